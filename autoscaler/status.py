"""The platform at a glance: one function gathers it, the CLI and the operator page show it.

:func:`gather` reads, in one database transaction and a few Redis round trips:

- **queues** (every queue of the deployment): ready jobs (depth) and the oldest ready
  job's age, per priority band and in all, from Redis (what the scheduler reads); jobs in
  flight (leased) and waiting for a retry (delayed); jobs in (created) and out (reached
  a final state: completed, failed, cancelled) per minute over the last
  :data:`RATE_WINDOW_SECONDS`, from the record;
- **workers**: every live ``workers`` row (active, draining): where it runs (the VPS, or
  a cloud node: a Ray node other than the head's, once ``ray up`` recorded it), host,
  state, heartbeat age, running attempts, last CPU (``worker_metrics``, if recent),
  whether it has paused claiming and why (the disk guard: ``claims_paused``), its last
  outage pause (``outage_paused``: why, since when, how long; while it lasts or after);
  and
  the cloud instances on the meter (open ``cloud_spend`` rows);
- **spend**: the ledger's last hour and today, the caps of ``scheduler.json``, and the
  daily cap's lock;
- **billing**: the last reconciliation of the ledger with each provider's bill
  (:mod:`autoscaler.billing`): when it was read, up to which day, an error, and the last
  findings;
- **bursts**: the operators' manual bursts not ended (``hypermedia scheduler burst``);
- **bulk runs**: those not finished (:func:`hypermedia.bulk.runs.unfinished`) with their
  progress (done and failed of their total, in flight, rate, ETA: what ``hypermedia bulk
  status`` says), and the last :data:`BULK_FINISHED_SHOWN` finished in the last
  :data:`BULK_FINISHED_WITHIN` seconds; their jobs counted in one query for all of them;
- **alerts** firing (:mod:`autoscaler.alerting`'s state), the most severe first;
- **decisions**: the scheduler's last ones with their reasons; who leads and when the
  last turn was;
- **storage**: its probe's last answer (:mod:`hypermedia.storage.health`), when the
  caller has one: up, or down and why.

It answers a :class:`Status` of plain values (:meth:`Status.as_json`: what ``hypermedia
status --json`` prints); it writes nothing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import func, select

from autoscaler.alerting import METRICS_FRESH_SECONDS, read_alert_state
from autoscaler.config import SchedulerConfig
from autoscaler.leader import Leadership
from autoscaler.scheduler import (
    BURSTS,
    COST_LOCK,
    RECONCILED,
    bursts_from,
    last_turn,
    ledger_spend,
    queue_state,
)
from autoscaler.snapshot import BANDS
from autoscaler.state import epoch, read_state, to_datetime
from hypermedia.bulk import runs
from hypermedia.clock import age_text
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.jobs.states import JobStatus
from hypermedia.stack import Stack
from hypermedia.storage.health import StorageHealth

RATE_WINDOW_SECONDS = 900.0
# The finished bulk runs shown below those not finished: a few, of the last day.
BULK_FINISHED_SHOWN = 3
BULK_FINISHED_WITHIN = 86_400.0
FINAL = (JobStatus.COMPLETED.value, JobStatus.FAILED.value, JobStatus.CANCELLED.value)


@dataclass(frozen=True, slots=True)
class BandStatus:
    depth: int
    oldest_age_seconds: float


@dataclass(frozen=True, slots=True)
class QueueStatus:
    queue: str
    depth: int
    oldest_age_seconds: float
    bands: dict[str, BandStatus]
    in_flight: int
    retry_wait: int
    created: int  # in the rate window
    finished: int  # reached a final state in the rate window
    in_per_minute: float
    out_per_minute: float


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    worker_id: str
    queue: str
    location: str  # vps | cloud
    hostname: str
    node_id: str | None
    state: str
    heartbeat_age_seconds: float
    current_jobs: int
    concurrency: int
    cpu_percent: float | None
    # Claiming no job although live (the disk guard): why ("low disk (312 MB free, needs
    # 1024)") and for how long; None: claiming.
    claims_paused: str | None = None
    claims_paused_seconds: float | None = None
    # Its last outage pause (the record, Redis or the storage down: claims held back):
    # why, since when, how long (so far, while ``outage_pause_over`` is False); None:
    # never paused.
    outage_paused: str | None = None
    outage_paused_since: float | None = None
    outage_paused_seconds: float | None = None
    outage_pause_over: bool = False
    outage_paused_ago_seconds: float | None = None  # since it began

    @property
    def shown_state(self) -> str:
        """The state as ``hypermedia status`` and the operator page show it."""
        if self.claims_paused is None:
            return self.state
        return f"{self.state}, claiming paused: {self.claims_paused}"

    @property
    def outage_note(self) -> str | None:
        """Its last outage pause as ``hypermedia status`` and the operator page say it."""
        if self.outage_paused is None or self.outage_paused_seconds is None:
            return None
        lasted = age_text(self.outage_paused_seconds)
        if not self.outage_pause_over:
            return f"claiming paused by an outage for {lasted}: {self.outage_paused}"
        ago = age_text(self.outage_paused_ago_seconds or 0.0)
        return f"paused {lasted} by an outage {ago} ago: {self.outage_paused}"


@dataclass(frozen=True, slots=True)
class InstanceStatus:
    provider: str
    instance_id: str
    node_type: str
    spot: bool
    cents_per_hour: float
    running_seconds: float


@dataclass(frozen=True, slots=True)
class SpendStatus:
    last_hour_cents: float
    today_cents: float
    hourly_cap_cents: int
    daily_cap_cents: int
    alert_threshold_cents: int
    locked: bool
    locked_at: float | None
    lock_reason: str | None


@dataclass(frozen=True, slots=True)
class BurstStatus:
    """An operator's manual burst not ended (``hypermedia scheduler burst``)."""

    queue: str
    workers: int
    until: float
    by: str


