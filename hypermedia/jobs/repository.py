"""Guarded SQL for every job transition.

Each method is one state-machine event turned into ``UPDATE ... WHERE job_id = ?
AND status IN (<legal sources>)`` (plus the claimant's worker id where a lease is
involved). A statement that matches no row means the transition was not legal
any more (someone else claimed, cancelled, or the lease was reaped): the method
answers ``None``/``False`` and changes nothing. Methods take an open connection
so callers decide the transaction; none of them talks to Redis. Job rows are born
here too (:meth:`JobRepository.create`, with their credits reserved), and every
credit a transition moves goes through :mod:`hypermedia.jobs.credits`.

The worker's hot path has batch forms: :meth:`JobRepository.claim_many` (one
guarded UPDATE for the batch, one INSERT for its attempt rows; with ``start`` the
START event is applied in the same UPDATE, which is the claim and the start in one
transaction) and :meth:`JobRepository.complete_many` (group commit: one guarded
UPDATE, the attempts closed, one ledger charge per job, each user's credits settled
once). Their statements (:mod:`hypermedia.jobs.statements`) are built once per
dialect, with bound parameters only; the single-job ``claim`` and ``complete`` are
the batch forms with one id.

On PostgreSQL ``claim_many`` is one statement, and so is ``complete_many`` when no
job of the batch has outputs (data-modifying CTEs): a caller may run those without
an explicit transaction, the statement being atomic by itself.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import (
    Connection,
    Row,
    bindparam,
    delete,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import NoResultFound

from hypermedia import accounts
from hypermedia.clock import to_datetime
from hypermedia.db import tables as t
from hypermedia.errors import NotFound, QueueUnavailable, ServiceUnavailable, error_classes
from hypermedia.ids import new_id
from hypermedia.jobs import callbacks, credits
from hypermedia.jobs import statements as sql
from hypermedia.jobs.states import (
    IN_FLIGHT,
    Backoff,
    FailureDecision,
    JobEvent,
    JobStatus,
    decide_failure,
    decide_outage,
    sources,
)


def _guard(event: JobEvent) -> list[str]:
    return sorted(s.value for s in sources(event))


# Built once: every submit on SQLite runs them (the rows are its parameters).
_INSERT_SUBMISSIONS = insert(t.submissions)
_INSERT_JOBS = insert(t.jobs)


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    job_id: str
    queue: str
    operation: str
    object_id: str
    user_id: str
    profile_id: int
    priority: int
    params: dict[str, Any]
    attempt_number: int  # the attempt row's number
    attempt_count: int  # attempts counted against max_attempts, this one included
    max_attempts: int
    deadline: float  # lease / visibility timeout, epoch seconds
    attempt_started_at: float | None = None  # the attempt row's started_at, epoch seconds
    estimated_millicredits: int | None = None  # its cost before the step's units of work
    # What the submit reserved for it: the most its completion may charge.
    reserved_millicredits: int | None = None
    started: bool = True  # processing; False: claimed, its start still to come
    # Its time limit (from its pages: ProfileRecord.job_timeout_seconds); None (a job
    # from before it): its profile's timeout_seconds.
    timeout_seconds: int | None = None


@dataclass(frozen=True, slots=True)
class OutputRecord:
    output_type: str
    storage_key: str
    size_bytes: int
    content_type: str | None = None
    object_id: str | None = None


@dataclass(frozen=True, slots=True)
class FinishedJob:
    """A job whose step succeeded and whose outputs are stored: what completing it needs."""

    job_id: str
    outputs: Sequence[OutputRecord] = ()
    # None: charge the estimate; either way at most the job's reservation.
    actual_millicredits: int | None = None
    peak_memory_mb: float | None = None
    attempt_started_at: float | None = None  # known to the claimant; None: read it
    # The work the step reported (pages, engine passes ...): the attempt's units.
    units: Mapping[str, int] | None = None
    # When the attempt's work ended (its outputs stored), epoch seconds: its
    # finished_at, and its duration up to it. None: the completion's own moment. A
    # worker commits its completions in batches, so its job's end is not the commit's.
    attempt_finished_at: float | None = None


if TYPE_CHECKING:
    from hypermedia.queue.events import JobEvents
    from hypermedia.queue.redis_queue import RedisQueue

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class NewJob:
    """A job ingest accepted, before it has a row."""

    job_id: str
    submission_id: str
    object_id: str
    profile_id: int
    operation: str
    queue: str
    priority: int
    params: dict[str, Any]
    estimated_millicredits: int
    # What the submit holds for it: the estimate plus the most the units of work its
    # step may report can cost (ProfileRecord.reserve_millicredits).
    reserved_millicredits: int
    max_attempts: int
    callback_url: str | None = None  # POSTed the job once it has ended (hypermedia.callbacks)
    # Its time limit (ProfileRecord.job_timeout_seconds); None: its profile's.
    timeout_seconds: int | None = None


@dataclass(frozen=True, slots=True)
class NewSubmission:
    """One accepted submit request and its jobs, before they have rows."""

    submission_id: str
    idempotency_key: str | None
    request_hash: str
    jobs: tuple[NewJob, ...]

    @property
    def estimated_millicredits(self) -> int:
        return sum(job.estimated_millicredits for job in self.jobs)

    @property
    def reserved_millicredits(self) -> int:
        return sum(job.reserved_millicredits for job in self.jobs)


@dataclass(frozen=True, slots=True)
class Moved:
    """A job that changed state, with what Redis needs to mirror it."""

    job_id: str
    queue: str
    priority: int
    status: JobStatus
    retry_at: float | None = None
    operation: str = ""  # where the caller counts it (metrics); "" where nobody does
    # A job its loop took ahead and began, started first in the same transaction (its
    # start had not reached the record): that moment; the caller counts the start.
    started_at: float | None = None


def _deleted_object(conn: Connection, object_ids: Sequence[str]) -> str | None:
    """The first of ``object_ids`` whose object is deleted (None: none is)."""
    o = t.objects.c
    return conn.execute(
        select(o.object_id)
        .where(o.object_id.in_(object_ids), o.deleted_at.is_not(None))
        .order_by(o.object_id)
        .limit(1)
    ).scalar_one_or_none()


def _lock_live_objects(conn: Connection, object_ids: Iterable[str]) -> set[str]:
    """Those of ``object_ids`` whose object is live, locked ``FOR SHARE`` until the
    transaction ends, in id order (as :func:`~hypermedia.jobs.statements.create_pg`
    and a deletion lock theirs: two never wait for each other's rows in turn). A
    deletion (which locks its object ``FOR UPDATE`` before it looks for jobs on it)
    either waits for this transaction, then sees its jobs, or is waited for, and its
    object is not among those answered."""
    o = t.objects.c
    return set(
        conn.execute(
            select(o.object_id)
            .where(o.object_id.in_(sorted(set(object_ids))), o.deleted_at.is_(None))
            .order_by(o.object_id)
            .with_for_update(read=True)
        ).scalars()
    )


def _submission_values(submission: NewSubmission) -> dict[str, Any]:
    """What a submission's row takes from the plan (:data:`sql.SUBMISSION_COLUMNS`)."""
    return {
        "submission_id": submission.submission_id,
        "idempotency_key": submission.idempotency_key,
        "request_hash": submission.request_hash,
        "estimated_millicredits": submission.estimated_millicredits,
    }


def _job_values(job: NewJob) -> dict[str, Any]:
    """What a new job's row takes from the plan (:data:`sql.JOB_COLUMNS`)."""
    return {
        "job_id": job.job_id,
        "submission_id": job.submission_id,
        "object_id": job.object_id,
        "profile_id": job.profile_id,
        "operation": job.operation,
        "queue": job.queue,
        "priority": job.priority,
        "params": job.params,
        "estimated_millicredits": job.estimated_millicredits,
        "reserved_millicredits": job.reserved_millicredits,
        "max_attempts": job.max_attempts,
        "callback_url": job.callback_url,
        "timeout_seconds": job.timeout_seconds,
    }


def _job_row(job: NewJob, user_id: str, moment: Any, *, callback_url: str | None) -> dict[str, Any]:
    """A new job's row, born as :data:`JobEvent.ENQUEUE` leaves it."""
    return {
        **_job_values(job),
        "user_id": user_id,
        "status": sql.after(JobEvent.ENQUEUE).value,
        "attempt_count": 0,
        "callback_url": callback_url,
        "cancel_requested": False,
        "created_at": moment,
        "queued_at": moment,
        "updated_at": moment,
    }


def enqueue_new(queue: RedisQueue, jobs: Iterable[NewJob], *, action: str) -> None:
    """Push jobs the record already holds as ``queued`` onto their Redis queues. Redis
    down: they stay queued in the record (durable already) and the reconciler pushes
    them when it is back; a warning with ``action`` says so. Those a cancel ended since
    their commit are not made ready: its removal left a tombstone the push honours
    (:mod:`hypermedia.queue.keys`), so no read of the record is needed here."""
    by_queue: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for job in jobs:
        by_queue[job.queue].append((job.job_id, job.priority))
    for name, entries in by_queue.items():
        try:
            queue.enqueue(name, entries)
        except QueueUnavailable as exc:
            log.warning(
                "redis unavailable; %d jobs stay queued in the database",
                len(entries),
                extra={"queue": name, "action": action, "error": str(exc)},
            )


def forget_cancelled(
    queue: RedisQueue,
    events: JobEvents,
    cancelled: Mapping[str, Sequence[str]],
    now: float,
    *,
    action: str,
) -> None:
    """After the commit that cancelled jobs (queue name -> job ids): take them off their
    Redis queues and publish each one's ``cancelled`` status event, so that followers'
    streams end now. Best effort: with Redis down the reconciler drops them later, and
    the streams read the record at each keep-alive."""
    from hypermedia.queue.events import status_event

    for name, job_ids in cancelled.items():
        if not job_ids:
            continue
        try:
            queue.remove(name, list(job_ids))
        except QueueUnavailable as exc:
            log.warning(
                "redis unavailable; the reconciler drops %d cancelled jobs",
                len(job_ids),
                extra={"queue": name, "action": action, "error": str(exc)},
            )
    ended = status_event(JobStatus.CANCELLED.value, now)
    events.publish_many((job_id, ended) for job_ids in cancelled.values() for job_id in job_ids)


class JobRepository:
    def __init__(self, backoff: Backoff | None = None) -> None:
        self.backoff = backoff or Backoff()
        self._statements = sql.StatementCache()

    # -- creation and queueing ----------------------------------------------------

    def create(
        self, conn: Connection, user_id: str, submissions: Sequence[NewSubmission], now: float
    ) -> None:
        """Record accepted submissions of one user: the sum of their jobs' reservations
        held
        (:func:`~hypermedia.jobs.credits.reserve`: too few credits raise
        :class:`~hypermedia.errors.PaymentRequired` before any row is written), their
        submission rows and their job rows, born ``queued``.

        created -> queued happens inside the caller's transaction: the rows are inserted
        already queued (no UPDATE of the batch). On PostgreSQL all of it is one
        statement (:func:`~hypermedia.jobs.statements.create_pg`), atomic by itself: on
        a connection of :func:`~hypermedia.db.engine.statements` it commits alone. A
        second submission with an idempotency key the user already used raises
        ``IntegrityError``, with nothing written.
        """
        if not submissions:
            return
        amount = sum(s.reserved_millicredits for s in submissions)
        estimate = sum(s.estimated_millicredits for s in submissions)
        if conn.dialect.name == "postgresql":  # one statement, one round trip
            objects = sorted({job.object_id for s in submissions for job in s.jobs})
            held = conn.execute(
                self._statements.get(conn, ("create",), sql.create_pg),
                {
                    "b_user": user_id,
                    "b_amount": amount,
                    "b_now": to_datetime(now),
                    "b_submissions": [_submission_values(s) for s in submissions],
                    "b_jobs": [_job_values(job) for s in submissions for job in s.jobs],
                    "b_objects": sql.ids_param(conn, objects),
                    "b_object_count": len(objects),
                },
            ).first()
            if held is None:
                deleted = _deleted_object(conn, objects)
                if deleted is not None:  # since the submit read it
                    raise NotFound(f"no object {deleted!r}", object_id=deleted)
                raise credits.payment_required(conn, user_id, amount, estimate)
            return
        credits.reserve(conn, user_id, amount, now, estimate=estimate)
        moment = to_datetime(now)
        conn.execute(
            _INSERT_SUBMISSIONS,
            [
                {**_submission_values(s), "user_id": user_id, "created_at": moment}
                for s in submissions
            ],
        )
        conn.execute(
            _INSERT_JOBS,
            [
                _job_row(job, user_id, moment, callback_url=job.callback_url)
                for s in submissions
                for job in s.jobs
            ],
        )

    def create_bulk(
        self,
        conn: Connection,
        run_id: str,
        user_id: str,
        submission: NewSubmission,
        now: float,
        *,
        reserve: bool,
    ) -> list[NewJob]:
        """Record one batch of a bulk run's jobs (born ``queued``, tagged with
        ``run_id``) under one submission row of ``user_id``; answers the jobs inserted.
        A job for an object the run already has a job for is left out (the unique
        ``(bulk_run_id, object_id)``: a run resumed from an older cursor creates nothing
        twice), and so is one for an object deleted since the page was read (its
        object locked first, see :func:`_lock_live_objects`). ``reserve``: hold the
        batch's reservations on ``user_id``'s credits first (a run that names an
        account; :class:`~hypermedia.errors.PaymentRequired` and nothing written when
        short); else the platform pays and nothing is reserved."""
        live = _lock_live_objects(conn, [job.object_id for job in submission.jobs])
        jobs = [job for job in submission.jobs if job.object_id in live]
        if not jobs:
            return []
        planned = sum(job.reserved_millicredits for job in jobs)
        estimate = sum(job.estimated_millicredits for job in jobs)
        if reserve:  # before any row: short of credits, nothing is written
            credits.reserve(conn, user_id, planned, now, estimate=estimate)
        moment = to_datetime(now)
        conn.execute(
            insert(t.submissions).values(
                submission_id=submission.submission_id,
                user_id=user_id,
                idempotency_key=submission.idempotency_key,
                request_hash=submission.request_hash,
                estimated_millicredits=estimate,
                created_at=moment,
            )
        )
        dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
        rows = [
            {**_job_row(job, user_id, moment, callback_url=None), "bulk_run_id": run_id}
            for job in jobs
        ]
        inserted = set(
            conn.execute(
                dialect.insert(t.jobs).on_conflict_do_nothing().returning(t.jobs.c.job_id),
                rows,
                # One statement per batch (insertmanyvalues) with RETURNING.
            ).scalars()
        )
        fresh = [job for job in jobs if job.job_id in inserted]
        unused = planned - sum(j.reserved_millicredits for j in fresh)
        if reserve and unused:
            credits.release(conn, user_id, unused, now)
        return fresh

    def mark_queued(self, conn: Connection, job_ids: Sequence[str], now: float) -> int:
        """created -> queued for a batch."""
        if not job_ids:
            return 0
        result = conn.execute(
            update(t.jobs)
            .where(t.jobs.c.job_id.in_(job_ids), t.jobs.c.status.in_(_guard(JobEvent.ENQUEUE)))
            .values(
                status=JobStatus.QUEUED.value,
                queued_at=to_datetime(now),
                updated_at=to_datetime(now),
            )
        )
        return result.rowcount

    def any_due(self, conn: Connection, now: float) -> bool:
        """Whether a job in retry_wait has come due (what :meth:`promote_due` moves)."""
        found = conn.execute(
            select(t.jobs.c.job_id)
            .where(
                t.jobs.c.status.in_(_guard(JobEvent.RETRY_DUE)),
                t.jobs.c.run_after <= to_datetime(now),
            )
            .limit(1)
        ).first()
        return found is not None

    def promote_due(
        self, conn: Connection, now: float, job_ids: Sequence[str] | None = None
    ) -> list[Moved]:
        """retry_wait -> queued for every job whose ``run_after`` has passed."""
        stmt = update(t.jobs).where(
            t.jobs.c.status.in_(_guard(JobEvent.RETRY_DUE)),
            t.jobs.c.run_after <= to_datetime(now),
        )
        if job_ids is not None:
            if not job_ids:
                return []
            stmt = stmt.where(t.jobs.c.job_id.in_(job_ids))
        rows = conn.execute(
            stmt.values(
                status=JobStatus.QUEUED.value,
                run_after=None,
                queued_at=to_datetime(now),
                updated_at=to_datetime(now),
            ).returning(t.jobs.c.job_id, t.jobs.c.queue, t.jobs.c.priority)
        ).all()
        return [Moved(r.job_id, r.queue, r.priority, JobStatus.QUEUED) for r in rows]

    # -- claiming and running ----------------------------------------------------

    def claim(
        self, conn: Connection, job_id: str, worker_id: str, now: float, lease_seconds: float
    ) -> ClaimedJob | None:
        """The atomic claim: queued -> claimed, attempt_count + 1, attempt row. None if lost."""
        claimed = self.claim_many(conn, [job_id], worker_id, now, {}, default_lease=lease_seconds)
        return claimed[0] if claimed else None

    def claim_many(
        self,
        conn: Connection,
        job_ids: Sequence[str],
        worker_id: str,
        now: float,
        leases: Mapping[int, float],
        *,
        default_lease: float,
        start: bool | Literal["first"] = False,
    ) -> list[ClaimedJob]:
        """The atomic claim of a batch: one guarded UPDATE (queued -> claimed,
        attempt_count + 1) and one INSERT of their attempt rows.

        ``leases``: lease seconds by profile id (``default_lease`` for any other).
        ``start``: the START event too (claimed -> processing, ``started_at``), in the
        same UPDATE: the claim's guard still decides, the row just does not stop at
        ``claimed`` on the way; ``"first"``: only for the first of ``job_ids`` (the one
        its loop runs now; the others it took ahead wait ``claimed``). Jobs the guard
        refuses are left out; the claimed ones come back in the order of ``job_ids``.
        """
        if not job_ids:
            return []
        profile_ids = tuple(sorted(leases))
        stmt = self._statements.get(
            conn,
            ("claim", start, profile_ids),
            lambda dialect: sql.claim(dialect, profile_ids, start),
        )
        params: dict[str, Any] = {
            "ids": sql.ids_param(conn, job_ids),
            "b_worker": worker_id,
            "b_now": to_datetime(now),
            "b_deadline": to_datetime(now + default_lease),
        }
        if start == "first":
            params["b_first"] = job_ids[0]
        params.update(
            sql.lease_params(
                conn.dialect.name,
                {pid: to_datetime(now + leases[pid]) for pid in profile_ids},
            )
        )
        rows = {r.job_id: r for r in conn.execute(stmt, params)}
        if not rows:
            return []
        if conn.dialect.name == "postgresql":  # the attempt rows came with the claim
            numbers = {job_id: r.attempt_number for job_id, r in rows.items()}
        else:
            numbers = dict(
                conn.execute(
                    self._statements.get(conn, ("attempts",), sql.attempts),
                    {
                        "ids": sql.ids_param(conn, rows),
                        "b_worker": worker_id,
                        "b_now": to_datetime(now),
                    },
                ).all()
            )
        claimed = []
        for job_id in job_ids:
            row = rows.get(job_id)
            if row is None:
                continue
            claimed.append(
                ClaimedJob(
                    job_id=job_id,
                    queue=row.queue,
                    operation=row.operation,
                    object_id=row.object_id,
                    user_id=row.user_id,
                    profile_id=row.profile_id,
                    priority=row.priority,
                    params=row.params,
                    attempt_number=int(numbers[job_id]),
                    attempt_count=row.attempt_count,
                    max_attempts=row.max_attempts,
                    deadline=now + leases.get(row.profile_id, default_lease),
                    attempt_started_at=now,
                    estimated_millicredits=row.estimated_millicredits,
                    reserved_millicredits=row.reserved_millicredits,
                    started=start is True or (start == "first" and job_id == job_ids[0]),
                    timeout_seconds=row.timeout_seconds,
                )
            )
        return claimed

    def start(self, conn: Connection, job_id: str, worker_id: str, now: float) -> bool:
        """claimed -> processing, by the worker holding the claim."""
        result = conn.execute(
            update(t.jobs)
            .where(
                t.jobs.c.job_id == job_id,
                t.jobs.c.claimed_by == worker_id,
                t.jobs.c.status.in_(_guard(JobEvent.START)),
            )
            .values(
                status=JobStatus.PROCESSING.value,
                started_at=to_datetime(now),
                updated_at=to_datetime(now),
            )
        )
        return result.rowcount == 1

    def start_many(
        self, conn: Connection, worker_id: str, started: Sequence[tuple[str, float]]
    ) -> set[str]:
        """claimed -> processing for jobs a loop took ahead and has now reached, each at
        its own moment (``(job_id, epoch seconds)``): the job's ``started_at`` and its
        running attempt's. Answers the jobs this worker still held ``claimed``."""
        if not started:
            return set()
        if conn.dialect.name == "postgresql":
            stmt = self._statements.get(conn, ("start_pg",), sql.start_pg)
            params = {
                "ids": sql.csv(job_id for job_id, _ in started),
                "b_times": sql.csv(sql.naive_utc(to_datetime(at)) for _, at in started),
                "b_worker": worker_id,
            }
            return set(conn.execute(stmt, params).scalars())
        j, a = t.jobs.c, t.attempts.c
        (source,) = _guard(JobEvent.START)  # one status: executemany takes no IN list
        at = bindparam("b_at", type_=sql.UTC)
        held = set(
            conn.execute(
                select(j.job_id).where(
                    sql.ids_match(j.job_id, conn.dialect.name),
                    j.claimed_by == worker_id,
                    j.status.in_(_guard(JobEvent.START)),
                ),
                {"ids": sql.ids_param(conn, [job_id for job_id, _ in started])},
            ).scalars()
        )
        rows = [
            {"b_job": job_id, "b_worker": worker_id, "b_at": to_datetime(moment)}
            for job_id, moment in started
        ]
        rows = [row for row in rows if row["b_job"] in held]
        if not rows:
            return set()
        conn.execute(
            update(t.jobs)
            .where(
                j.job_id == bindparam("b_job"),
                j.claimed_by == bindparam("b_worker"),
                j.status == source,
            )
            .values(status=JobStatus.PROCESSING.value, started_at=at, updated_at=at),
            rows,
        )
        conn.execute(
            update(t.attempts)
            .where(
                a.job_id == bindparam("b_job"),
                a.worker_id == bindparam("b_worker"),
                a.status == "running",
            )
            .values(started_at=at),
            rows,
        )
        return held

    def extend_lease(
        self, conn: Connection, job_id: str, worker_id: str, deadline: float, now: float
    ) -> bool:
        result = conn.execute(
            update(t.jobs)
            .where(
                t.jobs.c.job_id == job_id,
                t.jobs.c.claimed_by == worker_id,
                t.jobs.c.status.in_([s.value for s in IN_FLIGHT]),
            )
            .values(visibility_timeout=to_datetime(deadline), updated_at=to_datetime(now))
        )
        return result.rowcount == 1

    def is_cancel_requested(self, conn: Connection, job_id: str) -> bool:
        return job_id in self.cancel_requested_among(conn, [job_id])

    def cancel_requested_among(self, conn: Connection, job_ids: Sequence[str]) -> set[str]:
        """The jobs of ``job_ids`` whose user asked to cancel them."""
        if not job_ids:
            return set()
        stmt = self._statements.get(conn, ("cancel_requested",), sql.cancel_requested)
        return set(conn.execute(stmt, {"ids": sql.ids_param(conn, job_ids)}).scalars())

    def complete(
        self,
        conn: Connection,
        job_id: str,
        worker_id: str,
        now: float,
        outputs: Sequence[OutputRecord] = (),
        *,
        actual_millicredits: int | None = None,
        peak_memory_mb: float | None = None,
    ) -> Moved | None:
        """processing -> completed: outputs registered (idempotently), attempt closed,
        credits charged (``actual_millicredits``, else the estimate; at most the job's
        reservation) and the reservation released. None if this worker no longer holds
        the job."""
        moved = self.complete_many(
            conn,
            worker_id,
            now,
            [FinishedJob(job_id, outputs, actual_millicredits, peak_memory_mb)],
        )
        return moved[0] if moved else None

    def complete_many(
        self,
        conn: Connection,
        worker_id: str,
        now: float,
        finished: Sequence[FinishedJob],
        versions: Mapping[int, int] | None = None,
        started: Mapping[str, float] | None = None,
    ) -> list[Moved]:
        """processing -> completed for a batch (group commit): one guarded UPDATE, the
        attempts closed, one ledger charge per job (its actual cost, at most its
        reservation) and the credits settled once per user (the charges spent, the
        jobs' whole reservations released); outputs registered (idempotently). On
        PostgreSQL all of it but the outputs is one statement (data-modifying CTEs),
        else a few.

        ``versions``: profile versions by id where the caller knows them (else read).
        ``started``: of these, jobs still ``claimed`` (taken ahead) that began at the
        moment given: started and completed at once. Jobs this worker no longer holds
        are left out of the answer and untouched.
        """
        if not finished:
            return []
        started = started or {}
        if started and conn.dialect.name != "postgresql":
            self.start_many(conn, worker_id, list(started.items()))
        if conn.dialect.name == "postgresql":
            stmt = self._statements.get(conn, ("complete_pg",), sql.complete_pg)
            rows = list(
                conn.execute(
                    stmt,
                    {
                        "ids": sql.csv(f.job_id for f in finished),
                        "b_actuals": sql.csv(f.actual_millicredits for f in finished),
                        "b_peaks": sql.csv(f.peak_memory_mb for f in finished),
                        "b_starts": sql.csv(
                            sql.naive_utc(to_datetime(started[f.job_id]))
                            if f.job_id in started
                            else None
                            for f in finished
                        ),
                        "b_ends": sql.csv(
                            None
                            if f.attempt_finished_at is None
                            else sql.naive_utc(to_datetime(f.attempt_finished_at))
                            for f in finished
                        ),
                        "b_worker": worker_id,
                        "b_now": to_datetime(now),
                    },
                )
            )
            _warn_charged_already([r.job_id for r in rows if not r.charged])
        else:
            rows = self._complete_in_steps(conn, worker_id, now, finished)
        if not rows:
            return []
        # The batch's order (UPDATE ... RETURNING answers in the table's): the outputs
        # register in it, so of two jobs that wrote one key the record keeps the last.
        order = {f.job_id: i for i, f in enumerate(finished)}
        rows.sort(key=lambda r: order[r.job_id])
        by_id = {f.job_id: f for f in finished}
        if any(by_id[r.job_id].outputs for r in rows):
            self._register_outputs(conn, rows, by_id, now, versions or {})
        units = [
            {"b_job": r.job_id, "b_units": dict(found.units)}
            for r in rows
            if (found := by_id[r.job_id]).units is not None
        ]
        if units:
            conn.execute(self._statements.get(conn, ("units",), sql.attempt_units), units)
        return [
            Moved(r.job_id, r.queue, r.priority, JobStatus.COMPLETED, operation=r.operation)
            for r in rows
        ]

    def _complete_in_steps(
        self, conn: Connection, worker_id: str, now: float, finished: Sequence[FinishedJob]
    ) -> list[Row[Any]]:
        """:meth:`complete_many` without data-modifying CTEs (SQLite)."""
        moment = to_datetime(now)
        by_id = {f.job_id: f for f in finished}
        # Jobs charged their estimate (the usual case) go in one UPDATE; a job with an
        # explicit actual cost gets its own.
        groups: dict[int | None, list[str]] = defaultdict(list)
        for f in finished:
            groups[f.actual_millicredits].append(f.job_id)
        stmt = self._statements.get(conn, ("complete",), sql.complete)
        rows: list[Row[Any]] = []
        for actual, ids in groups.items():
            params = {"ids": sql.ids_param(conn, ids), "b_worker": worker_id, "b_now": moment}
            rows.extend(conn.execute(stmt, {**params, "b_actual": actual}))
        if not rows:
            return []
        self._close_attempts(conn, [by_id[r.job_id] for r in rows], "completed", now)
        made = {
            charge.job_id
            for charge in conn.execute(
                self._statements.get(conn, ("ledger",), sql.ledger),
                {"ids": sql.ids_param(conn, [r.job_id for r in rows]), "b_now": moment},
            )
        }
        _warn_charged_already([r.job_id for r in rows if r.job_id not in made])
        callbacks.record(conn, [(r.job_id, "completed") for r in rows if r.callback_url], now)
        charged: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for r in rows:
            # A job charged already spends nothing more; its reservation goes all the same.
            if r.job_id in made:
                charged[r.user_id][0] += r.actual_millicredits
            charged[r.user_id][1] += r.reserved_millicredits
        # The account rows last: they are the rows every submit and completion of a
        # user contends for, so hold their locks for the shortest time.
        conn.execute(
            self._statements.get(conn, ("settle",), sql.settle),
            [
                {"b_user": user_id, "b_charge": charge, "b_reserved": reserved, "b_now": moment}
                for user_id, (charge, reserved) in sorted(charged.items())
            ],
        )
        return rows

    def _register_outputs(
        self,
        conn: Connection,
        rows: Sequence[Row[Any]],
        finished: Mapping[str, FinishedJob],
        now: float,
        versions: Mapping[int, int],
    ) -> None:
        wanted = {r.profile_id for r in rows if finished[r.job_id].outputs} - set(versions)
        known = dict(versions)
        if wanted:
            known.update(
                conn.execute(
                    select(t.profiles.c.profile_id, t.profiles.c.version).where(
                        t.profiles.c.profile_id.in_(sorted(wanted))
                    )
                ).all()
            )
        produced = [(r, o) for r in rows for o in finished[r.job_id].outputs]
        stored: defaultdict[str, int] = defaultdict(int)
        object_ids = self._derived_objects(
            conn, [(r.job_id, r.user_id, o) for r, o in produced if not o.object_id], now, stored
        )
        moment = to_datetime(now)
        records = [
            {
                "job_id": r.job_id,
                "output_type": o.output_type,
                "profile_version": known[r.profile_id],
                "object_id": o.object_id or object_ids[o.storage_key],
                "storage_key": o.storage_key,
                "size_bytes": o.size_bytes,
                "content_type": o.content_type,
                "created_at": moment,
            }
            for r, o in produced
        ]
        if records:
            conn.execute(
                self._statements.get(conn, ("insert_outputs",), sql.insert_outputs), records
            )
        accounts.add_stored_bytes(conn, stored)

    def fail(
        self,
        conn: Connection,
        job_id: str,
        worker_id: str | None,
        now: float,
        error_code: str,
        error_message: str,
        *,
        retryable: bool = True,
        peak_memory_mb: float | None = None,
        retry_now: bool = False,
        log_tail: str | None = None,
        started_at: float | None = None,
        outage: bool = False,
    ) -> tuple[Moved, FailureDecision] | None:
        """A failed attempt: retry_wait with backoff, or failed once attempts are used up
        (cancelled instead, retried or not, if its owner asked for that meanwhile).

        ``outage``: the platform's outage ended it (``error_code`` a
        :class:`~hypermedia.errors.ServiceUnavailable`'s), not the job: the attempt is
        not counted (``attempt_count`` back by one, the attempt closed ``released``
        with the error) and the job waits in retry_wait (:func:`~hypermedia.jobs.
        states.decide_outage`), up to :data:`~hypermedia.jobs.states.OUTAGE_HANDBACKS`
        times a job (its released attempts with such a code say how many).

        ``worker_id`` None is the reaper acting for a worker that vanished; it only
        matches jobs whose lease has expired. ``log_tail``: the end of what the job's
        child printed, kept on the attempt for the job's owner. ``started_at``: when
        the worker began the job; one its loop took ahead may still be ``claimed`` here
        (its start waits in the worker's completion batcher): it starts at that moment
        first, so its attempt is timed from it, not from the claim.
        """
        conds = [t.jobs.c.job_id == job_id, t.jobs.c.status.in_(_guard(JobEvent.FAIL))]
        if worker_id is not None:
            conds.append(t.jobs.c.claimed_by == worker_id)
        else:
            conds.append(t.jobs.c.visibility_timeout <= to_datetime(now))
        row = conn.execute(
            select(
                t.jobs.c.attempt_count,
                t.jobs.c.max_attempts,
                t.jobs.c.queue,
                t.jobs.c.operation,
                t.jobs.c.priority,
                t.jobs.c.user_id,
                t.jobs.c.reserved_millicredits,
                t.jobs.c.claimed_by,
                t.jobs.c.callback_url,
                t.jobs.c.status,
                t.jobs.c.cancel_requested,
            ).where(*conds)
        ).one_or_none()
        if row is None:
            return None
        began = None
        if (
            started_at is not None
            and worker_id is not None
            and row.status in _guard(JobEvent.START)
            and self.start_many(conn, worker_id, [(job_id, started_at)])
        ):
            began = started_at
        if outage and error_code in outage_codes():
            decision = decide_outage(
                row.attempt_count,
                row.max_attempts,
                self._outage_handbacks(conn, job_id),
                now,
                self.backoff,
            )
        else:
            decision = decide_failure(
                row.attempt_count, row.max_attempts, now, self.backoff, retryable=retryable
            )
        if retry_now and decision.retry_at is not None:
            # The worker died, not the job: the attempt counts, the wait does not.
            decision = FailureDecision(decision.status, now, decision.reason + " (retry now)")
        if row.cancel_requested:
            # Its owner cancelled it while it ran (a worker that died, or failed it,
            # before honouring that): cancelled now, its credits released, not queued
            # again to be claimed and cancelled by the next worker after the backoff;
            # nor failed when this failure was its last (attempts used up, an error not
            # retryable): its owner asked to cancel it and reads that it was.
            decision = FailureDecision(JobStatus.CANCELLED, None, "cancel requested")
        # A cancelled job names no error, however it ended (as a completed one names
        # none): the failure is its attempt's, closed below with its code.
        ended_cancelled = decision.status is JobStatus.CANCELLED
        values: dict[str, Any] = {
            "status": decision.status.value,
            "error_code": None if ended_cancelled else error_code,
            "error_message": None if ended_cancelled else error_message[:4000],
            "visibility_timeout": None,
            "updated_at": to_datetime(now),
        }
        if decision.retry_at is not None:
            values["run_after"] = to_datetime(decision.retry_at)
        else:
            values["completed_at"] = to_datetime(now)
        if not decision.counted:
            values["attempt_count"] = row.attempt_count - 1
        result = conn.execute(
            update(t.jobs)
            .where(*conds, t.jobs.c.attempt_count == row.attempt_count)
            .values(**values)
        )
        if result.rowcount != 1:
            return None
        self._close_attempt(
            conn,
            job_id,
            "failed" if decision.counted else "released",
            now,
            peak_memory_mb,
            error_code,
            error_message,
            log_tail,
        )
        if decision.status in (JobStatus.FAILED, JobStatus.CANCELLED):
            credits.release(conn, row.user_id, row.reserved_millicredits, now)
            if row.callback_url:
                callbacks.record(conn, [(job_id, decision.status.value)], now)
        moved = Moved(
            job_id,
            row.queue,
            row.priority,
            decision.status,
            decision.retry_at,
            row.operation,
            started_at=began,
        )
        return moved, decision

    def _outage_handbacks(self, conn: Connection, job_id: str) -> int:
        """How many of the job's attempts were handed back for the platform's outage."""
        a = t.attempts.c
        return int(
            conn.execute(
                select(func.count()).where(
                    a.job_id == job_id,
                    a.status == "released",
                    a.error_code.in_(sorted(outage_codes())),
                )
            ).scalar_one()
        )

    def release(
        self,
        conn: Connection,
        job_id: str,
        worker_id: str,
        now: float,
        *,
        reason_code: str | None = None,
        reason: str | None = None,
        started_at: float | None = None,
    ) -> Moved | None:
        """Hand an in-flight job back to the queue without spending an attempt
        (drain, spot notice). The attempt row is closed as ``released``, with
        ``reason_code`` / ``reason`` in its error columns when given (why it was
        handed back; ``released`` says it is not a failure). ``started_at``: as for
        :meth:`fail`, a job its loop took ahead and began, still ``claimed`` here,
        starts at that moment first, its attempt timed from it."""
        began = self._start_begun(conn, job_id, worker_id, started_at)
        row = conn.execute(
            update(t.jobs)
            .where(
                t.jobs.c.job_id == job_id,
                t.jobs.c.claimed_by == worker_id,
                t.jobs.c.status.in_(_guard(JobEvent.RELEASE)),
            )
            .values(
                status=JobStatus.QUEUED.value,
                claimed_by=None,
                visibility_timeout=None,
                attempt_count=t.jobs.c.attempt_count - 1,
                queued_at=to_datetime(now),
                updated_at=to_datetime(now),
            )
            .returning(t.jobs.c.queue, t.jobs.c.priority, t.jobs.c.attempt_count)
        ).one_or_none()
        if row is None:
            return None
        self._close_attempt(conn, job_id, "released", now, None, reason_code, reason)
        return Moved(job_id, row.queue, row.priority, JobStatus.QUEUED, started_at=began)

    def cancel_claimed(
        self,
        conn: Connection,
        job_id: str,
        worker_id: str,
        now: float,
        *,
        started_at: float | None = None,
    ) -> Moved | None:
        """The worker honours ``cancel_requested``: in flight -> cancelled.
        ``started_at``: as for :meth:`release`."""
        began = self._start_begun(conn, job_id, worker_id, started_at)
        row = conn.execute(
            update(t.jobs)
            .where(
                t.jobs.c.job_id == job_id,
                t.jobs.c.claimed_by == worker_id,
                t.jobs.c.cancel_requested.is_(True),
                t.jobs.c.status.in_([s.value for s in IN_FLIGHT]),
            )
            .values(
                status=JobStatus.CANCELLED.value,
                visibility_timeout=None,
                completed_at=to_datetime(now),
                updated_at=to_datetime(now),
                error_code=None,  # an earlier attempt's, if one failed (see fail())
                error_message=None,
            )
            .returning(
                t.jobs.c.queue,
                t.jobs.c.priority,
                t.jobs.c.user_id,
                t.jobs.c.attempt_count,
                t.jobs.c.reserved_millicredits,
                t.jobs.c.callback_url,
            )
        ).one_or_none()
        if row is None:
            return None
        self._close_attempt(conn, job_id, "cancelled", now, None)
        credits.release(conn, row.user_id, row.reserved_millicredits, now)
        if row.callback_url:
            callbacks.record(conn, [(job_id, JobStatus.CANCELLED.value)], now)
        return Moved(job_id, row.queue, row.priority, JobStatus.CANCELLED, started_at=began)

    def _start_begun(
        self, conn: Connection, job_id: str, worker_id: str, started_at: float | None
    ) -> float | None:
        """Start a job its loop began at ``started_at`` if the record still has it
        ``claimed`` (:meth:`start_many`); answers that moment if it did."""
        if started_at is None or not self.start_many(conn, worker_id, [(job_id, started_at)]):
            return None
        return started_at

    # -- cancellation by the user ---------------------------------------------------

    def cancel(self, conn: Connection, job_id: str, user_id: str, now: float) -> JobStatus | None:
        """User cancel. Not yet running -> cancelled; running -> cancel_requested
        (status stays; answers PROCESSING/CLAIMED). None if no such job for this user.
        A terminal job answers its own status, unchanged."""
        row = conn.execute(
            update(t.jobs)
            .where(
                t.jobs.c.job_id == job_id,
                t.jobs.c.user_id == user_id,
                t.jobs.c.status.in_(
                    [s.value for s in sources(JobEvent.CANCEL) if s not in IN_FLIGHT]
                ),
            )
            .values(
                status=JobStatus.CANCELLED.value,
                completed_at=to_datetime(now),
                run_after=None,
                updated_at=to_datetime(now),
                error_code=None,  # a retry_wait job's: its failed attempt's (see fail())
                error_message=None,
            )
            .returning(t.jobs.c.reserved_millicredits, t.jobs.c.callback_url)
        ).one_or_none()
        if row is not None:
            credits.release(conn, user_id, row.reserved_millicredits, now)
            if row.callback_url:
                callbacks.record(conn, [(job_id, JobStatus.CANCELLED.value)], now)
            return JobStatus.CANCELLED
        conn.execute(
            update(t.jobs)
            .where(
                t.jobs.c.job_id == job_id,
                t.jobs.c.user_id == user_id,
                t.jobs.c.status.in_([s.value for s in IN_FLIGHT]),
            )
            .values(cancel_requested=True, updated_at=to_datetime(now))
        )
        status = conn.execute(
            select(t.jobs.c.status).where(t.jobs.c.job_id == job_id, t.jobs.c.user_id == user_id)
        ).scalar_one_or_none()
        return None if status is None else JobStatus(status)

    # -- the reaper's view ---------------------------------------------------------

    def expired(self, conn: Connection, now: float, limit: int = 1000) -> list[str]:
        """In-flight jobs whose visibility timeout has passed."""
        return list(
            conn.execute(
                select(t.jobs.c.job_id)
                .where(
                    t.jobs.c.status.in_([s.value for s in IN_FLIGHT]),
                    t.jobs.c.visibility_timeout <= to_datetime(now),
                )
                .limit(limit)
            ).scalars()
        )

    def in_flight_of(self, conn: Connection, worker_id: str) -> list[str]:
        """Jobs a worker holds (claimed or processing)."""
        return list(
            conn.execute(
                select(t.jobs.c.job_id).where(
                    t.jobs.c.claimed_by == worker_id,
                    t.jobs.c.status.in_([s.value for s in IN_FLIGHT]),
                )
            ).scalars()
        )

    def states(self, conn: Connection, job_ids: Sequence[str]) -> dict[str, Row[Any]]:
        if not job_ids:
            return {}
        rows = conn.execute(
            select(
                t.jobs.c.job_id,
                t.jobs.c.queue,
                t.jobs.c.priority,
                t.jobs.c.status,
                t.jobs.c.run_after,
                t.jobs.c.visibility_timeout,
                t.jobs.c.claimed_by,
            ).where(t.jobs.c.job_id.in_(job_ids))
        ).all()
        return {r.job_id: r for r in rows}  # type: ignore[misc]

    # -- helpers -------------------------------------------------------------------

    def _derived_objects(
        self,
        conn: Connection,
        outputs: Sequence[tuple[str, str, OutputRecord]],
        now: float,
        stored: defaultdict[str, int],
    ) -> dict[str, str]:
        """The objects rows of (job_id, user_id, output)s: one per storage key (a re-run
        overwrote the same key, so it updates the same row; a row deleted meanwhile is
        live again, the re-running job's user's), by storage key. What they
        add to their owners' stored bytes goes into ``stored``. A few statements for
        the whole batch, each built once."""
        if not outputs:
            return {}
        keys = sorted({output.storage_key for _, _, output in outputs})
        found = {
            r.storage_key: r
            for r in conn.execute(
                self._statements.get(conn, ("objects_by_key",), sql.objects_by_key),
                {"b_keys": keys},
            )
        }
        new_jobs = sorted({job for job, _, out in outputs if out.storage_key not in found})
        sources = {
            r.job_id: r
            for r in (
                conn.execute(
                    self._statements.get(conn, ("job_sources",), sql.job_sources),
                    {"b_jobs": new_jobs},
                )
                if new_jobs
                else ()
            )
        }
        # In the batch's order, as one statement each did before: a key two jobs of the
        # batch wrote (the same operation asked twice) is created once, then resized.
        created: dict[str, dict[str, Any]] = {}
        resized: dict[str, dict[str, Any]] = {}
        object_ids: dict[str, str] = {}
        for job_id, user_id, output in outputs:
            key = output.storage_key
            if key in created:
                row = created[key]
                stored[row["owner_id"]] += output.size_bytes - row["size_bytes"]
                row.update(size_bytes=output.size_bytes, content_type=output.content_type)
            elif key in found:
                existing = found[key]
                change = resized.get(key)
                if change is not None:
                    owner, before = change["b_owner"], change["b_size"]
                elif existing.deleted_at is None:
                    owner, before = existing.owner_id, int(existing.size_bytes)
                else:
                    # Its owner deleted it: the bytes are stored again, this job's
                    # user's now (else no quota would count them, no delete take them).
                    owner, before = user_id, 0
                stored[owner] += output.size_bytes - before
                resized[key] = {
                    "b_id": existing.object_id,
                    "b_owner": owner,
                    "b_size": output.size_bytes,
                    "b_type": output.content_type,
                }
                object_ids[key] = str(existing.object_id)
            else:
                source = sources.get(job_id)
                if source is None:
                    raise NoResultFound(f"job {job_id} has no source object")
                object_ids[key] = new_id(after=source.object_id)
                created[key] = {
                    "object_id": object_ids[key],
                    "pool_id": source.pool_id,
                    "owner_id": user_id,
                    "kind": "derived",
                    "source_object_id": source.object_id,
                    "storage_key": key,
                    "filename": output.output_type,
                    "content_type": output.content_type,
                    "size_bytes": output.size_bytes,
                    "created_at": to_datetime(now),
                }
                stored[user_id] += output.size_bytes
        if resized:
            conn.execute(
                self._statements.get(conn, ("resize_object",), sql.resize_object),
                list(resized.values()),
            )
        if created:
            conn.execute(
                self._statements.get(conn, ("insert_objects",), lambda _: insert(t.objects)),
                list(created.values()),
            )
        return object_ids

    def _close_attempts(
        self, conn: Connection, finished: Iterable[FinishedJob], status: str, now: float
    ) -> None:
        """Close the running attempt of each job in one executemany, ended at its
        ``attempt_finished_at`` (else ``now``); started times not given are read in one
        SELECT."""
        finished = list(finished)
        unknown = [f.job_id for f in finished if f.attempt_started_at is None]
        started_at: dict[str, float] = {}
        if unknown:
            a = t.attempts.c
            for job_id, begun in conn.execute(
                select(a.job_id, a.started_at).where(a.job_id.in_(unknown), a.status == "running")
            ).all():
                started_at[job_id] = begun.timestamp()
        rows = []
        for f in finished:
            begun = f.attempt_started_at
            if begun is None:
                begun = started_at.get(f.job_id)
            if begun is None:
                continue  # no running attempt (a row older than attempts)
            ended = now if f.attempt_finished_at is None else f.attempt_finished_at
            rows.append(
                {
                    "b_job": f.job_id,
                    "b_duration": max(0, int((ended - begun) * 1000)),
                    "b_peak": f.peak_memory_mb,
                    "b_status": status,
                    "b_now": to_datetime(ended),
                }
            )
        if rows:
            conn.execute(self._statements.get(conn, ("close",), sql.close_attempt), rows)

    def _close_attempt(
        self,
        conn: Connection,
        job_id: str,
        status: str,
        now: float,
        peak_memory_mb: float | None,
        error_code: str | None = None,
        error_message: str | None = None,
        log_tail: str | None = None,
    ) -> None:
        """Close the job's running attempt (claims are exclusive: there is at most one)."""
        running = conn.execute(
            select(t.attempts.c.attempt_id, t.attempts.c.started_at).where(
                t.attempts.c.job_id == job_id, t.attempts.c.status == "running"
            )
        ).first()
        if running is None:
            return
        duration_ms = max(0, int((now - running.started_at.timestamp()) * 1000))
        conn.execute(
            update(t.attempts)
            .where(t.attempts.c.attempt_id == running.attempt_id)
            .values(
                status=status,
                finished_at=to_datetime(now),
                duration_ms=duration_ms,
                peak_memory_mb=peak_memory_mb,
                error_code=error_code,
                error_message=None if error_message is None else error_message[:4000],
                log_tail=log_tail or None,
            )
        )


def _warn_charged_already(job_ids: Sequence[str]) -> None:
    """Completed jobs the ledger had a charge of already (``uk_credit_ledger_job_charge``):
    not charged again. A job completes once, so this says something moved one back."""
    for job_id in job_ids:
        log.warning(
            "job %s completed but charged already: not charged again",
            job_id,
            extra={"job_id": job_id, "action": "charge"},
        )


def remove_outputs(conn: Connection, object_ids: Sequence[str]) -> None:
    """Forget the outputs of deleted objects: the output rows of every job that ran on
    one of ``object_ids``, and every output row that names one of them (its blobs are
    gone; the jobs stay, for their history)."""
    if not object_ids:
        return
    jobs = select(t.jobs.c.job_id).where(t.jobs.c.object_id.in_(object_ids))
    conn.execute(
        delete(t.outputs).where(
            t.outputs.c.job_id.in_(jobs) | t.outputs.c.object_id.in_(object_ids)
        )
    )


__all__ = [
    "ClaimedJob",
    "FinishedJob",
    "JobRepository",
    "Moved",
    "NewJob",
    "NewSubmission",
    "OutputRecord",
    "remove_outputs",
]


def outage_codes() -> frozenset[str]:
    """The error codes of the platform's outage (every
    :class:`~hypermedia.errors.ServiceUnavailable`'s: the record, Redis, the storage,
    the head), which end an attempt without counting it (:meth:`JobRepository.fail`)."""
    global _OUTAGE_CODES
    if _OUTAGE_CODES is None:
        _OUTAGE_CODES = frozenset(
            code for code, cls in error_classes().items() if issubclass(cls, ServiceUnavailable)
        )
    return _OUTAGE_CODES


_OUTAGE_CODES: frozenset[str] | None = None
