"""The scheduler loop: observe -> policy -> apply, the only place with side effects.

Every ``evaluation_interval_seconds``, the scheduler that holds the leadership lease
(:mod:`autoscaler.leader`):

1. observes: ready jobs per queue and priority band from Redis
   (:meth:`~hypermedia.queue.redis_queue.RedisQueue.priority_heads`), the queued jobs
   expected to run long (:func:`long_jobs`, from the record), each queue's load (its
   recent arrival rate and mean run time, :func:`queue_loads`: what the policy's
   estimates size scale-ups and keep workers by, as in the simulator), the workers and their
   running jobs from the database (an actor on a burst node counts with its node), the
   cloud workers and prices from the :class:`Fleet`, the spend from the ``cloud_spend``
   ledger, and its own history and cost lock from ``scheduler_state``;
2. asks the pure policy (:func:`autoscaler.policy.decide`) what to do;
3. writes every decision with its reason to ``scheduler_decisions`` and the log, and
   applies it through the :class:`Fleet`, each action only while its term of
   leadership still holds (the fencing token is recorded with the decision).

The :class:`Fleet` is the seam to the clouds. It gets one :class:`~autoscaler.snapshot.Plan`
per turn: the cloud workers wanted per queue, and the launch/drain/terminate decisions
behind that number. :class:`NoCloud` (the default, and all ``vps_only`` needs) has no
cloud workers and launches nothing; :class:`autoscaler.rayfleet.RayFleet` turns a plan
into one ``request_resources`` call, launch orders for the node provider, drains and
terminations.

A hold (something wanted, not done: cooldown, cap, mode) is written to
``scheduler_decisions`` when it begins, not on every turn it lasts: a hold whose reason
(numbers aside) was held in the previous turn too is only logged. With its decisions the
leader writes each queue's depth and workers (:mod:`autoscaler.samples`, at most once a
minute): the operator page's charts.

4. evaluates the alert rules (:mod:`autoscaler.alerting`) on the same snapshot and the
   decisions carried out, and records their notifications for the webhooks; the
   :class:`~autoscaler.webhooks.Sender` delivers them on its own thread while
   :meth:`Scheduler.run` runs, so a webhook never holds up a turn.

5. every :data:`RECONCILE_SECONDS` (the seed's 15 minutes), reconciles the ledger with
   what the clouds bill (:meth:`Scheduler.reconcile`, :mod:`autoscaler.billing`): a
   provider's bill is read only when something of it has settled and was not compared;
   its findings are alerts of the same turn.

Every turn sets the spend gauges (the last hour and today, the caps, the alert
threshold, the cost lock) and the time of the evaluation in the stack's recorder
(:mod:`hypermedia.metrics`), and tells it which Ray nodes are cloud workers; every
decision written to ``scheduler_decisions`` is counted by its action.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import func, select
from sqlalchemy.engine import Connection, Engine

from autoscaler import billing, cost, policy, samples, webhooks
from autoscaler.alerting import Alerting
from autoscaler.billing import Account, Finding, LedgerRow
from autoscaler.config import ProviderName, SchedulerConfig
from autoscaler.drivers.base import DriverError
from autoscaler.leader import Leadership, Term
from autoscaler.snapshot import (
    FLEET_ACTIONS,
    LONG_JOB_SECONDS,
    RATE_WINDOW_SECONDS,
    Decision,
    History,
    ManualBurst,
    Offer,
    Plan,
    QueueState,
    Snapshot,
    Spend,
    WorkerState,
    expected_run_seconds,
    is_long,
    next_history,
    plan_of,
)
from autoscaler.snapshot import queue_state as snapshot_queue_state
from autoscaler.state import delete_state, read_state, write_state
from autoscaler.state import epoch as _epoch
from autoscaler.state import to_datetime as _to_datetime
from hypermedia import ids
from hypermedia.clock import Clock
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.errors import ConfigError, DatabaseUnavailable
from hypermedia.jobs.states import JobStatus
from hypermedia.metrics import (
    COST_LOCKED,
    DAY,
    DECISIONS,
    HOUR,
    LAST_EVALUATION,
    SPEND,
    SPEND_ALERT,
    SPEND_CAP,
    NoMetrics,
    Recorder,
)
from hypermedia.queue.redis_queue import RedisQueue
from hypermedia.sandbox.limits import wall_clock_seconds
from hypermedia.stack import Stack

log = logging.getLogger(__name__)

HISTORY = "history"
COST_LOCK = "cost_lock"
HOLDS = "holds"
RECONCILED = "billing_reconciled"
RECONCILE_SECONDS = 900.0  # the seed: billing is checked every 15 minutes
KEEP_FINDINGS = 20  # the last findings kept for `scheduler status`


# -- the seam to the clouds ---------------------------------------------------------------


class Fleet(Protocol):
    """Cloud workers, their prices, and the hands that launch and stop them."""

    def cloud_workers(self, now: float, actors: Sequence[WorkerState]) -> list[WorkerState]:
        """The cloud workers now; ``actors`` are the workers table's live rows (an actor
        on a burst node counts toward its node's jobs)."""
        ...

    def offers(self, now: float) -> dict[ProviderName, Offer]: ...

    def apply(self, plan: Plan, term: Term) -> list[bool]:
        """Make the fleet match ``plan``; whether each of ``plan.actions`` was done."""
        ...

    def billing(self) -> Mapping[str, Account]:
        """The providers whose billing this fleet can read (:mod:`autoscaler.billing`),
        by name; a provider left out is not reconciled."""
        ...


