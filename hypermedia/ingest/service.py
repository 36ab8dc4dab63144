"""The ingest service: validate, check access, estimate, reserve credits, create, enqueue.

One library call for the web tier and the HTTP API alike::

    service.submit(caller, SubmitRequest(object_id=..., operations=["thumbnail"]))

Order of work (the seed's job creation, made transactional):

1. every operation has an active profile and a pipeline step registered for it in
   :mod:`pipelines.registry` (else 422 ``unknown_operation``: a profile without a step
   would reserve credits for a job no worker can ever run);
2. the object exists and the caller may use it (else ``not_found``, as for any id
   the caller may not see), it is not larger than the profile allows, and its content
   fits the operation: the inspection made when its bytes were stored
   (:mod:`hypermedia.sandbox.inspect`) is judged against the profile's ``accepts`` and
   input limits, and a refusal (``input_type_mismatch``, ``unsupported_format``,
   ``macro_document``, ``encrypted_document``, ``zip_bomb``, ``pixel_limit`` ...)
   raises before anything is written. Objects recorded without an inspection (outputs,
   rows older than migration 0002) are left to the pipelines' own checks;
3. credits are estimated as ``base_cost + cost_per_mb x size_mb`` per job
   (:meth:`~hypermedia.jobs.catalog.ProfileRecord.estimate_millicredits`), and each
   job's reservation is its estimate plus the most its step's priced units of work
   may cost for this input and these params
   (:meth:`~hypermedia.jobs.catalog.ProfileRecord.reserve_millicredits`: ocr's
   escalations), the most it can ever be charged; and its time limit, from the pages
   its step may read where its profile gives time a page
   (:meth:`~hypermedia.jobs.catalog.ProfileRecord.job_timeout_seconds`: a document
   past ``max_timeout_seconds`` is refused, ``page_limit``);
4. the job record takes them in one transaction
   (:meth:`~hypermedia.jobs.repository.JobRepository.create`): the reservations are
   held on the caller's account, and too few available credits raise
   :class:`PaymentRequired` and roll it back, so nothing is created and nothing is
   queued; else the job rows are inserted, born ``queued``, and it commits;
5. the jobs are pushed to their Redis queues. If Redis is down the jobs are still
   durably queued and the reconciler pushes them later; the submit succeeds.

Before any of it, the caller's API key must allow the request: a priority it names
lies in the key's granted range (else 403 ``priority_not_allowed``), and the key's
submits per minute are not used up (else 429 ``rate_limited``, counted on Redis by
:mod:`hypermedia.ratelimit`; a batch counts one per request).

An idempotency key makes a retried submit return the jobs of the first one
(``replayed=True``), whatever the key's rate meanwhile: a replay is neither checked
against the key's grants nor counted; the same key with a different request is a
``conflict``.
A job's reservation is released when it ends: when it completes, its actual cost
(at most the reservation) is charged; when it fails or is cancelled, nothing is
(:mod:`hypermedia.jobs.credits`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import unicodedata
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy import Connection, Engine, Executable, String, bindparam, func, select
from sqlalchemy.exc import IntegrityError

from hypermedia.accounts import UNLIMITED, Caller, KeyGrants, key_in_force
from hypermedia.clock import Clock, SystemClock
from hypermedia.db import tables as t
from hypermedia.db.conflicts import rerun_on_conflict
from hypermedia.db.engine import snapshot, statements, transaction
from hypermedia.errors import (
    AuthenticationFailed,
    CallbackNotAllowed,
    IdempotencyKeyReused,
    IllegalTransition,
    InputRejected,
    InputTooLarge,
    InvalidParams,
    InvalidRequest,
    NotFound,
    PriorityNotAllowed,
    QueueUnavailable,
    UnknownOperation,
)
from hypermedia.ids import new_id
from hypermedia.ingest.fields import IDEMPOTENCY_KEY_RULE, IdempotencyKey, Text, json_problem
from hypermedia.jobs import callbacks
from hypermedia.jobs import statements as sql
from hypermedia.jobs.catalog import ProfileCatalog, ProfileRecord
from hypermedia.jobs.repository import JobRepository, NewJob, NewSubmission, enqueue_new
from hypermedia.jobs.states import IN_FLIGHT, JobStatus
from hypermedia.metrics import JOBS_SUBMITTED, NoMetrics, Recorder
from hypermedia.objects import quota_exceeded, usable_by
from hypermedia.queue.events import JobEvents, status_event
from hypermedia.queue.redis_queue import RedisQueue
from hypermedia.ratelimit import RateLimiter
from hypermedia.sandbox.inspect import InputLimits, Inspection, check_operation

log = logging.getLogger(__name__)

MAX_PARAMS_BYTES = 8192
LIMIT_PREFIX = "max_"


class SubmitRequest(BaseModel):
    """What to do with which object."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    object_id: Text = Field(min_length=1, max_length=64)
    operations: list[Text] = Field(min_length=1, max_length=32)
    priority: int | None = Field(default=None, ge=1, le=10)
    params: dict[str, dict[str, Any]] = Field(default_factory=dict)
    idempotency_key: IdempotencyKey | None = Field(
        default=None, min_length=1, max_length=200, description=f"{IDEMPOTENCY_KEY_RULE}."
    )
    callback_url: Text | None = Field(
        default=None,
        max_length=2048,
        description="POSTed each job, signed, once it is completed, failed or cancelled "
        "(`X-Hypermedia-Signature`). Its host must be one the server allows "
        "(`callback_hosts`), else 422 `callback_not_allowed`.",
    )

    @field_validator("operations")
    @classmethod
    def _unique(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("operations must not repeat")
        return value

    @field_validator("params")
    @classmethod
    def _small(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        if len(json.dumps(value, allow_nan=True)) > MAX_PARAMS_BYTES:
            raise ValueError(f"params must serialize to at most {MAX_PARAMS_BYTES} bytes")
        # NaN, Infinity, NUL and lone surrogates: JSON the record cannot store.
        problem = json_problem(value, "params")
        if problem is not None:
            raise ValueError(problem)
        for operation, params in value.items():
            limits = sorted(k for k in params if k.startswith(LIMIT_PREFIX))
            if limits:
                # Limits (max_pixels, max_frames ...) are the operator's, set in the
                # profile; a request may not raise them.
                raise ValueError(
                    f"params.{operation}.{limits[0]}: limits come from the profile, not the request"
                )
        return value

    @field_validator("callback_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None:
            callback_target(value)
        return value

    def fingerprint(self) -> str:
        body = self.model_dump(exclude={"idempotency_key"})
        if body["callback_url"] is None:  # as requests hashed before callbacks existed
            del body["callback_url"]
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def callback_target(url: str) -> tuple[str, int]:
    """A callback URL's host (lower case, an IPv6 address without brackets) and port;
    ValueError for anything but a plain http(s) URL (no credentials, no fragment, no
    control character: ``urlsplit`` drops a tab or a newline where the HTTP client
    refuses the URL)."""
    for index, char in enumerate(url):
        if unicodedata.category(char) == "Cc":
            raise ValueError(f"must not contain control characters ({char!r} at {index})")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("expected an http:// or https:// URL with a host")
    if parts.username is not None or parts.password is not None:
        raise ValueError("must not carry credentials (user:password@)")
    if parts.fragment:
        raise ValueError("must not have a fragment (#...)")
    try:
        port = parts.port
    except ValueError:
        raise ValueError("has an invalid port") from None
    return _host_name(parts.hostname), port or (443 if parts.scheme == "https" else 80)


def _host_name(host: str) -> str:
    """``host`` as the allowlist compares it: lower case, a name in its ASCII (IDNA)
    form as the HTTP client connects to it (``bücher.example`` is
    ``xn--bcher-kva.example``), without the root's trailing dot (``hooks.example.`` is
    ``hooks.example``, the same name in DNS). ValueError if it has no IDNA form."""
    host = host.lower()
    if not host.isascii():
        import httpx

        try:
            host = httpx.URL(f"http://{host}/").raw_host.decode("ascii").lower()
        except (httpx.InvalidURL, UnicodeError):
            raise ValueError(f"has a host with no IDNA form ({host!r})") from None
    return host[:-1] if host.endswith(".") and not host.endswith("..") else host


def callback_allowed(url: str, hosts: Collection[str]) -> bool:
    """Whether ``url``'s host is one of ``hosts`` (the settings' ``callback_hosts``:
    ``host`` allows any port, ``host:port`` that one)."""
    host, port = callback_target(url)
    for entry in hosts:
        allowed = urlsplit(f"//{entry}")
        try:
            name = _host_name(allowed.hostname or "")
        except ValueError:
            continue  # a name no URL can carry allows nothing
        if name == host and allowed.port in (None, port):
            return True
    return False


def registered_operations() -> Collection[str]:
    """The operations some pipeline step implements (imports the pipeline modules once)."""
    import pipelines.registry

    return pipelines.registry.operations()


def runnable_profile(
    catalog: ProfileCatalog, operation: str, implemented: Collection[str]
) -> ProfileRecord:
    """``operation``'s active profile, if something here runs it: else 422
    ``unknown_operation`` (no profile, no pipeline step, or no worker for its queue),
    the operations accepted in its details. Submits and bulk runs ask it alike."""
    profile = catalog.get(operation)
    if operation not in implemented:
        if operation in registered_operations():  # a step, but nothing runs it
            why = f"no worker here runs the {profile.queue!r} queue"
        else:
            why = "no pipeline step implements it yet"
        raise UnknownOperation(
            f"{operation!r} is not accepted: {why}",
            operation=operation,
            implemented=sorted(set(implemented) & set(catalog.operations())),
        )
    return profile


def check_params(
    operation: str, profile_params: Mapping[str, Any], request_params: Mapping[str, Any]
) -> None:
    """Refuse (422 ``invalid_params``) a parameter only the profile may set (``ocr``'s
    ``paddle_models``: paths on the worker), and what the operation's step would refuse
    of its parameters, where the step registered a check (``ocr``: an unknown language)."""
    import pipelines.registry

    reserved = sorted(pipelines.registry.profile_only(operation) & set(request_params))
    if reserved:
        raise InvalidParams(
            f"params.{operation}.{reserved[0]}: set by the operator in the profile,"
            " not by a request",
            operation=operation,
        )
    try:
        pipelines.registry.check(operation, {**profile_params, **request_params})
    except pipelines.registry.PipelineError as exc:
        raise InvalidParams(exc.message, operation=operation) from exc


@dataclass(frozen=True, slots=True)
class SubmittedJob:
    job_id: str
    operation: str
    queue: str
    priority: int
    estimated_millicredits: int
    # What the submit holds: the estimate plus the most its step's priced units of work
    # may cost (ocr: escalations); the most the job may be charged.
    reserved_millicredits: int


@dataclass(frozen=True, slots=True)
class SubmitResult:
    submission_id: str
    jobs: list[SubmittedJob]
    estimated_millicredits: int
    reserved_millicredits: int
    replayed: bool = False

    @property
    def job_ids(self) -> list[str]:
        return [j.job_id for j in self.jobs]


@dataclass(frozen=True, slots=True)
class AttemptView:
    attempt_number: int
    worker_id: str
    status: str
    error_code: str | None
    error_message: str | None
    started_at: datetime
    finished_at: datetime | None
    duration_ms: int | None
    peak_memory_mb: float | None
    has_log: bool = False  # the end of its child's output is kept (a failed attempt)
    units: dict[str, int] | None = None  # the step's units of work (ocr: escalations)


@dataclass(frozen=True, slots=True)
class OutputView:
    output_type: str
    profile_version: int
    storage_key: str
    size_bytes: int
    content_type: str | None
    object_id: str | None


@dataclass(frozen=True, slots=True)
class JobView:
    job_id: str
    submission_id: str
    object_id: str
    operation: str
    queue: str
    priority: int
    status: str
    cancel_requested: bool
    attempt_count: int
    max_attempts: int
    estimated_millicredits: int
    reserved_millicredits: int
    actual_millicredits: int | None
    error_code: str | None
    error_message: str | None
    created_at: datetime
    queued_at: datetime | None
    started_at: datetime | None
    completed_at: datetime | None
    run_after: datetime | None
    attempts: list[AttemptView] = field(default_factory=list)
    outputs: list[OutputView] = field(default_factory=list)
    callback_url: str | None = None
    callback: CallbackView | None = None  # its terminal event's delivery, once it ended
    # The time limit its child runs under, seconds: its own, worked out at submit (its
    # pages), else (a job from before 0021) its profile's; None when neither is known.
    timeout_seconds: int | None = None


@dataclass(frozen=True, slots=True)
class CallbackView:
    """The delivery of a job's terminal event to its ``callback_url``."""

    event_id: str
    event: str
    status: str  # pending | delivered | failed
    attempts: int
    next_attempt_at: datetime | None
    last_attempt_at: datetime | None
    response_code: int | None
    last_error: str | None
    delivered_at: datetime | None


@dataclass(frozen=True, slots=True)
class QueueStats:
    queue: str
    queued: int
    in_flight: int
    retry_wait: int
    oldest_queued_at: datetime | None
    oldest_age_seconds: float | None
    redis_ready: int | None
    redis_leased: int | None
    redis_delayed: int | None


@dataclass(frozen=True, slots=True)
class _Object:
    pool_id: str
    size_bytes: int
    inspection: Inspection | None


def _usable_objects(dialect: str) -> Executable:
    """The objects of ``ids`` the user ``b_user`` may use, with what a submit checks,
    and the user's stored bytes (the storage quota), in the same statement."""
    o = t.objects.c
    user = bindparam("b_user", type_=String)
    stored = select(t.users.c.stored_bytes).where(t.users.c.user_id == user).scalar_subquery()
    return select(
        o.object_id, o.pool_id, o.size_bytes, o.inspection, stored.label("stored_bytes")
    ).where(sql.ids_match(o.object_id, dialect), usable_by(user))


# Built once: every submit under an idempotency key (the HTTP client sends one with
# each) looks its key up.
_KEYED_SUBMISSIONS = select(t.submissions).where(
    t.submissions.c.user_id == bindparam("r_user", type_=String),
    t.submissions.c.idempotency_key.in_(bindparam("r_keys", expanding=True)),
)


class IngestService:
    def __init__(
        self,
        engine: Engine,
        queue: RedisQueue,
        catalog: ProfileCatalog,
        clock: Clock | None = None,
        repository: JobRepository | None = None,
        implemented: Callable[[], Collection[str]] = registered_operations,
        limiter: RateLimiter | None = None,
        key_defaults: KeyGrants = UNLIMITED,
        metrics: Recorder | None = None,
        callback_hosts: Collection[str] = (),
        storage_quota_bytes: int | None = None,
    ) -> None:
        self.engine = engine
        # A user (not an operator) who stores this much already starts no job: its
        # outputs would be stored on top (None: no quota).
        self.storage_quota_bytes = storage_quota_bytes
        self.metrics: Recorder = metrics or NoMetrics()
        self.callback_hosts = tuple(callback_hosts)
        self.events = JobEvents(queue.client, queue.prefix)
        self.queue = queue
        self.catalog = catalog
        self.clock = clock or SystemClock()
        self.repository = repository or JobRepository()
        self.implemented = implemented
        self.limiter = limiter
        self.key_defaults = key_defaults
        self._input_limits: dict[int, InputLimits] = {}
        self._statements = sql.StatementCache()

    # -- submit -------------------------------------------------------------------

    def submit(self, caller: Caller, request: SubmitRequest) -> SubmitResult:
        return self.submit_many(caller, [request])[0]

    def submit_many(self, caller: Caller, requests: Sequence[SubmitRequest]) -> list[SubmitResult]:
        """Submit several requests in one transaction: all are accepted or none."""
        implemented = self.implemented()
        for request in requests:
            for operation in request.operations:
                profile = runnable_profile(self.catalog, operation, implemented)
                check_params(operation, profile.params, request.params.get(operation, {}))
            unknown = set(request.params) - set(request.operations)
            if unknown:
                raise InvalidRequest(
                    f"params given for operations not requested: {sorted(unknown)}"
                )
            url = request.callback_url
            if url is not None and not callback_allowed(url, self.callback_hosts):
                host, port = callback_target(url)
                # An IPv6 address in brackets, as a URL and callback_hosts write it:
                # "::1:9000" reads as another address, with no port.
                shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
                raise CallbackNotAllowed(
                    f"callback_url: {shown} is not a host this server sends callbacks "
                    "to (the operator allows them in callback_hosts)",
                    host=host,
                    port=port,
                )
        try:
            results, fresh = self._submit_transaction(caller, requests)
        except IntegrityError:
            # A concurrent submit with the same idempotency key won: replay it.
            results, fresh = self._submit_transaction(caller, requests)
        enqueue_new(self.queue, fresh, action="enqueue_deferred")
        for result in results:
            if not result.replayed:
                for job in result.jobs:
                    self.metrics.count(
                        JOBS_SUBMITTED, {"queue": job.queue, "operation": job.operation}
                    )
        return results

    def _check_grants(self, caller: Caller, requests: Sequence[SubmitRequest]) -> None:
        """The API key's priority range (a priority the request names; without one the
        profile's default, the operator's own choice, applies) and submit rate."""
        grants = caller.grants.resolved(self.key_defaults)
        low, high = grants.priority_min or 1, grants.priority_max or 10
        for request in requests:
            if request.priority is not None and not low <= request.priority <= high:
                raise PriorityNotAllowed(
                    f"this API key may submit at priority {low}-{high}, not {request.priority}"
                    " (the operator grants more with `hypermedia user grant`)",
                    priority=request.priority,
                    allowed_min=low,
                    allowed_max=high,
                )
        if self.limiter is not None and requests:
            identity = caller.key_id or f"user-{caller.user_id}"
            self.limiter.hit("submit", identity, grants.submits_per_minute or 0, len(requests))

    def _submit_transaction(
        self, caller: Caller, requests: Sequence[SubmitRequest]
    ) -> tuple[list[SubmitResult], list[NewJob]]:
        now = self.clock.now()
        # The writes are one statement on PostgreSQL (JobRepository.create): the reads
        # before it need no transaction of their own.
        replays: dict[int, SubmitResult] = {}
        if any(r.idempotency_key for r in requests):
            with statements(self.engine) as conn:
                replays = self._replays(conn, caller, requests)
        # A retry that replays an earlier submit is answered as the first was: the key's
        # grants (its rate above all) apply to what the others would create. Asked of
        # Redis between connections: SQLite's write lock is not held meanwhile.
        self._check_grants(caller, [r for i, r in enumerate(requests) if i not in replays])

        def record() -> list[NewSubmission]:
            with statements(self.engine) as conn:
                objects, used = self._objects(
                    conn, caller, {r.object_id for i, r in enumerate(requests) if i not in replays}
                )
                quota = None if caller.is_operator else self.storage_quota_bytes
                if quota is not None and objects and used >= quota:
                    raise quota_exceeded(quota, used, None)
                planned = [
                    self._plan(request, objects[request.object_id])
                    for index, request in enumerate(requests)
                    if index not in replays
                ]
                self.repository.create(conn, caller.user_id, planned, now)
            return planned

        # Run again whole if PostgreSQL aborts it in a deadlock with a concurrent delete
        # or submit: nothing of it was kept, and nothing was sent to Redis yet.
        planned = rerun_on_conflict(record, what="submit")
        results: list[SubmitResult] = []
        fresh: list[NewJob] = []
        planned_iter = iter(planned)
        for index in range(len(requests)):
            if index in replays:
                results.append(replays[index])
                continue
            p = next(planned_iter)
            fresh.extend(p.jobs)
            results.append(
                SubmitResult(
                    submission_id=p.submission_id,
                    jobs=[
                        SubmittedJob(
                            j.job_id,
                            j.operation,
                            j.queue,
                            j.priority,
                            j.estimated_millicredits,
                            j.reserved_millicredits,
                        )
                        for j in p.jobs
                    ],
                    estimated_millicredits=p.estimated_millicredits,
                    reserved_millicredits=p.reserved_millicredits,
                )
            )
        return results, fresh

    def _replays(
        self, conn: Connection, caller: Caller, requests: Sequence[SubmitRequest]
    ) -> dict[int, SubmitResult]:
        keyed = {r.idempotency_key: i for i, r in enumerate(requests) if r.idempotency_key}
        if not keyed:
            return {}
        rows = conn.execute(
            _KEYED_SUBMISSIONS, {"r_user": caller.user_id, "r_keys": list(keyed)}
        ).all()
        replays: dict[int, SubmitResult] = {}
        for row in rows:
            index = keyed[row.idempotency_key]
            if row.request_hash != requests[index].fingerprint():
                raise IdempotencyKeyReused(
                    "idempotency key already used for a different request: nothing was "
                    "submitted; send this request under a new key",
                    idempotency_key=row.idempotency_key,
                )
            jobs = conn.execute(
                select(
                    t.jobs.c.job_id,
                    t.jobs.c.operation,
                    t.jobs.c.queue,
                    t.jobs.c.priority,
                    t.jobs.c.estimated_millicredits,
                    t.jobs.c.reserved_millicredits,
                )
                .where(t.jobs.c.submission_id == row.submission_id)
                .order_by(t.jobs.c.job_id)
            ).all()
            replays[index] = SubmitResult(
                submission_id=row.submission_id,
                jobs=[SubmittedJob(*j) for j in jobs],
                estimated_millicredits=row.estimated_millicredits,
                reserved_millicredits=sum(j.reserved_millicredits for j in jobs),
                replayed=True,
            )
        return replays

    def _objects(
        self, conn: Connection, caller: Caller, object_ids: set[str]
    ) -> tuple[dict[str, _Object], int]:
        """The objects ``caller`` may use, by id, and the caller's stored bytes."""
        if not object_ids:
            return {}, 0
        rows = conn.execute(
            self._statements.get(conn, ("objects",), _usable_objects),
            {"ids": sql.ids_param(conn, object_ids), "b_user": caller.user_id},
        ).all()
        found = {
            r.object_id: _Object(
                r.pool_id,
                int(r.size_bytes),
                None if r.inspection is None else Inspection.from_dict(r.inspection),
            )
            for r in rows
        }
        missing = sorted(object_ids - set(found))
        if missing:
            raise NotFound(f"no object {missing[0]!r}", object_id=missing[0])
        return found, int(rows[0].stored_bytes or 0)

    def _plan(self, request: SubmitRequest, obj: _Object) -> NewSubmission:
        size = obj.size_bytes
        jobs: list[NewJob] = []
        submission_id = new_id()
        for operation in request.operations:
            profile = self.catalog.get(operation)
            if size > profile.max_input_bytes:
                raise InputTooLarge(
                    f"object is {size} bytes; {operation} accepts at most "
                    f"{profile.max_input_bytes}",
                    object_id=request.object_id,
                    operation=operation,
                )
            if obj.inspection is not None:
                try:
                    check_operation(
                        obj.inspection, operation, profile.accepts, self._limits(profile)
                    )
                except InputRejected as exc:
                    exc.details["object_id"] = request.object_id
                    raise
            params = {**profile.params, **request.params.get(operation, {})}
            try:
                timeout = profile.job_timeout_seconds(params, obj.inspection)
            except InputRejected as exc:
                exc.details["object_id"] = request.object_id
                raise
            estimate = profile.estimate_millicredits(size)
            jobs.append(
                NewJob(
                    job_id=new_id(),
                    submission_id=submission_id,
                    object_id=request.object_id,
                    profile_id=profile.profile_id,
                    operation=operation,
                    queue=profile.queue,
                    priority=request.priority or profile.default_priority,
                    params=params,
                    estimated_millicredits=estimate,
                    reserved_millicredits=profile.reserve_millicredits(
                        estimate, params, obj.inspection
                    ),
                    max_attempts=profile.max_attempts,
                    callback_url=request.callback_url,
                    timeout_seconds=timeout,
                )
            )
        return NewSubmission(
            submission_id, request.idempotency_key, request.fingerprint(), tuple(jobs)
        )

    def _limits(self, profile: ProfileRecord) -> InputLimits:
        limits = self._input_limits.get(profile.profile_id)
        if limits is None:
            limits = InputLimits.from_dict(profile.input_limits)
            self._input_limits[profile.profile_id] = limits
        return limits

    # -- read and cancel --------------------------------------------------------------

    def get_job(self, caller: Caller, job_id: str) -> JobView:
        """The caller's job (NotFound for anyone else's, as for one that does not exist)."""
        with snapshot(self.engine) as conn:
            view = job_view(conn, job_id, caller.user_id)
        if view is None:
            raise NotFound(f"no job {job_id!r}", job_id=job_id)
        return view

    def job(self, job_id: str) -> JobView | None:
        """Any user's job, for what the platform itself tells its owner (callbacks)."""
        with snapshot(self.engine) as conn:
            return job_view(conn, job_id)

    def status_event(self, caller: Caller, job_id: str) -> dict[str, Any]:
        """The caller's job's status as the record has it, shaped as a status event
        (:mod:`hypermedia.queue.events`, with ``"record": true``); NotFound for anyone
        else's job; AuthenticationFailed once the caller's API key is revoked (its
        authentication may be cached: a stream opened before the revocation ends at its
        next keep-alive). One small query: event streams call it at every keep-alive."""
        j = t.jobs.c
        with snapshot(self.engine) as conn:
            row = conn.execute(
                select(
                    j.status,
                    j.attempt_count,
                    j.error_code,
                    j.run_after,
                    j.updated_at,
                    key_in_force(caller).label("key_in_force"),
                ).where(j.job_id == job_id, j.user_id == caller.user_id)
            ).one_or_none()
        if row is not None and not row.key_in_force:
            raise AuthenticationFailed("invalid API key")
        if row is None:
            raise NotFound(f"no job {job_id!r}", job_id=job_id)
        return status_event(
            row.status,
            row.updated_at.timestamp(),
            row.attempt_count or None,
            error_code=row.error_code,
            retry_at=None if row.run_after is None else row.run_after.timestamp(),
            record=True,
        )

    def attempt_log(self, caller: Caller, job_id: str, attempt_number: int) -> str:
        """The end of what the child of a failed attempt printed (NotFound: no such job
        of the caller's, no such attempt, or none kept)."""
        with snapshot(self.engine) as conn:
            log = conn.execute(
                select(t.attempts.c.log_tail)
                .join(t.jobs, t.jobs.c.job_id == t.attempts.c.job_id)
                .where(
                    t.jobs.c.job_id == job_id,
                    t.jobs.c.user_id == caller.user_id,
                    t.attempts.c.attempt_number == attempt_number,
                )
            ).scalar_one_or_none()
        if log is None:
            raise NotFound(
                f"no log kept for attempt {attempt_number} of job {job_id!r}",
                job_id=job_id,
                attempt_number=attempt_number,
            )
        return str(log)

    def cancel(self, caller: Caller, job_id: str) -> JobStatus:
        """Cancel a job: answers CANCELLED, or the in-flight status with cancel requested."""
        now = self.clock.now()

        def cancelling() -> tuple[Any, JobStatus | None]:
            with transaction(self.engine) as conn:
                found = conn.execute(
                    select(t.jobs.c.queue, t.jobs.c.status).where(
                        t.jobs.c.job_id == job_id, t.jobs.c.user_id == caller.user_id
                    )
                ).one_or_none()
                return found, self.repository.cancel(conn, job_id, caller.user_id, now)

        # Run again whole if PostgreSQL aborts it in a deadlock (with a completion, a
        # delete): Redis and the job's followers hear of it only after its commit.
        found, status = rerun_on_conflict(cancelling, what="cancel")
        if status is None or found is None:
            raise NotFound(f"no job {job_id!r}", job_id=job_id)
        queue = found.queue
        if status is JobStatus.CANCELLED and found.status == JobStatus.CANCELLED.value:
            return status  # cancelled before: its end was published then
        if status is JobStatus.CANCELLED:
            try:
                self.queue.remove(queue, [job_id])
            except QueueUnavailable:
                log.warning("redis unavailable; reconciler will drop %s", job_id)
            self.events.publish(job_id, status_event(status.value, now))
            return status
        if status in IN_FLIGHT:
            return status
        raise IllegalTransition(
            f"job is already {status.value}", job_id=job_id, status=status.value
        )

    # -- operators ------------------------------------------------------------------

    def queue_overview(self) -> list[QueueStats]:
        now = self.clock.now()
        with snapshot(self.engine) as conn:  # a read: on SQLite it holds up no writer
            rows = conn.execute(
                select(
                    t.jobs.c.queue,
                    t.jobs.c.status,
                    func.count(),
                    func.min(t.jobs.c.queued_at),
                )
                .where(
                    t.jobs.c.status.in_(
                        [
                            JobStatus.QUEUED.value,
                            JobStatus.CLAIMED.value,
                            JobStatus.PROCESSING.value,
                            JobStatus.RETRY_WAIT.value,
                        ]
                    )
                )
                .group_by(t.jobs.c.queue, t.jobs.c.status)
            ).all()
        counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        oldest: dict[str, datetime] = {}
        for queue, status, count, first in rows:
            counts[queue][status] += count
            if status == JobStatus.QUEUED.value and first is not None:
                # min() over a UTC column comes back naive on SQLite.
                oldest[queue] = first if first.tzinfo else first.replace(tzinfo=UTC)
        stats = []
        for queue in self.queue.queues:
            c = counts.get(queue, {})
            try:
                redis_counts = self.queue.counts(queue)
            except QueueUnavailable:
                redis_counts = None
            first = oldest.get(queue)
            stats.append(
                QueueStats(
                    queue=queue,
                    queued=c.get("queued", 0),
                    in_flight=c.get("claimed", 0) + c.get("processing", 0),
                    retry_wait=c.get("retry_wait", 0),
                    oldest_queued_at=first,
                    oldest_age_seconds=None if first is None else max(0.0, now - first.timestamp()),
                    redis_ready=None if redis_counts is None else redis_counts.ready,
                    redis_leased=None if redis_counts is None else redis_counts.leased,
                    redis_delayed=None if redis_counts is None else redis_counts.delayed,
                )
            )
        return stats


_NOT_COLUMNS = ("attempts", "outputs", "callback", "timeout_seconds")


def job_view(conn: Connection, job_id: str, user_id: str | None = None) -> JobView | None:
    """A job with its attempts, outputs and callback delivery (None: no such job, or
    not ``user_id``'s when given)."""
    conds = [t.jobs.c.job_id == job_id]
    if user_id is not None:
        conds.append(t.jobs.c.user_id == user_id)
    row = conn.execute(select(t.jobs).where(*conds)).first()
    if row is None:
        return None
    a = t.attempts.c
    attempts = conn.execute(
        select(
            *(a[name] for name in AttemptView.__dataclass_fields__ if name != "has_log"),
            a.log_tail.is_not(None).label("has_log"),
        )
        .where(a.job_id == job_id)
        .order_by(a.attempt_number)
    ).all()
    outputs = conn.execute(
        select(t.outputs).where(t.outputs.c.job_id == job_id).order_by(t.outputs.c.output_id)
    ).all()
    callback = callbacks.of_job(conn, job_id) if row.callback_url else None
    sent = None
    if callback is not None:
        sent = CallbackView(**{k: callback._mapping[k] for k in CallbackView.__dataclass_fields__})
    elif row.callback_status is not None:  # the outbox's row pruned: what it came to
        sent = CallbackView(
            event_id=callbacks.event_id(job_id, row.status),
            event=row.status,
            status=row.callback_status,
            attempts=row.callback_attempts,
            next_attempt_at=None,
            last_attempt_at=None,
            response_code=None,
            last_error=None,
            delivered_at=None,
        )
    m = row._mapping
    timeout = row.timeout_seconds
    if timeout is None:  # a job from before its time was kept on it: its profile's
        timeout = conn.execute(
            select(t.profiles.c.timeout_seconds).where(t.profiles.c.profile_id == row.profile_id)
        ).scalar_one_or_none()
    return JobView(
        **{k: m[k] for k in JobView.__dataclass_fields__ if k not in _NOT_COLUMNS},
        attempts=[
            AttemptView(**{k: a._mapping[k] for k in AttemptView.__dataclass_fields__})
            for a in attempts
        ],
        outputs=[
            OutputView(**{k: o._mapping[k] for k in OutputView.__dataclass_fields__})
            for o in outputs
        ],
        callback=sent,
        timeout_seconds=timeout,
    )
