"""Leases expire, retries wait 2^(n-1) minutes on a controllable clock, attempts run out."""

from __future__ import annotations

import pytest
from sqlalchemy import event

from hypermedia import accounts
from hypermedia.db.engine import transaction
from hypermedia.jobs.reaper import LEASE_EXPIRED, Reaper, ReapReport
from hypermedia.jobs.repository import JobRepository
from hypermedia.jobs.states import JobStatus
from tests import support
from tests.factories import make_user, open_stack, submit


def _lease(stack, queue: str):
    return stack.dispatcher.queue_lease_seconds(queue)


def test_expired_lease_is_reaped_then_retried_until_failed(engine, settings, manual_clock):
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack, credits=100)
    (job_id,) = submit(stack, person, ["thumbnail"])  # max_attempts = 3
    estimate = stack.ingest.get_job(person.caller, job_id).estimated_millicredits
    profile = stack.catalog.get("thumbnail")
    job_lease = profile.timeout_seconds * 1.5 + stack.settings.lease_grace_seconds

    waits = []
    for attempt in (1, 2, 3):
        (job,) = stack.dispatcher.claim("images", f"doomed-{attempt}")
        assert job.job_id == job_id and job.attempt_number == attempt
        assert stack.dispatcher.start(job, f"doomed-{attempt}")
        # The worker vanishes. Just before the deadline nothing happens...
        manual_clock.advance(job_lease - 1)
        assert stack.reaper.tick().expired == 0
        assert stack.ingest.get_job(person.caller, job_id).status == "processing"
        # ... just after it, the attempt fails with lease_expired.
        manual_clock.advance(2)
        report = stack.reaper.tick()
        assert report.expired == 1
        view = stack.ingest.get_job(person.caller, job_id)
        assert view.attempts[-1].status == "failed"
        assert view.attempts[-1].error_code == LEASE_EXPIRED
        if attempt == 3:
            assert view.status == "failed"
            break
        assert view.status == "retry_wait"
        assert view.run_after is not None
        wait = view.run_after.timestamp() - manual_clock.now()
        waits.append(round(wait))
        assert stack.queue.counts("images").delayed == 1
        # Not due one second early; due one second after.
        manual_clock.advance(wait - 1)
        assert stack.reaper.tick().promoted == 0
        assert stack.dispatcher.claim("images", "early") == []
        manual_clock.advance(2)
        assert stack.reaper.tick().promoted == 1
        assert stack.ingest.get_job(person.caller, job_id).status == "queued"

    assert waits == [60, 120]  # 2^(n-1) minutes: 1, 2
    counts = stack.queue.counts("images")
    assert (counts.ready, counts.leased, counts.delayed) == (0, 0, 0)
    assert len(stack.ingest.get_job(person.caller, job_id).attempts) == 3
    with transaction(stack.engine) as conn:
        bal = accounts.balance(conn, person.caller.user_id)
    # A failed job is never charged and holds no reservation.
    assert bal.reserved_millicredits == 0
    assert bal.balance_millicredits == 100_000
    assert estimate > 0
    stack.close()