class NoCloud:
    """No cloud at all: what ``vps_only`` needs, and what ``hypermedia scheduler run``
    has (the hands on the clouds are a ``ray up`` head's :class:`~autoscaler.rayfleet.
    RayFleet`). It launches nothing (and says so)."""

    def cloud_workers(self, now: float, actors: Sequence[WorkerState]) -> list[WorkerState]:
        return []

    def offers(self, now: float) -> dict[ProviderName, Offer]:
        return {}

    def apply(self, plan: Plan, term: Term) -> list[bool]:
        for decision in plan.actions:
            log.warning("no cloud driver configured: %s not carried out", decision.reason)
        return [False] * len(plan.actions)

    def billing(self) -> Mapping[str, Account]:
        return {}


# -- persistent state ----------------------------------------------------------------------


def history_from(value: Mapping[str, Any] | None) -> History:
    if not value:
        return History()
    return History(
        last_scale_up=dict(value.get("last_scale_up", {})),
        last_scale_down=dict(value.get("last_scale_down", {})),
        launches=tuple(value.get("launches", ())),
        empty_since=dict(value.get("empty_since", {})),
        last_alert=dict(value.get("last_alert", {})),
    )


def history_value(history: History) -> dict[str, Any]:
    return {
        "last_scale_up": dict(history.last_scale_up),
        "last_scale_down": dict(history.last_scale_down),
        "launches": list(history.launches),
        "empty_since": dict(history.empty_since),
        "last_alert": dict(history.last_alert),
    }


BURSTS = "bursts"  # scheduler_state: operators' manual bursts by queue
MAX_BURST_SECONDS = 7 * 86_400.0


def set_burst(
    engine: Engine,
    config: SchedulerConfig,
    queue: str,
    workers: int,
    seconds: float,
    now: float,
    by: str = "",
) -> ManualBurst:
    """Record an operator's burst (``hypermedia scheduler burst``): keep ``workers``
    cloud workers for ``queue`` for ``seconds``. Refused (ConfigError naming the key)
    where nothing could launch them: a queue not in scheduler.json or not
    cloud-enabled, ``vps_only``, more than ``max_workers``."""
    if queue not in config.queues:
        raise ConfigError(f"scheduler.json: queues.{queue}", "no such queue")
    if config.mode == "vps_only":
        raise ConfigError(
            "scheduler.json: mode", "vps_only launches nothing: set hybrid to burst by hand"
        )
    if not config.queues[queue].cloud_enabled:
        raise ConfigError(f"scheduler.json: queues.{queue}.cloud_enabled", "false: it never bursts")
    limit = config.queues[queue].max_workers
    if not 1 <= workers <= limit:
        raise ConfigError(
            f"scheduler.json: queues.{queue}.max_workers",
            f"a burst of {workers} workers: between 1 and max_workers ({limit})",
        )
    if not 0 < seconds <= MAX_BURST_SECONDS:
        raise ConfigError("burst --for", "between a minute and 7 days")
    burst = ManualBurst(workers=workers, until=now + seconds, by=by)
    with transaction(engine) as conn:
        kept = dict(read_state(conn, BURSTS) or {})
        kept[queue] = {"workers": burst.workers, "until": burst.until, "by": burst.by}
        write_state(conn, BURSTS, kept, now)
    return burst


