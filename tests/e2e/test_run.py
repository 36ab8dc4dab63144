"""`hypermedia run examples/` as the README's first command runs it: a subprocess
on the embedded default that starts everything, processes the shipped sample
files end to end, writes outputs, and stops everything it started."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pyvips
from sqlalchemy import select

from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.embedded import find_running
from hypermedia.runner import local_operator
from hypermedia.worker.cluster import short_temp_dir
from tests.factories import Person, open_stack, stored_object, submit

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hypermedia.cli", "run", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_run_examples_end_to_end(tmp_path):
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYPERMEDIA_", "RAY_"))}
    env["HYPERMEDIA_DATA_DIR"] = str(data)
    samples = sorted(p for p in EXAMPLES.iterdir() if not p.name.startswith("."))
    assert len(samples) >= 8
    result = _run([str(EXAMPLES)], tmp_path, env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    text = " ".join(result.stderr.split())
    assert f"{len(samples)} jobs: {len(samples)} completed" in text
    said = rf"{len(samples)} jobs ended ([0-9.]+) s after the first upload \(([0-9.]+) jobs/s"
    took = re.search(said, text)
    assert took is not None, text[-2000:]
    seconds, rate = float(took[1]), float(took[2])
    # Both printed to a tenth: the time the rate came from lies within 0.05 s of the one
    # shown (0.7 s shown, 10.8 jobs/s: 8 jobs in 0.74 s).
    fastest, slowest = len(samples) / max(seconds - 0.05, 0.01), len(samples) / (seconds + 0.05)
    assert 0 < seconds < 600 and slowest - 0.05 <= rate <= fastest + 0.05, (seconds, rate)
    for sample in samples:
        (output,) = (tmp_path / "hypermedia-out" / sample.name).iterdir()
        image = pyvips.Image.new_from_file(str(output))
        assert max(image.width, image.height) <= 320
        assert output.suffix == ".webp"
    # The rotated phone photo came out upright (EXIF orientation applied): portrait.
    (upright,) = (tmp_path / "hypermedia-out" / "phone-photo-rotated.jpg").iterdir()
    image = pyvips.Image.new_from_file(str(upright))
    assert image.height > image.width
    # Written out, the files and outputs leave the data dir's storage (each run kept a
    # copy of all of them, for ever).
    stored = [p for p in (data / "objects").rglob("*") if p.is_file()]
    assert stored == [], stored
    assert not (data / "logs").exists()  # nothing failed: no worker logs kept
    # Everything it started is gone: no Redis from its data dir, no Ray processes.
    assert find_running(data / "redis") is None
    marker = str(short_temp_dir(data / "ray", "head"))
    leftovers = [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if marker in " ".join(p.info["cmdline"] or [])
    ]
    assert leftovers == []


def test_run_refuses_an_operation_without_a_pipeline(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYPERMEDIA_", "RAY_"))}
    env["HYPERMEDIA_DATA_DIR"] = str(tmp_path / "data")
    result = _run([str(EXAMPLES / "banner.webp"), "--op", "no_such_op"], tmp_path, env)
    assert result.returncode == 1
    assert "unknown_operation" in result.stderr
    assert "Traceback" not in result.stderr
    # Wide: the error box would otherwise wrap a long path (xdist's are) mid-name.
    missing = _run([str(tmp_path / "missing.jpg")], tmp_path, {**env, "COLUMNS": "1000"})
    assert missing.returncode != 0
    assert "missing.jpg" in missing.stderr


# Enough files that a run is still uploading when a test's signal comes: 60 were all
# done within the second one test waited, on a quiet machine (exit 0, nothing stopped).
MANY = 400


def _many_banners(tmp_path: Path) -> Path:
    many = tmp_path / "many"
    many.mkdir()
    banner = (EXAMPLES / "banner.webp").read_bytes()
    for i in range(MANY):
        (many / f"{i}-banner.webp").write_bytes(banner)
    return many


def _run_until(tmp_path: Path, env: dict[str, str], files: list[Path], marker: str):
    """`hypermedia run` in the background, once its stderr has shown ``marker``."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "hypermedia.cli", "run", *map(str, files), "--op", "thumbnail"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if marker in line:
            return proc, seen
    proc.wait()
    raise AssertionError(f"run ended before {marker!r}: {''.join(seen)[-3000:]}")


