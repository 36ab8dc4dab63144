"""What the scheduler sees and what it decides: plain values, no I/O.

The loop (:mod:`autoscaler.scheduler`) observes Redis, the database and the clouds and
builds a :class:`Snapshot`; the pure policy (:mod:`autoscaler.policy`, with the cost
guard of :mod:`autoscaler.cost`) turns it into :class:`Decision` values, each with a
reason a person can read; the loop applies them and records them. The simulator
(:mod:`autoscaler.simulate`) builds snapshots from a virtual clock instead.

Times are seconds on one clock (``Snapshot.now``; wall-clock epoch seconds in the
loop, virtual seconds in the simulator). Money is in cents (floats: a spot price is
a fraction of a cent per second).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

from autoscaler.placement import vps_pools

# Priority bands of the seed's routing table: one copy, in the core (the metrics and the
# alerts label by them too), re-exported here for the policy and the simulator.
from hypermedia.jobs.priority import BANDS as BANDS
from hypermedia.jobs.priority import Band as Band
from hypermedia.jobs.priority import band_of as band_of

if TYPE_CHECKING:  # an annotation only: the policy runs without loading pydantic
    from autoscaler.config import ProviderName, SchedulerConfig


# The seed's routing table: "Long transcode (> 30 min): spot with checkpointing".
LONG_JOB_SECONDS = 1800.0


def expected_run_seconds(stated_seconds: float | None, wall_clock_seconds: float) -> float | None:
    """How long a job is expected to run, from what is known before it runs: the length
    its input states (a transcode works through it at about real time), never more than
    its profile's wall clock lets it run. None: its input states no length.

    The simulator knows each job's duration instead (its trace states it)."""
    if stated_seconds is None:
        return None
    return min(stated_seconds, wall_clock_seconds)


def is_long(expected_seconds: float | None) -> bool:
    """Whether a job counts in :attr:`QueueState.long_jobs` (spot with checkpoints)."""
    return expected_seconds is not None and expected_seconds > LONG_JOB_SECONDS


@dataclass(frozen=True, slots=True)
class QueueState:
    """One queue now: jobs ready to run (not running, not delayed retries)."""

    name: str
    depth: int
    oldest_age_seconds: float = 0.0  # of the oldest ready job; 0 when empty
    depth_by_band: Mapping[Band, int] = field(default_factory=dict)
    oldest_by_band: Mapping[Band, float] = field(default_factory=dict)
    # Ready jobs expected to run over LONG_JOB_SECONDS (long transcodes: spot with
    # checkpoints); see is_long.
    long_jobs: int = 0
    # The queue's recent load, where known (None: unknown; the policy then sizes from the
    # depth alone): jobs that arrived in the last RATE_WINDOW_SECONDS, as a rate per hour,
    # and the mean running time of its recent finished jobs (autoscaler.estimate).
    arrivals_per_hour: float | None = None
    mean_run_seconds: float | None = None


# The window the arrival rate is measured over (the loop and the simulator alike): half
# an hour, long enough that a queue of long, sparse jobs (transcodes every 10 minutes) is
# not read as idle between two of them (15 minutes flapped such a queue's workers).
RATE_WINDOW_SECONDS = 1800.0


def queue_state(
    name: str,
    heads: Iterable[tuple[int, int, float]],
    long_jobs: int = 0,
    arrivals_per_hour: float | None = None,
    mean_run_seconds: float | None = None,
) -> QueueState:
    """A queue from its ready jobs per priority: ``(priority, count, oldest age)``."""
    depth_by_band: dict[Band, int] = {}
    oldest_by_band: dict[Band, float] = {}
    for priority, count, age in heads:
        band = band_of(priority)
        depth_by_band[band] = depth_by_band.get(band, 0) + count
        oldest_by_band[band] = max(oldest_by_band.get(band, 0.0), age)
    return QueueState(
        name=name,
        depth=sum(depth_by_band.values()),
        oldest_age_seconds=max(oldest_by_band.values(), default=0.0),
        depth_by_band={b: depth_by_band[b] for b in BANDS if b in depth_by_band},
        oldest_by_band={b: oldest_by_band[b] for b in BANDS if b in oldest_by_band},
        long_jobs=long_jobs,
        arrivals_per_hour=arrivals_per_hour,
        mean_run_seconds=mean_run_seconds,
    )


