"""What the embedded stack starts dies with the process that started it.

``ray start`` daemonizes (its raylet and GCS are nobody's children) and the embedded
Redis runs in a session of its own, so neither dies with ``hypermedia run`` or the
``up`` head when that process is killed (``kill -9``, the OOM killer, a crash).
:class:`Watchdog` is their net: a small process in a session of its own that holds
the read end of a pipe whose write end only the stack's process has (the kernel
closes it when that process dies, however it dies). The stack's process names each
service before it starts it, one JSON line each (a Ray node's temp dir, an embedded
Redis's directory: paths, never a secret), and writes ``done`` once it has stopped
them itself. If the pipe ends without ``done``, the watchdog stops every service
named, as ``hypermedia down`` would, and exits. Signals the stack's process handles
(SIGTERM, SIGINT) go through its own orderly stop; this is for the ones it cannot.

Run as ``python -m hypermedia.watchdog FD DATA_DIR``; the data dir is on its
command line so that ``ps`` tells which stack it watches.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)


class Watchdog:
    """The stack's side: start the watchdog, name services, say ``done``."""

    def __init__(self, data_dir: Path) -> None:
        from hypermedia.worker.cluster import INHERITED, INHERITED_PREFIXES

        read_end, write_end = os.pipe()  # both non-inheritable (PEP 446)
        log_fd = os.open(data_dir / "watchdog.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "hypermedia.watchdog", str(read_end), str(data_dir)],
                pass_fds=(read_end,),
                stdin=subprocess.DEVNULL,
                stdout=log_fd,
                stderr=log_fd,
                start_new_session=True,  # a Ctrl-C or a kill of the process group spares it
                # Only what finding programs needs: the stack's credentials stay with it.
                env={
                    k: v
                    for k, v in os.environ.items()
                    if k in INHERITED or k.startswith(INHERITED_PREFIXES)
                },
            )
        finally:
            os.close(read_end)
            os.close(log_fd)
        self._pipe: IO[str] | None = os.fdopen(write_end, "w", buffering=1)

    def watch_ray_node(self, temp_dir: Path) -> None:
        self._say({"ray": str(temp_dir)})

    def watch_redis(self, directory: Path) -> None:
        self._say({"redis": str(directory)})

    def done(self) -> None:
        """Everything named was stopped by its owner: the watchdog exits quietly."""
        if self._pipe is None:
            return
        with contextlib.suppress(OSError):
            self._say({"done": True})
            self._pipe.close()
        self._pipe = None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5)

    def _say(self, message: dict[str, object]) -> None:
        if self._pipe is not None:
            self._pipe.write(json.dumps(message) + "\n")


def stop_services(ray_nodes: list[str], redis_dirs: list[str]) -> None:
    """Stop the named Ray nodes and embedded Redis servers (what ``down`` does too)."""
    from hypermedia.embedded import find_running
    from hypermedia.worker.cluster import RayNode

    for temp_dir in ray_nodes:
        node = RayNode(Path(temp_dir), Path(temp_dir) / "no-token")
        if node.is_running():
            count = node.stop()
            log.warning("stopped the Ray node in %s (%d processes)", temp_dir, count)
    for directory in redis_dirs:
        running = find_running(Path(directory))
        if running is not None:
            running.stop()
            log.warning("stopped the Redis of %s", directory)


def main(argv: list[str]) -> int:
    from hypermedia import logs
    from hypermedia.errors import ConfigError

    try:
        logs.configure_from_environment()
    except ConfigError:
        # The CLI that started this checked both variables; never fail to watch.
        logs.configure("info", "json")
    # Its own session has no terminal; a stray SIGINT/SIGHUP must not end the watch.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    fd, data_dir = int(argv[0]), argv[1]
    ray_nodes: list[str] = []
    redis_dirs: list[str] = []
    with os.fdopen(fd) as pipe:
        for line in pipe:
            message = json.loads(line)
            if message.get("done"):
                return 0
            if "ray" in message:
                ray_nodes.append(message["ray"])
            if "redis" in message:
                redis_dirs.append(message["redis"])
    log.warning("the stack of %s died without stopping: stopping what it started", data_dir)
    stop_services(ray_nodes, redis_dirs)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
