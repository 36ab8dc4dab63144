"""The SQLite record locked by another process for longer than the busy timeout.

Every process of a local stack (the API, the pipeline actors, the CLI, an operator's
``sqlite3`` shell) writes the one file, one writer at a time; a transaction waits up to
the busy timeout (30 s; 0.3 s here) for the write lock, then SQLite gives up with
SQLITE_BUSY ("database is locked"). That is the database being unavailable for a
while, as PostgreSQL down is: the API answers 503 ``database_unavailable`` with
``Retry-After`` (not 500 ``internal``), and a worker's batch of completions waits and is
committed once the lock is free (not dropped, its jobs left processing until their
leases expire and run again). So is its file failing a write (a disk I/O error, a
full disk): a completion is committed once the disk takes it.

The lock is held by another OS process through the project's own engine.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from bench.in_process import InProcessExecutor
from hypermedia.callbacks import CallbackSender
from hypermedia.db import tables as t
from hypermedia.db.engine import make_engine, snapshot, transaction
from hypermedia.errors import DatabaseUnavailable
from hypermedia.ingest.api import create_app
from hypermedia.ingest.http_errors import OUTAGE_RETRY_AFTER_SECONDS
from hypermedia.ingest.service import SubmitRequest
from hypermedia.worker.worker import ended_workers
from tests import ray_support
from tests.factories import make_object, make_user, open_stack
from tests.pipelines_for_tests import PRELOAD
from tests.worker_support import loop_worker

BUSY_SECONDS = 0.3
P = "/v1/hypermedia"

# Another process: BEGIN IMMEDIATE through the project's engine (the write lock), held
# until its stdin says so.
_HOLDER = """
import sys
from hypermedia.db.engine import make_engine, transaction
with transaction(make_engine(sys.argv[1])):
    print("holding", flush=True)
    sys.stdin.readline()
