"""The thin client against a real uvicorn server (and once through TestClient's transport)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError
from sqlalchemy import func, select

from hypermedia import tls
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.embedded import free_port
from hypermedia.errors import (
    AlreadyRegistered,
    AuthenticationFailed,
    ConcurrencyLimited,
    ConfigError,
    Conflict,
    Forbidden,
    HypermediaError,
    IllegalTransition,
    InvalidRequest,
    NotFound,
    PaymentRequired,
    RateLimited,
    ServiceUnavailable,
    UnknownOperation,
)
from hypermedia.ingest.api import create_app
from hypermedia.ingest.client import HypermediaClient, error_from_response
from hypermedia.ingest.schemas import ObjectResponse
from hypermedia.stack import Stack
from tests.api_support import AnswerDropper, add_user, bearer, running_server, slow_upload
from tests.generated import Generated

IMAGE = b"\xff\xd8\xff\xe0" + bytes(range(256)) * 40


@pytest.fixture
def stack(pg_engine, settings) -> Iterator[Stack]:
    opened = Stack.open(settings(), engine=pg_engine, auto_migrate=True)
    yield opened
    opened.close()


@pytest.fixture
def base_url(stack) -> Iterator[str]:
    with running_server(create_app(stack)) as url:
        yield url


def test_client_end_to_end_over_http(stack, base_url, tmp_path):
    alice = add_user(stack, "alice", credits=5)
    operator = add_user(stack, "ops", operator=True)
    source = tmp_path / "photo.jpg"
    source.write_bytes(IMAGE)

    with HypermediaClient(base_url, alice.api_key, timeout=10) as client:
        obj = client.upload(source)
        assert obj.filename == "photo.jpg"
        assert obj.size_bytes == len(IMAGE)
        assert obj.sha256 == hashlib.sha256(IMAGE).hexdigest()
        assert client.object(obj.object_id) == obj
        from_bytes = client.upload(b"abc", "abc.bin")
        assert from_bytes.size_bytes == 3

        submitted = client.process(
            obj.object_id, ["thumbnail", "resize"], priority=4, params={"resize": {"width": 800}}
        )
        assert len(submitted.job_ids) == 2 and not submitted.replayed
        again = client.process(
            obj.object_id,
            ["thumbnail", "resize"],
            priority=4,
            params={"resize": {"width": 800}},
            idempotency_key="k1",
        )
        replay = client.process(
            obj.object_id,
            ["thumbnail", "resize"],
            priority=4,
            params={"resize": {"width": 800}},
            idempotency_key="k1",
        )
        assert replay.replayed and replay.job_ids == again.job_ids
        with pytest.raises(Conflict):
            client.process(obj.object_id, ["thumbnail"], idempotency_key="k1")

        job = client.job(submitted.job_ids[0])
        assert job.status == "queued" and job.priority == 4
        account = client.credits()
        assert account.reserved == pytest.approx(submitted.estimated_credits * 2)

        cancelled = client.cancel(job.job_id)
        assert cancelled.status == "cancelled" and not cancelled.cancel_requested
        finished = client.wait(job.job_id, timeout=5)
        assert finished.status == "cancelled" and finished.finished
        with pytest.raises(TimeoutError, match="still queued"):
            client.wait(submitted.job_ids[1], timeout=0.2)
        # Timed out before any event said the status (a loaded machine: "still unknown"):
        # the record's, read once.
        with pytest.raises(TimeoutError, match="still queued"):
            client.wait(submitted.job_ids[1], timeout=0.001)

        with pytest.raises(NotFound, match="no job"):
            client.job("0" * 32)
        with pytest.raises(UnknownOperation):
            client.process(obj.object_id, ["no_such_op"])
        with pytest.raises(InvalidRequest) as invalid:
            client.process(obj.object_id, [])
        assert "body.operations" in invalid.value.message
        with pytest.raises(Forbidden):
            client.queues()
        with pytest.raises(InvalidRequest, match="must lie under"):
            client.register("originals/x/y", "y", 1)

    with HypermediaClient(base_url, operator.api_key) as client:
        overview = {q.queue: q for q in client.queues().queues}
        assert overview["images"].queued == 3
        assert overview["images"].redis is not None and overview["images"].redis.ready == 3
        assert client.health().status == "ok"
        with pytest.raises(NotFound):
            client.job(submitted.job_ids[1])  # alice's job: operators see only their own too

    poor = add_user(stack, "poor", credits=0)
    with HypermediaClient(base_url, poor.api_key) as client:
        upload = client.upload(IMAGE, "x.jpg")
        with pytest.raises(PaymentRequired) as short:
            client.process(upload.object_id, ["thumbnail"])
        assert short.value.details["available_credits"] == 0

    with (
        HypermediaClient(base_url, "hm_000000000000_bad") as client,
        pytest.raises(AuthenticationFailed),
    ):
        client.credits()


def test_client_uploads_image_files(stack, base_url, generated: Generated):
    alice = add_user(stack, "alice")
    files = [generated / f"images/{name}" for name in ("drawing.png", "alpha.png", "photo.jpg")]
    with HypermediaClient(base_url, alice.api_key) as client:
        for path in files:
            obj = client.upload(path)
            assert obj.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
            assert b"".join(stack.storage.read(f"originals/{obj.pool_id}/{obj.object_id}")) == (
                path.read_bytes()
            )


def test_client_cancel_of_finished_job_raises_illegal_transition(stack):
    alice = add_user(stack, "alice")
    # The client on TestClient's transport: no server needed.
    with (
        TestClient(create_app(stack)) as http,
        HypermediaClient("http://testserver", alice.api_key, transport=http._transport) as client,
    ):
        obj = client.upload(IMAGE, "a.jpg")
        job_id = client.process(obj.object_id, ["thumbnail"]).job_ids[0]
        [claimed] = stack.dispatcher.claim("images", "w")
        stack.dispatcher.start(claimed, "w")
        assert client.cancel(job_id).cancel_requested
        stack.dispatcher.complete(claimed, "w")
        with pytest.raises(IllegalTransition, match="completed"):
            client.cancel(job_id)


def test_an_operation_or_a_status_may_be_given_as_one_name(stack):
    """process(object_id, "thumbnail") and list_jobs(status="queued") type-check (a str
    is an Iterable[str]) but were sent a letter at a time: 422 "unknown operation 't'",
    and a 422 for each letter of the status."""
    alice = add_user(stack, "alice")
    with (
        TestClient(create_app(stack)) as http,
        HypermediaClient("http://testserver", alice.api_key, transport=http._transport) as client,
    ):
        obj = client.upload(IMAGE, "a.jpg")
        one = client.process(obj.object_id, "thumbnail")
        assert [job.operation for job in one.jobs] == ["thumbnail"]
        queued = client.list_jobs(status="queued")
        assert [job.job_id for job in queued.jobs] == one.job_ids
        client.cancel(one.job_ids[0])
        assert client.list_jobs(status="queued").jobs == []
        assert [j.job_id for j in client.list_jobs(status=("queued", "cancelled")).jobs] == (
            one.job_ids
        )


def test_a_submit_whose_answer_was_lost_is_retried_without_a_second_job(stack, base_url):
    """The server creates the jobs and reserves their credits, then the answer is lost
    (the connection drops): the client tries again with the same Idempotency-Key, and
    the server answers with the first submit's jobs; nothing is created or reserved twice."""
    alice = add_user(stack, "alice", credits=5)
    with HypermediaClient(base_url, alice.api_key) as direct:
        obj = direct.upload(IMAGE, "a.jpg")
    with (
        AnswerDropper(base_url, b"POST /v1/hypermedia/process", drops=1) as proxy,
        HypermediaClient(proxy.url, alice.api_key) as client,
    ):
        submitted = client.process(obj.object_id, ["thumbnail"])
        assert proxy.dropped == 1
        assert submitted.replayed  # the answer of the first, lost, try
        jobs = client.list_jobs(object_id=obj.object_id).jobs
        assert [j.job_id for j in jobs] == submitted.job_ids
        assert client.credits().reserved == pytest.approx(submitted.estimated_credits)


