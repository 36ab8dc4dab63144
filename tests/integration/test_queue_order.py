"""Priority-then-age order, on both databases, through the real submit and claim path."""

from __future__ import annotations

import random
import time

from hypermedia import ids
from hypermedia.ingest.service import SubmitRequest
from tests.factories import make_object, make_user, open_stack


def test_thousand_jobs_leave_by_priority_then_age(engine, settings, manual_clock):
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    obj = make_object(stack, person)
    rng = random.Random(7)
    submitted: list[tuple[int, int, str]] = []  # (priority, submit order, job id)
    order = 0
    for _batch in range(10):
        requests = [
            SubmitRequest(object_id=obj, operations=["thumbnail"], priority=rng.randint(1, 10))
            for _ in range(100)
        ]
        for request, result in zip(
            requests, stack.ingest.submit_many(person.caller, requests), strict=True
        ):
            assert request.priority is not None
            submitted.append((request.priority, order, result.job_ids[0]))
            order += 1
        manual_clock.advance(0.5)

    # What the scheduler reads: per priority, how many and the oldest.
    heads = stack.queue.priority_heads("images")
    for priority in range(1, 11):
        mine = [job_id for p, _o, job_id in sorted(submitted) if p == priority]
        assert heads.get(priority) == ((len(mine), mine[0]) if mine else None)
    first = min(submitted, key=lambda s: s[1])[2]
    assert abs(ids.created_at(first) - time.time()) < 120

    claimed: list[str] = []
    while batch := stack.dispatcher.claim("images", "worker-1", count=37):
        claimed.extend(job.job_id for job in batch)

    expected = [job_id for _p, _o, job_id in sorted(submitted)]
    assert len(claimed) == 1000
    assert claimed == expected
    # Every claim was a real claim in the record: one attempt each.
    views = [stack.ingest.get_job(person.caller, job_id) for job_id in claimed[:5]]
    assert all(v.status == "claimed" and v.attempt_count == 1 for v in views)
    stack.close()


def test_default_priority_comes_from_the_profile(engine, settings, manual_clock):
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    obj = make_object(stack, person)
    result = stack.ingest.submit(
        person.caller, SubmitRequest(object_id=obj, operations=["thumbnail", "regenerate"])
    )
    by_op = {j.operation: j for j in result.jobs}
    assert by_op["thumbnail"].priority == stack.catalog.get("thumbnail").default_priority
    assert by_op["regenerate"].priority == stack.catalog.get("regenerate").default_priority
    assert by_op["regenerate"].queue == "bulk"
    assert stack.queue.ready_ids("bulk") == [by_op["regenerate"].job_id]
    stack.close()


def test_unlease_returns_only_the_workers_own_leases_in_their_order(redis_client, redis_prefix):
    from hypermedia.queue.redis_queue import RedisQueue

    queue = RedisQueue(redis_client, redis_prefix, ["images"])
    jobs = [(f"job-{index:02d}", 1 + index % 3) for index in range(9)]
    queue.enqueue("images", jobs)
    order = queue.ready_ids("images")
    mine = queue.claim("images", "w-1", 60, time.time(), count=6)
    theirs = queue.claim("images", "w-2", 60, time.time(), count=3)
    # w-1 may hand back only what it holds: w-2's leases stay put.
    assert queue.unlease("images", "w-1", [*mine, *theirs]) == 6
    assert queue.ready_ids("images") == order[:6]
    assert sorted(j for j, where in queue.members("images").items() if where == "leased") == sorted(
        entry.job_id for entry in theirs
    )
