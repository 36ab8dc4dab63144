"""A bulk run across a kill -9 of the head: ``hypermedia serve`` in a subprocess drives a
backfill from its bulk thread, is killed with SIGKILL mid-creation, and a second head
goes on from the run's cursor: every object gets exactly one job, all of them in Redis."""

from __future__ import annotations

import os
import signal
import time

from sqlalchemy import func, insert, select

from hypermedia.bulk.runs import RunSpec
from hypermedia.bulk.service import BulkService
from hypermedia.clock import to_datetime
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.ids import new_id
from hypermedia.stack import Stack
from tests import support
from tests.e2e.test_callbacks_head import REPO, head
from tests.factories import make_user

OBJECTS = 4000


def _seed(stack: Stack, owner_id: str, pool_id: str, n: int) -> None:
    """Upload rows (what register_object writes), in one statement."""
    now = to_datetime(stack.clock.now())
    rows = []
    for _ in range(n):
        object_id = new_id()
        rows.append(
            {
                "object_id": object_id,
                "pool_id": pool_id,
                "owner_id": owner_id,
                "kind": "original",
                "storage_key": f"originals/{pool_id}/{object_id}",
                "filename": "photo.jpg",
                "content_type": "image/jpeg",
                "size_bytes": 1000,
                "created_at": now,
            }
        )
    with transaction(stack.engine) as conn:
        conn.execute(insert(t.objects), rows)


def _created(service: BulkService, run_id: str) -> int:
    return service.get(run_id).created_jobs


def test_a_head_killed_mid_creation_resumes_from_the_cursor_with_no_duplicate(
    pg_engine, settings, tmp_path
):
    chosen = settings()
    stack = Stack.open(chosen, engine=pg_engine, auto_migrate=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERMEDIA_")}
    env.update(
        PYTHONPATH=str(REPO),
        HYPERMEDIA_DATA_DIR=str(chosen.data_dir),
        HYPERMEDIA_DATABASE_URL=support.url_string(pg_engine),
        HYPERMEDIA_REDIS_URL=str(chosen.redis_url),
        HYPERMEDIA_REDIS_PREFIX=chosen.redis_prefix,
        HYPERMEDIA_BULK_POLL_SECONDS="0.2",
    )
    log = tmp_path / "serve.log"
    try:
        person = make_user(stack)
        _seed(stack, person.caller.user_id, person.pool_id, OBJECTS)
        service = BulkService(stack.engine, stack.queue, stack.catalog, clock=stack.clock)
        with head(env, log) as (_url, first):
            run = service.create(
                RunSpec(
                    kind="backfill", operation="thumbnail", max_in_flight=OBJECTS, batch_size=50
                ),
                "test",
            )
            deadline = time.monotonic() + 60
            while _created(service, run.run_id) < 200 and time.monotonic() < deadline:
                time.sleep(0.01)
            first.kill()  # kill -9, mid-creation
            assert first.wait(10) == -signal.SIGKILL
        at_kill = _created(service, run.run_id)
        assert 0 < at_kill < OBJECTS, f"{at_kill} of {OBJECTS} at the kill: not mid-creation"
        with head(env, log):
            deadline = time.monotonic() + 120
            while service.get(run.run_id).state == "creating" and time.monotonic() < deadline:
                time.sleep(0.2)
            view = service.get(run.run_id)
            j = t.jobs.c
            with transaction(stack.engine) as conn:
                jobs, objects = conn.execute(
                    select(func.count(), func.count(func.distinct(j.object_id))).where(
                        j.bulk_run_id == run.run_id
                    )
                ).one()
            # The second head reconciled at its start: jobs committed but not pushed
            # when the first died are in Redis too.
            ready = stack.queue.counts("bulk").ready
    finally:
        stack.close()
    assert view.state == "draining", view
    assert (jobs, objects, view.created_jobs, view.scanned) == (OBJECTS,) * 4
    assert ready == OBJECTS