def test_a_job_cancelled_while_its_worker_is_lost_ends_cancelled_when_its_lease_expires(
    engine, settings, manual_clock
):
    """Its owner cancels it while it runs (cancel_requested), then its worker dies
    before honouring that: the reaper took the expired lease for a failed attempt and
    queued it again after the backoff (its credits held a minute or more, an attempt
    spent, claimed again only to be cancelled). Now it ends cancelled at once, its
    credits released; a worker failing such a job ends it the same way."""
    stack = open_stack(settings, engine, manual_clock, backoff_base_seconds=60)
    person = make_user(stack)
    lost, failing = submit(stack, person, ["thumbnail"]), submit(stack, person, ["thumbnail"])
    claimed = stack.dispatcher.claim("images", "w", 2)
    for job in claimed:
        assert stack.dispatcher.start(job, "w")
    assert {stack.ingest.cancel(person.caller, j) for j in (*lost, *failing)} == {
        JobStatus.PROCESSING
    }  # cancel requested: its worker is to honour it
    manual_clock.advance(stack.dispatcher.queue_lease_seconds("images") + 1)
    (failing_job,) = [job for job in claimed if job.job_id in failing]
    assert stack.dispatcher.fail(failing_job, "w", "x", "boom") is JobStatus.CANCELLED
    report = stack.reaper.tick()
    assert (report.expired, report.retried, report.failed) == (1, 0, 0)
    for job_id in (*lost, *failing):
        assert stack.ingest.get_job(person.caller, job_id).status == "cancelled"
    counts = stack.queue.counts("images")
    assert (counts.ready, counts.leased, counts.delayed) == (0, 0, 0)
    with transaction(stack.engine) as conn:
        assert accounts.balance(conn, person.caller.user_id).reserved_millicredits == 0
    stack.close()


def test_backoff_doubles_and_max_attempts_ends_in_failed(engine, settings, manual_clock):
    stack = open_stack(settings, engine, manual_clock, backoff_base_seconds=60)
    person = make_user(stack)
    (job_id,) = submit(stack, person, ["transcode_video"])  # max_attempts = 3
    seen = []
    for attempt in range(1, 4):
        (job,) = stack.dispatcher.claim("media", "w")
        assert stack.dispatcher.start(job, "w")
        status = stack.dispatcher.fail(job, "w", "ffmpeg_error", f"exit 1 on attempt {attempt}")
        view = stack.ingest.get_job(person.caller, job_id)
        seen.append(status.value if status else None)
        if view.status == "retry_wait":
            assert view.run_after is not None
            delay = view.run_after.timestamp() - manual_clock.now()
            assert round(delay) == 60 * 2 ** (attempt - 1)
            manual_clock.advance(delay)
            assert stack.reaper.tick().promoted == 1
    assert seen == ["retry_wait", "retry_wait", "failed"]
    view = stack.ingest.get_job(person.caller, job_id)
    assert view.error_code == "ffmpeg_error"
    assert [a.status for a in view.attempts] == ["failed"] * 3
    assert stack.dispatcher.claim("media", "w") == []
    stack.close()


def test_non_retryable_error_fails_at_once(engine, settings, manual_clock):
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    (job_id,) = submit(stack, person, ["thumbnail"])
    (job,) = stack.dispatcher.claim("images", "w")
    stack.dispatcher.start(job, "w")
    status = stack.dispatcher.fail(job, "w", "unsupported_format", "not an image", retryable=False)
    assert status is not None and status.value == "failed"
    assert stack.ingest.get_job(person.caller, job_id).attempt_count == 1
    stack.close()


def test_lease_popped_but_never_claimed_returns_to_ready(engine, settings, manual_clock):
    """A worker died between the Redis pop and the database claim."""
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    (job_id,) = submit(stack, person, ["thumbnail"])
    leased = stack.queue.claim("images", "ghost", 30, manual_clock.now())
    assert [entry.job_id for entry in leased] == [job_id]
    assert stack.queue.counts("images").ready == 0
    manual_clock.advance(31)
    assert stack.reaper.tick().leases_returned == 1
    assert stack.queue.ready_ids("images") == [job_id]
    (job,) = stack.dispatcher.claim("images", "alive")
    assert job.job_id == job_id and job.attempt_number == 1
    stack.close()


