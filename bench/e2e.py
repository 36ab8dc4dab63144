"""Real work through the whole platform, beside Celery prefork and a bare loop.

    pip install -e '.[dev,bench]'     # Celery
    python bench/e2e.py               # the corpus (else generated files), ~5 minutes
    python bench/e2e.py --limit 8 --rows bare,hypermedia --json /tmp/e2e.json
    python bench/e2e.py --ops thumbnail --repeat 10   # the images' thumbnails alone

The same jobs through three rows: images (``thumbnail`` and ``convert``), PDFs
(``pdf_preview``) and word-processing documents (``docx_to_pdf``), each step with its
profile's parameters (``etc/profiles.toml``):

* ``hypermedia``: the embedded default stack (``LocalStack``, as ``hypermedia run``
  starts it: a private Redis, the SQLite record, a Ray head, one pipeline actor per
  queue); every file uploaded and its operations submitted through the HTTP ingest
  client, then waited for in the record; each job in a sandboxed child;
* ``celery``: ``celery worker -P prefork -c 2`` (Redis broker, results ignored)
  running the same step functions on the same files (on the same disk: no upload, no
  storage, no sandbox, no durable record);
* ``bare``: one process calling the step functions in a loop: the floor.

Each row runs in a Python process of its own inside a cpuacct cgroup of its own (this
machine's cgroup v1 hierarchy; where there is none the row's CPU is its process tree's,
which misses the Ray processes that daemonise), after an untimed warm-up of one job of
each operation. Over the timed window: jobs/s, CPU-s a job of the whole row (Redis,
Ray, PostgreSQL are not used by ``bare``) and, split, ``pipeline`` (the bare row's CPU
a job: the steps themselves) and ``platform`` (the rest), and the peak of the summed RSS
of the row's processes (sampled every 0.2 s; the sampler's own CPU is taken off the
row's). Results: a table, and JSON in ``bench/results/`` (``--json`` to choose);
``bench/reports/e2e.json`` is one run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
ROWS = ("bare", "celery", "hypermedia")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".gif", ".tif", ".tiff")
IMAGE_OPERATIONS = ("thumbnail", "convert")
CGROUP_ROOT = Path("/sys/fs/cgroup/cpuacct")
MAX_IMAGE_BYTES = 20 * 1024 * 1024


# -- what runs -----------------------------------------------------------------------------


def work_set(limit: int) -> list[tuple[str, list[str]]]:
    """``(file, operations)`` pairs: the corpus's images, PDFs and DOCX when the corpus
    is there, else the project's generated ones; at most ``limit`` files of each kind."""
    from tests.corpus_support import find_corpus

    lookup = find_corpus()
    if lookup.path is not None:
        images_dir, documents_dir = lookup.path / "images", lookup.path / "documents"
    else:
        from tests.generated import Generated

        generated = Generated(Path(tempfile.mkdtemp(prefix="hm-bench-e2e-files-")))
        images_dir, documents_dir = generated.group("images"), generated.group("documents")
    images = [
        p
        for p in sorted(images_dir.iterdir())
        if p.suffix.lower() in IMAGE_SUFFIXES and p.stat().st_size <= MAX_IMAGE_BYTES
    ][:limit]
    pdfs = sorted(documents_dir.glob("*.pdf"))[:limit]
    docx = sorted(documents_dir.glob("*.docx"))[:limit]
    return [
        *[(str(p), list(IMAGE_OPERATIONS)) for p in images],
        *[(str(p), ["pdf_preview"]) for p in pdfs],
        *[(str(p), ["docx_to_pdf"]) for p in docx],
    ]


def profile_params() -> dict[str, dict[str, Any]]:
    profiles = tomllib.loads((REPO / "etc" / "profiles.toml").read_text())["profiles"]
    return {name: dict(p.get("params", {})) for name, p in profiles.items()}


