"""The Redis key schema: every key hypermedia writes, in one place.

``{p}`` is the configured prefix (``redis_prefix``, default ``hm``), ``{q}`` a
queue name (``images``, ``documents``, ``ocr``, ``media``, ``bulk`` ...).

===========================  ======  ==================================================
key                          type    contents
===========================  ======  ==================================================
``{p}:ready:{q}``            ZSET    jobs waiting to be claimed. member = job id,
                                     score = priority (1 first). Equal scores leave in
                                     lexicographic member order, and job ids are
                                     time-ordered (:mod:`hypermedia.ids`), so the set
                                     pops by priority, then age.
``{p}:leased:{q}``           ZSET    claimed jobs. score = lease deadline (epoch ms).
``{p}:owner:{q}``            HASH    job id -> worker id holding the lease.
``{p}:delayed:{q}``          ZSET    jobs in retry_wait. score = due time (epoch ms).
``{p}:prio:{q}``             HASH    job id -> priority, for every job in any of the
                                     three sets, so a job returns to ``ready`` with its
                                     own priority.
``{p}:wake:{q}``             LIST    wake-up tokens for idle claimers (BLPOP), trimmed
                                     to ``WAKE_TOKENS_MAX``.
``{p}:wake:{q}:{worker_id}`` LIST    wake-up tokens for one worker's idle claim loops,
                                     pushed when it stops claiming (a drain, a spot
                                     notice, a stop): one a loop, gone
                                     ``WORKER_WAKE_TTL_SECONDS`` after.
``{p}:ended:{q}``            ZSET    tombstones: jobs taken off as ended (terminal in
                                     the record, or unknown to it). member = job id,
                                     score = when (epoch ms). A push (enqueue, delay,
                                     restore) skips a job found here, so one that read
                                     the job as live before it ended (a submit between
                                     its commit and its push) cannot make it ready
                                     again. Kept at least ``ENDED_KEPT_SECONDS``: each
                                     removal trims older entries and renews the key's
                                     expiry by as much.
``{p}:reconciled``           STRING  epoch seconds of the last complete reconcile. Its
                                     absence (FLUSHALL, a restart that lost the data)
                                     asks for a reconcile at once.
``{p}:events:{job_id}``      STREAM  the job's recent events (:mod:`hypermedia.queue.events`):
                                     field ``e`` = the event's JSON, at most
                                     ``EVENTS_KEPT`` entries (the oldest trimmed), gone
                                     ``EVENTS_TTL_SECONDS`` after the last one
                                     (``ENDED_TTL_SECONDS`` after a terminal one). Its
                                     name is also the pub/sub channel each event is
                                     published on, as ``"<entry id> <JSON>"``.
``{p}:ratelimit:LIMITER/…``  LIST    rate-limit moving windows, written by the `limits`
                                     library (:mod:`hypermedia.ratelimit`): submits per
                                     API key, uploads per user
                                     (``…/{what}/{identity}/{n}/1/minute``). Losing them
                                     only resets the windows.
===========================  ======  ==================================================

A job id is in at most one of ready / leased / delayed. Redis mirrors the job
record: ``queued`` -> ready, ``claimed``/``processing`` -> leased, ``retry_wait``
-> delayed, terminal -> absent (and in ended for a while). PostgreSQL is the truth;
the reconciler rebuilds these keys from it, so losing Redis loses no job.

A terminal job never becomes live again, so a tombstone is never wrong, only
bounded: a push later than ``ENDED_KEPT_SECONDS`` after the job's removal (or one
after a removal that could not reach Redis) leaves it ready until the reconciler's
next pass drops it.
"""

from __future__ import annotations

from dataclasses import dataclass

WAKE_TOKENS_MAX = 256
# A worker's own wake-up tokens outlive its stop by this (those no loop took: a loop
# busy with a job when they came).
WORKER_WAKE_TTL_SECONDS = 60
# Far longer than a commit -> push gap can be (the client gives a push up after about
# 45 s: 4 tries of a 10 s timeout); beyond it the reconciler's pass is the safety net.
ENDED_KEPT_SECONDS = 300


@dataclass(frozen=True, slots=True)
class QueueKeys:
    ready: str
    leased: str
    owner: str
    delayed: str
    prio: str
    wake: str
    ended: str

    def all(self) -> tuple[str, ...]:
        return (
            self.ready,
            self.leased,
            self.owner,
            self.delayed,
            self.prio,
            self.wake,
            self.ended,
        )


def reconciled_key(prefix: str) -> str:
    return f"{prefix}:reconciled"


def queue_keys(prefix: str, queue: str) -> QueueKeys:
    return QueueKeys(
        ready=f"{prefix}:ready:{queue}",
        leased=f"{prefix}:leased:{queue}",
        owner=f"{prefix}:owner:{queue}",
        delayed=f"{prefix}:delayed:{queue}",
        prio=f"{prefix}:prio:{queue}",
        wake=f"{prefix}:wake:{queue}",
        ended=f"{prefix}:ended:{queue}",
    )


def worker_wake_key(prefix: str, queue: str, worker_id: str) -> str:
    """One worker's wake-up list on ``queue`` (queue names have no colon)."""
    return f"{prefix}:wake:{queue}:{worker_id}"


def events_key(prefix: str, job_id: str) -> str:
    """A job's event stream, and the pub/sub channel of its live events."""
    return f"{prefix}:events:{job_id}"


def rate_limit_prefix(prefix: str) -> str:
    """The key prefix the `limits` library writes under (it adds ``/<limit>/<identity>``)."""
    return f"{prefix}:ratelimit"
