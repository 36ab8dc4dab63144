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
-> delayed, terminal -> absent. PostgreSQL is the truth; the reconciler rebuilds
these keys from it, so losing Redis loses no job.
"""

from __future__ import annotations

from dataclasses import dataclass

WAKE_TOKENS_MAX = 256


@dataclass(frozen=True, slots=True)
class QueueKeys:
    ready: str
    leased: str
    owner: str
    delayed: str
    prio: str
    wake: str

    def all(self) -> tuple[str, ...]:
        return (self.ready, self.leased, self.owner, self.delayed, self.prio, self.wake)


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
    )


def events_key(prefix: str, job_id: str) -> str:
    """A job's event stream, and the pub/sub channel of its live events."""
    return f"{prefix}:events:{job_id}"


def rate_limit_prefix(prefix: str) -> str:
    """The key prefix the `limits` library writes under (it adds ``/<limit>/<identity>``)."""
    return f"{prefix}:ratelimit"
