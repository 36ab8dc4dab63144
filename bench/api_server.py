"""The HTTP API under uvicorn, for the benchmark: ``python -m bench.api_server --port N``.

``--socket bind`` (the default): uvicorn binds the port itself, as ``hypermedia serve``
does; ``--socket listening``: it serves a socket already listening
(:func:`hypermedia.embedded.listening_socket`), as the local stack of ``hypermedia run``
and ``hypermedia up`` does.

Settings come from ``HYPERMEDIA_*`` variables (the parent passes its database,
Redis and prefix). The schema must already be migrated. No access log: one
line per request would measure the terminal, not the API. The server stops by
itself when its parent process goes away.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time

import uvicorn

from hypermedia.config import load_settings
from hypermedia.embedded import listening_socket
from hypermedia.ingest.api import create_app
from hypermedia.stack import Stack


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default=os.environ.get("HYPERMEDIA_BENCH_HOST", "127.0.0.1"))
    parser.add_argument(
        "--port", type=int, default=int(os.environ.get("HYPERMEDIA_BENCH_PORT", "8080"))
    )
    parser.add_argument("--socket", choices=("bind", "listening"), default="bind")
    args = parser.parse_args()
    _exit_with_parent()
    stack = Stack.open(load_settings())
    try:
        config = uvicorn.Config(
            create_app(stack),
            host=args.host,
            port=args.port,
            log_level="warning",
            access_log=False,
            lifespan="off",
        )
        if args.socket == "listening":
            uvicorn.Server(config).run(sockets=[listening_socket(args.host, args.port)])
        else:
            uvicorn.Server(config).run()
    finally:
        stack.close()


def _exit_with_parent(interval: float = 0.5) -> None:
    """SIGTERM ourselves (uvicorn then shuts down) if the benchmark dies without
    stopping us, so no server outlives a killed run."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


if __name__ == "__main__":
    main()
