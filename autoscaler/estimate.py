"""Load estimates for the policy and the capacity advice: pure arithmetic, no I/O.

A queue's recent load is its arrival rate ``λ`` (jobs that arrived in the last
:data:`~autoscaler.snapshot.RATE_WINDOW_SECONDS`, per second) and the mean running time
``d`` of its recent jobs (:class:`Load`). From them:

- **busy workers** ``λ·d`` (Little's law): the workers the arrivals alone keep busy;
- **backlog when a new node is ready** (:func:`backlog_at_ready`): the jobs waiting now,
  plus those arriving during the boot ``B``, minus what the workers already taking
  jobs run meanwhile: ``depth + λ·B - active·B/d`` (never below 0);
- **workers wanted** (:func:`workers_wanted`): ``ceil(max(λ·d, min(backlog, backlog·d/T)))``:
  the more of the workers the arrivals keep busy and those that clear that backlog
  within ``T`` (the scale-up rule's ``oldest_job_age_seconds`` while priority 1-3 jobs
  wait, else ``idle_minutes``), a worker per job at most (their sum would launch a
  second worker for a lone job at any rate, and see it drained idle);
- **needed again** (:func:`needed_again`): a worker about to be drained is kept when
  the arrivals keep more workers busy than would remain (``λ·d > remaining``), or the
  jobs expected within ``H = B + cooldown`` (the soonest a replacement could take
  work) exceed, by at least one, what the workers that would remain can run in ``H``
  (``λ·H >= remaining·H/d + 1``);
- **p95 wait with c workers** (:func:`p95_wait`): the M/M/c (Erlang C) tail,
  ``P(wait > t) = C(c, λd)·exp(-(c/d - λ)·t)``, for the capacity advice
  (:func:`workers_for_p95`).

Boot times: the offer's ``launch_delay_seconds`` where it states one (the simulator's
clouds do), else :data:`DEFAULT_BOOT_SECONDS` (typical times to a worker taking jobs:
an instance booting, the image pulled, the worker registered).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autoscaler.config import ProviderName
    from autoscaler.snapshot import Offer, QueueState

DEFAULT_BOOT_SECONDS: dict[str, float] = {"aws": 90.0, "google": 60.0, "ionos": 120.0}
# The last burst worker of a queue is kept while a job is expected within this many idle
# windows (30 min with the shipped idle_minutes of 10). bench/scheduler.py's traces,
# launches and cost of the daily cycle / three days / backfill: 1 window 55 $5.59 / 156
# $16.00 / 29 $5.43; 2 windows 47 / 126 / 27; 3 windows 39 $5.60 / 100 $16.33 / 24 $5.94
# (the seed's rules alone: 278 / 759 / 48): half the seed rules' launches at 3.
KEEP_LAST_IDLE_WINDOWS = 3.0


@dataclass(frozen=True, slots=True)
class Load:
    """A queue's recent arrival rate (jobs per second) and mean running time (seconds)."""

    rate: float
    mean_run: float

    @classmethod
    def of(cls, state: QueueState) -> Load | None:
        """The queue's load, None when the snapshot does not know it."""
        if state.arrivals_per_hour is None or not state.mean_run_seconds:
            return None
        return cls(state.arrivals_per_hour / 3600.0, state.mean_run_seconds)

    @property
    def busy(self) -> float:
        """Workers the arrivals keep busy (λ·d)."""
        return self.rate * self.mean_run

    def describe(self) -> str:
        return f"{self.rate * 3600:.0f} arrivals/h x {self.mean_run:.0f} s mean"


def boot_seconds(provider: ProviderName, offer: Offer | None) -> float:
    if offer is not None and offer.launch_delay_seconds > 0:
        return offer.launch_delay_seconds
    return DEFAULT_BOOT_SECONDS.get(provider, 90.0)


def backlog_at_ready(depth: int, load: Load, active: int, boot: float) -> float:
    """Jobs waiting when a node launched now would take work."""
    served = active * boot / load.mean_run
    return max(0.0, depth + load.rate * boot - served)


def workers_wanted(backlog: float, load: Load, clear_seconds: float) -> int:
    """Workers (all of the queue's) that run the arrivals and clear ``backlog`` within
    ``clear_seconds`` (a job is not split: never more workers for the backlog than jobs
    in it)."""
    clearing = min(backlog, backlog * load.mean_run / max(clear_seconds, 1.0))
    return whole(max(load.busy, clearing))


def whole(workers: float) -> int:
    """Estimated workers as a count: to the nearest, halves down (a twentieth of a job
    expected during a boot does not launch a second worker for a lone job)."""
    return max(0, math.ceil(workers - 0.5))


