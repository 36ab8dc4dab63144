"""A chunked transcode killed after k of its n chunks resumes on a fresh worker and
transcodes only n - k chunks (counted in the retried attempt's units), on real FFmpeg,
Ray (the shared head) and S3 (moto's server); its output equals a single pass's, and
its checkpoints are gone from storage and the record once the job has ended. The
kills: the child's kill -9, the actor's kill -9, and a spot notice from the local
metadata service (an in-process worker on a real sandboxed child, as in
test_spot_watcher).

The step is ``test.transcode_slowly`` (tests/pipelines_for_tests.py): ``transcode_video``
in 1 s chunks; a clip of four seconds at 160x120: four chunks, a few CPU-seconds a test.
For the kills its first attempt holds after the second chunk until it is killed (so the
kill lands between two chunks however loaded the machine); for a spot notice it pauses
1.5 s after each piece. The Ray test (both kills and a cancel, one stack) takes 30-80 s
of wall clock, and must: an actor's start, and for the actor's kill a replacement's."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from sqlalchemy import select

import pipelines.media as media
from hypermedia.db import tables as t
from hypermedia.ingest.service import SubmitRequest
from hypermedia.jobs import checkpoints
from hypermedia.sandbox.executor import ChildExecutor
from hypermedia.server import Maintenance
from hypermedia.stack import Stack
from hypermedia.storage.grants import StorageGrants
from hypermedia.worker.execute import JobExecution
from hypermedia.worker.spot import SpotWatch
from hypermedia.worker.worker import SPOT_INTERRUPTED, Worker
from tests import media_support as ms
from tests import ray_support, support
from tests.clouds.metadata_server import MetadataServer
from tests.factories import make_user, stored_object
from tests.integration import test_media_frame_rate as frame_rate
from tests.pipelines_for_tests import PRELOAD
from tests.ray_support import ray_stack

OPERATION = "test.transcode_slowly"
SECONDS = 4  # chunks
KILL_AFTER = 2
PAUSE = 1.5  # seconds after each finished piece: the window a spot notice lands in
# The kill tests: the first attempt holds after its KILL_AFTER-th chunk until killed, on
# any machine (a pause after each chunk let a loaded machine commit a third before the
# kill); the retry resumes that chunk, so it never holds.
HOLD = {"hold_after": f"chunk-{KILL_AFTER - 1:05d}.mp4", "hold_seconds": 600}
REGION = "us-east-1"


@pytest.fixture
def moto_s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    with support.moto_bucket(monkeypatch, "hm-resume", REGION) as settings:
        yield settings


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ms.clip(tmp_path_factory.mktemp("resume") / "clip.mp4", SECONDS)


@pytest.fixture(scope="module")
def single(clip: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The clip's single pass, which every resumed output is compared with."""
    return _single_pass(clip, tmp_path_factory.mktemp("resume") / "single")


def _wait(predicate: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.1)


def _submit(stack: Stack, person: Any, clip: Path, hold: bool = False) -> str:
    object_id = stored_object(stack, person, clip.read_bytes())
    params: dict[str, Any] = dict(HOLD) if hold else {"pause_seconds": PAUSE}
    result = stack.ingest.submit(
        person.caller,
        SubmitRequest(object_id=object_id, operations=[OPERATION], params={OPERATION: params}),
    )
    return result.job_ids[0]


def _status(stack: Stack, person: Any, job_id: str) -> str:
    return stack.ingest.get_job(person.caller, job_id).status


def _completed(rs: ray_support.RayStack, person: Any, job_id: str) -> bool:
    """Whether the job completed; what it was is kept for the timeout's message."""
    view = rs.stack.ingest.get_job(person.caller, job_id)
    attempts = [(a.status, a.error_code, a.worker_id) for a in view.attempts]
    # Where Redis has it too: a timeout's message says which side kept the job waiting.
    in_redis = rs.stack.queue.members("media").get(job_id, "absent")
    rs.last_seen = f"{view.status}, attempts {attempts}, in Redis: {in_redis}"
    return view.status == "completed"


def _keys(stack: Stack, job_id: str) -> list[str]:
    with stack.engine.connect() as conn:
        rows = conn.execute(
            select(t.checkpoints.c.storage_key).where(t.checkpoints.c.job_id == job_id)
        )
        return [row.storage_key for row in rows]


