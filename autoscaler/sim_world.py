"""The scheduler simulator's world: the arrivals, the simulated clouds and the cluster
they run on, on a virtual clock (:mod:`autoscaler.simulate` runs it).

Trace
    A CSV file with the header ``at_seconds,queue,priority,duration_seconds[,count]``:
    ``count`` jobs (default 1) of ``queue`` arrive at ``at_seconds`` (virtual seconds
    from 0), each with a priority (1 most urgent .. 10) and a running time.
    :mod:`autoscaler.traces` writes the shipped ones (``etc/traces/``).

World
    Each queue has its VPS workers from the start (free): the head's pools
    (:func:`autoscaler.placement.vps_pools`: its baseline, in ``cloud_first`` at most one
    of a cloud-enabled queue, whose policy keeps the rest on the cloud). A cloud
    instance is launched by a decision, costs its price per hour from its launch (the
    same :class:`~autoscaler.cost.Interval` ledger as the loop's; a spot instance the
    market's), takes jobs after its provider's launch delay, and is gone at
    ``terminate`` (its interval closed). The cost guard counts each instance as the
    node provider books it (:func:`autoscaler.policy.at_most`: a spot one at the most
    it may bill), running and in the spend, as in the loop; the report's costs are
    what the clouds bill. A spot instance may be interrupted (a Poisson process per
    instance, ``interruptions_per_hour``, seeded): it disappears and its job goes back
    to the queue. Every worker runs one job at a time and takes the most urgent job
    first (priority, then age). A job's wait is the time from its arrival to its last
    start (an interrupted job waits again); a job still waiting at the end counts with
    its wait so far (``unfinished`` says how many).
"""

from __future__ import annotations

import csv
import heapq
import math
import random
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from autoscaler import cost, policy
from autoscaler.placement import vps_pools
from autoscaler.sim_report import FleetSample
from autoscaler.snapshot import (
    RATE_WINDOW_SECONDS,
    Band,
    Decision,
    History,
    Offer,
    QueueState,
    Snapshot,
    Spend,
    WorkerState,
    is_long,
    queue_state,
)

if TYPE_CHECKING:
    from autoscaler.config import ProviderName, SchedulerConfig

TRACE_COLUMNS = ("at_seconds", "queue", "priority", "duration_seconds")
EPSILON_CENTS = 1e-6
RUN_MEMORY = 100  # finished jobs per queue the mean running time is taken over


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
    """The arrivals of a trace CSV, in time order; ValueError naming the line if bad.

    Read as spreadsheets and exports write them: any line ends (LF, CRLF, CR), a UTF-8
    byte-order mark, ``#`` comment lines (before the header too), blank lines and rows
    of empty cells (``,,,``) skipped, spaces around cells ignored."""
    text = Path(path).read_text(encoding="utf-8-sig")
    lines = [
        (n, line)
        for n, line in enumerate(text.splitlines(), start=1)
        if line.strip() and not line.lstrip().startswith("#")
    ]
    rows = csv.reader([line for _, line in lines])
    header = tuple(cell.strip() for cell in next(rows, []))
    if header[:4] != TRACE_COLUMNS or header[4:] not in ((), ("count",)):
        raise ValueError(
            f"{path}: header must be {','.join(TRACE_COLUMNS)}[,count], not {','.join(header)}"
        )
    arrivals = []
    for (n, _), cells in zip(lines[1:], rows, strict=True):
        values = [cell.strip() for cell in cells]
        if not any(values):
            continue
        if len(values) > len(header):
            raise ValueError(f"{path}:{n}: {len(values)} cells, the header has {len(header)}")
        arrivals.append(_arrival(dict(zip(header, values, strict=False)), f"{path}:{n}"))
    return sorted(arrivals, key=lambda a: a.at)


