"""The bulk run record (``bulk_runs``): the one door to it.

A run is created by an operator (``hypermedia bulk ...`` on the server, or the
operator-only ``POST /v1/hypermedia/bulk/runs``) and then driven by the head
(:class:`hypermedia.bulk.runner.BulkRunner`). Its states::

    creating ──(objects exhausted)──▶ draining ──(no job of it left live)──▶ completed
       │  ▲                              │
     pause resume                      cancel ──▶ cancelled (its queued jobs cancelled,
       ▼  │                                        running ones asked to stop)
     paused ──cancel──▶ cancelled
    creating ──(an account short of credits, a target unreachable ...)──▶ paused, reason

Every change is a guarded ``UPDATE ... WHERE state IN (...)``, as for jobs.

A cancelled run's jobs that were running go on until their worker sees the request
(seconds, or a lease's length if that worker died): ``stopping`` counts them, and
what an operator reads of the run (``hypermedia bulk status``, the API's run, the
status and the operator page, the metrics) says "cancelled (3 jobs still stopping)"
until none is left, so a cancelled run does not pass for an idle cluster.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from sqlalchemy import ColumnElement, Connection, case, func, insert, literal, select, update

from hypermedia.clock import to_datetime
from hypermedia.db import tables as t
from hypermedia.errors import Conflict, InvalidRequest, NotFound
from hypermedia.ids import new_id
from hypermedia.ingest.fields import Text, WrittenTime
from hypermedia.jobs.states import JobStatus

BULK_PRIORITIES = range(7, 11)  # seed 003: background regeneration gets 7-10
DEFAULT_PRIORITY = 8  # on the bulk queue
OWN_QUEUE_PRIORITY = 10  # on the operation's own queue: after every user's job
BULK_QUEUE = "bulk"
# The platform's own account: jobs of a run that names no account are its (estimated
# at 0 credits; what units a step prices lands in its ledger as the platform's spend,
# at most the bound their reservations record; its account holds nothing).
PLATFORM_USER_ID = "0" * 32
PLATFORM_USER_NAME = "hypermedia-platform"

Kind = Literal["regenerate", "backfill", "migrate"]


class RunState(enum.StrEnum):
    CREATING = "creating"
    PAUSED = "paused"
    DRAINING = "draining"
    COMPLETED = "completed"
    CANCELLED = "cancelled"


ACTIVE = frozenset({RunState.CREATING, RunState.DRAINING})  # the runner drives these
FINISHED = frozenset({RunState.COMPLETED, RunState.CANCELLED})
# Live job statuses: what counts against a run's max_in_flight.
LIVE_JOB_STATUSES = (
    JobStatus.QUEUED.value,
    JobStatus.CLAIMED.value,
    JobStatus.PROCESSING.value,
    JobStatus.RETRY_WAIT.value,
)


class BulkFilter(BaseModel):
    """Which objects a run considers (all given conditions hold)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pool_id: Text | None = Field(default=None, max_length=64)
    owner_id: Text | None = Field(default=None, max_length=32)
    detected_kind: Text | None = Field(
        default=None, max_length=32, description="the kind found in the bytes (image, pdf ...)"
    )
    created_after: Annotated[datetime | None, WrittenTime] = None
    created_before: Annotated[datetime | None, WrittenTime] = None
    # regenerate: every object with an output of the operation, the current version's
    # too (else only those whose newest output is below the current version).
    all_versions: bool = False

    @field_validator("detected_kind")
    @classmethod
    def _a_kind(cls, value: str | None) -> str | None:
        # A kind the inspector never finds matches no object: a typo, not a selection.
        from hypermedia.sandbox.inspect import KINDS

        if value is not None and value not in KINDS:
            raise ValueError(
                f"{value!r} is no kind the inspector finds ({', '.join(sorted(KINDS))})"
            )
        return value

    @field_validator("created_before")
    @classmethod
    def _after_the_start(cls, value: datetime | None, info: ValidationInfo) -> datetime | None:
        start = info.data.get("created_after")
        # Naive times are refused below, naming the field; only aware ones compare.
        if value is None or start is None or value.tzinfo is None or start.tzinfo is None:
            return value
        if value <= start:
            raise ValueError(
                f"the range is empty: created_before ({value.isoformat()}) must be after"
                f" created_after ({start.isoformat()})"
            )
        return value

    @model_validator(mode="after")
    def _aware(self) -> BulkFilter:
        for name in ("created_after", "created_before"):
            value = getattr(self, name)
            if value is None:
                continue
            if value.tzinfo is None:
                raise ValueError(f"{name} needs a time zone (e.g. 2026-01-01T00:00:00Z)")
            try:
                value.astimezone(UTC)  # how the record compares it
            except OverflowError:
                raise ValueError(f"{name} is outside the years 1-9999 in UTC") from None
        return self

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_defaults=True)


