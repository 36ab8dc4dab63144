"""A job's events over Server-Sent Events, on a real uvicorn server, PostgreSQL and Redis:
the recent ones for a late subscriber, live ones as the worker's path publishes them,
resuming with Last-Event-ID, the record when Redis lost an event, another user's 404."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from hypermedia import tls
from hypermedia.errors import NotFound
from hypermedia.ingest.api import create_app
from hypermedia.ingest.client import HypermediaClient
from hypermedia.ingest.schemas import JobEvent
from hypermedia.jobs.repository import ClaimedJob, FinishedJob
from hypermedia.queue.events import JobEvents, progress_event
from hypermedia.queue.redis_queue import connect
from hypermedia.stack import Stack
from tests.api_support import AnswerDropper, running_server
from tests.factories import make_user, submit


@pytest.fixture
def stack(pg_engine, settings) -> Iterator[Stack]:
    opened = Stack.open(settings(), engine=pg_engine, auto_migrate=True)
    yield opened
    opened.close()


@pytest.fixture
def base_url(stack) -> Iterator[str]:
    with running_server(create_app(stack, events_keepalive_seconds=0.5)) as url:
        yield url


def _started(stack: Stack, job_id: str) -> ClaimedJob:
    [claimed] = stack.dispatcher.claim_and_start("images", "w")
    assert claimed.job_id == job_id
    return claimed


def _progress(stack: Stack, job: ClaimedJob, done: float, total: float = 4) -> None:
    event = progress_event("run", done, total, "pages", time.time(), job.attempt_number)
    stack.dispatcher.events.publish(job.job_id, event)


def _shape(events: list[JobEvent]) -> list[tuple[str, str | None, float | None]]:
    return [(e.type, e.status, e.done) for e in events]


def test_a_late_subscriber_gets_the_recent_events_and_the_stream_ends_with_the_job(stack, base_url):
    person = make_user(stack)
    job_id = submit(stack, person, ["thumbnail"])[0]
    job = _started(stack, job_id)
    for done in (1, 2):
        _progress(stack, job, done)
    key = stack.dispatcher.events.key(job_id)
    assert stack.redis.ttl(key) > 23 * 3600  # a running job's events: kept a day
    with HypermediaClient(base_url, person.api_key) as client:
        # Connected after those: they come first, from the job's stream, with their ids.
        seen: list[JobEvent] = []
        arrived = threading.Event()

        def follow() -> None:
            for event in client.events(job_id, timeout=30):
                seen.append(event)
                if event.type == "progress" and event.done == 2:
                    arrived.set()

        follower = threading.Thread(target=follow)
        follower.start()
        assert arrived.wait(10)
        _progress(stack, job, 3)  # live, now
        assert stack.dispatcher.complete_many("w", [FinishedJob(job_id)]) == [True]
        follower.join(15)
        assert not follower.is_alive()
        assert 0 < stack.redis.ttl(key) <= 600  # an ended job's: ten minutes
        assert _shape(seen) == [
            ("status", "processing", None),
            ("progress", None, 1.0),
            ("progress", None, 2.0),
            ("progress", None, 3.0),
            ("status", "completed", None),
        ]
        assert all(e.id is not None and not e.record for e in seen)
        assert seen[1].fraction == 0.25 and seen[1].unit == "pages" and seen[1].attempt == 1
        ids = [e.id for e in seen]
        assert ids == sorted(ids, key=lambda i: tuple(map(int, str(i).split("-"))))

        # Resumed after the second event: the rest only.
        again = list(client.events(job_id, last_event_id=seen[1].id, timeout=10))
        assert _shape(again) == _shape(seen[2:])
        # A finished job: its recent events, then the stream ends at once.
        assert _shape(list(client.events(job_id, timeout=10))) == _shape(seen)
        assert client.wait(job_id, timeout=10).status == "completed"

    # hypermedia watch, with its bars: the job ended, completed (exit 0).
    from typer.testing import CliRunner

    from hypermedia.cli import app

    env = {"HYPERMEDIA_API_URL": base_url, "HYPERMEDIA_API_KEY": person.api_key}
    watched = CliRunner().invoke(app, ["watch", job_id], env=env)
    assert watched.exit_code == 0, watched.output
    assert job_id[:12] in watched.stdout and "completed" in watched.stdout


def test_wait_outlasts_an_api_restart(stack, base_url):
    """The API goes away under a waiting client (its stream reset, connections refused
    for a few seconds, as a deploy restarts it) and comes back: wait() reconnects and
    answers the job, instead of raising at the first refused connection."""
    person = make_user(stack)
    job_id = submit(stack, person, ["thumbnail"])[0]
    job = _started(stack, job_id)
    with (
        AnswerDropper(base_url, b"", drops=0) as api,
        HypermediaClient(api.url, person.api_key) as client,
    ):
        seen: list[JobEvent] = []
        outcome: list[object] = []
        first = threading.Event()

        def follow() -> None:
            try:
                for event in client.events(job_id, timeout=60):
                    seen.append(event)
                    first.set()
                outcome.append(client.job(job_id).status)
            except Exception as exc:
                outcome.append(exc)

        follower = threading.Thread(target=follow)
        follower.start()
        assert first.wait(10)
        api.cut()
        time.sleep(5)  # the client's reconnect (after the server's 2 s retry) is refused
        assert not outcome, outcome
        api.restore()
        stack.dispatcher.complete_many("w", [FinishedJob(job.job_id)])
        follower.join(40)
        assert not follower.is_alive()
        assert outcome == ["completed"], outcome
        assert seen[-1].status == "completed"


def test_a_resumed_stream_does_not_pass_on_the_status_it_delivered_again(stack, base_url):
    """On every connection the server sends the record's status (no id) after what
    followed Last-Event-ID: a stream taken up again (the API restarted under it) passed
    the job's "processing" on a second time, and a consumer tracking status changes saw
    processing -> processing. A record status the same as the last one delivered is
    not passed on; what is news still is (a progress, the end)."""
    person = make_user(stack)
    job_id = submit(stack, person, ["thumbnail"])[0]
    job = _started(stack, job_id)
    with (
        AnswerDropper(base_url, f"GET /v1/hypermedia/jobs/{job_id}/events".encode(), 0) as api,
        HypermediaClient(api.url, person.api_key) as client,
    ):
        seen: list[JobEvent] = []
        first = threading.Event()

        def follow() -> None:
            for event in client.events(job_id, timeout=60):
                seen.append(event)
                first.set()

        follower = threading.Thread(target=follow)
        follower.start()
        assert first.wait(10)
        api.cut()
        time.sleep(1)  # the stream reset; connections refused
        api.restore()
        deadline = time.monotonic() + 20
        while api.requests < 2:  # taken up again (after the server's 2 s retry)
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(1.5)  # the server sends the record's "processing" on it
        _progress(stack, job, 1)
        stack.dispatcher.complete_many("w", [FinishedJob(job.job_id)])
        follower.join(30)
        assert not follower.is_alive()
    assert _shape(seen) == [
        ("status", "processing", None),
        ("progress", None, 1.0),
        ("status", "completed", None),
    ], seen


def test_the_record_ends_a_stream_whose_terminal_event_redis_lost(stack, base_url):
    person = make_user(stack)
    job_id = submit(stack, person, ["thumbnail"])[0]
    job = _started(stack, job_id)
    with HypermediaClient(base_url, person.api_key) as client:
        first = next(iter(client.events(job_id, timeout=10)))
        assert (first.type, first.status) == ("status", "processing")
        stack.dispatcher.events.client.delete(stack.dispatcher.events.key(job_id))
        # The status changes with no event (as if Redis had been away when it did).
        with stack.engine.begin() as conn:
            stack.repository.complete_many(conn, "w", time.time(), [FinishedJob(job.job_id)])
        started = time.monotonic()
        events = list(client.events(job_id, timeout=10))
        assert _shape(events) == [("status", "completed", None)]
        assert events[0].record and events[0].id is None
        assert time.monotonic() - started < 5


def test_another_users_job_events_are_404_and_a_queued_job_times_out(stack, base_url):
    alice, bob = make_user(stack), make_user(stack)
    job_id = submit(stack, alice, ["thumbnail"])[0]
    with HypermediaClient(base_url, bob.api_key) as client, pytest.raises(NotFound):
        next(iter(client.events(job_id, timeout=5)))
    with HypermediaClient(base_url, alice.api_key) as client:
        with pytest.raises(NotFound):
            next(iter(client.events("0" * 32, timeout=5)))
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="still queued"):
            client.wait(job_id, timeout=1.5)
        assert time.monotonic() - started < 5


def _streamed(
    stack: Stack, key: str, record: Callable[[], dict[str, object]]
) -> tuple[list[str], list[dict[str, object]]]:
    """What :func:`hypermedia.ingest.events.stream` sends for ``key`` with ``record`` as
    the job record's status: the SSE messages, and the data of each."""
    import asyncio

    from hypermedia.ingest import events as sse
    from hypermedia.ingest.subscriber import EventSubscriber

    async def collect() -> list[str]:
        subscriber = EventSubscriber(stack.redis_url)
        try:
            return [text async for text in sse.stream(subscriber, key, record, keepalive=5)]
        finally:
            await subscriber.aclose()

    sent = asyncio.run(collect())
    data = [
        json.loads(line.removeprefix("data: "))
        for text in sent
        for line in text.splitlines()
        if line.startswith("data: ")
    ]
    return sent, data


