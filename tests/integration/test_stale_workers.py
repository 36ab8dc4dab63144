"""Workers recorded active that nobody saw die are marked dead (issue 11, item 14).

A head killed with -9 takes its actors with it, and no supervisor is left to record
their deaths: their rows stay ``active`` with heartbeats that stop. The next
supervisor marks such a worker dead once its heartbeat is ``STALE_HEARTBEATS`` beats
old, and hands its in-flight jobs back; its own workers stay active.
"""

from __future__ import annotations

from sqlalchemy import select

from hypermedia.clock import to_datetime
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.worker.supervisor import STALE_HEARTBEATS
from tests.factories import add_worker_row
from tests.ray_support import ray_stack


def _status(engine, worker_id: str) -> str:
    with transaction(engine) as conn:
        return str(
            conn.execute(
                select(t.workers.c.status).where(t.workers.c.worker_id == worker_id)
            ).scalar_one()
        )


def test_a_worker_whose_heartbeat_stopped_is_marked_dead(pg_engine, settings, tmp_path):
    with ray_stack(settings, pg_engine, tmp_path, {"images": 1}) as rs:
        now = rs.stack.clock.now()
        beat = rs.supervisor.heartbeat_seconds
        rows = {"images-ghost": now - 100 * STALE_HEARTBEATS * beat}  # its head is long gone
        for worker_id, last in rows.items():
            add_worker_row(pg_engine, worker_id, at=to_datetime(last), hostname="gone")
        rs.wait_for(lambda: _status(pg_engine, "images-ghost") == "dead", what="ghost dead")
        (member,) = rs.supervisor.actors()
        assert _status(pg_engine, member.worker_id) == "active"
