"""Is the storage up? A cheap probe of it, asked often, never slow to answer.

The backend's ``check()`` is the probe (S3: a HEAD of the bucket; local: the directory
takes a file and has room). :class:`StorageHealth` runs it at most every ``every``
seconds and keeps the answer: ``/healthz`` is polled often, and a probe per poll
would be a request to S3 per poll. A probe runs in a thread of its own, one at a
time; the caller that started it waits at most ``timeout`` seconds, then counts a
probe still running as down ("no answer within ..."), and every other caller gets the
last answer at once. So a storage that hangs never makes ``/healthz`` hang.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from hypermedia.clock import Clock, SystemClock
from hypermedia.errors import HypermediaError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StorageState:
    ok: bool
    problem: str | None  # why not ok (the operator's words: it may name the directory)
    checked_at: float  # epoch of the probe


class StorageHealth:
    def __init__(
        self,
        check: Callable[[], None],
        *,
        every: float,
        timeout: float,
        clock: Clock | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._check = check
        self.every = every
        self.timeout = timeout
        self._clock: Clock = clock or SystemClock()
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._state: StorageState | None = None
        self._started_at = 0.0
        self._running: threading.Thread | None = None

    def state(self) -> StorageState:
        """The last probe's answer, probing first when it is older than ``every``."""
        with self._lock:
            due = self._state is None or self._monotonic() - self._started_at >= self.every
            started = None
            if due and self._running is None:
                started = threading.Thread(target=self._probe, name="storage-probe", daemon=True)
                self._running = started
                self._started_at = self._monotonic()
                started.start()
        if started is not None:
            started.join(self.timeout)
        with self._lock:
            if started is not None and started.is_alive():
                self._record(
                    StorageState(
                        False,
                        f"the storage did not answer within {self.timeout:g} s",
                        self._clock.now(),
                    )
                )
            if self._state is None:  # the first probe, started by another caller, runs
                return StorageState(False, "the storage is being probed", self._clock.now())
            return self._state

    def _probe(self) -> None:
        try:
            self._check()
        except HypermediaError as exc:
            state = StorageState(False, exc.message, self._clock.now())
        except Exception as exc:
            state = StorageState(False, f"{type(exc).__name__}: {exc}", self._clock.now())
        else:
            state = StorageState(True, None, self._clock.now())
        with self._lock:
            self._running = None
            self._record(state)

    def _record(self, state: StorageState) -> None:
        before = self._state
        self._state = state
        if not state.ok and (before is None or before.ok or before.problem != state.problem):
            log.warning("storage down: %s", state.problem, extra={"action": "health"})
        elif state.ok and before is not None and not before.ok:
            log.info("storage up again", extra={"action": "health"})
