"""``ocr``'s parameters, its reading order and its page judgement: pure, case tables."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipelines import ocr_layout, ocr_params
from pipelines.ocr_engines import Line
from pipelines.registry import PipelineError

DEFAULTS = ocr_params.parse({})
PADDLE = {"det": "/m/det", "rec": "/m/rec", "dict": "/m/keys.txt", "languages": ["en", "zh"]}


def test_defaults_and_output_types():
    assert DEFAULTS.languages == ("en",)
    assert DEFAULTS.engines == ("ppocr", "ppocr-cls", "tesseract")
    assert DEFAULTS.output_type("txt") == "ocr-en-ppocr_ppocr-cls_tesseract-c97-d300.txt"
    forced = ocr_params.parse({"lang": "en+de", "engines": ["tesseract"], "text_layer": "ocr"})
    assert forced.output_type("pdf") == "ocr-en_de-tesseract-c97-d300-ocr.pdf"
    assert forced.tesseract_languages() == ("eng", "deu")


def test_paddle_models_and_the_languages_they_read():
    request = ocr_params.parse({"engines": ["paddle", "tesseract"], "paddle_models": PADDLE})
    assert request.paddle_models == ocr_params.PaddleModels(
        "/m/det", "/m/rec", "/m/keys.txt", ("en", "zh")
    )
    assert request.reads("paddle") and request.reads("tesseract")
    german = ocr_params.parse(
        {"lang": "de", "engines": ["paddle", "tesseract"], "paddle_models": PADDLE}
    )
    assert not german.reads("paddle") and german.reads("tesseract")
    assert request.output_type("txt") == "ocr-en-paddle_tesseract-c97-d300.txt"
    assert ocr_params.PROFILE_ONLY == ("paddle_models",)


@pytest.mark.parametrize(
    ("params", "languages"),
    [
        ({"lang": "en"}, ("en",)),
        ({"lang": "EN+de"}, ("en", "de")),
        ({"lang": ["fr", "it", "fr"]}, ("fr", "it")),
        ({"lang": "zh-hant"}, ("zh-hant",)),
    ],
)
def test_languages(params, languages):
    assert ocr_params.parse(params).languages == languages


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"lang": "xx"}, "unknown language 'xx'"),
        ({"lang": "en+klingon"}, "unknown language 'klingon'"),
        ({"lang": ""}, "unknown language"),
        ({"lang": 7}, "lang must be"),
        ({"engines": ["ppocr", "ppocr"]}, "twice"),
        ({"engines": ["paddle"]}, "the ocr profile sets no paddle_models"),
        ({"engines": ["tesseract-lstm"]}, "engines must be"),
        ({"paddle_models": {"det": "/m/det"}}, "paddle_models must be a table of"),
        ({"paddle_models": {**PADDLE, "rec": "models/rec"}}, "paddle_models.rec must be an abs"),
        ({"paddle_models": {**PADDLE, "languages": "xx"}}, "paddle_models.languages: unknown"),
        # The paddle models read English and Chinese only; no Tesseract in the chain.
        ({"lang": "de", "engines": ["paddle"], "paddle_models": PADDLE}, "no engine of the chain"),
        ({"engines": []}, "engines must be"),
        ({"min_confidence": 1.5}, "min_confidence must be in 0..1"),
        ({"min_confidence": True}, "must be a number"),
        # The output's name holds it in hundredths (c97): 0.971 would share 0.97's name.
        ({"min_confidence": 0.971}, "min_confidence is given in hundredths"),
        ({"dpi": 20}, "dpi must be in 72..600"),
        ({"text_layer": "keep"}, "text_layer must be"),
        ({"colour": "red"}, "unknown parameter(s) colour"),
        # Arabic: no PP-OCR model ships for it, and the chain has no Tesseract.
        ({"lang": "ar", "engines": ["ppocr"]}, "no engine of the chain"),
    ],
)
def test_refused(params, fragment):
    with pytest.raises(PipelineError) as caught:
        ocr_params.parse(params)
    assert caught.value.code == "invalid_params"
    assert fragment in caught.value.message


def test_the_step_module_imports_no_engine():
    """The API imports every pipeline (to know what is implemented): ocr must not pull
    onnxruntime, OpenCV or libtesseract into it."""
    code = "import sys, pipelines.ocr; print(sorted(sys.modules))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    for heavy in ("rapidocr", "onnxruntime", "cv2", "tesserocr", "fpdf", "numpy"):
        assert f"'{heavy}'" not in loaded, heavy


# -- reading order --------------------------------------------------------------------------


def line(text: str, x0: int, y0: int, x1: int, y1: int) -> Line:
    return Line(text, (x0, y0, x1, y1), 0.99)


def read(lines: list[Line]) -> list[str]:
    return ocr_layout.page_text(ocr_layout.reading_order(lines)).split("\n")


def test_two_columns_under_a_title_read_column_by_column():
    lines = [line("Title over both", 100, 50, 1500, 100)]
    for row in range(4):
        y = 200 + row * 60
        lines.append(line(f"right {row}", 850, y, 1500, y + 40))
        lines.append(line(f"left {row}", 100, y, 760, y + 40))
    texts = [t for t in read(lines) if t]
    assert texts == ["Title over both"] + [f"left {r}" for r in range(4)] + [
        f"right {r}" for r in range(4)
    ]


def test_a_ragged_single_column_is_one_column():
    widths = [1400, 900, 1350, 400, 1200]
    lines = [line(f"l{i}", 100, 100 + i * 60, 100 + w, 140 + i * 60) for i, w in enumerate(widths)]
    assert ocr_layout.column_boundaries(lines, 40) == []
    assert read(lines) == [f"l{i}" for i in range(5)]


def test_pieces_of_one_printed_line_form_a_row():
    lines = [line("world", 400, 102, 600, 140), line("hello", 100, 100, 350, 142)]
    assert read(lines) == ["hello world"]


def test_a_wide_gap_starts_a_block():
    lines = [line("a", 100, 100, 500, 140), line("b", 100, 160, 500, 200)]
    lines.append(line("c", 100, 400, 500, 440))
    blocks = ocr_layout.reading_order(lines)
    assert [ocr_layout.block_text(b) for b in blocks] == ["a\nb", "c"]


@pytest.mark.parametrize(
    ("lines", "ink", "weak"),
    [
        ([], 0.0, None),
        ([], 0.01, "no text read"),
        ([Line("Hello world", (0, 0, 10, 10), 0.95)], 0.01, None),
        ([Line("Hello world", (0, 0, 10, 10), 0.5)], 0.01, "mean line confidence 0.50"),
        ([Line("~~ ## ;; ~~ ## ;; ~~ ## ;; x", (0, 0, 10, 10), 0.99)], 0.01, "implausible"),
        ([Line("a b c d e f g h i j k l", (0, 0, 10, 10), 0.99)], 0.01, "fragments"),
    ],
)
def test_assess(lines, ink, weak):
    weakness = ocr_layout.assess(lines, ink, 0.85).weakness
    assert (weakness is None) if weak is None else (weak in (weakness or ""))


def test_mean_confidence_weighs_characters():
    lines = [Line("a", (0, 0, 1, 1), 0.0), Line("abc", (0, 0, 1, 1), 1.0)]
    assert ocr_layout.mean_confidence(lines) == pytest.approx(0.75)


def test_engine_threads_are_the_jobs_cpu_share(monkeypatch):
    from pipelines.ocr import job_threads

    available = len(os.sched_getaffinity(0))
    monkeypatch.setenv("HYPERMEDIA_JOB_CPUS", "1")
    assert job_threads() == 1
    monkeypatch.setenv("HYPERMEDIA_JOB_CPUS", str(available + 5))
    assert job_threads() == available
    monkeypatch.delenv("HYPERMEDIA_JOB_CPUS")
    assert job_threads() == available
