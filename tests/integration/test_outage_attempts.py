"""An attempt the platform's outage ended spends none of the job's attempts.

A worker asks the head for its job's URLs (the grants actor: the record, the storage);
when the record or the storage is down, that grant fails the attempt. It was failed
like a fault of the job's own, retryable: each outage the job met spent one of its
``max_attempts``, and a job ended ``failed`` after a few outages that were never its
fault. And the record being down, the worker could not write that failure either: the
job stayed ``processing`` until its lease ran out, whose expiry then spent the attempt.
Now the job is handed back to retry_wait without counting the attempt (the hand back
waits for the record), up to OUTAGE_HANDBACKS times a job.

Real outages: a private PostgreSQL stopped while the worker asks for its input's URL;
on SQLite, whose reads go on whatever holds the write lock, the storage refusing the
output's URL (an earlier run's blob there is being deleted) while another process holds
the record's write lock past the busy timeout as the worker hands the job back.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Engine, delete, insert, select

from bench.in_process import InProcessExecutor
from hypermedia.clock import to_datetime
from hypermedia.db import tables as t
from hypermedia.db.engine import make_engine, snapshot, transaction
from hypermedia.embedded import listening_socket
from hypermedia.ingest.service import SubmitRequest
from hypermedia.jobs.states import OUTAGE_BACKOFF, OUTAGE_HANDBACKS
from hypermedia.stack import Stack
from hypermedia.storage.base import derived_key
from hypermedia.storage.grants import StorageGrants
from hypermedia.worker.execute import Completion, JobExecution, Outcome
from tests import ray_support
from tests.factories import make_object, make_user, open_stack
from tests.pipelines_for_tests import PRELOAD
from tests.support import PrivatePostgres
from tests.worker_support import NoGrants

OUTAGE_SECONDS = 1.5
BUSY_SECONDS = 0.3

# Another process: BEGIN IMMEDIATE through the project's engine (SQLite's write lock),
# held until its stdin closes.
_HOLDER = """
import sys
from hypermedia.db.engine import make_engine, transaction
with transaction(make_engine(sys.argv[1])):
    print("holding", flush=True)
    sys.stdin.readline()
