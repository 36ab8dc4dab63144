"""The head's metrics through prometheus-client, served on the API's ``/metrics``.

:class:`HeadMetrics` is the head's :class:`~hypermedia.metrics.Recorder`: a
``CollectorRegistry`` of its own (no global registry, one per stack) holding what the
head's processes count as it happens (submits, the failures the reaper and the
supervisor record, the scheduler's spend and decisions). :meth:`HeadMetrics.watch`
adds what is read when Prometheus scrapes: queue depth and oldest age per priority
band from Redis (one pipelined round trip per queue), in-flight and retry-wait
counts, the live workers and their heartbeats from the record (one query), the
callback outbox's backlog (one query), and the storage probe's last answer
(:meth:`HeadMetrics.watch_storage`). A backing service that does not answer leaves its
metrics out of that scrape (and says so in the log) rather than failing the whole
answer.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import Counter as Tally
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import Counter as PromCounter
from prometheus_client import Gauge as PromGauge
from prometheus_client import Histogram as PromHistogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import Engine, select

from hypermedia import ids
from hypermedia.clock import Clock, to_epoch
from hypermedia.db import tables as t
from hypermedia.db.engine import snapshot, transaction
from hypermedia.errors import HypermediaError
from hypermedia.metrics import (
    BANDS,
    BLOB_DELETIONS_OLDEST,
    BLOB_DELETIONS_PENDING,
    BULK_RUN_OBJECTS,
    CALLBACKS_FAILED,
    CALLBACKS_OLDEST,
    CALLBACKS_OVERDUE,
    CALLBACKS_PENDING,
    CLAIMS_PAUSED,
    CLOUD,
    HEARTBEAT_AGE,
    QUEUE_DEPTH,
    QUEUE_IN_FLIGHT,
    QUEUE_OLDEST,
    QUEUE_RETRY_WAIT,
    SCRAPED,
    STORAGE_UP,
    VPS,
    WORKERS,
    Labels,
    Metric,
    band_of,
    check,
)
from hypermedia.queue.redis_queue import RedisQueue

if TYPE_CHECKING:
    from hypermedia.storage.health import StorageHealth

log = logging.getLogger(__name__)

# The classic text format every Prometheus reads (what generate_latest writes for our
# names; the library's "latest" announces 1.0.0, which Prometheus 2 does not know).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LIVE_WORKERS = ("active", "draining")


class HeadMetrics:
    """The head's recorder (see the module docstring)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.cloud_nodes: dict[str, bool] = {}
        self._instruments: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._watched = False
        self.storage_health: StorageHealth | None = None

    def count(self, metric: Metric, labels: Labels, amount: float = 1.0) -> None:
        self._child(metric, "counter", labels).inc(amount)

    def observe(self, metric: Metric, labels: Labels, value: float) -> None:
        self._child(metric, "histogram", labels).observe(value)

    def set(self, metric: Metric, labels: Labels, value: float) -> None:
        self._child(metric, "gauge", labels).set(value)

    def place(self, cloud_nodes: Mapping[str, bool]) -> None:
        self.cloud_nodes = dict(cloud_nodes)

    def _child(self, metric: Metric, kind: str, labels: Labels) -> Any:
        values = check(metric, kind, labels)  # type: ignore[arg-type]
        if metric in SCRAPED:
            raise ValueError(f"{metric.name} is read when scraped, not recorded")
        # Made on first use: a metric without labels would otherwise be exported as 0
        # by a head that never records it (a scheduler's last evaluation "in 1970").
        with self._lock:
            instrument = self._instruments.get(metric.name)
            if instrument is None:
                instrument = _instrument(metric, self.registry)
                self._instruments[metric.name] = instrument
        return instrument.labels(*values) if values else instrument

    def watch(self, queue: RedisQueue, engine: Engine, clock: Clock) -> None:
        """Read the queues (Redis) and the workers (the record) on every scrape."""
        if not self._watched:
            self.registry.register(StateCollector(queue, engine, clock, self))
            self._watched = True

    def watch_storage(self, health: StorageHealth) -> None:
        """Export the storage probe's last answer on every scrape (``storage_up``)."""
        self.storage_health = health

    def exposition(self) -> bytes:
        """The text format Prometheus scrapes (``Content-Type``: :data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)


def _instrument(metric: Metric, registry: CollectorRegistry) -> Any:
    labels = list(metric.labels)
    if metric.kind == "counter":
        return PromCounter(metric.name, metric.help, labels, registry=registry)
    if metric.kind == "histogram":
        return PromHistogram(
            metric.name, metric.help, labels, registry=registry, buckets=metric.buckets
        )
    return PromGauge(metric.name, metric.help, labels, registry=registry)


class StateCollector(Collector):
    """Queue and worker gauges, read when scraped."""

    def __init__(
        self, queue: RedisQueue, engine: Engine, clock: Clock, metrics: HeadMetrics
    ) -> None:
        self.queue = queue
        self.engine = engine
        self.clock = clock
        self.metrics = metrics

    def describe(self) -> Iterator[GaugeMetricFamily]:
        for metric in SCRAPED:
            yield _family(metric)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = self.clock.now()
        try:
            yield from self._queues(now)
        except HypermediaError as exc:
            log.warning("metrics: queues not read: %s", exc, extra={"action": "metrics"})
        try:
            yield from self._workers(now)
        except HypermediaError as exc:
            log.warning("metrics: workers not read: %s", exc, extra={"action": "metrics"})
        try:
            yield from self._bulk()
        except HypermediaError as exc:
            log.warning("metrics: bulk runs not read: %s", exc, extra={"action": "metrics"})
        try:
            yield from self._blob_deletions(now)
        except HypermediaError as exc:
            log.warning("metrics: blob deletions not read: %s", exc, extra={"action": "metrics"})
        try:
            yield from self._callbacks(now)
        except HypermediaError as exc:
            log.warning("metrics: callbacks not read: %s", exc, extra={"action": "metrics"})
        health = self.metrics.storage_health
        if health is not None:  # never raises: a storage that hangs is down after the timeout
            family = _family(STORAGE_UP)
            family.add_metric([], 1.0 if health.state().ok else 0.0)
            yield family

    def _blob_deletions(self, now: float) -> Iterator[GaugeMetricFamily]:
        from hypermedia.storage import deletions

        with transaction(self.engine) as conn:
            waiting = deletions.pending(conn, now)
        count, oldest = _family(BLOB_DELETIONS_PENDING), _family(BLOB_DELETIONS_OLDEST)
        count.add_metric([], waiting.count)
        oldest.add_metric([], waiting.oldest_age_seconds)
        yield from (count, oldest)

    def _callbacks(self, now: float) -> Iterator[GaugeMetricFamily]:
        from hypermedia.jobs import callbacks

        with snapshot(self.engine) as conn:  # a read: no writer waits for it (SQLite)
            backlog = callbacks.backlog(conn, now)
        pending, failed = _family(CALLBACKS_PENDING), _family(CALLBACKS_FAILED)
        oldest, overdue = _family(CALLBACKS_OLDEST), _family(CALLBACKS_OVERDUE)
        pending.add_metric([], backlog.pending)
        failed.add_metric([], backlog.failed)
        oldest.add_metric([], backlog.oldest_pending_age_seconds)
        overdue.add_metric([], backlog.oldest_overdue_seconds)
        yield from (pending, failed, oldest, overdue)

    def _bulk(self) -> Iterator[GaugeMetricFamily]:
        from hypermedia.bulk import runs

        family = _family(BULK_RUN_OBJECTS)
        sums: Tally[tuple[str, str, str, str]] = Tally()
        with transaction(self.engine) as conn:
            for view in runs.unfinished(conn):
                for name, value in view.counts().items():
                    sums[(view.kind, view.operation or "", view.state, name)] += value
        for labels, value in sorted(sums.items()):
            family.add_metric(list(labels), value)
        yield family

    def _queues(self, now: float) -> Iterator[GaugeMetricFamily]:
        depth, oldest = _family(QUEUE_DEPTH), _family(QUEUE_OLDEST)
        in_flight, retry_wait = _family(QUEUE_IN_FLIGHT), _family(QUEUE_RETRY_WAIT)
        rows = [
            (name, self.queue.priority_heads(name), self.queue.counts(name))
            for name in self.queue.queues
        ]
        for name, heads, counts in rows:
            by_band = dict.fromkeys(BANDS, 0)
            age = dict.fromkeys(BANDS, 0.0)
            for priority, (count, oldest_id) in heads.items():
                band = band_of(priority)
                by_band[band] += count
                with contextlib.suppress(ValueError):  # an id not ours tells no age
                    age[band] = max(age[band], now - ids.created_at(oldest_id))
            for band in BANDS:
                depth.add_metric([name, band], by_band[band])
                oldest.add_metric([name, band], max(0.0, age[band]))
            in_flight.add_metric([name], counts.leased)
            retry_wait.add_metric([name], counts.delayed)
        yield from (depth, oldest, in_flight, retry_wait)

    def _workers(self, now: float) -> Iterator[GaugeMetricFamily]:
        w = t.workers.c
        with transaction(self.engine) as conn:
            rows: Sequence[Any] = conn.execute(
                select(w.queue, w.status, w.node_id, w.last_heartbeat, w.claims_paused_since).where(
                    w.status.in_(LIVE_WORKERS)
                )
            ).all()
        cloud = self.metrics.cloud_nodes
        tally: Tally[tuple[str, str, str, str]] = Tally()
        beats: dict[str, float] = {}
        paused: dict[str, float] = {}
        for row in rows:
            on_cloud = row.node_id is not None and row.node_id in cloud
            spot = "true" if on_cloud and cloud[row.node_id] else "false"
            tally[(row.queue, row.status, CLOUD if on_cloud else VPS, spot)] += 1
            age = max(0.0, now - to_epoch(row.last_heartbeat))
            beats[row.queue] = max(beats.get(row.queue, 0.0), age)
            paused_for = (
                0.0
                if row.claims_paused_since is None
                else max(0.0, now - to_epoch(row.claims_paused_since))
            )
            paused[row.queue] = max(paused.get(row.queue, 0.0), paused_for)
        workers, heartbeat = _family(WORKERS), _family(HEARTBEAT_AGE)
        claims_paused = _family(CLAIMS_PAUSED)
        for key, count in sorted(tally.items()):
            workers.add_metric(list(key), count)
        for queue, age in sorted(beats.items()):
            heartbeat.add_metric([queue], age)
        for queue, seconds in sorted(paused.items()):
            claims_paused.add_metric([queue], seconds)
        yield from (workers, heartbeat, claims_paused)


def _family(metric: Metric) -> GaugeMetricFamily:
    return GaugeMetricFamily(metric.name, metric.help, labels=list(metric.labels))