WorkerStatus = Literal["starting", "active", "draining", "terminated"]


@dataclass(frozen=True, slots=True)
class WorkerState:
    """One worker (a pipeline actor's node): on the VPS, or a cloud instance."""

    worker_id: str
    queue: str
    status: WorkerStatus
    started_at: float
    current_jobs: int = 0
    last_job_at: float | None = None  # the last job it finished (None: none yet)
    provider: ProviderName | None = None  # None: the VPS
    spot: bool = False
    # What the node provider booked it at, which the caps count: a spot instance at the
    # most it may bill (autoscaler.policy.at_most); it bills the market price.
    cost_per_hour_cents: float = 0.0
    drain_started_at: float | None = None
    # The Ray node it runs on (hex id): an actor's node, or a cloud worker's Ray node once
    # it has joined. The loop uses it to count an actor on a burst node with its node.
    node_id: str | None = None
    # Claiming no job since (the disk guard, ``worker_min_free_disk_mb``: the workers
    # row's claims_paused_since; a cloud node's when all its actors are paused, since the
    # last of them paused) and why; None: it claims.
    claims_paused_since: float | None = None
    claims_paused_reason: str | None = None

    @property
    def cloud(self) -> bool:
        return self.provider is not None

    def idle_since(self) -> float:
        """When it last had nothing to do: its last job, or its start."""
        return self.last_job_at if self.last_job_at is not None else self.started_at


@dataclass(frozen=True, slots=True)
class Offer:
    """What one enabled provider would charge now, per instance-hour, in cents."""

    provider: ProviderName
    on_demand_cents_per_hour: float
    spot_cents_per_hour: float | None = None  # None: no spot market / not allowed
    launch_delay_seconds: float = 0.0  # informational (the simulator's boot time)


@dataclass(frozen=True, slots=True)
class Spend:
    """Cloud spend from our own ledger (cost_per_hour x running time per worker)."""

    last_hour_cents: float
    today_cents: float  # since midnight UTC (the loop's clock), or the simulator's day
    locked: bool = False  # the daily cap locked the mode to vps_only until a reset
    alerted_today: bool = False


@dataclass(frozen=True, slots=True)
class History:
    """What the scheduler did before, as far as the rules need it."""

    last_scale_up: Mapping[str, float] = field(default_factory=dict)  # by queue
    last_scale_down: Mapping[str, float] = field(default_factory=dict)  # by queue
    launches: tuple[float, ...] = ()  # times of recent launches (the launch-rate cap)
    empty_since: Mapping[str, float] = field(default_factory=dict)  # queue depth 0 since
    # The last flood alert per queue (an ``alert`` decision with a queue); paces repeats.
    last_alert: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ManualBurst:
    """An operator's burst (the seed's stage 2, "manual cloud burst"): keep ``workers``
    cloud workers for the queue until ``until`` (epoch seconds), whatever its depth;
    the caps, ``max_workers`` and the mode still apply. ``hypermedia scheduler burst``."""

    workers: int
    until: float
    by: str = ""  # who asked (the operator's name, for the reasons)


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: float
    queues: Mapping[str, QueueState]
    workers: tuple[WorkerState, ...]
    offers: Mapping[ProviderName, Offer]
    spend: Spend
    history: History = History()
    # Operators' bursts by queue (those whose time has passed are ignored).
    bursts: Mapping[str, ManualBurst] = field(default_factory=dict)


Action = Literal["launch", "drain", "terminate", "alert", "lock", "hold"]


