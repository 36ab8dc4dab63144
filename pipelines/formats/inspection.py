"""Step 1 of input validation, the facts: what a file *is*, from its content, never its
name or the uploader's claim. Explicit signatures (:mod:`.signatures`) win, libmagic
names what they do not know, and the container readers look inside (ZIP directory,
OLE2 directory, PDF trailer, image and media headers). Nothing is decoded or
extracted; every read is bounded.

The rules (what is refused, for which operation, under which limits) are the core's:
:mod:`hypermedia.sandbox.inspect`. The facts live here, beside the readers, so that a
pipeline step can see a file exactly as ingest saw it without importing the core.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.formats import images, media, office, pdf, signatures
from pipelines.formats.source import FileSource, Source
from pipelines.sniff import ARCHIVE_TAIL_BYTES, appended_archive

log = logging.getLogger(__name__)

# Bump when the inspection would find different facts: stored inspections say which
# version made them.
# 3: an image that ends before its header gives a width and height is corrupt.
INSPECTOR_VERSION = 3
HEAD_BYTES = signatures.HEAD_BYTES
_FLAT_ODF_SCAN_BYTES = 8 * 1024 * 1024
_POLYGLOT_KINDS = {"image", "pdf", "video", "audio"}


@dataclass(frozen=True, slots=True)
class Inspection:
    """What a file is, by content. ``details`` holds the facts (JSON-serializable)."""

    kind: str
    mime: str
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return str(self.details.get("label", self.mime))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "mime": self.mime, "details": self.details}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Inspection:
        return cls(str(data["kind"]), str(data["mime"]), dict(data.get("details") or {}))


# -- step 1: facts ---------------------------------------------------------------------------


def inspect_file(path: Path) -> Inspection:
    """Inspect a local file."""
    with FileSource(path) as source:
        return inspect_source(source)


def inspect_source(source: Source) -> Inspection:
    """Inspect the bytes ``source`` reads (a file, a buffer, ranged GETs)."""
    head = source.read_at(0, HEAD_BYTES)
    found = signatures.detect(head)
    kind, mime = found.kind, found.mime
    details: dict[str, Any] = {"inspector": INSPECTOR_VERSION, "label": found.label}
    described = _libmagic(head)
    if described is not None:
        details["magic"] = described[0]
        if found.format == "unknown":
            kind, mime = _kind_from_magic(described[0])
            details["label"] = described[1][:200] or found.label
    try:
        kind, mime = _look_inside(source, found, kind, mime, details)
    except Exception as exc:
        # A reader's bug must not let a file through unchecked: a container we could
        # not inspect is refused (invalid_input); for other kinds the limits stay unknown.
        log.exception("inspecting a %s failed", found.label, extra={"action": "inspect"})
        if found.format in ("zip", "ole", "pdf", "flat-odf"):
            details["corrupt"] = f"could not be inspected ({type(exc).__name__})"
    if kind in _POLYGLOT_KINDS and source.size > 22:
        tail_start = max(0, source.size - ARCHIVE_TAIL_BYTES)
        if appended_archive(source.read_at(tail_start, source.size - tail_start)):
            details["appended_archive"] = True
    return Inspection(kind, mime, details)


def _look_inside(
    source: Source, found: signatures.Signature, kind: str, mime: str, details: dict[str, Any]
) -> tuple[str, str]:
    if found.kind == "image":
        details.update(images.geometry(source, found.format))
    elif found.format == "pdf":
        facts = pdf.analyze(source)
        if facts.encrypted:
            details["encrypted"] = facts.encrypted
        if facts.pages is not None:
            details["pages"] = facts.pages
        if facts.largest_image is not None:
            details["largest_image"] = list(facts.largest_image)
    elif found.format in ("zip", "ole"):
        container = (office.inspect_zip if found.format == "zip" else office.inspect_ole)(source)
        details["label"] = container.label
        details.update(container.details)
        return container.kind, container.mime
    elif found.kind in ("audio", "video"):
        analyzed = media.analyze(source, found)
        details["label"] = analyzed.label
        details.update(analyzed.details)
        return analyzed.kind, analyzed.mime
    elif found.format == "flat-odf":
        _flat_odf(source, details)
    return kind, mime


def _flat_odf(source: Source, details: dict[str, Any]) -> None:
    """A flat (single XML) OpenDocument: embedded Basic modules, dangerous DTDs."""
    text = source.read_at(0, _FLAT_ODF_SCAN_BYTES)
    for marker in (b"<ooo:library-embedded", b"<ooo:module", b"<office:script "):
        if marker in text:
            details["macros"] = f"embedded scripts ({marker.decode()[1:].strip()})"
            break
    head = text[: office.PROLOG_BYTES]
    danger = office.prolog_danger(head, any_dtd=False, whole=len(head) == source.size)
    if danger is not None:
        details["unsafe_xml"] = f"the document {danger}"


@functools.cache
def _magic_handles() -> tuple[Any, Any] | None:
    try:
        import magic

        return magic.Magic(mime=True), magic.Magic()
    except Exception as exc:  # libmagic missing: the explicit signatures still decide
        log.warning("libmagic unavailable: %s", exc, extra={"action": "inspect"})
        return None


def _libmagic(head: bytes) -> tuple[str, str] | None:
    """libmagic's ``(mime, description)`` of the head, or None when unavailable."""
    if not head:
        return None
    handles = _magic_handles()
    if handles is None:
        return None
    try:
        return str(handles[0].from_buffer(head)), str(handles[1].from_buffer(head))
    except Exception:
        return None


def _kind_from_magic(magic_mime: str) -> tuple[str, str]:
    top = magic_mime.split("/", 1)[0]
    if magic_mime == "application/x-empty":
        return "empty", magic_mime
    if top in ("image", "video", "audio"):
        return top, magic_mime
    special = {
        "text/rtf": "rtf",
        "text/html": "html",
        "text/xml": "xml",
        "application/xml": "xml",
        "application/pdf": "pdf",
        "application/postscript": "postscript",
    }
    if magic_mime in special:
        return special[magic_mime], magic_mime
    if top == "text":
        return "text", magic_mime
    return "unknown", magic_mime