def _running_with_progress(stack):
    """A thumbnail job started, its first progress event published: its id, the
    claimed job and its event stream's key."""
    person = make_user(stack)
    job_id = submit(stack, person, ["thumbnail"])[0]
    job = _started(stack, job_id)
    _progress(stack, job, 1)
    return job_id, job, stack.dispatcher.events.key(job_id)


def test_events_published_while_the_record_was_read_are_sent_before_it_ends(stack):
    """The race of a subscriber arriving as the job ends: what was published between
    its reading the stream and the record comes from the stream, the end with its id."""
    from hypermedia.queue.events import status_event

    job_id, job, key = _running_with_progress(stack)

    def record() -> dict[str, object]:
        _progress(stack, job, 2)  # the worker's last events, published meanwhile
        stack.dispatcher.events.publish(job_id, status_event("completed", time.time()))
        return status_event("completed", time.time(), record=True)

    _, data = _streamed(stack, key, record)
    assert [(d["type"], d.get("status"), d.get("done")) for d in data] == [
        ("status", "processing", None),
        ("progress", None, 1.0),
        ("progress", None, 2.0),
        ("status", "completed", None),
    ]
    assert not any(d.get("record") for d in data)  # the end came from the stream


def test_an_end_published_just_after_the_record_was_read_comes_from_the_stream(stack):
    """The record's commit comes before the job's last event is published: a subscriber
    that read the record in between waits a moment for that event (seen once under
    load: the stream ended on the record's status instead)."""
    from hypermedia.queue.events import status_event

    job_id, _job, key = _running_with_progress(stack)
    worker: list[threading.Timer] = []

    def record() -> dict[str, object]:
        # Committed; the worker publishes the end half a second later.
        timer = threading.Timer(
            0.5,
            lambda: stack.dispatcher.events.publish(job_id, status_event("completed", time.time())),
        )
        worker.append(timer)
        timer.start()
        return status_event("completed", time.time(), record=True)

    sent, data = _streamed(stack, key, record)
    # The stream has the end as soon as Redis ran the publish script, before the
    # worker's thread has read the script's reply: done with the stack's Redis before
    # the fixture closes it (under load, the close came first; its pool disconnects
    # connections in use too, and redis-py's read failed in that thread: EBADF).
    [timer] = worker
    timer.join(10)
    assert not timer.is_alive()
    assert [(d["type"], d.get("status"), d.get("done")) for d in data] == [
        ("status", "processing", None),
        ("progress", None, 1.0),
        ("status", "completed", None),
    ]
    assert not data[-1].get("record") and "id: " in sent[-1]