"""


@contextmanager
def write_lock_held(url: str) -> Iterator[None]:
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
        yield
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        assert holder.wait(20) == 0


@pytest.fixture
def busy_engine(sqlite_url: str) -> Iterator[Any]:
    engine = make_engine(sqlite_url, sqlite_busy_seconds=BUSY_SECONDS)
    yield engine
    engine.dispose()


def test_a_request_past_the_busy_timeout_answers_503_not_500(
    sqlite_url, busy_engine, settings, tmp_path
):
    stack = open_stack(settings, busy_engine, None)
    person = make_user(stack)
    obj = make_object(stack, person)
    client = TestClient(create_app(stack), raise_server_exceptions=False)
    body = {"object_id": obj, "operations": ["thumbnail"]}
    headers = {"Authorization": f"Bearer {person.api_key}"}
    with write_lock_held(sqlite_url):
        with (
            pytest.raises(DatabaseUnavailable, match="locked by another writer"),
            transaction(busy_engine),
        ):
            pass
        with snapshot(busy_engine) as conn:  # reads go on
            assert conn.execute(select(t.objects.c.object_id)).scalar_one() == obj
        submitted = client.post(f"{P}/process", json=body, headers=headers)
        uploaded = client.put(
            f"{P}/objects", params={"filename": "a.txt"}, content=b"hello", headers=headers
        )
        for answer in (submitted, uploaded):
            assert answer.status_code == 503, answer.text
            assert answer.json()["error"]["code"] == "database_unavailable"
            assert answer.headers["Retry-After"] == str(OUTAGE_RETRY_AFTER_SECONDS)
    assert client.post(f"{P}/process", json=body, headers=headers).status_code == 202


def test_health_and_the_ended_workers_read_while_another_process_writes(
    sqlite_url, busy_engine, settings
):
    """/healthz and the supervisor's read of ended workers are reads: they answer
    while another process holds the write lock (they took it, as a write would, and
    waited the busy timeout: 30 s for /healthz, then 'database: false')."""
    stack = open_stack(settings, busy_engine, None)
    client = TestClient(create_app(stack), raise_server_exceptions=False)
    with write_lock_held(sqlite_url):
        health = client.get("/healthz")
        assert health.json()["database"] is True, health.text
        assert ended_workers(busy_engine, ["no-such-worker"]) == set()


def test_the_callback_sender_reads_its_backlog_while_another_process_writes(
    sqlite_url, busy_engine, settings
):
    """The sender reads past a busy receiver's due callbacks, however many, every pass:
    in a write transaction (on SQLite BEGIN IMMEDIATE) that held every writer while it
    read, and waited for the lock itself (here: 'locked by another writer'). A read
    now: its lanes start while another process writes."""
    stack = open_stack(
        settings, busy_engine, None, callback_hosts=["127.0.0.1"], callback_secret="s" * 32
    )
    person = make_user(stack)
    job_ids = [
        job_id
        for _ in range(3)
        for job_id in stack.ingest.submit(
            person.caller,
            SubmitRequest(
                object_id=make_object(stack, person),
                operations=["thumbnail"],
                callback_url="http://127.0.0.1:9/hook",
            ),
        ).job_ids
    ]
    for job_id in job_ids:
        stack.ingest.cancel(person.caller, job_id)  # each ends: one callback due each
    sender = CallbackSender.from_settings(stack.engine, stack.settings, stack.clock)
    with ThreadPoolExecutor(1) as pool, write_lock_held(sqlite_url):
        lanes = sender._start(None, pool, threading.Event())
        assert len(lanes) == 1  # one receiver's lane, its rows read under the lock
        wait(lanes)  # its attempt needs the lock: it waits, then fails, nothing sent


class _Gated(InProcessExecutor):
    """Runs a job once told to."""

    def __init__(self, work_root: Path) -> None:
        super().__init__(work_root, PRELOAD)
        self.entered = threading.Event()
        self.go = threading.Event()

    def run(self, job_id: str, *args: Any, **kwargs: Any) -> Any:
        self.entered.set()
        assert self.go.wait(60)
        return super().run(job_id, *args, **kwargs)


def test_a_completion_that_meets_the_lock_is_committed_once_it_is_free(
    sqlite_url, busy_engine, settings, tmp_path
):
    stack = open_stack(
        settings, busy_engine, None, profiles_path=ray_support.test_profiles(tmp_path)
    )
    person = make_user(stack)
    obj = make_object(stack, person)
    [result] = stack.ingest.submit_many(
        person.caller, [SubmitRequest(object_id=obj, operations=["test.noop"])]
    )
    job_id = result.job_ids[0]
    executor = _Gated(tmp_path / "work")
    worker = loop_worker(stack, tmp_path / "work", "busy-w", queue="bulk", executor=executor)
    worker.start()
    try:
        assert executor.entered.wait(30)
        with write_lock_held(sqlite_url):
            executor.go.set()  # the job ends; its completion waits for the lock
            time.sleep(BUSY_SECONDS * 5)  # several busy timeouts
        deadline = time.monotonic() + 15
        while _status(busy_engine, job_id) != "completed":
            assert time.monotonic() < deadline, _status(busy_engine, job_id)
            time.sleep(0.05)
    finally:
        worker.stop()
    assert worker.stats.completed == 1


def _status(engine: Any, job_id: str) -> str:
    with snapshot(engine) as conn:
        return str(
            conn.execute(select(t.jobs.c.status).where(t.jobs.c.job_id == job_id)).scalar_one()
        )


# Another process completes a job claimed here, its files unable to grow for its first
# 1.5 s (RLIMIT_FSIZE 0: every write to the record's WAL fails, SQLite's "disk I/O
# error"; Python ignores SIGXFSZ), and prints the outcomes its batcher reported.
_WRITES_FAIL_AWHILE = """
import json, pickle, resource, sys, time
from hypermedia.config import load_settings
from hypermedia.stack import Stack
from hypermedia.worker.execute import Completion
from hypermedia.worker.worker import CompletionBatcher
overrides, job = json.loads(sys.argv[1]), pickle.loads(bytes.fromhex(sys.argv[2]))
stack = Stack.open(load_settings(**overrides))
outcomes = []
batcher = CompletionBatcher(stack.dispatcher, sys.argv[3], outcomes.append)
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))
batcher.add(Completion(job, [], None))
time.sleep(1.5)
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
batcher.close(30)
stack.close()
print(json.dumps([outcome.status for outcome in outcomes]))
"""


def test_a_completion_the_disk_refused_is_committed_once_it_writes(
    sqlite_url, sqlite_engine, settings, tmp_path
):
    """A raw sqlite3 OperationalError other than SQLITE_BUSY (a disk I/O error, a full
    disk) went through untranslated: the batcher gave its jobs up at once ("lost"),
    left processing until their leases expired (5,430 s for transcode_video), then run
    again. Now the record is unavailable as when locked: tried again until written."""
    profiles = str(ray_support.test_profiles(tmp_path))
    stack = open_stack(settings, sqlite_engine, None, profiles_path=profiles)
    person = make_user(stack)
    obj = make_object(stack, person)
    stack.ingest.submit_many(
        person.caller, [SubmitRequest(object_id=obj, operations=["test.noop"])]
    )
    [job] = stack.dispatcher.claim_and_start("bulk", "disk-w")
    chosen = stack.settings
    overrides = {
        "database_url": sqlite_url,
        "redis_url": chosen.redis_url,
        "redis_prefix": chosen.redis_prefix,
        "data_dir": str(chosen.data_dir),
        "profiles_path": profiles,
    }
    arguments = [json.dumps(overrides), pickle.dumps(job).hex(), "disk-w"]
    completer = subprocess.run(
        [sys.executable, "-c", _WRITES_FAIL_AWHILE, *arguments],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completer.returncode == 0, completer.stderr
    assert "disk I/O error; retrying" in completer.stderr  # it did meet the disk
    assert json.loads(completer.stdout) == ["completed"]  # old: ["lost"]
    assert _status(sqlite_engine, job.job_id) == "completed"
    with snapshot(sqlite_engine) as conn:
        charges = conn.execute(
            select(t.credit_ledger.c.kind).where(t.credit_ledger.c.job_id == job.job_id)
        ).scalars()
        assert sorted(charges) == ["charge"]