class MigrateTarget(BaseModel):
    """Where ``migrate`` copies objects: an S3 bucket (the head's own credentials, from
    its environment; none are stored)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Literal["s3"] = "s3"
    bucket: Text = Field(min_length=3, max_length=63)
    endpoint_url: Text | None = Field(default=None, max_length=512)
    region: Text | None = Field(default=None, max_length=64)
    prefix: Text = Field(default="", max_length=200)

    @property
    def name(self) -> str:
        """What ``objects.storage_backend`` says of an object copied there."""
        return f"s3:{self.bucket}/{self.prefix}".rstrip("/")


MAX_IN_FLIGHT = 1_000_000  # a run's cap on its live jobs, at most


class RunChange(BaseModel):
    """What an operator may change while a run runs (``PATCH`` of the run)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_in_flight: int = Field(
        ge=1, le=MAX_IN_FLIGHT, description="at most this many of its jobs queued or running"
    )


class RunSpec(BaseModel):
    """What an operator asks for."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Kind
    operation: Text | None = Field(default=None, max_length=64)
    filter: BulkFilter = Field(default_factory=BulkFilter)
    target: MigrateTarget | None = None
    priority: int | None = Field(
        default=None,
        ge=min(BULK_PRIORITIES),
        le=max(BULK_PRIORITIES),
        description=f"{min(BULK_PRIORITIES)}-{max(BULK_PRIORITIES)}; default:"
        f" {DEFAULT_PRIORITY} on the bulk queue, {OWN_QUEUE_PRIORITY} on the operation's own",
    )
    queue: Text | None = Field(
        default=None,
        description="bulk, or the operation's own queue; default: bulk when a worker serves"
        " it here, else the operation's own queue (a queue no worker serves is refused)",
    )
    max_in_flight: int = Field(default=200, ge=1, le=MAX_IN_FLIGHT)
    batch_size: int = Field(default=500, ge=1, le=10_000)
    account: Text | None = Field(
        default=None, max_length=200, description="a user name (or id) to charge; none: platform"
    )

    @model_validator(mode="after")
    def _shape(self) -> RunSpec:
        if self.kind == "migrate":
            if self.target is None:
                raise ValueError("migrate needs a target")
            if self.operation is not None:
                raise ValueError("migrate copies objects; it takes no operation")
        else:
            if self.operation is None:
                raise ValueError(f"{self.kind} needs an operation")
            if self.target is not None:
                raise ValueError(f"{self.kind} takes no target")
        return self


# The jobs that ended in this window (at most: since the run was created) give a run's
# rate, and from it its ETA.
RATE_WINDOW_SECONDS = 600.0


@dataclass(frozen=True, slots=True)
class Progress:
    """How far a run is, in objects of its selection (what ``status`` and the API show).

    ``total``: the objects its filter selected at create, or, once nothing is left to
    scan (draining, completed), those it scanned (objects stored since are dealt with
    too, objects deleted since are not); None while it scans for a run from before
    totals or whose selection was too big to count at create (:data:`COUNT_SECONDS`).
    ``done``: skipped (done already), unfit and completed (migrated); ``failed``: jobs
    failed or cancelled (copies failed); ``in_flight``: jobs queued or running;
    ``remaining``: the rest, in flight and not scanned yet. ``jobs_per_second``: its
    jobs ended over the last :data:`RATE_WINDOW_SECONDS`; ``eta_seconds``: the jobs
    left (in flight, and those the objects not scanned yet would make at the share of
    jobs so far) at that rate, while it runs."""

    total: int | None
    done: int
    failed: int
    in_flight: int
    remaining: int | None
    percent: float | None
    jobs_per_second: float | None
    eta_seconds: float | None


def progress(
    *,
    kind: str,
    state: str,
    total: int | None,
    scanned: int,
    created_jobs: int,
    skipped: int,
    unfit: int,
    migrated: int,
    failed: int,
    jobs: dict[str, int],
    ended_recently: int = 0,
    window_seconds: float = 0.0,
) -> Progress:
    """A run's :class:`Progress` from its counts and its jobs by status (pure)."""
    if kind == "migrate":
        done, lost, in_flight = migrated, failed, 0
    else:
        done = skipped + unfit + jobs.get(JobStatus.COMPLETED.value, 0)
        lost = jobs.get(JobStatus.FAILED.value, 0) + jobs.get(JobStatus.CANCELLED.value, 0)
        in_flight = sum(jobs.get(status, 0) for status in LIVE_JOB_STATUSES)
    if state in (RunState.DRAINING, RunState.COMPLETED):
        whole: int | None = scanned  # nothing is left to scan
    else:
        whole = None if total is None else max(total, scanned)
    if whole is None:
        return Progress(None, done, lost, in_flight, None, None, None, None)
    remaining = max(0, whole - done - lost)
    if whole:
        percent = round(100.0 * min(whole, done + lost) / whole, 1)
    else:
        percent = 100.0 if state in (RunState.DRAINING, RunState.COMPLETED) else 0.0
    rate = None
    if kind != "migrate" and ended_recently and window_seconds > 0:
        rate = ended_recently / window_seconds
    eta = None
    if rate is not None and state in ACTIVE:
        unscanned = max(0, whole - scanned)
        share = created_jobs / scanned if scanned else 1.0
        eta = round((in_flight + unscanned * share) / rate, 1)
    return Progress(
        whole,
        done,
        lost,
        in_flight,
        remaining,
        percent,
        None if rate is None else round(rate, 3),
        eta,
    )


