"""ChildExecutor on real processes: every way a job's child can end, and what it leaves.

The operations are the misbehaving steps of ``tests/pipelines_for_tests.py``,
preloaded into the fork server. No mocks: children really run out of memory,
spin, flood the disk, fork grandchildren and get killed from outside.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from hypermedia.sandbox.executor import (
    PROGRESS_FORWARD_INTERVAL,
    ChildExecutor,
    ChildFailed,
    ChildResult,
    StepProgress,
)
from tests.pipelines_for_tests import PRELOAD

MB = 1024 * 1024


def _stat(pid: int) -> list[bytes] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None


def alive(pid: int) -> bool:
    """Running (a zombie or a vanished process is not)."""
    fields = _stat(pid)
    return fields is not None and fields[0] not in (b"Z", b"X")


def wait_until(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def children_of(parent: int) -> list[tuple[int, bytes]]:
    """(pid, state) of every process whose parent is ``parent``."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat(int(name))
            if fields is not None and int(fields[1]) == parent:
                found.append((int(name), fields[0]))
    return found


def spares_of(ex: ChildExecutor, server: int) -> list[tuple[int, bytes]]:
    """The server's children but tiny inits (:mod:`hypermedia.sandbox.tinyinit`: pid 1
    of a namespace whose pid 2 is the spare)."""
    children = children_of(server)
    if not ex.capabilities.get("tiny_init"):
        return children
    return [(pid, state) for pid, state in children if _namespace_pid(pid) != "1"]


def _namespace_pid(pid: int) -> str | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            return line.split()[-1]
    return None


@pytest.fixture(scope="module")
def executor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChildExecutor]:
    with ChildExecutor(tmp_path_factory.mktemp("sandbox"), preload=PRELOAD) as ex:
        yield ex


_ids = iter(range(1_000_000))


@pytest.fixture
def job_id() -> str:
    return f"job-{os.getpid()}-{next(_ids)}"


def place_input(ex: ChildExecutor, job_id: str, data: bytes = b"input bytes") -> Path:
    path = ex.prepare(job_id) / "input" / "source"
    path.write_bytes(data)
    return path


def run(
    ex: ChildExecutor,
    job_id: str,
    operation: str,
    params: dict[str, Any] | None = None,
    **limits: Any,
) -> ChildResult:
    limits.setdefault("timeout_seconds", 10)
    limits.setdefault("memory_limit_mb", 1024)
    return ex.run(job_id, operation, place_input(ex, job_id), params or {}, **limits)


def failure(
    ex: ChildExecutor, job_id: str, operation: str, params: dict[str, Any] | None = None, **kw: Any
) -> ChildFailed:
    with pytest.raises(ChildFailed) as caught:
        run(ex, job_id, operation, params, **kw)
    return caught.value


