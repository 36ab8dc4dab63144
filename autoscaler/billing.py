"""Billing reconciliation: the ledger against what the clouds bill (seed 000, "Cost
Control": "Actual billing reconciliation happens via provider APIs (not real-time,
checked every 15 minutes)").

Pure: values in, values out (the scheduler's loop, :meth:`autoscaler.scheduler.
Scheduler.reconcile`, reads the rows and the bills and stores the outcome).

The caps run on the ledger: launch time x price, real time. A bill lags (hours to a
day) and holds what the ledger does not price (disks, addresses, traffic, an instance
nobody recorded). So a bill is compared with the ledger only once what it covers has
*settled*: ``settle_seconds`` (the reader's :attr:`~autoscaler.drivers.base.
BillingReader.billing_settle_seconds`) after it ended:

* **an instance**, once terminated that long ago: its charges (named by its instance id
  or its launch's request id, every day of its life) against its ledger total. The row
  is then reconciled (what was billed stored, ``reconciled_at`` set) and not read again.
* **a UTC day**, once it ended that long ago: the provider's whole bill for the cluster
  that day, charges of no ledger row included, against the ledger's spend that day.

Either differing by more than :data:`TOLERANCE` (or :data:`MIN_DIFFERENCE_CENTS`) is a
:class:`Finding`: a warning in the log, an alert (``billing``) to the webhooks, a line
in ``hypermedia scheduler status``. A bill that shows nothing at all where the ledger
has spend is one too, most likely the billing not set up (tags not activated, no
export); the finding says so.

When (:func:`pending`): a provider's billing is read only when something of it has
settled and was not compared yet, so a reconciliation costs a read or two per day of
bursting (Cost Explorer charges $0.01 a request), one read covering everything pending
(:func:`window`), at most every ``interval_seconds`` (a failed read is tried again then).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from autoscaler.cost import DAY_SECONDS, HOUR_SECONDS, money
from autoscaler.drivers.base import BillingReader, Charge, DriverError

TOLERANCE = 0.10  # a bill this far from the ledger is a finding
MIN_DIFFERENCE_CENTS = 1.0  # ... and at least this far
KEEP_DAYS = 62  # compared days remembered (a bill is never read further back)
KEEP_SECONDS = KEEP_DAYS * DAY_SECONDS


@dataclass(frozen=True, slots=True)
class Account:
    """One provider's billing as the fleet offers it: its reader bound to the cluster."""

    settle_seconds: float
    interval_seconds: float
    read: Callable[[str, str], list[Charge] | DriverError]  # (first_day, last_day)


def accounts(drivers: Mapping[Any, object], cluster: str) -> dict[str, Account]:
    """The drivers that read their cloud's billing (:class:`~autoscaler.drivers.base.
    BillingReader`), bound to ``cluster``; the others (IONOS) are not reconciled."""
    return {
        name: Account(
            settle_seconds=driver.billing_settle_seconds,
            interval_seconds=driver.billing_interval_seconds,
            read=functools.partial(driver.charges, cluster),
        )
        for name, driver in drivers.items()
        if isinstance(driver, BillingReader)
    }


@dataclass(frozen=True, slots=True)
class LedgerRow:
    """One ``cloud_spend`` row, in seconds and cents."""

    spend_id: int
    provider: str
    instance_id: str
    request_id: str | None
    launched_at: float
    terminated_at: float | None
    cents_per_hour: float
    reconciled: bool = False

    def cents_between(self, start: float, end: float, now: float) -> float:
        """What the ledger counts for this row in ``[start, end)`` (up to ``now`` while
        it runs)."""
        stop = self.terminated_at if self.terminated_at is not None else now
        seconds = max(0.0, min(end, stop) - max(start, self.launched_at))
        return self.cents_per_hour * seconds / HOUR_SECONDS

    def total(self, now: float) -> float:
        return self.cents_between(self.launched_at, math.inf, now)


@dataclass(frozen=True, slots=True)
class Finding:
    """A settled bill that differs from the ledger."""

    provider: str
    subject: str  # "instance i-0abc" or "2026-12-03"
    ledger_cents: float
    billed_cents: float
    note: str = ""

    @property
    def key(self) -> str:
        return f"{self.provider}:{self.subject}"

    def message(self) -> str:
        what = self.subject if self.subject.startswith("instance") else f"the day {self.subject}"
        text = (
            f"{self.provider}'s bill for {what} is {money(self.billed_cents)}, the ledger"
            f" counted {money(self.ledger_cents)}"
        )
        return f"{text} ({self.note})" if self.note else text


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one read of a provider's bill settled."""

    billed: dict[int, float]  # spend_id -> cents of its whole life, for the rows settled
    days: tuple[str, ...]  # the days compared
    findings: tuple[Finding, ...]


