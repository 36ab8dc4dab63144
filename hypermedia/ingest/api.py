"""The HTTP API: ``create_app(stack)`` builds a FastAPI app over a :class:`Stack`.

There is no module-level app: ``hypermedia serve`` builds the stack from
settings and hands the app to uvicorn; tests build their own.

Every route but ``/healthz`` and the blob routes needs ``Authorization: Bearer
hm_...`` (401 otherwise), checked before the body is read (``/metrics``, the head's
Prometheus metrics, an operator's key); a body over its route's
limit answers 413 unread (``max_json_body_bytes``, uploads ``max_upload_bytes``; see
:mod:`hypermedia.ingest.guard`). The blob routes serve the local storage's signed URLs
(:mod:`hypermedia.storage.signing`): the signature is their credential, a bad or
expired one answers 403 ``invalid_signature`` / ``url_expired``.

A caller sees, cancels and submits only for their own jobs and the
objects of their pools; any other id answers 404, exactly as an id that does
not exist. Errors are ``{"error": {"code", "message", "details"?}}`` with the
status of the :mod:`hypermedia.errors` class; a malformed request is 422
``invalid_request`` naming the fields; anything unexpected is 500 ``internal``
with no trace in the body (it goes to the log).

Authentications are cached in memory for ``auth_cache_seconds`` (30 s by
default; see :mod:`hypermedia.ingest.auth`): a revoked key stops working within
that time.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Generator
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from email.utils import formatdate
from types import UnionType
from typing import Annotated, Any, BinaryIO, Literal, TypeVar, Union, cast, get_args, get_origin

import anyio
from fastapi import APIRouter, Depends, FastAPI, Header, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import AfterValidator, BaseModel
from sqlalchemy import text
from starlette.types import Receive, Scope, Send

from hypermedia import __version__
from hypermedia.accounts import Caller, balance
from hypermedia.bulk.runs import MAX_PAGE as BULK_MAX_PAGE
from hypermedia.bulk.runs import RunChange, RunSpec
from hypermedia.bulk.service import BulkService
from hypermedia.config import Settings
from hypermedia.db.engine import snapshot
from hypermedia.errors import (
    AuthenticationFailed,
    Forbidden,
    InputTooLarge,
    InvalidRequest,
    NotFound,
    RangeNotSatisfiable,
)
from hypermedia.ids import new_id
from hypermedia.ingest import (
    docs,
    downloads,
    events,
    fields,
    openapi,
    queries,
    ranges,
    uploads,
)
from hypermedia.ingest.auth import Authenticator
from hypermedia.ingest.guard import RequestGuard, RouteRule, Rules
from hypermedia.ingest.http_errors import error_response, install_error_handlers
from hypermedia.ingest.inspection import InspectionBudget, InspectionRunner
from hypermedia.ingest.schemas import (
    AttemptLogResponse,
    BulkEstimateOut,
    BulkRunOut,
    BulkRunsResponse,
    CancelResponse,
    CreditsResponse,
    DeleteObjectResponse,
    ErrorBody,
    ErrorResponse,
    HealthResponse,
    JobResponse,
    JobsPage,
    JobStatusName,
    ObjectResponse,
    OutputUrlResponse,
    ProcessResponse,
    QueueOut,
    QueuesResponse,
    RedisCounts,
    RegisterRequest,
    SubmissionResponse,
    SubmittedJobOut,
    credits,
    job_response,
    job_summary,
)
from hypermedia.ingest.service import SubmitRequest, SubmitResult
from hypermedia.ingest.subscriber import EventSubscriber
from hypermedia.jobs.states import IN_FLIGHT
from hypermedia.objects import ObjectInfo, get_object, quota_exceeded, storage_used
from hypermedia.sandbox.inspect import Inspection, refusal
from hypermedia.stack import Stack
from hypermedia.storage.base import (
    DEFAULT_CONTENT_TYPE,
    InvalidSignature,
    Storage,
    StoredBlob,
    original_key,
    scripted,
)
from hypermedia.storage.local import LocalStorage
from hypermedia.zero_copy import ZERO_COPY_SEND

log = logging.getLogger(__name__)
_T = TypeVar("_T")

PREFIX = "/v1/hypermedia"
METRICS_PATH = "/metrics"  # where Prometheus looks by default

_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="ApiKey",
    description="An API key from `hypermedia user add`: `Authorization: Bearer hm_...`.",
)


_RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds to wait before trying again.",
        "schema": {"type": "integer"},
    }
}


def _error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The errors ``statuses`` as the handlers answer them (ErrorResponse; a 429, a 503
    and a 507 with ``Retry-After``)."""
    return {
        status: {
            "model": ErrorResponse,
            **({"headers": _RETRY_AFTER} if status in (429, 503, 507) else {}),
        }
        for status in statuses
    }


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """A keyed route's errors: ``statuses``, 401, 422 (a malformed request) and 503 (the
    key is checked in the database first: while it is down, every keyed route is 503)."""
    return _error_responses(*statuses, 401, 422, 503)


# -- dependencies -----------------------------------------------------------------------


async def _stack(request: Request) -> Stack:
    # async: FastAPI runs a plain ``def`` dependency in its thread pool, a hand-off to
    # another thread and back on every request for one attribute read.
    return cast(Stack, request.app.state.stack)


