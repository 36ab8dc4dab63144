"""The job state machine and retry backoff. Pure: no I/O, no clock of its own.

::

    created --enqueue--> queued --claim--> claimed --start--> processing --complete--> completed
    claimed | processing --fail--> retry_wait --due--> queued
    claimed | processing --fail--> failed           (attempts used up, or not retryable)
    claimed | processing --fail--> cancelled        (its owner asked to cancel it meanwhile)
    claimed | processing --fail--> retry_wait       (the platform's outage: attempt not counted)
    claimed | processing --release--> queued        (drain, spot notice: attempt not counted)
    created | queued | retry_wait --cancel--> cancelled
    claimed | processing --cancel--> cancelled      (by the worker, honouring cancel_requested)

``transition(status, event)`` answers the next status or raises
:class:`~hypermedia.errors.IllegalTransition`. The repository turns every legal
transition into ``UPDATE ... WHERE status IN (<allowed sources>)`` so that an
illegal change is impossible in the database too, not merely unlikely.

Backoff: attempt *n* (1-based) failed -> wait ``base x 2^(n-1)``: 1, 2, 4, 8 ... minutes
with the default base of 60 s, capped at ``max_seconds``.

An attempt that the platform's outage ended (the record, Redis or the storage down
when the worker asked the head for its job's URLs: a
:class:`~hypermedia.errors.ServiceUnavailable`, not anything of the job's own) is
handed back without counting against ``max_attempts``: the job waits
:data:`OUTAGE_BACKOFF` by the number of such hand backs (15 s, 30 s ... 5 min), at most
:data:`OUTAGE_HANDBACKS` times; after that each one counts as a failed attempt again, so
a job on a platform broken for good, or one that alone meets a refusal every time (an
output key whose earlier blob the storage never finishes deleting), still ends.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from hypermedia.errors import IllegalTransition


class JobStatus(enum.StrEnum):
    CREATED = "created"
    QUEUED = "queued"
    CLAIMED = "claimed"
    PROCESSING = "processing"
    COMPLETED = "completed"
    RETRY_WAIT = "retry_wait"
    FAILED = "failed"
    CANCELLED = "cancelled"


class JobEvent(enum.StrEnum):
    ENQUEUE = "enqueue"
    CLAIM = "claim"
    START = "start"
    COMPLETE = "complete"
    FAIL = "fail"
    RETRY_DUE = "retry_due"
    RELEASE = "release"
    CANCEL = "cancel"


TERMINAL: frozenset[JobStatus] = frozenset(
    {JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED}
)
IN_FLIGHT: frozenset[JobStatus] = frozenset({JobStatus.CLAIMED, JobStatus.PROCESSING})

S, E = JobStatus, JobEvent
_TABLE: dict[tuple[JobStatus, JobEvent], JobStatus] = {
    (S.CREATED, E.ENQUEUE): S.QUEUED,
    (S.CREATED, E.CANCEL): S.CANCELLED,
    (S.QUEUED, E.CLAIM): S.CLAIMED,
    (S.QUEUED, E.CANCEL): S.CANCELLED,
    (S.CLAIMED, E.START): S.PROCESSING,
    (S.CLAIMED, E.FAIL): S.RETRY_WAIT,
    (S.CLAIMED, E.RELEASE): S.QUEUED,
    (S.CLAIMED, E.CANCEL): S.CANCELLED,
    (S.PROCESSING, E.COMPLETE): S.COMPLETED,
    (S.PROCESSING, E.FAIL): S.RETRY_WAIT,
    (S.PROCESSING, E.RELEASE): S.QUEUED,
    (S.PROCESSING, E.CANCEL): S.CANCELLED,
    (S.RETRY_WAIT, E.RETRY_DUE): S.QUEUED,
    (S.RETRY_WAIT, E.CANCEL): S.CANCELLED,
}
del S, E


def transition(status: JobStatus, event: JobEvent) -> JobStatus:
    """The status after ``event``; raises IllegalTransition if the machine forbids it.

    ``FAIL`` answers ``retry_wait``; whether it becomes ``failed`` instead is
    :func:`decide_failure`'s call, which needs the attempt count.
    """
    try:
        return _TABLE[(status, event)]
    except KeyError:
        raise IllegalTransition(
            f"cannot {event.value} a job that is {status.value}",
            status=status.value,
            event=event.value,
        ) from None


def sources(event: JobEvent) -> frozenset[JobStatus]:
    """Every status from which ``event`` is legal: the guard of its UPDATE."""
    return frozenset(src for (src, ev) in _TABLE if ev is event)


def is_legal(status: JobStatus, event: JobEvent) -> bool:
    return (status, event) in _TABLE


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff: ``base_seconds x 2^(attempt-1)``, capped."""

    base_seconds: float = 60.0
    max_seconds: float = 3600.0

    def delay(self, attempt: int) -> float:
        if attempt < 1:
            raise ValueError("attempt numbers start at 1")
        # Cap the exponent first so a huge attempt number cannot overflow.
        exponent = min(attempt - 1, 62)
        return float(min(self.base_seconds * (2**exponent), self.max_seconds))


