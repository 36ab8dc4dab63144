"""Small JSON state files shared by processes on one machine, under ``flock``.

``ray up`` and the head's monitor each build a node provider (and its drivers); the
local driver's instances and the provider's node tags live in files both must see.
Each file holds what the clouds' listings can rebuild (the provider adopts every
listed instance it has no record of), so one that cannot be parsed (cut short by a
crash before its data reached the disk, edited by hand) is set aside beside itself
and read as empty: an error in the log, not a provider that fails every listing and
every terminate while its instances cost money.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


@contextlib.contextmanager
def exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path`` (created if missing)."""
    with lock_path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _read(path: Path) -> dict[str, Any]:
    """The file's object; ``{}`` when missing, or when it is not a JSON object (the
    file is then renamed ``<name>.corrupt-<epoch seconds>`` and the error logged)."""
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return {}
    try:
        state = json.loads(text)
    except ValueError as exc:  # JSONDecodeError, and text that is not UTF-8
        problem = str(exc)
    else:
        if isinstance(state, dict):
            return state
        problem = f"a JSON {type(state).__name__}, not an object"
    kept = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
    path.replace(kept)
    log.error(
        "state file %s could not be read (%s): set aside as %s and started afresh;"
        " the next listing of the clouds rebuilds it",
        path,
        problem,
        kept.name,
        extra={"action": "state_file_corrupt"},
    )
    return {}


@contextlib.contextmanager
def locked_json(path: Path) -> Iterator[dict[str, Any]]:
    """The file's object (``{}`` when missing or unreadable as one: :func:`_read`),
    read under ``<path>.lock`` and written back atomically (a temporary file, synced,
    then renamed) when the block ends without error."""
    with exclusive(path.with_suffix(".lock")):
        state = _read(path)
        yield state
        temporary = path.with_suffix(".tmp")
        with temporary.open("w") as out:
            out.write(json.dumps(state, indent=1, sort_keys=True))
            out.flush()
            os.fsync(out.fileno())
        temporary.replace(path)