@dataclass(frozen=True, slots=True)
class Decision:
    """One thing to do, and why. ``launch``: ``count`` instances for ``queue`` on
    ``provider`` (``spot`` or on-demand); ``drain``/``terminate``: ``worker_id``;
    ``alert``: tell the operator; ``lock``: the daily cap was reached (vps_only until a
    reset); ``hold``: nothing done although something was wanted (cooldown, cap, mode)."""

    action: Action
    reason: str
    queue: str | None = None
    worker_id: str | None = None
    provider: ProviderName | None = None
    spot: bool = False
    count: int = 1
    cents_per_hour: float = 0.0  # a launch: the price it was chosen at


FLEET_ACTIONS: tuple[Action, ...] = ("launch", "drain", "terminate")


@dataclass(frozen=True, slots=True)
class Plan:
    """One turn's work for the fleet: the cloud workers wanted per queue once it is done
    (``desired``: what Ray's ``request_resources`` is told, every queue in one call) and
    the launch, drain and terminate decisions that say where new workers go and which
    ones leave."""

    desired: Mapping[str, int]
    actions: tuple[Decision, ...]


def plan_of(snapshot: Snapshot, decisions: Iterable[Decision]) -> Plan:
    """The fleet's part of a turn's decisions. A queue wants the cloud workers that are
    starting or active, plus this turn's launches, minus this turn's drains (a
    terminate only ends a worker already draining)."""
    desired = dict.fromkeys(snapshot.queues, 0)
    for worker in snapshot.workers:
        if worker.cloud and worker.status in ("starting", "active"):
            desired[worker.queue] = desired.get(worker.queue, 0) + 1
    actions = tuple(d for d in decisions if d.action in FLEET_ACTIONS)
    for decision in actions:
        if decision.queue is None:
            continue
        if decision.action == "launch":
            desired[decision.queue] = desired.get(decision.queue, 0) + decision.count
        elif decision.action == "drain":
            desired[decision.queue] = desired.get(decision.queue, 0) - 1
    return Plan({name: max(0, n) for name, n in desired.items()}, actions)


def actor_totals(config: SchedulerConfig, plan: Plan) -> dict[str, int]:
    """The pipeline actors each queue wants once a turn's plan is done: what Ray's
    ``request_resources`` is told and the supervisor's pools are sized to. The VPS's
    share of the baseline (:func:`autoscaler.placement.vps_pools`: the whole baseline
    in ``vps_only`` and ``hybrid``, at most one worker of a cloud-enabled queue in
    ``cloud_first``) plus the cloud workers the plan wants (in ``cloud_first`` they
    include the rest of the baseline: asked for once). The share is what the head's
    Ray node advertises, so Ray launches nodes for the cloud's part only."""
    vps = vps_pools(config)
    return {name: vps[name] + plan.desired.get(name, 0) for name in config.queues}


LAUNCH_MEMORY_SECONDS = 3600.0  # launches remembered for the launch-rate cap


def next_history(
    snapshot: Snapshot, decisions: Iterable[Decision], applied: Iterable[bool] | None = None
) -> History:
    """The history after a turn, as the loop and the simulator record it: cooldown clocks
    of what was done (``applied``, parallel to ``decisions``; None: all of it), launch
    times for the rate cap, the last flood alert per queue, and since when each queue
    has been empty."""
    now = snapshot.now
    history = snapshot.history
    up = dict(history.last_scale_up)
    down = dict(history.last_scale_down)
    alerts = dict(history.last_alert)
    launches = [at for at in history.launches if now - at < LAUNCH_MEMORY_SECONDS]
    decisions = list(decisions)
    done_flags = [True] * len(decisions) if applied is None else list(applied)
    for decision, done in zip(decisions, done_flags, strict=True):
        if not done or decision.queue is None:
            continue
        if decision.action == "launch":
            up[decision.queue] = now
            launches.extend([now] * decision.count)
        elif decision.action == "drain":
            down[decision.queue] = now
        elif decision.action == "alert":
            alerts[decision.queue] = now
    empty = dict(history.empty_since)
    for name, state in snapshot.queues.items():
        if state.depth == 0:
            empty.setdefault(name, now)
        else:
            empty.pop(name, None)
    return replace(
        history,
        last_scale_up=up,
        last_scale_down=down,
        launches=tuple(launches),
        empty_since=empty,
        last_alert=alerts,
    )
