"""The worker's loops without Ray: claim-and-start, jobs taken ahead (prefetch: each
started as its loop reaches it, handed back when the job before it runs long), the
completion batcher (group commit), operations that need no input, drain with
prefetched jobs.

Steps run in-process (:class:`~bench.in_process.InProcessExecutor`, the
benchmark's executor) so these tests are about the job path, not the sandbox,
which ``test_sandbox_executor`` and ``test_workers`` cover.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil
import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from autoscaler import config as scheduler_config
from bench.in_process import InProcessExecutor
from hypermedia.cli import app
from hypermedia.clock import to_datetime
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.ingest.service import SubmitRequest
from hypermedia.runner import paused_workers
from hypermedia.stack import Stack
from hypermedia.storage.grants import OutputGrant
from hypermedia.worker.execute import Completion, JobExecution, Outcome
from hypermedia.worker.worker import Worker
from tests import ray_support, support
from tests.factories import Person, make_object, make_user, open_stack
from tests.pipelines_for_tests import PRELOAD
from tests.worker_support import NoGrants, loop_worker


@contextmanager
def running_worker(
    stack: Stack,
    tmp_path: Path,
    *,
    prefetch: int,
    concurrency: int = 2,
    worker_id: str = "loop-w",
    queue: str = "bulk",
    grants: NoGrants | None = None,
    **options: Any,
) -> Iterator[tuple[Worker, NoGrants]]:
    grants = grants or NoGrants()
    worker = loop_worker(
        stack,
        tmp_path / "work",
        worker_id,
        queue=queue,
        concurrency=concurrency,
        grants=grants,
        prefetch=prefetch,
        **options,
    )
    worker.start()
    try:
        yield worker, grants
    finally:
        if not worker.wait(0):
            worker.stop()


def _submit_noops(stack: Stack, count: int) -> list[str]:
    person = make_user(stack)
    obj = make_object(stack, person)
    requests = [SubmitRequest(object_id=obj, operations=["test.noop"]) for _ in range(count)]
    return [r.job_ids[0] for r in stack.ingest.submit_many(person.caller, requests)]


def _statuses(stack: Stack) -> dict[str, int]:
    with transaction(stack.engine) as conn:
        return {
            str(k): int(v)
            for k, v in conn.execute(
                select(t.jobs.c.status, func.count()).group_by(t.jobs.c.status)
            ).all()
        }


def _wait(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_noop_jobs_drain_through_prefetch_and_group_commit(engine, settings, tmp_path):
    stack = open_stack(settings, engine, None, profiles_path=ray_support.test_profiles(tmp_path))
    job_ids = _submit_noops(stack, 300)
    with running_worker(stack, tmp_path, prefetch=25) as (worker, grants):
        _wait(lambda: worker.stats.completed == len(job_ids))
        worker.stop()
    assert grants.calls == 0
    assert worker.stats.claimed == len(job_ids) and worker.stats.lost == 0
    assert worker.completions is not None and worker.completions.commits < len(job_ids)
    assert _statuses(stack) == {"completed": len(job_ids)}
    with transaction(stack.engine) as conn:
        attempts = conn.execute(
            select(t.attempts.c.status, func.count()).group_by(t.attempts.c.status)
        ).all()
        charges = conn.execute(
            select(func.count())
            .select_from(t.credit_ledger)
            .where(t.credit_ledger.c.kind == "charge")
        ).scalar_one()
        reserved = conn.execute(select(t.credit_accounts.c.reserved_millicredits)).scalars().all()
    assert [tuple(a) for a in attempts] == [("completed", len(job_ids))]
    # Taken 25 at a time, most were started and completed in one batch: each still has
    # its start, that of its attempt, before its end.
    with transaction(stack.engine) as conn:
        times = conn.execute(
            select(t.jobs.c.started_at, t.jobs.c.completed_at, t.attempts.c.started_at).join(
                t.attempts, t.attempts.c.job_id == t.jobs.c.job_id
            )
        ).all()
    assert len(times) == len(job_ids)
    assert all(job_start == attempt_start <= end for job_start, end, attempt_start in times)
    assert len({job_start for job_start, _end, _attempt in times}) > len(job_ids) // 25
    assert charges == len(job_ids)
    assert set(reserved) == {0}
    assert stack.queue.counts("bulk").leased == 0
    assert not list((tmp_path / "work" / "jobs").iterdir())  # every workdir removed
    stack.close()


def test_jobs_on_either_side_of_a_deploy_run_with_their_own_version(engine, settings, tmp_path):
    """A deploy (a stack opened on profiles where test.noop is at v2: ``db upgrade`` or a
    restart syncs them) between submits and runs. A worker that read its catalog before
    meets jobs of v2, one that read it after meets jobs queued at v1: each runs every
    job with the profile it was submitted with (read from the record once). Before,
    both failed such jobs for good as ``profile_missing``."""
    (tmp_path / "v1").mkdir()
    (tmp_path / "v2").mkdir()
    v1 = ray_support.test_profiles(tmp_path / "v1")
    v2 = ray_support.test_profiles(tmp_path / "v2")
    text = v2.read_text()
    block = text.index('[profiles."test.noop"]')
    version = text.index("version = 1\n", block)
    params = text.index("params = { needs_input = false }", block)
    assert version < params < text.index("[", block + 1)
    v2.write_text(
        text[:version]
        + "version = 2\n"
        + text[version + len("version = 1\n") : params]
        + "params = { needs_input = false, v = 2 }"
        + text[params + len("params = { needs_input = false }") :]
    )
    before = open_stack(settings, engine, None, profiles_path=v1)
    old_jobs = _submit_noops(before, 5)
    after = open_stack(settings, engine, None, profiles_path=v2)  # the deploy
    new_jobs = _submit_noops(after, 5)
    assert before.catalog.get("test.noop").version == 1
    assert after.catalog.get("test.noop").version == 2

    def versions(job_ids: list[str]) -> set[int]:
        with transaction(after.engine) as conn:
            return set(
                conn.execute(
                    select(t.profiles.c.version)
                    .join(t.jobs, t.jobs.c.profile_id == t.profiles.c.profile_id)
                    .where(t.jobs.c.job_id.in_(job_ids))
                ).scalars()
            )

    assert versions(old_jobs) == {1} and versions(new_jobs) == {2}
    # The worker of before's catalog takes all ten: v1's as it knows them, v2's read.
    with running_worker(before, tmp_path, prefetch=1) as (worker, _grants):
        _wait(lambda: worker.stats.completed + worker.stats.failed >= 10)
        worker.stop()
    assert worker.stats.completed == 10, worker.stats
    # A v1 job still queued meets a worker of after's catalog (v1 inactive there).
    late = _submit_noops(before, 3)  # before's ingest still submits v1
    assert versions(late) == {1}
    with running_worker(after, tmp_path, prefetch=1, worker_id="after-w") as (worker, _grants):
        _wait(lambda: worker.stats.completed + worker.stats.failed >= 3)
        worker.stop()
    assert worker.stats.completed == 3, worker.stats
    assert _statuses(after) == {"completed": 13}
    before.close()
    after.close()


def _profiles_without_input(directory: Path, operation: str) -> Path:
    """The test profiles, with ``operation`` reading no input (so no storage needed)."""
    path = ray_support.test_profiles(directory)
    header = f'[profiles."{operation}"]\n'
    text = path.read_text()
    assert header in text
    path.write_text(text.replace(header, header + "params = { needs_input = false }\n"))
    return path


def test_drain_hands_back_prefetched_jobs_not_begun(pg_engine, settings, tmp_path):
    profiles = _profiles_without_input(tmp_path, "test.sleep")
    stack = open_stack(settings, pg_engine, None, profiles_path=profiles)
    person = make_user(stack)
    obj = make_object(stack, person)
    params = {"test.sleep": {"seconds": 1}}
    requests = [
        SubmitRequest(object_id=obj, operations=["test.sleep"], params=params) for _ in range(4)
    ]
    job_ids = [r.job_ids[0] for r in stack.ingest.submit_many(person.caller, requests)]
    # One loop takes all four jobs at once.
    worker = loop_worker(stack, tmp_path / "work", "drainer", prefetch=4)
    worker.start()
    # Taken ahead, the three behind the first are claimed, not yet started.
    _wait(lambda: _statuses(stack) == {"processing": 1, "claimed": 3})
    handed_back = worker.drain(timeout=30)
    assert worker.stats.completed == 1 and worker.stats.released == 3
    assert sorted(handed_back) == sorted(job_ids[1:])
    views = [stack.ingest.get_job(person.caller, j) for j in job_ids]
    assert [v.status for v in views] == ["completed", "queued", "queued", "queued"]
    assert [v.attempt_count for v in views] == [1, 0, 0, 0]
    assert [a.status for v in views[1:] for a in v.attempts] == ["released"] * 3
    assert sorted(stack.queue.ready_ids("images")) == sorted(job_ids[1:])
    stack.close()


def _one_sleep_job(settings, engine, tmp_path: Path, seconds: float) -> tuple[Stack, Person, str]:
    """A stack with the test profiles, a user and their one test.sleep job, queued."""
    stack = open_stack(settings, engine, None, profiles_path=ray_support.test_profiles(tmp_path))
    person = make_user(stack)
    request = SubmitRequest(
        object_id=make_object(stack, person),
        operations=["test.sleep"],
        params={"test.sleep": {"seconds": seconds}},
    )
    return stack, person, stack.ingest.submit(person.caller, request).job_ids[0]


class _InputServer(NoGrants):
    """Serves each job's input by ``get`` (an HTTP handler's ``do_GET``)."""

    def __init__(self, get: Callable[[BaseHTTPRequestHandler], None]) -> None:
        super().__init__()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                get(self)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def input_url(self, job_id: str, worker_id: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{job_id}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _HeldInput(_InputServer):
    """An input URL whose download hangs until ``release``: a user's cancel arrives
    while the job's input is still coming, before its step (or child) exists."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        self.released = threading.Event()

        def get(handler: BaseHTTPRequestHandler) -> None:
            self.requested.set()
            self.released.wait(60)
            handler.send_response(200)
            handler.send_header("Content-Length", "1")
            handler.end_headers()
            handler.wfile.write(b"x")

        super().__init__(get)

    def close(self) -> None:
        self.released.set()
        super().close()


