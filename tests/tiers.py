"""What each test tier runs on, as a pytest plugin (registered by tests/conftest.py).

``generated``   session fixture: the project's own files (:mod:`tests.generated`), each
                group built on first use under the session's temp dir (shared by
                xdist workers). Every tier but the corpus tier uses these.
``corpus``      marker: the test runs on the shared corpus (``HYPERMEDIA_TEST_CORPUS``,
                else ``shared/corpus`` beside the checkout). Without a corpus these
                tests are deselected and the summary says so in one line; with
                ``CI=true``, or a ``HYPERMEDIA_TEST_CORPUS`` that names no corpus, they
                fail instead: CI must not pass without the tier.
"""

from __future__ import annotations

import os

import pytest

from tests.corpus_support import CORPUS_ENV, find_corpus
from tests.generated import Generated

_PROBLEM = pytest.StashKey[str]()
_DESELECTED = pytest.StashKey[int]()
# How an xdist worker tells the controller how many it deselected.
_WORKER_KEY = "hypermedia_corpus_deselected"


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    marked = [item for item in items if item.get_closest_marker("corpus")]
    if not marked:
        return
    found = find_corpus()
    if found.path is not None:
        return
    if _in_ci() or os.environ.get(CORPUS_ENV):
        config.stash[_PROBLEM] = f"the corpus tier cannot run: {found.problem}"
        return
    items[:] = [item for item in items if not item.get_closest_marker("corpus")]
    config.hook.pytest_deselected(items=marked)
    config.stash[_DESELECTED] = len(marked)
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput[_WORKER_KEY] = len(marked)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # tryfirst: before the skipping plugin, so a corpus test whose parameters (read
    # from the corpus) came out empty fails too rather than skipping.
    problem = item.config.stash.get(_PROBLEM, "")
    if problem and item.get_closest_marker("corpus"):
        pytest.fail(problem, pytrace=False)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """xdist: the controller learns what its workers deselected (all collect the same)."""
    count = int(getattr(node, "workeroutput", {}).get(_WORKER_KEY, 0))
    config: pytest.Config = node.config  # type: ignore[attr-defined]
    config.stash[_DESELECTED] = max(count, config.stash.get(_DESELECTED, 0))


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
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
