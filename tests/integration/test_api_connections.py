"""Connections that never finish a request head: the API, as ``serve`` runs it
(:class:`hypermedia.server.ApiServer`), closes them (:class:`HeadTimedH11Protocol`)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn

from hypermedia.embedded import listening_socket
from hypermedia.ingest.api import create_app
from hypermedia.server import ApiServer, HeadTimedH11Protocol
from hypermedia.stack import Stack
from tests.api_support import add_user, wait_until_healthy

HEAD_SECONDS = 1.0


class _Quick(HeadTimedH11Protocol):
    head_seconds = HEAD_SECONDS


@pytest.fixture
def api(sqlite_engine, settings) -> Iterator[tuple[Stack, int]]:
    stack = Stack.open(settings(), engine=sqlite_engine, auto_migrate=True)
    sock = listening_socket()
    app = create_app(stack, auth_cache_seconds=0)
    server = ApiServer(uvicorn.Config(app, log_config=None, lifespan="off"), app)
    assert server.config.http is HeadTimedH11Protocol  # what serve, up and run get
    server.config.http = _Quick
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    port = sock.getsockname()[1]
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}")
        yield stack, port
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
        stack.close()
    assert not thread.is_alive()


def _answer(conn: socket.socket) -> bytes:
    """One whole answer (its head and its Content-Length of body)."""
    said = b""
    while b"\r\n\r\n" not in said:
        said += conn.recv(65536)
    head, _, body = said.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += conn.recv(65536)
    return head


def _until_closed(conn: socket.socket, seconds: float) -> tuple[bytes, float]:
    """What the server sends until it closes the connection, and when it did."""
    began = time.monotonic()
    conn.settimeout(seconds)
    said = b""
    while chunk := conn.recv(65536):
        said += chunk
    return said, time.monotonic() - began


def test_a_connection_that_never_finishes_a_request_head_is_closed(api):
    # Before: uvicorn waited for a head for ever; 1,100 silent connections took every
    # descriptor of an API under a shell's 1,024 and nobody else got an answer.
    _stack, port = api
    with (
        socket.create_connection(("127.0.0.1", port)) as silent,
        socket.create_connection(("127.0.0.1", port)) as trickling,
    ):
        trickling.sendall(b"GET /healthz HTTP/1.1\r\nHost: test\r\nX-Slow: ")
        said, after = _until_closed(trickling, 10 * HEAD_SECONDS)
        head, _, body = said.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 "), said
        assert json.loads(body)["error"]["code"] == "request_timeout"
        assert after < 5 * HEAD_SECONDS
        assert _until_closed(silent, 10 * HEAD_SECONDS)[0] == b""


def test_a_kept_alive_connection_gets_the_time_again_and_a_slow_body_is_not_cut(api):
    stack, port = api
    user = add_user(stack, "alice")
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.settimeout(10)
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n")
        assert _answer(conn).startswith(b"HTTP/1.1 200 ")
        # The head of the next request on it is complete in time, its body is not:
        # the head's timer has stopped (a JSON body's pace is not the head's).
        body = b'{"object_id": "nothing", "operations": ["thumbnail"]}'
        conn.sendall(
            b"POST /v1/hypermedia/process HTTP/1.1\r\nHost: test\r\n"
            b"Authorization: Bearer %s\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (user.api_key.encode(), len(body))
        )
        time.sleep(2 * HEAD_SECONDS)
        conn.sendall(body)
        assert _answer(conn).startswith(b"HTTP/1.1 404 ")  # no such object
        conn.sendall(b"GET /healthz HTTP/1.1\r\n")  # and again, the next head: cut
        said, _after = _until_closed(conn, 10 * HEAD_SECONDS)
        assert said.startswith(b"HTTP/1.1 408 "), said
