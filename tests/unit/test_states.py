"""The job state machine, checked against a table written out independently here."""

from __future__ import annotations

import itertools

import pytest

from hypermedia.errors import IllegalTransition
from hypermedia.jobs.states import (
    IN_FLIGHT,
    TERMINAL,
    Backoff,
    FailureDecision,
    JobEvent,
    JobStatus,
    decide_failure,
    is_legal,
    sources,
    transition,
)

# Every legal (status, event) -> next status. Anything not listed must be refused.
EXPECTED: dict[tuple[str, str], str] = {
    ("created", "enqueue"): "queued",
    ("created", "cancel"): "cancelled",
    ("queued", "claim"): "claimed",
    ("queued", "cancel"): "cancelled",
    ("claimed", "start"): "processing",
    ("claimed", "fail"): "retry_wait",
    ("claimed", "release"): "queued",
    ("claimed", "cancel"): "cancelled",
    ("processing", "complete"): "completed",
    ("processing", "fail"): "retry_wait",
    ("processing", "release"): "queued",
    ("processing", "cancel"): "cancelled",
    ("retry_wait", "retry_due"): "queued",
    ("retry_wait", "cancel"): "cancelled",
}

STATUSES = [
    "created",
    "queued",
    "claimed",
    "processing",
    "completed",
    "retry_wait",
    "failed",
    "cancelled",
]
EVENTS = ["enqueue", "claim", "start", "complete", "fail", "retry_due", "release", "cancel"]
ALL_PAIRS = list(itertools.product(STATUSES, EVENTS))
LEGAL = [pair for pair in ALL_PAIRS if pair in EXPECTED]
ILLEGAL = [pair for pair in ALL_PAIRS if pair not in EXPECTED]


def test_the_enums_are_exactly_these():
    assert sorted(s.value for s in JobStatus) == sorted(STATUSES)
    assert sorted(e.value for e in JobEvent) == sorted(EVENTS)


def test_the_cross_product_is_covered():
    assert len(ALL_PAIRS) == 64
    assert len(LEGAL) == len(EXPECTED) == 14
    assert len(ILLEGAL) == 50


@pytest.mark.parametrize(("status", "event"), LEGAL, ids=[f"{s}-{e}" for s, e in LEGAL])
def test_legal_transition(status, event):
    after = transition(JobStatus(status), JobEvent(event))
    assert after is JobStatus(EXPECTED[(status, event)])
    assert is_legal(JobStatus(status), JobEvent(event))


@pytest.mark.parametrize(("status", "event"), ILLEGAL, ids=[f"{s}-{e}" for s, e in ILLEGAL])
def test_illegal_transition(status, event):
    assert not is_legal(JobStatus(status), JobEvent(event))
    with pytest.raises(IllegalTransition) as info:
        transition(JobStatus(status), JobEvent(event))
    error = info.value
    assert error.details == {"status": status, "event": event}
    assert status in error.message
    assert event in error.message
    assert error.code == "illegal_transition"
    assert error.status == 409
    assert error.__cause__ is None
    assert error.__suppress_context__


EXPECTED_SOURCES = {
    "enqueue": {"created"},
    "claim": {"queued"},
    "start": {"claimed"},
    "complete": {"processing"},
    "fail": {"claimed", "processing"},
    "retry_due": {"retry_wait"},
    "release": {"claimed", "processing"},
    "cancel": {"created", "queued", "claimed", "processing", "retry_wait"},
}


@pytest.mark.parametrize(("event", "expected"), sorted(EXPECTED_SOURCES.items()))
def test_sources(event, expected):
    got = sources(JobEvent(event))
    assert isinstance(got, frozenset)
    assert {s.value for s in got} == expected


def test_sources_agree_with_transition():
    for event in JobEvent:
        for status in JobStatus:
            assert (status in sources(event)) == is_legal(status, event)


def test_terminal_and_in_flight_sets():
    assert {s.value for s in TERMINAL} == {"completed", "failed", "cancelled"}
    assert {s.value for s in IN_FLIGHT} == {"claimed", "processing"}


@pytest.mark.parametrize(
    ("status", "event"),
    list(itertools.product(["completed", "failed", "cancelled"], EVENTS)),
)
def test_terminal_states_accept_nothing(status, event):
    with pytest.raises(IllegalTransition):
        transition(JobStatus(status), JobEvent(event))


def test_no_event_leads_out_of_a_terminal_state_or_into_created():
    for (status, _event), after in EXPECTED.items():
        assert status not in {"completed", "failed", "cancelled"}
        assert after != "created"


def test_statuses_are_strings_for_the_database():
    assert isinstance(JobStatus.RETRY_WAIT, str)
    assert JobStatus("retry_wait") is JobStatus.RETRY_WAIT
    assert str(JobStatus.QUEUED) == "queued"
    assert f"{JobEvent.RETRY_DUE}" == "retry_due"


# -- backoff --------------------------------------------------------------------------