def _arrival(row: Mapping[str, str], where: str) -> Arrival:
    for column in TRACE_COLUMNS:
        if not row.get(column):
            raise ValueError(f"{where}: {column} is empty")
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
    """One simulated provider: prices in cents per instance-hour, boot time, spot risk,
    and its billing: in steps of ``billing_step_seconds`` with at least
    ``min_billed_seconds`` per instance (AWS and Google: per second, 60 s minimum)."""

    provider: ProviderName
    on_demand_cents_per_hour: float
    spot_cents_per_hour: float | None = None  # None: no spot market
    launch_delay_seconds: float = 90.0
    interruptions_per_hour: float = 0.0  # per spot instance
    min_billed_seconds: float = 60.0
    billing_step_seconds: float = 1.0

    def billed_seconds(self, ran: float) -> float:
        """What an instance that ran ``ran`` seconds is billed for."""
        steps = math.ceil(max(ran, 0.0) / self.billing_step_seconds - 1e-9)
        return max(self.min_billed_seconds, steps * self.billing_step_seconds)

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
    an IONOS cube), boot times (billed: an instance is paid from its launch, takes work
    after its boot), per-second billing with a minute's minimum, and a spot
    interruption every 20 instance-hours."""
    return {
        "aws": Cloud("aws", 17.0, 4.0, 90.0, 0.05),
        "google": Cloud("google", 21.0, 5.0, 60.0, 0.05),
        # IONOS bills by the minute (assumed here: a minute's step, a minute's minimum).
        "ionos": Cloud("ionos", 15.0, None, 120.0, 0.0, billing_step_seconds=60.0),
    }


# -- the cluster -----------------------------------------------------------------------------

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
    price: float = 0.0  # what its cloud bills an hour (a spot instance: the market's)
    booked: float = 0.0  # what the node provider books it at, the caps count (at_most)
    status: Literal["starting", "active", "draining"] = "active"
    job: _Job | None = None
    last_job_at: float | None = None
    drain_started_at: float | None = None
    prewarmed: bool = False

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
            cost_per_hour_cents=self.booked,
            drain_started_at=self.drain_started_at,
        )


@dataclass
class World:
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
    ledger: dict[str, cost.Interval] = field(default_factory=dict)  # what the clouds bill
    # The same instances at what the node provider books them at: what the loop's ledger
    # (cloud_spend) holds and the cost guard counts.
    booked: dict[str, cost.Interval] = field(default_factory=dict)
    jobs: list[_Job] = field(default_factory=list)
    history: History = field(default_factory=History)
    locked_at: float | None = None
    alerted_day: float | None = None
    launches: int = 0
    interruptions: int = 0
    hourly_breaches: int = 0
    timeline: list[FleetSample] = field(default_factory=list)
    # churn: seconds billed while booting, and what booting and minimum billing cost
    boot_billed_seconds: float = 0.0
    churn_cents: float = 0.0
    cap_holds: int = 0  # evaluations where the cost caps held a launch
    # the load the policy estimates from: recent arrivals, recent finished run times
    arrived: dict[str, deque[tuple[float, int]]] = field(default_factory=dict)
    ran: dict[str, deque[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        vps = vps_pools(self.config)
        for name in self.config.queues:
            self.waiting[name] = {}
            self.long_waiting[name] = 0
            self.arrived[name] = deque()
            self.ran[name] = deque(maxlen=RUN_MEMORY)
            for i in range(vps[name]):
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
        self.arrived[arrival.queue].append((self.now, arrival.count))
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
        self.ran[worker.queue].append(worker.job.duration)
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
            closed = self.ledger[worker_id] = self.close(worker, interval)
            self.booked[worker_id] = replace(self.booked[worker_id], end=closed.end)

    def close(self, worker: _Worker, interval: cost.Interval) -> cost.Interval:
        """Its meter stopped now, as its provider bills it (the minimum, the steps), and
        its churn counted: the boot it was paid for and the billing's top-up."""
        assert worker.provider is not None
        cloud = self.clouds[worker.provider]
        ran = self.now - interval.start
        billed = cloud.billed_seconds(ran)
        booting = min(ran, cloud.launch_delay_seconds) if not worker.prewarmed else 0.0
        self.boot_billed_seconds += booting
        self.churn_cents += worker.price * (booting + billed - ran) / cost.HOUR_SECONDS
        return replace(interval, end=interval.start + billed)

    # decisions

    def launch(self, decision: Decision, prewarmed: bool = False) -> None:
        assert decision.queue is not None and decision.provider is not None
        cloud = self.clouds.get(decision.provider)
        if cloud is None:
            raise ValueError(f"no simulated cloud for provider {decision.provider!r}")
        price = cloud.price(decision.spot)
        # Booked as the node provider books it, and so counted against the caps: a spot
        # instance at the most it may bill; it bills the market's price.
        option = policy.Option(decision.provider, decision.spot, price)
        booked = policy.at_most(self.config, option, cloud.on_demand_cents_per_hour)
        for _ in range(decision.count):
            self.launches += 1
            worker = _Worker(
                f"sim-{self.launches:05d}",
                decision.queue,
                self.now,
                provider=decision.provider,
                spot=decision.spot,
                price=price,
                booked=booked.cents_per_hour,
                status="active" if prewarmed else "starting",
                prewarmed=prewarmed,
            )
            self.workers[worker.worker_id] = worker
            self.ledger[worker.worker_id] = cost.Interval(self.now, None, price)
            self.booked[worker.worker_id] = cost.Interval(self.now, None, booked.cents_per_hour)
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
        arrived = self.arrived[name]
        while arrived and arrived[0][0] <= self.now - RATE_WINDOW_SECONDS:
            arrived.popleft()
        ran = self.ran[name]
        return queue_state(
            name,
            heads,
            long_jobs=self.long_waiting[name],
            arrivals_per_hour=sum(n for _, n in arrived) * 3600.0 / RATE_WINDOW_SECONDS,
            mean_run_seconds=sum(ran) / len(ran) if ran else None,
        )

    def spend(self) -> Spend:
        """The spend the cost guard sees: the instances at what the provider booked them
        at (as the loop's ledger; what they are billed is :attr:`ledger`)."""
        return cost.spend(
            self.booked.values(),
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

    def sample(self, snapshot: Snapshot) -> None:
        vps = dict.fromkeys(self.config.queues, 0)
        cloud = dict.fromkeys(self.config.queues, 0)
        for w in self.workers.values():
            (cloud if w.provider is not None else vps)[w.queue] += 1
        billed = cost.spend(self.ledger.values(), self.now)
        oldest: dict[Band, float] = {}
        for state in snapshot.queues.values():
            for band, age in state.oldest_by_band.items():
                oldest[band] = max(oldest.get(band, 0.0), age)
        self.timeline.append(
            FleetSample(
                self.now,
                vps,
                cloud,
                sum(q.depth for q in snapshot.queues.values()),
                depth_by_queue={name: q.depth for name, q in snapshot.queues.items()},
                oldest_by_band=oldest,
                # what the clouds bill (the guard's snapshot counts the bookings)
                hour_cents=billed.last_hour_cents,
                today_cents=billed.today_cents,
            )
        )

    def check_hour(self) -> None:
        last_hour = cost.spent_between(self.ledger.values(), self.now - 3600.0, self.now)
        if last_hour > self.config.cost_limits.max_hourly_spend_cents + EPSILON_CENTS:
            self.hourly_breaches += 1

    def busy(self) -> bool:
        """Jobs waiting or running."""
        return any(heap for q in self.waiting.values() for heap in q.values()) or any(
            w.job is not None for w in self.workers.values()
        )
