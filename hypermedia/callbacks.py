"""Completion webhooks: the head POSTs a job, signed, to the ``callback_url`` its submit
named, once the job is completed, failed or cancelled.

Who may be called
    Only hosts in the settings' ``callback_hosts`` (``host`` any port, ``host:port`` that
    one): a submit naming any other is refused, 422 ``callback_not_allowed``
    (:func:`hypermedia.ingest.service.callback_allowed`). Without the list the head would
    POST wherever a user says, from inside the operator's network. Redirects are not
    followed.

The request
    ``POST <callback_url>`` of :func:`payload` as JSON, signed as every webhook of the
    platform is (:mod:`hypermedia.webhooks`): ``X-Hypermedia-Signature: t=<unix
    seconds>,v1=<hex>``, HMAC-SHA256 over ``"<t>." + body`` with ``callback_secret``
    (unset: a secret generated once in ``<data_dir>/callback.secret``, mode 0600, for
    the operator to hand to the web tier), and ``X-Hypermedia-Delivery: <event id>``,
    the same on every attempt::

        {"id": "<event id>", "type": "job.completed", "created_at": "...",
         "job": {<the job as GET /jobs/{id} answers it, without its callback>}}

Durability
    The event is a row of the outbox (:mod:`hypermedia.jobs.callbacks`), written in the
    transaction of the terminal status itself, so a head killed between that commit and
    the send loses nothing: the row is still ``pending`` when a head runs again.
    :class:`CallbackSender` works through due rows on its own thread
    (:class:`hypermedia.server.Maintenance` starts it), each receiver's in order and the
    receivers side by side, a lane each (a slow one holds its own rows, never the
    others': a pass starts lanes for the receivers not busy and waits for none), claims
    each attempt by a guarded UPDATE, and retries any answer but a 2xx after
    :func:`~hypermedia.webhooks.backoff` until ``callback_max_attempts``; then the
    delivery is ``failed``. A receiver that gives no answer (no connection, or none in
    the timeout) has its other due rows put behind the one retried, due with it and
    their attempts uncounted: while it is down one of its events is retried at a time
    (the next once that one has failed), and its backlog is not tried row after row.
    Every attempt's answer (code,
    error) is kept on the row, and ``GET /jobs/{id}`` shows it (``callback``). Delivery
    is at least once: a receiver should drop an event id it has seen (a head killed
    after the answer but before recording it sends again).

The URL, which may carry a token, is never logged; an attempt that got no answer keeps
only the kind of error.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import Engine

from hypermedia import tls
from hypermedia.clock import Clock
from hypermedia.config import Settings
from hypermedia.db.engine import snapshot, transaction
from hypermedia.errors import HypermediaError
from hypermedia.ingest.schemas import job_response
from hypermedia.ingest.service import JobView, job_view
from hypermedia.jobs import callbacks as outbox
from hypermedia.logs import Outage
from hypermedia.metrics import CALLBACKS_LAST_ATTEMPT, NoMetrics, Recorder
from hypermedia.storage.local import load_or_create_secret
from hypermedia.webhooks import backoff, send

log = logging.getLogger(__name__)

BATCH = 50  # rows of one receiver a lane takes
SENDERS = 8  # receivers sent to at once
POSTPONE_CHUNK = 500  # event ids an UPDATE names
USER_AGENT = "hypermedia-callbacks/1"
SECRET_SETTING = "callback_secret (HYPERMEDIA_CALLBACK_SECRET)"  # noqa: S105 - its name


def payload(view: JobView, event_id: str, event: str, created_at: Any) -> dict[str, Any]:
    """The JSON body of a job's terminal event (the same on every attempt: the job
    has ended, so its record no longer moves)."""
    job = job_response(view).model_dump(mode="json", exclude={"callback"})
    return {
        "id": event_id,
        "type": f"job.{event}",
        "created_at": created_at.isoformat(),
        "job": job,
    }


def secret_of(settings: Settings) -> Callable[[], str]:
    """The signing secret, read (or generated) on first use: a head that never sends a
    callback writes no secret."""
    found: list[str] = []

    def secret() -> str:
        if not found:
            if settings.callback_secret is not None:
                found.append(settings.callback_secret.get_secret_value())
            else:
                path = settings.callback_secret_path
                found.append(load_or_create_secret(path, SECRET_SETTING, "job callbacks"))
        return found[0]

    return secret


@dataclass(frozen=True, slots=True)
class Delivery:
    """One attempt at one event."""

    event_id: str
    job_id: str
    attempt: int
    delivered: bool
    response_code: int | None
    error: str | None
    retry_at: float | None = None  # when it is due again (None: delivered or failed)


def _receiver(url: str | None) -> str:
    """The receiver a callback URL names: its host and port (the allowlist's unit)."""
    parts = urlsplit(url or "")
    try:
        port = parts.port
    except ValueError:  # refused at submit; a row holding one fails its own attempt
        port = None
    return f"{(parts.hostname or '').lower()}:{port or parts.scheme}"


# No answer because of the URL itself, not its receiver: the receiver's other rows may
# still get through.
_URL_ERRORS = frozenset({"InvalidURL", "UnsupportedProtocol"})


def _report(lane: Future[Any]) -> None:
    """A lane the head's loop started and nobody waits for: its failure, told."""
    exc = lane.exception()
    if isinstance(exc, HypermediaError):
        log.warning("callback lane stopped: %s", exc, extra={"action": "callback"})
    elif exc is not None:
        log.error("callback lane failed", exc_info=exc, extra={"action": "callback"})


def _unanswered(delivery: Delivery) -> bool:
    """An attempt its receiver did not answer (no connection, or none in the timeout):
    the receiver's other rows would fare the same."""
    return delivery.response_code is None and delivery.error not in _URL_ERRORS


class CallbackSender:
    """Sends due outbox rows (see the module docstring). ``deliver_due`` is one pass;
    ``run`` passes every ``poll_seconds`` until stopped."""

    def __init__(
        self,
        engine: Engine,
        secret: Callable[[], str],
        clock: Clock,
        *,
        max_attempts: int = 8,
        timeout_seconds: float = 10.0,
        metrics: Recorder | None = None,
    ) -> None:
        self.engine = engine
        # Where each attempt's end is told (CALLBACKS_LAST_ATTEMPT): a sender working
        # through a slow receiver's backlog, not one stopped.
        self.metrics: Recorder = NoMetrics() if metrics is None else metrics
        self.secret = secret
        self.clock = clock
        self.max_attempts = max_attempts
        self.timeout_seconds = timeout_seconds
        self._lock = threading.Lock()
        self._busy: set[str] = set()  # receivers with a lane running

    @classmethod
    def from_settings(
        cls, engine: Engine, settings: Settings, clock: Clock, metrics: Recorder | None = None
    ) -> CallbackSender:
        return cls(
            engine,
            secret_of(settings),
            clock,
            max_attempts=settings.callback_max_attempts,
            timeout_seconds=settings.callback_timeout_seconds,
            metrics=metrics,
        )

    def deliver_due(self) -> list[Delivery]:
        """One pass, waited for: events due now, one attempt each, what each attempt
        got (see :meth:`_start`)."""
        import httpx

        with (
            httpx.Client(follow_redirects=False, verify=tls.client_context()) as client,
            ThreadPoolExecutor(SENDERS, thread_name_prefix="callback") as pool,
        ):
            lanes = self._start(client, pool, threading.Event())
            return [delivery for lane in lanes for delivery in lane.result()]

    def run(self, stop: threading.Event, poll_seconds: float) -> None:
        """A pass every ``poll_seconds`` until ``stop``, never waiting for the lanes an
        earlier pass started: a receiver taking its timeout holds only its own lane."""
        import httpx

        # A database that is down fails every pass alike: told when that starts, every
        # few minutes while it lasts, and when it ends.
        outage = Outage(log, "callbacks wait", extra={"action": "callback"})
        with (
            httpx.Client(follow_redirects=False, verify=tls.client_context()) as client,
            ThreadPoolExecutor(SENDERS, thread_name_prefix="callback") as pool,
        ):
            while not stop.is_set():
                try:
                    for lane in self._start(client, pool, stop):
                        lane.add_done_callback(_report)
                except HypermediaError as exc:
                    outage.failed(exc)
                except Exception:
                    log.exception(
                        "callback pass failed; the next in %s s",
                        poll_seconds,
                        extra={"action": "callback"},
                    )
                else:
                    outage.succeeded()
                stop.wait(poll_seconds)

    def _start(self, client: Any, pool: Executor, stop: threading.Event) -> list[Future[Any]]:
        """Start a lane for each receiver (host and port) with due rows and none running,
        up to :data:`SENDERS` at once, each with its first :data:`BATCH` rows, sent in
        order; a lane that gets no answer leaves the rest of its receiver's rows behind
        that one's retry. The due rows are read in order, past those of a busy
        receiver: a pass that took the oldest 50 left every other receiver's callbacks
        behind a backlog of one receiver's, and one that waited for its slowest lane
        held the next for everyone."""
        with self._lock:
            busy = set(self._busy)
        free = SENDERS - len(busy)
        lanes: dict[str, list[Any]] = {}
        full = 0
        if free > 0:
            # A read, however long the backlog it reads past: on SQLite it takes no
            # write lock (a transaction's BEGIN IMMEDIATE held every writer meanwhile).
            with snapshot(self.engine) as conn:
                for row in outbox.due(conn, self.clock.now()):
                    receiver = _receiver(row.callback_url)
                    lane = lanes.get(receiver)
                    if lane is None:
                        if receiver in busy or len(lanes) == free:
                            continue
                        lane = lanes[receiver] = []
                    if len(lane) < BATCH:
                        lane.append(row)
                        full += len(lane) == BATCH
                        if full == free:
                            break
        with self._lock:
            self._busy.update(lanes)
        return [
            pool.submit(self._lane, client, receiver, rows, stop)
            for receiver, rows in lanes.items()
        ]

    def _lane(
        self, client: Any, receiver: str, rows: list[Any], stop: threading.Event
    ) -> list[Delivery]:
        done = []
        try:
            for row in rows:
                if stop.is_set():
                    break
                delivery = self._attempt(client, row)
                if delivery is None:
                    continue
                done.append(delivery)
                if _unanswered(delivery):  # the next would fare the same (or wait as long)
                    if delivery.retry_at is not None:
                        self._postpone(receiver, delivery.retry_at)
                    break
        finally:
            with self._lock:
                self._busy.discard(receiver)
        return done

    def _postpone(self, receiver: str, until: float) -> None:
        """Put the receiver's other due rows behind the one it did not answer, due when
        that one is retried: left due, its backlog was tried row after row, each its
        whole timeout, and burnt their attempts while it was down."""
        now = self.clock.now()
        with snapshot(self.engine) as conn:  # the read holds no writer back (SQLite)
            events = [
                row.event_id
                for row in outbox.due(conn, now)
                if _receiver(row.callback_url) == receiver
            ]
        with transaction(self.engine) as conn:  # postpone() takes only those still due
            for start in range(0, len(events), POSTPONE_CHUNK):
                outbox.postpone(conn, events[start : start + POSTPONE_CHUNK], now, until)
        if events:
            log.info(
                "%d callbacks to a receiver that did not answer wait for its retry",
                len(events),
                extra={"action": "callback"},
            )

    def _attempt(self, client: Any, row: Any) -> Delivery | None:
        now = self.clock.now()
        attempt = row.attempts + 1
        # Until this attempt's answer is written the row is not due: a sender killed
        # mid-send leaves it to be sent again after that.
        hold = now + self.timeout_seconds + backoff(attempt)
        with transaction(self.engine) as conn:
            if not outbox.claim(conn, row.event_id, row.attempts, now, hold):
                return None  # another sender took it
            view = job_view(conn, row.job_id)
        if view is None or row.callback_url is None:  # cannot be: rows follow their job
            return None
        body = json.dumps(
            payload(view, row.event_id, row.event, row.created_at), separators=(",", ":")
        ).encode()
        answer = send(
            client,
            row.callback_url,
            body,
            secret=self.secret(),
            delivery_id=row.event_id,
            timestamp=int(time.time()),
            timeout=self.timeout_seconds,
            user_agent=USER_AGENT,
        )
        failed = not answer.delivered and attempt >= self.max_attempts
        retry_at = None if answer.delivered or failed else self.clock.now() + backoff(attempt)
        with transaction(self.engine) as conn:
            outbox.finish(
                conn, row.event_id, self.clock.now(), answer.code, answer.error, retry_at=retry_at
            )
        self.metrics.set(CALLBACKS_LAST_ATTEMPT, {}, self.clock.now())
        extra = {"action": "callback", "job_id": row.job_id}
        if answer.delivered:
            log.info("job %s: %s callback delivered", row.job_id, row.event, extra=extra)
        elif failed:
            log.warning(
                "job %s: %s callback failed after %d attempts: %s",
                row.job_id,
                row.event,
                attempt,
                answer.error,
                extra=extra,
            )
        else:
            log.info(
                "job %s: %s callback attempt %d of %d: %s; next in %.0f s",
                row.job_id,
                row.event,
                attempt,
                self.max_attempts,
                answer.error,
                backoff(attempt),
                extra=extra,
            )
        return Delivery(
            row.event_id,
            row.job_id,
            attempt,
            answer.delivered,
            answer.code,
            answer.error,
            retry_at,
        )
