"""Operation name -> pipeline step.

A step is a pure function of files::

    step(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]

It reads ``input_path``, writes its outputs inside ``workdir`` and returns them.
It does no network I/O, imports nothing from ``hypermedia`` or ``autoscaler`` (the
content inspection it shares with ingest is :mod:`pipelines.formats`), and runs in a
child process that the worker may kill at any time.

Output types name what the step produced *with its effective parameters*
(``thumbnail-320x320.webp``, ``convert.png``): the output key is
``derived/{pool}/{object}/{profile_version}/{output_type}``, so two requests with
different parameters must never share an output type, and the same request must
always give the same one (a re-run overwrites the same key).

A step may also report the work it did (``{"page": 3, "escalation": 1}``) with
:func:`usage_output`: an output of type :data:`USAGE_OUTPUT` that the worker reads
(the profile's ``unit_costs`` price it; the attempt records it) and never stores. A
step that reports units declares the most of each it can report for an input
(:func:`register_max_units`): a submit reserves the estimate plus those units at their
prices, so a job is never charged more than its user had available. A profile that
prices a unit its step declares no bound for is refused at startup
(:func:`bounded_units`).

A step registered with ``checkpoints=True`` may keep finished pieces of its work in
its workdir (:mod:`pipelines.checkpoints`); the worker stores them as they appear and
puts them back before a retry (:func:`checkpointing`).

Failures raise :class:`PipelineError` with a stable ``code`` (``unsupported_format``,
``invalid_input``, ``pixel_limit``, ``invalid_params`` ...) and whether a retry
could help (``retryable``); anything else escaping a step is a bug, reported as
``pipeline_crashed``.
"""

from __future__ import annotations

import contextlib
import typing
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if typing.TYPE_CHECKING:  # (a name of its own would be one more export)
    from pipelines.formats.inspection import Inspection

__all__ = [
    "USAGE_OUTPUT",
    "Check",
    "MaxUnits",
    "Output",
    "PipelineError",
    "Step",
    "UnsetParameters",
    "bounded_units",
    "check",
    "check_profile",
    "checkpointing",
    "get",
    "load_all",
    "max_units",
    "operations",
    "preload",
    "profile_only",
    "register",
    "register_max_units",
    "usage_output",
]

# The output type a step reports its units of work under (see the module docstring).
USAGE_OUTPUT = "usage.json"
_USAGE_CONTENT_TYPE = "application/vnd.hypermedia.usage+json"


@dataclass(frozen=True, slots=True)
class Output:
    output_type: str
    path: Path
    content_type: str


def usage_output(workdir: Path, units: Mapping[str, int]) -> Output:
    """The step's units of work (names of lowercase letters, digits and ``_``; counts
    of 0 or more) as the :data:`USAGE_OUTPUT` output, written in ``workdir``."""
    import json

    path = workdir / USAGE_OUTPUT
    path.write_text(json.dumps({str(unit): int(count) for unit, count in units.items()}))
    return Output(USAGE_OUTPUT, path, _USAGE_CONTENT_TYPE)


