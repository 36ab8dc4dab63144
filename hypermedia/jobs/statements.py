"""The SQL of the worker's batch steps and of the submit, built once per dialect and
kept.

``claim`` (queued -> claimed, or -> processing with the START event folded in) and
the attempt rows; ``start_pg`` (the later start of jobs claimed ahead);
``complete_pg`` (PostgreSQL: the whole completion as one statement of
data-modifying CTEs) and its parts for other databases (``complete``,
``close_attempt``, ``ledger``, ``settle``); ``cancel_requested``; ``create_pg`` (a
submit's record as one statement on PostgreSQL). Statements take
bound parameters only (names start with ``b_``, except ``ids``), so one compiled
form serves every batch: on PostgreSQL the ids go as one comma-separated text
parameter (``job_id = ANY(string_to_array(:ids, ','))``), one statement text for
every batch size, and one parameter (psycopg dumps a list element by element in
Python).

Guards are written so the ids drive the lookup (see :func:`guarded`). Used by
:class:`~hypermedia.jobs.repository.JobRepository`; nothing here executes anything.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from datetime import UTC as UTC_ZONE
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import (
    JSON,
    BigInteger,
    ColumnElement,
    Connection,
    Executable,
    Float,
    Integer,
    String,
    Text,
    and_,
    any_,
    bindparam,
    case,
    column,
    func,
    insert,
    literal,
    or_,
    select,
    true,
    type_coerce,
    update,
)
from sqlalchemy import cast as sa_cast
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.dml import ReturningUpdate
from sqlalchemy.sql.elements import Grouping

from hypermedia.db import tables as t
from hypermedia.jobs import callbacks, credits
from hypermedia.jobs.states import JobEvent, JobStatus, sources, transition


def guard(event: JobEvent) -> list[str]:
    """The statuses ``event`` is legal from: the guard of its UPDATE."""
    return sorted(s.value for s in sources(event))


def after(event: JobEvent, *then: JobEvent) -> JobStatus:
    """The one status every source of ``event`` leads to, then through ``then``."""
    targets = {transition(s, event) for s in sources(event)}
    if len(targets) != 1:
        raise ValueError(f"{event} leads to {sorted(targets)}, not one status")
    (status,) = targets
    for next_event in then:
        status = transition(status, next_event)
    return status


def ids_match(column: Any, dialect: str, name: str = "ids") -> ColumnElement[bool]:
    """``column = ANY(string_to_array(:ids, ','))`` on PostgreSQL: one statement text
    for every batch size (so it stays prepared) and one text parameter (psycopg dumps
    a list element by element in Python); ``column IN (:ids...)`` elsewhere. Pass the
    ids through :func:`ids_param`."""
    if dialect == "postgresql":
        return column == any_(pg_array(name, String))  # type: ignore[no-any-return]
    return column.in_(bindparam(name, expanding=True))  # type: ignore[no-any-return]


def guarded(column: Any, event: JobEvent) -> ColumnElement[bool]:
    """``(status IN (<sources of event>)) IS TRUE``: the guard of a batch step, written
    so no index on status can serve it. The jobs are found by id; a plan that scans
    every queued job through a status index and filters by id (what PostgreSQL picks
    when its statistics are missing or old, as in a burst) costs the whole queue per
    claim."""
    return column.in_(guard(event)).is_(true())  # type: ignore[no-any-return]


def pg_array(name: str, element: Any) -> Any:
    """A PostgreSQL array sent as one comma-separated text parameter (see :func:`csv`)."""
    text = func.string_to_array(bindparam(name, type_=String), literal(","), literal("NULL"))
    return text if element is String else sa_cast(text, postgresql.ARRAY(element))


def pg_timestamps(name: str) -> Any:
    """:func:`pg_array` of timestamps (text of :func:`naive_utc`), read once a
    statement: text -> timestamp is not immutable, so PostgreSQL would parse the whole
    array again for each row that indexes it (a batch of n jobs, n x n parses: half a
    completion's time at 60 jobs). As a scalar subquery it is an InitPlan, run once."""
    return select(pg_array(name, postgresql.TIMESTAMP)).scalar_subquery()


def csv(values: Iterable[object]) -> str:
    """Ids, integers and floats (None as NULL) for :func:`_pg_array`; ids never hold commas."""
    return ",".join("NULL" if v is None else str(v) for v in values)


def ids_param(conn: Connection, job_ids: Iterable[str]) -> Any:
    """The ``ids`` parameter of :func:`_ids_match` for this connection's dialect."""
    return csv(job_ids) if conn.dialect.name == "postgresql" else list(job_ids)


UTC = t.jobs.c.updated_at.type


def now_param() -> Any:
    return bindparam("b_now", type_=UTC)


class StatementCache:
    """Statements built once per (key, dialect) and kept; safe across threads."""

    def __init__(self) -> None:
        self._statements: dict[tuple[Any, ...], Executable] = {}
        self._lock = threading.Lock()

    def get(
        self, conn: Connection, key: tuple[Any, ...], build: Callable[[str], Executable]
    ) -> Executable:
        dialect = conn.dialect.name
        full = (dialect, *key)
        found = self._statements.get(full)
        if found is None:
            with self._lock:
                found = self._statements.setdefault(full, build(dialect))
        return found


def cancel_requested(dialect: str) -> Executable:
    return select(t.jobs.c.job_id).where(
        ids_match(t.jobs.c.job_id, dialect), t.jobs.c.cancel_requested.is_(True)
    )


def claim(dialect: str, profile_ids: tuple[int, ...], start: bool | Literal["first"]) -> Executable:
    """The claim of a batch (``start``: True, every job started too; ``"first"``, only
    the job ``b_first``, the one its loop runs at once: the others wait ``claimed``)."""
    j = t.jobs.c
    now = now_param()
    deadline: Any = bindparam("b_deadline", type_=UTC)
    if profile_ids and dialect == "postgresql":
        # The profiles' deadlines as two arrays in step (:func:`lease_params`): the
        # statement keeps 18 parameters whatever the number of profiles (psycopg
        # caches its conversion of a query of at most 50; a CASE of 25 profiles made
        # 62, converted again on every claim: a tenth of the claim loops' time).
        ends = Grouping(pg_timestamps("b_lease_ends"))
        deadline = func.coalesce(
            ends[func.array_position(pg_array("b_lease_profiles", Integer), j.profile_id)],
            deadline,
        )
    elif profile_ids:
        deadline = case(
            {pid: bindparam(f"b_deadline_{pid}", type_=UTC) for pid in profile_ids},
            value=j.profile_id,
            else_=deadline,
        )
    values: dict[str, Any] = {
        "status": after(JobEvent.CLAIM).value,
        "claimed_by": bindparam("b_worker", type_=String),
        "claimed_at": now,
        "visibility_timeout": deadline,
        "attempt_count": j.attempt_count + 1,
        "updated_at": now,
    }
    if start == "first":
        first = j.job_id == bindparam("b_first", type_=String)
        values["status"] = case(
            (first, after(JobEvent.CLAIM, JobEvent.START).value),
            else_=after(JobEvent.CLAIM).value,
        )
        values["started_at"] = case((first, now), else_=j.started_at)
    elif start:
        values["status"] = after(JobEvent.CLAIM, JobEvent.START).value
        values["started_at"] = now
    claiming = (
        update(t.jobs)
        .where(ids_match(j.job_id, dialect), guarded(j.status, JobEvent.CLAIM))
        .values(values)
        .returning(
            j.job_id,
            j.queue,
            j.operation,
            j.object_id,
            j.user_id,
            j.profile_id,
            j.priority,
            j.params,
            j.attempt_count,
            j.max_attempts,
            j.estimated_millicredits,
            j.reserved_millicredits,
            j.timeout_seconds,
        )
    )
    if dialect != "postgresql":
        return claiming
    # PostgreSQL: the attempt rows in the same statement, from the claimed rows.
    claimed = claiming.cte("claimed")
    numbered = attempts(dialect, claimed).cte("attempt")
    return select(claimed, numbered.c.attempt_number).join(
        numbered, numbered.c.job_id == claimed.c.job_id
    )


def start_pg(dialect: str) -> Executable:
    """PostgreSQL's :meth:`JobRepository.start_many` in one statement: the jobs of
    ``ids`` this worker holds ``claimed`` start, each at its moment (``b_times``, in
    the order of ``ids``), and so do their running attempts; answers the started ids."""
    j, a = t.jobs.c, t.attempts.c
    ids = type_coerce(pg_array("ids", String), postgresql.ARRAY(Text))
    times = pg_timestamps("b_times")

    def of(job_id: Any) -> Any:
        return Grouping(times)[func.array_position(ids, sa_cast(job_id, Text))]

    started = (
        update(t.jobs)
        .where(
            ids_match(j.job_id, dialect),
            j.claimed_by == bindparam("b_worker", type_=String),
            guarded(j.status, JobEvent.START),
        )
        .values(
            status=after(JobEvent.START).value,
            started_at=of(j.job_id),
            updated_at=of(j.job_id),
        )
        .returning(j.job_id)
        .cte("started")
    )
    timed = (
        update(t.attempts)
        .where(
            ids_match(a.job_id, dialect),
            a.job_id.in_(select(started.c.job_id)),
            a.status == "running",
        )
        .values(started_at=of(a.job_id))
        .returning(a.attempt_id)
        .cte("timed")
    )
    return select(started.c.job_id).add_cte(timed)


def naive_utc(moment: datetime) -> str:
    """An aware datetime as PostgreSQL's ``timestamp`` text of its UTC time."""
    return moment.astimezone(UTC_ZONE).replace(tzinfo=None).isoformat(sep=" ")


def lease_params(dialect: str, deadlines: dict[int, datetime]) -> dict[str, Any]:
    """The per-profile deadlines of :func:`claim` (``deadlines``: profile id -> aware
    datetime, one for each of the statement's profile ids)."""
    if dialect != "postgresql":
        return {f"b_deadline_{pid}": moment for pid, moment in deadlines.items()}
    return {
        "b_lease_profiles": csv(deadlines),
        "b_lease_ends": csv(naive_utc(moment) for moment in deadlines.values()),
    }


def attempts(dialect: str, claimed: Any = None) -> Any:
    """One running attempt row per claimed job (the ``claimed`` rows, else the
    jobs of ``ids``), numbered after its last one: attempt rows are numbered 1, 2,
    3 ... even when a released attempt was not counted against max_attempts, so the
    number can run ahead of attempt_count."""
    a = t.attempts
    source = claimed.c if claimed is not None else t.jobs.c
    previous = a.alias("previous")
    number = (
        select(func.coalesce(func.max(previous.c.attempt_number), 0) + 1)
        .where(previous.c.job_id == source.job_id)
        .scalar_subquery()
    )
    rows = select(
        source.job_id,
        number,
        bindparam("b_worker", type_=String),
        literal("running", String),
        now_param(),
    )
    if claimed is None:
        rows = rows.where(ids_match(source.job_id, dialect))
    return (
        insert(a)
        .from_select(["job_id", "attempt_number", "worker_id", "status", "started_at"], rows)
        .returning(a.c.job_id, a.c.attempt_number)
    )


def complete_pg(dialect: str) -> Executable:
    """PostgreSQL's :meth:`complete_many` in one statement.

    ``done`` completes the jobs this worker holds (the guard); ``closed`` closes
    their running attempts, ``ledger`` charges each (not one charged already: each
    row answered says ``charged``), ``settle`` spends each user's charges made and
    releases their jobs' reservations, ``outbox`` records the terminal
    event of each that named a callback (:mod:`hypermedia.jobs.callbacks`). Per-job
    values (actual cost, peak memory, ``b_starts``, ``b_ends``) come as arrays in the
    order of ``ids``. Every part reads ``done``, so the job rows are locked before the
    account rows, in the same order as every other step.

    ``b_starts``: for a job its loop took ahead and began since the last batch, the
    moment it did (else NULL): such a job, still ``claimed``, is started and completed
    here at once (its ``started_at`` and its attempt's from that moment), so a short
    job taken ahead costs no statement of its own.

    ``b_ends``: the moment each job's attempt ended (its work done, before the batch
    it waited for; NULL: ``b_now``), its ``finished_at`` and the end of its duration.
    """
    j, a = t.jobs.c, t.attempts.c
    now = now_param()
    ids = type_coerce(pg_array("ids", String), postgresql.ARRAY(Text))
    actuals = pg_array("b_actuals", BigInteger)
    peaks = pg_array("b_peaks", Float)
    starts = pg_timestamps("b_starts")
    ends = pg_timestamps("b_ends")

    def of(values: Any, job_id: Any) -> Any:
        return Grouping(values)[func.array_position(ids, sa_cast(job_id, Text))]

    done = _complete_update(dialect, now, of(actuals, j.job_id), started=of(starts, j.job_id)).cte(
        "done"
    )
    began = func.coalesce(of(starts, a.job_id), a.started_at)
    ended = func.coalesce(of(ends, a.job_id), now)
    elapsed = func.extract("epoch", ended - began) * 1000
    closed = (
        update(t.attempts)
        .where(
            ids_match(a.job_id, dialect),
            a.job_id.in_(select(done.c.job_id)),
            a.status == "running",
        )
        .values(
            status="completed",
            started_at=began,
            finished_at=ended,
            duration_ms=func.greatest(0, sa_cast(func.floor(elapsed), BigInteger)),
            peak_memory_mb=of(peaks, a.job_id),
            error_code=None,
            error_message=None,
        )
        .returning(a.attempt_id)
        .cte("closed")
    )
    ledger = credits.charge(dialect, done.c, now).cte("ledger")
    # Each user's account spends the charges made (a job charged already is not charged
    # again: its entry stands) and releases all its jobs' reservations.
    charges = (
        select(ledger.c.user_id, func.sum(-ledger.c.amount_millicredits).label("charge"))
        .group_by(ledger.c.user_id)
        .subquery("charges")
    )
    held = (
        select(done.c.user_id, func.sum(done.c.reserved_millicredits).label("reserved"))
        .group_by(done.c.user_id)
        .subquery("held")
    )
    totals = (
        select(
            held.c.user_id,
            func.coalesce(charges.c.charge, 0).label("charge"),
            held.c.reserved,
        )
        .select_from(held.outerjoin(charges, charges.c.user_id == held.c.user_id))
        .subquery("totals")
    )
    settle = (
        credits.settle(totals.c.user_id, totals.c.charge, totals.c.reserved, now)
        .returning(t.credit_accounts.c.user_id)
        .cte("settle")
    )
    # The outbox rows of the jobs that named a callback, in this same statement.
    outbox = callbacks.insert_completed(done, now).returning(t.callbacks.c.event_id).cte("outbox")
    charged = ledger.c.job_id.is_not(None).label("charged")
    return (
        select(done, charged)
        .select_from(done.outerjoin(ledger, ledger.c.job_id == done.c.job_id))
        .add_cte(closed, ledger, settle, outbox)
    )


def complete(dialect: str) -> Executable:
    return _complete_update(dialect, now_param(), bindparam("b_actual", type_=BigInteger))


def _complete_update(
    dialect: str, now: Any, actual: Any, *, started: Any = None
) -> ReturningUpdate[Any]:
    """processing -> completed for the batch this worker holds; ``actual`` is the
    actual cost (NULL keeps the estimate), charged at most the job's reservation (what
    its submit held: the charge can never take more than the user had available);
    ``started``, where not NULL, the moment a ``claimed`` job began: START and
    COMPLETE at once."""
    j = t.jobs.c
    cost = func.coalesce(actual, j.estimated_millicredits)
    capped = case((cost > j.reserved_millicredits, j.reserved_millicredits), else_=cost)
    status_ok: Any = guarded(j.status, JobEvent.COMPLETE)
    values: dict[str, Any] = {}
    if started is not None:
        status_ok = or_(
            j.status.in_(guard(JobEvent.COMPLETE)),
            and_(j.status.in_(guard(JobEvent.START)), started.is_not(None)),
        ).is_(true())
        values["started_at"] = func.coalesce(started, j.started_at)
    return (
        update(t.jobs)
        .where(
            ids_match(j.job_id, dialect),
            j.claimed_by == bindparam("b_worker", type_=String),
            status_ok,
        )
        .values(
            **values,
            status=after(JobEvent.COMPLETE).value,
            completed_at=now,
            visibility_timeout=None,
            updated_at=now,
            actual_millicredits=capped,
            error_code=None,
            error_message=None,
        )
        .returning(
            j.job_id,
            j.queue,
            j.operation,
            j.priority,
            j.user_id,
            j.profile_id,
            j.estimated_millicredits,
            j.reserved_millicredits,
            j.actual_millicredits,
            j.callback_url,
        )
    )


def ledger(dialect: str) -> Executable:
    """One charge per completed job, read from the job rows just updated (returning
    those made: a job charged already is not charged again)."""
    j = t.jobs.c
    return credits.charge(dialect, j, now_param(), ids_match(j.job_id, dialect))


def settle(dialect: str) -> Executable:
    """A user's account after a batch: ``b_charge`` spent, ``b_reserved`` (the jobs'
    reservations) released."""
    return credits.settle(
        bindparam("b_user", type_=String),
        bindparam("b_charge", type_=BigInteger),
        bindparam("b_reserved", type_=BigInteger),
        now_param(),
    )


def attempt_units(dialect: str) -> Executable:
    """The units of work a completed attempt's step reported (``b_units``, a dict)."""
    a = t.attempts
    return (
        update(a)
        .where(a.c.job_id == bindparam("b_job", type_=String), a.c.status == "completed")
        .values(units=bindparam("b_units", type_=a.c.units.type))
    )


def close_attempt(dialect: str) -> Executable:
    a = t.attempts
    return (
        update(a)
        .where(a.c.job_id == bindparam("b_job", type_=String), a.c.status == "running")
        .values(
            status=bindparam("b_status", type_=String),
            finished_at=now_param(),
            duration_ms=bindparam("b_duration", type_=BigInteger),
            peak_memory_mb=bindparam("b_peak", type_=Float),
            error_code=None,
            error_message=None,
        )
    )


# -- submit ----------------------------------------------------------------------------

SUBMISSION_COLUMNS = ("submission_id", "idempotency_key", "request_hash", "estimated_millicredits")
JOB_COLUMNS = (
    "job_id",
    "submission_id",
    "object_id",
    "profile_id",
    "operation",
    "queue",
    "priority",
    "params",
    "estimated_millicredits",
    "reserved_millicredits",
    "max_attempts",
    "callback_url",
    "timeout_seconds",
)


def create_pg(dialect: str) -> Executable:
    """PostgreSQL: a submit's whole record as one statement (on an autocommit
    connection its own transaction: no BEGIN and COMMIT round trips). The user's
    credits reserved (``b_user``, ``b_amount``), then from that row the submission rows
    (``b_submissions``: a JSON array of objects with :data:`SUBMISSION_COLUMNS`) and
    the job rows (``b_jobs``, :data:`JOB_COLUMNS`), born queued at ``b_now``. Answers
    one row when the credits were held; no row, and nothing written, when too few
    were available, or when one of the jobs' objects (``b_objects``, ``b_object_count``
    of them) is deleted: they are locked ``FOR SHARE`` first, so a deletion (which
    locks its object ``FOR UPDATE`` before it looks for jobs on it) either waits for
    this statement and then sees its jobs, or is seen here, done. They are locked in
    id order, as a deletion locks an object and then its (younger) outputs: else a
    batch naming both could take the output, then wait for the object the deletion
    holds while it waits for the output (deadlock detected). One statement text for
    any number of rows, so it stays prepared."""
    now = now_param()
    o = t.objects.c
    live = (
        select(o.object_id)
        .where(ids_match(o.object_id, dialect, "b_objects"), o.deleted_at.is_(None))
        .order_by(o.object_id)  # the rows are locked as sorted
        .with_for_update(read=True)
        .cte("live")
    )
    all_live = select(func.count()).select_from(live).scalar_subquery() == bindparam(
        "b_object_count", type_=Integer
    )
    held = (
        credits.reserving(
            bindparam("b_user", type_=String), bindparam("b_amount", type_=BigInteger), now
        )
        .where(all_live)
        .returning(t.credit_accounts.c.user_id)
        .cte("held")
    )
    s = t.submissions.c
    given = _recordset("b_submissions", [s[name] for name in SUBMISSION_COLUMNS])
    submitted = (
        insert(t.submissions)
        .from_select(
            [*SUBMISSION_COLUMNS, "user_id", "created_at"],
            select(*given.c, held.c.user_id, now).select_from(given.join(held, true())),
        )
        .returning(s.submission_id)
        .cte("submitted")
    )
    j = t.jobs.c
    rows = _recordset("b_jobs", [j[name] for name in JOB_COLUMNS])
    born = {
        "status": literal(after(JobEvent.ENQUEUE).value, String),
        "attempt_count": literal(0, j.attempt_count.type),
        "cancel_requested": literal(False, j.cancel_requested.type),
        "created_at": now,
        "queued_at": now,
        "updated_at": now,
    }
    queued = (
        insert(t.jobs)
        .from_select(
            [*JOB_COLUMNS, "user_id", *born],
            select(*rows.c, held.c.user_id, *born.values()).select_from(rows.join(held, true())),
        )
        .returning(j.job_id)
        .cte("queued")
    )
    return select(held.c.user_id).add_cte(submitted, queued)


def _recordset(name: str, columns: list[Any]) -> Any:
    """``json_to_recordset(:name) AS (<columns with their types>)``: rows sent as one
    JSON parameter."""
    return (
        func.json_to_recordset(bindparam(name, type_=JSON))
        .table_valued(*(column(c.name, c.type) for c in columns))
        .render_derived(with_types=True)
    )


def objects_by_key(dialect: str) -> Executable:
    """The objects rows already stored at the keys ``b_keys`` (a batch's outputs)."""
    o = t.objects.c
    return select(o.object_id, o.owner_id, o.size_bytes, o.deleted_at, o.storage_key).where(
        o.storage_key.in_(bindparam("b_keys", expanding=True))
    )


def job_sources(dialect: str) -> Executable:
    """The object each job of ``b_jobs`` reads, with its pool: what a derived object
    of the job's output points back to."""
    return (
        select(t.jobs.c.job_id, t.objects.c.object_id, t.objects.c.pool_id)
        .join(t.objects, t.jobs.c.object_id == t.objects.c.object_id)
        .where(t.jobs.c.job_id.in_(bindparam("b_jobs", expanding=True)))
    )


def resize_object(dialect: str) -> Executable:
    """An object rewritten at the same key (a re-run): its new size and type, and its
    owner (``b_owner``); live again if it had been deleted (its bytes are back)."""
    o = t.objects.c
    return (
        update(t.objects)
        .where(o.object_id == bindparam("b_id"))
        .values(
            owner_id=bindparam("b_owner"),
            size_bytes=bindparam("b_size"),
            content_type=bindparam("b_type"),
            deleted_at=None,
        )
    )


def insert_outputs(dialect: str) -> Executable:
    """Outputs rows, one per (job, output type): a re-run's second row is dropped."""
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    return insert(t.outputs).on_conflict_do_nothing()
