"""The scheduling policy: a :class:`~autoscaler.snapshot.Snapshot` in, decisions out.

Seed 000 ("Scaling Logic", "Routing Rules", "Cost Control"), as a pure function:
:func:`decide` imports nothing that does I/O; the loop (:mod:`autoscaler.scheduler`)
and the simulator apply what it returns. Each :class:`~autoscaler.snapshot.Decision`
has a reason a person can read; :func:`explain` adds why nothing happened where
nothing did.

One evaluation, in this order (the applier applies the list in order):

1. **Cost guard** (:func:`autoscaler.cost.guard`): an ``alert`` (``queue=None``) once a
   day at ``alert_threshold_cents``; a ``lock`` when the daily cap is reached (the loop
   persists it; it lasts until ``hypermedia scheduler reset-cost-lock``). A ``hold``
   explains launches the guard refuses.
2. **Termination.** A draining cloud worker is terminated once it has no jobs, or when
   its drain has lasted ``scaling_rules.scale_down.drain_timeout_seconds`` (the seed's
   5-minute force-kill by default; its jobs return to the queue when their visibility
   timeout expires). A worker is only ever terminated after a ``drain``: never
   straight from active.
3. **Cloud workers that must go whatever the load** are drained: every one of a queue
   :func:`autoscaler.admission.closed` closes (``vps_only``, locked, the queue no
   longer in the file or no longer cloud-enabled), any whose queue no longer
   bursts to that worker's provider, and any that has claimed no job for
   ``scaling_rules.scale_down.claims_paused_drain_seconds`` (default 10 minutes)
   because its disk is low (``WorkerState.claims_paused_since``: the disk guard,
   ``worker_min_free_disk_mb``): unhealthy, it costs money and runs nothing. Drained,
   it no longer counts as the queue's capacity, so the rules below launch a
   replacement if the queue needs one (``max_workers`` still counts it until it is
   terminated). A VPS worker is never drained for it (the alert rule
   ``worker_disk_low`` tells the operator).
4. **Per queue** (in the file's order), scale-up or scale-down, never both:

   - *Scale-up* is triggered when ``depth >= queue_depth_threshold`` or
     ``oldest >= oldest_job_age_seconds``, only where the queue is ``cloud_enabled``
     and the mode allows the cloud. The seed's policy table then sizes the burst (the
     thresholds gate, the table sizes): the row is the higher of the depth's and the
     oldest age's:

     ============ ===================== ==============================================
     depth        oldest job            burst (cloud) workers wanted for the queue
     ============ ===================== ==============================================
     0-5          < 120 s               1 if the thresholds trigger (seed's rule), else 0
     6-20         120 s ≤ age < 300 s   1
     21-100       300 s ≤ age ≤ 600 s   3
     > 100        > 600 s               max: ``max_workers`` minus the queue's VPS
                                        workers, and an ``alert`` for the operator
     ============ ===================== ==============================================

     With the default thresholds (10, 300 s) depth 6-9 and ages 120-299 s do not
     trigger: the table's rows are read as sizes, never as triggers. The table's
     count is a *target* (cloud workers starting or active for the queue), not a
     number to add per evaluation: 15 waiting jobs keep one burst worker, not one
     more every cooldown. A launch needs :func:`autoscaler.admission.admit` (the
     queue open, room under ``max_workers``, the cost guard not refusing every
     launch: the rule the node provider applies again), the scale-up cooldown elapsed
     since the queue's last scale-up (``now - last >= cooldown_seconds``: exactly at
     the cooldown is allowed), room under the provider's ``max_instances`` and the
     cost guard's consent at its price, instance by instance. The flood
     alert repeats at most every :data:`FLOOD_ALERT_REPEAT_SECONDS` per queue
     (``History.last_alert``).
   - *Scale-down* (when no scale-up is triggered), per cloud worker (starting or
     active: one stuck starting for ``idle_minutes`` goes too): no current
     jobs, idle (since its last job, else its start) for ``>= idle_minutes``, the
     queue's depth ``< queue_depth_below``, and the scale-down cooldown elapsed since
     the queue's last scale-down; always a ``drain`` (termination follows, step 2).
     One drain per queue per cooldown (with a cooldown of 0, every eligible worker);
     the longest idle goes first. The table's last row, "0 for 10 min: terminate all
     burst workers", drains every idle burst worker of a queue whose depth has been 0
     for ``idle_minutes`` (the seed's 10 minutes are the default ``idle_minutes``;
     ``History.empty_since``), without the cooldown; a worker still busy with a job
     is drained at the first evaluation after it finishes.

Load estimates (issue 19; only where the snapshot carries the queue's load: its
arrival rate over the last 30 minutes and mean run time, which the loop and the
simulator both measure; without it every rule is the seed's as above)

- *Sizing a triggered scale-up* (the thresholds still gate it): the table's row is read
  at the moment a node launched now would take work (the backlog then: the depth plus
  the arrivals during the boot minus what the active workers run meanwhile; the oldest
  job's age then) and bounds the workers that clear that backlog within
  ``oldest_job_age_seconds`` (while priority 1-3 jobs wait; else within
  ``idle_minutes``); never fewer than 1 nor than the workers the arrivals alone keep
  busy; the same ``max_workers``, cooldown, providers and cost guard. With no run time
  known yet: a worker per job waiting then, the row's at most.
- *Keep-alive*: a burst worker a scale-down rule would drain is kept (a ``hold`` naming
  the rule and the estimate) while the arrivals keep more workers busy than would
  remain, or more jobs than the remaining workers can run are expected before a
  replacement could take work (boot + the scale-up cooldown); never one dearer than its
  replacement would be, each at what it is expected to bill (a spot one at the market
  price, not the maximum its booking and the caps count). Draining for ``vps_only``, the
  lock, or a queue no longer bursting is never held.
- *Routing a scale-up with urgent work waiting*: only the workers the priority 1-3
  jobs need (to run them within ``oldest_job_age_seconds``, at least one, less the VPS
  and on-demand workers up) go on-demand; the rest take the route of the work behind
  them (spot where it allows), instead of every launch of the turn on-demand.
- ``explain`` adds capacity advice: a queue whose recent load its ``max_workers`` cannot
  keep up with (the backlog's growth per hour), or only with a p95 wait over
  ``oldest_job_age_seconds``, and the workers that would keep it within
  (:mod:`autoscaler.estimate`).

``max_workers`` counts every worker of the queue not yet terminated: VPS and cloud,
starting, active *and draining* (a draining instance still exists and costs money, so
a drain followed by a launch cannot exceed the maximum; :mod:`autoscaler.admission`).
Capacity for the table's target counts only starting and active cloud workers.

Modes
    ``vps_only``: never launch; every cloud worker left over is drained, then
    terminated. ``hybrid``: the VPS holds the baseline (the policy never starts or stops
    VPS workers); the cloud takes bursts as above. ``cloud_first`` ("minimal VPS worker,
    most processing on cloud"): the same thresholds and table, and the baseline is
    kept on the cloud but for the VPS's share (:func:`autoscaler.placement.vps_pools`:
    at most one worker of a cloud-enabled queue; the whole baseline of one that is not,
    which never gets cloud workers): a cloud-enabled queue gets cloud workers up to
    ``baseline_workers`` less that share (less its non-cloud workers live, if more)
    even with an empty queue (same cooldown and caps as any launch), bursts come on top
    of it, and scale-down never drains below it. Locked by the daily cap: as
    ``vps_only``; the VPS's share keeps running the queue's jobs.

Routing (the launch's ``spot`` flag), the most urgent waiting work first:
    priority 1-3 jobs waiting: on-demand only (the VPS takes them too); long transcodes
    waiting (``long_jobs``, over 30 minutes): spot with checkpoints; a
    ``spot_preferred`` queue, or only priority 7-10 jobs waiting: spot if any eligible
    provider offers it, else on-demand; priority 4-6 (or no band known): either,
    whichever is cheaper (on-demand on a tie).

Provider choice
    The queue's ``cloud_provider`` if set (only that one: it is the operator's pin),
    else every enabled provider; among those with an offer in the snapshot and room
    under ``max_instances`` (counting their instances not yet terminated and the ones
    launched in this evaluation), the cheapest allowed option: the spot price where
    spot is allowed (AWS ``spot_enabled`` within ``spot_max_price``, Google
    ``preemptible``; IONOS has none) and wanted, else on-demand. Ties go to on-demand,
    then to the order aws, google, ionos. The caps count each option as the node
    provider does (:func:`at_most`): a spot instance at the most it may bill (AWS:
    ``spot_max_price``, else the on-demand price; Google: the on-demand price), an
    on-demand one at its price; the cheapest option by its price now *that the caps
    allow* is chosen, so a spot instance whose maximum would pass a cap gives way to
    the on-demand one that fits (for every route but on-demand-only: spot wanted
    falls back to on-demand as it does without a spot offer).

What the applier records for the next evaluation
    ``launch``: ``History.last_scale_up[queue] = now`` and ``now`` once per instance in
    ``History.launches``; ``drain``: ``History.last_scale_down[queue] = now`` (every
    drain, which only makes the next scale-down wait); ``alert`` with a queue (a flood):
    ``History.last_alert[queue] = now``; ``alert`` without a queue (the spend):
    ``Spend.alerted_today`` for the rest of the day; ``lock``: ``Spend.locked`` until
    the reset; the queue's ``empty_since`` from its depth.

Holds and notes
    A ``hold`` says a wanted launch or drain did not happen for a reason that can
    change: cooldown, ``max_workers``, ``max_instances``, no offer, a cost cap, the
    launch-rate cap, the lock. A static configuration (mode ``vps_only``, a queue
    that is not cloud-enabled) is not a hold: :func:`explain` says it instead.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

from autoscaler import admission, cost, estimate, placement
from autoscaler.admission import Admission
from autoscaler.cost import Budget, GuardVerdict
from autoscaler.snapshot import (
    Band,
    Decision,
    ManualBurst,
    Offer,
    QueueState,
    Snapshot,
    WorkerState,
)

if TYPE_CHECKING:  # config values come in built: importing pydantic is the loader's job
    from autoscaler.config import ProviderName, QueueConfig, SchedulerConfig

# Tie-breaks between equally cheap offers (the order of the seed's settings file).
PROVIDER_ORDER: tuple[ProviderName, ...] = ("aws", "google", "ionos")

FLOOD_ALERT_REPEAT_SECONDS = 3600.0
LIVE = ("starting", "active")
EPSILON_CENTS = 1e-6


# -- the policy table ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TableRow:
    """A row of the seed's scaling policy table. ``burst`` None: up to the maximum."""

    name: str
    burst: int | None
    alert: bool = False


