"""The worker's batch steps keep the single steps' guarantees: claim-and-start only
from ``queued``, group-committed completion only of jobs the worker holds, each job
claimed once under concurrency, credits and attempts as the single steps leave them."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import replace
from typing import cast

import pytest
from sqlalchemy import func, select

from hypermedia.clock import ManualClock, to_datetime
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.ingest.service import SubmitRequest
from hypermedia.jobs.repository import ClaimedJob, FinishedJob, JobRepository, OutputRecord
from hypermedia.jobs.states import JobStatus
from hypermedia.metrics import JOB_DURATION, JOBS_STARTED, MemoryRecorder
from hypermedia.stack import Stack
from tests.factories import Person, make_object, make_user, open_stack, submit
from tests.integration.test_guards import NOW, WORKER, _force, _row

repo = JobRepository()


@pytest.mark.parametrize("status", list(JobStatus))
def test_claim_and_start_only_from_queued(pg_engine, settings, manual_clock, status):
    stack = open_stack(settings, pg_engine, manual_clock)
    person = make_user(stack)
    (job_id,) = submit(stack, person, ["thumbnail"])
    with transaction(pg_engine) as conn:
        _force(conn, job_id, status)
        before = _row(conn, job_id)
        claimed = repo.claim_many(conn, [job_id], "w-new", NOW, {}, default_lease=60, start=True)
        after = _row(conn, job_id)
        attempts = conn.execute(
            select(t.attempts.c.status, t.attempts.c.worker_id).where(t.attempts.c.job_id == job_id)
        ).all()
    if status is JobStatus.QUEUED:
        (job,) = claimed
        assert after["status"] == "processing" and after["claimed_by"] == "w-new"
        assert after["started_at"] == after["claimed_at"]
        assert after["attempt_count"] == 2  # _force left it at 1
        assert job.attempt_count == after["attempt_count"] and job.attempt_started_at == NOW
        assert [tuple(a) for a in attempts] == [("running", "w-new")]
    else:
        assert claimed == []
        assert after == before
        assert attempts == []
    stack.close()


def test_each_claimed_job_gets_its_profiles_lease(engine, settings, manual_clock):
    """The deadline of a claim is its profile's lease (the default for a profile the
    worker names none for), to the microsecond, in the row and in what the worker holds;
    with more profiles than the statement has parameters for one each."""
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    jobs = submit(stack, person, ["thumbnail", "convert", "compress"])
    with transaction(engine) as conn:
        profiles = {job_id: cast(int, _row(conn, job_id)["profile_id"]) for job_id in jobs}
        assert len(set(profiles.values())) == 3
        first, second, third = (profiles[job_id] for job_id in jobs)
        # Seconds with a fraction; and 40 profiles that no job of these has.
        leases = {first: 30.25, second: 3600.000001, **{9000 + n: float(n) for n in range(40)}}
        claimed = repo.claim_many(conn, jobs, WORKER, NOW, leases, default_lease=90, start=True)
        rows = {job_id: _row(conn, job_id) for job_id in jobs}
    expected = {jobs[0]: NOW + 30.25, jobs[1]: NOW + 3600.000001, jobs[2]: NOW + 90}
    assert {job.job_id: job.deadline for job in claimed} == expected
    for job_id, deadline in expected.items():
        assert rows[job_id]["visibility_timeout"] == to_datetime(deadline), job_id
    assert {profiles[job.job_id] for job in claimed} == {first, second, third}
    stack.close()


def test_complete_many_completes_only_the_jobs_this_worker_runs(engine, settings, manual_clock):
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    obj = make_object(stack, person)
    requests = [SubmitRequest(object_id=obj, operations=["thumbnail"]) for _ in range(4)]
    results = stack.ingest.submit_many(person.caller, requests)
    ours = stack.dispatcher.claim_and_start("images", "mine", count=2)
    theirs = stack.dispatcher.claim_and_start("images", "other", count=1)
    (only_claimed,) = stack.dispatcher.claim("images", "mine", count=1)
    assert len(ours) == 2 and len(theirs) == 1
    with transaction(engine) as conn:
        balance_before = _account(conn, person.caller.user_id)
    finished = [
        FinishedJob(job.job_id, attempt_started_at=job.attempt_started_at, peak_memory_mb=3.5)
        for job in [*ours, *theirs, only_claimed]
    ]
    manual_clock.advance(2)
    assert stack.dispatcher.complete_many("mine", finished) == [True, True, False, False]
    estimate = results[0].estimated_millicredits
    with transaction(engine) as conn:
        statuses = dict(
            conn.execute(
                select(t.jobs.c.job_id, t.jobs.c.status).where(
                    t.jobs.c.job_id.in_([f.job_id for f in finished])
                )
            ).all()
        )
        attempts = conn.execute(
            select(t.attempts.c.job_id, t.attempts.c.status, t.attempts.c.duration_ms)
        ).all()
        ledger = conn.execute(
            select(t.credit_ledger.c.job_id, t.credit_ledger.c.amount_millicredits).where(
                t.credit_ledger.c.kind == "charge"
            )
        ).all()
        balance_after = _account(conn, person.caller.user_id)
    assert [statuses[f.job_id] for f in finished] == [
        "completed",
        "completed",
        "processing",
        "claimed",
    ]
    done = {ours[0].job_id, ours[1].job_id}
    assert {(a.job_id, a.status, a.duration_ms) for a in attempts if a.job_id in done} == {
        (job_id, "completed", 2000) for job_id in done
    }
    assert all(a.status == "running" for a in attempts if a.job_id not in done)
    assert sorted(ledger) == sorted((job_id, -estimate) for job_id in done)
    assert balance_after == (balance_before[0] - 2 * estimate, balance_before[1] - 2 * estimate)
    assert set(stack.queue.members("images")) == {theirs[0].job_id, only_claimed.job_id}
    stack.close()


def test_complete_many_ends_each_attempt_when_its_work_ended(engine, settings, manual_clock):
    """A worker commits its completions in batches: a job's attempt ends when its work
    did (``FinishedJob.attempt_finished_at``), not at the later commit of the batch it
    waited for, in its finished_at, its duration_ms and the duration metric; without
    one, at the commit. Known or read start, and a job taken ahead that began and ended
    since the last batch (started and completed in the same commit)."""
    stack = open_stack(settings, engine, manual_clock)
    stack.dispatcher.metrics = recorder = MemoryRecorder()
    person = make_user(stack)
    for _ in range(4):
        submit(stack, person, ["thumbnail"])
    t0 = manual_clock.now()
    known, read, no_end = stack.dispatcher.claim_and_start("images", WORKER, count=3)
    (ahead,) = stack.dispatcher.claim("images", WORKER, count=1)
    finished = [
        FinishedJob(known.job_id, attempt_started_at=t0, attempt_finished_at=t0 + 1.5),
        FinishedJob(read.job_id, attempt_finished_at=t0 + 2.25),
        FinishedJob(ahead.job_id, attempt_started_at=t0 + 1, attempt_finished_at=t0 + 3.125),
        FinishedJob(no_end.job_id, attempt_started_at=t0),
    ]
    manual_clock.advance(5)  # the batch commits well after they ended
    assert stack.dispatcher.complete_many(WORKER, finished, [(ahead, t0 + 1)]) == [True] * 4
    with transaction(engine) as conn:
        a = t.attempts.c
        attempts = {
            r.job_id: r
            for r in conn.execute(
                select(a.job_id, a.status, a.started_at, a.finished_at, a.duration_ms)
            )
        }
    expected = {
        known.job_id: (t0, t0 + 1.5, 1500),
        read.job_id: (t0, t0 + 2.25, 2250),
        ahead.job_id: (t0 + 1, t0 + 3.125, 2125),
        no_end.job_id: (t0, t0 + 5, 5000),
    }
    assert {
        job_id: (r.status, r.started_at, r.finished_at, r.duration_ms)
        for job_id, r in attempts.items()
    } == {
        job_id: ("completed", to_datetime(began), to_datetime(ended), ms)
        for job_id, (began, ended, ms) in expected.items()
    }
    labels = {"queue": "images", "operation": "thumbnail", "outcome": "completed"}
    # The job whose start the record had to read is not timed here (its start unknown).
    assert sorted(recorder.observations(JOB_DURATION, **labels)) == [1.5, 2.125, 5.0]
    stack.close()


def _second_begun(
    stack: Stack, clock: ManualClock, jobs: int
) -> tuple[MemoryRecorder, Person, float, list[ClaimedJob]]:
    """``jobs`` thumbnails taken by one claim, none started in the record; the second
    begun by its loop 3 s after the claim (its start only in the worker's completion
    batcher yet). The metrics recorder, the user, the claim's time and the jobs."""
    stack.dispatcher.metrics = recorder = MemoryRecorder()
    person = make_user(stack)
    for _ in range(jobs):
        submit(stack, person, ["thumbnail"])
    t0 = clock.now()
    taken = stack.dispatcher.claim_ahead("images", WORKER, jobs)
    assert not any(job.started for job in taken[1:])
    began = clock.advance(3)  # the loop reaches it once the first has run
    taken[1] = replace(taken[1], attempt_started_at=began, started=True)  # as the loop does
    return recorder, person, t0, taken


