"""The PostgreSQL server's limits on every connection of the record
(``database_statement_seconds``, :data:`hypermedia.db.engine.STATEMENT_SECONDS`): a
statement, a lock wait and a session idle in a transaction are each bounded, and what
they cut short is the database unavailable (503 from the API, retried by the loops).

Without them a session holding processing_jobs (an operator's ``BEGIN; LOCK TABLE
processing_jobs;`` left open in psql) held every API submit, claim, completion batch and
scheduler turn for as long as it lasted, and a process of ours stopped in a transaction
held the rows it had locked for ever. Migrations go without them (an index built
concurrently takes what it takes).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text, update

from autoscaler import config as scheduler_config
from autoscaler.leader import Leadership
from autoscaler.scheduler import Scheduler
from hypermedia.clock import SystemClock
from hypermedia.config import Settings, load_settings
from hypermedia.db import MIN_STATEMENT_SECONDS, migrate
from hypermedia.db import tables as t
from hypermedia.db.engine import make_engine, statement_limits, transaction
from hypermedia.errors import ConfigError
from hypermedia.ingest.api import create_app
from hypermedia.ingest.service import SubmitRequest
from hypermedia.profiles import load_profiles
from hypermedia.stack import Stack
from hypermedia.worker.execute import Completion, Outcome
from hypermedia.worker.worker import CompletionBatcher
from tests import ray_support
from tests.factories import make_object, make_user

LIMIT_SECONDS = 3  # statement 3 s, lock wait 1 s, idle in a transaction 6 s
HOLD_SECONDS = 6.0


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


@contextmanager
def _held(url: str, statement: str, seconds: float) -> Iterator[None]:
    """Another session (an operator's psql) runs ``statement`` in a transaction it
    keeps open ``seconds`` from the block's start, whatever the block waits for."""
    holder = psycopg.connect(_libpq(url), autocommit=True)
    holder.execute("BEGIN")
    holder.execute(statement)
    letting_go = threading.Timer(seconds, holder.execute, ("ROLLBACK",))
    letting_go.start()
    try:
        yield
    finally:
        letting_go.join()
        holder.close()


def _stack(settings: Callable[..., Settings], tmp_path: Any) -> Stack:
    """A stack built as the services build theirs: its engine from the settings."""
    chosen = settings(profiles_path=str(ray_support.test_profiles(tmp_path)))
    profiled = frozenset(load_profiles(chosen.profiles_path, chosen.queue_names))
    return Stack.open(chosen, auto_migrate=True, implemented=lambda: profiled)


def _timed(work: Callable[[], str], said: dict[str, Any], name: str) -> threading.Thread:
    def run() -> None:
        began = time.monotonic()
        try:
            answer = work()
        except Exception as exc:
            answer = f"{type(exc).__name__}: {exc}"
        said[name] = (answer, round(time.monotonic() - began, 1))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_lock_another_session_holds_fails_each_hot_path_within_the_lock_wait(
    pg_database_url, settings, tmp_path, monkeypatch
):
    monkeypatch.setenv("HYPERMEDIA_DATABASE_STATEMENT_SECONDS", str(LIMIT_SECONDS))
    stack = _stack(settings, tmp_path)
    try:
        person = make_user(stack)
        obj = make_object(stack, person)
        request = SubmitRequest(object_id=obj, operations=["test.noop"])
        stack.ingest.submit_many(person.caller, [request, request])
        [done] = stack.dispatcher.claim_and_start("bulk", "limits-w")
        client = TestClient(create_app(stack, auth_cache_seconds=0), raise_server_exceptions=False)
        headers = {"Authorization": f"Bearer {person.api_key}"}
        shipped = scheduler_config.parse(json.loads(scheduler_config.SHIPPED.read_text()))
        leadership = Leadership(stack.redis, stack.settings.redis_prefix, "limits", 600)
        scheduler = Scheduler(shipped, stack.engine, stack.queue, leadership, SystemClock())
        outcomes: list[Outcome] = []
        batcher = CompletionBatcher(stack.dispatcher, "limits-w", outcomes.append)

        def submit() -> str:
            body = {"object_id": obj, "operations": ["test.noop"]}
            answer = client.post("/v1/hypermedia/process", json=body, headers=headers)
            return f"{answer.status_code} {answer.json().get('error', {}).get('code')}"

        def claim() -> str:
            return f"claimed {len(stack.dispatcher.claim_and_start('bulk', 'limits-w2'))}"

        def complete() -> str:
            batcher.add(Completion(done, [], None))
            while not outcomes:
                time.sleep(0.05)
            return outcomes[0].status

        def tick() -> str:
            scheduler.evaluate()
            return "evaluated"

        said: dict[str, Any] = {}
        began = time.monotonic()
        with _held(pg_database_url, "LOCK TABLE processing_jobs", HOLD_SECONDS):
            paths = {"submit": submit, "claim": claim, "complete": complete, "tick": tick}
            threads = [_timed(work, said, name) for name, work in paths.items()]
        for thread in threads:
            thread.join(max(0.1, HOLD_SECONDS + 10 - (time.monotonic() - began)))
        batcher.close(5)
    finally:
        stack.close()
    # Old: each waited for the lock, 6.0 s: 202, claimed 1, evaluated, completed.
    assert said["submit"][0] == "503 database_unavailable", said
    assert said["claim"][0].startswith("DatabaseUnavailable"), said
    assert "SQLSTATE 55P03" in said["claim"][0], said
    assert said["tick"][0].startswith("DatabaseUnavailable"), said
    for name in ("submit", "claim", "tick"):
        assert said[name][1] < HOLD_SECONDS - 2, said
    # The completion is retried until the lock is let go, and written then.
    assert said["complete"][0] == "completed", said
    assert HOLD_SECONDS - 1 < said["complete"][1] < HOLD_SECONDS + 5, said


def test_a_session_left_idle_in_a_transaction_is_ended_and_its_rows_let_go(
    pg_database_url, settings, tmp_path, monkeypatch
):
    """A process of ours stopped in a transaction (SIGSTOP, a VM paused, a debugger)
    holding a job's row: the server ends its session after twice the limit, the job's
    completion (waiting for the row) goes through, and the stopped process's next
    statement is the database unavailable, not a 500's InternalError."""
    monkeypatch.setenv("HYPERMEDIA_DATABASE_STATEMENT_SECONDS", str(LIMIT_SECONDS))
    stack = _stack(settings, tmp_path)
    try:
        person = make_user(stack)
        obj = make_object(stack, person)
        stack.ingest.submit_many(
            person.caller, [SubmitRequest(object_id=obj, operations=["test.noop"])]
        )
        [job] = stack.dispatcher.claim_and_start("bulk", "idle-w")
        stalled, let_go = threading.Event(), threading.Event()
        said: dict[str, Any] = {}

        def stall() -> str:
            with transaction(stack.engine) as conn:
                j = t.jobs
                conn.execute(
                    update(j).where(j.c.job_id == job.job_id).values(priority=j.c.priority)
                )
                stalled.set()
                # Stopped here, its row locked, until the completion went through.
                let_go.wait(120)
                conn.execute(text("SELECT 1"))
            return "committed"

        stalling = _timed(stall, said, "stalled")
        assert stalled.wait(10)
        outcomes: list[Outcome] = []
        batcher = CompletionBatcher(stack.dispatcher, "idle-w", outcomes.append)
        began = time.monotonic()
        batcher.add(Completion(job, [], None))
        while not outcomes and time.monotonic() - began < 60:
            time.sleep(0.05)
        let_go.set()
        batcher.close(5)
        stalling.join(20)
    finally:
        stack.close()
    # Old: the completion waited for the stalled transaction to end (here: never, as it
    # ends only once the completion went through), which committed.
    assert outcomes == [Outcome(job.job_id, "completed")], outcomes
    assert said["stalled"][0].startswith("DatabaseUnavailable"), said
    assert "SQLSTATE 25P03" in said["stalled"][0], said


def test_a_migration_goes_without_the_engines_limits(pg_database_url):
    """An index built concurrently (0030's, on credit_ledger) waits for a session
    holding the table longer than the engine's statement limit: the migration takes
    the time (its own lock wait is lifted for a build), then the engine's connections
    have their limits back."""
    engine = make_engine(pg_database_url, statement_seconds=1)
    try:
        migrate.downgrade(engine, "0029")
        began = time.monotonic()
        with _held(pg_database_url, "LOCK TABLE credit_ledger IN SHARE MODE", 3.0):
            migrate.upgrade(engine)  # without the lift: QueryCanceled after 1 s
        took = time.monotonic() - began
        assert migrate.current_revision(engine) == migrate.head_revision()
        with engine.connect() as conn:
            shown = _limits(conn)
    finally:
        engine.dispose()
    assert took > 2.5, took
    assert shown == ["1s", "333ms", "2s"], shown


def _limits(conn: Any) -> list[str]:
    """The connection's statement, lock and idle-in-transaction limits, as shown."""
    return [
        conn.execute(text(f"SHOW {name}")).scalar_one()
        for name in ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")
    ]


def _shown(url: str, **kwargs: Any) -> list[str]:
    engine = make_engine(url, **kwargs)
    try:
        with engine.connect() as conn:
            return _limits(conn)
    finally:
        engine.dispose()


def test_every_connection_has_the_limits_and_the_url_or_pgoptions_wins(
    pg_database_url, monkeypatch
):
    monkeypatch.delenv("PGOPTIONS", raising=False)
    assert _shown(pg_database_url) == ["30s", "10s", "1min"]
    assert _shown(pg_database_url, statement_seconds=4.5) == ["4500ms", "1500ms", "9s"]
    assert _shown(pg_database_url, statement_seconds=0) == ["0", "0", "0"]
    options = quote("-c statement_timeout=0 --lock-timeout=2s")
    assert _shown(f"{pg_database_url}?options={options}") == ["0", "2s", "1min"]
    monkeypatch.setenv("PGOPTIONS", "-c lock_timeout=7s -c plan_cache_mode=force_custom_plan")
    assert _shown(pg_database_url) == ["30s", "7s", "1min"]
    engine = make_engine(pg_database_url)
    try:
        with engine.connect() as conn:  # the rest of PGOPTIONS still reaches the server
            assert conn.execute(text("SHOW plan_cache_mode")).scalar_one() == "force_custom_plan"
    finally:
        engine.dispose()


def test_a_limit_too_small_for_a_millisecond_is_never_none(pg_database_url, monkeypatch):
    """PostgreSQL counts its limits in whole milliseconds and reads 0 as none: the lock
    wait (a third) of 0.0015 s and less rounded to 0, no limit at all, and the statement
    limit too at 0.0005 s. The settings refuse less than MIN_STATEMENT_SECONDS (3 ms, a
    lock wait of 1 ms), naming the key; an engine given less gets 1 ms for each. (Shown
    on a bare connection: SQLAlchemy's first statements on a connection take longer.)"""

    def shown(seconds: float) -> list[str]:
        """The three limits a connection given ``seconds``' options has. One statement
        outside a transaction (no idle-in-transaction time for its 1-2 ms limit to end
        the session), asked again when the machine's load held it past its 1 ms."""
        options = " ".join(f"-c {n}={ms}" for n, ms in statement_limits(seconds).items())
        for _ in range(50):
            try:
                with psycopg.connect(
                    _libpq(pg_database_url), options=options, autocommit=True
                ) as conn:
                    row = conn.execute(
                        "SELECT current_setting('statement_timeout'),"
                        " current_setting('lock_timeout'),"
                        " current_setting('idle_in_transaction_session_timeout')"
                    ).fetchone()
                    assert row is not None
                    return [str(value) for value in row]
            except psycopg.errors.QueryCanceled:
                continue
        raise AssertionError(f"every read of the limits of {seconds} s was cancelled")

    # Old: ["1ms", "0", "2ms"] and ["0", "0", "1ms"].
    assert shown(0.001) == ["1ms", "1ms", "2ms"]
    assert shown(0.0004) == ["1ms", "1ms", "1ms"]
    assert shown(MIN_STATEMENT_SECONDS) == ["3ms", "1ms", "6ms"]
    assert Settings(database_statement_seconds=MIN_STATEMENT_SECONDS)
    assert Settings(database_statement_seconds=0).database_statement_seconds == 0
    monkeypatch.setenv("HYPERMEDIA_DATABASE_STATEMENT_SECONDS", "0.0015")
    with pytest.raises(ConfigError) as refused:
        load_settings()
    assert refused.value.key == (
        "database_statement_seconds (HYPERMEDIA_DATABASE_STATEMENT_SECONDS)"
    ), refused.value


@pytest.mark.parametrize("seconds", [0.0, 30.0])
def test_sqlite_is_left_as_it_was(sqlite_url, seconds):
    """SQLite has no such server limits: its busy timeout bounds a wait for another's
    write lock (SQLITE_BUSY_SECONDS), and the setting changes nothing there."""
    engine = make_engine(sqlite_url, statement_seconds=seconds)
    try:
        with transaction(engine) as conn:
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar_one() == 30_000
    finally:
        engine.dispose()