def end_burst(engine: Engine, queue: str, now: float) -> bool:
    """End an operator's burst of ``queue`` (its workers then go as idle ones do);
    whether there was one."""
    with transaction(engine) as conn:
        kept = dict(read_state(conn, BURSTS) or {})
        found = kept.pop(queue, None)
        write_state(conn, BURSTS, kept, now)
    return found is not None and float(found["until"]) > now


def bursts_from(value: Mapping[str, Any] | None, now: float) -> dict[str, ManualBurst]:
    """The operators' bursts that have not ended."""
    return {
        queue: ManualBurst(int(b["workers"]), float(b["until"]), str(b.get("by", "")))
        for queue, b in (value or {}).items()
        if float(b["until"]) > now
    }


def last_turn(conn: Connection) -> float | None:
    """When the leader last recorded a turn (its history, written every turn; None:
    never): what ``scheduler status`` shows and the node provider's backstop reads."""
    row = conn.execute(
        select(t.scheduler_state.c.updated_at).where(t.scheduler_state.c.name == HISTORY)
    ).scalar_one_or_none()
    return _epoch(row) if row is not None else None


def reset_cost_lock(engine: Engine) -> dict[str, Any] | None:
    """Clear the daily-cap lock (``hypermedia scheduler reset-cost-lock``); what it was."""
    with transaction(engine) as conn:
        lock = read_state(conn, COST_LOCK)
        delete_state(conn, COST_LOCK)
    return lock


# -- observation -----------------------------------------------------------------------------


def queue_state(
    queue: RedisQueue,
    name: str,
    now: float,
    long_jobs: int = 0,
    load: tuple[float, float | None] | None = None,
) -> QueueState:
    """One queue from Redis's ready jobs; ``load``: its recent arrivals per hour and mean
    run time (:func:`queue_loads`; None: unknown)."""
    return snapshot_queue_state(
        name,
        (
            (priority, count, max(0.0, now - ids.created_at(oldest_id)))
            for priority, (count, oldest_id) in queue.priority_heads(name).items()
        ),
        long_jobs=long_jobs,
        arrivals_per_hour=None if load is None else load[0],
        mean_run_seconds=None if load is None else load[1],
    )


RUN_TIME_WINDOW_SECONDS = 6 * 3600.0  # completed attempts the mean run time is taken over


def queue_loads(
    conn: Connection, queues: Sequence[str], now: float
) -> dict[str, tuple[float, float | None]]:
    """Each queue's load as the policy estimates from it (the simulator measures the
    same): jobs created in the last :data:`~autoscaler.snapshot.RATE_WINDOW_SECONDS`, as
    a rate per hour, and the mean run time of the completed attempts of its jobs
    completed in the last :data:`RUN_TIME_WINDOW_SECONDS` (None: none)."""
    j, a = t.jobs.c, t.attempts.c
    arrived: dict[str, int] = dict(
        conn.execute(
            select(j.queue, func.count())
            .where(j.created_at >= _to_datetime(now - RATE_WINDOW_SECONDS))
            .where(j.queue.in_(list(queues)))
            .group_by(j.queue)
        ).all()
    )
    ran: dict[str, Any] = dict(
        conn.execute(
            select(j.queue, func.avg(a.duration_ms))
            .select_from(t.attempts.join(t.jobs, j.job_id == a.job_id))
            .where(a.status == "completed", a.duration_ms.is_not(None))
            # the jobs' completed_at is indexed (the out-rate); their attempts by job
            .where(j.completed_at >= _to_datetime(now - RUN_TIME_WINDOW_SECONDS))
            .where(j.queue.in_(list(queues)))
            .group_by(j.queue)
        ).all()
    )
    return {
        name: (
            int(arrived.get(name, 0)) * 3600.0 / RATE_WINDOW_SECONDS,
            float(ran[name]) / 1000.0 if ran.get(name) else None,
        )
        for name in queues
    }


