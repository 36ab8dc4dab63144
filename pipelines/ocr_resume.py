"""``ocr`` in pieces: the pages a long document's attempt has read survive its loss.

A document of more than one page (a PDF, a multi-page TIFF) keeps every page it has
read, as the outputs need it: its :class:`~pipelines.ocr.PageResult` (lines, boxes,
confidences, every engine's attempt with its CPU seconds, orientation, deskew, layout
regions) and the page image the searchable PDF shows. Once :data:`EVERY_PAGES` pages
are waiting, or :data:`EVERY_SECONDS` have passed since the last piece (a page that
ends past it closes the piece), they are committed as one checkpoint
(:mod:`pipelines.checkpoints`): ``pages-00001-00010.zip`` (its first and last page),
stored uncompressed (the images are PNG or JPEG already). The document's last page
is never waited for: its outputs come next. The worker stores each piece as it
appears and puts the stored ones back before a retry; the retry takes every page it
finds there (:meth:`PageCheckpoints.page`) and reads only the others, in order.

A page put back is the page as it was read: JSON keeps each number's type and value
exactly (floats round-trip through ``repr``), the image its bytes, so the outputs are
byte for byte those of one uninterrupted attempt that had read the same pages (the
searchable PDF's creation date and ``/ID`` aside, which differ between any two runs).
A piece is used only when it is whole (its zip's CRCs hold) and was written by this
:data:`FORMAT` for a document of the same page count and the same parameters; one that
is not is left out, with a warning, and its pages are read again. A piece is tied to
the OCR build that wrote it (:func:`pipelines.ocr_engines.engines_build`: the engines'
and their runtimes' versions, libtesseract's and its models'): a retry on a node with
another build reads every page again. Storage keys a piece
by its job, profile version and parameters (:mod:`hypermedia.jobs.checkpoints`): a
changed profile never finds another version's pages.

Overhead (bench/ocr_checkpoints.py, 11 generated pages of 1966 x 635 px at 300 dpi,
tesseract alone: the cheapest chain, where it weighs most): a piece of 10 pages
(890 KiB, their JPEG images) is written in 0.002 s beside the 5 s they took to read,
and a retry takes them back in 0.005 s; the step's wall time 5.38 s against 5.35 s
without checkpoints (median of 3). Its upload is the worker's, in another process:
one PUT and two short transactions a piece.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines import checkpoints

if TYPE_CHECKING:
    from pipelines.ocr import Attempt, PageResult
    from pipelines.ocr_engines import Line

log = logging.getLogger(__name__)

FORMAT = 1
EVERY_PAGES = 10
EVERY_SECONDS = 60.0
_INDEX = "pages.json"
_PIECE = re.compile(r"pages-(\d{5})-(\d{5})\.zip")


def piece_name(first: int, last: int) -> str:
    return f"pages-{first:05d}-{last:05d}.zip"


def params_digest(params: Mapping[str, Any]) -> str:
    canonical = json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


class PageCheckpoints:
    """The pages of one document: those put back from earlier attempts, and those read
    since, committed in pieces. ``pages``: the document's page count."""

    def __init__(
        self,
        workdir: Path,
        pages_dir: Path,
        pages: int,
        params: Mapping[str, Any],
        *,
        every_pages: int | None = None,
        every_seconds: float | None = None,
        build: str | None = None,
    ) -> None:
        from pipelines.ocr_engines import engines_build

        self.workdir = workdir
        self.pages_dir = pages_dir
        self.pages = pages
        self.digest = params_digest(params)
        self.build = engines_build() if build is None else build
        self.every_pages = EVERY_PAGES if every_pages is None else every_pages
        self.every_seconds = EVERY_SECONDS if every_seconds is None else every_seconds
        self._restored: dict[int, tuple[dict[str, Any], Path]] = {}
        self._pending: list[tuple[PageResult, Path]] = []
        self._since = time.monotonic()
        self.resumed = 0
        self._load()

    def _load(self) -> None:
        for name, path in sorted(checkpoints.finished(self.workdir, self.build).items()):
            if _PIECE.fullmatch(name) is None:
                continue
            try:
                with zipfile.ZipFile(path) as piece:
                    if piece.testzip() is not None:
                        raise ValueError("a member's CRC does not hold")
                    index = json.loads(piece.read(_INDEX))
                    if (index.get("format"), index.get("pages"), index.get("params")) != (
                        FORMAT,
                        self.pages,
                        self.digest,
                    ):
                        raise ValueError("written for another format, document or parameters")
                    members = set(piece.namelist())
                    for page in index["results"]:
                        if page["image"] not in members:
                            raise ValueError(f"no image {page['image']!r}")
            except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as exc:
                log.warning("ocr: checkpoint %s is not used (%s): its pages are read again",
                            name, exc)  # fmt: skip
                continue
            for page in index["results"]:
                self._restored.setdefault(int(page["number"]), (page, path))

    def restored(self) -> int:
        """How many pages were put back."""
        return len(self._restored)

    def page(self, number: int) -> tuple[PageResult, Path] | None:
        """Page ``number`` as an earlier attempt read it (its image back in the pages
        directory), None when it has to be read."""
        found = self._restored.get(number)
        if found is None:
            return None
        page, path = found
        with zipfile.ZipFile(path) as piece:
            image = self.pages_dir / Path(page["image"]).name  # its name when read
            image.write_bytes(piece.read(page["image"]))
        self.resumed += 1
        return decode(page), image

    def add(self, result: PageResult, image: Path) -> None:
        """Page ``result`` was read (its image at ``image``): committed with the pages
        waiting once there are enough of them, or once enough time has passed."""
        self._pending.append((result, image))
        if result.number >= self.pages:
            return  # the outputs come next
        if (
            len(self._pending) >= self.every_pages
            or time.monotonic() - self._since >= self.every_seconds
        ):
            self.commit()

    def commit(self) -> None:
        """The pages waiting, as one piece."""
        if not self._pending:
            return
        numbers = [result.number for result, _ in self._pending]
        name = piece_name(min(numbers), max(numbers))
        partial = checkpoints.partial(self.workdir, name, self.build)
        results = []
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_STORED) as piece:
            for result, image in self._pending:
                member = image.name  # page-<n>.png or .jpg, as the pages directory has it
                piece.write(image, member)
                results.append({**encode(result), "image": member})
            index = {"format": FORMAT, "pages": self.pages, "params": self.digest}
            piece.writestr(_INDEX, json.dumps({**index, "results": results}, ensure_ascii=False))
        checkpoints.commit(self.workdir, name, self.build)
        self._pending.clear()
        self._since = time.monotonic()