async def _caller(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Caller:
    # The guard authenticated the request before its body was read (see .guard).
    caller = getattr(request.state, "caller", None)
    if isinstance(caller, Caller):
        return caller
    if credentials is None:
        raise AuthenticationFailed("missing API key: send Authorization: Bearer hm_...")
    authenticator = cast(Authenticator, request.app.state.authenticator)
    return await run_in_threadpool(authenticator, credentials.credentials)


def _inspector(request: Request) -> uploads.Inspector:
    return cast(InspectionRunner, request.app.state.inspector).inspect


StackDep = Annotated[Stack, Depends(_stack)]
CallerDep = Annotated[Caller, Depends(_caller)]

# What a path may name (see .fields): an id the platform made matches its pattern; an
# object id (a web tier may register its own) or an output type is text without NUL.
JobId = Annotated[str, Path(pattern=fields.ID_PATTERN, description="A job id.")]
SubmissionId = Annotated[str, Path(pattern=fields.ID_PATTERN)]
RunId = Annotated[str, Path(pattern=fields.ID_PATTERN)]
ObjectId = Annotated[fields.Text, Path(min_length=1, max_length=64)]
OutputType = Annotated[fields.Text, Path(min_length=1, max_length=64)]
# An attempt's number is a 32-bit integer in the record.
AttemptNumber = Annotated[int, Path(ge=1, le=2**31 - 1)]
CreatedTime = Annotated[
    datetime | None,
    Query(description="An ISO 8601 time with its zone (`Z`, `+02:00`), not a number."),
    fields.WrittenTime,
    AfterValidator(lambda moment: None if moment is None else _in_utc(moment)),
]


async def _checked_query(request: Request) -> None:
    """422 naming the query parameter whose bytes are not UTF-8 (Starlette would hand
    the route U+FFFD in their place: a file name stored as nobody gave it), or that is
    given twice with different values where the route takes one (Starlette takes the
    last: ``limit=1&limit=500`` was 500)."""
    found = fields.undecodable_query(request.scope.get("query_string", b""))
    if found is not None:
        name, why = found
        raise RequestValidationError(
            [{"type": "string_unicode", "loc": ("query", name), "msg": why, "input": None}]
        )
    pairs = request.query_params.multi_items()
    if len(pairs) > 1:
        route = request.scope.get("route")
        repeatable = _route_list_query_names(request, route) if isinstance(route, APIRoute) else ()
        repeated = fields.repeated_query(pairs, repeatable)
        if repeated is not None:
            values = [value[:40] for name, value in pairs if name == repeated]
            raise RequestValidationError(
                [
                    {
                        "type": "repeated",
                        "loc": ("query", repeated),
                        "msg": f"given {len(values)} times with different values "
                        f"{values[:5]}: give it once",
                        "input": None,
                    }
                ]
            )


def _route_list_query_names(request: Request, route: APIRoute) -> frozenset[str]:
    """:func:`_list_query_names` of ``route``, found once per route of the app: walking
    its dependencies took ~17 us a request (GET /jobs; ~40 us for the deepest route)."""
    found: dict[int, frozenset[str]] = request.app.state.list_query_names
    names = found.get(id(route))  # held as long as the app (by it or its router): ids stay
    if names is None:
        names = found[id(route)] = _list_query_names(route.dependant)
    return names


def _list_query_names(dependant: Dependant) -> frozenset[str]:
    """The query parameters a route takes as lists (``status``: repeat it)."""
    names = {
        param.alias for param in dependant.query_params if _is_list(param.field_info.annotation)
    }
    for sub in dependant.dependencies:
        names |= _list_query_names(sub)
    return frozenset(names)


def _is_list(annotation: Any) -> bool:
    if get_origin(annotation) in (Union, UnionType):
        return any(_is_list(arg) for arg in get_args(annotation))
    return get_origin(annotation) in (list, set, frozenset, tuple) or annotation in (list, set)


router = APIRouter(dependencies=[Depends(_checked_query)])


# -- jobs -------------------------------------------------------------------------------


@router.post(
    f"{PREFIX}/process",
    operation_id="submitJobs",
    status_code=202,
    summary="Submit processing jobs for an object",
    responses=_errors(400, 402, 403, 404, 409, 413, 415, 429, 503),
    tags=["jobs"],
)
def process(
    body: SubmitRequest,
    caller: CallerDep,
    stack: StackDep,
    idempotency_key: Annotated[
        fields.IdempotencyKey | None,
        Header(
            alias="Idempotency-Key",
            min_length=1,
            max_length=200,
            description="Same as the body's idempotency_key; a retry with the same key "
            "and body replays the first submit; another body under the key is 409 "
            f"`idempotency_key_reused`. {fields.IDEMPOTENCY_KEY_RULE} (else 422).",
        ),
    ] = None,
) -> ProcessResponse:
    """Estimate, reserve credits (402 when short: nothing is created), create and
    queue one job per operation."""
    if idempotency_key is not None:
        if body.idempotency_key not in (None, idempotency_key):
            raise InvalidRequest("the Idempotency-Key header and body idempotency_key differ")
        body = body.model_copy(update={"idempotency_key": idempotency_key})
    return _process_response(stack.ingest.submit(caller, body))


@router.get(
    f"{PREFIX}/jobs/{{job_id}}",
    operation_id="getJob",
    summary="A job's status, attempts, outputs and credits",
    responses=_errors(404),
    tags=["jobs"],
)
def get_job(job_id: JobId, caller: CallerDep, stack: StackDep) -> JobResponse:
    return job_response(stack.ingest.get_job(caller, job_id))


@router.get(
    f"{PREFIX}/jobs",
    operation_id="listJobs",
    summary="The caller's jobs, newest first, a page at a time",
    responses=_errors(),
    tags=["jobs"],
)
def list_jobs(
    caller: CallerDep,
    stack: StackDep,
    status: Annotated[
        list[JobStatusName] | None, Query(description="Only these statuses (repeat it).")
    ] = None,
    operation: Annotated[fields.Text | None, Query(max_length=64)] = None,
    object_id: Annotated[fields.Text | None, Query(max_length=64)] = None,
    submission_id: Annotated[str | None, Query(pattern=fields.ID_PATTERN)] = None,
    created_after: CreatedTime = None,
    created_before: CreatedTime = None,
    cursor: Annotated[
        str | None,
        Query(pattern=r"^[0-9a-f]{32}$", description="`next_cursor` of the page before."),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=queries.MAX_PAGE)] = 50,
) -> JobsPage:
    """Keyset pages: a page never shifts when jobs are created meanwhile, and the
    thousandth costs what the first does."""
    filters = queries.JobFilters(
        statuses=tuple(status or ()),
        operation=operation,
        object_id=object_id,
        submission_id=submission_id,
        created_after=created_after,
        created_before=created_before,
    )
    with snapshot(stack.engine) as conn:
        page = queries.list_jobs(conn, caller.user_id, filters, cursor=cursor, limit=limit)
    return JobsPage(jobs=[job_summary(row) for row in page.jobs], next_cursor=page.next_cursor)


def _in_utc(moment: datetime) -> datetime:
    """``moment`` in UTC, which the record compares it in (a ValueError: 422 naming the
    parameter, as for any other bad query parameter)."""
    if moment.tzinfo is None:
        raise ValueError("needs a time zone (e.g. Z or +00:00)")
    try:
        return moment.astimezone(UTC)
    except OverflowError:  # 9999-12-31T23:59:59-23:59 is in the year 10000 in UTC
        raise ValueError("is outside the years 1-9999 in UTC") from None


@router.get(
    f"{PREFIX}/submissions/{{submission_id}}",
    operation_id="getSubmission",
    summary="A submission and its jobs",
    responses=_errors(404),
    tags=["jobs"],
)
def get_submission(
    submission_id: SubmissionId, caller: CallerDep, stack: StackDep
) -> SubmissionResponse:
    with snapshot(stack.engine) as conn:
        found = queries.submission(conn, caller.user_id, submission_id)
    if found is None:
        raise NotFound(f"no submission {submission_id!r}", submission_id=submission_id)
    row, jobs = found
    return SubmissionResponse(
        submission_id=row.submission_id,
        idempotency_key=row.idempotency_key,
        estimated_credits=credits(row.estimated_millicredits),
        created_at=row.created_at,
        jobs=[job_summary(job) for job in jobs],
    )


