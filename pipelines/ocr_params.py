"""``ocr`` parameters: validated into an :class:`OcrRequest`, named as output types.

Pure (no engine, no file): the API validates a request with it at submit (an unknown
language is refused there with 422, before any job exists), the step again in its
child. Parameters are the profile's ``params`` merged with the request's:

``lang``
    the page's language(s): ``"en"``, ``"en+de"`` or ``["en", "de"]``; codes from
    :data:`LANGUAGES` (ISO 639-1, ``zh`` simplified and ``zh-hant`` traditional
    Chinese), default ``"en"``. Each engine of the chain is asked only for what it
    has models for; a language no engine of the chain reads is refused.
``engines``
    the escalation chain, first engine first: names from :data:`ENGINES`, default
    ``["ppocr", "ppocr-cls", "tesseract"]``. A page goes to the next engine only when
    the previous result is weak (:mod:`pipelines.ocr`). ``paddle`` (the PaddleOCR
    package itself, extra ``paddle``) needs ``paddle_models`` in the profile.
``min_confidence``
    0..1 in hundredths (0.97, not 0.971: the output's name holds it, ``c97``), default
    0.97: a page whose mean line confidence is below it escalates.
    PP-OCR gives 0.98-1.00 on pages it reads right (the corpus's clean pages) and
    0.90-0.96 where lines are upside down or the print is tiny; Tesseract's own
    numbers run lower (0.93-0.97 on clean pages), so a Tesseract result at the end of
    the chain is kept only when it beats the others.
``dpi``
    72..600, default 300: how finely PDF pages are rendered for OCR (images are
    read at their own size).
``text_layer``
    ``"auto"`` (default): a PDF page whose own text layer is good keeps it and is not
    OCR-ed; ``"ocr"``: every page is OCR-ed.
``layout``
    ``true`` (default): the layout model finds the page's regions (text, title,
    figure, table ...) and the JSON's blocks are those regions; ``false``: blocks
    are the reading order's only (no ``type``). The model costs ~0.15 CPU-seconds a
    page, 7-13 % of ppocr's on the generated pages.
``max_pages``, ``max_pixels`` (the profile's, never a request's)
    the largest document and page (pixels) the step reads.
``paddle_models`` (the profile's, never a request's: paths on the worker)
    the ``paddle`` engine's models, every path given, nothing looked for or
    downloaded: ``{det = ".../ch_PP-OCRv4_det_infer", rec = ".../ch_PP-OCRv4_rec_infer",
    dict = ".../ppocr_keys_v1.txt", languages = ["en", "zh"]}``: the detection and
    recognition models' Paddle inference directories (``inference.pdiparams`` beside
    ``inference.pdmodel`` or ``inference.json``), the recognition model's character
    list, and the languages that model reads (codes as ``lang``'s).

Output types carry every parameter that changes the result::

    ocr-en-ppocr_ppocr-cls_tesseract-c97-d300.txt   (.json, .pdf)

(``-ocr`` appended for ``text_layer = "ocr"``, ``-nolayout`` for ``layout = false``.)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipelines.params import integer, reject_unknown
from pipelines.registry import PipelineError


@dataclass(frozen=True, slots=True)
class Language:
    code: str
    name: str
    # Tesseract's traineddata name (Debian: tesseract-ocr-<name>), None: none exists.
    tesseract: str | None
    # Whether the PP-OCR models shipped in the rapidocr wheel (PP-OCRv6 small,
    # multilingual: Chinese, Japanese and Latin-script languages) read it: every letter
    # of its alphabet is in the recognition model's character list. Vietnamese is not:
    # the list lacks its stacked-diacritic vowels (ế, ệ, ấ ...), which PP-OCR drops
    # or reads as the bare vowel at 0.98 confidence (CER 0.11 on a generated page,
    # Tesseract's 0.00), so nothing would escalate.
    ppocr: bool


LANGUAGES: dict[str, Language] = {
    lang.code: lang
    for lang in (
        Language("en", "English", "eng", True),
        Language("de", "German", "deu", True),
        Language("fr", "French", "fra", True),
        Language("it", "Italian", "ita", True),
        Language("es", "Spanish", "spa", True),
        Language("pt", "Portuguese", "por", True),
        Language("nl", "Dutch", "nld", True),
        Language("pl", "Polish", "pol", True),
        Language("cs", "Czech", "ces", True),
        Language("sv", "Swedish", "swe", True),
        Language("da", "Danish", "dan", True),
        Language("fi", "Finnish", "fin", True),
        Language("no", "Norwegian", "nor", True),
        Language("tr", "Turkish", "tur", True),
        Language("vi", "Vietnamese", "vie", False),
        Language("zh", "Chinese (simplified)", "chi_sim", True),
        Language("zh-hant", "Chinese (traditional)", "chi_tra", True),
        Language("ja", "Japanese", "jpn", True),
        Language("ru", "Russian", "rus", False),
        Language("ar", "Arabic", "ara", False),
        Language("hi", "Hindi", "hin", False),
    )
}

ENGINES = ("ppocr", "ppocr-cls", "tesseract", "paddle")
DEFAULT_LANG = ("en",)
DEFAULT_ENGINES = ("ppocr", "ppocr-cls", "tesseract")
DEFAULT_MIN_CONFIDENCE = 0.97
DEFAULT_DPI = 300
TEXT_LAYER_MODES = ("auto", "ocr")
DEFAULT_MAX_PAGES = 100
MAX_PAGES_LIMIT = 10_000
DEFAULT_MAX_PIXELS = 100_000_000
MAX_PIXELS_LIMIT = 1_000_000_000

KEYS = (
    "lang",
    "engines",
    "min_confidence",
    "dpi",
    "text_layer",
    "layout",
    "max_pages",
    "max_pixels",
    "paddle_models",
)
# Keys only the profile sets (the operator's): a request naming one is refused at submit.
PROFILE_ONLY = ("paddle_models",)
PADDLE_MODEL_KEYS = ("det", "rec", "dict", "languages")


@dataclass(frozen=True, slots=True)
class PaddleModels:
    """Where the ``paddle`` engine's models are (absolute paths on the worker)."""

    det: str
    rec: str
    dict: str
    languages: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class OcrRequest:
    """``ocr``'s effective parameters."""

    languages: tuple[str, ...]
    engines: tuple[str, ...]
    min_confidence: float
    dpi: int
    text_layer: str
    max_pages: int
    max_pixels: int
    layout: bool = True
    paddle_models: PaddleModels | None = None

    def output_type(self, extension: str) -> str:
        layer = "" if self.text_layer == "auto" else f"-{self.text_layer}"
        layout = "" if self.layout else "-nolayout"
        confidence = round(self.min_confidence * 100)
        return (
            f"ocr-{'_'.join(self.languages)}-{'_'.join(self.engines)}"
            f"-c{confidence}-d{self.dpi}{layer}{layout}.{extension}"
        )

    def tesseract_languages(self) -> tuple[str, ...]:
        return tuple(
            name for code in self.languages if (name := LANGUAGES[code].tesseract) is not None
        )

    def ppocr_reads(self) -> bool:
        """Whether the shipped PP-OCR models read every language asked for."""
        return all(self.reads("ppocr", code) for code in self.languages)

    def reads(self, engine: str, code: str | None = None) -> bool:
        """Whether ``engine`` has models for language ``code`` (None: for every language
        asked for); ``paddle`` reads what its configured models say they read."""
        if code is None:
            return all(self.reads(engine, code) for code in self.languages)
        if engine.startswith("ppocr"):
            return LANGUAGES[code].ppocr
        if engine == "paddle":
            return self.paddle_models is not None and code in self.paddle_models.languages
        return LANGUAGES[code].tesseract is not None


