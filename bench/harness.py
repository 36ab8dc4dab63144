"""Timing loops, result rows and the throwaway services a benchmark run owns.

Everything a run creates is registered on one :class:`contextlib.ExitStack`
as soon as it exists, so an error (or Ctrl-C / SIGTERM) part-way through still
drops the databases and stops the servers it started.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import os
import platform
import secrets
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import redis
from psycopg import sql
from sqlalchemy import make_url

from autoscaler.sim_report import percentile
from hypermedia.embedded import EmbeddedRedis

log = logging.getLogger(__name__)


# -- results --------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """One timed stretch of one row: ``jobs`` done in ``seconds``."""

    jobs: int
    seconds: float
    latencies_ms: list[float] = field(default_factory=list, repr=False)

    @property
    def jobs_per_second(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else float("nan")


@dataclass
class Row:
    """One measured line, made of one sample per round (warm-up excluded).

    Its rate is the median of the rounds' rates, so one round disturbed by
    another process on the machine does not move it; latencies are pooled.
    """

    key: str  # e.g. "hypermedia.submit_many"; ratios refer to rows by key
    system: str
    action: str
    durable: bool  # a per-job record that survives a restart of the queue
    per: str = "call"  # what one latency sample is: a call, a batch, a request
    note: str = ""
    samples: list[Sample] = field(default_factory=list, repr=False)

    @property
    def jobs(self) -> int:
        return sum(s.jobs for s in self.samples)

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.samples)

    @property
    def jobs_per_second(self) -> float:
        rates = [s.jobs_per_second for s in self.samples if s.seconds > 0]
        return statistics.median(rates) if rates else float("nan")

    @property
    def latencies_ms(self) -> list[float]:
        return sorted(x for s in self.samples for x in s.latencies_ms)

    def latency(self, fraction: float) -> float | None:
        lat = self.latencies_ms
        return percentile(lat, fraction) if lat else None

    def as_json(self) -> dict[str, Any]:
        lat = self.latencies_ms
        return {
            "key": self.key,
            "system": self.system,
            "action": self.action,
            "durable": self.durable,
            "jobs": self.jobs,
            "seconds": round(self.seconds, 4),
            "jobs_per_second": round(self.jobs_per_second, 1),
            "rounds_jobs_per_second": [round(s.jobs_per_second, 1) for s in self.samples],
            "latency_per": self.per if lat else None,
            "p50_ms": round(percentile(lat, 0.50), 3) if lat else None,
            "p99_ms": round(percentile(lat, 0.99), 3) if lat else None,
            "mean_ms": round(statistics.fmean(lat), 3) if lat else None,
            "max_ms": round(lat[-1], 3) if lat else None,
            "note": self.note,
        }


@dataclass
class Skipped:
    """A row that could not be measured in this run, and why."""

    key: str
    system: str
    action: str
    reason: str


# -- timing loops ---------------------------------------------------------------------


def time_calls(call: Callable[[int], object], n: int, warmup: int) -> Sample:
    """Call ``call(i)`` ``warmup`` times untimed (negative ``i``), then ``n`` times
    timed one by one (``i`` from 0)."""
    for i in range(warmup):
        call(-1 - i)
    latencies: list[float] = []
    clock = time.perf_counter
    started = clock()
    for i in range(n):
        t0 = clock()
        call(i)
        latencies.append((clock() - t0) * 1000.0)
    return Sample(n, clock() - started, latencies)


def time_batches(
    call: Callable[[range], object], n: int, batch: int, warmup_batches: int = 1
) -> Sample:
    """Like :func:`time_calls` for batch APIs: ``call(range_of_indexes)`` per batch."""
    for w in range(warmup_batches):
        call(range(-batch * (w + 1), -batch * w))
    latencies: list[float] = []
    clock = time.perf_counter
    started = clock()
    for lo in range(0, n, batch):
        t0 = clock()
        call(range(lo, min(lo + batch, n)))
        latencies.append((clock() - t0) * 1000.0)
    return Sample(n, clock() - started, latencies)


# -- services the run owns ------------------------------------------------------------


def unique_name(stem: str) -> str:
    return f"{stem}_{secrets.token_hex(4)}"


class ScratchDatabases:
    """Databases created on a PostgreSQL server for this run and dropped after it.

    ``admin_url`` is any URL of a database we may connect to with the right to
    CREATE DATABASE (``postgresql://postgres@127.0.0.1:5432/postgres``).
    """

    def __init__(self, admin_url: str) -> None:
        self.admin_url = make_url(admin_url).set(drivername="postgresql")
        self.created: list[str] = []

    def _admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(
            self._conninfo(self.admin_url.database or "postgres"), autocommit=True
        )

    def _conninfo(self, database: str) -> str:
        return self.admin_url.set(database=database).render_as_string(hide_password=False)

    def create(self, name: str) -> str:
        """Create ``name``; returns its libpq URL (``postgresql://...``)."""
        with self._admin() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        self.created.append(name)
        return self._conninfo(name)

    def server_version(self) -> str:
        with self._admin() as conn:
            row = conn.execute("SHOW server_version").fetchone()
        return str(row[0]) if row else "?"

    def drop_all(self) -> None:
        with self._admin() as conn:
            while self.created:
                name = self.created.pop()
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )
                log.info("dropped database %s", name)


def sqlalchemy_url(libpq_url: str) -> str:
    return (
        make_url(libpq_url)
        .set(drivername="postgresql+psycopg")
        .render_as_string(hide_password=False)
    )


def start_redis(directory: Path, stack: contextlib.ExitStack) -> EmbeddedRedis:
    """A private redis-server for every Redis user in the run (ours and the peers').

    Configured like the peer notes' servers (AOF, fsync every second) so their
    numbers and ours are comparable; nothing else uses it, so no key can clash.
    """
    server = EmbeddedRedis(directory)
    stack.callback(server.stop)
    server.start()
    client = redis.Redis.from_url(server.url)
    try:
        client.config_set("appendonly", "yes")
        client.config_set("appendfsync", "everysec")
    finally:
        client.close()
    return server


def redis_url(server: EmbeddedRedis, db: int) -> str:
    return server.url.rsplit("/", 1)[0] + f"/{db}"


def redis_version(url: str) -> str:
    client = redis.Redis.from_url(url)
    try:
        return str(client.info("server")["redis_version"])
    finally:
        client.close()


REPO = Path(__file__).resolve().parent.parent


def run_metadata(meta: dict[str, Any], packages: Sequence[str]) -> dict[str, Any]:
    """When, where and with what a benchmark ran: the head of every JSON report."""
    versions = {}
    for name in packages:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[name] = importlib.metadata.version(name)
    return {
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "git": git_describe(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cores": os.cpu_count(),
        "packages": versions,
        **meta,
    }


def git_describe() -> str:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{commit}{'-dirty' if dirty else ''}"