def test_a_retry_parked_after_its_promotion_goes_back_to_ready(engine, settings, manual_clock):
    """A worker commits a retry, then stalls past the backoff before parking the job in
    Redis: the reaper promotes it meanwhile, and the late park hides a queued job in
    the delayed set (seen once, a transcode's retry never claimed at load 8). The
    reaper's next tick puts it back where the record says; nothing else would."""
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    (job_id,) = submit(stack, person, ["thumbnail"])
    (job,) = stack.dispatcher.claim("images", "w")
    stack.dispatcher.start(job, "w")
    stack.dispatcher.fail(job, "w", "child_killed", "killed")
    assert stack.queue.members("images") == {job_id: "delayed"}
    manual_clock.advance(3600)
    assert stack.reaper.tick().promoted == 1
    assert stack.queue.members("images") == {job_id: "ready"}
    stack.queue.delay("images", [(job_id, manual_clock.now() - 1)])  # the late park
    assert stack.ingest.get_job(person.caller, job_id).status == "queued"
    assert stack.dispatcher.claim("images", "w2") == []  # hidden from every worker
    report = stack.reaper.tick()
    assert (report.promoted, report.delays_returned) == (0, 1)
    assert stack.queue.members("images") == {job_id: "ready"}
    (again,) = stack.dispatcher.claim("images", "w2")
    assert again.job_id == job_id and again.attempt_number == 2
    # A retry still waiting in the record is left to be promoted when it is due.
    stack.dispatcher.start(again, "w2")
    stack.dispatcher.fail(again, "w2", "child_killed", "killed")
    assert stack.reaper.tick().delays_returned == 0
    assert stack.queue.members("images") == {job_id: "delayed"}
    stack.close()


def test_a_cancel_between_a_promotion_or_release_and_its_push_leaves_no_ready_job(
    engine, settings, manual_clock
):
    """A retry the reaper promotes, and a job a worker releases, each go to Redis after
    the commit that made them queued; a cancel committed in between removed nothing,
    and the push then left a cancelled job ready (demand to the scheduler) until the
    reconciler's pass. The cancel's tombstone keeps the push from doing so."""
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    promoted, released = submit(stack, person, ["thumbnail"]), submit(stack, person, ["thumbnail"])
    (job,) = stack.dispatcher.claim("images", "w")
    stack.dispatcher.start(job, "w")
    stack.dispatcher.fail(job, "w", "child_killed", "killed")
    assert stack.queue.members("images") == {promoted[0]: "delayed", released[0]: "ready"}
    (held,) = stack.dispatcher.claim("images", "w2")
    stack.dispatcher.start(held, "w2")
    push = stack.queue.enqueue

    def cancelled_first(name, entries):
        for job_id, _priority in entries:
            assert stack.ingest.cancel(person.caller, job_id) is JobStatus.CANCELLED
        return push(name, entries)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stack.queue, "enqueue", cancelled_first)
        assert stack.dispatcher.release(held, "w2")
        manual_clock.advance(3600)
        assert stack.reaper.tick().promoted == 1
    assert stack.queue.members("images") == {}
    assert stack.queue.counts("images").ready == 0
    for job_id in (*promoted, *released):
        assert stack.ingest.get_job(person.caller, job_id).status == "cancelled"
    stack.close()


def test_extended_lease_is_not_reaped(engine, settings, manual_clock):
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    (job_id,) = submit(stack, person, ["thumbnail"])
    (job,) = stack.dispatcher.claim("images", "slow")
    stack.dispatcher.start(job, "slow")
    lease = _lease(stack, "images")
    for _ in range(5):
        manual_clock.advance(lease - 10)
        assert stack.dispatcher.extend(job, "slow", lease)
        assert stack.reaper.tick().expired == 0
    assert stack.dispatcher.complete(job, "slow")
    assert stack.ingest.get_job(person.caller, job_id).status == "completed"
    stack.close()


def test_release_hands_back_without_spending_an_attempt(engine, settings, manual_clock):
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    (job_id,) = submit(stack, person, ["thumbnail"])
    (job,) = stack.dispatcher.claim("images", "draining")
    stack.dispatcher.start(job, "draining")
    assert stack.dispatcher.release(job, "draining")
    view = stack.ingest.get_job(person.caller, job_id)
    assert view.status == "queued" and view.attempt_count == 0
    assert [a.status for a in view.attempts] == ["released"]
    assert stack.queue.ready_ids("images") == [job_id]
    (again,) = stack.dispatcher.claim("images", "fresh")
    assert again.attempt_number == 2 and again.attempt_count == 1
    stack.close()


