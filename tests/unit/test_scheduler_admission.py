"""The one admission rule the policy and the node provider share (autoscaler.admission)."""

from __future__ import annotations

import pytest

from autoscaler import admission, cost, policy
from autoscaler.snapshot import Spend
from tests.unit.test_scheduler_policy import NOW, cloud, make_config, of, queue, snap, vps


def verdict(
    *, locked: bool = False, last_hour: float = 0.0, launches: tuple[float, ...] = ()
) -> cost.GuardVerdict:
    config = make_config()
    return cost.guard(
        config.cost_limits,
        Spend(last_hour, 0.0, locked=locked),
        now=NOW,
        committed_cents_per_hour=0.0,
        launches=launches,
        max_launches=2,
        stop_horizon_seconds=policy.stop_horizon_seconds(config),
    )


@pytest.mark.parametrize(
    ("mode", "changes", "queue_name", "workers", "guard", "room", "refusal", "configured"),
    [
        ("hybrid", {}, "ocr", 0, {}, 10, None, False),
        ("hybrid", {}, "ocr", 9, {}, 1, None, False),
        # every worker counts, the baseline is not subtracted again
        ("hybrid", {"queues__ocr__baseline_workers": 2}, "ocr", 3, {}, 7, None, False),
        ("cloud_first", {"queues__ocr__baseline_workers": 2}, "ocr", 0, {}, 10, None, False),
        ("hybrid", {}, "ocr", 10, {}, 0, "ocr has 10 workers, at max_workers (10)", False),
        ("hybrid", {}, "ocr", 12, {}, 0, "ocr has 12 workers, at max_workers (10)", False),
        ("vps_only", {}, "ocr", 0, {}, 0, "mode is vps_only", True),
        ("hybrid", {}, "images", 0, {}, 0, "images is not cloud-enabled", True),
        ("hybrid", {}, "thumbnails", 0, {}, 0, "queue thumbnails is not in scheduler.json", True),
        # the lock first, whatever the mode; it is a state, not the configuration
        ("vps_only", {}, "ocr", 0, {"locked": True}, 0, admission.LOCKED, False),
        ("hybrid", {}, "ocr", 0, {"last_hour": 500.0}, 0, "hourly spend $5.00", False),
        ("hybrid", {}, "ocr", 0, {"launches": (NOW - 1, NOW - 2)}, 0, "launch-rate cap", False),
        # at max_workers before the cost guard
        ("hybrid", {}, "ocr", 10, {"last_hour": 500.0}, 0, "at max_workers", False),
    ],
)
def test_admission_cases(mode, changes, queue_name, workers, guard, room, refusal, configured):
    config = make_config(mode, **changes)
    answer = admission.admit(config, queue_name, verdict=verdict(**guard), queue_workers=workers)
    assert answer.room == room
    if refusal is None:
        assert answer.refusal is None
    else:
        assert answer.refusal is not None and refusal in answer.refusal
    assert answer.configured is configured
    assert answer.closed is (configured or guard.get("locked", False))


def test_provider_room_counts_instances_not_yet_terminated():
    config = make_config(cloud_providers__aws__max_instances=3)
    assert admission.provider_room(config, ["aws", "google"], {"aws": 2}) == {
        "aws": 1,
        "google": 5,
    }


def test_the_policy_holds_for_the_admissions_reason():
    """The policy's hold names what admit says: the provider refuses with the same words."""
    config = make_config(queues__ocr__max_workers=2)
    workers = (vps("v-1"), cloud("w-1", status="draining", jobs=1, drain_for=10))
    decisions = policy.decide(config, snap(queue(depth=150), workers=workers))
    [hold] = of(decisions, "hold")
    said = admission.admit(config, "ocr", verdict=verdict(), queue_workers=2).refusal
    assert said is not None and hold.reason.endswith(said)
