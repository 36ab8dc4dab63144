"""Errors as the API answers them: ``{"error": {"code", "message", "details"?}}``.

* a :class:`~hypermedia.errors.HypermediaError` answers its own ``status`` and
  ``code`` (401 adds ``WWW-Authenticate: Bearer``; a ``retry_after_seconds`` detail
  adds ``Retry-After``, and a 503 without one, the database, Redis or the storage down,
  says :data:`OUTAGE_RETRY_AFTER_SECONDS`, a 507 (the storage's disk full)
  :data:`STORAGE_FULL_RETRY_AFTER_SECONDS`; such an outage is told in
  :data:`OUTAGE_MESSAGES`' words, with no details, the driver's or the disk's going to
  the log);
* a request FastAPI cannot validate is 422 ``invalid_request``, the message
  naming each bad field by its path (``body.operations: ...``; a body that is not JSON:
  where and why, in :mod:`json`'s words; one it cannot read: why: not UTF-8, nested
  too deeply, an integer of more than 4300 digits), the first
  :data:`MAX_REPORTED_ERRORS` of them; a JSON route's body sent under another
  ``Content-Type`` (none, or ``curl -d``'s form type: FastAPI does not read it as
  JSON) is 415 ``unsupported_media_type`` naming the header to send;
* unknown routes and methods are 404 ``not_found`` / 405 ``method_not_allowed``;
* a value the database refused (SQLAlchemy's ``DataError``: a NUL in text, a number out
  of its column's range) is 400 ``invalid_request``: a last line behind the checks of
  :mod:`hypermedia.ingest.fields`, which should have refused it first;
* a transaction PostgreSQL aborted in a conflict with concurrent ones (deadlock
  detected, a serialization failure) on a path that does not run it again
  (:mod:`hypermedia.db.conflicts`) is 503 ``database_conflict`` with ``Retry-After``,
  as the paths that do answer once their runs are spent: never 500;
* anything else is 500 ``internal``: the trace goes to the log, never the body.

An error body always encodes: a message echoing what the request held (a lone UTF-16
surrogate among it) is sent with non-ASCII characters escaped rather than failing.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hypermedia.db.conflicts import conflict_error
from hypermedia.errors import (
    DatabaseUnavailable,
    HypermediaError,
    InvalidRequest,
    QueueUnavailable,
    UnsupportedMediaType,
)
from hypermedia.storage.base import StorageFull, StorageUnavailable

log = logging.getLogger(__name__)

# When a client should try again after a 503 whose error names no time of its own (a
# database or Redis that is down: nobody knows when it is back; the reaper and the
# reconciler try every few seconds, so a retry sooner than this would meet the outage).
OUTAGE_RETRY_AFTER_SECONDS = 5
# A full disk stays full until the operator makes room: sooner is a wasted upload.
STORAGE_FULL_RETRY_AFTER_SECONDS = 60
# What a caller is told of an outage: the driver's words (the host, the port, the
# database's name; the bucket, the endpoint, the storage directory) are the
# operator's, in the log.
OUTAGE_MESSAGES = {
    # Down, silent, full or refusing connections: "unreachable" misled for a full disk.
    DatabaseUnavailable.code: "the database is unavailable; try again shortly",
    QueueUnavailable.code: "the job queue is unreachable; try again shortly",
    StorageUnavailable.code: "the file storage is unavailable; nothing was stored; "
    "try again shortly",
    StorageFull.code: "the file storage is full; nothing was stored; try again later",
}


# The problems a 422 names, the first ones (``details.errors_total`` counts them all):
# each of 60,000 unknown keys in a 1 MB body named twice answered 9 MB.
MAX_REPORTED_ERRORS = 20


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(HypermediaError, _on_hypermedia_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(DataError, _on_data_error)
    app.add_middleware(_InternalErrors)


# -- errors ------------------------------------------------------------------------------


class _ErrorJSON(JSONResponse):
    """JSON as FastAPI renders it, but ASCII-escaped when that cannot be UTF-8 (a lone
    surrogate the request held, echoed in the message): ``"\\ud800"``."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def _error(
    status: int, body: dict[str, Any], headers: Mapping[str, str] | None = None
) -> JSONResponse:
    return _ErrorJSON({"error": body}, status_code=status, headers=headers)


def error_response(exc: HypermediaError) -> JSONResponse:
    """The answer to ``exc``: its status and body; 401 adds ``WWW-Authenticate``, an
    error with a ``retry_after_seconds`` detail a ``Retry-After`` header (a 503
    without one: :data:`OUTAGE_RETRY_AFTER_SECONDS`)."""
    headers: dict[str, str] = {}
    if exc.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    retry_after = exc.details.get("retry_after_seconds")
    if isinstance(retry_after, int | float):
        headers["Retry-After"] = str(max(1, math.ceil(retry_after)))
    elif exc.status == 503:
        headers["Retry-After"] = str(OUTAGE_RETRY_AFTER_SECONDS)
    elif exc.status == 507:
        headers["Retry-After"] = str(STORAGE_FULL_RETRY_AFTER_SECONDS)
    if exc.status >= 500:
        log.warning("%s: %s", exc.code, exc.message, extra={"action": "api_error"})
    body = exc.to_dict()
    if exc.code in OUTAGE_MESSAGES:
        body = {"code": exc.code, "message": OUTAGE_MESSAGES[exc.code]}
    return _error(exc.status, body, headers or None)