def test_stale_worker_cannot_complete_a_reclaimed_job(engine, settings, manual_clock):
    stack = open_stack(settings, engine, manual_clock, backoff_base_seconds=1)
    person = make_user(stack)
    (job_id,) = submit(stack, person, ["thumbnail"])
    (old,) = stack.dispatcher.claim("images", "old")
    stack.dispatcher.start(old, "old")
    manual_clock.advance(_lease(stack, "images") + 1)
    stack.reaper.tick()
    manual_clock.advance(5)
    stack.reaper.tick()
    (new,) = stack.dispatcher.claim("images", "new")
    stack.dispatcher.start(new, "new")
    assert not stack.dispatcher.complete(old, "old")  # the guard refuses the ghost
    assert stack.dispatcher.complete(new, "new")
    view = stack.ingest.get_job(person.caller, job_id)
    assert view.status == "completed" and view.attempt_count == 2
    stack.close()


def test_a_cancelled_job_reads_as_cancelled_whichever_way_it_ended(engine, settings, manual_clock):
    """A job its owner cancelled while it ran, whose attempt then failed (its worker
    failed it, died, or its lease expired), ended cancelled but kept the failure's
    error_code and error_message: GET /jobs/{id} and its callback said cancelled *and*
    worker_lost, the list of jobs said lease_expired, its cancelled event carried the
    error code. So did a job cancelled in retry_wait or on its next attempt (the code
    of the attempt that had failed). Now a cancelled job names no error, as a completed
    one names none; each attempt keeps its own (``attempts``)."""
    from datetime import UTC, datetime

    from hypermedia.callbacks import payload
    from hypermedia.ingest import queries
    from hypermedia.ingest.schemas import job_summary
    from hypermedia.jobs.dispatcher import WORKER_LOST

    stack = open_stack(settings, engine, manual_clock, backoff_base_seconds=60)
    person = make_user(stack)
    ids = [submit(stack, person, ["thumbnail"])[0] for _ in range(5)]
    waiting, honoured, by_worker, expired, lost = ids
    first = stack.dispatcher.claim("images", "w0", 2)
    assert [job.job_id for job in first] == [waiting, honoured]
    for job in first:
        assert stack.dispatcher.start(job, "w0")
        assert stack.dispatcher.fail(job, "w0", "ffmpeg_error", "boom") is JobStatus.RETRY_WAIT
    assert stack.ingest.cancel(person.caller, waiting) is JobStatus.CANCELLED
    manual_clock.advance(61)
    assert stack.reaper.tick().promoted == 1

    running = {}
    for job_id, worker in ((honoured, "w1"), (by_worker, "w2"), (expired, "w3"), (lost, "w4")):
        (job,) = stack.dispatcher.claim("images", worker)
        assert job.job_id == job_id and stack.dispatcher.start(job, worker)
        running[job_id] = job
        assert stack.ingest.cancel(person.caller, job_id) is JobStatus.PROCESSING
    assert stack.dispatcher.honour_cancel(running[honoured], "w1")
    failed = stack.dispatcher.fail(running[by_worker], "w2", "ffmpeg_error", "boom")
    assert failed is JobStatus.CANCELLED
    assert stack.dispatcher.recover_worker("w4") == [lost]
    manual_clock.advance(stack.dispatcher.queue_lease_seconds("images") + 1)
    assert stack.reaper.tick().expired == 1

    codes = {
        waiting: ["ffmpeg_error"],
        honoured: ["ffmpeg_error", None],
        by_worker: ["ffmpeg_error"],
        expired: [LEASE_EXPIRED],
        lost: [WORKER_LOST],
    }
    with transaction(stack.engine) as conn:
        page = queries.list_jobs(conn, person.caller.user_id, queries.JobFilters())
    listed = {row.job_id: job_summary(row) for row in page.jobs}
    for job_id in ids:
        view = stack.ingest.get_job(person.caller, job_id)
        seen = (view.status, view.error_code, view.error_message)
        assert seen == ("cancelled", None, None), job_id
        assert [a.error_code for a in view.attempts] == codes[job_id], job_id
        assert (listed[job_id].status, listed[job_id].error_code) == ("cancelled", None)
        sent = payload(view, "e", "cancelled", datetime.now(UTC))["job"]
        assert (sent["status"], sent["error_code"], sent["error_message"]) == (
            "cancelled",
            None,
            None,
        )
        _, last = stack.dispatcher.events.history(job_id)[-1]
        assert last["status"] == "cancelled" and "error_code" not in last, (job_id, last)
        record = stack.ingest.status_event(person.caller, job_id)
        assert record["status"] == "cancelled" and "error_code" not in record, job_id
    with transaction(stack.engine) as conn:
        assert accounts.balance(conn, person.caller.user_id).reserved_millicredits == 0
    stack.close()


