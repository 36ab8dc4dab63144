"""Tables of the job record. One schema for PostgreSQL and SQLite.

Conventions: ids are 32-hex time-ordered strings (:mod:`hypermedia.ids`); times
are UTC (stored naive, returned aware); credits are integer millicredits; status
columns hold :class:`~hypermedia.jobs.states.JobStatus` values. The schema is
created only by the Alembic migrations in ``migrations/versions``; these classes
describe it for queries, and a test checks the two agree.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from hypermedia.sandbox.limits import DEFAULT_MAX_OUTPUT_BYTES, DEFAULT_MAX_PROCESSES

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in, aware UTC datetimes out, on every database."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


ID = String(32)


def _where(predicate: str) -> dict[str, Any]:
    """A partial index's predicate, on both databases."""
    return {"postgresql_where": text(predicate), "sqlite_where": text(predicate)}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSON()}


class User(Base):
    __tablename__ = "users"

    user_id: Mapped[str] = mapped_column(ID, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    is_operator: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime]
    # Bytes of the live objects the user owns (uploads and their jobs' outputs), kept
    # with every insert, resize and deletion of one (hypermedia.accounts.add_stored_bytes):
    # the storage quota reads one row instead of summing the user's objects.
    stored_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))


class Pool(Base):
    """A storage pool: objects live in one; its members may use them."""

    __tablename__ = "pools"

    pool_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime]


class PoolMember(Base):
    __tablename__ = "pool_members"

    pool_id: Mapped[str] = mapped_column(ForeignKey("pools.pool_id"), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.user_id"), primary_key=True)
    role: Mapped[str] = mapped_column(String(16), default="member")


class StoredObject(Base):
    """A file in storage: an upload (``kind='original'``) or a derived output."""

    __tablename__ = "objects"
    # An upload's Idempotency-Key: one object per user and key (NULLs never collide).
    __table_args__ = (
        Index("uk_object_idempotency_key", "owner_id", "idempotency_key", unique=True),
    )

    object_id: Mapped[str] = mapped_column(ID, primary_key=True)
    pool_id: Mapped[str] = mapped_column(ForeignKey("pools.pool_id"), index=True)
    owner_id: Mapped[str] = mapped_column(ForeignKey("users.user_id"), index=True)
    kind: Mapped[str] = mapped_column(String(16), default="original")
    # Indexed: a deletion walks everything derived from an object by it.
    source_object_id: Mapped[str | None] = mapped_column(
        ForeignKey("objects.object_id"), index=True
    )
    storage_key: Mapped[str] = mapped_column(String(512), unique=True)
    filename: Mapped[str] = mapped_column(String(255))
    # Detected from the bytes at upload/registration (never the client's claim); for
    # derived outputs, what the pipeline wrote.
    content_type: Mapped[str | None] = mapped_column(String(127))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime]
    # hypermedia.sandbox.inspect.Inspection.to_dict() of the stored bytes: kind, mime and
    # the facts the submit-time checks judge. NULL for outputs and pre-0002 objects.
    inspection: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Set by DELETE /objects/{id}: the blobs are gone; the row stays for its jobs' history.
    deleted_at: Mapped[datetime | None]
    # Where a bulk migration put the object's verified copy (the run's target backend,
    # :mod:`hypermedia.bulk.migrate`); NULL: the server's configured storage.
    storage_backend: Mapped[str | None] = mapped_column(String(64))
    # The Idempotency-Key of the upload that made it (PUT /objects): a retry with the
    # same key answers with this object instead of storing a second one.
    idempotency_key: Mapped[str | None] = mapped_column(String(200))


class ApiKey(Base):
    """API keys are shown once; only their SHA-256 is stored."""

    __tablename__ = "api_keys"

    key_id: Mapped[str] = mapped_column(String(16), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.user_id"), index=True)
    key_hash: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None]
    # What the operator granted this key (hypermedia user add/key/grant); NULL: the
    # settings' key_priority_min / key_priority_max / key_submits_per_minute.
    priority_min: Mapped[int | None] = mapped_column(Integer)
    priority_max: Mapped[int | None] = mapped_column(Integer)
    submits_per_minute: Mapped[int | None] = mapped_column(Integer)


