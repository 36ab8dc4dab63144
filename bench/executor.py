"""Per-job cost of the sandbox: no-op jobs per second through ChildExecutor.

    python bench/executor.py                 # 2,000 jobs per row and round, 3 rounds
    python bench/executor.py --jobs 500 --rounds 5 --json /tmp/executor.json

Rows (every job is a real child with its own address space, workdir and result):

* ``executor``: ``ChildExecutor.run`` of ``test.noop`` with 1 and 2 calling threads,
  with the default spares (children forked ahead of time) and with none (a fork on
  each request), the job's workdir prepared and cleaned up as the worker does, the
  job sandbox on (as root: namespaces, read-only view, a job uid; what that adds
  is ``bench/sandbox.py``'s subject).
* ``fork + exit, nothing else``: this process (pipeline modules loaded) forks with
  libc's ``fork()``, the child exits at once, the parent waits: the kernel's floor
  for a child of an address space this size.
* ``multiprocessing forkserver``: ``Process(target=noop).start(); join()`` on Python's
  own fork server with the same modules preloaded, the other way to get a warm
  child per job (no workdir, no limits, no result): the yardstick. Each of its
  children also imports the calling program's ``__main__`` (here this script), as
  it would in any real program; it runs a tenth of the jobs.

The fork servers preload ``pipelines.registry`` (with every pipeline module it
lists: pyvips and friends) and ``tests.pipelines_for_tests``. A row's jobs/s is
the median of its rounds; rows take turns within a round. CPU per job is split
between the calling process, the fork server and the children (from /proc), so it
shows where a job's cost goes whatever else runs on the machine; the caller's share
includes creating and removing the workdir, which on a disk mounted with ``discard``
costs more than the rest of the caller's work (``--work-root /dev/shm``). Results go to
``bench/results/executor-<timestamp>.json`` unless ``--json`` says otherwise.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hypermedia.sandbox.executor import ChildExecutor  # noqa: E402
from hypermedia.sandbox.wire import DEFAULT_SPARES  # noqa: E402
from tests.pipelines_for_tests import PRELOAD  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def _noop() -> None:
    pass


def _cpu(pid: int) -> tuple[float, float]:
    """(own, reaped children's) CPU seconds of ``pid``."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        fields = stat.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK, (int(fields[13]) + int(fields[14])) / TICK


@dataclass
class Row:
    name: str
    threads: int
    rates: list[float] = field(default_factory=list)
    cpu_ms: dict[str, list[float]] = field(default_factory=dict)

    @property
    def jobs_per_second(self) -> float:
        return statistics.median(self.rates)

    def cpu(self, part: str) -> float | None:
        values = self.cpu_ms.get(part)
        return statistics.median(values) if values else None


class Subject:
    """Something that runs ``n`` no-op jobs on ``threads`` threads."""

    server_pid: int | None = None

    def run(self, n: int, threads: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class Executor(Subject):
    def __init__(self, work_root: Path, spares: int) -> None:
        self.executor = ChildExecutor(work_root, preload=PRELOAD, spares=spares)
        self.server_pid = self.executor.server_pid
        self.counter = 0
        self.lock = threading.Lock()

    def _job(self) -> None:
        with self.lock:
            self.counter += 1
            job_id = f"bench-{self.counter}"
        workdir = self.executor.prepare(job_id)
        source = workdir / "input" / "source"
        source.write_bytes(b"x")
        try:
            self.executor.run(
                job_id, "test.noop", source, {}, timeout_seconds=30, memory_limit_mb=1024
            )
        finally:
            self.executor.cleanup(job_id)

    def run(self, n: int, threads: int) -> None:
        _in_threads(self._job, n, threads)

    def close(self) -> None:
        self.executor.close()


class MultiprocessingForkserver(Subject):
    def __init__(self) -> None:
        self.context = multiprocessing.get_context("forkserver")
        self.context.set_forkserver_preload(list(PRELOAD))
        self.run(1, 1)  # start the server
        from multiprocessing import forkserver

        self.server_pid = forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]

    def _job(self) -> None:
        process = self.context.Process(target=_noop)
        process.start()
        process.join()

    def run(self, n: int, threads: int) -> None:
        _in_threads(self._job, n, threads)


class ForkFloor(Subject):
    """libc fork(), the child _exit(0)s at once, waitpid: what the kernel charges for
    a child of an address space this size (this process, pipeline modules loaded)."""

    def __init__(self) -> None:
        from pipelines import registry

        registry.load_all()
        self.fork = ctypes.PyDLL(None).fork

    def _job(self) -> None:
        pid = self.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)

    def run(self, n: int, threads: int) -> None:
        _in_threads(self._job, n, threads)


