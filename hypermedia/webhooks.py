"""Signed webhook requests: one signature, one backoff and one way to send, for every
webhook the platform sends (alerts: :mod:`autoscaler.webhooks`; job completions:
:mod:`hypermedia.callbacks`).

The request
    ``POST`` of a JSON body with ``Content-Type: application/json``,
    ``X-Hypermedia-Delivery: <id>`` (the same on every retry of one delivery: a
    receiver that saw it already can drop it) and ``X-Hypermedia-Signature:
    t=<unix seconds>,v1=<hex>``, where ``<hex>`` is HMAC-SHA256 with the shared secret
    over ``"<t>." + body`` (Stripe's scheme: the timestamp is signed with the body, so a
    captured request cannot be replayed later than the receiver's tolerance).
    :func:`verify` is the receiver's side. Redirects are not followed: a webhook's
    host is what was allowed, never where it points.

What an attempt may cost
    ``timeout`` bounds the whole attempt, not each read: a receiver that answers one
    byte every few seconds is cut off when it is spent (its socket shut down), and
    the answer's body is never read (only the status line and headers, which the
    HTTP parser caps at 100 KB), so neither a slow receiver nor a huge answer holds
    the sender, which sends one delivery after another. The name's resolution is the
    one step not bounded by it.

Retries
    A delivery is done on a 2xx answer. Any other answer, a timeout or a refused
    connection is retried after :func:`backoff` (10 s, doubling, at most 15 min)
    until the sender's attempt limit. :func:`send` answers what one attempt got and
    never raises for the network: the exception's text may hold the URL (a token in
    it), so only its kind is kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import socket
import threading
from dataclasses import dataclass
from typing import Any

SIGNATURE_HEADER = "X-Hypermedia-Signature"
DELIVERY_HEADER = "X-Hypermedia-Delivery"
BACKOFF_SECONDS = 10.0
BACKOFF_MAX_SECONDS = 900.0
SIGNATURE_TOLERANCE_SECONDS = 300.0


def sign(secret: str, body: bytes, timestamp: int) -> str:
    """The ``X-Hypermedia-Signature`` value for ``body`` sent at ``timestamp``."""
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={digest.hexdigest()}"


def verify(
    secret: str,
    body: bytes,
    header: str,
    now: float,
    tolerance: float = SIGNATURE_TOLERANCE_SECONDS,
) -> bool:
    """Whether ``header`` signs ``body`` with ``secret`` within ``tolerance`` of ``now``."""
    parts = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        timestamp = int(parts["t"])
        given = parts["v1"]
    except (KeyError, ValueError):
        return False
    if not given.isascii():  # a forged one: compare_digest raises TypeError on it
        return False
    expected = sign(secret, body, timestamp).split("v1=", 1)[1]
    return hmac.compare_digest(expected, given) and abs(now - timestamp) <= tolerance


def backoff(attempts: int) -> float:
    """Seconds before the next attempt after ``attempts`` failed ones (1, 2, ...)."""
    return min(BACKOFF_MAX_SECONDS, BACKOFF_SECONDS * 2.0 ** max(0, attempts - 1))


@dataclass(frozen=True, slots=True)
class Answer:
    """What one attempt got: the HTTP status (None: no answer) and, unless it was a
    2xx, why it failed."""

    code: int | None
    error: str | None

    @property
    def delivered(self) -> bool:
        return self.error is None


class _Deadline:
    """Cuts one request off ``seconds`` after it starts, whatever it is waiting for: the
    connection's socket (a duplicate, so a TLS wrap of the original does not hide it)
    is shut down, which wakes a read blocked on it. httpx's timeouts bound each read,
    so a receiver that sends a byte now and then held the sender for ever."""

    def __init__(self, seconds: float) -> None:
        self.expired = False
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
        with self._lock:
            if self._socket is not None:
                self._socket.close()
                self._socket = None

    def trace(self, event: str, info: dict[str, Any]) -> None:
        """httpx's ``trace`` extension: takes the connection's socket once it is made."""
        if event != "connection.connect_tcp.complete":
            return
        made = info["return_value"].get_extra_info("socket")
        with self._lock:
            if isinstance(made, socket.socket) and self._socket is None:
                self._socket = made.dup()
                if self.expired:
                    self._shut()

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            if self._socket is not None:
                self._shut()

    def _shut(self) -> None:
        assert self._socket is not None
        with contextlib.suppress(OSError):  # already closed by the other end
            self._socket.shutdown(socket.SHUT_RDWR)


def send(
    client: Any,
    url: str,
    body: bytes,
    *,
    secret: str,
    delivery_id: str,
    timestamp: int,
    timeout: float,
    user_agent: str,
) -> Answer:
    """POST ``body`` to ``url`` once, signed, in at most about ``timeout`` seconds (see
    the module docstring). ``client``: an ``httpx.Client`` that does not follow
    redirects."""
    import httpx

    headers = {
        "Content-Type": "application/json",
        "User-Agent": user_agent,
        # A connection of its own, never one kept from an earlier delivery: the
        # deadline takes the socket when it is made.
        "Connection": "close",
        DELIVERY_HEADER: delivery_id,
        SIGNATURE_HEADER: sign(secret, body, timestamp),
    }
    with _Deadline(timeout) as deadline:
        try:
            with client.stream(
                "POST",
                url,
                content=body,
                headers=headers,
                timeout=timeout,
                extensions={"trace": deadline.trace},
            ) as response:
                code = response.status_code  # the body is never read
        except (httpx.HTTPError, httpx.InvalidURL) as exc:  # InvalidURL is no HTTPError
            # httpx's own timeout (each read's, the same seconds) can fire before the
            # deadline's timer thread is let run on a busy machine: the same no answer.
            if deadline.expired or isinstance(exc, httpx.TimeoutException):
                return Answer(None, f"no answer in {timeout:g} s")
            return Answer(None, type(exc).__name__)  # its text can hold the URL: its kind
    return Answer(code, None if 200 <= code < 300 else f"answered {code}")
