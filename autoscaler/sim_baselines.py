"""The scheduler simulator's baselines: what the policy is compared with
(:func:`autoscaler.simulate.compare`).

- :class:`StaticFleet`: a fixed on-demand fleet sized for the trace's peak hour, up
  from the start (pre-warmed), paid until the end; no decisions.
- :class:`KedaRule`: a KEDA-style rule: every 30 s, ``ceil(depth / target)`` cloud
  workers per cloud-enabled queue (up to ``max_workers`` minus its VPS workers),
  up at once, down only to the highest target of the last 300 s; no cost caps.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from autoscaler import policy
from autoscaler.snapshot import Decision, Snapshot, WorkerState

if TYPE_CHECKING:
    from autoscaler.config import ProviderName, SchedulerConfig
    from autoscaler.sim_world import Arrival, Cloud


@dataclass
class StaticFleet:
    """``per_queue`` on-demand cloud workers, up from the start to the end (see
    :func:`peak_fleet` for the size that serves a trace's peak hour)."""

    per_queue: Mapping[str, int]
    name: str = "static-for-peak"
    keeps_fleet: bool = True

    def interval_seconds(self, config: SchedulerConfig) -> float:
        return float(config.evaluation_interval_seconds)

    def prewarm(
        self, config: SchedulerConfig, clouds: Mapping[ProviderName, Cloud]
    ) -> list[Decision]:
        launches = []
        for queue, count in self.per_queue.items():
            provider = cheapest_on_demand(config, clouds, queue, {})
            if count > 0 and provider is not None:
                launches.append(
                    Decision(
                        "launch", f"static fleet: {count}", queue, provider=provider, count=count
                    )
                )
        return launches

    def decide(self, config: SchedulerConfig, snapshot: Snapshot) -> list[Decision]:
        return []


@dataclass
class KedaRule:
    """KEDA-style: cloud workers = ``ceil(depth / jobs_per_worker)`` per cloud-enabled
    queue (capped by ``max_workers`` minus VPS workers and providers' ``max_instances``),
    polled every ``poll_seconds``; up at once; down to the highest target of the last
    ``cooldown_seconds`` (draining the idle first); on-demand; no cost caps. Stateful:
    one instance per run."""

    jobs_per_worker: int = 5
    poll_seconds: float = 30.0
    cooldown_seconds: float = 300.0
    name: str = "keda-style"
    keeps_fleet: bool = False
    _targets: dict[str, list[tuple[float, int]]] = field(default_factory=dict, repr=False)

    def interval_seconds(self, config: SchedulerConfig) -> float:
        return self.poll_seconds

    def prewarm(
        self, config: SchedulerConfig, clouds: Mapping[ProviderName, Cloud]
    ) -> list[Decision]:
        return []

    def decide(self, config: SchedulerConfig, snapshot: Snapshot) -> list[Decision]:
        now = snapshot.now
        decisions = [
            Decision("terminate", f"{w.worker_id} drained", w.queue, worker_id=w.worker_id)
            for w in snapshot.workers
            if w.cloud and w.status == "draining" and w.current_jobs == 0
        ]
        on = _instances_by_provider(snapshot.workers)
        for name, queue in config.queues.items():
            if not queue.cloud_enabled:
                continue
            mine = [w for w in snapshot.workers if w.queue == name]
            vps = sum(1 for w in mine if not w.cloud)
            live = [w for w in mine if w.cloud and w.status in policy.LIVE]
            depth = snapshot.queues[name].depth
            target = min(max(0, queue.max_workers - vps), math.ceil(depth / self.jobs_per_worker))
            window = [
                (at, n) for at, n in self._targets.get(name, []) if now - at < self.cooldown_seconds
            ]
            window.append((now, target))
            self._targets[name] = window
            if target > len(live):
                decisions += _keda_launch(config, snapshot, name, target - len(live), on)
            else:
                keep = max(n for _, n in window)
                surplus = sorted(live, key=lambda w: (w.current_jobs, w.worker_id))
                decisions += [
                    Decision("drain", f"keda: {name} target {keep}", name, worker_id=w.worker_id)
                    for w in surplus[: max(0, len(live) - keep)]
                ]
        return decisions


def _keda_launch(
    config: SchedulerConfig,
    snapshot: Snapshot,
    queue: str,
    count: int,
    on: dict[ProviderName, int],
) -> list[Decision]:
    decisions = []
    clouds = {o.provider: o.on_demand_cents_per_hour for o in snapshot.offers.values()}
    for _ in range(count):
        room = {
            p: price
            for p, price in clouds.items()
            if p in config.burst_providers(queue)
            and on.get(p, 0) < config.cloud_providers.get(p).max_instances
        }
        if not room:
            break
        provider = min(room, key=lambda p: (room[p], policy.PROVIDER_ORDER.index(p)))
        on[provider] = on.get(provider, 0) + 1
        decisions.append(Decision("launch", f"keda: {queue} up", queue, provider=provider))
    return decisions


def _instances_by_provider(workers: Iterable[WorkerState]) -> dict[ProviderName, int]:
    counts: dict[ProviderName, int] = {}
    for w in workers:
        if w.provider is not None and w.status != "terminated":
            counts[w.provider] = counts.get(w.provider, 0) + 1
    return counts


def cheapest_on_demand(
    config: SchedulerConfig,
    clouds: Mapping[ProviderName, Cloud],
    queue: str,
    used: Mapping[ProviderName, int],
) -> ProviderName | None:
    """The cheapest on-demand provider ``queue`` may burst onto (None: none)."""
    eligible = [p for p in config.burst_providers(queue) if p in clouds]
    if not eligible:
        return None
    return min(
        eligible,
        key=lambda p: (clouds[p].on_demand_cents_per_hour, policy.PROVIDER_ORDER.index(p)),
    )


def peak_fleet(
    config: SchedulerConfig, arrivals: Sequence[Arrival], window_seconds: float = 3600.0
) -> dict[str, int]:
    """Cloud workers per cloud-enabled queue that keep up with its busiest hour:
    ``ceil(work in the busiest window / window)`` minus its VPS workers (windows start
    every 10 minutes)."""
    sizes: dict[str, int] = {}
    step = 600.0
    for name, queue in config.queues.items():
        if not queue.cloud_enabled:
            continue
        bins: dict[int, float] = {}
        for a in arrivals:
            if a.queue == name:
                key = int(a.at // step)
                bins[key] = bins.get(key, 0.0) + a.duration * a.count
        span = int(window_seconds // step)
        peak = max((sum(bins.get(k + i, 0.0) for i in range(span)) for k in bins), default=0.0)
        sizes[name] = max(0, math.ceil(peak / window_seconds) - queue.baseline_workers)
    return sizes