def _in_threads(job: Callable[[], None], n: int, threads: int) -> None:
    shares = [n // threads + (1 if i < n % threads else 0) for i in range(threads)]
    errors: list[BaseException] = []

    def loop(count: int) -> None:
        try:
            for _ in range(count):
                job()
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=loop, args=(share,)) for share in shares]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]


def measure(subject: Subject, row: Row, jobs: int) -> None:
    server = subject.server_pid
    mine = os.times()
    before = _cpu(server) if server else (0.0, 0.0)
    started = time.perf_counter()
    subject.run(jobs, row.threads)
    seconds = time.perf_counter() - started
    after = _cpu(server) if server else (0.0, 0.0)
    now = os.times()
    row.rates.append(jobs / seconds)
    caller = (now.user + now.system) - (mine.user + mine.system)
    own_children = (now.children_user + now.children_system) - (
        mine.children_user + mine.children_system
    )
    parts = {
        "caller": caller,
        "server": after[0] - before[0],
        # The fork server's children, or (no server pid) the caller's own.
        "children": (after[1] - before[1]) if server else own_children,
    }
    for part, value in parts.items():
        row.cpu_ms.setdefault(part, []).append(value / jobs * 1000)


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="hm-bench-executor-", dir=args.work_root) as scratch:
        factories: dict[str, Callable[[], Subject]] = {
            f"executor, {DEFAULT_SPARES} spares": lambda: Executor(
                Path(scratch) / "spares", spares=DEFAULT_SPARES
            ),
            "executor, no spares": lambda: Executor(Path(scratch) / "nospares", spares=0),
            "multiprocessing forkserver": MultiprocessingForkserver,
            "fork + exit, nothing else": ForkFloor,
        }
        subjects = {name: make() for name, make in factories.items()}
        rows = [Row(name, threads) for name in subjects for threads in (1, 2)]
        try:
            for subject in subjects.values():  # warm-up, untimed
                subject.run(args.warmup, 2)
            for round_ in range(args.rounds):
                order = rows[round_ % len(rows) :] + rows[: round_ % len(rows)]
                for row in order:
                    slow = isinstance(subjects[row.name], MultiprocessingForkserver)
                    measure(subjects[row.name], row, args.jobs // 10 if slow else args.jobs)
                    print(
                        f"  round {round_ + 1}: {row.name}, {row.threads} thread(s): "
                        f"{row.rates[-1]:.0f} jobs/s",
                        file=sys.stderr,
                    )
        finally:
            for subject in subjects.values():
                subject.close()
    return {
        "jobs_per_round": args.jobs,
        "work_root": str(args.work_root or tempfile.gettempdir()),
        "rounds": args.rounds,
        "rows": [
            {
                "name": row.name,
                "threads": row.threads,
                "jobs_per_second": round(row.jobs_per_second, 1),
                "ms_per_job": round(1000 / row.jobs_per_second, 3),
                "cpu_ms_per_job": {part: round(row.cpu(part) or 0.0, 3) for part in row.cpu_ms},
                "rates": [round(rate, 1) for rate in row.rates],
            }
            for row in rows
        ],
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "kernel": platform.release(),
            "loadavg": os.getloadavg(),
        },
    }


def render(result: dict[str, Any]) -> str:
    lines = [
        f"{'row':<28} {'threads':>7} {'jobs/s':>8} {'ms/job':>7}  "
        f"{'CPU ms/job: caller':>18} {'server':>7} {'children':>8} {'total':>7}",
    ]
    for row in result["rows"]:
        cpu = row["cpu_ms_per_job"]
        lines.append(
            f"{row['name']:<28} {row['threads']:>7} {row['jobs_per_second']:>8.0f} "
            f"{row['ms_per_job']:>7.2f}  {cpu['caller']:>18.2f} {cpu['server']:>7.2f} "
            f"{cpu['children']:>8.2f} {sum(cpu.values()):>7.2f}"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000, help="jobs per row and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--json", type=Path, help="default bench/results/executor-<time>.json")
    parser.add_argument(
        "--work-root",
        type=Path,
        help="where the jobs' workdirs go (default: the system temp dir); e.g. /dev/shm",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    print(render(result))
    path = (
        args.json or ROOT / "bench" / "results" / f"executor-{time.strftime('%Y%m%d-%H%M%S')}.json"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