@router.get(
    f"{PREFIX}/jobs/{{job_id}}/outputs/{{output_type}}/url",
    operation_id="getOutputUrl",
    summary="A short-lived URL to download one of a job's outputs",
    responses=_errors(404),
    tags=["jobs"],
)
def get_output_url(
    job_id: JobId, output_type: OutputType, caller: CallerDep, stack: StackDep
) -> OutputUrlResponse:
    """A GET URL signed for ``download_url_ttl_seconds`` (5 minutes by default): hand it
    to a browser; it needs no API key, answers the output's ``content_type`` and an
    ``ETag`` (``If-None-Match``: 304), and serves a ``Range`` of bytes (a ``<video>``
    seeks with them), on either storage backend. Its ``Content-Disposition`` names the
    file after the upload's (``report.docx``: ``report.pdf``; ``photo.jpg``:
    ``photo-thumbnail-320x320.webp``), ``inline`` for an image, a video, audio or a PDF
    (a browser shows them), ``attachment`` for the rest (see
    :mod:`hypermedia.ingest.downloads`)."""
    with snapshot(stack.engine) as conn:
        found = queries.output(conn, caller.user_id, job_id, output_type)
    if found is None:
        raise NotFound(
            f"job {job_id!r} has no output {output_type!r}", job_id=job_id, output_type=output_type
        )
    ttl = stack.settings.download_url_ttl_seconds
    return OutputUrlResponse(
        job_id=job_id,
        output_type=found.output_type,
        url=stack.storage.presign_get(
            found.storage_key,
            ttl,
            found.content_type,
            downloads.content_disposition(
                downloads.download_name(found.filename, found.output_type), found.content_type
            ),
        ),
        expires_at=datetime.fromtimestamp(stack.clock.now() + ttl, UTC),
        size_bytes=found.size_bytes,
        content_type=found.content_type,
    )


_EVENT_STREAM: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Server-Sent Events: `status` and `progress` events (see "
        "`hypermedia.ingest.events`), each with its id; the stream ends after a terminal "
        "status.",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    },
}


@router.get(
    f"{PREFIX}/jobs/{{job_id}}/events",
    operation_id="streamJobEvents",
    summary="A job's events, live (Server-Sent Events)",
    response_class=StreamingResponse,
    responses={**_EVENT_STREAM, **_errors(404, 429, 503)},
    tags=["jobs"],
)
async def job_events(
    job_id: JobId,
    request: Request,
    caller: CallerDep,
    stack: StackDep,
    last_event_id: Annotated[
        str | None,
        Header(
            alias="Last-Event-ID",
            pattern=fields.ENTRY_ID_PATTERN,
            description="Resume after this event (what an EventSource sends on reconnect).",
        ),
        AfterValidator(fields.entry_id),
    ] = None,
) -> StreamingResponse:
    """The job's recent events, its status as the record has it, then its events as
    they happen, until it has ended: status changes and progress (download, the step's
    own, upload)."""
    streams = cast(events.EventStreams, request.app.state.event_streams)
    slot = streams.take(caller)  # 429 / 503 before anything is read
    try:
        await run_in_threadpool(stack.ingest.status_event, caller, job_id)  # 404: not theirs
    except BaseException:
        slot.release()
        raise
    body = events.stream(
        cast(EventSubscriber, request.app.state.event_subscriber),
        stack.ingest.events.key(job_id),
        lambda: stack.ingest.status_event(caller, job_id),
        after=last_event_id,
        keepalive=request.app.state.events_keepalive,
    )
    return events.EventStreamResponse(
        body, slot=slot, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )


@router.get(
    f"{PREFIX}/jobs/{{job_id}}/attempts/{{attempt_number}}/log",
    operation_id="getAttemptLog",
    summary="The end of what a failed attempt's child printed",
    responses=_errors(404),
    tags=["jobs"],
)
def get_attempt_log(
    job_id: JobId, attempt_number: AttemptNumber, caller: CallerDep, stack: StackDep
) -> AttemptLogResponse:
    """The last 64 KB of the child's stdout and stderr, kept when the attempt failed
    (404 when none was kept: the attempt did not fail in its child)."""
    log = stack.ingest.attempt_log(caller, job_id, attempt_number)
    return AttemptLogResponse(job_id=job_id, attempt_number=attempt_number, log=log)


@router.post(
    f"{PREFIX}/jobs/{{job_id}}/cancel",
    operation_id="cancelJob",
    summary="Cancel a job",
    responses={
        202: {"model": CancelResponse, "description": "Running: cancel requested."},
        **_errors(404, 409),
    },
    tags=["jobs"],
)
def cancel_job(
    job_id: JobId, caller: CallerDep, stack: StackDep, response: Response
) -> CancelResponse:
    """A queued (or retry-waiting) job is cancelled at once (200) and its credits
    released; a running one is asked to stop (202, ``cancel_requested``); a finished
    one answers 409."""
    status = stack.ingest.cancel(caller, job_id)
    running = status in IN_FLIGHT
    if running:
        response.status_code = 202
    return CancelResponse(job_id=job_id, status=status.value, cancel_requested=running)


# -- objects -----------------------------------------------------------------------------


_BINARY_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


UploadKey = Annotated[
    fields.IdempotencyKey | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=200,
        description="Makes the upload safe to retry: another upload of yours under this "
        "key, with the same bytes, file name and pool, stores nothing and is answered "
        "with the first object (`replayed`); with anything else, or once that object is "
        "deleted: 409 `idempotency_key_reused`. Honoured as long as submits' keys are. "
        f"{fields.IDEMPOTENCY_KEY_RULE} (else 422).",
    ),
]


