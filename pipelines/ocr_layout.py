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
    from pipelines.ocr_engines import Line

Row = list["Line"]
Block = list[Row]

_GUTTER_MIN_LINES_EACH_SIDE = 2
# Magazine columns sit as close as a quarter of a line height apart (UNLV pages at
# 300 dpi: 14 px gutters, 50 px lines); word spaces never line up across whole lines.
_GUTTER_MIN_WIDTH = 0.25
_BLOCK_GAP = 1.2
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
