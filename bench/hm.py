"""The hypermedia side of the ingest benchmark: library submit, HTTP submit, worker drain.

Every submitted request names its own object (one operation each, ``thumbnail``
on the ``images`` queue), so the access check and the record look like real
traffic rather than one hot row. Objects are seeded up front, untimed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import func, insert, select

from bench.harness import Sample, time_batches, time_calls
from hypermedia import accounts
from hypermedia.accounts import Caller
from hypermedia.clock import to_datetime
from hypermedia.config import Settings
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.embedded import free_port
from hypermedia.ids import new_id
from hypermedia.ingest.service import SubmitRequest
from hypermedia.jobs.states import JobStatus
from hypermedia.stack import Stack

OPERATION = "thumbnail"
QUEUE = "images"
SEEDED_BYTES = 2_000_000  # each seeded object's size: a photo
ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Subject:
    """An opened stack, one paying user and a supply of that user's objects."""

    stack: Stack
    caller: Caller
    api_key: str
    object_ids: list[str]
    submitted: int = 0  # jobs submitted so far, to check the record against
    completed: int = 0
    _used: int = field(default=0, repr=False)

    def take(self, n: int) -> list[str]:
        if self._used + n > len(self.object_ids):
            raise RuntimeError(f"seeded {len(self.object_ids)} objects, need {self._used + n}")
        ids = self.object_ids[self._used : self._used + n]
        self._used += n
        return ids


def open_subject(settings: Settings) -> tuple[Subject, str]:
    """Open (and migrate) the stack and make the paying user; answers their pool id."""
    stack = Stack.open(settings, auto_migrate=True)
    try:
        with transaction(stack.engine) as conn:
            user = accounts.create_user(
                conn,
                "bench",
                stack.clock.now(),
                credits_millicredits=10**13,
                grants=accounts.UNLIMITED,
            )
            caller = accounts.authenticate(conn, user.api_key)
    except BaseException:
        stack.close()
        raise
    return Subject(stack, caller, user.api_key, []), user.pool_id


def seed_objects(stack: Stack, caller: Caller, pool_id: str, n: int) -> list[str]:
    """Insert ``n`` objects in one statement per 5,000.

    ``objects.register_object`` costs two round trips per object; the rows (and the
    user's count of stored bytes) are the same as it would write.
    """
    moment = to_datetime(stack.clock.now())
    ids = [new_id() for _ in range(n)]
    rows = [
        {
            "object_id": object_id,
            "pool_id": pool_id,
            "owner_id": caller.user_id,
            "kind": "original",
            "storage_key": f"originals/{pool_id}/{object_id}",
            "filename": "photo.jpg",
            "content_type": "image/jpeg",
            "size_bytes": SEEDED_BYTES,
            "sha256": None,
            "created_at": moment,
        }
        for object_id in ids
    ]
    with transaction(stack.engine) as conn:
        for lo in range(0, n, 5000):
            conn.execute(insert(t.objects), rows[lo : lo + 5000])
        accounts.add_stored_bytes(conn, {caller.user_id: SEEDED_BYTES * n})
    return ids


# -- library submit ----------------------------------------------------------------------


def submit_many(subject: Subject, n: int, batch: int) -> Sample:
    """``submit_many``: ``batch`` one-operation requests per call, one transaction each."""
    ids = subject.take(n + batch)
    ingest, caller = subject.stack.ingest, subject.caller

    def call(indexes: range) -> None:
        requests = [
            SubmitRequest(object_id=ids[batch + i], operations=[OPERATION]) for i in indexes
        ]
        results = ingest.submit_many(caller, requests)
        assert len(results) == len(requests)

    sample = time_batches(call, n, batch)
    subject.submitted += n + batch
    return sample


def submit(subject: Subject, n: int, warmup: int) -> Sample:
    """``submit``: one request (one job) per call, one transaction per call."""
    ids = subject.take(n + warmup)
    ingest, caller = subject.stack.ingest, subject.caller

    def call(i: int) -> None:
        ingest.submit(caller, SubmitRequest(object_id=ids[warmup + i], operations=[OPERATION]))

    sample = time_calls(call, n, warmup)
    subject.submitted += n + warmup
    return sample


# -- HTTP submit -------------------------------------------------------------------------


@contextlib.contextmanager
def api_server(settings: Settings, log_path: Path, timeout: float = 30.0) -> Iterator[str]:
    """Run ``bench/api_server.py`` (uvicorn over ``create_app``) on a free port.

    Yields its base URL; the process is terminated (then killed) on the way out.
    """
    with api_server_process(settings, log_path, timeout) as (base, _process):
        yield base


