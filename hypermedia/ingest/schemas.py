"""The HTTP API's wire models: what the server answers and the client parses.

Pydantic only (no FastAPI, no SQLAlchemy), so the thin client can import them
cheaply. Credits travel as decimal numbers (millicredits / 1000); times as ISO
8601 in UTC. The submit request body is
:class:`hypermedia.ingest.service.SubmitRequest` itself.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from hypermedia.ingest.fields import FileName, Text


def credits(millicredits: int) -> float:
    return millicredits / 1000


def credits_or_none(millicredits: int | None) -> float | None:
    return None if millicredits is None else millicredits / 1000


class _Model(BaseModel):
    # Responses may grow fields: a client built against an older server must not break.
    model_config = ConfigDict(extra="ignore", frozen=True)


class ErrorBody(_Model):
    code: str = Field(description="Stable machine-readable error code, e.g. `not_found`.")
    message: str
    details: dict[str, Any] | None = None


class ErrorResponse(_Model):
    error: ErrorBody


class SubmittedJobOut(_Model):
    job_id: str
    operation: str
    queue: str
    priority: int
    estimated_credits: float
    reserved_credits: float | None = Field(
        default=None,
        description="What the submit holds on your credits: the estimate plus the most "
        "the units of work its step may report can cost (the profile's unit_costs: ocr "
        "escalations). The job is never charged more; the rest is released when it ends.",
    )


class ProcessResponse(_Model):
    submission_id: str
    job_ids: list[str]
    jobs: list[SubmittedJobOut]
    estimated_credits: float
    reserved_credits: float | None = Field(
        default=None,
        description="What the submit holds on your credits: the estimate plus the most "
        "the units of work its step may report can cost (the profile's unit_costs: ocr "
        "escalations). The job is never charged more; the rest is released when it ends.",
    )
    replayed: bool = Field(description="True when an idempotency key replayed an earlier submit.")


class AttemptOut(_Model):
    attempt_number: int
    worker_id: str
    status: str
    error_code: str | None = None
    error_message: str | None = None
    started_at: datetime
    finished_at: datetime | None = None
    duration_ms: int | None = None
    peak_memory_mb: float | None = None
    has_log: bool = Field(
        default=False,
        description="The end of its child's output is kept (a failed attempt): "
        "`GET .../attempts/{attempt_number}/log`.",
    )
    # The units of work the step reported (ocr: page, ocr_page, engine_pass, escalation),
    # which the profile's unit_costs priced into the job's actual credits.
    units: dict[str, int] | None = None


class AttemptLogResponse(_Model):
    job_id: str
    attempt_number: int
    log: str = Field(
        description="The last 64 KB of what the attempt's child printed (stdout and "
        "stderr, whole lines; its working directory shown as `<workdir>`)."
    )


class OutputOut(_Model):
    output_type: str
    profile_version: int
    storage_key: str
    size_bytes: int
    content_type: str | None = None
    object_id: str | None = None


JobStatusName = Literal[
    "created", "queued", "claimed", "processing", "retry_wait", "completed", "failed", "cancelled"
]
TERMINAL_STATUSES: frozenset[str] = frozenset({"completed", "failed", "cancelled"})


CallbackStatus = Literal["pending", "delivered", "failed"]


class CallbackOut(_Model):
    """The delivery of the job's terminal event to its ``callback_url``. Once the outbox
    has pruned its event (``callback_delivered_retention_seconds``, a day, after its
    delivery; ``callback_failed_retention_seconds``, 7 days, after it was given up) only
    what it came to is kept: ``status`` and ``attempts``, the times and the last answer
    null."""

    event_id: str = Field(description="`X-Hypermedia-Delivery` of every attempt: the same.")
    event: Literal["completed", "failed", "cancelled"]
    status: CallbackStatus
    attempts: int
    next_attempt_at: datetime | None = Field(default=None, description="While pending.")
    last_attempt_at: datetime | None = None
    response_code: int | None = Field(default=None, description="The receiver's last answer.")
    last_error: str | None = None
    delivered_at: datetime | None = None


class JobResponse(_Model):
    job_id: str
    submission_id: str | None = None
    object_id: str
    operation: str
    queue: str
    priority: int
    status: JobStatusName
    cancel_requested: bool
    attempt_count: int
    max_attempts: int
    estimated_credits: float
    reserved_credits: float | None = Field(
        default=None,
        description="What the submit holds on your credits: the estimate plus the most "
        "the units of work its step may report can cost (the profile's unit_costs: ocr "
        "escalations). The job is never charged more; the rest is released when it ends.",
    )
    actual_credits: float | None = Field(
        default=None, description="What the job was charged, once it completed."
    )
    error_code: str | None = None
    error_message: str | None = None
    created_at: datetime
    queued_at: datetime | None = None
    started_at: datetime | None = None
    completed_at: datetime | None = None
    run_after: datetime | None = Field(default=None, description="When a retry is due.")
    attempts: list[AttemptOut] = Field(default_factory=list)
    outputs: list[OutputOut] = Field(default_factory=list)
    callback_url: str | None = None
    callback: CallbackOut | None = Field(
        default=None,
        description="Once the job has ended with a `callback_url`: its delivery so far.",
    )
    timeout_seconds: int | None = Field(
        default=None,
        description="The time limit each attempt runs under, in seconds: worked out at "
        "submit from the pages its step may read (ocr: the profile's time plus its time "
        "per page).",
    )

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL_STATUSES


def job_response(view: Any) -> JobResponse:
    """The answer for a :class:`~hypermedia.ingest.service.JobView`."""
    callback = view.callback
    return JobResponse(
        job_id=view.job_id,
        submission_id=view.submission_id,
        object_id=view.object_id,
        operation=view.operation,
        queue=view.queue,
        priority=view.priority,
        status=view.status,
        cancel_requested=view.cancel_requested,
        attempt_count=view.attempt_count,
        max_attempts=view.max_attempts,
        estimated_credits=credits(view.estimated_millicredits),
        reserved_credits=credits(view.reserved_millicredits),
        actual_credits=credits_or_none(view.actual_millicredits),
        error_code=view.error_code,
        error_message=view.error_message,
        created_at=view.created_at,
        queued_at=view.queued_at,
        started_at=view.started_at,
        completed_at=view.completed_at,
        run_after=view.run_after,
        attempts=[AttemptOut.model_validate(a, from_attributes=True) for a in view.attempts],
        outputs=[OutputOut.model_validate(o, from_attributes=True) for o in view.outputs],
        callback_url=view.callback_url,
        callback=None
        if callback is None
        else CallbackOut.model_validate(callback, from_attributes=True),
        timeout_seconds=view.timeout_seconds,
    )


class JobEvent(_Model):
    """One event of ``GET /jobs/{id}/events`` (see :mod:`hypermedia.queue.events`)."""

    id: str | None = Field(default=None, description="Its SSE id (None: the record's view).")
    type: str = Field(description="`status` or `progress`.")
    at: float | None = Field(default=None, description="When, in epoch seconds.")
    attempt: int | None = None
    status: JobStatusName | None = None
    error_code: str | None = None
    retry_at: float | None = None
    record: bool = Field(default=False, description="A status read from the job record.")
    phase: str | None = Field(default=None, description="`download`, `run` or `upload`.")
    done: float | None = None
    total: float | None = None
    unit: str | None = Field(default=None, description="`bytes`, `seconds`, `pages` ...")
    fraction: float | None = None

    @property
    def ends(self) -> bool:
        """A terminal status: nothing follows it."""
        return self.type == "status" and self.status in TERMINAL_STATUSES


class JobSummary(_Model):
    """A job without its attempts and outputs (``GET /jobs/{id}`` has them)."""

    job_id: str
    submission_id: str
    object_id: str
    operation: str
    queue: str
    priority: int
    status: JobStatusName
    attempt_count: int
    max_attempts: int
    estimated_credits: float
    actual_credits: float | None = None
    error_code: str | None = None
    created_at: datetime
    started_at: datetime | None = None
    completed_at: datetime | None = None


def job_summary(row: Any) -> JobSummary:
    """A :data:`hypermedia.ingest.queries.SUMMARY` row as the API answers it."""
    return JobSummary(
        job_id=row.job_id,
        submission_id=row.submission_id,
        object_id=row.object_id,
        operation=row.operation,
        queue=row.queue,
        priority=row.priority,
        status=row.status,
        attempt_count=row.attempt_count,
        max_attempts=row.max_attempts,
        estimated_credits=credits(row.estimated_millicredits),
        actual_credits=credits_or_none(row.actual_millicredits),
        error_code=row.error_code,
        created_at=row.created_at,
        started_at=row.started_at,
        completed_at=row.completed_at,
    )


class JobsPage(_Model):
    jobs: list[JobSummary]
    next_cursor: str | None = Field(
        default=None,
        description="Pass as `cursor` for the next page (older jobs); null on the last.",
    )


class SubmissionResponse(_Model):
    submission_id: str
    idempotency_key: str | None = None
    estimated_credits: float
    created_at: datetime
    jobs: list[JobSummary]


class OutputUrlResponse(_Model):
    job_id: str
    output_type: str
    url: str = Field(description="GET it without an API key, until `expires_at`.")
    expires_at: datetime
    size_bytes: int
    content_type: str | None = None


class CancelResponse(_Model):
    job_id: str
    status: JobStatusName
    cancel_requested: bool = Field(
        description="True when the job is running: its worker stops it at the next check."
    )


class RegisterRequest(BaseModel):
    """A file the web tier already stored under ``originals/<pool_id>/``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    storage_key: Text = Field(min_length=1, max_length=512)
    filename: FileName = Field(min_length=1, max_length=255)
    size_bytes: int = Field(ge=0, le=2**63 - 1)  # the record's 64-bit integer
    pool_id: Text | None = Field(default=None, min_length=1, max_length=64)
    content_type: Text | None = Field(
        default=None,
        max_length=127,
        description="Ignored: the type is detected from the stored bytes.",
        deprecated=True,
    )
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")