def _stack_processes(data: Path) -> list[int]:
    marker = str(short_temp_dir(data / "ray", "head"))
    return [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if p.pid != os.getpid()
        and (
            marker in " ".join(p.info["cmdline"] or [])
            or str(data) in " ".join(p.info["cmdline"] or [])
        )
    ]


def _argv(pid: int) -> list[str]:
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


def test_run_killed_with_9_leaves_no_service_running(tmp_path):
    """And a run's Ray head runs stand-ins for Ray's two agents (nobody scrapes its
    metrics: no ray.json tells Prometheus where they are), which go with it too."""
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYPERMEDIA_", "RAY_"))}
    env["HYPERMEDIA_DATA_DIR"] = str(data)
    proc, _seen = _run_until(tmp_path, env, [EXAMPLES / "banner.webp"], "ray head at")
    redis = find_running(data / "redis")
    assert redis is not None and redis.pid is not None
    started = [*_stack_processes(data), redis.pid]  # redis-server rewrites its cmdline
    assert len(started) > 3
    lines = [_argv(pid) for pid in started]
    stand_ins = sorted(a[3] for a in lines if len(a) > 3 and a[2].endswith("agent_stand_in.py"))
    assert stand_ins == ["dashboard_agent", "runtime_env_agent"], lines
    rays = [
        a for a in lines if "Agent" in " ".join(a[:1]) or "dashboard/agent.py" in " ".join(a[1:3])
    ]
    assert rays == [], rays
    proc.kill()
    assert proc.wait() == -signal.SIGKILL
    procs = [psutil.Process(pid) for pid in started if psutil.pid_exists(pid)]
    _gone, alive = psutil.wait_procs(procs, timeout=60)  # the watchdog's work
    assert [p.pid for p in alive] == []
    assert _stack_processes(data) == []
    assert find_running(data / "redis") is None


def _job_statuses(database: Path) -> Counter[str]:
    with contextlib.closing(sqlite3.connect(database)) as conn:
        return Counter(status for (status,) in conn.execute("SELECT status FROM processing_jobs"))


def test_run_stopped_with_sigterm_stops_what_it_started_and_says_so(tmp_path):
    """Stopped once jobs are in the record: the outputs of those done are written, the
    others cancelled (they were left queued, and the next run of the data dir ran them
    for nobody), and the summary says which is which."""
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYPERMEDIA_", "RAY_"))}
    env["HYPERMEDIA_DATA_DIR"] = str(data)
    # Enough work to be busy when the signal comes.
    many = _many_banners(tmp_path)
    proc, seen = _run_until(tmp_path, env, [many], f"submitting {MANY} files")
    while sum(_job_statuses(data / "hypermedia.db").values()) < 20 and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, rest = proc.communicate(timeout=120)
    text = " ".join(("".join(seen) + rest).split())
    assert proc.returncode == 130, text[-3000:]  # as for Ctrl-C
    assert "stopping the Ray head" in text and "stopped redis" in text
    assert re.search(r"stopped in \d+\.\d s", text), text[-2000:]
    assert _stack_processes(data) == []
    assert find_running(data / "redis") is None
    said = re.search(
        r"interrupted: (\d+) jobs done \(outputs in hypermedia-out/\), (\d+) cancelled,"
        rf" (\d+) of {MANY} files not submitted",
        text,
    )
    assert said is not None, text[-3000:]
    done, cancelled, unsent = map(int, said.groups())
    # 20 jobs were in the record; the signal may have cut off the 20th submit's answer
    # (its job made, not in the summary: see below).
    assert done + cancelled + unsent == MANY and unsent <= MANY - 19
    outputs = list((tmp_path / "hypermedia-out").glob("*/thumbnail*"))
    assert len(outputs) == done
    # Nothing of it is left to run: every job it submitted ended. (A submit the signal
    # cut off after the API created its job is not in the summary: done or cancelled.)
    statuses = _job_statuses(data / "hypermedia.db")
    assert set(statuses) <= {"completed", "cancelled"}, statuses
    assert 0 <= statuses["completed"] - done <= 1 and 0 <= statuses["cancelled"] - cancelled <= 1


