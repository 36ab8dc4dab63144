"""The operator page's charts as data: columns aligned on their times (the shape uPlot
draws), times in epoch seconds, money in cents.

- **depth** and **workers** per queue: the queue samples (:mod:`autoscaler.samples`); a
  sample missing for more than :data:`GAP_INTERVALS` intervals (no scheduler led) breaks
  the line instead of drawing across the gap;
- **spend**: the ledger's spend in the last hour and today (:func:`autoscaler.cost.spend`)
  at :data:`SPEND_POINTS` evenly spaced times and at the window's end, against the caps.
  Spend needs no samples: the ledger holds every instance's launch, end and price.

Pure: the values in, the columns out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from autoscaler import cost

if TYPE_CHECKING:
    from autoscaler.samples import Sample

GAP_INTERVALS = 3
SPEND_POINTS = 120


@dataclass(frozen=True, slots=True)
class Charts:
    since: float
    until: float
    queues: list[str]
    times: list[float]  # of the samples (and of the gaps between them)
    depth: dict[str, list[int | None]]
    workers: dict[str, list[int | None]]
    spend_times: list[float]
    last_hour_cents: list[float]
    today_cents: list[float]
    hourly_cap_cents: int
    daily_cap_cents: int
    alert_threshold_cents: int

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def queue_columns(
    samples: Sequence[Sample], queues: Sequence[str], interval: float
) -> tuple[list[float], dict[str, list[int | None]], dict[str, list[int | None]]]:
    """Times, depth and workers per queue from ``samples`` (oldest first) taken every
    ``interval`` seconds; a queue not sampled at a time is None there."""
    by_time: dict[float, dict[str, Sample]] = {}
    for sample in samples:
        by_time.setdefault(sample.at, {})[sample.queue] = sample
    times: list[float] = []
    depth: dict[str, list[int | None]] = {q: [] for q in queues}
    workers: dict[str, list[int | None]] = {q: [] for q in queues}
    for at, taken in by_time.items():
        if times and at - times[-1] > GAP_INTERVALS * interval:
            times.append(times[-1] + interval)  # a point of nothing: the line breaks here
            for q in queues:
                depth[q].append(None)
                workers[q].append(None)
        times.append(at)
        for q in queues:
            found = taken.get(q)
            depth[q].append(found.depth if found is not None else None)
            workers[q].append(found.workers if found is not None else None)
    return times, depth, workers


def spend_columns(
    intervals: Sequence[cost.Interval], since: float, until: float, points: int = SPEND_POINTS
) -> tuple[list[float], list[float], list[float]]:
    """Times from ``since`` to ``until`` (both included) and the ledger's spend in the last
    hour and today at each, in cents."""
    step = (until - since) / points
    times = [since + i * step for i in range(points)] + [until]
    spent = [cost.spend(intervals, at) for at in times]
    return (
        times,
        [round(s.last_hour_cents, 2) for s in spent],
        [round(s.today_cents, 2) for s in spent],
    )


def charts(
    samples: Sequence[Sample],
    intervals: Sequence[cost.Interval],
    queues: Sequence[str],
    *,
    since: float,
    until: float,
    sample_interval: float,
    hourly_cap_cents: int,
    daily_cap_cents: int,
    alert_threshold_cents: int,
) -> Charts:
    times, depth, workers = queue_columns(samples, queues, sample_interval)
    spend_times, last_hour, today = spend_columns(intervals, since, until)
    return Charts(
        since=since,
        until=until,
        queues=list(queues),
        times=times,
        depth=depth,
        workers=workers,
        spend_times=spend_times,
        last_hour_cents=last_hour,
        today_cents=today,
        hourly_cap_cents=hourly_cap_cents,
        daily_cap_cents=daily_cap_cents,
        alert_threshold_cents=alert_threshold_cents,
    )