def test_a_job_taken_ahead_that_fails_before_its_start_is_written_is_timed_from_it(
    engine, settings, manual_clock
):
    """A loop took two jobs; the second, begun, fails while its start still waits in
    the worker's completion batcher (the record has it ``claimed``): its attempt is
    timed from when the loop began it, not from the claim, and the job has that
    started_at; its start is counted and its ``processing`` event goes out before the
    failure's. The start the batcher writes afterwards changes nothing."""
    stack = open_stack(settings, engine, manual_clock)
    recorder, _person, t0, (_first, second) = _second_begun(stack, manual_clock, 2)
    began = t0 + 3
    manual_clock.advance(0.5)
    status = stack.dispatcher.fail(second, WORKER, "boom", "it broke", retryable=True)
    assert status is JobStatus.RETRY_WAIT
    assert stack.dispatcher.complete_many(WORKER, [], [(second, began)]) == []
    with transaction(engine) as conn:
        a = t.attempts.c
        attempt = conn.execute(
            select(a.status, a.started_at, a.finished_at, a.duration_ms).where(
                a.job_id == second.job_id
            )
        ).one()
        job = _row(conn, second.job_id)
    assert tuple(attempt) == ("failed", to_datetime(began), to_datetime(t0 + 3.5), 500)
    assert job["status"] == "retry_wait" and job["started_at"] == to_datetime(began)
    assert recorder.total(JOBS_STARTED) == 2  # the first at its claim, the second once
    assert _statuses_published(stack, second.job_id) == ["claimed", "processing", "retry_wait"]
    stack.close()