QUIET = TableRow("depth 0-5, oldest < 2 min", 0)
ONE = TableRow("depth 6-20 or oldest 2-5 min: 1 burst worker", 1)
THREE = TableRow("depth 21-100 or oldest 5-10 min: up to 3 burst workers", 3)
FLOOD = TableRow("depth > 100 or oldest > 10 min: up to max_workers", None, alert=True)


def table_row(depth: int, oldest_seconds: float) -> TableRow:
    """The higher of the depth's row and the oldest age's row."""
    if depth > 100 or oldest_seconds > 600:
        return FLOOD
    if depth >= 21 or oldest_seconds >= 300:
        return THREE
    if depth >= 6 or oldest_seconds >= 120:
        return ONE
    return QUIET


def triggered(config: SchedulerConfig, state: QueueState) -> bool:
    """The seed's scale-up condition (depth or oldest age at its threshold)."""
    up = config.scaling_rules.scale_up
    return state.depth >= up.queue_depth_threshold or (
        state.oldest_age_seconds >= up.oldest_job_age_seconds
    )


# -- routing and provider choice -------------------------------------------------------------

RouteKind = Literal["on_demand", "either", "spot"]


@dataclass(frozen=True, slots=True)
class Route:
    kind: RouteKind
    why: str


def route(queue: str, config: QueueConfig, state: QueueState) -> Route:
    """On-demand, spot or either for a launch for ``queue`` (the seed's routing rules)."""
    bands = state.depth_by_band
    if bands.get("1-3", 0) > 0:
        return Route("on_demand", "priority 1-3 jobs waiting: on-demand")
    if state.long_jobs > 0:
        return Route("spot", "long transcodes waiting: spot with checkpoints")
    if config.spot_preferred:
        return Route("spot", f"{queue} prefers spot")
    if bands.get("4-6", 0) > 0:
        return Route("either", "priority 4-6: on-demand or spot, the cheaper")
    if bands.get("7-10", 0) > 0:
        return Route("spot", "priority 7-10 only: spot preferred")
    return Route("either", "on-demand or spot, the cheaper")


