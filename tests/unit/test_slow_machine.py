"""The slow-machine plugin (tests/slow_machine.py) on a small suite of its own, in a
pytest subprocess (pytest-timeout's alarm is the outer test's own): on a machine
measured slower, every test's timeout (the ini's and a marker's) stretches by the
factor; on a quiet one, or given 1, they stay as written."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import slow_machine

pytest_plugins = ["pytester"]
REPO = Path(__file__).resolve().parents[2]

SUITE = """
import time
import pytest

def test_under_the_ini_timeout():
    time.sleep(0.8)

@pytest.mark.timeout(0.5)
def test_under_its_own_timeout():
    time.sleep(0.8)

@pytest.mark.timeout(0)
def test_without_a_timeout():
    time.sleep(0.1)
"""


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # pytest-timeout alone: quicker
    pytester.makeini("[pytest]\ntimeout = 0.5\n")
    pytester.makepyfile(test_suite=SUITE)
    return pytester


def _run(suite: pytest.Pytester, *args: str) -> pytest.RunResult:
    return suite.runpytest_subprocess(
        "-p", "pytest_timeout", "-p", "tests.slow_machine", "-p", "no:cacheprovider", *args
    )


def test_a_slower_machine_stretches_every_timeout(suite, monkeypatch):
    monkeypatch.setenv(slow_machine.SCALE_ENV, "3")
    result = _run(suite)
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["timeouts: x3 (HYPERMEDIA_TEST_TIMEOUT_SCALE*"])


def test_a_quiet_machine_keeps_them(suite, monkeypatch):
    monkeypatch.setenv(slow_machine.SCALE_ENV, "1")
    result = _run(suite)
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(["*Timeout (>0.5s) from pytest-timeout*"])


def test_unset_it_is_measured_and_said(suite, monkeypatch):
    monkeypatch.delenv(slow_machine.SCALE_ENV, raising=False)
    result = _run(suite, "-k", "without")
    result.stdout.fnmatch_lines(
        ["timeouts: x* (HYPERMEDIA_TEST_TIMEOUT_SCALE; a quiet machine: 1)"]
    )


def test_a_bad_factor_is_refused_by_name(suite, monkeypatch):
    monkeypatch.setenv(slow_machine.SCALE_ENV, "fast")
    result = _run(suite)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*HYPERMEDIA_TEST_TIMEOUT_SCALE='fast': not a number*"])


def test_the_factor_is_the_slowdown_within_bounds():
    base = slow_machine.BASELINE_SECONDS
    assert slow_machine.scale_for(base / 2) == 1
    assert slow_machine.scale_for(base * 2.5) == 2.5
    assert slow_machine.scale_for(base * 10) == slow_machine.MAX_SCALE
    assert slow_machine.measure(iterations=1000, runs=2) > 0


def test_waits_inside_a_test_read_the_session_s_factor(monkeypatch):
    monkeypatch.setenv(slow_machine.SCALE_ENV, "2.5")
    assert slow_machine.current_scale() == 2.5
    monkeypatch.delenv(slow_machine.SCALE_ENV)
    assert slow_machine.current_scale() == 1
