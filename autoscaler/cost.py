"""Cloud spend: the ledger's arithmetic and the cost guard (seed 000, "Cost Control").

Pure: the standard library and :mod:`autoscaler.config` / :mod:`autoscaler.snapshot`
values. The loop and the simulator compute :class:`~autoscaler.snapshot.Spend` with
:func:`spend`; the policy asks :func:`guard` what the limits allow.

Ledger
    Spend comes from our own ledger: every cloud instance's :class:`Interval` on the
    meter (launch .. termination, or .. now while it runs) times its price per hour.
    ``last_hour_cents`` is what the intervals cost in the rolling hour
    ``[now - 3600, now]``; ``today_cents`` since midnight UTC of ``now`` (on the
    simulator's virtual clock: since the last multiple of 86,400 s). The committed
    rate (:func:`running_rate`) is the price per hour of every cloud instance not yet
    terminated, draining ones included: they cost money until they are gone.

Guard (``max_hourly_spend_cents``, ``max_daily_spend_cents``, ``alert_threshold_cents``)
    - **Hourly cap.** Hourly spend at (>=) the cap: no new instances. A launch commits
      its price for one hour (:data:`COMMITTED_HOURS`, :func:`launch_commitment_cents`):
      it is refused when the committed rate plus its price would pass the cap. The
      ledger's hourly spend is the integral of that rate over the last hour, so keeping
      the rate within the cap keeps every hour's spend within it, whatever the clock.
    - **Daily cap.** Reached when today's spend, plus what the running instances will
      cost until they can be stopped (``stop_horizon_seconds``: the policy passes two
      evaluation intervals plus the drain timeout), is at (>=) the cap: the verdict
      says ``lock`` (the policy drains and terminates every cloud worker and emits a
      ``lock`` decision; the loop persists it; it stays until an operator runs
      ``hypermedia scheduler reset-cost-lock``). Counting the stopping time is what
      keeps the day's spend from passing the cap while the instances drain, instead of
      noticing it afterwards. A cap with nothing spent and nothing running is not
      "reached" (a cap of 0 refuses every launch but locks nothing). A launch is also
      refused when its committed hour would bring today's spend over the cap, so a
      launch never locks the scheduler by itself.
    - **Alert.** Once per day (``Spend.alerted_today``) when today's spend is at (>=)
      ``alert_threshold_cents`` (and above zero).
    - **Launch-rate cap.** At most :func:`launch_rate_cap` instances launched in any
      :data:`LAUNCH_WINDOW_SECONDS` (10 minutes): the sum of the enabled providers'
      ``max_instances`` (at least 1). A full fleet can start in one go; a fleet whose
      instances die at boot is relaunched at most once per window, not every
      evaluation. Each entry of ``History.launches`` is one instance (a launch of 3
      records 3 times).
    - **The clock set back.** A launch more than :data:`CLOCK_SLACK_SECONDS` after
      ``now`` means the clock went back (an NTP step, a VM restored from a snapshot):
      the ledger's spend is computed against a clock behind the time it has already
      run, so the intervals after ``now`` cost nothing in it and the hour and the day
      look unspent. No launch until the clock passes that launch again; a launch in
      the clock's future still counts for the launch-rate cap.

Every refusal and verdict carries a reason a person can read; money is shown in dollars.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from autoscaler.snapshot import Spend, WorkerState

if TYPE_CHECKING:  # config values come in built: importing pydantic is the loader's job
    from autoscaler.config import CloudProviders, CostLimits

HOUR_SECONDS = 3600.0
DAY_SECONDS = 86_400.0
# A launched instance's price is committed for this long (the guard's look-ahead).
COMMITTED_HOURS = 1.0
LAUNCH_WINDOW_SECONDS = 600.0
# A launch this far in the future of the guard's clock: the clock was set back.
CLOCK_SLACK_SECONDS = 60.0
RESET_COMMAND = "hypermedia scheduler reset-cost-lock"


# The ledger (``cloud_spend``) and the instance tags keep prices as whole micro-dollars;
# everything else counts cents.
MICRODOLLARS_PER_CENT = 10_000


def money(cents: float) -> str:
    """``$1.23`` (cents in, dollars out)."""
    return f"${cents / 100:,.2f}"


def to_microusd(cents: float) -> int:
    """Cents as the whole micro-dollars the ledger and the tags store."""
    return round(cents * MICRODOLLARS_PER_CENT)


def from_microusd(microusd: int) -> float:
    """Stored micro-dollars as cents."""
    return microusd / MICRODOLLARS_PER_CENT


# -- the ledger ------------------------------------------------------------------------------


# How each cloud bills an instance's time: (the least it bills, the step it rounds up to),
# in seconds. EC2 (Linux) and Compute Engine: by the second, a minute at least; IONOS by
# the minute (assumed, as the simulator does: a minute's step, a minute's minimum).
BILLING_SECONDS: dict[str, tuple[float, float]] = {
    "aws": (60.0, 1.0),
    "google": (60.0, 1.0),
    "ionos": (60.0, 60.0),
}
DEFAULT_BILLING_SECONDS = (60.0, 60.0)  # another provider (local): the coarser of them


def billed_seconds(seconds: float, minimum: float, step: float) -> float:
    """What a cloud bills for an instance that ran ``seconds``: at least ``minimum``,
    rounded up to a whole number of ``step`` seconds."""
    billed = max(seconds, minimum)
    return math.ceil(billed / step - 1e-9) * step if step > 0 else billed


@dataclass(frozen=True, slots=True)
class Interval:
    """One cloud instance on the meter: from ``start`` to ``end`` (None: still running).
    An ended one costs what its cloud bills (``min_seconds`` at least, rounded up to
    ``step_seconds``), counted in the window it ended in."""

    start: float
    end: float | None
    cents_per_hour: float
    min_seconds: float = 0.0
    step_seconds: float = 0.0

    @classmethod
    def of(cls, worker: WorkerState, end: float | None = None) -> Interval:
        return cls(worker.started_at, end, worker.cost_per_hour_cents)

    @classmethod
    def billed(
        cls, provider: str, start: float, end: float | None, cents_per_hour: float
    ) -> Interval:
        """A ledger row's interval, billed as its provider bills (:data:`BILLING_SECONDS`)."""
        minimum, step = BILLING_SECONDS.get(provider, DEFAULT_BILLING_SECONDS)
        return cls(start, end, cents_per_hour, minimum, step)

    def cents_between(self, start: float, end: float) -> float:
        """What it cost between ``start`` and ``end`` (a running one runs until ``end``;
        one that ended by ``end`` costs its whole bill: its minimum and rounding too)."""
        lo = max(self.start, start)
        if self.end is None:
            hi = end
        elif self.end <= end:
            hi = self.start + billed_seconds(
                self.end - self.start, self.min_seconds, self.step_seconds
            )
        else:
            hi = end
        return 0.0 if hi <= lo else self.cents_per_hour * (hi - lo) / HOUR_SECONDS


