"""The HTTP API under uvicorn, for the benchmark: ``python -m bench.api_server --port N``.

Settings come from ``HYPERMEDIA_*`` variables (the parent passes its database,
Redis and prefix). The schema must already be migrated. No access log: one
line per request would measure the terminal, not the API.
"""

from __future__ import annotations

import argparse
import os

import uvicorn

from hypermedia.config import load_settings
from hypermedia.ingest.api import create_app
from hypermedia.stack import Stack


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default=os.environ.get("HYPERMEDIA_BENCH_HOST", "127.0.0.1"))
    parser.add_argument(
        "--port", type=int, default=int(os.environ.get("HYPERMEDIA_BENCH_PORT", "8080"))
    )
    args = parser.parse_args()
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
        uvicorn.Server(config).run()
    finally:
        stack.close()


if __name__ == "__main__":
    main()
