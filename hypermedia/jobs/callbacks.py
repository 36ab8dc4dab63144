"""The callback outbox (``job_callbacks``): a job's terminal event for the
``callback_url`` its submit named.

A job that reaches completed, failed or cancelled with a ``callback_url`` gets one row
here, written by :class:`~hypermedia.jobs.repository.JobRepository` in the same
transaction (the same statement, in PostgreSQL's group commit) as the status: either
both are durable or neither. The head's sender (:mod:`hypermedia.callbacks`) works
through the rows; a head killed between that commit and its send finds the row
``pending`` when it starts again, so nothing is lost.

A row's ``event_id`` is ``md5("<job_id>:<event>")``: a terminal status is final, so a
job has one such event, and every attempt to deliver it carries the same id (the
webhook's ``X-Hypermedia-Delivery``), whoever sends it.

Delivery states: ``pending`` (due at ``next_attempt_at``) -> ``delivered`` (a 2xx
answer) | ``failed`` (the sender's attempt limit reached). A ``delivered`` row is kept
``callback_delivered_retention_seconds`` (a day) after its delivery, a ``failed`` one
``callback_failed_retention_seconds`` (7 days) after its last attempt; then the head's
maintenance deletes it (:func:`prune`, a bounded number of batches a call), keeping on
its job what became of it (``processing_jobs.callback_status``, ``callback_attempts``):
the job, kept for ever, still shows its callback delivered or given up, without the
outbox's times and last answer; the outbox holds a day of deliveries, not every one. A
receiver that does not answer has its other due rows postponed (:func:`postpone`)
behind the one retried, their attempts uncounted. An attempt is claimed by a guarded
UPDATE (the attempt count and due time as read) that pushes
``next_attempt_at`` past the attempt's timeout, so two senders never send one attempt
twice and one that dies mid-send leaves the row due again later. Delivery is at least
once: a sender killed after the receiver answered but before it wrote ``delivered``
sends again, with the same event id.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, Row, String, delete, insert, literal, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql import func

from hypermedia.clock import to_datetime, to_epoch
from hypermedia.db import tables as t
from hypermedia.db.engine import snapshot, transaction

PENDING = "pending"
DELIVERED = "delivered"
FAILED = "failed"

# The window of the callbacks given up that the metrics count (hypermedia_callbacks_failed).
FAILED_WINDOW_SECONDS = 3600.0
# Rows one transaction of prune deletes, and the transactions one call runs: a
# longer backlog is left to the next call (the head's maintenance makes it soon), so a
# call never holds the maintenance thread (the reaper) for a whole backlog.
PRUNE_BATCH = 1000
PRUNE_BATCHES = 10


def event_id(job_id: str, event: str) -> str:
    """The id of ``job_id``'s terminal ``event`` (the same as PostgreSQL's
    ``md5(job_id || ':' || event)`` in the group commit's statement)."""
    return hashlib.md5(f"{job_id}:{event}".encode(), usedforsecurity=False).hexdigest()


def record(conn: Connection, events: Iterable[tuple[str, str]], now: float) -> None:
    """Outbox rows for ``(job_id, event)`` pairs of jobs that named a callback."""
    moment = to_datetime(now)
    rows = [
        {
            "event_id": event_id(job_id, event),
            "job_id": job_id,
            "event": event,
            "status": PENDING,
            "attempts": 0,
            "next_attempt_at": moment,
            "created_at": moment,
        }
        for job_id, event in events
    ]
    if rows:
        conn.execute(insert(t.callbacks), rows)


def insert_completed(done: Any, now: Any) -> Any:
    """PostgreSQL: the outbox rows of the jobs a group commit's ``done`` CTE completed
    (those with a ``callback_url``), as an INSERT to run in the same statement."""
    event = literal("completed", String)
    rows = select(
        func.md5(done.c.job_id.concat(literal(":", String)).concat(event)),
        done.c.job_id,
        event,
        literal(PENDING, String),
        literal(0),
        now,
        now,
    ).where(done.c.callback_url.is_not(None))
    columns = ["event_id", "job_id", "event", "status", "attempts", "next_attempt_at", "created_at"]
    return pg_insert(t.callbacks).from_select(columns, rows)