def run_in_thread(
    ex: ChildExecutor, job_id: str, operation: str, params: dict[str, Any], **kw: Any
) -> tuple[threading.Thread, dict[str, Any]]:
    """Start ``run`` in a thread; its result or ChildFailed lands in the dict."""
    box: dict[str, Any] = {}
    path = place_input(ex, job_id)

    def target() -> None:
        try:
            box["result"] = ex.run(job_id, operation, path, params, **kw)
        except ChildFailed as exc:
            box["failed"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    assert wait_until(lambda: ex.child_pid(job_id) is not None, 10), "the child never started"
    return thread, box


def recorded_pids(ex: ChildExecutor, job_id: str) -> list[int]:
    path = ex.workdir(job_id) / "pids.txt"
    assert wait_until(path.exists, 5)
    return [int(line) for line in path.read_text().split()]


def processes_of(uids: range) -> list[int]:
    """Live processes (not zombies) whose real uid is in ``uids``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            status = Path(f"/proc/{name}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields["State"].split()[0] in ("Z", "X"):
            continue
        if int(fields["Uid"].split()[0]) in uids:
            found.append(int(name))
    return found


def all_gone(
    ex: ChildExecutor, recorded: list[int], uids: range | None = None
) -> Callable[[], bool]:
    """Whether the processes a job recorded are dead. With PID namespaces the pids a
    job writes are its namespace's, not ours: then no process of a job uid may live."""
    caps = ex.capabilities
    if uids is None and caps.get("pid_namespace"):
        first, last = caps["uid_range"]
        uids = range(first, last + 1)
    if uids is not None:
        return lambda: processes_of(uids) == []
    return lambda: not any(alive(pid) for pid in recorded)


# -- results ---------------------------------------------------------------------------


def test_noop_result(executor, job_id):
    result = run(executor, job_id, "test.noop")
    assert result.outputs == []
    assert result.duration_ms >= 0
    assert result.peak_memory_mb > 0


def test_outputs_are_returned_inside_the_workdir(executor, job_id):
    files = {"a.bin": 10, "nested/b.bin": 2000}
    result = run(executor, job_id, "test.write_files", {"files": files})
    workdir = executor.workdir(job_id)
    assert [o.output_type for o in result.outputs] == ["file-a.bin", "file-nested/b.bin"]
    for output, size in zip(result.outputs, files.values(), strict=True):
        assert output.path.is_relative_to(workdir)
        assert output.path.stat().st_size == size
        assert output.content_type == "application/octet-stream"


def test_the_child_reads_the_input_the_caller_placed(executor, job_id):
    result = run(executor, job_id, "test.copy_input")
    assert result.outputs[0].path.read_bytes() == b"input bytes"


def test_the_child_is_told_its_cpu_share(tmp_path, job_id):
    """job_cpus reaches the steps as HYPERMEDIA_JOB_CPUS (the ocr step's threads); an
    executor without it tells nothing."""
    with ChildExecutor(tmp_path / "shared", preload=PRELOAD, job_cpus=3) as ex:
        result = run(ex, job_id, "test.environment", timeout_seconds=7, memory_limit_mb=900)
        seen = json.loads(result.outputs[0].path.read_text())
    assert seen["environ"]["HYPERMEDIA_JOB_CPUS"] == "3"
    with ChildExecutor(tmp_path / "none", preload=PRELOAD) as ex:
        result = run(ex, job_id, "test.environment", timeout_seconds=7, memory_limit_mb=900)
        seen = json.loads(result.outputs[0].path.read_text())
    assert "HYPERMEDIA_JOB_CPUS" not in seen["environ"]


def test_what_the_child_sees(tmp_path, monkeypatch, job_id):
    monkeypatch.setenv("HYPERMEDIA_TEST_SECRET", "s3cr3t")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t")
    monkeypatch.setenv("VIPS_BLOCK_UNTRUSTED", "1")
    with ChildExecutor(tmp_path, preload=PRELOAD) as ex:
        result = run(
            ex,
            job_id,
            "test.environment",
            timeout_seconds=7,
            memory_limit_mb=900,
            max_output_bytes=5 * MB,
        )
        seen = json.loads(result.outputs[0].path.read_text())
        workdir = str(ex.workdir(job_id))
        log = (ex.workdir(job_id) / ".child.log").read_text()
        pid_namespace = ex.capabilities.get("pid_namespace")
        tiny_init = ex.capabilities.get("tiny_init")

    assert "s3cr3t" not in json.dumps(seen["environ"])
    assert seen["environ"]["VIPS_BLOCK_UNTRUSTED"] == "1"
    assert seen["oom_score_adj"] == "1000"  # the OOM killer takes a job first
    assert seen["environ"]["HOME"] == seen["environ"]["TMPDIR"] == workdir
    assert seen["cwd"] == seen["tempdir"] == workdir
    # stdin, stdout/stderr (the log), the result socket, and listdir's own descriptor
    assert seen["fds"] == [0, 1, 2, 3, 4]
    if tiny_init:
        # pid 2 of its own namespace (a tiny init is pid 1), in a session of its own
        assert (seen["pid"], seen["pgid"], seen["sid"]) == (2, 2, 2)
    elif pid_namespace:
        # pid 2 of its own namespace, in the session and group of that namespace's init
        assert (seen["pid"], seen["pgid"], seen["sid"]) == (2, 1, 1)
    else:
        assert seen["pid"] == seen["pgid"] == seen["sid"]  # its own session and group
    assert seen["rlimits"] == {
        "RLIMIT_AS": [900 * MB, 900 * MB],
        "RLIMIT_CPU": [7, 8],
        "RLIMIT_FSIZE": [5 * MB, 5 * MB],
        "RLIMIT_CORE": [0, 0],
        "RLIMIT_NOFILE": [1024, 1024],
    }
    assert "hello from the child" in log


def test_a_real_image_step_runs_in_the_sandbox(executor, job_id):
    """libvips starts threads in the child (forked without Python's hooks) under RLIMIT_AS."""
    import pyvips

    source = executor.prepare(job_id) / "input" / "source"
    image = pyvips.Image.black(1200, 900, bands=3) + 100
    source.write_bytes(image.write_to_buffer(".jpg[Q=90]"))
    params = {"width": 320, "height": 320, "format": "webp"}
    result = executor.run(
        job_id, "thumbnail", source, params, timeout_seconds=30, memory_limit_mb=256
    )
    [output] = result.outputs
    assert output.content_type == "image/webp"
    assert output.path.is_relative_to(executor.workdir(job_id))
    assert pyvips.Image.new_from_file(str(output.path)).width == 320


def test_the_server_stays_single_threaded_with_the_pipelines_loaded(executor):
    """The server forks with libc's fork(), which needs a single thread (else os.fork)."""
    assert executor.server_pid is not None
    assert os.listdir(f"/proc/{executor.server_pid}/task") == [str(executor.server_pid)]


def test_the_image_steps_fork_server_prepares_the_cmyk_transform_and_forks_safely(tmp_path, job_id):
    """The image steps' own preload: the server built the CMYK transform through
    libvips (prepare_fork_server) and is still single-threaded; its children run a
    profile-less CMYK JPEG (Pillow, that transform) and a PNG (libvips, its threads)."""
    import pyvips

    from pipelines import images
    from tests.generated import images as drawn

    with ChildExecutor(tmp_path, preload=images.PRELOAD) as ex:
        assert ex.server_pid is not None
        assert os.listdir(f"/proc/{ex.server_pid}/task") == [str(ex.server_pid)]
        cmyk = drawn.picture(640, 480).icc_transform("cmyk")
        inputs = {
            "cmyk": cmyk.write_to_buffer(".jpg[Q=90]", keep=drawn.KEEP_NONE),
            "png": drawn.picture(640, 480).write_to_buffer(".png"),
        }
        for n, (kind, data) in enumerate(inputs.items()):
            job = f"{job_id}-{n}"
            source = ex.prepare(job) / "input" / "source"
            source.write_bytes(data)
            params = {"width": 320, "height": 320, "format": "webp"}
            result = ex.run(
                job, "thumbnail", source, params, timeout_seconds=60, memory_limit_mb=512
            )
            [output] = result.outputs
            made = pyvips.Image.new_from_file(str(output.path))
            assert (made.width, made.bands) == (320, 3), kind
            # The drawing's colours, not a negative (CMYK through a profile).
            assert (made - drawn.picture(320, 240)).abs().avg() < 25, kind
            ex.cleanup(job)


# -- failures --------------------------------------------------------------------------


def test_timeout_kills_the_whole_group_within_the_wall_clock(executor, job_id):
    started = time.monotonic()
    exc = failure(executor, job_id, "test.sleep", {"seconds": 60, "children": 3}, timeout_seconds=1)
    elapsed = time.monotonic() - started
    assert exc.code == "timeout"
    assert exc.retryable
    # Wall clock = 1 s * 1.5 (the child's start counted, so not sooner), then killed: long
    # before its 60 s sleep or the executor's own wait for a stuck server would end it.
    assert 1.5 <= elapsed < 15
    grandchildren = recorded_pids(executor, job_id)
    assert len(grandchildren) == 3
    assert wait_until(all_gone(executor, grandchildren), 1)


def test_a_grandchild_that_leaves_the_group_is_swept_up(executor, job_id):
    exc = failure(
        executor,
        job_id,
        "test.sleep",
        {"seconds": 60, "children": 2, "escape": True},
        timeout_seconds=0.5,
    )
    assert exc.code == "timeout"
    grandchildren = recorded_pids(executor, job_id)
    assert wait_until(all_gone(executor, grandchildren), 3)


def test_processes_left_behind_by_a_successful_job_are_killed(executor, job_id):
    params = {"seconds": 0, "children": 20}
    result = run(executor, job_id, "test.sleep", params, max_processes=32)
    assert result.outputs == []
    grandchildren = recorded_pids(executor, job_id)
    assert len(grandchildren) == 20
    assert wait_until(all_gone(executor, grandchildren), 1)


def test_memory_hog_gets_memory_limit_and_the_executor_survives(executor, job_id):
    exc = failure(executor, job_id, "test.allocate", {"mb": 4096}, memory_limit_mb=256)
    assert exc.code == "memory_limit"
    assert not exc.retryable
    assert run(executor, job_id + "-next", "test.noop").outputs == []


def test_an_opencv_allocation_past_the_limit_is_memory_limit(tmp_path: Path):
    # OpenCV's own error for a failed allocation (the OCR step's resize of a large page
    # under load met it: reported pipeline_crashed before).
    with ChildExecutor(tmp_path / "work", preload=(*PRELOAD, "numpy", "cv2")) as ex:
        exc = failure(ex, "opencv", "test.allocate_in_opencv", {"mb": 2048}, memory_limit_mb=1024)
        assert exc.code == "memory_limit", exc
        run(ex, "opencv-small", "test.allocate_in_opencv", {"mb": 16}, memory_limit_mb=1024)


def test_memory_within_the_limit_is_fine_and_measured(executor, job_id):
    result = run(executor, job_id, "test.allocate", {"mb": 128}, memory_limit_mb=512)
    assert result.peak_memory_mb > 128


def test_cpu_spin_is_stopped(executor, job_id):
    started = time.monotonic()
    exc = failure(executor, job_id, "test.spin", timeout_seconds=1)
    assert exc.code in {"cpu_limit", "timeout"}
    assert not exc.retryable or exc.code == "timeout"
    # Stopped by its limits (a spin never ends), not by the executor's wait for a stuck
    # server (the wall clock + REPLY_GRACE: 16.5 s).
    assert time.monotonic() - started < 15


def test_kill_9_from_outside_is_child_killed_and_retryable(executor, job_id):
    thread, box = run_in_thread(
        executor, job_id, "test.sleep", {"seconds": 60}, timeout_seconds=30, memory_limit_mb=512
    )
    pid = executor.child_pid(job_id)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    thread.join(10)
    exc = box["failed"]
    assert exc.code == "child_killed"
    assert exc.retryable
    assert executor.child_pid(job_id) is None


def test_disk_flood_is_output_limit(executor, job_id):
    exc = failure(executor, job_id, "test.flood", max_output_bytes=10 * MB)
    assert exc.code == "output_limit"
    assert not exc.retryable
    assert (executor.workdir(job_id) / "flood.bin").stat().st_size <= 10 * MB


def test_outputs_over_the_total_limit_are_output_limit(executor, job_id):
    files = {"a.bin": 6 * MB, "b.bin": 6 * MB}  # each under RLIMIT_FSIZE, together over
    exc = failure(executor, job_id, "test.write_files", {"files": files}, max_output_bytes=10 * MB)
    assert exc.code == "output_limit"


@pytest.mark.parametrize("retryable", [True, False])
def test_pipeline_errors_pass_through(executor, job_id, retryable):
    params = {"code": "invalid_input", "message": "not an image", "retryable": retryable}
    exc = failure(executor, job_id, "test.fail", params)
    assert (exc.code, exc.message, exc.retryable) == ("invalid_input", "not an image", retryable)


@pytest.mark.parametrize("code", ["cancelled", "child_killed", "sandbox_unavailable"])
def test_a_child_cannot_claim_the_executors_own_codes(executor, job_id, code):
    """How a child ended says cancelled, child_killed ...: a result naming one (a
    hostile file's decoder writing its own) is a crash, not a job nobody cancelled taken
    for cancelled (lost, its error with it) or the sandbox's retryable failure."""
    params = {"code": code, "message": "forged", "retryable": True}
    exc = failure(executor, job_id, "test.fail", params)
    assert (exc.code, exc.retryable) == ("pipeline_crashed", False)
    assert f"the child reported the executor's own code '{code}'" in exc.message


def test_an_unknown_operation_is_unsupported(executor, job_id):
    exc = failure(executor, job_id, "test.no_such_operation")
    assert exc.code == "unsupported_operation"
    assert not exc.retryable


def test_an_unexpected_exception_is_pipeline_crashed(executor, job_id):
    exc = failure(executor, job_id, "test.crash", {"how": "raise"})
    assert exc.code == "pipeline_crashed"
    assert not exc.retryable
    assert exc.message == "ValueError: boom: the step hit a bug"
    assert "Traceback" in exc.detail
    assert "Traceback" in (executor.workdir(job_id) / ".child.log").read_text()


def test_a_failed_child_keeps_the_end_of_its_log_without_the_workdir_path(executor, job_id):
    exc = failure(executor, job_id, "test.crash", {"how": "segv", "lines": 4000})
    assert exc.code == "pipeline_crashed"
    assert len(exc.log.encode()) <= 64 * 1024
    lines = exc.log.splitlines()
    assert lines[-1] == "line 3999 of <workdir>"
    first = lines[0].split()
    assert first[0] == "line" and lines[0].endswith(" of <workdir>")  # whole lines
    assert int(first[1]) + len(lines) - 1 == 3999  # the last ones, none missing between
    assert 500 < len(lines) < 3999  # about 64 KB of 4000 lines that name the workdir
    assert str(executor.workdir(job_id)) not in exc.log


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("exit", "the child exited with status 3 without a result"),
        ("segv", "the child died of SIGSEGV"),
        ("sys_exit", "SystemExit: 4"),
    ],
)
def test_other_crashes_are_pipeline_crashed(executor, job_id, how, message):
    exc = failure(executor, job_id, "test.crash", {"how": how})
    assert (exc.code, exc.message, exc.retryable) == ("pipeline_crashed", message, False)