@dataclass(frozen=True, slots=True)
class Option:
    """An instance one provider offers now. ``cents_per_hour`` is what the caps count
    (:func:`at_most`); :attr:`expected_cents_per_hour` what it is expected to bill."""

    provider: ProviderName
    spot: bool
    cents_per_hour: float
    # The market price when ``cents_per_hour`` is the most a spot instance may bill
    # (what the caps count), None otherwise.
    quoted_cents_per_hour: float | None = None

    @property
    def expected_cents_per_hour(self) -> float:
        """Its price now (a spot instance's market price): what the choice ranks by."""
        quoted = self.quoted_cents_per_hour
        return self.cents_per_hour if quoted is None else quoted

    @property
    def label(self) -> str:
        kind = "spot" if self.spot else "on-demand"
        if self.quoted_cents_per_hour is not None:
            return (
                f"{self.provider} {kind} at {cost.money(self.quoted_cents_per_hour)}/h"
                f" (counted at its maximum, {cost.money(self.cents_per_hour)}/h)"
            )
        return f"{self.provider} {kind} at {cost.money(self.cents_per_hour)}/h"


def at_most(config: SchedulerConfig, option: Option, on_demand_cents_per_hour: float) -> Option:
    """The option priced at the most it may bill an hour, which the caps count (the
    node provider's rule too: it books a launch so). An on-demand instance bills its
    list price. A spot instance bills the market price of each moment, which may rise
    after the launch up to its maximum: on AWS the ``MaxPrice`` the launch sends
    (``spot_max_price``), else EC2's default maximum, the on-demand price; on Google,
    the on-demand price (a spot VM never costs more). Its market price now stays
    (``quoted_cents_per_hour``). Priced so already: unchanged."""
    if not option.spot:
        return option
    ceiling = config.cloud_providers.aws.spot_max_price_cents if option.provider == "aws" else None
    most = max(on_demand_cents_per_hour if ceiling is None else ceiling, option.cents_per_hour)
    if most == option.cents_per_hour:
        return option
    return replace(option, cents_per_hour=most, quoted_cents_per_hour=option.cents_per_hour)


def expected_cents_per_hour(worker: WorkerState, offers: Mapping[ProviderName, Offer]) -> float:
    """What a running cloud worker is expected to bill an hour, to rank it against an
    :class:`Option`'s :attr:`~Option.expected_cents_per_hour`. Its
    ``cost_per_hour_cents`` is what the node provider booked it at, which the caps count
    (:func:`at_most`: a spot one at the most it may bill); a spot instance bills the
    market price of each moment: its provider's spot offer now, at most that booking
    (its maximum). Without a spot price now: its booking."""
    booked = worker.cost_per_hour_cents
    offer = None if worker.provider is None else offers.get(worker.provider)
    if not worker.spot or offer is None or offer.spot_cents_per_hour is None:
        return booked
    return min(offer.spot_cents_per_hour, booked)


def options(
    config: SchedulerConfig, queue: str, offers: Mapping[ProviderName, Offer]
) -> list[Option]:
    """Every instance the queue may burst onto, with its price now and, for the caps,
    the most it may bill (:func:`at_most`)."""
    providers = config.cloud_providers
    found: list[Option] = []
    for name in config.burst_providers(queue):
        offer = offers.get(name)
        if offer is None:
            continue
        found.append(Option(name, False, offer.on_demand_cents_per_hour))
        spot = offer.spot_cents_per_hour
        if spot is None or not providers.spot_allowed(name):
            continue
        ceiling = providers.aws.spot_max_price_cents if name == "aws" else None
        if ceiling is None or spot <= ceiling:
            found.append(at_most(config, Option(name, True, spot), offer.on_demand_cents_per_hour))
    return found


