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
- ``three_day_cycle``: three days of the daily cycle, a new draw each day.
- ``bursts``: six hours of random dumps (OCR, bulk, transcodes, images) over a light
  background.
- ``backfill``: a 20,000-job bulk regeneration beside 12 hours of interactive traffic.
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


def _cycle(days: int, seed: int, scale: float = 1.0) -> list[Arrival]:
    """``days`` of :func:`day_shape`, each day a different draw of :data:`DAILY_MIX`."""
    rng = random.Random(seed)
    arrivals: list[Arrival] = []
    for minute in range(days * 24 * 60):
        shape = day_shape(minute % (24 * 60) / 60) * scale
        for queue, (peak, mix) in DAILY_MIX.items():
            for share, priority, duration in mix:
                count = _poisson(rng, peak * share * shape)
                if count:
                    at = minute * 60.0 + rng.randrange(60)
                    arrivals.append(Arrival(at, queue, priority, duration, count))
    return arrivals


def three_day_cycle() -> list[Arrival]:
    """Three days of the daily cycle (a new draw each day, seed 72)."""
    return sorted(_cycle(3, 72), key=lambda a: (a.at, a.queue, a.priority))


def bursts(seed: int = 6) -> list[Arrival]:
    """Six hours of bursts over a light background (images every 2 minutes, an OCR
    page every 3): every 20-50 minutes a dump of 20-150 OCR pages (a tenth of them
    urgent), 10-80 bulk jobs, a few transcodes or 20-60 images, at random."""
    rng = random.Random(seed)
    arrivals = [Arrival(float(t), "images", 2, 10.0) for t in range(0, 6 * 3600, 120)]
    arrivals += [Arrival(float(t), "ocr", 5, 60.0) for t in range(30, 6 * 3600, 180)]
    at = float(rng.randrange(600, 1800))
    while at < 6 * 3600:
        kind = rng.choice(("ocr", "ocr", "bulk", "media", "images"))
        if kind == "ocr":
            n = rng.randrange(20, 151)
            arrivals += [Arrival(at, "ocr", 3, 60.0, n // 10), Arrival(at, "ocr", 5, 60.0, n)]
        elif kind == "bulk":
            arrivals.append(Arrival(at, "bulk", 8, 120.0, rng.randrange(10, 81)))
        elif kind == "media":
            arrivals.append(Arrival(at, "media", 6, 600.0, rng.randrange(2, 7)))
        else:
            arrivals.append(Arrival(at, "images", 3, 10.0, rng.randrange(20, 61)))
        at += rng.randrange(1200, 3001)
    return sorted(arrivals, key=lambda a: (a.at, a.queue, a.priority))


def backfill(seed: int = 20) -> list[Arrival]:
    """A 20,000-job regeneration (bulk, priority 9, 20 s each, submitted in the first
    10 minutes) beside 12 hours of the daily cycle's interactive traffic (07:00 to
    19:00: images, documents, OCR, transcodes) and standard conversions in bulk
    (priority 5) that must overtake the backfill."""
    rng = random.Random(seed)
    arrivals = [Arrival(float(60 * i), "bulk", 9, 20.0, 2000) for i in range(10)]
    for minute in range(12 * 60):
        shape = day_shape(7 + minute / 60)
        for queue in ("images", "documents", "ocr", "media"):
            peak, mix = DAILY_MIX[queue]
            for share, priority, duration in mix:
                count = _poisson(rng, peak * share * shape)
                if count:
                    at = minute * 60.0 + rng.randrange(60)
                    arrivals.append(Arrival(at, queue, priority, duration, count))
        count = _poisson(rng, 0.3 * shape)
        if count:
            arrivals.append(Arrival(minute * 60.0 + rng.randrange(60), "bulk", 5, 60.0, count))
    return sorted(arrivals, key=lambda a: (a.at, a.queue, a.priority))


TRACES: dict[str, Callable[[], list[Arrival]]] = {
    "steady": steady,
    "daily_cycle": daily_cycle,
    "burst": burst,
    "runaway_flood": runaway_flood,
    "three_day_cycle": three_day_cycle,
    "bursts": bursts,
    "backfill": backfill,
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