def test_an_event_published_as_redis_restarts_is_not_lost_to_its_empty_script_cache(
    private_redis,
):
    """A Redis without the publish script (a fresh one; one restarted since the last
    publish: its script cache is empty) answers NOSCRIPT: the script is loaded and the
    events go out, instead of the error escaping to the job's worker."""
    client = connect(private_redis.url)
    client.script_flush()
    events = JobEvents(client, "hmtest")
    first = progress_event("run", 1, 4, "pages", time.time(), 1)
    events.publish("j" * 32, first)  # never loaded on this server
    client.script_flush()  # what a restart leaves
    second = progress_event("run", 2, 4, "pages", time.time(), 1)
    events.publish_many([("j" * 32, second), ("k" * 32, second)])
    assert [e for _, e in events.history("j" * 32)] == [first, second]
    assert [e for _, e in events.history("k" * 32)] == [second]
    client.close()


def test_a_publish_is_one_round_trip_once_the_script_is_loaded(private_redis):
    """No ``SCRIPT EXISTS`` before each pipeline (redis-py's script objects ask it every
    time): after the first publish, each one is the batch's EVALSHAs alone."""
    client = connect(private_redis.url)
    events = JobEvents(client, "hmtest")
    event = progress_event("run", 1, 4, "pages", time.time(), 1)
    events.publish("j" * 32, event)
    client.config_resetstat()
    for n in range(5):
        events.publish_many([(f"{n}" * 32, event), ("j" * 32, event)])
    stats = client.info("commandstats")
    assert stats["cmdstat_evalsha"]["calls"] == 10, stats
    assert not any(name.startswith("cmdstat_script") for name in stats), stats
    assert len(events.history("j" * 32)) == 6
    client.close()