def _line(line: Line) -> list[Any]:
    return [line.text, list(line.bbox), line.confidence]


def _attempt(attempt: Attempt) -> dict[str, Any]:
    return {
        "engine": attempt.engine,
        "confidence": attempt.confidence,
        "weakness": attempt.weakness,
        "skipped": attempt.skipped,
        "cpu_seconds": attempt.cpu_seconds,
        "lines": [_line(line) for line in attempt.lines],
    }


def encode(result: PageResult) -> dict[str, Any]:
    """A page's result as JSON values (its blocks are made from it when the outputs are
    written, and are not kept)."""
    return {
        "number": result.number,
        "width": result.width,
        "height": result.height,
        "dpi": result.dpi,
        "source": result.source,
        "lines": [_line(line) for line in result.lines],
        "engine": result.engine,
        "confidence": result.confidence,
        "orientation": result.orientation,
        "deskew": result.deskew,
        "attempts": [_attempt(attempt) for attempt in result.attempts],
        "regions": None
        if result.regions is None
        else [[r.kind, list(r.bbox), r.confidence] for r in result.regions],
        "layout_cpu_seconds": result.layout_cpu_seconds,
    }


def decode(page: Mapping[str, Any]) -> PageResult:
    """The :class:`~pipelines.ocr.PageResult` :func:`encode` was given."""
    from pipelines.ocr import Attempt, PageResult
    from pipelines.ocr_engines import Line, Region

    def lines(found: list[Any]) -> list[Line]:
        return [Line(text, _box(bbox), confidence) for text, bbox, confidence in found]

    regions = page["regions"]
    return PageResult(
        number=page["number"],
        width=page["width"],
        height=page["height"],
        dpi=page["dpi"],
        source=page["source"],
        lines=lines(page["lines"]),
        engine=page["engine"],
        confidence=page["confidence"],
        orientation=page["orientation"],
        deskew=page["deskew"],
        attempts=[
            Attempt(
                a["engine"],
                confidence=a["confidence"],
                weakness=a["weakness"],
                skipped=a["skipped"],
                cpu_seconds=a["cpu_seconds"],
                lines=lines(a["lines"]),
            )
            for a in page["attempts"]
        ],
        regions=None
        if regions is None
        else [Region(kind, _box(bbox), confidence) for kind, bbox, confidence in regions],
        layout_cpu_seconds=page["layout_cpu_seconds"],
    )


def _box(values: list[Any]) -> tuple[int, int, int, int]:
    x0, y0, x1, y1 = values
    return (x0, y0, x1, y1)
