"""The worker's side of a job: claim, start, extend, complete, fail, release.

Each step changes the job record first (a guarded UPDATE in its own
transaction) and then mirrors the new state into Redis. If the mirror step
fails (Redis down), the record is still right and the reaper / reconciler bring
Redis back in line; if the record step finds the job no longer ours, Redis is
corrected from the record. Workers (pipeline actors) call only this.

The worker's hot path is batched: :meth:`Dispatcher.claim_and_start` leases up to
``count`` jobs in Redis and claims and starts them in one transaction;
:meth:`Dispatcher.complete_many` completes a batch in one transaction (group
commit) and removes them from Redis in one call. Leases and profile versions come
from the catalog, not from SELECTs.

Each step that changes the record counts it in the dispatcher's recorder
(:mod:`hypermedia.metrics`): attempts started and their queue wait, jobs completed and
failed (or retried) by error code, attempt durations. Counted here, after the record
has changed, the metrics say what the record says.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Literal

from sqlalchemy import Engine, Row

from hypermedia import ids
from hypermedia.clock import Clock, SystemClock
from hypermedia.db.conflicts import rerun_on_conflict
from hypermedia.db.engine import transaction
from hypermedia.errors import QueueUnavailable
from hypermedia.jobs import checkpoints
from hypermedia.jobs.catalog import ProfileCatalog
from hypermedia.jobs.priority import band_of
from hypermedia.jobs.repository import (
    ClaimedJob,
    FinishedJob,
    JobRepository,
    Moved,
    OutputRecord,
)
from hypermedia.jobs.states import IN_FLIGHT, JobStatus
from hypermedia.metrics import (
    CANCELLED,
    COMPLETED,
    FAILED,
    JOB_DURATION,
    JOBS_COMPLETED,
    JOBS_FAILED,
    JOBS_RETRIED,
    JOBS_STARTED,
    QUEUE_WAIT,
    NoMetrics,
    Recorder,
)
from hypermedia.queue.events import JobEvents, status_event
from hypermedia.queue.redis_queue import Leased, RedisQueue, Restore
from hypermedia.sandbox.limits import wall_clock_seconds

log = logging.getLogger(__name__)


WORKER_LOST = "worker_lost"  # the code of an attempt whose worker died under it
# The timeout of a job whose profile the catalog no longer has (or of a queue with none).
UNKNOWN_PROFILE_TIMEOUT_SECONDS = 60


def lease_seconds(timeout_seconds: int | None, grace_seconds: float) -> float:
    """A job's lease: its wall-clock limit (timeout x 1.5) plus a grace period.
    ``timeout_seconds`` None: the profile is unknown (:data:`UNKNOWN_PROFILE_TIMEOUT_SECONDS`)."""
    if timeout_seconds is None:
        timeout_seconds = UNKNOWN_PROFILE_TIMEOUT_SECONDS
    return wall_clock_seconds(timeout_seconds) + grace_seconds


def event_error_code(status: JobStatus, code: str | None) -> str | None:
    """The error code a failed attempt's status event carries: none on a job it ended
    cancelled (its owner's cancel, asked while it ran), which names no error."""
    return None if status is JobStatus.CANCELLED else code


def count_failure(
    metrics: Recorder, moved: Moved, code: str, duration_seconds: float | None = None
) -> None:
    """A failed attempt, as the record took it: the job failed, or waits for a retry
    (one cancelled meanwhile, which the attempt's end ended, counts as neither, and its
    duration goes under the ``cancelled`` outcome, as a cancel its worker honoured)."""
    labels = {"queue": moved.queue, "operation": moved.operation, "code": code}
    cancelled = moved.status is JobStatus.CANCELLED
    if not cancelled:
        metrics.count(JOBS_FAILED if moved.status is JobStatus.FAILED else JOBS_RETRIED, labels)
    if duration_seconds is not None:
        outcome = CANCELLED if cancelled else FAILED
        observe_duration(metrics, moved, outcome, duration_seconds)


def observe_duration(
    metrics: Recorder, moved: Moved, outcome: str, duration_seconds: float
) -> None:
    """An attempt's time, under ``outcome``: what its job did with its end."""
    metrics.observe(
        JOB_DURATION,
        {"queue": moved.queue, "operation": moved.operation, "outcome": outcome},
        max(0.0, duration_seconds),
    )


class Dispatcher:
    def __init__(
        self,
        engine: Engine,
        queue: RedisQueue,
        catalog: ProfileCatalog,
        *,
        clock: Clock | None = None,
        repository: JobRepository | None = None,
        lease_grace_seconds: float = 30.0,
        metrics: Recorder | None = None,
    ) -> None:
        self.engine = engine
        self.metrics: Recorder = metrics or NoMetrics()
        self.queue = queue
        self.catalog = catalog
        self.clock = clock or SystemClock()
        self.repository = repository or JobRepository()
        self.grace = lease_grace_seconds
        self.events = JobEvents(queue.client, queue.prefix)  # every transition, published
        self._queue_lease: dict[str, float] = {}
        # A step that is one statement (see JobRepository) is atomic by itself: on
        # PostgreSQL it runs without BEGIN and COMMIT round trips.
        self._single = (
            engine.execution_options(isolation_level="AUTOCOMMIT")
            if engine.dialect.name == "postgresql"
            else engine
        )
        self._leases = {
            record.profile_id: lease_seconds(record.timeout_seconds, self.grace)
            for record in (catalog.get(op) for op in catalog.operations())
        }
        self._versions = {
            record.profile_id: record.version
            for record in (catalog.get(op) for op in catalog.operations())
        }
        # A job whose profile is no longer active.
        self._default_lease = lease_seconds(None, self.grace)

    def queue_lease_seconds(self, queue: str) -> float:
        """Redis lease for a queue: the longest lease of any profile on it."""
        if queue not in self._queue_lease:
            timeouts = [
                self.catalog.get(op).timeout_seconds
                for op in self.catalog.operations()
                if self.catalog.get(op).queue == queue
            ]
            self._queue_lease[queue] = lease_seconds(max(timeouts, default=None), self.grace)
        return self._queue_lease[queue]

    # -- claim --------------------------------------------------------------------

    def claim(self, queue: str, worker_id: str, count: int = 1) -> list[ClaimedJob]:
        """Lease up to ``count`` jobs in Redis, then claim them in the record (one
        transaction).

        A popped job the record will not give us (cancelled, claimed elsewhere,
        not yet due) is put back where the record says it belongs; if the record's
        transaction fails (database down), every lease goes straight back to ready.
        """
        return self._claim(queue, worker_id, count, start=False)

    def claim_and_start(self, queue: str, worker_id: str, count: int = 1) -> list[ClaimedJob]:
        """:meth:`claim` and :meth:`start` in one transaction: the jobs come back
        ``processing``, each with its attempt row. For a worker about to run them."""
        return self._claim(queue, worker_id, count, start=True)

    def claim_ahead(self, queue: str, worker_id: str, count: int) -> list[ClaimedJob]:
        """:meth:`claim` for a loop that runs the jobs one after another: the first
        is started in the same transaction (as :meth:`claim_and_start`), the others
        wait ``claimed`` (``ClaimedJob.started`` False) until the loop reaches them
        and starts them (:meth:`complete_many`'s ``started``)."""
        return self._claim(queue, worker_id, count, start="first")

    def _claim(
        self, queue: str, worker_id: str, count: int, *, start: bool | Literal["first"]
    ) -> list[ClaimedJob]:
        now = self.clock.now()
        leased = self.queue.claim(queue, worker_id, self.queue_lease_seconds(queue), now, count)
        if not leased:
            return []
        job_ids = [entry.job_id for entry in leased]
        try:
            with transaction(self._single) as conn:
                claimed = self.repository.claim_many(
                    conn,
                    job_ids,
                    worker_id,
                    now,
                    self._leases,
                    default_lease=self._default_lease,
                    start=start,
                )
        except Exception:
            # The record took none of them (database down): left leased, they would
            # wait out the whole lease while workers idle. Back to ready at once.
            self._unlease(queue, worker_id, leased)
            raise
        if len(claimed) < len(job_ids):
            ours = {job.job_id for job in claimed}
            self.mirror([job_id for job_id in job_ids if job_id not in ours])
        self._count_started([job for job in claimed if job.started], now)
        self.events.publish_many(
            (
                job.job_id,
                status_event(
                    (JobStatus.PROCESSING if job.started else JobStatus.CLAIMED).value,
                    now,
                    job.attempt_number,
                ),
            )
            for job in claimed
        )
        return claimed

    def _count_started(self, jobs: Sequence[ClaimedJob], now: float) -> None:
        for job in jobs:
            self.metrics.count(JOBS_STARTED, {"queue": job.queue, "operation": job.operation})
            if job.attempt_number == 1:
                try:
                    created = ids.created_at(job.job_id)  # our ids carry their time
                except ValueError:
                    continue  # a job id made elsewhere (an import): no wait to tell
                self.metrics.observe(
                    QUEUE_WAIT,
                    {"queue": job.queue, "priority_band": band_of(job.priority)},
                    max(0.0, now - created),
                )

    def _unlease(self, queue: str, worker_id: str, leased: Sequence[Leased]) -> None:
        try:
            self.queue.unlease(queue, worker_id, leased)
        except QueueUnavailable as exc:
            log.warning(
                "redis unavailable; %d leases of a failed claim wait for the reaper: %s",
                len(leased),
                exc,
                extra={"queue": queue, "worker_id": worker_id, "action": "unlease"},
            )

    # -- running ----------------------------------------------------------------------

    def start(self, job: ClaimedJob, worker_id: str) -> bool:
        now = self.clock.now()
        with transaction(self.engine) as conn:
            started = self.repository.start(conn, job.job_id, worker_id, now)
        if started:
            self._count_started([job], now)
            self.events.publish(
                job.job_id, status_event(JobStatus.PROCESSING.value, now, job.attempt_number)
            )
        return started

    def extend(self, job: ClaimedJob, worker_id: str, seconds: float) -> bool:
        """Push the lease ``seconds`` past now (long jobs heartbeat with this)."""
        now = self.clock.now()
        deadline = now + seconds
        with transaction(self.engine) as conn:
            ok = self.repository.extend_lease(conn, job.job_id, worker_id, deadline, now)
        if ok:
            try:
                self.queue.extend(job.queue, job.job_id, worker_id, deadline)
            except QueueUnavailable:
                log.warning(
                    "redis unavailable; lease of %s extended in the record only", job.job_id
                )
        return ok

    def commit_checkpoint(
        self, job: ClaimedJob, worker_id: str, storage_key: str, size_bytes: int
    ) -> bool:
        """A piece of the job's work is whole in storage (see
        :mod:`hypermedia.jobs.checkpoints`); False if the job is no longer ours."""
        return checkpoints.commit(
            self.engine, job.job_id, worker_id, storage_key, size_bytes, self.clock.now()
        )

    def cancel_requested(self, job: ClaimedJob) -> bool:
        with transaction(self.engine) as conn:
            return self.repository.is_cancel_requested(conn, job.job_id)

    def cancel_requested_among(self, job_ids: Sequence[str]) -> set[str]:
        """Which of these jobs their users asked to cancel (one query)."""
        if not job_ids:
            return set()
        with transaction(self.engine) as conn:
            return self.repository.cancel_requested_among(conn, job_ids)

    # -- endings -------------------------------------------------------------------------

    def complete(
        self,
        job: ClaimedJob,
        worker_id: str,
        outputs: Sequence[OutputRecord] = (),
        *,
        actual_millicredits: int | None = None,
        peak_memory_mb: float | None = None,
    ) -> bool:
        finished = FinishedJob(
            job.job_id, outputs, actual_millicredits, peak_memory_mb, job.attempt_started_at
        )
        return self.complete_many(worker_id, [finished])[0]

    def complete_many(
        self,
        worker_id: str,
        finished: Sequence[FinishedJob],
        started: Sequence[tuple[ClaimedJob, float]] = (),
    ) -> list[bool]:
        """Complete a batch in one transaction, then drop them from Redis in one call.
        Answers, per job, whether it was still ours (the others are mirrored).

        ``started``: jobs a claim loop took ahead (:meth:`claim_ahead`: ``claimed``) and
        has since begun to run, each with the moment it did: started (claimed ->
        processing) in the same transaction, before the completions, so a job can be
        both. Their ``processing`` events go out once it has committed."""
        if not finished and not started:
            return []
        ending = {f.job_id for f in finished}
        # A job started and finished since the last batch is both in one statement.
        together = {job.job_id: at for job, at in started if job.job_id in ending}
        alone = [(job.job_id, at) for job, at in started if job.job_id not in ending]
        # More than one statement: then an explicit transaction holds them together.
        several = (alone and finished) or any(f.outputs for f in finished)
        engine = self.engine if several else self._single
        now = self.clock.now()

        def completing() -> tuple[set[str], list[Any]]:
            with transaction(engine) as conn:
                begun = self.repository.start_many(conn, worker_id, alone)
                moved = (
                    self.repository.complete_many(
                        conn, worker_id, now, finished, self._versions, together
                    )
                    if finished
                    else []
                )
            return begun, moved

        # Run again whole if PostgreSQL aborts it in a deadlock (with a delete, a
        # submit): Redis and the events hear of it only after its commit. Spent:
        # DatabaseConflict, which the worker retries as it does an outage.
        begun, moved = rerun_on_conflict(completing, what="complete")
        begun |= {m.job_id for m in moved if m.job_id in together}
        starting = []
        for job, at in started:
            if job.job_id in begun:
                self._count_started([job], at)
                event = status_event(JobStatus.PROCESSING.value, at, job.attempt_number)
                starting.append((job.job_id, event))
        if not finished:
            self.events.publish_many(starting)
            return []
        done = {m.job_id for m in moved}
        lost = [f.job_id for f in finished if f.job_id not in done]
        if lost:
            self.mirror(lost)
        self._apply(moved, before=starting)  # their starts' events in the same call
        by_id = {f.job_id: f for f in finished}
        for m in moved:
            self.metrics.count(JOBS_COMPLETED, {"queue": m.queue, "operation": m.operation})
            began = by_id[m.job_id].attempt_started_at
            ended = by_id[m.job_id].attempt_finished_at
            if began is not None:
                self.metrics.observe(
                    JOB_DURATION,
                    {"queue": m.queue, "operation": m.operation, "outcome": COMPLETED},
                    max(0.0, (now if ended is None else ended) - began),
                )
        return [f.job_id in done for f in finished]

    def fail(
        self,
        job: ClaimedJob,
        worker_id: str,
        error_code: str,
        error_message: str,
        *,
        retryable: bool = True,
        peak_memory_mb: float | None = None,
        log_tail: str | None = None,
    ) -> JobStatus | None:
        """Record a failed attempt: answers RETRY_WAIT or FAILED, or CANCELLED when its
        owner asked to cancel it while it ran (None if not ours).
        ``log_tail``: the end of the child's output, kept on the attempt. A job its
        loop took ahead and began (``job.started``) whose start the record has not yet
        had is started at its moment first (:meth:`JobRepository.fail`)."""
        status, _counted = self._fail(
            job,
            worker_id,
            error_code,
            error_message,
            retryable=retryable,
            peak_memory_mb=peak_memory_mb,
            log_tail=log_tail,
        )
        return status

    def fail_for_outage(
        self, job: ClaimedJob, worker_id: str, error_code: str, error_message: str
    ) -> tuple[JobStatus | None, bool]:
        """The platform's outage (``error_code``: a ServiceUnavailable's) ended the
        attempt, not the job: back to retry_wait without counting it, up to
        :data:`~hypermedia.jobs.states.OUTAGE_HANDBACKS` times a job, then as
        :meth:`fail`. Answers the job's status (None if not ours) and whether the
        attempt counted."""
        return self._fail(job, worker_id, error_code, error_message, outage=True)

    def _fail(
        self,
        job: ClaimedJob,
        worker_id: str,
        error_code: str,
        error_message: str,
        *,
        retryable: bool = True,
        peak_memory_mb: float | None = None,
        log_tail: str | None = None,
        outage: bool = False,
    ) -> tuple[JobStatus | None, bool]:
        now = self.clock.now()
        with transaction(self.engine) as conn:
            result = self.repository.fail(
                conn,
                job.job_id,
                worker_id,
                now,
                error_code,
                error_message,
                retryable=retryable,
                peak_memory_mb=peak_memory_mb,
                log_tail=log_tail,
                started_at=job.attempt_started_at if job.started else None,
                outage=outage,
            )
        if result is None:
            self.mirror([job.job_id])
            return None, True
        moved, decision = result
        self._apply([moved], error_code=error_code, before=self._begun_first(job, moved))
        began = job.attempt_started_at
        count_failure(self.metrics, moved, error_code, None if began is None else now - began)
        return moved.status, decision.counted

    def recover_worker(self, worker_id: str, reason: str = "worker lost") -> list[str]:
        """A worker (actor or node) died: its in-flight jobs fail this attempt with
        ``worker_lost`` and, attempts permitting, go straight back to their queue
        (no backoff: the worker failed, not the job). Answers the job ids handled."""
        now = self.clock.now()
        with transaction(self.engine) as conn:
            job_ids = self.repository.in_flight_of(conn, worker_id)
        handled: list[str] = []
        for job_id in job_ids:
            with transaction(self.engine) as conn:
                result = self.repository.fail(
                    conn, job_id, worker_id, now, WORKER_LOST, reason, retry_now=True
                )
                if result is None:
                    continue
                moved, _ = result
                if moved.status is JobStatus.RETRY_WAIT:
                    self.repository.promote_due(conn, now, [job_id])
            count_failure(self.metrics, moved, WORKER_LOST)
            handled.append(job_id)
            retried = moved.status is JobStatus.RETRY_WAIT  # and promoted at once, above
            status = JobStatus.QUEUED if retried else moved.status
            code = event_error_code(status, WORKER_LOST)
            self.events.publish(job_id, status_event(status.value, now, error_code=code))
        if handled:
            self.mirror(handled)
            log.warning(
                "worker %s lost: %d in-flight jobs back to their queues",
                worker_id,
                len(handled),
                extra={"worker_id": worker_id, "action": "recover"},
            )
        return handled

    def release(
        self,
        job: ClaimedJob,
        worker_id: str,
        *,
        reason_code: str | None = None,
        reason: str | None = None,
    ) -> bool:
        """Hand the job back without spending an attempt (drain, spot notice);
        ``reason_code`` / ``reason`` go on the released attempt. One its loop took
        ahead and began (``job.started``), its start not yet in the record, is started
        at its moment first, as in :meth:`fail`; one never begun goes back unstarted."""
        with transaction(self.engine) as conn:
            moved = self.repository.release(
                conn,
                job.job_id,
                worker_id,
                self.clock.now(),
                reason_code=reason_code,
                reason=reason,
                started_at=job.attempt_started_at if job.started else None,
            )
        if moved is None:
            self.mirror([job.job_id])
            return False
        self._apply([moved], before=self._begun_first(job, moved))
        return True

    def honour_cancel(self, job: ClaimedJob, worker_id: str) -> bool:
        """The job's user asked to cancel it: in flight -> cancelled. A begun job its
        loop took ahead is started at its moment first, as in :meth:`release`. Its
        attempt is timed as a failed one is, under the ``cancelled`` outcome."""
        now = self.clock.now()
        with transaction(self.engine) as conn:
            moved = self.repository.cancel_claimed(
                conn,
                job.job_id,
                worker_id,
                now,
                started_at=job.attempt_started_at if job.started else None,
            )
        if moved is None:
            return False
        self._apply([moved], before=self._begun_first(job, moved))
        began = job.attempt_started_at
        if began is not None:
            observe_duration(self.metrics, moved, CANCELLED, now - began)
        return True

    def _begun_first(self, job: ClaimedJob, moved: Moved) -> list[tuple[str, dict[str, Any]]]:
        """A start its fail, release or cancel wrote first (``moved.started_at``: a job
        taken ahead and begun, its start still in the worker's completion batcher,
        which then finds it no longer ``claimed``): counted as that start would have
        been, and its ``processing`` event, to go out before the move's."""
        if moved.started_at is None:
            return []
        self._count_started([job], moved.started_at)
        event = status_event(JobStatus.PROCESSING.value, moved.started_at, job.attempt_number)
        return [(job.job_id, event)]

    # -- mirroring the record into Redis --------------------------------------------------

    def _apply(
        self,
        moves: Sequence[Moved],
        error_code: str | None = None,
        *,
        before: Sequence[tuple[str, dict[str, Any]]] = (),
    ) -> None:
        """Mirror moves into Redis (one call per queue and kind of move) and publish
        each as the job's status event (``error_code``: of a failed attempt), after
        the events ``before`` (one call for all)."""
        now = self.clock.now()
        self.events.publish_many(
            [
                *before,
                *(
                    (
                        m.job_id,
                        status_event(
                            m.status.value,
                            now,
                            retry_at=m.retry_at,
                            error_code=event_error_code(m.status, error_code),
                        ),
                    )
                    for m in moves
                ),
            ]
        )
        enqueue: dict[str, list[tuple[str, int]]] = defaultdict(list)
        delay: dict[str, list[tuple[str, float]]] = defaultdict(list)
        remove: dict[tuple[str, bool], list[str]] = defaultdict(list)
        for m in moves:
            if m.status is JobStatus.QUEUED:
                enqueue[m.queue].append((m.job_id, m.priority))
            elif m.status is JobStatus.RETRY_WAIT and m.retry_at is not None:
                delay[m.queue].append((m.job_id, m.retry_at))
            else:  # a completion leaves no tombstone (RedisQueue.remove)
                remove[m.queue, m.status is not JobStatus.COMPLETED].append(m.job_id)
        try:
            for queue, entries in enqueue.items():
                self.queue.enqueue(queue, entries)
            for queue, due in delay.items():
                self.queue.delay(queue, due)
            for (queue, tombstone), job_ids in remove.items():
                self.queue.remove(queue, job_ids, tombstone=tombstone)
        except QueueUnavailable as exc:
            log.warning("redis unavailable; reconciler will mirror %d jobs: %s", len(moves), exc)

    def mirror(self, job_ids: Sequence[str]) -> None:
        """Make Redis say what the record says about these jobs."""
        with transaction(self.engine) as conn:
            rows = self.repository.states(conn, job_ids)
        try:
            for job_id in job_ids:
                row = rows.get(job_id)
                if row is None:
                    for q in self.queue.queues:
                        self.queue.remove(q, [job_id])
                    continue
                mirror_row(self.queue, row)
        except QueueUnavailable as exc:
            log.warning("redis unavailable while mirroring: %s", exc)


def mirror_row(queue: RedisQueue, row: Row[Any]) -> None:
    status = JobStatus(row.status)
    if status is JobStatus.QUEUED:
        queue.enqueue(row.queue, [(row.job_id, row.priority)])
    elif status is JobStatus.RETRY_WAIT:
        due = row.run_after.timestamp() if row.run_after else 0.0
        queue.delay(row.queue, [(row.job_id, due)])
    elif status in IN_FLIGHT:
        deadline = row.visibility_timeout.timestamp() if row.visibility_timeout else 0.0
        queue.remove(row.queue, [row.job_id], tombstone=False)  # live: no tombstone
        queue.restore(
            row.queue,
            [Restore("leased", row.job_id, row.priority, deadline, row.claimed_by or "")],
        )
    else:
        queue.remove(row.queue, [row.job_id])
