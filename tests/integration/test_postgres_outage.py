"""A PostgreSQL outage under a running worker (a private server, stopped as a crash
would stop it): a claim the record cannot take hands its Redis lease straight back,
a completion that cannot be written waits for the database, and once it is back
every job completes once, without waiting for a lease to run out."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import func, select

from hypermedia.db import tables as t
from hypermedia.db.engine import make_engine, transaction
from hypermedia.ingest.service import SubmitRequest
from tests import ray_support
from tests.factories import make_object, make_user, open_stack, submit
from tests.support import PrivatePostgres
from tests.worker_support import loop_worker

OUTAGE_SECONDS = 20  # longer than the old completion retries (8 tries, about 16 s)


def _sleep_without_input(directory: Path) -> Path:
    path = ray_support.test_profiles(directory)
    header = '[profiles."test.sleep"]\n'
    text = path.read_text()
    assert header in text
    path.write_text(text.replace(header, header + "params = { needs_input = false }\n"))
    return path


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_postgres_outage_strands_no_lease_and_loses_no_completion(
    private_postgres: PrivatePostgres, settings, tmp_path
):
    engine = make_engine(private_postgres.url)
    stack = open_stack(settings, engine, None, profiles_path=_sleep_without_input(tmp_path))
    lease = stack.dispatcher.queue_lease_seconds("images")
    assert lease >= 90  # "promptly" below means long before any lease runs out
    person = make_user(stack)
    obj = make_object(stack, person)

    def submit(seconds: float, count: int, priority: int) -> list[str]:
        requests = [
            SubmitRequest(
                object_id=obj,
                operations=["test.sleep"],
                params={"test.sleep": {"seconds": seconds}},
                priority=priority,
            )
            for _ in range(count)
        ]
        return [r.job_ids[0] for r in stack.ingest.submit_many(person.caller, requests)]

    running = submit(3, 1, 1)[0]
    worker = loop_worker(stack, tmp_path / "work", "pg-w")
    execution = worker.execution
    worker.start()
    try:
        _wait(lambda: execution.running() == [running], 30, "the first job to run")
        # Queued behind it, in two priorities: they must come back in this order.
        waiting = submit(0, 10, 7) + submit(0, 10, 3)
        expected_order = waiting[10:] + waiting[:10]
        assert stack.queue.ready_ids("images") == expected_order

        private_postgres.stop()
        # The running job finishes while the database is down (its completion must
        # wait), and the idle loop keeps trying to claim.
        time.sleep(OUTAGE_SECONDS)
        assert worker.stats.errors >= 3, "the claim loop never met the outage"
        members = stack.queue.members("images")
        leased = sorted(job for job, where in members.items() if where == "leased")
        assert leased == [running]  # only the job whose completion waits holds a lease
        assert stack.queue.ready_ids("images") == expected_order

        private_postgres.start()
        everything = [running, *waiting]
        _wait(
            lambda: worker.stats.completed == len(everything),
            lease / 3,
            "every job to complete after the outage",
        )
    finally:
        worker.stop()
    assert worker.stats.lost == 0
    with transaction(stack.engine) as conn:
        statuses: dict[str, int] = dict(
            conn.execute(select(t.jobs.c.status, func.count()).group_by(t.jobs.c.status)).all()
        )
        attempts = conn.execute(
            select(t.attempts.c.job_id, t.attempts.c.status).order_by(t.attempts.c.job_id)
        ).all()
    assert statuses == {"completed": len(everything)}
    assert sorted(tuple(a) for a in attempts) == sorted((j, "completed") for j in everything)
    assert stack.queue.counts("images").leased == 0
    stack.close()
    engine.dispose()


def test_an_idle_connection_is_tried_before_use_a_busy_one_is_not(
    private_postgres: PrivatePostgres, monkeypatch
):
    """The pool tries a connection (a round trip) only when it has sat idle
    PING_AFTER_IDLE_SECONDS or its socket has something to read: after a restart, an
    idle one is found closed and replaced unseen, and so is one in steady use (the
    server closed it); one in steady use is otherwise not tried (no round trip more a
    transaction)."""
    from sqlalchemy import text

    from hypermedia.db import engine as engines

    def counted(engine) -> list[bool]:
        """Each round trip the pool spends trying a connection (what pool_pre_ping
        would spend on every checkout)."""
        calls: list[bool] = []
        ping = engine.dialect.do_ping

        def do_ping(dbapi_conn) -> bool:
            try:
                calls.append(ping(dbapi_conn))
            except Exception:
                calls.append(False)
                raise
            return True

        engine.dialect.do_ping = do_ping
        return calls

    def backend_pid(engine) -> int:
        with transaction(engine) as conn:
            return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())

    monkeypatch.setattr(engines, "PING_AFTER_IDLE_SECONDS", 0.5)
    busy = make_engine(private_postgres.url, pool_size=1, max_overflow=0)
    idle = make_engine(private_postgres.url, pool_size=1, max_overflow=0)
    try:
        busy_pings, idle_pings = counted(busy), counted(idle)
        first = backend_pid(busy)
        assert backend_pid(busy) == first and backend_pid(idle)
        assert busy_pings == [] and idle_pings == []  # back to back: never tried

        private_postgres.stop()
        private_postgres.start()
        time.sleep(0.6)  # the idle engine's connection has now sat idle long enough
        assert backend_pid(idle)  # tried, found closed, replaced: no error
        assert idle_pings == [False]

        # The busy one, not idle long enough, is tried only because its socket says
        # the server closed it: replaced before use, its transaction goes through.
        monkeypatch.setattr(engines, "PING_AFTER_IDLE_SECONDS", 3600.0)
        assert busy_pings == []
        second = backend_pid(busy)
        assert second != first
        assert busy_pings == [False]
        for _ in range(3):  # in steady use again: never tried
            assert backend_pid(busy) == second
        assert busy_pings == [False]
    finally:
        busy.dispose()
        idle.dispose()


def test_the_workers_row_says_its_outage_pause_once_the_record_is_back(
    private_postgres: PrivatePostgres, settings, tmp_path
):
    """A claim the record refuses pauses the worker's claims (the loop backs off);
    that was said only in the worker's log, and its row (what ``hypermedia status`` and
    the operator page read) showed a worker claiming all along. Now the worker keeps the
    pause, why and since when, and writes it as soon as the record takes it again, with
    its length once a claim goes through."""
    from rich.console import Console

    from autoscaler import config as scheduler_config
    from autoscaler.page.routes import render, templates
    from autoscaler.status import gather
    from hypermedia.cli.status import render as render_status

    engine = make_engine(private_postgres.url)
    stack = open_stack(settings, engine, None, profiles_path=_sleep_without_input(tmp_path))
    person = make_user(stack)
    obj = make_object(stack, person)

    def submit(seconds: float, count: int) -> list[str]:
        requests = [
            SubmitRequest(
                object_id=obj,
                operations=["test.sleep"],
                params={"test.sleep": {"seconds": seconds}},
            )
            for _ in range(count)
        ]
        return [r.job_ids[0] for r in stack.ingest.submit_many(person.caller, requests)]

    running = submit(2, 1)[0]
    worker = loop_worker(stack, tmp_path / "work", "pg-p", heartbeat_seconds=1.0)
    execution = worker.execution
    worker.start()

    def row():
        w = t.workers.c
        with transaction(stack.engine) as conn:
            return conn.execute(
                select(
                    w.outage_paused_since, w.outage_paused_reason, w.outage_paused_seconds
                ).where(w.worker_id == "pg-p")
            ).one()

    try:
        _wait(lambda: execution.running() == [running], 30, "the first job to run")
        waiting = submit(0, 3)
        assert row() == (None, None, None)
        stopped_at = time.time()
        private_postgres.stop()
        _wait(lambda: worker.outage_pause is not None, 30, "the claim loop to meet the outage")
        pause = worker.outage_pause
        assert pause is not None and pause.seconds is None
        assert pause.reason.startswith("database_unavailable: ")
        assert stopped_at <= pause.since <= time.time()
        time.sleep(6)
        private_postgres.start()
        started_at = time.time()
        _wait(
            lambda: worker.stats.completed == 1 + len(waiting),
            60,
            "every job to complete after the outage",
        )
        _wait(lambda: row()[2] is not None, 10, "the row to say how long the pause lasted")
        since, reason, seconds = row()
        assert since.timestamp() == pytest.approx(pause.since, abs=0.01)
        assert reason == pause.reason
        assert started_at - pause.since - 1 <= seconds <= time.time() - pause.since
        assert worker.outage_pause is not None and worker.outage_pause.seconds == seconds

        (shown,) = gather(stack, scheduler_config.load(None)).workers
        assert (shown.outage_paused, shown.outage_pause_over) == (reason, True)
        assert shown.outage_paused_seconds == seconds
        note = shown.outage_note
        assert note is not None and note.startswith(f"paused {int(seconds)}s by an outage ")
        assert note.endswith(f" ago: {reason}")
        console = Console(width=400, record=True)
        console.print(render_status(gather(stack, scheduler_config.load(None))))
        assert f"paused {int(seconds)}s by an outage" in console.export_text()
        page = render(
            templates().get_template("operator.html"), stack, scheduler_config.load(None), 1
        )
        assert f"paused {int(seconds)}s by an outage" in page
    finally:
        worker.stop()
        stack.close()
        engine.dispose()


@pytest.mark.parametrize(
    ("down", "code"), [("database", "database_unavailable"), ("redis", "queue_unavailable")]
)
def test_an_idle_workers_row_says_its_outage_pause_too(
    private_postgres: PrivatePostgres, private_redis, settings, tmp_path, down, code
):
    """A worker with nothing to claim when the record or Redis went down for 6 s: its
    row says the pause (since, why, how long) once the record takes it again, as a
    claiming worker's does."""
    engine = make_engine(private_postgres.url)
    stack = open_stack(
        settings,
        engine,
        None,
        redis_url=private_redis.url,
        profiles_path=_sleep_without_input(tmp_path),
    )
    worker = loop_worker(stack, tmp_path / "work", "idle-w", heartbeat_seconds=1.0)

    def row():
        w = t.workers.c
        with transaction(stack.engine) as conn:
            return conn.execute(
                select(
                    w.outage_paused_since, w.outage_paused_reason, w.outage_paused_seconds
                ).where(w.worker_id == "idle-w")
            ).one()

    service = private_postgres if down == "database" else private_redis
    worker.start()
    try:
        time.sleep(2)  # idle: a few empty claims and heartbeats
        assert row() == (None, None, None) and worker.stats.claimed == 0
        stopped_at = time.time()
        service.stop()
        time.sleep(6)
        service.start()
        started_at = time.time()
        _wait(lambda: row()[2] is not None, 20, "the row to say how long the pause lasted")
        since, reason, seconds = row()
        assert stopped_at <= since.timestamp() <= started_at
        assert reason.startswith(f"{code}: ")
        assert 0 < seconds <= time.time() - since.timestamp()
        assert worker.stats.claimed == 0
    finally:
        worker.stop()
        stack.close()
        engine.dispose()


