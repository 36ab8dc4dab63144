"""A completion webhook across a kill -9 of the head: ``hypermedia serve`` in a
subprocess, the job's terminal status committed while the head's sender sleeps, the head
killed before it sends, a second head that sends the event exactly once, signed with the
secret the head generated for the web tier."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import select

from hypermedia import webhooks
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.ingest.client import HypermediaClient
from hypermedia.jobs import callbacks as outbox
from hypermedia.jobs.repository import FinishedJob
from hypermedia.stack import Stack
from tests import support
from tests.api_support import serve_on_a_free_port
from tests.factories import make_user
from tests.webhook_receiver import receiving

REPO = Path(__file__).resolve().parents[2]


@contextmanager
def head(
    env: dict[str, str], log: Path, **more: str
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    process, url = serve_on_a_free_port(
        lambda port: [sys.executable, "-m", "hypermedia.cli", "serve", "--port", str(port)],
        {**env, **more},
        log,
    )
    try:
        yield url, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _row(stack: Stack, job_id: str) -> Any:
    with transaction(stack.engine) as conn:
        return conn.execute(select(t.callbacks).where(t.callbacks.c.job_id == job_id)).one()


def test_a_head_killed_between_commit_and_send_loses_nothing_and_sends_once(
    pg_engine, settings, tmp_path
):
    chosen = settings(callback_hosts=["127.0.0.1"])
    stack = Stack.open(chosen, engine=pg_engine, auto_migrate=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERMEDIA_")}
    env.update(
        PYTHONPATH=str(REPO),
        HYPERMEDIA_DATA_DIR=str(chosen.data_dir),
        HYPERMEDIA_DATABASE_URL=support.url_string(pg_engine),
        HYPERMEDIA_REDIS_URL=str(chosen.redis_url),
        HYPERMEDIA_REDIS_PREFIX=chosen.redis_prefix,
        HYPERMEDIA_CALLBACK_HOSTS="127.0.0.1",
    )
    log = tmp_path / "serve.log"
    try:
        person = make_user(stack)
        with receiving() as receiver:
            # Head A's sender looks once, at its start, then sleeps for an hour.
            with head(env, log, HYPERMEDIA_CALLBACK_POLL_SECONDS="3600") as (url, first):
                with HypermediaClient(url, person.api_key) as client:
                    obj = client.upload(b"\x89PNG\r\n\x1a\n" + bytes(256), "a.png")
                    job_id = client.process(
                        obj.object_id, ["thumbnail"], callback_url=receiver.url
                    ).job_ids[0]
                # The worker's commit: completed, and the event in the outbox with it.
                [claimed] = stack.dispatcher.claim_and_start("images", "w")
                assert stack.dispatcher.complete_many("w", [FinishedJob(claimed.job_id)])
                assert _row(stack, job_id).status == "pending"
                first.kill()  # kill -9, between the commit and the send
                assert first.wait(10) == -signal.SIGKILL
            assert receiver.taken() == []
            assert _row(stack, job_id).status == "pending"

            with head(env, log, HYPERMEDIA_CALLBACK_POLL_SECONDS="0.2"):
                deadline = time.monotonic() + 30
                while not receiver.requests and time.monotonic() < deadline:
                    time.sleep(0.1)
                time.sleep(1.5)  # several more of its passes: nothing is sent twice
                got = receiver.taken()
                row = _row(stack, job_id)
    finally:
        stack.close()
    assert len(got) == 1, [r.headers for r in got]
    (request,) = got
    secret_file = chosen.data_dir / "callback.secret"
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    secret = secret_file.read_text().strip()
    signature = request.headers[webhooks.SIGNATURE_HEADER]
    assert webhooks.verify(secret, request.body, signature, time.time())
    body = request.json()
    assert (
        request.headers[webhooks.DELIVERY_HEADER]
        == body["id"]
        == outbox.event_id(job_id, "completed")
    )
    assert (body["type"], body["job"]["job_id"], body["job"]["status"]) == (
        "job.completed",
        job_id,
        "completed",
    )
    assert (row.status, row.attempts, row.response_code) == ("delivered", 1, 200)
    assert "Traceback" not in log.read_text()
