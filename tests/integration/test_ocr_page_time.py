"""A long scan is read in the time its pages need: the ocr profile gives a job 300 s
and 12 s a page (``timeout_seconds_per_page``), up to ``max_timeout_seconds``; the
submit works the job's time out from the page count its upload's inspection found and
keeps it on the job, and the worker runs the job's child under it (CPU rlimit, wall
clock) and holds its lease for it. A document whose time would pass the cap is refused
at submit (``page_limit``), naming the most pages the cap allows.

Cheap: the 40-page scan's pages are tiny, and the worker's step here records what it
was handed instead of reading them (the real ocr step is test_pipeline_ocr's).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, update

from hypermedia.clock import to_datetime
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.errors import PageLimit
from hypermedia.ingest.service import SubmitRequest
from hypermedia.jobs.dispatcher import lease_seconds
from hypermedia.stack import Stack
from hypermedia.storage.grants import OutputGrant
from hypermedia.worker.execute import Completion, JobExecution
from pipelines.formats.inspection import inspect_file
from tests import ray_support
from tests.factories import make_object, make_user, open_stack, pdf_inspection
from tests.generated import ocr_pages

PAGES = 40
TIME = 300 + 12 * PAGES  # the shipped ocr profile's time for 40 pages


@pytest.fixture
def scan(tmp_path: Path) -> Path:
    path = tmp_path / "scan.pdf"
    ocr_pages.long_scan(path, PAGES)
    return path


def _job_row(stack: Stack, job_id: str) -> Any:
    with transaction(stack.engine) as conn:
        return conn.execute(select(t.jobs).where(t.jobs.c.job_id == job_id)).one()


def _jobs(stack: Stack) -> int:
    with transaction(stack.engine) as conn:
        return int(conn.execute(select(func.count()).select_from(t.jobs)).scalar_one())


def test_a_40_page_scan_is_accepted_with_the_time_its_pages_need(
    engine, settings, manual_clock, scan
):
    """It was refused (page_limit, 25 pages: what a flat 300 s reads). Its job's time is
    300 + 12 x 40 s, and its reservation holds the escalations of all 40 pages."""
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    inspection = inspect_file(scan)
    assert inspection.kind == "pdf" and inspection.details["pages"] == PAGES
    obj = make_object(stack, person, size_bytes=scan.stat().st_size, inspection=inspection)
    result = stack.ingest.submit(person.caller, SubmitRequest(object_id=obj, operations=["ocr"]))
    (job,) = result.jobs
    assert _job_row(stack, job.job_id).timeout_seconds == TIME
    # 0.25 for each of the 2 escalations (a 3-engine chain) of every page.
    assert job.reserved_millicredits == job.estimated_millicredits + 250 * 2 * PAGES
    # A one-page image keeps little more than the profile's time.
    image = make_object(stack, person, inspection=inspect_file(_one_page(scan.parent)))
    small = stack.ingest.submit(
        person.caller, SubmitRequest(object_id=image, operations=["ocr"])
    ).jobs[0]
    assert _job_row(stack, small.job_id).timeout_seconds == 312
    stack.close()


def _one_page(directory: Path) -> Path:
    path = directory / "page.png"
    ocr_pages.clean_page(size=20, margin=20).save(path)
    return path


def test_a_document_past_the_time_cap_is_refused_naming_the_most_pages(
    engine, settings, manual_clock, scan, tmp_path
):
    """Shipped, 501 pages pass the profile's max_pages (500); with a cap of 1,000 s,
    (1,000 - 300) / 12 = 58 pages: the 40-page scan fits, a 59-page one is refused.
    Nothing is created or reserved."""
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    long = make_object(stack, person, inspection=pdf_inspection(501))
    with pytest.raises(PageLimit) as caught:
        stack.ingest.submit(person.caller, SubmitRequest(object_id=long, operations=["ocr"]))
    assert caught.value.details["limit"] == 500
    stack.close()

    profiles = ray_support.test_profiles(tmp_path)
    text = profiles.read_text()
    assert "max_timeout_seconds = 7200\n" in text
    profiles.write_text(
        text.replace("max_timeout_seconds = 7200\n", "max_timeout_seconds = 1000\n")
    )
    stack = open_stack(settings, engine, manual_clock, profiles_path=profiles)
    person = make_user(stack, credits=100)
    fits = make_object(stack, person, inspection=inspect_file(scan))
    (job,) = stack.ingest.submit(
        person.caller, SubmitRequest(object_id=fits, operations=["ocr"])
    ).jobs
    assert _job_row(stack, job.job_id).timeout_seconds == TIME
    over = make_object(stack, person, inspection=pdf_inspection(59))
    with pytest.raises(PageLimit) as caught:
        stack.ingest.submit(person.caller, SubmitRequest(object_id=over, operations=["ocr"]))
    assert caught.value.status == 422 and caught.value.code == "page_limit"
    assert caught.value.details["limit"] == 58 and caught.value.details["pages"] == 59
    assert caught.value.details["object_id"] == over
    assert "at most 58 pages" in caught.value.message
    assert "over its limit of 1,000 s" in caught.value.message
    assert _jobs(stack) == 1
    stack.close()


class _Input:
    """Serves the job's input over HTTP (the grants a worker asks for its input)."""

    def __init__(self, payload: bytes) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def input_url(self, job_id: str, worker_id: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/input"

    def output_urls(
        self, job_id: str, worker_id: str, output_types: Mapping[str, str | None]
    ) -> dict[str, OutputGrant]:
        raise AssertionError("the recording step has no outputs")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class _Result:
    outputs: list[Any] = field(default_factory=list)
    duration_ms: int = 1
    peak_memory_mb: float | None = None


class _Recording:
    """An executor whose step records the limits it was handed and waits until the
    job's lease is the job's own (the worker's watcher extends it)."""

    def __init__(self, root: Path, stack: Stack, lease_until: float) -> None:
        self.root = root
        self.stack = stack
        self.lease_until = lease_until
        self.limits: dict[str, Any] = {}

    def prepare(self, job_id: str) -> Path:
        workdir = self.root / job_id
        (workdir / "input").mkdir(parents=True, exist_ok=True)
        return workdir

    def run(self, job_id: str, operation: str, input_path: Path, params: Any, **limits: Any):
        self.limits = {k: v for k, v in limits.items() if k != "on_progress"}
        deadline = time.monotonic() + 10
        while _job_row(self.stack, job_id).visibility_timeout < to_datetime(self.lease_until):
            assert time.monotonic() < deadline, "the job's lease was never its own"
            time.sleep(0.02)
        return _Result()

    def cancel(self, job_id: str) -> bool:
        return False

    def cleanup(self, job_id: str) -> None:
        pass


@pytest.fixture
def served(scan: Path) -> Iterator[_Input]:
    server = _Input(scan.read_bytes())
    yield server
    server.close()


def test_the_worker_runs_a_job_under_its_own_time(
    engine, settings, manual_clock, scan, served, tmp_path
):
    """The job's child gets the job's 780 s (CPU rlimit; wall clock x 1.5), not the
    profile's 300, and its lease is held for 780 x 1.5 s plus the grace, not 300's."""
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    obj = make_object(stack, person, size_bytes=scan.stat().st_size, inspection=inspect_file(scan))
    stack.ingest.submit(person.caller, SubmitRequest(object_id=obj, operations=["ocr"]))
    (job,) = stack.dispatcher.claim_and_start("ocr", "page-w")
    assert job.timeout_seconds == TIME
    now = stack.clock.now()
    executor = _Recording(
        tmp_path / "work", stack, now + lease_seconds(TIME, stack.dispatcher.grace)
    )
    execution = JobExecution(
        stack.dispatcher, stack.catalog, served, executor, "page-w", poll_seconds=0.05
    )
    try:
        done = execution.run_started(job)
    finally:
        execution.close()
    assert isinstance(done, Completion)
    assert executor.limits["timeout_seconds"] == TIME
    assert executor.limits["memory_limit_mb"] == stack.catalog.get("ocr").memory_limit_mb
    # A job from before migration 0021 (no time of its own) runs under its profile's.
    (older,) = stack.ingest.submit(
        person.caller, SubmitRequest(object_id=obj, operations=["ocr"])
    ).job_ids
    with transaction(stack.engine) as conn:
        conn.execute(update(t.jobs).where(t.jobs.c.job_id == older).values(timeout_seconds=None))
    (job,) = stack.dispatcher.claim_and_start("ocr", "page-w")
    assert job.timeout_seconds is None
    executor.lease_until = stack.clock.now() + lease_seconds(300, stack.dispatcher.grace)
    execution = JobExecution(
        stack.dispatcher, stack.catalog, served, executor, "page-w", poll_seconds=0.05
    )
    try:
        assert isinstance(execution.run_started(job), Completion)
    finally:
        execution.close()
    assert executor.limits["timeout_seconds"] == 300
    stack.close()
