"""Storage in a local directory: the embedded default."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from hypermedia.errors import NotFound
from hypermedia.storage.base import StoredBlob, check_key, too_large


class LocalStorage:
    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, key: str) -> Path:
        return self.root / check_key(key)

    def put(self, key: str, chunks: Iterable[bytes], max_bytes: int | None = None) -> StoredBlob:
        target = self.path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        size = 0
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".upload-")
        try:
            with os.fdopen(fd, "wb") as out:
                for chunk in chunks:
                    size += len(chunk)
                    if max_bytes is not None and size > max_bytes:
                        raise too_large(max_bytes)
                    digest.update(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return StoredBlob(key=key, size_bytes=size, sha256=digest.hexdigest())

    def read(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        try:
            handle = self.path(key).open("rb")
        except FileNotFoundError:
            raise NotFound(f"no stored object at {key!r}", key=key) from None
        with handle:
            while chunk := handle.read(chunk_size):
                yield chunk

    def exists(self, key: str) -> bool:
        return self.path(key).is_file()

    def size(self, key: str) -> int:
        try:
            return self.path(key).stat().st_size
        except FileNotFoundError:
            raise NotFound(f"no stored object at {key!r}", key=key) from None

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path(key).unlink()