@dataclass(frozen=True, slots=True)
class BillingStatus:
    """One provider's reconciliation: its bill last read at ``read_at`` (None: never),
    the latest day compared (``compared_through``; a day with no spend on the ledger
    is never compared, and an older one may still wait to settle), or what went
    wrong."""

    provider: str
    read_at: float | None
    compared_through: str | None
    error: str | None


@dataclass(frozen=True, slots=True)
class AlertStatus:
    key: str
    rule: str
    level: str
    summary: str
    firing_since: float
    last_sent: float | None


@dataclass(frozen=True, slots=True)
class DecisionStatus:
    decided_at: float
    mode: str
    action: str
    queue: str | None
    applied: bool
    reason: str


@dataclass(frozen=True, slots=True)
class BulkRunStatus:
    """A bulk run not finished, or cancelled with jobs still stopping
    (:mod:`hypermedia.bulk`)."""

    run_id: str
    kind: str
    operation: str | None
    state: str
    reason: str | None
    queue: str | None
    priority: int
    max_in_flight: int
    # scanned, created, skipped, unfit, migrated, failed, live, stopping (a cancelled
    # run's jobs not ended yet)
    counts: dict[str, int]
    # total, done, failed, in flight, remaining, percent, rate, ETA (as ``bulk status``);
    # total and percent None: a run from before totals, while it scans
    progress: runs.Progress
    finished_at: float | None = None

    @property
    def shown_state(self) -> str:
        """The state as ``hypermedia status`` and the operator page show it."""
        return runs.shown_state(self.state, self.counts.get("stopping", 0))


@dataclass(frozen=True, slots=True)
class StorageStatus:
    ok: bool
    problem: str | None
    checked_at: float


