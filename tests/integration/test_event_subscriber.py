"""The job events' Redis subscriber (hypermedia.ingest.subscriber) against a private
redis-server that stops answering without closing its connections (SIGSTOP, as a
network partition or a frozen host looks to the API): no reset ever comes."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from typing import Any

from hypermedia.ingest import events, subscriber
from hypermedia.ingest.subscriber import EventSubscriber


def test_a_pubsub_connection_whose_redis_stops_answering_is_lost_and_the_stream_follows_the_record(
    private_redis, monkeypatch, caplog
):
    """The stream waited for ever for live events on a connection whose Redis had gone
    silent: it heard nothing, and nothing told it the connection was dead. Now the
    reader PINGs a silent connection and takes it for lost once Redis said nothing for
    SILENT_SECONDS (here 2.5 s, ten PINGs' worth: a test process starved for a second
    keeps its connection): the stream follows the record and ends with it."""
    monkeypatch.setattr(subscriber, "PING_SECONDS", 0.25)
    monkeypatch.setattr(subscriber, "SILENT_SECONDS", 2.5)
    status = {"type": "status", "job_id": "j-1", "status": "processing"}
    pid = private_redis.pid
    assert pid is not None

    async def follow() -> tuple[list[str], float, int]:
        events_subscriber = EventSubscriber(private_redis.url)
        seen: list[str] = []
        stream = events.stream(events_subscriber, "hm-test:events:j-1", lambda: dict(status),
                               keepalive=3600)  # fmt: skip

        async def read() -> None:
            async for text in stream:
                seen.append(text)

        reading = asyncio.get_running_loop().create_task(read())
        deadline = time.monotonic() + 10
        while len(seen) < 2:  # retry:, the record's processing
            assert time.monotonic() < deadline, seen
            await asyncio.sleep(0.02)
        # Silent channel, Redis answering: its PINGs keep the connection (longer than
        # SILENT_SECONDS, without them it would be lost: a slow machine only lengthens it).
        await asyncio.sleep(3.0)
        assert len(seen) == 2 and events_subscriber.channels == 1, seen
        os.kill(pid, signal.SIGSTOP)
        try:
            stopped = time.monotonic()
            status["status"] = "completed"
            await asyncio.wait_for(reading, 60)
            took = time.monotonic() - stopped
            channels = events_subscriber.channels
            await events_subscriber.aclose()
        finally:
            os.kill(pid, signal.SIGCONT)
        return seen, took, channels

    with caplog.at_level(logging.WARNING, logger="hypermedia.ingest"):
        seen, took, channels = asyncio.run(follow())
    assert took < 2.5 + 30, took  # not the wait for ever
    assert channels == 0
    assert 'event: status\ndata: {"type":"status","job_id":"j-1","status":"completed"}' in seen[-1]
    lost: list[Any] = [r for r in caplog.records if "lost redis" in r.getMessage()]
    assert lost and "said nothing" in lost[0].getMessage(), caplog.text