class ObjectResponse(_Model):
    object_id: str
    pool_id: str
    size_bytes: int
    sha256: str | None = None
    filename: str
    content_type: str | None = Field(
        default=None, description="Detected from the content at upload, never the client's claim."
    )
    detected_kind: str | None = Field(
        default=None,
        description="What the content is, as profiles' `accepts` name it "
        "(`image`, `pdf`, `ooxml-word`, `video` ...).",
    )
    refusal: ErrorBody | None = Field(
        default=None,
        description="Set when every operation on this object would be refused "
        "(`macro_document`, `encrypted_document`, `zip_bomb` ...): the code and why.",
    )
    created_at: datetime
    replayed: bool = Field(
        default=False,
        description="True when an upload's Idempotency-Key replayed an earlier upload, or a "
        "registration repeated the one of its storage key: this is its object, nothing more "
        "was stored or registered.",
    )


class DeleteObjectResponse(_Model):
    object_id: str
    outputs_deleted: int = Field(description="Derived outputs deleted with it.")
    bytes_freed: int = Field(description="Stored bytes released from the owner's quota.")


class RedisCounts(_Model):
    ready: int
    leased: int
    delayed: int


class QueueOut(_Model):
    queue: str
    queued: int
    in_flight: int
    retry_wait: int
    oldest_queued_at: datetime | None = None
    oldest_age_seconds: float | None = None
    redis: RedisCounts | None = Field(
        default=None, description="What Redis holds; null when Redis is unreachable."
    )