@dataclass(frozen=True, slots=True)
class Status:
    at: float
    mode: str  # scheduler.json's mode, or vps_only while the cost lock holds
    leader: str | None  # "<host:pid> <term>", None: no scheduler leads
    last_turn_at: float | None
    rate_window_seconds: float
    queues: list[QueueStatus]
    workers: list[WorkerStatus]
    instances: list[InstanceStatus]
    spend: SpendStatus
    alerts: list[AlertStatus]
    decisions: list[DecisionStatus] = field(default_factory=list)
    bulk: list[BulkRunStatus] = field(default_factory=list)
    # The last few runs finished (BULK_FINISHED_SHOWN, in BULK_FINISHED_WITHIN), latest first.
    bulk_finished: list[BulkRunStatus] = field(default_factory=list)
    billing: list[BillingStatus] = field(default_factory=list)
    bursts: list[BurstStatus] = field(default_factory=list)
    # The reconciliation's last findings: a settled bill that differs from the ledger.
    billing_findings: list[str] = field(default_factory=list)
    storage: StorageStatus | None = None  # None: not probed by this caller

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def gather(
    stack: Stack,
    config: SchedulerConfig,
    decisions: int = 10,
    storage: StorageHealth | None = None,
) -> Status:
    """The platform now (see the module docstring); ``storage``: the probe to ask."""
    now = stack.clock.now()
    since = to_datetime(now - RATE_WINDOW_SECONDS)
    names = list(stack.queue.queues)
    j = t.jobs.c
    with transaction(stack.engine) as conn:
        created: dict[str, int] = {
            queue: count
            for queue, count in conn.execute(
                select(j.queue, func.count()).where(j.created_at >= since).group_by(j.queue)
            )
        }
        finished: dict[str, int] = {
            queue: count
            for queue, count in conn.execute(
                select(j.queue, func.count())
                .where(j.completed_at >= since, j.status.in_(FINAL))
                .group_by(j.queue)
            )
        }
        workers = _workers(conn, now)
        instances = _instances(conn, now)
        lock = read_state(conn, COST_LOCK)
        reconciled = read_state(conn, RECONCILED) or {}
        bursts = bursts_from(read_state(conn, BURSTS), now)
        spend = ledger_spend(conn, now, lock is not None, False)
        firing = read_alert_state(conn).firing()
        turn = last_turn(conn)
        d = t.scheduler_decisions
        recent = conn.execute(select(d).order_by(d.c.decision_id.desc()).limit(decisions)).all()
        bulk = runs.unfinished(conn, now)
        bulk_finished = runs.recently_finished(conn, now, BULK_FINISHED_SHOWN, BULK_FINISHED_WITHIN)

    minutes = RATE_WINDOW_SECONDS / 60
    queues = []
    for name in names:
        state = queue_state(stack.queue, name, now)
        counts = stack.queue.counts(name)
        queues.append(
            QueueStatus(
                queue=name,
                depth=state.depth,
                oldest_age_seconds=round(state.oldest_age_seconds, 1),
                bands={
                    band: BandStatus(
                        state.depth_by_band[band], round(state.oldest_by_band[band], 1)
                    )
                    for band in BANDS
                    if band in state.depth_by_band
                },
                in_flight=counts.leased,
                retry_wait=counts.delayed,
                created=int(created.get(name, 0)),
                finished=int(finished.get(name, 0)),
                in_per_minute=round(created.get(name, 0) / minutes, 2),
                out_per_minute=round(finished.get(name, 0) / minutes, 2),
            )
        )
    limits = config.cost_limits
    probed = storage.state() if storage is not None else None
    leadership = Leadership(stack.redis, stack.settings.redis_prefix, "status", 1)
    return Status(
        storage=StorageStatus(probed.ok, probed.problem, probed.checked_at) if probed else None,
        at=now,
        mode="vps_only" if lock is not None else config.mode,
        leader=leadership.current(),
        last_turn_at=turn,
        rate_window_seconds=RATE_WINDOW_SECONDS,
        queues=queues,
        workers=workers,
        instances=instances,
        spend=SpendStatus(
            last_hour_cents=round(spend.last_hour_cents, 2),
            today_cents=round(spend.today_cents, 2),
            hourly_cap_cents=limits.max_hourly_spend_cents,
            daily_cap_cents=limits.max_daily_spend_cents,
            alert_threshold_cents=limits.alert_threshold_cents,
            locked=lock is not None,
            locked_at=float(lock["at"]) if lock is not None else None,
            lock_reason=lock.get("reason") if lock is not None else None,
        ),
        billing=[
            BillingStatus(
                provider=name,
                read_at=kept.get("read_at"),
                compared_through=max(kept.get("compared") or [""]) or None,
                error=kept.get("error"),
            )
            for name, kept in sorted(reconciled.get("providers", {}).items())
        ],
        billing_findings=[f["message"] for f in reconciled.get("findings", [])][-5:],
        bursts=[
            BurstStatus(queue, b.workers, b.until, b.by) for queue, b in sorted(bursts.items())
        ],
        alerts=[
            AlertStatus(a.key, a.rule, a.level, a.summary, a.firing_since or a.since, a.last_sent)
            for a in firing
        ],
        decisions=[
            DecisionStatus(
                decided_at=epoch(row.decided_at),
                mode=row.mode,
                action=row.action,
                queue=row.queue,
                applied=bool(row.applied),
                reason=row.reason,
            )
            for row in recent
        ],
        bulk=[_bulk_run(r) for r in bulk],
        bulk_finished=[_bulk_run(r) for r in bulk_finished],
    )


