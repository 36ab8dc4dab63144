"""One Redis subscriber for every job event stream of an API process.

Each ``GET /jobs/{id}/events`` stream (:mod:`hypermedia.ingest.events`) needs the
messages of its job's channel. A pub/sub connection of its own per stream made up to
``event_streams`` (1000) Redis connections per API process, against Redis's
``maxclients`` and the pool. :class:`EventSubscriber` holds one pub/sub connection:
a channel is subscribed while at least one stream follows it (and unsubscribed once
none does), and one task reads the connection and hands each message to the queues
of the streams that follow its channel. A stream that does not keep up (its client
reads slowly) holds up nobody: its queue is bounded, and one that overflowed is told
it missed messages (it reads them from the job's stream).

:meth:`EventSubscriber.subscribe` returns once Redis has confirmed the subscription,
so that what the stream reads from the job's capped stream next and what the channel
brings between them cover every event. When the connection is lost every stream
following a channel hears so (its ``get`` raises ``redis.ConnectionError``) and
follows the record from then on, as it would without Redis; the next subscription
opens a new connection. A connection that dies without a word (a network partition,
a Redis host frozen: no reset comes, and the socket waits for ever) is found out too:
the reader sends a PING once :data:`PING_SECONDS` passed without a word from Redis
(a message, a confirmation, a PONG), and takes the connection for lost, as one reset,
once :data:`SILENT_SECONDS` passed so (20 s: its PING unanswered for 10). The streams'
reads give up after :data:`READ_TIMEOUT_SECONDS`, connecting after
:data:`CONNECT_SECONDS`. The read commands of the streams (``XRANGE``) share a small
pool of their own (:attr:`EventSubscriber.client`). Every connection is named
``client_name`` (``CLIENT LIST`` shows them). Used from one event loop at a time: one
served again on another loop (a server started again in the same process) starts
afresh.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import redis
import redis.asyncio
from redis.asyncio.client import PubSub
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

log = logging.getLogger(__name__)

CLIENT_NAME = "hypermedia-events"
# The connections the streams' reads (XRANGE) share: each takes one for a moment.
READ_CONNECTIONS = 16
# How long a stream waits for a connection of that pool before it follows the record.
READ_WAIT_SECONDS = 10.0
# Messages kept for a stream that has not taken them yet: a running job publishes a
# few a second; a stream this far behind reads the rest from the job's stream.
QUEUED_MESSAGES = 256
CONFIRM_SECONDS = 10.0  # for Redis to confirm a subscription
# Nothing from Redis on the pub/sub connection for this long: the reader PINGs it.
PING_SECONDS = 10.0
# Nothing from Redis for this long (a PING unanswered for 10 s at least): it is lost.
SILENT_SECONDS = 20.0
READ_TIMEOUT_SECONDS = 10.0  # a stream's read (XRANGE) that Redis does not answer
CONNECT_SECONDS = 10.0
_READ_SECONDS = 5.0  # the reader's wait for a message, before it waits again
_GONE = (redis.ConnectionError, redis.TimeoutError, OSError)


class Subscription:
    """One stream's share of a channel: :meth:`get` its next message."""

    def __init__(self, channel: str) -> None:
        self.channel = channel
        self.missed = False  # messages were dropped: this stream fell too far behind
        self._messages: asyncio.Queue[str] = asyncio.Queue(QUEUED_MESSAGES)
        self._lost: BaseException | None = None
        self._wake = asyncio.Event()

    async def get(self, timeout: float) -> str | None:
        """The next message's data, or None after ``timeout`` seconds without one;
        ``redis.ConnectionError`` once the subscriber's connection is lost."""
        if self._messages.empty() and self._lost is None:
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
        if not self._messages.empty():
            return self._messages.get_nowait()
        if self._lost is not None:
            raise redis.ConnectionError(f"the events subscriber lost redis: {self._lost}")
        return None

    def _put(self, data: str) -> None:
        try:
            self._messages.put_nowait(data)
        except asyncio.QueueFull:
            self.missed = True
        self._wake.set()

    def _lose(self, exc: BaseException) -> None:
        self._lost = exc
        self._wake.set()


