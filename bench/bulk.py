"""Bulk runs at scale on PostgreSQL: creation rate, the head's memory, kill -9 and resume,
the backfill drained, and interactive waits with and without a backfill beside them.

    python bench/bulk.py                      # 100,000 objects (a few minutes on 2 cores)
    python bench/bulk.py --objects 20000      # reduced, on a busy machine
    python bench/bulk.py --json /tmp/bulk.json

It needs PostgreSQL (``--postgres-url``, default ``postgresql://postgres@127.0.0.1:5432/
postgres``, a role that may CREATE DATABASE) and ``redis-server`` on the PATH; it makes its
own database (``hm_bench_bulk_<random>``) and a private redis-server, and removes both at
the end (also on an error or Ctrl-C).

Phases, all in one run:

1. **creation**: ``--objects`` uploads seeded; ``hypermedia bulk backfill thumbnail`` as a
   run (no cap that binds: creation alone is timed) driven by a *head subprocess* (a
   :class:`~hypermedia.bulk.runner.BulkRunner` in its own process, as the API server's bulk
   thread runs it). Its RSS is sampled every page. When a third of the jobs exist, the
   head is killed with SIGKILL; a second head resumes from the committed cursor. Then the
   record is checked: one job per object, none twice, and Redis holds every queued job
   once the reconciler ran (jobs committed but not yet pushed when the head died).
2. **drain**: the backfill's jobs run through the dispatcher (claim, start, complete with
   an output row: a fast step standing in for the thumbnail) in ``--bulk-workers``
   threads, until the run is ``completed``.
3. **interactive waits**, side by side, each ``--seconds`` long: users' thumbnails at
   ``--rate`` a second (priority 2, ``submit``), run by ``--images-workers`` threads with a
   ``--step-ms`` step; the wait is from the submit's return to the claim. Rows: no
   backfill; a backfill (``resize``) on the ``bulk`` queue with its own worker; a
   backfill (``compress``) on the ``images`` queue at priority 8 sharing the images
   workers. Both backfills capped at ``--max-in-flight``.

Results: a table on stdout and ``bench/reports/bulk.json`` (``--json`` elsewhere), with the
load average before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sqlalchemy import func, select  # noqa: E402

from bench import harness  # noqa: E402
from bench.hm import seed_objects  # noqa: E402
from hypermedia import accounts  # noqa: E402
from hypermedia.config import Settings, load_settings  # noqa: E402
from hypermedia.db import tables as t  # noqa: E402
from hypermedia.db.engine import transaction  # noqa: E402
from hypermedia.stack import Stack  # noqa: E402

REPORT = ROOT / "bench" / "reports" / "bulk.json"


def _rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


# -- the head subprocess ----------------------------------------------------------------------


def head_main(run_id: str, progress: str) -> None:
    """A head's bulk thread, alone in its process: drive ``run_id`` until its creation
    is done. After every step it appends ``created rss_mb elapsed step_seconds
    step_created`` to ``progress`` (created: the run's count in the record)."""
    from hypermedia.bulk.runner import BulkRunner

    stack = Stack.open(load_settings(), with_storage=False)  # HYPERMEDIA_* from the parent
    runner = BulkRunner(stack.engine, stack.queue, clock=stack.clock)
    started = time.perf_counter()
    with open(progress, "a", buffering=1) as out:
        out.write(f"start {_rss_mb():.1f} 0 0 0\n")
        while True:
            begun = time.perf_counter()
            report = runner.step(run_id)
            took = time.perf_counter() - begun
            with transaction(stack.engine) as conn:
                created = conn.execute(
                    select(t.bulk_runs.c.created_jobs).where(t.bulk_runs.c.run_id == run_id)
                ).scalar_one()
            elapsed = time.perf_counter() - started
            out.write(f"{created} {_rss_mb():.1f} {elapsed:.3f} {took:.4f} {report.created}\n")
            if report.state != "creating":
                break
            if not report.created:
                time.sleep(0.05)  # at the cap: the head's thread waits for jobs to end
    stack.close()


def _start_head(settings: Settings, run_id: str, progress: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "HYPERMEDIA_DATABASE_URL": settings.effective_database_url,
        "HYPERMEDIA_REDIS_URL": settings.redis_url or "",
        "HYPERMEDIA_DATA_DIR": str(settings.data_dir),
    }
    return subprocess.Popen(
        [sys.executable, __file__, "_head", run_id, str(progress)], cwd=ROOT, env=env
    )


def _read_progress(path: Path) -> list[tuple[int, float, float, float, int]]:
    rows: list[tuple[int, float, float, float, int]] = []
    if not path.exists():
        return rows
    for line in path.read_text().splitlines():
        parts = line.split()
        if parts[0] != "start" and len(parts) == 5:
            rows.append(
                (int(parts[0]), float(parts[1]), float(parts[2]), float(parts[3]), int(parts[4]))
            )
    return rows


def _start_rss(path: Path) -> list[float]:
    if not path.exists():
        return []
    return [
        float(line.split()[1]) for line in path.read_text().splitlines() if line.startswith("start")
    ]


# -- phases -----------------------------------------------------------------------------------


def backfill_run(
    stack: Stack, settings: Settings, args: argparse.Namespace, work: Path
) -> dict[str, Any]:
    """``--objects`` backfilled: a head subprocess creates (capped at
    ``--creation-cap``) while ``--bulk-workers`` threads run the jobs with a fast step;
    the head is killed with SIGKILL a third of the way and a second one resumes."""
    from hypermedia.bulk.runner import BulkRunner
    from hypermedia.bulk.runs import RunSpec
    from hypermedia.bulk.service import BulkService
    from hypermedia.jobs.reaper import reconcile

    n = args.objects
    service = BulkService(stack.engine, stack.queue, stack.catalog, clock=stack.clock)
    run = service.create(
        RunSpec(
            kind="backfill",
            operation="thumbnail",
            # Nothing runs the jobs with --no-drain: a cap of the whole run would hold it
            # at "creating" once every object has its job (the cap binds, no page is read).
            max_in_flight=args.creation_cap if args.drain else max(args.creation_cap, n + 1),
            batch_size=args.batch,
        ),
        "bench",
    )
    stop = threading.Event()
    done: list[int] = []
    workers = [
        threading.Thread(
            target=lambda k=k: done.append(
                _worker(stack, "bulk", f"drain-{k}", 0, stop.is_set, {}, {}, count=50)
            ),
            daemon=True,
        )
        for k in range(args.bulk_workers)
    ]
    started = time.perf_counter()
    if not args.drain:
        workers = []
    for worker in workers:
        worker.start()
    first, second = work / "head1.progress", work / "head2.progress"
    head = _start_head(settings, run.run_id, first)
    killed_at = None
    while head.poll() is None:
        time.sleep(0.02)
        rows = _read_progress(first)
        if rows and rows[-1][0] >= n // 3:
            head.send_signal(signal.SIGKILL)
            head.wait()
            killed_at = rows[-1][0]
            break
    committed = service.get(run.run_id).created_jobs
    resume_started = time.perf_counter()
    head = _start_head(settings, run.run_id, second)
    head.wait()
    resume_seconds = time.perf_counter() - resume_started
    created_seconds = time.perf_counter() - started
    restored = reconcile(stack.engine, stack.queue).total_restored  # pushed lost at the kill
    while args.drain and service.get(run.run_id).live:
        time.sleep(0.2)
    stop.set()
    for worker in workers:
        worker.join()
    total_seconds = time.perf_counter() - started
    state = BulkRunner(stack.engine, stack.queue, clock=stack.clock).step(run.run_id).state
    j = t.jobs.c
    with transaction(stack.engine) as conn:
        jobs = conn.execute(
            select(func.count(), func.count(func.distinct(j.object_id))).where(
                j.bulk_run_id == run.run_id
            )
        ).one()
    view = service.get(run.run_id)
    steps = _read_progress(first) + _read_progress(second)
    full = [(took, made) for _, _, _, took, made in steps if made]
    rss = [r[1] for r in steps]
    return {
        "run_id": run.run_id,
        "objects": n,
        "creation_cap": view.max_in_flight,
        "jobs": int(jobs[0]),
        "distinct_objects": int(jobs[1]),
        "duplicates": int(jobs[0]) - int(jobs[1]),
        "jobs_by_status": view.jobs,
        "state": state,
        "killed_after_jobs": killed_at,
        "committed_at_kill": committed,
        "restored_by_reconcile": restored,
        "resume_seconds": round(resume_seconds, 2),
        "creation_seconds": round(created_seconds, 1),
        "backfill_seconds": round(total_seconds, 1),
        "backfill_jobs_per_s": round(n / total_seconds),
        "creation_steps": len(full),
        "creation_jobs_per_s_while_room": round(
            sum(made for _, made in full) / max(1e-9, sum(took for took, _ in full))
        ),
        "creation_ms_per_step_p50": round(
            sorted(took for took, _ in full)[len(full) // 2] * 1000, 1
        )
        if full
        else None,
        "head_rss_mb_at_start": _start_rss(first) + _start_rss(second),
        "head_rss_mb_max": max(rss, default=0.0),
        "head_rss_mb_by_created": [
            (steps[k][0], steps[k][1])
            for k in sorted(
                {0, len(steps) // 4, len(steps) // 2, 3 * len(steps) // 4, len(steps) - 1}
            )
        ]
        if steps
        else [],
    }


def _worker(
    stack: Stack,
    queue: str,
    worker_id: str,
    step_ms: float,
    stop: Any,
    waits: dict[str, float] | None = None,
    submitted: dict[str, float] | None = None,
    count: int = 10,
) -> int:
    from hypermedia.jobs.repository import FinishedJob, OutputRecord
    from hypermedia.storage.base import derived_key

    dispatcher = stack.dispatcher
    versions = {r.profile_id: r.version for r in map(stack.catalog.get, stack.catalog.operations())}
    done = 0
    while not stop():
        claimed = dispatcher.claim_and_start(queue, worker_id, count)
        now = time.time()
        if not claimed:
            if waits is None:  # a drain ends when its queue is empty
                return done
            time.sleep(0.005)
            continue
        if waits is not None and submitted is not None:
            for job in claimed:
                if job.job_id in submitted:
                    waits[job.job_id] = now - submitted[job.job_id]
        finished = []
        for job in claimed:
            if step_ms:
                time.sleep(step_ms / 1000)
            key = derived_key("bench", job.object_id, versions[job.profile_id], job.operation)
            finished.append(FinishedJob(job.job_id, [OutputRecord(job.operation, key, 100)]))
        dispatcher.complete_many(worker_id, finished)
        done += len(claimed)
    return done


def _drain_queue(stack: Stack, queue: str, threads: int, stop: Any) -> dict[str, Any]:
    results: list[int] = []
    started = time.perf_counter()
    pool = [
        threading.Thread(
            target=lambda k=k: results.append(
                _worker(stack, queue, f"drain-{k}", 0, stop, count=50)
            )
        )
        for k in range(threads)
    ]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return {"jobs": sum(results), "seconds": round(time.perf_counter() - started, 2)}


def interactive(
    stack: Stack,
    caller: Any,
    objects: list[str],
    args: argparse.Namespace,
    backfill: tuple[str, str] | None,
) -> dict[str, Any]:
    """Users' thumbnails at ``--rate``/s for ``--seconds``, with a backfill (operation,
    queue) beside them or none; the waits from submit to claim."""
    from hypermedia.bulk.runner import BulkRunner
    from hypermedia.bulk.runs import RunSpec
    from hypermedia.bulk.service import BulkService
    from hypermedia.ingest.service import SubmitRequest

    stop_event = threading.Event()
    submitted: dict[str, float] = {}
    waits: dict[str, float] = {}
    threads = [
        threading.Thread(
            target=_worker,
            args=(
                stack,
                "images",
                f"images-{k}",
                args.step_ms,
                stop_event.is_set,
                waits,
                submitted,
                1,
            ),
        )
        for k in range(args.images_workers)
    ]
    bulk_done: list[int] = []
    run_id = None
    if backfill is not None:
        operation, queue = backfill
        service = BulkService(stack.engine, stack.queue, stack.catalog, clock=stack.clock)
        run_id = service.create(
            RunSpec(
                kind="backfill",
                operation=operation,
                queue=queue,
                max_in_flight=args.max_in_flight,
                batch_size=500,
            ),
            "bench",
        ).run_id
        runner = BulkRunner(stack.engine, stack.queue, clock=stack.clock)
        threads.append(threading.Thread(target=runner.run, args=(stop_event, 0.2)))
        if queue == "bulk":
            threads += [
                threading.Thread(
                    target=lambda k=k: bulk_done.append(
                        _worker(
                            stack, "bulk", f"bulk-{k}", args.step_ms, stop_event.is_set, {}, {}, 1
                        )
                    )
                )
                for k in range(args.bulk_workers)
            ]
        time.sleep(1.0)  # the backfill is under way before users come
    for thread in threads:
        thread.start()
    rng = random.Random(1)
    deadline = time.time() + args.seconds
    k = 0
    while time.time() < deadline:
        result = stack.ingest.submit(
            caller,
            SubmitRequest(
                object_id=objects[k % len(objects)], operations=["thumbnail"], priority=2
            ),
        )
        submitted[result.job_ids[0]] = time.time()
        k += 1
        time.sleep(rng.expovariate(args.rate))
    time.sleep(2.0)  # the last ones get claimed
    stop_event.set()
    for thread in threads:
        thread.join()
    bulk_jobs = 0
    if run_id is not None:
        with transaction(stack.engine) as conn:
            bulk_jobs = int(
                conn.execute(
                    select(func.count()).where(
                        t.jobs.c.bulk_run_id == run_id, t.jobs.c.status == "completed"
                    )
                ).scalar_one()
            )
    values = sorted(waits.values())
    missing = len(submitted) - len(waits)
    from autoscaler.sim_report import percentile

    return {
        "backfill": "none" if backfill is None else f"{backfill[0]} on {backfill[1]}",
        "submitted": len(submitted),
        "started": len(values),
        "not_started": missing,
        "wait_p50_ms": round(percentile(values, 0.5) * 1000, 1),
        "wait_p99_ms": round(percentile(values, 0.99) * 1000, 1),
        "wait_max_ms": round((values[-1] if values else 0.0) * 1000, 1),
        "bulk_jobs_completed": bulk_jobs,
    }


# -- main -------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--objects", type=int, default=int(env("HYPERMEDIA_BENCH_OBJECTS", "100000")))
    p.add_argument("--batch", type=int, default=500)
    p.add_argument(
        "--postgres-url",
        default=env(
            "HYPERMEDIA_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    p.add_argument("--bulk-workers", type=int, default=2)
    p.add_argument("--images-workers", type=int, default=2)
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--rate", type=float, default=10.0, help="interactive submits a second")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--max-in-flight", type=int, default=200, help="the side-by-side backfills' cap")
    p.add_argument("--creation-cap", type=int, default=5000, help="the 100,000 backfill's cap")
    p.add_argument("--interactive-objects", type=int, default=2000)
    p.add_argument("--json", type=Path, default=REPORT)
    p.add_argument(
        "--no-drain",
        dest="drain",
        action="store_false",
        help="create only (with --creation-cap at --objects: creation alone is timed)",
    )
    p.add_argument("--no-interactive", dest="interactive", action="store_false")
    p.add_argument(
        "--no-backfill",
        dest="backfill",
        action="store_false",
        help="seed --objects, skip the backfill phase: the waits' backfills cover them all",
    )
    return p.parse_args(argv)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # the ExitStack still drops what it made
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 150))
    load_before = os.getloadavg()
    result: dict[str, Any] = {}
    with contextlib.ExitStack() as cleanup:
        work = Path(tempfile.mkdtemp(prefix="hm-bench-bulk-"))
        cleanup.callback(shutil.rmtree, work, True)  # last: after redis-server stopped
        databases = harness.ScratchDatabases(args.postgres_url)
        cleanup.callback(databases.drop_all)
        url = harness.sqlalchemy_url(databases.create(harness.unique_name("hm_bench_bulk")))
        redis_server = harness.start_redis(work / "redis", cleanup)
        settings = load_settings(
            database_url=url,
            redis_url=redis_server.url,
            data_dir=work / "data",
            # The seeded uploads are rows, not bytes: a 100,000-object backfill's owner
            # holds far past the default quota, which would refuse its users' submits.
            user_storage_quota_bytes=2**62,
        )
        stack = Stack.open(settings, auto_migrate=True)
        cleanup.callback(stack.close)
        with transaction(stack.engine) as conn:
            user = accounts.create_user(
                conn,
                "bench",
                stack.clock.now(),
                credits_millicredits=10**13,
                grants=accounts.UNLIMITED,
            )
            caller = accounts.authenticate(conn, user.api_key)
        t0 = time.perf_counter()
        seed_objects(stack, caller, user.pool_id, args.objects)
        result["seed_seconds"] = round(time.perf_counter() - t0, 1)
        console.print(f"seeded {args.objects} objects in {result['seed_seconds']} s")
        if args.backfill:
            result["backfill"] = backfill_run(stack, settings, args, work)
            console.print(result["backfill"])
        rows = []
        if args.interactive:
            users = seed_objects(stack, caller, user.pool_id, args.interactive_objects)
            for backfill in (None, ("resize", "bulk"), ("compress", "images")):
                rows.append(interactive(stack, caller, users, args, backfill))
                console.print(rows[-1])
        result["interactive"] = rows
    load_after = os.getloadavg()
    result["meta"] = harness.run_metadata(
        {
            "objects": args.objects,
            "args": {k: (v.name if isinstance(v, Path) else str(v)) for k, v in vars(args).items()},
            "load_before": load_before,
            "load_after": load_after,
        },
        ["sqlalchemy", "psycopg", "redis"],
    )
    c = result.get("backfill")
    if c is not None:
        table = Table(
            title=f"bulk backfill: {args.objects} objects"
            f" (load {load_before[0]:.1f} -> {load_after[0]:.1f})"
        )
        table.add_column("measure")
        table.add_column("value", justify="right")
        for label, value in (
            (
                "creation, jobs/s while the run has room (p50 ms a step of up to 20 pages)",
                f"{c['creation_jobs_per_s_while_room']} ({c['creation_ms_per_step_p50']})",
            ),
            (
                f"backfill end to end, jobs/s (cap {c['creation_cap']}, {args.bulk_workers} thr.)"
                if args.drain
                else "creation end to end (kill -9 and a restart included), jobs/s",
                str(c["backfill_jobs_per_s"]),
            ),
            ("head RSS MB at start / max", f"{c['head_rss_mb_at_start']} / {c['head_rss_mb_max']}"),
            ("head RSS MB by jobs created", str(c["head_rss_mb_by_created"])),
            (
                "kill -9 after jobs (committed)",
                f"{c['killed_after_jobs']} ({c['committed_at_kill']})",
            ),
            (
                "jobs / distinct objects / duplicates",
                f"{c['jobs']} / {c['distinct_objects']} / {c['duplicates']}",
            ),
            ("restored by the reconciler", str(c["restored_by_reconcile"])),
            ("run state, jobs", f"{c['state']}, {c['jobs_by_status']}"),
        ):
            table.add_row(label, value)
        console.print(table)
    if not rows:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
        console.print(f"wrote {args.json}")
        return 0
    waits = Table(
        title=f"interactive thumbnails at {args.rate}/s, {args.images_workers} images"
        f" workers, {args.step_ms} ms step"
    )
    for name in (
        "backfill",
        "submitted",
        "not_started",
        "wait_p50_ms",
        "wait_p99_ms",
        "wait_max_ms",
        "bulk_jobs_completed",
    ):
        waits.add_column(name, justify="right")
    base = rows[0]["wait_p99_ms"] or 1.0
    waits.add_column("p99 / none", justify="right")
    for row in rows:
        waits.add_row(
            *(
                str(row[k])
                for k in (
                    "backfill",
                    "submitted",
                    "not_started",
                    "wait_p50_ms",
                    "wait_p99_ms",
                    "wait_max_ms",
                    "bulk_jobs_completed",
                )
            ),
            f"{row['wait_p99_ms'] / base:.2f}",
        )
    console.print(waits)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
    console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_head":
        head_main(*sys.argv[2:4])
    else:
        sys.exit(main())
