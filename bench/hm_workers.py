"""The hypermedia side of the throughput benchmark: the record, a Ray head, the actors.

The jobs are ``test.noop`` (:mod:`tests.pipelines_for_tests`), whose profile (in
``tests/profiles_for_tests.toml``) says it needs no input: no presigned URL, no
download, no upload. Each request names its own object, seeded up front. The
pipeline actors are made by the :class:`~hypermedia.worker.supervisor.Supervisor`
on a Ray head of the run's own (token auth, free ports), one mode at a time:

* ``child``: every step in a child of the actor's fork server, as in production;
* ``in_process``: the step called in the actor (the benchmark's own actor,
  :func:`bench.in_process.in_process_actor`), to measure the job path apart from the
  child.

Nothing imports ``ray`` before :meth:`Hypermedia.start_cluster` has set its auth
environment.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil
from sqlalchemy import func, select, text

from bench import hm
from bench.drain import Drain, cpu_seconds, cpu_spent
from bench.harness import ScratchDatabases, sqlalchemy_url, unique_name
from hypermedia.config import load_settings
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.ingest.service import SubmitRequest
from hypermedia.stack import Stack

ROOT = Path(__file__).resolve().parent.parent
OPERATION = "test.noop"  # tests/pipelines_for_tests.py; its profile reads no input
QUEUE = "bulk"
PRELOAD = ("pipelines.registry", "tests.pipelines_for_tests")
MODES = ("in_process", "child")
WARMUP_JOBS = 200
DRAIN_TIMEOUT = 600.0


class Hypermedia:
    """The record, a Ray head, and the pipeline actors of one mode at a time."""

    def __init__(
        self,
        args: argparse.Namespace,
        admin: ScratchDatabases,
        server_url: str,
        tmp: Path,
        cleanup: contextlib.ExitStack,
    ) -> None:
        self.args = args
        self.cleanup = cleanup
        data_dir = tmp / "data"
        if args.work_dir is not None:
            data_dir = Path(tempfile.mkdtemp(prefix="hm-tput-", dir=args.work_dir))
            cleanup.callback(shutil.rmtree, data_dir, ignore_errors=True)
        profiles = tmp / "profiles.toml"
        profiles.write_text(
            (ROOT / "etc" / "profiles.toml").read_text()
            + "\n"
            + (ROOT / "tests" / "profiles_for_tests.toml").read_text()
        )
        database = admin.create(unique_name("hm_tput"))
        self.settings = load_settings(
            database_url=sqlalchemy_url(database),
            redis_url=server_url,
            redis_prefix="hmtput",
            data_dir=data_dir,
            profiles_path=profiles,
        )
        # Ingest accepts only operations with a step registered in this process too.
        for module in PRELOAD:
            importlib.import_module(module)
        subject, pool_id = hm.open_subject(self.settings)
        cleanup.callback(subject.stack.close)
        self.subject, self.pool_id = subject, pool_id
        self.stack: Stack = subject.stack
        self._ray_dir = tmp / "ray"
        self.node: Any = None

    def seed(self, count: int) -> None:
        self.subject.object_ids = hm.seed_objects(
            self.stack, self.subject.caller, self.pool_id, count
        )

    def start_cluster(self) -> None:
        """A Ray head of our own (token auth, free ports), and this process its client."""
        from hypermedia.worker import cluster

        token = cluster.ensure_token(self._ray_dir / cluster.TOKEN_FILE)
        cluster.apply_ray_environment(token)  # before ray is imported
        node = cluster.start_head(
            self._ray_dir,
            resources=cluster.queue_resources({QUEUE: self.args.actors}),
            token_path=token,
            # Room for every actor asked for (each reserves its queue's cpus).
            num_cpus=max(
                os.cpu_count() or 2,
                math.ceil(self.args.actors * self.settings.queues[QUEUE].cpus),
            ),
        )
        self.node = node
        self.cleanup.callback(self._stop_cluster)

        import ray

        ray.init(address=node.address, logging_level=logging.WARNING, log_to_driver=False)

    def _stop_cluster(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        if self.node is not None:
            self.node.stop()
            shutil.rmtree(self.node.temp_dir.parent, ignore_errors=True)
            self.node = None

    @contextlib.contextmanager
    def actors(self, mode: str) -> Iterator[list[psutil.Process]]:
        """The mode's pipeline actors, made by the Supervisor; yields their processes."""
        import ray

        from hypermedia.config import QueueSettings
        from hypermedia.server import Maintenance
        from hypermedia.worker.supervisor import Supervisor, settings_for_actors

        child = mode == "child"
        loops = self.args.child_loops if child else self.args.loops
        options: dict[str, Any] = {
            "prefetch": self.args.child_prefetch if child else self.args.prefetch
        }
        settings = self.settings.model_copy(
            update={"queues": {**self.settings.queues, QUEUE: QueueSettings(concurrency=loops)}}
        )
        stack = dataclasses.replace(self.stack, settings=settings)
        assert settings.redis_url is not None
        supervisor = Supervisor(
            stack,
            settings_for_actors(settings, settings.redis_url),
            {QUEUE: self.args.actors},
            preload=PRELOAD,
            worker_options=options,
        )
        if not child:  # benchmark only: no child per job
            from bench.in_process import in_process_actor

            supervisor.actor_class = in_process_actor()
        maintenance = Maintenance(
            self.stack,
            reaper_interval=self.settings.reaper_interval_seconds,
            reconcile_interval=self.settings.reconcile_interval_seconds,
        )
        try:
            supervisor.start()
            supervisor.wait_ready()
            maintenance.start()
            pids = ray.get([m.actor.pid.remote() for m in supervisor.actors()])
            processes = [psutil.Process(pid) for pid in pids]
            self.supervisor = supervisor
            yield processes
        finally:
            maintenance.stop()
            supervisor.stop(drain_timeout=30)

    def _tree(self, actors: Sequence[psutil.Process]) -> list[psutil.Process]:
        found = list(actors)
        for process in actors:
            with contextlib.suppress(psutil.Error):
                found.extend(process.children(recursive=True))
        return found

    def _backends(self) -> list[psutil.Process]:
        """This database's PostgreSQL backends (the pooled connections stay open)."""
        with transaction(self.stack.engine) as conn:
            pids = conn.execute(
                text("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
            ).scalars()
            found = []
            for pid in pids:
                with contextlib.suppress(psutil.Error):
                    found.append(psutil.Process(int(pid)))
        return found

    def completed(self) -> int:
        stats = self.supervisor.stats()
        return sum(s["completed"] for s in stats.values())

    def _wait_completed(self, count: int, timeout: float = DRAIN_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while self.completed() < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"hypermedia: {self.completed()} of {count} jobs in {timeout} s")
            time.sleep(0.05)

    def warm_up(self, jobs: int = WARMUP_JOBS) -> None:
        base = self.completed()
        ids = self.subject.take(jobs)
        requests = [SubmitRequest(object_id=o, operations=[OPERATION]) for o in ids]
        self.stack.ingest.submit_many(self.subject.caller, requests)
        self._wait_completed(base + jobs)

    def drain(self, n: int, actors: Sequence[psutil.Process]) -> Drain:
        """``n`` jobs through submit_many (``--batch`` per call) while the actors drain."""
        batch = self.args.batch
        ids = self.subject.take(n)
        requests = [SubmitRequest(object_id=o, operations=[OPERATION]) for o in ids]
        base = self.completed()
        tree, backends = self._tree(actors), self._backends()
        before_workers, before_pg = cpu_seconds(tree), cpu_seconds(backends)
        before_producer = time.process_time()
        job_ids: list[str] = []
        first = time.time()
        for lo in range(0, n, batch):
            results = self.stack.ingest.submit_many(self.subject.caller, requests[lo : lo + batch])
            job_ids.extend(r.job_ids[0] for r in results)
        last_enqueue = time.time()
        producer = time.process_time() - before_producer
        self._wait_completed(base + n)
        cpu = {
            "workers": cpu_spent(before_workers, tree) * 1000 / n,
            "postgres": cpu_spent(before_pg, backends) * 1000 / n,
            "producer": producer * 1000 / n,
        }
        times = self._times(job_ids)
        return Drain(
            jobs=n,
            first_enqueue=first,
            last_enqueue=last_enqueue,
            last_start=max(s for _j, _c, s, _d in times),
            last_done=max(d for _j, _c, _s, d in times),
            cpu_ms_per_job={k: round(v, 3) for k, v in cpu.items()},
        )

    def latency(self, n: int, rate: float) -> tuple[list[float], list[float], list[float]]:
        """``n`` jobs, one ``submit`` each, at ``rate``/s: submit -> start and -> done
        (ms), and of submit -> start the part after ``submit`` returned (the job durable
        and enqueued: the wake-up and the claim up to its start time)."""
        ids = self.subject.take(n)
        base = self.completed()
        job_ids: list[str] = []
        returned: dict[str, float] = {}
        began = time.monotonic()
        for i, object_id in enumerate(ids):
            delay = began + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            result = self.stack.ingest.submit(
                self.subject.caller, SubmitRequest(object_id=object_id, operations=[OPERATION])
            )
            returned[result.job_ids[0]] = time.time()
            job_ids.append(result.job_ids[0])
        self._wait_completed(base + n)
        times = self._times(job_ids)
        return (
            [(s - c) * 1000 for _j, c, s, _d in times],
            [(d - c) * 1000 for _j, c, _s, d in times],
            [(s - returned[j]) * 1000 for j, _c, s, _d in times],
        )

    def _times(self, job_ids: list[str]) -> list[tuple[str, float, float, float]]:
        """(job id, created, started, completed) of each job, epoch seconds; all must be
        done."""
        j = t.jobs.c
        with transaction(self.stack.engine) as conn:
            rows = conn.execute(
                select(j.job_id, j.status, j.created_at, j.started_at, j.completed_at).where(
                    j.job_id.in_(job_ids)
                )
            ).all()
        bad = [r.status for r in rows if r.status != "completed"]
        if len(rows) != len(job_ids) or bad:
            raise RuntimeError(f"hypermedia: {len(bad)} jobs not completed: {bad[:5]}")
        return [
            (
                r.job_id,
                r.created_at.timestamp(),
                r.started_at.timestamp(),
                r.completed_at.timestamp(),
            )
            for r in rows
        ]

    def check(self) -> dict[str, Any]:
        """Every submitted job completed exactly once, with one attempt and one charge."""
        with transaction(self.stack.engine) as conn:
            statuses = {
                str(k): int(v)
                for k, v in conn.execute(
                    select(t.jobs.c.status, func.count()).group_by(t.jobs.c.status)
                ).all()
            }
            attempts = {
                str(k): int(v)
                for k, v in conn.execute(
                    select(t.attempts.c.status, func.count()).group_by(t.attempts.c.status)
                ).all()
            }
            most = conn.execute(
                select(func.max(t.jobs.c.attempt_count)).select_from(t.jobs)
            ).scalar_one()
            charges = conn.execute(
                select(func.count())
                .select_from(t.credit_ledger)
                .where(t.credit_ledger.c.kind == "charge")
            ).scalar_one()
        counts = self.stack.queue.counts(QUEUE)
        found = {
            "jobs": statuses,
            "attempts": attempts,
            "max_attempt_count": most,
            "charges": charges,
            "redis": dataclasses.asdict(counts),
        }
        total = sum(statuses.values())
        if (
            statuses != {"completed": total}
            or attempts != {"completed": total}
            or most != 1
            or charges != total
            or counts.ready + counts.leased + counts.delayed
        ):
            raise RuntimeError(f"hypermedia record check failed: {found}")
        return found
