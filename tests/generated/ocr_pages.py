"""OCR inputs with known text: pages drawn here in DejaVu Sans (Pillow), each beside its
truth (``<name>.txt``, reading order), laid out like the corpus's ``ocr/`` pairs.

- ``clean-page.png``: a 300 dpi page of printed paragraphs, black on white;
- ``two-columns.png``: a title over two columns (the truth reads the left column,
  then the right);
- ``small-print.png``: the same paragraphs in small print (x-height ~5 px);
- ``mixed-orientation.png``: the clean page with its second and fourth lines upside
  down (a label stuck on the wrong way): PP-OCR without its angle classifier reads
  those lines as garbage with lower confidence, so the default chain escalates;
- ``photo-page.jpg``: the clean page turned 2 degrees, shaded, noisy, blurred and saved
  as a poor JPEG;
- ``turned-page.png``: the clean page turned 90 degrees clockwise;
- ``layout-page.png``: a title in large type, two paragraphs and a ruled table (a
  header row and three rows of three cells), for layout detection;
- ``scanned.pdf``: the clean page as an image-only PDF (no text layer), and
  ``born-digital.pdf``: the same paragraphs as PDF text (no image).

Everything is drawn from fixed seeds: the same bytes every run for one Pillow.

Pages some tests draw for themselves (not in the group): :func:`script_page`, lines
of another script (Vietnamese, Arabic right to left: DejaVu Sans has both; simplified
Chinese in WenQuanYi Micro Hei, :data:`CJK_FONT_PATHS`); :func:`long_scan`, an
image-only PDF of many tiny pages of one line each; ``two_columns(rows=1)``, the
title over the columns' first line only.
"""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tests.generated.entries import Entry

if TYPE_CHECKING:
    from PIL import Image, ImageFont

FONT_PATHS = (
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
)
# Chinese and Japanese: Debian's fonts-wqy-microhei.
CJK_FONT_PATHS = (
    "/usr/share/fonts/truetype/wqy/wqy-microhei.ttc",
    "/usr/share/fonts/wqy-microhei/wqy-microhei.ttc",
)
PARAGRAPHS = (
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Invoice 2024-117 lists 42 items at a total of 1,350.75 euros.",
    "Please return the signed form before Friday, 14 March.",
    "Our office opens at 8:30 and closes at 17:00 on weekdays.",
    "Each sample was measured three times; the mean is reported.",
)
TITLE = "Quarterly Report of the Harbour Office"
LEFT_COLUMN = (
    "Ships arriving in the",
    "morning are unloaded",
    "before noon, and the",
    "cranes are checked",
    "every second week.",
)
RIGHT_COLUMN = (
    "Storage fees rose by",
    "four percent this year",
    "while the number of",
    "containers fell to",
    "nine thousand.",
)
LAYOUT_TITLE = "Annual Harbour Statistics"
LAYOUT_PARAGRAPHS = (
    (
        "The harbour handled more ships this year than in any year",
        "before. Most of them arrived in the summer months, when the",
        "weather was calm and the river was deep enough for the",
        "largest vessels to reach the inner docks without delay.",
    ),
    (
        "The table below lists the cargo unloaded at each of the three",
        "docks. Grain and timber were the largest cargoes, while coal",
        "fell for the third year in a row as the power station closed.",
        "The figures are in thousands of tonnes.",
    ),
)
TABLE = (
    ("Dock", "Cargo", "Tonnes"),
    ("North", "Grain", "1250"),
    ("East", "Timber", "830"),
    ("South", "Coal", "415"),
)


def font(size: int, paths: tuple[str, ...] = FONT_PATHS) -> ImageFont.FreeTypeFont:
    from PIL import ImageFont

    for path in paths:
        if Path(path).is_file():
            return ImageFont.truetype(path, size)
    if paths == CJK_FONT_PATHS:
        raise FileNotFoundError(
            "WenQuanYi Micro Hei is missing: apt-get install fonts-wqy-microhei"
        )
    raise FileNotFoundError("DejaVu Sans is missing: apt-get install fonts-dejavu-core")


def _page(lines: list[tuple[str, int, int]], size: int, width: int, height: int) -> Image.Image:
    from PIL import Image, ImageDraw

    image = Image.new("L", (width, height), 255)
    draw = ImageDraw.Draw(image)
    face = font(size)
    for text, x, y in lines:
        draw.text((x, y), text, fill=0, font=face)
    return image


