"""Per-test timeouts stretched on a machine running slower than the one they were set on.

pytest-timeout's limits (``timeout`` in pyproject, ``@pytest.mark.timeout`` on the
long tests) are a backstop against a hung test, set with room on a quiet 2-core
machine. The same VM has run a pure-Python loop 3.5 times slower in one session than
in the next (a busy host), and every test with it: a CI run then cut three Ray tests
at 240 s while their actors were still starting. So the session's first process
times a fixed loop before the tests start, and every test's limit is multiplied by
how much slower than :data:`BASELINE_SECONDS` it ran (at least 1, at most
:data:`MAX_SCALE`); xdist's workers inherit the factor. No assertion is timed: only
the backstop moves. ``HYPERMEDIA_TEST_TIMEOUT_SCALE`` sets the factor instead.
"""

from __future__ import annotations

import os
import time

import pytest

SCALE_ENV = "HYPERMEDIA_TEST_TIMEOUT_SCALE"
# min of three runs of _loop on the quiet 2-core VM the limits were set on: 0.10 s.
BASELINE_SECONDS = 0.12
MAX_SCALE = 4.0
_ITERATIONS = 5_000_000


def _loop(iterations: int) -> int:
    total = 0
    for i in range(iterations):
        total += i
    return total


def measure(iterations: int = _ITERATIONS, runs: int = 3) -> float:
    """The fastest of ``runs`` timings of the loop, in seconds."""
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        _loop(iterations)
        best = min(best, time.perf_counter() - started)
    return best


def scale_for(seconds: float, baseline: float = BASELINE_SECONDS) -> float:
    """The factor for a loop that took ``seconds`` (1 at or under the baseline)."""
    return round(min(MAX_SCALE, max(1.0, seconds / baseline)), 2)


def session_scale() -> float:
    """The factor this session uses: the environment's, else measured once (and put in
    the environment for the processes that come after)."""
    given = os.environ.get(SCALE_ENV)
    if given is not None:
        try:
            scale = float(given)
        except ValueError:
            raise pytest.UsageError(f"{SCALE_ENV}={given!r}: not a number") from None
        if not 0 < scale <= 100:
            raise pytest.UsageError(f"{SCALE_ENV}={given!r}: between 0 and 100")
        return scale
    scale = scale_for(measure())
    os.environ[SCALE_ENV] = str(scale)
    return scale


def current_scale() -> float:
    """The session's factor as a test process sees it (1 outside such a session): for
    waits inside a test, which must end before its pytest-timeout limit does."""
    try:
        return max(1.0, float(os.environ.get(SCALE_ENV, "1")))
    except ValueError:
        return 1.0


def scaled_timeout(item: pytest.Item, default: float, scale: float) -> float | None:
    """``item``'s pytest-timeout limit times ``scale``; None where it has none."""
    marker = item.get_closest_marker("timeout")
    limit: object = default
    if marker is not None:
        limit = marker.args[0] if marker.args else marker.kwargs.get("timeout", default)
    if not isinstance(limit, int | float) or limit <= 0:
        return None
    return round(float(limit) * scale, 1)


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_SCALE] = session_scale()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    scale = config.stash[_SCALE]
    if scale == 1:
        return
    default = float(config.getini("timeout") or 0)
    for item in items:
        limit = scaled_timeout(item, default, scale)
        if limit is not None:
            item.add_marker(pytest.mark.timeout(limit), append=False)


def pytest_report_header(config: pytest.Config) -> str:
    scale = config.stash[_SCALE]
    return f"timeouts: x{scale:g} ({SCALE_ENV}; a quiet machine: 1)"


_SCALE = pytest.StashKey[float]()