def _single_pass(clip: Path, workdir: Path) -> Path:
    workdir.mkdir()
    (output,) = media.transcode_video(clip, {"height": 120, "crf": 30}, workdir)
    return output.path


def _check_resumed(
    stack: Stack, person: Any, job_id: str, single: Path, tmp_path: Path, resumed: int = KILL_AFTER
) -> None:
    """The retry transcoded only the chunks not committed before the kill; the output is
    a single pass's equal; the checkpoints are deleted (by the head's maintenance)."""
    view = stack.ingest.get_job(person.caller, job_id)
    assert view.status == "completed", view.attempts
    retry = view.attempts[-1]
    assert retry.units == {"chunks": SECONDS - resumed, "chunks_resumed": resumed}
    (output,) = view.outputs
    received = tmp_path / "output.mp4"
    received.write_bytes(b"".join(stack.storage.read(output.storage_key)))
    ms.assert_same_as_single_pass(received, single, SECONDS)
    keys = _keys(stack, job_id)
    _wait(lambda: not _keys(stack, job_id), "checkpoints swept", timeout=30)
    assert keys == [] or not any(stack.storage.exists(key) for key in keys)


def _killed_after_k(stack: Stack, job_id: str) -> None:
    _wait(
        lambda: checkpoints.count(stack.engine, job_id) >= KILL_AFTER,
        f"{KILL_AFTER} chunks committed",
        timeout=120,
    )


def test_kill_9_of_the_child_resumes_from_the_committed_chunks(
    pg_engine, settings, tmp_path, moto_s3, clip, single
):
    """The child killed after KILL_AFTER chunks: the retry resumes from them. Then, on
    the same stack and actor, two tests folded in (each started a Ray stack and an actor
    of its own, ~5 CPU-s; their assertions kept): a second job cancelled once a chunk is
    committed has its checkpoints deleted (test_a_cancelled_jobs_checkpoints_are_deleted);
    a third, its actor killed after KILL_AFTER chunks, resumes from them on the actor
    that replaces it (test_kill_9_of_the_actor_resumes_on_another_worker)."""
    with ray_stack(
        settings, pg_engine, tmp_path, {"media": 1}, backoff_base_seconds=0.2, **moto_s3
    ) as rs:
        person = make_user(rs.stack)
        job_id = _submit(rs.stack, person, clip, hold=True)
        (member,) = rs.supervisor.actors("media")
        _killed_after_k(rs.stack, job_id)
        stored = _keys(rs.stack, job_id)
        assert all(rs.stack.storage.exists(key) for key in stored)
        assert all(key.startswith(f"checkpoints/{job_id}/1/") for key in stored)
        pid = ray.get(member.actor.child_pids.remote())[job_id]
        os.kill(pid, signal.SIGKILL)
        rs.wait_for(lambda: _completed(rs, person, job_id), timeout=120, what="the retry")
        view = rs.stack.ingest.get_job(person.caller, job_id)
        assert [(a.status, a.error_code) for a in view.attempts] == [
            ("failed", "child_killed"),
            ("completed", None),
        ]
        _check_resumed(rs.stack, person, job_id, single, tmp_path)
        # A cancelled job's checkpoints are deleted.
        cancelled = _submit(rs.stack, person, clip)
        rs.wait_for(lambda: checkpoints.count(rs.stack.engine, cancelled) >= 1, what="a chunk")
        stored = _keys(rs.stack, cancelled)
        rs.stack.ingest.cancel(person.caller, cancelled)
        rs.wait_for(lambda: _status(rs.stack, person, cancelled) == "cancelled", what="cancelled")
        _wait(lambda: not _keys(rs.stack, cancelled), "checkpoints swept", timeout=30)
        assert stored and not any(rs.stack.storage.exists(key) for key in stored)
        # The actor killed: the job resumes on another worker.
        job_id = _submit(rs.stack, person, clip, hold=True)
        (member,) = rs.supervisor.actors("media")
        _killed_after_k(rs.stack, job_id)
        os.kill(ray.get(member.actor.pid.remote()), signal.SIGKILL)
        rs.wait_for(lambda: _completed(rs, person, job_id), timeout=120, what="the rerun")
        view = rs.stack.ingest.get_job(person.caller, job_id)
        assert [(a.status, a.error_code) for a in view.attempts] == [
            ("failed", "worker_lost"),
            ("completed", None),
        ]
        assert view.attempts[1].worker_id != member.worker_id
        (received := tmp_path / "actor-killed").mkdir()
        _check_resumed(rs.stack, person, job_id, single, received)


