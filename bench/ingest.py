"""Ingest benchmark: hypermedia's submit paths and worker loop beside peer job queues.

    python bench/ingest.py [--jobs N] [--json PATH] [--quick] [--peers a,b] [--profile DIR]

One run, one machine, side by side (see bench/README.md for what each row means):

* hypermedia library ``submit_many`` (batched) and ``submit`` (one per call), each
  job durably recorded in PostgreSQL and pushed to Redis before the call returns;
* hypermedia HTTP ``POST /v1/hypermedia/process`` through a uvicorn subprocess;
* hypermedia ``Dispatcher`` claim -> start -> complete with a no-op handler;
* Procrastinate (durable, PostgreSQL), RQ, Dramatiq and Celery (Redis) enqueue,
  and the in-process worker drain of those that have a cheap one.

The run creates its own PostgreSQL databases and a private redis-server and
removes them at the end, also on error or Ctrl-C. Every flag has a
``HYPERMEDIA_BENCH_*`` environment twin.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    # Run as a script: make `bench` importable and keep bench/ itself off the path.
    _root = str(Path(__file__).resolve().parent.parent)
    sys.path[0] = _root

from rich.console import Console
from rich.table import Table

from autoscaler.sim_report import percentile
from bench import harness, hm
from bench.harness import (
    Row,
    Sample,
    ScratchDatabases,
    Skipped,
    redis_url,
    redis_version,
    sqlalchemy_url,
    start_redis,
    time_batches,
    time_calls,
    unique_name,
)
from bench.peers import INSTALL_HINT, PEERS, timed_drain
from hypermedia.config import Settings, load_settings

log = logging.getLogger("bench.ingest")

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"

# hypermedia row -> the peer row it is compared with. Batched hypermedia rows meet
# the peer's batch API where it has one, else its one-by-one enqueue (marked).
COMPARE: dict[str, dict[str, str]] = {
    "hypermedia.submit_many": {
        "procrastinate": "procrastinate.batch",
        "rq": "rq.batch",
        "dramatiq": "dramatiq.one",
        "celery": "celery.one",
    },
    "hypermedia.submit": {p: f"{p}.one" for p in PEERS},
    "hypermedia.http": {p: f"{p}.one" for p in PEERS},
    "hypermedia.drain": {p: f"{p}.drain" for p in PEERS},
}


def _env(name: str, default: str) -> str:
    return os.environ.get(f"HYPERMEDIA_BENCH_{name}", default)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="hypermedia ingest benchmark with peer job queues, side by side."
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=int(_env("JOBS", "0")) or None,
        help="jobs per row (default 5000; 1000 with --quick) [HYPERMEDIA_BENCH_JOBS]",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        default=_env("QUICK", "") not in ("", "0", "false"),
        help="about 1,000 jobs per row [HYPERMEDIA_BENCH_QUICK]",
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=Path(_env("JSON", "")) if _env("JSON", "") else None,
        help="where to write results (default bench/results/ingest-<timestamp>.json) "
        "[HYPERMEDIA_BENCH_JSON]",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=int(_env("ROUNDS", "3")),
        help="split each row's jobs over this many rounds, systems interleaved; a row's "
        "rate is the median of its rounds' (default 3) [HYPERMEDIA_BENCH_ROUNDS]",
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=int(_env("BATCH", "500")),
        help="requests per submit_many / batch_defer call (default 500) [HYPERMEDIA_BENCH_BATCH]",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=int(_env("THREADS", "2")),
        help="dispatcher loops for the drain row (default 2) [HYPERMEDIA_BENCH_THREADS]",
    )
    parser.add_argument(
        "--claim-count",
        type=int,
        default=int(_env("CLAIM_COUNT", "10")),
        help="jobs per dispatcher.claim (default 10) [HYPERMEDIA_BENCH_CLAIM_COUNT]",
    )
    parser.add_argument(
        "--peers",
        default=_env("PEERS", ",".join(PEERS)),
        help=f"comma-separated peers, '' for none (default {','.join(PEERS)}) "
        "[HYPERMEDIA_BENCH_PEERS]",
    )
    parser.add_argument(
        "--no-drain",
        action="store_true",
        default=_env("NO_DRAIN", "") not in ("", "0", "false"),
        help="skip the peers' worker drain rows [HYPERMEDIA_BENCH_NO_DRAIN]",
    )
    parser.add_argument(
        "--postgres-url",
        default=_env("POSTGRES_URL", DEFAULT_ADMIN_URL),
        help="a database to connect to with CREATE DATABASE rights (default "
        f"{DEFAULT_ADMIN_URL}) [HYPERMEDIA_BENCH_POSTGRES_URL]",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=Path(_env("PROFILE", "")) if _env("PROFILE", "") else None,
        help="after the timed rows, profile extra library submit/drain passes with "
        "pyinstrument and write text reports to this directory [HYPERMEDIA_BENCH_PROFILE]",
    )
    args = parser.parse_args(argv)
    if args.jobs is None:
        args.jobs = 1000 if args.quick else 5000
    if min(args.jobs, args.rounds, args.batch, args.threads, args.claim_count) < 1:
        parser.error("--jobs, --rounds, --batch, --threads and --claim-count must be positive")
    args.peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = sorted(set(args.peers) - set(PEERS))
    if unknown:
        parser.error(f"unknown peers {unknown}; known: {sorted(PEERS)}")
    return args


# -- the run -------------------------------------------------------------------------------


@dataclass
class Measure:
    """A row and how to take one round's sample of it (``n`` jobs)."""

    row: Row
    take: Callable[[int], Sample]
    warm: int = 0  # objects a round uses beyond its n jobs (hypermedia submit rows)


