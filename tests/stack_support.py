"""The processes of a local stack (`hypermedia up`, a data dir's) that the e2e tests
look for: its Ray head's, its watchdog, what a stopped or killed one left
(tests/e2e/test_up_down.py, tests/e2e/test_secrets.py)."""

from __future__ import annotations

import os
from pathlib import Path

import psutil

from hypermedia.worker.cluster import short_temp_dir


def ray_processes(data: Path) -> list[int]:
    """The pids of the data dir's Ray head (each names its temp dir)."""
    marker = str(short_temp_dir(data / "ray", "head"))
    return [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if marker in " ".join(p.info["cmdline"] or [])
    ]


def leftovers(data: Path) -> list[str]:
    """Processes of the data dir's stack: its Ray head's (temp dir, the client server,
    which names the GCS address, anything with the cluster's token), its Redis and its
    watchdog."""
    temp_dir = short_temp_dir(data / "ray", "head")
    address_file = temp_dir / "ray_current_cluster"
    address = address_file.read_text().strip() if address_file.exists() else None
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        args = proc.info["cmdline"] or []
        line = " ".join(args)
        if proc.pid == os.getpid():
            continue
        if (
            str(temp_dir) in line
            or str(data) in line
            or (address and f"--address={address}" in args)
            or _with_token_of(proc, data)
        ):
            found.append(f"{proc.pid} {line[:120]}")
    return found


def _with_token_of(proc: psutil.Process, data: Path) -> bool:
    """A Ray process of the data dir's cluster that names neither its temp dir nor an
    address on record (a client server whose `ray start` was cut short): its
    environment has the cluster's token path."""
    try:
        token = proc.environ().get("RAY_AUTH_TOKEN_PATH", "")
    except psutil.Error:
        return False
    return token.startswith(str(data))


def watchdog_pid(data: Path) -> int:
    """The pid of the data dir's watchdog."""
    (pid,) = [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if "hypermedia.watchdog" in " ".join(p.info["cmdline"] or [])
        and str(data) in (p.info["cmdline"] or [])
    ]
    return pid


def wait_gone(pids: list[int], timeout: float = 60) -> list[int]:
    """Those of ``pids`` still running after ``timeout`` seconds."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    _gone, alive = psutil.wait_procs(procs, timeout=timeout)
    return [p.pid for p in alive]
