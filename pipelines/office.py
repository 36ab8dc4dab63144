"""Office steps on LibreOffice 7.4 (headless): ``docx_to_pdf`` and ``extract_text``.

``docx_to_pdf`` turns a word-processing document (OOXML ``docx``, ODF ``odt`` or flat
``fodt``, legacy Word ``doc``, RTF) into ``document.pdf``. ``extract_text`` writes
``text.txt`` (UTF-8, ``\\n`` line ends) from any kind its profile accepts
(how, kind by kind: :mod:`pipelines.office_text`).

What the input is and how LibreOffice converts it: :mod:`pipelines.office_libreoffice`.

Parameters (the profile's ``params``; limits cannot come from a request):
``max_pages`` (default :data:`DEFAULT_MAX_PAGES`) for both steps, ``max_text_bytes``
(default :data:`DEFAULT_MAX_TEXT_BYTES`) for ``extract_text``; anything else is
``invalid_params``. The limits decide whether there is an output, never what it is,
so they are not in the output type.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from pipelines.office_libreoffice import DocumentKind, cleanup, detect, to_pdf
from pipelines.office_text import extract
from pipelines.params import integer, reject_unknown
from pipelines.registry import Output, PipelineError, register

log = logging.getLogger(__name__)

DEFAULT_MAX_PAGES = 1000
DEFAULT_MAX_TEXT_BYTES = 50 * 1024 * 1024
MAX_PAGES_LIMIT = 100_000
MAX_TEXT_BYTES_LIMIT = 1024 * 1024 * 1024

PDF_TYPE = "document.pdf"
TEXT_TYPE = "text.txt"
TEXT_CONTENT_TYPE = "text/plain; charset=utf-8"


# -- parameters --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OfficeRequest:
    max_pages: int
    max_text_bytes: int


_KEYS = {
    "docx_to_pdf": ("max_pages",),
    "extract_text": ("max_pages", "max_text_bytes"),
}


def parse_params(operation: str, params: Mapping[str, Any]) -> OfficeRequest:
    """Validate ``params`` for ``operation``; unknown keys are ``invalid_params``."""
    reject_unknown(operation, params, _KEYS[operation])
    return OfficeRequest(
        max_pages=integer(params, "max_pages", 1, MAX_PAGES_LIMIT, DEFAULT_MAX_PAGES),
        max_text_bytes=integer(
            params, "max_text_bytes", 1, MAX_TEXT_BYTES_LIMIT, DEFAULT_MAX_TEXT_BYTES
        ),
    )


# -- steps -------------------------------------------------------------------------------

DOCX_TO_PDF_KINDS = ("ooxml-word", "odf-text", "msword", "rtf")
EXTRACT_TEXT_KINDS = (
    "pdf", "ooxml-word", "ooxml-sheet", "ooxml-slides", "odf-text", "odf-sheet",
    "odf-slides", "msword", "msexcel", "mspowerpoint", "rtf", "text", "html",
)  # fmt: skip


def _accepted(path: Path, kinds: tuple[str, ...], operation: str) -> DocumentKind:
    kind = detect(path)
    if kind.kind not in kinds:
        raise PipelineError(
            "unsupported_format", f"{operation} does not accept the input ({kind.label})"
        )
    return kind


@register("docx_to_pdf", check=partial(parse_params, "docx_to_pdf"))
def docx_to_pdf(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """A word-processing document as ``document.pdf``."""
    request = parse_params("docx_to_pdf", params)
    kind = _accepted(input_path, DOCX_TO_PDF_KINDS, "docx_to_pdf")
    try:
        produced, pages = to_pdf(input_path, kind, workdir, request.max_pages)
        path = workdir / PDF_TYPE
        produced.replace(path)
    finally:
        cleanup(workdir)
    log.debug("docx_to_pdf: %s -> %d page(s)", kind.kind, pages)
    return [Output(PDF_TYPE, path, "application/pdf")]


@register("extract_text", check=partial(parse_params, "extract_text"))
def extract_text(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """The text of a document as ``text.txt`` (UTF-8)."""
    request = parse_params("extract_text", params)
    kind = _accepted(input_path, EXTRACT_TEXT_KINDS, "extract_text")
    try:
        text = extract(
            input_path,
            kind,
            workdir,
            max_pages=request.max_pages,
            max_text_bytes=request.max_text_bytes,
        )
    finally:
        cleanup(workdir)
    path = workdir / TEXT_TYPE
    path.write_text(text, encoding="utf-8", errors="replace", newline="")
    return [Output(TEXT_TYPE, path, TEXT_CONTENT_TYPE)]
