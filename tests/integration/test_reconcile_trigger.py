"""The reconciler runs as soon as Redis may lack jobs, not at its next interval:
after FLUSHALL, and once Redis answers again after jobs were submitted while it was
down (a private Redis, restarted with its data: only the outage says so)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
import redis

from hypermedia.embedded import EmbeddedRedis
from hypermedia.ingest.service import SubmitRequest
from hypermedia.server import Maintenance
from hypermedia.stack import Stack
from tests.factories import make_object, make_user, open_stack

RECONCILE_INTERVAL = 3600.0
DEADLINE = 30.0  # seconds: far inside the interval, generous on a busy machine


@pytest.fixture
def stack(sqlite_engine, settings, private_redis: EmbeddedRedis) -> Iterator[Stack]:
    opened = open_stack(settings, sqlite_engine, None, redis_url=private_redis.url)
    yield opened
    opened.close()


@pytest.fixture
def maintenance(stack: Stack) -> Iterator[Maintenance]:
    running = Maintenance(stack, reaper_interval=0.2, reconcile_interval=RECONCILE_INTERVAL)
    assert running.reconcile_interval >= 100 * DEADLINE  # only a trigger can be in time
    running.start()
    _eventually(lambda: running.reconciles == 1, "the reconcile at start")
    yield running
    running.stop()


def _eventually(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {DEADLINE:g} s"
        time.sleep(0.05)


def _submit(stack: Stack, count: int) -> list[str]:
    person = make_user(stack)
    obj = make_object(stack, person)
    requests = [SubmitRequest(object_id=obj, operations=["thumbnail"]) for _ in range(count)]
    return [r.job_ids[0] for r in stack.ingest.submit_many(person.caller, requests)]


def _ready(stack: Stack) -> set[str]:
    try:
        return set(stack.queue.ready_ids("images"))
    except Exception:
        return set()


def test_flushall_is_reconciled_at_once(stack, maintenance, private_redis):
    job_ids = _submit(stack, 20)
    assert _ready(stack) == set(job_ids)
    client = redis.Redis.from_url(private_redis.url)
    client.flushall()
    client.close()
    assert _ready(stack) == set()
    _eventually(lambda: _ready(stack) == set(job_ids), "jobs back after FLUSHALL")
    # The round is counted once it has returned (just after the jobs are back).
    _eventually(lambda: maintenance.reconciles >= 2, "the reconcile counted")
    assert maintenance.reconciles == 2  # one, at once; not one a tick


def test_jobs_submitted_while_redis_was_down_are_enqueued_once_it_is_back(
    stack, maintenance, private_redis
):
    before = _submit(stack, 5)
    client = redis.Redis.from_url(private_redis.url)
    client.save()  # the restart below brings this data back: nothing looks emptied
    client.close()
    private_redis.stop()
    during = _submit(stack, 15)  # accepted: the record has them, the enqueue is deferred
    time.sleep(1.0)  # some maintenance ticks meet the outage
    private_redis.start()
    _eventually(lambda: _ready(stack) == set(before + during), "jobs submitted during the outage")
    _eventually(lambda: maintenance.reconciles >= 2, "the reconcile counted")