def _statuses_published(stack, job_id: str) -> list[str]:
    return [e["status"] for _, e in stack.dispatcher.events.history(job_id)]


def _attempt_of(conn, job_id: str) -> tuple[object, ...]:
    a = t.attempts.c
    return tuple(
        conn.execute(
            select(a.status, a.started_at, a.finished_at, a.duration_ms).where(a.job_id == job_id)
        ).one()
    )


def test_a_job_taken_ahead_released_before_its_start_is_written_is_timed_from_it(
    engine, settings, manual_clock
):
    """A loop took three jobs; the worker drains (or has a spot notice) while the
    second, begun, still has its start waiting in the worker's completion batcher (the
    record has it ``claimed``): it is handed back with its released attempt timed from
    when the loop began it, not from the claim, and the job has that started_at. The
    third, never begun, goes back unstarted. The second's start is counted and its
    ``processing`` event goes out before the hand-back's. The start the batcher writes
    afterwards changes nothing."""
    stack = open_stack(settings, engine, manual_clock)
    recorder, _person, t0, (_first, second, third) = _second_begun(stack, manual_clock, 3)
    began = t0 + 3
    manual_clock.advance(0.5)
    assert stack.dispatcher.release(second, WORKER, reason_code="drain", reason="draining")
    assert stack.dispatcher.release(third, WORKER)
    assert stack.dispatcher.complete_many(WORKER, [], [(second, began)]) == []
    with transaction(engine) as conn:
        attempts = {job.job_id: _attempt_of(conn, job.job_id) for job in (second, third)}
        jobs = {job.job_id: _row(conn, job.job_id) for job in (second, third)}
    assert attempts[second.job_id] == (
        "released",
        to_datetime(began),
        to_datetime(t0 + 3.5),
        500,
    )
    assert jobs[second.job_id]["status"] == "queued"
    assert jobs[second.job_id]["started_at"] == to_datetime(began)
    assert jobs[second.job_id]["attempt_count"] == 0  # no attempt spent
    # Never begun: its attempt ran from the claim, the job was never started.
    assert attempts[third.job_id] == ("released", to_datetime(t0), to_datetime(t0 + 3.5), 3500)
    assert jobs[third.job_id]["status"] == "queued" and jobs[third.job_id]["started_at"] is None
    assert recorder.total(JOBS_STARTED) == 2  # the first at its claim, the second once
    assert _statuses_published(stack, second.job_id) == ["claimed", "processing", "queued"]
    assert _statuses_published(stack, third.job_id) == ["claimed", "queued"]
    stack.close()