class CreditAccount(Base):
    """``balance`` is what the user has; ``reserved`` is held by unfinished jobs."""

    __tablename__ = "credit_accounts"

    user_id: Mapped[str] = mapped_column(ForeignKey("users.user_id"), primary_key=True)
    balance_millicredits: Mapped[int] = mapped_column(BigInteger, default=0)
    reserved_millicredits: Mapped[int] = mapped_column(BigInteger, default=0)
    updated_at: Mapped[datetime]


class CreditLedger(Base):
    __tablename__ = "credit_ledger"
    __table_args__ = (
        # One charge per job (0030): a completion that finds its job charged already
        # charges nothing more (hypermedia.jobs.credits.charge).
        Index("uk_credit_ledger_job_charge", "job_id", unique=True, **_where("kind = 'charge'")),
    )

    entry_id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    user_id: Mapped[str] = mapped_column(ForeignKey("users.user_id"), index=True)
    job_id: Mapped[str | None] = mapped_column(ForeignKey("processing_jobs.job_id"), index=True)
    kind: Mapped[str] = mapped_column(String(16))  # grant | charge | adjust
    amount_millicredits: Mapped[int] = mapped_column(BigInteger)
    note: Mapped[str] = mapped_column(String(255), default="")
    created_at: Mapped[datetime]


class ProcessingProfile(Base):
    __tablename__ = "processing_profiles"
    __table_args__ = (
        UniqueConstraint("operation", "version", name="uk_profile_operation_version"),
    )

    profile_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    operation: Mapped[str] = mapped_column(String(64))
    version: Mapped[int] = mapped_column(Integer)
    queue: Mapped[str] = mapped_column(String(32))
    base_cost_millicredits: Mapped[int] = mapped_column(BigInteger)
    cost_per_mb_millicredits: Mapped[int] = mapped_column(BigInteger)
    timeout_seconds: Mapped[int] = mapped_column(Integer)
    memory_limit_mb: Mapped[int] = mapped_column(Integer)
    max_processes: Mapped[int] = mapped_column(
        Integer, default=DEFAULT_MAX_PROCESSES, server_default=text(str(DEFAULT_MAX_PROCESSES))
    )
    max_output_bytes: Mapped[int] = mapped_column(
        BigInteger,
        default=DEFAULT_MAX_OUTPUT_BYTES,
        server_default=text(str(DEFAULT_MAX_OUTPUT_BYTES)),
    )
    max_input_bytes: Mapped[int] = mapped_column(BigInteger)
    max_attempts: Mapped[int] = mapped_column(Integer)
    default_priority: Mapped[int] = mapped_column(Integer)
    params: Mapped[dict[str, Any]]
    # Kinds / mime types the operation accepts, and its InputLimits (see profiles.py).
    accepts: Mapped[list[str]] = mapped_column(
        JSON, default=lambda: ["any"], server_default=text("'[\"any\"]'")
    )
    input_limits: Mapped[dict[str, Any]] = mapped_column(
        JSON, default=dict, server_default=text("'{}'")
    )
    # Millicredits per unit of work a job's step reports (profiles.py's unit_costs).
    unit_costs_millicredits: Mapped[dict[str, int]] = mapped_column(
        JSON, default=dict, server_default=text("'{}'")
    )
    # A job's time grows with its pages up to a cap (profiles.py); NULL: it does not.
    timeout_seconds_per_page: Mapped[float | None] = mapped_column(Float)
    max_timeout_seconds: Mapped[int | None] = mapped_column(Integer)
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class Submission(Base):
    """One accepted submit request; its idempotency key makes retries safe."""

    __tablename__ = "submissions"
    __table_args__ = (UniqueConstraint("user_id", "idempotency_key", name="uk_submission_key"),)

    submission_id: Mapped[str] = mapped_column(ID, primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.user_id"))
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    request_hash: Mapped[str] = mapped_column(String(64))
    estimated_millicredits: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime]