def _spot_worker(
    stack: Stack, executor: ChildExecutor, worker_id: str, work: Path, spot: SpotWatch | None
) -> Worker:
    grants = StorageGrants(stack.engine, stack.storage, 300, stack.clock)
    execution = JobExecution(
        stack.dispatcher, stack.catalog, grants, executor, worker_id, poll_seconds=0.5
    )
    return Worker(
        worker_id=worker_id,
        queue="media",
        concurrency=1,
        engine=stack.engine,
        dispatcher=stack.dispatcher,
        execution=execution,
        work_root=str(work),
        clock=stack.clock,
        spot=spot,
    )


@pytest.mark.parametrize(
    ("notice_seconds", "resumed"),
    [
        # Time to spare: the chunk in progress is finished and stored, then the child
        # is stopped.
        (120, KILL_AFTER + 1),
        # No time (less than the margin for the kill and the hand back): abandoned.
        (2, KILL_AFTER),
    ],
)
def test_a_spot_notice_keeps_the_finished_chunks_for_the_next_worker(
    pg_engine, settings, tmp_path, moto_s3, clip, single, notice_seconds, resumed
):
    stack = Stack.open(
        settings(profiles_path=ray_support.test_profiles(tmp_path), **moto_s3),
        engine=pg_engine,
        auto_migrate=True,
    )
    person = make_user(stack)
    job_id = _submit(stack, person, clip)
    work_a, work_b = tmp_path / "work-a", tmp_path / "work-b"
    maintenance = Maintenance(stack, reaper_interval=0.5, reconcile_interval=30)
    with (
        MetadataServer() as metadata,
        ChildExecutor(work_a, preload=PRELOAD) as executor_a,
        ChildExecutor(work_b, preload=PRELOAD) as executor_b,
    ):
        watch = SpotWatch("aws", metadata_url=metadata.url, poll_seconds=0.2)
        first = _spot_worker(stack, executor_a, "spot-a", work_a, watch)
        first.start()
        try:
            _killed_after_k(stack, job_id)
            metadata.serve_notice(deadline=time.time() + notice_seconds)
            assert first.wait(30), "the worker did not stop after the notice"
        finally:
            first.stop()
        view = stack.ingest.get_job(person.caller, job_id)
        assert view.status == "queued" and view.attempt_count == 0
        assert [(a.status, a.error_code) for a in view.attempts] == [("released", SPOT_INTERRUPTED)]
        second = _spot_worker(stack, executor_b, "steady-b", work_b, None)
        second.start()
        maintenance.start()
        try:
            _wait(lambda: _status(stack, person, job_id) == "completed", "the rerun")
            _check_resumed(stack, person, job_id, single, tmp_path, resumed)
        finally:
            maintenance.stop()
            second.stop()
    stack.close()


