"""Queue samples: each queue's depth, oldest ready job and workers over time, the history
behind the operator page's charts (:mod:`autoscaler.page`).

Nothing else keeps a queue's depth over time: Redis holds only the present, a decision is
written when something changes, ``worker_metrics`` is per worker. So the scheduler's
leader writes one ``queue_samples`` row per queue from the snapshot it decided on, in the
transaction that records its turn, at most every :data:`SAMPLE_SECONDS` (with the shipped
60 s evaluation interval: every turn, 7,200 rows a day for five queues), and deletes the
rows older than :data:`RETENTION_SECONDS` in the same transaction. The interval is kept
by each scheduler in memory: a new leader samples on its first turn.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.engine import Connection

from autoscaler.snapshot import Snapshot
from autoscaler.state import epoch, to_datetime
from hypermedia.db import tables as t

SAMPLE_SECONDS = 60.0
RETENTION_SECONDS = 2 * 86_400.0


@dataclass(frozen=True, slots=True)
class Sample:
    at: float
    queue: str
    depth: int  # ready jobs
    oldest_age_seconds: float
    workers: int  # the snapshot's workers of the queue not terminated: VPS and cloud


def samples_of(snapshot: Snapshot) -> list[Sample]:
    """One sample per queue of ``snapshot``."""
    workers = Counter(w.queue for w in snapshot.workers if w.status != "terminated")
    return [
        Sample(
            at=snapshot.now,
            queue=name,
            depth=state.depth,
            oldest_age_seconds=round(state.oldest_age_seconds, 1),
            workers=workers[name],
        )
        for name, state in snapshot.queues.items()
    ]


def record(conn: Connection, snapshot: Snapshot) -> int:
    """Write the snapshot's samples and forget those past the retention; rows written."""
    rows = samples_of(snapshot)
    s = t.queue_samples
    if rows:
        conn.execute(
            s.insert(),
            [
                {
                    "sampled_at": to_datetime(row.at),
                    "queue": row.queue,
                    "depth": row.depth,
                    "oldest_age_seconds": row.oldest_age_seconds,
                    "workers": row.workers,
                }
                for row in rows
            ],
        )
    conn.execute(s.delete().where(s.c.sampled_at < to_datetime(snapshot.now - RETENTION_SECONDS)))
    return len(rows)


def read(conn: Connection, since: float, until: float) -> list[Sample]:
    """The samples taken in ``[since, until]``, oldest first."""
    s = t.queue_samples.c
    rows = conn.execute(
        select(s.sampled_at, s.queue, s.depth, s.oldest_age_seconds, s.workers)
        .where(s.sampled_at >= to_datetime(since), s.sampled_at <= to_datetime(until))
        .order_by(s.sampled_at, s.queue)
    )
    return [
        Sample(epoch(row.sampled_at), row.queue, row.depth, row.oldest_age_seconds, row.workers)
        for row in rows
    ]