class EventSubscriber:
    """The job event subscriptions of one API process, on one pub/sub connection (see
    the module docstring)."""

    def __init__(
        self,
        url: str,
        *,
        client_name: str = CLIENT_NAME,
        read_connections: int = READ_CONNECTIONS,
    ) -> None:
        self.url = url
        self.client_name = client_name
        self.read_connections = read_connections
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: redis.asyncio.Redis | None = None
        self._pubsub: PubSub | None = None
        self._leaving: asyncio.Queue[str] | None = None  # channels to unsubscribe
        self._commands = asyncio.Lock()
        self._followers: dict[str, set[Subscription]] = {}
        # Per channel followed: done once Redis confirmed it.
        self._ready: dict[str, asyncio.Future[None]] = {}
        # Per channel, one future per SUBSCRIBE sent, confirmed in the order sent.
        self._confirming: dict[str, collections.deque[asyncio.Future[None]]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def client(self) -> redis.asyncio.Redis:
        """For the streams' reads (a pool of ``read_connections``)."""
        self._on_this_loop()
        if self._client is None:
            pool = redis.asyncio.BlockingConnectionPool.from_url(
                self.url,
                max_connections=self.read_connections,
                timeout=READ_WAIT_SECONDS,
                socket_timeout=READ_TIMEOUT_SECONDS,
                socket_connect_timeout=CONNECT_SECONDS,
                decode_responses=True,
                client_name=self.client_name,
                # Once more on a new connection: one of before a Redis restart is
                # closed (the first read after it met "Connection closed by server").
                retry=Retry(NoBackoff(), 1),
            )
            self._client = redis.asyncio.Redis(connection_pool=pool)
        return self._client

    @property
    def channels(self) -> int:
        """The channels followed now."""
        return len(self._followers)

    @contextlib.asynccontextmanager
    async def subscribe(self, channel: str) -> AsyncIterator[Subscription]:
        """Follow ``channel`` until the block ends; returns once Redis confirmed it.
        Raises ``redis.ConnectionError`` / ``redis.TimeoutError`` when it cannot."""
        self._on_this_loop()
        subscription = Subscription(channel)
        followers = self._followers.setdefault(channel, set())
        first = not followers
        followers.add(subscription)
        if first:
            self._ready[channel] = asyncio.get_running_loop().create_future()
        ready = self._ready[channel]
        try:
            if first:
                await self._subscribe(channel, ready)
            else:
                await self._wait(ready)
            yield subscription
        finally:
            self._leave(subscription)

    async def aclose(self) -> None:
        """Close the connections (the server stops)."""
        if self._loop is not asyncio.get_running_loop():
            return  # another loop's: gone with it
        tasks = list(self._tasks)
        if self._pubsub is not None:
            self._lost(self._pubsub, ConnectionError("the server is stopping"), warn=False)
        await asyncio.gather(*tasks, return_exceptions=True)  # the reader closes it
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.aclose()

    # -- internals -----------------------------------------------------------------------

    def _on_this_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        # A new loop (or the first): what the old one held is gone with it.
        self._loop = loop
        self._client = self._pubsub = self._leaving = None
        self._commands = asyncio.Lock()
        self._followers.clear()
        self._ready.clear()
        self._confirming.clear()
        self._tasks.clear()

    async def _subscribe(self, channel: str, ready: asyncio.Future[None]) -> None:
        sent = False
        try:
            async with self._commands:
                pubsub = await self._connected()
                self._confirming.setdefault(channel, collections.deque()).append(ready)
                try:
                    await pubsub.subscribe(channel)
                except _GONE as exc:
                    self._lost(pubsub, exc)
                    raise
                sent = True
        except BaseException as exc:
            if not sent:  # nothing will confirm it: the streams that came meanwhile
                with contextlib.suppress(KeyError, ValueError):
                    self._confirming[channel].remove(ready)
                _fail(ready, exc)
            raise
        await self._wait(ready)

    async def _wait(self, waiting: asyncio.Future[None]) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(waiting), CONFIRM_SECONDS)
        except TimeoutError:
            raise redis.TimeoutError("redis did not confirm a subscription") from None

    async def _connected(self) -> PubSub:
        if self._pubsub is not None:
            return self._pubsub
        # No retry of its own: a lost connection is told to the streams (they follow
        # the record), never silently replaced with the messages between lost.
        client = redis.asyncio.Redis.from_url(
            self.url,
            decode_responses=True,
            client_name=self.client_name,
            retry=Retry(NoBackoff(), 0),
            socket_connect_timeout=CONNECT_SECONDS,
        )
        pubsub = client.pubsub()
        try:
            await pubsub.connect()  # type: ignore[no-untyped-call]
        except BaseException:
            with contextlib.suppress(Exception):
                await pubsub.aclose()  # type: ignore[no-untyped-call]
                await client.aclose()
            raise
        self._pubsub = pubsub
        self._leaving = asyncio.Queue()
        self._spawn(self._read(pubsub, client))
        self._spawn(self._unsubscribe(pubsub, self._leaving))
        return pubsub

    def _spawn(self, work: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _read(self, pubsub: PubSub, client: redis.asyncio.Redis) -> None:
        clock = asyncio.get_running_loop().time
        heard = pinged = clock()  # Redis's last word; the last PING sent
        try:
            while self._pubsub is pubsub:
                now = clock()
                if now - heard >= SILENT_SECONDS:
                    silent = redis.TimeoutError(f"redis said nothing for {now - heard:.0f}s")
                    self._lost(pubsub, silent)
                    return
                try:
                    if now - max(heard, pinged) >= PING_SECONDS:
                        # Only sent (its PONG is read here, any word of Redis will do):
                        # one write, as the SUBSCRIBE of a stream is.
                        await pubsub.ping()
                        pinged = now
                    wake = min(max(heard, pinged) + PING_SECONDS, heard + SILENT_SECONDS)
                    message = await pubsub.get_message(
                        timeout=max(0.0, min(_READ_SECONDS, wake - clock()))
                    )
                except _GONE as exc:
                    self._lost(pubsub, exc)
                    return
                if message is not None:
                    heard = clock()
                    self._deliver(message)
        finally:
            # Cancelled (the loop ends): the streams' channels are followed no more.
            self._lost(pubsub, ConnectionError("the subscriber stopped"), warn=False)
            with contextlib.suppress(Exception):
                await pubsub.aclose()  # type: ignore[no-untyped-call]
                await client.aclose()

    def _deliver(self, message: dict[str, Any]) -> None:
        kind, channel = message.get("type"), str(message.get("channel"))
        if kind == "message":
            for subscription in self._followers.get(channel, ()):
                subscription._put(str(message["data"]))
        elif kind == "subscribe":
            pending = self._confirming.get(channel)
            if pending:
                confirmed = pending.popleft()
                if not confirmed.done():
                    confirmed.set_result(None)
                if not pending:
                    del self._confirming[channel]

    def _leave(self, subscription: Subscription) -> None:
        """A stream is done with its channel (synchronous: it runs as a stream is
        cancelled); the last to leave has the channel unsubscribed."""
        channel = subscription.channel
        followers = self._followers.get(channel)
        if followers is None:
            return
        followers.discard(subscription)
        if not followers:
            del self._followers[channel]
            self._ready.pop(channel, None)
            if self._leaving is not None:
                self._leaving.put_nowait(channel)

    async def _unsubscribe(self, pubsub: PubSub, leaving: asyncio.Queue[str]) -> None:
        """Unsubscribe the channels no stream follows any more, one task per
        connection (a stream leaves its channel as it is cancelled: it cannot wait)."""
        while self._pubsub is pubsub:
            channel = await leaving.get()
            async with self._commands:
                if channel in self._followers or self._pubsub is not pubsub:
                    continue  # followed again meanwhile, or the connection is gone
                try:
                    await pubsub.unsubscribe(channel)
                except _GONE as exc:
                    self._lost(pubsub, exc)

    def _lost(self, pubsub: PubSub, exc: BaseException, *, warn: bool = True) -> None:
        """The connection is gone: every stream hears so, and the next subscription
        opens another."""
        if self._pubsub is not pubsub:
            return
        if warn:
            log.warning(
                "job events: the subscriber lost redis (%d channels followed): %s",
                len(self._followers),
                exc,
                extra={"action": "job_events"},
            )
        self._pubsub = self._leaving = None
        for followers in self._followers.values():
            for subscription in followers:
                subscription._lose(exc)
        self._followers.clear()
        for ready in self._ready.values():
            _fail(ready, exc)
        self._ready.clear()
        self._confirming.clear()
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()


def _fail(ready: asyncio.Future[None], exc: BaseException) -> None:
    if ready.done():
        return
    if not isinstance(exc, redis.RedisError):
        exc = redis.ConnectionError(str(exc))
    ready.set_exception(exc)
    ready.exception()  # retrieved: whoever waits on it hears it, nobody else need