def long_jobs(conn: Connection, queues: Sequence[str]) -> dict[str, int]:
    """Queued jobs per queue that are long (:func:`~autoscaler.snapshot.is_long`), their
    expected run time (:func:`~autoscaler.snapshot.expected_run_seconds`) read from the
    record: the duration the input's inspection states (media headers, at upload) and
    the wall clock of the job's profile (its timeout x the sandbox's factor).

    Only what can pass the threshold is read: jobs of profiles whose wall clock can
    (a video transcode, not an image one), on inputs stating a length that can."""
    counts = dict.fromkeys(queues, 0)
    p, j, o = t.profiles.c, t.jobs.c, t.objects.c
    wall_clock = {
        profile_id: wall_clock_seconds(timeout_seconds)
        for profile_id, timeout_seconds in conn.execute(select(p.profile_id, p.timeout_seconds))
    }
    can_run_long = [pid for pid, wall in wall_clock.items() if is_long(wall)]
    if not can_run_long or not queues:
        return counts
    stated = o.inspection[("details", "duration_seconds")].as_float()
    rows = conn.execute(
        select(j.queue, j.profile_id, stated)
        .select_from(t.jobs)
        .join(t.objects, o.object_id == j.object_id)
        .where(
            j.status == JobStatus.QUEUED.value,
            j.queue.in_(list(queues)),
            j.profile_id.in_(can_run_long),
            stated > LONG_JOB_SECONDS,
        )
    )
    for queue, profile_id, seconds in rows:
        if is_long(expected_run_seconds(seconds, wall_clock[profile_id])):
            counts[queue] += 1
    return counts


def vps_workers(conn: Connection) -> list[WorkerState]:
    """The workers table's live rows: pipeline actors, on the VPS and on burst nodes
    (:meth:`Scheduler.observe` counts an actor on a burst node with its node, a cloud
    worker the :class:`Fleet` reports)."""
    w, a = t.workers, t.attempts
    running = (
        select(a.c.worker_id, func.count().label("running"))
        .where(a.c.status == "running")
        .group_by(a.c.worker_id)
        .subquery()
    )
    finished = (
        select(a.c.worker_id, func.max(a.c.finished_at).label("last"))
        .where(a.c.finished_at.is_not(None))
        .group_by(a.c.worker_id)
        .subquery()
    )
    rows = conn.execute(
        select(
            w.c.worker_id,
            w.c.queue,
            w.c.status,
            w.c.node_id,
            w.c.started_at,
            w.c.claims_paused_since,
            w.c.claims_paused_reason,
            running.c.running,
            finished.c.last,
        )
        .outerjoin(running, running.c.worker_id == w.c.worker_id)
        .outerjoin(finished, finished.c.worker_id == w.c.worker_id)
        .where(w.c.status.in_(("active", "draining")))
    )
    return [
        WorkerState(
            worker_id=row.worker_id,
            queue=row.queue,
            status=row.status,
            started_at=_epoch(row.started_at),
            current_jobs=int(row.running or 0),
            last_job_at=_epoch(row.last) if row.last is not None else None,
            node_id=row.node_id,
            claims_paused_since=(
                _epoch(row.claims_paused_since) if row.claims_paused_since is not None else None
            ),
            claims_paused_reason=row.claims_paused_reason,
        )
        for row in rows
    ]


def ledger_intervals(conn: Connection, since: float | None = None) -> list[cost.Interval]:
    """The ``cloud_spend`` ledger's instances on the meter (those still running or
    terminated at or after ``since``, if given)."""
    s = t.cloud_spend
    query = select(s.c.provider, s.c.launched_at, s.c.terminated_at, s.c.price_per_hour_microusd)
    if since is not None:
        query = query.where(
            s.c.terminated_at.is_(None) | (s.c.terminated_at >= _to_datetime(since))
        )
    return [
        cost.Interval.billed(
            row.provider,
            _epoch(row.launched_at),
            _epoch(row.terminated_at) if row.terminated_at is not None else None,
            cost.from_microusd(row.price_per_hour_microusd),
        )
        for row in conn.execute(query)
    ]


def ledger_spend(conn: Connection, now: float, locked: bool, alerted_today: bool) -> Spend:
    """Spend from ``cloud_spend``: each instance's price x its running time."""
    intervals = ledger_intervals(conn)
    return cost.spend(intervals, now, locked=locked, alerted_today=alerted_today)


