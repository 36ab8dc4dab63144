"""The shipped arrival traces (``etc/traces/*.csv``) for the scheduler simulator.

    python -m autoscaler.traces [DIRECTORY]     # writes steady, daily_cycle, burst,
                                                # runaway_flood (default: etc/traces)

Deterministic (seeded): the checked-in files are what this writes. Queues are the
shipped ``scheduler.json``'s: ``images`` and ``documents`` hold the VPS baseline and
take the interactive, urgent work (priorities 1-5, seconds each); ``ocr``, ``media``
and ``bulk`` have no VPS worker and burst to the cloud (OCR minutes, transcodes tens of
minutes, a few over 30 minutes, bulk jobs at priority 7-10).

- ``steady``: 4 hours of light VPS-only load (well below every threshold).
- ``daily_cycle``: 24 hours, quiet at night, a ramp from 07:00, the peak from 09:00 to
  17:00, decline to 22:00; mixed priorities; per-minute arrivals (Poisson).
- ``burst``: 3 hours; light background, then at 01:00 one dump of 200 OCR jobs, 60 bulk
  jobs and 40 images.
- ``runaway_flood``: 36 hours of arrivals far beyond any fleet (the queues only grow):
  what the cost caps are for.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Callable
from pathlib import Path

from autoscaler.sim_world import Arrival, write_trace
from hypermedia.etc import shipped_etc

DIRECTORY = shipped_etc() / "traces"


def steady() -> list[Arrival]:
    """An image every 2 minutes (priority 2, 30 s), a document every 5 (priority 5, 60 s)."""
    arrivals = [Arrival(float(t), "images", 2, 30.0) for t in range(0, 4 * 3600, 120)]
    arrivals += [Arrival(float(t), "documents", 5, 60.0) for t in range(60, 4 * 3600, 300)]
    return sorted(arrivals, key=lambda a: a.at)


def day_shape(hour: float) -> float:
    """Load relative to the peak (1.0) at ``hour`` of the day."""
    if hour < 7 or hour >= 22:
        return 0.08
    if hour < 9:
        return 0.08 + 0.92 * (hour - 7) / 2
    if hour < 17:
        return 1.0 - 0.15 * math.cos((hour - 9) / 8 * 2 * math.pi) ** 2  # a lunch dip
    return 1.0 - 0.92 * (hour - 17) / 5


# queue: (peak jobs per minute, [(share, priority, duration seconds)])
DAILY_MIX: dict[str, tuple[float, list[tuple[float, int, float]]]] = {
    "images": (2.0, [(0.8, 2, 10.0), (0.2, 4, 10.0)]),
    "documents": (1.0, [(0.5, 3, 30.0), (0.5, 5, 30.0)]),
    "ocr": (1.5, [(0.1, 3, 90.0), (0.9, 5, 90.0)]),
    "media": (0.2, [(0.9, 7, 600.0), (0.1, 8, 2400.0)]),
    "bulk": (1.5, [(1.0, 9, 120.0)]),
}


def _poisson(rng: random.Random, mean: float) -> int:
    """Knuth's method (means here are small)."""
    limit, k, product = math.exp(-mean), 0, rng.random()
    while product > limit:
        k += 1
        product *= rng.random()
    return k


def daily_cycle(seed: int = 24) -> list[Arrival]:
    rng = random.Random(seed)
    arrivals: list[Arrival] = []
    for minute in range(24 * 60):
        shape = day_shape(minute / 60)
        for queue, (peak, mix) in DAILY_MIX.items():
            for share, priority, duration in mix:
                count = _poisson(rng, peak * share * shape)
                if count:
                    at = minute * 60.0 + rng.randrange(60)
                    arrivals.append(Arrival(at, queue, priority, duration, count))
    return sorted(arrivals, key=lambda a: (a.at, a.queue, a.priority))


def burst() -> list[Arrival]:
    arrivals = [Arrival(float(t), "images", 2, 10.0) for t in range(0, 3 * 3600, 120)]
    arrivals += [
        Arrival(3600.0, "ocr", 5, 60.0, 200),
        Arrival(3600.0, "bulk", 8, 120.0, 60),
        Arrival(3600.0, "images", 3, 10.0, 40),
    ]
    return sorted(arrivals, key=lambda a: (a.at, a.queue))


def runaway_flood() -> list[Arrival]:
    """Every 5 minutes for 36 hours: 30 OCR jobs (2 min), 30 bulk (5 min), 3 transcodes."""
    arrivals: list[Arrival] = []
    for t in range(0, 36 * 3600, 300):
        arrivals += [
            Arrival(float(t), "ocr", 5, 120.0, 30),
            Arrival(float(t), "bulk", 8, 300.0, 30),
            Arrival(float(t), "media", 7, 1200.0, 3),
        ]
    return arrivals


TRACES: dict[str, Callable[[], list[Arrival]]] = {
    "steady": steady,
    "daily_cycle": daily_cycle,
    "burst": burst,
    "runaway_flood": runaway_flood,
}


def write_all(directory: Path = DIRECTORY) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, make in TRACES.items():
        path = directory / f"{name}.csv"
        write_trace(path, make())
        paths.append(path)
    return paths


if __name__ == "__main__":
    for written in write_all(Path(sys.argv[1]) if len(sys.argv) > 1 else DIRECTORY):
        print(written)
