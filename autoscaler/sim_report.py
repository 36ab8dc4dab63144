"""The scheduler simulator's report: what one run measured (:class:`Report`), as a
rich table (:func:`table`) and a PNG chart (:func:`chart`).

Cloud cost in cents, wait p50/p95/max per priority band, workers per queue over time
(VPS and cloud), instances launched, spot interruptions, and cap breaches: checks at
every evaluation that the last hour's spend was within ``max_hourly_spend_cents`` and,
at the end, that every virtual day's spend was within ``max_daily_spend_cents``. The
baselines do not obey the caps; their breaches say what the caps would have stopped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.table import Table

from autoscaler import cost
from autoscaler.snapshot import BANDS, Band


@dataclass(frozen=True, slots=True)
class Waits:
    """Waits of one priority band, in seconds (nearest-rank percentiles)."""

    jobs: int
    p50: float
    p95: float
    max: float


@dataclass(frozen=True, slots=True)
class FleetSample:
    """At one evaluation: workers not yet terminated per queue, the total depth, the
    depth per queue, the oldest waiting job per priority band, and the spend (the last
    hour, today)."""

    at: float
    vps: Mapping[str, int]
    cloud: Mapping[str, int]
    depth: int
    depth_by_queue: Mapping[str, int] = field(default_factory=dict)
    oldest_by_band: Mapping[Band, float] = field(default_factory=dict)
    hour_cents: float = 0.0
    today_cents: float = 0.0


@dataclass(frozen=True, slots=True)
class Report:
    controller: str
    duration_seconds: float
    cloud_cost_cents: float
    waits: Mapping[Band, Waits]
    jobs: int
    unfinished: int
    launches: int
    boot_billed_seconds: float  # instance time paid while booting (no work taken)
    churn_cents: float  # what booting and the providers' minimum billing cost
    cap_holds: int  # evaluations where the cost caps held a launch
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


def as_json(reports: Sequence[Report], **context: object) -> dict[str, object]:
    """What ``simulate --json FILE`` writes: ``{"policies": [{"policy", "cost_cents",
    "launches", "cap_breaches", "p95_wait_seconds": {"1-3", "4-6", "7-10"}, ...}]}``
    (``context``: the trace, the mode, the capacity advice, at the top level)."""
    policies = []
    for r in reports:
        policies.append(
            {
                "policy": r.controller,
                "cost_cents": round(r.cloud_cost_cents, 4),
                "launches": r.launches,
                "cap_breaches": r.cap_breaches,
                "p95_wait_seconds": {b: r.waits[b].p95 for b in BANDS},
                "p50_wait_seconds": {b: r.waits[b].p50 for b in BANDS},
                "max_wait_seconds": {b: r.waits[b].max for b in BANDS},
                "jobs_by_band": {b: r.waits[b].jobs for b in BANDS},
                "hourly_breaches": r.hourly_breaches,
                "daily_breaches": r.daily_breaches,
                "billed_boot_minutes": round(r.boot_billed_seconds / 60, 2),
                "churn_cents": round(r.churn_cents, 4),
                "cap_holds": r.cap_holds,
                "peak_cloud": r.peak_cloud(),
                "interruptions": r.interruptions,
                "jobs": r.jobs,
                "unfinished": r.unfinished,
                "duration_seconds": r.duration_seconds,
                "locked_at": r.locked_at,
            }
        )
    return {**context, "policies": policies}


def chart(
    reports: Sequence[Report],
    path: Path | str,
    title: str = "",
    caps: tuple[float, float] | None = None,
) -> bool:
    """A PNG, one column per policy and the same axes in every column: cloud and VPS
    workers stacked per queue; the oldest waiting job per priority band; the spend of
    the last hour and of the day against ``caps`` (hourly, daily cents). False (and
    nothing written) when matplotlib is not installed."""
    try:
        import matplotlib  # type: ignore[import-not-found, unused-ignore]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return False
    columns = max(1, len(reports))
    fig, axes = plt.subplots(
        3, columns, figsize=(4.2 * columns, 9), sharex=True, sharey="row", squeeze=False
    )
    queues = list(reports[0].timeline[0].vps) if reports and reports[0].timeline else []
    busy = [q for q in queues if any(s.vps[q] + s.cloud[q] for r in reports for s in r.timeline)]
    colours = plt.get_cmap("tab10")
    for column, report in enumerate(reports):
        samples = report.timeline
        hours = [s.at / 3600 for s in samples]
        workers, waits, spend = axes[0, column], axes[1, column], axes[2, column]
        if samples and busy:
            workers.stackplot(
                hours,
                *[[s.vps[q] + s.cloud[q] for s in samples] for q in busy],
                labels=busy,
                colors=[colours(queues.index(q)) for q in busy],
                step="post",
                alpha=0.85,
            )
        workers.set_title(
            f"{report.controller}\n{cost.money(report.cloud_cost_cents)},"
            f" {report.launches} launches, {report.cap_breaches} cap breaches",
            fontsize="medium",
        )
        for n, band in enumerate(BANDS):
            waits.plot(
                hours,
                [s.oldest_by_band.get(band, 0.0) / 60 for s in samples],
                label=f"priority {band}",
                color=colours(n + 5),
                linewidth=1,
            )
        spend.plot(hours, [s.hour_cents / 100 for s in samples], label="last hour")
        spend.plot(hours, [s.today_cents / 100 for s in samples], label="today")
        if caps is not None:
            spend.axhline(caps[0] / 100, color="tab:blue", linestyle="--", label="hourly cap")
            spend.axhline(caps[1] / 100, color="tab:orange", linestyle="--", label="daily cap")
        spend.set_xlabel("hours")
    axes[0, 0].set_ylabel("workers (VPS + cloud)")
    axes[1, 0].set_ylabel("oldest waiting job (min)")
    axes[2, 0].set_ylabel("cloud spend ($)")
    for row in range(3):
        axes[row, -1].legend(loc="upper right", fontsize="small")
    if title:
        fig.suptitle(title)
    # fixed margins: tight_layout over 12 axes costs a second, and the shared axes
    # leave nothing for it to fit
    fig.subplots_adjust(left=0.06, right=0.99, top=0.9, bottom=0.06, wspace=0.08, hspace=0.15)
    fig.savefig(str(path), dpi=90)
    plt.close(fig)
    return True