DEFAULT_DELAYS = [
    (1, 60.0),
    (2, 120.0),
    (3, 240.0),
    (4, 480.0),
    (5, 960.0),
    (6, 1920.0),
    (7, 3600.0),  # 3840 capped at an hour
    (8, 3600.0),
    (20, 3600.0),
    (62, 3600.0),
    (63, 3600.0),
    (64, 3600.0),
    (1_000, 3600.0),
    (10**9, 3600.0),
    (10**100, 3600.0),
]


@pytest.mark.parametrize(("attempt", "seconds"), DEFAULT_DELAYS)
def test_default_backoff(attempt, seconds):
    delay = Backoff().delay(attempt)
    assert isinstance(delay, float)
    assert delay == seconds


@pytest.mark.parametrize(
    ("base", "cap", "attempt", "seconds"),
    [
        (1.0, 10.0, 1, 1.0),
        (1.0, 10.0, 2, 2.0),
        (1.0, 10.0, 3, 4.0),
        (1.0, 10.0, 4, 8.0),
        (1.0, 10.0, 5, 10.0),
        (1.0, 10.0, 6, 10.0),
        (0.5, 100.0, 1, 0.5),
        (0.5, 100.0, 4, 4.0),
        (30.0, 30.0, 1, 30.0),
        (30.0, 30.0, 2, 30.0),
        (60.0, 1e12, 11, 61440.0),
        (1.0, 1e30, 10**6, float(2**62)),  # the exponent is capped, not unbounded
        (1e300, float("inf"), 10**6, float("inf")),  # float saturates, nothing raises
    ],
)
def test_custom_backoff(base, cap, attempt, seconds):
    assert Backoff(base_seconds=base, max_seconds=cap).delay(attempt) == seconds


def test_backoff_doubles_until_the_cap_and_never_shrinks():
    backoff = Backoff(base_seconds=60.0, max_seconds=3600.0)
    delays = [backoff.delay(n) for n in range(1, 200)]
    assert delays == sorted(delays)
    assert max(delays) == 3600.0
    for earlier, later in itertools.pairwise(delays):
        assert later in (earlier * 2, 3600.0)


@pytest.mark.parametrize("attempt", [0, -1, -(10**9)])
def test_attempt_numbers_start_at_one(attempt):
    with pytest.raises(ValueError, match="start at 1"):
        Backoff().delay(attempt)


def test_backoff_is_a_frozen_value():
    backoff = Backoff()
    with pytest.raises(AttributeError):
        backoff.base_seconds = 1.0  # type: ignore[misc]
    assert Backoff() == Backoff(60.0, 3600.0)


# -- decide_failure --------------------------------------------------------------------

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("attempt", "max_attempts", "status", "delay"),
    [
        (1, 3, "retry_wait", 60.0),
        (2, 3, "retry_wait", 120.0),
        (3, 3, "failed", None),
        (4, 3, "failed", None),  # over the limit (max lowered meanwhile): still failed
        (1, 1, "failed", None),
        (1, 2, "retry_wait", 60.0),
        (2, 2, "failed", None),
        (5, 10, "retry_wait", 960.0),
        (7, 10, "retry_wait", 3600.0),
        (9, 10, "retry_wait", 3600.0),
        (10, 10, "failed", None),
        (99, 100, "retry_wait", 3600.0),
        (100, 100, "failed", None),
    ],
)
def test_decide_failure(attempt, max_attempts, status, delay):
    decision = decide_failure(attempt, max_attempts, NOW, Backoff())
    assert isinstance(decision, FailureDecision)
    assert decision.status is JobStatus(status)
    if delay is None:
        assert decision.retry_at is None
    else:
        assert decision.retry_at == NOW + delay
    assert f"attempt {attempt} of {max_attempts}" in decision.reason


@pytest.mark.parametrize(("attempt", "max_attempts"), [(1, 3), (2, 3), (3, 3), (1, 100)])
def test_non_retryable_errors_fail_at_once(attempt, max_attempts):
    decision = decide_failure(attempt, max_attempts, NOW, Backoff(), retryable=False)
    assert decision.status is JobStatus.FAILED
    assert decision.retry_at is None
    assert "not retryable" in decision.reason


def test_decide_failure_uses_the_given_backoff():
    decision = decide_failure(2, 5, 100.0, Backoff(base_seconds=1.0, max_seconds=10.0))
    assert decision == FailureDecision(JobStatus.RETRY_WAIT, 102.0, decision.reason)
    assert "retry in 2s" in decision.reason


def test_a_retry_decision_is_a_legal_fail_transition():
    # FAIL leads to retry_wait in the machine; decide_failure may say failed instead.
    for status in (JobStatus.CLAIMED, JobStatus.PROCESSING):
        assert transition(status, JobEvent.FAIL) is JobStatus.RETRY_WAIT
    for attempt in range(1, 6):
        decision = decide_failure(attempt, 5, NOW, Backoff())
        assert decision.status in {JobStatus.RETRY_WAIT, JobStatus.FAILED}