@dataclass(frozen=True, slots=True)
class RunView:
    run_id: str
    kind: str
    operation: str | None
    target_version: int | None
    filter: dict[str, Any]
    target: dict[str, Any] | None
    queue: str | None
    priority: int
    max_in_flight: int
    batch_size: int
    account_user_id: str | None
    state: str
    cursor: str | None
    scanned: int
    created_jobs: int
    skipped: int
    unfit: int
    migrated: int
    failed: int
    reason: str | None
    created_by: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    # the objects its filter selected at create (None: from before 0027, or too many to
    # count at create: COUNT_SECONDS)
    total: int | None
    jobs: dict[str, int]  # the run's jobs by status (the record's, now)
    progress: Progress

    @property
    def live(self) -> int:
        return sum(self.jobs.get(status, 0) for status in LIVE_JOB_STATUSES)

    @property
    def stopping(self) -> int:
        """The jobs of a cancelled run not ended yet (asked to stop); 0 otherwise."""
        return self.live if self.state == RunState.CANCELLED else 0

    @property
    def shown_state(self) -> str:
        return shown_state(self.state, self.stopping)

    def counts(self) -> dict[str, int]:
        """What metrics and the operator page show of its progress."""
        return {
            "scanned": self.scanned,
            "created": self.created_jobs,
            "skipped": self.skipped,
            "unfit": self.unfit,
            "migrated": self.migrated,
            "failed": self.failed,
            "live": self.live,
            "stopping": self.stopping,
        }

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if isinstance(value, Progress):
                value = asdict(value)
            out[name] = value.isoformat() if isinstance(value, datetime) else value
        out["stopping"] = self.stopping
        return out