def ledger_rows(conn: Connection, since: float) -> list[LedgerRow]:
    """The ledger's rows still running or terminated at or after ``since``."""
    s = t.cloud_spend
    query = select(s).where(
        s.c.terminated_at.is_(None) | (s.c.terminated_at >= _to_datetime(since))
    )
    return [
        LedgerRow(
            spend_id=row.spend_id,
            provider=row.provider,
            instance_id=row.instance_id,
            request_id=row.request_id,
            launched_at=_epoch(row.launched_at),
            terminated_at=_epoch(row.terminated_at) if row.terminated_at is not None else None,
            # What the bill should say: the launch's quoted price where the caps count
            # a higher one (a spot instance's maximum).
            cents_per_hour=cost.from_microusd(
                row.price_per_hour_microusd
                if row.quoted_per_hour_microusd is None
                else row.quoted_per_hour_microusd
            ),
            reconciled=row.reconciled_at is not None,
        )
        for row in conn.execute(query.order_by(s.c.spend_id))
    ]


def hold_key(decision: Decision) -> str:
    """A hold's identity across turns: its queue, worker and reason without the numbers
    (depth, age and cooldown seconds change every turn; the hold is the same)."""
    return f"{decision.queue}|{decision.worker_id}|{re.sub(r'[0-9.]+', '#', decision.reason)}"


# -- the loop ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Evaluation:
    snapshot: Snapshot
    decisions: list[Decision]
    term: Term | None  # None: not the leader, nothing applied