def parse(params: Mapping[str, Any]) -> OcrRequest:
    """Validate ``params`` into an :class:`OcrRequest` (``invalid_params`` naming the key)."""
    reject_unknown("ocr", params, KEYS)
    text_layer = params.get("text_layer") or "auto"
    if text_layer not in TEXT_LAYER_MODES:
        raise PipelineError(
            "invalid_params",
            f"ocr: text_layer must be one of {', '.join(TEXT_LAYER_MODES)}, got {text_layer!r}",
        )
    layout = params.get("layout")
    layout = True if layout is None else layout
    if not isinstance(layout, bool):
        raise PipelineError("invalid_params", f"ocr: layout must be true or false, got {layout!r}")
    request = OcrRequest(
        languages=_languages(params.get("lang")),
        engines=_engines(params.get("engines")),
        min_confidence=_hundredths(params, "min_confidence", DEFAULT_MIN_CONFIDENCE),
        dpi=integer(params, "dpi", 72, 600, DEFAULT_DPI),
        text_layer=text_layer,
        max_pages=integer(params, "max_pages", 1, MAX_PAGES_LIMIT, DEFAULT_MAX_PAGES),
        max_pixels=integer(params, "max_pixels", 1, MAX_PIXELS_LIMIT, DEFAULT_MAX_PIXELS),
        layout=layout,
        paddle_models=_paddle_models(params.get("paddle_models")),
    )
    if "paddle" in request.engines and request.paddle_models is None:
        raise PipelineError(
            "invalid_params",
            "ocr: the paddle engine has no models here: the ocr profile sets no paddle_models",
        )
    if not any(request.reads(engine) for engine in request.engines):
        unread = [
            c for c in request.languages if not any(request.reads(e, c) for e in request.engines)
        ]
        raise PipelineError(
            "invalid_params",
            f"ocr: no engine of the chain ({', '.join(request.engines)}) reads"
            f" {', '.join(unread or request.languages)}: add tesseract to engines",
        )
    return request