# -- the sender's side -------------------------------------------------------------------------


def due(conn: Connection, now: float) -> Iterator[Any]:
    """Pending rows due at ``now``, oldest due first (then in the order their jobs
    ended), with their job's callback URL, read a page at a time: the sender reads
    past a busy receiver's rows, however many, to the others'."""
    c = t.callbacks.c
    # Options of this statement only: Connection.execution_options would stream every
    # later statement on the connection too (an UPDATE in a server-side cursor fails).
    yield from conn.execute(
        select(c.event_id, c.job_id, c.event, c.attempts, c.created_at, t.jobs.c.callback_url)
        .join(t.jobs, t.jobs.c.job_id == c.job_id)
        .where(c.status == PENDING, c.next_attempt_at <= to_datetime(now))
        .order_by(c.next_attempt_at, c.created_at, c.job_id),
        execution_options={"yield_per": 500},
    )


def postpone(conn: Connection, events: Sequence[str], now: float, until: float) -> None:
    """Make ``events`` due at ``until``, those still pending and due at ``now`` (one a
    sender holds is not due), without an attempt: their receiver did not answer
    another."""
    c = t.callbacks.c
    conn.execute(
        update(t.callbacks)
        .where(
            c.event_id.in_(events),
            c.status == PENDING,
            c.next_attempt_at <= to_datetime(now),
        )
        .values(next_attempt_at=to_datetime(until))
    )


def claim(conn: Connection, event: str, attempts: int, now: float, hold_until: float) -> bool:
    """Take attempt ``attempts + 1`` at ``event`` (False: another sender took it, or it
    is no longer due). Not due again before ``hold_until`` unless :func:`finish` says."""
    c = t.callbacks.c
    claimed = conn.execute(
        update(t.callbacks)
        .where(
            c.event_id == event,
            c.status == PENDING,
            c.attempts == attempts,
            c.next_attempt_at <= to_datetime(now),
        )
        .values(
            attempts=attempts + 1,
            last_attempt_at=to_datetime(now),
            next_attempt_at=to_datetime(hold_until),
        )
    )
    return claimed.rowcount == 1


def finish(
    conn: Connection,
    event: str,
    now: float,
    code: int | None,
    error: str | None,
    *,
    retry_at: float | None,
) -> None:
    """What an attempt got: delivered (``error`` None), due again at ``retry_at``, or
    failed for good (``retry_at`` None)."""
    c = t.callbacks.c
    values: dict[str, Any] = {"response_code": code, "last_error": error}
    if error is None:
        values.update(status=DELIVERED, delivered_at=to_datetime(now))
    elif retry_at is None:
        values["status"] = FAILED
    else:
        values["next_attempt_at"] = to_datetime(retry_at)
    conn.execute(update(t.callbacks).where(c.event_id == event, c.status == PENDING).values(values))


def of_job(conn: Connection, job_id: str) -> Row[Any] | None:
    """The job's outbox row (None: no callback, the job has not ended, or the row was
    pruned: its job's ``callback_status`` then says what became of it)."""
    return conn.execute(select(t.callbacks).where(t.callbacks.c.job_id == job_id)).first()


@dataclass(frozen=True, slots=True)
class Pruned:
    """What one call of :func:`prune` deleted, and whether it stopped at its bound with
    rows still to delete (``more``: call again soon)."""

    deleted: int
    more: bool