def test_run_refuses_an_out_that_is_a_file_before_starting(tmp_path):
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYPERMEDIA_", "RAY_"))}
    env["HYPERMEDIA_DATA_DIR"] = str(data)
    env["COLUMNS"] = "1000"
    (tmp_path / "out.txt").write_text("a file")
    result = _run([str(EXAMPLES / "banner.webp"), "--out", "out.txt"], tmp_path, env)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "error: config_invalid: --out (HYPERMEDIA_RUN_OUT): out.txt is not a directory"
    ]
    assert not data.exists()  # nothing started


def test_run_refuses_a_disk_its_workers_would_claim_nothing_on_before_starting(tmp_path):
    """Below worker_min_free_disk_mb the workers claim nothing: a run on such a disk sat
    with its bars at 0 until its timeout (30 minutes), without a word."""
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYPERMEDIA_", "RAY_"))}
    env["HYPERMEDIA_DATA_DIR"] = str(data)
    env["COLUMNS"] = "1000"
    env["HYPERMEDIA_WORKER_MIN_FREE_DISK_MB"] = str(2**40)  # more than any disk has
    result = _run([str(EXAMPLES / "banner.webp")], tmp_path, env)
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: service_unavailable: the disk of {data} has "), line
    assert "below worker_min_free_disk_mb (1099511627776)" in line
    assert "HYPERMEDIA_WORKER_MIN_FREE_DISK_MB" in line
    assert not data.exists()  # nothing started


def test_run_keeps_apart_files_of_one_name_and_reports_an_output_not_written(
    settings, sqlite_engine, tmp_path
):
    """in/a/photo.webp and in/b/photo.webp: each its outputs under its own path in the
    folder given (both went to one out/photo.webp/ before). One of them cannot be
    written (a file where its folder goes): the other is, the summary is shown, then
    one error line naming it; the stack stops. One run for both: each costs a stack.

    And in/c/corrupt.png, a PNG by its header that no decoder reads, fails: the run's
    Ray session (the actors' logs: a failed job's worker-side lines and traceback) went
    with the stack it stops. A run with failed jobs now keeps its workers' logs under
    the data dir's logs/ (private, redacted) and its summary line says where.

    And the data dir is one where a run killed with -9 left two jobs queued in the
    record (test_run_cancels_the_jobs_an_earlier_run_killed_with_9_left, folded in: a
    stack each): the next run of the data dir ran them (the reconciler put them back
    in Redis) for outputs nobody wrote out. It cancels them, before an actor could
    claim one, says so, and its summary counts its own jobs only."""
    left = _left_by_a_killed_run(settings, sqlite_engine)
    data = tmp_path  # the record the killed run left, where settings() put it
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYPERMEDIA_", "RAY_"))}
    env["HYPERMEDIA_DATA_DIR"] = str(data)
    env["COLUMNS"] = "1000"
    folder = tmp_path / "in"
    for name, sample in (("a", "banner.webp"), ("b", "logo-alpha.png")):
        (folder / name).mkdir(parents=True)
        (folder / name / "photo.webp").write_bytes((EXAMPLES / sample).read_bytes())
    png = bytearray((EXAMPLES / "logo-alpha.png").read_bytes())
    png[100:-20] = b"A" * (len(png) - 120)
    (folder / "c").mkdir()
    (folder / "c" / "corrupt.png").write_bytes(bytes(png))
    (tmp_path / "out" / "b").mkdir(parents=True)
    (tmp_path / "out" / "b" / "photo.webp").write_text("a file where the outputs' folder goes")
    result = _run([str(folder), "--op", "thumbnail", "--out", "out"], tmp_path, env)
    assert result.returncode == 1, result.stderr[-3000:]
    text = " ".join(result.stderr.split())
    (kept,) = (data / "logs").iterdir()
    assert re.fullmatch(r"run-\d{8}-\d{6}", kept.name)
    assert (
        "an earlier run was killed or timed out before its jobs ended: cancelled 2 of them" in text
    )
    assert "3 jobs: 2 completed, 1 failed. Outputs in out/; the workers' logs of this run are" in (
        text
    ), text
    assert f"the workers' logs of this run are in {kept}/" in text
    assert (data / "logs").stat().st_mode & 0o777 == 0o700
    assert kept.stat().st_mode & 0o777 == 0o700
    said = {p.name: p.read_text() for p in kept.iterdir()}
    assert all(name.startswith("worker-") for name in said), sorted(said)
    failed = [name for name, lines in said.items() if "attempt 1 failed: invalid_input" in lines]
    assert len(failed) == 1 and failed[0].endswith(".err"), sorted(said)
    assert "a/photo.webp" in text and "b/photo.webp" in text
    (written,) = (tmp_path / "out" / "a" / "photo.webp").iterdir()
    assert written.name.startswith("thumbnail") and written.stat().st_size > 0
    assert not (tmp_path / "out" / "photo.webp").exists()
    assert "error: outputs not written under out: out/b/photo.webp/thumbnail" in text
    assert "internal" not in text and "Traceback" not in text
    assert "stopped redis" in text
    assert find_running(data / "redis") is None
    with contextlib.closing(sqlite3.connect(data / "hypermedia.db")) as conn:
        ended = dict(
            conn.execute(
                "SELECT job_id, status FROM processing_jobs WHERE job_id IN (?, ?)", left
            ).fetchall()
        )
    assert ended == dict.fromkeys(left, "cancelled")


