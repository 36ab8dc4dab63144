"""The ocr step on pages of other scripts and on skewed pages, drawn here with known
text: the real engines (PP-OCR's ONNX models from the rapidocr wheel, libtesseract on
Debian's tessdata).

- Every language the parameters say PP-OCR reads has its letters in the recognition
  model's character list: a language whose letters are missing is read with high
  confidence and letters dropped, so the chain would never escalate it.
- A Vietnamese page through the default chain is read within 2 % CER.
- An Arabic page (Tesseract's ``ara``) at 24, 48 and 96 px type is read within 3 %
  CER: each line whole, its words in reading order, each word's letters in their order.
- A simplified Chinese page (Tesseract's ``chi_sim``) at 32, 64 and 96 px type is read
  within 3 % CER (Tesseract's spaces between words left out).
- A page skewed by 4 degrees either way is turned level before it is read (``deskew``
  in the JSON) and its lines come out one by one, in order.
- Every page of a multi-page TIFF is read, in order, within ``max_pages``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipelines import ocr, ocr_engines, ocr_params
from pipelines.registry import USAGE_OUTPUT
from tests.generated import ocr_pages
from tests.ocr_support import cer

# Letters of each language beyond ASCII's (Chinese and Japanese: a few common ones).
ALPHABETS = {
    "en": "",
    "de": "äöüßÄÖÜ",
    "fr": "àâçéèêëîïôûùüÿœ",
    "it": "àèéìòù",
    "es": "ñáéíóúü",
    "pt": "ãõçáâêéíóôú",
    "nl": "ëïé",
    "pl": "ąćęłńóśźżŁŚŻ",
    "cs": "áčďéěíňóřšťúůýž",
    "sv": "åäöÅÄÖ",
    "da": "æøåÆØÅ",
    "fi": "äöå",
    "no": "æøåÆØÅ",
    "tr": "çğıöşüİĞŞ",
    "vi": "ăâđêôơưạảấầẩẫậắằẳẵặẹẻẽếềểễệỉịọỏốồổỗộớờởỡợụủứừửữựỳỵỷỹ",
    "zh": "的是中国语",
    "zh-hant": "們國語這個",
    "ja": "あいうアイウ日本語",
}


def run(path: Path, workdir: Path, params: dict[str, Any]) -> tuple[Any, str]:
    outputs = ocr.ocr(path, params, workdir)
    (text,) = [o for o in outputs if o.output_type.endswith(".txt")]
    assert [o for o in outputs if o.output_type == USAGE_OUTPUT]
    return outputs, Path(text.path).read_text(encoding="utf-8")


def test_the_languages_ppocr_reads_are_in_its_models_alphabet():
    import onnxruntime  # type: ignore[import-untyped]

    model = ocr_engines.ppocr_model_dir() / "PP-OCRv6_rec_small.onnx"
    session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    characters = set(session.get_modelmeta().custom_metadata_map["character"].split("\n"))
    claimed = [code for code, language in ocr_params.LANGUAGES.items() if language.ppocr]
    assert set(claimed) <= set(ALPHABETS), "add the new language's letters to ALPHABETS"
    missing = {
        code: "".join(c for c in ALPHABETS[code] if c not in characters)
        for code in claimed
        if any(c not in characters for c in ALPHABETS[code])
    }
    assert missing == {}


@pytest.mark.timeout(300)
def test_a_vietnamese_page_is_read_by_the_chain(tmp_path: Path):
    page = tmp_path / "vi.png"
    ocr_pages.script_page(ocr_pages.VIETNAMESE).save(page)
    _, text = run(page, tmp_path / "work", {"lang": "vi"})
    truth = "\n".join(ocr_pages.VIETNAMESE)
    assert cer(text, truth).cer <= 0.02, text


@pytest.mark.timeout(300)
@pytest.mark.parametrize("size", [24, 48, 96])
def test_an_arabic_page_is_read_whole_lines_in_reading_order(tmp_path: Path, size: int):
    """Tesseract's line finding drops whole Arabic lines of large text: the page was
    enlarged by its size (2x at 24 and 48 px type here) and a line of three was lost
    (CER 0.33-0.68); it is scaled by its text's height now."""
    page = tmp_path / "ar.png"
    ocr_pages.script_page(ocr_pages.ARABIC, rtl=True, size=size).save(page)
    _, text = run(page, tmp_path / "work", {"lang": "ar"})
    truth = "\n".join(ocr_pages.ARABIC)
    assert cer(text, truth).cer <= 0.03, text


