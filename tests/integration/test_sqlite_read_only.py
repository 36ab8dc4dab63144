"""A SQLite record whose mount went read-only.

A connection that opens the record while its file system or bind mount is read-only
(an operator's remount, a file system remounted read-only after an error, a file made
unwritable) gets the file for reading only, and refuses every write, "attempt to write
a readonly database" (SQLITE_READONLY), for as long as it lives: once the mount is
writable again the pooled connection still refuses. That went through raw: the API
answered 500 ``internal`` and a worker's completion batch was given up (its job, done,
left processing until its lease ran out). Now it is the record unavailable (the API's
503, the batcher's retry) and drops the connection: the next one opens the file again,
for writing once the mount is.

The mount is read-only for real: a bind mount of the record's directory over itself.
Another connection to the record, opened before, keeps its WAL open, as a local
stack's other processes do (with none, a connection opening it read-only fails
SQLITE_CANTOPEN, already the record unavailable).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, select

from hypermedia.db import tables as t
from hypermedia.db.engine import make_engine, snapshot
from hypermedia.ingest.api import create_app
from hypermedia.ingest.service import SubmitRequest
from hypermedia.worker.execute import Completion, Outcome
from hypermedia.worker.worker import CompletionBatcher
from tests import ray_support
from tests.factories import make_object, make_user, open_stack

pytestmark = pytest.mark.root("a bind mount needs root")

P = "/v1/hypermedia"
TRIES = 5
READ_ONLY_SECONDS = 1.5


class RecordDirectory:
    """The record's directory, bind-mounted over itself, read-only or writable."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.mounted = False

    def read_only(self) -> None:
        if self.mounted:
            self._mount("-o", "remount,bind,ro")
        else:
            self._mount("--bind", "-o", "ro", str(self.directory))
            self.mounted = True

    def writable(self) -> None:
        self._mount("-o", "remount,bind,rw")

    def _mount(self, *arguments: str) -> None:
        subprocess.run(["mount", *arguments, str(self.directory)], check=True)

    def close(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.directory)], check=True)


# Another process with the record open (a local stack's API server, its actors): its
# WAL and WAL index stay. In another process: SQLite keeps the files of a connection
# closed in this one open while another connection of this process holds locks on them,
# and their files open for writing would keep the mount from going read-only.
_KEEPER = """
import sqlite3, sys
keeper = sqlite3.connect(sys.argv[1])
keeper.execute("PRAGMA journal_mode=WAL")
keeper.execute("SELECT count(*) FROM sqlite_master").fetchall()
print("open", flush=True)
sys.stdin.readline()
keeper.close()
"""


@pytest.fixture
def record(sqlite_url: str, tmp_path: Path) -> Iterator[tuple[RecordDirectory, str]]:
    directory = tmp_path / "record"
    directory.mkdir()
    path = directory / "hypermedia.db"
    shutil.copyfile(sqlite_url.removeprefix("sqlite:///"), path)
    path.chmod(0o600)
    mount = RecordDirectory(directory)
    keeper = subprocess.Popen(
        [sys.executable, "-c", _KEEPER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert keeper.stdout is not None and keeper.stdout.readline() == "open\n"
        yield mount, f"sqlite:///{path}"
    finally:
        assert keeper.stdin is not None
        keeper.stdin.close()
        keeper.wait(20)
        mount.close()


@contextlib.contextmanager
def _pool_opened_read_only(mount: RecordDirectory, engine: Engine) -> Iterator[None]:
    """Every connection of ``engine``'s pool opened while the mount was read-only."""
    engine.dispose()  # its files open for writing would keep the mount writable
    mount.read_only()
    with snapshot(engine) as conn:  # reads go on
        assert conn.execute(select(t.users.c.user_id)).first() is not None
    yield


def test_a_write_on_a_read_only_mount_is_unavailable_and_goes_through_once_writable(
    record, settings, tmp_path, caplog
):
    mount, url = record
    engine = make_engine(url)
    profiles = str(ray_support.test_profiles(tmp_path))
    stack = open_stack(settings, engine, None, database_url=url, profiles_path=profiles)
    try:
        person = make_user(stack)
        obj = make_object(stack, person)
        stack.ingest.submit_many(
            person.caller, [SubmitRequest(object_id=obj, operations=["test.noop"])]
        )
        [job] = stack.dispatcher.claim_and_start("bulk", "ro-w")
        client = TestClient(create_app(stack, auth_cache_seconds=0), raise_server_exceptions=False)
        headers = {"Authorization": f"Bearer {person.api_key}"}
        body = {"object_id": obj, "operations": ["test.noop"]}

        with _pool_opened_read_only(mount, engine):
            refused = client.post(f"{P}/process", json=body, headers=headers)
            # Old: 500 internal ("attempt to write a readonly database").
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "database_unavailable"
            mount.writable()
            answers = []
            for _ in range(TRIES):
                answer = client.post(f"{P}/process", json=body, headers=headers)
                answers.append((answer.status_code, answer.json().get("error", {}).get("code")))
        # Old: [(500, 'internal')] * 5: the pooled connection stayed read-only.
        assert answers == [(202, None)] * TRIES, answers

        with _pool_opened_read_only(mount, engine):
            outcomes: list[Outcome] = []
            batcher = CompletionBatcher(stack.dispatcher, "ro-w", outcomes.append)
            writable_again = threading.Timer(READ_ONLY_SECONDS, mount.writable)
            with caplog.at_level(logging.WARNING, logger="hypermedia.worker.worker"):
                writable_again.start()
                batcher.add(Completion(job, [], None))
                deadline = time.monotonic() + 20
                while not outcomes:
                    assert time.monotonic() < deadline, caplog.text
                    time.sleep(0.05)
                batcher.close(30)
                writable_again.join()
            assert "attempt to write a readonly database" in caplog.text  # it met it
        assert outcomes == [Outcome(job.job_id, "completed")]  # old: 'lost'
        with snapshot(engine) as conn:
            status = conn.execute(select(t.jobs.c.status).where(t.jobs.c.job_id == job.job_id))
            assert status.scalar_one() == "completed"
    finally:
        stack.close()
        engine.dispose()
