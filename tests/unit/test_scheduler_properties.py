"""Property tests: any sequence of events through the real policy and cost guard.

A tiny in-test world applies the decisions (launch adds an instance that starts at
the next evaluation, drain marks it draining, terminate removes it and closes its
ledger interval) and evaluates every ``evaluation_interval_seconds``, as the loop does.
Whatever arrives, finishes, crashes or costs, these hold:

- a queue never has more workers than ``max_workers``, a provider never more
  instances than ``max_instances``;
- the spend (computed with :mod:`autoscaler.cost` from the applied instances) never
  passes the hourly cap in any rolling hour, nor the daily cap on any day;
- nothing is launched in ``vps_only`` or while locked;
- every terminated worker was draining before.

The snapshots carry the queues' load (the arrival rate over the last 30 minutes, the
run time of their jobs) or not, drawn: the estimates that size scale-ups and keep
workers alive work within the same limits.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field, replace
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from autoscaler import config as scheduler_config
from autoscaler import cost, policy
from autoscaler.config import PROVIDERS, ProviderName, SchedulerConfig
from autoscaler.placement import vps_pools
from autoscaler.snapshot import (
    BANDS,
    Band,
    Decision,
    History,
    Offer,
    QueueState,
    Snapshot,
    WorkerState,
    next_history,
)
from autoscaler.snapshot import RATE_WINDOW_SECONDS as RATE_WINDOW

START = 1_800_000_000.0 - 1_800_000_000.0 % 86_400 + 20 * 3600  # 20:00 UTC: days turn
SHIPPED = json.loads(scheduler_config.SHIPPED.read_text())
QUEUES = ("ocr", "bulk", "images")
EPSILON = 1e-6


def build_config(
    mode: str, interval: int, hourly: int, daily: int, aws_max: int, google_max: int
) -> SchedulerConfig:
    data: dict[str, Any] = copy.deepcopy(SHIPPED)
    data["mode"] = mode
    data["evaluation_interval_seconds"] = interval
    data["cloud_providers"]["aws"].update(
        enabled=True, ami_id="ami-0123456789abcdef0", max_instances=aws_max
    )
    data["cloud_providers"]["google"].update(
        enabled=google_max > 0, image="projects/p/global/images/w", max_instances=google_max
    )
    # ocr: in cloud_first one baseline worker on the VPS, one on the cloud
    data["queues"]["ocr"].update(baseline_workers=2, max_workers=4, cloud_enabled=True)
    data["queues"]["bulk"].update(max_workers=3, cloud_enabled=True)
    data["cost_limits"] = {
        "max_hourly_spend_cents": hourly,
        "max_daily_spend_cents": daily,
        "alert_threshold_cents": daily // 2,
    }
    return scheduler_config.parse(data)


configs = st.builds(
    build_config,
    # repeated values weigh the draw: zero caps and vps_only now and then
    mode=st.sampled_from(["vps_only", "hybrid", "hybrid", "cloud_first", "cloud_first"]),
    interval=st.sampled_from([60, 300]),
    hourly=st.sampled_from([0, 40, 150, 150, 500, 500, 2000]),
    daily=st.sampled_from([0, 100, 400, 400, 2000, 2000, 10_000]),
    aws_max=st.integers(1, 3),
    google_max=st.integers(0, 2),
)


# -- events ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arrive:
    queue: str
    band: Band
    count: int
    job_seconds: float = 120.0  # how long each of the queue's jobs takes from now on


@dataclass(frozen=True)
class Finish:
    index: int  # of the workers with jobs, in id order
    every: bool = False  # every busy worker finishes


@dataclass(frozen=True)
class Crash:
    index: int  # of the cloud instances, in id order (a spot interruption)


@dataclass(frozen=True)
class Price:
    provider: ProviderName
    on_demand: float
    spot: float | None


@dataclass(frozen=True)
class Mode:
    mode: str  # the operator edits scheduler.json


@dataclass(frozen=True)
class Tick:
    evaluations: int


arrivals = st.builds(Arrive, st.sampled_from(QUEUES), st.sampled_from(BANDS), st.integers(1, 150))
ticks = st.builds(Tick, st.integers(1, 30))
events = st.lists(
    st.one_of(
        arrivals,
        ticks,
        arrivals,
        ticks,
        st.builds(Finish, st.integers(0, 20), st.booleans()),
        st.builds(Mode, st.sampled_from(["vps_only", "hybrid", "cloud_first"])),
        st.builds(Crash, st.integers(0, 20)),
        st.builds(
            Price,
            st.sampled_from(PROVIDERS[:2]),
            st.floats(1.0, 200.0),
            st.none() | st.floats(0.5, 60.0),
        ),
    ),
    min_size=4,
    max_size=40,
)


# -- the world -------------------------------------------------------------------------------


@dataclass
class World:
    config: SchedulerConfig
    now: float = START
    waiting: dict[str, dict[Band, int]] = field(default_factory=dict)
    oldest_at: dict[str, float] = field(default_factory=dict)
    workers: dict[str, WorkerState] = field(default_factory=dict)
    ledger: dict[str, cost.Interval] = field(default_factory=dict)
    offers: dict[ProviderName, Offer] = field(
        default_factory=lambda: {
            "aws": Offer("aws", 60.0, 4.5),
            "google": Offer("google", 80.0, 30.0),
        }
    )
    history: History = field(default_factory=History)
    locked: bool = False
    locked_at: float | None = None
    mode_since: float = START
    alerted_day: float | None = None
    serial: int = 0
    ever_drained: set[str] = field(default_factory=set)
    job_seconds: dict[str, float] = field(default_factory=dict)
    busy_until: dict[str, float] = field(default_factory=dict)
    days: set[float] = field(default_factory=set)
    # Whether the snapshots carry each queue's load (arrival rate, mean run time): the
    # policy's estimates size scale-ups and keep workers, within the same limits.
    estimates: bool = True
    arrived: dict[str, list[tuple[float, int]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.mode_since = self.now
        self.waiting = {q: {} for q in self.config.queues}
        # the VPS: the head's pools (the baseline in vps_only and hybrid; in cloud_first
        # one worker of a cloud-enabled queue), fixed from the start as the head's are
        for name, count in vps_pools(self.config).items():
            for i in range(count):
                worker = WorkerState(f"vps-{name}-{i}", name, "active", self.now)
                self.workers[worker.worker_id] = worker

    # observation

    def snapshot(self) -> Snapshot:
        queues = {}
        for name in self.config.queues:
            bands = {b: n for b, n in self.waiting[name].items() if n > 0}
            depth = sum(bands.values())
            age = self.now - self.oldest_at[name] if depth else 0.0
            recent = [n for at, n in self.arrived.get(name, []) if at > self.now - RATE_WINDOW]
            queues[name] = QueueState(
                name,
                depth,
                age,
                depth_by_band=bands,
                arrivals_per_hour=sum(recent) * 3600 / RATE_WINDOW if self.estimates else None,
                mean_run_seconds=self.job_seconds.get(name) if self.estimates else None,
            )
        return Snapshot(
            now=self.now,
            queues=queues,
            workers=tuple(self.workers[k] for k in sorted(self.workers)),
            offers=dict(self.offers),
            spend=cost.spend(
                self.ledger.values(),
                self.now,
                locked=self.locked,
                alerted_today=self.alerted_day == cost.day_start(self.now),
            ),
            history=self.history,
        )

    # events

    def arrive(self, event: Arrive) -> None:
        bands = self.waiting[event.queue]
        if not sum(bands.values()):
            self.oldest_at[event.queue] = self.now
        bands[event.band] = bands.get(event.band, 0) + event.count
        self.job_seconds[event.queue] = event.job_seconds
        self.arrived.setdefault(event.queue, []).append((self.now, event.count))

    def finish(self, event: Finish) -> None:
        busy = sorted(k for k, w in self.workers.items() if w.current_jobs)
        if busy:
            for key in busy if event.every else [busy[event.index % len(busy)]]:
                self.workers[key] = replace(self.workers[key], current_jobs=0, last_job_at=self.now)

    def crash(self, event: Crash) -> None:
        instances = sorted(k for k, w in self.workers.items() if w.cloud)
        if instances:
            self._remove(instances[event.index % len(instances)])

    def mode(self, event: Mode) -> None:
        self.config = self.config.model_copy(update={"mode": event.mode})
        self.mode_since = self.now

    def price(self, event: Price) -> None:
        self.offers[event.provider] = Offer(event.provider, event.on_demand, event.spot)

    @property
    def interval(self) -> int:
        return self.config.evaluation_interval_seconds

    def tick(self) -> None:
        previous = self.now
        self.now += self.config.evaluation_interval_seconds
        for key, worker in list(self.workers.items()):
            if worker.status == "starting":
                self.workers[key] = replace(worker, status="active")
        self._claim()
        snapshot = self.snapshot()
        decisions = policy.decide(self.config, snapshot)
        check_decisions(self.config, snapshot, decisions)
        for decision in decisions:
            self.apply(decision, snapshot)
        self.history = next_history(snapshot, decisions)
        self.check(previous)

    # applying decisions

    def apply(self, decision: Decision, snapshot: Snapshot) -> None:
        if decision.action == "launch":
            assert decision.queue is not None and decision.provider is not None
            assert decision.provider in self.config.burst_providers(decision.queue)
            assert decision.count >= 1
            offer = snapshot.offers[decision.provider]
            price = offer.spot_cents_per_hour if decision.spot else offer.on_demand_cents_per_hour
            assert price is not None
            # booked as the node provider books it, which the caps count: a spot
            # instance at the most it may bill
            option = policy.Option(decision.provider, decision.spot, price)
            price = policy.at_most(
                self.config, option, offer.on_demand_cents_per_hour
            ).cents_per_hour
            for _ in range(decision.count):
                self.serial += 1
                worker = WorkerState(
                    f"c-{self.serial:04d}",
                    decision.queue,
                    "starting",
                    self.now,
                    provider=decision.provider,
                    spot=decision.spot,
                    cost_per_hour_cents=price,
                )
                self.workers[worker.worker_id] = worker
                self.ledger[worker.worker_id] = cost.Interval.of(worker)
        elif decision.action == "drain":
            assert decision.worker_id is not None
            worker = self.workers[decision.worker_id]
            assert worker.cloud and worker.status in ("starting", "active")
            self.workers[worker.worker_id] = replace(
                worker, status="draining", drain_started_at=self.now
            )
            self.ever_drained.add(worker.worker_id)
        elif decision.action == "terminate":
            assert decision.worker_id is not None
            worker = self.workers[decision.worker_id]
            assert worker.status == "draining", f"{worker.worker_id} terminated undrained"
            assert worker.worker_id in self.ever_drained
            self._remove(worker.worker_id)
        elif decision.action == "lock":
            assert not self.locked
            self.locked, self.locked_at = True, self.now
        elif decision.action == "alert" and decision.queue is None:
            assert self.alerted_day != cost.day_start(self.now)
            self.alerted_day = cost.day_start(self.now)

    def _remove(self, key: str) -> None:
        worker = self.workers.pop(key)
        if worker.current_jobs:  # force-killed or interrupted: back to the queue
            self.arrive(Arrive(worker.queue, "4-6", worker.current_jobs))
        self.ledger[key] = cost.Interval(worker.started_at, self.now, worker.cost_per_hour_cents)

    def _claim(self) -> None:
        """Workers finish what they had and take the next batch: as many jobs as fit in
        an evaluation interval (at least one), busy until the batch is done."""
        interval = self.config.evaluation_interval_seconds
        for key in sorted(self.workers):
            worker = self.workers[key]
            done = self.busy_until.get(key, self.now)
            if worker.current_jobs and done <= self.now:
                worker = replace(worker, current_jobs=0, last_job_at=done)
            bands = self.waiting[worker.queue]
            waiting = sum(bands.values())
            if worker.status == "active" and not worker.current_jobs and waiting:
                seconds = self.job_seconds.get(worker.queue, 120.0)
                batch = min(waiting, max(1, int(interval // seconds)))
                for _ in range(batch):
                    band = next(b for b in BANDS if bands.get(b, 0) > 0)
                    bands[band] -= 1
                worker = replace(worker, current_jobs=1)
                self.busy_until[key] = self.now + batch * seconds
                if sum(bands.values()):
                    self.oldest_at[worker.queue] += batch * seconds  # the rest are younger
            self.workers[key] = worker

    # invariants after every evaluation

    def check(self, previous: float) -> None:
        config, now = self.config, self.now
        for name, queue in config.queues.items():
            count = sum(1 for w in self.workers.values() if w.queue == name)
            assert count <= max(queue.max_workers, queue.baseline_workers), (name, count)
        for provider in PROVIDERS:
            count = sum(1 for w in self.workers.values() if w.provider == provider)
            assert count <= config.cloud_providers.get(provider).max_instances, (provider, count)
        limits = config.cost_limits
        runs = list(self.ledger.values())
        last_hour = cost.spent_between(runs, now - 3600, now)
        assert last_hour <= limits.max_hourly_spend_cents + EPSILON, last_hour
        rate = cost.running_rate(self.workers.values())
        assert rate <= limits.max_hourly_spend_cents + EPSILON, rate
        cloud = [w for w in self.workers.values() if w.cloud]
        # the drain timeout, and the evaluation that sees it
        stopped = config.scaling_rules.scale_down.drain_timeout_seconds + self.interval
        if config.mode == "vps_only" and now - self.mode_since >= stopped:
            assert not cloud, "vps_only left cloud workers running past the drain timeout"
        if self.locked_at is not None and now - self.locked_at >= stopped:
            assert not cloud, "the lock left cloud workers running past the drain timeout"
        for day in {cost.day_start(previous), cost.day_start(now)}:
            spent = cost.spent_between(runs, day, min(now, day + 86_400))
            assert spent <= limits.max_daily_spend_cents + EPSILON, (day, spent)


def check_decisions(config: SchedulerConfig, snapshot: Snapshot, decisions: list[Decision]) -> None:
    if config.mode == "vps_only" or snapshot.spend.locked:
        assert not [d for d in decisions if d.action == "launch"], decisions
    for decision in decisions:
        assert decision.reason
    terminated = [d.worker_id for d in decisions if d.action == "terminate"]
    drained = [d.worker_id for d in decisions if d.action == "drain"]
    assert not set(terminated) & set(drained)  # never drained and killed in one turn
    assert len(set(terminated)) == len(terminated) and len(set(drained)) == len(drained)


def run(config: SchedulerConfig, script: list[Any], estimates: bool = True) -> World:
    world = World(config, estimates=estimates)
    for event in [*script, Tick(12)]:  # and an hour of evaluations after the last event
        if isinstance(event, Tick):
            for _ in range(event.evaluations):
                world.tick()
        elif isinstance(event, Arrive):
            world.arrive(event)
        elif isinstance(event, Finish):
            world.finish(event)
        elif isinstance(event, Crash):
            world.crash(event)
        elif isinstance(event, Mode):
            world.mode(event)
        else:
            world.price(event)
    return world


PROPERTY = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(config=configs, script=events, estimates=st.booleans())
# Drained mid-job by a switch to vps_only and back: the draining instances still count
# against max_workers while the flood asks for more.
@example(
    config=build_config("hybrid", 60, 2000, 10_000, 3, 2),
    script=[
        Arrive("ocr", "7-10", 150, 3600.0),
        Tick(2),
        Mode("vps_only"),
        Tick(1),
        Mode("hybrid"),
        Tick(2),
    ],
    estimates=True,
)
# Switched to vps_only mid-job: the drain's 5 minutes end in a forced termination.
@example(
    config=build_config("hybrid", 60, 2000, 10_000, 3, 2),
    script=[Arrive("ocr", "4-6", 150, 3600.0), Tick(2), Mode("vps_only"), Tick(8)],
    estimates=False,
)
def test_no_event_sequence_breaks_the_limits(config, script, estimates):
    run(config, script, estimates)


@settings(max_examples=80, deadline=None)
@given(
    hourly=st.sampled_from([150, 500]),
    daily=st.sampled_from([100, 400, 2000]),
    price=st.floats(5.0, 120.0),
    hours=st.integers(6, 30),
)
def test_a_flood_that_never_ends_stays_within_the_caps(hourly, daily, price, hours):
    """The runaway trace: work keeps coming, every instance is busy, prices move."""
    config = build_config("hybrid", 300, hourly, daily, 3, 2)
    world = World(config)
    world.offers = {"aws": Offer("aws", price, price / 4), "google": Offer("google", price, None)}
    for _ in range(hours * 12):
        world.arrive(Arrive("ocr", "7-10", 200))
        world.arrive(Arrive("bulk", "1-3", 200))
        world.tick()
    assert world.serial or price > 100  # it did burst when a launch fit the caps


def test_a_flood_in_hybrid_mode_bursts_then_locks_at_the_daily_cap():
    config = build_config("hybrid", 60, 500, 2000, 3, 2)
    morning = START - 20 * 3600 + 3600  # 01:00 UTC: the day has room for the whole story
    world = World(config, now=morning)
    world.offers = {"aws": Offer("aws", 150.0, None), "google": Offer("google", 160.0, None)}
    launched_at = None
    for _ in range(60 * 12):
        world.arrive(Arrive("ocr", "4-6", 50))
        world.tick()
        if launched_at is None and any(w.cloud for w in world.workers.values()):
            launched_at = world.now
        if world.locked and not any(w.cloud for w in world.workers.values()):
            break
    assert launched_at == morning + 60  # the first evaluation bursts: 3 on aws, $4.50/h
    assert world.locked
    assert not any(w.cloud for w in world.workers.values())
    spent = cost.spent_between(world.ledger.values(), cost.day_start(world.now), world.now)
    assert 1900 < spent <= 2000  # stopped close to the cap, never over it
