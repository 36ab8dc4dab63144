"""Ray actors: the pipeline actor (a worker on one queue) and the head's grants actor.

``PipelineActor`` asks for ``resources={"queue_<name>": 1}``, builds its own
connections from the settings it is given (nothing is pickled but plain data),
and runs a :class:`~hypermedia.worker.worker.Worker` whose claim loops pull
from Redis themselves: Ray carries no per-job calls. ``serve()`` returns when the
worker stops; its failing with ``RayActorError`` is how the supervisor learns the
actor (or its node) died.

``options`` tune the worker: ``prefetch`` (jobs one claim loop takes at once; the
queue's ``prefetch`` setting when not given). Every step runs in a child of the
actor's fork server (:meth:`PipelineService.make_executor`); the throughput
benchmark's own subclass runs them in the actor instead (``bench/in_process.py``),
nothing here.

With ``spot_watch`` set in the settings (``aws`` or ``gcp``, on a spot instance)
the worker watches the metadata service for the interruption notice and stops
itself when it comes (see :mod:`hypermedia.worker.spot`); ``serve()`` then returns
like any stop, and the workers row says ``spot_interrupted``.

``GrantsActor`` lives on the head, holds the storage credentials and issues each
job's presigned URLs; workers never hold storage credentials. Its answers are
values (``("ok", ...)`` / ``("error", code, message)``), translated back into
hypermedia errors by :class:`RayGrants`, so no exception class has to survive
Ray's pickling.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import ray

from hypermedia import workdirs
from hypermedia.config import Settings, load_settings
from hypermedia.errors import ConfigError, HypermediaError, ServiceUnavailable, error_classes
from hypermedia.storage.grants import OutputGrant

log = logging.getLogger(__name__)

HEAD_RESOURCE = "node:__internal_head__"


def _error_value(exc: HypermediaError) -> tuple[str, str, str]:
    return ("error", exc.code, exc.message)


def _configure_logging() -> None:
    """In an actor's process (not when the body runs in a driver or a test): records
    and their extras as JSON lines on the actor's stderr, Ray's ``worker-*.err``."""
    if ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None:
        from hypermedia import logs

        logs.configure_actor()


def _raise(answer: tuple[Any, ...]) -> Any:
    if answer[0] == "ok":
        return answer[1]
    _, code, message = answer
    # As itself (the database or the storage down is retried, a job no longer ours
    # is let go): every other answer was ServiceUnavailable, and its job failed for good.
    cls = error_classes().get(code, ServiceUnavailable)
    if issubclass(cls, ConfigError):  # its constructor names a key: the head's to fix
        cls = ServiceUnavailable
    raise cls(message)


class GrantsService:
    """The grants actor's body (plain class: testable without Ray).

    ``credentials_path``: the head's hand-off file of storage credentials (see
    :mod:`hypermedia.storage.credentials`), read here, on the head's node."""

    def __init__(self, settings: dict[str, Any], credentials_path: str | None = None) -> None:
        from hypermedia.clock import SystemClock
        from hypermedia.db.engine import settings_engine
        from hypermedia.db.migrate import schema_problem
        from hypermedia.db.upgrade import prepare_data_dir
        from hypermedia.storage import credentials
        from hypermedia.storage.configured import build_storage
        from hypermedia.storage.grants import StorageGrants

        _configure_logging()
        if credentials_path is not None:
            handed = credentials.read(Path(credentials_path))
            handed.apply_environment()
            if handed.storage_secret is not None:
                settings = {**settings, "storage_secret": handed.storage_secret}
        # The record and the storage, no whole Stack: its Redis client (redis-py imports
        # OpenTelemetry's SDK), queues, catalog and services were a quarter of this
        # actor's start beyond Ray's own (0.73 -> 0.48 CPU-s), and it asks none of them.
        cfg = load_settings(**settings)
        prepare_data_dir(cfg)
        self.engine = settings_engine(cfg)
        try:
            if (problem := schema_problem(self.engine)) is not None:
                raise ConfigError(cfg.database_setting, problem)
            clock = SystemClock()
            storage = build_storage(cfg, clock)
        except BaseException:
            self.engine.dispose()
            raise
        self.grants = StorageGrants(self.engine, storage, cfg.presign_ttl_seconds, clock)

    def input_url(self, job_id: str, worker_id: str) -> tuple[Any, ...]:
        try:
            return ("ok", self.grants.input_url(job_id, worker_id))
        except HypermediaError as exc:
            return _error_value(exc)

    def output_urls(
        self, job_id: str, worker_id: str, output_types: dict[str, str | None]
    ) -> tuple[Any, ...]:
        try:
            grants = self.grants.output_urls(job_id, worker_id, output_types)
        except HypermediaError as exc:
            return _error_value(exc)
        return ("ok", {k: (g.key, g.url, g.content_type) for k, g in grants.items()})

    def checkpoint_uploads(self, job_id: str, worker_id: str, names: list[str]) -> tuple[Any, ...]:
        try:
            grants = self.grants.checkpoint_uploads(job_id, worker_id, names)
        except HypermediaError as exc:
            return _error_value(exc)
        return ("ok", {k: (g.key, g.url, g.content_type) for k, g in grants.items()})

    def checkpoint_downloads(self, job_id: str, worker_id: str) -> tuple[Any, ...]:
        try:
            grants = self.grants.checkpoint_downloads(job_id, worker_id)
        except HypermediaError as exc:
            return _error_value(exc)
        return ("ok", {k: (g.key, g.url, g.content_type) for k, g in grants.items()})

    def ping(self) -> str:
        return "ok"


