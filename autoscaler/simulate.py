"""The scheduler simulator: an arrival trace through the real policy, on a virtual clock.

``hypermedia scheduler simulate --config scheduler.json --trace trace.csv`` (seed 000,
issue 5 "Simulator") replays per-queue arrivals against simulated clouds and reports
what the scheduler would have cost and how long jobs would have waited.

Trace
    A CSV file with the header ``at_seconds,queue,priority,duration_seconds[,count]``:
    ``count`` jobs (default 1) of ``queue`` arrive at ``at_seconds`` (virtual seconds
    from 0), each with a priority (1 most urgent .. 10) and a running time.
    :mod:`autoscaler.traces` writes the shipped ones (``etc/traces/``).

World
    Each queue has ``baseline_workers`` VPS workers from the start (free). A cloud
    instance is launched by a decision, costs its price per hour from its launch (the
    same :class:`~autoscaler.cost.Interval` ledger as the loop's), takes jobs after its
    provider's launch delay, and is gone at ``terminate`` (its interval closed). A spot
    instance may be interrupted (a Poisson process per instance, ``interruptions_per_hour``,
    seeded): it disappears and its job goes back to the queue. Every worker runs one job at
    a time and takes the most urgent job first (priority, then age). A job's wait is the
    time from its arrival to its last start (an interrupted job waits again); a job still
    waiting at the end counts with its wait so far (``unfinished`` says how many).

Controllers (what decides, every ``interval_seconds``)
    - :class:`OurPolicy`: the real :func:`autoscaler.policy.decide` (with the cost guard),
      every ``evaluation_interval_seconds``; decisions applied as the loop applies them;
      the history recorded as the loop records it (:func:`autoscaler.snapshot.next_history`).
    - :class:`StaticFleet`: a fixed on-demand fleet sized for the trace's peak hour, up
      from the start (pre-warmed), paid until the end; no decisions.
    - :class:`KedaRule`: a KEDA-style rule: every 30 s, ``ceil(depth / target)`` cloud
      workers per cloud-enabled queue (up to ``max_workers`` minus its VPS workers),
      up at once, down only to the highest target of the last 300 s; no cost caps.

Report (:class:`Report`)
    Cloud cost in cents, wait p50/p95/max per priority band, workers per queue over time
    (VPS and cloud), instances launched, spot interruptions, and cap breaches: checks at
    every evaluation that the last hour's spend was within ``max_hourly_spend_cents`` and,
    at the end, that every virtual day's spend was within ``max_daily_spend_cents``. The
    baselines do not obey the caps; their breaches say what the caps would have stopped.

:func:`main` is what the CLI calls: it prints a rich table of the three controllers and
draws a PNG chart (matplotlib, optional).
"""

from __future__ import annotations

import csv
import heapq
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from rich.table import Table

from autoscaler import cost, policy
from autoscaler.snapshot import (
    BANDS,
    Band,
    Decision,
    History,
    Offer,
    QueueState,
    Snapshot,
    Spend,
    WorkerState,
    band_of,
    is_long,
    next_history,
    queue_state,
)

if TYPE_CHECKING:
    from autoscaler.config import ProviderName, SchedulerConfig

TRACE_COLUMNS = ("at_seconds", "queue", "priority", "duration_seconds")
DEFAULT_TAIL_SECONDS = 4 * 3600.0  # after the last arrival, at most this long to finish
EPSILON_CENTS = 1e-6


# -- traces ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Arrival:
    """``count`` jobs of ``queue`` arriving at ``at`` (virtual seconds)."""

    at: float
    queue: str
    priority: int
    duration: float
    count: int = 1


