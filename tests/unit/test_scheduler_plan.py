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