def pick(
    choices: Sequence[Option],
    kind: RouteKind,
    room: Mapping[ProviderName, int],
    budget: Budget | None = None,
) -> Option | None:
    """The cheapest option (by its price now) the route allows on a provider with room
    and, given a ``budget``, that the caps allow at the most it may bill (None: none).
    Spot wanted falls back to on-demand where no spot option is left."""
    usable = [o for o in choices if room.get(o.provider, 0) > 0]
    if budget is not None:
        usable = [o for o in usable if budget.refusal(o.cents_per_hour) is None]
    if kind == "on_demand":
        usable = [o for o in usable if not o.spot]
    elif kind == "spot":
        usable = [o for o in usable if o.spot] or usable
    if not usable:
        return None
    return min(
        usable,
        key=lambda o: (o.expected_cents_per_hour, o.spot, PROVIDER_ORDER.index(o.provider)),
    )


# -- one evaluation --------------------------------------------------------------------------


@dataclass(slots=True)
class _Plan:
    """What one evaluation has decided so far (local to :func:`_evaluate`)."""

    budget: Budget
    decisions: list[Decision] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    drained: set[str] = field(default_factory=set)
    launched: dict[ProviderName, int] = field(default_factory=dict)

    def add(self, decision: Decision) -> None:
        self.decisions.append(decision)
        if decision.action == "drain" and decision.worker_id is not None:
            self.drained.add(decision.worker_id)


def stop_horizon_seconds(config: SchedulerConfig) -> float:
    """How long running instances may still cost once the daily cap is reached: the
    evaluation that notices, the next one that drains, and the drain timeout."""
    drain = config.scaling_rules.scale_down.drain_timeout_seconds
    return 2 * config.evaluation_interval_seconds + drain


def cost_verdict(config: SchedulerConfig, snapshot: Snapshot) -> GuardVerdict:
    return cost.guard(
        config.cost_limits,
        snapshot.spend,
        now=snapshot.now,
        committed_cents_per_hour=cost.running_rate(snapshot.workers),
        launches=snapshot.history.launches,
        max_launches=cost.launch_rate_cap(config.cloud_providers),
        stop_horizon_seconds=stop_horizon_seconds(config),
    )


def decide(config: SchedulerConfig, snapshot: Snapshot) -> list[Decision]:
    """What to do now (see the module docstring for every rule)."""
    return _evaluate(config, snapshot).decisions


def explain(config: SchedulerConfig, snapshot: Snapshot) -> list[str]:
    """The decisions, and why nothing happened where nothing did (for ``explain``)."""
    plan = _evaluate(config, snapshot)
    verdict = cost_verdict(config, snapshot)
    mode = config.mode + (" (locked to vps_only by the daily cost cap)" if verdict.locked else "")
    lines = [
        f"Mode: {mode}",
        cost.summary(config.cost_limits, snapshot.spend, cost.running_rate(snapshot.workers)),
    ]
    lines += [f"{d.action}: {d.reason}" for d in plan.decisions] or ["Nothing to do."]
    said = " ".join(d.reason for d in plan.decisions)
    lines += [f"cost: {reason}" for reason in verdict.reasons if reason not in said]
    return lines + plan.notes + advice(config, snapshot)


def advice(config: SchedulerConfig, snapshot: Snapshot) -> list[str]:
    """Capacity advice from each queue's recent load: whether the workers it may have
    (``max_workers`` where it bursts; its VPS ``baseline_workers`` where it does not:
    not cloud-enabled, or ``vps_only``) keep up (saturated: how fast the backlog grows)
    and how many workers would keep its p95 wait within ``oldest_job_age_seconds``
    (:func:`autoscaler.estimate.capacity`). Only where they fall short."""
    target = config.scaling_rules.scale_up.oldest_job_age_seconds
    lines = []
    for name, qc in config.queues.items():
        state = snapshot.queues.get(name)
        load = None if state is None else estimate.Load.of(state)
        if load is None or load.rate <= 0:
            continue
        bursts = qc.cloud_enabled and config.mode != "vps_only"
        workers, limit = (
            (qc.max_workers, "max_workers") if bursts else (qc.baseline_workers, "its VPS workers")
        )
        found = estimate.capacity(name, load, workers, target, limit)
        if found.short:
            lines.append(f"capacity: {found.describe()}")
    return lines


def _evaluate(config: SchedulerConfig, snapshot: Snapshot) -> _Plan:
    verdict = cost_verdict(config, snapshot)
    plan = _Plan(budget=verdict.budget)
    if verdict.alert_reason is not None:
        plan.add(Decision("alert", verdict.alert_reason))
    if verdict.lock_reason is not None:
        plan.add(Decision("lock", verdict.lock_reason))

    cloud = sorted(
        (w for w in snapshot.workers if w.cloud and w.status != "terminated"),
        key=lambda w: w.worker_id,
    )
    drain_timeout = config.scaling_rules.scale_down.drain_timeout_seconds
    for worker in cloud:
        if worker.status == "draining":
            _terminate_if_drained(worker, snapshot.now, drain_timeout, plan)
    for worker in cloud:
        if worker.status in LIVE:
            why = _misplaced(config, worker, verdict.locked)
            if why is not None:
                plan.add(_drain(worker, f"Draining worker {worker.worker_id}: {why}"))
    grace = config.scaling_rules.scale_down.claims_paused_drain_seconds
    for worker in cloud:
        if worker.status in LIVE and worker.worker_id not in plan.drained:
            _drain_if_starved(worker, snapshot.now, grace, plan)

    for name in config.queues:
        _queue(config, snapshot, name, verdict, plan)
    return plan


