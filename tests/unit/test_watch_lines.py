"""What `hypermedia watch` writes beside each job's bar, from its events."""

from __future__ import annotations

import pytest

from hypermedia.cli.jobs import _amount
from hypermedia.ingest.schemas import JobEvent


@pytest.mark.parametrize(
    ("phase", "done", "total", "unit", "shown"),
    [
        ("download", 1536.0, 3072.0, "bytes", "1.5 KB of 3.0 KB"),
        ("run", 12.5, 60.0, "seconds", "12.5 of 60 seconds"),
        ("run", 3.0, None, "pages", "3 pages"),
        # The run phase begins, its measure unknown (after a download's full bar).
        ("run", 0.0, None, "", ""),
    ],
)
def test_the_amount_beside_a_bar(
    phase: str, done: float, total: float | None, unit: str, shown: str
) -> None:
    event = JobEvent(type="progress", phase=phase, done=done, total=total, unit=unit)
    assert _amount(event) == shown
