"""A thin synchronous client for the HTTP API (httpx).

::

    with HypermediaClient("http://127.0.0.1:8080", api_key) as client:
        obj = client.upload(Path("cat.jpg"))
        submitted = client.process(obj.object_id, ["thumbnail"])
        job = client.wait(submitted.job_ids[0], timeout=60)

An API error is raised as the :mod:`hypermedia.errors` class whose ``code`` the server
sent (``not_found`` -> :class:`NotFound`, ``insufficient_credits`` ->
:class:`PaymentRequired` ...) with the server's message and details; a code no class
carries (``internal``, ``method_not_allowed``, a newer server's) becomes a plain
:class:`HypermediaError` whose ``code`` is the server's (its details keep it as
``server_code``, and ``http_status``). Every error made from an answer has the HTTP
status the server sent as ``http_status`` (an ``int``), which is not always the
class's ``status`` (the class's usual one: a body the API's schema refuses is 422
``invalid_request``, while ``InvalidRequest.status`` is 400): switch on ``code``, or
read ``http_status`` for the answer's status. A server that cannot be reached, or sent
no answer, raises :class:`ServiceUnavailable` with ``http_status`` None; an answer
that is not what the API sends (a web page at a base URL that is not the API's, a
value of a newer server's this client does not know) a plain :class:`HypermediaError`
saying so.

Retries (``retries``, 2 by default; backoff 0.5 s doubling, or the ``Retry-After``
the server sends): a request that never reached the server (the connection was
refused or could not be made, or none of the client's own came free) is sent again,
whatever it is; one that may have
reached it (no answer, a dropped connection, a 502/503/504) is sent again only when
repeating it is harmless: reads, :meth:`HypermediaClient.cancel` (a cancel repeated
is answered as the first), :meth:`HypermediaClient.process` and
:meth:`HypermediaClient.upload`, which send an ``Idempotency-Key`` (their own when the
caller names none) so that a submit or an upload whose answer was lost is answered by
the server as the first was (``replayed``), never created (nor stored, nor counted
against the quota) twice (an upload's body is sent again from its start), and
:meth:`HypermediaClient.register`, whose storage key is its idempotency key. Anything
else raises :class:`ServiceUnavailable` saying that the request may have been carried
out.

A 429 ``concurrency_limited`` (:class:`~hypermedia.errors.ConcurrencyLimited`: the user
has as many uploads arriving at once as the API allows, 4 by default; it read nothing
and counted nothing, and closed the connection: the try sent what was in flight, not
the whole body) is sent again after its ``Retry-After`` (a second), its body afresh,
until a place is free, for up to ``timeout`` seconds of waiting in all (then it
is raised); a body that can be read only once (an iterable, a pipe) is not. These
tries are not the ``retries``. A 429 ``rate_limited`` (the user's submits or uploads
a minute used up: :class:`~hypermedia.errors.RateLimited`, whose ``Retry-After`` may be
a minute) and a 402 are raised at once: a caller that would rather wait says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from os import PathLike
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Self, TypeVar, cast
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from hypermedia import tls
from hypermedia.errors import (
    ConcurrencyLimited,
    ConfigError,
    HypermediaError,
    InvalidRequest,
    ServiceUnavailable,
    error_classes,
)
from hypermedia.ingest.client_downloads import OutputDownload, OutputTransfer
from hypermedia.ingest.fields import idempotency_key_problem
from hypermedia.ingest.schemas import (
    AttemptLogResponse,
    CancelResponse,
    CreditsResponse,
    DeleteObjectResponse,
    HealthResponse,
    JobEvent,
    JobResponse,
    JobsPage,
    ObjectResponse,
    OutputUrlResponse,
    ProcessResponse,
    QueuesResponse,
    SubmissionResponse,
)

__all__ = ["PREFIX", "HypermediaClient", "error_from_response"]

PREFIX = "/v1/hypermedia"
_EVENT_STREAMS = 100  # a client's open event streams at most: the API's default per user
_DOWNLOAD_CHUNK = 1 << 20  # bytes an output download writes (or hands on) at a time
_Model = TypeVar("_Model", bound=BaseModel)


def error_from_response(status: int, payload: Any) -> HypermediaError:
    """The exception an error response stands for, its ``http_status`` the answer's
    ``status``."""
    error = _error_of(status, payload)
    error.http_status = status
    return error


def _error_of(status: int, payload: Any) -> HypermediaError:
    body = payload.get("error") if isinstance(payload, Mapping) else None
    if not isinstance(body, Mapping):
        return HypermediaError(f"HTTP {status}", http_status=status)
    code = str(body.get("code", "error"))
    message = str(body.get("message", f"HTTP {status}"))
    details = body.get("details")
    details = dict(details) if isinstance(details, Mapping) else {}
    details.pop("message", None)  # would collide with the constructor's own argument
    cls = error_classes().get(code)
    if cls is None:
        # A code no class carries (a newer server's, a handler's: internal,
        # method_not_allowed): the root class, its code the server's, not "error".
        error = HypermediaError(message, **{**details, "server_code": code, "http_status": status})
        error.code = code
        return error
    if issubclass(cls, ConfigError):
        # ConfigError's constructor builds its message from the key; keep the server's.
        error = ConfigError(str(details.get("key", "?")), message)
        error.message = message
        error.args = (message,)
        return error
    return cls(message, **details)


class HypermediaClient:
    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        retries: int = 2,
        event_streams: int = _EVENT_STREAMS,
    ) -> None:
        """``base_url``: the API's, ``http://`` or ``https://`` and its host, without
        :data:`PREFIX` (anything else raises :class:`~hypermedia.errors.ConfigError`,
        naming it); ``api_key``: its key, the whitespace around it dropped (a key file's
        newline), one a header cannot carry (a space, a character past ASCII inside)
        raises ConfigError, which does not show it; ``timeout``:
        seconds for each connect, read and write of one try; ``retries``: tries after the
        first one (see the module's doc); ``event_streams``: the most event streams
        (:meth:`events`, :meth:`wait`) this client holds open at once, on connections of
        their own: a stream past them waits for one to end (up to its ``timeout``), and
        the other calls always have their own (httpx's pool of 100). A ``transport`` given
        (a test's, one with its own limits) carries both, in its one pool."""
        if retries < 0:
            raise ValueError("retries must be 0 or more")
        if event_streams < 1:
            raise ValueError("event_streams must be 1 or more")
        _check_base_url(base_url)
        api_key = _checked_api_key(api_key)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=timeout,
            transport=transport,
            verify=tls.client_context(),
        )
        # A stream holds its connection as long as its job runs: on the calls' pool, as
        # many streams as a user may open (100) took all of it, and every other call of
        # the client waited its whole timeout, then failed unsent.
        self._streams = self._http
        if transport is None:
            self._streams = httpx.Client(
                base_url=self.base_url,
                headers=headers,
                timeout=timeout,
                verify=tls.client_context(),
                limits=httpx.Limits(
                    max_connections=event_streams,
                    max_keepalive_connections=min(event_streams, 20),
                ),
            )

    # -- plumbing -------------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        model: type[_Model],
        *,
        replayable: bool | None = None,
        content: Callable[[], bytes | Iterable[bytes]] | None = None,
        **kwargs: Any,
    ) -> _Model:
        """One call, tried again as the module's doc says: ``replayable`` (default: a
        GET) when repeating it after it may have reached the server is harmless;
        ``content`` makes the body afresh for each try."""
        if replayable is None:
            replayable = method == "GET"
        tries = 1 + self.retries
        attempt = 0
        waited_until: float | None = None  # the end of its wait for a place (a 429)
        while attempt < tries:
            attempt += 1
            if content is not None:
                kwargs["content"] = content()
            try:
                response = self._http.request(method, path, **kwargs)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                # Nothing reached the server: sending it again is always safe.
                if attempt < tries:
                    self._backoff(attempt, None)
                    continue
                raise ServiceUnavailable(
                    f"cannot reach the API at {self.base_url}: {exc}", url=self.base_url
                ) from exc
            except httpx.PoolTimeout as exc:
                # Never sent: the client's connections were all taken (open event
                # streams, other threads' calls) for the whole timeout.
                if attempt < tries:
                    self._backoff(attempt, None)
                    continue
                raise ServiceUnavailable(
                    f"no connection of this client to the API at {self.base_url} came free"
                    f" for {method} {path} within {self.timeout:g} s (all in use: open"
                    " event streams, other threads' calls); nothing was sent",
                    url=self.base_url,
                ) from exc
            except httpx.TransportError as exc:
                if replayable and attempt < tries:
                    self._backoff(attempt, None)
                    continue
                raise ServiceUnavailable(
                    f"no answer from the API at {self.base_url} to {method} {path} "
                    f"({type(exc).__name__}: {exc}): the request may have been carried out",
                    url=self.base_url,
                ) from exc
            if response.status_code in _RETRIED_STATUSES and replayable and attempt < tries:
                self._backoff(attempt, response.headers.get("Retry-After"))
                continue
            if response.status_code >= 400:
                error = error_from_response(response.status_code, _json_or_none(response))
                if isinstance(error, ConcurrencyLimited) and (content is None or replayable):
                    # Refused unread, nothing counted: sent again (its body afresh) as
                    # soon as one of the user's own has ended, for up to the timeout.
                    now = time.monotonic()
                    if waited_until is None:
                        waited_until = now + self.timeout
                    pause = _retry_after(response) or _BACKOFF_BASE
                    if now + pause < waited_until:
                        time.sleep(pause)
                        attempt -= 1  # a try that was not one
                        continue
                raise error
            return self._read(response, model)
        raise AssertionError("unreachable")

    def _read(self, response: httpx.Response, model: type[_Model]) -> _Model:
        """The answer as ``model``; one that is not (a web page at a base URL that is not
        the API's, a value a newer server added) a HypermediaError saying so."""
        try:
            return model.model_validate_json(response.content)
        except ValidationError as exc:
            raise _unreadable(response, model.__name__, _problems(exc)) from exc

    def _backoff(
        self, attempt: int, retry_after: str | None, deadline: float | None = None
    ) -> None:
        delay = min(_BACKOFF_MAX, _BACKOFF_BASE * 2 ** (attempt - 1))
        if retry_after is not None and retry_after.isdigit():
            delay = min(_BACKOFF_MAX, max(delay, float(retry_after)))
        if deadline is not None:
            delay = max(0.0, min(delay, deadline - time.monotonic()))
        time.sleep(delay)

    def close(self) -> None:
        self._http.close()
        if self._streams is not self._http:
            self._streams.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- objects ----------------------------------------------------------------------------

    def upload(
        self,
        source: Path | str | bytes | bytearray | memoryview | BinaryIO | Iterable[bytes],
        filename: str | None = None,
        pool_id: str | None = None,
        *,
        content_type: str = "application/octet-stream",
        idempotency_key: str | None = None,
    ) -> ObjectResponse:
        """Upload a file: a path (streamed from disk, afresh for each try), bytes (or a
        bytearray, a memoryview), a binary file object (streamed from where it stands: a
        seekable one, such as an open file or a web framework's uploaded file, afresh from
        there for each try) or an iterable of bytes (streamed without a
        ``Content-Length``). ``filename`` defaults to the path's or the file object's
        name; bytes and iterables need one.

        The upload carries ``idempotency_key`` (a new random one when None; one that is
        not 1-200 printable ASCII characters raises :class:`InvalidRequest`, unsent), so
        that a try whose answer was lost is retried safely: the server stores nothing more and
        answers with the first object (``replayed``). A source that can be read only once
        (an iterable, a pipe) is not sent again once its bytes started: such a try
        raises. When every try failed, the :class:`ServiceUnavailable` names the key in
        its details (``idempotency_key``): upload again with it to get the object, if
        there is one. While the user has as many uploads arriving as the API allows (429
        ``concurrency_limited``), the upload waits for a place, sent again after each
        ``Retry-After`` for up to ``timeout`` seconds (not a source read only once); the
        uploads a minute used up (429 ``rate_limited``) raise at once."""
        body = _upload_body(source)
        filename = filename or body.name
        if filename is None:
            raise ValueError("filename is required when uploading bytes or an iterable")
        params = {"filename": filename}
        if pool_id is not None:
            params["pool_id"] = pool_id
        key = _idempotency_key(idempotency_key)
        headers = {"Content-Type": content_type, "Idempotency-Key": key}
        if body.size is not None:
            headers["Content-Length"] = str(body.size)
        try:
            return self._request(
                "PUT",
                f"{PREFIX}/objects",
                ObjectResponse,
                # The key: a retry is answered with the first object, if it can be sent.
                replayable=body.replayable,
                params=params,
                content=body.content,
                headers=headers,
            )
        except ServiceUnavailable as exc:
            if "idempotency_key" not in exc.details:
                exc.details["idempotency_key"] = key
            raise

    def register(
        self,
        storage_key: str,
        filename: str,
        size_bytes: int,
        pool_id: str | None = None,
        content_type: str | None = None,
        sha256: str | None = None,
    ) -> ObjectResponse:
        """Register a file already stored at ``storage_key`` (under
        ``originals/<pool_id>/``).

        The storage key is the registration's idempotency key, so a try whose answer was
        lost is retried safely: the server answers with the first object (``replayed``),
        counted once. When every try failed, the :class:`ServiceUnavailable` names the
        key in its details (``storage_key``): register it again to get the object, if
        there is one. A key registered as another file, or by another user, raises
        :class:`~hypermedia.errors.AlreadyRegistered`."""
        body: dict[str, Any] = {
            "storage_key": storage_key,
            "filename": filename,
            "size_bytes": size_bytes,
        }
        for key, value in (
            ("pool_id", pool_id),
            ("content_type", content_type),
            ("sha256", sha256),
        ):
            if value is not None:
                body[key] = value
        try:
            return self._request(
                "POST",
                f"{PREFIX}/objects/register",
                ObjectResponse,
                replayable=True,  # the storage key: a retry is answered with the first object
                json=body,
            )
        except ServiceUnavailable as exc:
            if "storage_key" not in exc.details:
                exc.details["storage_key"] = storage_key
            raise

    def object(self, object_id: str) -> ObjectResponse:
        return self._request("GET", f"{PREFIX}/objects/{_segment(object_id)}", ObjectResponse)

    def delete(self, object_id: str) -> DeleteObjectResponse:
        """Delete an object of yours, its derived outputs and their stored bytes."""
        return self._request(
            "DELETE", f"{PREFIX}/objects/{_segment(object_id)}", DeleteObjectResponse
        )

    # -- jobs --------------------------------------------------------------------------------

    def process(
        self,
        object_id: str,
        operations: str | Iterable[str],
        priority: int | None = None,
        params: Mapping[str, Mapping[str, Any]] | None = None,
        idempotency_key: str | None = None,
        callback_url: str | None = None,
    ) -> ProcessResponse:
        """Submit ``operations`` (one name, or several) on an object; ``callback_url``:
        POSTed each job, signed, once it has ended (a host the server allows).

        The submit carries ``idempotency_key`` (a new random one when None; one that is
        not 1-200 printable ASCII characters raises :class:`InvalidRequest`, unsent), so
        that a try whose answer was lost is retried safely: the server answers the retry as
        it did the first (``replayed``). When every try failed, the
        :class:`ServiceUnavailable` names the key in its details
        (``idempotency_key``): submit again with it to learn what became of it."""
        body: dict[str, Any] = {"object_id": object_id, "operations": _names(operations)}
        if priority is not None:
            body["priority"] = priority
        if callback_url is not None:
            body["callback_url"] = callback_url
        if params:
            body["params"] = {op: dict(p) for op, p in params.items()}
        key = _idempotency_key(idempotency_key)
        try:
            return self._request(
                "POST",
                f"{PREFIX}/process",
                ProcessResponse,
                replayable=True,
                json=body,
                headers={"Idempotency-Key": key},
            )
        except ServiceUnavailable as exc:
            if "idempotency_key" not in exc.details:
                exc.details["idempotency_key"] = key
            raise

    def job(self, job_id: str) -> JobResponse:
        return self._request("GET", f"{PREFIX}/jobs/{_segment(job_id)}", JobResponse)

    def list_jobs(
        self,
        *,
        status: str | Iterable[str] = (),
        operation: str | None = None,
        object_id: str | None = None,
        submission_id: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> JobsPage:
        """One page of your jobs, newest first; pass its ``next_cursor`` as ``cursor``
        for the next. ``status``: one, or any of several."""
        params: dict[str, Any] = {"status": _names(status), "limit": limit}
        for name, value in (
            ("operation", operation),
            ("object_id", object_id),
            ("submission_id", submission_id),
            ("created_after", None if created_after is None else created_after.isoformat()),
            ("created_before", None if created_before is None else created_before.isoformat()),
            ("cursor", cursor),
        ):
            if value is not None:
                params[name] = value
        return self._request("GET", f"{PREFIX}/jobs", JobsPage, params=params)

    def submission(self, submission_id: str) -> SubmissionResponse:
        return self._request(
            "GET", f"{PREFIX}/submissions/{_segment(submission_id)}", SubmissionResponse
        )

    def output_url(self, job_id: str, output_type: str) -> OutputUrlResponse:
        """A short-lived URL that downloads the output without an API key."""
        path = f"{PREFIX}/jobs/{_segment(job_id)}/outputs/{_segment(output_type)}/url"
        return self._request("GET", path, OutputUrlResponse)

    def download(self, job_id: str, output_type: str, to: Path | str | BinaryIO) -> OutputDownload:
        """Save one of a job's outputs to ``to``: a path (written to ``<name>.part``
        beside it, renamed once whole; nothing left under either name when it fails) or
        a binary file object, written from where it stands (started again from there
        when the output was replaced during the transfer and it is seekable).

        Streamed (1 MiB chunks, never the whole output in memory) from its signed URL
        (:meth:`output_url`), with the client's TLS, timeout and retries: a try that got
        no answer is sent again, and a transfer that dropped midway is taken up where it
        stopped (a ``Range``); see :mod:`hypermedia.ingest.client_downloads`. Errors are
        the client's: :class:`~hypermedia.errors.NotFound` (no such job or output),
        :class:`ServiceUnavailable` when every try failed (``received_bytes`` in its
        details)."""
        if isinstance(to, str | PathLike):
            return self._download_to_path(job_id, output_type, Path(to))
        restart: Callable[[], None] | None = None
        if to.seekable():
            start = to.tell()

            def rewind() -> None:
                to.seek(start)
                to.truncate()

            restart = rewind
        transfer = self._output_transfer(job_id, output_type)
        for chunk in transfer.chunks(_DOWNLOAD_CHUNK, restart):
            to.write(chunk)
        return _downloaded(job_id, output_type, transfer)

    def _download_to_path(self, job_id: str, output_type: str, path: Path) -> OutputDownload:
        part = path.with_name(f"{path.name}.part")
        try:
            with part.open("wb") as handle:
                done = self.download(job_id, output_type, handle)
            part.replace(path)
        except BaseException:
            part.unlink(missing_ok=True)
            raise
        return done

    def output_chunks(
        self, job_id: str, output_type: str, *, chunk_size: int = _DOWNLOAD_CHUNK
    ) -> Iterator[bytes]:
        """One of a job's outputs as chunks of bytes (a web framework's streaming
        response), fetched as :meth:`download` fetches it; its connection is held until
        the iterator is exhausted or closed. A transfer that dropped is taken up where
        it stopped; one whose output was replaced meanwhile raises (its first bytes
        were handed on)."""
        return self._output_transfer(job_id, output_type).chunks(chunk_size, None)

    def _output_transfer(self, job_id: str, output_type: str) -> OutputTransfer:
        return OutputTransfer(
            self._http,
            lambda: self.output_url(job_id, output_type),
            self._blob_url,
            error_from_response,
            lambda attempt: self._backoff(attempt, None),
            self.retries,
        )

    def _blob_url(self, url: str) -> str:
        """A local storage's blob URL (signed with the API's public URL) through this
        client's base URL: the same API, where this client reaches it (a web tier's
        internal address; the signature does not cover the host). Any other URL (an
        object store's) as it is."""
        path = httpx.URL(url).raw_path.decode("ascii")  # with its query
        at = path.find(f"{PREFIX}/blobs/")
        return url if at < 0 else self.base_url + path[at:]

    def attempt_log(self, job_id: str, attempt_number: int) -> str:
        """The end of what a failed attempt's child printed."""
        path = f"{PREFIX}/jobs/{_segment(job_id)}/attempts/{_segment(str(attempt_number))}/log"
        return self._request("GET", path, AttemptLogResponse).log

    def cancel(self, job_id: str) -> CancelResponse:
        """Cancel a job, or ask a running one to stop. Sent again when its answer was
        lost: a cancel repeated is answered as the first (cancelled, or cancel requested)."""
        path = f"{PREFIX}/jobs/{_segment(job_id)}/cancel"
        return self._request("POST", path, CancelResponse, replayable=True)

    def events(
        self, job_id: str, *, last_event_id: str | None = None, timeout: float | None = None
    ) -> Iterator[JobEvent]:
        """The job's events (``GET /jobs/{id}/events``): its recent ones, its status as
        the record has it, then each as it happens, until it has ended. A dropped
        connection is resumed where it left off (``Last-Event-ID``; the record's
        status the server sends on each connection is passed on again only when it
        differs, in status or attempt, from the last status passed on), after the
        ``retry`` the server asks for, doubling while the API stays away (refused
        connections, as while it restarts: about a minute in all, the
        ``_EVENT_STREAM_DROPS`` tries; a 503, the server stopping or full, counts the
        same, after its ``Retry-After``, and so does a connection on which nothing comes
        for 45 s, three keep-alives); an API that never answered in this call (refused,
        or silent for 45 s) is tried as any request (``retries``). A 429 (the user's
        streams are all taken) is tried again after its ``Retry-After`` until one is
        free. ``timeout``: seconds in all
        (each try's connect and read included), then TimeoutError naming the last status
        (when no event said it, the record's: one read of at most
        ``_STATUS_READ_SECONDS`` more)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        state = _Following(job_id, last_event_id)
        drops = 0
        unanswered = 0  # tries that got no answer (refused, silent) before one did
        while True:
            try:
                for event in self._event_stream(state, deadline):
                    drops = 0
                    yield event
                    if event.ends:
                        return
            except httpx.PoolTimeout:
                # This client's event_streams were all open for the whole timeout (a
                # stream waits for one without a timeout, so only with one).
                raise self._timed_out(state, timeout) from None
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if deadline is not None and time.monotonic() >= deadline:
                    raise self._timed_out(state, timeout) from None
                if state.connected:
                    drops += 1
                else:
                    unanswered += 1
                if drops > _EVENT_STREAM_DROPS or unanswered > self.retries:
                    raise ServiceUnavailable(
                        f"cannot reach the API at {self.base_url}: {exc}", url=self.base_url
                    ) from exc
                if not state.connected:
                    self._backoff(unanswered, None, deadline)
                    continue
            except httpx.TransportError as exc:
                # Dropped (a reset, a closed connection) or silent past three keep-alives
                # (ReadTimeout: an API that hangs), or no answer at all in this call.
                if deadline is not None and time.monotonic() >= deadline:
                    raise self._timed_out(state, timeout) from None
                if not state.connected:
                    unanswered += 1
                    if unanswered > self.retries:
                        raise ServiceUnavailable(
                            f"no answer from the API at {self.base_url} to the event stream"
                            f" of job {job_id} ({type(exc).__name__}: {exc})",
                            url=self.base_url,
                        ) from exc
                    self._backoff(unanswered, None, deadline)
                    continue
                drops += 1
                if drops > _EVENT_STREAM_DROPS:
                    raise ServiceUnavailable(
                        f"the event stream of job {job_id} at {self.base_url} keeps"
                        f" dropping ({type(exc).__name__}: {exc})",
                        url=self.base_url,
                    ) from exc
            except _StreamRefused as refusal:
                # The server is there: the user's streams are all taken (429; one
                # ends when its job does), or this server's, or it is stopping (503).
                if refusal.error.http_status != 429:
                    drops += 1
                    if drops > _EVENT_STREAM_DROPS:
                        raise refusal.error from None
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    raise self._timed_out(state, timeout) from None
                pause = min(_BACKOFF_MAX, refusal.retry_after or state.retry)
                time.sleep(pause if deadline is None else min(pause, deadline - now))
                continue
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise self._timed_out(state, timeout)
            pause = min(_BACKOFF_MAX, state.retry * 2 ** max(0, drops - 1))
            time.sleep(pause if deadline is None else min(pause, deadline - now))

    def _timed_out(self, state: _Following, timeout: float | None) -> TimeoutError:
        """TimeoutError naming the job's last status: the record's, read once, when no
        event said it within ``timeout`` (a short one, a slow stream: "still unknown").
        That read is one try of at most ``_STATUS_READ_SECONDS``: with :meth:`job`'s
        retries and timeouts, a wait(timeout=5) on an API that does not answer raised
        after 5 + 3 x 30 s; its body is read within that time too (bytes that kept
        coming held it for as long as they came)."""
        if state.status == "unknown":
            path = f"{PREFIX}/jobs/{_segment(state.job_id)}"
            limit = min(self.timeout, _STATUS_READ_SECONDS)
            end = time.monotonic() + limit
            with (
                contextlib.suppress(ValueError, httpx.HTTPError),
                self._http.stream("GET", path, timeout=limit) as response,
            ):
                if response.status_code == 200:
                    body = bytearray()
                    for piece in response.iter_bytes():
                        body += piece
                        if time.monotonic() >= end:
                            raise ValueError("the job's status did not come in time")
                    state.status = JobResponse.model_validate_json(bytes(body)).status
        return state.timed_out(timeout)

    def _event_stream(self, state: _Following, deadline: float | None) -> Iterator[JobEvent]:
        headers = {"Accept": "text/event-stream"}
        if state.last_id is not None:
            headers["Last-Event-ID"] = state.last_id
        # Keep-alives come every 15 s: a longer silence is a dead connection.
        limit, read = self.timeout, _EVENT_READ_TIMEOUT
        # One of this client's event_streams: waited for until one ends (or the deadline).
        pool: float | None = None
        if deadline is not None:  # a connect (an API that takes none) within it too
            left = max(0.001, deadline - time.monotonic())
            limit, read, pool = min(limit, left), min(read, left), left
        path = f"{PREFIX}/jobs/{_segment(state.job_id)}/events"
        with self._streams.stream(
            "GET", path, headers=headers, timeout=httpx.Timeout(limit, read=read, pool=pool)
        ) as response:
            state.connected = True
            if response.status_code >= 400:
                response.read()
                error = error_from_response(response.status_code, _json_or_none(response))
                if response.status_code in (429, 503):
                    raise _StreamRefused(error, response.headers.get("Retry-After", ""))
                raise error
            if not response.headers.get("content-type", "").startswith("text/event-stream"):
                # Not the API (a web page): following it again and again would never end.
                raise _unreadable(response, "event stream", "not text/event-stream")
            lines = response.iter_lines() if deadline is None else _lines(response, deadline)
            events = _server_sent_events(lines, state)
            try:
                for event in events:
                    if event is not None and not state.repeats(event):
                        state.seen(event)
                        yield event
                    if deadline is not None and time.monotonic() >= deadline:
                        return  # events() says it timed out
            except ValueError as exc:  # json's, or pydantic's ValidationError
                raise _unreadable(response, "JobEvent", _problems(exc)) from exc

    def wait(self, job_id: str, timeout: float = 300.0) -> JobResponse:
        """Follow the job's events (:meth:`events`) until it is completed, failed or
        cancelled, then answer the job; TimeoutError after ``timeout`` seconds."""
        for event in self.events(job_id, timeout=timeout):
            if event.ends:
                break
        return self.job(job_id)

    # -- accounts and operators ----------------------------------------------------------------

    def credits(self) -> CreditsResponse:
        return self._request("GET", f"{PREFIX}/credits", CreditsResponse)

    def queues(self) -> QueuesResponse:
        return self._request("GET", f"{PREFIX}/queues", QueuesResponse)

    def health(self) -> HealthResponse:
        """``/healthz``; a 503 answer is returned (status ``unavailable``), not raised."""
        try:
            response = self._http.get("/healthz")
        except httpx.TransportError as exc:
            raise ServiceUnavailable(
                f"cannot reach the API at {self.base_url}: {exc}", url=self.base_url
            ) from exc
        if response.status_code not in (200, 503):
            raise error_from_response(response.status_code, _json_or_none(response))
        return self._read(response, HealthResponse)


_RETRIED_STATUSES = frozenset({502, 503, 504})
_BACKOFF_BASE = 0.5  # seconds before the second try, doubling
_BACKOFF_MAX = 30.0
_EVENT_READ_TIMEOUT = 45.0  # three keep-alives
_EVENT_STREAM_DROPS = 5  # connections in a row that drop without an event: then give up
_STATUS_READ_SECONDS = 2.0  # the job's status read once a wait has timed out
_LINE_END = re.compile(r"\r\n|\r|\n")


class _StreamRefused(Exception):
    """The API answered an event stream 429 or 503: try again after ``retry_after``."""

    def __init__(self, error: HypermediaError, retry_after: str) -> None:
        super().__init__(error.message)
        self.error = error
        self.retry_after = float(retry_after) if retry_after.isdigit() else None


class _Following:
    """Where a client is in a job's event stream."""

    def __init__(self, job_id: str, last_id: str | None) -> None:
        self.job_id = job_id
        self.last_id = last_id
        self.status = "unknown"
        self.attempt: int | None = None  # the last status event's
        self.retry = 2.0
        self.connected = False  # whether the API answered once

    def seen(self, event: JobEvent) -> None:
        if event.id is not None:
            self.last_id = event.id
        if event.type == "status" and event.status is not None:
            self.status, self.attempt = event.status, event.attempt

    def repeats(self, event: JobEvent) -> bool:
        """Whether ``event`` is the record's status (no id) that the last status event
        passed on said already: the server sends it on every connection, and a stream
        taken up again passed the job's "processing" on twice. One of another attempt
        is news."""
        return (
            event.id is None
            and event.type == "status"
            and event.status == self.status
            and (event.attempt is None or self.attempt is None or event.attempt == self.attempt)
        )

    def timed_out(self, timeout: float | None) -> TimeoutError:
        return TimeoutError(f"job {self.job_id} is still {self.status} after {timeout:g} s")


def _lines(response: httpx.Response, deadline: float) -> Iterator[str]:
    """The stream's lines (ended by CRLF, LF or CR, as ``text/event-stream`` says),
    ending as a stream that ended once ``deadline`` has passed, looked at after every
    piece that comes: each read waits at most its own timeout, and bytes that keep
    coming without ending a line (a proxy, an API gone wrong) held a wait with a
    timeout for as long as they came."""
    pending = ""
    for text in response.iter_text():
        buffer = pending + text
        # A CR at the end may be a CRLF's: its line is told once what follows is known.
        held = "\r" if buffer.endswith("\r") else ""
        *whole, rest = _LINE_END.split(buffer.removesuffix(held))
        pending = rest + held
        yield from whole
        if time.monotonic() >= deadline:
            return
    if pending.endswith("\r"):
        yield pending[:-1]
    elif pending:
        yield pending


def _server_sent_events(lines: Iterable[str], state: _Following) -> Iterator[JobEvent | None]:
    """Parse ``text/event-stream`` (the fields this API sends: id, event, data, retry);
    None for a comment (a keep-alive), so the reader can look at its clock."""
    entry: str | None = None
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                body = json.loads("\n".join(data))
                yield JobEvent.model_validate({**body, "id": entry})
            entry, data = None, []
            continue
        if line.startswith(":"):
            yield None
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "id":
            entry = value
        elif name == "data":
            data.append(value)
        elif name == "retry" and value.isdigit():
            state.retry = int(value) / 1000


def _downloaded(job_id: str, output_type: str, transfer: OutputTransfer) -> OutputDownload:
    return OutputDownload(
        job_id=job_id,
        output_type=output_type,
        size_bytes=transfer.received,
        content_type=transfer.content_type,
        resumed=transfer.resumed,
        restarted=transfer.restarted,
    )


def _unreadable(response: httpx.Response, expected: str, problem: str) -> HypermediaError:
    """A HypermediaError for an answer that is not the ``expected`` the API sends."""
    content_type = response.headers.get("content-type", "no Content-Type")
    request = response.request
    error = HypermediaError(
        f"the answer to {request.method} {request.url} (HTTP {response.status_code},"
        f" {content_type}) is not a {expected} this client can read ({problem}):"
        " is it the hypermedia API, and of a version this client knows?",
        url=str(request.url),
    )
    error.http_status = response.status_code
    return error


def _problems(exc: ValueError) -> str:
    if not isinstance(exc, ValidationError):
        return str(exc)
    return "; ".join(
        f"{'.'.join(str(part) for part in e['loc']) or 'body'}: {e['msg']}"
        for e in exc.errors()[:3]
    )


def _idempotency_key(given: str | None) -> str:
    """``given``, or a new random key; a key the API would refuse (it travels in a
    header: printable ASCII, see :data:`~hypermedia.ingest.fields.IDEMPOTENCY_KEY_RULE`)
    raises :class:`InvalidRequest` before anything is sent."""
    if given is None:
        return uuid.uuid4().hex
    problem = idempotency_key_problem(given)
    if problem is not None:
        raise InvalidRequest(f"idempotency_key {problem}", idempotency_key=given)
    return given


def _checked_api_key(api_key: str | None) -> str | None:
    """``api_key`` without the whitespace around it: read from a file (``read_text()``),
    its newline made every request fail in httpx (an illegal header value), retried,
    as "no answer from the API ... the request may have been carried out"; a key
    with a character past ASCII raised UnicodeEncodeError. Any character a header
    cannot carry is a ConfigError, which names where it is but not the key."""
    if api_key is None:
        return None
    key = api_key.strip()
    for at, char in enumerate(key):
        if not "!" <= char <= "~":
            raise ConfigError(
                "api_key",
                f"U+{ord(char):04X} at {at} of {len(key)} characters: an API key is"
                " printable ASCII without spaces (hm_...)",
            )
    return key


def _check_base_url(base_url: str) -> None:
    """A base URL that names no http(s) scheme or no host (``127.0.0.1:8080``,
    ``localhost:8080``) raises ConfigError: httpx would refuse each request, after the
    retries, as an API that may have carried it out; so does one ending with
    :data:`PREFIX`."""
    try:
        url = httpx.URL(base_url)
    except httpx.InvalidURL as exc:
        raise ConfigError("base_url", f"{base_url!r} is not a URL: {exc}") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise ConfigError(
            "base_url",
            f"{base_url!r} is not an http:// or https:// URL with a host"
            " (such as http://127.0.0.1:8080)",
        )
    if url.path.rstrip("/").endswith(PREFIX):
        # Every path would be PREFIX twice: each call a 404 not_found, as a job or an
        # object that does not exist (a web tier would take its jobs for gone).
        raise ConfigError(
            "base_url",
            f"{base_url!r} ends with {PREFIX}, which the client adds itself: give the"
            f" URL the API is served at ({base_url.rstrip('/').removesuffix(PREFIX)!r})",
        )


def _names(given: str | Iterable[str]) -> list[str]:
    """One name, or several: a str is Iterable[str] too, and ``list("thumbnail")`` sent
    nine one-letter operations (422 "unknown operation 't'")."""
    return [given] if isinstance(given, str) else list(given)


def _segment(value: str) -> str:
    """``value`` as one path segment: escaped, so that an id (a user's, handed on by a
    web tier) cannot name another route (``../bulk/runs/<id>``, ``x?y``); a dot segment
    escaped too, or httpx would resolve it."""
    quoted = quote(value, safe="")
    return quoted.replace(".", "%2E") if value in (".", "..") else quoted


def _retry_after(response: httpx.Response) -> float | None:
    """The answer's ``Retry-After`` in seconds (the API sends whole ones), at most
    ``_BACKOFF_MAX``; None when it has none."""
    value = response.headers.get("Retry-After", "")
    return min(_BACKOFF_MAX, float(value)) if value.isdigit() else None


def _json_or_none(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _file_chunks(path: Path, chunk_size: int = 1 << 20) -> Iterable[bytes]:
    with path.open("rb") as handle:
        yield from _read_chunks(handle, chunk_size)


def _read_chunks(handle: BinaryIO, chunk_size: int = 1 << 20) -> Iterator[bytes]:
    while chunk := handle.read(chunk_size):
        yield chunk


@dataclass(frozen=True, slots=True)
class _UploadBody:
    """What an upload sends: ``content()`` makes the body for a try; ``replayable``: a
    try that may have reached the server can be sent again (see :func:`_upload_body`)."""

    content: Callable[[], bytes | Iterable[bytes]]
    size: int | None  # None: unknown, sent chunked
    name: str | None  # the file's, when it has one
    replayable: bool


def _upload_body(
    source: Path | str | bytes | bytearray | memoryview | BinaryIO | Iterable[bytes],
) -> _UploadBody:
    if isinstance(source, bytes | bytearray | memoryview):
        data = bytes(source)
        return _UploadBody(lambda: data, len(data), None, True)
    if isinstance(source, str | PathLike):
        path = Path(source)
        return _UploadBody(lambda: _file_chunks(path), path.stat().st_size, path.name, True)
    name = getattr(source, "name", None)
    name = Path(name).name if isinstance(name, str) and name else None
    if hasattr(source, "read"):
        handle = cast(BinaryIO, source)
        if handle.seekable():
            start = handle.tell()
            size = handle.seek(0, os.SEEK_END) - start
            handle.seek(start)

            def from_start() -> Iterable[bytes]:
                handle.seek(start)
                return _read_chunks(handle)

            return _UploadBody(from_start, size, name, True)
        return _UploadBody(_Once(_read_chunks(handle)), None, name, False)
    if isinstance(source, Iterable):
        return _UploadBody(_Once(iter(source)), None, name, False)
    raise TypeError(
        f"cannot upload a {type(source).__name__}: pass a path, bytes, a file or chunks"
    )


class _Once:
    """The body of a source that can be read once: handed out again only while none of
    it was sent (a connection refused before the body went out)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._started = False

    def __call__(self) -> Iterable[bytes]:
        if self._started:
            raise ServiceUnavailable(
                "the upload's connection broke after part of its body was sent, and the"
                " body (an iterable, a pipe) cannot be read again: upload it again",
            )
        return self._sent()

    def _sent(self) -> Iterator[bytes]:
        for chunk in self._chunks:
            self._started = True
            yield chunk
