"""Settings: typed, validated when loaded, from the environment or a TOML file.

Precedence (highest first): explicit keyword arguments, ``HYPERMEDIA_*``
environment variables, the TOML file named by ``HYPERMEDIA_CONFIG``, defaults.
A bad value raises :class:`~hypermedia.errors.ConfigError` naming the key (and
its environment variable) and what was expected; nothing starts half-configured.

Queues given in the file or the environment are merged into the default five
(images, documents, ocr, media, bulk): tuning one keeps the others; new names add
queues.

Processing profiles (operation -> queue, version, costs, limits) live in their
own TOML file, ``etc/profiles.toml`` by default; see :mod:`hypermedia.profiles`.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    IPvAnyAddress,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from hypermedia.config_errors import (
    at_least_characters,
    chosen_error,
    is_unknown_key,
    unknown_key_problem,
)
from hypermedia.errors import ConfigError
from hypermedia.etc import shipped_etc

REPO_ETC = shipped_etc()
DEFAULT_QUEUES = ("images", "documents", "ocr", "media", "bulk")
_QUEUE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
# The URL schemes whose driver is installed (``postgresql`` is made psycopg's).
_DATABASE_DRIVERS = ("postgresql", "postgresql+psycopg", "sqlite", "sqlite+pysqlite")
_CALLBACK_HOST = re.compile(r"^([a-z0-9.-]{1,253}|\[[0-9a-f:.]{2,45}\])(:[0-9]{1,5})?$")
_S3_PREFIX = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._=-]{0,199}/?)*$")


def _default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "hypermedia"


DEFAULT_ACTOR_CPUS = 0.5  # see QueueSettings


class QueueSettings(BaseModel):
    """Per-queue settings. ``concurrency`` is the number of claim loops per actor;
    ``workers``, the pipeline actors of the queue that a local stack (``run``, ``up``,
    ``head``) starts on this machine (0: none here; its jobs are then refused at submit
    unless the stack is attached to a cluster, whose nodes may run them); ``cpus`` the
    CPUs each actor of the queue reserves from Ray (its ``num_cpus``: what Ray's
    dashboard, ``ray status`` and ``ray_resources`` show it using). The default, half a
    CPU, lets one actor of each of four queues share a 2-core machine; 0 places actors
    by their queue resource alone, as Ray sees no CPU taken. ``prefetch``, the jobs each
    claim loop takes in one claim and runs one after another (1: one at a time; more
    spares the record a claim and a commit a job where jobs are short, see
    :mod:`hypermedia.worker.worker`)."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, allow_inf_nan=False, hide_input_in_errors=True
    )

    concurrency: int = Field(default=1, ge=1, le=64)
    workers: int = Field(default=1, ge=0, le=16)
    cpus: float = Field(default=DEFAULT_ACTOR_CPUS, ge=0, le=64)
    prefetch: int = Field(default=1, ge=1, le=64)

    @field_validator("cpus")
    @classmethod
    def _ray_precision(cls, value: float) -> float:
        if 0 < value < 0.01:
            raise ValueError("must be 0 or at least 0.01")
        return round(value, 4)  # Ray counts resources in units of 0.0001


def _default_queues() -> dict[str, QueueSettings]:
    concurrency = {"images": 4, "documents": 2, "ocr": 1, "media": 1, "bulk": 1}
    return {name: QueueSettings(concurrency=concurrency[name]) for name in DEFAULT_QUEUES}


