"""Helpers for the API, client and CLI tests: users, a real uvicorn server, polling."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx
import psutil
import uvicorn
from fastapi import FastAPI

from hypermedia.accounts import NewUser, create_user
from hypermedia.db.engine import transaction
from hypermedia.embedded import free_port, listening_socket
from hypermedia.stack import Stack

REPO = Path(__file__).resolve().parents[1]


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


def wait_until_healthy(base_url: str, timeout: float = 20.0, path: str = "/healthz") -> None:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            response = httpx.get(f"{base_url}{path}", timeout=2)
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


def serve_on_a_free_port(
    command: Callable[[int], list[str]],
    env: dict[str, str],
    log_path: Path,
    *,
    tries: int = 3,
    timeout: float = 60.0,  # a start under load (a CI run's first minutes: load ~20)
    pick: Callable[[], int] = free_port,
    ready: str = "/healthz",
    taken: str = "could not start on 127.0.0.1:{port}",
) -> tuple[subprocess.Popen[bytes], str]:
    """A server process (``command(port)``, its output appended to ``log_path``) on a
    port free when picked, once it answers ``ready`` with 200; the process and its base
    URL. Another process may take the port between its pick and the server's bind: the
    server then exits saying so (``taken``, with the port), and is started again on
    another (``tries`` in all)."""
    for attempt in range(1, tries + 1):
        port = pick()
        with log_path.open("a") as log:
            process = subprocess.Popen(
                command(port), env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT
            )
        base_url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                break
            # Ours, not whoever took the port (another test's API answers /healthz too).
            if _listens(process.pid, port):
                wait_until_healthy(base_url, timeout, path=ready)
                return process, base_url
            time.sleep(0.05)
        else:
            process.kill()
            process.wait()
            raise AssertionError(f"{base_url} did not become healthy within {timeout}s")
        said = log_path.read_text()
        if attempt == tries or taken.format(port=port) not in said:
            raise AssertionError(f"the server exited {process.returncode}:\n{said[-3000:]}")
    raise AssertionError("unreachable")


def _listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` has a TCP socket listening on ``port``."""
    with suppress(psutil.Error):
        for conn in psutil.Process(pid).net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
                return True
    return False
