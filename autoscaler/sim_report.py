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
from dataclasses import dataclass
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
