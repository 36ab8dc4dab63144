"""``hypermedia status JOB_ID``'s rows name what they show: the job's end (the API's
``completed_at``, set whatever way it ended) is labelled by how it ended."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from typer.testing import CliRunner

from hypermedia.cli import app
from hypermedia.cli import jobs as cli_jobs
from hypermedia.ingest.schemas import JobResponse

AT = datetime(2026, 12, 7, 11, 19, 56, tzinfo=UTC)


class FakeClient:
    def __init__(self, job: JobResponse) -> None:
        self._job = job

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def job(self, job_id: str) -> JobResponse:
        return self._job

    def attempt_log(self, job_id: str, number: int) -> str:
        raise AssertionError("no attempt has a log")


def job(status: str, **extra: Any) -> JobResponse:
    ended = status in ("completed", "failed", "cancelled")
    return JobResponse.model_validate(
        {
            "job_id": "j1",
            "object_id": "o1",
            "operation": "pdf_preview",
            "queue": "documents",
            "priority": 2,
            "status": status,
            "cancel_requested": False,
            "attempt_count": 1,
            "max_attempts": 3,
            "estimated_credits": 0.225,
            "created_at": AT,
            "queued_at": AT,
            "started_at": AT,
            "completed_at": AT if ended else None,
        }
        | extra
    )


@pytest.mark.parametrize(
    ("status", "label"),
    [("completed", "completed"), ("failed", "failed"), ("cancelled", "cancelled")],
)
def test_a_jobs_end_is_labelled_by_how_it_ended(monkeypatch, status, label):
    monkeypatch.setattr(cli_jobs, "open_client", lambda *args: FakeClient(job(status)))
    shown = CliRunner().invoke(app, ["status", "j1"], env={"HYPERMEDIA_API_KEY": "hm_x_y"})
    assert shown.exit_code == 0, shown.output
    assert f"\n{label:<11}2026-12-07T11:19:56+00:00\n" in shown.stdout
    others = {"completed", "failed", "cancelled", "ended"} - {label}
    assert not any(f"\n{other:<11}2" in shown.stdout for other in others), shown.stdout


def test_a_job_not_ended_shows_no_end(monkeypatch):
    monkeypatch.setattr(cli_jobs, "open_client", lambda *args: FakeClient(job("processing")))
    shown = CliRunner().invoke(app, ["status", "j1"], env={"HYPERMEDIA_API_KEY": "hm_x_y"})
    assert shown.exit_code == 0, shown.output
    assert "\nended      -\n" in shown.stdout


def test_a_client_command_without_a_key_says_where_one_comes_from():
    """A new operator's first `submit` after `up`: told to set a key, and how to get one."""
    shown = CliRunner().invoke(app, ["status", "j1"])
    said = str(shown.exception)  # the entry point prints it as `error: <code>: <it>`
    assert "HYPERMEDIA_API_KEY" in said
    assert "hypermedia user add" in said, said
