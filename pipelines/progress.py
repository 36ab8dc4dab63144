"""How far the running step is: :func:`report`.

A step calls ``report(done, total, unit)`` as often as it likes (each FFmpeg progress
line, each page); what receives it is set by whoever runs the step. In a job's child
that is the sandbox (:mod:`hypermedia.sandbox.child`), which sends at most a few reports
a second on its channel to the worker, which publishes them as the job's events; where
nothing was set (a step called directly, a test) a report goes nowhere. Reporting
never fails the step and never blocks it: a report that cannot be sent at once is
dropped (the next one says more).

``unit`` names what is counted: ``seconds`` (media time), ``pages``, ``bytes``, or
anything short in lower case; ``total`` None when unknown. Imports nothing from
``hypermedia`` (see :mod:`pipelines.registry`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Progress", "report", "reporting_to"]


@dataclass(frozen=True, slots=True)
class Progress:
    done: float
    total: float | None
    unit: str


Sink = Callable[[Progress], None]
_sink: list[Sink] = []  # the one set for this process, if any


def report(done: float, total: float | None, unit: str) -> None:
    """Tell whoever runs this step how far it is; never raises."""
    if not _sink:
        return
    with contextlib.suppress(Exception):  # progress is never worth failing the step for
        _sink[0](Progress(float(done), None if total is None else float(total), unit))


def reporting_to(sink: Sink | None) -> None:
    """Send this process's reports to ``sink`` (None: nowhere). A job's child sets it
    once, before its step runs."""
    _sink.clear()
    if sink is not None:
        _sink.append(sink)
