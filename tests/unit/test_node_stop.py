"""RayNode.stop (hypermedia.worker.cluster) on stand-in processes that name a node's
temp dir, as Ray's daemons do: what counts as ended, and what appears during the stop.

Ray's daemons are not the stopper's children (``ray start`` leaves them to init, and
`down` stops a head another process started); here their parent is a shell that never
reaps them."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from hypermedia.worker.cluster import RayNode

# A daemon with two threads: the second listens on a port; on SIGTERM the main thread
# (the thread-group leader) exits alone, as when a killed multi-threaded process's
# leader has ended first, and the listener closes the port and the process 1 s later.
_THREADED = textwrap.dedent(
    """
    import ctypes, os, signal, socket, sys, threading, time
    SYS_EXIT = {"x86_64": 60, "aarch64": 93}[os.uname().machine]
    listener = socket.create_server(("127.0.0.1", 0))
    terminated = threading.Event()
    def serve():
        terminated.wait()
        time.sleep(1.0)
        os._exit(0)  # the whole process: the port closes now
    threading.Thread(target=serve).start()
    signal.signal(signal.SIGTERM, lambda *_: terminated.set())
    print(listener.getsockname()[1], flush=True)
    while not terminated.wait(0.05):
        pass
    ctypes.CDLL(None, use_errno=True).syscall(SYS_EXIT, 0)  # this thread only
    """
)

# A daemon that, on SIGTERM, starts two more and exits: one names the node's temp dir
# (a daemon `ray start` began as it was cut short), one names nothing of the node (the
# dashboard's multiprocessing resource tracker), an orphan in the daemon's process group.
_SPAWNER = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    def spawn(*_):
        sleeper = "import time; time.sleep(600)"
        pids = [
            subprocess.Popen([sys.executable, "-c", sleeper, sys.argv[1]]).pid,
            subprocess.Popen([sys.executable, "-c", sleeper]).pid,
        ]
        print(*pids, flush=True)
        os._exit(0)
    signal.signal(signal.SIGTERM, spawn)
    print("ready", flush=True)
    time.sleep(600)
    """
)


def _unreaped(code: str, temp_dir: Path) -> tuple[subprocess.Popen[str], psutil.Process]:
    """``code`` run as a child of a shell that never reaps it (its process group its
    own, as ``ray start`` starts the node's daemons); the shell, and the daemon."""
    shell = subprocess.Popen(
        # Its arguments in its environment: the shell's own command line must not name
        # the temp dir (the stop would take it for the node's).
        ["sh", "-c", 'setsid "$PY" -c "$CODE" "$DIR" & echo $!; exec sleep 600'],
        env={"PATH": "/usr/bin:/bin", "PY": sys.executable, "CODE": code, "DIR": str(temp_dir)},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert shell.stdout is not None
    return shell, psutil.Process(int(shell.stdout.readline()))


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            return True
    except OSError:
        return False


def test_a_leader_ended_before_its_threads_is_running_until_the_last_ends(tmp_path):
    """A zombie whose other threads still run is not ended: its sockets close with the
    last thread (a stop that took such a GCS for ended left its port answering). And a
    zombie is ended when its threads are: the stop does not wait for its parent (init,
    here a shell) to reap it (that wait was 1-2 s a stop on a late-reaping init)."""
    temp_dir = tmp_path / "node"
    shell, daemon = _unreaped(_THREADED, temp_dir)
    try:
        assert shell.stdout is not None
        port = int(shell.stdout.readline())
        assert _accepts(port)
        node = RayNode(temp_dir, Path("-"))
        assert node.processes() == [daemon]
        started = time.monotonic()
        assert node.stop(timeout=5) == 1
        took = time.monotonic() - started
        assert not _accepts(port)  # the stop ended with the last thread
        assert daemon.status() == psutil.STATUS_ZOMBIE  # never reaped by its parent
        assert 1.0 <= took < 4, took  # not the grace (5 s) nor the kill's wait (5 s)
    finally:
        shell.kill()
        shell.wait()


@pytest.mark.timeout(60)
def test_what_appears_during_the_stop_is_stopped(tmp_path):
    """A process begun after the stop listed the node's (a daemon of a `ray start` cut
    short, the resource tracker of a dashboard told to stop) is stopped too: the stop
    lists the node's processes again until none is left, with the members of its
    process groups (an orphan that names nothing of the node)."""
    temp_dir = tmp_path / "node"
    shell, daemon = _unreaped(_SPAWNER, temp_dir)
    try:
        assert shell.stdout is not None
        assert shell.stdout.readline().strip() == "ready"
        node = RayNode(temp_dir, Path("-"))
        assert node.processes() == [daemon]
        assert node.stop() == 3
        late = [psutil.Process(int(pid)) for pid in shell.stdout.readline().split()]
        assert len(late) == 2
        _gone, alive = psutil.wait_procs(late, timeout=0)  # init reaps them
        assert alive == [] or all(p.status() == psutil.STATUS_ZOMBIE for p in alive)
        assert node.processes() == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(daemon.pid, signal.SIGKILL)  # what a failed stop left
        shell.kill()
        shell.wait()