def warm_up_set(plan: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    """One file of each list of operations (the first)."""
    seen: dict[tuple[str, ...], tuple[str, list[str]]] = {}
    for path, ops in plan:
        seen.setdefault(tuple(ops), (path, ops))
    return list(seen.values())


# -- measuring a row (in the row's process) ---------------------------------------------------


class Meter:
    """CPU of this row's cgroup (else its process tree) and the peak of its summed RSS."""

    def __init__(self) -> None:
        self.usage = _own_cgroup_usage()
        self.peak_rss = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._before: dict[int, tuple[str, float]] = {}
        self.own_cpu = 0.0  # the sampler thread's CPU: the benchmark's, taken off the row's

    def cpu(self) -> float:
        if self.usage is not None:
            return int(self.usage.read_text()) / 1e9
        import psutil

        me = psutil.Process()
        total = sum(me.cpu_times()[:4])
        for child in me.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += sum(child.cpu_times()[:2])
        return float(total)

    def start(self) -> None:
        self._before = self.by_process()
        self._thread.start()

    def by_process(self) -> dict[int, tuple[str, float]]:
        """Each process's name and CPU so far (its own and its reaped children's)."""
        import psutil

        found = {}
        for pid in self._pids():
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                name = " ".join(proc.cmdline()) or proc.name()
                found[pid] = (name, sum(proc.cpu_times()[:4]))
        return found

    def breakdown(self) -> dict[str, float]:
        """CPU-s of the window by process (name; a process started within counts whole)."""
        totals: dict[str, float] = {}
        for pid, (name, cpu) in self.by_process().items():
            spent = cpu - self._before.get(pid, (name, 0.0))[1]
            key = _short(name)
            totals[key] = round(totals.get(key, 0.0) + spent, 2)
        return dict(sorted(totals.items(), key=lambda kv: -kv[1]))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _pids(self) -> list[int]:
        import psutil

        if self.usage is not None:
            procs = self.usage.parent / "cgroup.procs"
            return [int(p) for p in procs.read_text().split()]
        me = psutil.Process()
        return [me.pid, *(c.pid for c in me.children(recursive=True))]

    def _sample(self) -> None:
        import psutil

        while not self._stop.wait(0.2):
            total = 0
            for pid in self._pids():
                with contextlib.suppress(psutil.Error):
                    total += psutil.Process(pid).memory_info().rss
            self.peak_rss = max(self.peak_rss, total / 2**20)
            self.own_cpu = time.thread_time()


INGEST_CLIENT = "ingest-client"  # the hypermedia row's uploads and submits: a web tier's CPU


def _short(cmdline: str) -> str:
    """A process's kind from its command line (Ray's workers name their actor)."""
    for marker in (
        "ray::",
        "sandbox.forkserver",
        "gcs_server",
        "raylet",
        "redis-server",
        "celery",
        "dashboard",
        "runtime_env",
        "log_monitor",
        "inspection",
        "--ingest-client",
        "bench/e2e.py",
    ):
        if marker in cmdline:
            if marker == "--ingest-client":
                return INGEST_CLIENT
            rest = cmdline.split(marker, 1)[1].split()
            return marker + (rest[0] if marker == "ray::" and rest else "")
    words = cmdline.split()  # the program and its arguments, without their directories
    return " ".join(os.path.basename(w) for w in words[:3])[:40]


def _own_cgroup_usage() -> Path | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpuacct" in controllers.split(","):
            usage = CGROUP_ROOT / path.lstrip("/") / "cpuacct.usage"
            if path != "/" and usage.exists():
                return usage
    return None


def run_bare(plan: list[tuple[str, list[str]]], scratch: Path) -> dict[str, int]:
    from pipelines import registry

    registry.load_all()
    params = profile_params()
    counts = {"done": 0, "failed": 0}
    for n, (path, ops) in enumerate(plan):
        for op in ops:
            workdir = scratch / f"job-{n}-{op}"
            workdir.mkdir(parents=True)
            try:
                registry.get(op)(Path(path), params[op], workdir)
                counts["done"] += 1
            except Exception:  # a failed job, counted
                counts["failed"] += 1
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
    return counts


class CeleryRow:
    def __init__(self, scratch: Path, stack: contextlib.ExitStack) -> None:
        import redis

        from bench.harness import start_redis

        self.server = start_redis(scratch / "redis", stack)
        self.url = self.server.url
        self.client = redis.Redis.from_url(self.url)
        os.environ["HM_E2E_BROKER"] = self.url
        self.worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "bench.e2e_tasks", "worker", "-P", "prefork",
             "-c", "2", "--without-gossip", "--without-mingle", "--without-heartbeat",
             "--loglevel", "WARNING"],
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.DEVNULL, stderr=(scratch / "celery.log").open("wb"),
            start_new_session=True,
        )  # fmt: skip
        stack.callback(self._stop_worker)
        self.params = profile_params()

    def _stop_worker(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.worker.pid, 15)
        try:
            self.worker.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.worker.pid, 9)
            self.worker.wait()

    def run(self, plan: list[tuple[str, list[str]]], key: str) -> dict[str, int]:
        from bench.e2e_tasks import run_step

        total = 0
        for path, ops in plan:
            for op in ops:
                run_step.delay(op, path, self.params[op], key)
                total += 1
        deadline = time.monotonic() + 3600
        while time.monotonic() < deadline:
            found: dict[Any, Any] = self.client.hgetall(key)
            counts = {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in found.items()}
            if counts.get("done", 0) + counts.get("failed", 0) >= total:
                return {"done": counts.get("done", 0), "failed": counts.get("failed", 0)}
            time.sleep(0.05)
        raise SystemExit("celery: jobs not done within an hour")