def test_a_job_cancelled_while_its_last_attempt_runs_ends_cancelled_when_it_fails(
    engine, settings, manual_clock
):
    """Its owner cancels it while its attempt runs, and that attempt then fails for
    good: a permanent error its worker reports, or the last of its attempts (its lease
    expired, its worker lost). A cancel asked while a retry was to follow ended it
    cancelled, but one whose failure was final ended it ``failed``, with the error, a
    ``failed`` callback and event, counted in ``jobs_failed_total``: the owner who
    cancelled it read that it failed. Now it ends cancelled whichever way its attempt
    failed, as a cancel the worker honours does: no error, a ``cancelled`` callback, its
    reservation released and nothing charged (as for a failed job)."""
    from hypermedia.jobs import callbacks
    from hypermedia.jobs.dispatcher import WORKER_LOST
    from hypermedia.metrics.head import HeadMetrics
    from tests.metrics_support import parse, sum_by

    stack = open_stack(
        settings, engine, manual_clock, backoff_base_seconds=60, callback_hosts=["127.0.0.1"]
    )
    person = make_user(stack, credits=100)
    url = "http://127.0.0.1:9/hook"
    permanent, expired, lost = (
        submit(stack, person, ["thumbnail"], callback_url=url)[0] for _ in range(3)
    )
    with transaction(stack.engine) as conn:
        assert accounts.balance(conn, person.caller.user_id).reserved_millicredits > 0
    # The two others use up their attempts but the last (max_attempts = 3).
    for attempt in (1, 2):
        for job in stack.dispatcher.claim("images", "w0", 3):
            assert stack.dispatcher.start(job, "w0")
            if job.job_id != permanent:
                assert stack.dispatcher.fail(job, "w0", "boom", "x") is JobStatus.RETRY_WAIT
            else:
                assert stack.dispatcher.release(job, "w0")
        manual_clock.advance(60 * 2 ** (attempt - 1) + 1)
        assert stack.reaper.tick().promoted == 2
    running = {}
    for worker in ("w1", "w2", "w3"):
        (job,) = stack.dispatcher.claim("images", worker)
        assert stack.dispatcher.start(job, worker)
        running[job.job_id] = (job, worker)
        assert stack.ingest.cancel(person.caller, job.job_id) is JobStatus.PROCESSING
    assert running[expired][0].attempt_number == running[lost][0].attempt_number == 3

    job, worker = running[permanent]
    status = stack.dispatcher.fail(job, worker, "invalid_input", "bad bytes", retryable=False)
    assert status is JobStatus.CANCELLED
    assert stack.dispatcher.recover_worker(running[lost][1]) == [lost]
    manual_clock.advance(stack.dispatcher.queue_lease_seconds("images") + 1)
    report = stack.reaper.tick()
    assert (report.expired, report.failed) == (1, 0)

    codes = {permanent: "invalid_input", expired: LEASE_EXPIRED, lost: WORKER_LOST}
    for job_id, code in codes.items():
        view = stack.ingest.get_job(person.caller, job_id)
        assert (view.status, view.error_code, view.error_message) == ("cancelled", None, None)
        assert view.attempts[-1].error_code == code  # the attempt keeps its failure
        _, last = stack.dispatcher.events.history(job_id)[-1]
        assert last["status"] == "cancelled" and "error_code" not in last, (job_id, last)
        with transaction(stack.engine) as conn:
            sent = callbacks.of_job(conn, job_id)
        assert sent is not None and sent.event == "cancelled", job_id
    with transaction(stack.engine) as conn:
        bal = accounts.balance(conn, person.caller.user_id)
    assert (bal.reserved_millicredits, bal.balance_millicredits) == (0, 100_000)
    counts = stack.queue.counts("images")
    assert (counts.ready, counts.leased, counts.delayed) == (0, 0, 0)
    assert isinstance(stack.metrics, HeadMetrics)
    samples = parse(stack.metrics.exposition().decode())
    assert sum_by(samples, "hypermedia_jobs_failed_total", ("code",)) == {}
    stack.close()