def shown_state(state: str, stopping: int) -> str:
    """A run's state as an operator reads it: "cancelled (3 jobs still stopping)"."""
    if not stopping:
        return state
    return f"{state} ({stopping} job{'' if stopping == 1 else 's'} still stopping)"


def ensure_platform_user(conn: Connection, now: float) -> str:
    """The platform's user row (made once; no credit account: nothing is reserved)."""
    found = conn.execute(
        select(t.users.c.user_id).where(t.users.c.user_id == PLATFORM_USER_ID)
    ).scalar_one_or_none()
    if found is None:
        conn.execute(
            insert(t.users).values(
                user_id=PLATFORM_USER_ID,
                name=PLATFORM_USER_NAME,
                is_operator=False,
                created_at=to_datetime(now),
            )
        )
    return PLATFORM_USER_ID


def check_filter(conn: Connection, flt: BulkFilter) -> None:
    """NotFound naming the field when the filter names a pool or an owner that does not
    exist (it would match nothing: a typo passing for a selection with nothing to do)."""
    if flt.pool_id is not None:
        found = conn.execute(
            select(t.pools.c.pool_id).where(t.pools.c.pool_id == flt.pool_id)
        ).scalar_one_or_none()
        if found is None:
            raise NotFound(f"filter.pool_id: no pool {flt.pool_id!r}", pool_id=flt.pool_id)
    if flt.owner_id is not None:
        found = conn.execute(
            select(t.users.c.user_id).where(t.users.c.user_id == flt.owner_id)
        ).scalar_one_or_none()
        if found is None:
            raise NotFound(f"filter.owner_id: no user {flt.owner_id!r}", owner_id=flt.owner_id)


def find_account(conn: Connection, account: str) -> str:
    row = conn.execute(
        select(t.users.c.user_id).where(
            (t.users.c.name == account) | (t.users.c.user_id == account)
        )
    ).scalar_one_or_none()
    if row is None:
        raise NotFound(f"no user {account!r} to charge", account=account)
    return str(row)


def migrate_target(conn: Connection, name: str) -> MigrateTarget | None:
    """The target of the latest migrate run whose copies are recorded as ``name``
    (``objects.storage_backend``): where to reach them (its endpoint and region)."""
    r = t.bulk_runs.c
    rows = conn.execute(
        select(r.target)
        .where(r.kind == "migrate", r.target.is_not(None))
        .order_by(r.created_at.desc(), r.run_id.desc())
    ).scalars()
    for target in rows:
        spec = MigrateTarget.model_validate(target)
        if spec.name == name:
            return spec
    return None


def insert_run(
    conn: Connection,
    spec: RunSpec,
    *,
    profile_id: int | None,
    target_version: int | None,
    queue: str | None,
    priority: int,
    account_user_id: str | None,
    created_by: str,
    now: float,
    idempotency_key: str | None = None,
    request_hash: str | None = None,
) -> str:
    """A new run's row; ``idempotency_key`` one ``created_by`` already used is an
    IntegrityError (``uk_bulk_run_idempotency_key``)."""
    run_id = new_id()
    moment = to_datetime(now)
    conn.execute(
        insert(t.bulk_runs).values(
            run_id=run_id,
            kind=spec.kind,
            operation=spec.operation,
            profile_id=profile_id,
            target_version=target_version,
            filter=spec.filter.to_json(),
            target=None if spec.target is None else spec.target.model_dump(mode="json"),
            queue=queue,
            priority=priority,
            max_in_flight=spec.max_in_flight,
            batch_size=spec.batch_size,
            account_user_id=account_user_id,
            state=RunState.CREATING.value,
            cursor=None,
            scanned=0,
            created_jobs=0,
            skipped=0,
            unfit=0,
            migrated=0,
            failed=0,
            created_by=created_by,
            created_at=moment,
            updated_at=moment,
            idempotency_key=idempotency_key,
            request_hash=request_hash,
        )
    )
    return run_id


