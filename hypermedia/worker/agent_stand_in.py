"""What a head nobody observes runs in place of Ray's two agents (see
:mod:`hypermedia.worker.ray_start`, ``--without-agents``).

The raylet starts both agents and ends itself when one of them exits, so each gets a
stand-in that lives as long as the raylet (it ends within a second of the raylet, as
Ray's agents do) and imports nothing of Ray: a Python started ``-S`` on this file, the
standard library only (~0.01 CPU-s, where Ray's agents take ~1.2 to start).

``dashboard_agent --session-dir=DIR``
    Waits. ``--session-dir`` only names the node it belongs to (its processes are found
    by their temp dir).
``runtime_env_agent --listen=HOST:PORT -- COMMAND...``
    Listens on the agent's port. The first connection (a task or actor with a
    ``runtime_env``, which nothing of ours asks: the raylet talks to the agent for those
    only) turns it into Ray's own agent: it closes its socket and executes ``COMMAND``,
    the command Ray gave, in this process (the raylet's, which it watches). The raylet
    tries again every second meanwhile. A port it cannot bind: Ray's agent at once.
"""

from __future__ import annotations

import os
import select
import socket
import sys
from collections.abc import Sequence

POLL_SECONDS = 1.0


def _raylet_pid() -> int:
    """The raylet that started this process: Ray names it to its agents (the parent
    this process has now may already be another, the raylet gone as it started); else
    the parent (1: none)."""
    try:
        return int(os.environ["RAY_RAYLET_PID"])
    except (KeyError, ValueError):
        return os.getppid()


def _raylet_gone(raylet: int) -> bool:
    # This process was handed to another parent (init, a subreaper), or had no raylet.
    return raylet <= 1 or os.getppid() != raylet


def _listen(address: str) -> socket.socket | None:
    host, _, port = address.rpartition(":")
    try:
        return socket.create_server((host.strip("[]"), int(port)), backlog=1)
    except (OSError, ValueError):
        return None


def run(kind: str, options: Sequence[str], command: Sequence[str]) -> int:
    """Stand in for Ray's agent ``kind`` until the raylet ends (0) or, for the
    runtime env agent, until someone connects (then it becomes ``command``)."""
    raylet = _raylet_pid()
    server = None
    if kind == "runtime_env_agent":
        listen = next((o.partition("=")[2] for o in options if o.startswith("--listen=")), "")
        server = _listen(listen)
        if server is None:
            return _become(command)
    elif kind != "dashboard_agent":
        print(f"agent_stand_in: no such agent {kind!r}", file=sys.stderr)
        return 2
    waiting = [server] if server is not None else []
    while not _raylet_gone(raylet):
        ready, _, _ = select.select(waiting, [], [], POLL_SECONDS)
        if ready and server is not None:
            server.close()  # the connection waiting is refused: the raylet tries again
            return _become(command)
    return 0


def _become(command: Sequence[str]) -> int:
    """Ray's agent, in this process (execvp does not return: it runs the command or
    raises)."""
    if not command:
        print("agent_stand_in: no command to run", file=sys.stderr)
        return 2
    os.execvp(command[0], list(command))  # noqa: S606 - Ray's own command for its agent


def main(argv: Sequence[str]) -> int:
    if not argv:
        print("usage: agent_stand_in.py KIND [--option=...] [-- COMMAND...]", file=sys.stderr)
        return 2
    kind, *rest = argv
    if "--" in rest:
        at = rest.index("--")
        options, command = rest[:at], rest[at + 1 :]
    else:
        options, command = rest, []
    return run(kind, options, command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