class HypermediaRow:
    def __init__(self, scratch: Path, stack: contextlib.ExitStack, operations: list[str]) -> None:
        import pipelines.registry
        from hypermedia.config import load_settings
        from hypermedia.local import LocalStack, implemented_queues
        from hypermedia.runner import local_operator

        settings = load_settings(data_dir=str(scratch / "data"))
        self.implemented = pipelines.registry.operations()
        self.local = LocalStack(settings)
        stack.callback(self.local.stop)
        self.local.start(pools=implemented_queues(settings, operations), dashboard=False)
        assert self.local.stack is not None
        _caller, self.key = local_operator(self.local.stack)
        self.client_cpu = 0.0  # the ingest client processes', CPU-s

    def run(self, plan: list[tuple[str, list[str]]]) -> dict[str, int]:
        """The uploads and submits come from another process (a web tier's), so that its
        CPU shows apart from the API server's (``ingest-client`` in the breakdown)."""
        from hypermedia.runner import RunReport, Submitted, wait_until_finished

        scratch = Path(tempfile.mkdtemp(prefix="hm-bench-e2e-client-"))
        try:
            (scratch / "plan.json").write_text(json.dumps(plan))
            subprocess.run(
                [sys.executable, __file__, "--ingest-client", "--api", self.local.api_url,
                 "--plan", str(scratch / "plan.json"), "--out", str(scratch / "sent.json")],
                cwd=REPO, check=True, env={**os.environ, "HYPERMEDIA_API_KEY": self.key},
            )  # fmt: skip
            sent = json.loads((scratch / "sent.json").read_text())
            self.client_cpu += float(sent["cpu_seconds"])
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        report = RunReport()
        report.submitted = [Submitted(Path(p), op, q, job) for p, op, q, job in sent["submitted"]]
        report.skipped = [(Path(p), why) for p, why in sent["skipped"]]
        assert self.local.stack is not None
        wait_until_finished(self.local.stack, report, lambda _r: None, 3600, poll_seconds=0.05)
        counts = report.counts()
        return {
            "done": counts.get("completed", 0),
            "failed": sum(n for s, n in counts.items() if s != "completed") + len(report.skipped),
        }


def ingest_client_main(api_url: str, plan_path: Path, out: Path) -> None:
    """The hypermedia row's web tier: each file uploaded and submitted through the HTTP
    ingest client (the key in ``HYPERMEDIA_API_KEY``, never on a command line)."""
    import pipelines.registry
    from hypermedia.runner import submit_files

    plan = json.loads(plan_path.read_text())
    implemented = pipelines.registry.operations()
    submitted: list[tuple[str, str, str, str]] = []
    skipped: list[tuple[str, str]] = []
    key = os.environ["HYPERMEDIA_API_KEY"]
    for ops in {tuple(o) for _p, o in plan}:
        files = [Path(p) for p, o in plan if tuple(o) == ops]
        part = submit_files(api_url, key, files, list(ops), implemented)
        submitted += [(str(s.path), s.operation, s.queue, s.job_id) for s in part.submitted]
        skipped += [(str(path), why) for path, why in part.skipped]
    cpu = sum(os.times()[:2])  # its own CPU: once reaped, it hides in the row's
    out.write_text(json.dumps({"submitted": submitted, "skipped": skipped, "cpu_seconds": cpu}))


