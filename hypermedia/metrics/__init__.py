"""The platform's metrics: every name, label and bucket in one place.

Two exporters share this catalogue, each where the other cannot reach:

* the pipeline actors record through ``ray.util.metrics``
  (:mod:`hypermedia.metrics.actors`): Ray's metrics agent on each node exports them,
  prefixed ``ray_``, at the node's metrics export port, beside Ray's own metrics and
  where Ray's dashboard looks for them;
* the head (the API server, the reaper, the supervisor, the scheduler) records through
  prometheus-client (:mod:`hypermedia.metrics.head`) and serves them, with what it reads
  from Redis and the record at scrape time, on the API's ``/metrics`` (operator key).

The Prometheus config we ship (``etc/prometheus/prometheus.yml``) strips Ray's ``ray_``
prefix from ``ray_hypermedia_*``, so a metric counted in both places (a job failed by
its worker, or by the reaper when the worker vanished) is one name to Prometheus:
``sum by (code) (rate(hypermedia_jobs_failed_total[5m]))``.

Labels are low-cardinality on purpose: queue, operation, error code, priority band,
sandbox limit, worker state, VPS or cloud, spot, scheduler action, spend window.
Never a job, object, user or worker id (Ray adds its own ``WorkerId`` to what actors
export: one series per actor process).

Every name starts ``hypermedia_`` (left out below). Where: *actor* (Ray), *head*
(prometheus-client), *both*, *sched.* (the scheduler, on the head).

================================================  =========  ============================  ======
metric                                            type       labels                        where
================================================  =========  ============================  ======
``jobs_submitted_total``                          counter    queue, operation              head
``jobs_started_total``                            counter    queue, operation              actor
``jobs_completed_total``                          counter    queue, operation              actor
``jobs_failed_total``                             counter    queue, operation, code        both
``jobs_retried_total``                            counter    queue, operation, code        both
``job_duration_seconds``                          histogram  queue, operation, outcome     actor
``job_queue_wait_seconds``                        histogram  queue, priority_band          actor
``sandbox_kills_total``                           counter    queue, limit                  actor
``queue_depth``                                   gauge      queue, priority_band          head
``queue_oldest_age_seconds``                      gauge      queue, priority_band          head
``queue_in_flight``                               gauge      queue                         head
``queue_retry_wait``                              gauge      queue                         head
``workers``                                       gauge      queue, state, location, spot  head
``worker_heartbeat_age_seconds``                  gauge      queue                         head
``worker_claims_paused_seconds``                  gauge      queue                         head
``cloud_spend_cents``                             gauge      window                        sched.
``cloud_spend_cap_cents``                         gauge      window                        sched.
``cloud_spend_alert_cents``                       gauge                                    sched.
``cost_locked``                                   gauge                                    sched.
``scheduler_decisions_total``                     counter    action                        sched.
``scheduler_last_evaluation_timestamp_seconds``   gauge                                    sched.
``bulk_run_objects``                              gauge      kind, operation, state, count head
``storage_up``                                    gauge                                    head
``blob_deletions_pending``                        gauge                                    head
``blob_deletions_oldest_age_seconds``             gauge                                    head
``callbacks_pending``                             gauge                                    head
``callbacks_failed``                              gauge                                    head
``callbacks_oldest_pending_age_seconds``          gauge                                    head
``callbacks_oldest_overdue_seconds``              gauge                                    head
``callbacks_last_attempt_timestamp_seconds``      gauge                                    head
================================================  =========  ============================  ======

What each counts:

* *started*: attempts started (claimed and ``processing``; a retried job starts again);
  *completed*: jobs completed; *failed*: jobs that ended ``failed`` (``code`` is the
  job's ``error_code``); *retried*: failed attempts with another to come (the job went
  to ``retry_wait``). The record agrees: ``failed`` by ``code`` is ``processing_jobs``
  with ``status = 'failed'`` grouped by ``error_code``.
* *duration*: an attempt from its start to its completion, failure or cancel, as the
  record's ``job_attempts.duration_ms``; ``outcome`` is how the job took it:
  ``completed``, ``failed`` (the job failed, or waits for a retry) or ``cancelled`` (its
  owner's cancel, asked while it ran, which its worker honoured or its failure ended);
  an attempt the reaper failed after its lease ran out is not timed. *queue wait*: from the job's
  creation to the start of its first attempt.
* *sandbox kills*: jobs stopped by a limit of their sandbox (``limit``: ``wall_clock``,
  ``cpu``, ``memory``, ``disk``, ``processes``).
* *queue depth* and *oldest age*: ready jobs in Redis per priority band (every band is
  exported, 0 when empty); *in flight*: leased; *retry wait*: delayed retries.
* *workers*: live rows of ``workers`` (``state`` ``active`` or ``draining``;
  ``location`` ``vps`` or ``cloud`` and ``spot`` ``true``/``false``: the scheduler says
  which Ray nodes are cloud instances, see :meth:`Recorder.place`); *heartbeat age*:
  the oldest heartbeat among a queue's live workers.
* *spend*: the ``cloud_spend`` ledger's last hour (``window="hour"``) and today
  (``window="day"``, since midnight UTC), beside the caps (``max_hourly_spend_cents``,
  ``max_daily_spend_cents``) and ``alert_threshold_cents``; *cost locked*: 1 while the
  daily cap holds the scheduler in ``vps_only``; *decisions*: rows written to
  ``scheduler_decisions`` by ``action``.
* *bulk run objects*: the bulk runs not finished (``state`` ``creating``, ``paused``,
  ``draining``, and ``cancelled`` while jobs it asked to stop still run), summed by
  ``kind`` and ``operation``: objects ``scanned``, jobs ``created``, objects ``skipped``
  (done at the target version) and ``unfit``, objects ``migrated`` and ``failed``, and
  their jobs ``live`` (queued or running: the cap) and ``stopping`` (a cancelled run's
  jobs not ended yet).
  Each run by its id: ``hypermedia bulk status``, ``hypermedia status``, the operator page.
* *storage up*: 1 if the head's last probe of the storage (S3: a HEAD of the bucket;
  local: the directory takes a file and has room) answered, 0 if not: the probe
  ``/healthz`` and ``hypermedia status`` show, run at most every
  ``storage_probe_seconds``; a scrape waits for it at most
  ``storage_probe_timeout_seconds``.
* *blob deletions*: the blobs of deleted objects not deleted yet (``blob_deletions``:
  the storage failed, and the head's maintenance tries again with backoff,
  :mod:`hypermedia.storage.deletions`), and how long the oldest has waited (0 when
  none). A blob left there is still stored, and paid for.
* *callbacks*: the completion webhooks of the outbox (``job_callbacks``,
  :mod:`hypermedia.callbacks`) not delivered yet (``pending``: due, or waiting for a
  retry after a receiver failed), those given up after ``callback_max_attempts`` in the
  last hour (``failed``, by their last attempt: the outbox keeps them
  ``callback_failed_retention_seconds``, then the head's maintenance deletes them),
  how long the oldest pending one has waited since its job ended, and how long the
  oldest *due* one has waited for its attempt (``overdue``; each 0 when none). An
  event's age says how late its receiver hears of its job, not whether the sender
  works: with the default attempts and backoff one event is delivered or given up
  within about 25 minutes, but a receiver that does not answer has its events tried
  one at a time (the next once the one before is given up: its fifth waits about 1 h
  45 min), and ``callback_max_attempts`` above 10 keeps a single event pending past an
  hour (up to a day at 100). An event overdue for long is a sender not working through
  the outbox (the head's maintenance stopped, a lane stuck), or one working but behind:
  a receiver's events go one at a time, each up to ``callback_timeout_seconds``, so one
  answering in 9 s with 450 due has its last wait 67 min. The sender's
  ``callbacks_last_attempt_timestamp_seconds`` (recorded, not read from the outbox: when
  it last finished an attempt, whatever the answer; absent until its first) tells them
  apart: ``HypermediaCallbacksStuck`` fires on the first, ``HypermediaCallbacksBehind``
  on the second.

Nothing here imports prometheus-client or Ray: a :class:`Recorder` is passed to what
counts (the dispatcher, the reaper, ingest, the scheduler), built by whoever opens the
stack; :class:`MemoryRecorder` is the one for unit tests.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

from hypermedia.jobs.priority import BANDS, Band, band_of

__all__ = [
    "BANDS",
    "CATALOGUE",
    "Band",
    "MemoryRecorder",
    "Metric",
    "NoMetrics",
    "Recorder",
    "band_of",
]

Kind = Literal["counter", "gauge", "histogram"]
Labels = Mapping[str, str]

# Ray prefixes what actors export; our Prometheus config strips it again.
RAY_PREFIX = "ray_"

DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
WAIT_BUCKETS = (0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200)

# Label values.
VPS, CLOUD = "vps", "cloud"
COMPLETED, FAILED, CANCELLED = "completed", "failed", "cancelled"
HOUR, DAY = "hour", "day"
# The sandbox's limit codes (hypermedia.sandbox.outcome) and the limit each one names.
LIMIT_OF_CODE: Mapping[str, str] = {
    "timeout": "wall_clock",
    "cpu_limit": "cpu",
    "memory_limit": "memory",
    "output_limit": "disk",
    "process_limit": "processes",
}


@dataclass(frozen=True, slots=True)
class Metric:
    """One metric: its name (as Prometheus has it, after our scrape config), what it
    is, its label names and, for a histogram, its bucket bounds."""

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()

    @property
    def ray_name(self) -> str:
        """The name Ray's metrics agent exports an actor's samples under."""
        return RAY_PREFIX + self.name


JOBS_SUBMITTED = Metric(
    "hypermedia_jobs_submitted_total",
    "counter",
    "Jobs created by submits.",
    ("queue", "operation"),
)
JOBS_STARTED = Metric(
    "hypermedia_jobs_started_total",
    "counter",
    "Attempts started (a retried job starts again).",
    ("queue", "operation"),
)
JOBS_COMPLETED = Metric(
    "hypermedia_jobs_completed_total", "counter", "Jobs completed.", ("queue", "operation")
)
JOBS_FAILED = Metric(
    "hypermedia_jobs_failed_total",
    "counter",
    "Jobs that ended failed, by their error code.",
    ("queue", "operation", "code"),
)
JOBS_RETRIED = Metric(
    "hypermedia_jobs_retried_total",
    "counter",
    "Failed attempts with another attempt to come, by their error code.",
    ("queue", "operation", "code"),
)
JOB_DURATION = Metric(
    "hypermedia_job_duration_seconds",
    "histogram",
    "An attempt from its start to its end, by what its job did: completed, failed (or"
    " waits for a retry), or cancelled (its owner's cancel, asked while it ran).",
    ("queue", "operation", "outcome"),
    DURATION_BUCKETS,
)
QUEUE_WAIT = Metric(
    "hypermedia_job_queue_wait_seconds",
    "histogram",
    "A job from its creation to the start of its first attempt.",
    ("queue", "priority_band"),
    WAIT_BUCKETS,
)
SANDBOX_KILLS = Metric(
    "hypermedia_sandbox_kills_total",
    "counter",
    "Jobs stopped by a limit of their sandbox.",
    ("queue", "limit"),
)
QUEUE_DEPTH = Metric(
    "hypermedia_queue_depth", "gauge", "Jobs ready to run.", ("queue", "priority_band")
)
QUEUE_OLDEST = Metric(
    "hypermedia_queue_oldest_age_seconds",
    "gauge",
    "Age of the oldest ready job (0 when none).",
    ("queue", "priority_band"),
)
QUEUE_IN_FLIGHT = Metric(
    "hypermedia_queue_in_flight", "gauge", "Jobs leased by a worker.", ("queue",)
)
QUEUE_RETRY_WAIT = Metric(
    "hypermedia_queue_retry_wait", "gauge", "Jobs waiting for their retry.", ("queue",)
)
WORKERS = Metric(
    "hypermedia_workers",
    "gauge",
    "Live pipeline actors (workers rows active or draining).",
    ("queue", "state", "location", "spot"),
)
HEARTBEAT_AGE = Metric(
    "hypermedia_worker_heartbeat_age_seconds",
    "gauge",
    "The oldest heartbeat among a queue's live workers.",
    ("queue",),
)
CLAIMS_PAUSED = Metric(
    "hypermedia_worker_claims_paused_seconds",
    "gauge",
    "The longest a queue's live worker has claimed no job because its disk is low"
    " (worker_min_free_disk_mb); 0: every one claims.",
    ("queue",),
)
SPEND = Metric(
    "hypermedia_cloud_spend_cents",
    "gauge",
    "Cloud spend from the ledger: the last hour, and today (UTC).",
    ("window",),
)
SPEND_CAP = Metric(
    "hypermedia_cloud_spend_cap_cents",
    "gauge",
    "The spend caps of scheduler.json: hourly and daily.",
    ("window",),
)
SPEND_ALERT = Metric(
    "hypermedia_cloud_spend_alert_cents",
    "gauge",
    "scheduler.json's alert_threshold_cents (against today's spend).",
)
COST_LOCKED = Metric(
    "hypermedia_cost_locked",
    "gauge",
    "1 while the daily cap holds the scheduler in vps_only (until reset-cost-lock).",
)
DECISIONS = Metric(
    "hypermedia_scheduler_decisions_total",
    "counter",
    "Decisions written to scheduler_decisions.",
    ("action",),
)
LAST_EVALUATION = Metric(
    "hypermedia_scheduler_last_evaluation_timestamp_seconds",
    "gauge",
    "When the scheduler last evaluated (Unix seconds).",
)

BULK_RUN_OBJECTS = Metric(
    "hypermedia_bulk_run_objects",
    "gauge",
    "Bulk runs not finished (creating, paused, draining; cancelled while its jobs stop),"
    " summed: their objects by count (scanned, created, skipped, unfit, migrated, failed,"
    " live: jobs queued or running, stopping: a cancelled run's jobs not ended yet).",
    ("kind", "operation", "state", "count"),
)
STORAGE_UP = Metric(
    "hypermedia_storage_up",
    "gauge",
    "1 if the head's last probe of the storage answered (S3: a HEAD of the bucket; local:"
    " the directory takes a file and has room), 0 if not.",
)
BLOB_DELETIONS_PENDING = Metric(
    "hypermedia_blob_deletions_pending",
    "gauge",
    "Blobs of deleted objects not deleted yet: the storage failed, the head tries again.",
)
BLOB_DELETIONS_OLDEST = Metric(
    "hypermedia_blob_deletions_oldest_age_seconds",
    "gauge",
    "How long the oldest blob deletion not done yet has waited (0 when none).",
)
CALLBACKS_PENDING = Metric(
    "hypermedia_callbacks_pending",
    "gauge",
    "Job callbacks (completion webhooks) not delivered yet: due, or waiting for a retry.",
)
CALLBACKS_FAILED = Metric(
    "hypermedia_callbacks_failed",
    "gauge",
    "Job callbacks given up after callback_max_attempts failed attempts, in the last hour"
    " (by their last attempt).",
)
CALLBACKS_OLDEST = Metric(
    "hypermedia_callbacks_oldest_pending_age_seconds",
    "gauge",
    "How long the oldest job callback not delivered yet has waited since its job ended"
    " (0 when none).",
)
CALLBACKS_OVERDUE = Metric(
    "hypermedia_callbacks_oldest_overdue_seconds",
    "gauge",
    "How long the oldest job callback due for an attempt has waited for it (0 when none):"
    " a stopped sender, or one behind a receiver slow with a backlog (see"
    " hypermedia_callbacks_last_attempt_timestamp_seconds).",
)
CALLBACKS_LAST_ATTEMPT = Metric(
    "hypermedia_callbacks_last_attempt_timestamp_seconds",
    "gauge",
    "When the head's callback sender last finished an attempt at a job callback, whatever"
    " its answer (Unix seconds; absent until its first).",
)

CATALOGUE: tuple[Metric, ...] = (
    JOBS_SUBMITTED,
    JOBS_STARTED,
    JOBS_COMPLETED,
    JOBS_FAILED,
    JOBS_RETRIED,
    JOB_DURATION,
    QUEUE_WAIT,
    SANDBOX_KILLS,
    QUEUE_DEPTH,
    QUEUE_OLDEST,
    QUEUE_IN_FLIGHT,
    QUEUE_RETRY_WAIT,
    WORKERS,
    HEARTBEAT_AGE,
    CLAIMS_PAUSED,
    SPEND,
    SPEND_CAP,
    SPEND_ALERT,
    COST_LOCKED,
    DECISIONS,
    LAST_EVALUATION,
    BULK_RUN_OBJECTS,
    STORAGE_UP,
    BLOB_DELETIONS_PENDING,
    BLOB_DELETIONS_OLDEST,
    CALLBACKS_PENDING,
    CALLBACKS_FAILED,
    CALLBACKS_OLDEST,
    CALLBACKS_OVERDUE,
    CALLBACKS_LAST_ATTEMPT,
)
# What the head reads from Redis and the record when it is scraped (never recorded).
SCRAPED: tuple[Metric, ...] = (
    QUEUE_DEPTH,
    QUEUE_OLDEST,
    QUEUE_IN_FLIGHT,
    QUEUE_RETRY_WAIT,
    WORKERS,
    HEARTBEAT_AGE,
    CLAIMS_PAUSED,
    BULK_RUN_OBJECTS,
    STORAGE_UP,
    BLOB_DELETIONS_PENDING,
    BLOB_DELETIONS_OLDEST,
    CALLBACKS_PENDING,
    CALLBACKS_FAILED,
    CALLBACKS_OLDEST,
    CALLBACKS_OVERDUE,
)


class Recorder(Protocol):
    """Where a process records its metrics (see the module docstring). Labels are
    given by name, exactly the metric's :attr:`Metric.labels`."""

    def count(self, metric: Metric, labels: Labels, amount: float = 1.0) -> None: ...

    def observe(self, metric: Metric, labels: Labels, value: float) -> None: ...

    def set(self, metric: Metric, labels: Labels, value: float) -> None: ...

    def place(self, cloud_nodes: Mapping[str, bool]) -> None:
        """Which Ray nodes (hex ids) are cloud instances, and whether each is spot: the
        scheduler's word, for the ``location`` and ``spot`` of :data:`WORKERS`."""
        ...


