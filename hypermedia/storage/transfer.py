"""Moving bytes through presigned URLs: what a worker uses, with no storage credentials.

:func:`download` streams a GET URL into a file (atomically, at most ``max_bytes``,
hashing as it goes); :func:`upload` streams a file to a PUT URL with an exact
``Content-Length`` (S3 refuses chunked uploads). Both work the same against the
local backend's blob routes and S3.

Each thread keeps one HTTP client (:func:`_client`): consecutive transfers to the
same store reuse its connections (keep-alive) instead of opening one each.

Only connection failures are retried (a few times, with a short backoff): the
URL is still good and the transfer starts over. An HTTP error answer is not
retried here; it raises at once, naming the HTTP status and the store's own
error code (``url_expired`` / ``invalid_signature`` from hypermedia,
``AccessDenied`` / ``NoSuchKey`` ... from S3)::

    TransferError (transfer_failed)          any other refusal (400, 413 ...)
    ├── TransferDenied (transfer_denied, retryable)
    │                                         403: expired, altered or foreign URL;
    │                                         a new attempt asks for fresh URLs
    ├── TransferNotFound (transfer_not_found) 404: nothing stored at the key
    └── TransferUnavailable (transfer_unavailable, retryable)
                                              5xx, a timeout, or connections that
                                              kept failing

``retryable`` says whether another attempt of the job could succeed.

Error messages and logs carry the URL without its query string: the query is
the credential.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import re
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, ClassVar, TypeVar
from urllib.parse import urlsplit

import httpx

from hypermedia.errors import HypermediaError
from hypermedia.storage.base import too_large

log = logging.getLogger(__name__)

T = TypeVar("T")
Progress = Callable[[int, "int | None"], None]  # bytes so far, the total if known

CHUNK_SIZE = 1 << 20
DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=10.0)
# An idle connection is closed after this long: under uvicorn's own keep-alive timeout
# (5 s), so the client never reuses one the server is closing.
KEEPALIVE_SECONDS = 4.0
# Failures of the connection itself: the request can simply be made again.
_RETRIED = (httpx.NetworkError, httpx.ConnectTimeout, httpx.RemoteProtocolError)
_S3_CODE = re.compile(rb"<Code>([^<]{1,100})</Code>")


class TransferError(HypermediaError):
    """A transfer the store refused; ``http_status`` and ``remote_code`` say how."""

    code = "transfer_failed"
    status = 502
    retryable: ClassVar[bool] = False

    def __init__(
        self,
        message: str,
        *,
        url: str,
        http_status: int | None = None,
        remote_code: str | None = None,
    ) -> None:
        super().__init__(message, url=url, http_status=http_status, remote_code=remote_code)
        self.url = url
        self.http_status = http_status
        self.remote_code = remote_code


class TransferDenied(TransferError):
    code = "transfer_denied"
    retryable = True  # mostly an expired URL: the next attempt gets fresh ones


class TransferNotFound(TransferError):
    code = "transfer_not_found"


class TransferUnavailable(TransferError):
    code = "transfer_unavailable"
    retryable = True


def download(
    url: str,
    dest_path: Path,
    max_bytes: int,
    *,
    client: httpx.Client | None = None,
    timeout: httpx.Timeout | float | None = None,
    attempts: int = 3,
    backoff_seconds: float = 0.5,
    progress: Progress | None = None,
) -> tuple[int, str]:
    """GET ``url`` into ``dest_path``; returns (size, sha256 hex).

    The file appears only complete (written beside it, then renamed). More than
    ``max_bytes`` raises InputTooLarge and leaves no file. ``progress(done, total)``
    is called after each chunk (``total`` from ``Content-Length``, else None)."""

    wait = timeout or DEFAULT_TIMEOUT

    def once(http: httpx.Client) -> tuple[int, str]:
        headers = {"Accept-Encoding": "identity"}
        with http.stream("GET", url, headers=headers, timeout=wait) as response:
            _raise_for_status(response)
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > max_bytes:
                raise too_large(max_bytes)
            total = int(declared) if declared.isdigit() else None
            chunks = _counted(response.iter_raw(CHUNK_SIZE), progress, total)
            return _write_atomically(chunks, dest_path, max_bytes)

    return _with_retries("download", url, once, client, attempts, backoff_seconds)


def upload(
    path: Path,
    url: str,
    content_type: str | None = None,
    *,
    client: httpx.Client | None = None,
    timeout: httpx.Timeout | float | None = None,
    attempts: int = 3,
    backoff_seconds: float = 0.5,
    progress: Progress | None = None,
) -> None:
    """PUT the file at ``path`` to ``url``. ``content_type`` must be the one the URL
    was issued for, if it was issued for one. ``progress(done, total)`` is called after
    each chunk."""
    size = path.stat().st_size
    headers = {"Content-Length": str(size)}
    if content_type is not None:
        headers["Content-Type"] = content_type

    wait = timeout or DEFAULT_TIMEOUT

    def once(http: httpx.Client) -> None:
        with path.open("rb") as handle:
            content = _counted(_chunks(handle), progress, size)
            with http.stream("PUT", url, content=content, headers=headers, timeout=wait) as got:
                _raise_for_status(got)
                got.read()  # (empty) read to its end: else the connection is not kept

    _with_retries("upload", url, once, client, attempts, backoff_seconds)


def redact(url: str) -> str:
    """The URL without its query string (which holds the signature)."""
    return urlsplit(url)._replace(query="", fragment="").geturl()


# -- internals ---------------------------------------------------------------------------


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """One TLS context for every transfer of this process: building one loads the CA
    bundle (~17 ms of CPU), which a client per transfer paid twice a job (54 % of a
    pipeline actor's CPU in bench/e2e.py). ``SSL_CERT_FILE``/``SSL_CERT_DIR`` are read
    when it is built, as httpx reads them."""
    return httpx.create_ssl_context()


_local = threading.local()


def _client() -> httpx.Client:
    """This thread's client: a transfer is one thread's work from start to end, and an
    ``httpx.Client``'s pool is not shared across threads here. A new client (its
    transport, pool and TLS setup) and a new connection a transfer cost both sides
    ~1 ms of CPU; kept, a pipeline actor's claim loop reuses the connection for the
    job's download and uploads and the next job's. Lives as long as its thread."""
    client: httpx.Client | None = getattr(_local, "client", None)
    if client is None or client.is_closed:
        client = httpx.Client(
            timeout=DEFAULT_TIMEOUT,
            follow_redirects=False,
            verify=_ssl_context(),
            limits=httpx.Limits(max_keepalive_connections=4, keepalive_expiry=KEEPALIVE_SECONDS),
        )
        _local.client = client
    return client


def _with_retries(
    what: str,
    url: str,
    once: Callable[[httpx.Client], T],
    client: httpx.Client | None,
    attempts: int,
    backoff_seconds: float,
) -> T:
    shown = redact(url)
    http = client or _client()
    for attempt in range(1, max(attempts, 1) + 1):
        try:
            return once(http)
        except _RETRIED as exc:
            if attempt >= attempts:
                raise TransferUnavailable(
                    f"{what} of {shown} failed after {attempt} attempts: {exc!r}", url=shown
                ) from exc
            log.warning(
                "%s of %s: %r; retrying",
                what,
                shown,
                exc,
                extra={"action": f"storage_{what}", "attempt": attempt},
            )
            time.sleep(backoff_seconds * 2 ** (attempt - 1))
        except httpx.TransportError as exc:  # timeouts: the store is there but stuck
            raise TransferUnavailable(f"{what} of {shown} failed: {exc!r}", url=shown) from exc
    raise AssertionError("unreachable")


def _raise_for_status(response: httpx.Response) -> None:
    status = response.status_code
    if 200 <= status < 300:
        return
    body = b""
    for chunk in response.iter_bytes():
        body += chunk
        if len(body) >= 4096:
            break
    remote = _remote_code(body)
    kind: type[TransferError]
    if status == 403:
        kind = TransferDenied
    elif status == 404:
        kind = TransferNotFound
    elif status >= 500:
        kind = TransferUnavailable
    else:
        kind = TransferError
    shown = redact(str(response.request.url))
    detail = f" ({remote})" if remote else ""
    raise kind(
        f"{response.request.method} {shown} answered {status}{detail}",
        url=shown,
        http_status=status,
        remote_code=remote,
    )


def _remote_code(body: bytes) -> str | None:
    """The store's error code: hypermedia's JSON ``error.code`` or S3's XML ``<Code>``."""
    with contextlib.suppress(ValueError, KeyError, TypeError):
        parsed: Any = json.loads(body)
        code = parsed["error"]["code"] if isinstance(parsed, dict) else None
        if isinstance(code, str):
            return code
    match = _S3_CODE.search(body)
    return match.group(1).decode(errors="replace") if match else None


def _write_atomically(chunks: Iterator[bytes], dest: Path, max_bytes: int) -> tuple[int, str]:
    dest.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    size = 0
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                size += len(chunk)
                if size > max_bytes:
                    raise too_large(max_bytes)
                digest.update(chunk)
                out.write(chunk)
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return size, digest.hexdigest()


def _counted(
    chunks: Iterator[bytes], progress: Progress | None, total: int | None
) -> Iterator[bytes]:
    if progress is None:
        yield from chunks
        return
    done = 0
    for chunk in chunks:
        yield chunk
        done += len(chunk)
        progress(done, total)


def _chunks(handle: BinaryIO) -> Iterator[bytes]:
    while chunk := handle.read(CHUNK_SIZE):
        yield chunk
