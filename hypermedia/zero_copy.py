"""File bodies sent by the kernel: ASGI's ``http.response.zerocopysend`` extension on
uvicorn's h11 connections, which do not offer it.

A body that the app hands over as bytes sits in the API process until its client has
read it: a local blob sent in 1 MB chunks held ~1.6 MB per download whose reader had
stopped reading (a paused ``<video>``, a slow or hostile client), 300 of them ~480 MB,
for as long as they stayed open. :class:`ZeroCopyH11Protocol` advertises the
extension in each request's scope and answers its message with ``loop.sendfile``
(``os.sendfile`` from the file to the socket; asyncio reads and writes in its stead
where the transport cannot, e.g. TLS): no byte of the file passes through the
process, a paused reader holds none of its memory, and none is copied for one that
reads.

The message: ``{"type": "http.response.zerocopysend", "file": <a binary file open
for reading>, "offset": int, "count": int, "more_body": bool}`` after
``http.response.start``. h11 is told of ``count`` bytes of body (its
``send_with_data_passthrough``, made for this) and the kernel sends them. A
connection whose sendfile did not send them all (its client went away, the file was
shorter, the send was cancelled) is aborted: its framing is lost, and its app sees
``http.disconnect``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol, RequestResponseCycle

log = logging.getLogger(__name__)

ZERO_COPY_SEND = "http.response.zerocopysend"


class ZeroCopyH11Protocol(H11Protocol):
    """uvicorn's h11 connection with :data:`ZERO_COPY_SEND` (module docstring)."""

    def handle_events(self) -> None:
        before = self.cycle
        super().handle_events()
        cycle = self.cycle
        if cycle is not None and cycle is not before:
            # The request's task is created, not yet run: it reads cycle.send and the
            # scope when it starts.
            cycle.scope.setdefault("extensions", {})[ZERO_COPY_SEND] = {}
            cycle.send = _ZeroCopySend(cycle, self.loop)  # type: ignore[method-assign]


class _LengthOnly:
    """The body h11 is told of: it counts ``len()`` against Content-Length."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length


class _ZeroCopySend:
    def __init__(self, cycle: RequestResponseCycle, loop: asyncio.AbstractEventLoop) -> None:
        self.cycle = cycle
        self.loop = loop
        self.send: Callable[[Any], Awaitable[None]] = cycle.send

    async def __call__(self, message: Any) -> None:
        if message["type"] != ZERO_COPY_SEND:
            await self.send(message)
            return
        cycle = self.cycle
        if not cycle.response_started or cycle.response_complete:
            raise RuntimeError(f"Unexpected ASGI message {ZERO_COPY_SEND!r} sent here.")
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()
        if cycle.disconnected:
            return
        more_body = bool(message.get("more_body", False))
        if cycle.scope["method"] != "HEAD":
            file = message["file"]
            offset = message.get("offset")
            offset = file.tell() if offset is None else int(offset)
            count = message.get("count")
            if count is None:
                count = os.fstat(file.fileno()).st_size - offset
            if not await self._sendfile(file, offset, int(count)):
                return
        await self.send({"type": "http.response.body", "body": b"", "more_body": more_body})

    async def _sendfile(self, file: Any, offset: int, count: int) -> bool:
        """Whether all ``count`` bytes went; if not, the connection is aborted."""
        cycle = self.cycle
        body = _LengthOnly(count)
        sent = 0
        try:
            pieces: list[object] = list(
                cycle.conn.send_with_data_passthrough(h11.Data(data=body)) or ()  # type: ignore[arg-type]
            )
            for piece in pieces:
                if piece is not body:
                    cycle.transport.write(piece)  # type: ignore[arg-type]  # chunked framing
                elif count and not cycle.transport.is_closing():
                    sent = await self.loop.sendfile(cycle.transport, file, offset, count)
            if sent == count:
                return True
            if not cycle.transport.is_closing():
                log.warning("a file body ended after %d of its %d bytes", sent, count)
        except (OSError, RuntimeError) as exc:  # the client went away (or the disk)
            log.debug("a file body was cut short: %r", exc)
        finally:
            if sent != count:
                self._abort()
        return False

    def _abort(self) -> None:
        cycle = self.cycle
        cycle.transport.abort()
        cycle.disconnected = True
        cycle.message_event.set()
