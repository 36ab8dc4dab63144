"""The API's front door: authenticate, then bound the body, before the app reads a byte.

FastAPI reads and parses a JSON body before it resolves any dependency, so a route
whose authentication is a dependency would swallow a 300 MB body from anyone before
answering 401. :class:`RequestGuard` is an ASGI middleware that runs first:

1. a route that needs an API key (:attr:`RouteRule.needs_key`) is authenticated from
   the ``Authorization`` header alone; a missing or bad key answers 401 at once, and
   the caller is left in ``scope["state"]["caller"]`` for the routes;
2. a ``Content-Length`` over the route's limit answers 413 without reading the body;
3. a buffered route (JSON: small limits) has its body read here, counted chunk by
   chunk (a chunked body has no ``Content-Length``), refused with 413 past the limit,
   or with 408 ``request_timeout`` (the connection closed) when it is not whole
   ``body_seconds`` after the guard began reading it (``json_body_seconds``: uvicorn
   waits for a body as long as its client keeps the connection, so one declared longer
   than sent held its socket for good), and then replayed to the app; a streamed route
   (uploads) is passed through, and its handler stops the stream at the same limit and
   paces it (``upload_idle_seconds``: an upload is cut when it stops, never for its length).

An answer begun before the request's body was read whole (the guard's refusals, a
route's early one: an upload's 429) closes the connection (``Connection: close``):
uvicorn would read and drop the rest for a client that sends it all (httpx).

Refusals are the API's usual ``{"error": {...}}`` bodies (:mod:`.http_errors`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import anyio
import anyio.to_thread
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hypermedia.accounts import Caller
from hypermedia.errors import (
    AuthenticationFailed,
    HypermediaError,
    RequestTimeout,
    RequestTooLarge,
    UnsupportedMediaType,
)
from hypermedia.ingest.auth import Authenticator
from hypermedia.ingest.http_errors import error_response
from hypermedia.storage.base import too_large


@dataclass(frozen=True, slots=True)
class RouteRule:
    """What the guard demands of a request to one route."""

    needs_key: bool
    max_body_bytes: int
    streamed: bool = False


Rules = Callable[[str, str], RouteRule]  # (method, path) -> rule


def bearer_token(headers: Headers) -> str | None:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


class RequestGuard:
    def __init__(
        self, app: ASGIApp, *, authenticator: Authenticator, rules: Rules, body_seconds: float
    ) -> None:
        self.app = app
        self.authenticator = authenticator
        self.rules = rules
        self.body_seconds = body_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rule = self.rules(scope["method"], scope["path"])
        headers = Headers(scope=scope)
        if _has_body(headers):
            receive, send = _closing_unless_read(receive, send)
        try:
            if rule.needs_key:
                scope.setdefault("state", {})["caller"] = await self._authenticate(headers)
            declared = headers.get("content-length", "")
            if declared.isdigit() and int(declared) > rule.max_body_bytes:
                raise _too_large(rule)
            if not rule.streamed:
                _check_charset(headers)
                receive = await _buffered(receive, rule, self.body_seconds)
        except HypermediaError as exc:
            # Its body not read whole: the connection is closed after it (see below).
            await error_response(exc)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _authenticate(self, headers: Headers) -> Caller:
        token = bearer_token(headers)
        if token is None:
            raise AuthenticationFailed("missing API key: send Authorization: Bearer hm_...")
        cached = self.authenticator.cached(token)
        if cached is not None:
            return cached  # no thread hop on the hot path
        return await anyio.to_thread.run_sync(self.authenticator, token)


def _has_body(headers: Headers) -> bool:
    declared = headers.get("content-length")
    return "transfer-encoding" in headers or (declared is not None and declared != "0")


def _closing_unless_read(receive: Receive, send: Send) -> tuple[Receive, Send]:
    """``receive`` and ``send`` such that an answer begun before the request's body was
    read whole (a 401, a 413, a 429 before an upload's first byte was read, a body cut
    past its limit or its time) says ``Connection: close``, and uvicorn closes the
    connection after it. Else uvicorn reads and drops the rest of the body to keep the
    connection, and a client that sends its whole body before it reads an answer
    (httpx: no ``Expect: 100-continue``) sends all of it: the client's upload sent
    again after each 429 ``concurrency_limited`` sent its 100 MB body whole each time.
    Closed, the client's next write fails and it reads the answer (httpx does): what
    it sent is what was in flight, about a socket buffer."""
    read = False

    async def receiving() -> Message:
        nonlocal read
        message = await receive()
        if message["type"] == "http.request" and not message.get("more_body", False):
            read = True
        return message

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start" and not read:
            headers = [*message.get("headers", []), (b"connection", b"close")]
            message = {**message, "headers": headers}
        await send(message)

    return receiving, sending


def _check_charset(headers: Headers) -> None:
    """415 for a buffered (JSON) body said to be in another charset than UTF-8: it was
    read as UTF-8 all the same (``charset=latin1``: its accented letters refused, or
    read as other text)."""
    if headers.get("content-length", "") in ("", "0") and "transfer-encoding" not in headers:
        return  # no body
    content_type = headers.get("content-type", "")
    for parameter in content_type.split(";")[1:]:
        name, _, value = parameter.partition("=")
        charset = value.strip().strip('"').lower()
        if name.strip().lower() == "charset" and charset not in ("utf-8", "utf8"):
            raise UnsupportedMediaType(
                f"this route takes JSON in UTF-8: the request said charset={charset[:40]} "
                "(send Content-Type: application/json)",
                content_type=content_type,
            )


def _too_large(rule: RouteRule) -> HypermediaError:
    if rule.streamed:
        return too_large(rule.max_body_bytes)
    return RequestTooLarge(
        f"request body exceeds the limit of {rule.max_body_bytes} bytes for this route",
        max_bytes=rule.max_body_bytes,
    )


async def _buffered(receive: Receive, rule: RouteRule, seconds: float) -> Receive:
    """Read the whole body (at most ``rule.max_body_bytes``, within ``seconds``) and
    return a ``receive`` that replays it, then hands over to the real one (for
    ``http.disconnect``)."""
    chunks: list[bytes] = []
    size = 0
    with anyio.move_on_after(seconds):
        while True:
            message = await receive()
            if message["type"] != "http.request":
                # The client went away: let the app see the disconnect as it would.
                return _replay(message, receive)
            body = message.get("body", b"")
            size += len(body)
            if size > rule.max_body_bytes:
                raise _too_large(rule)
            chunks.append(body)
            if not message.get("more_body", False):
                return _replay({"type": "http.request", "body": b"".join(chunks)}, receive)
    raise RequestTimeout(
        f"the request body did not arrive within {seconds:g} s ({size} bytes came)",
        timeout_seconds=seconds,
        received_bytes=size,
    )


def _replay(first: Message, receive: Receive) -> Receive:
    pending: list[Message] = [first]

    async def replay() -> Message:
        if pending:
            return pending.pop()
        return await receive()

    return replay
