"""``hypermedia run``'s wait: each poll reads the jobs not yet seen finished, so a run of
many files does not read every ended job again on every poll until the last ends."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import update

from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.runner import RunReport, Submitted, poll_statuses
from tests.factories import make_user, open_stack, submit


def _set(engine, job_id: str, status: str, error_code: str | None = None) -> None:
    with transaction(engine) as conn:
        conn.execute(
            update(t.jobs)
            .where(t.jobs.c.job_id == job_id)
            .values(status=status, error_code=error_code, error_message=error_code)
        )


def test_a_poll_reads_only_the_jobs_not_yet_finished(engine, settings, manual_clock):
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    ended, running = submit(stack, person, ["thumbnail", "convert"])
    report = RunReport(
        submitted=[Submitted(Path(f"{j}.jpg"), "thumbnail", "images", j) for j in (ended, running)]
    )
    poll_statuses(stack, report)
    assert report.statuses == {ended: "queued", running: "queued"}

    _set(engine, ended, "failed", "invalid_input")
    _set(engine, running, "processing")
    poll_statuses(stack, report)
    assert report.statuses == {ended: "failed", running: "processing"}
    assert report.errors == {ended: "invalid_input: invalid_input"}

    # What a finished job ended as is kept; only the other is read again.
    _set(engine, ended, "queued")
    _set(engine, running, "completed")
    poll_statuses(stack, report)
    assert report.statuses == {ended: "failed", running: "completed"}
    stack.close()
