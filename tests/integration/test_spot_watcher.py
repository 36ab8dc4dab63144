"""The spot watcher against a local metadata service (AWS IMDSv2 and GCP), and a
real worker answering a spot notice: it stops claiming, its job goes back to the
queue with its attempt budget untouched, another worker completes it, and the first
worker's row says why it stopped.

The metadata service is :class:`tests.clouds.metadata_server.MetadataServer`; the
worker runs in this process on the real Redis and PostgreSQL, its job in a real
sandboxed child (:class:`~hypermedia.sandbox.executor.ChildExecutor`), which the
notice kills.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from sqlalchemy import select

from hypermedia import tls
from hypermedia.config import load_settings
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.errors import ConfigError
from hypermedia.ingest.service import SubmitRequest
from hypermedia.sandbox.executor import ChildExecutor
from hypermedia.stack import Stack
from hypermedia.worker.execute import JobExecution
from hypermedia.worker.spot import SpotNotice, SpotWatch, SpotWatcher
from hypermedia.worker.worker import SPOT_INTERRUPTED, Worker
from tests import ray_support
from tests.clouds.metadata_server import (
    AWS_ACTION_PATH,
    AWS_TOKEN_HEADER,
    AWS_TOKEN_PATH,
    AWS_TTL_HEADER,
    GCP_PREEMPTED_PATH,
    MetadataServer,
)
from tests.factories import make_object, make_user, open_stack
from tests.pipelines_for_tests import PRELOAD
from tests.worker_support import NoGrants


@pytest.fixture
def metadata() -> Iterator[MetadataServer]:
    with MetadataServer() as server:
        yield server


class Notices:
    """The watcher's callback: every notice it was given."""

    def __init__(self) -> None:
        self.seen: list[SpotNotice] = []
        self.arrived = threading.Event()

    def __call__(self, notice: SpotNotice) -> None:
        self.seen.append(notice)
        self.arrived.set()


