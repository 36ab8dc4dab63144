"""Tables of the job record. One schema for PostgreSQL and SQLite.

Conventions: ids are 32-hex time-ordered strings (:mod:`hypermedia.ids`); times
are UTC (stored naive, returned aware); credits are integer millicredits; status
columns hold :class:`~hypermedia.jobs.states.JobStatus` values. The schema is
created only by the Alembic migrations in ``migrations/versions``; these tables
describe it for queries, and a test checks the two agree.

Plain Core tables on one :data:`metadata` (:mod:`hypermedia.db.tables` names them
for the queries): nothing here maps classes, so a process that uses the record never
imports ``sqlalchemy.orm`` (0.2 CPU-s each, and every actor and command is one).
A column is ``nullable=False`` unless it may be NULL; a foreign key's column takes
the type of the column it refers to.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
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
# A serial key: BIGSERIAL on PostgreSQL, SQLite's INTEGER PRIMARY KEY (its rowid).
SERIAL = BigInteger().with_variant(Integer, "sqlite")

metadata = MetaData(naming_convention=NAMING)


def _where(predicate: str) -> dict[str, Any]:
    """A partial index's predicate, on both databases."""
    return {"postgresql_where": text(predicate), "sqlite_where": text(predicate)}


users = Table(
    "users",
    metadata,
    Column("user_id", ID, primary_key=True),
    Column("name", String(200), nullable=False, unique=True),
    Column("is_operator", Boolean, nullable=False, default=False),
    Column("created_at", UTCDateTime(), nullable=False),
    # Bytes of the live objects the user owns (uploads and their jobs' outputs), kept
    # with every insert, resize and deletion of one (hypermedia.accounts.add_stored_bytes):
    # the storage quota reads one row instead of summing the user's objects.
    Column("stored_bytes", BigInteger, nullable=False, default=0, server_default=text("0")),
)

