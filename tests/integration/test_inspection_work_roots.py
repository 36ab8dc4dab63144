"""The inspection server's work root (``$TMPDIR/hm-inspection-<pid>-*``): a server
SIGKILLed cannot remove its own, so the next server to start sweeps the roots of servers
that are gone, and never a live server's, another user's or one it cannot tell the
owner of. Real servers, real kills; nothing in the product is patched."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hypermedia.ingest import inspection
from hypermedia.ingest.inspection import (
    OWNER_LOCK,
    WORK_ROOT_PREFIX,
    InspectionBudget,
    InspectionRunner,
)

# A process that holds a root's owner.lock and lives: a server whose pid this PID
# namespace does not show (another container sharing the directory).
_HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(120)
"""


def _dead_pid() -> int:
    ended = subprocess.Popen(["true"])
    ended.wait()
    return ended.pid


def _root(directory: Path, pid: int, letters: str, *, lock: bool = True) -> Path:
    root = directory / f"{WORK_ROOT_PREFIX}{pid}-{letters}"
    (root / "jobs").mkdir(parents=True)
    if lock:
        (root / OWNER_LOCK).touch(0o600)
    return root


def _server_roots(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.name.startswith(WORK_ROOT_PREFIX))


def test_a_killed_servers_work_root_is_swept_when_the_next_starts(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where the servers make their roots
    inspection.close_server()  # the next is started there (one is reused)
    runner = InspectionRunner(InspectionBudget(cpu_seconds=5), hidden_paths=(tmp_path / "x",))
    runner.capabilities  # noqa: B018 - starts the server
    server = inspection._current
    assert server is not None
    [killed_root] = _server_roots(tmp_path)
    assert killed_root.name.startswith(f"{WORK_ROOT_PREFIX}{server.process.pid}-")
    server.process.kill()  # the OOM killer: no finally runs
    server.process.wait()
    assert killed_root.exists()

    dead = _dead_pid()
    old_format = tmp_path / f"{WORK_ROOT_PREFIX}k2j4_x9a"  # named for no pid: left
    old_format.mkdir()
    unlocked = _root(tmp_path, dead, "nolock", lock=False)  # its server killed as it made it: left
    elsewhere = _root(tmp_path, dead, "held")  # pid dead here, its server alive elsewhere: left
    others = _root(tmp_path, dead, "others") if os.geteuid() == 0 else None
    if others is not None:
        os.chown(others, 65534, 65534)  # another user's: never ours to remove
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(elsewhere / OWNER_LOCK)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        runner.capabilities  # noqa: B018 - "the inspection server died; starting another"
        replacement = inspection._current
        assert replacement is not None and replacement is not server
        assert not killed_root.exists()
        kept = [old_format, unlocked, elsewhere, *([others] if others else [])]
        [new_root] = [p for p in _server_roots(tmp_path) if p not in kept]
        assert new_root.name.startswith(f"{WORK_ROOT_PREFIX}{replacement.process.pid}-")
        assert all(p.exists() for p in kept)
        # The running server's root is locked: another sweep leaves it (and the rest).
        assert inspection.sweep_work_roots(str(tmp_path)) == []
        replacement.close()  # a server ending in order removes its own
        deadline = time.monotonic() + 10
        while new_root.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not new_root.exists()
    finally:
        holder.kill()
        holder.wait()
        inspection._current = None
    # Its holder gone, the root whose pid was dead here is swept too.
    assert inspection.sweep_work_roots(str(tmp_path)) == [str(elsewhere)]


@pytest.mark.parametrize("name", ["hm-inspection-", "hm-inspection-12", "hm-inspection-١٢-x"])
def test_a_name_without_an_ascii_pid_and_a_dash_names_no_owner(name):
    assert inspection._owner_pid(name) is None
    assert inspection._owner_pid("hm-inspection-12-abc") == 12


def test_a_zombie_owns_no_work_root():
    """A server killed with its API is a zombie until init reaps it (seconds here): it
    runs nothing, and its root is swept at once."""
    ended = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while inspection._alive(ended.pid):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert os.path.exists(f"/proc/{ended.pid}")  # not reaped yet: a zombie
    ended.wait()
    assert not inspection._alive(ended.pid)
    assert inspection._alive(os.getpid())
