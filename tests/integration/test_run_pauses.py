"""What ``hypermedia run`` says of workers that claim nothing while its jobs wait
(hypermedia.runner.paused_workers), read from the ``workers`` rows."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import update

from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.runner import ClaimPause, paused_workers
from hypermedia.stack import Stack
from tests.factories import add_worker_row


@pytest.fixture
def stack(sqlite_engine, settings) -> Iterator[Stack]:
    opened = Stack.open(settings(), engine=sqlite_engine, auto_migrate=True)
    yield opened
    opened.close()


def _set(stack: Stack, worker_id: str, **values: object) -> None:
    with transaction(stack.engine) as conn:
        conn.execute(update(t.workers).where(t.workers.c.worker_id == worker_id).values(**values))


def test_a_worker_paused_by_an_outage_is_said_as_a_low_disk_is(stack):
    """Only the disk guard's pauses were said: a worker whose claiming an outage had
    paused (the record, Redis, the storage down) left the bars still without a word."""
    at = datetime.now(UTC)
    for worker_id in ("w-disk", "w-outage", "w-over", "w-stopped", "w-both"):
        add_worker_row(stack.engine, worker_id, at=at)
    _set(stack, "w-disk", claims_paused_since=at, claims_paused_reason="low disk (9 MB free)")
    outage = {"outage_paused_since": at, "outage_paused_reason": "redis: [Errno 111] refused"}
    _set(stack, "w-outage", **outage)
    _set(stack, "w-over", **outage, outage_paused_seconds=21.0)  # it ended: claims again
    _set(stack, "w-stopped", **outage, status="stopped")
    _set(stack, "w-both", **outage, claims_paused_since=at, claims_paused_reason="low disk")
    assert paused_workers(stack) == [
        ClaimPause("w-both", "disk", "low disk"),
        ClaimPause("w-both", "outage", "redis: [Errno 111] refused"),
        ClaimPause("w-disk", "disk", "low disk (9 MB free)"),
        ClaimPause("w-outage", "outage", "redis: [Errno 111] refused"),
    ]
    assert ClaimPause("w-outage", "outage", "redis down").notice == (
        "w-outage claims no job: paused by an outage: redis down"
    )
    assert ClaimPause("w-disk", "disk", "low disk (9 MB free)").notice == (
        "w-disk claims no job: low disk (9 MB free)"
        " (worker_min_free_disk_mb, HYPERMEDIA_WORKER_MIN_FREE_DISK_MB)"
    )