def test_a_cancel_whose_answer_was_lost_is_sent_again(stack, base_url):
    """Cancelling is idempotent on the server (a cancelled job cancelled again answers
    200 cancelled, a running one 202 again), yet the client raised ServiceUnavailable
    "the request may have been carried out" when a cancel's answer was lost."""
    alice = add_user(stack, "alice", credits=5)
    with HypermediaClient(base_url, alice.api_key) as direct:
        obj = direct.upload(IMAGE, "a.jpg")
        job_id = direct.process(obj.object_id, ["thumbnail"]).job_ids[0]
    with (
        AnswerDropper(base_url, b"POST /v1/hypermedia/jobs/", drops=1) as proxy,
        HypermediaClient(proxy.url, alice.api_key) as client,
    ):
        cancelled = client.cancel(job_id)
        assert proxy.dropped == 1
        assert (cancelled.status, cancelled.cancel_requested) == ("cancelled", False)
        assert client.job(job_id).status == "cancelled"
        assert client.credits().reserved == 0


def test_a_submit_with_no_answer_says_it_may_have_been_done_and_names_its_key(stack, base_url):
    alice = add_user(stack, "alice", credits=5)
    with HypermediaClient(base_url, alice.api_key) as direct:
        obj = direct.upload(IMAGE, "a.jpg")
    with (
        AnswerDropper(base_url, b"POST /v1/hypermedia/process", drops=2) as proxy,
        HypermediaClient(proxy.url, alice.api_key, retries=1) as client,
    ):
        with pytest.raises(ServiceUnavailable, match="may have been carried out") as lost:
            client.process(obj.object_id, ["thumbnail"], idempotency_key="order-17")
        assert lost.value.details["idempotency_key"] == "order-17"
        again = client.process(obj.object_id, ["thumbnail"], idempotency_key="order-17")
        assert again.replayed
        assert len(client.list_jobs(object_id=obj.object_id).jobs) == 1


def _originals(stack: Stack, user_id: str) -> tuple[int, int]:
    """The user's object rows and the bytes their quota counts."""
    with transaction(stack.engine) as conn:
        rows = conn.execute(
            select(func.count()).select_from(t.objects).where(t.objects.c.owner_id == user_id)
        ).scalar_one()
        used = conn.execute(
            select(t.users.c.stored_bytes).where(t.users.c.user_id == user_id)
        ).scalar_one()
    return int(rows), int(used)


def test_an_upload_whose_answer_was_lost_is_retried_without_a_second_object(
    stack, base_url, tmp_path
):
    """The server stores and registers the file, then the answer is lost: the client
    sends the file again, from its start, under the same Idempotency-Key, and the
    server answers with the first object; nothing is stored or counted twice."""
    alice = add_user(stack, "alice")
    source = tmp_path / "photo.jpg"
    source.write_bytes(IMAGE)
    with (
        AnswerDropper(base_url, b"PUT /v1/hypermedia/objects", drops=1) as proxy,
        HypermediaClient(proxy.url, alice.api_key) as client,
    ):
        obj = client.upload(source)
        assert proxy.dropped == 1
        assert obj.replayed  # the answer of the first, lost, try
        assert obj.sha256 == hashlib.sha256(IMAGE).hexdigest()
        assert client.object(obj.object_id).object_id == obj.object_id
    assert _originals(stack, alice.user_id) == (1, len(IMAGE))
    stored = [p for p in stack.settings.storage_dir.rglob("*") if p.is_file()]
    assert [p.name for p in stored] == [obj.object_id]


def test_an_upload_takes_a_file_object_or_chunks(stack, base_url, tmp_path):
    """A web tier holds an uploaded file as a file object (an open file, a framework's
    upload, a BytesIO) or a stream of chunks: upload() took a path or bytes only, and
    raised TypeError ("expected str, bytes or os.PathLike object, not BufferedReader")."""
    alice = add_user(stack, "alice")
    source = tmp_path / "photo.jpg"
    source.write_bytes(b"HEADER" + IMAGE)
    sha = hashlib.sha256(IMAGE).hexdigest()
    with HypermediaClient(base_url, alice.api_key) as client:
        with source.open("rb") as handle:
            handle.seek(len(b"HEADER"))  # from where it stands
            from_file = client.upload(handle)
        assert (from_file.filename, from_file.size_bytes, from_file.sha256) == (
            "photo.jpg",
            len(IMAGE),
            sha,
        )
        from_memory = client.upload(io.BytesIO(IMAGE), "memory.jpg")
        assert (from_memory.size_bytes, from_memory.sha256) == (len(IMAGE), sha)
        # A bytearray or a memoryview: taken as bytes (mypy refused a bytearray).
        for buffer in (bytearray(IMAGE), memoryview(IMAGE)):
            from_buffer = client.upload(buffer, "buffer.jpg")
            assert (from_buffer.size_bytes, from_buffer.sha256) == (len(IMAGE), sha)
        chunks = (IMAGE[i : i + 1000] for i in range(0, len(IMAGE), 1000))
        from_chunks = client.upload(chunks, "chunks.jpg")  # no Content-Length: chunked
        assert (from_chunks.size_bytes, from_chunks.sha256) == (len(IMAGE), sha)
        read, write = os.pipe()
        with os.fdopen(write, "wb") as writer:
            writer.write(IMAGE)
        with os.fdopen(read, "rb") as pipe:
            assert not pipe.seekable()
            from_pipe = client.upload(pipe, "pipe.jpg")
        assert (from_pipe.size_bytes, from_pipe.sha256) == (len(IMAGE), sha)
        with pytest.raises(ValueError, match="filename is required"):
            client.upload(iter([IMAGE]))


def test_a_file_object_is_sent_again_from_where_it_stood_and_chunks_are_not(stack, base_url):
    alice = add_user(stack, "alice")
    with (
        AnswerDropper(base_url, b"PUT /v1/hypermedia/objects", drops=1) as proxy,
        HypermediaClient(proxy.url, alice.api_key) as client,
    ):
        handle = io.BytesIO(b"skip" + IMAGE)
        handle.seek(4)
        obj = client.upload(handle, "a.jpg")
        assert proxy.dropped == 1 and obj.replayed  # sent again, from byte 4
        assert obj.sha256 == hashlib.sha256(IMAGE).hexdigest()
        # Chunks cannot be read again: the lost answer is an error naming the key.
        proxy.drops = 2
        with pytest.raises(ServiceUnavailable, match="may have been carried out") as lost:
            client.upload(iter([IMAGE]), "b.jpg", idempotency_key="chunks-1")
        assert proxy.dropped == 2 and lost.value.details["idempotency_key"] == "chunks-1"
        again = client.upload(iter([IMAGE]), "b.jpg", idempotency_key="chunks-1")
        assert again.replayed
    assert _originals(stack, alice.user_id) == (2, 2 * len(IMAGE))