"""


@contextmanager
def _postgres_down(server: PrivatePostgres) -> Iterator[None]:
    server.stop()
    try:
        yield
    finally:
        server.start()


@contextmanager
def _sqlite_locked_and_output_being_deleted(url: str, engine: Engine, key: str) -> Iterator[None]:
    now = time.time()
    with transaction(engine) as conn:
        conn.execute(
            insert(t.blob_deletions).values(
                storage_key=key,
                requested_at=to_datetime(now),
                next_attempt_at=to_datetime(now),
                claimed_until=to_datetime(now + 3600),
            )
        )
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
        yield
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        assert holder.wait(20) == 0
        with transaction(engine) as conn:
            conn.execute(delete(t.blob_deletions).where(t.blob_deletions.c.storage_key == key))


@contextmanager
def _for_a_while(outage: Callable[[], object]) -> Iterator[None]:
    """``outage`` (a context manager's factory) begun now, ended OUTAGE_SECONDS later in
    another thread, whatever the caller does meanwhile."""
    ended = threading.Event()
    begun = threading.Event()

    def run() -> None:
        with outage():  # type: ignore[attr-defined]
            begun.set()
            time.sleep(OUTAGE_SECONDS)
        ended.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert begun.wait(30)
    try:
        yield
    finally:
        thread.join(60)
        assert ended.is_set()


def _job(engine: Engine, job_id: str) -> tuple[str, int]:
    with snapshot(engine) as conn:
        row = conn.execute(
            select(t.jobs.c.status, t.jobs.c.attempt_count).where(t.jobs.c.job_id == job_id)
        ).one()
    return row.status, row.attempt_count


def _due_now(stack: Stack, job_id: str) -> None:
    """The job's wait after its hand back cut short (the reaper's promotion)."""
    with transaction(stack.engine) as conn:
        moved = stack.dispatcher.repository.promote_due(conn, time.time() + 3600, [job_id])
    assert [m.job_id for m in moved] == [job_id]
    stack.dispatcher.mirror([job_id])


def _profiles_with_one_attempt(directory, operation: str):
    """The test profiles, with ``operation`` given one attempt: each outage of the
    platform (a private PostgreSQL stopped and started, a process holding SQLite's
    write lock) costs its CPU-s, and two are more than the job has attempts."""
    path = ray_support.test_profiles(directory)
    text = path.read_text()
    header = f'[profiles."{operation}"]\n'
    start = text.index(header)
    at = text.index("max_attempts = ", start)
    end = text.index("\n", at)
    path.write_text(text[:at] + "max_attempts = 1" + text[end:])
    return path


@pytest.mark.parametrize("database", ["postgresql", "sqlite"])
def test_an_attempt_the_platforms_outage_ended_spends_none_of_the_jobs(
    database, request, settings, tmp_path
):
    if database == "postgresql":
        server = request.getfixturevalue("private_postgres")
        url = server.url
    else:
        url = request.getfixturevalue("sqlite_url")
    engine = make_engine(url, sqlite_busy_seconds=BUSY_SECONDS)
    grants_engine = make_engine(url, sqlite_busy_seconds=BUSY_SECONDS)  # the grants actor's
    sock = listening_socket()
    stack = open_stack(
        settings,
        engine,
        None,
        api_url=f"http://127.0.0.1:{sock.getsockname()[1]}",
        profiles_path=_profiles_with_one_attempt(tmp_path, "test.copy_input"),
    )
    person = make_user(stack)
    obj = make_object(stack, person, size_bytes=5)
    stack.storage.put(f"originals/{person.pool_id}/{obj}", [b"hello"])
    [job_id] = stack.ingest.submit(
        person.caller, SubmitRequest(object_id=obj, operations=["test.copy_input"])
    ).job_ids
    profile = stack.catalog.get("test.copy_input")
    assert profile is not None and profile.max_attempts == 1
    if database == "postgresql":
        outage, code = (lambda: _postgres_down(server)), "database_unavailable"
    else:
        key = derived_key(person.pool_id, obj, profile.version, "copy")
        outage = lambda: _sqlite_locked_and_output_being_deleted(url, engine, key)  # noqa: E731
        code = "storage_unavailable"
    grants = StorageGrants(grants_engine, stack.storage, 600, stack.clock)
    execution = JobExecution(
        stack.dispatcher, stack.catalog, grants, InProcessExecutor(tmp_path / "work", PRELOAD), "w"
    )
    try:
        with ray_support.api_server(stack, sock):
            # More outages than the job has attempts (one): it was failed for good by the
            # first.
            for number in range(1, profile.max_attempts + 2):
                [job] = stack.dispatcher.claim_and_start("images", "w")
                assert job.job_id == job_id
                began = time.time()
                with _for_a_while(outage):
                    outcome = execution.run_started(job)
                assert outcome == Outcome(job_id, "released", code), outcome
                # The hand back waited for the record (PostgreSQL down, SQLite locked).
                assert time.time() - began >= OUTAGE_SECONDS - 0.2
                assert _job(engine, job_id) == ("retry_wait", 0)
                # The wait, counted from the hand back: its attempt's end, written with it.
                # Not from the wall clock here: a loaded machine takes seconds more to get
                # the record to take the hand back (once 66.7 s for a wait of 60).
                with snapshot(engine) as conn:
                    run_after = conn.execute(
                        select(t.jobs.c.run_after).where(t.jobs.c.job_id == job_id)
                    ).scalar_one()
                    handed_back = conn.execute(
                        select(t.attempts.c.finished_at)
                        .where(t.attempts.c.job_id == job_id)
                        .order_by(t.attempts.c.attempt_id.desc())
                        .limit(1)
                    ).scalar_one()
                waited = run_after.timestamp() - handed_back.timestamp()
                assert waited == pytest.approx(OUTAGE_BACKOFF.delay(number), abs=0.001)
                _due_now(stack, job_id)
            # The platform back: the job runs once more, its first counted attempt.
            [job] = stack.dispatcher.claim_and_start("images", "w")
            done = execution.run_started(job)
            assert isinstance(done, Completion), done
            assert stack.dispatcher.complete_many("w", [done.finished()], []) == [True]
    finally:
        execution.close()
        stack.close()
        grants_engine.dispose()
        engine.dispose()
    assert _job(engine, job_id) == ("completed", 1)
    with snapshot(engine) as conn:
        attempts = conn.execute(
            select(t.attempts.c.status, t.attempts.c.error_code)
            .where(t.attempts.c.job_id == job_id)
            .order_by(t.attempts.c.attempt_number)
        ).all()
    assert [tuple(a) for a in attempts] == [("released", code)] * (profile.max_attempts + 1) + [
        ("completed", None)
    ]
    assert profile.max_attempts + 1 < OUTAGE_HANDBACKS


def test_a_job_rides_out_so_many_outages_then_they_count(engine, settings, tmp_path):
    """The bound: a job that meets the platform's outage at every attempt (one that alone
    meets it: its output's earlier blob never done being deleted; a platform broken for
    good) is handed back OUTAGE_HANDBACKS times, the waits growing to OUTAGE_BACKOFF's
    longest; then each counts as a failed attempt, and it ends failed: no loop for ever."""
    stack = open_stack(settings, engine, None, profiles_path=ray_support.test_profiles(tmp_path))
    person = make_user(stack)
    obj = make_object(stack, person)
    [job_id] = stack.ingest.submit(
        person.caller, SubmitRequest(object_id=obj, operations=["test.copy_input"])
    ).job_ids
    max_attempts = stack.catalog.get("test.copy_input").max_attempts
    answers: list[tuple[str | None, bool]] = []
    waits: list[int | None] = []
    for _ in range(OUTAGE_HANDBACKS + max_attempts + 1):
        [job] = stack.dispatcher.claim_and_start("images", "w")
        now = time.time()
        status, counted = stack.dispatcher.fail_for_outage(
            job, "w", "storage_unavailable", "being deleted"
        )
        answers.append((None if status is None else status.value, counted))
        with snapshot(engine) as conn:
            run_after = conn.execute(
                select(t.jobs.c.run_after).where(t.jobs.c.job_id == job_id)
            ).scalar_one()
        waits.append(None if run_after is None else round(run_after.timestamp() - now))
        if status is None or status.value == "failed":
            break
        _due_now(stack, job_id)
    stack.close()
    assert answers == [("retry_wait", False)] * OUTAGE_HANDBACKS + [("retry_wait", True)] * (
        max_attempts - 1
    ) + [("failed", True)]
    assert waits[:OUTAGE_HANDBACKS] == [15, 30, 60, 120, 240, 300, 300, 300, 300, 300]
    assert _job(engine, job_id) == ("failed", max_attempts)


def _profiles_without_input(directory, operation: str):
    """The test profiles, with ``operation`` reading no input (so no storage needed)."""
    path = ray_support.test_profiles(directory)
    header = f'[profiles."{operation}"]\n'
    text = path.read_text()
    assert header in text
    path.write_text(text.replace(header, header + "params = { needs_input = false }\n"))
    return path


@pytest.mark.parametrize("how", ["drain", "spot notice"])
def test_a_hand_back_while_the_record_is_down_waits_for_it(
    private_postgres, settings, tmp_path, how
):
    """A loop took two jobs: the first runs (a child sleeping 120 s), the second waits
    behind it, ``claimed``. The record goes down and the worker drains (a spot notice):
    the first's child is killed and both are handed back, the record refusing. Each
    hand back is tried again until the record answers (within the drain's deadline):
    both jobs back in their queue, no attempt spent. They were left ``processing`` /
    ``claimed`` until their leases ran out, whose expiry counted the attempt."""
    from hypermedia.sandbox.executor import ChildExecutor
    from hypermedia.worker.spot import SpotNotice
    from tests.worker_support import loop_worker

    engine = make_engine(private_postgres.url)
    stack = open_stack(
        settings, engine, None, profiles_path=_profiles_without_input(tmp_path, "test.sleep")
    )
    person = make_user(stack)
    obj = make_object(stack, person)
    requests = [
        SubmitRequest(
            object_id=obj, operations=["test.sleep"], params={"test.sleep": {"seconds": 120}}
        )
        for _ in range(2)
    ]
    job_ids = [r.job_ids[0] for r in stack.ingest.submit_many(person.caller, requests)]
    executor = ChildExecutor(tmp_path / "work", preload=PRELOAD, hidden_paths=(tmp_path,))
    worker = loop_worker(stack, tmp_path / "work", "handing-w", prefetch=2, executor=executor)
    handed_back: list[str] = []
    try:
        worker.start()
        deadline = time.monotonic() + 60
        while not any(executor.child_pid(j) is not None for j in job_ids):
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.05)
        first = next(j for j in job_ids if executor.child_pid(j) is not None)
        while _job(engine, first)[0] != "processing":  # its start written
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.05)
        began = time.time()
        with _for_a_while(lambda: _postgres_down(private_postgres)):
            handed_back = (
                worker.drain(timeout=0)
                if how == "drain"
                else worker.interrupt(
                    SpotNotice("aws", "terminate", time.time() + 120, time.time())
                )
            )
        took = time.time() - began
    finally:
        worker.stop()
        executor.close()
    try:
        assert [_job(engine, j) for j in job_ids] == [("queued", 0)] * 2
        assert sorted(handed_back) == sorted(job_ids)
        assert worker.stats.released == 2
        # The hand backs waited for the record.
        assert took >= OUTAGE_SECONDS - 0.2
        with snapshot(engine) as conn:
            attempts = conn.execute(
                select(t.attempts.c.status, t.attempts.c.error_code).where(
                    t.attempts.c.job_id == first
                )
            ).all()
        code = None if how == "drain" else "spot_interrupted"
        assert [tuple(a) for a in attempts] == [("released", code)]
    finally:
        stack.close()
        engine.dispose()


class _Logged(logging.Handler):
    """Calls ``then`` (once) in the thread that logs a warning of the worker's holding
    ``words``: what the record does at that very moment."""

    def __init__(self, words: str, then: Callable[[], object] = lambda: None) -> None:
        super().__init__(logging.WARNING)
        self.words = words
        self.then = then
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.words in record.getMessage() and not self.seen.is_set():
            self.seen.set()
            self.then()


@contextmanager
def _logged(words: str, then: Callable[[], object] = lambda: None) -> Iterator[_Logged]:
    handler = _Logged(words, then)
    logger = logging.getLogger("hypermedia.worker")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def _in_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """``call`` run in a thread of its own; what it answered or raised, once it ends."""
    result: list[object] = []

    def run() -> None:
        try:
            result.append(call())
        except Exception as exc:
            result.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def _attempts(engine: Engine, job_id: str) -> list[tuple[str, str | None]]:
    with snapshot(engine) as conn:
        rows = conn.execute(
            select(t.attempts.c.status, t.attempts.c.error_code)
            .where(t.attempts.c.job_id == job_id)
            .order_by(t.attempts.c.attempt_number)
        ).all()
    return [(row.status, row.error_code) for row in rows]


def _sleep_job(server: PrivatePostgres, settings, tmp_path, seconds: float):
    engine = make_engine(server.url)
    stack = open_stack(
        settings, engine, None, profiles_path=_profiles_without_input(tmp_path, "test.sleep")
    )
    person = make_user(stack)
    request = SubmitRequest(
        object_id=make_object(stack, person),
        operations=["test.sleep"],
        params={"test.sleep": {"seconds": seconds}},
    )
    [job_id] = stack.ingest.submit(person.caller, request).job_ids
    return engine, stack, person, job_id


@pytest.mark.parametrize("how", ["its step ran on", "its child killed"])
def test_a_cancel_the_record_refused_is_written_as_a_cancel(
    private_postgres, settings, tmp_path, how
):
    """A job its user cancelled while its step ran ends cancelled, the record down just
    then. A step that ran on (here one in process, which no kill reaches): the cancel's
    write went to the outage's hand back, the attempt closed ``failed`` with
    database_unavailable (and the worker paused its claims for it); a child killed for
    the cancel: tried once, DatabaseUnavailable out of the run, the job left
    ``processing`` until its lease ran out. The cancel is tried again until the record
    takes it, as a cancel."""
    from hypermedia.sandbox.executor import ChildExecutor

    seconds = 2 if how == "its step ran on" else 120
    engine, stack, person, job_id = _sleep_job(private_postgres, settings, tmp_path, seconds)
    work = tmp_path / "work"
    if how == "its step ran on":
        executor: Any = InProcessExecutor(work, PRELOAD)
        poll = 0.05
    else:
        executor = ChildExecutor(work, preload=PRELOAD, hidden_paths=(tmp_path,))
        poll = 3600.0  # the test kills the child, as the watcher would
    execution = JobExecution(
        stack.dispatcher, stack.catalog, NoGrants(), executor, "w", poll_seconds=poll
    )
    try:
        [job] = stack.dispatcher.claim_and_start("images", "w")
        runner, outcome = _in_thread(lambda: execution.run_started(job))
        stack.ingest.cancel(person.caller, job_id)
        deadline = time.monotonic() + 30
        if how == "its step ran on":
            while not execution._running[job_id].cancelled.is_set():  # the watcher saw it
                assert time.monotonic() < deadline, "timed out"
                time.sleep(0.02)
        else:
            while executor.child_pid(job_id) is None:
                assert time.monotonic() < deadline, "timed out"
                time.sleep(0.02)
        with _logged("retrying in") as retried, _postgres_down(private_postgres):
            if how == "its child killed":
                executor.cancel(job_id)
            # The step ended, the record refused its end: tried again, or given up.
            while not retried.seen.is_set() and runner.is_alive():
                assert time.monotonic() < deadline + 30, "timed out"
                time.sleep(0.02)
        runner.join(60)
        assert outcome == [Outcome(job_id, "cancelled")], outcome
        assert _job(engine, job_id) == ("cancelled", 1)
        assert _attempts(engine, job_id) == [("cancelled", None)]
    finally:
        execution.close()
        if how == "its child killed":
            executor.close()
        stack.close()
        engine.dispose()


def _in_process(stack, tmp_path) -> JobExecution:
    """An execution running its steps in this process, granting no storage URLs."""
    return JobExecution(
        stack.dispatcher,
        stack.catalog,
        NoGrants(),
        InProcessExecutor(tmp_path / "work", PRELOAD),
        "w",
    )


def test_a_hand_back_given_up_is_not_made_an_outages(private_postgres, settings, tmp_path):
    """A drain's hand back the record refused until the drain's deadline is given up:
    the job is left to its lease. It went on to the outage's hand back, which the record,
    back just then, took: one of the job's OUTAGE_HANDBACKS spent, the job waiting 15 s
    in retry_wait, for an outage of the worker's own drain."""
    engine, stack, _person, job_id = _sleep_job(private_postgres, settings, tmp_path, 60)
    execution = _in_process(stack, tmp_path)
    try:
        [job] = stack.dispatcher.claim_and_start("images", "w")
        private_postgres.stop()
        # The drain's deadline passes while the record is down; it is back the moment
        # the hand back is given up.
        execution.release_all(hand_back_by=time.monotonic() + 1.0)
        with _logged("left to its lease", private_postgres.start) as given_up:
            outcome = execution.run_started(job)
        assert given_up.seen.is_set()
        assert outcome == Outcome(job_id, "lost"), outcome
        assert _job(engine, job_id) == ("processing", 1)  # its lease will hand it back
        assert _attempts(engine, job_id) == [("running", None)]
    finally:
        execution.close()
        stack.close()
        engine.dispose()


_CRASH_PROFILE = """
[profiles."test.crash"]
queue = "images"
version = 1
base_cost = 0.0
cost_per_mb = 0.0
timeout_seconds = 30
memory_limit_mb = 512
max_input_bytes = 1024
max_attempts = 2
default_priority = 5
params = { needs_input = false }
"""


class _NoInputThere(NoGrants):
    """An input URL where nothing listens: the download fails (transfer_unavailable)."""

    def input_url(self, job_id: str, worker_id: str) -> str:
        sock = listening_socket()
        port = sock.getsockname()[1]
        sock.close()
        return f"http://127.0.0.1:{port}/{job_id}"


@pytest.mark.parametrize("how", ["its step", "its input's download"])
def test_a_jobs_own_failure_waits_for_the_record(private_postgres, settings, tmp_path, how):
    """A job's own failure (its step crashed, its input could not be had) while the
    record was down was tried once: DatabaseUnavailable out of the run, the job left
    ``processing`` until its lease ran out, its error code and message and its child's
    last lines lost (the lease's expiry said lease_expired). It is tried again until
    the record takes it, with all of them."""
    from hypermedia.sandbox.executor import ChildExecutor

    engine = make_engine(private_postgres.url)
    profiles = ray_support.test_profiles(tmp_path)
    profiles.write_text(profiles.read_text() + _CRASH_PROFILE)
    stack = open_stack(settings, engine, None, profiles_path=profiles)
    person = make_user(stack)
    obj = make_object(stack, person)
    if how == "its step":
        operation, params = "test.crash", {"how": "raise", "lines": 2}
        code, retryable = "pipeline_crashed", False
        executor: Any = ChildExecutor(tmp_path / "work", preload=PRELOAD, hidden_paths=(tmp_path,))
        grants: NoGrants = NoGrants()
    else:
        operation, params = "test.copy_input", {}
        code, retryable = "transfer_unavailable", True
        executor = InProcessExecutor(tmp_path / "work", PRELOAD)
        grants = _NoInputThere()
    [job_id] = stack.ingest.submit(
        person.caller,
        SubmitRequest(object_id=obj, operations=[operation], params={operation: params}),
    ).job_ids
    execution = JobExecution(stack.dispatcher, stack.catalog, grants, executor, "w")
    try:
        [job] = stack.dispatcher.claim_and_start("images", "w")
        with _logged("retrying in") as retried, _postgres_down(private_postgres):
            runner, outcome = _in_thread(lambda: execution.run_started(job))
            deadline = time.monotonic() + 60
            while not retried.seen.is_set() and runner.is_alive():
                assert time.monotonic() < deadline, "timed out"
                time.sleep(0.02)
        runner.join(60)
        status = "retry_wait" if retryable else "failed"
        assert outcome == [Outcome(job_id, status, code)], outcome
        with snapshot(engine) as conn:
            row = conn.execute(
                select(t.jobs.c.status, t.jobs.c.error_code).where(t.jobs.c.job_id == job_id)
            ).one()
            attempt = conn.execute(
                select(t.attempts.c.status, t.attempts.c.error_code, t.attempts.c.log_tail).where(
                    t.attempts.c.job_id == job_id
                )
            ).one()
        assert tuple(row) == (status, code)
        assert (attempt.status, attempt.error_code) == ("failed", code)
        if how == "its step":
            assert "line 1 of" in (attempt.log_tail or ""), attempt.log_tail
    finally:
        execution.close()
        if how == "its step":
            executor.close()
        stack.close()
        engine.dispose()


def test_a_jobs_failure_is_tried_no_longer_than_its_lease(private_postgres, settings, tmp_path):
    """Past its lease the job is the lease's (its expiry, once the record is back, ends
    the attempt): the failure's write is given up then, the loop free again."""
    from dataclasses import replace

    engine = make_engine(private_postgres.url)
    profiles = ray_support.test_profiles(tmp_path)
    profiles.write_text(profiles.read_text() + _CRASH_PROFILE)
    stack = open_stack(settings, engine, None, profiles_path=profiles)
    person = make_user(stack)
    [job_id] = stack.ingest.submit(
        person.caller,
        SubmitRequest(object_id=make_object(stack, person), operations=["test.crash"]),
    ).job_ids
    execution = _in_process(stack, tmp_path)
    try:
        [job] = stack.dispatcher.claim_and_start("images", "w")
        with _postgres_down(private_postgres):
            job = replace(job, deadline=time.time() + 1.0)  # its lease all but spent
            began = time.monotonic()
            outcome = execution.run_started(job)
            took = time.monotonic() - began
        assert outcome == Outcome(job_id, "lost", "pipeline_crashed"), outcome
        assert 0.8 <= took < 10, took
        assert _job(engine, job_id) == ("processing", 1)
    finally:
        execution.close()
        stack.close()
        engine.dispose()


@pytest.mark.parametrize("until", ["its lease ran out", "the drain's deadline"])
def test_an_outages_hand_back_is_tried_no_longer_than_a_jobs_own_failure(
    private_postgres, settings, tmp_path, until
):
    """The record down as the worker asks for the job's input URL: the outage's hand
    back waits for it, like a job's own failure, but it was not given up at the end of
    the job's lease (tried on while the record stayed down, its expiry then also
    counting the attempt: a write past the job's lease), and given up at the drain's
    deadline it raised DatabaseUnavailable out of the run. Now, as a failure: given
    up at whichever comes first, answered lost with the outage's code (the worker
    pauses its claims for it), the job left to its lease."""
    from dataclasses import replace

    engine = make_engine(private_postgres.url)
    stack = open_stack(settings, engine, None, profiles_path=ray_support.test_profiles(tmp_path))
    person = make_user(stack)
    obj = make_object(stack, person, size_bytes=5)
    [job_id] = stack.ingest.submit(
        person.caller, SubmitRequest(object_id=obj, operations=["test.copy_input"])
    ).job_ids
    grants = StorageGrants(engine, stack.storage, 600, stack.clock)
    execution = JobExecution(
        stack.dispatcher, stack.catalog, grants, InProcessExecutor(tmp_path / "work", PRELOAD), "w"
    )
    try:
        [job] = stack.dispatcher.claim_and_start("images", "w")
        with _postgres_down(private_postgres):
            if until == "its lease ran out":
                job = replace(job, deadline=time.time() + 1.0)  # its lease all but spent
            else:
                execution.release_all(hand_back_by=time.monotonic() + 1.0)
            runner, outcome = _in_thread(lambda: execution.run_started(job))
            runner.join(30)  # the record down all along (else it takes the hand back)
        runner.join(60)
        assert outcome == [Outcome(job_id, "lost", "database_unavailable")], outcome
        assert _job(engine, job_id) == ("processing", 1)  # its lease will hand it back
        assert _attempts(engine, job_id) == [("running", None)]
    finally:
        execution.close()
        stack.close()
        engine.dispose()


@pytest.mark.parametrize("how", ["drain", "spot notice"])
def test_a_worker_answers_only_the_jobs_it_handed_back(private_postgres, settings, tmp_path, how):
    """drain() and interrupt() answer the jobs handed back (the supervisor logs their
    count): they answered every job running when release_all began, handed back or
    not. A drain whose job's step ended on its own just then (it completed) and a
    spot notice whose hand back the record refused until the notice's deadline (the
    job left to its lease) answered that job; they answer none."""
    from hypermedia.sandbox.executor import ChildExecutor
    from hypermedia.worker.spot import SpotNotice
    from tests.worker_support import loop_worker

    seconds = 1 if how == "drain" else 120
    engine, stack, _person, job_id = _sleep_job(private_postgres, settings, tmp_path, seconds)
    work = tmp_path / "work"
    if how == "drain":  # a step no kill reaches: it ends when it ends
        executor: Any = InProcessExecutor(work, PRELOAD)
    else:
        executor = ChildExecutor(work, preload=PRELOAD, hidden_paths=(tmp_path,))
    worker = loop_worker(stack, work, "answering-w", executor=executor)
    try:
        worker.start()
        deadline = time.monotonic() + 60
        # Its step begun (test.sleep writes pids.txt first), its child there.
        while not (
            (work / "jobs" / job_id / "pids.txt").exists()
            if how == "drain"
            else executor.child_pid(job_id) is not None
        ):
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.02)
        if how == "drain":
            handed_back = worker.drain(timeout=0)
            expected = ("completed", 1)
        else:
            # Hand backs tried until 5 s from now (the least a notice gets); the record
            # is down until after that.
            with _postgres_down(private_postgres):
                notice = SpotNotice("aws", "terminate", time.time() + 1, time.time())
                handed_back = worker.interrupt(notice)
            expected = ("processing", 1)  # left to its lease
    finally:
        worker.stop()
        if how == "spot notice":
            executor.close()
    try:
        assert handed_back == []
        assert _job(engine, job_id) == expected
        assert worker.stats.released == 0
    finally:
        stack.close()
        engine.dispose()