def needed_again(
    load: Load, remaining: int, horizon: float, idle_window: float = 0.0
) -> str | None:
    """Why a worker is needed again within ``horizon`` if ``remaining`` workers stay
    (None: it is not): the arrivals keep more than ``remaining`` (one or more) workers
    busy, or the jobs expected within ``horizon`` exceed by one or more what they can
    run in it. The last worker (none would remain) is kept while a job is expected
    within :data:`KEEP_LAST_IDLE_WINDOWS` of the operator's idle window (``idle_window``
    seconds, scale_down's idle_minutes): any arrivals at all keep a fraction of a
    worker busy, and a queue that sees a job less often should pay for a relaunch, not
    for a node idle all day."""
    if remaining > 0 and load.busy > remaining:
        return f"they keep {load.busy:.2f} workers busy, more than the {remaining} left"
    window = KEEP_LAST_IDLE_WINDOWS * idle_window
    if remaining == 0 and load.rate * window >= 1.0:
        return (
            f"{load.rate * window:.1f} jobs expected within {window:.0f} s, none left to run them"
        )
    expected = load.rate * horizon
    if expected >= remaining * horizon / load.mean_run + 1.0:
        return (
            f"{expected:.1f} jobs expected within {horizon:.0f} s, more than the"
            f" {remaining} left can run"
        )
    return None


def erlang_c(servers: int, offered: float) -> float:
    """The probability that a job waits (M/M/c), ``offered = λ·d`` (1 when saturated)."""
    if servers <= 0 or offered >= servers:
        return 1.0
    term, total = 1.0, 1.0  # offered^k / k!, summed for k < servers
    for k in range(1, servers):
        term *= offered / k
        total += term
    last = term * offered / servers * servers / (servers - offered)
    return last / (total + last)


def p95_wait(servers: int, load: Load) -> float:
    """The 95th percentile wait with ``servers`` workers (inf when they cannot keep up)."""
    if servers <= 0 or load.busy >= servers:
        return math.inf
    waiting = erlang_c(servers, load.busy)
    if waiting <= 0.05:
        return 0.0
    return math.log(waiting / 0.05) / (servers / load.mean_run - load.rate)


def workers_for_p95(load: Load, target_seconds: float, most: int = 1000) -> int | None:
    """The fewest workers whose p95 wait is within ``target_seconds`` (None: over ``most``)."""
    start = max(1, math.floor(load.busy))
    for servers in range(start, most + 1):
        if p95_wait(servers, load) <= target_seconds:
            return servers
    return None


@dataclass(frozen=True, slots=True)
class Capacity:
    """What ``max_workers`` means for a queue under a load (:func:`capacity`)."""

    queue: str
    load: Load
    max_workers: int  # the workers it may have (max_workers, or its VPS workers)
    target_seconds: float
    growth_per_hour: float  # jobs the backlog grows by per hour at max_workers (0: none)
    p95_at_max: float  # seconds (inf: saturated)
    workers_needed: int | None  # the fewest whose p95 is within the target
    limit: str = "max_workers"  # what bounds it: "max_workers", or "its VPS workers"

    @property
    def saturated(self) -> bool:
        return self.growth_per_hour > 0

    @property
    def short(self) -> bool:
        """Whether max_workers misses the target (saturated, or a p95 over it)."""
        return self.p95_at_max > self.target_seconds

    def describe(self) -> str:
        needed = (
            f"{self.workers_needed} workers would keep its p95 wait <= {self.target_seconds:.0f} s"
            if self.workers_needed is not None
            else f"no fleet under 1000 workers keeps its p95 within {self.target_seconds:.0f} s"
        )
        if self.saturated:
            return (
                f"{self.queue} is saturated at {self.limit} {self.max_workers}"
                f" ({self.load.describe()} keep {self.load.busy:.1f} workers busy): its backlog"
                f" grows by {self.growth_per_hour:.0f} jobs/h; {needed}"
            )
        return (
            f"{self.queue} at {self.limit} {self.max_workers}: p95 wait about"
            f" {self.p95_at_max:.0f} s ({self.load.describe()}); {needed}"
        )


def capacity(
    queue: str, load: Load, max_workers: int, target_seconds: float, limit: str = "max_workers"
) -> Capacity:
    """Whether ``max_workers`` keeps up with ``load``: the backlog's growth per hour when
    it cannot, the M/M/c p95 wait at it, and the workers that keep the p95 within
    ``target_seconds``."""
    growth = max(0.0, load.rate - max_workers / load.mean_run) * 3600.0
    return Capacity(
        queue,
        load,
        max_workers,
        target_seconds,
        growth,
        p95_wait(max_workers, load),
        workers_for_p95(load, target_seconds),
        limit,
    )
