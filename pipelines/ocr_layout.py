"""Reading order and page-quality judgements for OCR lines. Pure: no engine, no I/O.

:func:`reading_order` puts an engine's lines (:class:`pipelines.ocr_engines.Line`, in
whatever order the engine found them) into blocks in the order a person reads them:

1. *Gutters*: vertical stripes of the text area that (almost) no line crosses, with
   lines wholly to the left and wholly to the right of them (a ragged right margin is
   no gutter), at least a quarter line-height wide. Each gutter's middle is a column
   boundary.
2. A line crossing a boundary by over a line height (a title, a full-width
   paragraph) *spans*; the spanning lines cut the page into sections, read top to
   bottom; within a section the columns are read left to right, each top to bottom.
3. Within a column, lines whose vertical extents overlap by more than half form one
   row (read left to right: an engine may return one printed line as several
   pieces); a vertical gap over 1.2 line heights starts a new block.

:func:`laid_out` puts the lines into the regions the layout model found
(:class:`pipelines.ocr_engines.Region`): a line belongs to the region holding most
of its box (at least half); regions overlapping by most of the smaller one are one
(the more confident kept). Each region's lines form one block (a table's row by
row, others in reading order); lines outside every region stay in their
reading-order blocks, as ``text``. Blocks are ordered by their first line in
:func:`reading_order`; a figure, table or equation without any line read sits before
the first block below its top.

:func:`assess` says whether a page's result is weak enough to escalate: its mean
line confidence (weighted by characters) under the threshold, or text implausible
for the page (nothing read on a page with ink; mostly symbols; fragments).
"""

from __future__ import annotations

import statistics
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipelines.ocr_engines import Line, Region

Row = list["Line"]
Block = list[Row]

_GUTTER_MIN_LINES_EACH_SIDE = 2
# Magazine columns sit as close as a quarter of a line height apart (UNLV pages at
# 300 dpi: 14 px gutters, 50 px lines); word spaces never line up across whole lines.
_GUTTER_MIN_WIDTH = 0.25
_BLOCK_GAP = 1.2
# Two regions are one when their intersection is over this share of the smaller.
_SAME_REGION = 0.7
# A line belongs to a region holding at least this share of its box.
_IN_REGION = 0.5
# Regions kept without any line read in them (others are the OCR's to fill).
_KEPT_EMPTY = ("figure", "table", "equation")
# A page with fewer dark pixels than this is blank (one printed line on an A4 scan
# at 300 dpi is ~0.1 %).
_BLANK_INK = 0.0002


def reading_order(lines: Sequence[Line]) -> list[Block]:
    """``lines`` as blocks of rows, in reading order (see the module docstring)."""
    if not lines:
        return []
    height = statistics.median(max(1, line.bbox[3] - line.bbox[1]) for line in lines)
    boundaries = column_boundaries(lines, height)
    spanning: list[Line] = []
    columns: dict[int, list[Line]] = {}
    for line in lines:
        x0, _, x1, _ = line.bbox
        if any(x0 < b - height and x1 > b + height for b in boundaries):
            spanning.append(line)
        else:
            centre = (x0 + x1) / 2
            columns.setdefault(sum(1 for b in boundaries if b < centre), []).append(line)
    spanning.sort(key=lambda line: line.bbox[1])
    cuts = [(s.bbox[1] + s.bbox[3]) / 2 for s in spanning]
    sections: dict[tuple[int, int], list[Line]] = {}
    for column, members in columns.items():
        for line in members:
            middle = (line.bbox[1] + line.bbox[3]) / 2
            section = sum(1 for cut in cuts if cut < middle)
            sections.setdefault((section, column), []).append(line)
    blocks: list[Block] = []
    for section in range(len(spanning) + 1):
        for column in sorted(c for s, c in sections if s == section):
            blocks.extend(_blocks(_rows(sections[(section, column)]), height))
        if section < len(spanning):
            blocks.append([[spanning[section]]])
    return blocks