def test_an_idle_tick_sends_no_update_and_promotes_a_due_retry_once(engine, settings, manual_clock):
    """The promotion was an UPDATE of every due retry_wait job, sent each tick (every
    reaper_interval_seconds) with nothing due nearly always: on SQLite the write lock
    each time. Now a read looks first. A head's reaper that found a job due while
    another's promoted it meanwhile moves nothing (the UPDATE's guard): queued once."""
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    updates: list[str] = []

    def statement(_conn, _cursor, text, *_args) -> None:
        if text.split()[0].upper() == "UPDATE":
            updates.append(text)

    event.listen(stack.engine, "before_cursor_execute", statement)
    try:
        assert stack.reaper.tick() == ReapReport()
    finally:
        event.remove(stack.engine, "before_cursor_execute", statement)
    assert updates == []

    (job_id,) = submit(stack, person, ["thumbnail"])
    (job,) = stack.dispatcher.claim("images", "w")
    stack.dispatcher.start(job, "w")
    stack.dispatcher.fail(job, "w", "child_killed", "killed")
    manual_clock.advance(3600)
    other = Reaper(stack.engine, stack.queue, clock=manual_clock)
    seen: list[int] = []

    class Racing(JobRepository):
        def any_due(self, conn, now):
            due = super().any_due(conn, now)
            seen.append(other.tick().promoted)  # the other head's, in between
            return due

    late = Reaper(stack.engine, stack.queue, clock=manual_clock, repository=Racing())
    assert late.tick().promoted == 0
    assert seen == [1]
    assert stack.ingest.get_job(person.caller, job_id).status == "queued"
    assert stack.queue.members("images") == {job_id: "ready"}
    (again,) = stack.dispatcher.claim("images", "w2")
    assert again.job_id == job_id and again.attempt_number == 2
    stack.close()


def test_an_idle_tick_takes_no_write_lock(sqlite_engine, settings, manual_clock):
    """The expired leases were looked for in a write transaction: on SQLite the write
    lock (BEGIN IMMEDIATE) every tick, every API submit and worker completion beside
    it waiting its turn, to find nothing nearly always. Now the look is a snapshot; a
    lease that did expire is failed in a write transaction of its own, as before."""
    stack = open_stack(settings, sqlite_engine, manual_clock)
    person = make_user(stack)
    (job_id,) = submit(stack, person, ["thumbnail"])
    (job,) = stack.dispatcher.claim("images", "w")
    stack.dispatcher.start(job, "w")
    with support.write_locks(stack.engine) as idle:
        assert stack.reaper.tick() == ReapReport()
    assert idle == []
    manual_clock.advance(_lease(stack, "images") + 1)
    with support.write_locks(stack.engine) as expired:
        assert stack.reaper.tick().expired == 1
    assert len(expired) == 1
    assert stack.ingest.get_job(person.caller, job_id).status == "retry_wait"
    stack.close()
