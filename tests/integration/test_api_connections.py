"""Connections to the API as ``serve`` runs it (:class:`hypermedia.server.ApiServer`):
those that never finish a request head are closed (:class:`HeadTimedH11Protocol`), a
blob's bytes are sent by the kernel (:mod:`hypermedia.zero_copy`)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import suppress
from urllib.parse import urlsplit

import pytest
import uvicorn

from hypermedia import server as server_module
from hypermedia.embedded import listening_socket
from hypermedia.ingest.api import create_app
from hypermedia.server import ApiServer, HeadTimedH11Protocol
from hypermedia.stack import Stack
from hypermedia.storage.local import LocalStorage
from tests.api_support import add_user, wait_until_healthy
from tests.support import open_handles, within

HEAD_SECONDS = 1.0
BODY_SECONDS = 4.0  # json_body_seconds: the slow body below takes 2 s
MiB = 1 << 20


class _Quick(HeadTimedH11Protocol):
    head_seconds = HEAD_SECONDS


@pytest.fixture
def api(sqlite_engine, settings) -> Iterator[tuple[Stack, int]]:
    stack = Stack.open(
        settings(json_body_seconds=BODY_SECONDS), engine=sqlite_engine, auto_migrate=True
    )
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
    """One whole answer's head (its Content-Length of body read too)."""
    return _answer_and_body(conn)[0]


def _until_closed(conn: socket.socket, seconds: float) -> tuple[bytes, float]:
    """What the server sends until it closes the connection, and when it did (a reset:
    the server closed it with bytes of ours unread)."""
    began = time.monotonic()
    conn.settimeout(seconds)
    said = b""
    with suppress(ConnectionResetError):
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


@pytest.mark.parametrize("chunked", [False, True])
def test_a_json_body_that_does_not_arrive_whole_in_time_is_refused_and_closed(api, chunked):
    # Before: uvicorn waited for a body as long as its client kept the connection; one
    # declared longer than sent (any valid key) held its socket for good.
    stack, port = api
    user = add_user(stack, "alice")
    body = b'{"object_id": "nothing", "operations": ["thumbnail"]}'
    framing = b"Transfer-Encoding: chunked" if chunked else b"Content-Length: %d" % len(body)
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(
            b"POST /v1/hypermedia/process HTTP/1.1\r\nHost: test\r\n"
            b"Authorization: Bearer %s\r\nContent-Type: application/json\r\n"
            b"%s\r\n\r\n" % (user.api_key.encode(), framing)
        )
        part = body[:20]
        conn.sendall(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)
        said, after = _until_closed(conn, 10 * BODY_SECONDS)
    head, _, answer = said.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 "), said
    assert b"connection: close" in head.lower()
    error = json.loads(answer)["error"]
    assert error["code"] == "request_timeout"
    assert error["message"] == (
        f"the request body did not arrive within {BODY_SECONDS:g} s (20 bytes came)"
    )
    assert BODY_SECONDS - 0.5 < after < BODY_SECONDS + 3


def _blob(stack: Stack, size: int) -> tuple[LocalStorage, str, bytes, str]:
    """A stored blob: its storage, key, bytes and the request target of a signed GET."""
    storage = stack.storage
    assert isinstance(storage, LocalStorage)
    key = "derived/p/o/1/video"
    data = os.urandom(size)
    storage.put(key, [data])
    parts = urlsplit(storage.presign_get(key, 600))
    return storage, key, data, f"{parts.path}?{parts.query}"