def _paddle_models(value: object) -> PaddleModels | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or sorted(value) != sorted(PADDLE_MODEL_KEYS):
        raise PipelineError(
            "invalid_params",
            f"ocr: paddle_models must be a table of {', '.join(PADDLE_MODEL_KEYS)}, got {value!r}",
        )
    paths = {}
    for key in ("det", "rec", "dict"):
        path = value[key]
        if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
            raise PipelineError(
                "invalid_params", f"ocr: paddle_models.{key} must be an absolute path, got {path!r}"
            )
        paths[key] = path
    try:
        languages = _languages(value["languages"])
    except PipelineError as exc:
        reason = exc.message.removeprefix("ocr: ")
        raise PipelineError("invalid_params", f"ocr: paddle_models.languages: {reason}") from None
    return PaddleModels(paths["det"], paths["rec"], paths["dict"], languages)


def _languages(value: object) -> tuple[str, ...]:
    if value is None:
        return DEFAULT_LANG
    if isinstance(value, str):
        codes = [part.strip().lower() for part in value.split("+")]
    elif isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        codes = [str(v).strip().lower() for v in value]
    else:
        raise PipelineError(
            "invalid_params", f"ocr: lang must be a code like 'en' or 'en+de', got {value!r}"
        )
    unknown = [code for code in codes if code not in LANGUAGES]
    if unknown or not codes:
        raise PipelineError(
            "invalid_params",
            f"ocr: unknown language {', '.join(map(repr, unknown)) or repr(value)}"
            f" (known: {', '.join(LANGUAGES)})",
        )
    return tuple(dict.fromkeys(codes))


def _engines(value: object) -> tuple[str, ...]:
    if value is None:
        return DEFAULT_ENGINES
    names = [value] if isinstance(value, str) else value
    if (
        not isinstance(names, list | tuple)
        or not names
        or not all(isinstance(name, str) and name in ENGINES for name in names)
    ):
        raise PipelineError(
            "invalid_params",
            f"ocr: engines must be a list of {', '.join(ENGINES)}, got {value!r}",
        )
    if len(set(names)) != len(names):
        raise PipelineError("invalid_params", f"ocr: engines lists one twice: {value!r}")
    return tuple(names)


def _hundredths(params: Mapping[str, Any], key: str, default: float) -> float:
    """A fraction in hundredths: the output's name holds it as a whole percent, so two
    requests that name one output asked for the same thing."""
    value = _fraction(params, key, default)
    if abs(value * 100 - round(value * 100)) > 1e-9:
        raise PipelineError(
            "invalid_params", f"ocr: {key} is given in hundredths (0.97), got {value}"
        )
    return round(value, 2)


def _fraction(params: Mapping[str, Any], key: str, default: float) -> float:
    value = params.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PipelineError("invalid_params", f"ocr: {key} must be a number, got {value!r}")
    if not 0 <= value <= 1:
        raise PipelineError("invalid_params", f"ocr: {key} must be in 0..1, got {value}")
    return float(value)
