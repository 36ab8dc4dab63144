"""OCR model preload: what a job costs when the fork server loads more before it forks.

    python bench/ocr_preload.py                   # 4 jobs a row, table + JSON
    python bench/ocr_preload.py --jobs 6 --json out.json

Each row starts a fresh Python process that plays the fork server: it loads what the
row says, then forks one child per job (``os.fork``, as the server does when a
preloaded module runs threads) and reaps it. The rows' servers run side by side and
take turns, one job each a round, so a machine whose load changes meanwhile weighs
on every row alike. A child reads the generated
clean page (tests/generated/ocr_pages.py, 1966 x 635 px) with the ``ppocr`` engine
(RapidOCR on onnxruntime, the wheel's PP-OCRv6 models) and exits. Rows:

* ``per-job``: today. The server has imported the pipeline modules only; each job
  imports NumPy, OpenCV, onnxruntime and RapidOCR, builds the engine and reads.
* ``imports``: the server has also imported those libraries (no model loaded); each
  job builds the engine and reads.
* ``engine-1t``: the server has built the engine with one inference thread and read
  a small page (RapidOCR builds its sessions on first use); each job only reads.
* ``engine-2t``: the same with two inference threads (onnxruntime's intra-op pool
  then has a thread, which fork does not copy).

Per job: the child's CPU seconds (user + system, from ``wait4``), its wall time from
fork to reap, its peak RSS, and whether it finished within ``--timeout`` (a child
still running then is killed and counted as hung). Per row: the server's own CPU
spent preloading, its RSS and thread count when it forks. A second table times
building the three onnxruntime sessions in one process from the model files, from
their bytes read beforehand, and from graphs optimised beforehand (what reading
model bytes before the fork, or optimising once, could save a job). A third runs the
ocr step itself (the profile's defaults) through two real fork servers in turn, one
also preloading the libraries the step asks for (what the ocr workers now do). Results
go to ``bench/results/ocr-preload-<timestamp>.json`` unless ``--json`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

ROWS = (
    ("per-job", 1),
    ("per-job", 2),
    ("imports", 1),
    ("imports", 2),
    ("engine-1t", 1),
    ("engine-2t", 2),
)


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _cpu() -> float:
    times = os.times()
    return times.user + times.system


def _load_page(path: str) -> Any:
    import numpy as np
    from PIL import Image

    with Image.open(path) as image:
        return np.ascontiguousarray(np.asarray(image.convert("RGB"), dtype=np.uint8))


def _job(kind: str, threads: int, page_path: str, engine: Any) -> int:
    """What one forked child does: the number of lines it read."""
    from pipelines import ocr_engines

    page = _load_page(page_path)
    if engine is None:
        engine = ocr_engines.create("ppocr", ["eng"], threads)
    return len(engine.recognize(page))


def serve_row(kind: str, threads: int, page_path: str, timeout: float) -> None:
    """This process is the row's server: preload, say so, then fork one job for each
    line on stdin and answer each with a JSON line."""
    import pipelines.registry

    pipelines.registry.load_all()
    started = _cpu()
    engine = None
    if kind in ("imports", "engine-1t", "engine-2t"):
        import cv2  # noqa: F401
        import numpy  # noqa: F401
        import onnxruntime  # type: ignore[import-untyped]  # noqa: F401
        import rapidocr  # noqa: F401

        from pipelines import ocr_engines

        ocr_engines._no_spinning()
    if kind.startswith("engine-"):
        import numpy as np

        from pipelines import ocr_engines

        engine = ocr_engines.create("ppocr", ["eng"], threads)
        warm = np.full((120, 400, 3), 255, dtype=np.uint8)
        warm[50:70, 40:360] = 0  # a bar: detection and recognition both run
        engine.recognize(warm)
    server = {
        "preload_cpu_s": round(_cpu() - started, 3),
        "rss_mb": round(_rss_mb(), 1),
        "threads_at_fork": _threads(),
    }
    print(json.dumps(server), flush=True)
    for _ in sys.stdin:
        print(json.dumps(_fork_job(kind, threads, page_path, engine, timeout)), flush=True)


def _fork_job(
    kind: str, threads: int, page_path: str, engine: Any, timeout: float
) -> dict[str, Any]:
    read, write = os.pipe()
    begun = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the job
        os.close(read)
        code = 0
        try:
            lines = _job(kind, threads, page_path, engine)
            os.write(write, json.dumps({"lines": lines}).encode())
        except BaseException as exc:
            os.write(write, json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode())
            code = 1
        os._exit(code)
    os.close(write)
    outcome = "ok"
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() - begun > timeout:
            os.kill(pid, signal.SIGKILL)
            done, status, usage = os.wait4(pid, 0)
            outcome = "hung"
            break
        time.sleep(0.01)
    wall = time.monotonic() - begun
    with os.fdopen(read, "rb") as channel:
        said = channel.read()
    report = json.loads(said) if said else {}
    if outcome == "ok" and (status != 0 or "error" in report):
        outcome = "error: " + str(report.get("error", f"status {status}"))
    return {
        "outcome": outcome,
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
        "wall_s": round(wall, 3),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        "lines": report.get("lines"),
    }


def through_fork_servers(page: Path, rounds: int) -> dict[str, Any]:
    """The ``ocr`` step with its profile's default parameters on ``page``, through two
    real fork servers (:class:`~hypermedia.sandbox.executor.ChildExecutor`, sandbox on,
    one inference thread): one preloading the pipeline modules only, one also the
    libraries the ocr step asks for (:func:`pipelines.registry.preload`), a job on each
    in turn. A job's CPU is what its server's reaped children used meanwhile
    (``/proc/<server>/stat``: cutime + cstime)."""
    from hypermedia.sandbox.executor import ChildExecutor
    from pipelines import registry

    tick = os.sysconf("SC_CLK_TCK")

    def reaped_cpu(pid: int) -> float:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[13]) + int(fields[14])) / tick

    libraries = registry.preload(["ocr"])
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as work:
        executors = {
            "pipelines only": ChildExecutor(Path(work) / "plain", job_cpus=1),
            "ocr libraries too": ChildExecutor(
                Path(work) / "libs", preload=("pipelines.registry", *libraries), job_cpus=1
            ),
        }
        try:
            for name, executor in executors.items():
                rows[name] = {"capabilities": executor.capabilities, "jobs": []}
            for number in range(rounds):
                for name, executor in executors.items():
                    job = f"preload-{number}"
                    source = executor.prepare(job) / "input" / "page.png"
                    source.write_bytes(page.read_bytes())
                    server = executor._server
                    assert server is not None
                    before = reaped_cpu(server.pid)
                    result = executor.run(
                        job,
                        "ocr",
                        source,
                        {},
                        timeout_seconds=120,
                        memory_limit_mb=4096,
                        max_processes=32,
                    )
                    rows[name]["jobs"].append(
                        {
                            "cpu_s": round(reaped_cpu(server.pid) - before, 3),
                            "wall_s": round(result.duration_ms / 1000, 3),
                            "peak_rss_mb": round(result.peak_memory_mb, 1),
                        }
                    )
                    executor.cleanup(job)
        finally:
            for executor in executors.values():
                executor.close()
    for row in rows.values():
        row["cpu_p50"] = statistics.median(j["cpu_s"] for j in row["jobs"])
        row["wall_p50"] = statistics.median(j["wall_s"] for j in row["jobs"])
    return {"libraries": list(libraries), "rows": rows}


def session_builds(repeats: int) -> dict[str, Any]:
    """Building the ppocr engine's three onnxruntime sessions (one thread) in this
    process: from the files, from their bytes read beforehand, from graphs optimised
    beforehand and loaded without optimising again. Medians of ``repeats``."""
    import onnxruntime as ort

    from pipelines import ocr_engines

    models = ocr_engines.ppocr_model_dir()
    files = [models / name for name in ocr_engines._PPOCR_MODELS.values()]
    data = [path.read_bytes() for path in files]

    def options(level: Any = None) -> Any:
        made = ort.SessionOptions()
        made.intra_op_num_threads = 1
        made.inter_op_num_threads = 1
        made.log_severity_level = 3
        if level is not None:
            made.graph_optimization_level = level
        return made

    with tempfile.TemporaryDirectory() as work:
        optimised = []
        for path in files:
            made = options()
            made.optimized_model_filepath = str(Path(work) / path.name)
            ort.InferenceSession(str(path), made, providers=["CPUExecutionProvider"])
            optimised.append(str(Path(work) / path.name))
        ways = {
            "from the files": lambda: [
                ort.InferenceSession(str(p), options(), providers=["CPUExecutionProvider"])
                for p in files
            ],
            "from bytes read before": lambda: [
                ort.InferenceSession(b, options(), providers=["CPUExecutionProvider"]) for b in data
            ],
            "optimised before, loaded as is": lambda: [
                ort.InferenceSession(
                    p,
                    options(ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
                    providers=["CPUExecutionProvider"],
                )
                for p in optimised
            ],
        }
        timings: dict[str, float] = {}
        for name, build in ways.items():
            spent = []
            for _ in range(repeats):
                started = _cpu()
                build()
                spent.append(_cpu() - started)
            timings[name] = round(statistics.median(spent), 3)
    return {"cpu_s": timings, "model_mb": round(sum(map(len, data)) / 2**20, 1)}


def _summary(row: dict[str, Any]) -> dict[str, Any]:
    jobs = row["jobs"]
    ok = [j for j in jobs if j["outcome"] == "ok"]
    return {
        "row": f"{row['kind']} t{row['threads']}",
        "ok": f"{len(ok)}/{len(jobs)}",
        "cpu_p50": statistics.median(j["cpu_s"] for j in ok) if ok else None,
        "wall_p50": statistics.median(j["wall_s"] for j in ok) if ok else None,
        "rss_p50": statistics.median(j["peak_rss_mb"] for j in ok) if ok else None,
        "preload": row["server"]["preload_cpu_s"],
        "server_mb": row["server"]["rss_mb"],
        "threads": row["server"]["threads_at_fork"],
        "other": sorted({j["outcome"] for j in jobs} - {"ok"}),
    }


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=4, help="jobs (forks) per row")
    parser.add_argument("--timeout", type=float, default=60.0, help="a job's seconds")
    parser.add_argument("--json", type=Path, help="where to write the results")
    parser.add_argument("--row", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--page", help=argparse.SUPPRESS)
    parser.add_argument("--sessions", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sessions:
        print(json.dumps(session_builds(5)))
        return
    if args.row:
        serve_row(args.row, args.threads, args.page, args.timeout)
        return

    from tests.generated import ocr_pages

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with tempfile.TemporaryDirectory() as work:
        page = Path(work) / "clean-page.png"
        ocr_pages.clean_page().save(page)
        servers = []
        for kind, threads in ROWS:
            command = [sys.executable, __file__, "--row", kind, "--threads", str(threads)]
            command += ["--page", str(page), "--timeout", str(args.timeout)]
            process = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
            )
            assert process.stdout is not None
            server = json.loads(process.stdout.readline())
            servers.append((process, {"kind": kind, "threads": threads, "server": server}))
        rows = [row for _, row in servers]
        for row in rows:
            row["jobs"] = []
        # Round by round, one job of each row: the machine's load falls on every row.
        for round_number in range(args.jobs):
            for process, row in servers:
                assert process.stdin is not None and process.stdout is not None
                process.stdin.write("job\n")
                process.stdin.flush()
                row["jobs"].append(json.loads(process.stdout.readline()))
            print(f"  round {round_number + 1}/{args.jobs} done", file=sys.stderr)
        for process, _ in servers:
            assert process.stdin is not None
            process.stdin.close()
            process.wait(30)
        sessions_run = subprocess.run(
            [sys.executable, __file__, "--sessions"],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
        sessions = json.loads(sessions_run.stdout.strip().splitlines()[-1])
        servers_run = through_fork_servers(page, args.jobs)

    summaries = [_summary(row) for row in rows]
    columns = ("row", "ok", "cpu_p50", "wall_p50", "rss_p50", "preload", "server_mb", "threads")
    heads = ("row", "jobs ok", "job CPU-s", "job wall s", "job RSS MB", "preload CPU-s",
             "server MB", "threads at fork")  # fmt: skip
    widths = [max(len(h), 10) for h in heads]
    print("  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True)))
    for summary in summaries:
        cells = [_fmt(summary[c]) for c in columns]
        line = "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True))
        print(line + (f"  {', '.join(summary['other'])}" if summary["other"] else ""))
    print()
    print(f"onnxruntime sessions of the 3 models ({sessions['model_mb']} MB), CPU-s, median:")
    for way, seconds in sessions["cpu_s"].items():
        print(f"  {way:<32} {seconds:.3f}")
    print()
    print(
        "through the real fork server, the ocr step's defaults, one thread"
        f" (preloaded: {', '.join(servers_run['libraries'])}):"
    )
    for name, row in servers_run["rows"].items():
        print(
            f"  {name:<20} job CPU-s p50 {row['cpu_p50']:.2f}  job wall s p50 {row['wall_p50']:.2f}"
        )
    report = {
        "bench": "ocr_preload",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": {
            "cpus": os.cpu_count(),
            "load": os.getloadavg(),
            "python": platform.python_version(),
        },
        "jobs_per_row": args.jobs,
        "rows": rows,
        "summary": summaries,
        "sessions": sessions,
        "fork_servers": servers_run,
    }
    out = (
        args.json
        or REPO / "bench" / "results" / f"ocr-preload-{time.strftime('%Y%m%d-%H%M%S')}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"\nwritten: {out}")


if __name__ == "__main__":
    main()