def _paused_reader(port: int, target: str) -> socket.socket:
    """A GET of ``target`` whose client reads nothing (a paused player, a slow link)."""
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reader.connect(("127.0.0.1", port))
    reader.sendall(f"GET {target} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
    return reader


def test_a_reader_that_stops_reading_holds_none_of_the_blob_in_the_api(api):
    # Before: the blob went out in 1 MB chunks through the process, and each download
    # whose reader had stopped held ~1.6 MB of it (a chunk read ahead, the transport's
    # copy of the last) for as long as it stayed open: 300 paused readers of a running
    # `serve`, ~480 MB. Now the kernel sends the file: 300 hold ~12 MB in all.
    stack, port = api
    storage, key, _data, target = _blob(stack, 8 * MiB)
    readers: list[socket.socket] = []
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        readers = [_paused_reader(port, target) for _ in range(20)]
        assert within(20, lambda: open_handles(storage.path(key)) == 20)
        for reader in readers:  # each answer has begun, its socket buffers are full
            reader.settimeout(10)
            assert reader.recv(16, socket.MSG_PEEK).startswith(b"HTTP/1.1 200 ")
        time.sleep(1)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
        for reader in readers:
            reader.close()
    assert held < 5 * MiB, f"20 paused readers hold {held / MiB:.1f} MB of the API's memory"
    assert within(10, lambda: open_handles(storage.path(key)) == 0)  # and let go at once


def test_a_blob_sent_by_the_kernel_is_whole_and_its_connection_serves_on(api):
    stack, port = api
    _storage, _key, data, target = _blob(stack, 3 * MiB + 17)
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.settimeout(10)
        for ranged, status, expected in (
            (b"", b"200", data),
            (b"Range: bytes=1000-2099999\r\n", b"206", data[1000:2100000]),
            (b"Range: bytes=-5\r\n", b"206", data[-5:]),
            (b"Range: bytes=7-7\r\n", b"206", data[7:8]),
            (b"", b"200", data),
        ):
            conn.sendall(b"GET %s HTTP/1.1\r\nHost: test\r\n%s\r\n" % (target.encode(), ranged))
            head, body = _answer_and_body(conn)
            assert head.startswith(b"HTTP/1.1 " + status + b" "), head
            assert body == expected
        conn.sendall(b"HEAD %s HTTP/1.1\r\nHost: test\r\n\r\n" % target.encode())
        said = b""
        while b"\r\n\r\n" not in said:
            said += conn.recv(65536)
        assert said.startswith(b"HTTP/1.1 200 ") and said.endswith(b"\r\n\r\n"), said
        assert b"content-length: %d\r\n" % len(data) in said.lower()


def _answer_and_body(conn: socket.socket) -> tuple[bytes, bytes]:
    said = b""
    while b"\r\n\r\n" not in said:
        said += conn.recv(65536)
    head, _, body = said.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    chunks = [body]
    got = len(body)
    while got < length:
        chunk = conn.recv(1 << 20)
        assert chunk, "closed mid-body"
        chunks.append(chunk)
        got += len(chunk)
    body = b"".join(chunks)
    assert len(body) == length, "more bytes than its Content-Length"
    return head, body


def test_a_body_still_coming_after_its_answer_does_not_hold_the_connection(api):
    # A request answered before its body was read (401 without a key, 413 over the
    # limit): uvicorn read and dropped the rest, its keep-alive timer stopped by the
    # first byte of it and not set again. Before: one byte after the answer, then
    # nothing, held the socket for good (no key needed). Such an answer now says
    # Connection: close and the connection ends with it.
    _stack, port = api
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.settimeout(10)
        conn.sendall(
            b"POST /v1/hypermedia/process HTTP/1.1\r\nHost: test\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
        )
        head = _answer(conn)
        assert head.startswith(b"HTTP/1.1 401 ") and b"connection: close" in head.lower()
        with suppress(OSError):
            conn.sendall(b"{")
        said, after = _until_closed(conn, 8 + 10 * HEAD_SECONDS)
    assert said == b""
    assert after < 5 * HEAD_SECONDS


def test_an_idle_api_wakes_once_a_tick_and_a_stop_wakes_it_at_once(
    sqlite_engine, settings, monkeypatch
):
    """uvicorn's loop woke every 0.1 s to look for a stop (0.12 CPU-s a minute of an idle
    head): the API's wakes every TICK_SECONDS, and a stop set from another thread (a
    stack's stop) wakes it at once, however long the tick."""
    monkeypatch.setattr(server_module, "TICK_SECONDS", 3600.0, raising=False)
    stack = Stack.open(settings(), engine=sqlite_engine, auto_migrate=True)
    sock = listening_socket()
    app = create_app(stack, auth_cache_seconds=0)
    server = ApiServer(uvicorn.Config(app, log_config=None, lifespan="off"), app)
    ticks: list[int] = []
    tick = server.on_tick

    async def counted(counter: int) -> bool:
        ticks.append(counter)
        return await tick(counter)

    server.on_tick = counted  # type: ignore[method-assign]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until_healthy(f"http://127.0.0.1:{sock.getsockname()[1]}")
        time.sleep(0.5)  # uvicorn's own loop: 5 ticks more
        assert ticks == [0]
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
        stack.close()
    assert not thread.is_alive()
    assert ticks == [0, 10]  # the stop's: the header refreshed, the loop left