def _left_by_a_killed_run(settings, sqlite_engine) -> list[str]:
    """Two thumbnail jobs queued in the record of ``settings()``'s data dir by the local
    operator, as a run killed with -9 leaves them."""
    stack = open_stack(settings, sqlite_engine, None)  # the data dir's own record
    caller, _key = local_operator(stack)
    with transaction(stack.engine) as conn:
        pool_id = conn.execute(
            select(t.pool_members.c.pool_id).where(t.pool_members.c.user_id == caller.user_id)
        ).scalar_one()
    operator = Person(caller, _key, pool_id)
    banner = (EXAMPLES / "banner.webp").read_bytes()
    left = [
        job
        for _ in range(2)
        for job in submit(
            stack, operator, ["thumbnail"], object_id=stored_object(stack, operator, banner)
        )
    ]
    stack.close()
    return left


def test_run_interrupted_from_its_terminal_stops_cleanly_in_one_line(tmp_path):
    """Ctrl-C reaches the terminal's whole process group: the run stops what it started
    and says so in one line (the inspection server took the SIGINT too: a
    KeyboardInterrupt traceback, and uploads in flight logged as internal errors)."""
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYPERMEDIA_", "RAY_"))}
    env["HYPERMEDIA_DATA_DIR"] = str(data)
    many = _many_banners(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "hypermedia.cli", "run", str(many), "--op", "thumbnail"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a process group of its own, as a terminal gives it
    )
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if f"submitting {MANY} files" in line:
            break
    time.sleep(0.3)  # uploads (and their inspections) in flight
    # The run alone takes the terminal's signals: not the inspection server, nor Ray's
    # GCS, raylet and actors (killed under the run, they made its stop fail).
    # (A short-lived helper of the run's own, such as ldconfig run by ctypes.util's
    # find_library as a library loads, may be there for a moment: wait it out.)
    deadline = time.monotonic() + 5
    while (members := _process_group(proc.pid)) != [proc.pid] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert members == [proc.pid], [_cmdline(pid) for pid in members]
    os.killpg(proc.pid, signal.SIGINT)
    _, rest = proc.communicate(timeout=180)
    text = "".join(seen) + rest
    assert proc.returncode == 130, text[-3000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    assert "internal" not in text, text[-3000:]
    assert text.strip().splitlines()[-1] == "error: interrupted", text[-3000:]
    assert "stopped redis" in text
    assert _stack_processes(data) == []
    assert find_running(data / "redis") is None


def _cmdline(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return f"{pid} (gone)"


def _process_group(pgid: int) -> list[int]:
    members = []
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) == pgid:
                members.append(pid)
        except ProcessLookupError:
            continue
    return members
