"""A bulk run's progress (hypermedia.bulk.runs.progress): its whole, what is done,
failed and left, the share, the rate and the ETA, from its counts alone."""

from __future__ import annotations

from typing import Any

import pytest

from hypermedia.bulk.runs import Progress, progress

BASE: dict[str, Any] = {
    "kind": "backfill",
    "state": "creating",
    "total": 1000,
    "scanned": 0,
    "created_jobs": 0,
    "skipped": 0,
    "unfit": 0,
    "migrated": 0,
    "failed": 0,
    "jobs": {},
}


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        # just created: nothing done, no rate
        ({}, Progress(1000, 0, 0, 0, 1000, 0.0, None, None)),
        # 400 scanned: 100 skipped, 20 unfit, 280 jobs (200 completed, 5 failed, 3
        # cancelled, 72 live); 205 ended in the last 100 s: 2.05 a second; left: the 72
        # live and the 600 unscanned at 280 jobs for 400 objects (420): 492 / 2.05
        (
            {
                "scanned": 400,
                "created_jobs": 280,
                "skipped": 100,
                "unfit": 20,
                "jobs": {
                    "completed": 200,
                    "failed": 5,
                    "cancelled": 3,
                    "queued": 50,
                    "claimed": 22,
                },
                "ended_recently": 205,
                "window_seconds": 100.0,
            },
            Progress(1000, 320, 8, 72, 672, 32.8, 2.05, 240.0),
        ),
        # objects stored since the create: the whole grows with what was scanned
        ({"scanned": 1200, "skipped": 1200}, Progress(1200, 1200, 0, 0, 0, 100.0, None, None)),
        # draining: nothing left to scan, the whole is what was scanned (some deleted)
        (
            {"state": "draining", "scanned": 900, "skipped": 890, "jobs": {"processing": 10}}
            | {"created_jobs": 10, "ended_recently": 2, "window_seconds": 600.0},
            Progress(900, 890, 0, 10, 10, 98.9, 0.003, 3000.0),
        ),
        (
            {"state": "completed", "scanned": 0, "total": 5},
            Progress(0, 0, 0, 0, 0, 100.0, None, None),
        ),
        # paused, cancelled: a share, no ETA (not running)
        (
            {"state": "paused", "scanned": 100, "skipped": 100, "ended_recently": 9}
            | {"window_seconds": 60.0},
            Progress(1000, 100, 0, 0, 900, 10.0, 0.15, None),
        ),
        (
            {"state": "cancelled", "scanned": 10, "created_jobs": 10}
            | {"jobs": {"completed": 4, "cancelled": 6}},
            Progress(1000, 4, 6, 0, 990, 1.0, None, None),
        ),
        # a run from before totals: counts only while it scans, a whole once drained
        (
            {"total": None, "scanned": 50, "skipped": 50},
            Progress(None, 50, 0, 0, None, None, None, None),
        ),
        (
            {"total": None, "state": "completed", "scanned": 50, "skipped": 50},
            Progress(50, 50, 0, 0, 0, 100.0, None, None),
        ),
        # an empty selection
        ({"total": 0}, Progress(0, 0, 0, 0, 0, 0.0, None, None)),
        # a migration: copies, no jobs, no rate
        (
            {"kind": "migrate", "scanned": 300, "migrated": 290, "failed": 10}
            | {"ended_recently": 5, "window_seconds": 60.0},
            Progress(1000, 290, 10, 0, 700, 30.0, None, None),
        ),
    ],
)
def test_progress(changes: dict[str, Any], expected: Progress) -> None:
    assert progress(**(BASE | changes)) == expected
