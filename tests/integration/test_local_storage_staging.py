"""What a put into local storage leaves when its process is killed mid-write: the
staged file of a ``kill -9`` (the OOM killer, a killed API) was left beside the
object's key for ever. Staged files now live in one directory, and ``check`` (the
storage probe every API and head runs) removes those no write has touched for
:data:`~hypermedia.storage.local.STALE_STAGING_SECONDS`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hypermedia.storage.local import STAGING, STALE_STAGING_SECONDS, LocalStorage

REPO = Path(__file__).resolve().parents[2]

_WRITER = """
import sys, time
from pathlib import Path
from hypermedia.storage.local import LocalStorage

def chunks():
    yield b"x" * 65536
    print("writing", flush=True)
    time.sleep(600)
    yield b"never"

LocalStorage(Path(sys.argv[1])).put("objects/u/o/original", chunks())
"""


def _killed_mid_put(root: Path) -> None:
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(root)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert writer.stdout is not None
    assert writer.stdout.readline().strip() == "writing"
    writer.send_signal(signal.SIGKILL)
    writer.wait(30)


def test_a_put_killed_mid_write_leaves_its_staged_file_to_the_next_probe(tmp_path):
    root = tmp_path / "storage"
    _killed_mid_put(root)
    staged = [p for p in root.rglob("*") if p.is_file()]
    assert [p.parent.name for p in staged] == [STAGING], staged
    assert not (root / "objects").exists()  # nothing beside a key
    (dead,) = staged

    storage = LocalStorage(root)
    storage.check()  # a put still writing (touched a moment ago) is left alone
    assert dead.exists()
    old = time.time() - STALE_STAGING_SECONDS - 60
    os.utime(dead, (old, old))
    storage.put("objects/u/o/other", [b"fresh"])  # a put after it still works
    storage.check()
    assert not dead.exists()
    assert [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()] == [
        "objects/u/o/other"
    ]
