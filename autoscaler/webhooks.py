"""Alert webhooks: the file that names them, the signature, and the sender.

The file
    ``/etc/hypermedia/alert-webhooks.json`` (or ``$HYPERMEDIA_ALERT_WEBHOOKS``, or
    ``hypermedia scheduler run --alert-webhooks``), read when the scheduler starts; no
    API can name or change a webhook. When none is given and the default file does not
    exist, there are none: alerts are still recorded (``alerts``) and logged. The file
    holds secrets, so one that others may read (any ``o`` bit in its mode) refuses to
    start, as does an unknown key or a bad value, naming the key::

        {"webhooks": [
            {"name": "ops", "url": "https://hooks.example.com/hypermedia",
             "secret": "at least 16 characters", "min_level": "warning"}
        ]}

    ``min_level`` (info, warning, critical; default info): the least severe alert this
    webhook gets. ``timeout_seconds`` (default 10) and ``max_attempts`` (default 8) are
    optional. Neither the URL (it may carry a token) nor the secret is ever logged: a
    webhook is named by its ``name``.

The request
    ``POST`` of the alert as JSON (:func:`payload`), signed with the webhook's secret
    as every webhook of the platform is (:mod:`hypermedia.webhooks`: ``X-Hypermedia-
    Delivery: <delivery id>``, the same on every retry of one delivery, and
    ``X-Hypermedia-Signature: t=<unix seconds>,v1=<hex>``, HMAC-SHA256 over ``"<t>." +
    body``). :func:`verify` is the receiver's side.

The sender
    Notifications become ``alert_deliveries`` rows (one per webhook whose
    ``min_level`` the alert reaches) in the scheduler's turn, in the transaction that
    records them; :class:`Sender` works through them on its own thread, off the
    scheduler's turn, so a webhook that hangs or is down never stalls the scheduler.
    A delivery is claimed by a guarded ``UPDATE`` (its attempt count and due time as
    read) before it is sent, so two senders never send one attempt twice, and it is
    sent until a 2xx answer: it is then ``delivered`` and never sent again. Any other
    answer, a timeout or a refused connection schedules the next attempt after
    :func:`backoff` (10 s, doubling, at most 15 min) until ``max_attempts``, then it is
    ``failed``. Every attempt leaves its answer (code, error) on the row.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from sqlalchemy import select
from sqlalchemy.engine import Engine

from autoscaler.config import read_json
from autoscaler.state import to_datetime
from hypermedia import tls
from hypermedia.clock import Clock
from hypermedia.config_errors import (
    at_least_characters,
    chosen_error,
    is_unknown_key,
    unknown_key_problem,
)
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.errors import ConfigError
from hypermedia.webhooks import DELIVERY_HEADER, SIGNATURE_HEADER, backoff, send, sign, verify

__all__ = [
    "DELIVERY_HEADER",
    "SIGNATURE_HEADER",
    "Attempt",
    "Sender",
    "Webhook",
    "backoff",
    "load",
    "parse",
    "payload",
    "sign",
    "verify",
]

log = logging.getLogger(__name__)

DEFAULT_PATH = Path("/etc/hypermedia/alert-webhooks.json")
ENV_VAR = "HYPERMEDIA_ALERT_WEBHOOKS"
BATCH = 50


class Webhook(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    url: SecretStr  # it may carry a token: never shown
    secret: Annotated[SecretStr, at_least_characters(16)]
    min_level: Literal["info", "warning", "critical"] = "info"
    timeout_seconds: float = Field(default=10.0, gt=0, le=120)
    max_attempts: int = Field(default=8, ge=1, le=100)

    @field_validator("url")
    @classmethod
    def _http(cls, value: SecretStr) -> SecretStr:
        url = value.get_secret_value()
        if not url.startswith(("http://", "https://")) or len(url) < 10:
            raise ValueError("must be an http:// or https:// URL")
        return value


class WebhooksFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    webhooks: list[Webhook] = []

    @field_validator("webhooks")
    @classmethod
    def _unique_names(cls, value: list[Webhook]) -> list[Webhook]:
        names = [w.name for w in value]
        for name in names:
            if names.count(name) > 1:
                raise ValueError(f"the name {name!r} is used twice")
        return value


def parse(data: Any, source: str) -> list[Webhook]:
    if not isinstance(data, dict):
        raise ConfigError(source, "expected a JSON object")
    try:
        return list(WebhooksFile.model_validate(data).webhooks)
    except ValidationError as exc:
        first = chosen_error(exc)
        path = ".".join(str(part) for part in first["loc"]) or "(top level)"
        if is_unknown_key(first):
            problem = unknown_key_problem(exc, first, WebhooksFile)
        else:
            problem = first["msg"]
        # Never echo the input: it may be a secret.
        raise ConfigError(f"{source}: {path}", problem) from None


def load(path: Path | str | None = None) -> list[Webhook]:
    """The webhooks (see the module docstring for where they come from)."""
    explicit = path if path is not None else os.environ.get(ENV_VAR) or None
    chosen = Path(explicit) if explicit is not None else DEFAULT_PATH
    if explicit is None and not chosen.exists():
        return []
    try:
        mode = stat.S_IMODE(chosen.stat().st_mode)
        text = chosen.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(chosen), f"cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(str(chosen), f"not UTF-8 text (byte {exc.start})") from None
    if mode & 0o007:
        raise ConfigError(
            str(chosen),
            f"holds webhook secrets but others may read it (mode {mode:04o}): chmod o-rwx",
        )
    return parse(read_json(text, str(chosen)), str(chosen))


def payload(row: Any, delivery_id: str) -> dict[str, Any]:
    """The JSON body of a delivery of an ``alerts`` row."""
    return {
        "version": 1,
        "delivery_id": delivery_id,
        "alert": {
            "key": row.key,
            "rule": row.rule,
            "level": row.level,
            "status": row.status,
            "summary": row.summary,
            "labels": dict(row.labels),
            "details": dict(row.details),
            "started_at": row.started_at.isoformat(),
            "notified_at": row.notified_at.isoformat(),
        },
    }


# -- the sender ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Attempt:
    delivery_id: str
    webhook: str
    attempt: int
    delivered: bool
    response_code: int | None
    error: str | None


class Sender:
    """Delivers due ``alert_deliveries`` rows to the webhooks (see the module docstring)."""

    def __init__(self, engine: Engine, webhooks: Sequence[Webhook], clock: Clock) -> None:
        self.engine = engine
        self.webhooks: Mapping[str, Webhook] = {w.name: w for w in webhooks}
        self.clock = clock

    def deliver_due(self) -> list[Attempt]:
        """One pass: every delivery due now, sent once each; what each attempt got."""
        import httpx

        d = t.alert_deliveries
        now = self.clock.now()
        with transaction(self.engine) as conn:
            due = conn.execute(
                select(d.c.delivery_id, d.c.attempts, d.c.next_attempt_at, d.c.webhook)
                .where(d.c.status == "pending", d.c.next_attempt_at <= to_datetime(now))
                .order_by(d.c.next_attempt_at)
                .limit(BATCH)
            ).all()
        if not due:
            # The pass of nearly every second: no client (building one loads the CA
            # bundle: ~20 ms of CPU, 2 % of a core on the head while nothing is sent).
            return []
        done = []
        with httpx.Client(follow_redirects=False, verify=tls.client_context()) as client:
            for row in due:
                attempt = self._attempt(client, row.delivery_id, row.attempts, row.webhook)
                if attempt is not None:
                    done.append(attempt)
        return done

    def _claim(self, delivery_id: str, attempts: int, webhook: Webhook) -> Any | None:
        """Take one attempt at ``delivery_id`` (None: another sender took it, or it is no
        longer due); the alert row to send. Until the attempt's outcome is written the
        row is not due again (a sender that dies mid-send leaves it to be retried)."""
        d, a = t.alert_deliveries, t.alerts
        now = self.clock.now()
        with transaction(self.engine) as conn:
            claimed = conn.execute(
                d.update()
                .where(
                    d.c.delivery_id == delivery_id,
                    d.c.status == "pending",
                    d.c.attempts == attempts,
                    d.c.next_attempt_at <= to_datetime(now),
                )
                .values(
                    attempts=attempts + 1,
                    last_attempt_at=to_datetime(now),
                    next_attempt_at=to_datetime(now + webhook.timeout_seconds + backoff(1)),
                )
            )
            if claimed.rowcount != 1:
                return None
            return conn.execute(
                select(a)
                .join(d, d.c.alert_id == a.c.alert_id)
                .where(d.c.delivery_id == delivery_id)
            ).one()

    def _attempt(self, client: Any, delivery_id: str, attempts: int, name: str) -> Attempt | None:
        webhook = self.webhooks.get(name)
        if webhook is None:
            self._finish(delivery_id, attempts + 1, None, "webhook no longer configured", True)
            log.warning("alert delivery %s: webhook %r is no longer configured", delivery_id, name)
            return None
        alert = self._claim(delivery_id, attempts, webhook)
        if alert is None:
            return None
        attempt = attempts + 1
        body = json.dumps(payload(alert, delivery_id), separators=(",", ":")).encode()
        answer = send(
            client,
            webhook.url.get_secret_value(),
            body,
            secret=webhook.secret.get_secret_value(),
            delivery_id=delivery_id,
            timestamp=int(time.time()),
            timeout=webhook.timeout_seconds,
            user_agent="hypermedia-alerts/1",
        )
        code, error = answer.code, answer.error
        delivered = error is None
        failed = not delivered and attempt >= webhook.max_attempts
        self._finish(delivery_id, attempt, code, error, failed)
        extra = {"action": "alert_delivery"}
        if delivered:
            log.info("alert %s delivered to %s", alert.key, name, extra=extra)
        elif failed:
            log.warning(
                "alert %s to %s failed after %d attempts: %s",
                alert.key,
                name,
                attempt,
                error,
                extra=extra,
            )
        else:
            log.info(
                "alert %s to %s: %s, attempt %d of %d, next in %.0f s",
                alert.key,
                name,
                error,
                attempt,
                webhook.max_attempts,
                backoff(attempt),
                extra=extra,
            )
        return Attempt(delivery_id, name, attempt, delivered, code, error)

    def _finish(
        self, delivery_id: str, attempt: int, code: int | None, error: str | None, failed: bool
    ) -> None:
        d = t.alert_deliveries
        now = self.clock.now()
        values: dict[str, Any] = {"response_code": code, "last_error": error}
        if error is None:
            values.update(status="delivered", delivered_at=to_datetime(now))
        elif failed:
            values.update(status="failed", attempts=attempt)
        else:
            values["next_attempt_at"] = to_datetime(now + backoff(attempt))
        with transaction(self.engine) as conn:
            conn.execute(
                d.update()
                .where(d.c.delivery_id == delivery_id, d.c.status == "pending")
                .values(values)
            )

    def run(self, stop: threading.Event, poll_seconds: float = 1.0) -> None:
        """Deliver what is due every ``poll_seconds`` until ``stop`` is set."""
        while not stop.is_set():
            try:
                self.deliver_due()
            except Exception:
                log.exception("alert delivery pass failed; next one in %s s", poll_seconds)
            stop.wait(poll_seconds)