@router.put(
    f"{PREFIX}/objects",
    operation_id="uploadObject",
    status_code=201,
    summary="Upload a file (the raw request body)",
    responses=_errors(400, 404, 408, 409, 413, 429, 503, 507),
    openapi_extra=_BINARY_BODY,
    tags=["objects"],
)
async def upload_object(
    request: Request,
    caller: CallerDep,
    stack: StackDep,
    filename: Annotated[fields.FileName, Query(min_length=1, max_length=255)],
    pool_id: Annotated[fields.Text | None, Query(min_length=1, max_length=64)] = None,
    idempotency_key: UploadKey = None,
) -> ObjectResponse:
    """Streams the body into storage (at most ``max_upload_bytes``, else 413 and
    nothing is kept), records its sha256, inspects its content and registers the
    object. ``content_type`` in the answer is the type detected from the bytes (the
    request's ``Content-Type`` is not trusted, nor kept); ``refusal`` says when every
    operation would be refused (macros, encryption, a ZIP bomb ...). ``pool_id``
    defaults to the caller's personal pool. With an ``Idempotency-Key`` header, a
    retry of an upload whose answer was lost gets the first object (``replayed``):
    its body is read and compared, never stored nor counted again (quota, rate); an
    upload that failed left no key behind. Storage that cannot take the bytes answers
    503 ``storage_unavailable`` (507 ``storage_full`` for a full disk), with
    ``Retry-After``: nothing is kept, nothing counted on the quota."""
    settings = stack.settings
    quota = _quota(stack, caller)
    in_flight = cast(uploads.UploadsInFlight, request.app.state.uploads_in_flight)
    # The user's place among the uploads arriving is taken first: a refusal (429,
    # Retry-After: 1, which a client honours by sending it again) was counted on the
    # user's uploads per minute, and a client waiting for a place used that rate up.
    with nullcontext() if caller.is_operator else in_flight.hold(caller.user_id):
        admitted = await run_in_threadpool(
            _admit_upload, stack, caller, pool_id, quota, idempotency_key
        )
        pool, used = admitted.pool, admitted.used
        if admitted.earlier is not None:
            assert idempotency_key is not None
            replayed = await _replayed_upload(
                request, admitted.earlier, idempotency_key, pool, filename
            )
            return _object_response(replayed.info, replayed=True)
        room = settings.max_upload_bytes if quota is None else quota - used
        declared = request.headers.get("content-length", "")
        if quota is not None and (room <= 0 or (declared.isdigit() and int(declared) > room)):
            raise quota_exceeded(quota, used, int(declared) if declared.isdigit() else None)
        # A larger Content-Length than max_upload_bytes was refused by the guard, unread.
        limit = min(settings.max_upload_bytes, room)
        object_id = new_id()
        try:
            blob = await _store_body(request, stack.storage, original_key(pool, object_id), limit)
        except InputTooLarge:
            if quota is not None and limit < settings.max_upload_bytes:
                raise quota_exceeded(quota, used, None) from None
            raise
    uploaded = await _registered(
        request,
        lambda: uploads.register_blob(
            stack.engine,
            stack.storage,
            _inspector(request),
            caller,
            object_id=object_id,
            pool_id=pool,
            blob=blob,
            filename=filename,
            clock=stack.clock,
            quota_bytes=quota,
            idempotency_key=idempotency_key,
        ),
    )
    return _object_response(uploaded.info, replayed=uploaded.replayed)


async def _replayed_upload(
    request: Request, earlier: uploads.Keyed, key: str, pool: str, filename: str
) -> uploads.Uploaded:
    """A retry of the upload that made ``earlier``: refused unread when its pool, file
    name or declared size tell it is another; else its body hashed (nothing stored)
    and compared with the first's."""
    declared = request.headers.get("content-length", "")
    size = int(declared) if declared.isdigit() else None
    uploads.replay(earlier, key, pool_id=pool, filename=filename, size_bytes=size)
    digest = await uploads.hash_stream(
        request.stream(),
        earlier.info.size_bytes,
        limiter=request.app.state.upload_limiter,
        pace=request.app.state.upload_pace,
        stop=request.app.state.upload_stop,
    )
    return uploads.replay(
        earlier,
        key,
        pool_id=pool,
        filename=filename,
        size_bytes=earlier.info.size_bytes + 1 if digest is None else digest.size_bytes,
        sha256=None if digest is None else digest.sha256,
    )


async def _registered(request: Request, register: Callable[[], _T]) -> _T:
    """``register`` (an upload's inspection, then its row) in a worker thread borrowed
    from the app's inspection limiter (``inspection_concurrency``): a registration
    waiting for an inspection slot waits in the event loop, holding no thread of the
    default pool every other route runs in (~40 waiting held them all)."""
    limiter = cast(anyio.CapacityLimiter, request.app.state.inspection_limiter)
    return await anyio.to_thread.run_sync(register, limiter=limiter)


async def _store_body(request: Request, storage: Storage, key: str, limit: int) -> StoredBlob:
    """The request's body into ``key``, in one of the app's upload threads, at its pace."""
    return await uploads.store_stream(
        storage,
        key,
        request.stream(),
        limit,
        limiter=request.app.state.upload_limiter,
        pace=request.app.state.upload_pace,
        stop=request.app.state.upload_stop,
    )


# Operators (the platform's own accounts, `hypermedia run`'s among them) have neither an
# upload rate nor a storage quota.


def _count_upload(stack: Stack, caller: Caller) -> None:
    if not caller.is_operator:
        per_minute = stack.settings.user_uploads_per_minute
        stack.limiter.hit("upload", f"user-{caller.user_id}", per_minute)


def _quota(stack: Stack, caller: Caller) -> int | None:
    return None if caller.is_operator else stack.settings.user_storage_quota_bytes


@dataclass(frozen=True, slots=True)
class _Admitted:
    pool: str
    used: int
    earlier: uploads.Keyed | None = None


def _admit_upload(
    stack: Stack, caller: Caller, pool_id: str | None, quota: int | None, key: str | None
) -> _Admitted:
    """Before any byte is read (one trip to a worker thread): the pool the upload goes
    to, the bytes the caller stores, the object an upload under the same idempotency
    ``key`` made; unless it is a retry of that one, the upload counted against the
    caller's rate."""
    if key is None:
        _count_upload(stack, caller)
    with snapshot(stack.engine) as conn:
        pool = uploads.pool_for(conn, caller, pool_id)
        earlier = None if key is None else uploads.keyed_object(conn, caller.user_id, key)
        used = 0 if quota is None or earlier else storage_used(conn, caller.user_id)
    if key is not None and earlier is None:
        _count_upload(stack, caller)
    return _Admitted(pool, used, earlier)


@router.post(
    f"{PREFIX}/objects/register",
    operation_id="registerObject",
    status_code=201,
    summary="Register a file already in storage",
    responses=_errors(400, 404, 409, 413, 415, 429),
    tags=["objects"],
)
async def register_object(
    body: RegisterRequest, request: Request, caller: CallerDep, stack: StackDep
) -> ObjectResponse:
    """For web tiers that stored the file themselves, under ``originals/<pool_id>/``.
    The stored bytes are inspected as for an upload; a ``content_type`` in the body is
    ignored. Registrations count against the upload rate and the storage quota.

    The storage key is the registration's idempotency key (an ``Idempotency-Key``
    header is not read): registering a key again, as the owner of its object, with the
    ``filename``, ``size_bytes`` and ``sha256`` (or none) the first registration
    recorded answers with that object (``replayed``), inspected and counted once: a
    retry whose answer was lost. Anything else under a registered key (another file,
    another user's, an object deleted since) is 409 ``already_registered``, naming the
    object only to its owner."""
    registration, again = await run_in_threadpool(_admit_registration, stack, caller, body)
    if again is not None:
        return _object_response(again.info, replayed=True)
    registered = await _registered(
        request,
        lambda: uploads.register_stored(
            stack.engine,
            stack.storage,
            _inspector(request),
            caller,
            registration,
            object_id=new_id(),
            now=stack.clock.now(),
            quota_bytes=_quota(stack, caller),
        ),
    )
    return _object_response(registered.info, replayed=registered.replayed)


