"""Helpers for the API, client and CLI tests: users, a real uvicorn server, polling."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil
import uvicorn
from fastapi import FastAPI

from hypermedia import tls
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


def slow_upload(base_url: str, api_key: str, declared: int = 10_000_000) -> socket.socket:
    """A connection that sent an upload's headers and no byte of its body: an upload of
    the key's user arriving (``user_concurrent_uploads``) until its socket says more."""
    parts = urlsplit(base_url)
    conn = socket.create_connection((parts.hostname, parts.port), timeout=30)
    conn.sendall(
        (
            "PUT /v1/hypermedia/objects?filename=slow.bin HTTP/1.1\r\nHost: test\r\n"
            f"Authorization: Bearer {api_key}\r\nContent-Length: {declared}\r\n\r\n"
        ).encode()
    )
    return conn


def wait_until_healthy(base_url: str, timeout: float = 20.0, path: str = "/healthz") -> None:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            response = httpx.get(f"{base_url}{path}", timeout=2, verify=tls.client_context())
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


class AnswerDropper:
    """A TCP proxy in front of a real server that passes every request on but, for the
    next ``drops`` requests whose first line starts with ``request_line``, closes the
    client's connection instead of passing the answer back: the server did the work,
    the client never hears of it (a load balancer's reset, a lost network path)."""

    def __init__(self, upstream: str, request_line: bytes, drops: int) -> None:
        self.upstream = upstream.removeprefix("http://").rstrip("/")
        self.request_line = request_line
        self.drops = drops
        self.dropped = 0
        self.requests = 0  # requests that started with request_line, passed on or dropped
        self.sent = 0  # bytes the clients sent through it (requests' heads and bodies)
        self._lock = threading.Lock()
        self._listener = listening_socket()
        self._threads: list[threading.Thread] = []
        self._sockets: list[socket.socket] = []
        self._closed = False
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def __enter__(self) -> AnswerDropper:
        self._start(self._accept, self._listener)
        return self

    def __exit__(self, *_: object) -> None:
        self._closed = True
        self.cut()
        for thread in self._threads:
            thread.join(5)

    def cut(self) -> None:
        """As an API restarting: every connection reset, new ones refused."""
        with suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            self._sockets.clear()

    def restore(self) -> None:
        """Listening again, on the same port."""
        self._listener = listening_socket(port=int(self.url.rsplit(":", 1)[1]))
        self._start(self._accept, self._listener)

    def _start(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self, listener: socket.socket) -> None:
        while not self._closed:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            host, port = self.upstream.rsplit(":", 1)
            server = socket.create_connection((host, int(port)))
            with self._lock:
                self._sockets += [client, server]
            doomed = threading.Event()
            self._start(self._requests, client, server, doomed)
            self._start(self._answers, server, client, doomed)

    def _requests(
        self, client: socket.socket, server: socket.socket, doomed: threading.Event
    ) -> None:
        with suppress(OSError):
            while data := client.recv(65536):
                with self._lock:
                    self.sent += len(data)
                    if data.startswith(self.request_line):
                        self.requests += 1
                        if self.dropped < self.drops:
                            self.dropped += 1
                            doomed.set()
                server.sendall(data)

    def _answers(
        self, server: socket.socket, client: socket.socket, doomed: threading.Event
    ) -> None:
        with suppress(OSError):
            while data := server.recv(65536):
                if doomed.is_set():
                    break  # the answer is lost
                client.sendall(data)
        for sock in (client, server):
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class RequestHolder(AnswerDropper):
    """A TCP proxy in front of a real server that, while :meth:`hold` is on, keeps each
    request whose first line starts with ``request_line`` from the server until
    :meth:`release` (the others pass): a slow path to the server, as an S3 endpoint
    behind a stalled network takes its time to answer. ``held`` is set once one is kept."""

    def __init__(self, upstream: str, request_line: bytes) -> None:
        super().__init__(upstream, request_line, drops=0)
        self.held = threading.Event()
        self._released = threading.Event()
        self._released.set()

    def __enter__(self) -> RequestHolder:
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
        super().__exit__(*exc)

    def hold(self) -> None:
        self.held.clear()
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    def _requests(
        self, client: socket.socket, server: socket.socket, doomed: threading.Event
    ) -> None:
        with suppress(OSError):
            while data := client.recv(65536):
                if data.startswith(self.request_line) and not self._released.is_set():
                    self.held.set()
                    self._released.wait()
                server.sendall(data)
