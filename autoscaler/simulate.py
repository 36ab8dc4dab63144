"""The scheduler simulator: an arrival trace through the real policy, on a virtual clock.

``hypermedia scheduler simulate --config scheduler.json --trace trace.csv`` (seed 000,
issue 5 "Simulator") replays per-queue arrivals against simulated clouds and reports
what the scheduler would have cost and how long jobs would have waited.

The parts: :mod:`autoscaler.sim_world` (the trace, the simulated clouds, the
cluster on its virtual clock), :mod:`autoscaler.sim_baselines` (what the policy is
compared with), :mod:`autoscaler.sim_report` (what a run measured, as a table and a
chart). This module runs them: :func:`simulate` one controller, :func:`compare`
the three.

Controllers (what decides, every ``interval_seconds``)
    - :class:`OurPolicy`: the real :func:`autoscaler.policy.decide` (with the cost guard),
      every ``evaluation_interval_seconds``; decisions applied as the loop applies them;
      the history recorded as the loop records it (:func:`autoscaler.snapshot.next_history`).
    - :class:`~autoscaler.sim_baselines.StaticFleet` and
      :class:`~autoscaler.sim_baselines.KedaRule`: the baselines (static for the peak
      hour, KEDA-style), neither held to the cost caps.

:func:`main` is what the CLI calls: it prints a rich table of the three controllers and
draws a PNG chart (matplotlib, optional).
"""

from __future__ import annotations

import heapq
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from autoscaler import cost, estimate, policy
from autoscaler.sim_baselines import KedaRule, StaticFleet, peak_fleet
from autoscaler.sim_report import Report, as_json, chart, table, waits_of
from autoscaler.sim_world import (
    EPSILON_CENTS,
    Arrival,
    Cloud,
    World,
    default_clouds,
    read_trace,
)
from autoscaler.snapshot import BANDS, Band, Decision, Snapshot, band_of, next_history

if TYPE_CHECKING:
    from autoscaler.config import ProviderName, SchedulerConfig

DEFAULT_TAIL_SECONDS = 4 * 3600.0  # after the last arrival, at most this long to finish


class Controller(Protocol):
    """What decides: ``decide`` every ``interval_seconds`` (a fresh one per run)."""

    name: str

    def interval_seconds(self, config: SchedulerConfig) -> float: ...

    def prewarm(
        self, config: SchedulerConfig, clouds: Mapping[ProviderName, Cloud]
    ) -> list[Decision]:
        """Launches that are up before the run starts (no launch delay)."""
        ...

    def decide(self, config: SchedulerConfig, snapshot: Snapshot) -> list[Decision]: ...

    @property
    def keeps_fleet(self) -> bool:
        """Whether its cloud workers stay until the end (the run ends when work does)."""
        ...


@dataclass
class OurPolicy:
    """The real policy and cost guard (:func:`autoscaler.policy.decide`). ``estimates``
    False: the queues' load is left out of its snapshots, so it sizes and scales down by
    the seed's depth and age rules alone (what it did before the estimates: the
    bench's "seed rules only" row)."""

    name: str = "hypermedia"
    keeps_fleet: bool = False
    estimates: bool = True

    def interval_seconds(self, config: SchedulerConfig) -> float:
        return float(config.evaluation_interval_seconds)

    def prewarm(
        self, config: SchedulerConfig, clouds: Mapping[ProviderName, Cloud]
    ) -> list[Decision]:
        return []

    def decide(self, config: SchedulerConfig, snapshot: Snapshot) -> list[Decision]:
        if not self.estimates:
            blind = {
                name: replace(q, arrivals_per_hour=None, mean_run_seconds=None)
                for name, q in snapshot.queues.items()
            }
            snapshot = replace(snapshot, queues=blind)
        return policy.decide(config, snapshot)