def row_main(row: str, plan_path: Path, out: Path) -> None:
    plan = json.loads(plan_path.read_text())
    warm = warm_up_set(plan)
    meter = Meter()
    with contextlib.ExitStack() as stack:
        scratch = Path(tempfile.mkdtemp(prefix=f"hm-bench-e2e-{row}-"))
        stack.callback(shutil.rmtree, scratch, True)
        if row == "bare":
            run_bare(warm, scratch / "warm")

            def timed() -> dict[str, int]:
                return run_bare(plan, scratch / "jobs")
        elif row == "celery":
            celery = CeleryRow(scratch, stack)
            celery.run(warm, "hm-e2e-warm")

            def timed() -> dict[str, int]:
                return celery.run(plan, "hm-e2e-jobs")
        else:
            operations = sorted({op for _path, ops in plan for op in ops})
            hypermedia = HypermediaRow(scratch, stack, operations)  # their queues' actors
            hypermedia.run(warm)
            hypermedia.client_cpu = 0.0

            def timed() -> dict[str, int]:
                return hypermedia.run(plan)

        meter.start()
        cpu0, wall0 = meter.cpu(), time.monotonic()
        counts = timed()
        seconds, cpu = time.monotonic() - wall0, meter.cpu() - cpu0
        meter.stop()
        cpu -= meter.own_cpu
        breakdown = meter.breakdown()
        if row == "hypermedia" and hypermedia.client_cpu:
            # Reaped by this process, the client's CPU came in with this process's.
            mine = breakdown.get("bench/e2e.py", 0.0) - hypermedia.client_cpu
            breakdown["bench/e2e.py"] = round(mine, 2)
            breakdown[INGEST_CLIENT] = round(hypermedia.client_cpu, 2)
            breakdown = dict(sorted(breakdown.items(), key=lambda kv: -kv[1]))
    out.write_text(
        json.dumps(
            {
                **counts,
                "seconds": seconds,
                "cpu_seconds": cpu,
                "meter_cpu_seconds": round(meter.own_cpu, 3),
                "peak_rss_mb": round(meter.peak_rss, 1),
                "cpu_source": "cgroup" if meter.usage is not None else "process tree",
                "cpu_by_process": breakdown,
            }
        )
    )


# -- the run ---------------------------------------------------------------------------------


