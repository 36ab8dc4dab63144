"""Input validation before any decoder sees a byte: type sniffing and limits.

Two steps, kept apart so the facts can be stored and the rules re-applied:

1. :func:`inspect_file` / :func:`inspect_source` (:mod:`pipelines.formats.inspection`,
   beside the format readers, so that a pipeline step sees a file as ingest saw it
   without importing the core) read what a file *is* from its content, never its name
   or the uploader's claim: explicit signatures
   (:mod:`~pipelines.formats.signatures`) win, libmagic names what they do not
   know, and the container readers look inside (ZIP directory, OLE2 directory, PDF
   trailer, image and media headers). The answer is an :class:`Inspection`: a ``kind``
   (what profiles accept), a ``mime`` type and ``details`` (facts: dimensions, frames,
   pages, duration, ZIP statistics, macros, encryption ...). Nothing is decoded or
   extracted; every read is bounded.

2. :func:`check_operation` decides, from an inspection, whether an operation may run on
   the file under a profile's ``accepts`` and :class:`InputLimits`, and raises the
   :class:`~hypermedia.errors.InputRejected` subclass with a stable code otherwise::

       invalid_input         empty, truncated or unreadable container, or an image that
                             ends before its header gives a width and height
       encrypted_document    needs a password or key (PDF user password, encrypted Office/ODF, DRM)
       zip_bomb              over the size / ratio / entry limits, recursive or overlapping
                             entries, or cells whose shared strings expand past the size limit
       path_traversal        an archive entry named ``..``, absolute, with a drive or backslash
       macro_document        VBA, XLM macro sheets, ActiveX, DDE links, ODF Basic/scripts
       unsafe_xml            a DTD (external entities, entity expansion) in an Office/ODF part
       polyglot_file         a ZIP appended to an image, PDF or media file
       unsupported_format    PostScript/EPS, playlists, concat scripts, MIDI; or a format of
                             the right kind that the operation does not process (SVG for thumbnail)
       input_type_mismatch   the operation is for another kind of file (thumbnail on a PDF)
       pixel_limit           header width x height x frames over the profile's limit
       page_limit            more pages than the profile allows
       duration_limit        longer than the profile allows

   :func:`refusal` is the part that does not depend on the operation.

This module and :mod:`pipelines.formats` do no I/O beyond reading the bytes
they are handed; libmagic is loaded on first use (its loader runs ``ldconfig``).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, fields
from typing import Annotated, Any, ClassVar

from annotated_types import Ge, Gt

from hypermedia.errors import (
    DurationLimit,
    EncryptedDocument,
    InputRejected,
    InputTypeMismatch,
    InvalidInput,
    MacroDocument,
    PageLimit,
    PathTraversal,
    PixelLimit,
    PolyglotFile,
    UnsafeXml,
    UnsupportedFormat,
    ZipBomb,
)
from pipelines.formats.inspection import Inspection, inspect_file, inspect_source

# Step 1 lives beside the format readers (pipelines.formats.inspection), step 2 here;
# the core imports both from this module.
__all__ = [
    "ANY",
    "KINDS",
    "InputLimits",
    "Inspection",
    "accepted",
    "check_operation",
    "inspect_file",
    "inspect_source",
    "refusal",
]

log = logging.getLogger(__name__)

KINDS = frozenset(
    {
        "image",
        "pdf",
        "postscript",
        "rtf",
        "msword",
        "msexcel",
        "mspowerpoint",
        "ole",
        "ooxml",
        "ooxml-word",
        "ooxml-sheet",
        "ooxml-slides",
        "odf",
        "odf-text",
        "odf-sheet",
        "odf-slides",
        "odf-drawing",
        "video",
        "audio",
        "playlist",
        "ffconcat",
        "zip",
        "archive",
        "html",
        "xml",
        "text",
        "empty",
        "unknown",
    }
)
ANY = "any"

# Refused whatever the operation: what no pipeline should ever be handed.
_REFUSED_KINDS = {
    "postscript": "PostScript/EPS is not processed (no Ghostscript for user files)",
    "playlist": "playlists and manifests make FFmpeg fetch other files; upload the media itself",
    "ffconcat": "FFmpeg concat scripts name other files; upload the media itself",
}
_REFUSED_MIMES = {
    "audio/midi": "a MIDI file holds notes, not audio samples: there is nothing to transcode",
}


Positive = Annotated[int, Ge(1)]


@dataclass(frozen=True, slots=True)
class InputLimits:
    """A profile's limits on what its operation may be handed (``[profiles.<op>.limits]``).

    ``max_pixels`` counts width x height x frames as the header declares them, except
    that with ``jpeg_shrink_on_load`` a JPEG counts at 1/8 scale per side (the image
    pipeline decodes it at the smallest DCT scale that covers the output);
    ``max_source_pixels`` counts what the header declares with no such allowance. The
    ZIP limits are on the central directory's declared sizes.

    A plain dataclass (pydantic validates it inside :class:`hypermedia.profiles.Profile`
    from the constraints below) so that these rules import no pydantic model machinery.
    """

    __pydantic_config__: ClassVar[dict[str, Any]] = {"extra": "forbid", "allow_inf_nan": False}

    max_pixels: Positive | None = None
    max_source_pixels: Positive | None = None
    jpeg_shrink_on_load: bool = False
    max_pages: Positive | None = None
    max_duration_seconds: Annotated[float, Gt(0)] | None = None
    max_unzipped_bytes: Positive = 256 * 1024 * 1024
    max_zip_ratio: Annotated[float, Gt(1)] = 200.0
    max_zip_entries: Positive = 10_000

    def to_dict(self) -> dict[str, Any]:
        """The limits that differ from the defaults (what a profile row stores)."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if getattr(self, f.name) != f.default
        }

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> InputLimits:
        """From :meth:`to_dict` (validated when the profile was loaded)."""
        return cls(**values)


