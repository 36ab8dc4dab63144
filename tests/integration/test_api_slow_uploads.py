"""Slow uploads (slowloris: headers, then a trickle or nothing) through a real uvicorn
server: they neither take the threads every other route runs in, nor hold an upload
slot for ever."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import pytest

from hypermedia import tls
from hypermedia.ingest.api import create_app
from hypermedia.stack import Stack
from tests.api_support import add_user, bearer, running_server, slow_upload

P = "/v1/hypermedia"
DEFAULT_THREADS = 40  # anyio's default thread limiter: every sync route and dependency


@pytest.fixture
def stack(engine, settings) -> Iterator[Stack]:
    opened = Stack.open(
        settings(
            upload_concurrency=4,
            upload_idle_seconds=1.5,
            upload_min_bytes_per_second=100,
            user_concurrent_uploads=DEFAULT_THREADS + 5,  # one user fills the threads
        ),
        engine=engine,
        auto_migrate=True,
    )
    yield opened
    opened.close()


@pytest.fixture
def base_url(stack) -> Iterator[str]:
    with running_server(create_app(stack), access_log=False) as url:
        yield url


def _answer(conn: socket.socket) -> tuple[int, dict[str, object]]:
    answer = b""
    while chunk := conn.recv(65536):
        answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        if body and body.count(b"{") == body.count(b"}"):
            break
    return int(head.split(b" ", 2)[1]), json.loads(body)["error"]


def test_stalled_uploads_leave_the_other_routes_their_threads(stack, base_url):
    user = add_user(stack, "eve")  # an ordinary user: 60 uploads a minute
    with ExitStack() as sockets:
        for _ in range(DEFAULT_THREADS + 5):
            sockets.enter_context(slow_upload(base_url, user.api_key))
        time.sleep(1.0)  # every one of them in its handler, waiting for its body
        with httpx.Client(base_url=base_url, timeout=5, verify=tls.client_context()) as client:
            assert client.get("/healthz").status_code == 200
            assert client.get(f"{P}/credits", headers=bearer(user)).status_code == 200


def test_an_upload_whose_body_stops_is_refused(stack, base_url):
    user = add_user(stack, "eve")
    with slow_upload(base_url, user.api_key) as conn:
        conn.sendall(b"x" * 500)
        started = time.monotonic()
        status, error = _answer(conn)
    assert (status, error["code"]) == (408, "upload_too_slow")
    assert time.monotonic() - started < 10
    assert [p for p in stack.settings.storage_dir.rglob("*") if p.is_file()] == []


def test_an_upload_trickling_below_the_minimum_rate_is_refused(stack, base_url):
    user = add_user(stack, "eve")
    with slow_upload(base_url, user.api_key) as conn:
        started = time.monotonic()
        conn.settimeout(0.3)
        status: int | None = None
        error: dict[str, object] = {}
        while status is None and time.monotonic() - started < 10:
            conn.sendall(b"x")  # ~4 bytes/s: never idle, far below 100 bytes/s
            try:
                status, error = _answer(conn)
            except TimeoutError:
                continue
    assert (status, error.get("code")) == (408, "upload_too_slow")
    assert "bytes/s" in str(error["message"])


def test_one_user_may_have_a_few_uploads_arriving_at_once(engine, settings):
    """user_concurrent_uploads (4 by default): a fifth upload of a user whose four are
    still arriving is refused at once (429, nothing read); another user's upload, and
    an operator's, go through; once one of the four ends the user may upload again."""
    stack = Stack.open(settings(upload_idle_seconds=30), engine=engine, auto_migrate=True)
    try:
        with running_server(create_app(stack), access_log=False) as url:
            eve, bob = add_user(stack, "eve"), add_user(stack, "bob")
            operator = add_user(stack, "op", operator=True)
            with (
                ExitStack() as sockets,
                httpx.Client(base_url=url, timeout=10, verify=tls.client_context()) as client,
            ):
                held = [sockets.enter_context(slow_upload(url, eve.api_key)) for _ in range(4)]
                time.sleep(0.5)  # the four in their handlers, their bodies awaited

                def upload(person) -> httpx.Response:
                    return client.put(
                        f"{P}/objects",
                        params={"filename": "a.bin"},
                        content=b"hello",
                        headers=bearer(person),
                    )

                refused = upload(eve)
                assert refused.status_code == 429, refused.text
                assert refused.json()["error"]["code"] == "concurrency_limited"
                assert "at most 4 at once" in refused.json()["error"]["message"]
                assert refused.headers["retry-after"] == "1"
                assert upload(bob).status_code == 201
                assert upload(operator).status_code == 201
                held[0].sendall(b"x" * 5)
                held[0].shutdown(socket.SHUT_WR)  # its body ends short: the upload ends
                deadline = time.monotonic() + 5
                while (answer := upload(eve)).status_code == 429:
                    assert time.monotonic() < deadline, answer.text
                    time.sleep(0.1)
                assert answer.status_code == 201, answer.text
    finally:
        stack.close()


def test_an_upload_refused_for_the_users_uploads_arriving_is_not_counted_on_her_rate(
    engine, settings
):
    """The 429 of user_concurrent_uploads asks for the upload again in a second: it was
    counted on the user's uploads per minute before the place was looked for, so a
    client that waited for a place used her rate up (7 a minute, 4 arriving, 3 refused:
    the next upload, once one ended, 429 "too many uploads ... retry in 60 s")."""
    stack = Stack.open(
        settings(upload_idle_seconds=30, user_uploads_per_minute=7),
        engine=engine,
        auto_migrate=True,
    )
    try:
        with running_server(create_app(stack), access_log=False) as url:
            eve = add_user(stack, "eve")
            with (
                ExitStack() as sockets,
                httpx.Client(base_url=url, timeout=10, verify=tls.client_context()) as client,
            ):
                held = [sockets.enter_context(slow_upload(url, eve.api_key)) for _ in range(4)]
                time.sleep(0.5)  # the four in their handlers, their bodies awaited

                def upload() -> httpx.Response:
                    return client.put(
                        f"{P}/objects",
                        params={"filename": "a.bin"},
                        content=b"hello",
                        headers={**bearer(eve), "Idempotency-Key": "k1"},
                    )

                for _ in range(3):
                    refused = upload()
                    assert refused.status_code == 429, refused.text
                    assert "at most 4 at once" in refused.json()["error"]["message"]
                held[0].sendall(b"x" * 5)
                held[0].shutdown(socket.SHUT_WR)  # its body ends short: the upload ends
                deadline = time.monotonic() + 5
                while (answer := upload()).status_code == 429:
                    assert "at most 4 at once" in answer.text, answer.text
                    assert time.monotonic() < deadline, answer.text
                    time.sleep(0.1)
                assert answer.status_code == 201, answer.text
    finally:
        stack.close()