def day_of(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d")


def day_start(day: str) -> float:
    return datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=UTC).timestamp()


def _days(first: str, last: str) -> list[str]:
    start, end = date.fromisoformat(first), date.fromisoformat(last)
    return [(start + timedelta(days=n)).isoformat() for n in range((end - start).days + 1)]


def differ(billed: float, ledger: float) -> bool:
    return abs(billed - ledger) > max(MIN_DIFFERENCE_CENTS, TOLERANCE * ledger)


def pending(
    rows: Iterable[LedgerRow], settle_seconds: float, compared: Iterable[str], now: float
) -> tuple[list[LedgerRow], list[str]]:
    """Of one provider's rows: those whose instance ended ``settle_seconds`` ago and are
    not reconciled, and the days with ledger spend that ended that long ago and were not
    compared (``compared``: the days already compared), oldest first."""
    done = set(compared)
    horizon = now - KEEP_SECONDS
    instances: list[LedgerRow] = []
    days: set[str] = set()
    for row in rows:
        if (
            not row.reconciled
            and row.terminated_at is not None
            and row.terminated_at + settle_seconds <= now
        ):
            instances.append(row)
        stop = row.terminated_at if row.terminated_at is not None else now
        if stop < horizon:
            continue
        for day in _days(day_of(max(row.launched_at, horizon)), day_of(stop)):
            ended = day_start(day) + DAY_SECONDS
            if day not in done and ended + settle_seconds <= now and stop > day_start(day):
                days.add(day)
    instances.sort(key=lambda r: (r.launched_at, r.spend_id))
    return instances, sorted(days)


def window(instances: Sequence[LedgerRow], days: Sequence[str]) -> tuple[str, str]:
    """The days one read must cover: every day of the instances' lives and ``days``."""
    firsts = [day_of(r.launched_at) for r in instances] + list(days)
    lasts = [day_of(r.terminated_at) for r in instances if r.terminated_at is not None]
    return min(firsts), max(lasts + list(days))


def compare(
    provider: str,
    rows: Sequence[LedgerRow],
    charges: Sequence[Charge],
    instances: Sequence[LedgerRow],
    days: Sequence[str],
    now: float,
) -> Outcome:
    """Compare ``instances`` and ``days`` (from :func:`pending`) with ``charges`` (a read
    of the :func:`window`). ``rows``: every row of the provider that overlaps the window,
    reconciled or not, so that each charge finds its row."""
    by_id: dict[str, LedgerRow] = {}
    for row in rows:
        by_id.setdefault(row.instance_id, row)
        if row.request_id:
            by_id.setdefault(row.request_id, row)
    billed: dict[int, float] = {}
    unknown: dict[str, float] = {}
    by_day: dict[str, float] = {}
    for charge in charges:
        by_day[charge.day] = by_day.get(charge.day, 0.0) + charge.cents
        owner = by_id.get(charge.instance_id) if charge.instance_id else None
        if owner is None and charge.request_id:
            owner = by_id.get(charge.request_id)
        if owner is None:
            unknown[charge.day] = unknown.get(charge.day, 0.0) + charge.cents
        else:
            billed[owner.spend_id] = billed.get(owner.spend_id, 0.0) + charge.cents
    nothing = "the bill shows nothing for the cluster: is its billing set up?"
    empty = not charges
    findings: list[Finding] = []
    settled: dict[int, float] = {}
    for row in instances:
        bill, ledger = billed.get(row.spend_id, 0.0), row.total(now)
        settled[row.spend_id] = bill
        if differ(bill, ledger):
            note = nothing if empty else ""
            findings.append(Finding(provider, f"instance {row.instance_id}", ledger, bill, note))
    for day in days:
        start = day_start(day)
        ledger = sum(r.cents_between(start, start + DAY_SECONDS, now) for r in rows)
        bill = by_day.get(day, 0.0)
        if differ(bill, ledger):
            stray = unknown.get(day, 0.0)
            note = (
                nothing
                if empty
                else f"{money(stray)} of it on resources the ledger does not know"
                if stray >= MIN_DIFFERENCE_CENTS
                else ""
            )
            findings.append(Finding(provider, day, ledger, bill, note))
    return Outcome(settled, tuple(days), tuple(findings))