@pytest.mark.parametrize("damage", ["truncated", "bytes_changed"])
def test_a_checkpoint_damaged_in_storage_is_made_again(
    pg_engine, settings, tmp_path, moto_s3, clip, single, damage
):
    """A committed chunk whose stored bytes are damaged (cut in half, or 2,000 bytes
    inverted) before the retry restores it: the retry makes that chunk again and the
    job completes with a single pass's output. Before: the truncated chunk failed the
    job for good (``invalid_input``: the concat could not open it, blamed on the
    user's input), the changed one was joined into an output that did not decode."""
    stack = _s3_stack(settings, pg_engine, tmp_path, moto_s3)
    person = make_user(stack)
    job_id = _submit(stack, person, clip, hold=True)
    work_a, work_b = tmp_path / "work-a", tmp_path / "work-b"
    maintenance = Maintenance(stack, reaper_interval=0.5, reconcile_interval=30)
    with (
        ChildExecutor(work_a, preload=PRELOAD) as executor_a,
        ChildExecutor(work_b, preload=PRELOAD) as executor_b,
    ):
        first = _spot_worker(stack, executor_a, "first-a", work_a, None)
        first.start()
        try:
            _killed_after_k(stack, job_id)
            pid = executor_a.child_pid(job_id)
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            _wait(lambda: _status(stack, person, job_id) in ("retry_wait", "queued"), "the kill")
        finally:
            first.stop()
        key = min(_keys(stack, job_id))
        assert key.endswith("-chunk-00000.mp4")
        data = b"".join(stack.storage.read(key))
        middle = len(data) // 2
        if damage == "truncated":
            data = data[:middle]
        else:
            data = (
                data[:middle]
                + bytes(b ^ 0xFF for b in data[middle : middle + 2000])
                + data[middle + 2000 :]
            )
        stack.storage.put(key, [data])
        second = _spot_worker(stack, executor_b, "second-b", work_b, None)
        second.start()
        maintenance.start()
        try:
            _wait(lambda: _status(stack, person, job_id) in ("completed", "failed"), "the retry")
            view = stack.ingest.get_job(person.caller, job_id)
            assert [(a.status, a.error_code) for a in view.attempts] == [
                ("failed", "child_killed"),
                ("completed", None),
            ]
            # chunk 0 made again, chunk 1 resumed, chunks 2 and 3 made for the first time
            _check_resumed(stack, person, job_id, single, tmp_path, resumed=KILL_AFTER - 1)
        finally:
            maintenance.stop()
            second.stop()
    stack.close()


def test_a_damaged_checkpoint_made_again_is_stored_again(
    pg_engine, settings, tmp_path, moto_s3, clip, single
):
    """A restored chunk found damaged is made again, but its worker counted it stored
    (it had restored it) and never stored the new one: storage kept the damaged bytes,
    and every later retry met them again. Attempt 1 commits chunk 0 and is killed; its
    stored bytes are damaged; attempt 2 makes chunk 0 again, which must replace the
    damaged one in storage (old code: never within 60 s), and is killed while it holds
    after it; attempt 3 resumes chunk 0 and makes the other three."""
    stack = _s3_stack(settings, pg_engine, tmp_path, moto_s3)
    person = make_user(stack)
    object_id = stored_object(stack, person, clip.read_bytes())
    hold = {"hold_after": "chunk-00000.mp4", "hold_seconds": 600}
    job_id = stack.ingest.submit(
        person.caller,
        SubmitRequest(object_id=object_id, operations=[OPERATION], params={OPERATION: hold}),
    ).job_ids[0]
    works = [tmp_path / f"work-{n}" for n in (1, 2, 3)]
    maintenance = Maintenance(stack, reaper_interval=0.5, reconcile_interval=30)
    with (
        ChildExecutor(works[0], preload=PRELOAD) as executor_1,
        ChildExecutor(works[1], preload=PRELOAD) as executor_2,
        ChildExecutor(works[2], preload=PRELOAD) as executor_3,
    ):
        first = _spot_worker(stack, executor_1, "first", works[0], None)
        first.start()
        try:
            _wait(lambda: checkpoints.count(stack.engine, job_id) >= 1, "chunk 0", timeout=120)
            _kill_child(stack, person, job_id, executor_1)
        finally:
            first.stop()
        (key,) = _keys(stack, job_id)
        assert key.endswith("-chunk-00000.mp4")
        data = b"".join(stack.storage.read(key))
        middle = len(data) // 2
        damaged = (
            data[:middle]
            + bytes(b ^ 0xFF for b in data[middle : middle + 2000])
            + data[middle + 2000 :]
        )
        stack.storage.put(key, [damaged])
        maintenance.start()  # where the retries' backoff ends
        try:
            second = _spot_worker(stack, executor_2, "second", works[1], None)
            second.start()
            try:
                _wait(lambda: executor_2.child_pid(job_id) is not None, "attempt 2", timeout=120)
                _wait(
                    lambda: b"".join(stack.storage.read(key)) != damaged,
                    "the chunk made again stored in place of the damaged one",
                    timeout=60,
                )
                _kill_child(stack, person, job_id, executor_2)
            finally:
                second.stop()
            third = _spot_worker(stack, executor_3, "third", works[2], None)
            third.start()
            try:
                _wait(
                    lambda: _status(stack, person, job_id) in ("completed", "failed"), "attempt 3"
                )
                view = stack.ingest.get_job(person.caller, job_id)
                assert [(a.status, a.error_code) for a in view.attempts] == [
                    ("failed", "child_killed"),
                    ("failed", "child_killed"),
                    ("completed", None),
                ]
                _check_resumed(stack, person, job_id, single, tmp_path, resumed=1)
            finally:
                third.stop()
        finally:
            maintenance.stop()
    stack.close()