class _GrantsDown(NoGrants):
    """Grants answered as the grants actor answers them, with the head's record or
    storage down: the error's code and message, raised again in the worker."""

    def __init__(self, code: str) -> None:
        super().__init__()
        self.code = code

    def input_url(self, job_id: str, worker_id: str) -> str:
        from hypermedia.worker.actor import _raise

        url: str = _raise(("error", self.code, f"{self.code}: the head could not sign"))
        return url


@pytest.mark.parametrize("code", ["database_unavailable", "storage_unavailable", "storage_full"])
def test_grants_the_head_could_not_make_for_an_outage_are_retried(engine, settings, tmp_path, code):
    """Any code but not_found and illegal_transition came back from the grants actor as
    ServiceUnavailable, and only the record's or Redis' outage was retried: a storage
    outage at the head failed every job it met for good, at its first attempt. Such an
    outage is the platform's: the job is handed back to retry_wait, no attempt spent."""
    stack, _person, job_id = _one_sleep_job(settings, engine, tmp_path, 0.1)
    execution = JobExecution(
        stack.dispatcher,
        stack.catalog,
        _GrantsDown(code),
        InProcessExecutor(tmp_path / "work", PRELOAD),
        "w",
    )
    try:
        (job,) = stack.dispatcher.claim_and_start("images", "w")
        outcome = execution.run_started(job)
    finally:
        execution.close()
    assert isinstance(outcome, Outcome), outcome
    assert (outcome.status, outcome.error_code) == ("released", code), outcome
    with transaction(stack.engine) as conn:
        row = conn.execute(
            select(t.jobs.c.status, t.jobs.c.attempt_count).where(t.jobs.c.job_id == job_id)
        ).one()
    assert (row.status, row.attempt_count) == ("retry_wait", 0)
    stack.close()


