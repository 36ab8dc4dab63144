"""Time as a dependency: the real clock, and a manual one for tests and simulations."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the Unix epoch."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.time()


class ManualClock:
    """A clock that moves only when told to: backoff and lease expiry without sleeping."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        with self._lock:
            self._now += seconds
            return self._now


def to_datetime(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def to_epoch(moment: datetime) -> float:
    return moment.timestamp()


def age_text(seconds: float | None) -> str:
    """A duration as the status screens show it: ``42s``, ``3m 07s``, ``2h 05m``."""
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"
