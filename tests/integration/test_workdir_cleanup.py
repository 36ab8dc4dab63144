"""A dead worker's job workdirs (copies of user input) do not stay on disk: the
supervisor removes them when Ray reports the actor's death, the reaper when a job's
lease runs out and nobody reported anything."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import ray

from hypermedia import objects
from hypermedia.clock import to_datetime
from hypermedia.db.engine import transaction
from hypermedia.ids import new_id
from hypermedia.ingest.service import SubmitRequest
from hypermedia.storage.base import original_key
from hypermedia.workdirs import job_workdir, worker_root
from tests.factories import add_worker_row, make_object, make_user, open_stack, submit
from tests.ray_support import ray_stack

SECRET_INPUT = b"the user's file, copied into the job's workdir " * 100


def test_killed_actors_workdirs_are_removed_when_it_is_replaced(pg_engine, settings, tmp_path):
    with ray_stack(settings, pg_engine, tmp_path, {"images": 1}) as rs:
        person = make_user(rs.stack)
        object_id = new_id()
        key = original_key(person.pool_id, object_id)
        blob = rs.stack.storage.put(key, [SECRET_INPUT])
        with transaction(rs.stack.engine) as conn:
            objects.register_object(
                conn,
                person.caller,
                object_id=object_id,
                pool_id=person.pool_id,
                storage_key=key,
                filename="in.bin",
                size_bytes=blob.size_bytes,
                now=rs.stack.clock.now(),
            )
        job_id = rs.stack.ingest.submit(
            person.caller,
            SubmitRequest(
                object_id=object_id,
                operations=["test.sleep"],
                params={"test.sleep": {"seconds": 120}},
            ),
        ).job_ids[0]
        (member,) = rs.supervisor.actors("images")
        data_dir = rs.settings.data_dir
        workdir = job_workdir(data_dir, member.worker_id, job_id)
        rs.wait_for(
            lambda: job_id in ray.get(member.actor.child_pids.remote()), what="the job running"
        )
        copied = [p for p in workdir.rglob("*") if p.is_file() and p.read_bytes() == SECRET_INPUT]
        assert copied, f"no copy of the input under {workdir}"

        os.kill(ray.get(member.actor.pid.remote()), signal.SIGKILL)
        rs.wait_for(lambda: member.worker_id in rs.supervisor.events.died, what="death noticed")
        assert job_id in rs.supervisor.events.recovered_jobs
        assert not worker_root(data_dir, member.worker_id).exists()
        assert not any(p.read_bytes() == SECRET_INPUT for p in _files(data_dir / "work"))


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


def test_reaper_removes_the_workdir_of_a_job_whose_lease_ran_out(
    engine, settings, manual_clock, tmp_path
):
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    job_id = submit(stack, person, ["thumbnail"], object_id=make_object(stack, person))[0]
    [job] = stack.dispatcher.claim_and_start("images", "images-gone")
    assert job.job_id == job_id
    # What the worker had made of the job when it vanished without a word.
    workdir = job_workdir(stack.settings.data_dir, "images-gone", job_id)
    (workdir / "input").mkdir(parents=True)
    (workdir / "input" / "source").write_bytes(SECRET_INPUT)
    (workdir / "out").mkdir(mode=0o500)  # a step may leave it unwritable
    other = job_workdir(stack.settings.data_dir, "images-alive", new_id())
    other.mkdir(parents=True)

    assert stack.reaper.tick().expired == 0
    assert workdir.exists()  # the lease still runs: the job may be alive
    manual_clock.advance(stack.dispatcher.queue_lease_seconds("images") + 1)
    assert stack.reaper.tick().expired == 1
    assert not workdir.exists()
    assert other.exists()  # another worker's job is not touched
    stack.close()


def test_a_worker_starting_on_a_node_removes_what_ended_workers_left_there(
    pg_engine, settings, tmp_path
):
    """On a burst node neither the supervisor nor the reaper runs: the next worker
    that starts there removes the roots of workers the record says have ended, and
    only those (one without a row may be starting right now)."""
    with ray_stack(settings, pg_engine, tmp_path, {"images": 1}) as rs:
        data_dir = rs.settings.data_dir
        left = {}
        for worker_id, status in [
            ("images-diedonburst", "dead"),
            ("images-stoppedthere", "stopped"),
            ("images-noticed", "spot_interrupted"),
            ("images-starting", None),
        ]:
            workdir = job_workdir(data_dir, worker_id, new_id())
            (workdir / "input").mkdir(parents=True)
            (workdir / "input" / "source").write_bytes(SECRET_INPUT)
            (workdir / "out").mkdir(mode=0o500)  # a job may leave it unwritable
            left[worker_id] = worker_root(data_dir, worker_id)
            if status is not None:
                # (An active row would not do: one whose heartbeat stops is marked
                # dead within seconds, and then swept too.)
                now = to_datetime(rs.stack.clock.now())
                add_worker_row(rs.stack.engine, worker_id, at=now, status=status)

        # The record says the first three ended; a new worker starts on this node.
        (member,) = rs.supervisor.actors("images")
        os.kill(ray.get(member.actor.pid.remote()), signal.SIGKILL)
        rs.wait_for(lambda: member.worker_id in rs.supervisor.events.died, what="death noticed")
        rs.wait_for(
            lambda: any(m.worker_id != member.worker_id for m in rs.supervisor.actors("images")),
            what="a replacement",
        )
        rs.supervisor.wait_ready()

        assert not left["images-diedonburst"].exists()
        assert not left["images-stoppedthere"].exists()
        assert not left["images-noticed"].exists()
        assert left["images-starting"].exists()
