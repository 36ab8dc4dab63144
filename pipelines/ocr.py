"""The ``ocr`` step: an image or PDF in; text, a JSON of pages/blocks/lines, a searchable PDF out.

Parameters: :mod:`pipelines.ocr_params`. Engines: :mod:`pipelines.ocr_engines`.
Reading order: :mod:`pipelines.ocr_layout`. PDF in and out: :mod:`pipelines.ocr_pdf`.

Per page:

1. A PDF page whose own text layer is good (``text_layer = "auto"``) keeps it: its
   lines come from PDFium, ``source: "text-layer"``, no engine runs. Every other
   page is rendered at ``dpi`` (PDF) or decoded upright (images: EXIF orientation
   applied, alpha flattened onto white), within ``max_pixels``.
2. Tesseract's OSD says whether the page is turned by 90/180/270 degrees; a turned
   page is turned upright first (``orientation`` in the JSON); a page skewed by a
   degree or more (up to 5) is then turned level (``deskew``), so that the lines'
   boxes do not overlap and reading order holds. The page image of the searchable
   PDF is the page as read, upright and level.
3. The chain (``engines``) runs in order until a result is good
   (:func:`pipelines.ocr_layout.assess`: mean line confidence at least
   ``min_confidence``, plausible text); each weak result escalates to the next
   engine. The page keeps the best result seen (good first, then the highest
   confidence) and records every attempt: engine, confidence, CPU seconds and why
   it escalated. An engine that is not installed, or does not read the language,
   is recorded as skipped.
4. With ``layout`` (default on) the layout model
   (:class:`pipelines.ocr_engines.LayoutModel`, CDLA classes: text, title, figure,
   table ...) finds the page's regions (text-layer pages too), and the page's lines
   become blocks of those regions (:func:`pipelines.ocr_layout.laid_out`);
   lines outside every region stay ``text`` blocks, blocks in reading order. A table
   block holds its lines row by row, ``cells`` null and a ``structure`` note: no
   table-structure model can run offline (none ships in a wheel), so no cells are
   guessed and no CSV is written.

Outputs (names from :meth:`OcrRequest.output_type`): ``.txt`` (UTF-8, pages apart
by a form feed, blocks by a blank line, in reading order), ``.json`` (schema in
:func:`_page_json`) and ``.pdf`` (page images with an invisible text layer); and the
job's units of work for the worker (:func:`_usage`: page, engine_pass, escalation counts),
which the ocr profile's ``unit_costs`` price; :func:`max_units` bounds them for a submit
to reserve.
A document of more than one page is read in pieces that survive the loss of its
attempt (:mod:`pipelines.ocr_resume`): the pages read are committed as checkpoints
every few pages, and a retry reads only the pages it does not find there.
Engines run on ``HYPERMEDIA_JOB_CPUS`` threads (the job's CPU share, set by the
worker), else on the CPUs this process may use.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines import ocr_layout, ocr_params, ocr_resume, progress, sniff
from pipelines.ocr_engines import Engine, LayoutModel, Line, Orientation, Region
from pipelines.registry import (
    Output,
    PipelineError,
    register,
    register_max_units,
    usage_output,
)

if TYPE_CHECKING:
    from pipelines.formats.inspection import Inspection
    from pipelines.ocr_engines import PageArray

log = logging.getLogger(__name__)

JSON_VERSION = 1
# What a table block says instead of its cells.
NO_TABLE_STRUCTURE = "not available: no offline table-structure model is installed"
TEXT_CONTENT_TYPE = "text/plain; charset=utf-8"
_PAGE_SEPARATOR = "\n\f\n"
# Images without a usable resolution are taken as scanned at this (for the PDF's
# page size only). libvips reports 72 dpi for a PNG without pHYs: screen resolutions
# (72, 96) are taken as no resolution, or a 2000 px scan would make a 70 cm page.
_DEFAULT_IMAGE_DPI = 300
_MIN_IMAGE_DPI = 150
_IMAGE_KINDS = ("jpeg", "png", "gif", "webp", "tiff", "bmp", "pnm")


def job_threads() -> int:
    """Inference threads: the job's CPU share as the worker states it, else the CPUs
    this process may run on."""
    available = len(os.sched_getaffinity(0)) or 1
    stated = os.environ.get("HYPERMEDIA_JOB_CPUS", "")
    if stated.isdigit() and int(stated) > 0:
        return min(int(stated), available)
    return available


def check(params: Mapping[str, Any]) -> None:
    """Refuse, before a job exists, parameters the step would refuse (unknown
    language, a language no installed engine of the chain reads)."""
    request = ocr_params.parse(params)
    others = [engine for engine in request.engines if engine != "tesseract"]
    if "tesseract" in request.engines and not any(request.reads(e) for e in others):
        from pipelines.ocr_engines import tesseract_languages

        installed = tesseract_languages()
        if installed:
            missing = [t for t in request.tesseract_languages() if t not in installed]
            if missing:
                raise PipelineError(
                    "invalid_params",
                    f"ocr: no installed model reads {'+'.join(request.languages)}"
                    f" (tesseract lacks {', '.join(missing)})",
                )


@dataclass(slots=True)
class Attempt:
    engine: str
    confidence: float | None = None
    weakness: str | None = None
    skipped: str | None = None
    cpu_seconds: float = 0.0
    lines: list[Line] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"engine": self.engine}
        if self.skipped is not None:
            out["skipped"] = self.skipped
            return out
        out["confidence"] = round(self.confidence or 0.0, 4)
        out["lines"] = len(self.lines)
        # What this engine read, in reading order: what escalation weighed.
        out["text"] = ocr_layout.page_text(ocr_layout.reading_order(self.lines))
        out["cpu_seconds"] = round(self.cpu_seconds, 3)
        if self.weakness is not None:
            out["escalated_because"] = self.weakness
        return out


@dataclass(slots=True)
class PageResult:
    number: int
    width: int
    height: int
    dpi: float
    source: str  # "ocr" | "text-layer"
    lines: list[Line]
    engine: str | None = None
    confidence: float | None = None
    orientation: int = 0
    deskew: float = 0.0
    attempts: list[Attempt] = field(default_factory=list)
    # The layout model's regions, None when it did not run.
    regions: list[Region] | None = None
    layout_cpu_seconds: float = 0.0
    blocks: list[ocr_layout.LaidBlock] = field(default_factory=list)


class Engines:
    """The chain's engines, each built on first use and kept for the next pages."""

    def __init__(self, request: ocr_params.OcrRequest, threads: int) -> None:
        self.request = request
        self.threads = threads
        self._built: dict[str, Engine | PipelineError] = {}
        self._layout: LayoutModel | None = None
        # Tesseract's OSD, loaded on the first page and kept for the others.
        self.orientation = Orientation()

    def get(self, name: str) -> Engine | str:
        """The engine, or why it cannot run here."""
        if name.startswith("ppocr") and not self.request.ppocr_reads():
            return f"the PP-OCR models do not read {'+'.join(self.request.languages)}"
        if name == "paddle" and not self.request.reads(name):
            return f"the paddle models do not read {'+'.join(self.request.languages)}"
        if name not in self._built:
            from pipelines import ocr_engines

            try:
                self._built[name] = ocr_engines.create(
                    name,
                    self.request.tesseract_languages(),
                    self.threads,
                    paddle_models=self.request.paddle_models,
                )
            except PipelineError as exc:
                if exc.code != "engine_unavailable":
                    raise
                self._built[name] = exc
        built = self._built[name]
        return built.message if isinstance(built, PipelineError) else built

    def layout(self) -> LayoutModel:
        """The layout model (``engine_unavailable`` if rapid-layout is missing)."""
        if self._layout is None:
            from pipelines import ocr_engines

            self._layout = ocr_engines.LayoutModel(self.threads)
        return self._layout

    def close(self) -> None:
        for engine in self._built.values():
            if not isinstance(engine, PipelineError):
                engine.close()
        self._built.clear()
        if self._layout is not None:
            self._layout.close()
            self._layout = None
        self.orientation.close()