class ProcessingJob(Base):
    __tablename__ = "processing_jobs"
    __table_args__ = (
        Index("ix_jobs_status_queue", "status", "queue"),
        Index("ix_jobs_status_run_after", "status", "run_after"),
        Index("ix_jobs_status_visibility", "status", "visibility_timeout"),
        # A user's jobs a page at a time, newest first (GET /jobs: keyset pages).
        Index("ix_jobs_user_job", "user_id", "job_id"),
        # A bulk run makes at most one job per object (a resumed run creates none twice)
        # and counts its jobs in flight by status (its cap). Partial, like completed_at's:
        # a claim or a completion rewrites the row (status is indexed, so never a HOT
        # update) and a new row version gets an entry in every index whose predicate
        # it meets; a job outside bulk runs, or not yet ended, needs none in these.
        Index(
            "uk_jobs_bulk_run_object",
            "bulk_run_id",
            "object_id",
            unique=True,
            **_where("bulk_run_id IS NOT NULL"),
        ),
        Index(
            "ix_jobs_bulk_run_status", "bulk_run_id", "status", **_where("bulk_run_id IS NOT NULL")
        ),
        # The out-rate (status view, scheduler): ended jobs only.
        Index(
            "ix_processing_jobs_completed_at", "completed_at", **_where("completed_at IS NOT NULL")
        ),
    )

    job_id: Mapped[str] = mapped_column(ID, primary_key=True)
    submission_id: Mapped[str] = mapped_column(ForeignKey("submissions.submission_id"), index=True)
    # (user_id, job_id) is indexed above: no index of user_id alone.
    user_id: Mapped[str] = mapped_column(ForeignKey("users.user_id"))
    object_id: Mapped[str] = mapped_column(ForeignKey("objects.object_id"), index=True)
    profile_id: Mapped[int] = mapped_column(ForeignKey("processing_profiles.profile_id"))
    operation: Mapped[str] = mapped_column(String(64))
    queue: Mapped[str] = mapped_column(String(32))
    priority: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))
    params: Mapped[dict[str, Any]]
    estimated_millicredits: Mapped[int] = mapped_column(BigInteger)
    # What the submit held on the user's credits: the estimate plus the most the units
    # of work its step may report can cost (unit_costs); every release gives back this,
    # and the completion charges at most this.
    reserved_millicredits: Mapped[int] = mapped_column(BigInteger)
    # The job's time limit, worked out at submit (its pages' time: profiles.py); the
    # worker's CPU and wall-clock limits and lease follow it. NULL (jobs from before
    # it): the profile's timeout_seconds.
    timeout_seconds: Mapped[int | None] = mapped_column(Integer)
    actual_millicredits: Mapped[int | None] = mapped_column(BigInteger)
    attempt_count: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer)
    claimed_by: Mapped[str | None] = mapped_column(String(64))
    claimed_at: Mapped[datetime | None]
    visibility_timeout: Mapped[datetime | None]
    run_after: Mapped[datetime | None]
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    error_code: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(index=True)  # the in-rate (status)
    queued_at: Mapped[datetime | None]
    started_at: Mapped[datetime | None]
    completed_at: Mapped[datetime | None]  # the out-rate: indexed above, ended jobs only
    updated_at: Mapped[datetime]
    # Where the head POSTs the job once it is completed, failed or cancelled (a host of
    # the settings' callback_hosts; see job_callbacks).
    callback_url: Mapped[str | None] = mapped_column(String(2048))
    # The bulk run that made it (regenerate / backfill), else NULL.
    bulk_run_id: Mapped[str | None] = mapped_column(ForeignKey("bulk_runs.run_id"))


class JobAttempt(Base):
    __tablename__ = "job_attempts"
    __table_args__ = (UniqueConstraint("job_id", "attempt_number", name="uk_attempt_number"),)

    attempt_id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    job_id: Mapped[str] = mapped_column(ForeignKey("processing_jobs.job_id"))
    attempt_number: Mapped[int] = mapped_column(Integer)
    worker_id: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))  # running | completed | failed | released
    error_code: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
    duration_ms: Mapped[int | None] = mapped_column(BigInteger)
    peak_memory_mb: Mapped[float | None] = mapped_column(Float)
    # A failed attempt's child: the end of its stdout and stderr (at most 64 KB).
    log_tail: Mapped[str | None] = mapped_column(Text)
    # The work the step reported, as the profile's unit_costs count it (ocr: page,
    # ocr_page, engine_pass, escalation); null for steps that report none.
    units: Mapped[dict[str, int] | None] = mapped_column(JSON)


