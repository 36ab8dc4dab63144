"""Throughput benchmark: no-op jobs through hypermedia's whole path beside peer job queues.

    python bench/throughput.py [--jobs N] [--quick] [--json PATH] [--peers a,b] [--modes ...]

One run, one machine, side by side (see bench/README.md):

* hypermedia: ``IngestService.submit_many`` (the job record in PostgreSQL, then Redis)
  -> pipeline actors made by the ``Supervisor`` on a real local Ray cluster (token
  auth) -> claim and start in the record -> the step (``test.noop``, which needs no
  input) -> completion committed in PostgreSQL; with the per-job child
  (``ChildExecutor``, as in production) and without it (the benchmark-only
  in-process executor);
* Dramatiq (2 processes x 8 threads), Celery (prefork -c 2) and RQ (2 SimpleWorkers),
  each with its own worker processes on a Redis broker.

Each system: a drain of ``--jobs`` jobs (first enqueue to last start, and for
hypermedia to last completion committed) with the producer running alongside, then
``--latency-jobs`` jobs sent one at a time at ``--rate`` jobs/s (submit -> start).
Everything the run creates (databases, redis-server, Ray head, worker processes) is
removed at the end, also on error, Ctrl-C or SIGTERM. Every flag has a
``HYPERMEDIA_BENCH_*`` environment twin.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    # Run as a script: make `bench` importable and keep bench/ itself off the path.
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from rich.console import Console
from rich.table import Table

from autoscaler.sim_report import percentile
from bench import harness
from bench.drain import Drain
from bench.harness import ScratchDatabases, redis_url, redis_version, start_redis
from bench.hm_workers import MODES, WARMUP_JOBS, Hypermedia
from bench.peer_workers import PEER_WORKERS, PeerWorkers, peer_drain, peer_latency, running

log = logging.getLogger("bench.throughput")

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
MODE_NAMES = {"in_process": "hypermedia, no child", "child": "hypermedia, child per job"}
TARGET_P50_MS, TARGET_P99_MS = 2.0, 5.0  # issue 18: durable, on the child path, at 50 jobs/s


def _env(name: str, default: str) -> str:
    return os.environ.get(f"HYPERMEDIA_BENCH_{name}", default)


def _work_dir_default() -> Path | None:
    value = _env("WORK_DIR", "/dev/shm" if Path("/dev/shm").is_dir() else "")
    return Path(value) if value else None


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="No-op jobs through hypermedia's whole path beside peer job queues."
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=int(_env("JOBS", "0")) or None,
        help="jobs per drain (default 20000; 2000 with --quick) [HYPERMEDIA_BENCH_JOBS]",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        default=_env("QUICK", "") not in ("", "0", "false"),
        help="2,000 jobs per drain, 200 latency jobs [HYPERMEDIA_BENCH_QUICK]",
    )
    parser.add_argument(
        "--latency-jobs",
        type=int,
        default=int(_env("LATENCY_JOBS", "0")) or None,
        help="jobs sent one at a time for latency (default 500; 200 with --quick) "
        "[HYPERMEDIA_BENCH_LATENCY_JOBS]",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=float(_env("RATE", "50")),
        help="jobs/s of the latency phase (default 50) [HYPERMEDIA_BENCH_RATE]",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=int(_env("ROUNDS", "3")),
        help="split each system's jobs over this many drains, the systems taking turns "
        "in a rotating order; a row's rate is the median of its drains' (default 3) "
        "[HYPERMEDIA_BENCH_ROUNDS]",
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=int(_env("BATCH", "500")),
        help="requests per submit_many call in the drain (default 500) [HYPERMEDIA_BENCH_BATCH]",
    )
    parser.add_argument(
        "--modes",
        default=_env("MODES", ",".join(MODES)),
        help="hypermedia modes: in_process (no child; benchmark only), child "
        "(default both) [HYPERMEDIA_BENCH_MODES]",
    )
    parser.add_argument(
        "--actors",
        type=int,
        default=int(_env("ACTORS", "1")),
        help="pipeline actors on the queue (default 1) [HYPERMEDIA_BENCH_ACTORS]",
    )
    parser.add_argument(
        "--loops",
        type=int,
        default=int(_env("LOOPS", "2")),
        help="claim loops per actor without the child (default 2) [HYPERMEDIA_BENCH_LOOPS]",
    )
    parser.add_argument(
        "--child-loops",
        type=int,
        default=int(_env("CHILD_LOOPS", "4")),
        help="claim loops per actor with the child (default 4) [HYPERMEDIA_BENCH_CHILD_LOOPS]",
    )
    parser.add_argument(
        "--prefetch",
        type=int,
        default=int(_env("PREFETCH", "64")),
        help="jobs one loop claims at once without the child (default 64) "
        "[HYPERMEDIA_BENCH_PREFETCH]",
    )
    parser.add_argument(
        "--child-prefetch",
        type=int,
        default=int(_env("CHILD_PREFETCH", "1")),
        help="jobs one loop claims at once with the child (default 1, as in production) "
        "[HYPERMEDIA_BENCH_CHILD_PREFETCH]",
    )
    parser.add_argument(
        "--peers",
        default=_env("PEERS", ",".join(PEER_WORKERS)),
        help=f"comma-separated peers, '' for none (default {','.join(PEER_WORKERS)}) "
        "[HYPERMEDIA_BENCH_PEERS]",
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=_work_dir_default(),
        help="where hypermedia's data dir (job workdirs) goes: a directory of the run "
        "under this one (default /dev/shm, a tmpfs, else the run's temp dir) "
        "[HYPERMEDIA_BENCH_WORK_DIR]",
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=Path(_env("JSON", "")) if _env("JSON", "") else None,
        help="where to write results (default bench/results/throughput-<timestamp>.json) "
        "[HYPERMEDIA_BENCH_JSON]",
    )
    parser.add_argument(
        "--postgres-url",
        default=_env("POSTGRES_URL", DEFAULT_ADMIN_URL),
        help="a database to connect to with CREATE DATABASE rights (default "
        f"{DEFAULT_ADMIN_URL}) [HYPERMEDIA_BENCH_POSTGRES_URL]",
    )
    args = parser.parse_args(argv)
    if args.jobs is None:
        args.jobs = 2000 if args.quick else 20000
    if args.latency_jobs is None:
        args.latency_jobs = 200 if args.quick else 500
    numbers = (args.jobs, args.latency_jobs, args.rounds, args.batch, args.actors)
    if min(*numbers, args.loops, args.child_loops, args.prefetch, args.child_prefetch) < 1:
        parser.error("counts must be positive")
    if args.rate <= 0:
        parser.error("--rate must be positive")
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if set(args.modes) - set(MODES):
        parser.error(f"unknown modes {sorted(set(args.modes) - set(MODES))}; known: {MODES}")
    args.peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    if set(args.peers) - set(PEER_WORKERS):
        parser.error(f"unknown peers {sorted(set(args.peers) - set(PEER_WORKERS))}")
    return args


# -- results ----------------------------------------------------------------------------


@dataclass
class Row:
    key: str  # hypermedia.in_process, hypermedia.child, dramatiq, celery, rq
    system: str
    workers: str
    durable: bool
    drains: list[Drain] = field(default_factory=list)
    start_ms: list[float] = field(default_factory=list)  # submit -> start, latency phase
    done_ms: list[float] = field(default_factory=list)  # submit -> completed (hypermedia)
    # Of submit -> start, the part after submit returned (hypermedia): the rest is the
    # submit's own transaction (durable: its commit waits for the WAL) and enqueue.
    queued_ms: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def drain_rate(self) -> float:
        """Jobs/s to the last start: median of the rounds."""
        return statistics.median(d.to_start for d in self.drains)

    @property
    def done_rate(self) -> float | None:
        rates = [r for r in (d.to_done for d in self.drains) if r is not None]
        return statistics.median(rates) if rates else None

    def latency(self, values: list[float], fraction: float) -> float | None:
        return percentile(sorted(values), fraction) if values else None

    def as_json(self) -> dict[str, Any]:
        def rounded(x: float | None, digits: int = 3) -> float | None:
            return None if x is None else round(x, digits)

        return {
            "key": self.key,
            "system": self.system,
            "workers": self.workers,
            "durable": self.durable,
            "drain_jobs_per_second": round(self.drain_rate, 1),
            "drain_to_completion_jobs_per_second": rounded(self.done_rate, 1),
            "rounds": [
                {
                    "jobs": d.jobs,
                    "to_start_jobs_per_second": round(d.to_start, 1),
                    "to_completion_jobs_per_second": rounded(d.to_done, 1),
                    "enqueue_jobs_per_second": round(d.enqueue_rate, 1),
                    "seconds_to_last_start": round(d.last_start - d.first_enqueue, 3),
                    "cpu_ms_per_job": d.cpu_ms_per_job,
                }
                for d in self.drains
            ],
            "latency_jobs": len(self.start_ms),
            "start_p50_ms": rounded(self.latency(self.start_ms, 0.5)),
            "start_p99_ms": rounded(self.latency(self.start_ms, 0.99)),
            "start_max_ms": rounded(max(self.start_ms) if self.start_ms else None),
            "after_submit_p50_ms": rounded(self.latency(self.queued_ms, 0.5)),
            "after_submit_p99_ms": rounded(self.latency(self.queued_ms, 0.99)),
            "done_p50_ms": rounded(self.latency(self.done_ms, 0.5)),
            "done_p99_ms": rounded(self.latency(self.done_ms, 0.99)),
            "note": self.note,
        }


def round_sizes(n: int, rounds: int) -> list[int]:
    """``n`` jobs split over ``rounds`` as evenly as whole jobs allow."""
    rounds = max(1, min(rounds, n))
    return [n // rounds + (1 if r < n % rounds else 0) for r in range(rounds)]


# -- the run --------------------------------------------------------------------------------


def run(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    meta: dict[str, Any] = {"loadavg_start": [round(x, 2) for x in os.getloadavg()]}
    rows: dict[str, Row] = {}
    checks: dict[str, Any] = {}
    with contextlib.ExitStack() as cleanup:
        tmp = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="hm-tput-")))
        databases = ScratchDatabases(args.postgres_url)
        cleanup.callback(databases.drop_all)
        server = start_redis(tmp / "redis", cleanup)
        meta.update(postgres=databases.server_version(), redis=redis_version(server.url))
        console.log(
            f"PostgreSQL {meta['postgres']}, private redis-server {meta['redis']}, "
            f"load average {meta['loadavg_start']}"
        )
        if meta["loadavg_start"][0] > 1.0:
            console.log("[yellow]the machine is busy: rates will be noisy; ratios less so")

        steps: list[tuple[str, Callable[[int, int], None]]] = []
        if args.modes:
            ours = Hypermedia(args, databases, redis_url(server, 0), tmp, cleanup)
            per_mode = args.jobs + args.rounds * WARMUP_JOBS + args.latency_jobs
            ours.seed(per_mode * len(args.modes))
            console.log(f"seeded {per_mode * len(args.modes):,} objects; starting a Ray head")
            ours.start_cluster()
            for mode in args.modes:
                loops = args.child_loops if mode == "child" else args.loops
                prefetch = args.child_prefetch if mode == "child" else args.prefetch
                rows[f"hypermedia.{mode}"] = Row(
                    f"hypermedia.{mode}",
                    MODE_NAMES[mode],
                    f"{args.actors} actor(s) x {loops} loops, prefetch {prefetch}",
                    durable=True,
                    note="benchmark-only in-process step" if mode == "in_process" else "",
                )
                steps.append((mode, _hypermedia_step(ours, mode, rows, args, console)))
        for index, name in enumerate(args.peers, start=1):
            peer = _make_peer(name, redis_url(server, index), tmp / name, console)
            if peer is None:
                continue
            cleanup.callback(peer.close)
            rows[name] = Row(name, name, peer.workers, durable=False)
            steps.append((name, _peer_step(peer, rows[name], args, console)))

        sizes = round_sizes(args.jobs, args.rounds)
        console.log(f"{args.jobs:,} jobs per system in drains of {sizes}; the order rotates")
        for r, size in enumerate(sizes):
            for _name, step in steps[r % len(steps) :] + steps[: r % len(steps)]:
                step(r, size)
        if args.modes:
            checks["hypermedia"] = ours.check()
        meta["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    return {"rows": list(rows.values()), "meta": meta, "checks": checks}


def _hypermedia_step(
    ours: Hypermedia,
    mode: str,
    rows: dict[str, Row],
    args: argparse.Namespace,
    console: Console,
) -> Callable[[int, int], None]:
    row = rows[f"hypermedia.{mode}"]

    def step(round_: int, jobs: int) -> None:
        with ours.actors(mode) as actors:
            ours.warm_up()
            drain = ours.drain(jobs, actors)
            row.drains.append(drain)
            console.log(
                f"round {round_ + 1} {row.system}: {drain.jobs:,} jobs, "
                f"{drain.to_start:,.0f} jobs/s to last start, "
                f"{drain.to_done or 0:,.0f} to last completion "
                f"(submit_many {drain.enqueue_rate:,.0f}/s); CPU ms/job {drain.cpu_ms_per_job}"
            )
            if round_ == min(args.rounds, args.jobs) - 1:
                start_ms, done_ms, queued_ms = ours.latency(args.latency_jobs, args.rate)
                row.start_ms, row.done_ms, row.queued_ms = start_ms, done_ms, queued_ms
                console.log(
                    f"{row.system} at {args.rate:g}/s: submit -> start p50 "
                    f"{row.latency(start_ms, 0.5):.2f} ms, p99 {row.latency(start_ms, 0.99):.2f} "
                    f"ms (after submit returned: p50 {row.latency(queued_ms, 0.5):.2f} ms); "
                    f"-> completed p50 {row.latency(done_ms, 0.5):.2f} ms"
                )

    return step


def _make_peer(name: str, url: str, directory: Path, console: Console) -> PeerWorkers | None:
    cls = PEER_WORKERS[name]
    try:
        return cls(url, directory)
    except ImportError as exc:
        console.log(f"[yellow]{name} skipped: {exc} (pip install -e '.[bench]')")
        return None


def _peer_step(
    peer: PeerWorkers, row: Row, args: argparse.Namespace, console: Console
) -> Callable[[int, int], None]:
    def step(round_: int, jobs: int) -> None:
        with running(peer):
            drain = peer_drain(peer, jobs)
            row.drains.append(drain)
            console.log(
                f"round {round_ + 1} {row.system}: {drain.jobs:,} jobs, "
                f"{drain.to_start:,.0f} jobs/s to last start "
                f"(enqueue {drain.enqueue_rate:,.0f}/s); CPU ms/job {drain.cpu_ms_per_job}"
            )
            if round_ == min(args.rounds, args.jobs) - 1:
                row.start_ms = peer_latency(peer, args.latency_jobs, args.rate)
                console.log(
                    f"{row.system} at {args.rate:g}/s: submit -> start p50 "
                    f"{row.latency(row.start_ms, 0.5):.2f} ms, "
                    f"p99 {row.latency(row.start_ms, 0.99):.2f} ms"
                )

    return step


# -- reporting -------------------------------------------------------------------------------


def ratios(rows: Sequence[Row]) -> list[dict[str, Any]]:
    by_key = {r.key: r for r in rows}
    found = []
    for mode in MODES:
        ours = by_key.get(f"hypermedia.{mode}")
        if ours is None:
            continue
        for peer in PEER_WORKERS:
            theirs = by_key.get(peer)
            if theirs is None:
                continue
            done = ours.done_rate
            found.append(
                {
                    "hypermedia": ours.key,
                    "peer": peer,
                    "drain_ratio": round(ours.drain_rate / theirs.drain_rate, 3),
                    "drain_to_completion_ratio": (
                        None if done is None else round(done / theirs.drain_rate, 3)
                    ),
                }
            )
    return found


def targets(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """The workers issue's targets, checked on this run's numbers."""
    by_key = {r.key: r for r in rows}
    found = []

    def add(what: str, value: float | None, goal: float | None, higher: bool) -> None:
        if value is None or goal is None:
            return
        met = value >= goal if higher else value <= goal
        found.append({"target": what, "value": round(value, 2), "goal": round(goal, 2), "met": met})

    no_child, child = by_key.get("hypermedia.in_process"), by_key.get("hypermedia.child")
    dramatiq, celery = by_key.get("dramatiq"), by_key.get("celery")
    for ours, peer, goal in ((no_child, dramatiq, "without child"), (child, celery, "with child")):
        if ours is None or peer is None:
            continue
        name = f"drain {goal} >= {peer.system}"
        add(f"{name} (to last start)", ours.drain_rate, peer.drain_rate, True)
        add(f"{name} (to last completion)", ours.done_rate, peer.drain_rate, True)
    for row in (no_child, child):
        if row and row.start_ms:
            p50, p99 = row.latency(row.start_ms, 0.5), row.latency(row.start_ms, 0.99)
            add(f"{row.system}: p50 submit->start (ms)", p50, TARGET_P50_MS, False)
            add(f"{row.system}: p99 submit->start (ms)", p99, TARGET_P99_MS, False)
    return found


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def render(console: Console, result: dict[str, Any]) -> None:
    rows: list[Row] = result["rows"]
    settings, meta = result["settings"], result["meta"]
    table = Table(
        title=f"throughput: {settings['jobs']:,} no-op jobs per system in {settings['rounds']} "
        f"drains; latency {settings['latency_jobs']} jobs at {settings['rate']:g}/s; "
        f"{os.cpu_count()} cores, load {meta['loadavg_start'][0]}->{meta['loadavg_end'][0]}"
    )
    for header in (
        "system",
        "workers",
        "durable",
        "drain jobs/s",
        "to completion",
        "start p50 ms",
        "start p99 ms",
        "done p50 ms",
        "CPU ms/job: workers",
        "PostgreSQL",
    ):
        table.add_column(header, justify="left" if header in ("system", "workers") else "right")

    def cpu(row: Row, part: str) -> float | None:
        values = [d.cpu_ms_per_job[part] for d in row.drains if part in d.cpu_ms_per_job]
        return statistics.median(values) if values else None

    for row in rows:
        table.add_row(
            row.system,
            row.workers,
            "yes" if row.durable else "no",
            f"{row.drain_rate:,.0f}",
            _fmt(row.done_rate, 0),
            _fmt(row.latency(row.start_ms, 0.5)),
            _fmt(row.latency(row.start_ms, 0.99)),
            _fmt(row.latency(row.done_ms, 0.5)),
            _fmt(cpu(row, "workers")),
            _fmt(cpu(row, "postgres")),
        )
    console.print(table)
    found = result["ratios"]
    if found:
        ratio_table = Table(title="hypermedia drain jobs/s ÷ peer drain jobs/s (same run)")
        ratio_table.add_column("hypermedia")
        peers = [p for p in PEER_WORKERS if any(r["peer"] == p for r in found)]
        for p in peers:
            ratio_table.add_column(f"÷ {p}", justify="right")
        for mode in MODES:
            cells = {r["peer"]: r for r in found if r["hypermedia"] == f"hypermedia.{mode}"}
            if not cells:
                continue
            ratio_table.add_row(
                MODE_NAMES[mode],
                *[
                    f"{cells[p]['drain_ratio']:.2f} ({_fmt(cells[p]['drain_to_completion_ratio'])})"
                    if p in cells
                    else "-"
                    for p in peers
                ],
            )
        console.print(ratio_table)
        console.print(
            "(in brackets: hypermedia's rate to its last completion committed; the peers "
            "keep no completion record)"
        )
    goal_table = Table(title="targets")
    for header in ("target", "this run", "goal", "met"):
        goal_table.add_column(header)
    for goal in result["targets"]:
        goal_table.add_row(
            goal["target"],
            f"{goal['value']:,}",
            f"{goal['goal']:,}",
            "yes" if goal["met"] else "NO",
        )
    console.print(goal_table)


def metadata(result: dict[str, Any]) -> dict[str, Any]:
    return harness.run_metadata(
        result["meta"],
        ("ray", "sqlalchemy", "psycopg", "redis", "rq", "dramatiq", "celery"),
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # SIGTERM unwinds like Ctrl-C, so every database, server and worker is cleaned up.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    console = Console()
    if not console.is_terminal:
        console = Console(width=180)
    started = time.monotonic()
    result = run(args, console)
    result["settings"] = {
        "jobs": args.jobs,
        "latency_jobs": args.latency_jobs,
        "rate": args.rate,
        "rounds": args.rounds,
        "batch": args.batch,
        "modes": args.modes,
        "actors": args.actors,
        "loops": args.loops,
        "child_loops": args.child_loops,
        "prefetch": args.prefetch,
        "child_prefetch": args.child_prefetch,
        "peers": args.peers,
        "work_dir": str(args.work_dir) if args.work_dir else None,
    }
    result["ratios"] = ratios(result["rows"])
    result["targets"] = targets(result["rows"])
    render(console, result)
    document = {
        "meta": metadata(result),
        "settings": result["settings"],
        "rows": [r.as_json() for r in result["rows"]],
        "ratios": result["ratios"],
        "targets": result["targets"],
        "checks": result["checks"],
    }
    document["meta"]["wall_seconds"] = round(time.monotonic() - started, 1)
    path = args.json or ROOT / "bench" / "results" / (
        f"throughput-{time.strftime('%Y%m%d-%H%M%S')}.json"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
    console.print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