def detect_regions(
    page: PageArray, request: ocr_params.OcrRequest, engines: Engines
) -> tuple[list[Region] | None, float]:
    """The page's regions by the layout model (None when ``layout`` is off) and the
    CPU seconds it took."""
    if not request.layout:
        return None, 0.0
    started = time.process_time()
    regions = engines.layout().detect(page)
    return regions, time.process_time() - started


def recognise_page(
    page: PageArray, request: ocr_params.OcrRequest, engines: Engines
) -> tuple[PageArray, int, float, list[Attempt], Attempt]:
    """Turn ``page`` upright and level and run the chain on it: the upright page, its
    turn, the degrees it was turned level by, every attempt and the chosen one."""
    import numpy as np

    from pipelines.ocr_engines import OSD_MIN_CONFIDENCE, deskew, page_binary, page_orientation

    turn = 0
    # Binarised once for OSD and deskew (a 3312 x 2550 page: 0.19 CPU-s a time); a
    # turned page is binarised again, upright.
    binary: PageArray | None = page_binary(page)
    degrees, confidence = page_orientation(page, binary, engines.orientation)
    if degrees and confidence >= OSD_MIN_CONFIDENCE:
        turn = degrees
        # OSD's angle is how far the page is turned clockwise: turn it back.
        page = np.ascontiguousarray(np.rot90(page, k=degrees // 90))
        binary = None
    page, skew = deskew(page, binary)
    grey = page.min(axis=2)
    dark = grey < 128
    ink = float(dark.mean())
    # Engines read the inked part of the page: a line on a blank A4 scan would be
    # shrunk to nothing by a detector that scales whole pages to ~2000 px.
    (x0, y0, x1, y1) = _ink_box(dark)
    region = np.ascontiguousarray(page[y0:y1, x0:x1])
    attempts: list[Attempt] = []
    for name in request.engines:
        engine = engines.get(name)
        if isinstance(engine, str):
            attempts.append(Attempt(name, skipped=engine))
            continue
        started = time.process_time()
        lines = [_shifted(line, x0, y0) for line in engine.recognize(region)]
        assessment = ocr_layout.assess(lines, ink, request.min_confidence)
        attempt = Attempt(
            name,
            confidence=assessment.confidence,
            weakness=assessment.weakness,
            cpu_seconds=time.process_time() - started,
            lines=lines,
        )
        attempts.append(attempt)
        if assessment.weakness is None:
            break
    tried = [a for a in attempts if a.skipped is None]
    if not tried:
        reasons = "; ".join(f"{a.engine}: {a.skipped}" for a in attempts)
        raise PipelineError("engine_unavailable", f"ocr: no engine of the chain can run: {reasons}")
    chosen = max(tried, key=lambda a: (a.weakness is None, a.confidence or 0.0))
    return page, turn, skew, attempts, chosen


def _ink_box(dark: Any) -> tuple[int, int, int, int]:
    """The box around the page's dark pixels, with a margin; the whole page if none."""
    import numpy as np

    height, width = dark.shape
    rows = np.flatnonzero(dark.any(axis=1))
    columns = np.flatnonzero(dark.any(axis=0))
    if not len(rows):
        return 0, 0, width, height
    margin = max(32, min(width, height) // 50)
    return (
        max(0, int(columns[0]) - margin),
        max(0, int(rows[0]) - margin),
        min(width, int(columns[-1]) + 1 + margin),
        min(height, int(rows[-1]) + 1 + margin),
    )


def _shifted(line: Line, dx: int, dy: int) -> Line:
    x0, y0, x1, y1 = line.bbox
    return Line(line.text, (x0 + dx, y0 + dy, x1 + dx, y1 + dy), line.confidence)


# -- input -------------------------------------------------------------------------------


def _detect(path: Path) -> str:
    with path.open("rb") as file:
        head = file.read(sniff.HEAD_BYTES)
    if b"%PDF-" in head[:1024]:
        return "pdf"
    detected = sniff.sniff(head)
    if detected.kind == "empty":
        raise PipelineError("invalid_input", "the input file is empty")
    if detected.kind not in _IMAGE_KINDS:
        raise PipelineError(
            "unsupported_format",
            f"{detected.label} cannot be OCR-ed (a PDF, JPEG, PNG, GIF, WebP, TIFF, BMP or"
            " PNM image can)",
        )
    return detected.kind


def load_image(path: Path, kind: str, max_pixels: int) -> tuple[PageArray, float]:
    """The image upright (EXIF orientation applied), RGB on white; its dpi."""
    from pipelines import images
    from pipelines.image_source import DecodeFailed, describe_error

    try:
        if kind == "pnm":
            source: Any = _pnm_input(path)
        else:
            source = images.open_input(path, images.detect(path))
        try:
            width, height = source.header.size
            if width * height > max_pixels:
                raise PipelineError(
                    "pixel_limit",
                    f"{width}x{height} = {width * height:,} pixels is over the limit of"
                    f" {max_pixels:,} (max_pixels)",
                )
            if source.header.transposed:
                width, height = height, width
            image = source.render(width, height, None, False)
        finally:
            source.close()
    except DecodeFailed as exc:
        raise PipelineError(
            "invalid_input", f"the image cannot be decoded: {describe_error(exc, path)}"
        ) from None
    return _page_array(image)


def tiff_pages(path: Path) -> int:
    """How many pages (directories) a TIFF holds, from its header."""
    from pipelines import images
    from pipelines.image_source import DecodeFailed, describe_error

    try:
        source = images.open_input(path, images.detect(path))
    except DecodeFailed as exc:
        raise PipelineError(
            "invalid_input", f"the image cannot be decoded: {describe_error(exc, path)}"
        ) from None
    try:
        return max(1, source.header.frames)
    finally:
        source.close()


def load_tiff_page(path: Path, index: int, max_pixels: int) -> tuple[PageArray, float]:
    """Page ``index`` (from 0) of a TIFF, upright, RGB on white; its dpi."""
    import pyvips

    from pipelines.image_source import DecodeFailed
    from pipelines.image_vips import check_loader

    try:
        image = pyvips.Image.tiffload(str(path), page=index, access="sequential")
        check_loader(image, "tiffload")
    except (pyvips.Error, DecodeFailed) as exc:
        reason = " ".join(str(exc).split())
        raise PipelineError(
            "invalid_input", f"page {index + 1} of the TIFF cannot be decoded: {reason}"
        ) from None
    if image.width * image.height > max_pixels:
        raise PipelineError(
            "pixel_limit",
            f"page {index + 1}: {image.width}x{image.height} ="
            f" {image.width * image.height:,} pixels is over the limit of {max_pixels:,}"
            " (max_pixels)",
        )
    return _page_array(image.autorot())


def _page_array(image: Any) -> tuple[PageArray, float]:
    """A decoded page as the engines read it (RGB, 8 bits, on white), and its dpi."""
    import numpy as np
    import pyvips

    from pipelines import images

    dpi = _image_dpi(image)
    if image.hasalpha():
        image = image.flatten(background=[255] * (image.bands - 1))
    if image.interpretation not in ("srgb", "b-w") or image.format != "uchar":
        image = image.colourspace("srgb").cast("uchar")
    if image.bands == 1:
        image = image.bandjoin([image, image])
    try:
        # libvips decodes here, into one buffer of the whole page.
        array = np.asarray(image.numpy(), dtype=np.uint8)
    except pyvips.Error as exc:
        reason = " ".join(str(exc).split())
        if any(marker in reason for marker in images.NO_MEMORY):
            # The sandbox's memory_limit, as the image steps report it.
            raise MemoryError(f"libvips could not decode the page: {reason}") from None
        raise PipelineError("invalid_input", f"the image cannot be decoded: {reason}") from None
    if array.ndim == 2:
        array = np.stack([array] * 3, axis=2)
    return np.ascontiguousarray(array[:, :, :3]), dpi


def _pnm_input(path: Path) -> Any:
    from PIL import Image

    from pipelines.image_decoders import _PillowInput
    from pipelines.image_source import DecodeFailed, Header

    try:
        image: Image.Image = Image.open(path, formats=["PPM"])
    except Exception as exc:
        raise DecodeFailed(str(exc) or type(exc).__name__) from exc
    if image.mode == "1":
        image = image.convert("L")
    width, height = image.size
    return _PillowInput(image=image, header=Header(width=width, height=height))


def _image_dpi(image: Any) -> float:
    try:
        dpi = float(image.xres) * 25.4
    except (AttributeError, TypeError, ValueError):
        return _DEFAULT_IMAGE_DPI
    return dpi if _MIN_IMAGE_DPI <= dpi <= 2400 else _DEFAULT_IMAGE_DPI


# -- the step ----------------------------------------------------------------------------


# Imported by the ocr worker's fork server before it forks: a one-page job with the
# profile's defaults through the real fork server 6.46 -> 6.13 CPU-s (p50 of 5,
# interleaved; bench/ocr_preload.py). ``rapidocr`` alone imports nothing (its package
# imports lazily): ``rapidocr.main`` (its modules and their OmegaConf defaults) took
# another 0.43 CPU-s off each job (6.66 -> 6.23, p50 of 5 interleaved, load 8-10).
# Engines and models are still built in each job:
# a server-built engine saved 0.1-0.3 CPU-s more, fixed jobs at one inference thread
# and cost the server 240 MB (bench/README.md).
# Also the searchable PDF's writer (fpdf2 and what it imports: ~0.3 CPU-s a job) and the
# image decoders with their libvips and Pillow settings (pipelines.images.PRELOAD).
# And pipelines.ocr_engines, whose prepare_fork_server sets the children's malloc to
# keep freed memory for reuse (a 300-dpi page: 9.3-11.3 -> 7.9 CPU-s).
PRELOAD = (
    "numpy",
    "cv2",
    "onnxruntime",
    "rapidocr",
    "rapidocr.main",
    "rapidocr.inference_engine.onnxruntime.main",
    "rapid_layout",
    "rapid_layout.inference_engine.onnxruntime.main",
    "fpdf",
    "pipelines.ocr_pdf",
    "pipelines.image_vips",
    "pipelines.image_pillow",
    "pipelines.image_decoders",
    "pipelines.ocr_engines",
)


@register(
    "ocr", check=check, profile_only=ocr_params.PROFILE_ONLY, preload=PRELOAD, checkpoints=True
)
def ocr(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """OCR an image or PDF: text, JSON and a searchable PDF (see the module doc)."""
    request = ocr_params.parse(params)
    kind = _detect(input_path)
    workdir.mkdir(parents=True, exist_ok=True)
    pages_dir = workdir / "ocr-pages"
    pages_dir.mkdir(exist_ok=True)
    outputs: list[Output] = []
    engines = Engines(request, job_threads())
    results: list[PageResult] = []
    images: list[Path] = []
    saved: list[ocr_resume.PageCheckpoints] = []

    def pieces(count: int) -> ocr_resume.PageCheckpoints:
        # Made once the page count is known: a piece is only for a document of as many.
        done = ocr_resume.PageCheckpoints(workdir, pages_dir, count, params)
        saved.append(done)
        return done

    try:
        if kind == "pdf":
            _ocr_pdf(input_path, request, engines, pages_dir, results, images, pieces)
        elif kind == "tiff" and (count := tiff_pages(input_path)) > 1:
            # Every page of a multi-page TIFF (a fax, a scanner's document): the first
            # alone was read, and the others were left out without a word.
            if count > request.max_pages:
                raise PipelineError(
                    "page_limit",
                    f"the TIFF has {count:,} pages, over the limit of {request.max_pages:,}",
                )
            done = pieces(count)
            for index in range(count):
                if not _resumed(done, index + 1, results, images):
                    page, dpi = load_tiff_page(input_path, index, request.max_pixels)
                    results.append(
                        _ocr_image_page(index + 1, page, dpi, request, engines, pages_dir, images)
                    )
                    done.add(results[-1], images[-1])
                progress.report(index + 1, count, "pages")
        else:
            page, dpi = load_image(input_path, kind, request.max_pixels)
            results.append(_ocr_image_page(1, page, dpi, request, engines, pages_dir, images))
            progress.report(1, 1, "pages")
        resumed = saved[0].resumed if saved else 0
        outputs = [
            *_write_outputs(results, images, request, workdir),
            _usage(results, workdir, resumed),
        ]
    finally:
        engines.close()
        shutil.rmtree(pages_dir, ignore_errors=True)
    return outputs


def _ocr_image_page(
    number: int,
    page: PageArray,
    dpi: float,
    request: ocr_params.OcrRequest,
    engines: Engines,
    pages_dir: Path,
    images: list[Path],
) -> PageResult:
    upright, turn, skew, attempts, chosen = recognise_page(page, request, engines)
    regions, layout_cpu = detect_regions(upright, request, engines)
    height, width = upright.shape[:2]
    images.append(_save_page_image(upright, pages_dir / f"page-{number}"))
    return PageResult(
        number=number,
        width=width,
        height=height,
        dpi=dpi,
        source="ocr",
        lines=chosen.lines,
        engine=chosen.engine,
        confidence=chosen.confidence,
        orientation=turn,
        deskew=skew,
        attempts=attempts,
        regions=regions,
        layout_cpu_seconds=layout_cpu,
    )


def _resumed(
    done: ocr_resume.PageCheckpoints, number: int, results: list[PageResult], images: list[Path]
) -> bool:
    """Whether page ``number`` was read by an earlier attempt (then it is taken)."""
    found = done.page(number)
    if found is None:
        return False
    results.append(found[0])
    images.append(found[1])
    return True


def _ocr_pdf(
    path: Path,
    request: ocr_params.OcrRequest,
    engines: Engines,
    pages_dir: Path,
    results: list[PageResult],
    images: list[Path],
    pieces: Callable[[int], ocr_resume.PageCheckpoints],
) -> None:
    import pypdfium2 as pdfium

    from pipelines import ocr_pdf, pdf

    with pdf.open_pdf(path) as document:
        count = len(document)
        if count < 1:
            raise PipelineError("invalid_input", "the PDF has no pages")
        if count > request.max_pages:
            raise PipelineError(
                "page_limit",
                f"the PDF has {count:,} pages, over the limit of {request.max_pages:,}",
            )
        done = pieces(count)
        for index in range(count):
            if _resumed(done, index + 1, results, images):
                progress.report(index + 1, count, "pages")
                continue
            try:
                page = document[index]
            except pdfium.PdfiumError:
                raise PipelineError(
                    "invalid_input", f"page {index + 1} of the PDF is damaged and cannot be loaded"
                ) from None
            try:
                array, scale = ocr_pdf.render_page(page, request.dpi, request.max_pixels)
                layer = ocr_pdf.text_layer(page, scale) if request.text_layer == "auto" else []
            finally:
                page.close()
            if layer and ocr_pdf.good_text_layer(layer):
                regions, layout_cpu = detect_regions(array, request, engines)
                height, width = array.shape[:2]
                images.append(_save_page_image(array, pages_dir / f"page-{index + 1}"))
                results.append(
                    PageResult(
                        number=index + 1,
                        width=width,
                        height=height,
                        dpi=request.dpi,
                        source="text-layer",
                        lines=layer,
                        regions=regions,
                        layout_cpu_seconds=layout_cpu,
                    )
                )
            else:
                results.append(
                    _ocr_image_page(
                        index + 1, array, request.dpi, request, engines, pages_dir, images
                    )
                )
            done.add(results[-1], images[-1])
            progress.report(index + 1, count, "pages")


def _usage(results: Sequence[PageResult], workdir: Path, resumed: int = 0) -> Output:
    """The job's units of work, as the ocr profile's ``unit_costs`` price them:
    ``page``, ``ocr_page`` (read by an engine, not a text layer), ``engine_pass``
    (engines that read a page; skipped ones are not) and ``escalation`` (the passes
    after each page's first), over the whole document, pages an earlier attempt read
    included (the job is charged as one uninterrupted attempt would be); and, on an
    attempt that took pages from earlier ones, ``pages_resumed``: how many (not
    priced), so that its record says how much the retry saved."""
    read = [r for r in results if r.source == "ocr"]
    passes = sum(1 for r in read for a in r.attempts if a.skipped is None)
    units = {
        "page": len(results),
        "ocr_page": len(read),
        "engine_pass": passes,
        "escalation": passes - len(read),
    }
    if resumed:
        units["pages_resumed"] = resumed
    return usage_output(workdir, units)


@register_max_units("ocr", units=("page", "ocr_page", "engine_pass", "escalation"))
def max_units(params: Mapping[str, Any], inspection: Inspection | None) -> dict[str, int]:
    """The most of each unit :func:`_usage` can report: every page read by every engine
    of the chain (each page after the first engine escalating to the last). Pages: 1
    for an image (the step reads its first frame), a TIFF's pages (it reads them all);
    a PDF's page count as its inspection found it; at most ``max_pages`` (the step
    refuses more); ``max_pages`` when it is not known (a PDF whose count the inspection
    could not read, an input never inspected)."""
    request = ocr_params.parse(params)
    pages = request.max_pages
    counted = inspection.details.get("pages") if inspection is not None else None
    if inspection is not None and inspection.kind == "image":
        pages = 1
        if inspection.mime == "image/tiff" and isinstance(counted, int) and counted > 1:
            pages = min(counted, request.max_pages)
    elif (
        inspection is not None
        and inspection.kind == "pdf"
        and isinstance(counted, int)
        and counted >= 1
    ):
        pages = min(counted, request.max_pages)
    engines = len(request.engines)
    return {
        "page": pages,
        "ocr_page": pages,
        "engine_pass": pages * engines,
        "escalation": pages * (engines - 1),
    }


def _save_page_image(page: PageArray, stem: Path) -> Path:
    """The page image for the searchable PDF: PNG for black and white, else JPEG.

    The PNG is saved at zlib's default level, not ``optimize``: fpdf2 decodes it and
    compresses the pixels again for the PDF, whose bytes are the same either way (a
    3312 x 2550 page 0.59 -> 0.14 CPU-s, its PNG 162 -> 171 kB: what a checkpoint
    keeps). Black and white is told by two comparisons, not ``np.isin`` (0.60 -> 0.03
    CPU-s on a 3600 x 4800 page)."""
    from PIL import Image

    grey = bool((page[:, :, 0] == page[:, :, 1]).all() and (page[:, :, 1] == page[:, :, 2]).all())
    if grey:
        plane = page[:, :, 0]
        if bool(((plane == 0) | (plane == 255)).all()):
            path = stem.with_suffix(".png")
            Image.fromarray(plane).convert("1").save(path)
            return path
        path = stem.with_suffix(".jpg")
        Image.fromarray(plane).save(path, quality=80)
        return path
    path = stem.with_suffix(".jpg")
    Image.fromarray(page).save(path, quality=80)
    return path


def _write_outputs(
    results: Sequence[PageResult],
    images: Sequence[Path],
    request: ocr_params.OcrRequest,
    workdir: Path,
) -> list[Output]:
    from pipelines import ocr_pdf

    texts = []
    for result in results:
        if result.regions is None:
            blocks = ocr_layout.reading_order(result.lines)
            result.blocks = [ocr_layout.LaidBlock("text", rows) for rows in blocks]
        else:
            result.blocks = ocr_layout.laid_out(result.lines, result.regions)
        texts.append(ocr_layout.page_text([b.rows for b in result.blocks if b.rows]))
    text_path = workdir / request.output_type("txt")
    text_path.write_text(_PAGE_SEPARATOR.join(texts) + "\n", encoding="utf-8")
    document = {
        "version": JSON_VERSION,
        "languages": list(request.languages),
        "engines": list(request.engines),
        "min_confidence": request.min_confidence,
        "pages": [_page_json(result, request) for result in results],
    }
    json_path = workdir / request.output_type("json")
    json_path.write_text(json.dumps(document, ensure_ascii=False, indent=1), encoding="utf-8")
    pdf_path = workdir / request.output_type("pdf")
    ocr_pdf.write_searchable_pdf(
        [
            ocr_pdf.PdfPage(
                image=image,
                width_px=result.width,
                height_px=result.height,
                width_pt=result.width * 72 / result.dpi,
                height_pt=result.height * 72 / result.dpi,
                lines=[line for block in result.blocks for row in block.rows for line in row],
            )
            for result, image in zip(results, images, strict=True)
        ],
        pdf_path,
    )
    for image in images:
        image.unlink(missing_ok=True)
    log.debug(
        "ocr: %d page(s): %s",
        len(results),
        ", ".join(f"{r.number}:{r.source}:{r.engine}" for r in results),
    )
    return [
        Output(text_path.name, text_path, TEXT_CONTENT_TYPE),
        Output(json_path.name, json_path, "application/json"),
        Output(pdf_path.name, pdf_path, "application/pdf"),
    ]


def _page_json(result: PageResult, request: ocr_params.OcrRequest) -> dict[str, Any]:
    """``{page, width, height, dpi, source, engine, confidence, orientation, deskew,
    attempts, layout, blocks: [{type, bbox, confidence, lines: [{text, bbox, confidence,
    engine, language}]}]}``; bboxes are ``[x0, y0, x1, y1]`` in the page image's pixels
    (after ``orientation``, then ``deskew``: the degrees, counter-clockwise, a skewed
    page was turned level by on a canvas grown to hold it; 0 when it was not).
    ``layout`` is ``{model, regions, cpu_seconds}`` or null when it is off (then
    blocks have no ``type`` nor ``confidence``). A block's ``type`` is its
    region's class (:class:`pipelines.ocr_engines.Region`; ``text`` for lines outside
    every region, ``confidence`` null), its bbox the region's; a ``table`` block adds
    ``cells: null`` and ``structure`` saying why (no table-structure model is installed:
    its lines are there, row by row, its cells are not guessed)."""
    engine = result.engine if result.source == "ocr" else "pdf-text-layer"
    language = "+".join(request.languages)
    blocks = []
    for laid in result.blocks:
        lines = [line for row in laid.rows for line in row]
        block: dict[str, Any] = {}
        if result.regions is not None:
            block["type"] = laid.kind
        block["bbox"] = list(ocr_layout.block_bbox(laid))
        if result.regions is not None:
            block["confidence"] = laid.region.confidence if laid.region else None
        if laid.kind == "table" and laid.region is not None:
            block["cells"] = None
            block["structure"] = NO_TABLE_STRUCTURE
        block["lines"] = [
            {
                "text": line.text,
                "bbox": list(line.bbox),
                "confidence": line.confidence,
                "engine": engine,
                "language": language,
            }
            for line in lines
        ]
        blocks.append(block)
    page: dict[str, Any] = {
        "page": result.number,
        "width": result.width,
        "height": result.height,
        "dpi": round(result.dpi, 2),
        "source": result.source,
        "engine": engine,
        "confidence": round(result.confidence, 4) if result.confidence is not None else None,
        "orientation": result.orientation,
        "deskew": round(result.deskew, 2),
        "attempts": [attempt.as_json() for attempt in result.attempts],
        "layout": None
        if result.regions is None
        else {
            "model": LayoutModel.name,
            "regions": len(result.regions),
            "cpu_seconds": round(result.layout_cpu_seconds, 3),
        },
        "blocks": blocks,
    }
    return page
