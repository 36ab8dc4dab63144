"""``GET /operator``: the operator page (see :mod:`autoscaler.page`) and its static files.

Who may see it: an operator's API key (``hypermedia user add --operator``). A browser
sends it by HTTP Basic authentication, the key as the password (any user name): without
a key the page answers 401 with a ``Basic`` challenge, so the browser asks for one.
``Authorization: Bearer hm_...`` works too. No key or a bad one: 401
``unauthenticated``; a key that is not an operator's: 403 ``forbidden``. Keys are checked
by the API's :class:`~hypermedia.ingest.auth.Authenticator` (and its cache). The static
files (uPlot, the page's script and style) are public: they hold nothing of the platform.

Read-only: a GET that writes nothing. The numbers are :func:`autoscaler.status.gather`'s,
the ones ``hypermedia status`` shows, with the last :data:`DECISION_LOG` decisions instead
of 10; ``?hours=`` (default 6, at most the samples' retention) is the charts' window. The
page reloads itself every :data:`REFRESH_SECONDS`. Its Content-Security-Policy runs only
the package's own scripts: the chart data travels as a JSON data block, not a script.

The chart library: uPlot 1.6.32 (MIT, ``static/uPlot.LICENSE``), ``dist/uPlot.iife.min.js``
and ``dist/uPlot.min.css`` of the npm package ``uplot`` as published. 51 KB, no
dependencies, made for time series; Chart.js, the other well-kept choice, is four times
the size and needs a date adapter for a time axis.
"""

from __future__ import annotations

import base64
import binascii
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, cast

from fastapi import Depends, FastAPI, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, PackageLoader, StrictUndefined, Template
from markupsafe import Markup, escape
from starlette.responses import Response
from starlette.types import Scope

from autoscaler import cost, samples
from autoscaler.config import SchedulerConfig
from autoscaler.page.charts import Charts, charts
from autoscaler.scheduler import ledger_intervals
from autoscaler.status import Status, gather
from hypermedia.accounts import Caller
from hypermedia.clock import age_text
from hypermedia.db.engine import transaction
from hypermedia.errors import AuthenticationFailed, Forbidden, ServiceUnavailable
from hypermedia.ingest.auth import Authenticator
from hypermedia.ingest.http_errors import OUTAGE_MESSAGES, error_response
from hypermedia.stack import Stack

PATH = "/operator"
STATIC_PATH = f"{PATH}/static"
STATIC_DIR = Path(__file__).resolve().parent / "static"
REFRESH_SECONDS = 60
DECISION_LOG = 50
DEFAULT_HOURS = 6.0
MAX_HOURS = samples.RETENTION_SECONDS / 3600
WINDOWS = (1, 6, 24, 48)
CHALLENGE = 'Basic realm="hypermedia operator", charset="UTF-8"'
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
        " base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
# The page's own files (its script, the chart library, the style): as the page's, but
# cached (they change only with the package; Starlette sends their ETag).
STATIC_HEADERS = {name: value for name, value in HEADERS.items() if name != "Cache-Control"}


class _StaticFiles(StaticFiles):
    """The page's files with :data:`STATIC_HEADERS` (Starlette's StaticFiles sends none
    of them: a browser sent to one as a document ran it without the page's policy)."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(STATIC_HEADERS)
        return response


# While the record or Redis is down the page can neither check the key nor read what it
# shows: it says so, and reloads itself until they are back (a JSON error stopped it).
OUTAGE_REFRESH_SECONDS = 10


class PageOutage(Exception):
    """The record or Redis is down: the page says which and reloads itself."""

    def __init__(self, error: ServiceUnavailable) -> None:
        super().__init__(error.message)
        self.error = error


class OperatorKeyNeeded(Exception):
    """No key, or a bad one: 401 ``unauthenticated`` with a Basic challenge (a browser
    then asks for it). Not an error class of its own: the client sees the API's."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def presented_key(authorization: str) -> str | None:
    """The API key of an ``Authorization`` header: a Bearer token, or a Basic password."""
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() == "bearer":
        token = value.strip()
        return token or None
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    _user, colon, password = decoded.partition(":")
    return password if colon and password else None


async def _operator(request: Request) -> Caller:
    key = presented_key(request.headers.get("authorization", ""))
    if key is None:
        raise OperatorKeyNeeded(
            "an operator's API key is needed: give it as the password (any user name)"
        )
    authenticator = cast(Authenticator, request.app.state.authenticator)
    try:
        caller = await run_in_threadpool(authenticator, key)
    except AuthenticationFailed as exc:
        raise OperatorKeyNeeded(exc.message) from None
    except ServiceUnavailable as exc:
        raise PageOutage(exc) from None
    if not caller.is_operator:
        raise Forbidden("the operator page is for operators only")
    return caller