async def _on_hypermedia_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HypermediaError)
    return error_response(exc)


async def _on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    content_type = request.headers.get("content-type")
    if not _is_json(content_type) and any(_body_unread(error) for error in errors):
        said = "named none" if not content_type else f"said {content_type!r}"
        return error_response(
            UnsupportedMediaType(
                "this route takes a JSON body: send it with Content-Type: application/json"
                f" (the request {said})",
                content_type=content_type,
            )
        )
    problems = []
    for error in errors[:MAX_REPORTED_ERRORS]:
        path = ".".join(str(part) for part in error.get("loc", ()))
        message = str(error.get("msg", ""))
        if error["type"] == "json_invalid":
            # FastAPI's loc is ("body", <character>) and its msg "JSON decode error".
            at = error.get("loc", ("body",))[1:]
            path = "body"
            reason = error.get("ctx", {}).get("error", "")
            message = f"not valid JSON{f' at character {at[0]}' if at else ''}: {reason}"
        problems.append({"path": path, "message": message, "type": error["type"]})
    message = "; ".join(f"{p['path']}: {p['message']}" for p in problems) or "invalid request"
    details: dict[str, Any] = {"errors": problems}
    if len(errors) > len(problems):
        message += f"; and {len(errors) - len(problems)} more"
        details["errors_total"] = len(errors)
    body = {"code": InvalidRequest.code, "message": message, "details": details}
    return _error(422, body)


def _is_json(content_type: str | None) -> bool:
    """Whether FastAPI reads a body of ``content_type`` as JSON (``application/json``,
    ``application/*+json``, with parameters or not)."""
    if not content_type:
        return False
    kind = content_type.partition(";")[0].strip().lower()
    main, _, sub = kind.partition("/")
    return main == "application" and (sub == "json" or sub.endswith("+json"))


def _body_unread(error: Any) -> bool:
    """FastAPI's error for a model body it was given as bytes (not read as JSON)."""
    return tuple(error.get("loc", ())) == ("body",) and error["type"] == "model_attributes_type"


async def _on_data_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, DataError)
    # The database's own words name the column at best, and may quote the value back.
    log.warning(
        "database refused a value on %s %s: %s",
        request.method,
        request.url.path,
        exc.orig,
        extra={"action": "api_data_error"},
    )
    message = "a value in the request cannot be stored (out of range or not valid text)"
    return _error(400, {"code": InvalidRequest.code, "message": message})


def _unreadable_json(cause: ValueError | RecursionError) -> JSONResponse:
    """422 ``invalid_request`` for a JSON body :mod:`json` could not read, as for one
    that is not JSON: bytes that are not UTF-8 (nor UTF-16, UTF-32), nesting past the
    parser's depth, an integer past Python's 4300 digits."""
    if isinstance(cause, RecursionError):
        reason = "nested too deeply"
    elif isinstance(cause, UnicodeDecodeError):
        reason = f"not UTF-8 text ({cause.reason} at byte {cause.start})"
    else:
        reason = str(cause).partition("; use sys.")[0]
    message = f"not valid JSON: {reason}"
    problems = [{"path": "body", "message": message, "type": "json_invalid"}]
    body = {
        "code": InvalidRequest.code,
        "message": f"body: {message}",
        "details": {"errors": problems},
    }
    return _error(422, body)


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}
# The codes answered here that no error class carries (the OpenAPI ErrorCode enum).
HANDLER_CODES = ("not_found", "method_not_allowed", "http_error", "internal")


async def _on_http_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    cause = exc.__cause__
    if exc.status_code == 400 and isinstance(cause, ValueError | RecursionError):
        # FastAPI's "There was an error parsing the body" (400 http_error): a body its
        # JSON parser gave up on for other reasons than a JSONDecodeError.
        return _unreadable_json(cause)
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    return _error(exc.status_code, {"code": code, "message": str(exc.detail)}, exc.headers)


class _InternalErrors:
    """Answer 500 ``internal`` for any unexpected exception, logging the trace.

    A plain ASGI middleware rather than an ``Exception`` handler: Starlette
    re-raises after such a handler, and the server would log every error twice.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            conflict = conflict_error(exc)
            if conflict is not None and not started:
                await error_response(conflict)(scope, receive, send)
                return
            log.exception(
                "internal error on %s %s",
                scope.get("method"),
                scope.get("path"),
                extra={"action": "api_internal_error"},
            )
            if started:
                raise
            response = _error(500, {"code": "internal", "message": "internal server error"})
            await response(scope, receive, send)
