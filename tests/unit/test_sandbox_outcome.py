"""Limits -> rlimits, and what a child's ending means (hypermedia.sandbox.limits / outcome)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hypermedia.sandbox.limits import MIB, Limits
from hypermedia.sandbox.outcome import ChildFailed, ExitReport, interpret

REPO = Path(__file__).resolve().parents[2]


# -- limits ----------------------------------------------------------------------------


def test_rlimits_follow_the_profile():
    limits = Limits(timeout_seconds=2.5, memory_limit_mb=512, max_output_bytes=1000)
    assert limits.wall_clock_seconds == 3.75
    assert limits.cpu_seconds == 3
    assert limits.rlimits() == [
        ("RLIMIT_CORE", 0, 0),
        ("RLIMIT_NOFILE", 1024, 1024),
        ("RLIMIT_FSIZE", 1000, 1000),
        ("RLIMIT_CPU", 3, 4),
        ("RLIMIT_AS", 512 * MIB, 512 * MIB),
    ]


def test_nproc_only_when_the_child_has_a_uid_of_its_own():
    limits = Limits(timeout_seconds=1, memory_limit_mb=64, max_processes=8)
    assert "RLIMIT_NPROC" not in [name for name, *_ in limits.rlimits()]
    with_uid = limits.rlimits(own_uid=True)
    assert ("RLIMIT_NPROC", 8, 8) in with_uid
    assert with_uid[-1][0] == "RLIMIT_AS"  # always last


def test_a_short_timeout_still_gets_a_second_of_cpu():
    assert Limits(timeout_seconds=0.2, memory_limit_mb=64).cpu_seconds == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"timeout_seconds": 0},
        {"timeout_seconds": -1},
        {"timeout_seconds": float("inf")},
        {"memory_limit_mb": 0},
        {"memory_limit_mb": 1.5},
        {"max_output_bytes": 0},
        {"max_processes": True},
    ],
)
def test_bad_limits_are_refused(kwargs):
    values = {"timeout_seconds": 1, "memory_limit_mb": 64, **kwargs}
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        Limits(**values)


def test_limits_imports_nothing_that_does_io():
    code = (
        "import json, sys; import hypermedia.sandbox.limits; print(json.dumps(sorted(sys.modules)))"
    )
    loaded = json.loads(
        subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout
    )
    assert not [m for m in loaded if m.split(".")[0] in {"socket", "subprocess", "ctypes"}]


# -- outcome ---------------------------------------------------------------------------


def report(**fields) -> ExitReport:
    base = {
        "pid": 100,
        "exit_code": 0,
        "signal": None,
        "killed_for": None,
        "duration_ms": 5,
        "maxrss_kb": 20_000,
        "cpu_seconds": 0.01,
    }
    return ExitReport(**{**base, **fields})


def outcome(result: bytes = b'{"outputs": []}', **fields) -> tuple[str, bool] | list[Any]:
    try:
        return interpret(report(**fields), result, cpu_seconds=10, wall_clock_seconds=15)
    except ChildFailed as exc:
        return (exc.code, exc.retryable)


KILL = signal.SIGKILL


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"signal": KILL, "exit_code": None, "killed_for": "cancelled"}, ("cancelled", False)),
        ({"signal": KILL, "exit_code": None, "killed_for": "timeout"}, ("timeout", True)),
        ({"signal": KILL, "exit_code": None, "killed_for": "shutdown"}, ("child_killed", True)),
        ({"signal": KILL, "exit_code": None}, ("child_killed", True)),
        ({"signal": signal.SIGTERM, "exit_code": None}, ("child_killed", True)),
        ({"signal": signal.SIGXCPU, "exit_code": None}, ("cpu_limit", False)),
        (  # the hard RLIMIT_CPU limit: SIGKILL from the kernel, not from us
            {"signal": KILL, "exit_code": None, "cpu_seconds": 11.0},
            ("cpu_limit", False),
        ),
        ({"signal": signal.SIGXFSZ, "exit_code": None}, ("output_limit", False)),
        ({"signal": signal.SIGSEGV, "exit_code": None}, ("pipeline_crashed", False)),
        ({"signal": signal.SIGABRT, "exit_code": None}, ("pipeline_crashed", False)),
        ({"exit_code": 3}, ("pipeline_crashed", False)),
        ({"exit_code": 71}, ("pipeline_crashed", False)),
        ({"exit_code": 72}, ("sandbox_unavailable", True)),  # could not enter its sandbox
        # killed for a timeout, but it had already exited by itself: its result counts
        ({"killed_for": "timeout"}, []),
        ({}, []),
    ],
)
def test_how_a_child_ended(fields, expected):
    assert outcome(**fields) == expected


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (b"", ("pipeline_crashed", False)),
        (b"not json", ("pipeline_crashed", False)),
        (b"[]", ("pipeline_crashed", False)),
        (b'{"outputs": "x"}', ("pipeline_crashed", False)),
        (b'{"outputs": [1]}', ("pipeline_crashed", False)),
        (
            b'{"error": {"code": "invalid_input", "message": "m", "retryable": true}}',
            ("invalid_input", True),
        ),
        (
            b'{"error": {"code": "memory_limit", "message": "m", "retryable": false}}',
            ("memory_limit", False),
        ),
        (
            b'{"outputs": [{"output_type": "a", "path": "a", "content_type": "x"}]}',
            [{"output_type": "a", "path": "a", "content_type": "x"}],
        ),
    ],
)
def test_what_the_child_reported(result, expected):
    assert outcome(result) == expected


def test_a_crash_keeps_its_traceback_apart_from_the_message():
    body = {"error": {"code": "pipeline_crashed", "message": "KeyError: 'x'", "detail": "Tb"}}
    with pytest.raises(ChildFailed) as caught:
        interpret(report(), json.dumps(body).encode(), cpu_seconds=1, wall_clock_seconds=1.5)
    assert (caught.value.message, caught.value.detail) == ("KeyError: 'x'", "Tb")
    assert str(caught.value) == "pipeline_crashed: KeyError: 'x'"


@pytest.mark.parametrize(
    ("signum", "maxrss_mb", "log_tail", "expected"),
    [
        (signal.SIGABRT, 434, "", "memory_limit"),  # PDFium's allocator at a 512 MB cap
        (signal.SIGTRAP, 300, "", "memory_limit"),
        (signal.SIGABRT, 40, "", "pipeline_crashed"),  # far from the cap: a real crash
        (signal.SIGABRT, 40, "terminate called after throwing 'std::bad_alloc'", "memory_limit"),
        (signal.SIGSEGV, 500, "", "pipeline_crashed"),  # not how an allocation fails
    ],
)
def test_an_abort_near_the_memory_cap_is_the_memory_limit(signum, maxrss_mb, log_tail, expected):
    with pytest.raises(ChildFailed) as caught:
        interpret(
            report(signal=signum, exit_code=None, maxrss_kb=maxrss_mb * 1024),
            b"",
            cpu_seconds=10,
            wall_clock_seconds=15,
            memory_limit_mb=512,
            log_tail=log_tail,
        )
    assert (caught.value.code, caught.value.retryable) == (expected, False)