def prune(
    engine: Engine,
    status: str,
    before: float,
    batch: int | None = None,
    batches: int | None = None,
) -> Pruned:
    """Delete the rows ``delivered`` (by their delivery) or given up (``failed``, by
    their last attempt) before ``before``, ``batch`` a transaction (:data:`PRUNE_BATCH`:
    a long backlog holds no writer long), at most ``batches`` transactions
    (:data:`PRUNE_BATCHES`): the rest is the next call's. Each row's outcome stays on
    its job (:func:`_keep_outcomes`)."""
    batch = PRUNE_BATCH if batch is None else batch
    batches = PRUNE_BATCHES if batches is None else batches
    c = t.callbacks.c
    ended = {DELIVERED: c.delivered_at, FAILED: c.last_attempt_at}[status]
    # By the index of (status, when they ended) (0032), oldest first: only the rows
    # past retention are read. Through ix_job_callbacks_status_next_attempt_at,
    # filtering on when they ended, a round with fewer than a batch past retention (each
    # once a backlog is gone, every 5 minutes) read every row of the status still kept
    # (200k delivered rows: 25-70 ms to delete none on PostgreSQL, 80-170 ms on SQLite).
    past = c.status == status, ended < to_datetime(before)
    # Nearly every call finds nothing past retention: looked for in a snapshot, not
    # under SQLite's write lock (which every submit and claim waits behind).
    with snapshot(engine) as conn:
        if conn.execute(select(c.event_id).where(*past).order_by(ended).limit(1)).first() is None:
            return Pruned(0, more=False)
    total = 0
    for _ in range(batches):
        with transaction(engine) as conn:
            doomed = conn.execute(
                select(c.event_id, c.job_id, c.status, c.attempts)
                .where(*past)
                .order_by(ended)
                .limit(batch)
            ).all()
            _keep_outcomes(conn, doomed)
            if doomed:
                conn.execute(
                    delete(t.callbacks).where(c.event_id.in_([r.event_id for r in doomed]))
                )
        total += len(doomed)
        if len(doomed) < batch:
            return Pruned(total, more=False)
    return Pruned(total, more=True)


def _keep_outcomes(conn: Connection, rows: Sequence[Any]) -> None:
    """What became of the callbacks of ``rows`` (outbox rows about to be deleted), kept
    on their jobs (``callback_status``, ``callback_attempts``): one UPDATE per outcome
    and attempt count, few in a batch."""
    jobs: dict[tuple[str, int], list[str]] = {}
    for row in rows:
        jobs.setdefault((row.status, row.attempts), []).append(row.job_id)
    for (status, attempts), job_ids in jobs.items():
        conn.execute(
            update(t.jobs)
            .where(t.jobs.c.job_id.in_(job_ids))
            .values(callback_status=status, callback_attempts=attempts)
        )


@dataclass(frozen=True, slots=True)
class Backlog:
    """The outbox as the metrics tell it: events not delivered yet (``pending``, due
    or waiting for a retry), those given up (``failed``) in the last
    :data:`FAILED_WINDOW_SECONDS` (by their last attempt), how long the oldest
    pending one has waited since its job ended, and how long the oldest due one has
    waited for its attempt since it was due (each 0 when none)."""

    pending: int
    failed: int
    oldest_pending_age_seconds: float
    oldest_overdue_seconds: float = 0.0


def backlog(conn: Connection, now: float) -> Backlog:
    """:class:`Backlog` in one read (delivered rows, most of the table, are not read:
    ``ix_job_callbacks_status_next_attempt_at`` leads with the status; nor are the
    failed ones of more than the window: a row's ``next_attempt_at`` is never before
    its last attempt, which :func:`claim` pushed it past)."""
    c = t.callbacks.c
    pending = c.status == PENDING
    since = to_datetime(now - FAILED_WINDOW_SECONDS)
    failed = (c.status == FAILED) & (c.next_attempt_at >= since)
    count_pending, count_failed, oldest, due = conn.execute(
        select(
            func.count().filter(pending),
            func.count().filter(failed & (c.last_attempt_at >= since)),
            func.min(c.created_at).filter(pending),
            func.min(c.next_attempt_at).filter(pending & (c.next_attempt_at <= to_datetime(now))),
        ).where(pending | failed)
    ).one()
    age = 0.0 if oldest is None else max(0.0, now - to_epoch(oldest))
    overdue = 0.0 if due is None else max(0.0, now - to_epoch(due))
    return Backlog(int(count_pending), int(count_failed), age, overdue)