class JobCallback(Base):
    """A job's terminal event for its ``callback_url``: the outbox the head's sender
    works through (:mod:`hypermedia.callbacks`), written in the transaction that made
    the job completed, failed or cancelled (:mod:`hypermedia.jobs.callbacks`)."""

    __tablename__ = "job_callbacks"
    __table_args__ = (
        Index("ix_job_callbacks_status_next_attempt_at", "status", "next_attempt_at"),
    )

    event_id: Mapped[str] = mapped_column(ID, primary_key=True)  # md5("<job_id>:<event>")
    job_id: Mapped[str] = mapped_column(ForeignKey("processing_jobs.job_id"), unique=True)
    event: Mapped[str] = mapped_column(String(16))  # completed | failed | cancelled
    status: Mapped[str] = mapped_column(String(16))  # pending | delivered | failed
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime]
    last_attempt_at: Mapped[datetime | None]
    response_code: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)
    delivered_at: Mapped[datetime | None]
    created_at: Mapped[datetime]


class JobCheckpoint(Base):
    """A finished piece of a long job (:mod:`pipelines.checkpoints`: a chunk of a
    transcode), stored so that a retry on any worker goes on from it. The row is
    written when its upload URL is granted (``granted_at``), before any byte is
    stored, so every stored piece has one; ``committed_at`` once the piece is whole in
    storage. The head deletes pieces and rows once the job has ended, and pieces never
    committed a day after their grant (:mod:`hypermedia.jobs.checkpoints`)."""

    __tablename__ = "job_checkpoints"

    # checkpoints/{job_id}/{profile_version}/{params digest}/{name}
    storage_key: Mapped[str] = mapped_column(String(512), primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("processing_jobs.job_id"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    granted_at: Mapped[datetime]
    committed_at: Mapped[datetime | None]


class BlobDeletion(Base):
    """A stored blob to delete: written in the transaction that marks its object
    deleted (``DELETE /objects/{id}``), removed once the storage has deleted it. A
    deletion the storage failed (S3 down, a timeout, a disk error) stays, and the
    head's maintenance tries it again with backoff (:mod:`hypermedia.storage.deletions`)."""

    __tablename__ = "blob_deletions"

    storage_key: Mapped[str] = mapped_column(String(512), primary_key=True)
    # The object whose deletion asked for it (for the log; the row of a blob it was).
    object_id: Mapped[str | None] = mapped_column(ID)
    requested_at: Mapped[datetime]
    # Failed tries so far, when the next is due, and what the last one met.
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(index=True)
    last_error: Mapped[str | None] = mapped_column(String(200))
    # SQLite: a deleter calls the storage now, until then at the latest (no transaction
    # open meanwhile); no job is granted the key to write until it is done.
    claimed_until: Mapped[datetime | None]
    # Where its object's verified copy was migrated to (objects.storage_backend), deleted
    # there too; NULL: the server's storage only.
    storage_backend: Mapped[str | None] = mapped_column(String(64))


class JobOutput(Base):
    __tablename__ = "job_outputs"
    __table_args__ = (
        UniqueConstraint("job_id", "output_type", "profile_version", name="uk_job_type_profile"),
    )

    output_id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    job_id: Mapped[str] = mapped_column(ForeignKey("processing_jobs.job_id"))
    output_type: Mapped[str] = mapped_column(String(64))
    profile_version: Mapped[int] = mapped_column(Integer)
    object_id: Mapped[str | None] = mapped_column(ForeignKey("objects.object_id"))
    storage_key: Mapped[str] = mapped_column(String(512))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    content_type: Mapped[str | None] = mapped_column(String(127))
    created_at: Mapped[datetime]


class Worker(Base):
    __tablename__ = "workers"

    worker_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    queue: Mapped[str] = mapped_column(String(32), index=True)
    node_id: Mapped[str | None] = mapped_column(String(64))
    hostname: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int | None] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))  # active | draining | stopped | dead
    concurrency: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime]
    last_heartbeat: Mapped[datetime]
    stopped_at: Mapped[datetime | None]
    # Claiming no job while active, since when and why (the disk guard: "low disk: 312
    # MB free, needs 1024"); NULL while it claims.
    claims_paused_since: Mapped[datetime | None]
    claims_paused_reason: Mapped[str | None] = mapped_column(String(200))
    # Its last outage pause (the record, Redis or the storage down: claims held back so
    # that no job spends an attempt on it): since when, why, and how long it lasted
    # (NULL while it lasts). Written by the worker's upkeep once the row can be.
    outage_paused_since: Mapped[datetime | None]
    outage_paused_reason: Mapped[str | None] = mapped_column(String(200))
    outage_paused_seconds: Mapped[float | None] = mapped_column(Float)