def column_boundaries(lines: Sequence[Line], height: float) -> list[float]:
    """The x of each column boundary (the middle of a gutter), left to right."""
    left = min(line.bbox[0] for line in lines)
    right = max(line.bbox[2] for line in lines)
    bucket = max(1.0, height / 10)
    count = int((right - left) / bucket) + 1
    coverage = [0] * count
    for line in lines:
        start = int((line.bbox[0] - left) / bucket)
        end = int((line.bbox[2] - left) / bucket)
        for index in range(start, min(end, count - 1) + 1):
            coverage[index] += 1
    allowance = max(1, len(lines) // 10)  # titles and the like cross gutters
    boundaries: list[float] = []
    index = 0
    while index < count:
        if coverage[index] > allowance:
            index += 1
            continue
        start = index
        while index < count and coverage[index] <= allowance:
            index += 1
        stripe_left, stripe_right = left + start * bucket, left + index * bucket
        if stripe_right - stripe_left < _GUTTER_MIN_WIDTH * height:
            continue
        lefts = sum(1 for line in lines if line.bbox[2] <= stripe_left + bucket)
        rights = sum(1 for line in lines if line.bbox[0] >= stripe_right - bucket)
        if min(lefts, rights) >= _GUTTER_MIN_LINES_EACH_SIDE:
            boundaries.append((stripe_left + stripe_right) / 2)
    return boundaries


def _rows(lines: list[Line]) -> list[Row]:
    rows: list[Row] = []
    for line in sorted(lines, key=lambda line: (line.bbox[1] + line.bbox[3]) / 2):
        if rows and _same_row(rows[-1], line):
            rows[-1].append(line)
        else:
            rows.append([line])
    for row in rows:
        row.sort(key=lambda line: line.bbox[0])
    return rows


def _same_row(row: Row, line: Line) -> bool:
    top = min(item.bbox[1] for item in row)
    bottom = max(item.bbox[3] for item in row)
    overlap = min(bottom, line.bbox[3]) - max(top, line.bbox[1])
    smaller = min(bottom - top, line.bbox[3] - line.bbox[1])
    return smaller > 0 and overlap > smaller / 2


def _blocks(rows: list[Row], height: float) -> list[Block]:
    blocks: list[Block] = []
    previous_bottom: float | None = None
    for row in rows:
        top = min(line.bbox[1] for line in row)
        if previous_bottom is None or top - previous_bottom > _BLOCK_GAP * height:
            blocks.append([])
        blocks[-1].append(row)
        previous_bottom = max(line.bbox[3] for line in row)
    return blocks


@dataclass(slots=True)
class LaidBlock:
    """A block of the page: ``kind`` is the region's class (``text`` for lines outside
    every region), ``region`` None for those."""

    kind: str
    rows: Block
    region: Region | None = None


def laid_out(lines: Sequence[Line], regions: Sequence[Region]) -> list[LaidBlock]:
    """``lines`` as blocks of the layout model's ``regions`` (module docstring)."""
    kept = distinct_regions(regions)
    home: dict[Line, int] = {}
    for line in lines:
        best, best_share = -1, _IN_REGION
        area = max(1, _area(line.bbox))
        for index, region in enumerate(kept):
            share = _intersection(line.bbox, region.bbox) / area
            if share >= best_share:
                best, best_share = index, share
        if best >= 0:
            home[line] = best
    groups: dict[tuple[str, int], LaidBlock] = {}
    last_row: dict[tuple[str, int], tuple[int, int]] = {}
    for block_index, block in enumerate(reading_order(lines)):
        for row_index, row in enumerate(block):
            for line in row:
                found = home.get(line)
                key = ("region", found) if found is not None else ("block", block_index)
                if key not in groups:
                    if found is None:
                        groups[key] = LaidBlock("text", [])
                    else:
                        groups[key] = LaidBlock(kept[found].kind, [], kept[found])
                laid = groups[key]
                if found is None and last_row.get(key) == (block_index, row_index):
                    laid.rows[-1].append(line)
                else:
                    laid.rows.append([line])
                last_row[key] = (block_index, row_index)
    ordered = list(groups.values())
    for laid in ordered:
        if laid.region is not None:
            members = [line for row in laid.rows for line in row]
            if laid.kind == "table":
                laid.rows = _rows(members)
            else:
                laid.rows = [row for block in reading_order(members) for row in block]
    for index, region in enumerate(kept):
        if ("region", index) in groups or region.kind not in _KEPT_EMPTY:
            continue
        below = [i for i, laid in enumerate(ordered) if block_bbox(laid)[1] > region.bbox[1]]
        ordered.insert(below[0] if below else len(ordered), LaidBlock(region.kind, [], region))
    return ordered


def distinct_regions(regions: Sequence[Region]) -> list[Region]:
    """``regions`` without those mostly inside a more confident one."""
    kept: list[Region] = []
    for region in sorted(regions, key=lambda r: -r.confidence):
        if all(
            _intersection(region.bbox, other.bbox)
            <= _SAME_REGION * max(1, min(_area(region.bbox), _area(other.bbox)))
            for other in kept
        ):
            kept.append(region)
    return kept


def block_bbox(laid: LaidBlock) -> tuple[int, int, int, int]:
    """The region's box, or the box around the block's lines."""
    if laid.region is not None:
        return laid.region.bbox
    lines = [line for row in laid.rows for line in row]
    return (
        min(line.bbox[0] for line in lines),
        min(line.bbox[1] for line in lines),
        max(line.bbox[2] for line in lines),
        max(line.bbox[3] for line in lines),
    )


def _area(box: tuple[int, int, int, int]) -> int:
    return max(0, box[2] - box[0]) * max(0, box[3] - box[1])


def _intersection(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> int:
    return _area((max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])))