class PipelineError(Exception):
    def __init__(self, code: str, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = retryable


class UnsetParameters(PipelineError):
    """Parameters the operation needs that are not set: refused in a request, but not in
    a profile, which may leave them to each request (:func:`check_profile`)."""

    def __init__(self, message: str) -> None:
        super().__init__("invalid_params", message)


Step = Callable[[Path, Mapping[str, Any], Path], list[Output]]
# Validates an operation's parameters (profile's merged with the request's) before a
# job exists: raises PipelineError("invalid_params", ...), does no decoding.
# What the step would refuse of its parameters raises PipelineError; what it answers
# (a step's own parser may serve: its parsed request) is not used.
Check = Callable[[Mapping[str, Any]], object]
# The most of each unit of work a step may report for one input: called with the
# parameters (the profile's merged with the request's, already checked) and the input's
# inspection (:class:`pipelines.formats.inspection.Inspection`: kind, pages ...; None
# for an object never inspected, such as another job's output), before the job exists.
# Answers ``{unit: count}``; a unit it leaves out is bounded by 0.
MaxUnits = Callable[[Mapping[str, Any], "Inspection | None"], Mapping[str, int]]

_STEPS: dict[str, Step] = {}
_CHECKS: dict[str, Check] = {}
_PROFILE_ONLY: dict[str, frozenset[str]] = {}
_PRELOAD: dict[str, tuple[str, ...]] = {}
_CHECKPOINTS: set[str] = set()
_MAX_UNITS: dict[str, tuple[frozenset[str], MaxUnits]] = {}


def register(
    operation: str,
    *,
    check: Check | None = None,
    profile_only: Collection[str] = (),
    preload: Sequence[str] = (),
    checkpoints: bool = False,
) -> Callable[[Step], Step]:
    """Register a step. ``profile_only``: parameters only the operator's profile may
    set (paths on the worker and the like); a request naming one is refused.
    ``preload``: libraries the fork server of a worker serving the step may import
    before it forks, so that each job does not (see :func:`preload`). ``checkpoints``:
    the step keeps finished pieces for a retry (:mod:`pipelines.checkpoints`)."""

    def decorate(step: Step) -> Step:
        if operation in _STEPS:
            raise ValueError(f"operation {operation!r} registered twice")
        _STEPS[operation] = step
        if check is not None:
            _CHECKS[operation] = check
        _PROFILE_ONLY[operation] = frozenset(profile_only)
        _PRELOAD[operation] = tuple(preload)
        if checkpoints:
            _CHECKPOINTS.add(operation)
        return step

    return decorate


def register_max_units(operation: str, units: Collection[str]) -> Callable[[MaxUnits], MaxUnits]:
    """Declare the units of work the step for ``operation`` reports (``units``) and the
    most of each it can report for an input (the decorated :data:`MaxUnits`). What a
    submit reserves is the job's estimate plus these at the profile's ``unit_costs``;
    the completion never charges more (a step that reports past its bound is charged
    its bound, and a warning says so)."""

    def decorate(bound: MaxUnits) -> MaxUnits:
        if operation in _MAX_UNITS:
            raise ValueError(f"the units of {operation!r} registered twice")
        _MAX_UNITS[operation] = (frozenset(units), bound)
        return bound

    return decorate


def bounded_units(operation: str) -> frozenset[str] | None:
    """The units of work the step for ``operation`` declares a bound for (see
    :func:`register_max_units`; none declared: empty), None when no step implements
    ``operation``."""
    load_all()
    if operation not in _STEPS:
        return None
    return _MAX_UNITS.get(operation, (frozenset(), None))[0]


def max_units(
    operation: str, params: Mapping[str, Any], inspection: Inspection | None
) -> dict[str, int]:
    """The most of each unit of work the step for ``operation`` may report on an input
    of ``inspection`` with ``params``: every unit it declares, 0 where its bound leaves
    one out ({} for a step that declares none). ``PipelineError`` for parameters the
    step refuses."""
    load_all()
    found = _MAX_UNITS.get(operation)
    if found is None:
        return {}
    declared, bound = found
    answer = dict.fromkeys(sorted(declared), 0)
    for unit, count in bound(params, inspection).items():
        if unit not in declared:
            raise ValueError(f"{operation}: bounds {unit!r}, which it did not declare")
        answer[unit] = max(0, int(count))
    return answer


def preload(operations: Iterable[str]) -> tuple[str, ...]:
    """The libraries the steps of ``operations`` asked to have imported before the
    fork (in order, once each), those installed here only: modules, never models or
    engines (no state a job could inherit half-made). Some start idle threads (NumPy's
    OpenBLAS, onnxruntime): the fork server then forks with ``os.fork``."""
    import importlib.util

    load_all()
    wanted = dict.fromkeys(m for op in operations for m in _PRELOAD.get(op, ()))
    return tuple(m for m in wanted if importlib.util.find_spec(m) is not None)


def profile_only(operation: str) -> frozenset[str]:
    """The parameters of ``operation`` a request may not set (see :func:`register`)."""
    load_all()
    return _PROFILE_ONLY.get(operation, frozenset())


def check(operation: str, params: Mapping[str, Any]) -> None:
    """Refuse ``params`` the step for ``operation`` would refuse, where the step
    registered a check (``PipelineError``); nothing otherwise."""
    load_all()
    found = _CHECKS.get(operation)
    if found is not None:
        found(params)


def check_profile(operation: str, params: Mapping[str, Any]) -> None:
    """Refuse what a profile sets that every request would be refused for (an unknown
    key, a bad value), as :func:`check` does; parameters it leaves unset are for the
    requests to set."""
    with contextlib.suppress(UnsetParameters):
        check(operation, params)


def checkpointing(operation: str) -> bool:
    """Whether the step for ``operation`` keeps checkpoints (see :func:`register`)."""
    load_all()
    return operation in _CHECKPOINTS


def get(operation: str) -> Step:
    """The step for ``operation`` (importing the pipeline modules on first use)."""
    load_all()
    try:
        return _STEPS[operation]
    except KeyError:
        raise PipelineError(
            "unsupported_operation", f"no pipeline implements {operation!r}"
        ) from None


def operations() -> list[str]:
    load_all()
    return sorted(_STEPS)


def load_all() -> None:
    """Import every pipeline module so their steps register."""
    import importlib

    for module in _MODULES:
        importlib.import_module(module)


# Pipeline modules register themselves on import; list each here when it exists.
_MODULES: list[str] = [
    "pipelines.images",
    "pipelines.pdf",
    "pipelines.office",
    "pipelines.media",
    "pipelines.ocr",
]