# How long a run's create counts its selection at most (PostgreSQL; the engine's own
# statement limit when that is less). Measured on PostgreSQL 15 (2 cores, 3M objects
# with a job and an output each): a backfill's COUNT 3-8M objects a second, a
# regenerate's (an EXISTS over the outputs joined to the jobs, hash joins spilling to
# disk) 0.7-1.2M: under the engine's 30 s the create of a regenerate over some 25M
# objects answered 503 database_unavailable, as every create asked again. A selection
# not counted in time leaves the run without a total until its scan ends (as one from
# before 0027), the create answered at once. On SQLite too: its count ran inside the
# create's write transaction for as long as it took, every other writer of the record
# (submits, claims, completions) waiting on it and failing SQLITE_BUSY past 30 s; it is
# interrupted at COUNT_SECONDS (SQLite's progress handler, looked at every
# _SQLITE_PROGRESS_STEPS virtual-machine steps).
COUNT_SECONDS = 5.0
_QUERY_CANCELED = "57014"
_SQLITE_PROGRESS_STEPS = 10_000


def count_total(conn: Connection, run_id: str, seconds: float | None = None) -> int | None:
    """Count the objects the new run's filter selects (one count over the filter: README's
    Bulk runs) and keep it as its ``total``; on PostgreSQL within ``seconds``
    (:data:`COUNT_SECONDS`; the engine's statement limit when less), else None: no total
    until its scan ends."""
    from hypermedia.bulk.select import selection

    row = conn.execute(select(t.bulk_runs).where(t.bulk_runs.c.run_id == run_id)).one()
    target = None if row.target is None else MigrateTarget.model_validate(row.target).name
    counting = selection(row, target)
    seconds = COUNT_SECONDS if seconds is None else seconds
    if conn.dialect.name == "postgresql":
        total = _count_within(conn, counting, seconds)
    else:
        total = _sqlite_count_within(conn, counting, seconds)
    if total is not None:
        conn.execute(update(t.bulk_runs).where(t.bulk_runs.c.run_id == run_id).values(total=total))
    return total


def _count_within(conn: Connection, counting: Any, seconds: float) -> int | None:
    """``counting`` run in a savepoint under a statement limit of ``seconds`` (or the
    session's, when less): its count, or None once cancelled at that limit (the
    savepoint rolled back, the limit with it; the transaction goes on). The limit is 1 ms
    at least: PostgreSQL reads a statement_timeout of 0 as none (as
    :func:`hypermedia.db.engine.statement_limits` does)."""
    from sqlalchemy.exc import OperationalError

    session_ms = _session_statement_ms(conn)
    bound = max(1, round(seconds * 1000))
    if session_ms:
        bound = min(bound, session_ms)
    try:
        with conn.begin_nested():
            conn.execute(select(func.set_config("statement_timeout", str(bound), True)))
            counted = int(conn.execute(counting).scalar_one())
            conn.execute(select(func.set_config("statement_timeout", str(session_ms), True)))
    except OperationalError as exc:
        if getattr(exc.orig, "sqlstate", None) != _QUERY_CANCELED:
            raise
        return None
    return counted


def _sqlite_count_within(conn: Connection, counting: Any, seconds: float) -> int | None:
    """``counting`` run in a savepoint on SQLite, interrupted once ``seconds`` have
    passed: its count, or None (the savepoint rolled back; the transaction goes on)."""
    import sqlite3
    import time

    from sqlalchemy.exc import OperationalError

    raw = conn.connection.driver_connection
    assert isinstance(raw, sqlite3.Connection), raw
    deadline = time.monotonic() + seconds
    raw.set_progress_handler(lambda: time.monotonic() >= deadline, _SQLITE_PROGRESS_STEPS)
    try:
        with conn.begin_nested():
            return int(conn.execute(counting).scalar_one())
    except OperationalError as exc:
        if getattr(exc.orig, "sqlite_errorcode", None) != sqlite3.SQLITE_INTERRUPT:
            raise
        return None
    finally:
        raw.set_progress_handler(None, 0)


