"""Peer job queues measured in the same run: Procrastinate, RQ, Dramatiq, Celery.

Each peer is driven the way its documentation shows for a producer, with its
defaults, and a no-op task taking one integer. Only Procrastinate keeps a
durable per-job record (a committed PostgreSQL row per job), like hypermedia;
the Redis queues keep a job only until it runs.

Peers are imported lazily: a missing one is reported as a skipped row with the
install hint (``pip install -e '.[bench]'``), not a crash.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, ClassVar

import psycopg
from sqlalchemy import make_url

from bench.harness import Sample

log = logging.getLogger(__name__)

QUEUE = "hm_bench"
INSTALL_HINT = "pip install -e '.[bench]'"


def noop(i: int) -> None:
    """The job every Redis peer runs."""


async def noop_async(i: int) -> None:
    """Procrastinate's job: async, so its worker runs it without a thread hop."""


class Peer:
    """A producer (and, where cheap to run in-process, a worker) of one peer queue."""

    system: ClassVar[str]
    durable: ClassVar[bool] = False
    one_action: ClassVar[str]
    batch_action: ClassVar[str | None] = None
    drain_action: ClassVar[str | None] = None
    drained_in: float | None = None  # set by a drain() whose tail is not draining

    def one(self, i: int) -> None:
        raise NotImplementedError

    def batch(self, indexes: range) -> None:
        raise NotImplementedError

    def drain(self) -> int:
        """Run every job enqueued so far; answers how many ran."""
        raise NotImplementedError

    def close(self) -> None:
        """Release connections (the servers themselves belong to the run)."""


class ProcrastinatePeer(Peer):
    system = "procrastinate"
    durable = True
    one_action = "task.defer(), 1/call"
    batch_action = "task.batch_defer(), {batch}/call"
    drain_action = "1 in-process worker, concurrency 10"

    def __init__(self, database_url: str) -> None:
        import procrastinate

        self.conninfo = (
            make_url(database_url)
            .set(drivername="postgresql")
            .render_as_string(hide_password=False)
        )
        self.app = procrastinate.App(
            connector=procrastinate.PsycopgConnector(conninfo=self.conninfo)
        )
        self.task = self.app.task(name="bench_noop", queue=QUEUE)(noop_async)
        self.app.open()
        self.app.schema_manager.apply_schema()
        self.succeeded = 0

    def one(self, i: int) -> None:
        self.task.defer(i=i)

    def batch(self, indexes: range) -> None:
        kwargs: list[dict[str, Any]] = [{"i": i} for i in indexes]
        self.task.batch_defer(*kwargs)

    def drain(self) -> int:
        self.app.run_worker(
            queues=[QUEUE], wait=False, concurrency=10, install_signal_handlers=False
        )
        # run_worker closes the app's connector on its way out; the next round defers again.
        self.app.open()
        with psycopg.connect(self.conninfo) as conn:
            row = conn.execute(
                "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
            ).fetchone()
        succeeded = int(row[0]) if row else 0
        ran, self.succeeded = succeeded - self.succeeded, succeeded
        return ran

    def close(self) -> None:
        # Interrupted inside run_worker, the connector is the async one and cannot be
        # closed synchronously; its pool went away with run_worker's event loop.
        with contextlib.suppress(NotImplementedError):
            self.app.close()


class RqPeer(Peer):
    system = "rq"
    one_action = "queue.enqueue(), 1/call"
    batch_action = "queue.enqueue_many(), {batch}/call"
    drain_action = "1 in-process SimpleWorker, burst"

    def __init__(self, redis_url: str) -> None:
        import redis
        import rq

        self.connection = redis.Redis.from_url(redis_url)
        self.queue = rq.Queue(QUEUE, connection=self.connection)

    def one(self, i: int) -> None:
        self.queue.enqueue(noop, i)

    def batch(self, indexes: range) -> None:
        import rq

        self.queue.enqueue_many([rq.Queue.prepare_data(noop, args=(i,)) for i in indexes])

    def drain(self) -> int:
        import rq

        class Worker(rq.SimpleWorker):  # type: ignore[misc,unused-ignore]
            def _install_signal_handlers(self) -> None:
                """Keep the run's own SIGINT/SIGTERM handling (it cleans up)."""

        before = len(self.queue.finished_job_registry)
        worker = Worker([self.queue], connection=self.connection)
        worker.work(burst=True, logging_level="WARNING")
        # The worker's own successful_job_count is not kept after a burst.
        return len(self.queue.finished_job_registry) - before

    def close(self) -> None:
        self.connection.close()


class DramatiqPeer(Peer):
    system = "dramatiq"
    one_action = "actor.send(), 1/call"
    drain_action = "1 in-process Worker, 8 threads"

    def __init__(self, redis_url: str) -> None:
        self.redis_url = redis_url
        self.broker, self.actor = self._declare()
        self.sent = 0

    def _declare(self) -> tuple[Any, Any]:
        """A broker with our actor declared on it (no global broker is set)."""
        import dramatiq
        from dramatiq.brokers.redis import RedisBroker

        # Untyped where dramatiq is installed, Any where it is not.
        broker = RedisBroker(url=self.redis_url)  # type: ignore[no-untyped-call,unused-ignore]
        actor = dramatiq.actor(broker=broker, queue_name=QUEUE, actor_name="noop")(noop)
        return broker, actor

    def one(self, i: int) -> None:
        self.actor.send(i)
        self.sent += 1

    def drain(self) -> int:
        import dramatiq

        # A broker and worker of its own per drain: a Worker cannot be reused after
        # stop(), its pause()/resume() can hang, and each one adds middleware to its broker.
        broker, _actor = self._declare()
        worker = dramatiq.Worker(broker, worker_threads=8)
        started = time.perf_counter()
        worker.start()
        try:
            broker.join(QUEUE)
            self.drained_in = time.perf_counter() - started  # stop() idles for a while
        finally:
            worker.stop()
            broker.close()
        ran, self.sent = self.sent, 0
        return ran

    def close(self) -> None:
        self.broker.close()


class CeleryPeer(Peer):
    system = "celery"
    one_action = "task.delay(), 1/call"

    def __init__(self, redis_url: str) -> None:
        import celery

        self.app = celery.Celery("hm_bench", broker=redis_url, set_as_current=False)
        self.app.conf.update(task_ignore_result=True, broker_connection_retry_on_startup=True)
        self.task = self.app.task(name="noop", ignore_result=True)(noop)

    def one(self, i: int) -> None:
        self.task.delay(i)

    def close(self) -> None:
        self.app.close()


PEERS: dict[str, Callable[..., Peer]] = {
    "procrastinate": ProcrastinatePeer,
    "rq": RqPeer,
    "dramatiq": DramatiqPeer,
    "celery": CeleryPeer,
}


def timed_drain(peer: Peer) -> Sample:
    """Time ``peer.drain()``, or the part of it the peer says was the draining."""
    peer.drained_in = None
    started = time.perf_counter()
    ran = peer.drain()
    seconds = time.perf_counter() - started
    return Sample(ran, seconds if peer.drained_in is None else peer.drained_in)
