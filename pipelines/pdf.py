"""PDF steps on PDFium (pypdfium2): ``pdf_preview``, and :func:`page_texts` for text.

PDFium is the PDF engine of Chromium, bundled in the pypdfium2 wheel (no system
library). It opens the document lazily: the page tree, then one page's objects, and
decodes images only when a page is rendered.

``pdf_preview`` renders one page to an image (:mod:`pipelines.pdf_params` for its
parameters and output type, e.g. ``preview-p1-w1024-q85.jpg``; JPEG by default):

1. parameters validated before the file is opened;
2. the first KiB sniffed for a ``%PDF-`` header, so another format is
   ``unsupported_format`` naming what it is (never the file's name);
3. the document opened without a password: one that needs a user password is
   ``encrypted_document``, one PDFium cannot parse (even after its xref repair) is
   ``invalid_input``, a page number beyond the document is ``invalid_params``;
4. the scale chosen from the page's size in points so the image is exactly ``width``
   pixels wide; the bitmap's size is checked against :data:`MAX_RENDER_PIXELS` and the
   output format's largest side *before* PDFium allocates it (PDFium allocates the
   bitmap it is asked for, so this check is the guard against absurd page sizes),
   else ``pixel_limit``;
5. rendered with annotations (their appearance streams: form fields show their
   values) onto white into an RGBx bitmap, which libvips encodes in place (no copy),
   no metadata.

:func:`page_texts` gives each page's text (PDFium's text page) for ``extract_text``,
refusing documents over a page limit before reading any page.

What this module cannot bound, PDFium mostly does itself (measured, pypdfium2 5.15 /
PDFium 159 under RLIMIT_AS 2048 MB): it decodes an image progressively at the
size it is drawn, so a 30000x30000 RGB Flate image (2.7 GB raw) renders in 1.5 s and
120 MB, a 100000x100000 one is skipped at once; ``pdfjs-bomb_giant.pdf`` (content
streams with a JBIG2Decode filter, each declaring 100000x100000) is never decoded,
because PDFium applies image filters to images only: its page renders, text only, in
~30 ms and ~50 MB. The sandbox stays the backstop: a CPU-bound page meets the CPU
limit and wall clock (``cpu_limit``/``timeout``); memory refused to Python or libvips
is ``memory_limit``; memory refused to PDFium's own allocator kills the child with
SIGTRAP (its deliberate out-of-memory crash), seen only far below the profile's
2048 MB.

Nothing active runs: PDFium executes JavaScript only through a form-fill environment
with a JS engine (``FPDFDOC_InitFormFillEnvironment`` + V8), which this module never
initialises (``init_forms`` is not called), so document/page/open actions, form
calculations and links are inert. PDFium has no network or file access of its own:
links (``URI``, ``file://``, ``Launch``) are annotations that are only drawn.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
import pyvips

from pipelines import images, pdf_params, progress, sniff
from pipelines.registry import Output, PipelineError, register

log = logging.getLogger(__name__)

# The PDF header may follow up to 1 KiB of junk (PDF 32000-1, annex H.3): PDFium
# looks for it there too.
_HEADER_WINDOW = 1024
# The largest bitmap PDFium is asked for: 4 bytes per pixel (BGRx) -> 256 MiB.
MAX_RENDER_PIXELS = 64_000_000
# libvips' encoders: WebP is limited to 16383 pixels a side, JPEG to 65535.
_MAX_SIDE = {"jpeg": 65_500, "png": 65_500, "webp": 16_383}


def check_header(path: Path) -> None:
    """Refuse a file that is not a PDF, naming what it is."""
    with path.open("rb") as file:
        head = file.read(max(_HEADER_WINDOW, sniff.HEAD_BYTES))
    if b"%PDF-" in head[:_HEADER_WINDOW]:
        return
    detected = sniff.sniff(head)
    if detected.kind == "empty":
        raise PipelineError("invalid_input", "the input file is empty")
    raise PipelineError("unsupported_format", f"{detected.label} is not a PDF document")


@contextmanager
def open_pdf(path: Path) -> Iterator[pdfium.PdfDocument]:
    """The document at ``path``, closed on exit; PDFium's refusals become codes.

    Opened through the raw API: ``PdfDocument(path)`` reads ``FPDF_GetLastError`` also
    when loading succeeded with zero pages, and so reports the previous document's
    error (a stale "password required").
    """
    raw = pdfium_c.FPDF_LoadDocument(os.fsencode(path), None)
    if not raw:
        raise _open_error(pdfium_c.FPDF_GetLastError())
    document = pdfium.PdfDocument(raw)
    try:
        yield document
    finally:
        document.close()


def _open_error(code: int) -> PipelineError:
    if code == pdfium_c.FPDF_ERR_PASSWORD:
        return PipelineError(
            "encrypted_document", "the PDF is encrypted and needs a password to be opened"
        )
    if code == pdfium_c.FPDF_ERR_SECURITY:
        return PipelineError(
            "encrypted_document", "the PDF is encrypted with an unsupported security handler"
        )
    if code == pdfium_c.FPDF_ERR_FILE:
        return PipelineError("invalid_input", "the PDF could not be read")
    return PipelineError(
        "invalid_input", "the PDF is damaged or not a PDF (its structure could not be parsed)"
    )


def _page_count(document: pdfium.PdfDocument) -> int:
    count = len(document)
    if count < 1:
        raise PipelineError("invalid_input", "the PDF has no pages")
    return count


def _load_page(document: pdfium.PdfDocument, index: int) -> pdfium.PdfPage:
    try:
        return document[index]
    except pdfium.PdfiumError:
        raise PipelineError(
            "invalid_input", f"page {index + 1} of the PDF is damaged and cannot be loaded"
        ) from None


def page_texts(pdf: Path, max_pages: int) -> list[str]:
    """The text of each page of ``pdf`` (PDFium's text layer, reading order as stored).

    ``page_limit`` if the document has more than ``max_pages`` pages,
    ``encrypted_document`` if it needs a password, ``invalid_input`` if it cannot be
    opened or has no pages. A page with no text layer (a scan), or one too damaged
    to load, gives ``""``. Lines end in ``\r\n`` as PDFium gives them.
    """
    with open_pdf(pdf) as document:
        count = _page_count(document)
        if count > max_pages:
            raise PipelineError(
                "page_limit", f"the PDF has {count:,} pages, over the limit of {max_pages:,}"
            )
        texts = []
        for index in range(count):
            texts.append(_page_text(document, index))
            progress.report(index + 1, count, "pages")
        return texts


def _page_text(document: pdfium.PdfDocument, index: int) -> str:
    """The text of one page; ``""`` (and a warning) for a page PDFium cannot load, so
    one damaged page does not lose the text of the others."""
    try:
        page = document[index]
    except pdfium.PdfiumError:
        log.warning("pdf text: page %d cannot be loaded, skipped", index + 1)
        return ""
    try:
        text_page = page.get_textpage()
        try:
            return str(text_page.get_text_range())
        finally:
            text_page.close()
    except pdfium.PdfiumError:
        log.warning("pdf text: the text of page %d cannot be read, skipped", index + 1)
        return ""
    finally:
        page.close()


def render_scale(page_width: float, page_height: float, width: int, max_side: int) -> float:
    """The scale (pixels per point) to render a ``page_width`` x ``page_height`` (points)
    page ``width`` pixels wide, or ``pixel_limit`` if the bitmap would be too large."""
    if not (math.isfinite(page_width) and math.isfinite(page_height)):
        raise PipelineError("invalid_input", "the page has no valid size")
    if page_width <= 0 or page_height <= 0:
        raise PipelineError(
            "invalid_input", f"the page has no area ({page_width:g} x {page_height:g} points)"
        )
    scale = width / page_width
    # pypdfium2 sizes the bitmap as ceil(points * scale): keep a rounding error from
    # making it one pixel wider than asked.
    while math.ceil(page_width * scale) > width:
        scale = math.nextafter(scale, 0.0)
    bitmap_width = math.ceil(page_width * scale)
    bitmap_height = math.ceil(page_height * scale)
    pixels = bitmap_width * bitmap_height
    if bitmap_height > max_side or pixels > MAX_RENDER_PIXELS:
        raise PipelineError(
            "pixel_limit",
            f"the page is {page_width:g} x {page_height:g} points: {width} pixels wide it"
            f" would be {bitmap_width:,} x {bitmap_height:,} pixels, over the limit of"
            f" {MAX_RENDER_PIXELS:,} pixels and {max_side:,} pixels a side",
        )
    return scale


def _encode(bitmap: pdfium.PdfBitmap, path: Path, request: pdf_params.PreviewRequest) -> None:
    """Save an RGBx PDFium bitmap as the requested format, no metadata.

    libvips reads the bitmap's memory in place (no copy), so the bitmap must outlive
    this call. Encoding a rendered page fails only for want of resources: memory or a
    thread (``MemoryError``, which the sandbox reports as ``memory_limit``) or room to
    write (``output_limit``).
    """
    stride_pixels = bitmap.stride // 4
    image = pyvips.Image.new_from_memory(bitmap.buffer, stride_pixels, bitmap.height, 4, "uchar")
    if stride_pixels != bitmap.width:
        image = image.crop(0, 0, bitmap.width, bitmap.height)
    image = image.extract_band(0, n=3).copy(interpretation="srgb")
    try:
        images.save(image, path, request.format, request.quality or pdf_params.DEFAULT_QUALITY)
    except pyvips.Error as exc:
        reason = " ".join(str(exc).split())
        if "memory" in reason or "thread" in reason:
            raise MemoryError(f"libvips could not encode the page: {reason}") from None
        if "write" in reason:
            raise PipelineError("output_limit", "the preview could not be written") from None
        raise


def render_page(
    input_path: Path, request: pdf_params.PreviewRequest, path: Path
) -> tuple[int, int]:
    """Render ``request.page`` of the PDF to ``path``; the image's size."""
    with open_pdf(input_path) as document:
        count = _page_count(document)
        if request.page > count:
            pages = "1 page" if count == 1 else f"{count:,} pages"
            raise PipelineError(
                "invalid_params", f"page {request.page} does not exist: the PDF has {pages}"
            )
        page = _load_page(document, request.page - 1)
        try:
            # The page as displayed: /Rotate applied, CropBox.
            page_width, page_height = page.get_size()
            scale = render_scale(
                page_width, page_height, request.width, _MAX_SIDE[request.format.name]
            )
            bitmap = page.render(
                scale=scale,
                may_draw_forms=False,
                prefer_bgrx=True,
                rev_byteorder=True,
                draw_annots=True,
            )
        except pdfium.PdfiumError as exc:
            raise PipelineError(
                "invalid_input", f"page {request.page} of the PDF cannot be rendered: {exc}"
            ) from None
        finally:
            page.close()
        try:
            _encode(bitmap, path, request)
            return bitmap.width, bitmap.height
        finally:
            bitmap.close()


# Imported by the fork server of a worker serving pdf_preview before it forks (see
# pipelines.images.PRELOAD): the encoder's libvips settings and operations.
PRELOAD = ("pipelines.image_vips",)


@register("pdf_preview", check=pdf_params.parse, preload=PRELOAD)
def pdf_preview(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """Render one page (``page``, 1-based) ``width`` pixels wide as JPEG, PNG or WebP."""
    request = pdf_params.parse(params)
    check_header(input_path)
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / request.output_type
    try:
        width, height = render_page(input_path, request, path)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    log.debug("pdf_preview: page %d -> %s %dx%d", request.page, path.name, width, height)
    return [Output(request.output_type, path, request.format.content_type)]