class _Sending(httpx.HTTPTransport):
    """An HTTP transport that notes when each request was sent."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.times: list[float] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.times.append(time.monotonic())
        return super().handle_request(request)

    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.times, self.times[1:], strict=False)]

    def __repr__(self) -> str:
        return f"<sent at {[round(t - self.times[0], 2) for t in self.times]}>"


def test_an_upload_waits_for_a_place_among_the_users_uploads_arriving_but_not_for_her_rate(
    pg_engine, settings, tmp_path
):
    """A user may have 4 uploads arriving at once; the fifth is refused unread, 429
    Retry-After: 1. upload() raised it at once (RateLimited after 0.01 s), so a web
    tier with more than 4 uploads at once on one key failed them. Now a path or a file
    object is sent again, afresh, each Retry-After until a place is free (for up to the
    client's timeout); chunks, which cannot be read again, and the uploads-per-minute
    429 (rate_limited, a minute's wait) are raised at once.
    Counted, not timed: the requests each upload sent (a loaded machine's server took
    over 3 s to store the small photo once a place was free)."""
    stack = Stack.open(
        settings(upload_idle_seconds=30, user_uploads_per_minute=6),
        engine=pg_engine,
        auto_migrate=True,
    )
    source = tmp_path / "photo.jpg"
    source.write_bytes(IMAGE)
    handle = io.BytesIO(b"skip" + IMAGE)
    handle.seek(4)
    try:
        with (
            running_server(create_app(stack), access_log=False) as url,
            ExitStack() as sockets,
        ):
            eve = add_user(stack, "eve")
            held = [sockets.enter_context(slow_upload(url, eve.api_key)) for _ in range(4)]
            time.sleep(0.5)  # the four in their handlers, their bodies awaited
            done: dict[str, object] = {}
            took: dict[str, float] = {}
            sent: dict[str, _Sending] = {}

            def upload(name: str, source: object, timeout: float = 60) -> None:
                started = time.monotonic()
                sent[name] = _Sending(verify=tls.client_context())
                try:
                    with HypermediaClient(
                        url, eve.api_key, timeout=timeout, transport=sent[name]
                    ) as client:
                        done[name] = client.upload(source, "a.jpg")  # type: ignore[arg-type]
                except HypermediaError as exc:
                    done[name] = exc
                took[name] = time.monotonic() - started

            upload("chunks", iter([IMAGE[:10], IMAGE[10:]]))
            assert isinstance(done["chunks"], ConcurrencyLimited), done["chunks"]
            assert done["chunks"].http_status == 429 and len(sent["chunks"].times) == 1
            upload("short", source, timeout=2)  # no place within its 2 s
            assert isinstance(done["short"], ConcurrencyLimited), done["short"]
            # Sent again after the Retry-After (1 s), then no more: a third would be
            # past its 2 s.
            assert len(sent["short"].times) == 2 and took["short"] >= 1.0, sent["short"]
            assert sent["short"].gaps()[0] >= 1.0, sent["short"]
            waiting = [
                threading.Thread(target=upload, args=(name, source_))
                for name, source_ in (("path", source), ("file object", handle))
            ]
            for thread in waiting:
                thread.start()
            time.sleep(1.5)  # refused, asked again a second later, refused
            assert "path" not in done and "file object" not in done, done
            for conn in held[:2]:
                conn.sendall(b"x" * 5)
                conn.shutdown(socket.SHUT_WR)  # its body ends short: that upload ends
            for thread in waiting:
                thread.join(15)
            sha = hashlib.sha256(IMAGE).hexdigest()
            for name in ("path", "file object"):
                obj = done[name]
                assert isinstance(obj, ObjectResponse), obj
                assert (obj.sha256, obj.replayed) == (sha, False)
                # Refused, sent again each Retry-After, taken once a place was free:
                # not held to its 60 s timeout.
                assert len(sent[name].times) >= 2 and min(sent[name].gaps()) >= 1.0, sent
                assert 1.5 <= took[name] < 30, took
            assert _originals(stack, eve.user_id) == (2, 2 * len(IMAGE))
            # Her 6 a minute used (the four held, these two; no refusal counted): the
            # rate's 429 is hers to wait for, raised at once.
            upload("rate", source)
            assert isinstance(done["rate"], RateLimited), done["rate"]
            assert not isinstance(done["rate"], ConcurrencyLimited)
            assert done["rate"].code == "rate_limited" and len(sent["rate"].times) == 1
    finally:
        stack.close()


def test_an_upload_refused_for_a_place_sends_only_what_was_in_flight(pg_engine, settings, tmp_path):
    """httpx sends a request's whole body before it reads the answer (no ``Expect:
    100-continue``), and uvicorn read and dropped the rest of a body answered unread to
    keep the connection: each try of an upload refused 429 concurrency_limited (4 of the
    user's arriving) sent the file whole, 103 MB of a 100 MB file each time. Now an
    answer begun before the body was read whole closes the connection: the client's
    next write fails, it reads the 429 and sends again after Retry-After; a try sends
    what was in flight (counted through a proxy: at most a few MB on loopback)."""
    stack = Stack.open(settings(upload_idle_seconds=30), engine=pg_engine, auto_migrate=True)
    size = 32 * 1024 * 1024
    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom(size))
    try:
        with (
            running_server(create_app(stack), access_log=False) as url,
            ExitStack() as sockets,
            AnswerDropper(url, b"PUT /v1/hypermedia/objects", drops=0) as proxy,
        ):
            eve = add_user(stack, "eve")
            held = [sockets.enter_context(slow_upload(url, eve.api_key)) for _ in range(4)]
            time.sleep(0.5)  # the four in their handlers, their bodies awaited
            with (
                HypermediaClient(proxy.url, eve.api_key, timeout=2.5) as client,
                pytest.raises(ConcurrencyLimited),
            ):
                client.upload(source, "big.bin")
            refused, sent = proxy.requests, proxy.sent
            assert refused >= 2, refused  # tried, then again after each Retry-After: 1
            assert sent < size // 2, f"{refused} refused tries sent {sent} bytes"
            for conn in held[:1]:
                conn.shutdown(socket.SHUT_WR)  # its body ends short: that upload ends
            with HypermediaClient(proxy.url, eve.api_key, timeout=30) as client:
                obj = client.upload(source, "big.bin")
            assert obj.size_bytes == size and not obj.replayed
            assert proxy.sent - sent >= size
            assert _originals(stack, eve.user_id) == (1, size)
    finally:
        stack.close()


def test_an_upload_with_no_answer_names_its_key_and_the_key_gets_the_object(stack, base_url):
    alice = add_user(stack, "alice")
    with (
        AnswerDropper(base_url, b"PUT /v1/hypermedia/objects", drops=2) as proxy,
        HypermediaClient(proxy.url, alice.api_key, retries=1) as client,
    ):
        with pytest.raises(ServiceUnavailable, match="may have been carried out") as lost:
            client.upload(IMAGE, "a.jpg", idempotency_key="photo-17")
        assert lost.value.details["idempotency_key"] == "photo-17"
        again = client.upload(IMAGE, "a.jpg", idempotency_key="photo-17")
        assert again.replayed
        with pytest.raises(Conflict, match="other content") as reused:
            client.upload(IMAGE[:-1] + b"\x00", "a.jpg", idempotency_key="photo-17")
        assert reused.value.code == "idempotency_key_reused"
        fresh = client.upload(IMAGE, "a.jpg")  # a key of its own: a second object
        assert not fresh.replayed and fresh.object_id != again.object_id
    assert _originals(stack, alice.user_id) == (2, 2 * len(IMAGE))


def test_a_registration_whose_answer_was_lost_is_retried_and_gets_the_first_object(stack, base_url):
    """The web tier stored the file; the server registers it, then the answer is lost:
    the client registers the key again and the server answers with the first object,
    one row, its bytes counted once. With no answer at all the error names the key, and
    registering it again gets the object."""
    alice = add_user(stack, "alice")
    key = f"originals/{alice.pool_id}/web-tier-17"
    blob = stack.storage.put(key, [IMAGE])
    with (
        AnswerDropper(base_url, b"POST /v1/hypermedia/objects/register", drops=1) as proxy,
        HypermediaClient(proxy.url, alice.api_key) as client,
    ):
        obj = client.register(key, "photo.jpg", len(IMAGE), sha256=blob.sha256)
        assert proxy.dropped == 1
        assert obj.replayed  # the answer of the first, lost, try
        assert obj.sha256 == blob.sha256 and obj.filename == "photo.jpg"
        assert client.object(obj.object_id).object_id == obj.object_id
        with pytest.raises(AlreadyRegistered) as other:
            client.register(key, "photo.jpg", len(IMAGE))  # no sha256: not the first's
        assert other.value.details["object_id"] == obj.object_id
    assert _originals(stack, alice.user_id) == (1, len(IMAGE))

    second = f"originals/{alice.pool_id}/web-tier-18"
    stack.storage.put(second, [IMAGE])
    with (
        AnswerDropper(base_url, b"POST /v1/hypermedia/objects/register", drops=2) as proxy,
        HypermediaClient(proxy.url, alice.api_key, retries=1) as client,
    ):
        with pytest.raises(ServiceUnavailable, match="may have been carried out") as lost:
            client.register(second, "b.jpg", len(IMAGE))
        assert lost.value.details["storage_key"] == second
        again = client.register(second, "b.jpg", len(IMAGE))
        assert again.replayed and again.object_id != obj.object_id
    assert _originals(stack, alice.user_id) == (2, 2 * len(IMAGE))


def test_client_errors_carry_the_http_status_the_server_sent(stack, base_url):
    """The class of an error is the server's code, and its ``status`` that class's
    usual one; ``http_status`` is what the answer said."""
    alice = add_user(stack, "alice", credits=5)
    with HypermediaClient(base_url, alice.api_key) as client:
        obj = client.upload(IMAGE, "a.jpg")
        with pytest.raises(InvalidRequest) as invalid:
            client.process(obj.object_id, ["thumbnail"], priority=11)
        assert invalid.value.code == "invalid_request" and invalid.value.status == 400
        assert invalid.value.http_status == 422
        assert invalid.value.to_dict()["code"] == "invalid_request"
        assert "http_status" not in invalid.value.details
        with pytest.raises(NotFound) as missing:
            client.job("0" * 32)
        assert missing.value.http_status == 404 == missing.value.status
    with (
        HypermediaClient(f"http://127.0.0.1:{free_port()}", alice.api_key, retries=0) as client,
        pytest.raises(ServiceUnavailable) as unreachable,
    ):
        client.credits()
    assert unreachable.value.http_status is None


def test_a_code_no_class_carries_is_the_errors_code(stack, base_url, monkeypatch):
    """The codes the API answers that no error class carries (``internal``, a route's
    ``method_not_allowed``) came back as a HypermediaError whose ``code`` was
    ``"error"``, the server's only in its details: a web tier switching on ``code``
    could not tell a server fault from anything else."""
    alice = add_user(stack, "alice", credits=5)

    def broken(*_: object) -> None:
        raise RuntimeError("the account read failed")

    monkeypatch.setattr("hypermedia.ingest.api.balance", broken)
    with (
        HypermediaClient(base_url, alice.api_key, retries=0) as client,
        pytest.raises(HypermediaError) as internal,
    ):
        client.credits()
    assert type(internal.value) is HypermediaError
    assert (internal.value.code, internal.value.http_status) == ("internal", 500)
    assert internal.value.to_dict()["code"] == "internal"
    assert internal.value.details["server_code"] == "internal"

    wrong = httpx.delete(
        f"{base_url}/v1/hypermedia/credits", headers=bearer(alice), verify=tls.client_context()
    )
    refused = error_from_response(wrong.status_code, wrong.json())
    assert type(refused) is HypermediaError
    assert (refused.code, refused.http_status) == ("method_not_allowed", 405)
    # A code with a class is still that class, its code the class's.
    with HypermediaClient(base_url, alice.api_key) as client, pytest.raises(NotFound) as missing:
        client.job("0" * 32)
    assert missing.value.code == "not_found"


@contextmanager
def answering(status: int, content_type: str, body: bytes) -> Iterator[str]:
    """A real HTTP server that answers every request ``status`` with ``body``: what a
    base URL that is not the API (a web tier's catch-all page) or a newer API sends."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = _answer

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_an_answer_the_client_cannot_read_is_a_hypermedia_error_naming_the_url():
    """A 200 that is not the API's JSON escaped as pydantic's ValidationError, which
    ``except HypermediaError`` (the module's promise) does not catch and the CLI showed
    as "internal: ValidationError: 1 validation error for CreditsResponse"."""
    page = b"<!doctype html><title>web tier</title>"
    with answering(200, "text/html", page) as url, HypermediaClient(url, "hm_x_y") as client:
        for call in (client.credits, lambda: client.job("0" * 32), client.health):
            with pytest.raises(HypermediaError) as unreadable:
                call()
            error = unreadable.value
            assert error.http_status == 200
            assert url in error.message and "text/html" in error.message
            assert "is it the hypermedia API" in error.message
            assert isinstance(error.__cause__, ValidationError)
        # Following its events was reconnecting every 2 s until wait()'s timeout.
        with pytest.raises(HypermediaError, match="not text/event-stream") as stream:
            client.wait("0" * 32, timeout=30)
        assert stream.value.http_status == 200
    # A newer server's job in a status this client does not know: named, not a crash.
    job = client_job_json(status="paused")
    with (
        answering(200, "application/json", job) as url,
        HypermediaClient(url, "hm_x_y") as client,
        pytest.raises(HypermediaError, match="status") as unknown,
    ):
        client.job("0" * 32)
    assert "JobResponse" in unknown.value.message
    event = b'id: 1-0\ndata: {"type": "status", "status": "paused"}\n\n'
    with (
        answering(200, "text/event-stream", event) as url,
        HypermediaClient(url, "hm_x_y") as client,
        pytest.raises(HypermediaError, match="JobEvent") as unknown,
    ):
        list(client.events("0" * 32, timeout=30))
    assert "status" in unknown.value.message


class Silent:
    """A real TCP server that takes each connection and reads its request, and never
    answers: an API that hangs (a stuck process, a proxy holding connections). Its
    ``requests`` are the request lines it got."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def __enter__(self) -> Silent:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        with suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join(5)
        for held in self._held:
            held.close()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            self._held.append(connection)
            threading.Thread(target=self._read, args=(connection,), daemon=True).start()

    def _read(self, connection: socket.socket) -> None:
        with suppress(OSError):
            line = connection.makefile("rb").readline()
            self.requests.append(line.decode("latin-1").strip())


@contextmanager
def taking_no_connection() -> Iterator[str]:
    """A real listening socket whose backlog is full: a connect to it hangs until its
    timeout (an API behind a firewall that drops packets, a host that is gone)."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=0)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    filler = socket.create_connection(listener.getsockname())
    try:
        yield url
    finally:
        filler.close()
        listener.close()


def test_wait_raises_at_its_timeout_when_the_api_does_not_answer():
    """wait(timeout=1) on an API that hangs read the job's status once the time was up
    with job()'s retries, each its full ``timeout``: three reads and 1 + 3 x 20 s + the
    backoff here (5 + 3 x 30 s with the defaults); on an API that takes no connection
    each try's connect took the client's ``timeout`` too, the deadline aside. Now each
    is bounded by what is left of the timeout, and the status read is one try of at
    most 2 s: the wait ends before one try's ``timeout`` (20 s) could have passed."""
    with Silent() as api, HypermediaClient(api.url, "hm_x_y", timeout=20, retries=2) as client:
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="still unknown after 1 s"):
            client.wait("0" * 32, timeout=1)
        assert time.monotonic() - started < 20
        reads = [r for r in api.requests if r.startswith(f"GET /v1/hypermedia/jobs/{'0' * 32} ")]
        assert len(reads) <= 1, api.requests
    with (
        taking_no_connection() as url,
        HypermediaClient(url, "hm_x_y", timeout=20, retries=2) as client,
    ):
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="still unknown after 1 s"):
            client.wait("0" * 32, timeout=1)
        assert time.monotonic() - started < 20


@contextmanager
def trickling() -> Iterator[str]:
    """A real HTTP server that answers an event stream and then sends a byte every
    0.2 s, never a whole line: an API (or a proxy before it) that is never silent
    long enough for a read to time out, yet never sends an event."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def drip(connection: socket.socket) -> None:
        with suppress(OSError), connection:
            connection.recv(65536)
            connection.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            while not stop.wait(0.2):
                connection.sendall(b"1\r\nx\r\n")

    def accept() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=drip, args=(connection,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        with suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join(5)


def test_wait_raises_at_its_timeout_when_the_api_trickles_bytes_that_make_no_event():
    """wait(timeout=1) on a stream whose bytes keep coming (each read well within its
    timeout) but never end a line: the deadline was looked at only after an event or a
    keep-alive, so the wait went on for as long as the bytes did (still waiting after
    30 s here). Now it raises at its timeout."""
    with trickling() as url, HypermediaClient(url, "hm_x_y", timeout=20) as client:
        ended: list[BaseException] = []

        def wait() -> None:
            try:
                client.wait("0" * 32, timeout=1)
            except BaseException as exc:
                ended.append(exc)

        started = time.monotonic()
        waiter = threading.Thread(target=wait, daemon=True)
        waiter.start()
        waiter.join(15)
        took = time.monotonic() - started
        assert not waiter.is_alive(), f"wait(timeout=1) still waiting after {took:.0f} s"
    [error] = ended
    assert isinstance(error, TimeoutError), error
    assert took < 5, took


def test_following_events_of_an_api_that_never_answers_ends(monkeypatch):
    """events() without a timeout (hypermedia watch's default) on an API that takes the
    connection and never answers (a hung process, a proxy holding it): each read timed
    out (45 s, three keep-alives), counted as nothing, and it connected again, for
    ever. Now such a try counts as one that got no answer, as any request's
    (``retries``), then ServiceUnavailable; and any other transport error of the
    stream is a drop, never httpx's own exception."""
    from hypermedia.ingest import client as module

    monkeypatch.setattr(module, "_EVENT_READ_TIMEOUT", 0.5)
    outcome: list[BaseException | list[object]] = []
    with Silent() as api, HypermediaClient(api.url, "hm_x_y", retries=1) as client:

        def follow() -> None:
            try:
                outcome.append(list(client.events("0" * 32)))
            except BaseException as exc:
                outcome.append(exc)

        follower = threading.Thread(target=follow, daemon=True)
        follower.start()
        follower.join(60)
        assert not follower.is_alive(), f"still following after {len(api.requests)} tries"
    [error] = outcome
    assert isinstance(error, ServiceUnavailable), error
    assert "no answer from the API" in error.message and "ReadTimeout" in error.message
    assert error.details["url"] == api.url
    assert len(api.requests) == 2  # retries=1
    assert all(r.startswith(f"GET /v1/hypermedia/jobs/{'0' * 32}/events ") for r in api.requests)


def test_a_call_that_waited_for_a_free_connection_in_vain_says_nothing_was_sent():
    """Every connection of the client's pool taken (here its one, by an event stream;
    httpx's default is 100, as many as the streams a user may open): a DELETE that
    waited for one the whole timeout was never sent, yet raised ServiceUnavailable "no
    answer from the API ... the request may have been carried out"."""
    limits = httpx.Limits(max_connections=1)
    with (
        Silent() as api,
        HypermediaClient(
            api.url, "hm_x_y", timeout=1, retries=1, transport=httpx.HTTPTransport(limits=limits)
        ) as client,
    ):
        ended: list[BaseException] = []

        def follow() -> None:  # holds the one connection until its timeout
            try:
                list(client.events("0" * 32, timeout=8))
            except BaseException as exc:
                ended.append(exc)

        follower = threading.Thread(target=follow, daemon=True)
        follower.start()
        while not api.requests:
            time.sleep(0.05)
        with pytest.raises(ServiceUnavailable, match="nothing was sent") as busy:
            client.delete("an-object")
        assert "may have been carried out" not in busy.value.message
        assert not any(r.startswith("DELETE") for r in api.requests), api.requests
        follower.join(60)
        assert [type(e) for e in ended] == [TimeoutError]


def client_job_json(**fields: object) -> bytes:
    job = {
        "job_id": "0" * 32,
        "object_id": "o",
        "operation": "thumbnail",
        "queue": "images",
        "priority": 5,
        "status": "queued",
        "cancel_requested": False,
        "attempt_count": 0,
        "max_attempts": 3,
        "estimated_credits": 0.1,
        "created_at": "2026-01-01T00:00:00Z",
        **fields,
    }
    return json.dumps(job).encode()


def test_an_id_is_one_path_segment_and_cannot_reach_another_route(stack, base_url):
    """The client put ids into its paths as given, and httpx resolves dot segments: a
    web tier handing a user's job id to cancel() with its operator key had
    cancel("../bulk/runs/<run>") cancel that bulk run (POST /bulk/runs/<run>/cancel),
    and job("../credits") read the credits. An id is now one escaped segment: the
    server answers for that id (none: 404), whatever it holds."""
    operator = add_user(stack, "ops", operator=True)
    with HypermediaClient(base_url, operator.api_key) as client:
        run = client._http.post(
            "/v1/hypermedia/bulk/runs", json={"kind": "backfill", "operation": "thumbnail"}
        ).json()
        assert run["state"] == "creating"
        for attempt in (
            lambda: client.cancel(f"../bulk/runs/{run['run_id']}"),
            lambda: client.cancel(f"x/../../bulk/runs/{run['run_id']}"),
            lambda: client.job("../credits"),
            lambda: client.job(".."),
            lambda: client.object("../credits"),
            lambda: client.output_url("0" * 32, "../../../../credits?x="),
            lambda: client.submission("../credits"),
        ):
            with pytest.raises((NotFound, InvalidRequest)):
                attempt()
        state = client._http.get(f"/v1/hypermedia/bulk/runs/{run['run_id']}").json()["state"]
        assert state == "creating"
        obj = client.upload(IMAGE, "a.jpg")
        assert client.object(obj.object_id).object_id == obj.object_id  # plain ids work


def test_unreachable_server_is_service_unavailable():
    with (
        HypermediaClient(f"http://127.0.0.1:{free_port()}", "hm_x_y", timeout=2) as client,
        pytest.raises(ServiceUnavailable, match="cannot reach"),
    ):
        client.credits()


def test_a_base_url_without_http_or_a_host_is_refused_naming_it():
    """``HypermediaClient("127.0.0.1:8080", key)`` (or HYPERMEDIA_API_URL=localhost:8080)
    was taken: each request failed in httpx (UnsupportedProtocol), was retried, and
    raised ServiceUnavailable "no answer from the API ... the request may have been
    carried out" (it was never sent), and events() raised httpx's own exception."""
    from typer.testing import CliRunner

    from hypermedia.cli import app

    for bad in ("127.0.0.1:8080", "localhost:8080", "ftp://127.0.0.1:8080", "http://", ""):
        with pytest.raises(ConfigError, match="base_url") as refused:
            HypermediaClient(bad, "hm_x_y")
        assert repr(bad) in refused.value.message and "http://" in refused.value.message
    for good in ("http://127.0.0.1:8080/", "https://api.example", "http://[::1]:80"):
        HypermediaClient(good, "hm_x_y").close()
    # With the API's prefix, which the client adds: every call was 404 not_found "Not
    # Found", as a job that does not exist.
    for prefixed in ("http://127.0.0.1:8080/v1/hypermedia", "https://h/media/v1/hypermedia/"):
        with pytest.raises(ConfigError, match="ends with /v1/hypermedia") as refused:
            HypermediaClient(prefixed, "hm_x_y")
        assert prefixed.rstrip("/").removesuffix("/v1/hypermedia") in refused.value.message
    HypermediaClient("https://h/media/", "hm_x_y").close()  # served under a path: fine

    env = {"HYPERMEDIA_API_URL": "localhost:8080", "HYPERMEDIA_API_KEY": "hm_x_y"}
    shown = CliRunner().invoke(app, ["credits", "show"], env=env)
    assert isinstance(shown.exception, ConfigError)  # main() prints it as config_invalid
    assert shown.exception.key == "api_url (--api-url, HYPERMEDIA_API_URL)"
    assert shown.exception.message.startswith(f"{shown.exception.key}: 'localhost:8080' is not")


def test_an_api_key_read_with_its_newline_works_and_one_a_header_cannot_carry_is_refused(
    stack, base_url, tmp_path
):
    """A key read from a file (``read_text()``) keeps its newline: every request failed
    in httpx (an illegal header value), was retried and raised ServiceUnavailable "no
    answer from the API ... the request may have been carried out"; a key with a
    character past ASCII raised UnicodeEncodeError. The whitespace around a key is
    dropped; one with a character a header cannot carry inside is a ConfigError that
    does not show it."""
    from typer.testing import CliRunner

    from hypermedia.cli import app

    alice = add_user(stack, "alice", credits=5)
    key_file = tmp_path / "api-key"
    key_file.write_text(alice.api_key + "\n")
    with HypermediaClient(base_url, key_file.read_text()) as client:
        assert client.credits().balance == 5
    for bad in (alice.api_key[:8] + " " + alice.api_key[8:], alice.api_key + "é"):
        with pytest.raises(ConfigError, match="api_key: U\\+00") as refused:
            HypermediaClient(base_url, bad)
        assert alice.api_key[4:] not in refused.value.message  # a secret: never shown

    env = {"HYPERMEDIA_API_URL": base_url, "HYPERMEDIA_API_KEY": alice.api_key + "é"}
    shown = CliRunner().invoke(app, ["credits", "show"], env=env)
    assert isinstance(shown.exception, ConfigError)
    assert shown.exception.key == "api_key (--api-key, HYPERMEDIA_API_KEY)"


def test_a_failed_attempts_log_is_shown_to_its_owner_by_the_api_and_status(stack, base_url):
    from typer.testing import CliRunner

    from hypermedia.cli import app

    alice, bob = add_user(stack, "alice"), add_user(stack, "bob")
    log = "".join(f"decoder: frame {n} corrupt\n" for n in range(30))
    with HypermediaClient(base_url, alice.api_key) as client:
        job_id = client.process(client.upload(IMAGE, "a.jpg").object_id, ["thumbnail"]).job_ids[0]
        # The worker's path: its child failed and left these lines (see the executor).
        [claimed] = stack.dispatcher.claim_and_start("images", "w")
        stack.dispatcher.fail(claimed, "w", "pipeline_crashed", "died of SIGSEGV", log_tail=log)
        job = client.job(job_id)
        assert [(a.status, a.has_log) for a in job.attempts] == [("failed", True)]
        assert client.attempt_log(job_id, 1) == log
        with pytest.raises(NotFound):
            client.attempt_log(job_id, 2)
    with HypermediaClient(base_url, bob.api_key) as client, pytest.raises(NotFound):
        client.attempt_log(job_id, 1)  # not bob's job: as if it did not exist

    env = {"HYPERMEDIA_API_URL": base_url, "HYPERMEDIA_API_KEY": alice.api_key}
    shown = CliRunner().invoke(app, ["status", job_id], env=env)
    assert shown.exit_code == 0, shown.output
    assert "attempt 1's child printed, the last 20 of 30 lines:" in shown.stdout
    assert "  decoder: frame 29 corrupt" in shown.stdout
    assert "frame 9 corrupt" not in shown.stdout and "frame 10 corrupt" in shown.stdout


def test_a_jobs_time_limit_is_shown_by_the_api_and_status(stack, base_url):
    """Its own (an ocr job's grows with its pages), else its profile's (a job from
    before the record kept it): neither the API's job nor ``status`` said it."""
    from sqlalchemy import update
    from typer.testing import CliRunner

    from hypermedia.cli import app

    alice = add_user(stack, "alice")
    env = {"HYPERMEDIA_API_URL": base_url, "HYPERMEDIA_API_KEY": alice.api_key}
    with HypermediaClient(base_url, alice.api_key) as client:
        job_id = client.process(client.upload(IMAGE, "a.jpg").object_id, ["thumbnail"]).job_ids[0]
        with transaction(stack.engine) as conn:
            conn.execute(
                update(t.jobs).where(t.jobs.c.job_id == job_id).values(timeout_seconds=4321)
            )
            profile = conn.execute(
                select(t.profiles.c.timeout_seconds)
                .select_from(
                    t.jobs.join(t.profiles, t.jobs.c.profile_id == t.profiles.c.profile_id)
                )
                .where(t.jobs.c.job_id == job_id)
            ).scalar_one()
        assert client.job(job_id).timeout_seconds == 4321
        shown = CliRunner().invoke(app, ["status", job_id], env=env)
        assert shown.exit_code == 0, shown.output
        assert "time limit 4,321 s\n" in shown.stdout
        with transaction(stack.engine) as conn:
            conn.execute(
                update(t.jobs).where(t.jobs.c.job_id == job_id).values(timeout_seconds=None)
            )
        assert client.job(job_id).timeout_seconds == profile
    shown = CliRunner().invoke(app, ["status", job_id], env=env)
    assert f"time limit {profile:,} s\n" in shown.stdout


def test_jobs_by_page_a_submission_and_an_outputs_download_url(stack):
    from datetime import UTC, datetime, timedelta

    from hypermedia.jobs.repository import OutputRecord
    from hypermedia.storage.base import derived_key

    alice, bob = add_user(stack, "alice"), add_user(stack, "bob")
    with (
        TestClient(create_app(stack)) as http,
        HypermediaClient("http://testserver", alice.api_key, transport=http._transport) as client,
    ):
        obj = client.upload(IMAGE, "a.jpg")
        first = client.process(obj.object_id, ["thumbnail", "resize", "compress"])
        second = client.process(obj.object_id, ["convert"], params={"convert": {"format": "png"}})
        third = client.process(obj.object_id, ["thumbnail"], params={"thumbnail": {"width": 64}})
        newest_first = sorted(first.job_ids + second.job_ids + third.job_ids, reverse=True)

        pages, cursor = [], None
        while True:
            page = client.list_jobs(limit=2, cursor=cursor)
            pages.append([job.job_id for job in page.jobs])
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert pages == [newest_first[0:2], newest_first[2:4], newest_first[4:5]]

        client.cancel(second.job_ids[0])
        assert [j.job_id for j in client.list_jobs(status=["cancelled"]).jobs] == second.job_ids
        queued = client.list_jobs(status=["queued", "processing"], operation="thumbnail").jobs
        assert sorted(j.job_id for j in queued) == sorted([first.job_ids[0], third.job_ids[0]])
        by_submission = client.list_jobs(submission_id=first.submission_id).jobs
        assert sorted(j.job_id for j in by_submission) == sorted(first.job_ids)
        later = datetime.now(UTC) + timedelta(hours=1)
        assert client.list_jobs(created_after=later).jobs == []
        with pytest.raises(InvalidRequest, match="time zone"):
            client.list_jobs(created_after=later.replace(tzinfo=None))

        shown = client.submission(first.submission_id)
        assert [j.job_id for j in shown.jobs] == first.job_ids
        assert shown.estimated_credits == first.estimated_credits

        # The worker's path: the thumbnail done, its output stored and registered.
        [job] = [
            j
            for j in stack.dispatcher.claim_and_start("images", "w", 10)
            if j.job_id == first.job_ids[0]
        ]
        key = derived_key(obj.pool_id, obj.object_id, 1, "thumbnail-test.webp")
        stack.storage.put(key, [b"RIFF-the-thumbnail"])
        record = OutputRecord("thumbnail-test.webp", key, 18, "image/webp")
        assert stack.dispatcher.complete(job, "w", [record])
        link = client.output_url(job.job_id, "thumbnail-test.webp")
        assert (link.size_bytes, link.content_type) == (18, "image/webp")
        ttl = stack.settings.download_url_ttl_seconds
        assert abs(link.expires_at.timestamp() - (time.time() + ttl)) < 30
        downloaded = http.get(link.url)  # no API key: the URL is the credential
        assert downloaded.status_code == 200 and downloaded.content == b"RIFF-the-thumbnail"
        # Its type, as the record has it (was application/octet-stream), and an ETag a
        # browser revalidates with (there was none).
        assert downloaded.headers["content-type"] == "image/webp"
        # Saved as the upload's name and the output's type (was the key's last segment),
        # shown in place: an image.
        assert downloaded.headers["content-disposition"] == (
            "inline; filename=\"a-thumbnail-test.webp\"; filename*=UTF-8''a-thumbnail-test.webp"
        )
        etag = downloaded.headers["etag"]
        revalidated = http.get(link.url, headers={"If-None-Match": etag})
        assert (revalidated.status_code, revalidated.content) == (304, b"")
        with pytest.raises(NotFound):
            client.output_url(job.job_id, "no-such-output.webp")

    with (
        TestClient(create_app(stack)) as http,
        HypermediaClient("http://testserver", bob.api_key, transport=http._transport) as other,
    ):
        assert other.list_jobs().jobs == []
        with pytest.raises(NotFound):
            other.submission(first.submission_id)
        with pytest.raises(NotFound):
            other.output_url(job.job_id, "thumbnail-test.webp")


def _an_output(stack: Stack, client: HypermediaClient, data: bytes, output_type: str) -> str:
    """A job of ``client``'s user completed with ``data`` as its ``output_type``."""
    from hypermedia.jobs.repository import OutputRecord
    from hypermedia.storage.base import derived_key

    obj = client.upload(IMAGE, "a.jpg")
    submitted = client.process(obj.object_id, ["thumbnail"])
    [job] = [
        j
        for j in stack.dispatcher.claim_and_start("images", "w", 10)
        if j.job_id == submitted.job_ids[0]
    ]
    key = derived_key(obj.pool_id, obj.object_id, 1, output_type)
    step = 1 << 20
    stack.storage.put(key, (data[at : at + step] for at in range(0, len(data), step)))
    assert stack.dispatcher.complete(
        job, "w", [OutputRecord(output_type, key, len(data), "video/mp4")]
    )
    return job.job_id


def test_an_output_downloads_streamed_to_a_file_and_a_dropped_transfer_resumes(
    stack, base_url, tmp_path, monkeypatch
):
    """A web tier had output_url() alone: it fetched the signed URL itself, with its own
    TLS, timeouts and retries (none), the URL's host the API's public one, and a
    dropped transfer started again from nothing. download() streams it to a file with
    the client's: the first try's answer lost (no byte came) is sent again, and a
    transfer cut after 3 MiB is taken up there (Range), never the whole output in
    memory."""
    import tracemalloc

    from hypermedia.ingest import api

    alice = add_user(stack, "alice", credits=5)
    data = os.urandom(40 << 20)
    served: list[tuple[int, int]] = []
    whole = api._file_chunks

    def cut_once(handle, start, length, chunk_size=1 << 20):
        served.append((start, length))
        sent = 0
        for chunk in whole(handle, start, length, chunk_size):
            if len(served) == 2 and sent >= 3 << 20:
                raise ConnectionResetError("the transfer is cut")
            sent += len(chunk)
            yield chunk

    monkeypatch.setattr(api, "_file_chunks", cut_once)
    with (
        AnswerDropper(base_url, b"GET /v1/hypermedia/blobs/", drops=1) as dropper,
        HypermediaClient(dropper.url, alice.api_key, timeout=20) as client,
    ):
        job_id = _an_output(stack, client, data, "video.mp4")
        target = tmp_path / "out" / "video.mp4"
        target.parent.mkdir()
        tracemalloc.start()
        try:
            done = client.download(job_id, "video.mp4", target)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert dropper.dropped == 1
    assert hashlib.sha256(target.read_bytes()).digest() == hashlib.sha256(data).digest()
    assert (done.size_bytes, done.content_type, done.resumed) == (len(data), "video/mp4", 1)
    assert list(target.parent.iterdir()) == [target]  # no .part left
    # The lost answer's, the cut one's, then the rest alone.
    assert served[:2] == [(0, len(data)), (0, len(data))]
    [(start, length)] = served[2:]
    assert start >= 3 << 20 and start + length == len(data)
    assert peak < 16 << 20, peak  # the output is 40 MiB (the server's and proxy's in it)


def test_an_output_is_handed_on_in_chunks_or_written_to_a_file_object(stack, base_url, tmp_path):
    alice = add_user(stack, "alice", credits=5)
    data = bytes(range(256)) * 9000
    with HypermediaClient(base_url, alice.api_key) as client:
        job_id = _an_output(stack, client, data, "video.mp4")
        chunks = list(client.output_chunks(job_id, "video.mp4", chunk_size=1 << 16))
        assert b"".join(chunks) == data and max(len(c) for c in chunks) <= 1 << 16
        sink = io.BytesIO(b"head:")
        sink.seek(5)
        assert client.download(job_id, "video.mp4", sink).size_bytes == len(data)
        assert sink.getvalue() == b"head:" + data
        (tmp_path / "out").mkdir()
        with pytest.raises(NotFound):
            client.download(job_id, "no-such.mp4", tmp_path / "out" / "missing.mp4")
        assert list((tmp_path / "out").iterdir()) == []


class _ServerClock:
    """The API's clock, ``ahead`` seconds past this process's (the client's)."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def now(self) -> float:
        return time.time() + self.ahead


def _cut_once_after(monkeypatch, at: int, then: Callable[[], None]) -> list[tuple[int, int]]:
    """The first blob answer cut after ``at`` bytes, ``then()`` done just before; the
    (start, length) of every blob answer served."""
    from hypermedia.ingest import api

    served: list[tuple[int, int]] = []
    whole = api._file_chunks

    def cut_once(handle, start, length, chunk_size=1 << 20):
        served.append((start, length))
        sent = 0
        for chunk in whole(handle, start, length, chunk_size):
            if len(served) == 1 and sent >= at:
                then()
                raise ConnectionResetError("the transfer is cut")
            sent += len(chunk)
            yield chunk

    monkeypatch.setattr(api, "_file_chunks", cut_once)
    return served


def test_a_download_resumed_on_a_url_the_api_says_expired_asks_for_a_new_one(
    pg_engine, settings, tmp_path, monkeypatch
):
    """The client judged its URL's expires_at by its own clock: one 60 s behind the
    API's resumed a cut transfer on a URL the API held expired, and raised its 403
    url_expired (Forbidden). A 403 url_expired now gets a new URL, whatever the
    client's clock says, and the transfer goes on where it stopped."""
    clock = _ServerClock()
    stack = Stack.open(
        settings(download_url_ttl_seconds=30), engine=pg_engine, auto_migrate=True, clock=clock
    )
    try:
        alice = add_user(stack, "alice", credits=5)
        data = os.urandom(3 << 20)

        def skewed() -> None:
            clock.ahead = 60.0  # the API's clock a minute past the client's

        served = _cut_once_after(monkeypatch, 1 << 20, skewed)
        with (
            running_server(create_app(stack)) as url,
            HypermediaClient(url, alice.api_key, timeout=10) as client,
        ):
            job_id = _an_output(stack, client, data, "video.mp4")
            target = tmp_path / "video.mp4"
            done = client.download(job_id, "video.mp4", target)
        assert target.read_bytes() == data
        assert (done.size_bytes, done.resumed, done.restarted) == (len(data), 1, 0)
        [(start, length)] = served[1:]  # the expired URL's try refused, unserved
        assert start >= 1 << 20 and start + length == len(data)
    finally:
        stack.close()


def test_a_download_of_an_output_replaced_by_one_of_another_size_starts_again_whole(
    stack, base_url, tmp_path, monkeypatch
):
    """A transfer whose output was replaced meanwhile starts again from its first byte
    (If-Range with the first answer's ETag: the API answers the whole new blob), but
    the size it checked at the end was the first URL's: a new output of another size
    raised "ended after 2097157 of its 3145728 bytes". The size is now the answer's."""
    from hypermedia.db.engine import snapshot
    from hypermedia.ingest import queries

    alice = add_user(stack, "alice", credits=5)
    first, second = os.urandom(3 << 20), os.urandom((2 << 20) + 5)
    keys: list[str] = []

    def replaced() -> None:
        step = 1 << 20
        stack.storage.put(keys[0], (second[at : at + step] for at in range(0, len(second), step)))

    served = _cut_once_after(monkeypatch, 1 << 20, replaced)
    with HypermediaClient(base_url, alice.api_key, timeout=10) as client:
        job_id = _an_output(stack, client, first, "video.mp4")
        with snapshot(stack.engine) as conn:
            found = queries.output(conn, alice.user_id, job_id, "video.mp4")
        assert found is not None
        keys.append(found.storage_key)
        target = tmp_path / "video.mp4"
        done = client.download(job_id, "video.mp4", target)
        assert target.read_bytes() == second  # never a splice of the two
        assert (done.size_bytes, done.restarted) == (len(second), 1)
        # Handed on in chunks, it cannot be rewound: it raises, as before.
        served.clear()
        with pytest.raises(HypermediaError, match="was replaced while it was downloaded"):
            list(client.output_chunks(job_id, "video.mp4"))


def test_a_resumed_download_from_a_store_without_an_etag_never_splices_two_outputs():
    """A store (a proxy) that sends no strong ETag gets no If-Range: a range resumed on
    a replaced output is the new one's bytes. The size the transfer must reach is the
    answer's now; a 206 of another total is the output replaced, raised, not spliced."""
    from datetime import UTC, datetime, timedelta

    from hypermedia.ingest.client_downloads import OutputTransfer
    from hypermedia.ingest.schemas import OutputUrlResponse

    first, second = os.urandom(3000), os.urandom(2500)
    asked: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.headers.get("Range"))
            if len(asked) == 1:  # the first, cut after 1000 bytes
                self.send_response(200)
                self.send_header("Content-Length", str(len(first)))
                self.end_headers()
                self.wfile.write(first[:1000])
                self.wfile.flush()
                self.close_connection = True
                return
            start = int(str(self.headers["Range"]).removeprefix("bytes=").rstrip("-"))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(second) - 1}/{len(second)}")
            self.send_header("Content-Length", str(len(second) - start))
            self.end_headers()
            self.wfile.write(second[start:])

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    link = OutputUrlResponse(
        job_id="j",
        output_type="video.mp4",
        url=f"http://127.0.0.1:{server.server_address[1]}/blob",
        expires_at=datetime.now(UTC) + timedelta(minutes=5),
        size_bytes=len(first),
        content_type="video/mp4",
    )
    try:
        with httpx.Client(timeout=5, verify=tls.client_context()) as http:
            transfer = OutputTransfer(
                http, lambda: link, lambda url: url, error_from_response, lambda _: None, 2
            )
            got = bytearray()

            def drain() -> None:
                for chunk in transfer.chunks(100, got.clear):
                    got.extend(chunk)

            with pytest.raises(HypermediaError, match="was replaced while it was downloaded"):
                drain()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    assert asked == [None, "bytes=1000-"]
    assert bytes(got) == first[:1000]