def block_text(block: Block) -> str:
    return "\n".join(" ".join(line.text for line in row) for row in block)


def page_text(blocks: Sequence[Block]) -> str:
    """The page's text: rows on lines, blocks apart by a blank line."""
    return "\n\n".join(block_text(block) for block in blocks)


# -- quality --------------------------------------------------------------------------


def mean_confidence(lines: Sequence[Line]) -> float:
    """Mean line confidence, weighted by each line's characters (0 without text)."""
    total = sum(len(line.text) for line in lines)
    if not total:
        return 0.0
    return sum(line.confidence * len(line.text) for line in lines) / total


@dataclass(frozen=True, slots=True)
class Assessment:
    confidence: float
    # Why the result is weak, None when it is good enough.
    weakness: str | None


def assess(lines: Sequence[Line], ink: float, min_confidence: float) -> Assessment:
    """Whether ``lines`` read from a page whose ``ink`` (fraction of dark pixels) is
    given are good enough, or why not."""
    confidence = mean_confidence(lines)
    text = "".join(line.text for line in lines)
    if not text.strip():
        if ink > _BLANK_INK:
            return Assessment(confidence, f"no text read on a page with {ink:.1%} ink")
        return Assessment(confidence, None)
    if confidence < min_confidence:
        return Assessment(
            confidence, f"mean line confidence {confidence:.2f} < {min_confidence:.2f}"
        )
    visible = [c for c in text if not c.isspace()]
    wordlike = sum(1 for c in visible if unicodedata.category(c)[0] in "LN")
    if len(visible) >= 20 and wordlike / len(visible) < 0.5:
        return Assessment(confidence, f"implausible text: {wordlike / len(visible):.0%} letters")
    words = " ".join(line.text for line in lines).split()
    if len(words) >= 10 and sum(len(w) for w in words) / len(words) < 2.0:
        return Assessment(confidence, "implausible text: fragments (mean word under 2 letters)")
    return Assessment(confidence, None)


def normalise(text: str) -> str:
    """Runs of whitespace collapsed to one space, ends stripped (for comparing)."""
    return " ".join(text.split())
