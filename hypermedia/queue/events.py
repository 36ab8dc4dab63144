"""Job events on Redis: what a job's subscribers hear while it runs.

They flow one way: a pipeline step's progress (:mod:`pipelines.progress`) -> the
sandbox's result socket -> the worker (:mod:`hypermedia.worker.execute`, which adds the
bytes of its own transfers and the job's status changes) -> here -> the API's
``GET /jobs/{id}/events`` (Server-Sent Events, :mod:`hypermedia.ingest.events`).

Each event is a JSON object::

    {"type": "status", "status": "processing", "attempt": 1, "at": 1733300000.1}
    {"type": "progress", "phase": "run", "done": 12.5, "total": 60.0,
     "unit": "seconds", "fraction": 0.208, "attempt": 1, "at": 1733300003.6}

(``phase``: ``download`` and ``upload`` in ``bytes``, the worker's; ``run``, the step's;
``fraction`` null when the total is unknown; a ``run`` event with ``done`` 0 and no
total follows a download that showed its progress, so that a step that reports none
does not leave the download's full bar showing; a status event may add ``retry_at`` or
``error_code``). :class:`JobEvents` appends it to the job's capped stream (kept a day
after its last event while the job runs, ten minutes after its end), so a late
subscriber reads the recent ones, and publishes it on the channel of the same name
with the stream entry's id, so a live subscriber that read the stream first drops what
it has seen (one Lua script: ``scripts/publish.lua``; keys: :mod:`.keys`).

Nothing here writes the database: a progress tick is one Redis call (the executor and
the child pass on a few a second per job). Events are best effort: a Redis error is
logged (at most once a minute) and the event dropped. The job record stays the truth:
a subscriber's stream ends on the record's terminal status, read from the database.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from importlib import resources
from typing import Any

import redis

from hypermedia.queue.keys import events_key

log = logging.getLogger(__name__)

EVENTS_KEPT = 200  # per job: ~50 s of a running job's progress, and what came before
EVENTS_TTL_SECONDS = 24 * 3600  # after a running job's last event
# After its end: the record has the outcome, and a stream costs ~5 KB of Redis even
# with two entries (1 M jobs a day kept 24 h would hold ~5 GB).
ENDED_TTL_SECONDS = 600
_WARN_EVERY_SECONDS = 60.0
# The terminal statuses (hypermedia.jobs.states.TERMINAL, which the queue package may
# not import; tests/unit/test_purity.py holds the two equal).
ENDED_STATUSES = frozenset({"completed", "failed", "cancelled"})


def status_event(
    status: str, at: float, attempt: int | None = None, **details: Any
) -> dict[str, Any]:
    """A job's status changed (``details``: ``retry_at``, ``error_code`` ...)."""
    event: dict[str, Any] = {"type": "status", "status": status, "at": round(at, 3)}
    if attempt is not None:
        event["attempt"] = attempt
    event.update({k: v for k, v in details.items() if v is not None})
    return event


def progress_event(
    phase: str,
    done: float,
    total: float | None,
    unit: str,
    at: float,
    attempt: int | None = None,
) -> dict[str, Any]:
    """How far a job's ``phase`` (download, run, upload) is."""
    fraction = None if not total else round(max(0.0, min(1.0, done / total)), 4)
    event: dict[str, Any] = {
        "type": "progress",
        "phase": phase,
        "done": done,
        "total": total,
        "unit": unit,
        "fraction": fraction,
        "at": round(at, 3),
    }
    if attempt is not None:
        event["attempt"] = attempt
    return event


def parse_published(message: str) -> tuple[str, dict[str, Any]] | None:
    """A channel message as :class:`JobEvents` publishes it: (entry id, event)."""
    entry, _, body = message.partition(" ")
    try:
        event = json.loads(body)
    except ValueError:
        return None
    return (entry, event) if isinstance(event, dict) else None


def entry_order(entry: str) -> tuple[int, int]:
    """A stream entry id as a sortable pair (``"1733300000123-4"`` -> (1733300000123, 4))."""
    millis, _, sequence = entry.partition("-")
    return int(millis), int(sequence or 0)


class JobEvents:
    """Publishes and reads jobs' events on one Redis, under one key prefix."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        *,
        kept: int = EVENTS_KEPT,
        ttl_seconds: int = EVENTS_TTL_SECONDS,
        ended_ttl_seconds: int = ENDED_TTL_SECONDS,
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.kept = kept
        self.ttl_seconds = ttl_seconds
        self.ended_ttl_seconds = ended_ttl_seconds
        source = resources.files("hypermedia.queue").joinpath("scripts/publish.lua").read_text()
        self._script = client.register_script(source)
        self._warned = 0.0
        self._lock = threading.Lock()

    def key(self, job_id: str) -> str:
        return events_key(self.prefix, job_id)

    def publish(self, job_id: str, event: Mapping[str, Any]) -> None:
        self.publish_many([(job_id, event)])

    def publish_many(self, events: Iterable[tuple[str, Mapping[str, Any]]]) -> None:
        """Publish several jobs' events in one round trip (best effort).

        The pipeline runs the script by its digest: redis-py's own script objects ask
        ``SCRIPT EXISTS`` before every pipeline, a second round trip for each publish
        (7 % of a pipeline actor's time on thumbnails). A Redis that lacks the script
        (its first use, a restart) answers NOSCRIPT to the whole batch, which did
        nothing then: the script is loaded and the batch sent again."""
        pending = list(events)
        if not pending:
            return
        script = self._script
        for attempt in (1, 2):
            try:
                pipe = self.client.pipeline(transaction=False)
                for job_id, event in pending:
                    body = json.dumps(event, separators=(",", ":"))
                    status = event.get("status")
                    ended = event.get("type") == "status" and status in ENDED_STATUSES
                    ttl = self.ended_ttl_seconds if ended else self.ttl_seconds
                    pipe.evalsha(script.sha, 1, self.key(job_id), body, self.kept, ttl)
                pipe.execute()
                return
            except redis.exceptions.NoScriptError as exc:
                if attempt == 2:
                    self._dropped(len(pending), exc)
                    return
                try:
                    self.client.script_load(script.script)  # the same digest
                except (redis.ConnectionError, redis.TimeoutError) as exc:
                    self._dropped(len(pending), exc)
                    return
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self._dropped(len(pending), exc)
                return

    def history(self, job_id: str, after: str | None = None) -> list[tuple[str, dict[str, Any]]]:
        """The job's recent events, oldest first; ``after``: only those past that entry."""
        start = "-" if after is None else f"({after}"
        entries: Any = self.client.xrange(self.key(job_id), min=start)
        return [(str(entry), json.loads(fields["e"])) for entry, fields in entries]

    def _dropped(self, count: int, exc: Exception) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self._warned < _WARN_EVERY_SECONDS:
                return
            self._warned = now
        log.warning(
            "redis unavailable: %d job events dropped (and any more this minute): %s",
            count,
            exc,
            extra={"action": "job_events"},
        )
