"""The alert rules (seed 000, "Monitoring & Alerts"): an observation in, notifications out.

Pure, like :mod:`autoscaler.policy`: :func:`evaluate` takes what the scheduler's leader
observed this turn (:class:`Observation`: queues from Redis, workers' heartbeats and CPU
and the last attempts' outcomes from the record, the spend, this turn's decisions), the
thresholds (``scheduler.json``'s ``alerts``: :class:`~autoscaler.config.AlertsConfig`)
and the state the last turn left (:class:`AlertState`), and answers the notifications to
send and the state to keep. The loop (:mod:`autoscaler.alerting`) records both in one
transaction; the webhooks' sender (:mod:`autoscaler.webhooks`) delivers them.

The rules (``key`` = rule, and the queue or worker it is about):

===================== ======== ===========================================================
rule                  level    condition (defaults: the seed's thresholds)
===================== ======== ===========================================================
queue_depth:Q         warning  queue Q's ready jobs > 50, sustained 10 min
oldest_job:Q          warning  the oldest ready priority 1-3 job of Q waits > 15 min
worker_cpu:W          warning  worker W's last ``cpu_percent`` > 90, sustained 10 min
heartbeat:W           warning  worker W (active or draining) last beat > 2 min ago:
                               the seed's "worker unhealthy"
worker_disk_low:W     warning  worker W has claimed no job for > 5 min: its workdirs'
                               disk below ``worker_min_free_disk_mb`` (its row's
                               ``claims_paused_since``; the scheduler drains such a
                               cloud worker after ``claims_paused_drain_seconds``)
all_workers_unhealthy critical no worker with a fresh heartbeat, while workers are
                               listed or jobs wait
failure_rate          warning  failed attempts > 10 % of the last 100 finished (once
                               ``min_jobs`` have finished)
failure_spike         critical failed attempts >= 50 % of the last 20 finished: a spike
daily_spend           warning  today's cloud spend > 80 % of ``max_daily_spend_cents``
daily_cap             critical the daily cap was reached: locked to vps_only until
                               ``hypermedia scheduler reset-cost-lock``
===================== ======== ===========================================================

A condition that must be *sustained* is pending from the first turn it holds and fires
once it has held for ``for_seconds`` (a turn where it does not hold starts it over), as
Prometheus's ``for:`` does; the others fire on the first turn they hold. A firing alert
is notified once when it starts firing, again every ``repeat_interval_seconds`` while it
fires (``repeat`` in its details), and once when it resolves (the condition no longer
holds, or what it was about is gone: a worker no longer listed). Nothing else is sent:
a condition that holds turn after turn is one notification, not one per turn.

Events are one notification each and never resolve: a scaling action carried out this
turn (``launch``, ``drain``, ``terminate``: info, the seed's "worker provisioned /
terminated"), the policy's own ``alert`` decisions (warning: the spend at
``alert_threshold_cents``, a queue flooded past the policy table's last row) and the
billing reconciliation's findings (``billing``, warning: a settled bill that differs
from the ledger, :mod:`autoscaler.billing`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from autoscaler.billing import Finding
from autoscaler.cost import money
from autoscaler.snapshot import Decision, QueueState, Spend

if TYPE_CHECKING:  # config values come in built: importing pydantic is the loader's job
    from autoscaler.config import AlertsConfig

Level = Literal["info", "warning", "critical"]
LEVELS: tuple[Level, ...] = ("info", "warning", "critical")
Status = Literal["firing", "resolved", "event"]

# Decisions that are scaling events when carried out.
SCALING_ACTIONS = ("launch", "drain", "terminate")


def level_rank(level: str) -> int:
    return LEVELS.index(level)


@dataclass(frozen=True, slots=True)
class WorkerHealth:
    """A worker row the record lists as live (active or draining)."""

    worker_id: str
    queue: str
    status: str
    heartbeat_age_seconds: float
    cpu_percent: float | None = None  # its last metrics row, if recent (None: none)
    # Claiming no job since (the disk guard: its row's claims_paused_since) and why;
    # None: claiming.
    claims_paused_since: float | None = None
    claims_paused_reason: str | None = None


@dataclass(frozen=True, slots=True)
class Observation:
    now: float
    queues: Mapping[str, QueueState]
    workers: tuple[WorkerHealth, ...]
    # The last finished attempts' outcomes, newest first: True = failed.
    outcomes: tuple[bool, ...]
    spend: Spend
    daily_cap_cents: float
    # This turn's decisions that were carried out (the events).
    decisions: tuple[Decision, ...] = ()
    # This turn's billing reconciliation's findings (events too).
    billing: tuple[Finding, ...] = ()


@dataclass(frozen=True, slots=True)
class Condition:
    """A rule that holds now, about one subject."""

    key: str
    rule: str
    level: Level
    summary: str
    labels: Mapping[str, str] = field(default_factory=dict)
    value: float | None = None
    threshold: float | None = None
    for_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class Active:
    """A condition that held at the last turn: pending (``firing_since`` None) or firing."""

    key: str
    rule: str
    level: Level
    summary: str
    labels: Mapping[str, str]
    since: float  # first turn it held
    firing_since: float | None = None
    last_sent: float | None = None
    value: float | None = None
    threshold: float | None = None

    @property
    def firing(self) -> bool:
        return self.firing_since is not None


@dataclass(frozen=True, slots=True)
class AlertState:
    active: Mapping[str, Active] = field(default_factory=dict)

    def firing(self) -> list[Active]:
        """The firing alerts, the most severe first, then the oldest."""
        return sorted(
            (a for a in self.active.values() if a.firing),
            key=lambda a: (-level_rank(a.level), a.firing_since, a.key),
        )


@dataclass(frozen=True, slots=True)
class Notification:
    key: str
    rule: str
    level: Level
    status: Status
    summary: str
    labels: Mapping[str, str]
    started_at: float  # when it began firing (an event: when it happened)
    at: float
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Result:
    notifications: list[Notification]
    state: AlertState


# -- the rules -----------------------------------------------------------------------------


def _minutes(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min"


def conditions(config: AlertsConfig, observed: Observation, locked: bool) -> list[Condition]:
    """Every rule that holds now (``locked``: the daily cap's lock is set, or was this turn)."""
    found: list[Condition] = []
    depth_rule = config.queue_depth
    oldest_rule = config.oldest_job
    for name, queue in observed.queues.items():
        if queue.depth > depth_rule.above:
            found.append(
                Condition(
                    f"queue_depth:{name}",
                    "queue_depth",
                    "warning",
                    f"queue {name}: {queue.depth} jobs waiting (more than {depth_rule.above}"
                    f" for {_minutes(depth_rule.for_seconds)})",
                    {"queue": name},
                    queue.depth,
                    depth_rule.above,
                    depth_rule.for_seconds,
                )
            )
        oldest = queue.oldest_by_band.get("1-3", 0.0)
        if oldest > oldest_rule.above_seconds:
            found.append(
                Condition(
                    f"oldest_job:{name}",
                    "oldest_job",
                    "warning",
                    f"queue {name}: a priority 1-3 job has waited {_minutes(oldest)}"
                    f" (more than {_minutes(oldest_rule.above_seconds)})",
                    {"queue": name},
                    round(oldest, 1),
                    oldest_rule.above_seconds,
                )
            )

    cpu_rule = config.worker_cpu
    disk_rule = config.worker_disk_low
    stale_after = config.heartbeat.older_than_seconds
    healthy = 0
    for worker in observed.workers:
        labels = {"worker_id": worker.worker_id, "queue": worker.queue}
        if worker.heartbeat_age_seconds > stale_after:
            found.append(
                Condition(
                    f"heartbeat:{worker.worker_id}",
                    "heartbeat",
                    "warning",
                    f"worker {worker.worker_id} ({worker.queue}, {worker.status}) unhealthy:"
                    f" last heartbeat {_minutes(worker.heartbeat_age_seconds)} ago"
                    f" (more than {_minutes(stale_after)})",
                    labels,
                    round(worker.heartbeat_age_seconds, 1),
                    stale_after,
                )
            )
        else:
            healthy += 1
        if worker.claims_paused_since is not None:
            # The record says since when: the rule fires once that is long enough
            # (no pending turns of its own: a restarted scheduler knows it at once). To
            # the millisecond: a moment read back from the record may be a microsecond
            # later than it was written (datetime rounds), 299.999999 s for 300.
            paused = round(max(0.0, observed.now - worker.claims_paused_since), 3)
            if paused >= disk_rule.for_seconds:
                found.append(
                    Condition(
                        f"worker_disk_low:{worker.worker_id}",
                        "worker_disk_low",
                        "warning",
                        f"worker {worker.worker_id} ({worker.queue}) has claimed no job for"
                        f" {_minutes(paused)}: {worker.claims_paused_reason or 'low disk'}"
                        f" (more than {_minutes(disk_rule.for_seconds)})",
                        labels,
                        round(paused, 1),
                        disk_rule.for_seconds,
                    )
                )
        if worker.cpu_percent is not None and worker.cpu_percent > cpu_rule.above_percent:
            found.append(
                Condition(
                    f"worker_cpu:{worker.worker_id}",
                    "worker_cpu",
                    "warning",
                    f"worker {worker.worker_id} ({worker.queue}): CPU {worker.cpu_percent:.0f} %"
                    f" (more than {cpu_rule.above_percent:g} % for"
                    f" {_minutes(cpu_rule.for_seconds)})",
                    labels,
                    round(worker.cpu_percent, 1),
                    cpu_rule.above_percent,
                    cpu_rule.for_seconds,
                )
            )
    waiting = sum(q.depth for q in observed.queues.values())
    if healthy == 0 and (observed.workers or waiting > 0):
        listed = len(observed.workers)
        found.append(
            Condition(
                "all_workers_unhealthy",
                "all_workers_unhealthy",
                "critical",
                f"no healthy worker: {listed} listed, none with a heartbeat in the last"
                f" {_minutes(stale_after)}; {waiting} jobs waiting",
                {},
                0,
                1,
            )
        )

    rate_rule = config.failure_rate
    window = observed.outcomes[: rate_rule.last_jobs]
    if len(window) >= rate_rule.min_jobs:
        failed = sum(window)
        percent = 100.0 * failed / len(window)
        if percent > rate_rule.above_percent:
            found.append(
                Condition(
                    "failure_rate",
                    "failure_rate",
                    "warning",
                    f"{failed} of the last {len(window)} jobs failed ({percent:.0f} %, more"
                    f" than {rate_rule.above_percent:g} %)",
                    {},
                    round(percent, 1),
                    rate_rule.above_percent,
                )
            )
    spike_rule = config.failure_spike
    recent = observed.outcomes[: spike_rule.last_jobs]
    if len(recent) >= spike_rule.last_jobs:
        failed = sum(recent)
        percent = 100.0 * failed / len(recent)
        if percent >= spike_rule.above_percent:
            found.append(
                Condition(
                    "failure_spike",
                    "failure_spike",
                    "critical",
                    f"failure spike: {failed} of the last {len(recent)} jobs failed"
                    f" ({percent:.0f} %, at least {spike_rule.above_percent:g} %)",
                    {},
                    round(percent, 1),
                    spike_rule.above_percent,
                )
            )

    cap = observed.daily_cap_cents
    spend_limit = cap * config.daily_spend.above_percent / 100.0
    today = observed.spend.today_cents
    if cap > 0 and today > spend_limit:
        found.append(
            Condition(
                "daily_spend",
                "daily_spend",
                "warning",
                f"cloud spend today {money(today)} is over {config.daily_spend.above_percent:g} %"
                f" of the {money(cap)} daily cap",
                {},
                round(today, 2),
                round(spend_limit, 2),
            )
        )
    if locked:
        found.append(
            Condition(
                "daily_cap",
                "daily_cap",
                "critical",
                f"daily cloud spend cap {money(cap)} reached ({money(today)} today): cloud"
                " workers terminated, locked to vps_only until"
                " `hypermedia scheduler reset-cost-lock`",
                {},
                round(today, 2),
                cap,
            )
        )
    return found


def events(decisions: Iterable[Decision], now: float) -> list[Notification]:
    """One notification per scaling action carried out and per policy ``alert``."""
    found = []
    for decision in decisions:
        labels = {
            name: value
            for name, value in (
                ("queue", decision.queue),
                ("worker_id", decision.worker_id),
                ("provider", decision.provider),
            )
            if value is not None
        }
        if decision.action in SCALING_ACTIONS:
            rule, level = "scaling", "info"
        elif decision.action == "alert":
            rule, level = "scheduler_alert", "warning"
        else:
            continue
        details = {"action": decision.action, "count": decision.count, "spot": decision.spot}
        found.append(
            Notification(
                key=f"{rule}:{decision.action}:{decision.queue or '-'}",
                rule=rule,
                level=level,  # type: ignore[arg-type]
                status="event",
                summary=decision.reason,
                labels=labels,
                started_at=now,
                at=now,
                details=details,
            )
        )
    return found


def billing_events(findings: Iterable[Finding], now: float) -> list[Notification]:
    """One warning per settled bill that differs from the ledger."""
    return [
        Notification(
            key=f"billing:{finding.key}",
            rule="billing",
            level="warning",
            status="event",
            summary=finding.message(),
            labels={"provider": finding.provider},
            started_at=now,
            at=now,
            details={
                "subject": finding.subject,
                "ledger_cents": round(finding.ledger_cents, 4),
                "billed_cents": round(finding.billed_cents, 4),
            },
        )
        for finding in findings
    ]


def evaluate(config: AlertsConfig, observed: Observation, state: AlertState) -> Result:
    """This turn's notifications and the state for the next turn (see the module doc)."""
    now = observed.now
    locked = observed.spend.locked or any(d.action == "lock" for d in observed.decisions)
    holding = {c.key: c for c in conditions(config, observed, locked)}
    notifications: list[Notification] = []
    active: dict[str, Active] = {}
    for key, condition in holding.items():
        before = state.active.get(key)
        current = Active(
            key=key,
            rule=condition.rule,
            level=condition.level,
            summary=condition.summary,
            labels=dict(condition.labels),
            since=before.since if before is not None else now,
            firing_since=before.firing_since if before is not None else None,
            last_sent=before.last_sent if before is not None else None,
            value=condition.value,
            threshold=condition.threshold,
        )
        repeat = False
        if not current.firing:
            if now - current.since < condition.for_seconds:
                active[key] = current
                continue
            current = replace(current, firing_since=now)
        elif current.last_sent is not None and (
            now - current.last_sent < config.repeat_interval_seconds
        ):
            active[key] = current
            continue
        else:
            repeat = True
        current = replace(current, last_sent=now)
        active[key] = current
        notifications.append(_notification(current, "firing", now, repeat=repeat))
    for key, before in state.active.items():
        if key not in holding and before.firing:
            notifications.append(_notification(before, "resolved", now))
    notifications.extend(events(observed.decisions, now))
    notifications.extend(billing_events(observed.billing, now))
    return Result(notifications, AlertState(active))


def _notification(alert: Active, status: Status, now: float, repeat: bool = False) -> Notification:
    details: dict[str, Any] = {"value": alert.value, "threshold": alert.threshold}
    if status == "firing":
        details["repeat"] = repeat
    summary = alert.summary if status == "firing" else f"resolved: {alert.summary}"
    return Notification(
        key=alert.key,
        rule=alert.rule,
        level=alert.level,
        status=status,
        summary=summary,
        labels=dict(alert.labels),
        started_at=alert.firing_since if alert.firing_since is not None else alert.since,
        at=now,
        details=details,
    )


# -- the state as JSON (a ``scheduler_state`` row) -------------------------------------------


def state_value(state: AlertState) -> dict[str, Any]:
    return {
        "active": {
            key: {
                "rule": a.rule,
                "level": a.level,
                "summary": a.summary,
                "labels": dict(a.labels),
                "since": a.since,
                "firing_since": a.firing_since,
                "last_sent": a.last_sent,
                "value": a.value,
                "threshold": a.threshold,
            }
            for key, a in state.active.items()
        }
    }


def state_from(value: Mapping[str, Any] | None) -> AlertState:
    if not value:
        return AlertState()
    active = {}
    for key, a in dict(value.get("active", {})).items():
        active[key] = Active(
            key=key,
            rule=a["rule"],
            level=a["level"],
            summary=a["summary"],
            labels=dict(a.get("labels", {})),
            since=float(a["since"]),
            firing_since=a.get("firing_since"),
            last_sent=a.get("last_sent"),
            value=a.get("value"),
            threshold=a.get("threshold"),
        )
    return AlertState(active)


def at_least(level: str, minimum: str) -> bool:
    """Whether ``level`` is ``minimum`` or more severe."""
    return level_rank(level) >= level_rank(minimum)


def rules() -> Sequence[str]:
    """Every rule :func:`evaluate` can notify (the Prometheus rules mirror the stateful ones)."""
    return (
        "queue_depth",
        "oldest_job",
        "worker_cpu",
        "heartbeat",
        "worker_disk_low",
        "all_workers_unhealthy",
        "failure_rate",
        "failure_spike",
        "daily_spend",
        "daily_cap",
        "scaling",
        "scheduler_alert",
        "billing",
    )