def run_row(row: str, plan_path: Path, scratch: Path) -> dict[str, Any]:
    out = scratch / f"{row}.json"
    group = CGROUP_ROOT / f"hm-bench-e2e-{row}-{os.getpid()}"
    use_group = CGROUP_ROOT.is_dir() and os.access(CGROUP_ROOT, os.W_OK)
    if use_group:
        group.mkdir(exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, __file__, "--row", row, "--plan", str(plan_path), "--out", str(out)],
        cwd=REPO,
    )
    if use_group:
        (group / "cgroup.procs").write_text(str(proc.pid))
    try:
        code = proc.wait(7200)
    finally:
        if use_group:
            with contextlib.suppress(OSError):
                group.rmdir()
    if code != 0:
        raise SystemExit(f"row {row} failed (exit {code})")
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--limit", type=int, default=40, help="files of each kind at most")
    parser.add_argument("--ops", default="", help="only these operations (comma-separated)")
    parser.add_argument(
        "--repeat", type=int, default=1, help="each file this many times (a longer window)"
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--row", help=argparse.SUPPRESS)
    parser.add_argument("--ingest-client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--api", help=argparse.SUPPRESS)
    parser.add_argument("--plan", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.ingest_client:
        ingest_client_main(args.api, args.plan, args.out)
        return 0
    if args.row:
        row_main(args.row, args.plan, args.out)
        return 0

    rows = [r for r in args.rows.split(",") if r]
    unknown = set(rows) - set(ROWS)
    if unknown:
        parser.error(f"unknown rows {sorted(unknown)}; rows are {', '.join(ROWS)}")
    if "celery" in rows:
        try:
            import celery  # noqa: F401
        except ImportError:
            parser.error("the celery row needs Celery: pip install -e '.[bench]'")
    plan = work_set(args.limit)
    if args.ops:
        wanted = set(args.ops.split(","))
        plan = [(path, [o for o in ops if o in wanted]) for path, ops in plan]
        plan = [(path, ops) for path, ops in plan if ops]
        if not plan:
            parser.error(f"no job runs any of {sorted(wanted)}")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    files = plan
    plan = plan * args.repeat
    jobs = sum(len(ops) for _p, ops in plan)
    scratch = Path(tempfile.mkdtemp(prefix="hm-bench-e2e-"))
    plan_path = scratch / "plan.json"
    plan_path.write_text(json.dumps(plan))
    print(f"{len(plan)} files, {jobs} jobs a row: {', '.join(rows)}")
    results: dict[str, dict[str, Any]] = {}
    try:
        for row in rows:
            results[row] = result = run_row(row, plan_path, scratch)
            print(
                f"  {row:11s} {result['seconds']:7.1f} s {result['cpu_seconds']:7.1f} CPU-s"
                f"  done {result['done']}, failed {result['failed']}"
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    bare = results.get("bare")
    pipeline_cpu = bare["cpu_seconds"] / max(bare["done"], 1) if bare else None
    table = []
    header = f"\n{'row':11s} {'jobs/s':>7s} {'CPU-s/job':>10s} {'pipeline':>9s} {'platform':>9s}"
    print(header + f" {'peak MB':>8s} {'x bare':>7s} {'x celery':>9s}")
    for row, result in results.items():
        done = max(result["done"], 1)
        rate = result["done"] / result["seconds"]
        per_job = result["cpu_seconds"] / done
        entry: dict[str, Any] = {
            "row": row,
            **result,
            "jobs_per_second": round(rate, 3),
            "cpu_seconds_per_job": round(per_job, 4),
        }
        if pipeline_cpu is not None:
            entry["pipeline_cpu_seconds_per_job"] = round(pipeline_cpu, 4)
            entry["platform_cpu_seconds_per_job"] = round(per_job - pipeline_cpu, 4)
        client = result.get("cpu_by_process", {}).get(INGEST_CLIENT)
        if client is not None:
            entry["ingest_client_cpu_seconds_per_job"] = round(client / done, 4)
        for peer in ("bare", "celery"):
            if peer in results and peer != row:
                peer_rate = results[peer]["done"] / results[peer]["seconds"]
                entry[f"speed_vs_{peer}"] = round(rate / peer_rate, 3)
        table.append(entry)

        def cell(key: str, fmt: str, entry: dict[str, Any] = entry) -> str:
            return format(entry[key], fmt) if key in entry else "-"

        print(
            f"{row:11s} {rate:7.2f} {per_job:10.4f} {cell('pipeline_cpu_seconds_per_job', '9.4f')}"
            f" {cell('platform_cpu_seconds_per_job', '9.4f')} {result['peak_rss_mb']:8.0f}"
            f" {cell('speed_vs_bare', '7.2f')} {cell('speed_vs_celery', '9.2f')}"
        )
    for entry in table:
        if "ingest_client_cpu_seconds_per_job" in entry:
            print(
                f"{entry['row']}: {entry['ingest_client_cpu_seconds_per_job']:.4f} CPU-s a job of"
                " it is the ingest client's (uploads and submits: the web tier's side)"
            )
    report = {
        "meta": {
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_end": os.getloadavg(),
            "files": len(files),
            "repeat": args.repeat,
            "jobs": jobs,
            "plan": [(f"{Path(path).parent.name}/{Path(path).name}", ops) for path, ops in files],
        },
        "rows": table,
    }
    out = args.json or REPO / "bench" / "results" / f"e2e-{int(time.time())}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