def test_a_waiting_client_outlasts_a_restart_of_the_head(stack):
    """`submit --wait`, `watch` and client.wait() across a restart of the head (the API
    gone for a while, then back on the same address): the stream is taken up again
    and ends with the job, which completed meanwhile. It failed with
    service_unavailable ('cannot reach the API'; `watch`: 'did not complete') at the
    first connection refused, though the job went on. A server never reached still
    fails at once."""
    import uvicorn

    from hypermedia.embedded import listening_socket
    from hypermedia.errors import ServiceUnavailable
    from tests.api_support import wait_until_healthy

    app = create_app(stack, events_keepalive_seconds=0.5)

    def serve(sock):
        server = uvicorn.Server(uvicorn.Config(app, log_config=None, lifespan="off"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        return server, thread

    def stop(server, thread, sock) -> None:  # as a head killed: open streams cut
        server.should_exit = server.force_exit = True
        thread.join(10)
        sock.close()
        assert not thread.is_alive()

    person = make_user(stack)
    job_id = submit(stack, person, ["thumbnail"])[0]
    job = _started(stack, job_id)
    first = listening_socket()
    port = first.getsockname()[1]
    base_url = f"http://127.0.0.1:{port}"
    server, thread = serve(first)
    wait_until_healthy(base_url)
    outcome: list[object] = []
    seen: list[JobEvent] = []
    with HypermediaClient(base_url, person.api_key) as client:

        def follow() -> None:
            try:
                for event in client.events(job_id, timeout=60):
                    seen.append(event)
                outcome.append(client.job(job_id).status)
            except Exception as exc:
                outcome.append(exc)

        follower = threading.Thread(target=follow)
        follower.start()
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _shape(seen) == [("status", "processing", None)]
        stop(server, thread, first)
        # Down: the job ends meanwhile, and the client finds nobody listening.
        assert stack.dispatcher.complete_many("w", [FinishedJob(job.job_id)]) == [True]
        time.sleep(4)
        second = listening_socket(port=port)
        server, thread = serve(second)
        try:
            follower.join(30)
            assert not follower.is_alive()
        finally:
            stop(server, thread, second)
    assert outcome == ["completed"], outcome
    assert _shape(seen)[-1] == ("status", "completed", None)

    with HypermediaClient(base_url, person.api_key) as client:  # nobody there, ever
        started = time.monotonic()
        with pytest.raises(ServiceUnavailable, match="cannot reach the API"):
            client.wait(job_id, timeout=30)
        assert time.monotonic() - started < 5


def _open_stream(base_url: str, person, job_id: str) -> socket.socket:
    """A client following ``job_id``'s events on a raw socket, once the server has sent
    the stream's first lines (its place taken)."""
    return _opened(base_url, person, job_id)[0]


def _opened(base_url: str, person, job_id: str) -> tuple[socket.socket, bytes]:
    """:func:`_open_stream`, and what its first read took: the answer's head, and on a
    busy machine the stream's first events with it."""
    host, port = base_url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(
        f"GET /v1/hypermedia/jobs/{job_id}/events HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {person.api_key}\r\n\r\n".encode()
    )
    first = sock.recv(4096)
    assert first.startswith(b"HTTP/1.1 200"), first
    return sock, first


def _events_answer(base_url: str, person, job_id: str) -> httpx.Response:
    """The answer to a request for ``job_id``'s events that the server refuses."""
    url = f"{base_url}/v1/hypermedia/jobs/{job_id}/events"
    with httpx.stream(
        "GET",
        url,
        headers={"Authorization": f"Bearer {person.api_key}"},
        verify=tls.client_context(),
    ) as r:
        assert r.status_code != 200
        r.read()
        return r


def test_event_streams_are_capped_per_user_and_per_server(pg_engine, settings):
    """Each stream holds a socket and a Redis connection while its job runs. One user
    had no cap: past redis-py's pool of 100 connections every further stream, anyone's,
    was sent no live event (followed the record alone, each keep-alive), and thousands
    held as many sockets. Now a user's streams past user_concurrent_event_streams are
    429 with Retry-After (nothing read), the server's past event_streams 503, and a
    client waiting on a 429 gets its stream once one of the user's ends."""
    stack = Stack.open(
        settings(event_streams=3, user_concurrent_event_streams=2),
        engine=pg_engine,
        auto_migrate=True,
    )
    try:
        with running_server(create_app(stack, events_keepalive_seconds=0.5)) as url:
            alice, bob = make_user(stack), make_user(stack)
            jobs = submit(stack, alice, ["thumbnail"]) + submit(stack, alice, ["thumbnail"])
            held = [_open_stream(url, alice, jobs[0]), _open_stream(url, alice, jobs[1])]
            refused = _events_answer(url, alice, jobs[0])
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["code"] == "concurrency_limited"
            assert refused.headers["Retry-After"] == "5"
            # Another user is not refused for hers; the server's third is its last.
            bobs = submit(stack, bob, ["thumbnail"])[0]
            held.append(_open_stream(url, bob, bobs))
            full = _events_answer(url, bob, bobs)
            assert full.status_code == 503 and "at most 3" in full.json()["error"]["message"]
            assert full.headers["Retry-After"] == "5"

            # The client waits on a 429 (alice's third) until one of hers has ended.
            seen: list[JobEvent] = []
            with HypermediaClient(url, alice.api_key) as client:
                follower = threading.Thread(
                    target=lambda: seen.extend(client.events(jobs[0], timeout=30)), daemon=True
                )
                follower.start()
                held.pop(0).close()
                held.pop(0).close()  # two places: the client's comes whenever it asks
                deadline = time.monotonic() + 20
                while not seen and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert _shape(seen[:1]) == [("status", "queued", None)]
                stack.ingest.cancel(alice.caller, jobs[0])
                follower.join(15)
                assert not follower.is_alive()
                assert _shape(seen)[-1] == ("status", "cancelled", None)
            for sock in held:
                sock.close()
    finally:
        stack.close()


def test_a_hundred_streams_of_one_user_leave_another_her_live_events(stack):
    """redis-py's asyncio pool holds 100 connections unless told otherwise, and each
    stream holds one: with 100 streams of one user open, another's stream was sent no
    live event (it followed the record alone, at each keep-alive)."""
    with running_server(create_app(stack, events_keepalive_seconds=5)) as url:
        alice, mallory = make_user(stack), make_user(stack)
        job_id = submit(stack, alice, ["thumbnail"])[0]
        job = _started(stack, job_id)
        hers = submit(stack, mallory, ["thumbnail"])[0]
        held = [_open_stream(url, mallory, hers) for _ in range(100)]
        try:
            with HypermediaClient(url, alice.api_key) as client:
                events = iter(client.events(job_id, timeout=20))
                assert next(events).status == "processing"
                _progress(stack, job, 1)
                live = next(events)
                assert (live.type, live.done, live.record) == ("progress", 1.0, False)
        finally:
            for sock in held:
                sock.close()


def test_more_event_streams_than_connections_leave_the_clients_other_calls_theirs(stack):
    """httpx's pool holds 100 connections, as many as the event streams a user may open
    (user_concurrent_event_streams): a web tier's client following 100 streams had every
    connection taken, and its next call waited its whole timeout for one, then failed
    ("nothing was sent"). Streams have connections of their own now (the client's
    event_streams, 100): the other calls keep theirs, and a stream past them waits for
    one to end."""
    streams = 101
    with running_server(create_app(stack, events_keepalive_seconds=5)) as url:
        alice = make_user(stack)
        job_id = submit(stack, alice, ["thumbnail"])[0]
        lock = threading.Lock()
        following: list[str] = []
        ends: list[str | BaseException] = []
        with HypermediaClient(url, alice.api_key, timeout=5, retries=0) as client:

            def follow() -> None:
                last = "none"
                try:
                    for event in client.events(job_id, timeout=90):
                        if last == "none":
                            with lock:
                                following.append(job_id)
                        last = event.status or last
                except BaseException as exc:
                    last = exc  # type: ignore[assignment]
                with lock:
                    ends.append(last)

            threads = [threading.Thread(target=follow, daemon=True) for _ in range(streams)]
            for thread in threads:
                thread.start()
            deadline = time.monotonic() + 60
            while len(following) < 100 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(following) == 100, (len(following), ends)
            assert client.credits().reserved > 0  # the queued job's
            assert client.job(job_id).status == "queued"
            assert len(following) == 100  # the one past them waits, holding nothing
            stack.ingest.cancel(alice.caller, job_id)
            for thread in threads:
                thread.join(60)
            assert not any(thread.is_alive() for thread in threads)
        assert ends == ["cancelled"] * streams

        # Past a client's event_streams, a stream waits for one, up to its timeout.
        queued = submit(stack, alice, ["thumbnail"])[0]
        with HypermediaClient(url, alice.api_key, event_streams=1) as client:
            first = iter(client.events(queued, timeout=30))
            assert next(first).status == "queued"
            started = time.monotonic()
            with pytest.raises(TimeoutError, match="still queued"):
                list(client.events(queued, timeout=1))
            assert time.monotonic() - started < 10
            assert client.job(queued).status == "queued"


def test_a_revoked_keys_open_stream_ends_at_its_next_keep_alive(stack, base_url):
    """A stream re-read the record at each keep-alive by user id only: one opened before
    its key was revoked (`hypermedia user revoke`) kept sending the job's events for as
    long as the job ran. Now the first read of the record after the revocation ends it,
    and the client's reconnect is refused 401 (at once: the authenticator's cache does
    not keep the key alive for a stream)."""
    from hypermedia.accounts import key_id_of, revoke_api_key
    from hypermedia.errors import AuthenticationFailed

    person = make_user(stack)
    job_id = submit(stack, person, ["thumbnail"])[0]
    job = _started(stack, job_id)
    url = f"{base_url}/v1/hypermedia/jobs/{job_id}/events"
    headers = {"Authorization": f"Bearer {person.api_key}"}
    keepalives = 0
    with httpx.stream(
        "GET", url, headers=headers, timeout=10, verify=tls.client_context()
    ) as answer:
        assert answer.status_code == 200
        lines = answer.iter_lines()
        for line in lines:
            if line.startswith("data: ") and '"processing"' in line:
                break
        with stack.engine.begin() as conn:
            assert revoke_api_key(conn, key_id_of(person.api_key), time.time())
        _progress(stack, job, 1)  # the job goes on
        for line in lines:
            if line == ": keep-alive":
                keepalives += 1
                if keepalives == 20:  # the record was read 19 times: it never ends
                    break
        else:
            keepalives = 0  # ended
    assert keepalives == 0
    with HypermediaClient(base_url, person.api_key) as client, pytest.raises(AuthenticationFailed):
        next(iter(client.events(job_id, timeout=10)))


def _following(base_url: str, person, job_id: str) -> socket.socket:
    """A client following ``job_id``'s events on a raw socket, once the stream has sent
    the job's status (its channel subscribed, its recent events read)."""
    # The head's read may hold the status already (it once threw it away: a stream
    # then waited for a status sent before, keep-alive after keep-alive).
    sock, seen = _opened(base_url, person, job_id)
    while b"event: status" not in seen:
        chunk = sock.recv(4096)
        assert chunk, seen
        seen += chunk
    return sock


def _clients(redis_client) -> list[dict[str, str]]:
    return [c for c in redis_client.client_list() if c.get("name") != "test-observer"]


def test_the_streams_of_an_api_process_share_one_redis_subscriber(
    pg_engine, settings, private_redis
):
    """Each stream held a pub/sub connection of its own: 50 streams were 50 Redis
    connections (1000 per API process at the cap, against Redis's maxclients). Now one
    connection, named, follows the channels of every stream, a channel while anyone
    follows it; the streams go on through Redis going away (they follow the record
    and end with it) and the streams after it came back hear live events again."""
    from hypermedia.ingest.subscriber import CLIENT_NAME, READ_CONNECTIONS

    stack = Stack.open(settings(redis_url=private_redis.url), engine=pg_engine, auto_migrate=True)
    observer = connect(private_redis.url)
    observer.client_setname("test-observer")
    held: list[socket.socket] = []
    try:
        with running_server(create_app(stack, events_keepalive_seconds=0.5)) as url:
            person = make_user(stack)
            jobs = [submit(stack, person, ["thumbnail"])[0] for _ in range(10)]
            held = [_following(url, person, jobs[n % 10]) for n in range(50)]
            subscribed = [c for c in _clients(observer) if int(c.get("sub", 0))]
            assert len(subscribed) == 1, subscribed
            assert subscribed[0]["name"] == CLIENT_NAME and int(subscribed[0]["sub"]) == 10
            ours = [c for c in _clients(observer) if c.get("name") == CLIENT_NAME]
            assert len(ours) <= 1 + READ_CONNECTIONS, ours

            # Live events reach every stream of the job, once each.
            job = _started(stack, jobs[0])
            _progress(stack, job, 1)
            for sock in held[::10]:  # jobs[0]'s
                seen = b""
                while b"event: progress" not in seen:
                    seen += sock.recv(4096)
                assert seen.count(b"event: progress") == 1 and b'"done":1' in seen, seen

            # The streams gone, their channels are unsubscribed; the connection stays.
            for sock in held:
                sock.close()
            held = []
            deadline = time.monotonic() + 10
            while any(int(c.get("sub", 0)) for c in _clients(observer)):
                assert time.monotonic() < deadline, _clients(observer)
                time.sleep(0.05)

            # Redis goes away under a stream: it follows the record and ends with it.
            other = _started(stack, jobs[1])
            with HypermediaClient(url, person.api_key) as client:
                events = iter(client.events(jobs[0], timeout=30))
                assert _shape([next(events), next(events)]) == [
                    ("status", "processing", None),
                    ("progress", None, 1.0),
                ]
                observer.close()
                private_redis.stop()
                with stack.engine.begin() as conn:
                    stack.repository.complete_many(
                        conn, "w", time.time(), [FinishedJob(job.job_id)]
                    )
                rest = list(events)
                # The record's status, as it changes (the first read may come before
                # the commit), then its end.
                assert _shape(rest)[-1] == ("status", "completed", None), rest
                assert all(e.record for e in rest) and len(rest) <= 2, rest
                private_redis.start()  # back, on the same port (empty)
                events = iter(client.events(jobs[1], timeout=30))
                assert next(events).status == "processing"
                _progress(stack, other, 2)
                live = next(events)
                assert (live.type, live.done, live.record) == ("progress", 2.0, False)
    finally:
        for sock in held:
            sock.close()
        stack.close()


def test_cancelling_a_cancelled_job_again_publishes_no_second_end(stack, base_url):
    """A cancel of a job cancelled before (a client's retry, `hypermedia cancel` run
    twice) answered 200 and published the job's ``cancelled`` event again: its stream
    held two ends, and every later subscriber was sent both."""
    person = make_user(stack)
    job_id = submit(stack, person, ["thumbnail"])[0]
    with HypermediaClient(base_url, person.api_key) as client:
        assert client.cancel(job_id).status == "cancelled"
        assert client.cancel(job_id).status == "cancelled"  # still answered, idempotent
        events = list(client.events(job_id, timeout=10))
    assert _shape(events) == [("status", "cancelled", None)]
    history = [e for _, e in stack.dispatcher.events.history(job_id)]
    assert [e["status"] for e in history] == ["cancelled"]