def _admit_registration(
    stack: Stack, caller: Caller, body: RegisterRequest
) -> tuple[uploads.Registration, uploads.Uploaded | None]:
    """The registration asked for, and the first object when it is a registration's
    retry (not counted again); anything else (refused here or not) is counted against
    the caller's upload rate."""
    again = None
    try:
        registration = uploads.Registration.of(
            body.storage_key, body.filename, body.size_bytes, body.pool_id, body.sha256
        )
        registration.pool(stack.engine, caller)
        again = registration.again(stack.engine, caller)
    finally:
        if again is None:
            _count_upload(stack, caller)
    return registration, again


@router.get(
    f"{PREFIX}/objects/{{object_id}}",
    operation_id="getObject",
    summary="An object's metadata",
    responses=_errors(404),
    tags=["objects"],
)
def read_object(object_id: ObjectId, caller: CallerDep, stack: StackDep) -> ObjectResponse:
    with snapshot(stack.engine) as conn:
        return _object_response(get_object(conn, caller, object_id))


@router.delete(
    f"{PREFIX}/objects/{{object_id}}",
    operation_id="deleteObject",
    summary="Delete an object, its derived outputs and their stored bytes",
    responses=_errors(404, 409),
    tags=["objects"],
)
def delete_object(object_id: ObjectId, caller: CallerDep, stack: StackDep) -> DeleteObjectResponse:
    """Only the object's owner may (anyone else: 404, as for an id that does not exist);
    409 while a job on it is unfinished. The bytes leave the owner's storage quota. An
    output other users' jobs wrote too is not deleted: it passes to the latest of them."""
    deletion = uploads.delete_object(
        stack.engine,
        stack.storage,
        stack.queue,
        stack.ingest.events,
        caller,
        object_id,
        stack.clock,
        stack.backends,
    )
    return DeleteObjectResponse(
        object_id=object_id, outputs_deleted=deletion.outputs, bytes_freed=deletion.size_bytes
    )


# -- blobs: the local storage's signed URLs ----------------------------------------------


class BlobStored(BaseModel):
    key: str
    size_bytes: int
    sha256: str


_BLOB_ERRORS = _error_responses(400, 403, 404, 413, 422, 503)


def _local_storage(stack: Stack) -> LocalStorage:
    if not isinstance(stack.storage, LocalStorage):
        raise NotFound("blob URLs are served by the object store, not by this API")
    return stack.storage


# Where the server cannot send a file itself (an ASGI server without
# http.response.zerocopysend: ApiServer's connections have it), its bytes pass through
# the process in chunks of this size, one of which a reader that stopped reading holds
# (with the transport's copy of the last): 1 MB chunks held ~1.6 MB per paused
# download (300: ~480 MB), 256 KB ~0.5 MB (300: ~145 MB) at ~2/3 of the pace.
FILE_CHUNK_BYTES = 256 << 10


def _file_chunks(
    handle: BinaryIO, start: int, length: int, chunk_size: int = FILE_CHUNK_BYTES
) -> Generator[bytes]:
    with handle:
        handle.seek(start)
        while length > 0 and (chunk := handle.read(min(chunk_size, length))):
            length -= len(chunk)
            yield chunk