@pytest.mark.parametrize(
    "kind", ["outside", "dotdot", "symlink", "symlinked_dir", "hardlink", "directory", "missing"]
)
def test_outputs_outside_the_workdir_or_not_plain_files_are_refused(executor, job_id, kind):
    exc = failure(executor, job_id, "test.bad_output", {"kind": kind})
    assert exc.code == "invalid_output"
    assert not exc.retryable


def test_a_step_returning_nonsense_is_pipeline_crashed(executor, job_id):
    exc = failure(executor, job_id, "test.bad_output", {"kind": "not_a_list"})
    assert exc.code == "pipeline_crashed"
    assert "not a list of Output" in exc.message


# -- progress ------------------------------------------------------------------------------


def test_the_steps_progress_is_passed_on_while_it_runs(executor, job_id):
    seen: list[tuple[float, StepProgress]] = []
    started = time.monotonic()
    result = run(
        executor,
        job_id,
        "test.progress",
        {"steps": 4, "seconds": 0.3},
        on_progress=lambda p: seen.append((time.monotonic(), p)),
    )
    ended = time.monotonic()
    assert result.outputs == []
    assert [(p.done, p.total, p.unit) for _, p in seen] == [(n, 4, "pages") for n in (1, 2, 3, 4)]
    assert seen[-1][1].fraction == 1.0
    assert seen[0][0] < ended - 0.5  # the first arrived while the step still ran
    assert started < seen[0][0]


