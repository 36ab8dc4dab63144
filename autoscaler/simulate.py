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
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from autoscaler import cost, policy
from autoscaler.sim_baselines import KedaRule, StaticFleet, peak_fleet
from autoscaler.sim_report import Report, chart, table, waits_of
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
    """The real policy and cost guard (:func:`autoscaler.policy.decide`)."""

    name: str = "hypermedia"
    keeps_fleet: bool = False

    def interval_seconds(self, config: SchedulerConfig) -> float:
        return float(config.evaluation_interval_seconds)

    def prewarm(
        self, config: SchedulerConfig, clouds: Mapping[ProviderName, Cloud]
    ) -> list[Decision]:
        return []

    def decide(self, config: SchedulerConfig, snapshot: Snapshot) -> list[Decision]:
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
    world.history = next_history(snapshot, decisions)
    world.sample(sum(q.depth for q in snapshot.queues.values()))
    world.check_hour()
    if world.now < last_arrival:
        return False
    cloud_left = any(w.provider is not None for w in world.workers.values())
    done = not world.busy() and (control.keeps_fleet or not cloud_left)
    return done or world.now >= last_arrival + tail


def _report(world: World, control: Controller) -> Report:
    end = world.now
    for worker_id in [w for w, i in world.ledger.items() if i.end is None]:
        world.ledger[worker_id] = replace(world.ledger[worker_id], end=end)
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
    """Our policy, a static fleet sized for the peak hour, and the KEDA-style rule."""
    controllers: list[Controller] = [
        OurPolicy(),
        StaticFleet(peak_fleet(config, arrivals)),
        KedaRule(),
    ]
    return [simulate(config, arrivals, c, clouds, seed=seed) for c in controllers]


def main(
    config_path: Path | str | None,
    trace_path: Path | str,
    chart_path: Path | str | None = None,
) -> int:
    """``hypermedia scheduler simulate``: the three controllers on one trace, as a table
    (and a PNG chart at ``chart_path``). 0: our policy stayed within the caps; 1: it
    breached one; 2: the config or the trace is unusable."""
    from rich.console import Console

    from autoscaler import config as scheduler_config
    from hypermedia.errors import ConfigError

    console = Console()
    if not console.is_terminal:  # piped or captured: do not squeeze the columns into 80
        console = Console(width=max(console.width, 160))
    try:
        config = scheduler_config.load(config_path)
        arrivals = read_trace(trace_path)
        reports = compare(config, arrivals)
    except (ConfigError, ValueError, OSError) as exc:
        console.print(f"[red]scheduler simulate: {exc}[/red]", highlight=False)
        return 2
    console.print(table(reports, f"{Path(trace_path).name} ({config.mode})"))
    if chart_path is not None:
        if chart(reports, chart_path, Path(trace_path).name):
            console.print(f"chart: {chart_path}")
        else:
            console.print("no chart: matplotlib is not installed (pip install matplotlib)")
    return 1 if reports[0].cap_breaches else 0