@contextlib.contextmanager
def api_server_process(
    settings: Settings,
    log_path: Path,
    timeout: float = 30.0,
    port: int | None = None,
    socket: str = "bind",
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """:func:`api_server` on ``port`` (else a free one), yielding the process too (to
    read its CPU). The server gets the settings' database, Redis, data dir, upload rate
    and, when set, API URL; ``socket`` is ``bench.api_server``'s ``--socket``."""
    port = port or free_port()
    env = {
        **os.environ,
        "HYPERMEDIA_DATABASE_URL": settings.effective_database_url,
        "HYPERMEDIA_REDIS_URL": settings.redis_url or "",
        "HYPERMEDIA_REDIS_PREFIX": settings.redis_prefix,
        "HYPERMEDIA_DATA_DIR": str(settings.data_dir),
        "HYPERMEDIA_USER_UPLOADS_PER_MINUTE": str(settings.user_uploads_per_minute),
    }
    if settings.api_url:
        env["HYPERMEDIA_API_URL"] = settings.api_url
    env.pop("HYPERMEDIA_CONFIG", None)
    base = f"http://127.0.0.1:{port}"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "bench.api_server", "--port", str(port), "--socket", socket],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
    try:
        _wait_healthy(process, base, timeout, log_path)
        yield base, process
    finally:
        _stop(process)


def _wait_healthy(
    process: subprocess.Popen[bytes], base: str, timeout: float, log_path: Path
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"API server exited with {process.returncode}:\n{tail}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{base}/healthz", timeout=1.0).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"API server not healthy after {timeout:.0f} s (log: {log_path})")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class HttpSubmitter:
    """``POST /v1/hypermedia/process``, one request at a time on a keep-alive connection."""

    def __init__(self, subject: Subject, base_url: str) -> None:
        self.subject = subject
        self.client = httpx.Client(
            base_url=base_url,
            headers={"Authorization": f"Bearer {subject.api_key}"},
            timeout=30.0,
        )

    def submit(self, n: int, warmup: int) -> Sample:
        ids = self.subject.take(n + warmup)

        def call(i: int) -> None:
            response = self.client.post(
                "/v1/hypermedia/process",
                json={"object_id": ids[warmup + i], "operations": [OPERATION]},
            )
            if response.status_code != 202:
                raise RuntimeError(f"submit answered {response.status_code}: {response.text}")

        sample = time_calls(call, n, warmup)
        self.subject.submitted += n + warmup
        return sample

    def close(self) -> None:
        self.client.close()


# -- worker side -----------------------------------------------------------------------------


def drain(subject: Subject, n: int, threads: int, count: int) -> Sample:
    """claim -> start -> complete with a no-op handler, ``threads`` loops in this process
    (0: one loop in the calling thread), until ``n`` jobs are done or the queue is empty."""
    dispatcher = subject.stack.dispatcher
    done = 0
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[BaseException] = []

    def loop(k: int) -> None:
        nonlocal done
        worker_id = f"bench-worker-{k}"
        try:
            while not stop.is_set():
                jobs = dispatcher.claim(QUEUE, worker_id, count)
                if not jobs:
                    return
                for job in jobs:
                    if not dispatcher.start(job, worker_id):
                        raise RuntimeError(f"start lost {job.job_id}")
                    if not dispatcher.complete(job, worker_id):
                        raise RuntimeError(f"complete lost {job.job_id}")
                with lock:
                    done += len(jobs)
                    if done >= n:
                        stop.set()
        except BaseException as exc:
            errors.append(exc)
            stop.set()

    workers = [threading.Thread(target=loop, args=(k,), daemon=True) for k in range(threads)]
    started = time.perf_counter()
    if not workers:
        loop(0)  # threads=0: in the calling thread (profilers see only that one)
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    seconds = time.perf_counter() - started
    if errors:
        raise errors[0]
    subject.completed += done
    return Sample(done, seconds)


# -- checks ----------------------------------------------------------------------------------


def check_record(subject: Subject) -> dict[str, Any]:
    """Every submitted job is in the record and in Redis, in the state it should be."""
    stack = subject.stack
    with transaction(stack.engine) as conn:
        counts: dict[str, int] = dict(
            conn.execute(select(t.jobs.c.status, func.count()).group_by(t.jobs.c.status)).all()
        )
    redis_counts = stack.queue.counts(QUEUE)
    queued = counts.get(JobStatus.QUEUED.value, 0)
    found = {
        "record": {str(k): int(v) for k, v in counts.items()},
        "redis_ready": redis_counts.ready,
        "redis_leased": redis_counts.leased,
    }
    completed = subject.completed
    expected_queued = subject.submitted - completed
    if (
        counts.get(JobStatus.COMPLETED.value, 0) != completed
        or queued != expected_queued
        or redis_counts.ready != expected_queued
        or redis_counts.leased != 0
    ):
        raise RuntimeError(
            f"record/queue mismatch: expected {completed} completed and "
            f"{expected_queued} queued, found {found}"
        )
    return found