def test_a_child_flooding_its_result_socket_still_delivers_its_result(executor, job_id):
    seen: list[StepProgress] = []
    params = {"flood": 100_000, "steps": 1, "seconds": 0, "unit": "frames"}
    result = run(executor, job_id, "test.progress", params, on_progress=seen.append)
    assert result.outputs == []
    # A receive each, one passed on per interval at most (and the last): ~5 when quiet,
    # more when a loaded machine stretches the child's life.
    passed_on = result.duration_ms / 1000 / PROGRESS_FORWARD_INTERVAL + 2
    assert 1 <= len(seen) <= max(10, passed_on), (len(seen), result.duration_ms)
    assert (seen[-1].done, seen[-1].total) == (1, 1)
    # Nobody listening: the result still arrives (the executor reads the socket anyway).
    executor.cleanup(job_id)
    executor.prepare(job_id)
    assert run(executor, job_id, "test.progress", params).outputs == []


# -- cancel, cleanup, concurrency ------------------------------------------------------


def test_cancel_mid_run(executor, job_id):
    thread, box = run_in_thread(
        executor, job_id, "test.sleep", {"seconds": 60}, timeout_seconds=30, memory_limit_mb=512
    )
    pid = executor.child_pid(job_id)
    assert pid is not None
    assert executor.cancel(job_id)
    thread.join(20)  # the cancel ends it: its sleep (60 s) and wall clock (45 s) would not
    assert not thread.is_alive()
    exc = box["failed"]
    assert (exc.code, exc.retryable) == ("cancelled", False)
    assert wait_until(lambda: not alive(pid), 1)


