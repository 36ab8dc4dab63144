"""The serve process's maintenance thread: reconcile at start, reaper ticks, clean stop."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import select

from hypermedia.accounts import Caller
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.ingest.service import SubmitRequest
from hypermedia.objects import register_object
from hypermedia.server import Maintenance
from hypermedia.stack import Stack
from tests import support
from tests.api_support import add_user


@pytest.fixture
def stack(pg_engine, settings, manual_clock) -> Iterator[Stack]:
    opened = Stack.open(settings(), engine=pg_engine, auto_migrate=True, clock=manual_clock)
    yield opened
    opened.close()


def _submit(stack: Stack, count: int = 2) -> list[str]:
    user = add_user(stack, "alice")
    caller = Caller(user.user_id)
    with transaction(stack.engine) as conn:
        register_object(
            conn,
            caller,
            object_id="obj1",
            pool_id=user.pool_id,
            storage_key=f"originals/{user.pool_id}/obj1",
            filename="a.png",
            size_bytes=1000,
            now=stack.clock.now(),
        )
    ops = ["thumbnail", "resize", "compress", "convert"][:count]
    return stack.ingest.submit(caller, SubmitRequest(object_id="obj1", operations=ops)).job_ids


def _eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def _status(stack: Stack, job_id: str) -> str:
    with transaction(stack.engine) as conn:
        return str(conn.execute(select(t.jobs.c.status).where(t.jobs.c.job_id == job_id)).scalar())


def test_reconciles_at_start_and_reaps_every_tick(stack, redis_client, redis_prefix, manual_clock):
    job_ids = _submit(stack)
    support.delete_keys(redis_client, redis_prefix)  # Redis lost everything
    assert stack.queue.ready_ids("images") == []

    maintenance = Maintenance(stack, reaper_interval=0.02, reconcile_interval=3600)
    maintenance.start()
    try:
        _eventually(lambda: maintenance.reconciles == 1)
        assert set(stack.queue.ready_ids("images")) == set(job_ids)

        [claimed] = stack.dispatcher.claim("images", "worker-1")
        assert stack.dispatcher.start(claimed, "worker-1")
        manual_clock.advance(3600)  # the lease ran out: the worker is gone
        _eventually(lambda: _status(stack, claimed.job_id) == "retry_wait")
        assert maintenance.reconciles == 1  # not due again
    finally:
        maintenance.stop()
    rounds = maintenance.rounds
    time.sleep(0.1)
    assert maintenance.rounds == rounds  # stopped


def test_keeps_going_while_redis_is_down(sqlite_engine, settings, private_redis):
    stack = Stack.open(
        settings(redis_url=private_redis.url), engine=sqlite_engine, auto_migrate=True
    )
    try:
        private_redis.stop()
        maintenance = Maintenance(stack, reaper_interval=0.01, reconcile_interval=0.01)
        maintenance.start()
        _eventually(lambda: maintenance.rounds >= 2, timeout=30)
        private_redis.start()
        _eventually(lambda: maintenance.reconciles >= 1, timeout=30)
        maintenance.stop()
    finally:
        stack.close()