def _bulk_run(r: runs.RunView) -> BulkRunStatus:
    return BulkRunStatus(
        run_id=r.run_id,
        kind=r.kind,
        operation=r.operation,
        state=r.state,
        reason=r.reason,
        queue=r.queue,
        priority=r.priority,
        max_in_flight=r.max_in_flight,
        counts=r.counts(),
        progress=r.progress,
        finished_at=None if r.finished_at is None else epoch(r.finished_at),
    )


def _workers(conn: Any, now: float) -> list[WorkerStatus]:
    w, a, m = t.workers, t.attempts, t.worker_metrics
    running = (
        select(a.c.worker_id, func.count().label("running"))
        .where(a.c.status == "running")
        .group_by(a.c.worker_id)
        .subquery()
    )
    latest = (
        select(m.c.worker_id, func.max(m.c.metric_id).label("metric_id"))
        .where(m.c.recorded_at >= to_datetime(now - METRICS_FRESH_SECONDS))
        .group_by(m.c.worker_id)
        .subquery()
    )
    # The head's Ray node, as autoscaler.provider records it (VPS_NODE) under `ray up`.
    vps = (read_state(conn, "vps_node") or {}).get("node_id")
    rows = conn.execute(
        select(w, running.c.running, m.c.cpu_percent)
        .outerjoin(running, running.c.worker_id == w.c.worker_id)
        .outerjoin(latest, latest.c.worker_id == w.c.worker_id)
        .outerjoin(m, m.c.metric_id == latest.c.metric_id)
        .where(w.c.status.in_(("active", "draining")))
        .order_by(w.c.queue, w.c.worker_id)
    )
    return [
        WorkerStatus(
            worker_id=row.worker_id,
            queue=row.queue,
            location="cloud" if vps and row.node_id and row.node_id != vps else "vps",
            hostname=row.hostname,
            node_id=row.node_id,
            state=row.status,
            heartbeat_age_seconds=round(max(0.0, now - epoch(row.last_heartbeat)), 1),
            current_jobs=int(row.running or 0),
            concurrency=row.concurrency,
            cpu_percent=None if row.cpu_percent is None else round(row.cpu_percent, 1),
            claims_paused=row.claims_paused_reason if row.claims_paused_since else None,
            claims_paused_seconds=(
                None
                if row.claims_paused_since is None
                else round(max(0.0, now - epoch(row.claims_paused_since)), 1)
            ),
            **_outage_pause(row, now),
        )
        for row in rows
    ]


def _outage_pause(row: Any, now: float) -> dict[str, Any]:
    if row.outage_paused_since is None:
        return {}
    since = epoch(row.outage_paused_since)
    over = row.outage_paused_seconds is not None
    return {
        "outage_paused": row.outage_paused_reason,
        "outage_paused_since": since,
        "outage_paused_seconds": (
            row.outage_paused_seconds if over else round(max(0.0, now - since), 1)
        ),
        "outage_pause_over": over,
        "outage_paused_ago_seconds": round(max(0.0, now - since), 1),
    }


def _instances(conn: Any, now: float) -> list[InstanceStatus]:
    from autoscaler.cost import from_microusd

    s = t.cloud_spend.c
    rows = conn.execute(
        select(t.cloud_spend).where(s.terminated_at.is_(None)).order_by(s.launched_at)
    )
    return [
        InstanceStatus(
            provider=row.provider,
            instance_id=row.instance_id,
            node_type=row.node_type,
            spot=bool(row.spot),
            cents_per_hour=from_microusd(row.price_per_hour_microusd),
            running_seconds=round(max(0.0, now - epoch(row.launched_at)), 1),
        )
        for row in rows
    ]