# -- step 2: rules --------------------------------------------------------------------------


def refusal(inspection: Inspection, limits: InputLimits | None = None) -> InputRejected | None:
    """Why this file is refused whatever the operation, or None."""
    limits = limits or InputLimits()
    d = inspection.details
    about = {"kind": inspection.kind, "mime": inspection.mime}
    label = inspection.label
    if inspection.kind == "empty":
        return InvalidInput("the file is empty", **about)
    if d.get("corrupt"):
        return InvalidInput(f"{label}: {d['corrupt']}", **about)
    if d.get("encrypted"):
        return EncryptedDocument(
            f"{label} cannot be opened without a password or key ({d['encrypted']})", **about
        )
    bomb = _zip_bomb(d.get("zip"), limits, plain=inspection.kind == "zip")
    if bomb is not None:
        return ZipBomb(f"{label}: {bomb}", **about, zip=d["zip"])
    text_bytes = d.get("text_bytes")
    if isinstance(text_bytes, int) and text_bytes > limits.max_unzipped_bytes:
        return ZipBomb(
            f"{label}: its cells expand to {text_bytes:,} bytes of text"
            f" (limit {limits.max_unzipped_bytes:,})",
            **about,
            text_bytes=text_bytes,
        )
    if d.get("path_traversal"):
        entry = str(d["path_traversal"])
        return PathTraversal(f"{label} has an entry escaping its folder: {entry!r}", **about)
    if d.get("macros"):
        return MacroDocument(
            f"{label} contains macros or active content ({d['macros']}); "
            "save it without macros (e.g. as .docx/.xlsx/.pptx) and upload again",
            **about,
        )
    if d.get("unsafe_xml"):
        return UnsafeXml(f"{label}: {d['unsafe_xml']}", **about)
    if d.get("appended_archive"):
        return PolyglotFile(f"{label} with a ZIP archive appended (a polyglot file)", **about)
    reason = _REFUSED_KINDS.get(inspection.kind) or _REFUSED_MIMES.get(inspection.mime)
    if reason:
        return UnsupportedFormat(f"{label}: {reason}", **about)
    return None


def _zip_bomb(stats: Any, limits: InputLimits, *, plain: bool) -> str | None:
    """Why a ZIP's directory says bomb. Nested archives count only in a plain ZIP: an
    Office file embedding a workbook (itself a ZIP) is ordinary."""
    if not isinstance(stats, dict):
        return None
    if stats.get("central_directory_bytes"):
        return f"a {stats['central_directory_bytes']:,}-byte central directory"
    if stats.get("recursive"):
        return f"it contains itself ({stats['recursive'][0]})"
    if stats.get("overlapping"):
        return f"overlapping entries ({stats['overlapping']})"
    if stats.get("nested_archives") and plain:
        return f"nested archives ({stats['nested_archives'][0]})"
    entries = int(stats.get("entries", 0))
    if entries > limits.max_zip_entries:
        return f"{entries:,} entries (limit {limits.max_zip_entries:,})"
    unzipped = int(stats.get("unzipped_bytes", 0))
    if unzipped > limits.max_unzipped_bytes:
        return f"inflates to {unzipped:,} bytes (limit {limits.max_unzipped_bytes:,})"
    ratio = float(stats.get("max_ratio", 0))
    if ratio > limits.max_zip_ratio:
        return f"an entry inflates {ratio:,.0f}:1 (limit {limits.max_zip_ratio:,.0f}:1)"
    return None


