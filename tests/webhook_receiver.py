"""A real HTTP server on 127.0.0.1 that receives webhooks, for tests.

It records every request (headers and body) and answers the codes it is told to, in
order (then 200); ``hold`` makes it keep each request open until released (a webhook
that hangs); ``answer_bytes`` makes it answer that long a body (``sent``: how much of it
the sender took before it went away); ``drip`` makes it write its answer's head one byte
at a time, that many seconds apart (a receiver that never quite times out);
``on_request`` is called as each request arrives (a test's clock moved by the time a
slow receiver would take)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    answered: int

    def json(self) -> Any:
        return json.loads(self.body)


class Receiver:
    def __init__(self) -> None:
        self.requests: list[Received] = []
        self.answers: list[int] = []  # codes to answer next, in order; then 200
        self.hold = threading.Event()  # set: requests wait for `release`
        self.release = threading.Event()
        self.arrived = threading.Event()
        self.answer_bytes = 0
        self.sent = 0
        self.drip = 0.0
        self.on_request: Callable[[], object] | None = None
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                receiver.arrived.set()
                if receiver.on_request is not None:
                    receiver.on_request()
                if receiver.hold.is_set():
                    receiver.release.wait(60)
                with receiver._lock:
                    code = receiver.answers.pop(0) if receiver.answers else 200
                    receiver.requests.append(
                        Received(self.path, dict(self.headers.items()), body, code)
                    )
                if receiver.drip:
                    head = f"HTTP/1.1 {code} OK\r\nContent-Length: 0\r\n\r\n".encode()
                    try:
                        for byte in head:
                            self.wfile.write(bytes([byte]))
                            time.sleep(receiver.drip)
                    except OSError:
                        pass  # the sender went away
                    return
                self.send_response(code)
                self.send_header("Content-Length", str(receiver.answer_bytes))
                self.end_headers()
                chunk = b"x" * (1 << 20)
                while receiver.sent < receiver.answer_bytes:
                    size = min(len(chunk), receiver.answer_bytes - receiver.sent)
                    try:
                        self.wfile.write(chunk[:size])
                    except OSError:
                        return  # the sender went away
                    receiver.sent += size

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/alerts"

    def taken(self) -> list[Received]:
        """The requests received so far, and forget them."""
        with self._lock:
            taken, self.requests = self.requests, []
        return taken


@contextmanager
def receiving() -> Iterator[Receiver]:
    receiver = Receiver()
    thread = threading.Thread(target=receiver.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.release.set()
        receiver.server.shutdown()
        receiver.server.server_close()
        thread.join(10)