# The waits of a job handed back for the platform's outage, by the number of the hand
# back: 15, 30, 60, 120, 240, then 300 s, as a worker's outage pause grows (a worker
# that met the outage claims nothing for as long; the others would meet it too).
OUTAGE_BACKOFF = Backoff(base_seconds=15.0, max_seconds=300.0)
# How many outages a job rides out without spending an attempt: with their waits (and
# the claims between), the first ~33 minutes of outage a job meets. The worker's outage
# pause bounds nothing per job: it is a worker's, it ends when any job completes, and
# every other worker claims the job handed back.
OUTAGE_HANDBACKS = 10


@dataclass(frozen=True, slots=True)
class FailureDecision:
    """What a failed attempt leads to, and why; ``counted``: whether the attempt counts
    against ``max_attempts`` (not one the platform's outage ended: :func:`decide_outage`)."""

    status: JobStatus
    retry_at: float | None
    reason: str
    counted: bool = True


def decide_failure(
    attempt_count: int, max_attempts: int, now: float, backoff: Backoff, *, retryable: bool = True
) -> FailureDecision:
    """After attempt ``attempt_count`` failed at ``now`` (epoch seconds): retry or give up."""
    if not retryable:
        return FailureDecision(JobStatus.FAILED, None, "error is not retryable")
    if attempt_count >= max_attempts:
        return FailureDecision(
            JobStatus.FAILED, None, f"attempt {attempt_count} of {max_attempts} failed"
        )
    delay = backoff.delay(attempt_count)
    return FailureDecision(
        JobStatus.RETRY_WAIT,
        now + delay,
        f"attempt {attempt_count} of {max_attempts} failed; retry in {delay:g}s",
    )


def decide_outage(
    attempt_count: int, max_attempts: int, handed_back: int, now: float, backoff: Backoff
) -> FailureDecision:
    """Attempt ``attempt_count`` ended at ``now`` by the platform's outage, after
    ``handed_back`` earlier hand backs of the job for one: back to retry_wait, the
    attempt not counted, while fewer than :data:`OUTAGE_HANDBACKS`; then a failed
    attempt like any other (:func:`decide_failure` with ``backoff``)."""
    if handed_back < OUTAGE_HANDBACKS:
        delay = OUTAGE_BACKOFF.delay(handed_back + 1)
        return FailureDecision(
            JobStatus.RETRY_WAIT,
            now + delay,
            f"the platform's outage, not counted ({handed_back + 1} of {OUTAGE_HANDBACKS});"
            f" retry in {delay:g}s",
            counted=False,
        )
    decision = decide_failure(attempt_count, max_attempts, now, backoff)
    return FailureDecision(
        decision.status,
        decision.retry_at,
        f"{decision.reason} (the platform's outage: {OUTAGE_HANDBACKS} not counted already)",
    )