def _drain(worker: WorkerState, reason: str) -> Decision:
    return Decision(
        "drain", reason, queue=worker.queue, worker_id=worker.worker_id, provider=worker.provider
    )


def _terminate_if_drained(
    worker: WorkerState, now: float, drain_timeout: float, plan: _Plan
) -> None:
    where = f"worker {worker.worker_id} ({worker.provider})"
    why: str | None = None
    if worker.current_jobs == 0:
        why = "drained, no jobs left"
    elif worker.drain_started_at is None:
        plan.notes.append(f"{where}: draining, {worker.current_jobs} jobs left")
    elif now - worker.drain_started_at >= drain_timeout:
        why = (
            f"drain timed out after {_duration(drain_timeout)}, force-killing"
            f" {worker.current_jobs} jobs (they return to the queue)"
        )
    else:
        left = drain_timeout - (now - worker.drain_started_at)
        plan.notes.append(
            f"{where}: draining, {worker.current_jobs} jobs left, force-killed in {left:.0f}s"
        )
    if why is not None:
        plan.add(
            Decision(
                "terminate",
                f"Terminating {where}: {why}",
                queue=worker.queue,
                worker_id=worker.worker_id,
                provider=worker.provider,
                spot=worker.spot,
            )
        )


def _drain_if_starved(worker: WorkerState, now: float, grace: float, plan: _Plan) -> None:
    """Drain a cloud worker that has claimed no job for ``grace`` seconds because its
    disk is low (the disk guard): idle, it costs money while its queue waits; once it
    is drained the queue's rules may launch a replacement. Within the grace, a note."""
    since = worker.claims_paused_since
    if since is None:
        return
    paused = round(max(0.0, now - since), 3)  # to the millisecond, as alerts.py's rule
    why = worker.claims_paused_reason or "low disk"
    if paused < grace:
        plan.notes.append(
            f"worker {worker.worker_id} ({worker.provider}): claiming paused for"
            f" {paused:.0f}s ({why}), drained at {grace:.0f}s"
        )
        return
    plan.add(
        _drain(
            worker,
            f"Draining worker {worker.worker_id}: unhealthy, it has claimed no job for"
            f" {_duration(paused)} ({why}; claims_paused_drain_seconds {grace:.0f}): an idle"
            f" instance that costs money; {worker.queue} gets a replacement if it needs one",
        )
    )


