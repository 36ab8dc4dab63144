"""plan_of: the fleet's part of a turn (what request_resources is told)."""

from __future__ import annotations

import pytest

from autoscaler.snapshot import Decision, QueueState, Snapshot, Spend, WorkerState, plan_of


def worker(worker_id: str, queue: str, status: str = "active", provider: str | None = "aws"):
    return WorkerState(worker_id, queue, status, started_at=0.0, provider=provider)  # type: ignore[arg-type]


def snapshot(*workers: WorkerState) -> Snapshot:
    queues = {name: QueueState(name, 0) for name in ("images", "ocr", "bulk")}
    return Snapshot(now=100.0, queues=queues, workers=workers, offers={}, spend=Spend(0, 0))


@pytest.mark.parametrize(
    ("workers", "decisions", "desired"),
    [
        ((), [], {"images": 0, "ocr": 0, "bulk": 0}),
        # VPS workers are not the fleet's: only cloud workers count.
        ((worker("vps-1", "images", provider=None),), [], {"images": 0, "ocr": 0, "bulk": 0}),
        ((worker("i-1", "ocr"), worker("i-2", "ocr", "starting")), [], {"ocr": 2}),
        # A draining worker is already leaving; a terminate ends it without changing the count.
        (
            (worker("i-1", "ocr"), worker("i-2", "ocr", "draining")),
            [Decision("terminate", "t", queue="ocr", worker_id="i-2")],
            {"ocr": 1},
        ),
        ((worker("i-1", "ocr"),), [Decision("launch", "l", queue="ocr", count=3)], {"ocr": 4}),
        (
            (worker("i-1", "ocr"), worker("i-2", "bulk")),
            [Decision("drain", "d", queue="ocr", worker_id="i-1")],
            {"ocr": 0, "bulk": 1},
        ),
        # Records (alert, lock, hold) are not fleet actions and change nothing.
        (
            (worker("i-1", "bulk"),),
            [Decision("alert", "a"), Decision("hold", "h", queue="bulk")],
            {"bulk": 1},
        ),
    ],
)
def test_desired_workers_per_queue(workers, decisions, desired):
    plan = plan_of(snapshot(*workers), decisions)
    assert {q: plan.desired[q] for q in desired} == desired
    assert set(plan.desired) == {"images", "ocr", "bulk"}
    assert [d.action for d in plan.actions] == [
        d.action for d in decisions if d.action in ("launch", "drain", "terminate")
    ]


def _turn(config, *workers: WorkerState, locked: bool = False) -> dict[str, int]:
    """What the fleet asks Ray for after the policy's turn over an empty cluster."""
    from autoscaler import policy
    from autoscaler.snapshot import actor_totals
    from tests.unit.test_scheduler_policy import NOW, OFFERS

    queues = {name: QueueState(name, 0) for name in config.queues}
    spend = Spend(0, 0, locked=locked)
    now = Snapshot(now=NOW, queues=queues, workers=workers, offers=OFFERS, spend=spend)  # type: ignore[arg-type]
    return actor_totals(config, plan_of(now, policy.decide(config, now)))


def test_cloud_first_asks_for_its_baseline_once():
    """cloud_first keeps on the cloud the part of a queue's baseline the VPS does not
    hold (the VPS holds one worker of a cloud-enabled queue): the fleet's request counts
    the VPS's worker and those cloud workers once each, not the baseline and again the
    cloud's (four nodes asked for a baseline of two)."""
    from tests.unit.test_scheduler_policy import make_config

    cloud_first = make_config("cloud_first", queues__ocr__baseline_workers=3)
    assert _turn(cloud_first)["ocr"] == 3
    assert _turn(cloud_first, worker("vps-1", "ocr", provider=None))["ocr"] == 3
    # The cloud's two launched and running, the queue empty: still three.
    running = (worker("vps-1", "ocr", provider=None), worker("i-1", "ocr"), worker("i-2", "ocr"))
    assert _turn(cloud_first, *running)["ocr"] == 3
    # A third cloud worker (a burst that went idle) is drained: back to three.
    assert _turn(cloud_first, *running, worker("i-3", "ocr"))["ocr"] == 3
    # Locked by the daily cap: the cloud workers drain, the VPS's worker stays.
    assert _turn(cloud_first, *running, locked=True)["ocr"] == 1
    # images is not cloud-enabled: its whole baseline on the VPS, in every mode.
    assert _turn(cloud_first)["images"] == 1
    # hybrid: the VPS holds the baseline, the cloud only bursts.
    hybrid = make_config("hybrid", queues__ocr__baseline_workers=3)
    assert _turn(hybrid)["ocr"] == 3
    assert _turn(hybrid, running[1])["ocr"] == 3  # an idle burst worker drains
