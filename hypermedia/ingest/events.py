"""``GET /v1/hypermedia/jobs/{job_id}/events``: a job's events as Server-Sent Events.

The route checks first that the job is the caller's (404 otherwise, as for any other
route), then streams (:func:`stream`)::

    retry: 2000

    id: 1733300003612-0          <- the job's recent events (its capped stream on
    event: progress                 Redis), after Last-Event-ID when a client resumes
    data: {"type": "progress", "phase": "run", "done": 12.5, ...}

    event: status                <- the job as the record has it, when that says more
    data: {"type": "status", "status": "processing", "attempt": 1, "record": true}

    id: 1733300003871-0          <- then live events (pub/sub), none twice
    event: progress
    data: {...}

    : keep-alive                 <- every ``keepalive`` seconds without an event

The events are those of :mod:`hypermedia.queue.events`; each carries the entry id of
the job's stream as its SSE id, so a client that reconnects with ``Last-Event-ID`` gets
what it missed, while the stream keeps it. The stream ends after a terminal status
(completed, failed or cancelled), whether it came as an event or from the record, which
is read again at every keep-alive: an event Redis lost never leaves a subscriber waiting
for more than that. While Redis cannot be reached the record alone is followed, every
keep-alive. That read also asks whether the caller's API key is still in force: a stream
whose key was revoked ends at its next keep-alive.

The streams of an API process share one Redis pub/sub connection
(:class:`~hypermedia.ingest.subscriber.EventSubscriber`: a job's channel is subscribed
while a stream follows it) and a small pool for their reads. :class:`EventStreams`
bounds them (each holds a socket for as long as its job runs): at most ``per_user`` of
one user (more: 429 ``concurrency_limited``) and ``total`` in all (more: 503), and it
ends them all, cleanly, when the server stops (:class:`EventStreamResponse`): a stream
lasts as long as its job, and the server would otherwise wait for every job followed
before it exits. A client takes its stream up again on the next server with
``Last-Event-ID``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from functools import partial
from typing import Any

import anyio
import redis
import redis.asyncio
from starlette.concurrency import run_in_threadpool
from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from hypermedia.accounts import Caller
from hypermedia.errors import AuthenticationFailed, ConcurrencyLimited, ServiceUnavailable
from hypermedia.ingest.schemas import TERMINAL_STATUSES
from hypermedia.ingest.subscriber import EventSubscriber, Subscription
from hypermedia.queue.events import entry_order, parse_published

log = logging.getLogger(__name__)

KEEPALIVE_SECONDS = 15.0
# How long a stream whose job the record says has ended waits for the job's last event
# (published just after the record's commit) before it sends the record's status.
ENDING_GRACE_SECONDS = 2.0
RETRY_MILLISECONDS = 2000
# When a user whose streams are all taken may try again: one ends when its job does.
BUSY_RETRY_AFTER_SECONDS = 5


class EventStreams:
    """The job event streams this API process serves now: at most ``per_user`` of one
    user (operators have no such cap) and ``total`` in all. Used from the event loop
    only."""

    def __init__(self, total: int, per_user: int) -> None:
        self.total = total
        self.per_user = per_user
        self.closed = False  # the server is stopping: no new stream
        self._counts: dict[str, int] = {}
        self._open: set[_Slot] = set()

    @property
    def open(self) -> int:
        return len(self._open)

    def take(self, caller: Caller) -> _Slot:
        """A place for one more stream of ``caller``'s: ConcurrencyLimited (429) when the
        user has ``per_user`` open, ServiceUnavailable (503) when this process has
        ``total`` or is stopping."""
        if self.closed:
            raise ServiceUnavailable(
                "the API is stopping: follow the job again in a moment",
                retry_after_seconds=RETRY_MILLISECONDS / 1000,
            )
        if self.open >= self.total:
            raise ServiceUnavailable(
                f"this API server has {self.open} event streams open (at most"
                f" {self.total}): try again when one has ended",
                limit=self.total,
                retry_after_seconds=BUSY_RETRY_AFTER_SECONDS,
            )
        user = caller.user_id
        held = self._counts.get(user, 0)
        if not caller.is_operator and held >= self.per_user:
            raise ConcurrencyLimited(
                f"{held} event streams of this user are open (at most {self.per_user}"
                " at once): try again when one has ended",
                limit=self.per_user,
                retry_after_seconds=BUSY_RETRY_AFTER_SECONDS,
            )
        self._counts[user] = held + 1
        slot = _Slot(self, user)
        self._open.add(slot)
        return slot

    def close(self) -> None:
        """The server is stopping: every stream ends (see :class:`EventStreamResponse`),
        and none starts."""
        self.closed = True
        for slot in list(self._open):
            slot.end()

    def _release(self, slot: _Slot) -> None:
        self._open.discard(slot)
        left = self._counts[slot.user] - 1
        if left:
            self._counts[slot.user] = left
        else:
            del self._counts[slot.user]


class _Slot:
    """One stream's place in :class:`EventStreams`, given back once (``release``);
    ``end()`` stops the stream that holds it (the server is stopping)."""

    def __init__(self, streams: EventStreams, user: str) -> None:
        self.streams: EventStreams | None = streams
        self.user = user
        self.ended = False
        self._stop: Callable[[], None] | None = None

    def on_end(self, stop: Callable[[], None]) -> None:
        self._stop = stop
        if self.ended:
            stop()

    def end(self) -> None:
        self.ended = True
        if self._stop is not None:
            self._stop()

    def release(self) -> None:
        if self.streams is not None:
            self.streams._release(self)
            self.streams = None


class EventStreamResponse(StreamingResponse):
    """A stream of :func:`stream`'s messages that holds its ``slot`` while it runs and
    ends when the client goes away, when the messages do, or when the server stops
    (the slot's ``end()``): then the body ends cleanly, as after a lost event, and the
    client reconnects (``Last-Event-ID``) to the server that follows."""

    def __init__(
        self,
        content: AsyncIterator[str],
        *,
        slot: _Slot,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(content, media_type="text/event-stream", headers=headers)
        self.slot = slot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = ended = False

        async def sending(message: Message) -> None:
            nonlocal started, ended
            started = True
            ended = message["type"] == "http.response.body" and not message.get("more_body")
            await send(message)

        try:
            async with anyio.create_task_group() as group:

                async def until(done: Callable[[], Awaitable[None]]) -> None:
                    await done()
                    group.cancel_scope.cancel()

                self.slot.on_end(group.cancel_scope.cancel)
                group.start_soon(until, partial(self.listen_for_disconnect, receive))
                await until(partial(self.stream_response, sending))
            if self.slot.ended and started and not ended:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            self.slot.release()


def message(event: dict[str, Any], entry: str | None = None) -> str:
    """One SSE message: ``id`` (the stream entry, if any), ``event`` (its type), ``data``."""
    head = f"id: {entry}\n" if entry is not None else ""
    kind = str(event.get("type", "message"))
    return f"{head}event: {kind}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n"


def _ends(event: dict[str, Any]) -> bool:
    return event.get("type") == "status" and event.get("status") in TERMINAL_STATUSES


async def stream(
    subscriber: EventSubscriber,
    key: str,
    record: Callable[[], dict[str, Any]],
    *,
    after: str | None = None,
    keepalive: float = KEEPALIVE_SECONDS,
) -> AsyncIterator[str]:
    """The SSE messages of one job (see the module docstring). ``subscriber``: the API
    process's one subscriber; ``key``: the job's events key (stream and channel);
    ``record()``: its status event as the record has it (called in a thread), or
    AuthenticationFailed once the caller may follow it no more (their key revoked):
    the stream then ends there, as when the server stops, and the client's reconnect
    is refused; ``after``: the Last-Event-ID the client sent."""
    messages = _follow(subscriber, key, record, after, keepalive)
    async with contextlib.aclosing(messages):
        try:
            async for text in messages:
                yield text
        except AuthenticationFailed:
            log.info(
                "job events: the stream's API key was revoked; it ends",
                extra={"action": "job_events"},
            )


async def _follow(
    subscriber: EventSubscriber,
    key: str,
    record: Callable[[], dict[str, Any]],
    after: str | None,
    keepalive: float,
) -> AsyncGenerator[str, None]:
    yield f"retry: {RETRY_MILLISECONDS}\n\n"
    async with contextlib.AsyncExitStack() as stack:
        client = subscriber.client
        try:
            live = await stack.enter_async_context(subscriber.subscribe(key))
            try:
                entries: Any = await client.xrange(key, min="-" if after is None else f"({after}")
            except redis.ResponseError as exc:
                if after is None:
                    raise
                # An id Redis refuses (the route checks its range): resume from the start.
                log.warning("job events: redis refused Last-Event-ID %s: %s", after, exc)
                after = None
                entries = await client.xrange(key, min="-")
        except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError) as exc:
            log.warning("job events: redis unavailable, following the record: %s", exc)
            await stack.aclose()
            async for text in _record_only(record, keepalive):
                yield text
            return
        last = entry_order(after) if after is not None else (0, 0)
        status: str | None = None
        for entry, fields in entries:
            event = json.loads(fields["e"])
            last = entry_order(entry)
            yield message(event, entry)
            if event.get("type") == "status":
                status = event.get("status")
        if status in TERMINAL_STATUSES:
            return  # the stream holds its end
        now = await run_in_threadpool(record)
        if now.get("status") in TERMINAL_STATUSES:
            async for text in _ending(client, live, key, last, now):
                yield text
            return
        if now.get("status") != status:
            yield message(now)
        while True:
            try:
                published = await live.get(keepalive)
                missed = await _missed(client, live, key, last)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                log.warning("job events: redis went away, following the record: %s", exc)
                await stack.aclose()
                async for text in _record_only(record, keepalive):
                    yield text
                return
            for entry, event in missed:
                last = entry_order(entry)
                yield message(event, entry)
                if _ends(event):
                    return
            if published is None:
                if missed:
                    continue
                yield ": keep-alive\n\n"
                now = await run_in_threadpool(record)
                if now.get("status") in TERMINAL_STATUSES:
                    async for text in _ending(client, live, key, last, now):
                        yield text
                    return
                continue
            parsed = parse_published(published)
            if parsed is None:
                continue
            entry, event = parsed
            if entry_order(entry) <= last:
                continue  # sent from the stream already
            last = entry_order(entry)
            yield message(event, entry)
            if _ends(event):
                return


async def _missed(
    client: redis.asyncio.Redis, live: Subscription, key: str, last: tuple[int, int]
) -> list[tuple[str, dict[str, Any]]]:
    """What the channel brought this stream that it fell too far behind to keep (its
    client reads slowly): read from the job's stream, past ``last``."""
    if not live.missed:
        return []
    live.missed = False
    millis, sequence = last
    entries: Any = await client.xrange(key, min=f"({millis}-{sequence}")
    return [(str(entry), json.loads(fields["e"])) for entry, fields in entries]


async def _ending(
    client: redis.asyncio.Redis,
    live: Subscription,
    key: str,
    last: tuple[int, int],
    now: dict[str, Any],
) -> AsyncIterator[str]:
    """The record says the job has ended: the events it published meanwhile (its end
    among them), else the record's. The end is published just after the record's
    commit: one not in the stream yet is waited for on the channel (subscribed since
    the start) for up to :data:`ENDING_GRACE_SECONDS`; Redis may have lost it."""
    millis, sequence = last
    try:
        entries: Any = await client.xrange(key, min=f"({millis}-{sequence}")
    except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
        entries = []
    for entry, fields in entries:
        event = json.loads(fields["e"])
        last = max(last, entry_order(entry))
        yield message(event, entry)
        if _ends(event):
            return
    deadline = time.monotonic() + ENDING_GRACE_SECONDS
    while (left := deadline - time.monotonic()) > 0:
        try:
            published = await live.get(left)
        except (redis.ConnectionError, redis.TimeoutError):
            break
        parsed = None if published is None else parse_published(published)
        if parsed is None or entry_order(parsed[0]) <= last:
            continue
        entry, event = parsed
        last = entry_order(entry)
        yield message(event, entry)
        if _ends(event):
            return
    yield message(now)


async def _record_only(
    record: Callable[[], dict[str, Any]], keepalive: float
) -> AsyncIterator[str]:
    """Without Redis: the record's status, as it changes, until it ends."""
    seen: str | None = None
    while True:
        now = await run_in_threadpool(record)
        if now.get("status") != seen:
            seen = now.get("status")
            yield message(now)
        else:
            yield ": keep-alive\n\n"
        if seen in TERMINAL_STATUSES:
            return
        await anyio.sleep(keepalive)
