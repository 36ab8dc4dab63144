"""The tiers plugin (tests/tiers.py) on a small suite of its own, run in process:
the slow tier is left out unless asked for, and says so; a corpus that was asked for
and is not there fails its tests instead of passing without them."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

SUITE = """
import pytest

def test_quick():
    pass

@pytest.mark.slow
def test_a_whole_cluster():
    pass

@pytest.mark.corpus
def test_on_the_corpus():
    pass
"""

NEEDS = """
import pytest

@pytest.mark.root("the full sandbox needs root")
def test_as_root():
    pass

@pytest.mark.program("hypermedia-no-such-program")
def test_with_a_program():
    pass

@pytest.mark.program("sh")
def test_with_sh():
    pass
"""


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    for name in ("CI", "HYPERMEDIA_TEST_SLOW", "HYPERMEDIA_TEST_CORPUS"):
        monkeypatch.delenv(name, raising=False)
    pytester.makeini(
        "[pytest]\nmarkers =\n    slow: slow\n    corpus: corpus\n    root: root\n"
        "    program: program\naddopts = --strict-markers\n"
    )
    pytester.makepyfile(test_suite=SUITE)
    return pytester


def _run(suite: pytest.Pytester, *args: str) -> pytest.RunResult:
    return suite.runpytest_inprocess("-p", "tests.tiers", "-p", "no:cacheprovider", *args)


def test_the_slow_tier_is_left_out_and_the_summary_says_how_to_run_it(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path
):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "MANIFEST.tsv").write_text("")
    monkeypatch.setenv("HYPERMEDIA_TEST_CORPUS", str(corpus))
    result = _run(suite)
    result.assert_outcomes(passed=2, deselected=1)
    result.stdout.fnmatch_lines(
        ["slow tier: 1 tests did not run (*CI runs them); to run them set HYPERMEDIA_TEST_SLOW=1*"]
    )
    result = _run(suite, "-m", "not corpus")  # an expression that does not name them
    result.assert_outcomes(passed=1, deselected=2)
    result.stdout.fnmatch_lines(
        ["slow tier: 1 tests did not run (*CI runs them); to run them set HYPERMEDIA_TEST_SLOW=1*"]
    )


@pytest.mark.parametrize(
    ("env", "args", "passed"),
    [
        ({"HYPERMEDIA_TEST_SLOW": "1"}, (), 3),
        ({"CI": "true"}, (), 3),
        ({}, ("-m", "slow"), 1),
    ],
)
def test_the_slow_tier_runs_when_asked(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path, env, args, passed
):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "MANIFEST.tsv").write_text("")
    monkeypatch.setenv("HYPERMEDIA_TEST_CORPUS", str(corpus))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = _run(suite, *args)
    assert result.parseoutcomes().get("passed") == passed
    assert "slow tier" not in result.stdout.str()


def test_a_corpus_asked_for_and_missing_fails_its_tests(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path
):
    monkeypatch.setenv("HYPERMEDIA_TEST_CORPUS", str(tmp_path / "nowhere"))
    result = _run(suite)
    result.assert_outcomes(passed=1, errors=1, deselected=1)
    result.stdout.fnmatch_lines(["*the corpus tier cannot run*"])


@pytest.mark.parametrize("ci", [False, True])
def test_a_test_that_cannot_run_here_is_skipped_saying_why_and_fails_in_ci(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: bool
):
    """Not root, or a program not on PATH: skipped with the reason, but with CI=true a
    failure (CI must not pass without them); a program that is there runs."""
    monkeypatch.delenv("CI", raising=False)
    if ci:
        monkeypatch.setenv("CI", "true")
    monkeypatch.setattr("os.geteuid", lambda: 1000)  # this run's user is not root
    pytester.makeini(
        "[pytest]\nmarkers =\n    root: root\n    program: program\naddopts = --strict-markers\n"
    )
    pytester.makepyfile(test_needs=NEEDS)
    result = pytester.runpytest_inprocess("-p", "tests.tiers", "-p", "no:cacheprovider", "-rsE")
    if ci:
        result.assert_outcomes(passed=1, errors=2)  # failed at setup, as the corpus tier
    else:
        result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines(
        [
            "*the full sandbox needs root (running as uid 1000): CI must run these tests as root*",
            "*needs hypermedia-no-such-program, not on PATH*",
        ],
        consecutive=False,
    )