def round_sizes(n: int, rounds: int) -> list[int]:
    """``n`` jobs split over ``rounds`` as evenly as whole jobs allow."""
    rounds = max(1, min(rounds, n))
    return [n // rounds + (1 if r < n % rounds else 0) for r in range(rounds)]


def run(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    n, batch = args.jobs, args.batch
    sizes = round_sizes(n, args.rounds)
    warmup = max(10, min(100, sizes[0] // 20))
    skipped: list[Skipped] = []
    meta: dict[str, Any] = {"loadavg_start": [round(x, 2) for x in os.getloadavg()]}
    checks: dict[str, Any] = {}
    groups: list[list[Measure]] = []

    with contextlib.ExitStack() as cleanup:
        tmp = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="hm-bench-")))
        databases = ScratchDatabases(args.postgres_url)
        cleanup.callback(databases.drop_all)
        hm_db = databases.create(unique_name("hm_bench"))
        server = start_redis(tmp / "redis", cleanup)
        meta.update(postgres=databases.server_version(), redis=redis_version(server.url))
        console.log(
            f"PostgreSQL {meta['postgres']}, private redis-server {meta['redis']}, "
            f"load average {meta['loadavg_start']}"
        )
        if meta["loadavg_start"][0] > 1.0:
            console.log("[yellow]the machine is busy: rates will be noisy; ratios less so")

        settings = load_settings(
            database_url=sqlalchemy_url(hm_db),
            redis_url=redis_url(server, 0),
            redis_prefix="hmbench",
            data_dir=tmp / "data",
        )
        ours = _hypermedia_measures(args, settings, cleanup, tmp, warmup, skipped)
        subject: hm.Subject = ours[0]
        groups.append(ours[1])
        objects = sum(len(sizes) * m.warm + n for m in ours[1] if m.warm)
        if args.profile:
            objects += 2 * n + batch + warmup
        subject.object_ids = hm.seed_objects(subject.stack, subject.caller, ours[2], objects)
        console.log(f"seeded {objects} objects for the submit rows")

        if args.peers:
            peer_db = databases.create(unique_name("hm_bench_procrastinate"))
            for index, name in enumerate(args.peers, start=1):
                measures = _peer_measures(
                    name, peer_db, redis_url(server, index), batch, warmup, args, cleanup, skipped
                )
                if measures:
                    groups.append(measures)

        console.log(
            f"{n} jobs per row in {len(sizes)} rounds of {sizes[0]}; groups rotate each round"
        )
        for r, size in enumerate(sizes):
            for group in groups[r % len(groups) :] + groups[: r % len(groups)]:
                for measure in group:
                    sample = measure.take(size)
                    measure.row.samples.append(sample)
                    _report(console, r, measure.row, sample)
        checks["hypermedia"] = hm.check_record(subject)

        if args.profile:
            meta["profiles"] = _profile(subject, args, warmup)
            console.log(f"profiles written to {args.profile}")
        meta["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]

    return {
        "rows": [m.row for g in groups for m in g],
        "skipped": skipped,
        "meta": meta,
        "checks": checks,
        "settings": {
            "jobs": n,
            "rounds": len(sizes),
            "batch": batch,
            "warmup": warmup,
            "threads": args.threads,
            "claim_count": args.claim_count,
            "peers": args.peers,
            "peer_drain": not args.no_drain,
        },
    }


def _hypermedia_measures(
    args: argparse.Namespace,
    settings: Settings,
    cleanup: contextlib.ExitStack,
    tmp: Path,
    warmup: int,
    skipped: list[Skipped],
) -> tuple[hm.Subject, list[Measure], str]:
    subject, pool_id = hm.open_subject(settings)
    cleanup.callback(subject.stack.close)
    batch = args.batch
    measures = [
        Measure(
            Row(
                "hypermedia.submit_many",
                "hypermedia",
                f"library submit_many, {batch}/call",
                durable=True,
                per=f"call of {batch}",
            ),
            lambda k: hm.submit_many(subject, k, batch),
            warm=batch,
        ),
        Measure(
            Row("hypermedia.submit", "hypermedia", "library submit, 1/call", durable=True),
            lambda k: hm.submit(subject, k, warmup),
            warm=warmup,
        ),
    ]
    api_missing = _api_missing()
    if api_missing:
        skipped.append(Skipped("hypermedia.http", "hypermedia", "HTTP POST /process", api_missing))
    else:
        base_url = cleanup.enter_context(hm.api_server(settings, tmp / "api-server.log"))
        client = hm.HttpSubmitter(subject, base_url)
        cleanup.callback(client.close)
        measures.append(
            Measure(
                Row(
                    "hypermedia.http",
                    "hypermedia",
                    "HTTP POST /v1/hypermedia/process, 1/request",
                    durable=True,
                    per="request",
                    note="uvicorn subprocess, httpx keep-alive client, sequential",
                ),
                lambda k: client.submit(k, warmup),
                warm=warmup,
            )
        )
    measures.append(
        Measure(
            Row(
                "hypermedia.drain",
                "hypermedia",
                f"dispatcher claim({args.claim_count})->start->complete, {args.threads} threads",
                durable=True,
                note="no-op handler, in-process",
            ),
            lambda k: hm.drain(subject, k, args.threads, args.claim_count),
        )
    )
    return subject, measures, pool_id


def _api_missing() -> str:
    """Why the HTTP row cannot run ('' if it can)."""
    try:
        from hypermedia.ingest import api
    except ImportError as exc:
        return f"hypermedia.ingest.api cannot be imported: {exc}"
    if not callable(getattr(api, "create_app", None)):
        return "hypermedia.ingest.api has no create_app"
    return ""


def _peer_measures(
    name: str,
    database_url: str,
    peer_redis_url: str,
    batch: int,
    warmup: int,
    args: argparse.Namespace,
    cleanup: contextlib.ExitStack,
    skipped: list[Skipped],
) -> list[Measure]:
    try:
        peer = PEERS[name](database_url if name == "procrastinate" else peer_redis_url)
    except ImportError as exc:
        reason = f"{exc.name or exc} not installed ({INSTALL_HINT})"
        skipped.append(Skipped(f"{name}.one", name, "enqueue", reason))
        return []
    cleanup.callback(peer.close)

    def row(kind: str, action: str, per: str = "call", note: str = "") -> Row:
        return Row(f"{name}.{kind}", name, action, durable=peer.durable, per=per, note=note)

    measures = [Measure(row("one", peer.one_action), lambda k: time_calls(peer.one, k, warmup))]
    if peer.batch_action:
        measures.append(
            Measure(
                row("batch", peer.batch_action.format(batch=batch), per=f"call of {batch}"),
                lambda k: time_batches(peer.batch, k, batch),
            )
        )
    if peer.drain_action and not args.no_drain:
        measures.append(
            Measure(
                row("drain", peer.drain_action, note="no-op task; includes warm-up jobs"),
                lambda _k: timed_drain(peer),
            )
        )
    return measures


def _profile(subject: hm.Subject, args: argparse.Namespace, warmup: int) -> dict[str, str]:
    """Untimed extra passes under pyinstrument; text reports in ``args.profile``."""
    from pyinstrument import Profiler

    out: Path = args.profile
    out.mkdir(parents=True, exist_ok=True)
    n = args.jobs
    passes: dict[str, Callable[[], object]] = {
        "submit_many": lambda: hm.submit_many(subject, n, args.batch),
        "submit": lambda: hm.submit(subject, n, warmup),
        "drain": lambda: hm.drain(subject, 2 * n, 0, args.claim_count),
    }
    written: dict[str, str] = {}
    for name, work in passes.items():
        profiler = Profiler(async_mode="disabled")
        with profiler:
            work()
        path = out / f"ingest-{name}.txt"
        path.write_text(profiler.output_text(unicode=False, color=False, show_all=False))
        written[name] = str(path)
    return written


# -- reporting -------------------------------------------------------------------------------


def ratios(rows: Sequence[Row], peers: Sequence[str]) -> list[dict[str, Any]]:
    by_key = {r.key: r for r in rows}
    found = []
    for ours, against in COMPARE.items():
        if ours not in by_key:
            continue
        for peer in peers:
            theirs = by_key.get(against.get(peer, ""))
            if theirs is None or not theirs.jobs_per_second > 0:
                continue
            found.append(
                {
                    "hypermedia": ours,
                    "peer": theirs.key,
                    "ratio": round(by_key[ours].jobs_per_second / theirs.jobs_per_second, 3),
                    "like_for_like": not (
                        ours == "hypermedia.submit_many" and theirs.key.endswith(".one")
                    ),
                }
            )
    return found


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _report(console: Console, round_: int, row: Row, sample: Sample) -> None:
    latency = ""
    if sample.latencies_ms:
        lat = sorted(sample.latencies_ms)
        latency = f", p50 {percentile(lat, 0.5):.2f} ms, p99 {percentile(lat, 0.99):.2f} ms"
    console.log(
        f"round {round_ + 1} {row.key}: {sample.jobs:,} jobs, "
        f"{sample.jobs_per_second:,.0f} jobs/s{latency}"
    )


def render(console: Console, result: dict[str, Any]) -> None:
    rows: list[Row] = result["rows"]
    settings = result["settings"]
    meta = result["meta"]
    table = Table(
        title=f"ingest: {settings['jobs']:,} jobs per row in {settings['rounds']} rounds; "
        f"PostgreSQL {meta.get('postgres')}, Redis {meta.get('redis')}, {os.cpu_count()} cores"
    )
    for header, justify in (
        ("system", "left"),
        ("what", "left"),
        ("durable", "center"),
        ("jobs", "right"),
        ("jobs/s", "right"),
        ("p50 ms", "right"),
        ("p99 ms", "right"),
        ("latency of", "left"),
    ):
        table.add_column(header, justify=justify)  # type: ignore[arg-type]
    for row in rows:
        table.add_row(
            row.system,
            row.action,
            "yes" if row.durable else "no",
            f"{row.jobs:,}",
            f"{row.jobs_per_second:,.0f}",
            _fmt(row.latency(0.5)),
            _fmt(row.latency(0.99)),
            row.per if row.latencies_ms else "",
        )
    for s in result["skipped"]:
        table.add_row(s.system, s.action, "", "", "skipped", "", "", s.reason)
    console.print(table)

    found = result["ratios"]
    peers = [p for p in settings["peers"] if any(r["peer"].startswith(f"{p}.") for r in found)]
    if not found:
        return
    ratio_table = Table(title="hypermedia jobs/s ÷ peer jobs/s (same run)")
    ratio_table.add_column("hypermedia row")
    for p in peers:
        ratio_table.add_column(f"÷ {p}", justify="right")
    by_pair = {(r["hypermedia"], r["peer"].split(".")[0]): r for r in found}
    for ours in COMPARE:
        if not any(key == ours for key, _ in by_pair):
            continue
        cells = []
        for p in peers:
            r = by_pair.get((ours, p))
            if r is None:
                cells.append("-")
            else:
                mark = "" if r["like_for_like"] else " †"
                cells.append(f"{r['ratio']:.2f}{mark}")
        ratio_table.add_row(ours.removeprefix("hypermedia."), *cells)
    console.print(ratio_table)
    console.print(
        "† the peer has no batch enqueue: compared with its one-by-one enqueue.\n"
        "submit/http rows are compared with each peer's one-by-one enqueue; drain with "
        "its in-process worker."
    )


def metadata(result: dict[str, Any]) -> dict[str, Any]:
    return harness.run_metadata(
        result["meta"],
        (
            "sqlalchemy",
            "psycopg",
            "redis",
            "fastapi",
            "uvicorn",
            "httpx",
            "procrastinate",
            "rq",
            "dramatiq",
            "celery",
        ),
    )


def as_json(result: dict[str, Any]) -> dict[str, Any]:
    return {
        "meta": metadata(result),
        "settings": result["settings"],
        "rows": [r.as_json() for r in result["rows"]],
        "skipped": [vars(s) for s in result["skipped"]],
        "ratios": result["ratios"],
        "checks": result["checks"],
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # SIGTERM unwinds like Ctrl-C, so every database and server is cleaned up.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # a log file or pipe: keep table rows on one line
    started = time.monotonic()
    result = run(args, console)
    result["ratios"] = ratios(result["rows"], args.peers)
    render(console, result)
    document = as_json(result)
    document["meta"]["wall_seconds"] = round(time.monotonic() - started, 1)
    path = args.json or ROOT / "bench" / "results" / f"ingest-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
    console.print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
