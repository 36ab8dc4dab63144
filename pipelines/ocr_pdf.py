"""PDF in and out for ``ocr``: pages rendered (PDFium), text layers read, searchable PDF written.

Reading: each page is rendered with PDFium (:mod:`pipelines.pdf`'s opener and its
bitmap-size guard) at the request's dpi; a page's own text layer is read with its
boxes (PDFium's text rectangles, one per run of text on a line) and judged by
:func:`good_text_layer`: born-digital pages keep it and skip OCR.

Writing: :func:`write_searchable_pdf` makes one PDF page per page image, the image
filling the page, with the recognised lines over it as *invisible* text (text render
mode 3, as OCRmyPDF and Tesseract do) placed and stretched onto each line's box, so
a viewer selects and searches the text where it is seen. It is written with fpdf2
(a maintained PDF writer) in DejaVu Sans (Debian's fonts-dejavu-core), subset;
characters the font lacks (CJK) are left out of the text layer, not of the text
and JSON outputs.
"""

from __future__ import annotations

import logging
import math
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipelines.ocr_engines import Line
from pipelines.registry import PipelineError

if TYPE_CHECKING:
    import pypdfium2 as pdfium

    from pipelines.ocr_engines import PageArray

log = logging.getLogger(__name__)

FONT_PATHS = (
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
)
# A good text layer: at least this many visible characters, this share of them
# letters, digits, punctuation or symbols (no U+FFFD, private-use or control glyphs).
_MIN_LAYER_CHARS = 20
_MIN_LAYER_CLEAN = 0.9


def render_page(page: pdfium.PdfPage, dpi: int, max_pixels: int) -> tuple[PageArray, float]:
    """The page as an RGB array at ``dpi`` and the scale used (pixels per point)."""
    import numpy as np

    from pipelines import pdf

    width_pt, height_pt = page.get_size()
    scale = dpi / 72
    if not (math.isfinite(width_pt) and math.isfinite(height_pt)) or width_pt <= 0:
        raise PipelineError("invalid_input", "the page has no valid size")
    pixels = math.ceil(width_pt * scale) * math.ceil(height_pt * scale)
    if pixels > min(max_pixels, pdf.MAX_RENDER_PIXELS):
        raise PipelineError(
            "pixel_limit",
            f"the page is {width_pt:g} x {height_pt:g} points: at {dpi} dpi it would be"
            f" {pixels:,} pixels, over the limit of {min(max_pixels, pdf.MAX_RENDER_PIXELS):,}",
        )
    bitmap = page.render(scale=scale, may_draw_forms=False, draw_annots=True, rev_byteorder=True)
    try:
        array = np.array(bitmap.to_numpy()[:, :, :3], dtype=np.uint8, copy=True)
    finally:
        bitmap.close()
    return array, scale


def text_layer(page: pdfium.PdfPage, scale: float) -> list[Line]:
    """The page's own text as lines with boxes in pixels at ``scale``."""
    _, height_pt = page.get_size()
    text_page = page.get_textpage()
    try:
        lines = []
        for index in range(text_page.count_rects()):
            left, bottom, right, top = text_page.get_rect(index)
            text = " ".join(text_page.get_text_bounded(left, bottom, right, top).split())
            if not text:
                continue
            box = (
                round(left * scale),
                round((height_pt - top) * scale),
                round(right * scale),
                round((height_pt - bottom) * scale),
            )
            lines.append(Line(text, box, 1.0))
        return lines
    finally:
        text_page.close()


def good_text_layer(lines: Sequence[Line]) -> bool:
    """Whether a page's text layer is worth keeping instead of OCR."""
    visible = [c for line in lines for c in line.text if not c.isspace()]
    if len(visible) < _MIN_LAYER_CHARS:
        return False
    clean = sum(
        1
        for c in visible
        if c != "\ufffd"
        and unicodedata.category(c)[0] in "LNPS"
        and unicodedata.category(c) != "Co"
    )
    return clean / len(visible) >= _MIN_LAYER_CLEAN


@dataclass(frozen=True, slots=True)
class PdfPage:
    image: Path
    width_px: int
    height_px: int
    width_pt: float
    height_pt: float
    lines: Sequence[Line]


def font_path() -> Path | None:
    return next((Path(p) for p in FONT_PATHS if Path(p).is_file()), None)


def write_searchable_pdf(pages: Sequence[PdfPage], path: Path) -> None:
    """One page per image, its lines as invisible text over it (see the module doc)."""
    from fpdf import FPDF
    from fpdf.enums import TextMode

    logging.getLogger("fpdf").setLevel(logging.ERROR)
    document = FPDF(unit="pt")
    document.set_auto_page_break(False)
    document.set_margins(0, 0, 0)
    document.set_producer("hypermedia ocr")
    font = font_path()
    if font is not None:
        document.add_font("ocr", "", str(font))
        family = "ocr"
    else:
        family = "helvetica"
    for page in pages:
        document.add_page(format=(page.width_pt, page.height_pt))
        document.image(str(page.image), x=0, y=0, w=page.width_pt, h=page.height_pt)
        document.text_mode = TextMode.INVISIBLE
        per_px_x = page.width_pt / page.width_px
        per_px_y = page.height_pt / page.height_px
        for line in page.lines:
            text = line.text if font is not None else _latin1(line.text)
            if font is not None:
                text = "".join(c for c in text if _has_glyph(document, c))
            if not text.strip():
                continue
            x0, y0, x1, y1 = line.bbox
            box_w, box_h = (x1 - x0) * per_px_x, (y1 - y0) * per_px_y
            if box_w <= 0 or box_h <= 0:
                continue
            size = max(1.0, box_h * 0.85)
            document.set_font(family, size=size)
            natural = document.get_string_width(text)
            if natural > 0:
                document.set_stretching(max(1.0, min(1000.0, 100 * box_w / natural)))
            document.text(x0 * per_px_x, y1 * per_px_y - 0.2 * box_h, text)
            document.set_stretching(100)
        document.text_mode = TextMode.FILL
    document.output(str(path))


def _has_glyph(document: object, char: str) -> bool:
    font = getattr(document, "current_font", None)
    cmap = getattr(font, "cmap", None)
    return char == " " or cmap is None or ord(char) in cmap


def _latin1(text: str) -> str:
    return text.encode("latin-1", "replace").decode("latin-1")