def accepted(inspection: Inspection, accepts: list[str] | tuple[str, ...]) -> bool:
    return any(a in (ANY, inspection.kind, inspection.mime) for a in accepts)


def _families(accepts: list[str] | tuple[str, ...]) -> set[str]:
    """The kinds an ``accepts`` list is about: ``image/png`` is about images."""
    families = set()
    for entry in accepts:
        top = entry.split("/", 1)[0]
        families.add(top if "/" in entry and top in ("image", "audio", "video") else entry)
    return families


def check_operation(
    inspection: Inspection,
    operation: str,
    accepts: list[str] | tuple[str, ...],
    limits: InputLimits,
) -> None:
    """Raise the :class:`~hypermedia.errors.InputRejected` for running ``operation`` on
    the inspected file under a profile's ``accepts`` and ``limits``; return if it may."""
    refused = refusal(inspection, limits)
    if refused is not None:
        refused.details["operation"] = operation
        raise refused
    about = {"operation": operation, "kind": inspection.kind, "mime": inspection.mime}
    if not accepted(inspection, accepts):
        wanted = ", ".join(accepts)
        if inspection.kind in _families(accepts):
            raise UnsupportedFormat(
                f"{operation} does not process {inspection.label} ({inspection.mime});"
                f" it accepts {wanted}",
                **about,
                accepts=list(accepts),
            )
        raise InputTypeMismatch(
            f"{operation} needs {wanted}; this file is {inspection.label} ({inspection.mime}),"
            " judged by its content",
            **about,
            accepts=list(accepts),
        )
    _check_limits(inspection, limits, about)


def _check_limits(inspection: Inspection, limits: InputLimits, about: dict[str, Any]) -> None:
    d = inspection.details
    width, height = d.get("width"), d.get("height")
    if inspection.kind == "image" and isinstance(width, int) and isinstance(height, int):
        frames = max(1, int(d.get("frames") or 1))
        declared = width * height * frames
        shape = f"{width}x{height}" + (f" x {frames:,} frames" if frames > 1 else "")
        if limits.max_source_pixels is not None and declared > limits.max_source_pixels:
            raise PixelLimit(
                f"{shape} = {declared:,} pixels is over the limit of {limits.max_source_pixels:,}",
                **about,
                pixels=declared,
                limit=limits.max_source_pixels,
            )
        decoded = declared
        if limits.jpeg_shrink_on_load and inspection.mime == "image/jpeg":
            decoded = math.ceil(width / 8) * math.ceil(height / 8) * frames
        if limits.max_pixels is not None and decoded > limits.max_pixels:
            at_scale = " (at 1/8 scale)" if decoded != declared else ""
            raise PixelLimit(
                f"{shape} = {decoded:,} pixels{at_scale} is over the limit of"
                f" {limits.max_pixels:,}",
                **about,
                pixels=decoded,
                limit=limits.max_pixels,
            )
    largest = d.get("largest_image")
    if inspection.kind == "pdf" and isinstance(largest, list) and len(largest) == 2:
        declared = int(largest[0]) * int(largest[1])
        if limits.max_source_pixels is not None and declared > limits.max_source_pixels:
            raise PixelLimit(
                f"{inspection.label} declares a {largest[0]}x{largest[1]} image ="
                f" {declared:,} pixels, over the limit of {limits.max_source_pixels:,}",
                **about,
                pixels=declared,
                limit=limits.max_source_pixels,
            )
    pages = d.get("pages")
    if isinstance(pages, int) and limits.max_pages is not None and pages > limits.max_pages:
        raise PageLimit(
            f"{inspection.label} has {pages:,} pages; the limit is {limits.max_pages:,}",
            **about,
            pages=pages,
            limit=limits.max_pages,
        )
    duration = d.get("duration_seconds")
    if (
        isinstance(duration, int | float)
        # Inspection reports no duration that is no number of seconds; facts stored
        # before it refused them may hold inf or NaN: unknown, as a new upload's.
        and math.isfinite(duration)
        and limits.max_duration_seconds is not None
        and duration > limits.max_duration_seconds
    ):
        raise DurationLimit(
            f"{inspection.label} lasts {duration:,.0f} s; the limit is"
            f" {limits.max_duration_seconds:,.0f} s",
            **about,
            duration_seconds=duration,
            limit=limits.max_duration_seconds,
        )