class NoMetrics:
    """Records nothing (a process that exports no metrics)."""

    def count(self, metric: Metric, labels: Labels, amount: float = 1.0) -> None:
        pass

    def observe(self, metric: Metric, labels: Labels, value: float) -> None:
        pass

    def set(self, metric: Metric, labels: Labels, value: float) -> None:
        pass

    def place(self, cloud_nodes: Mapping[str, bool]) -> None:
        pass


def check(metric: Metric, kind: Kind, labels: Labels) -> tuple[str, ...]:
    """The label values in the metric's order; ``ValueError`` for the wrong kind or
    labels (a programming error: the tests find it)."""
    if metric.kind != kind:
        raise ValueError(f"{metric.name} is a {metric.kind}, not a {kind}")
    if set(labels) != set(metric.labels):
        raise ValueError(f"{metric.name} takes labels {metric.labels}, got {sorted(labels)}")
    return tuple(str(labels[name]) for name in metric.labels)


class MemoryRecorder:
    """Keeps what is recorded, for tests: ``value(metric, **labels)`` and
    ``observations(metric, **labels)``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.values: dict[tuple[str, tuple[str, ...]], float] = defaultdict(float)
        self.histograms: dict[tuple[str, tuple[str, ...]], list[float]] = defaultdict(list)
        self.cloud_nodes: dict[str, bool] = {}

    def count(self, metric: Metric, labels: Labels, amount: float = 1.0) -> None:
        key = (metric.name, check(metric, "counter", labels))
        if amount < 0:
            raise ValueError(f"{metric.name}: a counter only goes up")
        with self._lock:
            self.values[key] += amount

    def observe(self, metric: Metric, labels: Labels, value: float) -> None:
        key = (metric.name, check(metric, "histogram", labels))
        with self._lock:
            self.histograms[key].append(value)

    def set(self, metric: Metric, labels: Labels, value: float) -> None:
        key = (metric.name, check(metric, "gauge", labels))
        with self._lock:
            self.values[key] = value

    def place(self, cloud_nodes: Mapping[str, bool]) -> None:
        with self._lock:
            self.cloud_nodes = dict(cloud_nodes)

    def value(self, metric: Metric, **labels: str) -> float:
        with self._lock:
            return self.values.get((metric.name, check(metric, metric.kind, labels)), 0.0)

    def total(self, metric: Metric) -> float:
        """The sum over every label set of a counter or gauge."""
        with self._lock:
            return sum(v for (name, _), v in self.values.items() if name == metric.name)

    def observations(self, metric: Metric, **labels: str) -> list[float]:
        with self._lock:
            return list(self.histograms.get((metric.name, check(metric, "histogram", labels)), []))
