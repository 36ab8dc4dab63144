"""PostgreSQL on a full disk refuses every write that needs a new page ("could not
extend file ...: No space left on device", SQLSTATE 53100) and reads on: the record
unavailable until there is room, as when the server is down. The API answers 503
``database_unavailable`` with ``Retry-After`` (not 500 ``internal``), and a worker's
completion waits and is committed once the disk has room (not given up, its job left
processing until its lease runs out and run again).

The disk is full for real: a private PostgreSQL keeps the record's database in a
tablespace on a tmpfs of its own (its WAL stays on the machine's disk: a WAL write
that fails is a PANIC, the server restarting, which is the outage the other tests
stage), filled by a file and emptied again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select, text

from hypermedia.db import migrate
from hypermedia.db import tables as t
from hypermedia.db.engine import make_engine, snapshot
from hypermedia.ingest.api import create_app
from hypermedia.ingest.http_errors import OUTAGE_RETRY_AFTER_SECONDS
from hypermedia.ingest.service import SubmitRequest
from hypermedia.jobs.repository import OutputRecord
from hypermedia.worker.execute import Completion, Outcome
from hypermedia.worker.worker import CompletionBatcher
from tests import ray_support
from tests.factories import make_object, make_user, open_stack
from tests.support import PrivatePostgres, ServiceNotReachable

pytestmark = pytest.mark.root("mounting a tmpfs needs root")

P = "/v1/hypermedia"
MOST_SUBMITS = 1000  # a page of each table takes a few dozen; the disk has no more


class SmallDiskPostgres:
    """A private PostgreSQL whose database ``hypermedia`` (migrated) lives on a 16 MiB
    tmpfs that :meth:`fill` fills and :meth:`free` empties."""

    def __init__(self) -> None:
        self.server = PrivatePostgres()
        self.mount = self.server.base / "small"
        self.mount.mkdir()
        owner = pwd.getpwnam("postgres")
        options = f"size=16m,mode=0700,uid={owner.pw_uid},gid={owner.pw_gid}"
        mounting = ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(self.mount)]
        subprocess.run(mounting, check=True)
        self.filler = self.mount / "filler"

    def start(self) -> str:
        self.server.start()
        admin = make_engine(self.server.server_url())
        try:
            with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text(f"CREATE TABLESPACE small LOCATION '{self.mount}'"))
                conn.execute(text("CREATE DATABASE hypermedia TABLESPACE small"))
        finally:
            admin.dispose()
        url = self.server.server_url("hypermedia")
        engine = make_engine(url)
        try:
            migrate.upgrade(engine)
        finally:
            engine.dispose()
        return url

    def fill(self) -> None:
        with pytest.raises(OSError, match="No space left on device"):
            _write_until_full(self.filler)
        assert os.statvfs(self.mount).f_bavail == 0

    def free(self) -> None:
        self.filler.unlink()

    def close(self) -> None:
        with contextlib.suppress(ServiceNotReachable):
            self.server.stop()  # before the unmount: its files there are closed
        subprocess.run(["umount", "-l", str(self.mount)], check=True)
        self.server.close()


def _write_until_full(path: Path) -> None:
    with path.open("wb") as out:
        while True:
            out.write(b"\0" * 65536)
            out.flush()


@pytest.fixture
def small_disk_postgres() -> Iterator[tuple[SmallDiskPostgres, str]]:
    server = SmallDiskPostgres()
    try:
        yield server, server.start()
    finally:
        server.close()


def test_a_full_disk_is_the_database_unavailable_and_loses_nothing(
    small_disk_postgres, settings, tmp_path, caplog
):
    disk, url = small_disk_postgres
    engine = make_engine(url)
    profiles = str(ray_support.test_profiles(tmp_path))
    stack = open_stack(settings, engine, None, database_url=url, profiles_path=profiles)
    try:
        person = make_user(stack)
        obj = make_object(stack, person)
        stack.ingest.submit_many(
            person.caller, [SubmitRequest(object_id=obj, operations=["test.noop"])]
        )
        [job] = stack.dispatcher.claim_and_start("bulk", "disk-w")
        client = TestClient(create_app(stack), raise_server_exceptions=False)
        headers = {"Authorization": f"Bearer {person.api_key}"}
        body = {"object_id": obj, "operations": ["test.noop"]}

        disk.fill()
        accepted: list[str] = []
        for _ in range(MOST_SUBMITS):
            answer = client.post(f"{P}/process", json=body, headers=headers)
            if answer.status_code != 202:
                break
            accepted.extend(answer.json()["job_ids"])
        # Old: 500 internal ("could not extend file ...: No space left on device").
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "database_unavailable"
        # It answers (with no room): not "unreachable", and nothing of the server's.
        assert answer.json()["error"]["message"] == "the database is unavailable; try again shortly"
        assert answer.headers["Retry-After"] == str(OUTAGE_RETRY_AFTER_SECONDS)

        # The job's output is the first row of its table: a page the disk has no room for.
        output = OutputRecord("result.txt", f"outputs/{job.job_id}/result.txt", 5, "text/plain")
        outcomes: list[Outcome] = []
        batcher = CompletionBatcher(stack.dispatcher, "disk-w", outcomes.append)
        with caplog.at_level(logging.WARNING, logger="hypermedia.worker.worker"):
            batcher.add(Completion(job, [output], None))
            deadline = time.monotonic() + 10
            while "disk full, SQLSTATE 53100" not in caplog.text:
                assert time.monotonic() < deadline, caplog.text
                time.sleep(0.05)
            time.sleep(0.5)  # it goes on trying while the disk is full
            assert outcomes == []  # old: [Outcome(job_id, 'lost')] at once
            disk.free()
            batcher.close(30)
        assert [o.status for o in outcomes] == ["completed"]

        # Nothing lost, nothing half-kept: every accepted job is in the record and its
        # queue, the refused submission nowhere; the job completed with its output.
        with snapshot(engine) as conn:
            submitted = set(
                conn.execute(select(t.jobs.c.job_id).where(t.jobs.c.job_id != job.job_id)).scalars()
            )
            submissions = conn.execute(select(func.count()).select_from(t.submissions)).scalar()
            status = conn.execute(
                select(t.jobs.c.status).where(t.jobs.c.job_id == job.job_id)
            ).scalar_one()
            outputs = conn.execute(
                select(t.outputs.c.storage_key).where(t.outputs.c.job_id == job.job_id)
            ).scalars()
            assert list(outputs) == [output.storage_key]
        assert submitted == set(accepted)
        assert submissions == 1 + len(accepted)
        assert status == "completed"
        assert set(stack.queue.ready_ids("bulk")) == set(accepted)
        assert client.post(f"{P}/process", json=body, headers=headers).status_code == 202
    finally:
        stack.close()
        engine.dispose()
