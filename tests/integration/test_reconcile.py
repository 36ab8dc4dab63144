"""Postgres is the truth: Redis wiped or killed with -9 loses no job."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter

from sqlalchemy import func, select

from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.errors import QueueUnavailable
from hypermedia.ingest.service import SubmitRequest
from hypermedia.jobs.reaper import reconcile
from hypermedia.stack import Stack
from tests import support
from tests.factories import make_object, make_user, open_stack


def _statuses(engine) -> dict[str, int]:
    with transaction(engine) as conn:
        return dict(
            conn.execute(select(t.jobs.c.status, func.count()).group_by(t.jobs.c.status)).all()
        )


def _redis_view(stack: Stack) -> dict[str, str]:
    view: dict[str, str] = {}
    for queue in stack.queue.queues:
        for job_id, target in stack.queue.members(queue).items():
            assert job_id not in view, f"{job_id} is in two queues"
            view[job_id] = target
    return view


def test_flushall_then_reconcile_restores_every_job_exactly_once(
    engine, settings, manual_clock, private_redis
):
    stack = open_stack(settings, engine, manual_clock, redis_url=private_redis.url)
    person = make_user(stack)
    obj = make_object(stack, person)
    ops = ["thumbnail", "pdf_preview", "ocr", "transcode_audio", "regenerate"]
    requests = [SubmitRequest(object_id=obj, operations=ops) for _ in range(60)]
    stack.ingest.submit_many(person.caller, requests)  # 300 jobs in five queues
    # Put jobs in every live state: in flight, retry_wait, completed, cancelled.
    in_flight = stack.dispatcher.claim("images", "w1", count=10)
    for job in in_flight[:5]:
        stack.dispatcher.start(job, "w1")
    waiting = stack.dispatcher.claim("ocr", "w2", count=7)
    for job in waiting:
        stack.dispatcher.start(job, "w2")
        stack.dispatcher.fail(job, "w2", "engine_error", "boom")
    done = stack.dispatcher.claim("documents", "w3", count=9)
    for job in done:
        stack.dispatcher.start(job, "w3")
        stack.dispatcher.complete(job, "w3")
    cancelled = stack.queue.ready_ids("bulk")[:4]
    for job_id in cancelled:
        stack.ingest.cancel(person.caller, job_id)

    before = _redis_view(stack)
    assert Counter(before.values()) == {"ready": 300 - 10 - 7 - 9 - 4, "leased": 10, "delayed": 7}

    stack.redis.flushall()
    assert _redis_view(stack) == {}
    report = reconcile(stack.engine, stack.queue)
    assert report.total_restored == len(before)
    assert _redis_view(stack) == before  # same jobs, same sets, each exactly once
    # Priorities came back too: ready order is unchanged.
    assert reconcile(stack.engine, stack.queue).total_restored == 0

    # Everything still runs to the end, once.
    manual_clock.advance(61)  # past the first retry's backoff, inside every lease
    assert stack.reaper.tick().promoted == 7
    for job in in_flight:
        if job in in_flight[:5]:
            assert stack.dispatcher.complete(job, "w1")
        else:
            assert stack.dispatcher.start(job, "w1")
            assert stack.dispatcher.complete(job, "w1")
    executed: Counter[str] = Counter()
    for queue in stack.queue.queues:
        while batch := stack.dispatcher.claim(queue, "drain", count=50):
            for job in batch:
                executed[job.job_id] += 1
                stack.dispatcher.start(job, "drain")
                stack.dispatcher.complete(job, "drain")
    assert max(executed.values()) == 1
    assert _statuses(stack.engine) == {"completed": 296, "cancelled": 4}
    assert _redis_view(stack) == {}
    stack.close()


def test_reconcile_drops_entries_the_record_no_longer_wants(engine, settings, manual_clock):
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    obj = make_object(stack, person)
    result = stack.ingest.submit(person.caller, SubmitRequest(object_id=obj, operations=["ocr"]))
    (job,) = stack.dispatcher.claim("ocr", "w")
    stack.dispatcher.start(job, "w")
    stack.dispatcher.complete(job, "w")
    # Stale entries: a finished job and an id the record never had. The finished one
    # is pushed after its tombstone is gone (a push that late, or a removal that never
    # reached Redis): the reconciler is what drops it then.
    stack.queue.client.delete(stack.queue.keys("ocr").ended)
    stack.queue.enqueue("ocr", [(result.job_ids[0], 4), ("f" * 32, 1)])
    report = reconcile(stack.engine, stack.queue)
    assert report.removed["ocr"] == 2
    assert stack.queue.members("ocr") == {}
    stack.close()


def test_submit_survives_redis_outage_and_reconcile_enqueues(
    settings, sqlite_engine, private_redis
):
    stack = open_stack(settings, sqlite_engine, None, redis_url=private_redis.url)
    person = make_user(stack)
    obj = make_object(stack, person)
    private_redis.kill()
    result = stack.ingest.submit(person.caller, SubmitRequest(object_id=obj, operations=["ocr"]))
    assert _statuses(stack.engine) == {"queued": 1}
    private_redis.restart()
    assert stack.queue.members("ocr") == {}
    reconcile(stack.engine, stack.queue)
    assert stack.queue.ready_ids("ocr") == result.job_ids
    stack.close()


def test_redis_killed_mid_run_loses_nothing(pg_engine, settings, private_redis):
    """A producer and two consumers run; Redis is killed with -9 and restarted twice."""
    stack = Stack.open(settings(redis_url=private_redis.url), engine=pg_engine, auto_migrate=True)
    person = make_user(stack)
    obj = make_object(stack, person)
    total = 600
    submitted: list[str] = []
    executed: Counter[str] = Counter()
    lock = threading.Lock()
    producing = threading.Event()
    producing.set()
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            for i in range(total):
                request = SubmitRequest(
                    object_id=obj, operations=["thumbnail"], priority=1 + i % 10
                )
                submitted.extend(stack.ingest.submit(person.caller, request).job_ids)
        except BaseException as exc:
            errors.append(exc)
        finally:
            producing.clear()

    give_up = time.monotonic() + 180

    def running() -> bool:
        # A thread that died ends the run: its error is the failure, not a hang; so
        # does a job that never completes (the statuses below then show where it is).
        if errors or time.monotonic() > give_up:
            return False
        return producing.is_set() or _statuses(stack.engine).get("completed", 0) < total

    def consume(worker_id: str) -> None:
        try:
            while running():
                try:
                    batch = stack.dispatcher.claim("images", worker_id, count=5)
                except QueueUnavailable:
                    time.sleep(0.05)
                    continue
                if not batch:
                    time.sleep(0.01)
                    continue
                for job in batch:
                    with lock:
                        executed[job.job_id] += 1
                    stack.dispatcher.start(job, worker_id)
                    stack.dispatcher.complete(job, worker_id)
        except BaseException as exc:
            errors.append(exc)

    def reconcile_loop() -> None:
        try:
            while running():
                with contextlib.suppress(QueueUnavailable):
                    reconcile(stack.engine, stack.queue)
                time.sleep(0.2)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=produce)]
    threads += [threading.Thread(target=consume, args=(f"c{i}",)) for i in range(2)]
    threads.append(threading.Thread(target=reconcile_loop))
    for th in threads:
        th.start()
    kills = 0
    deadline = time.monotonic() + 120
    while kills < 2 and time.monotonic() < deadline:
        if len(submitted) >= (kills + 1) * total // 3:
            private_redis.kill()  # SIGKILL: no persistence, everything in Redis is gone
            kills += 1
            time.sleep(0.3)
            private_redis.restart()
        time.sleep(0.01)
    for th in threads:
        th.join(180)
    assert kills == 2
    assert not errors, errors
    assert len(submitted) == total
    assert set(executed) == set(submitted)
    assert max(executed.values()) == 1
    assert _statuses(stack.engine) == {"completed": total}
    stack.close()


def test_a_reconcile_takes_no_write_lock(sqlite_engine, settings, manual_clock):
    """The reconciler reads the record (every minute, a transaction a queue) and writes
    only to Redis. Its reads were write transactions: on SQLite the write lock (BEGIN
    IMMEDIATE) a queue, held while every live job of the queue was read, every API
    submit and worker completion waiting meanwhile. Now they are snapshots."""
    stack = open_stack(settings, sqlite_engine, manual_clock)
    person = make_user(stack)
    obj = make_object(stack, person)
    result = stack.ingest.submit(person.caller, SubmitRequest(object_id=obj, operations=["ocr"]))
    stack.queue.client.delete(*stack.queue.keys("ocr").all())  # lost from Redis
    stack.queue.enqueue("ocr", [("f" * 32, 1)])  # a job the record never had
    with support.write_locks(stack.engine) as taken:
        report = reconcile(stack.engine, stack.queue)
    assert (report.restored["ocr"], report.removed["ocr"]) == (1, 1)
    assert stack.queue.members("ocr") == {result.job_ids[0]: "ready"}
    assert taken == []
    stack.close()