def default_holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        engine: Engine,
        queue: RedisQueue,
        leadership: Leadership,
        clock: Clock,
        fleet: Fleet | None = None,
        alert_webhooks: Sequence[webhooks.Webhook] = (),
        metrics: Recorder | None = None,
    ) -> None:
        self.config = config
        self.engine = engine
        self.queue = queue
        self.leadership = leadership
        self.clock = clock
        self.fleet: Fleet = fleet or NoCloud()
        self.alerting = Alerting(config, engine, alert_webhooks)
        self.sender = webhooks.Sender(engine, alert_webhooks, clock)
        self.metrics: Recorder = metrics or NoMetrics()
        self.sampled_at: float | None = None  # the last queue samples this scheduler wrote

    def observe(self) -> Snapshot:
        now = self.clock.now()
        with transaction(self.engine) as conn:
            long = long_jobs(conn, list(self.config.queues))
            loads = queue_loads(conn, list(self.config.queues), now)
            workers = vps_workers(conn)
            history = history_from(read_state(conn, HISTORY))
            lock = read_state(conn, COST_LOCK)
            alerted = read_state(conn, "alerted") or {}
            today = _to_datetime(now).date().isoformat()
            spend = ledger_spend(conn, now, lock is not None, alerted.get("day") == today)
            bursts = bursts_from(read_state(conn, BURSTS), now)
        queues = {
            name: queue_state(self.queue, name, now, long[name], loads[name])
            for name in self.config.queues
        }
        cloud = self.fleet.cloud_workers(now, workers)
        burst_nodes = {w.node_id for w in cloud if w.node_id is not None}
        workers = [w for w in workers if w.node_id is None or w.node_id not in burst_nodes]
        workers.extend(cloud)
        return Snapshot(
            now=now,
            queues=queues,
            workers=tuple(workers),
            offers=self.fleet.offers(now),
            spend=spend,
            history=history,
            bursts=bursts,
        )

    def explain(self) -> list[str]:
        """What the policy would do now, and why (nothing is applied or recorded)."""
        return policy.explain(self.config, self.observe())

    def evaluate(self) -> Evaluation:
        """One turn: observe, decide, and, as the leader, record and apply."""
        snapshot = self.observe()
        self.publish(snapshot)
        decisions = policy.decide(self.config, snapshot)
        term = self.leadership.acquire()
        if term is None:
            return Evaluation(snapshot, decisions, None)
        applied = self._carry_out(plan_of(snapshot, decisions), decisions, term)
        self._record(snapshot, decisions, applied, term)
        try:
            findings = self.reconcile(snapshot.now)
        except DatabaseUnavailable:
            raise
        except Exception:  # a bill that cannot be read or made sense of never stops the scaling
            log.exception("reconciling the billing failed")
            findings = []
        if self.leadership.holds(term):
            try:
                self.alerting.turn(snapshot, decisions, applied, findings)
            except Exception:  # the alerts never stop the scaling
                log.exception("evaluating the alert rules failed")
        return Evaluation(snapshot, decisions, term)

    def publish(self, snapshot: Snapshot) -> None:
        """The turn's spend against the caps, the lock, and which nodes are cloud."""
        spend, limits = snapshot.spend, self.config.cost_limits
        self.metrics.set(SPEND, {"window": HOUR}, spend.last_hour_cents)
        self.metrics.set(SPEND, {"window": DAY}, spend.today_cents)
        self.metrics.set(SPEND_CAP, {"window": HOUR}, limits.max_hourly_spend_cents)
        self.metrics.set(SPEND_CAP, {"window": DAY}, limits.max_daily_spend_cents)
        self.metrics.set(SPEND_ALERT, {}, limits.alert_threshold_cents)
        self.metrics.set(COST_LOCKED, {}, 1.0 if spend.locked else 0.0)
        self.metrics.set(LAST_EVALUATION, {}, snapshot.now)
        self.metrics.place(
            {w.node_id: w.spot for w in snapshot.workers if w.cloud and w.node_id is not None}
        )

    def reconcile(self, now: float) -> list[Finding]:
        """Every :data:`RECONCILE_SECONDS`, compare the ledger with what the providers
        bill (:mod:`autoscaler.billing`: only what has settled, a provider's billing read
        only when something of it is pending, at most every interval of its reader).
        Settled rows get what was billed and ``reconciled_at``; each finding is logged
        and returned (the turn's alerts notify them). The findings of this check."""
        with transaction(self.engine) as conn:
            state = read_state(conn, RECONCILED) or {}
            if now - float(state.get("at", -RECONCILE_SECONDS)) < RECONCILE_SECONDS:
                return []
            rows = ledger_rows(conn, now - billing.KEEP_SECONDS)
        accounts = self.fleet.billing()
        providers: dict[str, Any] = dict(state.get("providers", {}))
        findings: list[Finding] = []
        for name in sorted({row.provider for row in rows}):
            mine = [row for row in rows if row.provider == name]
            kept: dict[str, Any] = dict(providers.get(name, {}))
            providers[name] = kept
            account = accounts.get(name)
            if account is None:
                kept.update(error="its billing is not read", read_at=None)
                continue
            oldest = billing.day_of(now - billing.KEEP_SECONDS)
            compared = [d for d in kept.get("compared", []) if d >= oldest]
            instances, days = billing.pending(mine, account.settle_seconds, compared, now)
            if not (instances or days) or now < float(kept.get("next_read", 0.0)):
                continue
            first, last = billing.window(instances, days)
            kept["next_read"] = now + account.interval_seconds
            try:
                charges = account.read(first, last)
            except Exception as exc:  # a driver bug: still wait the interval (a read costs)
                log.exception("reading %s's billing failed", name)
                charges = DriverError("invalid", f"reading the bill failed: {exc!r}")
            if isinstance(charges, DriverError):
                kept["error"] = str(charges)
                log.warning(
                    "reading %s's billing for %s .. %s failed: %s",
                    name,
                    first,
                    last,
                    charges,
                    extra={"action": "scheduler_reconcile"},
                )
                continue
            start, end = billing.day_start(first), billing.day_start(last) + cost.DAY_SECONDS
            overlapping = [
                r
                for r in mine
                if r.launched_at < end and (r.terminated_at is None or r.terminated_at >= start)
            ]
            outcome = billing.compare(name, overlapping, charges, instances, days, now)
            with transaction(self.engine) as conn:
                s = t.cloud_spend
                for spend_id, cents in outcome.billed.items():
                    conn.execute(
                        s.update()
                        .where(s.c.spend_id == spend_id)
                        .values(
                            billed_microusd=cost.to_microusd(cents),
                            reconciled_at=_to_datetime(now),
                        )
                    )
            kept.update(
                error=None,
                read_at=now,
                compared=sorted(set(compared) | set(outcome.days)),
                charges=len(charges),
                window=[first, last],
            )
            for finding in outcome.findings:
                log.warning("%s", finding.message(), extra={"action": "scheduler_reconcile"})
            findings.extend(outcome.findings)
        recent = list(state.get("findings", [])) + [
            {"at": now, "key": f.key, "message": f.message()} for f in findings
        ]
        with transaction(self.engine) as conn:
            value = {"at": now, "providers": providers, "findings": recent[-KEEP_FINDINGS:]}
            write_state(conn, RECONCILED, value, now)
        return findings

    def _carry_out(self, plan: Plan, decisions: list[Decision], term: Term) -> list[bool]:
        """Hand the plan to the fleet if this term still leads; records (alert, lock,
        hold) are carried out by writing them down."""
        if not self.leadership.holds(term):
            log.warning("lost the leadership: nothing carried out")
            done = [False] * len(plan.actions)
        else:
            done = self.fleet.apply(plan, term)
        results = iter(done)
        return [next(results) if d.action in FLEET_ACTIONS else True for d in decisions]

    def _record(
        self, snapshot: Snapshot, decisions: list[Decision], applied: list[bool], term: Term
    ) -> None:
        now = snapshot.now
        history = next_history(snapshot, decisions, applied)
        mode = "vps_only" if snapshot.spend.locked else self.config.mode
        recorded: list[str] = []
        with transaction(self.engine) as conn:
            held_before = set((read_state(conn, HOLDS) or {}).get("keys", []))
            held_now: list[str] = []
            for decision, done in zip(decisions, applied, strict=True):
                if decision.action == "hold":
                    key = hold_key(decision)
                    held_now.append(key)
                    if key in held_before:
                        log.debug("%s (still)", decision.reason)
                        continue
                log.info(
                    "%s%s",
                    decision.reason,
                    "" if done else " (not carried out)",
                    extra={"action": f"scheduler_{decision.action}", "queue": decision.queue},
                )
                conn.execute(
                    t.scheduler_decisions.insert().values(
                        decided_at=_to_datetime(now),
                        mode=mode,
                        queue=decision.queue,
                        action=decision.action,
                        count=decision.count,
                        provider=decision.provider,
                        reason=decision.reason,
                        details={
                            "term": term.token,
                            "holder": term.holder,
                            "worker_id": decision.worker_id,
                            "spot": decision.spot,
                        },
                        applied=done,
                    )
                )
                recorded.append(decision.action)
                if decision.action == "lock" and done:
                    write_state(conn, COST_LOCK, {"at": now, "reason": decision.reason}, now)
                if decision.action == "alert" and decision.queue is None:  # the spend alert
                    write_state(conn, "alerted", {"day": _to_datetime(now).date().isoformat()}, now)
            write_state(conn, HISTORY, history_value(history), now)
            write_state(conn, HOLDS, {"keys": held_now}, now)
            sample = self.sampled_at is None or now - self.sampled_at >= samples.SAMPLE_SECONDS
            if sample:
                samples.record(conn, snapshot)
        for action in recorded:  # once committed: the count says what the table says
            self.metrics.count(DECISIONS, {"action": action})
        if sample:
            self.sampled_at = now

    def stop(self) -> None:
        """Give the leadership up at once if this scheduler holds it."""
        term = self.leadership.acquire()
        if term is not None:
            self.leadership.release(term)

    def run(self, stop: threading.Event) -> None:
        """Evaluate every ``evaluation_interval_seconds`` until ``stop`` is set; the alert
        webhooks' sender works beside it, on its own thread."""
        interval = self.config.evaluation_interval_seconds
        sending = None
        if self.sender.webhooks:
            sending = threading.Thread(
                target=self.sender.run, args=(stop,), name="alert-sender", daemon=True
            )
            sending.start()
        try:
            while not stop.is_set():
                try:
                    self.evaluate()
                except Exception:
                    log.exception("scheduler evaluation failed; next one in %s s", interval)
                stop.wait(interval)
        finally:
            if sending is not None:
                sending.join(30)


def open_scheduler(
    config: SchedulerConfig,
    stack: Stack,
    fleet: Fleet | None = None,
    alert_webhooks: Sequence[webhooks.Webhook] | None = None,
) -> Scheduler:
    """A scheduler on a stack's database, Redis and clock. Every queue of the config must
    be one of the deployment's (``HYPERMEDIA_QUEUES``). ``alert_webhooks`` None: the
    webhooks file's (:func:`autoscaler.webhooks.load`)."""
    unknown = sorted(set(config.queues) - set(stack.settings.queue_names))
    if unknown:
        raise ConfigError(
            f"scheduler.json: queues.{unknown[0]}",
            f"not a queue of this deployment ({', '.join(stack.settings.queue_names)})",
        )
    # The lease outlives two missed evaluations: a slow turn does not hand it over.
    ttl = 3 * config.evaluation_interval_seconds
    leadership = Leadership(stack.redis, stack.settings.redis_prefix, default_holder(), ttl)
    if alert_webhooks is None:
        alert_webhooks = webhooks.load()
    return Scheduler(
        config,
        stack.engine,
        stack.queue,
        leadership,
        stack.clock,
        fleet,
        alert_webhooks,
        stack.metrics,
    )