def simulate(
    config: SchedulerConfig,
    arrivals: Sequence[Arrival],
    controller: Controller | None = None,
    clouds: Mapping[ProviderName, Cloud] | None = None,
    *,
    seed: int = 0,
    tail_seconds: float = DEFAULT_TAIL_SECONDS,
) -> Report:
    """Replay ``arrivals`` under ``controller`` (default: the real policy). The run ends at
    the first evaluation after the last arrival where no job is waiting or running and
    no cloud worker is left (a fleet-keeping controller: when the work is done), or
    ``tail_seconds`` after the last arrival."""
    control = controller if controller is not None else OurPolicy()
    world = World(config, clouds if clouds is not None else default_clouds(), random.Random(seed))
    for decision in control.prewarm(config, world.clouds):
        world.launch(decision, prewarmed=True)
    for arrival in arrivals:
        world.push(arrival.at, "arrive", arrival)
    world.push(0.0, "evaluate", None)
    last_arrival = max((a.at for a in arrivals), default=0.0)
    interval = control.interval_seconds(config)
    while world.events:
        at, _, _, kind, payload = heapq.heappop(world.events)
        world.now = at
        if kind == "evaluate":
            if _evaluate(world, control, last_arrival, tail_seconds):
                break
            world.push(at + interval, "evaluate", None)
        elif kind == "arrive":
            assert isinstance(payload, Arrival)
            world.arrive(payload)
        elif kind == "finish":
            assert isinstance(payload, tuple)
            world.finish(*payload)
        elif kind == "boot":
            assert isinstance(payload, str)
            world.boot(payload)
        elif payload in world.workers:
            assert isinstance(payload, str)
            world.interruptions += 1
            world.remove(payload)
        world.dispatch()
    return _report(world, control)


def _evaluate(world: World, control: Controller, last_arrival: float, tail: float) -> bool:
    """One evaluation: decide, apply, record; whether the run is over."""
    snapshot = world.snapshot()
    decisions = control.decide(world.config, snapshot)
    for decision in decisions:
        world.apply(decision)
    if any(d.action == "hold" and _capped(d.reason) for d in decisions):
        world.cap_holds += 1
    world.history = next_history(snapshot, decisions)
    world.sample(snapshot)
    world.check_hour()
    if world.now < last_arrival:
        return False
    cloud_left = any(w.provider is not None for w in world.workers.values())
    done = not world.busy() and (control.keeps_fleet or not cloud_left)
    return done or world.now >= last_arrival + tail


def _capped(reason: str) -> bool:
    """Whether a hold is the cost caps' (hourly, daily, or the lock they set)."""
    return "hourly cap" in reason or "daily cap" in reason or "daily cost cap" in reason