@pytest.mark.parametrize("how", ["drain", "spot notice"])
def test_a_stopping_workers_row_says_so_once_the_record_is_back(
    private_postgres, settings, tmp_path, how
):
    """A worker stopping while the record is down (here an idle one) tried its row's
    status once (draining, then stopped or spot_interrupted): the row said ``active``
    after it had stopped, until the stale-worker sweep called it dead; the scheduler
    counted it as capacity meanwhile. The status is tried again within the drain's
    (the notice's) deadline."""
    from hypermedia.worker.spot import SpotNotice
    from tests.worker_support import loop_worker

    engine = make_engine(private_postgres.url)
    stack = open_stack(settings, engine, None, profiles_path=ray_support.test_profiles(tmp_path))
    worker = loop_worker(stack, tmp_path / "work", "stopping-w")
    try:
        worker.start()
        with _for_a_while(lambda: _postgres_down(private_postgres)):
            if how == "drain":
                worker.drain(timeout=0)
            else:
                worker.interrupt(SpotNotice("aws", "terminate", time.time() + 120, time.time()))
    finally:
        worker.stop()
    try:
        with snapshot(engine) as conn:
            row = conn.execute(
                select(t.workers.c.status, t.workers.c.stopped_at).where(
                    t.workers.c.worker_id == "stopping-w"
                )
            ).one()
        assert row.status == ("stopped" if how == "drain" else "spot_interrupted"), row
        assert row.stopped_at is not None
    finally:
        stack.close()
        engine.dispose()