def spent_between(intervals: Iterable[Interval], start: float, end: float) -> float:
    return sum(interval.cents_between(start, end) for interval in intervals)


def day_start(now: float) -> float:
    """Midnight UTC of ``now`` (epoch seconds have no leap seconds: days are 86,400 s)."""
    return now - now % DAY_SECONDS


def spend(
    intervals: Iterable[Interval], now: float, *, locked: bool = False, alerted_today: bool = False
) -> Spend:
    """The ledger's spend at ``now``: the last hour and the day so far."""
    runs = list(intervals)
    return Spend(
        last_hour_cents=spent_between(runs, now - HOUR_SECONDS, now),
        today_cents=spent_between(runs, day_start(now), now),
        locked=locked,
        alerted_today=alerted_today,
    )


def running_rate(workers: Iterable[WorkerState]) -> float:
    """Cents per hour of every cloud instance not yet terminated (draining ones too)."""
    return sum(w.cost_per_hour_cents for w in workers if w.cloud and w.status != "terminated")


def launch_commitment_cents(cents_per_hour: float) -> float:
    """What a launch commits: its price for :data:`COMMITTED_HOURS`."""
    return cents_per_hour * COMMITTED_HOURS


def launch_rate_cap(providers: CloudProviders) -> int:
    """Instances that may be launched per :data:`LAUNCH_WINDOW_SECONDS`."""
    return max(1, sum(providers.get(name).max_instances for name in providers.enabled()))


def recent_launches(launches: Iterable[float], now: float) -> int:
    """Launches after ``now - 600 s`` (those after ``now`` too: the clock went back)."""
    return sum(1 for at in launches if now - LAUNCH_WINDOW_SECONDS < at)


def clock_set_back(launches: Iterable[float], now: float) -> str | None:
    """Why no launch may start while the clock is behind the last launch (None: it
    is not, by more than :data:`CLOCK_SLACK_SECONDS`)."""
    behind = max((at - now for at in launches), default=0.0)
    if behind <= CLOCK_SLACK_SECONDS:
        return None
    return (
        f"the clock is {behind:,.0f} s behind the last launch (set back?): the spend"
        " against the caps cannot be computed; no new instances until it passes it"
    )


def summary(limits: CostLimits, spend: Spend, committed_cents_per_hour: float) -> str:
    """One line for ``hypermedia scheduler explain``."""
    state = f"; locked to vps_only until `{RESET_COMMAND}`" if spend.locked else ""
    return (
        f"Spend: {money(spend.last_hour_cents)} in the last hour"
        f" (cap {money(limits.max_hourly_spend_cents)}), {money(spend.today_cents)} today"
        f" (cap {money(limits.max_daily_spend_cents)},"
        f" alert at {money(limits.alert_threshold_cents)});"
        f" running instances {money(committed_cents_per_hour)}/h{state}"
    )