def _wait(predicate: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _watching(watch: SpotWatch, notices: Notices) -> SpotWatcher:
    watcher = SpotWatcher(watch, notices)
    watcher.start()
    return watcher


# -- the local metadata service answers as the clouds do ------------------------------------


def test_the_local_service_enforces_the_token_and_the_header(metadata):
    with httpx.Client(base_url=metadata.url, verify=tls.client_context()) as http:
        assert http.put(AWS_TOKEN_PATH).status_code == 400  # no TTL header
        assert http.put(AWS_TOKEN_PATH, headers={AWS_TTL_HEADER: "0"}).status_code == 400
        assert http.get(AWS_TOKEN_PATH).status_code == 405
        assert http.get(AWS_ACTION_PATH).status_code == 401  # no token
        assert http.get(AWS_ACTION_PATH, headers={AWS_TOKEN_HEADER: "forged"}).status_code == 401
        token = http.put(AWS_TOKEN_PATH, headers={AWS_TTL_HEADER: "60"}).text
        assert http.get(AWS_ACTION_PATH, headers={AWS_TOKEN_HEADER: token}).status_code == 404
        assert http.get(GCP_PREEMPTED_PATH).status_code == 403  # no Metadata-Flavor
        flavor = {"Metadata-Flavor": "Google"}
        first = http.get(GCP_PREEMPTED_PATH, headers=flavor)
        assert (first.status_code, first.text) == (200, "FALSE")
        started = time.monotonic()
        same = http.get(
            GCP_PREEMPTED_PATH,
            params={
                "wait_for_change": "true",
                "last_etag": first.headers["ETag"],
                "timeout_sec": 1,
            },
            headers=flavor,
        )
        assert same.text == "FALSE" and time.monotonic() - started >= 0.9  # it waited
        metadata.serve_notice(deadline=time.time() + 120)
        notice = http.get(AWS_ACTION_PATH, headers={AWS_TOKEN_HEADER: token})
        assert notice.status_code == 200 and notice.json()["action"] == "terminate"
        changed = http.get(
            GCP_PREEMPTED_PATH,
            params={"wait_for_change": "true", "last_etag": first.headers["ETag"]},
            headers=flavor,
        )
        assert changed.text == "TRUE" and changed.headers["ETag"] != first.headers["ETag"]


# -- AWS ------------------------------------------------------------------------------------


def test_aws_no_notice_no_callback_then_exactly_one_with_the_deadline(metadata):
    notices = Notices()
    watcher = _watching(SpotWatch("aws", metadata_url=metadata.url, poll_seconds=0.1), notices)
    try:
        _wait(lambda: len(metadata.requests_to(AWS_ACTION_PATH, 404)) >= 5, what="polls")
        assert notices.seen == []
        # IMDSv2: a token first, then every poll carries it; never a refused poll.
        (put,) = metadata.requests_to(AWS_TOKEN_PATH)
        assert put.method == "PUT" and put.status == 200
        assert put.headers[AWS_TTL_HEADER.lower()] == "21600"
        polls = metadata.requests_to(AWS_ACTION_PATH)
        assert all(r.headers.get(AWS_TOKEN_HEADER.lower()) for r in polls)
        assert {r.status for r in polls} == {404}

        deadline = int(time.time()) + 120
        metadata.serve_notice(deadline=deadline, action="terminate")
        assert notices.arrived.wait(5)
        time.sleep(0.5)  # a few more polls' worth: still one callback
        assert len(notices.seen) == 1
        (notice,) = notices.seen
        assert (notice.provider, notice.action, notice.deadline) == ("aws", "terminate", deadline)
        assert notice.deadline - notice.seen_at == pytest.approx(120, abs=3)
        assert "interrupted: spot instance reclaimed" in notice.reason
        _wait(lambda: not watcher.running, timeout=5, what="the watcher to end")
        assert watcher.notice == notice
    finally:
        watcher.stop()


def test_aws_token_is_refreshed_before_expiry_and_after_a_401(metadata):
    notices = Notices()
    watch = SpotWatch("aws", metadata_url=metadata.url, poll_seconds=0.1, token_ttl_seconds=2)
    watcher = _watching(watch, notices)
    try:
        # Refreshed at 80% of its TTL, before the service refuses it. A watcher that only
        # renewed on a 401 would have one refused poll per renewal; a stalled machine may
        # cost one (a poll delayed past the 0.4 s margin), never one per renewal.
        _wait(lambda: len(metadata.requests_to(AWS_TOKEN_PATH)) >= 4, what="token refreshes")
        renewals = len(metadata.requests_to(AWS_TOKEN_PATH)) - 1
        refused = metadata.requests_to(AWS_ACTION_PATH, 401)
        assert len(refused) <= 1 < renewals, (renewals, refused)
        # A token the service forgot: one 401, a new token, and polling goes on.
        metadata.expire_tokens()
        _wait(lambda: len(metadata.requests_to(AWS_ACTION_PATH, 401)) > len(refused), what="a 401")
        polled = len(metadata.requests_to(AWS_ACTION_PATH, 404))
        _wait(lambda: len(metadata.requests_to(AWS_ACTION_PATH, 404)) > polled + 2, what="polls")
        metadata.serve_notice(deadline=time.time() + 90, action="stop")
        assert notices.arrived.wait(5)
        assert [n.action for n in notices.seen] == ["stop"]
    finally:
        watcher.stop()


def test_the_watcher_survives_a_service_that_is_not_there():
    notices = Notices()
    with MetadataServer() as gone:
        url = gone.url  # a port nobody listens on once it stops
    watcher = _watching(SpotWatch("aws", metadata_url=url, poll_seconds=0.1), notices)
    try:
        time.sleep(0.5)
        assert watcher.running and notices.seen == []
    finally:
        watcher.stop()
    assert not watcher.running


def test_a_failing_callback_is_logged_not_raised(metadata, caplog):
    def explode(notice: SpotNotice) -> None:
        raise RuntimeError("boom")

    metadata.serve_notice()
    hooked: list[threading.ExceptHookArgs] = []
    previous = threading.excepthook
    threading.excepthook = hooked.append
    try:
        with caplog.at_level(logging.WARNING, logger="hypermedia.worker.spot"):
            watcher = SpotWatcher(SpotWatch("aws", metadata_url=metadata.url), explode)
            watcher.start()
            _wait(lambda: not watcher.running, timeout=10, what="the watcher to end")
    finally:
        threading.excepthook = previous
    assert hooked == []
    assert any("handling the spot notice failed" in r.getMessage() for r in caplog.records)


# -- GCP ------------------------------------------------------------------------------------


def test_gcp_long_polls_with_the_etag_and_calls_back_once(metadata):
    notices = Notices()
    # A long long-poll: a notice that comes while it waits must still be seen at once.
    watcher = _watching(SpotWatch("gcp", metadata_url=metadata.url, poll_seconds=5), notices)
    try:
        _wait(lambda: len(metadata.requests_to(GCP_PREEMPTED_PATH)) >= 1, what="the first read")
        time.sleep(0.5)  # the long-poll is in flight (requests are recorded as answered)
        assert notices.seen == []
        served = time.time()
        metadata.serve_notice()
        assert notices.arrived.wait(3)  # well within the long-poll's 5 s
        time.sleep(0.3)
        (notice,) = notices.seen
        assert (notice.provider, notice.action) == ("gcp", "preempted")
        assert notice.seen_at - served < 3
        assert notice.deadline == pytest.approx(notice.seen_at + 30)
        first, second = metadata.requests_to(GCP_PREEMPTED_PATH)
        assert first.headers["metadata-flavor"] == second.headers["metadata-flavor"] == "Google"
        assert (first.query, first.status) == ({}, 200)
        assert second.query["wait_for_change"] == "true" and second.query["timeout_sec"] == "5"
        assert second.query["last_etag"] and second.status == 200
        _wait(lambda: not watcher.running, timeout=5, what="the watcher to end")
    finally:
        watcher.stop()


def test_a_stopped_gcp_watcher_calls_nobody(metadata):
    notices = Notices()
    watcher = _watching(SpotWatch("gcp", metadata_url=metadata.url, poll_seconds=2), notices)
    _wait(lambda: len(metadata.requests_to(GCP_PREEMPTED_PATH)) >= 1, what="the first read")
    time.sleep(0.3)
    watcher.stop(timeout=0.1)  # returns while the long-poll is still in flight
    metadata.serve_notice()  # which the long-poll now answers
    _wait(lambda: not watcher.running, timeout=10, what="the watcher to end")
    assert notices.seen == [] and watcher.notice is None


# -- settings -------------------------------------------------------------------------------


def test_spot_settings(monkeypatch):
    default = load_settings()
    assert default.spot_watch == "off" and default.metadata_url is None
    assert SpotWatch.from_settings(default) is None
    monkeypatch.setenv("HYPERMEDIA_SPOT_WATCH", "gcp")
    monkeypatch.setenv("HYPERMEDIA_METADATA_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("HYPERMEDIA_SPOT_POLL_SECONDS", "2")
    watch = SpotWatch.from_settings(load_settings())
    assert watch == SpotWatch("gcp", metadata_url="http://127.0.0.1:9", poll_seconds=2.0)
    assert SpotWatch("aws").base_url == "http://169.254.169.254"
    assert SpotWatch("gcp").base_url == "http://metadata.google.internal"
    with pytest.raises(ConfigError, match=r"metadata_url \(HYPERMEDIA_METADATA_URL\)"):
        load_settings(spot_watch="off", metadata_url="http://127.0.0.1:9")
    with pytest.raises(ConfigError, match="http"):
        load_settings(spot_watch="aws", metadata_url="169.254.169.254")
    with pytest.raises(ConfigError, match=r"spot_watch \(HYPERMEDIA_SPOT_WATCH\)"):
        load_settings(spot_watch="azure")
    with pytest.raises(ConfigError, match="spot_poll_seconds"):
        load_settings(spot_poll_seconds=0)


# -- a worker answering the notice ----------------------------------------------------------


def _profiles_without_input(directory: Path) -> Path:
    path = ray_support.test_profiles(directory)
    header = '[profiles."test.sleep"]\n'
    text = path.read_text()
    assert header in text
    path.write_text(text.replace(header, header + "params = { needs_input = false }\n"))
    return path


def _worker(
    stack: Stack, executor: ChildExecutor, worker_id: str, work: Path, spot: SpotWatch | None
) -> Worker:
    execution = JobExecution(
        stack.dispatcher, stack.catalog, NoGrants(), executor, worker_id, poll_seconds=0.5
    )
    return Worker(
        worker_id=worker_id,
        queue="images",
        concurrency=2,  # an idle loop that must not take the handed-back job
        engine=stack.engine,
        dispatcher=stack.dispatcher,
        execution=execution,
        work_root=str(work),
        clock=stack.clock,
        spot=spot,
    )


def _job_row(stack: Stack, job_id: str):
    with transaction(stack.engine) as conn:
        return conn.execute(
            select(
                t.jobs.c.status,
                t.jobs.c.attempt_count,
                t.jobs.c.max_attempts,
                t.jobs.c.claimed_by,
                t.jobs.c.error_code,
            ).where(t.jobs.c.job_id == job_id)
        ).one()


def _attempts(stack: Stack, job_id: str) -> list[tuple[object, ...]]:
    a = t.attempts.c
    with transaction(stack.engine) as conn:
        rows = conn.execute(
            select(a.attempt_number, a.worker_id, a.status, a.error_code, a.error_message)
            .where(a.job_id == job_id)
            .order_by(a.attempt_number)
        ).all()
    return [tuple(r) for r in rows]


def _worker_row(stack: Stack, worker_id: str):
    with transaction(stack.engine) as conn:
        return conn.execute(
            select(t.workers.c.status, t.workers.c.stopped_at).where(
                t.workers.c.worker_id == worker_id
            )
        ).one()


def test_a_spot_notice_hands_the_job_back_unspent_and_another_worker_completes_it(
    pg_engine, settings, tmp_path, metadata, caplog
):
    stack = open_stack(settings, pg_engine, None, profiles_path=_profiles_without_input(tmp_path))
    person = make_user(stack)
    obj = make_object(stack, person)
    request = SubmitRequest(
        object_id=obj, operations=["test.sleep"], params={"test.sleep": {"seconds": 6}}
    )
    (job_id,) = stack.ingest.submit(person.caller, request).job_ids
    watch = SpotWatch("aws", metadata_url=metadata.url, poll_seconds=0.2)
    first_work, second_work = tmp_path / "work-a", tmp_path / "work-b"
    with (
        ChildExecutor(first_work, preload=PRELOAD) as first_executor,
        ChildExecutor(second_work, preload=PRELOAD) as second_executor,
        caplog.at_level(logging.INFO, logger="hypermedia.worker"),
    ):
        first = _worker(stack, first_executor, "spot-a", first_work, watch)
        first.start()
        try:
            _wait(lambda: first_executor.child_pid(job_id) is not None, what="the job's child")
            child = first_executor.child_pid(job_id)
            assert child is not None
            before = _job_row(stack, job_id)
            assert (before.status, before.attempt_count, before.claimed_by) == (
                "processing",
                1,
                "spot-a",
            )
            assert _worker_row(stack, "spot-a").status == "active"

            metadata.serve_notice(deadline=time.time() + 120)
            assert first.wait(30), "the worker did not stop after the notice"
        finally:
            first.stop()

        # The notice: the child killed, the job handed back, no attempt spent.
        assert first.notice is not None and first.notice.provider == "aws"
        _wait(lambda: not psutil.pid_exists(child), timeout=10, what="the child to go")
        after = _job_row(stack, job_id)
        assert (after.status, after.claimed_by, after.error_code) == ("queued", None, None)
        assert after.attempt_count == before.attempt_count - 1 == 0
        assert after.max_attempts == before.max_attempts == 3
        ((number, worker_id, status, code, message),) = _attempts(stack, job_id)
        assert (number, worker_id, status, code) == (1, "spot-a", "released", SPOT_INTERRUPTED)
        assert str(message).startswith("interrupted: spot instance reclaimed (aws terminate by ")
        assert stack.queue.ready_ids("images") == [job_id]
        # It stopped claiming: the job sat in its queue while the worker wound down.
        s = first.stats
        assert (s.claimed, s.released, s.completed, s.failed, s.retried) == (1, 1, 0, 0, 0)
        row = _worker_row(stack, "spot-a")
        assert row.status == SPOT_INTERRUPTED and row.stopped_at is not None
        interrupted = [r for r in caplog.records if getattr(r, "action", "") == SPOT_INTERRUPTED]
        assert len(interrupted) == 1 and getattr(interrupted[0], "worker_id", "") == "spot-a"

        # A second worker (no notice for it) runs the job to the end on its own budget.
        second = _worker(stack, second_executor, "steady-b", second_work, None)
        second.start()
        try:
            _wait(lambda: _job_row(stack, job_id).status == "completed", what="the rerun")
        finally:
            second.stop()
    done = _job_row(stack, job_id)
    assert (done.attempt_count, done.max_attempts) == (1, 3)
    assert [(a[0], a[1], a[2]) for a in _attempts(stack, job_id)] == [
        (1, "spot-a", "released"),
        (2, "steady-b", "completed"),
    ]
    assert second.stats.completed == 1
    assert _worker_row(stack, "steady-b").status == "stopped"
    stack.close()