def test_a_job_taken_ahead_cancelled_before_its_start_is_written_is_timed_from_it(
    engine, settings, manual_clock
):
    """A loop took two jobs; the second, begun, is cancelled by its user and the
    worker honours it while its start still waits in the completion batcher (the record
    has it ``claimed``): its cancelled attempt is timed from when the loop began it,
    not from the claim, and the job has that started_at; its start is counted and its
    ``processing`` event goes out before the cancel's. The start the batcher writes
    afterwards changes nothing."""
    stack = open_stack(settings, engine, manual_clock)
    recorder, person, t0, (_first, second) = _second_begun(stack, manual_clock, 2)
    began = t0 + 3
    manual_clock.advance(0.25)
    assert stack.ingest.cancel(person.caller, second.job_id) is JobStatus.CLAIMED
    manual_clock.advance(0.25)
    assert stack.dispatcher.honour_cancel(second, WORKER)
    assert stack.dispatcher.complete_many(WORKER, [], [(second, began)]) == []
    with transaction(engine) as conn:
        attempt = _attempt_of(conn, second.job_id)
        job = _row(conn, second.job_id)
    assert attempt == ("cancelled", to_datetime(began), to_datetime(t0 + 3.5), 500)
    assert job["status"] == "cancelled" and job["started_at"] == to_datetime(began)
    assert recorder.total(JOBS_STARTED) == 2  # the first at its claim, the second once
    assert _statuses_published(stack, second.job_id) == ["claimed", "processing", "cancelled"]
    stack.close()


def _account(conn, user_id: str) -> tuple[int, int]:
    acct = t.credit_accounts.c
    row = conn.execute(
        select(acct.balance_millicredits, acct.reserved_millicredits).where(acct.user_id == user_id)
    ).one()
    return int(row[0]), int(row[1])


def test_complete_many_registers_outputs_once_per_key(engine, settings, manual_clock):
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    job_ids = [submit(stack, person, ["thumbnail"])[0] for _ in range(3)]
    jobs = stack.dispatcher.claim_and_start("images", "w", count=3)
    assert sorted(j.job_id for j in jobs) == sorted(job_ids)
    finished = [
        FinishedJob(
            job.job_id,
            [OutputRecord("thumb.webp", f"derived/{job.job_id}/thumb.webp", 10, "image/webp")],
            attempt_started_at=job.attempt_started_at,
        )
        for job in jobs
    ]
    assert stack.dispatcher.complete_many("w", finished) == [True] * 3
    version = stack.catalog.get("thumbnail").version
    with transaction(engine) as conn:
        outputs = conn.execute(
            select(t.outputs.c.job_id, t.outputs.c.profile_version, t.outputs.c.storage_key)
        ).all()
        derived = conn.execute(
            select(func.count()).select_from(t.objects).where(t.objects.c.kind == "derived")
        ).scalar_one()
    assert sorted(outputs) == sorted(
        (j.job_id, version, f"derived/{j.job_id}/thumb.webp") for j in jobs
    )
    assert derived == 3
    stack.close()


def _stored_bytes(conn, user_id: str) -> int:
    return int(
        conn.execute(
            select(t.users.c.stored_bytes).where(t.users.c.user_id == user_id)
        ).scalar_one()
    )


def test_complete_many_with_one_key_written_twice_in_a_batch(engine, settings, manual_clock):
    """Two jobs of one batch that wrote the same key (the same operation asked twice of
    one object): one objects row, created by the first and resized by the second, both
    outputs pointing at it, the owner's stored bytes counting the last size once; and
    a key already stored before the batch, written twice in it, resized twice."""
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    fresh, stored = make_object(stack, person, 1000), make_object(stack, person, 2000)
    first = [submit(stack, person, ["thumbnail"], object_id=stored)[0]]
    (job,) = stack.dispatcher.claim_and_start("images", "w", count=1)
    old = OutputRecord("t.webp", f"derived/{stored}/t.webp", 50, "image/webp")
    assert stack.dispatcher.complete_many("w", [FinishedJob(job.job_id, [old])]) == [True]
    with transaction(engine) as conn:
        assert _stored_bytes(conn, person.caller.user_id) == 1000 + 2000 + 50

    again = [submit(stack, person, ["thumbnail"], object_id=o)[0] for o in (fresh, fresh)]
    again += [submit(stack, person, ["thumbnail"], object_id=stored)[0] for _ in range(2)]
    jobs = {j.job_id: j for j in stack.dispatcher.claim_and_start("images", "w", count=4)}
    sizes = dict(zip(again, (10, 30, 70, 20), strict=True))
    keys = dict(zip(again, (f"derived/{fresh}/t.webp",) * 2 + (old.storage_key,) * 2, strict=True))
    finished = [
        FinishedJob(
            job_id,
            [OutputRecord("t.webp", keys[job_id], sizes[job_id], "image/webp")],
            attempt_started_at=jobs[job_id].attempt_started_at,
        )
        for job_id in again
    ]
    assert stack.dispatcher.complete_many("w", finished) == [True] * 4
    with transaction(engine) as conn:
        rows = conn.execute(
            select(t.objects.c.storage_key, t.objects.c.object_id, t.objects.c.size_bytes).where(
                t.objects.c.kind == "derived"
            )
        ).all()
        pointed = dict(
            conn.execute(
                select(t.outputs.c.job_id, t.outputs.c.object_id).where(
                    t.outputs.c.job_id.in_(first + again)
                )
            ).all()
        )
        total = _stored_bytes(conn, person.caller.user_id)
    by_key = {r.storage_key: r for r in rows}
    assert sorted(by_key) == sorted(set(keys.values())) and len(rows) == 2
    assert by_key[keys[again[0]]].size_bytes == 30 and by_key[old.storage_key].size_bytes == 20
    assert {pointed[j] for j in again[:2]} == {by_key[keys[again[0]]].object_id}
    assert {pointed[j] for j in first + again[2:]} == {by_key[old.storage_key].object_id}
    assert total == 1000 + 2000 + 30 + 20
    stack.close()


