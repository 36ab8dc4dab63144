"""Peer job queues with their own worker processes, as the peer notes ran them.

=========  ===================================================================
Celery     ``celery worker -P prefork -c 2 --without-gossip --without-mingle
           --without-heartbeat`` (Redis broker, results ignored)
RQ         2 x ``rq worker -w rq.worker.SimpleWorker``
Dramatiq   ``dramatiq --processes 2 --threads 8`` (Redis broker)
=========  ===================================================================

Each peer gets a Redis database of its own on the run's private redis-server. The
producer runs in the calling process and enqueues one job per call (``delay``,
``enqueue``, ``send``), as in the notes; the job records when it was enqueued and
when it started (:mod:`bench.peer_jobs`). The workers run in their own process
group, so stopping them stops their pool children too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import psutil
import redis

from bench import peer_jobs
from bench.drain import Drain, cpu_seconds, cpu_spent

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT = 60.0
DRAIN_TIMEOUT = 600.0


@dataclass(frozen=True)
class Record:
    enqueued: float
    started: float


class PeerWorkers:
    """One peer: its worker processes, a producer, and what its jobs recorded."""

    system: ClassVar[str]
    workers: ClassVar[str]  # how its workers run, for the table
    install: ClassVar[str]  # the module whose absence skips the peer

    def __init__(self, redis_url: str, directory: Path) -> None:
        self.redis_url = redis_url
        self.records = directory / "records"
        self.records.mkdir(parents=True, exist_ok=True)
        self.log_path = directory / "workers.log"
        self.processes: list[subprocess.Popen[bytes]] = []
        self.send: Callable[[float], None] = self._producer()

    # -- subclasses -------------------------------------------------------------

    def _producer(self) -> Callable[[float], None]:
        raise NotImplementedError

    def _commands(self) -> list[list[str]]:
        raise NotImplementedError

    # -- workers ------------------------------------------------------------------

    def start(self) -> None:
        env = {
            **os.environ,
            peer_jobs.REDIS_URL_ENV: self.redis_url,
            peer_jobs.RECORDS_ENV: str(self.records),
            "PYTHONPATH": str(ROOT),
        }
        with self.log_path.open("ab") as log:
            for command in self._commands():
                self.processes.append(
                    subprocess.Popen(
                        command,
                        cwd=ROOT,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=log,
                        start_new_session=True,
                    )
                )

    def warm_up(self, jobs: int = 50) -> None:
        """Send ``jobs`` and wait until every one has run: the workers are up."""
        before = self.count()
        for _ in range(jobs):
            self.send(time.time())
        self.wait_for(before + jobs, START_TIMEOUT)

    def stop(self) -> None:
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # the group: pool children too
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(5)
        self.processes.clear()

    def tree(self) -> list[psutil.Process]:
        """The worker processes and their children, alive now."""
        found: list[psutil.Process] = []
        for process in self.processes:
            try:
                parent = psutil.Process(process.pid)
                found.append(parent)
                found.extend(parent.children(recursive=True))
            except psutil.Error:
                continue
        return found

    # -- records ------------------------------------------------------------------

    def count(self) -> int:
        """Jobs recorded so far (every line is the same length)."""
        total = 0
        for path in self.records.iterdir():
            with contextlib.suppress(FileNotFoundError):
                total += path.stat().st_size // peer_jobs.LINE_BYTES
        return total

    def wait_for(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.count() < count:
            for process in self.processes:
                if process.poll() is not None:
                    tail = self.log_path.read_text(errors="replace")[-2000:]
                    raise RuntimeError(
                        f"{self.system} worker exited ({process.returncode}):\n{tail}"
                    )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{self.system}: {self.count()} of {count} jobs ran in {timeout:.0f} s "
                    f"(log: {self.log_path})"
                )
            time.sleep(0.02)

    def read(self, since: float) -> list[Record]:
        """Every job enqueued at or after ``since`` (epoch seconds)."""
        found = []
        for path in self.records.iterdir():
            for line in path.read_text().splitlines():
                enqueued, started = (float(x) for x in line.split())
                if enqueued >= since:
                    found.append(Record(enqueued, started))
        return found

    def close(self) -> None:
        self.stop()


class CeleryWorkers(PeerWorkers):
    system = "celery"
    workers = "prefork -c 2, no gossip/mingle/heartbeat"
    install = "celery"

    def _producer(self) -> Callable[[float], None]:
        self.app = peer_jobs.celery_app_for(self.redis_url)
        task = self.app.tasks["hm_bench.noop"]
        return lambda enqueued: task.delay(enqueued)

    def _commands(self) -> list[list[str]]:
        return [
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "bench.peer_jobs:celery_app",
                "worker",
                "-P",
                "prefork",
                "-c",
                "2",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-Q",
                peer_jobs.QUEUE,
                "--loglevel",
                "WARNING",
            ]
        ]

    def close(self) -> None:
        super().close()
        self.app.close()


class RqWorkers(PeerWorkers):
    system = "rq"
    workers = "2 x rq worker -w SimpleWorker"
    install = "rq"

    def _producer(self) -> Callable[[float], None]:
        import rq

        self.connection = redis.Redis.from_url(self.redis_url)
        queue = rq.Queue(peer_jobs.QUEUE, connection=self.connection)

        def send(enqueued: float) -> None:
            queue.enqueue(peer_jobs.rq_noop, enqueued)

        return send

    def _commands(self) -> list[list[str]]:
        command = [
            sys.executable,
            "-m",
            "rq.cli",
            "worker",
            "-w",
            "rq.worker.SimpleWorker",
            "--url",
            self.redis_url,
            "--logging_level",
            "WARNING",
            peer_jobs.QUEUE,
        ]
        return [command, command]

    def close(self) -> None:
        super().close()
        self.connection.close()


class DramatiqWorkers(PeerWorkers):
    system = "dramatiq"
    workers = "2 processes x 8 threads"
    install = "dramatiq"

    def _producer(self) -> Callable[[float], None]:
        self.actor: Any = peer_jobs.dramatiq_actor_for(self.redis_url)
        return lambda enqueued: self.actor.send(enqueued)

    def _commands(self) -> list[list[str]]:
        return [
            [
                sys.executable,
                "-m",
                "dramatiq",
                "bench.peer_jobs:dramatiq_broker",
                "--processes",
                "2",
                "--threads",
                "8",
                "--queues",
                peer_jobs.QUEUE,
            ]
        ]

    def close(self) -> None:
        super().close()
        self.actor.broker.close()


PEER_WORKERS: dict[str, type[PeerWorkers]] = {
    "dramatiq": DramatiqWorkers,
    "celery": CeleryWorkers,
    "rq": RqWorkers,
}


@contextlib.contextmanager
def running(peer: PeerWorkers) -> Iterator[PeerWorkers]:
    """The peer's workers up (and warm) for the block, stopped after it."""
    try:
        peer.start()
        peer.warm_up()
        yield peer
    finally:
        peer.stop()


