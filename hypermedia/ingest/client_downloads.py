"""A job's output fetched through its signed URL, for :class:`HypermediaClient`'s
``download`` and ``output_chunks``.

The URL (``GET /jobs/{id}/outputs/{type}/url``) is fetched without the API key (it is
its own credential; S3 refuses a request with two): a local storage's blob route
(``/v1/hypermedia/blobs/...``, signed with the API's public URL) through the client's
base URL, which a web tier reaches even where the public URL is another host's; an
object store's as it is. Bytes stream in chunks, never the whole output in memory.

A try that got no answer, or 502/503/504, is tried again (``retries`` tries in a row
that brought no new byte, with the client's backoff); a transfer that drops after some
bytes is taken up where it stopped with ``Range: bytes=N-`` and ``If-Range`` (the
first answer's ``ETag``): 206 goes on; a whole answer (200) under the same strong
``ETag`` is the same bytes, those already had skipped; under another (the output
replaced) the transfer starts again from its first byte when the target can be
rewound, else raises. The size the transfer must reach is the answer's (its
``Content-Range`` total, a whole answer's ``Content-Length``): a replaced output's
own, once it started again. A 206 of another total than the bytes had (from a store
with no strong ``ETag``, so no ``If-Range``) is a replaced output too: it raises, the
two never spliced (one of the same size cannot be told without an ``ETag``).

A URL past its ``expires_at`` is asked for afresh before a try, and so is one a 403
refused as expired (the API's ``url_expired``, an object store's 403), once in a row,
whatever the client's clock said: the URL's expiry is the server's clock's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx

from hypermedia.errors import (
    Forbidden,
    HypermediaError,
    NotFound,
    RangeNotSatisfiable,
    ServiceUnavailable,
)
from hypermedia.ingest.schemas import OutputUrlResponse

__all__ = ["OutputDownload"]

_RETRIED_STATUSES = frozenset({502, 503, 504})
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_URL_MARGIN = 5.0  # seconds before its expiry a URL is taken as expired


@dataclass(frozen=True, slots=True)
class OutputDownload:
    """What :meth:`HypermediaClient.download` wrote."""

    job_id: str
    output_type: str
    size_bytes: int
    content_type: str | None
    resumed: int  # times a dropped transfer was taken up where it stopped (Range)
    restarted: int  # times it started again from the first byte (the output replaced)


class OutputTransfer:
    """One output's bytes, as :meth:`chunks` yields them; its counters once done.

    ``link`` asks the API for a (fresh) signed URL; ``blob_url`` maps it to the URL
    fetched; ``error_of`` makes the client's exception of an error answer; ``backoff``
    sleeps before the nth try again."""

    def __init__(
        self,
        http: httpx.Client,
        link: Callable[[], OutputUrlResponse],
        blob_url: Callable[[str], str],
        error_of: Callable[[int, object], HypermediaError],
        backoff: Callable[[int], None],
        retries: int,
    ) -> None:
        self._http = http
        self._link = link
        self._blob_url = blob_url
        self._error_of = error_of
        self._backoff = backoff
        self._retries = retries
        self.received = 0
        self.resumed = 0
        self.restarted = 0
        self.content_type: str | None = None
        self.size: int | None = None

    def chunks(self, chunk_size: int, restart: Callable[[], None] | None) -> Iterator[bytes]:
        """The output's bytes. ``restart``: rewinds what was written, when the output
        was replaced during the transfer (None: that raises)."""
        link = self._link()
        self.content_type, self.size = link.content_type, link.size_bytes
        etag: str | None = None
        failures = 0  # tries in a row that brought no new byte
        renewed = False  # the URL was asked for afresh on a 403 (once in a row)
        while True:
            if _expired(link):
                link = self._link()
            request = self._request(link.url, etag)
            try:
                response = self._http.send(request, stream=True)
            except httpx.TransportError as exc:
                failures = self._failed(failures, exc, request)
                continue
            try:
                if response.status_code in _RETRIED_STATUSES and failures < self._retries:
                    failures += 1
                    self._backoff(failures)
                    continue
                if response.status_code >= 400:
                    response.read()
                    error = _error(response, self._error_of)
                    if response.status_code == 403 and not renewed and _maybe_expired(error):
                        # Expired by the server's clock, which is not the client's.
                        renewed = True
                        link = self._link()
                        continue
                    raise error
                renewed = False
                skip = self._skip(response, etag, restart)
                self.size = _size(response, self.size)
                etag = _strong(response.headers.get("etag"))
                self.content_type = response.headers.get("content-type", self.content_type)
                for chunk in response.iter_bytes(chunk_size):
                    if skip:
                        kept = chunk[skip:]
                        skip -= len(chunk) - len(kept)
                        chunk = kept
                    if chunk:
                        self.received += len(chunk)
                        failures = 0
                        yield chunk
            except httpx.TransportError as exc:
                failures = self._failed(failures, exc, request)
                if self.received:
                    self.resumed += 1
                continue
            finally:
                response.close()
            if self.size is not None and self.received != self.size:
                raise HypermediaError(
                    f"the download of {_shown(request)} ended after {self.received} of its"
                    f" {self.size} bytes",
                    url=_shown(request),
                )
            return

    def _request(self, url: str, etag: str | None) -> httpx.Request:
        headers: dict[str, str] = {}
        if self.received:
            headers["Range"] = f"bytes={self.received}-"
            if etag is not None:
                headers["If-Range"] = etag
        request = self._http.build_request("GET", self._blob_url(url), headers=headers)
        # The signed URL is the credential: the API key goes nowhere else.
        request.headers.pop("Authorization", None)
        return request

    def _failed(self, failures: int, exc: httpx.TransportError, request: httpx.Request) -> int:
        """Count a try that failed; raise past the retries."""
        failures += 1
        if failures > self._retries:
            raise ServiceUnavailable(
                f"the download of {_shown(request)} failed after {self.received} bytes"
                f" ({type(exc).__name__}: {exc})",
                url=_shown(request),
                received_bytes=self.received,
            ) from exc
        self._backoff(failures)
        return failures

    def _skip(
        self, response: httpx.Response, etag: str | None, restart: Callable[[], None] | None
    ) -> int:
        """How many bytes of this answer were had already."""
        if not self.received:
            return 0
        if response.status_code == 206:
            found = _CONTENT_RANGE.fullmatch(response.headers.get("content-range", ""))
            if found is None or int(found.group(1)) != self.received:
                raise HypermediaError(
                    f"the download of {_shown(response.request)} was resumed at byte"
                    f" {self.received} and answered"
                    f" {response.headers.get('content-range')!r}",
                    url=_shown(response.request),
                )
            if self.size is None or found.group(3) in ("*", str(self.size)):
                return 0
            # Another size: another output (a store that sent no strong ETag, so no
            # If-Range could keep the range to the bytes already had).
            raise HypermediaError(
                f"the output at {_shown(response.request)} was replaced while it was"
                f" downloaded ({self.received} bytes had come; {self.size} bytes then,"
                f" {found.group(3)} now): download it again",
                url=_shown(response.request),
            )
        if etag is not None and _strong(response.headers.get("etag")) == etag:
            return self.received  # the whole of the same bytes: a route without ranges
        if restart is None:
            raise HypermediaError(
                f"the output at {_shown(response.request)} was replaced while it was"
                f" downloaded ({self.received} bytes had come): download it again",
                url=_shown(response.request),
            )
        restart()
        self.received = 0
        self.restarted += 1
        return 0


def _expired(link: OutputUrlResponse) -> bool:
    return link.expires_at.timestamp() - _URL_MARGIN <= datetime.now(UTC).timestamp()


def _maybe_expired(error: HypermediaError) -> bool:
    """Whether a 403 may be the URL's expiry: the API's ``url_expired``, or an object
    store's refusal (S3's says "Request has expired" in its XML)."""
    return error.code in ("url_expired", Forbidden.code)


def _size(response: httpx.Response, known: int | None) -> int | None:
    """The output's size as this answer gives it (its ``Content-Range``'s total, or a
    whole answer's ``Content-Length``): a replaced output's, when the transfer started
    again. ``known`` when it gives none (or the bytes come encoded)."""
    if response.headers.get("content-encoding", "identity") != "identity":
        return known
    if response.status_code == 206:
        found = _CONTENT_RANGE.fullmatch(response.headers.get("content-range", ""))
        total = None if found is None else found.group(3)
        return int(total) if total is not None and total.isdigit() else known
    length = response.headers.get("content-length", "")
    return int(length) if length.isdigit() else known


def _strong(etag: str | None) -> str | None:
    """An ``ETag`` ``If-Range`` may carry: a weak one never matches (RFC 9110)."""
    return None if etag is None or etag.startswith("W/") else etag


def _shown(request: httpx.Request) -> str:
    """The URL without its query: the signature is a credential, kept out of messages."""
    return str(request.url.copy_with(query=None))


def _error(
    response: httpx.Response, error_of: Callable[[int, object], HypermediaError]
) -> HypermediaError:
    """The client's exception for an error answer: the API's from its JSON body; an
    object store's (XML) by its status."""
    try:
        payload = response.json()
    except ValueError:
        payload = None
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        return error_of(response.status_code, payload)
    status = response.status_code
    cls: type[HypermediaError] = {
        403: Forbidden,
        404: NotFound,
        416: RangeNotSatisfiable,
    }.get(status, ServiceUnavailable if status >= 500 else HypermediaError)
    error = cls(
        f"the download of {_shown(response.request)} was answered HTTP {status}"
        + (" (the URL expired?)" if status == 403 else ""),
        url=_shown(response.request),
    )
    error.http_status = status
    return error