def test_the_first_grant_after_a_restart_of_the_database_is_granted(
    private_postgres: PrivatePostgres, settings, monkeypatch
):
    """The grants actor's pooled connection, used a moment before PostgreSQL restarted,
    is dropped by the restart: the pool replaces it before the grant uses it instead of
    the grant failing the job's attempt (database_unavailable, its backoff, the worker paused)
    while the database is up. Down, a grant still fails."""
    from hypermedia.db import engine as engines
    from hypermedia.errors import DatabaseUnavailable
    from hypermedia.storage.grants import StorageGrants

    # Within the idle time a pooled connection is used untried, whatever the machine's
    # speed (a slow restart would otherwise outlast it, and the pool try it first).
    monkeypatch.setattr(engines, "PING_AFTER_IDLE_SECONDS", 3600.0)
    engine = make_engine(private_postgres.url)
    stack = open_stack(settings, engine, None)
    grants_engine = make_engine(private_postgres.url)  # the actor's own pool
    try:
        person = make_user(stack)
        [job_id] = submit(stack, person, ["thumbnail"])
        [claimed] = stack.dispatcher.claim("images", "w-1")
        assert claimed.job_id == job_id
        grants = StorageGrants(grants_engine, stack.storage, 600, stack.clock)
        assert grants.input_url(job_id, "w-1")

        private_postgres.stop()
        with pytest.raises(DatabaseUnavailable):
            grants.input_url(job_id, "w-1")
        private_postgres.start()
        assert grants.input_url(job_id, "w-1")

        grants.input_url(job_id, "w-1")  # a connection in use again, then a restart
        private_postgres.stop()
        private_postgres.start()
        assert set(grants.output_urls(job_id, "w-1", ["thumbnail.webp"])) == {"thumbnail.webp"}
    finally:
        grants_engine.dispose()
        stack.close()
        engine.dispose()


