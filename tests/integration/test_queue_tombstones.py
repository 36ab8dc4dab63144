"""Tombstones: a job removed as ended is not put back by a push that read it as live."""

from __future__ import annotations

import time
from types import SimpleNamespace

from hypermedia.queue import redis_queue
from hypermedia.queue.keys import ENDED_KEPT_SECONDS
from hypermedia.queue.redis_queue import RedisQueue, Restore
from tests.factories import make_object, make_user, open_stack, submit


def test_no_push_puts_back_a_job_removed_as_ended(redis_client, redis_prefix):
    queue = RedisQueue(redis_client, redis_prefix, ["images"])
    queue.remove("images", ["ended"])  # a cancel whose job was not pushed yet
    assert queue.enqueue("images", [("ended", 5), ("live", 5)]) == 1
    queue.delay("images", [("ended", time.time() + 60)])
    assert queue.restore("images", [Restore("ready", "ended", 5)]) == 0
    assert queue.members("images") == {"live": "ready"}
    assert redis_client.hkeys(queue.keys("images").prio) == ["live"]
    assert queue.priority_heads("images") == {5: (1, "live")}
    # A live job cleared only to be put elsewhere (mirroring a lease) gets no tombstone.
    queue.remove("images", ["live"], tombstone=False)
    assert queue.restore("images", [Restore("leased", "live", 5, time.time() + 60, "w")]) == 1
    assert queue.members("images") == {"live": "leased"}
    assert redis_client.zrange(queue.keys("images").ended, 0, -1) == ["ended"]


def test_tombstones_are_kept_their_time_then_trimmed(redis_client, redis_prefix, monkeypatch):
    queue = RedisQueue(redis_client, redis_prefix, ["images"])
    ended = queue.keys("images").ended
    queue.remove("images", ["old"])
    kept_ms = ENDED_KEPT_SECONDS * 1000
    assert kept_ms - 5000 < redis_client.pttl(ended) <= kept_ms  # gone with the queue idle
    later = time.time() + ENDED_KEPT_SECONDS - 5
    monkeypatch.setattr(redis_queue, "time", SimpleNamespace(time=lambda: later))
    queue.remove("images", ["newer"])  # within the time: both kept
    assert sorted(redis_client.zrange(ended, 0, -1)) == ["newer", "old"]
    later += 10
    queue.remove("images", ["newest"])  # past it: the oldest trimmed
    assert sorted(redis_client.zrange(ended, 0, -1)) == ["newer", "newest"]
    assert queue.enqueue("images", [("old", 5), ("newer", 5)]) == 1
    assert queue.ready_ids("images") == ["old"]  # a push that late: the reconciler's pass


def test_a_completion_leaves_no_tombstone_and_a_cancel_does(engine, settings, manual_clock):
    """A tombstone per completion would hold Redis's memory in proportion to the drain
    rate (130 bytes x 300 s x completions a second): only jobs that ended otherwise
    (cancelled here) get one; the push a completion could race was its own."""
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    done, cancelled = (
        submit(stack, person, ["thumbnail"], object_id=make_object(stack, person))[0]
        for _ in range(2)
    )
    (job,) = stack.dispatcher.claim("images", "w1")
    assert job.job_id == done
    stack.dispatcher.start(job, "w1")
    assert stack.dispatcher.complete(job, "w1", [])
    stack.ingest.cancel(person.caller, cancelled)
    tombstones = stack.queue.keys("images").ended
    assert stack.queue.client.zrange(tombstones, 0, -1) == [cancelled]
    stack.close()
