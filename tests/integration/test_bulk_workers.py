"""A bulk backfill end to end on Ray: the head's bulk thread (the API server's
maintenance) creates the run's jobs and a real ``bulk``-queue pipeline actor makes real
thumbnails of real images, the same outputs an interactive submit makes."""

from __future__ import annotations

import pyvips
from sqlalchemy import select

from hypermedia.bulk.runs import RunSpec
from hypermedia.bulk.service import BulkService
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from tests.factories import make_user, stored_object
from tests.generated.images import picture
from tests.ray_support import ray_stack


def test_a_backfill_makes_real_thumbnails_on_a_bulk_actor(pg_engine, settings, tmp_path):
    with ray_stack(settings, pg_engine, tmp_path, {"bulk": 1}, bulk_poll_seconds=0.2) as rs:
        stack = rs.stack
        person = make_user(stack)
        objects = [
            stored_object(stack, person, picture(640 + 64 * k, 480).jpegsave_buffer(Q=85))
            for k in range(3)
        ]
        service = BulkService(stack.engine, stack.queue, stack.catalog, clock=stack.clock)
        run = service.create(
            RunSpec(
                kind="backfill",
                operation="thumbnail",
                max_in_flight=2,
                filter={"pool_id": person.pool_id},
            ),
            "test",
        )

        def done() -> bool:
            view = service.get(run.run_id)
            rs.last_seen = f"{view.state} {view.jobs}"
            return view.state == "completed"

        rs.wait_for(done, timeout=120, what="the run to complete")
        view = service.get(run.run_id)
        assert view.jobs == {"completed": 3} and view.created_jobs == 3
        j, o = t.jobs.c, t.outputs.c
        with transaction(stack.engine) as conn:
            outputs = conn.execute(
                select(j.object_id, j.queue, o.storage_key, o.profile_version)
                .join(t.outputs, o.job_id == j.job_id)
                .where(j.bulk_run_id == run.run_id)
            ).all()
        assert sorted(row.object_id for row in outputs) == sorted(objects)
        for row in outputs:
            assert row.queue == "bulk" and row.profile_version == 1
            thumb = pyvips.Image.new_from_buffer(b"".join(stack.storage.read(row.storage_key)), "")
            assert thumb.get("vips-loader") == "webpload_buffer"
            assert max(thumb.width, thumb.height) == 320