def test_an_idle_workers_drain_is_not_held_by_its_rows_status(private_postgres, settings, tmp_path):
    """With the record down, an idle worker's drain(timeout=20) tried its row's status
    "draining" until the timeout and then "stopped" until 30 s past it: 50 s, past the
    supervisor's bound for an actor that does not answer (drain timeout + 30 s; 0.4 s
    before the statuses were retried). "draining" is tried while the loops run, the
    final status FINAL_STATUS_SECONDS past their end."""
    from tests.worker_support import loop_worker

    engine = make_engine(private_postgres.url)
    stack = open_stack(settings, engine, None, profiles_path=ray_support.test_profiles(tmp_path))
    worker = loop_worker(stack, tmp_path / "work", "idle-w")
    try:
        worker.start()
        with _postgres_down(private_postgres):
            began = time.monotonic()
            assert worker.drain(timeout=20) == []
            took = time.monotonic() - began
        assert took < 15, took  # FINAL_STATUS_SECONDS (10) and the loops' end
    finally:
        worker.stop()
        stack.close()
        engine.dispose()


def test_the_upkeeps_hand_back_ends_its_wait_when_the_worker_stops(
    private_postgres, settings, tmp_path
):
    """The upkeep hands back a job taken ahead that waited too long; during a drain a
    hand back the record refuses is tried again until the drain's deadline. Its waits
    (up to 5 s each) were in time.sleep, deaf to the worker stopping: the upkeep went on
    past stop() (whose join of it gave up after 10 s) to the deadline, writing while the
    worker wrote its final status. They end when the worker stops."""
    from tests.worker_support import loop_worker

    engine, stack, _person, job_id = _sleep_job(private_postgres, settings, tmp_path, 60)
    worker = loop_worker(stack, tmp_path / "work", "upkeep-w", queue="bulk", prefetch=2)
    stopping: threading.Thread | None = None
    try:
        worker.start()
        [job] = stack.dispatcher.claim_ahead("images", "upkeep-w", 1)
        with _logged("could not hand it back") as retried:
            private_postgres.stop()
            worker._hand_back_by = time.monotonic() + 60  # as a drain sets it
            held = worker._held[0]
            with held.lock:  # taken ahead by the loop, waiting since long ago
                held.jobs.append(job)
                held.since = 0.0
            assert retried.seen.wait(30)  # the upkeep tries it again
        assert worker._upkeep is not None
        time.sleep(3)  # its waits grow past a second
        began = time.monotonic()
        stopping, _ = _in_thread(worker.stop)
        worker._upkeep.join(8)
        assert not worker._upkeep.is_alive(), "the upkeep still waits for the record"
        assert time.monotonic() - began < 5
    finally:
        private_postgres.start()
        if stopping is not None:
            stopping.join(60)
        worker.stop()
    try:
        assert _job(engine, job_id) == ("processing", 1)  # left to its lease
    finally:
        stack.close()
        engine.dispose()