def test_one_key_written_by_several_jobs_keeps_the_batchs_last_size(engine, settings):
    """The batch's order decides, whatever order the database answers the completing
    UPDATE in: four jobs of one object write one key, the batch lists them newest
    first, and the record keeps the size of the last one listed (the storage holds the
    last upload). PostgreSQL answered in its own order and the record kept another."""
    stack = open_stack(settings, engine, clock=None)
    person = make_user(stack)
    obj = make_object(stack, person, 1000)
    jobs = [submit(stack, person, ["thumbnail"], object_id=obj)[0] for _ in range(4)]
    claimed = {j.job_id: j for j in stack.dispatcher.claim_and_start("images", "w", count=4)}
    assert sorted(claimed) == sorted(jobs)
    key = f"derived/{obj}/t.webp"
    listed = list(reversed(jobs))
    sizes = dict(zip(listed, (40, 30, 20, 10), strict=True))
    finished = [
        FinishedJob(
            job_id,
            [OutputRecord("t.webp", key, sizes[job_id], "image/webp")],
            attempt_started_at=claimed[job_id].attempt_started_at,
        )
        for job_id in listed
    ]
    assert stack.dispatcher.complete_many("w", finished) == [True] * 4
    with transaction(engine) as conn:
        size = conn.execute(
            select(t.objects.c.size_bytes).where(t.objects.c.storage_key == key)
        ).scalar_one()
        outputs = dict(conn.execute(select(t.outputs.c.job_id, t.outputs.c.size_bytes)).all())
    assert size == 10
    assert outputs == sizes  # each output row keeps its own job's size
    stack.close()


def test_claim_and_start_never_gives_a_job_twice(engine, settings):
    stack = open_stack(settings, engine, clock=None)
    person = make_user(stack)
    obj = make_object(stack, person)
    requests = [SubmitRequest(object_id=obj, operations=["thumbnail"]) for _ in range(300)]
    job_ids = [r.job_ids[0] for r in stack.ingest.submit_many(person.caller, requests)]
    claimed: list[str] = []
    errors: list[BaseException] = []

    def drain(worker_id: str) -> None:
        try:
            while batch := stack.dispatcher.claim_and_start("images", worker_id, count=7):
                claimed.extend(job.job_id for job in batch)
                finished = [
                    FinishedJob(j.job_id, attempt_started_at=j.attempt_started_at) for j in batch
                ]
                assert all(stack.dispatcher.complete_many(worker_id, finished))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=drain, args=(f"w{i}",)) for i in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors
    assert Counter(claimed) == Counter(dict.fromkeys(job_ids, 1))
    with transaction(stack.engine) as conn:
        statuses: dict[str, int] = dict(
            conn.execute(select(t.jobs.c.status, func.count()).group_by(t.jobs.c.status)).all()
        )
        attempts = conn.execute(
            select(t.attempts.c.status, func.count()).group_by(t.attempts.c.status)
        ).all()
    assert statuses == {"completed": len(job_ids)}
    assert [tuple(a) for a in attempts] == [("completed", len(job_ids))]
    assert stack.queue.members("images") == {}
    stack.close()


def test_cancel_requested_among(engine, settings, manual_clock):
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    job_ids = [submit(stack, person, ["thumbnail"])[0] for _ in range(3)]
    jobs = stack.dispatcher.claim_and_start("images", WORKER, count=3)
    assert stack.dispatcher.cancel_requested_among([j.job_id for j in jobs]) == set()
    stack.ingest.cancel(person.caller, job_ids[1])
    assert stack.dispatcher.cancel_requested_among(job_ids) == {job_ids[1]}
    stack.close()
