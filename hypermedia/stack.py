"""Build the platform's parts from settings and pass them around: no globals.

``Stack.open(settings)`` connects the database and Redis, syncs the configured
profiles into the record and returns every service wired together. The
embedded default (no ``database_url`` / ``redis_url``) is a SQLite file and a
private ``redis-server`` in ``data_dir``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

import redis
from sqlalchemy import Engine

from hypermedia.accounts import KeyGrants
from hypermedia.clock import Clock, SystemClock
from hypermedia.config import Settings
from hypermedia.db.engine import make_engine, transaction
from hypermedia.db.migrate import current_revision, head_revision, upgrade
from hypermedia.errors import ConfigError
from hypermedia.ingest.service import IngestService, registered_operations
from hypermedia.jobs.catalog import ProfileCatalog, sync_profiles
from hypermedia.jobs.dispatcher import Dispatcher
from hypermedia.jobs.repository import JobRepository
from hypermedia.jobs.states import Backoff
from hypermedia.profiles import load_profiles
from hypermedia.queue.reaper import Reaper
from hypermedia.queue.redis_queue import RedisQueue, connect
from hypermedia.ratelimit import RateLimiter
from hypermedia.storage.base import Storage
from hypermedia.storage.local import LocalStorage, load_or_create_secret


def redis_url_for(settings: Settings) -> str:
    if settings.redis_url:
        return settings.redis_url
    from hypermedia.embedded import ensure_running

    return ensure_running(settings.data_dir / "redis")


def build_storage(settings: Settings, clock: Clock) -> Storage:
    """The configured storage: S3 (boto3 imported only then), else the local directory
    with URLs signed by ``storage_secret`` or the secret kept in ``data_dir``."""
    if settings.storage_backend == "s3":
        from hypermedia.storage.s3 import S3Storage

        assert settings.s3_bucket is not None  # the settings refuse s3 without a bucket
        return S3Storage(
            settings.s3_bucket,
            endpoint_url=settings.s3_endpoint_url,
            region=settings.s3_region,
            prefix=settings.s3_prefix,
        )
    secret = (
        settings.storage_secret.get_secret_value()
        if settings.storage_secret is not None
        else load_or_create_secret(settings.storage_secret_path)
    )
    return LocalStorage(
        settings.storage_dir, base_url=settings.public_api_url, secret=secret, clock=clock
    )


def migrate(
    settings: Settings, engine: Engine | None = None, *, clock: Clock | None = None
) -> None:
    """Apply migrations and sync profiles (``hypermedia db upgrade``)."""
    owned = engine is None
    engine = engine or make_engine(settings.effective_database_url)
    try:
        upgrade(engine)
        profiles = load_profiles(settings.profiles_path, settings.queue_names)
        with transaction(engine) as conn:
            sync_profiles(conn, profiles, (clock or SystemClock()).now())
    finally:
        if owned:
            engine.dispose()


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
    storage: Storage
    clock: Clock
    limiter: RateLimiter

    @classmethod
    def open(
        cls,
        settings: Settings,
        *,
        clock: Clock | None = None,
        auto_migrate: bool = False,
        engine: Engine | None = None,
        implemented: Callable[[], Collection[str]] = registered_operations,
    ) -> Stack:
        """``implemented`` names the operations ingest accepts (those with a pipeline
        step; tests of queue mechanics may widen it to every profile)."""
        clock = clock or SystemClock()
        engine = engine or make_engine(settings.effective_database_url)
        if auto_migrate:
            migrate(settings, engine, clock=clock)
        elif current_revision(engine) != head_revision():
            raise ConfigError(
                "database_url (HYPERMEDIA_DATABASE_URL)",
                "the database schema is not up to date: run `hypermedia db upgrade`",
            )
        catalog = ProfileCatalog.load(engine)
        if not len(catalog):
            raise ConfigError(
                "profiles_path (HYPERMEDIA_PROFILES_PATH)",
                "no active profiles in the database: run `hypermedia db upgrade`",
            )
        client = connect(redis_url_for(settings))
        queue = RedisQueue(client, settings.redis_prefix, settings.queue_names)
        repository = JobRepository(
            Backoff(settings.backoff_base_seconds, settings.backoff_max_seconds)
        )
        limiter = RateLimiter(client, settings.redis_prefix)
        key_defaults = KeyGrants(
            settings.key_priority_min, settings.key_priority_max, settings.key_submits_per_minute
        )
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
            ),
            dispatcher=Dispatcher(
                engine,
                queue,
                catalog,
                clock=clock,
                repository=repository,
                lease_grace_seconds=settings.lease_grace_seconds,
            ),
            reaper=Reaper(
                engine, queue, clock=clock, repository=repository, data_dir=settings.data_dir
            ),
            storage=build_storage(settings, clock),
            clock=clock,
            limiter=limiter,
        )

    def close(self) -> None:
        self.redis.close()
        self.engine.dispose()
