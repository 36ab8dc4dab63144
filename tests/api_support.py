"""Helpers for the API, client and CLI tests: users, a real uvicorn server, polling."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn
from fastapi import FastAPI

from hypermedia.accounts import NewUser, create_user
from hypermedia.db.engine import transaction
from hypermedia.embedded import listening_socket
from hypermedia.stack import Stack


def add_user(stack: Stack, name: str, credits: float = 10.0, *, operator: bool = False) -> NewUser:
    with transaction(stack.engine) as conn:
        return create_user(
            conn,
            name,
            stack.clock.now(),
            credits_millicredits=round(credits * 1000),
            is_operator=operator,
        )


def bearer(user: NewUser) -> dict[str, str]:
    return {"Authorization": f"Bearer {user.api_key}"}


def wait_until_healthy(base_url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            response = httpx.get(f"{base_url}/healthz", timeout=2)
            if response.status_code == 200:
                return
            last = response.text
        except httpx.TransportError as exc:
            last = exc
        time.sleep(0.05)
    raise AssertionError(f"{base_url} did not become healthy within {timeout}s: {last}")


@contextmanager
def running_server(
    app: FastAPI, sock: socket.socket | None = None, *, access_log: bool = True
) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a thread on ``sock``, a listening socket (default: a
    new one on a port the kernel picks; no other process can take it before uvicorn
    serves it); yields the base URL."""
    sock = sock or listening_socket()
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, log_config=None, access_log=access_log, lifespan="off")
    )
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="uvicorn-test", daemon=True
    )
    thread.start()
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(base_url)
        yield base_url
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
        assert not thread.is_alive(), "uvicorn did not stop"
