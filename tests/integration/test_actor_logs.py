"""A pipeline actor's logs on a real Ray cluster: JSON lines with their extra fields in
Ray's ``worker-*.err`` of the actor's process (hypermedia.logs)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import ray

from tests.ray_support import ray_stack, shared_head


def _records(paths: list[Path]) -> list[dict[str, Any]]:
    """Every record in the files: their lines that are not Ray's own markers."""
    records = []
    for path in paths:
        for line in path.read_text().splitlines():
            if not line.strip() or line.startswith(":"):  # Ray's ":actor_name:" markers
                continue
            records.append(json.loads(line))  # anything else is a record: JSON
    return records


def test_a_pipeline_actor_logs_json_lines_with_worker_id_queue_and_action(
    pg_engine, settings, tmp_path
):
    with ray_stack(settings, pg_engine, tmp_path, {"images": 1}) as rs:
        (member,) = rs.supervisor.actors("images")
        pid = ray.get(member.actor.pid.remote())
        logs_dir = shared_head().temp_dir / "session_latest" / "logs"
        found: list[dict[str, Any]] = []

        def started() -> bool:
            found[:] = _records(sorted(logs_dir.glob(f"worker-*-{pid}.err")))
            rs.last_seen = repr(found[-3:])
            return any(r.get("action") == "start" for r in found)

        rs.wait_for(started, timeout=30, what=f"the start record in worker-*-{pid}.err")
        (start,) = [r for r in found if r.get("action") == "start"]
        assert start["worker_id"] == member.worker_id
        assert start["queue"] == "images"
        assert start["level"] == "INFO"
        assert start["logger"] == "hypermedia.worker.worker"
        assert member.worker_id in start["message"]
        assert datetime.fromisoformat(start["timestamp"]).utcoffset() is not None
