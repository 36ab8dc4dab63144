"""Small JSON state files shared by processes on one machine, under ``flock``.

``ray up`` and the head's monitor each build a node provider (and its drivers); the
local driver's instances and the provider's node tags live in files both must see.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path`` (created if missing)."""
    with lock_path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def locked_json(path: Path) -> Iterator[dict[str, Any]]:
    """The file's object (``{}`` when missing), read under ``<path>.lock`` and written
    back atomically (temporary file, then rename) when the block ends without error."""
    with exclusive(path.with_suffix(".lock")):
        state: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
        yield state
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(state, indent=1, sort_keys=True))
        temporary.replace(path)