class _StorageComesBack(_InputServer):
    """The input's URL, which the head cannot sign while ``down`` is set (its storage is
    unavailable: the grants actor's answer, raised again in the worker); ``refusals``:
    it comes back by itself after that many. ``refused``: when (monotonic) each was."""

    def __init__(self, refusals: int | None = None) -> None:
        self.down = threading.Event()
        self.refusals = refusals
        self.refused: list[float] = []

        def get(handler: BaseHTTPRequestHandler) -> None:
            handler.send_response(200)
            handler.send_header("Content-Length", "1")
            handler.end_headers()
            handler.wfile.write(b"x")

        super().__init__(get)

    def input_url(self, job_id: str, worker_id: str) -> str:
        from hypermedia.worker.actor import _raise

        if self.down.is_set():
            self.refused.append(time.monotonic())
            if self.refusals is not None and len(self.refused) >= self.refusals:
                self.down.clear()
            _raise(("error", "storage_unavailable", "the file storage is unavailable"))
        return super().input_url(job_id, worker_id)


class _SlowWarnings(logging.Handler):
    """Takes its time over the records that hold ``words``."""

    def __init__(self, words: str) -> None:
        super().__init__(logging.WARNING)
        self.words = words

    def emit(self, record: logging.LogRecord) -> None:
        if self.words in record.getMessage():
            time.sleep(0.2)  # within the test's pause of 1 s


def test_a_worker_whose_jobs_meet_an_outage_stops_claiming_for_a_while(engine, settings, tmp_path):
    """A job that fails because the storage is down is handed back for later; the next
    jobs would meet the same outage at once (each spending an attempt, before such an
    attempt counted: a few minutes of outage failed every queued job for good). The
    worker claims nothing for a while
    after such a failure, twice as long after the next, and claims as before once a job
    completes again. The pause (since the first failure, why, how long) is the row's
    once it ended (it was said only in the worker's log)."""
    stack, person, _first = _one_sleep_job(settings, engine, tmp_path, 0.05)
    for _ in range(3):
        stack.ingest.submit(
            person.caller,
            SubmitRequest(
                object_id=make_object(stack, person),
                operations=["test.sleep"],
                params={"test.sleep": {"seconds": 0.05}},
            ),
        )
    # Down for the first two jobs: back by itself, however late the test looks.
    storage = _StorageComesBack(refusals=2)
    storage.down.set()
    # When each claim was made: the pauses are checked as the gaps between a refusal
    # and the next claim (a lower bound, which a slow machine only lengthens).
    claims: list[float] = []
    claim_and_start = stack.dispatcher.claim_and_start

    def claim_noted(*args: Any, **kwargs: Any) -> Any:
        asked = time.monotonic()
        jobs = claim_and_start(*args, **kwargs)
        if jobs:
            claims.append(asked)
        return jobs

    stack.dispatcher.claim_and_start = claim_noted  # type: ignore[method-assign]
    # Its warning written slowly (a loaded machine; CI once): the count of the retry was
    # seen before the pause it began.
    slow = _SlowWarnings("claims paused")
    logging.getLogger("hypermedia.worker.worker").addHandler(slow)
    try:
        with running_worker(
            stack,
            tmp_path,
            prefetch=1,
            concurrency=1,
            worker_id="outage-w",
            queue="images",
            grants=storage,
            outage_pause_seconds=1.0,
        ) as (worker, _grants):
            _wait(lambda: worker.stats.released == 1, timeout=30)
            first = worker.outage_pause
            assert first is not None and first.seconds is None
            assert first.reason == f"job {_first} failed: storage_unavailable"
            _wait(lambda: worker.stats.released == 2, timeout=30)  # after it: one more, met
            assert worker.outage_pause == first  # one pause from the first failure on
            _wait(lambda: worker.stats.completed == 2, timeout=30)  # the two never tried
            # Nothing claimed within the pause after a refusal, twice as long the second.
            assert len(storage.refused) == 2 and len(claims) >= 4
            assert claims[0] <= storage.refused[0] < storage.refused[1]
            assert claims[1] - storage.refused[0] >= 1.0
            assert claims[2] - storage.refused[1] >= 2.0
            # The first completion ended the pause; the upkeep writes it to the row.
            ended = worker.outage_pause
            assert ended is not None and (ended.since, ended.reason) == (first.since, first.reason)
            assert ended.seconds is not None and 3.0 <= ended.seconds < 30
            w = t.workers.c
            shown = select(w.outage_paused_since, w.outage_paused_reason, w.outage_paused_seconds)

            def row() -> Any:
                with transaction(stack.engine) as conn:
                    return conn.execute(shown.where(w.worker_id == "outage-w")).one()

            _wait(lambda: row().outage_paused_seconds is not None, timeout=10)
            since, reason, seconds = row()
            assert (reason, seconds) == (first.reason, ended.seconds)
            assert since.timestamp() == pytest.approx(first.since, abs=0.01)
    finally:
        logging.getLogger("hypermedia.worker.worker").removeHandler(slow)
        storage.close()
    statuses = _statuses(stack)
    assert statuses == {"retry_wait": 2, "completed": 2}, statuses
    assert (worker.stats.failed, worker.stats.retried) == (0, 0)  # no attempt spent
    stack.close()


class _CountingExecutor(InProcessExecutor):
    def __init__(self, work_root: Path) -> None:
        super().__init__(work_root, PRELOAD)
        self.runs = 0

    def run(self, *args, **kwargs):
        self.runs += 1
        return super().run(*args, **kwargs)


def test_a_cancel_during_the_input_download_never_starts_the_step(engine, settings, tmp_path):
    """Cancelled while its input downloads (no child to kill yet), the job ends
    cancelled without its step running: the request is not lost with the kill that
    had nothing to reach."""
    stack, person, job_id = _one_sleep_job(settings, engine, tmp_path, 30)
    held = _HeldInput()
    executor = _CountingExecutor(tmp_path / "work")
    execution = JobExecution(
        stack.dispatcher, stack.catalog, held, executor, "cancel-w", poll_seconds=0.05
    )
    try:
        (job,) = stack.dispatcher.claim_and_start("images", "cancel-w")
        outcome: list[object] = []
        runner = threading.Thread(target=lambda: outcome.append(execution.run_started(job)))
        runner.start()
        assert held.requested.wait(30)
        stack.ingest.cancel(person.caller, job_id)
        # The watcher's query sees the request (it has no child to kill), then the
        # input arrives.
        _wait(lambda: execution._running[job_id].cancelled.is_set())
        held.released.set()
        runner.join(60)
        assert not runner.is_alive()
    finally:
        held.close()
        execution.close()
    assert executor.runs == 0
    (result,) = outcome
    assert getattr(result, "status", None) == "cancelled", result
    assert stack.ingest.get_job(person.caller, job_id).status == "cancelled"
    stack.close()