async def _challenge(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, OperatorKeyNeeded)
    response = error_response(AuthenticationFailed(exc.message))
    response.headers["WWW-Authenticate"] = CHALLENGE
    return response


def when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S")


def bdi(value: object) -> Markup:
    """A value others wrote (a host name, a reason, an error ...) as the page shows it:
    escaped, in a ``<bdi>``, so that a bidi control of it (U+202E, right-to-left
    override) ends with it instead of reversing the page's own text after it."""
    return Markup("<bdi>{}</bdi>").format("" if value is None else value)


def isolating(text: str, value: str | None) -> Markup:
    """``text``, the page's words around ``value`` (its last occurrence), with ``value``
    in a ``<bdi>`` (:func:`bdi`): e.g. a worker's state, "active, claiming paused:
    <reason>", whose wording is the record's (shared with ``hypermedia status``)."""
    before, found, after = text.rpartition(value) if value else ("", "", text)
    if not found:
        return escape(text)
    return escape(before) + bdi(value) + escape(after)


def templates() -> Environment:
    environment = Environment(
        loader=PackageLoader("autoscaler.page", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters.update(
        money=cost.money,
        age=age_text,
        when=when,
        thousands=lambda n: f"{n:,}",
        bdi=bdi,
        isolating=isolating,
    )
    return environment


def history(stack: Stack, config: SchedulerConfig, status: Status, hours: float) -> Charts:
    """The charts of the ``hours`` before ``status`` was gathered."""
    until = status.at
    since = until - hours * 3600
    with transaction(stack.engine) as conn:
        taken = samples.read(conn, since, until)
        # The window's first points count the hour before ``since`` and its day so far:
        # an instance ended before both costs nothing in the window.
        start = min(cost.day_start(since), since - cost.HOUR_SECONDS)
        intervals = ledger_intervals(conn, start)
    return charts(
        taken,
        intervals,
        [q.queue for q in status.queues],
        since=since,
        until=until,
        sample_interval=max(samples.SAMPLE_SECONDS, config.evaluation_interval_seconds),
        hourly_cap_cents=status.spend.hourly_cap_cents,
        daily_cap_cents=status.spend.daily_cap_cents,
        alert_threshold_cents=status.spend.alert_threshold_cents,
    )


def render(template: Template, stack: Stack, config: SchedulerConfig, hours: float) -> str:
    try:
        status = gather(stack, config, decisions=DECISION_LOG, storage=stack.storage_health)
        drawn = history(stack, config, status, hours).as_json()
    except ServiceUnavailable as exc:
        raise PageOutage(exc) from None
    return template.render(
        status=status,
        charts=drawn,
        hours=hours,
        windows=WINDOWS,
        refresh_seconds=REFRESH_SECONDS,
        static=STATIC_PATH,
        path=PATH,
    )


def install(app: FastAPI, config: SchedulerConfig) -> None:
    """Mount the page on ``app`` (the API's, from :func:`~hypermedia.ingest.api.create_app`:
    its stack and authenticator), showing ``config``'s caps and mode."""
    template = templates().get_template("operator.html")

    def operator_page(
        request: Request,
        _caller: Annotated[Caller, Depends(_operator)],
        hours: Annotated[float, Query(gt=0, le=MAX_HOURS)] = DEFAULT_HOURS,
    ) -> HTMLResponse:
        stack = cast(Stack, request.app.state.stack)
        return HTMLResponse(render(template, stack, config, hours), headers=HEADERS)

    app.add_api_route(PATH, operator_page, methods=["GET"], include_in_schema=False)
    app.add_exception_handler(OperatorKeyNeeded, _challenge)
    outage_page = templates().get_template("outage.html")

    async def _outage(_request: Request, exc: Exception) -> HTMLResponse:
        assert isinstance(exc, PageOutage)
        error_response(exc.error)  # logged as every outage the API answers is
        page = outage_page.render(
            at=datetime.now(UTC).timestamp(),
            code=exc.error.code,
            message=OUTAGE_MESSAGES.get(exc.error.code, exc.error.message),
            refresh_seconds=OUTAGE_REFRESH_SECONDS,
            static=STATIC_PATH,
        )
        headers = {**HEADERS, "Retry-After": str(OUTAGE_REFRESH_SECONDS)}
        return HTMLResponse(page, status_code=503, headers=headers)

    app.add_exception_handler(PageOutage, _outage)
    app.mount(STATIC_PATH, _StaticFiles(directory=STATIC_DIR), name="operator-static")