def read_trace(path: Path | str) -> list[Arrival]:
    """The arrivals of a trace CSV, in time order; ValueError naming the line if bad."""
    with Path(path).open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        header = tuple(reader.fieldnames or ())
        if header[:4] != TRACE_COLUMNS or header[4:] not in ((), ("count",)):
            raise ValueError(
                f"{path}: header must be {','.join(TRACE_COLUMNS)}[,count], not {','.join(header)}"
            )
        arrivals = [_arrival(row, f"{path}:{n}") for n, row in enumerate(reader, start=2)]
    return sorted(arrivals, key=lambda a: a.at)


def _arrival(row: Mapping[str, str], where: str) -> Arrival:
    try:
        arrival = Arrival(
            at=float(row["at_seconds"]),
            queue=row["queue"].strip(),
            priority=int(row["priority"]),
            duration=float(row["duration_seconds"]),
            count=int(row.get("count") or 1),
        )
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None
    if not arrival.queue:
        raise ValueError(f"{where}: empty queue")
    if not 1 <= arrival.priority <= 10:
        raise ValueError(f"{where}: priority {arrival.priority} is not 1..10")
    if not (math.isfinite(arrival.at) and arrival.at >= 0):
        raise ValueError(f"{where}: at_seconds must be >= 0")
    if not (math.isfinite(arrival.duration) and arrival.duration > 0):
        raise ValueError(f"{where}: duration_seconds must be > 0")
    if arrival.count < 1:
        raise ValueError(f"{where}: count must be >= 1")
    return arrival


def write_trace(path: Path | str, arrivals: Iterable[Arrival]) -> None:
    """Write a trace CSV (with the ``count`` column)."""
    with Path(path).open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow([*TRACE_COLUMNS, "count"])
        for a in arrivals:
            writer.writerow([_num(a.at), a.queue, a.priority, _num(a.duration), a.count])


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


# -- simulated clouds ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cloud:
    """One simulated provider: prices in cents per instance-hour, boot time, spot risk."""

    provider: ProviderName
    on_demand_cents_per_hour: float
    spot_cents_per_hour: float | None = None  # None: no spot market
    launch_delay_seconds: float = 90.0
    interruptions_per_hour: float = 0.0  # per spot instance

    def offer(self) -> Offer:
        return Offer(
            self.provider,
            self.on_demand_cents_per_hour,
            self.spot_cents_per_hour,
            self.launch_delay_seconds,
        )

    def price(self, spot: bool) -> float:
        if spot:
            if self.spot_cents_per_hour is None:
                raise ValueError(f"{self.provider} has no spot price")
            return self.spot_cents_per_hour
        return self.on_demand_cents_per_hour


def default_clouds() -> dict[ProviderName, Cloud]:
    """Plausible list prices for the seed's instance types (c6i.xlarge, c2-standard-4,
    an IONOS cube), boot times, and a spot interruption every 20 instance-hours."""
    return {
        "aws": Cloud("aws", 17.0, 4.0, 90.0, 0.05),
        "google": Cloud("google", 21.0, 5.0, 60.0, 0.05),
        "ionos": Cloud("ionos", 15.0, None, 120.0, 0.0),
    }


# -- controllers -----------------------------------------------------------------------------


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


# -- the report ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Waits:
    """Waits of one priority band, in seconds (nearest-rank percentiles)."""

    jobs: int
    p50: float
    p95: float
    max: float


@dataclass(frozen=True, slots=True)
class FleetSample:
    """Workers not yet terminated per queue, and the total depth, at one evaluation."""

    at: float
    vps: Mapping[str, int]
    cloud: Mapping[str, int]
    depth: int