class _FileStream(StreamingResponse):
    """A blob's bytes from its open file, which is closed when the answer ends,
    however it ends. Starlette cancels a stream whose client went away while it waited
    to send (a reader that stopped reading, then closed), leaving the body's generator
    suspended, its file open until the cyclic garbage collector found it: 300 such
    downloads held 300 descriptors (a blob deleted since, its disk space too).

    The server sends the file itself where it can (:data:`ZERO_COPY_SEND`, which
    ApiServer's connections offer): no byte of it passes through the process, so a
    reader that stops reading holds none of its memory."""

    def __init__(
        self,
        handle: BinaryIO,
        start: int,
        length: int,
        *,
        status_code: int,
        media_type: str,
        headers: dict[str, str],
    ) -> None:
        self._handle = handle
        self._start = start
        self._length = length
        self._zero_copy = False
        self._chunks = _file_chunks(handle, start, length)
        super().__init__(
            self._chunks, status_code=status_code, media_type=media_type, headers=headers
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._zero_copy = ZERO_COPY_SEND in scope.get("extensions", {})
        try:
            await super().__call__(scope, receive, send)
        finally:
            # No read runs now: a cancelled read of the thread pool is waited for.
            self._chunks.close()
            self._handle.close()

    async def stream_response(self, send: Send) -> None:
        if not self._zero_copy:
            await super().stream_response(send)
            return
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        await send(
            {
                "type": ZERO_COPY_SEND,
                "file": self._handle,
                "offset": self._start,
                "count": self._length,
                "more_body": False,
            }
        )


_BLOB_RANGE = Header(
    alias="Range",
    description="One range of bytes (`bytes=0-1023`, `bytes=1024-`, `bytes=-1024`): 206 "
    "with those bytes and `Content-Range`; past the end: 416. Several ranges, or with "
    "an `If-Range` that is not the blob's current `ETag`: the whole blob (200).",
)
_BLOB_IF_NONE_MATCH = Header(
    alias="If-None-Match",
    description="The `ETag` of an earlier answer (or `*`): 304 with no body while the "
    "blob is still those bytes.",
)
_BLOB_CONTENT_TYPE = Query(
    description="What the URL was signed with: the `Content-Type` a GET answers "
    "(`application/octet-stream` without it), the one a PUT must send."
)
_BLOB_DISPOSITION = Query(
    description="What the URL was signed with: the `Content-Disposition` a GET answers "
    "(none without it)."
)
_BLOB_HEADERS = {
    "Content-Length": {"schema": {"type": "integer"}},
    "Content-Disposition": {
        "description": "The one the URL was signed with, if any.",
        "schema": {"type": "string"},
    },
    "Accept-Ranges": {"schema": {"type": "string", "enum": ["bytes"]}},
    "ETag": {
        "description": "Changes when the blob's bytes are replaced.",
        "schema": {"type": "string"},
    },
    "Last-Modified": {"schema": {"type": "string"}},
}
# What the route serves (an output may be HTML or SVG) comes from the API's origin: no
# sniffing a type it was not given, and a document a browser would run scripts in is
# sandboxed (no script, no cookie of that origin). Not every type: a sandboxed PDF is
# refused by Chromium's viewer.


def _blob_safety(content_type: str) -> dict[str, str]:
    headers = {"X-Content-Type-Options": "nosniff"}
    if scripted(content_type):
        headers["Content-Security-Policy"] = "sandbox"
    return headers


def _blob_answer(
    request: Request,
    stack: Stack,
    key: str,
    expires: str | None,
    sig: str | None,
    content_type: str | None,
    disposition: str | None,
) -> Response:
    """The answer to a GET (or HEAD: the same, without the bytes) of a signed blob URL."""
    storage = _local_storage(stack)
    storage.verify("GET", key, expires, sig, content_type, disposition)
    handle, size = storage.open(key)
    stat = os.fstat(handle.fileno())
    etag = ranges.entity_tag(size, stat.st_mtime_ns, stat.st_ino)
    media_type = content_type or DEFAULT_CONTENT_TYPE
    validators = {
        "ETag": etag,
        "Last-Modified": formatdate(stat.st_mtime, usegmt=True),
        **_blob_safety(media_type),
    }
    if disposition is not None:
        validators["Content-Disposition"] = disposition
    if ranges.not_modified(request.headers.get("if-none-match"), etag):
        handle.close()
        return Response(status_code=304, headers=validators)
    try:
        wanted = ranges.requested(
            request.headers.get("range"),
            size,
            if_range=request.headers.get("if-range"),
            etag=etag,
        )
    except ranges.Unsatisfiable:
        handle.close()
        refused = error_response(
            RangeNotSatisfiable(
                f"the range {request.headers.get('range')!r} starts past the blob's {size} bytes",
                size_bytes=size,
            )
        )
        refused.headers["Content-Range"] = f"bytes */{size}"
        return refused
    headers = {"Accept-Ranges": "bytes", "Content-Length": str(size), **validators}
    status, start, length = 200, 0, size
    if wanted is not None:
        status, start, length = 206, wanted.start, wanted.length
        headers.update({"Content-Length": str(length), "Content-Range": wanted.content_range})
    if request.method == "HEAD":
        handle.close()
        return Response(status_code=status, headers=headers, media_type=media_type)
    return _FileStream(
        handle, start, length, status_code=status, media_type=media_type, headers=headers
    )


@router.get(
    f"{PREFIX}/blobs/{{key:path}}",
    operation_id="readBlob",
    summary="Read a stored blob through a signed URL (no API key)",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "The blob, as the type the URL was signed with.",
            "content": {"application/octet-stream": {"schema": {"type": "string"}}},
            "headers": _BLOB_HEADERS,
        },
        206: {
            "description": "The range asked for (`Content-Range` says which).",
            "content": {"application/octet-stream": {"schema": {"type": "string"}}},
            "headers": {**_BLOB_HEADERS, "Content-Range": {"schema": {"type": "string"}}},
        },
        304: {"description": "`If-None-Match` named the blob's `ETag`: no body."},
        **_BLOB_ERRORS,
        **_error_responses(416),
    },
    tags=["storage"],
)
def read_blob(
    key: str,
    request: Request,
    stack: StackDep,
    expires: str | None = None,
    sig: str | None = None,
    content_type: Annotated[str | None, _BLOB_CONTENT_TYPE] = None,
    disposition: Annotated[str | None, _BLOB_DISPOSITION] = None,
    byte_range: Annotated[str | None, _BLOB_RANGE] = None,
    if_none_match: Annotated[str | None, _BLOB_IF_NONE_MATCH] = None,
) -> Response:
    """Streams the bytes at ``key`` (or one range of them) if ``expires`` and ``sig``
    sign a GET of it (and of its ``content_type`` and ``disposition``)."""
    return _blob_answer(request, stack, key, expires, sig, content_type, disposition)


@router.head(
    f"{PREFIX}/blobs/{{key:path}}",
    operation_id="headBlob",
    summary="A stored blob's size, through a signed GET URL (no API key)",
    responses={
        200: {
            "description": "What a GET would answer, without the bytes.",
            "headers": _BLOB_HEADERS,
        },
        206: {
            "description": "What a GET of the `Range` would answer, without the bytes.",
            "headers": {**_BLOB_HEADERS, "Content-Range": {"schema": {"type": "string"}}},
        },
        304: {"description": "`If-None-Match` named the blob's `ETag`."},
        **_BLOB_ERRORS,
        **_error_responses(416),
    },
    response_class=Response,
    tags=["storage"],
)
def head_blob(
    key: str,
    request: Request,
    stack: StackDep,
    expires: str | None = None,
    sig: str | None = None,
    content_type: Annotated[str | None, _BLOB_CONTENT_TYPE] = None,
    disposition: Annotated[str | None, _BLOB_DISPOSITION] = None,
    byte_range: Annotated[str | None, _BLOB_RANGE] = None,
    if_none_match: Annotated[str | None, _BLOB_IF_NONE_MATCH] = None,
) -> Response:
    return _blob_answer(request, stack, key, expires, sig, content_type, disposition)


@router.put(
    f"{PREFIX}/blobs/{{key:path}}",
    operation_id="writeBlob",
    summary="Store a blob through a signed URL (no API key)",
    responses={**_BLOB_ERRORS, **_error_responses(408, 507)},
    openapi_extra=_BINARY_BODY,
    tags=["storage"],
)
async def write_blob(
    key: str,
    request: Request,
    stack: StackDep,
    expires: str | None = None,
    sig: str | None = None,
    content_type: str | None = None,
) -> BlobStored:
    """Streams the body to ``key`` (atomically replacing what was there; at most
    ``max_upload_bytes``, else 413 and nothing changes) if the URL signs a PUT of
    it. A URL issued for a content type needs that ``Content-Type`` header."""
    storage = _local_storage(stack)
    storage.verify("PUT", key, expires, sig, content_type)
    if content_type is not None and request.headers.get("content-type") != content_type:
        raise InvalidSignature(f"this URL was issued for Content-Type: {content_type}")
    limit = stack.settings.max_upload_bytes
    blob = await _store_body(request, storage, key, limit)
    return BlobStored(key=blob.key, size_bytes=blob.size_bytes, sha256=blob.sha256)


# -- accounts and operators ------------------------------------------------------------


