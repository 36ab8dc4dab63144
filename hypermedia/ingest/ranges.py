"""Which bytes a ``Range`` header asks of a blob (RFC 9110, section 14): pure.

One range of bytes is served (206); what this cannot serve as one range (several
ranges, another unit, a malformed header, an ``If-Range``: the blob routes send no
validator to compare it with) is answered with the whole blob, as the RFC lets a
server do; a range that starts past the end is unsatisfiable (416).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ONE_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


@dataclass(frozen=True, slots=True)
class ByteRange:
    """Bytes ``start`` to ``end`` (inclusive) of a blob of ``size`` bytes."""

    start: int
    end: int
    size: int

    @property
    def length(self) -> int:
        return self.end + 1 - self.start

    @property
    def content_range(self) -> str:
        return f"bytes {self.start}-{self.end}/{self.size}"


class Unsatisfiable(Exception):
    """The range asks for no byte the blob has."""


def requested(header: str | None, size: int, *, if_range: str | None = None) -> ByteRange | None:
    """The one range ``header`` asks of ``size`` bytes; None: serve them all.
    :class:`Unsatisfiable` when it asks for none of them."""
    if header is None or if_range is not None:
        return None
    match = _ONE_RANGE.fullmatch(header.strip())
    if match is None:
        return None
    first, last = match.groups()
    if not first:
        if not last:
            return None  # "bytes=-": malformed
        suffix = int(last)
        if suffix == 0 or size == 0:
            raise Unsatisfiable
        return ByteRange(max(0, size - suffix), size - 1, size)
    start = int(first)
    if last and int(last) < start:
        return None  # malformed: ignored, as the RFC says
    if start >= size:
        raise Unsatisfiable
    end = size - 1 if not last else min(int(last), size - 1)
    return ByteRange(start, end, size)
