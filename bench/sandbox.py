"""What the job sandbox adds to a job: start-to-exit latency of a no-op job, p50/p99.

    python bench/sandbox.py                  # 400 jobs per row and round, 3 rounds
    python bench/sandbox.py --jobs 200 --rounds 5 --json /tmp/sandbox.json

Needs root (a job uid, namespaces). Every row is one job after another from one
thread, timed from the call to its return:

* ``executor, sandbox``: ``ChildExecutor.run`` of ``test.noop`` as the worker does
  it (default spares, the full sandbox: network and mount namespaces, read-only
  view, a job uid, the seccomp filter, every process of that uid gone before the
  return).
* ``executor, sandbox, copy init``: the same, each job's PID namespace's init a
  spare (a copy of the server) that forks the job's process, as where there is no
  tiny init (:mod:`hypermedia.sandbox.tinyinit`; ``HYPERMEDIA_SANDBOX_PID_INIT=copy``).
* ``executor, sandbox off``: the same executor with ``sandbox=False``: rlimits and
  a spare, nothing else. The difference to the row above is what the sandbox adds
  to a job's latency.
* ``executor, sandbox, no spares``: a fork per request, so the sandbox is built on
  the job's clock: the worst case (a burst that outruns the spares).
* ``fork + sandbox, bare``: this process (pipeline modules loaded) forks with
  libc's ``fork()`` into a PID namespace of the child's own; the child (the
  namespace's init, which must not run the step) forks the job's process, which
  builds the sandbox (``Isolation.prepare``, ``enter`` and ``filter_syscalls``:
  namespaces, view, the uid's network namespace entered, workdir bound, uid, seccomp
  filter) and exits; each parent
  waits.
  The kernel's part of the sandbox, which spares do ahead of time.
* ``fork + exit``: the same without the sandbox: the floor for a child of this size.
* ``python -c pass``: a fresh interpreter (``subprocess.run``), what a job would cost
  without a warm server; a tenth of the jobs.

Rows take turns within a round; latencies are pooled over the rounds. CPU per job
(executor rows) is split between the calling process, the fork server and the
children (from /proc), as in ``bench/executor.py``. Results go to
``bench/results/sandbox-<timestamp>.json`` unless ``--json`` says otherwise.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from autoscaler.sim_report import percentile  # noqa: E402
from bench.executor import _cpu  # noqa: E402
from hypermedia.sandbox import isolation  # noqa: E402
from hypermedia.sandbox.executor import PID_INIT_ENV, ChildExecutor  # noqa: E402
from tests.pipelines_for_tests import PRELOAD  # noqa: E402

TARGET_P50_MS = 5.0


@dataclass
class Row:
    name: str
    share: float = 1.0  # of --jobs per round
    latencies_ms: list[float] = field(default_factory=list)
    cpu_ms: dict[str, list[float]] = field(default_factory=dict)

    def percentile(self, fraction: float) -> float:
        return percentile(sorted(self.latencies_ms), fraction)


class Subject:
    server_pid: int | None = None

    def one(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class Executor(Subject):
    def __init__(
        self,
        work_root: Path,
        *,
        sandbox: bool,
        spares: int | None = None,
        pid_init: str = "tiny",
    ) -> None:
        kwargs: dict[str, Any] = {"sandbox": sandbox}
        if spares is not None:
            kwargs["spares"] = spares
        before = os.environ.get(PID_INIT_ENV)
        os.environ[PID_INIT_ENV] = pid_init  # read once, when the server starts
        try:
            self.executor = ChildExecutor(work_root, preload=PRELOAD, **kwargs)
        finally:
            if before is None:
                del os.environ[PID_INIT_ENV]
            else:
                os.environ[PID_INIT_ENV] = before
        self.server_pid = self.executor.server_pid
        self.counter = 0
        self.capabilities = self.executor.capabilities

    def one(self) -> None:
        raise NotImplementedError  # timed in measure(): run() only, not prepare/cleanup

    def timed(self) -> float:
        self.counter += 1
        job_id = f"bench-{self.counter}"
        source = self.executor.prepare(job_id) / "input" / "source"
        source.write_bytes(b"x")
        try:
            started = time.perf_counter()
            self.executor.run(
                job_id, "test.noop", source, {}, timeout_seconds=30, memory_limit_mb=1024
            )
            return (time.perf_counter() - started) * 1000
        finally:
            self.executor.cleanup(job_id)

    def close(self) -> None:
        self.executor.close()


class BareFork(Subject):
    """libc fork(); the child builds the sandbox (or not) and exits; waitpid."""

    def __init__(self, work_root: Path, *, sandbox: bool) -> None:
        from pipelines import registry

        registry.load_all()
        self.fork = ctypes.PyDLL(None, use_errno=True).fork
        self.sandbox: isolation.Isolation | None = None
        self.workdir = ""
        self.network: int | None = None
        if sandbox:
            jobs_root = work_root / "jobs"
            (jobs_root / "job").mkdir(parents=True)
            code = isolation.code_paths(list(sys.modules.values()), also_cover=[os.getcwd()])
            settings = isolation.Settings(
                enabled=True,
                work_root=str(work_root),
                jobs_root=str(jobs_root),
                hidden=isolation.DEFAULT_HIDDEN,
                exposed=code.exposes,
                covered=(*isolation.DEFAULT_COVERED, *code.covers),
            )
            self.sandbox = isolation.Isolation.start(settings, self._fork)
            if self.sandbox.missing:
                raise SystemExit(f"the sandbox is incomplete here: {self.sandbox.missing}")
            self.workdir = str(jobs_root / "job")
            # Made here, once, as the server makes it on the uid's first job.
            self.network = self.sandbox.network_namespace_of(self.sandbox.uids[0])

    def no_new_privileges(self) -> None:
        if ctypes.CDLL(None, use_errno=True).prctl(38, 1, 0, 0, 0):  # PR_SET_NO_NEW_PRIVS
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")

    def _fork(self) -> int:
        pid: int = self.fork()
        if pid < 0:
            raise OSError(ctypes.get_errno(), "fork")
        return pid

    def one(self) -> None:
        sandbox = self.sandbox
        pid, init = sandbox.fork_spare(self._fork) if sandbox is not None else (self._fork(), None)
        if pid == 0:
            status = 0
            try:
                if sandbox is not None:
                    self.no_new_privileges()
                    if sandbox.spare_is_init:  # the init forks the job's process
                        step = self._fork()
                        if step:
                            _, raw = os.waitpid(step, 0)
                            os._exit(1 if os.waitstatus_to_exitcode(raw) else 0)
                    jobs_fd = sandbox.prepare()
                    # The inherited copy of the descriptor: enter() closes it.
                    sandbox.enter(jobs_fd, self.workdir, sandbox.uids[0], self.network)
                    sandbox.filter_syscalls()
            except BaseException:
                status = 1
            os._exit(status)
        _, status = os.waitpid(pid, 0)
        if init is not None:  # a tiny init (the server kills it, and reaps it later)
            os.kill(init, 9)
            os.waitpid(init, 0)
        if status != 0:
            raise RuntimeError(f"the child failed: {status}")

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()


class FreshPython(Subject):
    def one(self) -> None:
        subprocess.run([sys.executable, "-c", "pass"], check=True)


def measure(subject: Subject, row: Row, jobs: int) -> None:
    server = subject.server_pid
    mine = os.times()
    before = _cpu(server) if server else (0.0, 0.0)
    for _ in range(jobs):
        if isinstance(subject, Executor):
            row.latencies_ms.append(subject.timed())
        else:
            started = time.perf_counter()
            subject.one()
            row.latencies_ms.append((time.perf_counter() - started) * 1000)
    after = _cpu(server) if server else (0.0, 0.0)
    now = os.times()
    caller = (now.user + now.system) - (mine.user + mine.system)
    own_children = (now.children_user + now.children_system) - (
        mine.children_user + mine.children_system
    )
    parts = {
        "caller": caller,
        "server": after[0] - before[0],
        "children": (after[1] - before[1]) if server else own_children,
    }
    for part, value in parts.items():
        row.cpu_ms.setdefault(part, []).append(value / jobs * 1000)


def run(args: argparse.Namespace) -> dict[str, Any]:
    if os.geteuid() != 0:
        raise SystemExit("bench/sandbox.py needs root: the sandbox gives each job a uid")
    with tempfile.TemporaryDirectory(prefix="hm-bench-sandbox-", dir=args.work_root) as scratch:
        base = Path(scratch)
        factories: dict[str, Callable[[], Subject]] = {
            "executor, sandbox": lambda: Executor(base / "sandbox", sandbox=True),
            "executor, sandbox, copy init": lambda: Executor(
                base / "copy", sandbox=True, pid_init="copy"
            ),
            "executor, sandbox off": lambda: Executor(base / "off", sandbox=False),
            "executor, sandbox, no spares": lambda: Executor(
                base / "nospares", sandbox=True, spares=0
            ),
            "fork + sandbox, bare": lambda: BareFork(base / "bare", sandbox=True),
            "fork + exit": lambda: BareFork(base / "floor", sandbox=False),
            "python -c pass": FreshPython,
        }
        shares = {"python -c pass": 0.1}
        subjects = {name: make() for name, make in factories.items()}
        rows = [Row(name, shares.get(name, 1.0)) for name in subjects]
        capabilities = subjects["executor, sandbox"].capabilities  # type: ignore[attr-defined]
        if capabilities.get("missing"):
            raise SystemExit(f"the sandbox is incomplete here: {capabilities['missing']}")
        try:
            for subject, row in zip(subjects.values(), rows, strict=True):  # warm-up
                measure(subject, Row(row.name), max(1, int(args.warmup * row.share)))
            for round_ in range(args.rounds):
                order = rows[round_ % len(rows) :] + rows[: round_ % len(rows)]
                for row in order:
                    jobs = max(1, int(args.jobs * row.share))
                    measure(subjects[row.name], row, jobs)
                    print(
                        f"  round {round_ + 1}: {row.name}: "
                        f"p50 {statistics.median(row.latencies_ms[-jobs:]):.2f} ms",
                        file=sys.stderr,
                    )
        finally:
            for subject in subjects.values():
                subject.close()
    by_name = {row.name: row for row in rows}
    sandbox_p50 = by_name["executor, sandbox"].percentile(0.5)
    off_p50 = by_name["executor, sandbox off"].percentile(0.5)
    return {
        "jobs_per_round": args.jobs,
        "rounds": args.rounds,
        "work_root": str(args.work_root or tempfile.gettempdir()),
        "capabilities": capabilities,
        "rows": [
            {
                "name": row.name,
                "jobs": len(row.latencies_ms),
                "p50_ms": round(row.percentile(0.5), 3),
                "p90_ms": round(row.percentile(0.9), 3),
                "p99_ms": round(row.percentile(0.99), 3),
                "mean_ms": round(statistics.fmean(row.latencies_ms), 3),
                "cpu_ms_per_job": {
                    part: round(statistics.median(values), 3) for part, values in row.cpu_ms.items()
                },
            }
            for row in rows
        ],
        "sandbox_adds_p50_ms": round(sandbox_p50 - off_p50, 3),
        "target_p50_ms": TARGET_P50_MS,
        "meets_target": sandbox_p50 <= TARGET_P50_MS,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "kernel": platform.release(),
            "loadavg": os.getloadavg(),
        },
    }


def render(result: dict[str, Any]) -> str:
    lines = [
        f"{'row':<30} {'jobs':>5} {'p50 ms':>7} {'p90 ms':>7} {'p99 ms':>7} {'mean':>7}  "
        f"{'CPU ms/job: caller':>18} {'server':>7} {'children':>8}",
    ]
    for row in result["rows"]:
        cpu = row["cpu_ms_per_job"]
        lines.append(
            f"{row['name']:<30} {row['jobs']:>5} {row['p50_ms']:>7.2f} {row['p90_ms']:>7.2f} "
            f"{row['p99_ms']:>7.2f} {row['mean_ms']:>7.2f}  {cpu['caller']:>18.2f} "
            f"{cpu['server']:>7.2f} {cpu['children']:>8.2f}"
        )
    verdict = "meets" if result["meets_target"] else "MISSES"
    lines.append(
        f"the sandbox adds {result['sandbox_adds_p50_ms']:.2f} ms at p50; a sandboxed no-op "
        f"job {verdict} the {result['target_p50_ms']:g} ms p50 target"
    )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=400, help="jobs per row and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--json", type=Path, help="default bench/results/sandbox-<time>.json")
    parser.add_argument(
        "--work-root", type=Path, help="where the jobs' workdirs go (default: the temp dir)"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    print(render(result))
    path = (
        args.json or ROOT / "bench" / "results" / f"sandbox-{time.strftime('%Y%m%d-%H%M%S')}.json"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
