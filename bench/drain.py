"""One drain's numbers, and the CPU its processes spent: shared by every system measured."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import psutil


@dataclass
class Drain:
    """One drain: jobs enqueued from ``first_enqueue``; when the last started and ended."""

    jobs: int
    first_enqueue: float
    last_enqueue: float
    last_start: float
    last_done: float | None = None  # hypermedia: the last completion committed
    cpu_ms_per_job: dict[str, float] = field(default_factory=dict)

    @property
    def to_start(self) -> float:
        return self.jobs / (self.last_start - self.first_enqueue)

    @property
    def to_done(self) -> float | None:
        if self.last_done is None:
            return None
        return self.jobs / (self.last_done - self.first_enqueue)

    @property
    def enqueue_rate(self) -> float:
        return self.jobs / max(self.last_enqueue - self.first_enqueue, 1e-9)


def cpu_seconds(processes: Sequence[psutil.Process]) -> dict[int, float]:
    """CPU seconds per process, children it has reaped included."""
    found = {}
    for process in processes:
        try:
            c = process.cpu_times()
        except psutil.Error:
            continue
        found[process.pid] = c.user + c.system + c.children_user + c.children_system
    return found


def cpu_spent(before: dict[int, float], processes: Sequence[psutil.Process]) -> float:
    after = cpu_seconds(processes)
    return sum(after[pid] - before.get(pid, 0.0) for pid in after)