def _report(world: World, control: Controller) -> Report:
    end = world.now
    for worker_id in [w for w, i in world.ledger.items() if i.end is None]:
        world.ledger[worker_id] = world.close(world.workers[worker_id], world.ledger[worker_id])
    runs = list(world.ledger.values())
    daily_cap = world.config.cost_limits.max_daily_spend_cents
    days = range(int(end // cost.DAY_SECONDS) + 1)
    daily_breaches = sum(
        1
        for d in days
        if cost.spent_between(runs, d * cost.DAY_SECONDS, (d + 1) * cost.DAY_SECONDS)
        > daily_cap + EPSILON_CENTS
    )
    by_band: dict[Band, list[float]] = {band: [] for band in BANDS}
    for job in world.jobs:
        wait = job.wait if job.wait is not None else end - job.arrived_at
        by_band[band_of(job.priority)].append(wait)
    return Report(
        controller=control.name,
        duration_seconds=end,
        cloud_cost_cents=cost.spent_between(runs, 0.0, end),
        waits={band: waits_of(values) for band, values in by_band.items()},
        jobs=len(world.jobs),
        unfinished=sum(1 for job in world.jobs if not job.done),
        launches=world.launches,
        boot_billed_seconds=world.boot_billed_seconds,
        churn_cents=world.churn_cents,
        cap_holds=world.cap_holds,
        interruptions=world.interruptions,
        hourly_breaches=world.hourly_breaches,
        daily_breaches=daily_breaches,
        locked_at=world.locked_at,
        timeline=tuple(world.timeline),
    )


def compare(
    config: SchedulerConfig,
    arrivals: Sequence[Arrival],
    clouds: Mapping[ProviderName, Cloud] | None = None,
    *,
    seed: int = 0,
) -> list[Report]:
    """Our policy, the same without its load estimates (the seed's rules alone), a static
    fleet sized for the peak hour, and the KEDA-style rule."""
    controllers: list[Controller] = [
        OurPolicy(),
        OurPolicy(name="seed-rules-only", estimates=False),
        StaticFleet(peak_fleet(config, arrivals)),
        KedaRule(),
    ]
    return [simulate(config, arrivals, c, clouds, seed=seed) for c in controllers]


@dataclass(frozen=True, slots=True)
class Advice:
    """Capacity advice for one queue on a trace: what its busiest hour asks of
    ``max_workers`` (:class:`~autoscaler.estimate.Capacity`), and what the suggested
    change costs when the trace is replayed with it (our policy, the same clouds)."""

    capacity: estimate.Capacity | None  # None: advice on the cost caps
    change: str
    before: Report
    after: Report | None  # None: not replayed (nothing to burst to)
    why: str = ""  # the caps' advice: what they held

    def describe(self) -> str:
        def waits(r: Report) -> str:
            return ", ".join(
                f"p{b} {r.waits[b].p95 / 60:.1f} min" for b in BANDS if r.waits[b].jobs
            )

        headline = self.capacity.describe() if self.capacity is not None else self.why
        if self.after is None:
            return f"{headline}. Suggested: {self.change}"
        delta = self.after.cloud_cost_cents - self.before.cloud_cost_cents
        return (
            f"{headline}. On this trace, {self.change}:"
            f" {cost.money(self.after.cloud_cost_cents)} instead of"
            f" {cost.money(self.before.cloud_cost_cents)} ({'+' if delta >= 0 else '-'}"
            f"{cost.money(abs(delta))}), p95 waits {waits(self.after)} instead of"
            f" {waits(self.before)}, {self.after.unfinished} jobs unfinished instead of"
            f" {self.before.unfinished}, {self.after.cap_breaches} cap breaches"
        )


def busiest_hour(arrivals: Sequence[Arrival], queue: str) -> estimate.Load | None:
    """The queue's load in its busiest hour (windows every 10 minutes), None if idle."""
    mine = [a for a in arrivals if a.queue == queue]
    if not mine:
        return None
    best: tuple[float, float] = (0.0, 0.0)  # (jobs, seconds of work)
    starts = sorted({600.0 * int(a.at // 600) for a in mine})
    for start in starts:
        window = [a for a in mine if start <= a.at < start + 3600.0]
        jobs = float(sum(a.count for a in window))
        if jobs > best[0]:
            best = (jobs, float(sum(a.count * a.duration for a in window)))
    jobs, work = best
    return estimate.Load(jobs / 3600.0, work / jobs) if jobs else None


def with_max_workers(config: SchedulerConfig, queue: str, workers: int) -> SchedulerConfig:
    """``config`` with ``queue``'s max_workers set, and its providers' max_instances
    raised by as much (the instances the queue would need)."""
    old = config.queues[queue]
    queues = dict(config.queues)
    queues[queue] = old.model_copy(update={"max_workers": workers})
    providers = config.cloud_providers
    extra = max(0, workers - old.max_workers)
    for name in config.burst_providers(queue):
        current = providers.get(name)
        raised = current.model_copy(update={"max_instances": current.max_instances + extra})
        providers = providers.model_copy(update={name: raised})
    return config.model_copy(update={"queues": queues, "cloud_providers": providers})


def advise(
    config: SchedulerConfig,
    arrivals: Sequence[Arrival],
    ours: Report,
    clouds: Mapping[ProviderName, Cloud] | None = None,
    *,
    seed: int = 0,
) -> list[Advice]:
    """For every queue whose workers fall short of its busiest hour (saturated, or a p95
    wait over ``oldest_job_age_seconds``): the workers that would keep its p95 within
    it, and the trace replayed with them. A queue that bursts has ``max_workers``; one
    that does not (not cloud-enabled, or the mode is ``vps_only``) has its VPS
    ``baseline_workers``, and the replay lets it burst (``hybrid``, ``cloud_enabled``)
    where a provider is enabled (else there is no replay)."""
    target = config.scaling_rules.scale_up.oldest_job_age_seconds
    providers = config.cloud_providers.enabled()
    found = []
    for name, queue in config.queues.items():
        load = busiest_hour(arrivals, name)
        if load is None:
            continue
        bursts = queue.cloud_enabled and config.mode != "vps_only"
        workers = queue.max_workers if bursts else queue.baseline_workers
        limit = "max_workers" if bursts else "its VPS workers"
        capacity = estimate.capacity(name, load, workers, target, limit)
        if not capacity.short or capacity.workers_needed is None:
            continue
        needed = capacity.workers_needed
        after = None
        if bursts:
            change = f"max_workers {needed} for {name}"
            changed: SchedulerConfig | None = with_max_workers(config, name, needed)
        elif providers:
            change = f"{name} cloud-enabled with max_workers {needed}" + (
                " (mode hybrid)" if config.mode == "vps_only" else ""
            )
            queues = dict(config.queues)
            queues[name] = queue.model_copy(update={"cloud_enabled": True})
            mode = "hybrid" if config.mode == "vps_only" else config.mode
            opened = config.model_copy(update={"queues": queues, "mode": mode})
            changed = with_max_workers(opened, name, max(needed, queue.baseline_workers))
        else:
            change = f"{needed} workers for {name} (no cloud provider is enabled to replay it)"
            changed = None
        if changed is not None:
            after = simulate(changed, arrivals, OurPolicy(), clouds, seed=seed)
        found.append(Advice(capacity, change, ours, after))
    if ours.cap_holds:
        limits = config.cost_limits
        doubled = limits.model_copy(
            update={
                "max_hourly_spend_cents": 2 * limits.max_hourly_spend_cents,
                "max_daily_spend_cents": 2 * limits.max_daily_spend_cents,
            }
        )
        after = simulate(
            config.model_copy(update={"cost_limits": doubled}),
            arrivals,
            OurPolicy(),
            clouds,
            seed=seed,
        )
        change = (
            f"the caps doubled (hourly {cost.money(doubled.max_hourly_spend_cents)}, daily"
            f" {cost.money(doubled.max_daily_spend_cents)})"
        )
        held = f"the cost caps held launches at {ours.cap_holds} evaluations"
        found.append(Advice(None, change, ours, after, held))
    return found


def main(
    config_path: Path | str | None,
    trace_path: Path | str | None,
    chart_path: Path | str | None = None,
    json_path: Path | str | None = None,
    arrivals: Sequence[Arrival] | None = None,
    source: str | None = None,
) -> int:
    """``hypermedia scheduler simulate``: the controllers on one trace (a CSV file, or
    ``arrivals`` already read from the record, named by ``source``), as a table, the
    capacity advice, a PNG chart at ``chart_path`` and the JSON at ``json_path``.
    0: our policy stayed within the caps; 1: it breached one; 2: the config or the
    trace is unusable."""
    from rich.console import Console

    from autoscaler import config as scheduler_config
    from hypermedia.errors import ConfigError

    console = Console()
    if not console.is_terminal:  # piped or captured: do not squeeze the columns into 80
        console = Console(width=max(console.width, 160))
    name = source or Path(str(trace_path)).name
    try:
        config = scheduler_config.load(config_path)
        if arrivals is None:
            if trace_path is None:
                raise ValueError("no trace: give --trace FILE or --from-db")
            arrivals = read_trace(trace_path)
        reports = compare(config, arrivals)
        advice = advise(config, arrivals, reports[0])
    except (ConfigError, ValueError, OSError) as exc:
        console.print(f"[red]scheduler simulate: {exc}[/red]", highlight=False)
        return 2
    console.print(table(reports, f"{name} ({config.mode})"))
    for item in advice:
        console.print(f"capacity: {item.describe()}", highlight=False)
    if not advice:
        console.print("capacity: every queue's workers keep up with its busiest hour")
    limits = config.cost_limits
    caps = (float(limits.max_hourly_spend_cents), float(limits.max_daily_spend_cents))
    if chart_path is not None:
        if chart(reports, chart_path, f"{name} ({config.mode})", caps):
            console.print(f"chart: {chart_path}")
        else:
            console.print("no chart: matplotlib is not installed (pip install matplotlib)")
    if json_path is not None:
        document = as_json(
            reports,
            trace=name,
            mode=config.mode,
            capacity=[
                {
                    **(
                        {
                            "queue": a.capacity.queue,
                            "saturated": a.capacity.saturated,
                            "backlog_growth_per_hour": round(a.capacity.growth_per_hour, 1),
                            "max_workers": a.capacity.max_workers,
                            "workers_for_p95": a.capacity.workers_needed,
                            "p95_target_seconds": a.capacity.target_seconds,
                        }
                        if a.capacity is not None
                        else {"cap_holds": a.before.cap_holds}
                    ),
                    "change": a.change,
                    "cost_cents_before": round(a.before.cloud_cost_cents, 4),
                    "cost_cents_after": (
                        None if a.after is None else round(a.after.cloud_cost_cents, 4)
                    ),
                    "advice": a.describe(),
                }
                for a in advice
            ],
        )
        Path(json_path).write_text(json.dumps(document, indent=2) + "\n")
        console.print(f"json: {json_path}")
    return 1 if reports[0].cap_breaches else 0
