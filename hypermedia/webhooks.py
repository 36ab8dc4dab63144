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

Retries
    A delivery is done on a 2xx answer. Any other answer, a timeout or a refused
    connection is retried after :func:`backoff` (10 s, doubling, at most 15 min)
    until the sender's attempt limit. :func:`send` answers what one attempt got and
    never raises for the network: the exception's text may hold the URL (a token in
    it), so only its kind is kept.
"""

from __future__ import annotations

import hashlib
import hmac
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
    """POST ``body`` to ``url`` once, signed (see the module docstring). ``client``: an
    ``httpx.Client`` that does not follow redirects."""
    import httpx

    headers = {
        "Content-Type": "application/json",
        "User-Agent": user_agent,
        DELIVERY_HEADER: delivery_id,
        SIGNATURE_HEADER: sign(secret, body, timestamp),
    }
    try:
        response = client.post(url, content=body, headers=headers, timeout=timeout)
    except (httpx.HTTPError, httpx.InvalidURL) as exc:  # InvalidURL is no HTTPError
        return Answer(None, type(exc).__name__)  # its text can hold the URL: its kind only
    code = response.status_code
    return Answer(code, None if 200 <= code < 300 else f"answered {code}")