def test_the_first_transactions_after_a_restart_of_the_database_go_through(
    private_postgres: PrivatePostgres, settings, monkeypatch
):
    """A restart of PostgreSQL closes every pooled connection; one used within
    PING_AFTER_IDLE_SECONDS is not tried before use, and its next transaction, the
    first after the restart, failed with "server closed the connection unexpectedly"
    though the database was up: an API request answered 503, a worker's completion
    batch failed (retried with backoff, its jobs' end late), and the same for the
    head's, the callbacks sender's and the supervisor's. The pool now sees from the
    socket that the server closed the connection and replaces it before use. A
    connection that breaks in the middle of a transaction still fails it, and a
    database that is down still fails at once."""
    from fastapi.testclient import TestClient
    from sqlalchemy import text

    from hypermedia.db import engine as engines
    from hypermedia.db.engine import snapshot, statements
    from hypermedia.errors import DatabaseUnavailable
    from hypermedia.ingest.api import create_app

    # Within the idle time a pooled connection is used untried, whatever the machine's
    # speed (a slow restart would otherwise outlast it, and the pool try it first).
    monkeypatch.setattr(engines, "PING_AFTER_IDLE_SECONDS", 3600.0)
    engine = make_engine(private_postgres.url)
    stack = open_stack(settings, engine, None)
    try:
        person = make_user(stack)
        [job_id] = submit(stack, person, ["thumbnail"])
        headers = {"Authorization": f"Bearer {person.api_key}"}
        with TestClient(create_app(stack, auth_cache_seconds=0)) as api:
            assert api.get(f"/v1/hypermedia/jobs/{job_id}", headers=headers).status_code == 200

            private_postgres.stop()
            private_postgres.start()
            response = api.get(f"/v1/hypermedia/jobs/{job_id}", headers=headers)
            assert response.status_code == 200, response.text

        [claimed] = stack.dispatcher.claim_and_start("images", "w-1")
        assert claimed.job_id == job_id
        private_postgres.stop()
        private_postgres.start()
        assert stack.dispatcher.complete(claimed, "w-1") is True
        with transaction(engine) as conn:
            status = conn.execute(select(t.jobs.c.status).where(t.jobs.c.job_id == job_id))
            assert status.scalar_one() == "completed"

        # Every way into the record: a read-only snapshot, single statements.
        for opened in (snapshot, statements, transaction):
            with opened(engine) as conn:
                conn.execute(text("SELECT 1"))
            private_postgres.stop()
            private_postgres.start()
            with opened(engine) as conn:
                assert conn.execute(text("SELECT 1")).scalar_one() == 1

        def broken_midway() -> None:
            with transaction(engine) as conn:
                conn.execute(text("SELECT 1"))
                private_postgres.stop()
                private_postgres.start()
                conn.execute(text("SELECT 1"))

        # Broken in the middle of a transaction: it fails, its work is not done again.
        with pytest.raises(DatabaseUnavailable):
            broken_midway()

        private_postgres.stop()
        began = time.monotonic()
        with pytest.raises(DatabaseUnavailable), transaction(engine) as conn:
            conn.execute(text("SELECT 1"))
        assert time.monotonic() - began < 5
        private_postgres.start()
    finally:
        stack.close()
        engine.dispose()
