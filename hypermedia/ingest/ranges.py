"""Which bytes a ``Range`` header asks of a blob (RFC 9110, section 14), and whether
its conditional headers (section 13) leave anything to send: pure.

A blob's validator is :func:`entity_tag`, made from its file's size, modification time
and inode: it changes when a write replaces the file (a new file, renamed over the
old), and costs no read of the bytes. A hash would be the tag of the bytes alone, but
the record's (an object's or an output's ``sha256``) is not where the blob routes look
(they know a key, not a row), and one computed per request reads the whole file.

One range of bytes is served (206); what this cannot serve as one range (several
ranges, another unit, a malformed header, an ``If-Range`` that is not the blob's
current tag: a date, a weak tag, another tag) is answered with the whole blob, as the
RFC lets a server do; a range that starts past the end is unsatisfiable (416).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ONE_RANGE = re.compile(r"bytes=([0-9]*)-([0-9]*)")
# Past any blob's size: what a position of more digits than this stands for (Python
# refuses to read an integer of more than 4,300 digits: a 500, before).
_BEYOND = 1 << 64
_MAX_DIGITS = 19


def _position(digits: str) -> int:
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= _MAX_DIGITS else _BEYOND


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


def entity_tag(size: int, mtime_ns: int, inode: int) -> str:
    """The strong ``ETag`` of a file of ``size`` bytes with this modification time and
    inode (quoted, as the header carries it)."""
    return f'"{size:x}-{mtime_ns:x}-{inode:x}"'


def not_modified(if_none_match: str | None, etag: str) -> bool:
    """Whether an ``If-None-Match`` header names ``etag`` (weak comparison, ``*``
    naming any): a GET or HEAD is then answered 304 with no body."""
    if if_none_match is None:
        return False
    tags = [tag.strip() for tag in if_none_match.split(",")]
    return "*" in tags or _opaque(etag) in {_opaque(tag) for tag in tags}


def _opaque(tag: str) -> str:
    return tag[2:] if tag.startswith("W/") else tag


def requested(
    header: str | None, size: int, *, if_range: str | None = None, etag: str | None = None
) -> ByteRange | None:
    """The one range ``header`` asks of ``size`` bytes; None: serve them all.
    :class:`Unsatisfiable` when it asks for none of them. Under an ``If-Range``, only
    when it is ``etag`` (strong comparison: a weak tag or a date never is)."""
    if header is None or (if_range is not None and if_range.strip() != etag):
        return None
    match = _ONE_RANGE.fullmatch(header.strip())
    if match is None:
        return None
    first, last = match.groups()
    if not first:
        if not last:
            return None  # "bytes=-": malformed
        suffix = _position(last)
        if suffix == 0 or size == 0:
            raise Unsatisfiable
        return ByteRange(max(0, size - suffix), size - 1, size)
    start = _position(first)
    if last and _position(last) < start:
        return None  # malformed: ignored, as the RFC says
    if start >= size:
        raise Unsatisfiable
    end = size - 1 if not last else min(_position(last), size - 1)
    return ByteRange(start, end, size)
