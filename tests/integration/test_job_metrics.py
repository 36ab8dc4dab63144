"""What the head's /metrics says equals what the record says, on a controllable clock.

The dispatcher, the reaper and ingest count every job they move in the stack's
recorder (the head's prometheus-client registry here; an actor's is Ray's: see
test_metrics_scrape.py); the head's scrape reads queue depth, oldest age, in-flight
and retry-wait counts from Redis and the workers from the record."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from sqlalchemy import select

from hypermedia.clock import ManualClock, to_datetime
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.ids import created_at
from hypermedia.jobs.priority import BANDS, band_of
from hypermedia.jobs.states import JobStatus
from hypermedia.metrics.head import HeadMetrics
from tests.factories import add_worker_row, make_user, open_stack, submit
from tests.metrics_support import parse, sum_by


def _record(stack):
    with transaction(stack.engine) as conn:
        jobs = conn.execute(
            select(
                t.jobs.c.job_id,
                t.jobs.c.queue,
                t.jobs.c.operation,
                t.jobs.c.priority,
                t.jobs.c.status,
                t.jobs.c.error_code,
            )
        ).all()
        attempts = conn.execute(
            select(t.jobs.c.queue, t.jobs.c.operation, t.attempts.c.status, t.attempts.c.error_code)
            .select_from(t.attempts)
            .join(t.jobs, t.jobs.c.job_id == t.attempts.c.job_id)
        ).all()
    return jobs, attempts


def test_the_head_metrics_equal_the_record(engine, settings):
    clock = ManualClock(time.time())  # job ids carry the real time: ages line up
    stack = open_stack(settings, engine, clock)
    assert isinstance(stack.metrics, HeadMetrics)
    person = make_user(stack)
    thumbs = [submit(stack, person, ["thumbnail"], priority=2)[0] for _ in range(4)]
    (video,) = submit(stack, person, ["transcode_video"], priority=8)
    waiting = [submit(stack, person, ["ocr"], priority=5)[0] for _ in range(2)]
    beat = clock.now()
    add_worker_row(stack.engine, "w1", at=to_datetime(beat), queue="images", node_id="vps-node")
    add_worker_row(stack.engine, "w2", at=to_datetime(beat), queue="media", node_id="cloud-node")
    stack.metrics.place({"cloud-node": True})  # the scheduler's word: a spot instance

    clock.advance(7)
    first_claims = clock.now()
    claimed = stack.dispatcher.claim_and_start("images", "w1", 3)
    assert {job.job_id for job in claimed} < set(thumbs)
    clock.advance(2)
    assert stack.dispatcher.complete(claimed[0], "w1")
    stack.dispatcher.fail(claimed[1], "w1", "invalid_input", "bad bytes", retryable=False)
    stack.dispatcher.fail(claimed[2], "w1", "pipeline_crashed", "boom", retryable=True)
    later_claims = clock.now()
    (on_media,) = stack.dispatcher.claim_and_start("media", "w2")
    assert stack.dispatcher.recover_worker("w2", "node gone") == [video]  # queued again
    (last,) = stack.dispatcher.claim_and_start("images", "w3")
    clock.advance(stack.dispatcher.queue_lease_seconds("images") + 1)
    assert stack.reaper.tick().expired == 1  # lease_expired: waits for its retry
    assert on_media.job_id == video and last.job_id in thumbs

    samples = parse(stack.metrics.exposition().decode())
    jobs, attempts = _record(stack)
    by_job = Counter((j.queue, j.operation) for j in jobs)
    assert sum_by(samples, "hypermedia_jobs_submitted_total", ("queue", "operation")) == by_job
    started = Counter((a.queue, a.operation) for a in attempts)
    assert sum_by(samples, "hypermedia_jobs_started_total", ("queue", "operation")) == started
    completed = Counter((j.queue, j.operation) for j in jobs if j.status == "completed")
    assert completed == {("images", "thumbnail"): 1}
    assert sum_by(samples, "hypermedia_jobs_completed_total", ("queue", "operation")) == completed
    failed = Counter((j.queue, j.operation, j.error_code) for j in jobs if j.status == "failed")
    assert failed == {("images", "thumbnail", "invalid_input"): 1}
    assert sum_by(samples, "hypermedia_jobs_failed_total", ("queue", "operation", "code")) == failed
    # A failed attempt of a job that did not end failed was retried.
    retried = Counter(
        (a.queue, a.operation, a.error_code) for a in attempts if a.status == "failed"
    )
    retried.subtract(failed)
    assert +retried == {
        ("images", "thumbnail", "pipeline_crashed"): 1,
        ("images", "thumbnail", "lease_expired"): 1,
        ("media", "transcode_video", "worker_lost"): 1,
    }
    assert sum_by(samples, "hypermedia_jobs_retried_total", ("queue", "operation", "code")) == (
        +retried
    )

    # Durations: the completion and the two failures the worker reported (the
    # supervisor's and the reaper's are not timed); 2 s each on this clock.
    duration = sum_by(samples, "hypermedia_job_duration_seconds_count", ("outcome",))
    assert duration == {("completed",): 1, ("failed",): 2}
    assert sum_by(samples, "hypermedia_job_duration_seconds_sum", ("outcome",)) == {
        ("completed",): pytest.approx(2),
        ("failed",): pytest.approx(4),
    }
    # Queue wait: from each job's creation to its first attempt (3 thumbnails claimed
    # 7 s on, the video and the last thumbnail 9 s on).
    waits = sum_by(samples, "hypermedia_job_queue_wait_seconds_count", ("queue", "priority_band"))
    assert waits == {("images", "1-3"): 4, ("media", "7-10"): 1}
    images_wait = sum(first_claims - created_at(job.job_id) for job in claimed)
    images_wait += later_claims - created_at(last.job_id)
    assert sum_by(samples, "hypermedia_job_queue_wait_seconds_sum", ("queue",)) == {
        ("images",): pytest.approx(images_wait, abs=0.01),
        ("media",): pytest.approx(later_claims - created_at(video), abs=0.01),
    }

    # Read at scrape time: Redis's sets against the record's states.
    queued = Counter((j.queue, band_of(j.priority)) for j in jobs if j.status == "queued")
    # (the crashed thumbnail's retry came due while the lease ran out)
    assert queued == {("ocr", "4-6"): 2, ("media", "7-10"): 1, ("images", "1-3"): 1}
    depth = {
        (s.labels["queue"], s.labels["priority_band"]): s.value
        for s in samples
        if s.name == "hypermedia_queue_depth"
    }
    assert depth == {
        (q, band): queued.get((q, band), 0) for q in stack.queue.queues for band in BANDS
    }
    now = clock.now()
    oldest = {
        (s.labels["queue"], s.labels["priority_band"]): s.value
        for s in samples
        if s.name == "hypermedia_queue_oldest_age_seconds" and s.value
    }
    retried_thumb = next(j.job_id for j in jobs if j.status == "queued" and j.queue == "images")
    assert oldest == {
        ("ocr", "4-6"): pytest.approx(now - created_at(waiting[0]), abs=0.01),
        ("media", "7-10"): pytest.approx(now - created_at(video), abs=0.01),
        ("images", "1-3"): pytest.approx(now - created_at(retried_thumb), abs=0.01),
    }
    in_flight = Counter(j.queue for j in jobs if j.status in ("claimed", "processing"))
    assert sum_by(samples, "hypermedia_queue_in_flight", ("queue",)) == {
        (q,): n for q, n in in_flight.items()
    }
    retry_wait = Counter(j.queue for j in jobs if j.status == "retry_wait")
    assert retry_wait == {"images": 1}
    assert sum_by(samples, "hypermedia_queue_retry_wait", ("queue",)) == {("images",): 1}
    workers = sum_by(samples, "hypermedia_workers", ("queue", "state", "location", "spot"))
    assert workers == {
        ("images", "active", "vps", "false"): 1,
        ("media", "active", "cloud", "true"): 1,
    }
    assert sum_by(samples, "hypermedia_worker_heartbeat_age_seconds", ("queue",)) == {
        ("images",): pytest.approx(now - beat),
        ("media",): pytest.approx(now - beat),
    }
    stack.close()


def test_a_cancelled_attempt_is_timed_as_cancelled(engine, settings):
    """Jobs their owner cancelled while they ran: one its worker honoured the cancel
    of, one whose attempt failed first (a retry to follow), one whose attempt failed for
    good (an error not retryable). Both that failed ended cancelled, yet their attempts'
    durations went under ``outcome="failed"`` (and the honoured one's nowhere): a
    dashboard of failed attempts' times counted the owner's cancels. Now the outcome
    is the job's end: ``cancelled``, the three of them, none ``failed``."""
    clock = ManualClock(time.time())
    stack = open_stack(settings, engine, clock)
    assert isinstance(stack.metrics, HeadMetrics)
    person = make_user(stack)
    ids = [submit(stack, person, ["thumbnail"])[0] for _ in range(3)]
    honoured, retried, permanent = stack.dispatcher.claim_and_start("images", "w1", 3)
    assert [job.job_id for job in (honoured, retried, permanent)] == ids
    for job_id in ids:
        assert stack.ingest.cancel(person.caller, job_id) is JobStatus.PROCESSING
    clock.advance(2)
    assert stack.dispatcher.honour_cancel(honoured, "w1")
    assert stack.dispatcher.fail(retried, "w1", "pipeline_crashed", "boom") is JobStatus.CANCELLED
    clock.advance(1)
    status = stack.dispatcher.fail(permanent, "w1", "invalid_input", "bad", retryable=False)
    assert status is JobStatus.CANCELLED

    samples = parse(stack.metrics.exposition().decode())
    duration = sum_by(samples, "hypermedia_job_duration_seconds_count", ("outcome",))
    assert duration == {("cancelled",): 3}
    assert sum_by(samples, "hypermedia_job_duration_seconds_sum", ("outcome",)) == {
        ("cancelled",): pytest.approx(2 + 2 + 3)
    }
    stack.close()


def test_a_scrape_with_redis_down_still_answers_with_the_rest(engine, settings, private_redis):
    stack = open_stack(settings, engine, None, redis_url=private_redis.url)
    add_worker_row(stack.engine, "w1", at=to_datetime(stack.clock.now()), queue="images")
    private_redis.stop()
    assert isinstance(stack.metrics, HeadMetrics)
    samples = parse(stack.metrics.exposition().decode())
    names = {s.name for s in samples}
    assert "hypermedia_queue_depth" not in names
    assert sum_by(samples, "hypermedia_workers", ("queue",)) == {("images",): 1}
    stack.close()