class _SlowInput(_InputServer):
    """An input that comes in two halves 0.4 s apart: a download long enough to show
    its progress (one event a 0.25 s at most)."""

    def __init__(self) -> None:
        def get(handler: BaseHTTPRequestHandler) -> None:
            handler.send_response(200)
            handler.send_header("Content-Length", str(2 * 65536))
            handler.end_headers()
            handler.wfile.write(b"x" * 65536)
            handler.wfile.flush()
            time.sleep(0.4)
            handler.wfile.write(b"y" * 65536)

        super().__init__(get)


def test_a_step_that_reports_nothing_follows_its_shown_download_with_a_run_phase(
    engine, settings, tmp_path
):
    """A download long enough to show its progress ends at its full bar; a step that
    reports no progress of its own (a DOCX conversion) would leave that bar showing
    while it runs: the run phase begins with an event of no measure (the watcher shows
    "run", the bar empty)."""
    stack, _person, job_id = _one_sleep_job(settings, engine, tmp_path, 0.3)
    slow = _SlowInput()
    execution = JobExecution(
        stack.dispatcher, stack.catalog, slow, InProcessExecutor(tmp_path / "work", PRELOAD), "w"
    )
    try:
        (job,) = stack.dispatcher.claim_and_start("images", "w")
        outcome = execution.run_started(job)
    finally:
        slow.close()
        execution.close()
    assert isinstance(outcome, Completion), outcome  # the worker's batcher records it
    events = [e for _, e in stack.dispatcher.events.history(job_id)]
    progress = [
        (e["phase"], e["done"], e["total"], e["fraction"])
        for e in events
        if e["type"] == "progress"
    ]
    downloads = [p for p in progress if p[0] == "download"]
    assert downloads and downloads[-1] == ("download", 131072, 131072, 1.0), progress
    assert progress[-1] == ("run", 0.0, None, None), progress
    assert events[-1]["phase"] == "run", events
    stack.close()