class WorkerMetric(Base):
    __tablename__ = "worker_metrics"

    metric_id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    worker_id: Mapped[str] = mapped_column(ForeignKey("workers.worker_id"), index=True)
    recorded_at: Mapped[datetime]
    cpu_percent: Mapped[float] = mapped_column(Float)
    memory_mb: Mapped[float] = mapped_column(Float)
    disk_free_mb: Mapped[float] = mapped_column(Float)
    jobs_completed: Mapped[int] = mapped_column(Integer)
    jobs_failed: Mapped[int] = mapped_column(Integer)
    throughput_per_min: Mapped[float] = mapped_column(Float)


class SchedulerDecision(Base):
    """Every scaling decision the scheduler takes, with its reason."""

    __tablename__ = "scheduler_decisions"

    decision_id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    decided_at: Mapped[datetime] = mapped_column(index=True)
    mode: Mapped[str] = mapped_column(String(16))
    queue: Mapped[str | None] = mapped_column(String(32))
    action: Mapped[str] = mapped_column(String(32))
    count: Mapped[int] = mapped_column(Integer, default=0)
    provider: Mapped[str | None] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text)
    details: Mapped[dict[str, Any]]
    applied: Mapped[bool] = mapped_column(Boolean, default=False)


class QueueSample(Base):
    """One queue as the scheduler's leader saw it on a turn (at most one row per queue
    a minute, kept two days: :mod:`autoscaler.samples`): the operator page's charts."""

    __tablename__ = "queue_samples"

    sample_id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    sampled_at: Mapped[datetime] = mapped_column(index=True)
    queue: Mapped[str] = mapped_column(String(32))
    depth: Mapped[int] = mapped_column(Integer)  # ready jobs
    oldest_age_seconds: Mapped[float] = mapped_column(Float)
    workers: Mapped[int] = mapped_column(Integer)  # active and draining, VPS and cloud


class SchedulerState(Base):
    """What the scheduler must remember across restarts, by name: the cost lock (set
    when the daily cap is reached, cleared only by ``hypermedia scheduler
    reset-cost-lock``) and the history its rules read (cooldowns, launches)."""

    __tablename__ = "scheduler_state"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[dict[str, Any]]
    updated_at: Mapped[datetime]


class CloudSpend(Base):
    """One cloud instance's life and price: the ledger the cost guard sums."""

    __tablename__ = "cloud_spend"

    spend_id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    provider: Mapped[str] = mapped_column(String(16))
    instance_id: Mapped[str] = mapped_column(String(128))
    # The launch's request id (the hypermedia-request tag): a bill may name only that.
    request_id: Mapped[str | None] = mapped_column(String(64))
    node_type: Mapped[str] = mapped_column(String(64))
    region: Mapped[str] = mapped_column(String(64))
    spot: Mapped[bool] = mapped_column(Boolean, default=False)
    # What the caps count: the most the instance may bill an hour (a spot instance's
    # maximum, not its launch price).
    price_per_hour_microusd: Mapped[int] = mapped_column(BigInteger)
    # The price it was launched at when lower (a spot instance's market price then):
    # what its bill is expected to say. NULL: the price above.
    quoted_per_hour_microusd: Mapped[int | None] = mapped_column(BigInteger)
    launched_at: Mapped[datetime]
    terminated_at: Mapped[datetime | None]
    billed_microusd: Mapped[int | None] = mapped_column(BigInteger)
    reconciled_at: Mapped[datetime | None]

    __table_args__ = (UniqueConstraint("provider", "instance_id", name="uk_spend_instance"),)


