"""The stand-ins a head nobody observes runs for Ray's agents
(hypermedia.worker.agent_stand_in): each lives as long as the raylet that started it, and
the runtime env agent's becomes Ray's agent when someone connects. Real processes, each
a Python without site-packages (~0.01 CPU-s); the test process or a shell plays the
raylet."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from hypermedia.worker import agent_stand_in

STAND_IN = [sys.executable, "-S", agent_stand_in.__file__]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _until(check, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"no {what} within {timeout:g} s"
        time.sleep(0.05)
    return found


def _listening(pid: int, port: int) -> bool:
    """Whether ``pid`` listens on ``port`` (read, not connected to: a connection is
    what turns the stand-in into Ray's agent)."""
    try:
        connections = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.NoSuchProcess:
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in connections)


def test_the_runtime_env_agents_stand_in_becomes_rays_agent_when_someone_connects(tmp_path):
    """It listens on the agent's port; the first connection (the raylet's, for a
    runtime_env) makes it run Ray's command in its own process (the one the raylet
    watches), the port free for it: the agent Ray would have started, started when it is
    needed."""
    port = _free_port()
    became = tmp_path / "became"
    # Ray's agent binds the port, then says so.
    agent = (
        f"import os, socket; socket.create_server(('127.0.0.1', {port}));"
        f" open({str(became)!r}, 'w').write(str(os.getpid()))"
    )
    command = [*STAND_IN, "runtime_env_agent", f"--listen=127.0.0.1:{port}", "--"]
    command += [sys.executable, "-c", agent]
    env = {**os.environ, "RAY_RAYLET_PID": str(os.getpid())}
    stand_in = subprocess.Popen(command, env=env)
    try:
        _until(lambda: _listening(stand_in.pid, port), "stand-in listening")
        time.sleep(1.5)  # a poll or so
        assert not became.exists() and stand_in.poll() is None  # nobody asked yet
        # Reset, refused or taken: the connection is not served (the raylet tries again).
        with contextlib.suppress(ConnectionError):
            socket.create_connection(("127.0.0.1", port), timeout=10).close()
        assert stand_in.wait(timeout=30) == 0
        assert became.read_text() == str(stand_in.pid)  # Ray's agent, in its process
    finally:
        stand_in.kill()
        stand_in.wait()


def test_a_port_the_stand_in_cannot_bind_is_rays_agents_at_once(tmp_path):
    """Its port taken: Ray's agent at once (it reports the conflict as Ray does)."""
    became = tmp_path / "became"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [*STAND_IN, "runtime_env_agent", f"--listen=127.0.0.1:{port}", "--"]
        command += [sys.executable, "-c", f"open({str(became)!r}, 'w').write('ran')"]
        result = subprocess.run(command, timeout=60, check=False)
    assert result.returncode == 0
    assert became.read_text() == "ran"


def _stand_ins(pid: int) -> list[psutil.Process]:
    """Both stand-ins among ``pid``'s children once both are (a child may still be the
    shell it was forked as); [] before."""
    children = psutil.Process(pid).children()
    found = [p for p in children if p.cmdline()[1:3] == STAND_IN[1:3]]
    return found if len(found) == 2 else []


def test_the_stand_ins_end_with_the_raylet(tmp_path: Path):
    """The raylet ends itself when an agent exits, so a stand-in waits, and ends within
    a second or so of the raylet (as Ray's agents end with theirs): a raylet killed
    with -9 leaves neither behind. Here a shell that starts both is the raylet, and
    names itself to them as the raylet does (RAY_RAYLET_PID)."""
    port = _free_port()
    session = tmp_path / "session"
    stand_in = f"RAY_RAYLET_PID=$$ {' '.join(STAND_IN)}"
    line = " ".join(
        [
            f"{stand_in} dashboard_agent --session-dir={session} &",
            f"{stand_in} runtime_env_agent --listen=127.0.0.1:{port} -- false &",
            "exec sleep 600",
        ]
    )
    raylet = subprocess.Popen(["/bin/sh", "-c", line])
    stand_ins: list[psutil.Process] = []
    try:
        stand_ins = _until(lambda: _stand_ins(raylet.pid), "both stand-ins started")
        assert len(stand_ins) == 2, stand_ins
        _until(lambda: any(_listening(p.pid, port) for p in stand_ins), "stand-in listening")
        time.sleep(1.5)  # a poll or so: both still there while the raylet is
        assert all(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in stand_ins)
    finally:
        raylet.kill()
        raylet.wait()
    _gone, alive = psutil.wait_procs(stand_ins, timeout=30)
    assert alive == []
    # A raylet gone before its stand-in looked (its parent is another already): ends.
    env = {**os.environ, "RAY_RAYLET_PID": str(raylet.pid)}
    late = subprocess.run(
        [*STAND_IN, "dashboard_agent", f"--session-dir={session}"], env=env, timeout=60
    )
    assert late.returncode == 0