VIETNAMESE = (
    "Tôi yêu tiếng Việt rất nhiều.",
    "Hà Nội là thủ đô của Việt Nam.",
    "Chúng tôi đi học mỗi ngày.",
)
ARABIC = (
    "مرحبا بكم في المدينة الجميلة",
    "الكتاب على الطاولة الكبيرة",
    "نحن نذهب إلى المدرسة كل يوم",
)

CHINESE = (
    "我们每天早上去学校上课",
    "今天的天气非常好",
    "这本书在大桌子上面",
    "请在星期五之前交回表格",
    "办公室八点半开门五点关门",
    "每个样品测量了三次",
)


def script_page(
    lines: tuple[str, ...], *, rtl: bool = False, size: int = 48, cjk: bool = False
) -> Image.Image:
    """``lines`` one under another in DejaVu Sans (WenQuanYi Micro Hei for ``cjk``),
    right-aligned for a right-to-left script (Pillow shapes Arabic with libraqm)."""
    from PIL import Image, ImageDraw

    margin, step = 150, int(size * 1.7)
    face = font(size, CJK_FONT_PATHS if cjk else FONT_PATHS)
    direction = "rtl" if rtl else None
    measure = ImageDraw.Draw(Image.new("L", (1, 1)))
    width = margin * 2 + int(
        max(measure.textlength(t, font=face, direction=direction) for t in lines)
    )
    image = Image.new("L", (width, margin * 2 + step * len(lines)), 255)
    draw = ImageDraw.Draw(image)
    for index, text in enumerate(lines):
        length = draw.textlength(text, font=face, direction=direction)
        x = width - margin - length if rtl else margin
        draw.text((x, margin + index * step), text, fill=0, font=face, direction=direction)
    return image


def long_scan(path: Path, pages: int) -> None:
    """An image-only PDF of ``pages`` pages (a long scan, cheap to make and to read):
    each a tiny picture of one line, "Page <n>"."""
    images = [_page([(f"Page {n}", 10, 10)], 20, 160, 44) for n in range(1, pages + 1)]
    stamp = time.gmtime(946_684_800)  # 2000-01-01: Pillow stamps the time otherwise
    images[0].save(
        path,
        format="PDF",
        resolution=72,
        save_all=True,
        append_images=images[1:],
        creationDate=stamp,
        modDate=stamp,
    )


def clean_page(size: int = 42, margin: int = 150) -> Image.Image:
    """The paragraphs, one per line, on a page ``size`` px type (~10 pt at 300 dpi)."""
    step = int(size * 1.6)
    width = margin * 2 + int(size * 0.62 * max(len(p) for p in PARAGRAPHS))
    height = margin * 2 + step * len(PARAGRAPHS)
    lines = [(text, margin, margin + i * step) for i, text in enumerate(PARAGRAPHS)]
    return _page(lines, size, width, height)


def two_columns(rows: int = len(LEFT_COLUMN)) -> Image.Image:
    """The title over the columns' first ``rows`` lines (all of them by default)."""
    size, step, margin, gutter = 42, 66, 150, 120
    column = int(size * 0.62 * max(len(t) for t in LEFT_COLUMN + RIGHT_COLUMN))
    width = margin * 2 + column * 2 + gutter
    top = margin + int(step * 1.8)
    lines = [(TITLE, margin, margin)]
    lines += [(text, margin, top + i * step) for i, text in enumerate(LEFT_COLUMN[:rows])]
    right = margin + column + gutter
    lines += [(text, right, top + i * step) for i, text in enumerate(RIGHT_COLUMN[:rows])]
    return _page(lines, size, width, top + step * rows + margin)


def layout_page() -> Image.Image:
    """A title in 72 px type, two paragraphs in 40 px and a table ruled with lines."""
    from PIL import ImageDraw

    width, margin, size = 1500, 120, 40
    step = int(size * 1.5)
    lines = []
    top = margin + 180
    for paragraph in LAYOUT_PARAGRAPHS:
        lines += [(text, margin, top + i * step) for i, text in enumerate(paragraph)]
        top += step * len(paragraph) + step
    table_top = top + step // 2
    column, row = 380, 80
    height = table_top + row * len(TABLE) + margin
    image = _page(lines, size, width, height)
    draw = ImageDraw.Draw(image)
    draw.text((margin, margin), LAYOUT_TITLE, fill=0, font=font(72))
    face = font(size)
    columns = len(TABLE[0])
    for r, cells in enumerate(TABLE):
        for c, text in enumerate(cells):
            draw.text((margin + c * column + 30, table_top + r * row + 18), text, fill=0, font=face)
    for r in range(len(TABLE) + 1):
        y = table_top + r * row
        draw.line((margin, y, margin + columns * column, y), fill=0, width=3)
    for c in range(columns + 1):
        x = margin + c * column
        draw.line((x, table_top, x, table_top + row * len(TABLE)), fill=0, width=3)
    return image