def peer_drain(peer: PeerWorkers, n: int) -> Drain:
    base = peer.count()
    tree = peer.tree()
    before_workers = cpu_seconds(tree)
    before_producer = time.process_time()
    first = time.time()
    for _ in range(n):
        peer.send(time.time())
    last_enqueue = time.time()
    producer = time.process_time() - before_producer
    peer.wait_for(base + n, DRAIN_TIMEOUT)
    workers = cpu_spent(before_workers, tree)
    records = peer.read(first)
    if len(records) != n:
        raise RuntimeError(f"{peer.system}: {len(records)} of {n} drain jobs recorded")
    return Drain(
        jobs=n,
        first_enqueue=first,
        last_enqueue=last_enqueue,
        last_start=max(r.started for r in records),
        cpu_ms_per_job={
            "workers": round(workers * 1000 / n, 3),
            "producer": round(producer * 1000 / n, 3),
        },
    )


def peer_latency(peer: PeerWorkers, n: int, rate: float) -> list[float]:
    base = peer.count()
    first = time.time()
    began = time.monotonic()
    for i in range(n):
        delay = began + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        peer.send(time.time())
    peer.wait_for(base + n, DRAIN_TIMEOUT)
    records = peer.read(first)
    return [(r.started - r.enqueued) * 1000 for r in records]