# A storage pool: objects live in one; its members may use them.
pools = Table(
    "pools",
    metadata,
    Column("pool_id", String(64), primary_key=True),
    Column("name", String(200), nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
)

pool_members = Table(
    "pool_members",
    metadata,
    Column("pool_id", ForeignKey("pools.pool_id"), primary_key=True),
    Column("user_id", ForeignKey("users.user_id"), primary_key=True),
    Column("role", String(16), nullable=False, default="member"),
)

# A file in storage: an upload (kind='original') or a derived output.
objects = Table(
    "objects",
    metadata,
    Column("object_id", ID, primary_key=True),
    Column("pool_id", ForeignKey("pools.pool_id"), nullable=False, index=True),
    Column("owner_id", ForeignKey("users.user_id"), nullable=False, index=True),
    Column("kind", String(16), nullable=False, default="original"),
    # Indexed: a deletion walks everything derived from an object by it.
    Column("source_object_id", ForeignKey("objects.object_id"), index=True),
    Column("storage_key", String(512), nullable=False, unique=True),
    Column("filename", String(255), nullable=False),
    # Detected from the bytes at upload/registration (never the client's claim); for
    # derived outputs, what the pipeline wrote.
    Column("content_type", String(127)),
    Column("size_bytes", BigInteger, nullable=False),
    Column("sha256", String(64)),
    Column("created_at", UTCDateTime(), nullable=False),
    # hypermedia.sandbox.inspect.Inspection.to_dict() of the stored bytes: kind, mime and
    # the facts the submit-time checks judge. NULL for outputs and pre-0002 objects.
    Column("inspection", JSON),
    # Set by DELETE /objects/{id}: the blobs are gone; the row stays for its jobs' history.
    Column("deleted_at", UTCDateTime()),
    # Where a bulk migration put the object's verified copy (the run's target backend,
    # :mod:`hypermedia.bulk.migrate`); NULL: the server's configured storage.
    Column("storage_backend", String(64)),
    # The Idempotency-Key of the upload that made it (PUT /objects): a retry with the
    # same key answers with this object instead of storing a second one.
    Column("idempotency_key", String(200)),
    # An upload's Idempotency-Key: one object per user and key (NULLs never collide).
    Index("uk_object_idempotency_key", "owner_id", "idempotency_key", unique=True),
)

# API keys are shown once; only their SHA-256 is stored.
api_keys = Table(
    "api_keys",
    metadata,
    Column("key_id", String(16), primary_key=True),
    Column("user_id", ForeignKey("users.user_id"), nullable=False, index=True),
    Column("key_hash", String(64), nullable=False),
    Column("name", String(200), nullable=False, default=""),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("revoked_at", UTCDateTime()),
    # What the operator granted this key (hypermedia user add/key/grant); NULL: the
    # settings' key_priority_min / key_priority_max / key_submits_per_minute.
    Column("priority_min", Integer),
    Column("priority_max", Integer),
    Column("submits_per_minute", Integer),
)

# balance is what the user has; reserved is held by unfinished jobs.
credit_accounts = Table(
    "credit_accounts",
    metadata,
    Column("user_id", ForeignKey("users.user_id"), primary_key=True),
    Column("balance_millicredits", BigInteger, nullable=False, default=0),
    Column("reserved_millicredits", BigInteger, nullable=False, default=0),
    Column("updated_at", UTCDateTime(), nullable=False),
)

credit_ledger = Table(
    "credit_ledger",
    metadata,
    Column("entry_id", SERIAL, primary_key=True, autoincrement=True),
    Column("user_id", ForeignKey("users.user_id"), nullable=False, index=True),
    Column("job_id", ForeignKey("processing_jobs.job_id"), index=True),
    Column("kind", String(16), nullable=False),  # grant | charge | adjust
    Column("amount_millicredits", BigInteger, nullable=False),
    Column("note", String(255), nullable=False, default=""),
    Column("created_at", UTCDateTime(), nullable=False),
    # One charge per job (0030): a completion that finds its job charged already
    # charges nothing more (hypermedia.jobs.credits.charge).
    Index("uk_credit_ledger_job_charge", "job_id", unique=True, **_where("kind = 'charge'")),
)

processing_profiles = Table(
    "processing_profiles",
    metadata,
    Column("profile_id", Integer, primary_key=True, autoincrement=True),
    Column("operation", String(64), nullable=False),
    Column("version", Integer, nullable=False),
    Column("queue", String(32), nullable=False),
    Column("base_cost_millicredits", BigInteger, nullable=False),
    Column("cost_per_mb_millicredits", BigInteger, nullable=False),
    Column("timeout_seconds", Integer, nullable=False),
    Column("memory_limit_mb", Integer, nullable=False),
    Column(
        "max_processes",
        Integer,
        nullable=False,
        default=DEFAULT_MAX_PROCESSES,
        server_default=text(str(DEFAULT_MAX_PROCESSES)),
    ),
    Column(
        "max_output_bytes",
        BigInteger,
        nullable=False,
        default=DEFAULT_MAX_OUTPUT_BYTES,
        server_default=text(str(DEFAULT_MAX_OUTPUT_BYTES)),
    ),
    Column("max_input_bytes", BigInteger, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("default_priority", Integer, nullable=False),
    Column("params", JSON, nullable=False),
    # Kinds / mime types the operation accepts, and its InputLimits (see profiles.py).
    Column(
        "accepts",
        JSON,
        nullable=False,
        default=lambda: ["any"],
        server_default=text("'[\"any\"]'"),
    ),
    Column("input_limits", JSON, nullable=False, default=dict, server_default=text("'{}'")),
    # Millicredits per unit of work a job's step reports (profiles.py's unit_costs).
    Column(
        "unit_costs_millicredits", JSON, nullable=False, default=dict, server_default=text("'{}'")
    ),
    # A job's time grows with its pages up to a cap (profiles.py); NULL: it does not.
    Column("timeout_seconds_per_page", Float),
    Column("max_timeout_seconds", Integer),
    Column("active", Boolean, nullable=False, default=True),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    UniqueConstraint("operation", "version", name="uk_profile_operation_version"),
)

# One accepted submit request; its idempotency key makes retries safe.
submissions = Table(
    "submissions",
    metadata,
    Column("submission_id", ID, primary_key=True),
    Column("user_id", ForeignKey("users.user_id"), nullable=False),
    Column("idempotency_key", String(200)),
    Column("request_hash", String(64), nullable=False),
    Column("estimated_millicredits", BigInteger, nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    UniqueConstraint("user_id", "idempotency_key", name="uk_submission_key"),
)

processing_jobs = Table(
    "processing_jobs",
    metadata,
    Column("job_id", ID, primary_key=True),
    Column("submission_id", ForeignKey("submissions.submission_id"), nullable=False, index=True),
    # (user_id, job_id) is indexed below: no index of user_id alone.
    Column("user_id", ForeignKey("users.user_id"), nullable=False),
    Column("object_id", ForeignKey("objects.object_id"), nullable=False, index=True),
    Column("profile_id", ForeignKey("processing_profiles.profile_id"), nullable=False),
    Column("operation", String(64), nullable=False),
    Column("queue", String(32), nullable=False),
    Column("priority", Integer, nullable=False),
    Column("status", String(16), nullable=False),
    Column("params", JSON, nullable=False),
    Column("estimated_millicredits", BigInteger, nullable=False),
    # What the submit held on the user's credits: the estimate plus the most the units
    # of work its step may report can cost (unit_costs); every release gives back this,
    # and the completion charges at most this.
    Column("reserved_millicredits", BigInteger, nullable=False),
    # The job's time limit, worked out at submit (its pages' time: profiles.py); the
    # worker's CPU and wall-clock limits and lease follow it. NULL (jobs from before
    # it): the profile's timeout_seconds.
    Column("timeout_seconds", Integer),
    Column("actual_millicredits", BigInteger),
    Column("attempt_count", Integer, nullable=False, default=0),
    Column("max_attempts", Integer, nullable=False),
    Column("claimed_by", String(64)),
    Column("claimed_at", UTCDateTime()),
    Column("visibility_timeout", UTCDateTime()),
    Column("run_after", UTCDateTime()),
    Column("cancel_requested", Boolean, nullable=False, default=False),
    Column("error_code", String(64)),
    Column("error_message", Text),
    Column("created_at", UTCDateTime(), nullable=False, index=True),  # the in-rate (status)
    Column("queued_at", UTCDateTime()),
    Column("started_at", UTCDateTime()),
    Column("completed_at", UTCDateTime()),  # the out-rate: indexed below, ended jobs only
    Column("updated_at", UTCDateTime(), nullable=False),
    # Where the head POSTs the job once it is completed, failed or cancelled (a host of
    # the settings' callback_hosts; see job_callbacks).
    Column("callback_url", String(2048)),
    # The bulk run that made it (regenerate / backfill), else NULL.
    Column("bulk_run_id", ForeignKey("bulk_runs.run_id")),
    # Its callback's outcome (delivered | failed) and attempts, kept here once the
    # head's maintenance deletes its job_callbacks row; NULL while the outbox holds it.
    Column("callback_status", String(16)),
    Column("callback_attempts", Integer),
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
    Index("ix_jobs_bulk_run_status", "bulk_run_id", "status", **_where("bulk_run_id IS NOT NULL")),
    # The out-rate (status view, scheduler): ended jobs only.
    Index("ix_processing_jobs_completed_at", "completed_at", **_where("completed_at IS NOT NULL")),
)

job_attempts = Table(
    "job_attempts",
    metadata,
    Column("attempt_id", SERIAL, primary_key=True, autoincrement=True),
    Column("job_id", ForeignKey("processing_jobs.job_id"), nullable=False),
    Column("attempt_number", Integer, nullable=False),
    Column("worker_id", String(64), nullable=False),
    Column("status", String(16), nullable=False),  # running | completed | failed | released
    Column("error_code", String(64)),
    Column("error_message", Text),
    Column("started_at", UTCDateTime(), nullable=False),
    Column("finished_at", UTCDateTime()),
    Column("duration_ms", BigInteger),
    Column("peak_memory_mb", Float),
    # A failed attempt's child: the end of its stdout and stderr (at most 64 KB).
    Column("log_tail", Text),
    # The work the step reported, as the profile's unit_costs count it (ocr: page,
    # ocr_page, engine_pass, escalation); null for steps that report none.
    Column("units", JSON),
    UniqueConstraint("job_id", "attempt_number", name="uk_attempt_number"),
)

# A job's terminal event for its callback_url: the outbox the head's sender works
# through (hypermedia.callbacks), written in the transaction that made the job
# completed, failed or cancelled (hypermedia.jobs.callbacks).
job_callbacks = Table(
    "job_callbacks",
    metadata,
    Column("event_id", ID, primary_key=True),  # md5("<job_id>:<event>")
    Column("job_id", ForeignKey("processing_jobs.job_id"), nullable=False, unique=True),
    Column("event", String(16), nullable=False),  # completed | failed | cancelled
    Column("status", String(16), nullable=False),  # pending | delivered | failed
    Column("attempts", Integer, nullable=False, default=0),
    Column("next_attempt_at", UTCDateTime(), nullable=False),
    Column("last_attempt_at", UTCDateTime()),
    Column("response_code", Integer),
    Column("last_error", Text),
    Column("delivered_at", UTCDateTime()),
    Column("created_at", UTCDateTime(), nullable=False),
    Index("ix_job_callbacks_status_next_attempt_at", "status", "next_attempt_at"),
    # The prune's (0032): the rows of a status by when they ended. Whole, not partial
    # over one status: PostgreSQL leaves out of the scan a condition the index's
    # predicate implies (status), and a partial index on (delivered_at) alone SQLite
    # did not take without statistics, which it keeps none of unless asked.
    Index("ix_job_callbacks_status_delivered_at", "status", "delivered_at"),
    Index("ix_job_callbacks_status_last_attempt_at", "status", "last_attempt_at"),
)

# A finished piece of a long job (pipelines.checkpoints: a chunk of a transcode),
# stored so that a retry on any worker goes on from it. The row is written when its
# upload URL is granted (granted_at), before any byte is stored, so every stored piece
# has one; committed_at once the piece is whole in storage. The head deletes pieces and
# rows once the job has ended, and pieces never committed a day after their grant
# (hypermedia.jobs.checkpoints).
job_checkpoints = Table(
    "job_checkpoints",
    metadata,
    # checkpoints/{job_id}/{profile_version}/{params digest}/{name}
    Column("storage_key", String(512), primary_key=True),
    Column("job_id", ForeignKey("processing_jobs.job_id"), nullable=False, index=True),
    Column("name", String(64), nullable=False),
    Column("size_bytes", BigInteger),
    Column("granted_at", UTCDateTime(), nullable=False),
    Column("committed_at", UTCDateTime()),
)

# A stored blob to delete: written in the transaction that marks its object deleted
# (DELETE /objects/{id}), removed once the storage has deleted it. A deletion the
# storage failed (S3 down, a timeout, a disk error) stays, and the head's maintenance
# tries it again with backoff (hypermedia.storage.deletions).
blob_deletions = Table(
    "blob_deletions",
    metadata,
    Column("storage_key", String(512), primary_key=True),
    # The object whose deletion asked for it (for the log; the row of a blob it was).
    Column("object_id", ID),
    Column("requested_at", UTCDateTime(), nullable=False),
    # Failed tries so far, when the next is due, and what the last one met.
    Column("attempts", Integer, nullable=False, default=0),
    Column("next_attempt_at", UTCDateTime(), nullable=False, index=True),
    Column("last_error", String(200)),
    # SQLite: a deleter calls the storage now, until then at the latest (no transaction
    # open meanwhile); no job is granted the key to write until it is done.
    Column("claimed_until", UTCDateTime()),
    # Where its object's verified copy was migrated to (objects.storage_backend), deleted
    # there too; NULL: the server's storage only.
    Column("storage_backend", String(64)),
)

job_outputs = Table(
    "job_outputs",
    metadata,
    Column("output_id", SERIAL, primary_key=True, autoincrement=True),
    Column("job_id", ForeignKey("processing_jobs.job_id"), nullable=False),
    Column("output_type", String(64), nullable=False),
    Column("profile_version", Integer, nullable=False),
    Column("object_id", ForeignKey("objects.object_id")),
    Column("storage_key", String(512), nullable=False),
    Column("size_bytes", BigInteger, nullable=False),
    Column("content_type", String(127)),
    Column("created_at", UTCDateTime(), nullable=False),
    UniqueConstraint("job_id", "output_type", "profile_version", name="uk_job_type_profile"),
)

workers = Table(
    "workers",
    metadata,
    Column("worker_id", String(64), primary_key=True),
    Column("queue", String(32), nullable=False, index=True),
    Column("node_id", String(64)),
    Column("hostname", String(255), nullable=False),
    Column("pid", Integer),
    Column("status", String(16), nullable=False),  # active | draining | stopped | dead
    Column("concurrency", Integer, nullable=False),
    Column("started_at", UTCDateTime(), nullable=False),
    Column("last_heartbeat", UTCDateTime(), nullable=False),
    Column("stopped_at", UTCDateTime()),
    # Claiming no job while active, since when and why (the disk guard: "low disk: 312
    # MB free, needs 1024"); NULL while it claims.
    Column("claims_paused_since", UTCDateTime()),
    Column("claims_paused_reason", String(200)),
    # Its last outage pause (the record, Redis or the storage down: claims held back so
    # that no job spends an attempt on it): since when, why, and how long it lasted
    # (NULL while it lasts). Written by the worker's upkeep once the row can be.
    Column("outage_paused_since", UTCDateTime()),
    Column("outage_paused_reason", String(200)),
    Column("outage_paused_seconds", Float),
)

worker_metrics = Table(
    "worker_metrics",
    metadata,
    Column("metric_id", SERIAL, primary_key=True, autoincrement=True),
    Column("worker_id", ForeignKey("workers.worker_id"), nullable=False, index=True),
    Column("recorded_at", UTCDateTime(), nullable=False),
    Column("cpu_percent", Float, nullable=False),
    Column("memory_mb", Float, nullable=False),
    Column("disk_free_mb", Float, nullable=False),
    Column("jobs_completed", Integer, nullable=False),
    Column("jobs_failed", Integer, nullable=False),
    Column("throughput_per_min", Float, nullable=False),
)

# Every scaling decision the scheduler takes, with its reason.
scheduler_decisions = Table(
    "scheduler_decisions",
    metadata,
    Column("decision_id", SERIAL, primary_key=True, autoincrement=True),
    Column("decided_at", UTCDateTime(), nullable=False, index=True),
    Column("mode", String(16), nullable=False),
    Column("queue", String(32)),
    Column("action", String(32), nullable=False),
    Column("count", Integer, nullable=False, default=0),
    Column("provider", String(16)),
    Column("reason", Text, nullable=False),
    Column("details", JSON, nullable=False),
    Column("applied", Boolean, nullable=False, default=False),
)

# One queue as the scheduler's leader saw it on a turn (at most one row per queue a
# minute, kept two days: autoscaler.samples): the operator page's charts.
queue_samples = Table(
    "queue_samples",
    metadata,
    Column("sample_id", SERIAL, primary_key=True, autoincrement=True),
    Column("sampled_at", UTCDateTime(), nullable=False, index=True),
    Column("queue", String(32), nullable=False),
    Column("depth", Integer, nullable=False),  # ready jobs
    Column("oldest_age_seconds", Float, nullable=False),
    Column("workers", Integer, nullable=False),  # active and draining, VPS and cloud
)

# What the scheduler must remember across restarts, by name: the cost lock (set when
# the daily cap is reached, cleared only by `hypermedia scheduler reset-cost-lock`) and
# the history its rules read (cooldowns, launches).
scheduler_state = Table(
    "scheduler_state",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("value", JSON, nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
)

# One cloud instance's life and price: the ledger the cost guard sums.
cloud_spend = Table(
    "cloud_spend",
    metadata,
    Column("spend_id", SERIAL, primary_key=True, autoincrement=True),
    Column("provider", String(16), nullable=False),
    Column("instance_id", String(128), nullable=False),
    # The launch's request id (the hypermedia-request tag): a bill may name only that.
    Column("request_id", String(64)),
    Column("node_type", String(64), nullable=False),
    Column("region", String(64), nullable=False),
    Column("spot", Boolean, nullable=False, default=False),
    # What the caps count: the most the instance may bill an hour (a spot instance's
    # maximum, not its launch price).
    Column("price_per_hour_microusd", BigInteger, nullable=False),
    # The price it was launched at when lower (a spot instance's market price then):
    # what its bill is expected to say. NULL: the price above.
    Column("quoted_per_hour_microusd", BigInteger),
    Column("launched_at", UTCDateTime(), nullable=False),
    Column("terminated_at", UTCDateTime()),
    Column("billed_microusd", BigInteger),
    Column("reconciled_at", UTCDateTime()),
    UniqueConstraint("provider", "instance_id", name="uk_spend_instance"),
)

# One notification of an alert rule (autoscaler.alerts): it began firing, it fires
# still (a repeat), it resolved, or an event (a scaling action) happened.
alerts = Table(
    "alerts",
    metadata,
    Column("alert_id", SERIAL, primary_key=True, autoincrement=True),
    Column("key", String(200), nullable=False, index=True),  # rule and subject
    Column("rule", String(32), nullable=False),
    Column("level", String(16), nullable=False),  # info | warning | critical
    Column("status", String(16), nullable=False),  # firing | resolved | event
    Column("summary", Text, nullable=False),
    Column("labels", JSON, nullable=False),
    Column("details", JSON, nullable=False),
    Column("started_at", UTCDateTime(), nullable=False),
    Column("notified_at", UTCDateTime(), nullable=False, index=True),
)

# One notification to one webhook (the outbox a sender works through).
alert_deliveries = Table(
    "alert_deliveries",
    metadata,
    Column("delivery_id", ID, primary_key=True),
    Column("alert_id", SERIAL, ForeignKey("alerts.alert_id"), nullable=False, index=True),
    Column("webhook", String(64), nullable=False),
    Column("status", String(16), nullable=False),  # pending | delivered | failed
    Column("attempts", Integer, nullable=False, default=0),
    Column("next_attempt_at", UTCDateTime(), nullable=False),
    Column("last_attempt_at", UTCDateTime()),
    Column("response_code", Integer),
    Column("last_error", Text),
    Column("delivered_at", UTCDateTime()),
    Column("created_at", UTCDateTime(), nullable=False),
    Index("ix_alert_deliveries_status_next_attempt_at", "status", "next_attempt_at"),
)

# An operator's bulk run (hypermedia.bulk): regenerate, backfill or migrate the objects
# its filter matches, streamed in object_id order from cursor (the last object it has
# dealt with), at most max_in_flight of its jobs queued or running at a time. state:
# creating | paused | draining | completed | cancelled | failed.
bulk_runs = Table(
    "bulk_runs",
    metadata,
    Column("run_id", ID, primary_key=True),
    Column("kind", String(16), nullable=False),  # regenerate | backfill | migrate
    Column("operation", String(64)),
    Column("profile_id", ForeignKey("processing_profiles.profile_id")),
    Column("target_version", Integer),
    Column("filter", JSON, nullable=False),
    # migrate: the backend the objects are copied to (no secrets: the head's own).
    Column("target", JSON),
    Column("queue", String(32)),
    Column("priority", Integer, nullable=False),
    Column("max_in_flight", Integer, nullable=False),
    Column("batch_size", Integer, nullable=False),
    # Who pays: NULL is the platform (no user's credits).
    Column("account_user_id", ForeignKey("users.user_id")),
    Column("state", String(16), nullable=False, index=True),
    Column("cursor", String(32)),
    Column("scanned", BigInteger, nullable=False, default=0),
    Column("created_jobs", BigInteger, nullable=False, default=0),
    Column("skipped", BigInteger, nullable=False, default=0),  # done at the target already
    Column("unfit", BigInteger, nullable=False, default=0),  # the operation refuses it
    Column("migrated", BigInteger, nullable=False, default=0),
    Column("failed", BigInteger, nullable=False, default=0),
    Column("reason", Text),
    Column("created_by", String(200)),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    Column("finished_at", UTCDateTime()),
    Column("idempotency_key", String(200)),
    Column("request_hash", String(64)),  # what the create asked
    # The objects its filter selected at create (its progress's whole); NULL: from before.
    Column("total", BigInteger),
    # A create's Idempotency-Key: one run per creator and key (NULLs never collide).
    Index("uk_bulk_run_idempotency_key", "created_by", "idempotency_key", unique=True),
)