def mixed_orientation() -> Image.Image:
    image = clean_page()
    step = int(42 * 1.6)
    for index in (1, 3):
        top = 150 + index * step - 8
        box = (0, top, image.width, top + step)
        image.paste(image.crop(box).rotate(180), box)
    return image


def photo_page() -> bytes:
    import numpy as np
    from PIL import Image, ImageFilter

    page = clean_page().rotate(2.0, resample=Image.Resampling.BICUBIC, expand=True, fillcolor=255)
    pixels = np.asarray(page, dtype=np.float64)
    height, width = pixels.shape
    shade = np.linspace(0.0, 70.0, width)[None, :] + np.linspace(0.0, 40.0, height)[:, None]
    noise = np.random.default_rng(13).normal(0.0, 14.0, pixels.shape)
    photo = np.clip(pixels * 0.8 + 30 - shade + noise, 0, 255).astype(np.uint8)
    blurred = Image.fromarray(photo).filter(ImageFilter.GaussianBlur(1.2))
    out = io.BytesIO()
    blurred.convert("RGB").save(out, format="JPEG", quality=35)
    return out.getvalue()


def _save_pdf(image: Image.Image, path: Path, resolution: int) -> None:
    # Dates fixed: Pillow stamps the time of writing otherwise.
    stamp = time.gmtime(946_684_800)  # 2000-01-01
    image.save(path, format="PDF", resolution=resolution, creationDate=stamp, modDate=stamp)


def build(directory: Path) -> list[Entry]:
    from tests.generated.documents import text_pdf

    out = directory / "ocr"
    out.mkdir(parents=True, exist_ok=True)
    paragraphs = "\n".join(PARAGRAPHS) + "\n"
    entries: list[Entry] = []

    def pair(name: str, kind: str, truth: str, note: str) -> None:
        (out / name).with_suffix(".txt").write_text(truth, encoding="utf-8")
        entries.append(Entry(f"ocr/{name}", kind, f"ocr-truth:ocr/{Path(name).stem}.txt", note))

    clean_page().save(out / "clean-page.png")
    pair("clean-page.png", "ocr-image:png", paragraphs, "printed page, 300 dpi")
    two_columns().save(out / "two-columns.png")
    columns = "\n".join((TITLE, *LEFT_COLUMN, *RIGHT_COLUMN)) + "\n"
    pair("two-columns.png", "ocr-image:png", columns, "title over two columns")
    clean_page(size=9, margin=30).save(out / "small-print.png")
    pair("small-print.png", "ocr-image:png", paragraphs, "tiny print: x-height ~5 px")
    mixed_orientation().save(out / "mixed-orientation.png")
    pair("mixed-orientation.png", "ocr-image:png", paragraphs, "lines 2 and 4 upside down")
    (out / "photo-page.jpg").write_bytes(photo_page())
    pair("photo-page.jpg", "ocr-image:jpeg", paragraphs, "turned 2 deg, shaded, noisy, JPEG q35")
    turned = clean_page().rotate(-90, expand=True)
    turned.save(out / "turned-page.png")
    pair("turned-page.png", "ocr-image:png", paragraphs, "page turned 90 deg clockwise")
    layout_page().save(out / "layout-page.png")
    layout = [LAYOUT_TITLE, *(t for p in LAYOUT_PARAGRAPHS for t in p)]
    layout += [" ".join(cells) for cells in TABLE]
    pair("layout-page.png", "ocr-image:png", "\n".join(layout) + "\n", "title, text, ruled table")
    _save_pdf(clean_page().convert("RGB"), out / "scanned.pdf", 300)
    pair("scanned.pdf", "ocr-document:pdf", paragraphs, "image-only PDF (a scan)")
    (out / "born-digital.pdf").write_bytes(text_pdf([list(PARAGRAPHS)]))
    pair("born-digital.pdf", "ocr-document:pdf", paragraphs, "text layer, no image")
    return entries