def test_cancel_of_a_job_not_running_here_is_false(executor):
    assert executor.cancel("job-nobody-runs") is False


def test_cleanup_removes_the_workdir(executor, job_id):
    result = run(executor, job_id, "test.write_files", {"files": {"deep/er/x.bin": 10}})
    (result.outputs[0].path.parent).chmod(0o500)
    executor.cleanup(job_id)
    assert not executor.workdir(job_id).exists()
    executor.cleanup(job_id)  # twice is fine


def test_eight_threads_run_200_jobs_through_one_executor(executor):
    def one(index: int) -> ChildResult:
        job_id = f"concurrent-{os.getpid()}-{index}"
        try:
            return run(executor, job_id, "test.write_files", {"files": {f"{index}.out": index}})
        finally:
            executor.cleanup(job_id)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(200)))
    assert [r.outputs[0].output_type for r in results] == [f"file-{i}.out" for i in range(200)]
    assert not any((executor.work_root / "jobs").glob("concurrent-*"))
    assert executor.running() == []


# -- bad calls -------------------------------------------------------------------------


def test_bad_calls_are_value_errors(executor, job_id, tmp_path):
    path = place_input(executor, job_id)
    limits = {"timeout_seconds": 5, "memory_limit_mb": 256}
    outside = tmp_path / "outside"
    outside.write_bytes(b"x")
    with pytest.raises(ValueError, match="not inside the job's workdir"):
        executor.run(job_id, "test.noop", outside, {}, **limits)
    with pytest.raises(ValueError, match="not a safe directory name"):
        executor.prepare("../escape")
    with pytest.raises(ValueError, match="params are not JSON"):
        executor.run(job_id, "test.noop", path, {"x": object()}, **limits)
    with pytest.raises(ValueError, match="call prepare"):
        executor.run("job-never-prepared", "test.noop", path, {}, **limits)
    with pytest.raises(ValueError, match="timeout_seconds"):
        executor.run(job_id, "test.noop", path, {}, timeout_seconds=0, memory_limit_mb=256)


