"""StorageHealth: the storage's probe, cached, and never waited on past its timeout."""

from __future__ import annotations

import threading

from hypermedia.errors import ServiceUnavailable
from hypermedia.storage.health import StorageHealth


class Ticks:
    """A monotonic clock moved by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_answer_is_kept_for_every_seconds():
    probes: list[str] = []
    answers = ["up", "down", "up"]

    def check() -> None:
        probes.append("probe")
        if answers[len(probes) - 1] == "down":
            raise ServiceUnavailable("S3 unreachable")

    ticks = Ticks()
    health = StorageHealth(check, every=15, timeout=30, monotonic=ticks)
    assert health.state().ok
    ticks.now += 14.9
    assert health.state().ok and len(probes) == 1  # kept: no second probe
    ticks.now += 0.1
    down = health.state()
    assert (down.ok, down.problem, len(probes)) == (False, "S3 unreachable", 2)
    ticks.now += 15
    assert health.state().ok and len(probes) == 3


def test_a_probe_that_hangs_answers_down_and_blocks_no_one():
    release = threading.Event()
    started = threading.Event()
    hung = True

    def check() -> None:
        started.set()
        if hung:
            release.wait(60)

    ticks = Ticks()
    health = StorageHealth(check, every=0, timeout=0.05, monotonic=ticks)
    first = health.state()  # returns although the probe has not
    assert not first.ok and first.problem == "the storage did not answer within 0.05 s"
    assert started.is_set()
    assert health.state() == first  # the probe still runs: no second one, the last answer
    hung = False
    release.set()
    for _ in range(1000):  # the hung probe ends; the next ask probes again
        if health.state().ok:
            break
        threading.Event().wait(0.01)
    assert health.state().ok
