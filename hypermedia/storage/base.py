"""The storage contract.

A backend stores opaque bytes under keys. Keys are ``/``-separated, relative,
without ``..`` or empty segments (:func:`check_key`); user-chosen file names never
become keys. ``put`` is atomic: a reader sees the old bytes or the new bytes,
never a partial file; writing a key twice replaces it (deterministic output keys
make a re-run harmless). ``put`` refuses more than ``max_bytes``, storing nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from hypermedia.errors import InputTooLarge, InvalidRequest

_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=-]{0,199}$")


@dataclass(frozen=True, slots=True)
class StoredBlob:
    key: str
    size_bytes: int
    sha256: str


def check_key(key: str) -> str:
    parts = key.split("/")
    if len(key) > 512 or not parts or not all(_SEGMENT.match(p) for p in parts):
        raise InvalidRequest(f"invalid storage key {key!r}", key=key)
    return key


def original_key(pool_id: str, object_id: str) -> str:
    return check_key(f"originals/{pool_id}/{object_id}")


def derived_key(pool_id: str, object_id: str, profile_version: int, output_type: str) -> str:
    return check_key(f"derived/{pool_id}/{object_id}/{profile_version}/{output_type}")


class Storage(Protocol):
    def put(
        self, key: str, chunks: Iterable[bytes], max_bytes: int | None = None
    ) -> StoredBlob: ...

    def read(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]: ...

    def exists(self, key: str) -> bool: ...

    def size(self, key: str) -> int: ...

    def delete(self, key: str) -> None: ...


def too_large(max_bytes: int) -> InputTooLarge:
    return InputTooLarge(f"upload exceeds the limit of {max_bytes} bytes", max_bytes=max_bytes)