def test_the_same_job_cannot_run_twice_at_once(executor, job_id):
    thread, _box = run_in_thread(
        executor, job_id, "test.sleep", {"seconds": 60}, timeout_seconds=30, memory_limit_mb=512
    )
    with pytest.raises(ValueError, match="already running"):
        run(executor, job_id, "test.noop")
    executor.cancel(job_id)
    thread.join(10)


# -- the server ------------------------------------------------------------------------


def test_a_dead_server_fails_its_jobs_and_is_replaced(tmp_path, job_id):
    with ChildExecutor(tmp_path, preload=PRELOAD) as ex:
        thread, box = run_in_thread(
            ex, job_id, "test.sleep", {"seconds": 60}, timeout_seconds=30, memory_limit_mb=512
        )
        child = ex.child_pid(job_id)
        old_server = ex.server_pid
        assert child is not None and old_server is not None
        os.kill(old_server, signal.SIGKILL)
        thread.join(10)
        exc = box["failed"]
        assert (exc.code, exc.retryable) == ("sandbox_unavailable", True)
        assert wait_until(lambda: not alive(child), 2)  # PDEATHSIG
        assert run(ex, job_id + "-after", "test.noop").outputs == []
        assert ex.server_pid not in (None, old_server)


def test_without_spares_each_request_forks(tmp_path, job_id):
    with ChildExecutor(tmp_path, preload=PRELOAD, spares=0) as ex:
        assert ex.server_pid is not None
        assert children_of(ex.server_pid) == []
        assert run(ex, job_id, "test.write_files", {"files": {"a": 3}}).outputs
        assert failure(ex, job_id + "-fail", "test.crash").code == "pipeline_crashed"
        # A job is reported once its init relays how it ended; the init exits then.
        deadline = time.monotonic() + 10
        while children_of(ex.server_pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert children_of(ex.server_pid) == []


def test_spares_killed_from_outside_are_replaced(tmp_path, job_id):
    with ChildExecutor(tmp_path, preload=PRELOAD, spares=2) as ex:
        server = ex.server_pid
        assert server is not None
        assert wait_until(lambda: len(spares_of(ex, server)) == 2, 5)
        spares = {pid for pid, _state in spares_of(ex, server)}
        for pid in spares:
            os.kill(pid, signal.SIGKILL)
        # Noticed and replaced (a job given a spare as it dies would be child_killed).
        assert wait_until(lambda: not spares & {pid for pid, _ in children_of(server)}, 5)
        for index in range(5):
            assert run(ex, f"{job_id}-{index}", "test.noop").outputs == []
        # Two spares again, waiting for a job (asleep); their inits too, if tiny.
        inits = 2 if ex.capabilities.get("tiny_init") else 0
        assert wait_until(lambda: [s for _, s in spares_of(ex, server)] == [b"S", b"S"], 5)
        assert wait_until(lambda: len(children_of(server)) == 2 + inits, 5)


def test_a_preload_that_fails_is_reported(tmp_path):
    before = {pid for pid, _ in children_of(os.getpid())}
    with pytest.raises(ChildFailed, match="no_such_module") as caught:
        ChildExecutor(tmp_path, preload=("tests.no_such_module",))
    assert caught.value.code == "sandbox_unavailable"
    # No server of this executor is left (other processes of this test process, such
    # as an earlier test's executor replacing a spare, may come and go meanwhile).
    new = {pid for pid, _ in children_of(os.getpid())} - before
    assert [pid for pid in new if "no_such_module" in _cmdline(pid)] == []


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_close_kills_running_jobs_and_leaves_no_process(tmp_path, job_id):
    before = {pid for pid, _ in children_of(os.getpid())}  # e.g. the module's server
    ex = ChildExecutor(tmp_path, preload=PRELOAD)
    server = ex.server_pid
    assert server is not None
    for index in range(20):
        run(ex, f"{job_id}-{index}", "test.noop")
    thread, box = run_in_thread(
        ex,
        job_id,
        "test.sleep",
        {"seconds": 60, "children": 3},
        timeout_seconds=30,
        memory_limit_mb=512,
    )
    child = ex.child_pid(job_id)
    assert child is not None
    grandchildren = recorded_pids(ex, job_id)
    uid_range = ex.capabilities.get("uid_range")
    uids = range(uid_range[0], uid_range[1] + 1) if uid_range else None
    gone = all_gone(ex, grandchildren, uids if ex.capabilities.get("pid_namespace") else None)
    ex.close()
    thread.join(10)
    assert box["failed"].code == "child_killed"
    assert box["failed"].retryable
    assert not alive(server)
    assert not alive(child)
    assert gone()
    # Nothing of it is running or left a zombie (the children from before may have
    # changed state meanwhile: running or sleeping).
    assert {pid for pid, _ in children_of(os.getpid())} == before
    ex.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        run(ex, job_id + "-late", "test.noop")