def _session_statement_ms(conn: Connection) -> int:
    """The session's statement_timeout in milliseconds (0: none)."""
    return int(
        conn.exec_driver_sql(
            "SELECT setting FROM pg_settings WHERE name = 'statement_timeout'"
        ).scalar_one()
    )


def created_under(conn: Connection, created_by: str, idempotency_key: str) -> Any:
    """The run ``created_by`` created under ``idempotency_key`` (its id and request
    hash), or None: one at most (``uk_bulk_run_idempotency_key``; a creator is never
    NULL, which would collide with none)."""
    r = t.bulk_runs.c
    return conn.execute(
        select(r.run_id, r.request_hash).where(
            r.created_by == created_by, r.idempotency_key == idempotency_key
        )
    ).one_or_none()


def move(
    conn: Connection,
    run_id: str,
    sources: frozenset[RunState] | set[RunState],
    to: RunState,
    now: float,
    reason: str | None = None,
) -> bool:
    """Guarded state change: whether the run was in one of ``sources``."""
    values: dict[str, Any] = {"state": to.value, "updated_at": to_datetime(now)}
    if reason is not None or to is RunState.CREATING:
        values["reason"] = reason
    if to in FINISHED:
        values["finished_at"] = to_datetime(now)
    result = conn.execute(
        update(t.bulk_runs)
        .where(t.bulk_runs.c.run_id == run_id, t.bulk_runs.c.state.in_([s.value for s in sources]))
        .values(**values)
    )
    return result.rowcount == 1


def change_state(conn: Connection, run_id: str, action: str, now: float) -> RunState:
    """An operator's ``pause`` / ``resume`` / ``cancel``: the new state, or Conflict
    naming the state the run is in."""
    rules: dict[str, tuple[frozenset[RunState], RunState]] = {
        "pause": (frozenset({RunState.CREATING}), RunState.PAUSED),
        "resume": (frozenset({RunState.PAUSED}), RunState.CREATING),
        "cancel": (
            frozenset({RunState.CREATING, RunState.PAUSED, RunState.DRAINING}),
            RunState.CANCELLED,
        ),
    }
    if action not in rules:
        raise InvalidRequest(f"unknown action {action!r}", action=action)
    sources, to = rules[action]
    if move(conn, run_id, sources, to, now):
        return to
    state = conn.execute(
        select(t.bulk_runs.c.state).where(t.bulk_runs.c.run_id == run_id)
    ).scalar_one_or_none()
    if state is None:
        raise NotFound(f"no bulk run {run_id!r}", run_id=run_id)
    raise Conflict(f"cannot {action} a run that is {state}", run_id=run_id, state=state)


def set_max_in_flight(conn: Connection, run_id: str, max_in_flight: int, now: float) -> None:
    """An operator's new cap on the run's live jobs (taken at the runner's next step;
    a lower one lets the jobs live finish and creates none until fewer are live), or
    NotFound, or Conflict naming the state of a run that has finished."""
    r = t.bulk_runs.c
    result = conn.execute(
        update(t.bulk_runs)
        .where(r.run_id == run_id, r.state.not_in([s.value for s in FINISHED]))
        .values(max_in_flight=max_in_flight, updated_at=to_datetime(now))
    )
    if result.rowcount == 1:
        return
    state = conn.execute(select(r.state).where(r.run_id == run_id)).scalar_one_or_none()
    if state is None:
        raise NotFound(f"no bulk run {run_id!r}", run_id=run_id)
    raise Conflict(f"cannot change a run that is {state}", run_id=run_id, state=state)