GrantsActor = ray.remote(GrantsService)  # options (resources, concurrency) at spawn


class RayGrants:
    """The worker's side of the grants actor (implements execute.Grants)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def input_url(self, job_id: str, worker_id: str) -> str:
        return str(_raise(ray.get(self.handle.input_url.remote(job_id, worker_id))))

    def output_urls(
        self, job_id: str, worker_id: str, output_types: Mapping[str, str | None]
    ) -> dict[str, OutputGrant]:
        answer = ray.get(self.handle.output_urls.remote(job_id, worker_id, dict(output_types)))
        raw: dict[str, tuple[str, str, str | None]] = _raise(answer)
        return {k: OutputGrant(key=v[0], url=v[1], content_type=v[2]) for k, v in raw.items()}

    def checkpoint_uploads(
        self, job_id: str, worker_id: str, names: Sequence[str]
    ) -> dict[str, OutputGrant]:
        answer = ray.get(self.handle.checkpoint_uploads.remote(job_id, worker_id, list(names)))
        raw: dict[str, tuple[str, str, str | None]] = _raise(answer)
        return {k: OutputGrant(key=v[0], url=v[1], content_type=v[2]) for k, v in raw.items()}

    def checkpoint_downloads(self, job_id: str, worker_id: str) -> dict[str, OutputGrant]:
        answer = ray.get(self.handle.checkpoint_downloads.remote(job_id, worker_id))
        raw: dict[str, tuple[str, str, str | None]] = _raise(answer)
        return {k: OutputGrant(key=v[0], url=v[1], content_type=v[2]) for k, v in raw.items()}


class PipelineService:
    """The pipeline actor's body (plain class: the same code runs without Ray)."""

    def __init__(
        self,
        settings: dict[str, Any],
        queue: str,
        worker_id: str,
        concurrency: int,
        grants: Any,
        preload: tuple[str, ...] = ("pipelines.registry",),
        heartbeat_seconds: float = 30.0,
        metrics_seconds: float = 60.0,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        from hypermedia.metrics.actors import actor_metrics
        from hypermedia.stack import Stack
        from hypermedia.worker.execute import Executor, JobExecution
        from hypermedia.worker.spot import SpotWatch
        from hypermedia.worker.worker import Worker, ended_workers

        _configure_logging()
        options = dict(options or {})
        unknown = set(options) - {"prefetch"}
        if unknown:
            raise ValueError(f"unknown worker options {sorted(unknown)}")
        cfg: Settings = load_settings(**settings)
        # What is made here is closed again when a later step fails (a Worker argument,
        # its registration in the record): else the fork server and its spares would
        # live on beside this process, which Ray may keep after __init__ raised.
        with contextlib.ExitStack() as made:
            # Per-job grants only; its counts go to Ray's metrics agent.
            self.stack = Stack.open(
                cfg, with_storage=False, metrics=actor_metrics(), custom_plans=True
            )
            made.callback(self.stack.close)
            # Workers that died here left their jobs' files; on a burst node nobody else
            # is on this disk to remove them.
            engine = self.stack.engine
            workdirs.sweep(cfg.data_dir, lambda found: ended_workers(engine, found))
            work_root = workdirs.worker_root(cfg.data_dir, worker_id)
            # Each job's share of this node's CPUs: its claim loops split them.
            self.job_cpus = max(1, (os.cpu_count() or 1) // max(1, concurrency))
            # The modules that register steps (tests add theirs): known here too, so the
            # worker knows which of its operations keep checkpoints (pipelines.registry).
            for module in preload:
                importlib.import_module(module)
            preload = queue_preload(self.stack.catalog, queue, preload)
            self.executor: Any = self.make_executor(work_root, preload, cfg)
            made.callback(self.executor.close)
            executor: Executor = self.executor
            grants_client = RayGrants(grants) if _is_actor_handle(grants) else grants
            execution = JobExecution(
                self.stack.dispatcher, self.stack.catalog, grants_client, executor, worker_id
            )
            node_id = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
            self.worker = Worker(
                worker_id=worker_id,
                queue=queue,
                concurrency=concurrency,
                engine=self.stack.engine,
                dispatcher=self.stack.dispatcher,
                execution=execution,
                work_root=str(work_root),
                node_id=node_id,
                clock=self.stack.clock,
                heartbeat_seconds=heartbeat_seconds,
                metrics_seconds=metrics_seconds,
                prefetch=int(options.get("prefetch", cfg.queues[queue].prefetch)),
                spot=SpotWatch.from_settings(cfg),
                min_free_disk_mb=cfg.worker_min_free_disk_mb,
            )
            self.worker.start()
            made.pop_all()  # all started: serve() closes them

    def make_executor(self, work_root: Path, preload: tuple[str, ...], cfg: Settings) -> Any:
        """Where the steps run: a child per job, forked by the actor's fork server."""
        from hypermedia.sandbox.executor import ChildExecutor

        # The data dir holds the record, the stored objects and secrets: jobs must not
        # see it (their own workdir is mounted back in).
        return ChildExecutor(
            work_root,
            preload=preload,
            hidden_paths=(cfg.data_dir,),
            job_cpus=self.job_cpus,
        )

    def serve(self) -> dict[str, int]:
        """Block until the worker stops; its final counts."""
        while not self.worker.wait(1.0):
            pass
        self._close()
        return self.stats()

    def drain(self, timeout: float) -> list[str]:
        return self.worker.drain(timeout)

    def stats(self) -> dict[str, int]:
        s = self.worker.stats
        return {
            "claimed": s.claimed,
            "completed": s.completed,
            "failed": s.failed,
            "retried": s.retried,
            "cancelled": s.cancelled,
            "released": s.released,
            "lost": s.lost,
            "errors": s.errors,
            "running": len(self.worker.execution.running()),
        }

    def child_pids(self) -> dict[str, int]:
        """Running jobs and their child pids (operators and fault tests)."""
        pids = {}
        for job_id in self.worker.execution.running():
            pid = self.executor.child_pid(job_id)
            if pid is not None:
                pids[job_id] = pid
        return pids

    def pid(self) -> int:
        import os

        return os.getpid()

    def health(self) -> dict[str, Any]:
        """What this worker holds right now, for operators and leak checks: its pid, open
        descriptors and threads, running jobs, job workdirs on disk and processes under
        a job uid (the last two are empty between jobs), and its Ray worker id (the
        ``WorkerId`` label of the metrics it exports)."""
        import os
        import threading

        executor = self.executor
        return {
            "pid": os.getpid(),
            "ray_worker_id": ray.get_runtime_context().get_worker_id()
            if ray.is_initialized()
            else None,
            "open_fds": len(os.listdir("/proc/self/fd")),
            "threads": threading.active_count(),
            "running": len(self.worker.execution.running()),
            "workdirs": executor.workdirs() if hasattr(executor, "workdirs") else [],
            "job_processes": executor.job_processes() if hasattr(executor, "job_processes") else [],
            "sandbox": dict(getattr(executor, "capabilities", {})),
        }

    def _close(self) -> None:
        self.executor.close()
        self.stack.close()


PipelineActor = ray.remote(PipelineService)  # options (queue resource ...) at spawn


def _is_actor_handle(value: Any) -> bool:
    return isinstance(value, ray.actor.ActorHandle)


def queue_preload(catalog: Any, queue: str, preload: tuple[str, ...]) -> tuple[str, ...]:
    """``preload`` and the libraries the steps of ``queue``'s operations ask their fork
    server to import before it forks (:func:`pipelines.registry.preload`: the ocr
    queue's onnxruntime, OpenCV, RapidOCR ...), those installed on this node only."""
    from pipelines import registry

    operations = [op for op in catalog.operations() if catalog.get(op).queue == queue]
    return tuple(dict.fromkeys((*preload, *registry.preload(operations))))