def _duration(seconds: float) -> str:
    if seconds >= 60 and seconds % 60 == 0:
        minutes = int(seconds // 60)
        return f"{minutes} minute" + ("s" if minutes > 1 else "")
    return f"{seconds:.0f} s"


def _misplaced(config: SchedulerConfig, worker: WorkerState, locked: bool) -> str | None:
    """Why a cloud worker has no place now (None: it has one)."""
    shut = admission.closed(config, worker.queue, locked=locked)
    if shut is not None:
        return shut[0]
    if worker.provider not in config.burst_providers(worker.queue):
        return f"{worker.queue} does not burst to {worker.provider}"
    return None


@dataclass(frozen=True, slots=True)
class _QueueView:
    """One queue's workers as the rules count them."""

    name: str
    config: QueueConfig
    state: QueueState
    admission: Admission  # counting every worker not terminated against max_workers
    vps_live: int
    cloud_live: tuple[WorkerState, ...]  # starting or active, not drained now
    floor: int  # cloud workers kept: the baseline (cloud_first), an operator's burst
    vps_share: int = 0  # the baseline the VPS keeps (autoscaler.placement.vps_pools)
    manual: ManualBurst | None = None  # the operator's burst that sets the floor, if any


def _queue(
    config: SchedulerConfig,
    snapshot: Snapshot,
    name: str,
    verdict: GuardVerdict,
    plan: _Plan,
) -> None:
    qc = config.queues[name]
    state = snapshot.queues.get(name) or QueueState(name=name, depth=0)
    up = triggered(config, state)
    load = f"depth={state.depth}, oldest={state.oldest_age_seconds:.0f}s"
    mine = [w for w in snapshot.workers if w.queue == name and w.status != "terminated"]
    admitted = admission.admit(config, name, verdict=verdict, queue_workers=len(mine))
    if admitted.closed:
        if up and not admitted.configured:
            plan.add(_hold_up(name, load, admitted.refusal or ""))
        else:
            plan.notes.append(f"{name}: {load}; {admitted.refusal}: no cloud workers")
        return

    vps_live = sum(1 for w in mine if not w.cloud and w.status in LIVE)
    # The cloud holds the baseline less the VPS's share (all of it in hybrid, one worker
    # of a cloud-enabled queue in cloud_first), or less the non-cloud workers live if
    # more: a VPS actor being replaced launches nothing.
    vps_share = placement.vps_pools(config)[name]
    view = _QueueView(
        name=name,
        config=qc,
        state=state,
        admission=admitted,
        vps_live=vps_live,
        cloud_live=tuple(
            w for w in mine if w.cloud and w.status in LIVE and w.worker_id not in plan.drained
        ),
        floor=max(0, qc.baseline_workers - max(vps_live, vps_share)),
        vps_share=vps_share,
    )
    manual = snapshot.bursts.get(name)
    if manual is not None and manual.until > snapshot.now and manual.workers > view.floor:
        view = replace(view, floor=manual.workers, manual=manual)
    if up or len(view.cloud_live) < view.floor:
        _scale_up(config, snapshot, view, up, plan)
    else:
        _scale_down(config, snapshot, view, plan)


def _scale_up(
    config: SchedulerConfig,
    snapshot: Snapshot,
    view: _QueueView,
    up: bool,
    plan: _Plan,
) -> None:
    name, state, now = view.name, view.state, snapshot.now
    load = f"depth={state.depth}, oldest={state.oldest_age_seconds:.0f}s"
    most = max(0, view.config.max_workers - view.vps_live)
    have = len(view.cloud_live)
    sized = _size_burst(config, snapshot, view) if up else None
    if sized is not None:
        row, burst, sizing = sized
    else:
        row = table_row(state.depth, state.oldest_age_seconds)
        burst = (most if row.burst is None else max(1, row.burst)) if up else 0
        sizing = row.name if row is not QUIET else "the thresholds: 1 burst worker"
    wanted = min(view.floor + burst, most)
    if up:
        headline = f"Scaling up {name}: {load}"
    elif view.manual is not None:
        until = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(view.manual.until))
        by = f" by {view.manual.by}" if view.manual.by else ""
        headline = (
            f"Keeping {name}'s manual burst{by}: {have} of {view.manual.workers} cloud"
            f" workers until {until}"
        )
        sizing = "manual burst"
    else:
        headline = (
            f"Keeping {name}'s baseline on the cloud (cloud_first): {have} of {view.floor}"
            f" cloud workers (baseline {view.config.baseline_workers},"
            f" {max(view.vps_live, view.vps_share)} on the VPS)"
        )
        sizing = "baseline"

    if up and row.alert:
        last = snapshot.history.last_alert.get(name)
        if last is None or now - last >= FLOOD_ALERT_REPEAT_SECONDS:
            plan.add(
                Decision(
                    "alert",
                    f"Queue {name} flooded ({load}): scaling to max_workers"
                    f" {view.config.max_workers}; operator attention needed",
                    queue=name,
                )
            )

    missing = wanted - have
    if missing <= 0:
        plan.notes.append(f"{name}: {load}; {have} cloud workers, {sizing}: no launch needed")
        return
    if view.admission.refusal is not None:
        plan.add(_hold_up(name, load, view.admission.refusal))
        return
    cooldown = config.scaling_rules.scale_up.cooldown_seconds
    last_up = snapshot.history.last_scale_up.get(name)
    if last_up is not None and now - last_up < cooldown:
        since = f"cooldown, {now - last_up:.0f}s of {cooldown}s since its last scale-up"
        plan.add(_hold_up(name, load, since))
        return

    how = route(name, view.config, state)
    routes = _routes(config, view, how, min(missing, view.admission.room))
    choices = options(config, name, snapshot.offers)
    picked: list[Option] = []
    why: dict[Option, str] = {}
    stopped: str | None = None
    for this in routes:
        room = _provider_room(config, snapshot, plan)
        cheapest = pick(choices, this.kind, room)
        if cheapest is None:
            stopped = _no_provider(config, snapshot, name, plan)
            break
        # The cheapest the caps allow at the most it may bill, as the node provider
        # counts it: a spot maximum over a cap gives way to an on-demand option that fits.
        option = pick(choices, this.kind, room, plan.budget)
        if option is None:
            stopped = plan.budget.refusal(cheapest.cents_per_hour)
            break
        if option != cheapest:
            refused = plan.budget.refusal(cheapest.cents_per_hour)
            why.setdefault(option, f"{this.why}; not {cheapest.label}: {refused}")
        why.setdefault(option, this.why)
        plan.budget = plan.budget.after_launch(option.cents_per_hour)
        plan.launched[option.provider] = plan.launched.get(option.provider, 0) + 1
        picked.append(option)

    for option in dict.fromkeys(picked):
        count = picked.count(option)
        plan.add(
            Decision(
                "launch",
                f"{headline}; {count} on {option.label} ({why[option]}; {sizing})",
                queue=name,
                provider=option.provider,
                spot=option.spot,
                count=count,
                cents_per_hour=option.expected_cents_per_hour,
            )
        )
    if stopped is not None:
        plan.add(_hold_up(name, load, stopped, further=bool(picked)))