def read(conn: Connection, run_id: str) -> Any:
    """The run's row as it stands (None: no such run), locking nothing."""
    return conn.execute(select(t.bulk_runs).where(t.bulk_runs.c.run_id == run_id)).one_or_none()


def lock(conn: Connection, run_id: str) -> Any:
    """The run's row, locked for this transaction on PostgreSQL (one head advances a run
    at a time; SQLite serialises writers anyway)."""
    stmt = select(t.bulk_runs).where(t.bulk_runs.c.run_id == run_id)
    if conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update(skip_locked=True)
    return conn.execute(stmt).one_or_none()


def advance(conn: Connection, run_id: str, cursor: str | None, now: float, **added: int) -> None:
    """Move the cursor and add to the counts (in the batch's own transaction)."""
    r = t.bulk_runs.c
    values: dict[str, Any] = {name: r[name] + amount for name, amount in added.items() if amount}
    if cursor is not None:
        values["cursor"] = cursor
    values["updated_at"] = to_datetime(now)
    conn.execute(update(t.bulk_runs).where(r.run_id == run_id).values(**values))


def live_jobs(conn: Connection, run_id: str, limit: int | None = None) -> int:
    """The run's jobs queued, running or waiting for a retry; counted up to ``limit``
    at most (a cap check reads no more rows than the cap, however many are live)."""
    j = t.jobs.c
    live = select(j.job_id).where(j.bulk_run_id == run_id, j.status.in_(LIVE_JOB_STATUSES))
    if limit is not None:
        live = live.limit(limit)
    return int(conn.execute(select(func.count()).select_from(live.subquery())).scalar_one())


def job_counts(conn: Connection, run_id: str) -> dict[str, int]:
    return _job_counts(conn, [run_id], None).get(run_id, ({}, 0))[0]


def _job_counts(
    conn: Connection, run_ids: list[str], now: float | None
) -> dict[str, tuple[dict[str, int], int]]:
    """Each run's jobs by status, and how many of them completed or failed in its rate
    window (the last :data:`RATE_WINDOW_SECONDS`, at most since the run was created; 0
    without ``now``): one query, one pass over the runs' jobs, however many runs."""
    if not run_ids:
        return {}
    j, r = t.jobs.c, t.bulk_runs.c
    stmt = select(j.bulk_run_id, j.status, func.count())
    if now is None:
        stmt = stmt.add_columns(literal(0))
    else:
        recent = (j.completed_at >= to_datetime(now - RATE_WINDOW_SECONDS)) & (
            j.completed_at >= r.created_at
        )
        stmt = stmt.add_columns(func.sum(case((recent, 1), else_=0))).join(
            t.bulk_runs, r.run_id == j.bulk_run_id
        )
    rows = conn.execute(
        stmt.where(j.bulk_run_id.in_(run_ids)).group_by(j.bulk_run_id, j.status)
    ).all()
    rate_statuses = (JobStatus.COMPLETED.value, JobStatus.FAILED.value)
    out: dict[str, tuple[dict[str, int], int]] = {}
    for run_id, status, count, ended in rows:
        jobs, recent_count = out.get(run_id, ({}, 0))
        jobs[status] = int(count)
        if status in rate_statuses:
            recent_count += int(ended or 0)
        out[run_id] = (jobs, recent_count)
    return out


def view(conn: Connection, run_id: str, now: float | None = None) -> RunView:
    """The run as an operator reads it; ``now``: the moment its rate is measured to
    (None: no rate, no ETA)."""
    row = conn.execute(select(t.bulk_runs).where(t.bulk_runs.c.run_id == run_id)).one_or_none()
    if row is None:
        raise NotFound(f"no bulk run {run_id!r}", run_id=run_id)
    return _views(conn, [row], now)[0]