@router.get(
    f"{PREFIX}/credits",
    operation_id="getCredits",
    summary="The caller's credits",
    responses=_errors(),
    tags=["accounts"],
)
def read_credits(caller: CallerDep, stack: StackDep) -> CreditsResponse:
    with snapshot(stack.engine) as conn:  # a read: on SQLite it holds up no writer
        account = balance(conn, caller.user_id)
    return CreditsResponse(
        balance=credits(account.balance_millicredits),
        reserved=credits(account.reserved_millicredits),
        available=credits(account.available_millicredits),
    )


@router.get(
    f"{PREFIX}/queues",
    operation_id="getQueues",
    summary="Queue depths (operators only)",
    responses=_errors(403),
    tags=["operators"],
)
def read_queues(caller: CallerDep, stack: StackDep) -> QueuesResponse:
    if not caller.is_operator:
        raise Forbidden("queue statistics are for operators only")
    return QueuesResponse(
        queues=[
            QueueOut(
                queue=s.queue,
                queued=s.queued,
                in_flight=s.in_flight,
                retry_wait=s.retry_wait,
                oldest_queued_at=s.oldest_queued_at,
                oldest_age_seconds=s.oldest_age_seconds,
                redis=None
                if s.redis_ready is None or s.redis_leased is None or s.redis_delayed is None
                else RedisCounts(
                    ready=s.redis_ready, leased=s.redis_leased, delayed=s.redis_delayed
                ),
            )
            for s in stack.ingest.queue_overview()
        ]
    )


class BulkRunRequest(RunSpec):
    dry_run: bool = False


@router.post(
    f"{PREFIX}/bulk/runs",
    operation_id="createBulkRun",
    summary="Start a bulk regenerate, backfill or migrate run (operators only)",
    responses=_errors(400, 403, 404, 409, 413, 415),
    tags=["operators"],
    response_model=BulkRunOut | BulkEstimateOut,
)
def create_bulk_run(
    body: BulkRunRequest,
    caller: CallerDep,
    stack: StackDep,
    idempotency_key: Annotated[
        fields.IdempotencyKey | None,
        Header(
            alias="Idempotency-Key",
            min_length=1,
            max_length=200,
            description="A retry with the same key and body answers the run the first "
            "created and starts none; another body under the key is 409 "
            f"`idempotency_key_reused`. {fields.IDEMPOTENCY_KEY_RULE} (else 422).",
        ),
    ] = None,
) -> BulkRunOut | BulkEstimateOut:
    """``dry_run``: what it would do (count, bytes, CPU time from the operation's past
    attempts), nothing written. A migration copies with the head's own credentials."""
    service = _bulk(caller, stack)
    spec = RunSpec.model_validate(body.model_dump(exclude={"dry_run"}))
    if body.dry_run:
        return BulkEstimateOut.model_validate(asdict(service.estimate(spec)))
    view = service.create(spec, f"api:{caller.user_id}", idempotency_key)
    return BulkRunOut.model_validate(view.to_json())


@router.get(
    f"{PREFIX}/bulk/runs",
    operation_id="listBulkRuns",
    summary="The bulk runs, newest first, a page at a time (operators only)",
    responses=_errors(403),
    tags=["operators"],
)
def list_bulk_runs(
    caller: CallerDep,
    stack: StackDep,
    cursor: Annotated[
        str | None,
        Query(pattern=r"^[0-9a-f]{32}$", description="`next_cursor` of the page before."),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=BULK_MAX_PAGE)] = 50,
) -> BulkRunsResponse:
    """Keyset pages, as the jobs list's: a page never shifts when runs are created
    meanwhile."""
    page = _bulk(caller, stack).list(limit, cursor)
    return BulkRunsResponse(
        runs=[BulkRunOut.model_validate(r.to_json()) for r in page.runs],
        next_cursor=page.next_cursor,
    )


@router.get(
    f"{PREFIX}/bulk/runs/{{run_id}}",
    operation_id="getBulkRun",
    summary="A bulk run's progress (operators only)",
    responses=_errors(403, 404),
    tags=["operators"],
)
def read_bulk_run(run_id: RunId, caller: CallerDep, stack: StackDep) -> BulkRunOut:
    return BulkRunOut.model_validate(_bulk(caller, stack).get(run_id).to_json())


@router.post(
    f"{PREFIX}/bulk/runs/{{run_id}}/{{action}}",
    operation_id="changeBulkRun",
    summary="Pause, resume or cancel a bulk run (operators only)",
    responses=_errors(403, 404, 409),
    tags=["operators"],
)
def change_bulk_run(
    run_id: RunId,
    action: Literal["pause", "resume", "cancel"],
    caller: CallerDep,
    stack: StackDep,
) -> BulkRunOut:
    return BulkRunOut.model_validate(_bulk(caller, stack).act(run_id, action).to_json())


@router.patch(
    f"{PREFIX}/bulk/runs/{{run_id}}",
    operation_id="updateBulkRun",
    summary="Change a bulk run's max_in_flight while it runs (operators only)",
    responses=_errors(403, 404, 409, 413, 415),
    tags=["operators"],
)
def update_bulk_run(
    run_id: RunId, body: RunChange, caller: CallerDep, stack: StackDep
) -> BulkRunOut:
    """Taken at the run's next step: a lower cap creates no job until fewer are live
    (those live finish); a finished run is 409."""
    return BulkRunOut.model_validate(
        _bulk(caller, stack).throttle(run_id, body.max_in_flight).to_json()
    )


def _bulk(caller: Caller, stack: Stack) -> BulkService:
    """Bulk runs are the operator's: a user's key is refused, whatever it asks."""
    if not caller.is_operator:
        raise Forbidden("bulk runs are for operators only")
    return BulkService(
        stack.engine,
        stack.queue,
        stack.catalog,
        clock=stack.clock,
        implemented=stack.ingest.implemented,
        served_queues=stack.served_queues,
    )


@router.get(
    "/healthz",
    operation_id="getHealth",
    summary="Database, Redis and storage reachability (no authentication)",
    responses={503: {"model": HealthResponse, "description": "A backing service is down."}},
    tags=["operators"],
)
def healthz(stack: StackDep, response: Response) -> HealthResponse:
    """``storage``: the storage's last probe (S3: a HEAD of the bucket; local: the
    directory takes a file and has room), at most ``storage_probe_seconds`` old."""
    database = _database_ok(stack)
    redis_ok = _redis_ok(stack)
    storage = stack.storage_health is not None and stack.storage_health.state().ok
    ok = database and redis_ok and storage
    if not ok:
        response.status_code = 503
    return HealthResponse(
        status="ok" if ok else "unavailable", database=database, redis=redis_ok, storage=storage
    )