class _HeldUpload(NoGrants):
    """The input comes at once; each output's upload hangs until ``release``: a user's
    cancel arrives once the step has ended and its outputs are on their way."""

    def __init__(self) -> None:
        super().__init__()
        self.requested = threading.Event()
        self.released = threading.Event()
        self.stored: dict[str, bytes] = {}
        held = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", "5")
                self.end_headers()
                self.wfile.write(b"bytes")

            def do_PUT(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                held.requested.set()
                held.released.wait(60)
                held.stored[self.path] = body
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{path}"

    def input_url(self, job_id: str, worker_id: str) -> str:
        return self._url(f"in/{job_id}")

    def output_urls(
        self, job_id: str, worker_id: str, output_types: Mapping[str, str | None]
    ) -> dict[str, OutputGrant]:
        return {
            kind: OutputGrant(f"out/{job_id}/{kind}", self._url(f"out/{job_id}/{kind}"))
            for kind in output_types
        }

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


def _cancel_while_uploading(
    stack: Stack, tmp_path: Path, meanwhile: Callable[[], None] = lambda: None
) -> tuple[str, object, _HeldUpload, _CountingExecutor]:
    """Run one test.copy_input job whose output's upload hangs; cancel it then, do
    ``meanwhile``, let the upload end. The job id, what its run answered, the upload
    server and the executor."""
    person = make_user(stack)
    obj = make_object(stack, person)
    request = SubmitRequest(object_id=obj, operations=["test.copy_input"])
    job_id = stack.ingest.submit(person.caller, request).job_ids[0]
    held = _HeldUpload()
    executor = _CountingExecutor(tmp_path / "work")
    execution = JobExecution(
        stack.dispatcher, stack.catalog, held, executor, "late-w", poll_seconds=0.05
    )
    try:
        (job,) = stack.dispatcher.claim_and_start("images", "late-w")
        outcome: list[object] = []
        runner = threading.Thread(target=lambda: outcome.append(execution.run_started(job)))
        runner.start()
        assert held.requested.wait(30)  # the step ran; its output is uploading
        stack.ingest.cancel(person.caller, job_id)
        _wait(lambda: execution._running[job_id].cancelled.is_set())
        meanwhile()
        held.released.set()
        runner.join(60)
        assert not runner.is_alive()
    finally:
        held.close()
        execution.close()
    (result,) = outcome
    return job_id, result, held, executor


def test_a_cancel_once_the_outputs_are_being_stored_comes_too_late(engine, settings, tmp_path):
    """A cancel that arrives while the finished step's outputs upload does not end the
    job cancelled with its outputs in storage and no row for them (counted on no quota,
    taken by no delete): the job completes with them."""
    stack = open_stack(settings, engine, None, profiles_path=ray_support.test_profiles(tmp_path))
    job_id, result, held, executor = _cancel_while_uploading(stack, tmp_path)
    assert executor.runs == 1
    assert isinstance(result, Completion), result
    assert [o.storage_key for o in result.outputs] == [f"out/{job_id}/copy"]
    assert held.stored == {f"/out/{job_id}/copy": b"bytes"}
    stack.close()


def test_a_late_cancel_keeps_the_jobs_lease_while_its_outputs_upload(engine, settings, tmp_path):
    """A cancel that comes while the outputs upload is too late, and the job completes:
    so its lease is still extended meanwhile. Were it not, an upload longer than what
    was left of the lease would let the reaper take the job (lease_expired), and its
    completion, the outputs already in storage, would find the job no longer ours."""
    profiles = ray_support.test_profiles(tmp_path)
    text = profiles.read_text()
    head, _, rest = text.partition('[profiles."test.copy_input"]')
    rest = rest.replace("timeout_seconds = 30", "timeout_seconds = 1", 1)  # a 1.5 s lease
    profiles.write_text(f'{head}[profiles."test.copy_input"]{rest}')
    stack = open_stack(settings, engine, None, profiles_path=profiles, lease_grace_seconds=0)

    def outlast_the_lease() -> None:
        time.sleep(3)  # the upload outlasts the lease (1.5 s) twice over
        assert stack.reaper.tick().expired == 0

    job_id, result, _held, _executor = _cancel_while_uploading(stack, tmp_path, outlast_the_lease)
    assert isinstance(result, Completion), result
    assert stack.dispatcher.complete_many("late-w", [result.finished()]) == [True]
    with transaction(stack.engine) as conn:
        status = conn.execute(select(t.jobs.c.status).where(t.jobs.c.job_id == job_id))
        assert status.scalar_one() == "completed"
    stack.close()


def _sleep_jobs(stack: Stack, seconds: list[float]) -> tuple[Person, list[str]]:
    person = make_user(stack)
    obj = make_object(stack, person)
    requests = [
        SubmitRequest(
            object_id=obj, operations=["test.sleep"], params={"test.sleep": {"seconds": s}}
        )
        for s in seconds
    ]
    return person, [r.job_ids[0] for r in stack.ingest.submit_many(person.caller, requests)]


def test_jobs_taken_ahead_start_as_their_loop_reaches_them(engine, settings, tmp_path):
    """One claim takes three jobs: each becomes ``processing`` only when the loop
    begins it (the start goes with the completion batcher's transaction), its
    attempt timed from then, not from the claim."""
    stack = open_stack(
        settings, engine, None, profiles_path=_profiles_without_input(tmp_path, "test.sleep")
    )
    _person, job_ids = _sleep_jobs(stack, [0.6, 0.6, 0.6])
    worker = loop_worker(stack, tmp_path / "ahead", "ahead", prefetch=3)
    worker.start()
    seen: list[dict[str, int]] = []
    deadline = time.monotonic() + 60
    while worker.stats.completed < 3:
        assert time.monotonic() < deadline, "timed out"
        seen.append(_statuses(stack))
        time.sleep(0.05)
    worker.stop()
    # While they ran: never more than one processing, the others waiting claimed.
    assert {"processing": 1, "claimed": 2} in seen
    # And one still waiting claimed after another had completed (the sampler may miss
    # the 0.6 s of the middle job's run alone on a loaded machine: a CI-like run did).
    assert any(c.get("completed", 0) >= 1 and c.get("claimed", 0) >= 1 for c in seen), seen
    assert all(counts.get("processing", 0) <= 1 for counts in seen)
    assert worker.stats.claimed == 3 and worker.stats.released == 0
    with transaction(stack.engine) as conn:
        jobs = {
            r.job_id: r
            for r in conn.execute(
                select(
                    t.jobs.c.job_id,
                    t.jobs.c.claimed_at,
                    t.jobs.c.started_at,
                    t.jobs.c.completed_at,
                    t.jobs.c.status,
                )
            )
        }
        attempts = {
            r.job_id: r
            for r in conn.execute(
                select(
                    t.attempts.c.job_id,
                    t.attempts.c.started_at,
                    t.attempts.c.finished_at,
                    t.attempts.c.duration_ms,
                    t.attempts.c.status,
                )
            )
        }
    rows = [jobs[j] for j in job_ids]
    assert [r.status for r in rows] == ["completed"] * 3
    assert len({r.claimed_at for r in rows}) == 1  # one claim took them all
    # Each started after the one before it ended (its attempt's recorded end: when its
    # work did, not the later commit of its batch), its attempt from then.
    for before, after in itertools.pairwise(rows):
        ran = attempts[before.job_id]
        ended = ran.started_at + timedelta(milliseconds=ran.duration_ms)
        assert ended <= ran.finished_at <= after.started_at, (before, after, ran)
        assert ran.finished_at >= ran.started_at + timedelta(seconds=0.6), ran
        assert after.started_at - after.claimed_at >= timedelta(seconds=0.5)
    for job_id, row in zip(job_ids, rows, strict=True):
        attempt = attempts[job_id]
        assert attempt.status == "completed"
        assert abs((attempt.started_at - row.started_at).total_seconds()) < 0.001
        # Its own run (timed from its start, which came after the one before it ended,
        # checked above), not its wait: no upper bound in time, which a loaded machine
        # stretches (the CI-like run at load 14: 1,630 ms for a 0.6 s step).
        assert attempt.duration_ms >= 550
        recorded = attempt.finished_at - attempt.started_at
        assert abs(recorded.total_seconds() * 1000 - attempt.duration_ms) <= 1, attempt
    stack.close()


def _hold_account(pg_engine, person: Person) -> Any:
    """A connection in a transaction holding ``person``'s credit account row: a batch
    that completes one of their jobs waits for it (commit or close it)."""
    holder = pg_engine.connect()
    holder.begin()
    accounts = t.credit_accounts.c
    holder.execute(
        select(accounts.user_id).where(accounts.user_id == person.caller.user_id).with_for_update()
    ).one()
    return holder


class _SecondWaits(InProcessExecutor):
    """In-process steps; every step after the first waits for ``go`` before it runs.
    ``ended``: when each step returned (epoch seconds), by job id."""

    def __init__(self, work_root: Path) -> None:
        super().__init__(work_root, PRELOAD)
        self.go = threading.Event()
        self.ended: dict[str, float] = {}
        self._runs = 0

    def run(self, job_id: str, *args: Any, **kwargs: Any) -> Any:
        self._runs += 1
        if self._runs > 1:
            assert self.go.wait(60)
        result = super().run(job_id, *args, **kwargs)
        self.ended[job_id] = time.time()
        return result


def test_an_attempt_ends_when_its_step_did_not_when_its_batch_commits(
    pg_engine, settings, tmp_path
):
    """A job that finished while the batch before it was still committing (held here
    by a lock on its user's account row) waits for a later commit; its attempt still
    ends when its step did, so duration_ms is its own run, not its run plus that wait."""
    stack = open_stack(
        settings, pg_engine, None, profiles_path=_profiles_without_input(tmp_path, "test.sleep")
    )
    person, job_ids = _sleep_jobs(stack, [0.05, 0.3])
    executor = _SecondWaits(tmp_path / "delayed")
    worker = loop_worker(stack, tmp_path / "delayed", "delayed", prefetch=1, executor=executor)
    holder = _hold_account(pg_engine, person)
    worker.start()
    try:
        _wait(lambda: support.waits_for_a_lock(pg_engine))  # the first job's batch, held
        executor.go.set()  # the second job runs while it is
        _wait(lambda: len(executor.ended) == 2)
        time.sleep(1.0)  # its completion waits for the batch before it
        released = time.time()
        holder.commit()
        _wait(lambda: worker.stats.completed == 2)
    finally:
        holder.close()
        worker.stop()
    second = next(j for j in job_ids if executor.ended[j] == max(executor.ended.values()))
    with transaction(stack.engine) as conn:
        attempt = conn.execute(
            select(
                t.attempts.c.started_at,
                t.attempts.c.finished_at,
                t.attempts.c.duration_ms,
                t.attempts.c.status,
            ).where(t.attempts.c.job_id == second)
        ).one()
        completed_at = conn.execute(
            select(t.jobs.c.completed_at).where(t.jobs.c.job_id == second)
        ).scalar_one()
    assert attempt.status == "completed"
    # Ended after its step returned and before its batch could commit, which came later.
    assert to_datetime(executor.ended[second]) <= attempt.finished_at < to_datetime(released)
    assert completed_at >= to_datetime(released)
    span = (attempt.finished_at - attempt.started_at).total_seconds() * 1000
    assert abs(attempt.duration_ms - span) <= 1  # to its recorded end
    assert attempt.duration_ms >= 300  # its step's own 0.3 s
    stack.close()


@pytest.mark.parametrize("how", ["drain", "spot notice"])
def test_a_begun_job_taken_ahead_handed_back_before_its_start_is_written_is_timed_from_it(
    pg_engine, settings, tmp_path, monkeypatch, how
):
    """A loop took two jobs. The first's completion waits for its batch (held here by a
    lock on its user's account row), and the start of the second, which the loop has
    begun, waits in the completion batcher behind it: the record still has it
    ``claimed``. The worker drains (or has a spot notice) and hands the second back
    (its child killed): its released attempt is timed from when its loop began it, not
    from the claim, and the job has that started_at; the start the batcher writes
    once the lock goes changes nothing."""
    from hypermedia.sandbox.executor import ChildExecutor
    from hypermedia.worker import worker as worker_module
    from hypermedia.worker.spot import SpotNotice

    # A start alone stays in the batcher (else after 0.2 s it might join the held batch).
    monkeypatch.setattr(worker_module, "START_LINGER_SECONDS", 3600.0)
    stack = open_stack(
        settings, pg_engine, None, profiles_path=_profiles_without_input(tmp_path, "test.sleep")
    )
    person, (first_id, second_id) = _sleep_jobs(stack, [0.05, 120])
    executor = ChildExecutor(tmp_path / "ahead", preload=PRELOAD, hidden_paths=(tmp_path,))
    worker = loop_worker(stack, tmp_path / "ahead", "ahead-w", prefetch=2, executor=executor)
    holder = _hold_account(pg_engine, person)
    handed_back: list[str] = []
    stopping = threading.Thread(
        target=lambda: handed_back.extend(
            worker.drain(timeout=0)
            if how == "drain"
            else worker.interrupt(SpotNotice("aws", "terminate", time.time() + 120, time.time()))
        )
    )
    try:
        worker.start()
        _wait(lambda: support.waits_for_a_lock(pg_engine))  # the first job's batch, held
        _wait(lambda: executor.child_pid(second_id) is not None)  # the second begun
        assert _statuses(stack) == {"processing": 1, "claimed": 1}  # its start not written
        stopping.start()
        _wait(lambda: _statuses(stack) == {"processing": 1, "queued": 1})  # handed back
    finally:
        holder.close()  # the held batch commits; then the batcher's start of the second
        if stopping.is_alive():
            stopping.join(60)
        worker.stop()
        executor.close()
    assert handed_back == [second_id]
    assert (worker.stats.completed, worker.stats.released) == (1, 1)
    with transaction(stack.engine) as conn:
        job = conn.execute(select(t.jobs).where(t.jobs.c.job_id == second_id)).one()
        a = t.attempts.c
        attempt = conn.execute(
            select(a.status, a.started_at, a.finished_at, a.duration_ms, a.error_code).where(
                a.job_id == second_id
            )
        ).one()
        first = conn.execute(
            select(a.finished_at).where(a.job_id == first_id, a.status == "completed")
        ).scalar_one()
    assert (job.status, job.attempt_count) == ("queued", 0)
    assert attempt.status == "released"
    assert attempt.error_code == (None if how == "drain" else "spot_interrupted")
    # Begun once the first had run (not at the claim), its attempt from then.
    assert job.started_at is not None and attempt.started_at == job.started_at
    assert job.claimed_at < first <= job.started_at
    span = (attempt.finished_at - attempt.started_at).total_seconds() * 1000
    assert abs(attempt.duration_ms - span) <= 1
    stack.close()


def test_jobs_taken_ahead_go_back_when_the_one_before_runs_long(engine, settings, tmp_path):
    """A loop took three jobs and the first runs long: after HOLD_SECONDS the other two
    go back to their queue (released, no attempt spent) and another worker runs them
    while the first still runs."""
    from hypermedia.worker.worker import HOLD_SECONDS

    stack = open_stack(
        settings, engine, None, profiles_path=_profiles_without_input(tmp_path, "test.sleep")
    )
    # The long one runs until the test lets it end: the others, done meanwhile, cannot
    # have waited for it, however slow the machine.
    done = tmp_path / "long-one-may-end"
    person = make_user(stack)
    obj = make_object(stack, person)
    requests = [
        SubmitRequest(object_id=obj, operations=["test.sleep"], params={"test.sleep": p})
        for p in [{"seconds": 300, "until": str(done)}, {"seconds": 0.1}, {"seconds": 0.1}]
    ]
    job_ids = [r.job_ids[0] for r in stack.ingest.submit_many(person.caller, requests)]
    first = loop_worker(stack, tmp_path / "holder", "holder", prefetch=3)
    first.start()
    _wait(lambda: _statuses(stack) == {"processing": 1, "claimed": 2})
    second = loop_worker(stack, tmp_path / "other", "other", prefetch=1)
    second.start()
    _wait(lambda: second.stats.completed == 2, timeout=HOLD_SECONDS + 60)
    assert first.stats.completed == 0 and first.stats.released == 2
    views = [stack.ingest.get_job(person.caller, j) for j in job_ids]
    assert views[0].status == "processing"
    for view in views[1:]:
        assert view.status == "completed" and view.attempt_count == 1
        assert [(a.status, a.worker_id) for a in view.attempts] == [
            ("released", "holder"),
            ("completed", "other"),
        ]
    done.touch()
    _wait(lambda: first.stats.completed == 1, timeout=60)
    first.stop()
    second.stop()
    assert _statuses(stack) == {"completed": 3}
    stack.close()


def test_a_drain_answers_no_job_the_upkeep_handed_back_before_it(sqlite_engine, settings, tmp_path):
    """A loop took two jobs and the first ran past HOLD_SECONDS: the upkeep handed the
    second back, and the loop took it again and completed it. drain() and interrupt()
    answer the jobs handed back; every hand back of the upkeep was kept for them, for
    the worker's whole life (a list that only grew): the drain, long after both
    completed, answered the second. Only a drain's (a notice's) own are answered."""
    from hypermedia.worker.worker import HOLD_SECONDS

    stack = open_stack(
        settings, sqlite_engine, None, profiles_path=_profiles_without_input(tmp_path, "test.sleep")
    )
    person, (_first, second) = _sleep_jobs(stack, [HOLD_SECONDS + 1.5, 0.1])
    worker = loop_worker(stack, tmp_path / "work", "ahead-w", prefetch=2)
    worker.start()
    try:
        _wait(lambda: worker.stats.completed == 2, timeout=60)
    finally:
        handed_back = worker.drain(timeout=5)
    # The upkeep handed the second back once; the loop took it again.
    assert worker.stats.released == 1
    assert _statuses(stack) == {"completed": 2}
    attempts = stack.ingest.get_job(person.caller, second).attempts
    assert [a.status for a in attempts] == ["released", "completed"]
    assert handed_back == []
    assert worker._handed_back == []
    stack.close()


def test_the_workers_cpu_counts_its_jobs_sandboxed_children(pg_engine, settings, tmp_path):
    """``worker_metrics.cpu_percent`` (the seed's "worker CPU > 90 %" alert reads it) is
    the worker's CPU with its jobs': the steps run in sandboxed children of the fork
    server, not in the worker's process, whose own CPU alone stays near 0 while a job
    keeps a core busy. Here one job burns 2 s of CPU, then RLIMIT_CPU stops it: its
    wall clock limit is far away (test.spin's 2 s stopped it first on a loaded machine,
    0.82 CPU-s burnt at load 12), so the CPU it burns is known whatever the load."""
    from hypermedia.sandbox.executor import ChildExecutor

    profiles = ray_support.test_profiles(tmp_path)  # test.spin reads no input
    header = '[profiles."test.spin"]\n'
    text = profiles.read_text()
    spin = text.index(header)
    end = text.index("\n\n", spin)
    assert "timeout_seconds = 2\n" in text[spin:end]
    profiles.write_text(
        text[:spin]
        + text[spin:end].replace("timeout_seconds = 2\n", "timeout_seconds = 600\n")
        + text[end:]
    )
    stack = open_stack(settings, pg_engine, None, profiles_path=profiles)
    person = make_user(stack)
    obj = make_object(stack, person)
    executor = ChildExecutor(tmp_path / "cpu", preload=PRELOAD, hidden_paths=(tmp_path,))
    worker = loop_worker(stack, tmp_path / "cpu", "cpu-w", queue="bulk", executor=executor)
    worker.start()
    try:
        began = time.monotonic()
        worker.cpu_percent()  # the window starts here, before the job is there
        own = psutil.Process().cpu_times()  # the worker's process: this one
        params = {"test.spin": {"cpu_seconds": 2}}
        request = SubmitRequest(object_id=obj, operations=["test.spin"], params=params)
        [job_id] = stack.ingest.submit(person.caller, request).job_ids
        _wait(lambda: worker.stats.failed + worker.stats.retried >= 1, timeout=600)
        worker.write_metrics()
        window = time.monotonic() - began  # at least the worker's window
        after = psutil.Process().cpu_times()
    finally:
        worker.stop()
        executor.close()
    with transaction(stack.engine) as conn:
        (shown,) = conn.execute(select(t.worker_metrics.c.cpu_percent)).scalars()
        code, message = conn.execute(
            select(t.attempts.c.error_code, t.attempts.c.error_message).where(
                t.attempts.c.job_id == job_id
            )
        ).one()
    # Stopped by its CPU (not the wall clock), which the sandbox measured of the job's
    # child (its rusage; 1.8 s at times, for a soft limit of 2 s).
    assert code == "cpu_limit", (code, message)
    used = float(message.split("used ")[1].split(" s of CPU")[0])
    assert used >= 1.0, message
    # The share shown, as CPU-s over the window (however long a loaded machine made
    # it): the job's CPU on top of the worker's process's own. The window is the
    # test's (a little longer than the worker's: counted errs high), the share is
    # rounded to 0.1 % and the job's CPU to 0.1 s in its message.
    cores = max(1, min(worker.concurrency, os.cpu_count() or 1))
    counted = shown / 100 * cores * window
    alone = (after.user + after.system) - (own.user + own.system)
    assert counted - alone >= used - 0.1 - 0.001 * window, (shown, window, counted, alone, used)
    stack.close()


def test_a_worker_claims_nothing_while_its_disk_is_low_and_goes_on_after(
    pg_engine, settings, tmp_path, caplog
):
    """Below ``worker_min_free_disk_mb`` free on its workdirs' disk a worker claims no
    job (it says so, once); the jobs wait queued, and are run once there is room."""
    stack = open_stack(settings, pg_engine, None, profiles_path=ray_support.test_profiles(tmp_path))
    job_ids = _submit_noops(stack, 3)
    free_mb = shutil.disk_usage(tmp_path).free // 2**20
    worker = loop_worker(
        stack,
        tmp_path / "disk",
        "disk-w",
        queue="bulk",
        concurrency=2,
        min_free_disk_mb=free_mb + 1_000_000,  # a terabyte more than this disk has
        disk_check_seconds=0.2,
    )
    with caplog.at_level(logging.WARNING, logger="hypermedia.worker.worker"):
        worker.start()
        time.sleep(1.5)  # seven reads of the free space, each loop waiting between
    try:
        assert worker.stats.claimed == 0
        assert _statuses(stack) == {"queued": 3}
        low = [
            r.getMessage() for r in caplog.records if "worker_min_free_disk_mb" in r.getMessage()
        ]
        assert len(low) == 1 and "claiming no job" in low[0], low
        worker.min_free_disk_mb = 1  # room again (read within disk_check_seconds)
        _wait(lambda: worker.stats.completed == 3, timeout=60)
        assert _statuses(stack) == {"completed": 3}, job_ids
    finally:
        worker.stop()
    stack.close()


def test_a_worker_paused_by_low_disk_says_so_in_its_row_and_in_hypermedia_status(
    pg_engine, settings, tmp_path
):
    """The disk guard's pause is no longer one log line: the worker's row says since when
    and why it claims nothing (at once, and kept current by the heartbeat), ``hypermedia
    status --json`` and the screen show it beside the worker, and it clears once there
    is room."""
    stack = open_stack(settings, pg_engine, None, profiles_path=ray_support.test_profiles(tmp_path))
    _submit_noops(stack, 2)
    free_mb = shutil.disk_usage(tmp_path).free // 2**20
    needs = free_mb + 1_000_000  # a terabyte more than this disk has
    worker = loop_worker(
        stack,
        tmp_path / "disk",
        "disk-s",
        queue="bulk",
        heartbeat_seconds=0.5,
        min_free_disk_mb=needs,
        disk_check_seconds=0.2,
    )

    def row() -> tuple[object, str | None]:
        w = t.workers.c
        with transaction(stack.engine) as conn:
            found = conn.execute(
                select(w.claims_paused_since, w.claims_paused_reason).where(w.worker_id == "disk-s")
            ).one()
        return found[0], found[1]

    env = {
        "HYPERMEDIA_DATABASE_URL": support.url_string(stack.engine),
        "HYPERMEDIA_REDIS_URL": support.redis_server_url(),
        "HYPERMEDIA_REDIS_PREFIX": stack.settings.redis_prefix,
        "HYPERMEDIA_DATA_DIR": str(tmp_path),
        "HYPERMEDIA_SCHEDULER_CONFIG": str(scheduler_config.SHIPPED),
    }
    runner = CliRunner()
    started = time.time()
    worker.start()
    try:
        _wait(lambda: row()[0] is not None, timeout=10)
        since, reason = row()
        assert worker.stats.claimed == 0
        # The free MB in it is read anew at each heartbeat (0.5 s): the places that show
        # the reason are checked for its form, not for this read's number (a heartbeat
        # between this read and theirs once made them differ by a few MB).
        said = re.compile(rf"low disk \((\d+) MB free, needs {needs}\)")
        found = said.fullmatch(reason or "")
        assert found is not None, reason
        free_said = int(found[1])
        assert abs(free_said - free_mb) < 10_000, (free_said, free_mb)
        # What `hypermedia run` says.
        (pause,) = paused_workers(stack)
        assert (pause.worker_id, pause.cause) == ("disk-s", "disk")
        assert said.fullmatch(pause.reason), pause.reason
        result = runner.invoke(app, ["status", "--json"], env=env)
        assert result.exit_code == 0, result.output
        (shown,) = [w for w in json.loads(result.stdout)["workers"] if w["worker_id"] == "disk-s"]
        assert shown["state"] == "active"
        assert said.fullmatch(shown["claims_paused"]), shown["claims_paused"]
        assert 0 <= shown["claims_paused_seconds"] <= time.time() - started + 1
        screen = runner.invoke(app, ["status"], env=env, terminal_width=250)
        assert screen.exit_code == 0, screen.output
        assert "claiming paused: low disk" in screen.stdout
        time.sleep(1.2)  # heartbeats: the pause keeps its start
        assert row()[0] == since

        worker.min_free_disk_mb = 1  # room again
        _wait(lambda: row() == (None, None), timeout=10)
        assert paused_workers(stack) == []
        _wait(lambda: worker.stats.completed == 2, timeout=60)
        result = runner.invoke(app, ["status", "--json"], env=env)
        (shown,) = [w for w in json.loads(result.stdout)["workers"] if w["worker_id"] == "disk-s"]
        assert shown["claims_paused"] is None and shown["claims_paused_seconds"] is None
    finally:
        worker.stop()
    stack.close()


@pytest.mark.parametrize("how", ["stop", "drain"])
def test_a_stop_wakes_the_idle_loops_blocked_on_redis(
    sqlite_engine, settings, tmp_path, monkeypatch, how
):
    """An idle loop blocks on its queue's wake-up list (BLPOP, which nothing can
    interrupt) for IDLE_WAIT_SECONDS; only a new job's token woke it sooner, so that
    wait was kept at 1 s to bound a drain's, a spot notice's or a stop's, and an idle
    loop claimed and blocked again every second. Now a stop leaves a token a loop on
    the worker's own list: each loop blocked then wakes on it (old: each of their
    waits timed out), so the wait can be longer."""
    from hypermedia.worker import worker as worker_module

    monkeypatch.setattr(worker_module, "IDLE_WAIT_SECONDS", 8.0)  # < the 10 s socket timeout
    stack = open_stack(settings, sqlite_engine, None)
    blocked, woken = threading.Semaphore(0), []
    wait = stack.queue.wait

    def recorded(*args: Any) -> bool:
        blocked.release()
        result = wait(*args)
        woken.append(result)
        return result

    monkeypatch.setattr(stack.queue, "wait", recorded)
    worker = loop_worker(stack, tmp_path / "work", "idle-w", queue="bulk", concurrency=3)
    worker.start()
    for _ in range(3):  # each loop claimed nothing and is on its way into BLPOP
        assert blocked.acquire(timeout=30)
    worker.stop() if how == "stop" else worker.drain(timeout=30)
    assert woken == [True, True, True]
    stack.close()
