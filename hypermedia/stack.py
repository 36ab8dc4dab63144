"""Build the platform's parts from settings and pass them around: no globals.

``Stack.open(settings)`` connects the database and Redis, syncs the configured
profiles into the record and returns every service wired together. The
embedded default (no ``database_url`` / ``redis_url``) is a SQLite file and a
private ``redis-server`` in ``data_dir``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass

import redis
from sqlalchemy import Engine

from hypermedia.accounts import KeyGrants
from hypermedia.clock import Clock, SystemClock
from hypermedia.config import Settings
from hypermedia.db.engine import settings_engine
from hypermedia.db.migrate import schema_problem
from hypermedia.db.upgrade import migrate, prepare_data_dir
from hypermedia.errors import ConfigError
from hypermedia.ingest.service import IngestService, registered_operations
from hypermedia.jobs.catalog import ProfileCatalog
from hypermedia.jobs.dispatcher import Dispatcher
from hypermedia.jobs.reaper import Reaper
from hypermedia.jobs.repository import JobRepository
from hypermedia.jobs.states import Backoff
from hypermedia.metrics import Recorder
from hypermedia.queue.redis_queue import RedisQueue, connect
from hypermedia.ratelimit import RateLimiter
from hypermedia.storage.base import Storage
from hypermedia.storage.configured import build_storage
from hypermedia.storage.deletions import Backends
from hypermedia.storage.health import StorageHealth

log = logging.getLogger(__name__)


def redis_url_for(settings: Settings) -> str:
    if settings.redis_url:
        return settings.redis_url
    from hypermedia.embedded import ensure_running

    return ensure_running(settings.data_dir / "redis")


def storage_health(storage: Storage, settings: Settings, clock: Clock) -> StorageHealth:
    return StorageHealth(
        storage.check,
        every=settings.storage_probe_seconds,
        timeout=settings.storage_probe_timeout_seconds,
        clock=clock,
    )


@dataclass
class Stack:
    settings: Settings
    engine: Engine
    redis: redis.Redis
    queue: RedisQueue
    catalog: ProfileCatalog
    repository: JobRepository
    ingest: IngestService
    dispatcher: Dispatcher
    reaper: Reaper
    clock: Clock
    limiter: RateLimiter
    metrics: Recorder
    _storage: Storage | None = None
    redis_url: str = ""  # what `redis` connects to (the API's event streams open their own)
    # The storage's probe (cached), what /healthz asks; None without storage.
    storage_health: StorageHealth | None = None
    # The queues that have or can get a worker, asked when a bulk run is placed (a run
    # on a queue no worker serves would wait forever); None: every configured queue.
    served_queues: Callable[[], Collection[str]] | None = None
    _backends: Backends | None = None

    @property
    def has_storage(self) -> bool:
        return self._storage is not None

    @property
    def backends(self) -> Backends:
        """The backends bulk migrations copied objects to, by name (a deletion deletes
        a migrated object's copy there too), opened when first named."""
        if self._backends is None:
            from hypermedia.bulk.runner import MigrateTargets

            self._backends = MigrateTargets(self.engine)
        return self._backends

    @property
    def storage(self) -> Storage:
        if self._storage is None:
            raise ConfigError(
                "storage",
                "this process was opened without storage: a worker moves bytes "
                "with the per-job URLs the head grants",
            )
        return self._storage

    @classmethod
    def open(
        cls,
        settings: Settings,
        *,
        clock: Clock | None = None,
        auto_migrate: bool = False,
        engine: Engine | None = None,
        implemented: Callable[[], Collection[str]] = registered_operations,
        with_storage: bool = True,
        metrics: Recorder | None = None,
        custom_plans: bool = False,
        served_queues: Callable[[], Collection[str]] | None = None,
    ) -> Stack:
        """``implemented`` names the operations ingest accepts (those with a pipeline
        step; tests of queue mechanics may widen it to every profile).
        ``with_storage=False``: no storage backend, so none of its credentials or
        signing secret (a pipeline actor's stack).
        ``metrics``: where the stack's parts count what they do; by default the head's
        (:class:`~hypermedia.metrics.head.HeadMetrics`, which also reads the queues and
        workers when scraped: the API serves it on ``/metrics``).
        ``custom_plans``: see :func:`~hypermedia.db.engine.make_engine` (a pipeline
        actor's claim loops).
        ``served_queues``: the queues that have or can get a worker (those ``implemented``
        was drawn from), where a bulk run may go; None: every configured queue."""
        clock = clock or SystemClock()
        prepare_data_dir(settings)
        engine = engine or settings_engine(settings, custom_plans=custom_plans)
        if auto_migrate:
            migrate(settings, engine, clock=clock)
        elif (problem := schema_problem(engine)) is not None:
            raise ConfigError(settings.database_setting, problem)
        catalog = ProfileCatalog.load(engine)
        if not len(catalog):
            raise ConfigError(
                "profiles_path (HYPERMEDIA_PROFILES_PATH)",
                "no active profiles in the database: run `hypermedia db upgrade`",
            )
        redis_url = redis_url_for(settings)
        client = connect(redis_url)
        queue = RedisQueue(client, settings.redis_prefix, settings.queue_names)
        head = None  # the head's own recorder, made here when none is given
        if metrics is None:
            from hypermedia.metrics.head import HeadMetrics

            head = HeadMetrics()
            head.watch(queue, engine, clock)
            metrics = head
        repository = JobRepository(
            Backoff(settings.backoff_base_seconds, settings.backoff_max_seconds)
        )
        limiter = RateLimiter(client, settings.redis_prefix)
        key_defaults = KeyGrants(
            settings.key_priority_min, settings.key_priority_max, settings.key_submits_per_minute
        )
        storage = build_storage(settings, clock) if with_storage else None
        health = storage_health(storage, settings, clock) if storage else None
        if head is not None and health is not None:
            head.watch_storage(health)
        return cls(
            settings=settings,
            engine=engine,
            redis=client,
            queue=queue,
            catalog=catalog,
            repository=repository,
            ingest=IngestService(
                engine,
                queue,
                catalog,
                clock,
                repository,
                implemented,
                limiter=limiter,
                key_defaults=key_defaults,
                metrics=metrics,
                callback_hosts=settings.callback_hosts,
                storage_quota_bytes=settings.user_storage_quota_bytes,
            ),
            dispatcher=Dispatcher(
                engine,
                queue,
                catalog,
                clock=clock,
                repository=repository,
                lease_grace_seconds=settings.lease_grace_seconds,
                metrics=metrics,
            ),
            reaper=Reaper(
                engine,
                queue,
                clock=clock,
                repository=repository,
                data_dir=settings.data_dir,
                metrics=metrics,
            ),
            clock=clock,
            limiter=limiter,
            metrics=metrics,
            _storage=storage,
            redis_url=redis_url,
            storage_health=health,
            served_queues=served_queues,
        )

    def close(self) -> None:
        self.redis.close()
        self.engine.dispose()