# -- the guard -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Budget:
    """What is left for launches in this evaluation; :meth:`after_launch` for each one
    admitted, so several launches in one evaluation are checked together."""

    limits: CostLimits
    today_cents: float
    committed_cents_per_hour: float
    launches_left: int
    max_launches: int
    blocked: str | None = None  # why no launch at all is allowed now

    def refusal(self, cents_per_hour: float) -> str | None:
        """Why a launch at this price is refused (None: it is allowed)."""
        if self.blocked is not None:
            return self.blocked
        if self.launches_left <= 0:
            return _rate_capped(self.max_launches)
        rate = self.committed_cents_per_hour + cents_per_hour
        hourly = self.limits.max_hourly_spend_cents
        if rate > hourly:
            return (
                f"a launch at {money(cents_per_hour)}/h would commit {money(rate)}/h,"
                f" over the {money(hourly)} hourly cap"
            )
        today = self.today_cents + rate * COMMITTED_HOURS
        daily = self.limits.max_daily_spend_cents
        if today > daily:
            return (
                f"a launch at {money(cents_per_hour)}/h would bring today's spend to"
                f" {money(today)} within the hour, over the {money(daily)} daily cap"
            )
        return None

    def after_launch(self, cents_per_hour: float) -> Budget:
        return replace(
            self,
            committed_cents_per_hour=self.committed_cents_per_hour + cents_per_hour,
            launches_left=self.launches_left - 1,
        )


@dataclass(frozen=True, slots=True)
class GuardVerdict:
    """What the cost limits say now. ``lock_reason``: the daily cap was reached in this
    evaluation (emit the lock; terminate every cloud worker); ``locked``: locked now or
    before; ``alert_reason``: send today's spend alert; ``reasons``: all of it."""

    budget: Budget
    locked: bool = False
    lock_reason: str | None = None
    alert_reason: str | None = None
    reasons: tuple[str, ...] = ()

    @property
    def lock(self) -> bool:
        return self.lock_reason is not None

    @property
    def alert(self) -> bool:
        return self.alert_reason is not None

    @property
    def launches_allowed(self) -> bool:
        return self.budget.blocked is None and self.budget.launches_left > 0

    @property
    def launch_refusal(self) -> str | None:
        """Why no launch is possible at all (None: launches are checked one by one)."""
        if self.budget.blocked is not None:
            return self.budget.blocked
        return _rate_capped(self.budget.max_launches) if self.budget.launches_left <= 0 else None


def _rate_capped(max_launches: int) -> str:
    return (
        f"launch-rate cap: {max_launches} instances launched in the last"
        f" {LAUNCH_WINDOW_SECONDS / 60:.0f} minutes"
    )


def guard(
    limits: CostLimits,
    spend: Spend,
    *,
    now: float,
    committed_cents_per_hour: float,
    launches: Iterable[float] = (),
    max_launches: int,
    stop_horizon_seconds: float,
) -> GuardVerdict:
    """The verdict of the cost limits (see the module docstring for each rule)."""
    launches = list(launches)
    today = spend.today_cents
    committed = committed_cents_per_hour
    daily = limits.max_daily_spend_cents
    reasons: list[str] = []
    blocked: str | None = None
    lock_reason: str | None = None

    projected = today + committed * stop_horizon_seconds / HOUR_SECONDS
    if spend.locked:
        blocked = f"locked to vps_only by the daily cost cap until `{RESET_COMMAND}`"
        reasons.append(blocked)
    elif projected >= daily and (today > 0 or committed > 0):
        running = (
            f" ({money(projected)} once the running instances at {money(committed)}/h stop)"
            if committed > 0
            else ""
        )
        lock_reason = blocked = (
            f"Daily cloud spend cap {money(daily)} reached: {money(today)} today{running};"
            f" terminating every cloud worker and locking to vps_only until `{RESET_COMMAND}`"
        )
        reasons.append(blocked)

    alert_reason: str | None = None
    if today >= limits.alert_threshold_cents and today > 0 and not spend.alerted_today:
        alert_reason = (
            f"Daily cloud spend {money(today)} reached the alert threshold"
            f" {money(limits.alert_threshold_cents)} (daily cap {money(daily)})"
        )
        reasons.append(alert_reason)

    hourly = limits.max_hourly_spend_cents
    if spend.last_hour_cents >= hourly:
        at_cap = (
            f"hourly spend {money(spend.last_hour_cents)} is at the {money(hourly)} cap:"
            " no new instances"
        )
        reasons.append(at_cap)
        blocked = blocked or at_cap

    set_back = clock_set_back(launches, now)
    if set_back is not None:
        reasons.append(set_back)
        blocked = blocked or set_back

    left = max(0, max_launches - recent_launches(launches, now))
    if left == 0:
        reasons.append(_rate_capped(max_launches))
    return GuardVerdict(
        budget=Budget(limits, today, committed, left, max_launches, blocked),
        locked=spend.locked or lock_reason is not None,
        lock_reason=lock_reason,
        alert_reason=alert_reason,
        reasons=tuple(reasons),
    )