def _kill_child(stack: Stack, person: Any, job_id: str, executor: ChildExecutor) -> None:
    pid = executor.child_pid(job_id)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    _wait(lambda: _status(stack, person, job_id) in ("retry_wait", "queued"), "the kill")


def _s3_stack(settings: Any, engine: Any, tmp_path: Path, moto_s3: dict[str, Any]) -> Stack:
    """A stack on moto's S3 with the test profiles, retrying after 0.2 s."""
    return Stack.open(
        settings(
            profiles_path=ray_support.test_profiles(tmp_path), backoff_base_seconds=0.2, **moto_s3
        ),
        engine=engine,
        auto_migrate=True,
    )


def test_a_variable_frame_rate_video_killed_mid_way_resumes_from_its_chunks(
    pg_engine, settings, tmp_path, moto_s3
):
    """A phone clip's variable frame rate (tests.integration.test_media_frame_rate's
    CUT: 6 chunks, bursts and slow frames across them) killed after KILL_AFTER chunks:
    the retry makes only the rest, and its output has the single pass's frames at their
    times. Before, such a video was never chunked: the retry made it all again."""
    clip = frame_rate.timed(
        tmp_path / "phone.mp4", frame_rate.CUT, frames=frame_rate.CUT_FRAMES, rate=60,
        flash_at=5.2, flash=frame_rate.CUT_FLASH, keyframes="0,1,2,3,4,5", seconds=6,
    )  # fmt: skip
    chunks = 6
    stack = _s3_stack(settings, pg_engine, tmp_path, moto_s3)
    person = make_user(stack)
    job_id = _submit(stack, person, clip, hold=True)
    work_a, work_b = tmp_path / "work-a", tmp_path / "work-b"
    maintenance = Maintenance(stack, reaper_interval=0.5, reconcile_interval=30)
    with (
        ChildExecutor(work_a, preload=PRELOAD) as executor_a,
        ChildExecutor(work_b, preload=PRELOAD) as executor_b,
    ):
        first = _spot_worker(stack, executor_a, "first-a", work_a, None)
        first.start()
        try:
            _killed_after_k(stack, job_id)
            _kill_child(stack, person, job_id, executor_a)
        finally:
            first.stop()
        second = _spot_worker(stack, executor_b, "second-b", work_b, None)
        second.start()
        maintenance.start()
        try:
            _wait(lambda: _status(stack, person, job_id) in ("completed", "failed"), "the retry")
        finally:
            maintenance.stop()
            second.stop()
    view = stack.ingest.get_job(person.caller, job_id)
    assert [(a.status, a.error_code) for a in view.attempts] == [
        ("failed", "child_killed"),
        ("completed", None),
    ]
    assert view.attempts[-1].units == {"chunks": chunks - KILL_AFTER, "chunks_resumed": KILL_AFTER}
    (output,) = view.outputs
    received = tmp_path / "output.mp4"
    received.write_bytes(b"".join(stack.storage.read(output.storage_key)))
    single = _single_pass(clip, tmp_path / "single")
    times = frame_rate.packet_times(received)
    assert len(times) == frame_rate.CUT_FRAMES
    assert times == pytest.approx(frame_rate.packet_times(single), abs=frame_rate.TICK)
    assert frame_rate.audio_packets(received) == frame_rate.audio_packets(single)
    assert frame_rate.decode_errors(received) == ""
    assert frame_rate.flash_time(received) == pytest.approx(5.2, abs=frame_rate.TICK)
    stack.close()
