"""Random access to the bytes being inspected.

A :class:`Source` is a size and ``read_at(offset, length)``: a local file
(:class:`FileSource`), a buffer (:class:`BytesSource`) or anything that can answer a
ranged read, such as an object store (:class:`CallbackSource`). :class:`SourceFile`
turns one into the seekable binary file that :mod:`zipfile` and ``olefile`` want; every
byte they read is counted, so a caller can see how much an inspection really read.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Protocol


class Source(Protocol):
    @property
    def size(self) -> int: ...

    def read_at(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes from ``offset`` (fewer only at the end)."""
        ...


class BytesSource:
    def __init__(self, data: bytes) -> None:
        self._data = data

    @property
    def size(self) -> int:
        return len(self._data)

    def read_at(self, offset: int, length: int) -> bytes:
        if offset < 0 or length <= 0:
            return b""
        return self._data[offset : offset + length]


class FileSource:
    """A local file, read with ``pread`` (no shared file position)."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_RDONLY)
        self._size = os.fstat(self._fd).st_size

    @property
    def size(self) -> int:
        return self._size

    def read_at(self, offset: int, length: int) -> bytes:
        if offset < 0 or length <= 0 or offset >= self._size:
            return b""
        return os.pread(self._fd, min(length, self._size - offset), offset)

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> FileSource:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class CallbackSource:
    """``read_at`` answered by a callback, e.g. a ranged GET on an object store."""

    def __init__(self, size: int, read_at: Callable[[int, int], bytes]) -> None:
        self._size = size
        self._read_at = read_at

    @property
    def size(self) -> int:
        return self._size

    def read_at(self, offset: int, length: int) -> bytes:
        if offset < 0 or length <= 0 or offset >= self._size:
            return b""
        return self._read_at(offset, min(length, self._size - offset))


class SourceFile(io.RawIOBase):
    """A read-only, seekable file over a :class:`Source` that counts what it read."""

    def __init__(self, source: Source) -> None:
        super().__init__()
        self._source = source
        self._position = 0
        self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            position = offset
        elif whence == io.SEEK_CUR:
            position = self._position + offset
        elif whence == io.SEEK_END:
            position = self._source.size + offset
        else:
            raise ValueError(f"bad whence {whence}")
        if position < 0:
            raise OSError("seek before the start of the file")
        self._position = position
        return position

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(buffer).cast("B")
        data = self._source.read_at(self._position, len(view))
        view[: len(data)] = data
        self._position += len(data)
        self.bytes_read += len(data)
        return len(data)


def buffered(source: Source, buffer_size: int = 256 * 1024) -> io.BufferedReader:
    """A buffered binary file over ``source``: few, large reads (one GET each)."""
    return io.BufferedReader(SourceFile(source), buffer_size=buffer_size)
