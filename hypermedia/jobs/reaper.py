"""The reaper and the reconciler: keep Redis in line with the job record.

Reaper (every few seconds):

1. in-flight jobs whose visibility timeout passed (the worker died or hung)
   fail their attempt with ``lease_expired``: retry_wait with backoff, or
   failed once attempts are used up (a poison pill cannot loop forever); the
   workdir the job left on this node, if any, is removed;
2. Redis leases that expired are put back where the record says (a worker
   that died between popping a job and claiming it in the record leaves a
   lease on a job that is still ``queued``);
3. retry_wait jobs whose time has come go back to ``queued`` and their queue;
4. due entries of Redis's delayed sets whose job the record no longer holds as
   retry_wait are put back where the record says (a worker that stalled between
   committing a retry and parking it in Redis, past its backoff, parks a job this
   reaper already promoted; the reconciler leaves it, since it is in a set).

Reconciler (every minute, at start-up, and at once when Redis may have missed
writes: see :meth:`~hypermedia.queue.redis_queue.RedisQueue.reconcile_wanted`):
every job the record holds as queued / in flight / retry_wait that Redis lacks is
restored (only if it is in no set at that moment); every Redis entry whose job
the record says is finished, or does not know, is dropped. Postgres is the
truth: wiping Redis loses no job.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, Row, select

from hypermedia import workdirs
from hypermedia.clock import Clock, SystemClock
from hypermedia.db import tables as t
from hypermedia.db.engine import snapshot, transaction
from hypermedia.jobs.dispatcher import count_failure, event_error_code, mirror_row
from hypermedia.jobs.repository import JobRepository
from hypermedia.jobs.states import IN_FLIGHT, JobStatus
from hypermedia.metrics import NoMetrics, Recorder
from hypermedia.queue.events import JobEvents, status_event
from hypermedia.queue.redis_queue import RedisQueue, Restore, Target

log = logging.getLogger(__name__)

LEASE_EXPIRED = "lease_expired"


@dataclass
class ReapReport:
    expired: int = 0
    retried: int = 0
    failed: int = 0
    leases_returned: int = 0
    promoted: int = 0
    delays_returned: int = 0


@dataclass
class ReconcileReport:
    restored: dict[str, int] = field(default_factory=dict)
    removed: dict[str, int] = field(default_factory=dict)

    @property
    def total_restored(self) -> int:
        return sum(self.restored.values())

    @property
    def total_removed(self) -> int:
        return sum(self.removed.values())


class Reaper:
    def __init__(
        self,
        engine: Engine,
        queue: RedisQueue,
        *,
        clock: Clock | None = None,
        repository: JobRepository | None = None,
        batch: int = 1000,
        data_dir: Path | None = None,
        metrics: Recorder | None = None,
    ) -> None:
        """``data_dir``: this node's; the workdirs that expired jobs left in it go.
        ``metrics``: where the attempts it fails are counted."""
        self.engine = engine
        self.metrics: Recorder = metrics or NoMetrics()
        self.queue = queue
        self.clock = clock or SystemClock()
        self.repository = repository or JobRepository()
        self.batch = batch
        self.data_dir = data_dir
        self.events = JobEvents(queue.client, queue.prefix)

    def tick(self) -> ReapReport:
        report = ReapReport()
        self._expire(report)
        self._return_leases(report)
        self._promote(report)
        self._return_delays(report)
        if report.expired or report.leases_returned or report.promoted or report.delays_returned:
            log.info(
                "reaper: %d expired (%d retry, %d failed), %d leases returned, %d retries due,"
                " %d delays returned",
                report.expired,
                report.retried,
                report.failed,
                report.leases_returned,
                report.promoted,
                report.delays_returned,
                extra={"action": "reap"},
            )
        return report

    def _expire(self, report: ReapReport) -> None:
        now = self.clock.now()
        # Read in a snapshot: a transaction takes SQLite's write lock, reads included,
        # and this runs every reaper_interval_seconds, nearly always finding nothing.
        # Each failure is its own write transaction, whose guard reads the lease again.
        with snapshot(self.engine) as conn:
            expired = self.repository.expired(conn, now, self.batch)
            holders = {
                job_id: row.claimed_by
                for job_id, row in self.repository.states(conn, expired).items()
                if row.claimed_by
            }
        for job_id in expired:
            with transaction(self.engine) as conn:
                result = self.repository.fail(
                    conn, job_id, None, now, LEASE_EXPIRED, "lease expired: worker lost or hung"
                )
            if result is None:
                continue  # the worker finished or extended it in the meantime
            moved, _ = result
            count_failure(self.metrics, moved, LEASE_EXPIRED)
            self.events.publish(
                job_id,
                status_event(
                    moved.status.value,
                    now,
                    retry_at=moved.retry_at,
                    error_code=event_error_code(moved.status, LEASE_EXPIRED),
                ),
            )
            report.expired += 1
            if self.data_dir is not None and job_id in holders:
                # Its worker is gone or hung: nobody else removes what the job left.
                workdirs.remove_job(self.data_dir, holders[job_id], job_id)
            if moved.status is JobStatus.RETRY_WAIT and moved.retry_at is not None:
                report.retried += 1
                self.queue.delay(moved.queue, [(job_id, moved.retry_at)])
            else:  # failed, or cancelled by its owner while it ran
                report.failed += int(moved.status is JobStatus.FAILED)
                self.queue.remove(moved.queue, [job_id])

    def _records_of(self, queue: str, ids: list[str]) -> Iterator[Row[Any]]:
        """The record's rows of these Redis entries of ``queue``, read in one query; an
        entry whose job the record does not know is dropped from Redis."""
        if not ids:
            return
        with snapshot(self.engine) as conn:
            rows = self.repository.states(conn, ids)
        for job_id in ids:
            row = rows.get(job_id)
            if row is None:
                self.queue.remove(queue, [job_id])
            else:
                yield row

    def _return_leases(self, report: ReapReport) -> None:
        now = self.clock.now()
        for queue in self.queue.queues:
            for row in self._records_of(queue, self.queue.expired_leases(queue, now, self.batch)):
                status = JobStatus(row.status)
                if (
                    status in IN_FLIGHT
                    and row.visibility_timeout is not None
                    and row.visibility_timeout.timestamp() <= now
                ):
                    continue  # step 1 handles it on the next tick
                mirror_row(self.queue, row)
                if status is JobStatus.QUEUED:
                    report.leases_returned += 1

    def _return_delays(self, report: ReapReport) -> None:
        """Due entries of Redis's delayed sets that the record no longer holds as
        waiting, made to agree with it (as expired leases are). A worker parks a failed
        job there after committing its retry_wait; if it stalls longer than the backoff
        between the two, this reaper has promoted the job meanwhile (queued in the
        record, ready in Redis) and the late park hides it in the delayed set, where
        nothing claims it. Runs after :meth:`_promote`, which has taken the retries
        the record holds as due: an entry still due here is either such a stray, or a
        retry the record holds as not yet due (left for a later promote)."""
        now = self.clock.now()
        for queue in self.queue.queues:
            for row in self._records_of(queue, self.queue.due_retries(queue, now, self.batch)):
                if JobStatus(row.status) is JobStatus.RETRY_WAIT:
                    continue
                mirror_row(self.queue, row)
                report.delays_returned += 1

    def _promote(self, report: ReapReport) -> None:
        """retry_wait jobs whose time has come, queued. Looked for first in a snapshot:
        the UPDATE alone, sent every tick, took SQLite's write lock each time, nearly
        always to find nothing. The UPDATE's own guard (still retry_wait, still due)
        decides which move, so a job promoted meanwhile (another head's reaper) is not
        moved twice, and one come due since the look is the next tick's."""
        now = self.clock.now()
        with snapshot(self.engine) as conn:
            if not self.repository.any_due(conn, now):
                return
        with transaction(self.engine) as conn:
            moved = self.repository.promote_due(conn, now)
        by_queue: dict[str, list[tuple[str, int]]] = {}
        for m in moved:
            by_queue.setdefault(m.queue, []).append((m.job_id, m.priority))
        for queue, entries in by_queue.items():
            self.queue.enqueue(queue, entries)
        self.events.publish_many((m.job_id, status_event(m.status.value, now)) for m in moved)
        report.promoted += len(moved)


_TARGET: dict[str, Target] = {
    JobStatus.QUEUED.value: "ready",
    JobStatus.CLAIMED.value: "leased",
    JobStatus.PROCESSING.value: "leased",
    JobStatus.RETRY_WAIT.value: "delayed",
}


def reconcile(engine: Engine, queue: RedisQueue) -> ReconcileReport:
    """Make Redis agree with the record (see the module docstring)."""
    report = ReconcileReport()
    token = queue.reconcile_begins()
    live = list(_TARGET)
    for name in queue.queues:
        in_redis = queue.members(name)  # read Redis first: see restore.lua
        with snapshot(engine) as conn:  # reads only: no write lock on SQLite
            rows = conn.execute(
                select(
                    t.jobs.c.job_id,
                    t.jobs.c.status,
                    t.jobs.c.priority,
                    t.jobs.c.run_after,
                    t.jobs.c.visibility_timeout,
                    t.jobs.c.claimed_by,
                ).where(t.jobs.c.queue == name, t.jobs.c.status.in_(live))
            ).all()
            wanted = {r.job_id for r in rows}
            stray = [job_id for job_id in in_redis if job_id not in wanted]
            still_live = set()
            if stray:
                still_live = set(
                    conn.execute(
                        select(t.jobs.c.job_id).where(
                            t.jobs.c.job_id.in_(stray), t.jobs.c.status.in_(live)
                        )
                    ).scalars()
                )
        missing = [
            Restore(
                _TARGET[r.status],
                r.job_id,
                r.priority,
                _at(r),
                r.claimed_by or "",
            )
            for r in rows
            if r.job_id not in in_redis
        ]
        restored = 0
        for start in range(0, len(missing), 500):
            restored += queue.restore(name, missing[start : start + 500])
        # Only drop entries the record says are finished or unknown (final states).
        drop = [job_id for job_id in stray if job_id not in still_live]
        removed = queue.remove(name, drop) if drop else 0
        report.restored[name] = restored
        report.removed[name] = removed
    queue.reconciled(token)
    if report.total_restored or report.total_removed:
        log.warning(
            "reconciler: restored %d, removed %d",
            report.total_restored,
            report.total_removed,
            extra={"action": "reconcile"},
        )
    return report


def _at(row: object) -> float:
    run_after = getattr(row, "run_after", None)
    visibility = getattr(row, "visibility_timeout", None)
    moment = run_after or visibility
    return moment.timestamp() if moment is not None else 0.0
