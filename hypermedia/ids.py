"""Identifiers: time-ordered (UUIDv7 layout), 32 hex characters.

Ids sort lexicographically in creation order: the first 48 bits are the Unix time
in milliseconds and the next 12 a per-process counter within that millisecond.
The queue relies on this: members with equal priority leave a Redis sorted set in
lexicographic order, which is therefore age order.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

_lock = threading.Lock()
_last_ms = 0
_counter = 0


def new_id(after: str | None = None) -> str:
    """A new id; with ``after`` (an id made elsewhere, perhaps on a machine whose clock
    runs ahead of this one's), one that sorts after it: its millisecond at least the
    next one of ``after``'s. A derived output's id sorts after its source's, which the
    locks of a deletion and a submit rely on (both take an object before its outputs:
    :func:`hypermedia.objects.plan_deletion`), whatever the worker's clock says."""
    global _last_ms, _counter
    floor = 0
    if after is not None and len(after) == 32:
        with contextlib.suppress(ValueError):  # not one of ours: nothing to follow
            floor = int(after[:12], 16) + 1
    with _lock:
        ms = max(time.time_ns() // 1_000_000, floor)
        if ms <= _last_ms:
            _counter += 1
            if _counter > 0xFFF:  # 4096 ids in one ms: borrow the next millisecond
                _last_ms += 1
                _counter = 0
            ms = _last_ms
        else:
            _last_ms, _counter = ms, 0
        counter = _counter
    rand = int.from_bytes(os.urandom(8), "big")
    value = (ms & 0xFFFFFFFFFFFF) << 80
    value |= 0x7 << 76 | counter << 64  # version 7, then the counter (rand_a)
    value |= 0x2 << 62 | rand & 0x3FFFFFFFFFFFFFFF  # variant 10, then random bits
    return f"{value:032x}"


def created_at(identifier: str) -> float:
    """When ``identifier`` was made (Unix seconds, millisecond precision).

    ``ValueError`` for a string that is not one of our ids."""
    if len(identifier) != 32:
        raise ValueError(f"not an id: {identifier!r}")
    return int(identifier[:12], 16) / 1000.0