@router.get(
    METRICS_PATH,
    operation_id="getMetrics",
    summary="The head's metrics in Prometheus's text format (operators only)",
    responses=_errors(403, 404),
    tags=["operators"],
    response_class=Response,
)
def read_metrics(caller: CallerDep, stack: StackDep) -> Response:
    """What the head counts and reads from Redis and the record when scraped (see
    :mod:`hypermedia.metrics`); the pipeline actors' metrics are Ray's to export."""
    if not caller.is_operator:
        raise Forbidden("metrics are for operators only")
    from hypermedia.metrics.head import CONTENT_TYPE, HeadMetrics

    if not isinstance(stack.metrics, HeadMetrics):
        raise NotFound("this API's stack exports no metrics")
    return Response(stack.metrics.exposition(), media_type=CONTENT_TYPE)


def _database_ok(stack: Stack) -> bool:
    try:
        with snapshot(stack.engine) as conn:  # a read: on SQLite no wait for the writer
            conn.execute(text("SELECT 1"))
    except Exception as exc:
        log.warning("health: database unreachable: %s", exc, extra={"action": "health"})
        return False
    return True


def _redis_ok(stack: Stack) -> bool:
    try:
        return stack.queue.ping()
    except Exception as exc:
        log.warning("health: redis unreachable: %s", exc, extra={"action": "health"})
        return False


# -- conversions -------------------------------------------------------------------------


def _process_response(result: SubmitResult) -> ProcessResponse:
    return ProcessResponse(
        submission_id=result.submission_id,
        job_ids=result.job_ids,
        jobs=[
            SubmittedJobOut(
                job_id=j.job_id,
                operation=j.operation,
                queue=j.queue,
                priority=j.priority,
                estimated_credits=credits(j.estimated_millicredits),
                reserved_credits=credits(j.reserved_millicredits),
            )
            for j in result.jobs
        ],
        estimated_credits=credits(result.estimated_millicredits),
        reserved_credits=credits(result.reserved_millicredits),
        replayed=result.replayed,
    )


def _object_response(info: ObjectInfo, *, replayed: bool = False) -> ObjectResponse:
    detected_kind = refused = None
    if info.inspection is not None:
        inspection = Inspection.from_dict(info.inspection)
        detected_kind = inspection.kind
        problem = refusal(inspection)
        if problem is not None:
            refused = ErrorBody(code=problem.code, message=problem.message)
    return ObjectResponse(
        object_id=info.object_id,
        pool_id=info.pool_id,
        size_bytes=info.size_bytes,
        sha256=info.sha256,
        filename=info.filename,
        content_type=info.content_type,
        detected_kind=detected_kind,
        refusal=refused,
        created_at=info.created_at,
        replayed=replayed,
    )


# -- the app -----------------------------------------------------------------------------


def create_app(
    stack: Stack,
    *,
    auth_cache_seconds: float = 30.0,
    events_keepalive_seconds: float = events.KEEPALIVE_SECONDS,
) -> FastAPI:
    """The API over ``stack``. Authentications are cached ``auth_cache_seconds``; a job's
    event stream sends a keep-alive (and reads the record) every
    ``events_keepalive_seconds`` without an event."""
    app = FastAPI(
        title="hypermedia",
        version=__version__,
        summary="Processing jobs for user files: submit, follow, cancel.",
        # Swagger UI from the API's own files (hypermedia.ingest.docs), not FastAPI's
        # page of a CDN's; no ReDoc.
        docs_url=None,
        redoc_url=None,
        # Starlette would answer a path with a slash too many (an empty id: GET
        # /jobs/, DELETE /objects/) with a 307 to the route without it: the list of
        # jobs for a job, a 405 for a delete. No route ends in a slash: 404.
        redirect_slashes=False,
    )
    app.state.stack = stack
    app.state.list_query_names = {}  # _route_list_query_names
    app.state.events_keepalive = events_keepalive_seconds
    app.state.event_streams = events.EventStreams(
        stack.settings.event_streams, stack.settings.user_concurrent_event_streams
    )
    app.state.event_subscriber = EventSubscriber(stack.redis_url)
    authenticator = Authenticator(stack.engine, ttl=auth_cache_seconds)
    app.state.authenticator = authenticator
    settings = stack.settings
    app.state.inspector = InspectionRunner(
        InspectionBudget(
            cpu_seconds=settings.inspection_cpu_seconds,
            wall_seconds=settings.inspection_wall_seconds,
            memory_mb=settings.inspection_memory_mb,
            concurrency=settings.inspection_concurrency,
        ),
        # The data dir (storage secret, embedded database, Redis, every object) is not
        # for the parsers of a hostile upload to see.
        hidden_paths=(settings.data_dir,),
    )
    # Uploads stream in threads of their own (see Settings.upload_concurrency).
    app.state.upload_limiter = anyio.CapacityLimiter(settings.upload_concurrency)
    app.state.inspection_limiter = anyio.CapacityLimiter(settings.inspection_concurrency)
    app.state.uploads_in_flight = uploads.UploadsInFlight(settings.user_concurrent_uploads)
    app.state.upload_stop = uploads.UploadStop()  # stopped by the server as it stops
    app.state.upload_pace = uploads.ReadPace(
        idle_seconds=settings.upload_idle_seconds,
        min_bytes_per_second=settings.upload_min_bytes_per_second,
    )
    # The router's routes themselves, built once a process as the module was imported:
    # include_router would have FastAPI build each of them again for each app (its
    # dependencies and its models' validators), at the app's first request: ~100 ms of
    # CPU an app, measured, in a test process that makes hundreds.
    app.router.routes.extend(router.routes)
    openapi.install(app, lambda: served_operations(stack))
    docs.install(app)
    # Added before the error handlers: inside them, so its own surprises answer 500.
    app.add_middleware(
        RequestGuard,
        authenticator=authenticator,
        rules=route_rules(stack.settings),
        body_seconds=stack.settings.json_body_seconds,
    )
    install_error_handlers(app)
    return app


def served_operations(stack: Stack) -> list[str]:
    """The operations this server accepts: active profiles a pipeline step implements."""
    return sorted(set(stack.catalog.operations()) & set(stack.ingest.implemented()))


def route_rules(settings: Settings) -> Rules:
    """Which routes need a key, and how large a body each takes: uploads stream up to
    ``max_upload_bytes``, every other route takes at most ``max_json_body_bytes``."""
    blobs = f"{PREFIX}/blobs/"
    uploads_path = f"{PREFIX}/objects"

    def rule(method: str, path: str) -> RouteRule:
        blob = path.startswith(blobs)
        upload = method == "PUT" and (blob or path == uploads_path)
        return RouteRule(
            needs_key=(path.startswith(f"{PREFIX}/") and not blob) or path == METRICS_PATH,
            max_body_bytes=settings.max_upload_bytes if upload else settings.max_json_body_bytes,
            streamed=upload,
        )

    return rule
