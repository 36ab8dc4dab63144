"""The session's end check for sandbox processes that outlived their owners.

A fork server (:mod:`hypermedia.sandbox.forkserver`), a tiny init of one of its PID
namespaces (:mod:`hypermedia.sandbox.tinyinit`: it shares the server's memory, so its
command line is the server's), a spare or job forked from one (the same), or an
inspection server (:mod:`hypermedia.ingest.inspection`) must end when what started
it ends. One that did not runs on after the tests, holding memory (two tiny inits
left by a killed actor's server held 52 MB), unnoticed: nothing failed.

At the end of a session (``tests/conftest.py``, in the session's first process, once
every test and the shared Ray head are done) those still running are named, the run
fails, and they are killed. Only this session's: a process counts when its command line
names a path under the session's base temporary directory (each test's ``tmp_path``,
the work roots and data directories of its executors, actors and API servers, lie
under it; xdist's workers have theirs inside it), so the processes of another run on
the same machine, which has another base directory, are never touched.
"""

from __future__ import annotations

import contextlib
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

# What a sandbox server's command line holds: the fork server's bootstrap imports the
# first, the inspection server is run as the second (``python -m``).
SERVER_MARKERS = (b"hypermedia.sandbox.forkserver", b"hypermedia.ingest.inspection")
GRACE_SECONDS = 15.0  # for servers whose owners ended just now (the shared head's actors)


@dataclass(frozen=True, slots=True)
class Leaked:
    pid: int
    ppid: int
    what: str  # "a PID namespace's init" or "a sandbox server (or a process it forked)"
    rss_mb: float

    def __str__(self) -> str:
        return f"pid {self.pid} (ppid {self.ppid}): {self.what}, {self.rss_mb:.0f} MB RSS"


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read()
    except OSError:
        return b""


def _status(pid: int) -> dict[str, str]:
    fields = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                name, _, value = line.partition(":")
                fields[name] = value.strip()
    except OSError:
        pass
    return fields


def sandbox_processes(root: Path) -> list[Leaked]:
    """Live sandbox processes (not zombies) whose command line names a path under
    ``root``."""
    under = str(root).rstrip("/").encode() + b"/"
    found = []
    for pid in psutil.pids():
        cmdline = _cmdline(pid)
        if under not in cmdline or not any(marker in cmdline for marker in SERVER_MARKERS):
            continue
        status = _status(pid)
        if status.get("State", "X")[:1] in ("Z", "X", ""):
            continue
        nspids = status.get("NSpid", "").split()
        init = len(nspids) > 1 and nspids[-1] == "1"
        what = "a PID namespace's init" if init else "a sandbox server (or a process it forked)"
        rss_kb = int(status.get("VmRSS", "0 kB").split()[0])
        found.append(Leaked(pid, int(status.get("PPid", "0")), what, rss_kb / 1024))
    return found


def leaked_sandbox_processes(root: Path, grace: float = GRACE_SECONDS) -> list[Leaked]:
    """:func:`sandbox_processes` of ``root`` that are still running after ``grace``
    seconds (none: at once), killed then (SIGKILL)."""
    deadline = time.monotonic() + grace
    while (found := sandbox_processes(root)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for leaked in found:
        with contextlib.suppress(OSError):
            psutil.Process(leaked.pid).send_signal(signal.SIGKILL)
    return found