class QueuesResponse(_Model):
    queues: list[QueueOut]


class BulkProgressOut(_Model):
    """How far a run is, in objects of its selection."""

    total: int | None = Field(
        description="The objects its filter selected at create (once nothing is left to"
        " scan: those it scanned); null while it scans for a run from before totals, or"
        " one whose selection was too big to count at its create."
    )
    done: int = Field(description="Skipped (done already), unfit, and completed or migrated.")
    failed: int = Field(description="Jobs failed or cancelled; a migration's failed copies.")
    in_flight: int = Field(description="Jobs queued or running.")
    remaining: int | None = Field(description="In flight and not scanned yet.")
    percent: float | None = Field(description="(done + failed) / total, in percent.")
    jobs_per_second: float | None = Field(
        description="Its jobs that ended over the last 10 minutes, a second; null: none."
    )
    eta_seconds: float | None = Field(
        description="The jobs left at that rate while it runs; null: unknown, or not running."
    )


class BulkRunOut(_Model):
    """A bulk run (operators only): its filter, cursor, counts, state and jobs."""

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
    account_user_id: str | None = Field(description="Who pays; null: the platform.")
    state: str = Field(description="creating, paused, draining, completed or cancelled.")
    cursor: str | None = Field(description="The last object id the run has dealt with.")
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
    jobs: dict[str, int] = Field(description="The run's jobs by status.")
    total: int | None = Field(
        None, description="The objects its filter selected at create; null: from before."
    )
    progress: BulkProgressOut | None = None
    stopping: int = Field(
        0,
        description="A cancelled run's jobs still running, asked to stop (0 once none"
        " is left; always 0 for a run not cancelled).",
    )


class BulkRunsResponse(_Model):
    runs: list[BulkRunOut]
    next_cursor: str | None = Field(
        default=None,
        description="Pass as `cursor` for the next page (older runs); null on the last.",
    )


class BulkEstimateOut(_Model):
    """What a run would do (``dry_run``): nothing is written."""

    kind: str
    operation: str | None
    queue: str | None
    priority: int
    objects: int = Field(description="Jobs it would create, or objects it would copy.")
    skipped: int
    unfit: int
    bytes: int
    mean_job_seconds: float | None
    history_attempts: int
    cpu_seconds: float | None


class CreditsResponse(_Model):
    balance: float
    reserved: float = Field(description="Held by jobs that have not finished.")
    available: float


class HealthResponse(_Model):
    status: Literal["ok", "unavailable"]
    database: bool
    redis: bool
    # Probed since 2026-12: None from a server that does not say (a client may be newer).
    storage: bool | None = None
