"""The head process behind ``hypermedia serve``: the HTTP API plus queue upkeep.

:class:`Maintenance` is a background thread that reconciles Redis with the job
record once at start, then runs the reaper every ``reaper_interval_seconds``
and the reconciler every ``reconcile_interval_seconds``, or on the first tick
after Redis is reachable again or found emptied (the queue's
``reconcile_wanted``). A failed round (Redis or the database down) is logged and
retried on the next tick; ``stop()`` returns once the round in progress has
finished. Every :data:`CHECKPOINT_SWEEP_SECONDS` it deletes the checkpoints of jobs
that ended and the orphans (:func:`hypermedia.jobs.checkpoints.sweep`), and every
:data:`~hypermedia.storage.deletions.SWEEP_SECONDS` the blobs of deleted objects that
the storage failed to delete when they were (:func:`hypermedia.storage.deletions.sweep`,
with backoff). Every :data:`CALLBACK_PRUNE_SECONDS` it deletes the job callbacks
delivered longer than ``callback_delivered_retention_seconds`` ago and those given up
longer than ``callback_failed_retention_seconds`` ago
(:func:`hypermedia.jobs.callbacks.prune`: a bounded number of batches a round, the next
round going on while rows are left, so a backlog never holds the reaper). A second
thread sends completion webhooks (:mod:`hypermedia.callbacks`)
every ``callback_poll_seconds``, so a receiver that hangs never delays the reaper. A
third drives bulk runs (:class:`~hypermedia.bulk.runner.BulkRunner`): at once while a
run has room for jobs, else every ``bulk_poll_seconds``; a head restarted after a crash
picks its runs up from their cursors.

The access log never shows a signed URL's signature (:class:`RedactSignedUrls`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import threading
import time
from collections.abc import Callable, Collection, Iterator
from typing import TYPE_CHECKING
from urllib.parse import unquote_plus

import h11
import uvicorn

from hypermedia.bulk.runner import BulkRunner
from hypermedia.callbacks import CallbackSender
from hypermedia.clock import age_text
from hypermedia.config import Settings
from hypermedia.errors import HypermediaError, ServiceUnavailable
from hypermedia.jobs import callbacks as outbox
from hypermedia.jobs import checkpoints
from hypermedia.jobs.reaper import reconcile
from hypermedia.logs import REDACTED, SECRET_PARAMETERS, Outage
from hypermedia.stack import Stack
from hypermedia.storage import deletions
from hypermedia.zero_copy import ZeroCopyH11Protocol

if TYPE_CHECKING:
    import socket

    from fastapi import FastAPI
    from sqlalchemy import Engine
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)

# How often ended jobs' checkpoints are deleted (hypermedia.jobs.checkpoints.sweep).
CHECKPOINT_SWEEP_SECONDS = 5.0
# How often the callbacks delivered or given up past their retention are deleted.
CALLBACK_PRUNE_SECONDS = 300.0
# A stopping API's uploads refused (api_shutdown_seconds), how long their answers and
# the removal of their partial bytes may take before uvicorn cancels what still runs.
STOP_ANSWER_SECONDS = 5.0
# How long a connection may take to send a whole request head (the request line and
# its headers), from its opening or from its last answer: see HeadTimedH11Protocol.
REQUEST_HEAD_SECONDS = 20.0
# How often the API's server loop wakes with nothing to do, to refresh its Date header
# (whole seconds) and its request count's limit; a stop wakes it at once. uvicorn's own
# loop woke every 0.1 s: 0.12 CPU-s a minute of an idle head, its API thread's all.
TICK_SECONDS = 1.0


class Maintenance:
    def __init__(
        self,
        stack: Stack,
        *,
        reaper_interval: float,
        reconcile_interval: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stack = stack
        self.reaper_interval = reaper_interval
        self.reconcile_interval = reconcile_interval
        self._monotonic = monotonic
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sender: threading.Thread | None = None
        self.callbacks = CallbackSender.from_settings(
            stack.engine, stack.settings, stack.clock, stack.metrics
        )
        self.bulk = BulkRunner(
            stack.engine,
            stack.queue,
            storage=stack._storage,
            clock=stack.clock,
            repository=stack.repository,
        )
        self._bulk: threading.Thread | None = None
        self.rounds = 0
        self.reconciles = 0
        self._outages: dict[str, Outage] = {}  # by action: each told apart
        self._prune_more = False  # the last callback prune left rows past its bound

    def start(self) -> None:
        if self._thread is not None:
            return
        # httpx imported here, in the starting thread, not first in the callbacks
        # thread beside another thread's import of it: CPython hands one of two imports
        # waiting on each other a partly made module (seen: a run's callbacks thread
        # died on "module 'httpcore' has no attribute 'ConnectionPool'").
        import httpx  # noqa: F401

        self._thread = threading.Thread(
            target=self._run, name="hypermedia-maintenance", daemon=True
        )
        self._thread.start()
        self._sender = threading.Thread(
            target=self.callbacks.run,
            args=(self._stop, self.stack.settings.callback_poll_seconds),
            name="hypermedia-callbacks",
            daemon=True,
        )
        self._sender.start()
        self._bulk = threading.Thread(
            target=self.bulk.run,
            args=(self._stop, self.stack.settings.bulk_poll_seconds),
            name="hypermedia-bulk",
            daemon=True,
        )
        self._bulk.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        for thread in (self._thread, self._sender, self._bulk):
            if thread is not None:
                thread.join(timeout)
                if thread.is_alive():
                    log.warning("%s thread still busy after %.0f s", thread.name, timeout)
        self._thread = self._sender = self._bulk = None

    def _run(self) -> None:
        next_reconcile = self._monotonic()  # reconcile once at start
        next_sweep = next_blob_sweep = next_callback_prune = self._monotonic()
        while not self._stop.is_set():
            if self._monotonic() >= next_reconcile or self.stack.queue.reconcile_wanted():
                self._step("reconcile", self.reconcile)
                next_reconcile = self._monotonic() + self.reconcile_interval
            self._step("reap", self.stack.reaper.tick)
            if self._monotonic() >= next_sweep:
                self._step("checkpoints", self.sweep_checkpoints)
                next_sweep = self._monotonic() + CHECKPOINT_SWEEP_SECONDS
            if self._monotonic() >= next_blob_sweep:
                self._step("blob_sweep", self.sweep_blobs)
                next_blob_sweep = self._monotonic() + deletions.SWEEP_SECONDS
            if self._monotonic() >= next_callback_prune:
                self._prune_more = False
                self._step("callback_prune", self.prune_callbacks)
                # A backlog left by the round's bound: its next batches the next round.
                wait = 0.0 if self._prune_more else CALLBACK_PRUNE_SECONDS
                next_callback_prune = self._monotonic() + wait
            self.rounds += 1
            self._stop.wait(self.reaper_interval)

    def sweep_checkpoints(self) -> None:
        """Ended jobs' checkpoints and orphans out of storage and the record (a process
        opened without storage has none to sweep)."""
        if self.stack.has_storage:
            checkpoints.sweep(self.stack.engine, self.stack.storage, self.stack.clock.now())

    def sweep_blobs(self) -> None:
        """Deleted objects' blobs the storage failed to delete, tried again once due."""
        if self.stack.has_storage:
            deletions.sweep(
                self.stack.engine,
                self.stack.storage,
                self.stack.clock,
                backends=self.stack.backends,
            )

    def prune_callbacks(self) -> outbox.Pruned:
        """Job callbacks given up longer ago than ``callback_failed_retention_seconds``
        and those delivered longer ago than ``callback_delivered_retention_seconds``,
        deleted, at most :data:`~hypermedia.jobs.callbacks.PRUNE_BATCHES` batches of
        each (the rest the next round's); answers how many and whether rows are left."""
        settings, now = self.stack.settings, self.stack.clock.now()
        deleted, more = 0, False
        for status, retention, what in (
            (outbox.FAILED, settings.callback_failed_retention_seconds, "given up"),
            (outbox.DELIVERED, settings.callback_delivered_retention_seconds, "delivered"),
        ):
            pruned = outbox.prune(self.stack.engine, status, now - retention)
            deleted, more = deleted + pruned.deleted, more or pruned.more
            if pruned.deleted:
                log.info(
                    "deleted %d job callbacks %s more than %s ago%s",
                    pruned.deleted,
                    what,
                    age_text(retention),
                    "; more next round" if pruned.more else "",
                    extra={"action": "callback_prune"},
                )
        self._prune_more = more
        return outbox.Pruned(deleted, more)

    def reconcile(self) -> None:
        reconcile(self.stack.engine, self.stack.queue)
        self.reconciles += 1

    def _step(self, action: str, step: Callable[[], object]) -> None:
        outage = self._outages.get(action)
        if outage is None:
            outage = Outage(log, f"{action} failed", extra={"action": action})
            self._outages[action] = outage
        try:
            step()
            outage.succeeded()
        except HypermediaError as exc:
            outage.failed(exc)
        except Exception:
            log.exception("%s failed unexpectedly", action, extra={"action": action})