class Settings(BaseSettings):
    """Everything the platform needs to connect and run."""

    model_config = SettingsConfigDict(
        env_prefix="HYPERMEDIA_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
        allow_inf_nan=False,
        # A refused value may be a secret: the error's text (a traceback at debug level
        # shows it) leaves inputs out; _describe shows the ones that may be shown.
        hide_input_in_errors=True,
    )

    data_dir: Path = Field(default_factory=_default_data_dir)
    database_url: str | None = None
    # A PostgreSQL server gone without a word (a NAT's or firewall's table that dropped
    # the connection, a partition, a host powered off) is found out within this long,
    # on every connection (TCP keepalives and TCP_USER_TIMEOUT: see
    # hypermedia.db.engine.DEAD_PEER_SECONDS), and a connection not made within it is
    # given up (libpq's connect_timeout); 0: the kernel's and libpq's defaults (~15 min
    # for a statement sent, never for one awaiting its answer or a connection a server
    # took and never answered). A value in the URL wins.
    database_dead_peer_seconds: float = Field(default=30.0, ge=0, le=3600)
    # The PostgreSQL server's limits on every connection (see
    # hypermedia.db.engine.STATEMENT_SECONDS): a statement cancelled after this long, a
    # lock waited for a third of it, a session idle in a transaction ended after twice
    # it; such a statement fails database_unavailable. 0: none (PostgreSQL's defaults:
    # a statement behind another session's lock waited for as long as it was held);
    # else at least MIN_STATEMENT_SECONDS (3 ms: see _check_statement_seconds).
    # Migrations lift them. A limit the URL's libpq ``options`` (or PGOPTIONS) sets wins.
    database_statement_seconds: float = Field(default=30.0, ge=0, le=86400)
    # What a connection's server session is to the record: its own for as long as the
    # connection lasts ("session": PostgreSQL itself, or a pooler such as PgBouncer in
    # session mode), or a server connection lent for one transaction at a time
    # ("transaction": PgBouncer's pool_mode = transaction, the pooled endpoints of
    # managed PostgreSQL services). Then no statement is prepared on the server (the
    # next transaction may run on a server connection that never saw it), nothing is
    # SET for the session, and migrations, which hold a session lock, refuse to run
    # (`db upgrade` past the pooler: README, Behind PgBouncer).
    database_pooling: Literal["session", "transaction"] = "session"
    redis_url: str | None = None
    redis_prefix: str = Field(default="hm", pattern=r"^[A-Za-z0-9_.-]{1,32}$")
    profiles_path: Path = REPO_ETC / "profiles.toml"
    queues: dict[str, QueueSettings] = Field(default_factory=_default_queues)

    api_host: str = "127.0.0.1"
    api_port: int = Field(default=8080, ge=1, le=65535)
    api_url: str | None = None
    api_key: str | None = None
    max_upload_bytes: int = Field(default=2 * 1024**3, ge=1)
    # Every request body but an upload's is read into memory: keep it small.
    max_json_body_bytes: int = Field(default=1024**2, ge=1024, le=64 * 1024**2)
    # ... and must arrive whole within this long (408 request_timeout): 1 MB in
    # 120 s is ~70 kbit/s, a slow mobile link's pace. Uploads have their own pace.
    json_body_seconds: float = Field(default=120.0, gt=0, le=3600)
    # Each upload's inspection runs in a child with these budgets (ingest.inspection).
    inspection_cpu_seconds: int = Field(default=10, ge=1, le=600)
    inspection_wall_seconds: float = Field(default=30.0, gt=0, le=3600)
    inspection_memory_mb: int = Field(default=1024, ge=256, le=64 * 1024)
    inspection_concurrency: int = Field(default=2, ge=1, le=64)
    # Uploads stream into storage in worker threads of their own, at most this many at
    # once (the rest wait, holding no thread): slow ones never take the threads every
    # other route runs in. A body that stops for upload_idle_seconds, or arrives slower
    # than upload_min_bytes_per_second on average once that long, is refused (408).
    upload_concurrency: int = Field(default=16, ge=1, le=1024)
    upload_idle_seconds: float = Field(default=30.0, gt=0, le=3600)
    upload_min_bytes_per_second: int = Field(default=1024, ge=0)
    # A stopping API (SIGTERM) lets the requests in flight finish this long; then an
    # upload still arriving is refused (503, its partial bytes removed), and what still
    # runs STOP_ANSWER_SECONDS later is cancelled (hypermedia.server.ApiServer).
    api_shutdown_seconds: float = Field(default=30.0, gt=0, le=3600)
    # What an API key may do unless the operator granted it otherwise (per key, with
    # `hypermedia user add/key/grant`): priorities 1-3 go to on-demand capacity.
    key_priority_min: int = Field(default=4, ge=1, le=10)
    key_priority_max: int = Field(default=10, ge=1, le=10)
    key_submits_per_minute: int = Field(default=600, ge=1)
    # Every user's stored bytes (uploads and their outputs) and uploads per minute.
    user_storage_quota_bytes: int = Field(default=10 * 1024**3, ge=1)
    user_uploads_per_minute: int = Field(default=60, ge=1)
    # Uploads one user may have arriving at once (the API's upload threads are shared:
    # one user's slow bodies must not hold them all). More: 429 until one ends.
    user_concurrent_uploads: int = Field(default=4, ge=1, le=1024)
    # Job event streams (GET /jobs/{id}/events) this API process serves at once, each
    # holding a socket and a Redis connection while its job runs: in all (more: 503),
    # and of one user (more: 429 until one ends; operators have no such cap).
    event_streams: int = Field(default=1000, ge=1, le=100_000)
    user_concurrent_event_streams: int = Field(default=100, ge=1, le=100_000)

    # Storage: a local directory (``data_dir/objects``, URLs served by the API and
    # signed with ``storage_secret``) or an S3 bucket (URLs presigned by S3).
    storage_backend: Literal["local", "s3"] = "local"
    s3_bucket: str | None = Field(default=None, validate_default=True)
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    s3_prefix: str = Field(default="", max_length=200)
    storage_secret: Annotated[SecretStr, at_least_characters(32)] | None = None
    presign_ttl_seconds: int = Field(default=900, ge=1, le=7 * 24 * 3600)
    # /healthz probes the storage (S3: a HEAD of the bucket) at most this often (0: on
    # every ask), and waits at most storage_probe_timeout_seconds for it.
    storage_probe_seconds: float = Field(default=15.0, ge=0, le=3600)
    storage_probe_timeout_seconds: float = Field(default=2.0, gt=0, le=60)
    # An output's download URL (GET /jobs/{id}/outputs/{type}/url) lives this long.
    download_url_ttl_seconds: int = Field(default=300, ge=1, le=24 * 3600)

    # Completion webhooks (hypermedia.callbacks): the hosts a submit's callback_url may
    # name ("host" any port, "host:port" that port; none: no callbacks; the environment
    # takes them comma-separated), the HMAC secret they are signed with (unset: one kept
    # in data_dir/callback.secret), and delivery.
    callback_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    callback_secret: Annotated[SecretStr, at_least_characters(32)] | None = None
    callback_max_attempts: int = Field(default=8, ge=1, le=100)
    callback_timeout_seconds: float = Field(default=10.0, gt=0, le=120)
    callback_poll_seconds: float = Field(default=1.0, gt=0, le=3600)
    # How long a callback given up (callback_max_attempts failed attempts) stays in the
    # outbox, for GET /jobs/{id} to show its last answer; the head's maintenance then
    # deletes it. At least the hour hypermedia_callbacks_failed counts.
    callback_failed_retention_seconds: float = Field(default=7 * 86_400.0, ge=3600, le=366 * 86_400)
    # How long a callback delivered stays in the outbox after its delivery (its times and
    # the receiver's answer, for GET /jobs/{id}); then the head's maintenance deletes it,
    # the job keeping its outcome and attempts. 0: at the maintenance's next round.
    callback_delivered_retention_seconds: float = Field(default=86_400.0, ge=0, le=366 * 86_400)
    # Bulk runs (hypermedia.bulk): how often the head looks at runs with no room for
    # jobs (a run with room is driven at once).
    bulk_poll_seconds: float = Field(default=2.0, gt=0, le=3600)

    # Every span of time is bounded: a clock, a timedelta and a thread's wait overflow
    # somewhere past them (an unbounded reaper interval killed serve's maintenance
    # thread while its API went on answering).
    backoff_base_seconds: float = Field(default=60.0, gt=0, le=86_400)
    backoff_max_seconds: float = Field(default=3600.0, gt=0, le=7 * 86_400)
    lease_grace_seconds: float = Field(default=30.0, ge=0, le=86_400)
    reaper_interval_seconds: float = Field(default=5.0, gt=0, le=3600)
    reconcile_interval_seconds: float = Field(default=60.0, gt=0, le=86_400)
    # A worker claims no job while the disk of its workdirs has less than this free
    # (MB): a job may write up to its profile's max_output_bytes there, and on one VPS
    # that disk is also the database's. It claims again once there is.
    worker_min_free_disk_mb: int = Field(default=1024, ge=0)

    # A Ray cluster started by `ray up` (ray_cluster/*.yaml): the head services attach
    # to it instead of starting a Ray head of their own, run the scheduler.json
    # baseline of actors per queue, and run the scheduler with the burst fleet.
    ray_address: str | None = Field(default=None, pattern=r"^[A-Za-z0-9.-]+:[0-9]{2,5}$")
    # The address a Ray head of our own (`run`, `up`) listens on for nodes that join
    # it (`hypermedia worker`). Unset: loopback only, and no node can join.
    ray_node_ip: IPvAnyAddress | None = None
    # Ray's dashboard on the head of `up` (`run` never starts it): on 127.0.0.1, behind
    # the cluster's token. It costs about 1 GB of memory.
    ray_dashboard: bool = True
    # Where that dashboard's Metrics page finds Prometheus and Grafana (etc/prometheus/,
    # etc/grafana/); with nothing listening there the page says so.
    prometheus_url: str = Field(default="http://127.0.0.1:9090", pattern=r"^https?://\S+$")
    grafana_url: str = Field(default="http://127.0.0.1:3000", pattern=r"^https?://\S+$")

    # Spot interruption notices (hypermedia.worker.spot): a worker on a spot instance
    # watches its cloud's metadata service ("aws" or "gcp"); "off" everywhere else.
    # ``metadata_url`` replaces the provider's own address (tests, a local mock).
    spot_watch: Literal["off", "aws", "gcp"] = "off"
    metadata_url: str | None = None
    spot_poll_seconds: float = Field(default=5.0, gt=0, le=60)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = os.environ.get("HYPERMEDIA_CONFIG")
        if config_file:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=config_file))
        return tuple(sources)

    @field_validator("data_dir", mode="before")
    @classmethod
    def _check_data_dir(cls, value: object) -> object:
        # Path("") is the working directory: an unset variable in a shell script
        # (HYPERMEDIA_DATA_DIR=$UNSET) would put the stack's files wherever it ran.
        if isinstance(value, str) and not value.strip():
            raise ValueError("empty: give the directory the stack keeps its files in")
        return value

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        scheme, found, _rest = value.partition("://")
        if not found or scheme.split("+")[0] not in ("postgresql", "sqlite"):
            raise ValueError("expected a postgresql+psycopg:// or sqlite:/// URL")
        if scheme not in _DATABASE_DRIVERS:
            # A driver SQLAlchemy knows but this install has not (asyncpg, psycopg2, ...):
            # refused here rather than as an internal ModuleNotFoundError at connect.
            raise ValueError(
                f"driver {scheme!r} is not supported: use postgresql+psycopg:// (psycopg 3)"
                " or sqlite:///"
            )
        if scheme == "postgresql":
            # One driver, chosen: psycopg 3.
            value = "postgresql+psycopg://" + value.removeprefix("postgresql://")
        return value

    @field_validator("database_statement_seconds")
    @classmethod
    def _check_statement_seconds(cls, value: float) -> float:
        from hypermedia.db import MIN_STATEMENT_SECONDS

        if 0 < value < MIN_STATEMENT_SECONDS:
            # PostgreSQL's limits are whole milliseconds, 0 meaning none: the lock wait
            # (a third) of less would round to no limit at all.
            raise ValueError(
                f"must be 0 (no limits) or at least {MIN_STATEMENT_SECONDS} (PostgreSQL"
                " counts its limits in whole milliseconds; a lock wait of a third of less"
                " would be 0, no limit)"
            )
        return value

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("expected a redis://, rediss:// or unix:// URL")
        return value

    @field_validator("s3_bucket")
    @classmethod
    def _check_s3_bucket(cls, value: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("storage_backend") == "s3" and value is None:
            raise ValueError("required when storage_backend is 's3'")
        if value is not None and not _S3_BUCKET.fullmatch(value):
            raise ValueError(f"expected an S3 bucket name matching {_S3_BUCKET.pattern}")
        return value

    @field_validator("s3_bucket", "s3_endpoint_url", "s3_region", "s3_prefix")
    @classmethod
    def _only_with_s3(cls, value: str | None, info: ValidationInfo) -> str | None:
        # An S3 option with the local backend would be silently ignored: refuse it.
        if value and info.data.get("storage_backend") == "local":
            raise ValueError("set, but storage_backend is 'local' (set storage_backend = 's3')")
        return value

    @field_validator("s3_endpoint_url")
    @classmethod
    def _check_s3_endpoint(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("expected an http:// or https:// URL")
        return value

    @field_validator("s3_prefix")
    @classmethod
    def _check_s3_prefix(cls, value: str) -> str:
        if not _S3_PREFIX.fullmatch(value):
            raise ValueError("expected key segments separated by '/', e.g. 'hypermedia/'")
        return value

    @field_validator("metadata_url")
    @classmethod
    def _check_metadata_url(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        if info.data.get("spot_watch", "off") == "off":
            # It would be silently ignored: refuse it.
            raise ValueError("set, but spot_watch is 'off' (set spot_watch = 'aws' or 'gcp')")
        if not value.startswith(("http://", "https://")):
            raise ValueError("expected an http:// or https:// URL")
        return value

    @field_validator("callback_hosts", mode="before")
    @classmethod
    def _split_callback_hosts(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part for part in (p.strip() for p in value.split(",")) if part]
        return value

    @field_validator("callback_hosts")
    @classmethod
    def _check_callback_hosts(cls, value: list[str]) -> list[str]:
        hosts = []
        for entry in value:
            host = entry.strip().lower()
            if not _CALLBACK_HOST.fullmatch(host):
                raise ValueError(
                    f"{entry!r}: expected a host name or address, with an optional :port "
                    "(no scheme, no path)"
                )
            hosts.append(host)
        return hosts

    @field_validator("inspection_wall_seconds")
    @classmethod
    def _check_inspection_wall(cls, value: float, info: ValidationInfo) -> float:
        cpu = info.data.get("inspection_cpu_seconds")
        if isinstance(cpu, int) and value < cpu:
            raise ValueError(f"must be at least inspection_cpu_seconds ({cpu})")
        return value

    @field_validator("key_priority_max")
    @classmethod
    def _check_key_priorities(cls, value: int, info: ValidationInfo) -> int:
        low = info.data.get("key_priority_min")
        if isinstance(low, int) and value < low:
            raise ValueError(f"must be at least key_priority_min ({low})")
        return value

    @field_validator("queues", mode="before")
    @classmethod
    def _merge_queues(cls, value: Any) -> Any:
        """Queues given (file or ``HYPERMEDIA_QUEUES__<NAME>__<KEY>``) are merged into the
        defaults: setting one queue's concurrency keeps the other queues. New names add
        queues."""
        if not isinstance(value, dict):
            return value
        merged: dict[str, Any] = {name: q.model_dump() for name, q in _default_queues().items()}
        for name, body in value.items():
            if isinstance(body, dict) and isinstance(merged.get(name), dict):
                merged[name] = {**merged[name], **body}
            else:
                merged[name] = body
        return merged

    @field_validator("queues")
    @classmethod
    def _check_queues(cls, value: dict[str, QueueSettings]) -> dict[str, QueueSettings]:
        if not value:
            raise ValueError("expected at least one queue")
        for name in value:
            if not _QUEUE_NAME.match(name):
                raise ValueError(f"queue name {name!r} must match {_QUEUE_NAME.pattern}")
        return value

    @property
    def effective_database_url(self) -> str:
        """The configured URL, or the embedded SQLite file in ``data_dir``."""
        return self.database_url or f"sqlite:///{self.data_dir / 'hypermedia.db'}"

    @property
    def database_setting(self) -> str:
        """The setting :attr:`effective_database_url` comes from, as an error names it."""
        if self.database_url:
            return "database_url (HYPERMEDIA_DATABASE_URL)"
        return "data_dir (HYPERMEDIA_DATA_DIR)"

    @property
    def storage_dir(self) -> Path:
        return self.data_dir / "objects"

    @property
    def public_api_url(self) -> str:
        """The API as others reach it: ``api_url``, else ``http://api_host:api_port``."""
        if self.api_url:
            return self.api_url.rstrip("/")
        host = f"[{self.api_host}]" if ":" in self.api_host else self.api_host
        return f"http://{host}:{self.api_port}"

    @property
    def callback_secret_path(self) -> Path:
        """Where the generated callback signing secret is kept when ``callback_secret``
        is unset (the web tier verifies callbacks with it)."""
        return self.data_dir / "callback.secret"

    @property
    def storage_secret_path(self) -> Path:
        """Where the generated signing secret is kept when ``storage_secret`` is unset."""
        return self.data_dir / "storage.secret"

    @property
    def queue_names(self) -> tuple[str, ...]:
        return tuple(self.queues)

    def pool_cpus(self, pools: Mapping[str, int]) -> float:
        """The CPUs Ray must find for ``pools`` (actors per queue): each actor reserves
        its queue's ``cpus``. A node that hosts them all needs at least this many."""
        return sum(count * self.queues[queue].cpus for queue, count in pools.items())


def load_settings(**overrides: Any) -> Settings:
    """Build settings, translating validation errors into a ConfigError naming the key."""
    config_file = os.environ.get("HYPERMEDIA_CONFIG")
    if config_file and not Path(config_file).is_file():
        raise ConfigError("HYPERMEDIA_CONFIG", f"file {config_file!r} does not exist")
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError(*_describe(exc)) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("HYPERMEDIA_CONFIG", f"{config_file} is not valid TOML: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            "HYPERMEDIA_CONFIG", f"{config_file} is not UTF-8 text (byte {exc.start})"
        ) from None
    if config_file:
        _check_private(Path(config_file))
    return settings


def _check_private(path: Path) -> None:
    """A settings file that holds a secret (a secret setting, a URL with a password) must
    not be readable by others, as the alert webhooks file must not: refuse it naming the
    file and the key, never the value."""
    import stat

    from hypermedia.embedded import shown_url

    mode = stat.S_IMODE(path.stat().st_mode)
    if not mode & 0o007:
        return
    data = tomllib.loads(path.read_text(encoding="utf-8"))  # read once already: it parses
    for key, value in data.items():
        if not isinstance(value, str) or not value:
            continue
        if is_secret_setting(key) or shown_url(value) != value:  # a URL's password
            raise ConfigError(
                f"{path}: {key}",
                f"a secret in a file others may read (mode {mode:04o}): chmod o-rwx {path}",
            )


def declared_queue_names(environ: Mapping[str, str]) -> set[str]:
    """Every queue something names, for telling a misspelt ``HYPERMEDIA_QUEUES__<NAME>__…``
    from a queue of one's own: the default five, the queues the profiles file routes
    operations to, and those ``HYPERMEDIA_QUEUES`` (JSON) or the config file's
    ``[queues.<name>]`` define. A file or value that cannot be read adds nothing here
    (loading the settings says what is wrong with it)."""
    import contextlib
    import json

    names = set(DEFAULT_QUEUES)
    file: dict[str, Any] = {}
    config_file = environ.get("HYPERMEDIA_CONFIG")
    if config_file:
        try:
            file = tomllib.loads(Path(config_file).read_text())
        except (OSError, ValueError):
            file = {}
    with_json: Any = {}
    with contextlib.suppress(ValueError):
        with_json = json.loads(environ.get("HYPERMEDIA_QUEUES") or "{}")
    for defined in (file.get("queues"), with_json):
        if isinstance(defined, dict):
            names.update(str(name) for name in defined)
    profiles = environ.get("HYPERMEDIA_PROFILES_PATH") or file.get("profiles_path")
    try:
        data = tomllib.loads(Path(str(profiles or REPO_ETC / "profiles.toml")).read_text())
    except (OSError, ValueError):
        data = {}
    profiles_table = data.get("profiles")
    for body in profiles_table.values() if isinstance(profiles_table, dict) else ():
        if isinstance(body, dict) and isinstance(body.get("queue"), str):
            names.add(body["queue"])
    return names


_SECRET_NAME = re.compile(r"(^|_)(secret|key|token|password)$")


def _holds_secret_str(annotation: object) -> bool:
    return annotation is SecretStr or any(_holds_secret_str(a) for a in get_args(annotation))


def is_secret_setting(name: str) -> bool:
    """A setting whose value is never shown: a ``SecretStr``, or named like a secret
    (``*_secret``, ``*_key``, ``*_token``, ``*_password``)."""
    field = Settings.model_fields.get(name)
    if field is not None and _holds_secret_str(field.annotation):
        return True
    return bool(_SECRET_NAME.search(name))


def shown_value(name: str, value: object) -> str | None:
    """How a refused value of setting ``name`` may appear in an error, or None if it
    may not: never a secret's; a URL without its password (``scheme://user:***@host``);
    nothing that looks like it holds a password we cannot mask."""
    if is_secret_setting(name):
        return None
    if isinstance(value, str) and "@" in value:
        from hypermedia.embedded import shown_url

        shown = shown_url(value)
        if shown == value and ":" in value.rpartition("@")[0]:
            return None  # user:password@host without a scheme: nothing to mask by
        return repr(shown)
    return repr(value)


# Variables read before (or without) the settings: the log's (by the CLI, which sets up
# logging first, and by the actors) and the sandbox's (by its fork servers, which import
# no pydantic). Written in a settings file they are refused as such, not as unknown.
ENVIRONMENT_ONLY = ("HYPERMEDIA_LOG_LEVEL", "HYPERMEDIA_LOG_FORMAT", "HYPERMEDIA_SANDBOX_PID_INIT")


def _describe(exc: ValidationError) -> tuple[str, str]:
    first = chosen_error(exc)
    path = ".".join(str(part) for part in first["loc"])
    top = str(first["loc"][0]) if first["loc"] else ""
    env = f"HYPERMEDIA_{top.upper()}"
    # A nested key set by its own variable (HYPERMEDIA_QUEUES__IMAGES__PREFETCH) is named
    # by it; given in HYPERMEDIA_QUEUES (JSON) or the file, by the top-level one.
    nested = "HYPERMEDIA_" + "__".join(str(part) for part in first["loc"]).upper()
    if len(first["loc"]) > 1:
        env = next((name for name in os.environ if name.upper() == nested), env)
    key = f"{path} ({env})" if top else path
    problem = first["msg"]
    if is_unknown_key(first) and len(first["loc"]) == 1 and env in ENVIRONMENT_ONLY:
        problem = f"not read from a settings file: set {env} in the environment"
    elif is_unknown_key(first):
        problem = unknown_key_problem(exc, first, Settings, "unknown setting")
    elif "input" in first and not isinstance(first["input"], dict):
        shown = shown_value(top, first["input"])
        if shown is None:
            problem = f"{problem} (the value given is not shown: it may be a secret)"
        else:
            problem = f"{problem}; got {shown}"
    return key, problem