def _views(conn: Connection, rows: Sequence[Any], now: float | None = None) -> list[RunView]:
    """The runs of ``rows`` (``bulk_runs`` rows) as an operator reads them, their jobs
    counted in one query for all (:func:`_job_counts`)."""
    counted = _job_counts(conn, [row.run_id for row in rows], now)
    fields = [f for f in RunView.__dataclass_fields__ if f not in ("jobs", "progress")]
    views = []
    for row in rows:
        m = row._mapping
        window = 0.0
        if now is not None:
            created = m["created_at"]
            created = created if created.tzinfo else created.replace(tzinfo=UTC)
            window = max(0.0, min(RATE_WINDOW_SECONDS, now - created.timestamp()))
        jobs, recent = counted.get(row.run_id, ({}, 0))
        shown = progress(
            kind=m["kind"],
            state=m["state"],
            total=m["total"],
            scanned=m["scanned"],
            created_jobs=m["created_jobs"],
            skipped=m["skipped"],
            unfit=m["unfit"],
            migrated=m["migrated"],
            failed=m["failed"],
            jobs=jobs,
            ended_recently=recent if window > 0 else 0,
            window_seconds=window,
        )
        views.append(RunView(**{f: m[f] for f in fields}, jobs=jobs, progress=shown))
    return views


MAX_PAGE = 200  # runs a page holds at most (as the jobs list's)


@dataclass(frozen=True, slots=True)
class RunPage:
    runs: list[RunView]
    next_cursor: str | None  # None: this was the last page


def list_runs(
    conn: Connection, limit: int = 50, cursor: str | None = None, now: float | None = None
) -> RunPage:
    """A page of runs, newest first, as the jobs list pages: run ids are time-ordered,
    so a page is ``run_id < <cursor> ORDER BY run_id DESC LIMIT n`` on the primary key,
    and a run created while an operator pages never shifts what is left to read. The
    cursor is the last run id of the page before (opaque to clients)."""
    limit = max(1, min(limit, MAX_PAGE))
    r = t.bulk_runs.c
    stmt = select(t.bulk_runs)
    if cursor is not None:
        stmt = stmt.where(r.run_id < cursor)
    rows = conn.execute(stmt.order_by(r.run_id.desc()).limit(limit + 1)).all()
    more = len(rows) > limit
    rows = rows[:limit]
    return RunPage(_views(conn, rows, now), rows[-1].run_id if more else None)


def active_ids(conn: Connection) -> list[str]:
    return list(
        conn.execute(
            select(t.bulk_runs.c.run_id)
            .where(t.bulk_runs.c.state.in_([s.value for s in ACTIVE]))
            .order_by(t.bulk_runs.c.run_id)
        ).scalars()
    )


def unfinished(conn: Connection, now: float | None = None) -> list[RunView]:
    """Runs not completed nor cancelled, and cancelled runs whose jobs are still
    stopping, oldest first (two queries, however many: the runs, then their jobs)."""
    r = t.bulk_runs.c
    rows = conn.execute(
        select(t.bulk_runs)
        .where(r.state.not_in([s.value for s in FINISHED]) | (_stopping()))
        .order_by(r.run_id)
    ).all()
    return _views(conn, rows, now)


def recently_finished(conn: Connection, now: float, limit: int, within: float) -> list[RunView]:
    """The last ``limit`` runs that finished (completed, or cancelled with none of their
    jobs still stopping) in the ``within`` seconds before ``now``, the latest first."""
    r = t.bulk_runs.c
    rows = conn.execute(
        select(t.bulk_runs)
        .where(
            r.state.in_([s.value for s in FINISHED]),
            r.finished_at >= to_datetime(now - within),
            ~_stopping(),
        )
        .order_by(r.finished_at.desc(), r.run_id.desc())
        .limit(limit)
    ).all()
    return _views(conn, rows, now)


def _stopping() -> ColumnElement[bool]:
    """A cancelled run with jobs still live (asked to stop, not ended yet)."""
    r, j = t.bulk_runs.c, t.jobs.c
    live = select(j.job_id).where(j.bulk_run_id == r.run_id, j.status.in_(LIVE_JOB_STATUSES))
    return (r.state == RunState.CANCELLED.value) & live.exists()