def _routes(config: SchedulerConfig, view: _QueueView, how: Route, count: int) -> list[Route]:
    """The route of each of ``count`` launches. The seed's rule: on-demand while priority
    1-3 jobs wait. With the queue's run time known, only the workers those jobs need
    (to run them within ``oldest_job_age_seconds``, at least one, less the queue's VPS
    and on-demand workers already up: they take the most urgent jobs first) are
    on-demand; the rest take the route of the work behind them (spot where it allows)."""
    state = view.state
    urgent = state.depth_by_band.get("1-3", 0)
    if how.kind != "on_demand" or not urgent or not state.mean_run_seconds:
        return [how] * count
    clear = config.scaling_rules.scale_up.oldest_job_age_seconds
    serving = view.vps_live + sum(1 for w in view.cloud_live if not w.spot)
    needed = max(1, estimate.whole(urgent * state.mean_run_seconds / clear)) - serving
    behind: dict[Band, int] = {b: n for b, n in state.depth_by_band.items() if b != "1-3"}
    if not behind:
        return [how] * count
    rest = route(view.name, view.config, replace(state, depth_by_band=behind))
    rest = Route(
        rest.kind,
        f"{rest.why}: the {urgent} priority 1-3 jobs have their on-demand workers"
        f" ({max(0, needed)} new, {serving} up)",
    )
    return [how if i < needed else rest for i in range(count)]


def _boot(config: SchedulerConfig, snapshot: Snapshot, queue: str) -> float:
    """The soonest a node launched now for ``queue`` takes work (its providers' boot)."""
    providers = config.burst_providers(queue) or ["aws"]
    return min(estimate.boot_seconds(p, snapshot.offers.get(p)) for p in providers)


def _size_burst(
    config: SchedulerConfig, snapshot: Snapshot, view: _QueueView
) -> tuple[TableRow, int, str] | None:
    """The burst for a triggered scale-up from the queue's load (None: load unknown, the
    table sizes from the depth alone). The table's row is read at the moment a node
    launched now would be ready (the backlog then, the oldest job's age then) and bounds
    the workers wanted to clear that backlog within ``oldest_job_age_seconds``; never
    fewer than 1 nor than the workers the arrivals alone keep busy."""
    state = view.state
    if state.arrivals_per_hour is None:
        return None
    boot = _boot(config, snapshot, view.name)
    most = max(0, view.config.max_workers - view.vps_live)
    load = estimate.Load.of(state)
    if load is None:  # arrivals known, no run time yet: a worker per job, the table's at most
        row = table_row(state.depth, state.oldest_age_seconds + boot)
        cap = most if row.burst is None else max(1, row.burst)
        expected = estimate.whole(state.depth + state.arrivals_per_hour * boot / 3600.0)
        burst = max(1, min(cap, expected))
        return (
            row,
            burst,
            (
                f"estimate: no run time known yet, {expected} jobs waiting when a node is ready"
                f" (boot {boot:.0f} s); table at ready: {row.name}; {burst} burst"
                f" worker{'s' if burst != 1 else ''}, one per job at most"
            ),
        )
    active = view.vps_live + sum(1 for w in view.cloud_live if w.status == "active")
    backlog = estimate.backlog_at_ready(state.depth, load, active, boot)
    row = table_row(estimate.whole(backlog), state.oldest_age_seconds + boot)
    cap = most if row.burst is None else max(1, row.burst)
    clear = _clear_seconds(config, state)
    total = estimate.workers_wanted(backlog, load, clear)
    busy = estimate.whole(load.busy)
    burst = max(1, min(cap, total - view.vps_live), busy - view.vps_live)
    fired = (
        "the arrivals' busy workers"
        if burst == busy - view.vps_live and burst > min(cap, total - view.vps_live)
        else ("the table's row" if total - view.vps_live > cap else "the backlog estimate")
    )
    sizing = (
        f"estimate: {load.describe()} keep {load.busy:.1f} workers busy; backlog"
        f" {backlog:.0f} when a node is ready (boot {boot:.0f} s), {total} workers clear it"
        f" within {clear} s; table at ready: {row.name}; {fired} sets {burst} burst"
        f" worker{'s' if burst != 1 else ''}"
    )
    return row, burst, sizing


def _clear_seconds(config: SchedulerConfig, state: QueueState) -> float:
    """How soon a scale-up means to clear the backlog: ``oldest_job_age_seconds`` (the
    wait the scale-up rule tolerates) while priority 1-3 jobs wait; else no sooner than
    ``idle_minutes`` (a worker launched for less work than that would sit idle longer
    than it works before the scale-down rule lets it go)."""
    urgent = config.scaling_rules.scale_up.oldest_job_age_seconds
    if state.depth_by_band.get("1-3", 0) > 0 or not state.depth_by_band:
        return float(urgent)
    return float(max(urgent, config.scaling_rules.scale_down.idle_minutes * 60))


def _hold_up(name: str, load: str, why: str, further: bool = False) -> Decision:
    more = " further" if further else ""
    return Decision("hold", f"Not scaling up {name}{more} ({load}): {why}", queue=name)


def _provider_room(
    config: SchedulerConfig, snapshot: Snapshot, plan: _Plan
) -> dict[ProviderName, int]:
    """Instances each enabled provider may still start (max_instances minus the ones not
    yet terminated and the ones launched in this evaluation)."""
    used = dict(plan.launched)
    for worker in snapshot.workers:
        if worker.provider is not None and worker.status != "terminated":
            used[worker.provider] = used.get(worker.provider, 0) + 1
    return admission.provider_room(config, config.cloud_providers.enabled(), used)


def _no_provider(config: SchedulerConfig, snapshot: Snapshot, queue: str, plan: _Plan) -> str:
    room = _provider_room(config, snapshot, plan)
    parts = []
    for name in config.burst_providers(queue):
        if name not in snapshot.offers:
            parts.append(f"{name} offers no price")
        elif room.get(name, 0) <= 0:
            limit = config.cloud_providers.get(name).max_instances
            parts.append(f"{name} at max_instances {limit}")
    return "no eligible provider (" + ", ".join(parts or ["none enabled"]) + ")"


