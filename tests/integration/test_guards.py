"""Illegal transitions are impossible in the database, not merely unlikely.

For every status a job can be in, every repository step is tried. Exactly the
steps the state machine allows change the row; every other one matches nothing
and leaves the row byte-for-byte as it was.

Each case submits a job of its own and looks at that job's row only, so the cases of a
test share one database and one stack (``module_engine``): a fresh clone and a
``Stack.open`` per case cost the file most of its CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial

import pytest
from sqlalchemy import Connection, Engine, select, update

from hypermedia.clock import ManualClock, to_datetime
from hypermedia.config import Settings
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.jobs.repository import JobRepository
from hypermedia.jobs.states import JobEvent, JobStatus, is_legal
from hypermedia.stack import Stack
from tests.factories import Person, make_user, open_stack, submit

WORKER = "w-guard"
NOW = 1_900_000_000.0
repo = JobRepository()

Step = Callable[[Connection, str], object]

# event -> the repository call that performs it (None/False/0 means "refused")
STEPS: dict[JobEvent, Step] = {
    JobEvent.ENQUEUE: lambda c, j: repo.mark_queued(c, [j], NOW),
    JobEvent.CLAIM: lambda c, j: repo.claim(c, j, WORKER, NOW, 60),
    JobEvent.START: lambda c, j: repo.start(c, j, WORKER, NOW),
    JobEvent.COMPLETE: lambda c, j: repo.complete(c, j, WORKER, NOW),
    JobEvent.FAIL: lambda c, j: repo.fail(c, j, WORKER, NOW, "e", "m"),
    JobEvent.RETRY_DUE: lambda c, j: repo.promote_due(c, NOW, [j]),
    JobEvent.RELEASE: lambda c, j: repo.release(c, j, WORKER, NOW),
}


def _force(conn: Connection, job_id: str, status: JobStatus) -> None:
    """Put a job in ``status`` directly, with the fields that status implies."""
    conn.execute(
        update(t.jobs)
        .where(t.jobs.c.job_id == job_id)
        .values(
            status=status.value,
            claimed_by=WORKER,
            attempt_count=1,
            run_after=to_datetime(NOW - 1),
            visibility_timeout=to_datetime(NOW + 60),
            cancel_requested=True,
        )
    )


def _row(conn: Connection, job_id: str) -> dict[str, object]:
    return dict(conn.execute(select(t.jobs).where(t.jobs.c.job_id == job_id)).one()._mapping)


def _changed(result: object) -> bool:
    if isinstance(result, bool):
        return result
    if isinstance(result, int):
        return result > 0
    if isinstance(result, list):
        return bool(result)
    return result is not None


CASES = [(status, event) for status in JobStatus for event in STEPS]


def _shared(engine: Engine, settings: Callable[..., Settings]) -> Iterator[tuple[Stack, Person]]:
    stack = open_stack(partial(settings, engine), engine, ManualClock())
    yield stack, make_user(stack)
    stack.close()


@pytest.fixture(scope="module")
def shared_pg(module_pg_engine, module_settings) -> Iterator[tuple[Stack, Person]]:
    """A stack and a user every case of a test on PostgreSQL submits its own job with."""
    yield from _shared(module_pg_engine, module_settings)


@pytest.fixture(scope="module")
def shared(module_engine, module_settings) -> Iterator[tuple[Stack, Person]]:
    """The same on PostgreSQL and on SQLite."""
    yield from _shared(module_engine, module_settings)


@pytest.mark.parametrize(("status", "event"), CASES, ids=[f"{s}-{e}" for s, e in CASES])
def test_each_step_from_each_status(shared_pg, status, event):
    stack, person = shared_pg
    (job_id,) = submit(stack, person, ["thumbnail"])
    with transaction(stack.engine) as conn:
        _force(conn, job_id, status)
        before = _row(conn, job_id)
        result = STEPS[event](conn, job_id)
        after = _row(conn, job_id)
    if is_legal(status, event):
        assert _changed(result), f"{event} from {status} should have applied"
        assert after != before
    else:
        assert not _changed(result), f"{event} from {status} must be refused"
        assert after == before


@pytest.mark.parametrize("status", list(JobStatus))
def test_user_cancel_from_each_status(shared, status):
    stack, person = shared
    (job_id,) = submit(stack, person, ["thumbnail"])
    with transaction(stack.engine) as conn:
        _force(conn, job_id, status)
        conn.execute(update(t.jobs).where(t.jobs.c.job_id == job_id).values(cancel_requested=False))
        answer = repo.cancel(conn, job_id, person.caller.user_id, NOW)
        after = _row(conn, job_id)
    if status in (JobStatus.CREATED, JobStatus.QUEUED, JobStatus.RETRY_WAIT):
        assert answer is JobStatus.CANCELLED
        assert after["status"] == "cancelled"
    elif status in (JobStatus.CLAIMED, JobStatus.PROCESSING):
        assert answer == status  # still running, now asked to stop
        assert after["status"] == status.value
        assert after["cancel_requested"] is True
    else:
        assert answer == status  # finished: nothing to cancel
        assert after["status"] == status.value
        assert after["cancel_requested"] is False


def test_worker_honours_cancel_only_when_requested(engine, settings, manual_clock):
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    (job_id,) = submit(stack, person, ["thumbnail"])
    (job,) = stack.dispatcher.claim("images", WORKER)
    stack.dispatcher.start(job, WORKER)
    assert not stack.dispatcher.cancel_requested(job)
    assert not stack.dispatcher.honour_cancel(job, WORKER)
    assert stack.ingest.cancel(person.caller, job_id) is JobStatus.PROCESSING
    assert stack.dispatcher.cancel_requested(job)
    assert stack.dispatcher.honour_cancel(job, WORKER)
    view = stack.ingest.get_job(person.caller, job_id)
    assert view.status == "cancelled"
    assert view.attempts[-1].status == "cancelled"
    assert stack.queue.members("images") == {}
    stack.close()