@pytest.mark.timeout(300)
@pytest.mark.parametrize("size", [32, 64, 96])
def test_a_chinese_page_of_large_text_is_read_by_tesseract(tmp_path: Path, size: int):
    """Tesseract misreads Han characters once the text passes ~40 px: the page was
    enlarged by its size (3x at 32 and 64 px type here) or read as it came (CER 0.15,
    0.22, 0.17); it is scaled by its text's height now."""
    page = tmp_path / "zh.png"
    ocr_pages.script_page(ocr_pages.CHINESE, size=size, cjk=True).save(page)
    _, text = run(page, tmp_path / "work", {"lang": "zh", "engines": ["tesseract"]})
    truth = "".join(ocr_pages.CHINESE)
    assert cer("".join(text.split()), truth).cer <= 0.03, text


@pytest.mark.timeout(300)
@pytest.mark.parametrize("degrees", [-4, 4])
def test_a_page_skewed_a_few_degrees_keeps_its_line_order(tmp_path: Path, degrees: int):
    """Turned by 4 degrees, each printed line's box overlaps the next's by most of its
    height: read as they lie, the lines would merge into rows read left to right."""
    from PIL import Image

    page = tmp_path / "skewed.png"
    clean = ocr_pages.clean_page()
    clean.rotate(degrees, resample=Image.Resampling.BICUBIC, expand=True, fillcolor=255).save(page)
    outputs, text = run(page, tmp_path / "work", {"engines": ["tesseract"]})
    assert [line for line in text.splitlines() if line] == list(ocr_pages.PARAGRAPHS)
    (document,) = [
        o for o in outputs if o.output_type.endswith(".json") and o.output_type != USAGE_OUTPUT
    ]
    (described,) = json.loads(Path(document.path).read_text(encoding="utf-8"))["pages"]
    assert described["deskew"] == pytest.approx(-degrees, abs=0.5)


def test_every_page_of_a_multi_page_tiff_is_read(tmp_path: Path):
    """A fax or a scanner's document: a TIFF of several pages. The step read its first
    page alone and said nothing of the others; it reads each as a page now (the JSON's
    pages, the text in page order, one progress report a page), within max_pages."""
    from PIL import Image

    from pipelines.registry import PipelineError

    words = ("Alpha harbour morning", "Bravo station evening", "Charlie garden winter")
    pages = [
        ocr_pages.script_page((line,), size=42).convert("L").point(lambda v: 255 if v > 128 else 0)
        for line in words
    ]
    path = tmp_path / "fax.tif"
    pages[0].save(path, save_all=True, append_images=pages[1:], compression="tiff_lzw")
    assert getattr(Image.open(path), "n_frames", 1) == 3
    outputs, text = run(path, tmp_path / "work", {"engines": ["tesseract"]})
    (document,) = [
        o for o in outputs if o.output_type.startswith("ocr-") and o.output_type.endswith(".json")
    ]
    found = json.loads(Path(document.path).read_text(encoding="utf-8"))
    assert [page["page"] for page in found["pages"]] == [1, 2, 3]  # was [1]
    positions = [text.find(line) for line in words]
    assert -1 not in positions and positions == sorted(positions), text
    with pytest.raises(PipelineError) as refused:
        ocr.ocr(path, {"engines": ["tesseract"], "max_pages": 2}, tmp_path / "again")
    assert refused.value.code == "page_limit" and "3 pages" in refused.value.message