def redact_query(target: str) -> str:
    """A request target as it may be logged: the values of :data:`SECRET_PARAMETERS`
    replaced (the rest of the query stays, for whoever reads the log)."""
    path, sep, query = target.partition("?")
    if not sep:
        return target
    parts = []
    for part in query.split("&"):
        name, eq, _value = part.partition("=")
        if eq and unquote_plus(name).lower() in SECRET_PARAMETERS:
            part = f"{name}={REDACTED}"
        parts.append(part)
    return f"{path}?{'&'.join(parts)}"


class RedactSignedUrls(logging.Filter):
    """uvicorn's access log line carries the full request target (its third argument):
    signed URLs lose their signature before any handler sees the record (ours redact
    every line again: :func:`hypermedia.logs.redact_urls`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            record.args = (*args[:2], redact_query(args[2]), *args[3:])
        return True


def redact_access_log() -> None:
    """Install :class:`RedactSignedUrls` on uvicorn's access logger (once)."""
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, RedactSignedUrls) for f in access.filters):
        access.addFilter(RedactSignedUrls())


class CutCleanly:
    """ASGI wrapper of the API for its stop: a request still running when uvicorn
    cancels what outlived the graceful shutdown (``api_shutdown_seconds`` +
    :data:`STOP_ANSWER_SECONDS`) answers 503 ``service_unavailable`` (with
    ``Retry-After``) if its answer had not begun, and is logged as a warning. uvicorn
    answered a 500 and logged the cancellation's traceback at ERROR. Only once
    :attr:`stopping` is set: a cancellation before that is not the stop's."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.stopping = False

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
        except asyncio.CancelledError:
            if not self.stopping:
                raise
            log.warning(
                "the API stopped: %s %s was cut short%s",
                scope.get("method"),
                scope.get("path"),
                "" if started else " (answered 503)",
                extra={"action": "serve"},
            )
            if not started:
                from hypermedia.ingest.http_errors import error_response

                answer = error_response(ServiceUnavailable("the API is stopping: try again later"))
                with contextlib.suppress(Exception):
                    await answer(scope, receive, send)


class HeadTimedH11Protocol(ZeroCopyH11Protocol):
    """uvicorn's h11 connection, closed when it has not sent a whole request head
    within :attr:`head_seconds` of its opening or of its last answer: 408
    ``request_timeout`` to one that sent part of a head, nothing to one that sent
    nothing, nor to one still sending the body of a request answered already (a 401,
    a 413 before it was read: uvicorn drops it). uvicorn waits for a head for ever (its
    keep-alive timer runs only after an answer, and stops at the next byte), so sockets
    that never finish one (slowloris, or opened and left silent, or a body trickling
    after its answer) each hold a descriptor for good: 1,100 silent
    connections took every descriptor of an API under a shell's 1,024 and no one got an
    answer while they stayed open. A body's pace is the routes' business (uploads:
    ``upload_idle_seconds``; JSON bodies: :mod:`hypermedia.ingest.guard`)."""

    head_seconds = REQUEST_HEAD_SECONDS
    _head_timer: asyncio.TimerHandle | None = None
    _head_begun = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_arrived()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._head_timer is not None:
            self._head_begun = True
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        if self._serving():
            self._head_arrived()

    def on_response_complete(self) -> None:
        self._await_head()  # before uvicorn reads a pipelined request's head
        super().on_response_complete()

    def _await_head(self) -> None:
        self._head_arrived()
        self._head_begun = False
        self._head_timer = self.loop.call_later(self.head_seconds, self._head_late)

    def _head_arrived(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _serving(self) -> bool:
        """Whether a request's head came and its answer is not complete yet. Not the
        rest of the body of one answered already (a 401, a 413 before it was read):
        uvicorn reads and drops it, its keep-alive timer stopped by its first byte."""
        return self.cycle is not None and not self.cycle.response_complete

    def _head_late(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self._serving():
            return
        if self.conn.their_state is h11.IDLE and self._head_begun:
            body = (
                '{"error":{"code":"request_timeout","message":"the request head did not'
                f' arrive within {self.head_seconds:g} s"}}}}'
            ).encode()
            self.transport.write(
                b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
            )
        self.transport.close()


class ApiServer(uvicorn.Server):
    """uvicorn for the API's ``app`` (:func:`~hypermedia.ingest.api.create_app`): its
    job event streams end as the server stops (each lasts as long as its job, and
    uvicorn waits for every open response: a SIGTERM did not stop ``serve`` while
    anyone followed a running job); the requests in flight get
    ``api_shutdown_seconds`` to finish, then the uploads still arriving are refused
    (503, nothing kept: :class:`~hypermedia.ingest.uploads.UploadStop`), as are those
    still inspected (their children killed, their blobs deleted:
    :meth:`~hypermedia.ingest.inspection.InspectionRunner.stop`), and
    :data:`STOP_ANSWER_SECONDS` later uvicorn cancels whatever still runs (a slow
    client's upload held the stop for as long as its body took), answered 503 if it can
    be (:class:`CutCleanly`); and, in the main
    thread, minus re-raising SIGTERM/SIGINT after its graceful shutdown: that would kill
    the process before ``serve`` has closed the stack."""

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        self.shutdown_seconds = float(app.state.stack.settings.api_shutdown_seconds)
        config.timeout_graceful_shutdown = math.ceil(self.shutdown_seconds + STOP_ANSWER_SECONDS)
        self.cut = CutCleanly(app)
        config.app = self.cut
        config.http = HeadTimedH11Protocol
        # asyncio's loop, whatever else is installed: uvicorn's "auto" takes uvloop where
        # it is, whose loop.sendfile is not implemented, and every blob download sent by
        # the kernel (hypermedia.zero_copy) would be cut.
        config.loop = "asyncio"
        super().__init__(config)
        self.event_streams = app.state.event_streams
        self.upload_stop = app.state.upload_stop
        self.inspector = app.state.inspector
        self.event_subscriber = app.state.event_subscriber

    @property
    def should_exit(self) -> bool:
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        # Set from another thread (a stack's stop) or a signal handler: the main loop
        # waits on the event, not a short sleep, and wakes at once.
        self._should_exit = value
        woken = getattr(self, "_exit_wake", None)
        if value and woken is not None:
            loop, event = woken
            with contextlib.suppress(RuntimeError):  # the loop has closed: nothing waits
                loop.call_soon_threadsafe(event.set)

    async def main_loop(self) -> None:
        """uvicorn's loop, which woke every 0.1 s to look at ``should_exit``, waking every
        :data:`TICK_SECONDS` (each tick one of uvicorn's seconds: its Date header is
        refreshed at each) and as soon as ``should_exit`` is set."""
        event = asyncio.Event()
        self._exit_wake = (asyncio.get_running_loop(), event)
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 10) % 864000  # on_tick refreshes the header at % 10 == 0
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), TICK_SECONDS)
            should_exit = await self.on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.cut.stopping = True
        self.event_streams.close()
        loop = asyncio.get_running_loop()
        cut = loop.call_later(self.shutdown_seconds, self._stop_uploads)
        try:
            await super().shutdown(sockets)
        finally:
            cut.cancel()
            await self.event_subscriber.aclose()

    def _stop_uploads(self) -> None:
        log.warning(
            "the API is stopping: uploads still arriving or inspected after %g s are refused",
            self.shutdown_seconds,
            extra={"action": "serve"},
        )
        self.upload_stop.stop()
        self.inspector.stop()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        signals = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in signals}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def head_stack(
    settings: Settings, queues: Callable[[Engine], Callable[[], Collection[str]]] | None
) -> Stack:
    """The stack ``serve`` runs: with ``queues``, its ingest accepts the operations of
    the queues named, and bulk runs go only on those; None: every queue's."""
    if queues is None:
        return Stack.open(settings)
    from hypermedia.db.engine import settings_engine
    from hypermedia.local import operations_of

    engine = settings_engine(settings)
    served = queues(engine)
    return Stack.open(
        settings,
        engine=engine,
        implemented=operations_of(settings, served),
        served_queues=served,
    )


def serve(
    settings: Settings,
    *,
    host: str,
    port: int,
    access_log: bool = True,
    extend: Callable[[FastAPI], None] | None = None,
    queues: Callable[[Engine], Callable[[], Collection[str]]] | None = None,
) -> None:
    """Open the stack, start maintenance, run the API until SIGINT/SIGTERM, clean up.
    ``extend`` adds to the app what the core does not know (the operator page).
    ``queues``: given the record, what names the queues that have or can get a worker
    (:class:`~hypermedia.local.StaffedQueues`); ingest refuses the others' operations.
    None: every implemented operation is accepted."""
    from hypermedia.ingest.api import create_app

    stack = head_stack(settings, queues)
    maintenance = Maintenance(
        stack,
        reaper_interval=settings.reaper_interval_seconds,
        reconcile_interval=settings.reconcile_interval_seconds,
    )
    try:
        app = create_app(stack)
        if extend is not None:
            extend(app)
        # log_config=None: the CLI owns logging handlers; uvicorn only logs through them.
        config = uvicorn.Config(
            app, host=host, port=port, log_config=None, access_log=access_log, lifespan="off"
        )
        server = ApiServer(config, app)
        redact_access_log()
        maintenance.start()
        log.info("serving the API on http://%s:%d", host, port, extra={"action": "serve"})
        try:
            server.run()
        except SystemExit as exc:  # uvicorn exits when it cannot bind
            raise HypermediaError(
                f"the API server could not start on {host}:{port} (see the log above)"
            ) from exc
    finally:
        maintenance.stop()
        stack.close()
