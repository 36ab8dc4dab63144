"""What each test tier runs on, as a pytest plugin (registered by tests/conftest.py).

``generated``   session fixture: the project's own files (:mod:`tests.generated`), each
                group built on first use under the session's temp dir (shared by
                xdist workers). Every tier but the corpus tier uses these.
``corpus``      marker: the test runs on the shared corpus (``HYPERMEDIA_TEST_CORPUS``,
                else ``shared/corpus`` beside the checkout). Without a corpus these
                tests are deselected and the summary says so in one line; with
                ``CI=true``, or a ``HYPERMEDIA_TEST_CORPUS`` that names no corpus, they
                fail instead: CI must not pass without the tier.
``root``        marker (``@pytest.mark.root("what needs it")``): the test needs root (the
                full sandbox: namespaces, uids, seccomp; mounts). Run as another user
                it is skipped, saying why; with ``CI=true`` it fails instead: CI runs
                as root and must not pass without these tests.
``program``     marker (``@pytest.mark.program("ffmpeg")``): the test runs that program;
                where it is not on PATH, the same: skipped, or failed with ``CI=true``.
``slow``        marker: minutes of its own (a whole ``ray up`` cluster launching nodes).
                Left out of a run unless ``CI=true``, ``HYPERMEDIA_TEST_SLOW=1`` or a
                ``-m`` expression that names them (``-m slow`` runs only them); the
                summary says how many did not run and how to run them.
"""

from __future__ import annotations

import os
import shutil

import pytest

from tests.corpus_support import CORPUS_ENV, find_corpus
from tests.generated import Generated

SLOW_ENV = "HYPERMEDIA_TEST_SLOW"
_PROBLEM = pytest.StashKey[str]()
_DESELECTED = pytest.StashKey[int]()
_SLOW_DESELECTED = pytest.StashKey[int]()
# How an xdist worker tells the controller how many it deselected.
_WORKER_KEY = "hypermedia_corpus_deselected"
_SLOW_WORKER_KEY = "hypermedia_slow_deselected"


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def _slow_wanted(config: pytest.Config) -> bool:
    asked = os.environ.get(SLOW_ENV, "").lower() in {"1", "true", "yes"}
    return _in_ci() or asked or "slow" in str(config.getoption("markexpr", ""))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _leave_out_slow(config, items)
    _corpus_tier(config, items)


def _leave_out_slow(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any(item.get_closest_marker("slow") for item in items) and not _slow_wanted(config):
        _deselect(config, items, "slow", _SLOW_DESELECTED, _SLOW_WORKER_KEY)


def _corpus_tier(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(item.get_closest_marker("corpus") for item in items):
        return
    found = find_corpus()
    if found.path is not None:
        return
    if _in_ci() or os.environ.get(CORPUS_ENV):
        config.stash[_PROBLEM] = f"the corpus tier cannot run: {found.problem}"
        return
    _deselect(config, items, "corpus", _DESELECTED, _WORKER_KEY)


def _deselect(
    config: pytest.Config,
    items: list[pytest.Item],
    marker: str,
    count: pytest.StashKey[int],
    worker_key: str,
) -> None:
    """Leave out the tests marked ``marker``, counted for the summary (an xdist worker
    tells its controller the count under ``worker_key``)."""
    marked = [item for item in items if item.get_closest_marker(marker)]
    items[:] = [item for item in items if not item.get_closest_marker(marker)]
    config.hook.pytest_deselected(items=marked)
    config.stash[count] = len(marked)
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput[worker_key] = len(marked)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # tryfirst: before the skipping plugin, so a corpus test whose parameters (read
    # from the corpus) came out empty fails too rather than skipping.
    problem = item.config.stash.get(_PROBLEM, "")
    if problem and item.get_closest_marker("corpus"):
        pytest.fail(problem, pytrace=False)
    root = item.get_closest_marker("root")
    if root is not None and os.geteuid() != 0:
        why = f"{root.args[0] if root.args else 'needs root'} (running as uid {os.geteuid()})"
        _cannot_run(f"{why}: CI must run these tests as root")
    for needed in item.iter_markers("program"):
        name = needed.args[0]
        if shutil.which(name) is None:
            _cannot_run(f"needs {name}, not on PATH (scripts/setup installs it)")


def _cannot_run(why: str) -> None:
    """A test that cannot run here: skipped, saying why; a failure with ``CI=true``."""
    if _in_ci():
        pytest.fail(why, pytrace=False)
    pytest.skip(why)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """xdist: the controller learns what its workers deselected (all collect the same)."""
    output = getattr(node, "workeroutput", {})
    config: pytest.Config = node.config  # type: ignore[attr-defined]
    for key, stash in ((_WORKER_KEY, _DESELECTED), (_SLOW_WORKER_KEY, _SLOW_DESELECTED)):
        config.stash[stash] = max(int(output.get(key, 0)), config.stash.get(stash, 0))


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    slow = config.stash.get(_SLOW_DESELECTED, 0)
    if slow:
        terminalreporter.write_line(
            f"slow tier: {slow} tests did not run (whole `ray up` clusters, minutes each;"
            f" CI runs them); to run them set {SLOW_ENV}=1, or -m slow for only them"
        )
    count = config.stash.get(_DESELECTED, 0)
    if count:
        terminalreporter.write_line(
            f"corpus tier: {count} tests did not run (no corpus); to run them set"
            f" {CORPUS_ENV}=/path/to/corpus or put shared/corpus beside the checkout"
        )


@pytest.fixture(scope="session")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Generated:
    """The generated files; xdist workers share the controller's session directory."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    return Generated(shared / "generated")