def _scale_down(config: SchedulerConfig, snapshot: Snapshot, view: _QueueView, plan: _Plan) -> None:
    name, state, now = view.name, view.state, snapshot.now
    rules = config.scaling_rules.scale_down
    load = f"depth={state.depth}, oldest={state.oldest_age_seconds:.0f}s"
    if not view.cloud_live:
        plan.notes.append(f"{name}: {load}; below the scale-up thresholds, no cloud workers")
        return
    drainable = len(view.cloud_live) - view.floor
    if drainable <= 0:
        kept = "the manual burst" if view.manual is not None else "the baseline"
        plan.notes.append(f"{name}: {load}; cloud workers at {kept} ({view.floor})")
        return
    idle_for = rules.idle_minutes * 60
    idle = sorted(
        (w for w in view.cloud_live if w.current_jobs == 0),
        key=lambda w: (w.idle_since(), w.worker_id),
    )

    keep = _KeepAlive(config, snapshot, view)
    empty_since = snapshot.history.empty_since.get(name)
    if state.depth == 0 and empty_since is not None and now - empty_since >= idle_for:
        minutes = int((now - empty_since) // 60)
        for worker in idle[:drainable]:
            rule = f"{name} empty for {minutes} minutes"
            if keep.holds(worker, rule, plan):
                return
            plan.add(
                _drain(
                    worker,
                    f"Scaling down worker {worker.worker_id}: {rule}, terminating all burst"
                    " workers",
                )
            )
        if len(idle) < drainable:
            plan.notes.append(f"{name}: empty; busy burst workers drain once idle")
        return

    eligible = [w for w in idle if now - w.idle_since() >= idle_for]
    if not eligible:
        plan.notes.append(f"{name}: {load}; no cloud worker idle for {rules.idle_minutes} minutes")
        return
    if state.depth >= rules.queue_depth_below:
        plan.notes.append(
            f"{name}: {load}; {len(eligible)} idle cloud workers kept: depth is not below"
            f" queue_depth_below ({rules.queue_depth_below})"
        )
        return
    cooldown = rules.cooldown_seconds
    last = snapshot.history.last_scale_down.get(name)
    for worker in eligible[:drainable]:
        if last is not None and now - last < cooldown:
            plan.add(
                Decision(
                    "hold",
                    f"Not scaling down worker {worker.worker_id}: cooldown,"
                    f" {now - last:.0f}s of {cooldown}s since {name}'s last scale-down",
                    queue=name,
                    worker_id=worker.worker_id,
                )
            )
            return
        minutes = int((now - worker.idle_since()) // 60)
        below = rules.queue_depth_below
        rule = f"idle for {minutes} minutes ({name} depth={state.depth} < {below})"
        if keep.holds(worker, rule, plan):
            return
        plan.add(_drain(worker, f"Scaling down worker {worker.worker_id}: {rule}"))
        last = now


class _KeepAlive:
    """The keep-alive estimate for one queue's scale-down: a burst worker a rule would
    drain is kept (a ``hold`` saying why) while the queue's recent arrival rate says it
    will be needed again before a replacement could take work (boot + the scale-up
    cooldown; :func:`autoscaler.estimate.needed_again`)."""

    def __init__(self, config: SchedulerConfig, snapshot: Snapshot, view: _QueueView) -> None:
        self.load = estimate.Load.of(view.state)
        self.view = view
        self.snapshot = snapshot
        self.cooldown = config.scaling_rules.scale_up.cooldown_seconds
        self.idle_window = 60.0 * config.scaling_rules.scale_down.idle_minutes
        self.left = view.vps_live + len(view.cloud_live)
        # what a replacement would cost now (the route and offers a launch would take)
        how = route(view.name, view.config, view.state)
        everywhere = dict.fromkeys(config.burst_providers(view.name), 1)
        found = pick(options(config, view.name, snapshot.offers), how.kind, everywhere)
        self.replacement = None if found is None else found.expected_cents_per_hour

    def holds(self, worker: WorkerState, rule: str, plan: _Plan) -> bool:
        """Whether ``worker`` is kept (the hold added); else it counts as drained. A
        worker dearer than its replacement would be (on-demand, where a launch now
        would be spot) is not kept: idle, it costs more than a new one's boot. Both are
        priced at what they are expected to bill (:func:`expected_cents_per_hour`)."""
        self.left -= 1
        if self.load is None or worker.provider is None:
            return False
        # Like for like: what each is expected to bill (a spot one's market price), not
        # a running spot worker's booking at its maximum against the market's price.
        expected = expected_cents_per_hour(worker, self.snapshot.offers)
        if self.replacement is not None and expected > self.replacement + EPSILON_CENTS:
            return False
        boot = estimate.boot_seconds(worker.provider, self.snapshot.offers.get(worker.provider))
        horizon = boot + self.cooldown
        why = estimate.needed_again(self.load, self.left, horizon, self.idle_window)
        if why is None:
            return False
        plan.add(
            Decision(
                "hold",
                f"Keeping worker {worker.worker_id} (would drain: {rule}): keep-alive"
                f" estimate: {self.load.describe()}: {why} (a replacement takes boot"
                f" {boot:.0f} s + cooldown {self.cooldown} s)",
                queue=self.view.name,
                worker_id=worker.worker_id,
            )
        )
        return True