class Alert(Base):
    """One notification of an alert rule (:mod:`autoscaler.alerts`): it began firing, it
    fires still (a repeat), it resolved, or an event (a scaling action) happened."""

    __tablename__ = "alerts"

    alert_id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    key: Mapped[str] = mapped_column(String(200), index=True)  # rule and subject
    rule: Mapped[str] = mapped_column(String(32))
    level: Mapped[str] = mapped_column(String(16))  # info | warning | critical
    status: Mapped[str] = mapped_column(String(16))  # firing | resolved | event
    summary: Mapped[str] = mapped_column(Text)
    labels: Mapped[dict[str, Any]]
    details: Mapped[dict[str, Any]]
    started_at: Mapped[datetime]
    notified_at: Mapped[datetime] = mapped_column(index=True)


class AlertDelivery(Base):
    """One notification to one webhook (the outbox a sender works through)."""

    __tablename__ = "alert_deliveries"
    __table_args__ = (
        Index("ix_alert_deliveries_status_next_attempt_at", "status", "next_attempt_at"),
    )

    delivery_id: Mapped[str] = mapped_column(ID, primary_key=True)
    alert_id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), ForeignKey("alerts.alert_id"), index=True
    )
    webhook: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))  # pending | delivered | failed
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime]
    last_attempt_at: Mapped[datetime | None]
    response_code: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)
    delivered_at: Mapped[datetime | None]
    created_at: Mapped[datetime]


class BulkRun(Base):
    """An operator's bulk run (:mod:`hypermedia.bulk`): regenerate, backfill or migrate
    the objects its ``filter`` matches, streamed in ``object_id`` order from ``cursor``
    (the last object it has dealt with), at most ``max_in_flight`` of its jobs queued or
    running at a time. ``state``: creating | paused | draining | completed | cancelled
    | failed."""

    __tablename__ = "bulk_runs"
    # A create's Idempotency-Key: one run per creator and key (NULLs never collide).
    __table_args__ = (
        Index("uk_bulk_run_idempotency_key", "created_by", "idempotency_key", unique=True),
    )

    run_id: Mapped[str] = mapped_column(ID, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # regenerate | backfill | migrate
    operation: Mapped[str | None] = mapped_column(String(64))
    profile_id: Mapped[int | None] = mapped_column(ForeignKey("processing_profiles.profile_id"))
    target_version: Mapped[int | None] = mapped_column(Integer)
    filter: Mapped[dict[str, Any]]
    # migrate: the backend the objects are copied to (no secrets: the head's own).
    target: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    queue: Mapped[str | None] = mapped_column(String(32))
    priority: Mapped[int] = mapped_column(Integer)
    max_in_flight: Mapped[int] = mapped_column(Integer)
    batch_size: Mapped[int] = mapped_column(Integer)
    # Who pays: NULL is the platform (no user's credits).
    account_user_id: Mapped[str | None] = mapped_column(ForeignKey("users.user_id"))
    state: Mapped[str] = mapped_column(String(16), index=True)
    cursor: Mapped[str | None] = mapped_column(String(32))
    scanned: Mapped[int] = mapped_column(BigInteger, default=0)
    created_jobs: Mapped[int] = mapped_column(BigInteger, default=0)
    skipped: Mapped[int] = mapped_column(BigInteger, default=0)  # done at the target already
    unfit: Mapped[int] = mapped_column(BigInteger, default=0)  # the operation refuses it
    migrated: Mapped[int] = mapped_column(BigInteger, default=0)
    failed: Mapped[int] = mapped_column(BigInteger, default=0)
    reason: Mapped[str | None] = mapped_column(Text)
    created_by: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    request_hash: Mapped[str | None] = mapped_column(String(64))  # what the create asked
    # The objects its filter selected at create (its progress's whole); NULL: from before.
    total: Mapped[int | None] = mapped_column(BigInteger)