@dataclass(frozen=True, slots=True)
class Report:
    controller: str
    duration_seconds: float
    cloud_cost_cents: float
    waits: Mapping[Band, Waits]
    jobs: int
    unfinished: int
    launches: int
    interruptions: int
    hourly_breaches: int
    daily_breaches: int
    locked_at: float | None
    timeline: tuple[FleetSample, ...]

    @property
    def cap_breaches(self) -> int:
        return self.hourly_breaches + self.daily_breaches

    def peak_cloud(self) -> int:
        return max((sum(s.cloud.values()) for s in self.timeline), default=0)


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (rank ``ceil(fraction * n)``) of sorted values; 0 if none.

    The one copy (the benchmarks' reports use it too). The epsilon keeps a product that
    floating point leaves a hair above a whole rank (0.95 x 20 = 19.000000000000004) on
    that rank."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(fraction * len(sorted_values) - 1e-9))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def waits_of(values: Iterable[float]) -> Waits:
    ordered = sorted(values)
    return Waits(
        len(ordered), percentile(ordered, 0.5), percentile(ordered, 0.95), max(ordered, default=0.0)
    )


# -- the engine ------------------------------------------------------------------------------

EventKind = Literal["finish", "interrupt", "boot", "arrive", "evaluate"]
# At one instant: jobs finish, instances die or boot, jobs arrive, then the controller looks.
_ORDER: dict[EventKind, int] = {"finish": 0, "interrupt": 1, "boot": 2, "arrive": 3, "evaluate": 4}


@dataclass(slots=True)
class _Job:
    seq: int
    queue: str
    priority: int
    duration: float
    arrived_at: float
    wait: float | None = None  # set at each start
    done: bool = False


@dataclass(slots=True)
class _Worker:
    worker_id: str
    queue: str
    started_at: float
    provider: ProviderName | None = None
    spot: bool = False
    price: float = 0.0
    status: Literal["starting", "active", "draining"] = "active"
    job: _Job | None = None
    last_job_at: float | None = None
    drain_started_at: float | None = None

    def state(self) -> WorkerState:
        return WorkerState(
            self.worker_id,
            self.queue,
            self.status,
            self.started_at,
            current_jobs=0 if self.job is None else 1,
            last_job_at=self.last_job_at,
            provider=self.provider,
            spot=self.spot,
            cost_per_hour_cents=self.price,
            drain_started_at=self.drain_started_at,
        )


@dataclass
class _World:
    """The mutable state of one run (see the module docstring for its rules)."""

    config: SchedulerConfig
    clouds: Mapping[ProviderName, Cloud]
    rng: random.Random
    now: float = 0.0
    events: list[tuple[float, int, int, EventKind, object]] = field(default_factory=list)
    serial: int = 0
    waiting: dict[str, dict[int, list[tuple[float, int, _Job]]]] = field(default_factory=dict)
    long_waiting: dict[str, int] = field(default_factory=dict)
    workers: dict[str, _Worker] = field(default_factory=dict)
    ledger: dict[str, cost.Interval] = field(default_factory=dict)
    jobs: list[_Job] = field(default_factory=list)
    history: History = field(default_factory=History)
    locked_at: float | None = None
    alerted_day: float | None = None
    launches: int = 0
    interruptions: int = 0
    hourly_breaches: int = 0
    timeline: list[FleetSample] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name, queue in self.config.queues.items():
            self.waiting[name] = {}
            self.long_waiting[name] = 0
            for i in range(queue.baseline_workers):
                worker = _Worker(f"vps-{name}-{i}", name, self.now)
                self.workers[worker.worker_id] = worker

    # events

    def push(self, at: float, kind: EventKind, payload: object) -> None:
        self.serial += 1
        heapq.heappush(self.events, (at, _ORDER[kind], self.serial, kind, payload))

    def enqueue(self, job: _Job) -> None:
        heap = self.waiting[job.queue].setdefault(job.priority, [])
        heapq.heappush(heap, (job.arrived_at, job.seq, job))
        if is_long(job.duration):
            self.long_waiting[job.queue] += 1

    def arrive(self, arrival: Arrival) -> None:
        if arrival.queue not in self.waiting:
            raise ValueError(f"trace queue {arrival.queue!r} is not in the config's queues")
        for _ in range(arrival.count):
            job = _Job(len(self.jobs), arrival.queue, arrival.priority, arrival.duration, self.now)
            self.jobs.append(job)
            self.enqueue(job)

    def next_job(self, queue: str) -> _Job | None:
        """The most urgent waiting job of ``queue`` (priority, then age), taken."""
        by_priority = self.waiting[queue]
        for priority in sorted(p for p, heap in by_priority.items() if heap):
            job = heapq.heappop(by_priority[priority])[2]
            if is_long(job.duration):
                self.long_waiting[queue] -= 1
            return job
        return None

    def dispatch(self) -> None:
        for worker in self.workers.values():
            if worker.status == "active" and worker.job is None:
                job = self.next_job(worker.queue)
                if job is not None:
                    job.wait = self.now - job.arrived_at
                    worker.job = job
                    self.push(self.now + job.duration, "finish", (worker.worker_id, job.seq))

    def finish(self, worker_id: str, seq: int) -> None:
        worker = self.workers.get(worker_id)
        if worker is None or worker.job is None or worker.job.seq != seq:
            return  # the worker is gone and its job went back to the queue
        worker.job.done = True
        worker.job = None
        worker.last_job_at = self.now

    def boot(self, worker_id: str) -> None:
        worker = self.workers.get(worker_id)
        if worker is not None and worker.status == "starting":
            worker.status = "active"

    def remove(self, worker_id: str) -> None:
        """Terminated or interrupted: gone, its job back in the queue, its meter stopped."""
        worker = self.workers.pop(worker_id)
        if worker.job is not None:
            self.enqueue(worker.job)
        interval = self.ledger.get(worker_id)
        if interval is not None:
            self.ledger[worker_id] = replace(interval, end=self.now)

    # decisions

    def launch(self, decision: Decision, prewarmed: bool = False) -> None:
        assert decision.queue is not None and decision.provider is not None
        cloud = self.clouds.get(decision.provider)
        if cloud is None:
            raise ValueError(f"no simulated cloud for provider {decision.provider!r}")
        price = cloud.price(decision.spot)
        for _ in range(decision.count):
            self.launches += 1
            worker = _Worker(
                f"sim-{self.launches:05d}",
                decision.queue,
                self.now,
                provider=decision.provider,
                spot=decision.spot,
                price=price,
                status="active" if prewarmed else "starting",
            )
            self.workers[worker.worker_id] = worker
            self.ledger[worker.worker_id] = cost.Interval(self.now, None, price)
            if not prewarmed:
                self.push(self.now + cloud.launch_delay_seconds, "boot", worker.worker_id)
            if decision.spot and cloud.interruptions_per_hour > 0:
                life = self.rng.expovariate(cloud.interruptions_per_hour / 3600.0)
                self.push(self.now + life, "interrupt", worker.worker_id)

    def apply(self, decision: Decision) -> None:
        """Carry out one decision, as the loop's fleet would."""
        if decision.action == "launch":
            self.launch(decision)
        elif decision.action == "drain" and decision.worker_id in self.workers:
            worker = self.workers[decision.worker_id]
            worker.status = "draining"
            worker.drain_started_at = self.now
        elif decision.action == "terminate" and decision.worker_id in self.workers:
            self.remove(decision.worker_id)
        elif decision.action == "lock" and self.locked_at is None:
            self.locked_at = self.now
        elif decision.action == "alert" and decision.queue is None:
            self.alerted_day = cost.day_start(self.now)

    # observation

    def queue_state(self, name: str) -> QueueState:
        heads = [
            (priority, len(heap), self.now - heap[0][0])
            for priority, heap in self.waiting[name].items()
            if heap
        ]
        return queue_state(name, heads, long_jobs=self.long_waiting[name])

    def spend(self) -> Spend:
        return cost.spend(
            self.ledger.values(),
            self.now,
            locked=self.locked_at is not None,
            alerted_today=self.alerted_day == cost.day_start(self.now),
        )

    def snapshot(self) -> Snapshot:
        return Snapshot(
            now=self.now,
            queues={name: self.queue_state(name) for name in self.config.queues},
            workers=tuple(w.state() for w in self.workers.values()),
            offers={p: c.offer() for p, c in self.clouds.items()},
            spend=self.spend(),
            history=self.history,
        )

    def sample(self, depth: int) -> None:
        vps = dict.fromkeys(self.config.queues, 0)
        cloud = dict.fromkeys(self.config.queues, 0)
        for w in self.workers.values():
            (cloud if w.provider is not None else vps)[w.queue] += 1
        self.timeline.append(FleetSample(self.now, vps, cloud, depth))

    def check_hour(self) -> None:
        last_hour = cost.spent_between(self.ledger.values(), self.now - 3600.0, self.now)
        if last_hour > self.config.cost_limits.max_hourly_spend_cents + EPSILON_CENTS:
            self.hourly_breaches += 1

    def busy(self) -> bool:
        """Jobs waiting or running."""
        return any(heap for q in self.waiting.values() for heap in q.values()) or any(
            w.job is not None for w in self.workers.values()
        )


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
    world = _World(config, clouds if clouds is not None else default_clouds(), random.Random(seed))
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


def _evaluate(world: _World, control: Controller, last_arrival: float, tail: float) -> bool:
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


def _report(world: _World, control: Controller) -> Report:
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


# -- output ----------------------------------------------------------------------------------


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def table(reports: Sequence[Report], title: str = "scheduler simulation") -> Table:
    """A rich table: one row per controller."""
    out = Table(title=title)
    for column in ("policy", "cloud cost", "launches", "peak cloud", "cap breaches h/d"):
        out.add_column(column, justify="left" if column == "policy" else "right")
    for band in BANDS:
        out.add_column(f"p{band} wait p50/p95/max", justify="right")
    out.add_column("jobs (unfinished)", justify="right")
    for r in reports:
        waits = [
            "-"
            if r.waits[b].jobs == 0
            else "/".join(_duration(v) for v in (r.waits[b].p50, r.waits[b].p95, r.waits[b].max))
            for b in BANDS
        ]
        locked = " (locked)" if r.locked_at is not None else ""
        out.add_row(
            r.controller + locked,
            cost.money(r.cloud_cost_cents),
            str(r.launches),
            str(r.peak_cloud()),
            f"{r.hourly_breaches}/{r.daily_breaches}",
            *waits,
            f"{r.jobs} ({r.unfinished})",
        )
    return out


def chart(reports: Sequence[Report], path: Path | str, title: str = "") -> bool:
    """Workers per queue (VPS + cloud) and queue depth over time, one panel per controller,
    as a PNG; False (and nothing written) when matplotlib is not installed."""
    try:
        import matplotlib  # type: ignore[import-not-found, unused-ignore]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return False
    fig, axes = plt.subplots(len(reports), 1, figsize=(11, 3.2 * len(reports)), squeeze=False)
    for ax, report in zip(axes[:, 0], reports, strict=True):
        hours = [s.at / 3600 for s in report.timeline]
        queues = list(report.timeline[0].vps) if report.timeline else []
        for queue in queues:
            counts = [s.vps[queue] + s.cloud[queue] for s in report.timeline]
            if any(counts):
                ax.step(hours, counts, where="post", label=f"{queue} (VPS+cloud)")
        ax.set_ylabel("workers")
        ax.set_title(f"{report.controller}: {cost.money(report.cloud_cost_cents)}")
        depth_axis = ax.twinx()
        depth_axis.plot(hours, [s.depth for s in report.timeline], color="grey", alpha=0.4)
        depth_axis.set_ylabel("jobs waiting", color="grey")
        ax.legend(loc="upper left", fontsize="small")
    axes[-1, 0].set_xlabel("hours")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(str(path), dpi=100)
    plt.close(fig)
    return True


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
