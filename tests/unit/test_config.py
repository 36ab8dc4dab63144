"""Settings: defaults, environment, TOML file, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from hypermedia.cli.services import check_worker_cpus
from hypermedia.config import DEFAULT_QUEUES, REPO_ETC, Settings, load_settings
from hypermedia.errors import ConfigError


@pytest.fixture
def config_file(tmp_path, monkeypatch):
    """``config_file(text)`` writes a TOML file and points HYPERMEDIA_CONFIG at it."""

    def write(text: str) -> Path:
        path: Path = tmp_path / "hypermedia.toml"
        path.write_text(text)
        monkeypatch.setenv("HYPERMEDIA_CONFIG", str(path))
        return path

    return write


def test_defaults(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    settings = load_settings()
    assert settings.data_dir == tmp_path / "xdg" / "hypermedia"
    assert settings.database_url is None
    assert settings.redis_url is None
    assert settings.redis_prefix == "hm"
    assert settings.profiles_path == REPO_ETC / "profiles.toml"
    assert settings.queue_names == DEFAULT_QUEUES == ("images", "documents", "ocr", "media", "bulk")
    assert {name: q.concurrency for name, q in settings.queues.items()} == {
        "images": 4,
        "documents": 2,
        "ocr": 1,
        "media": 1,
        "bulk": 1,
    }
    assert settings.api_host == "127.0.0.1"
    assert settings.api_port == 8080
    assert settings.api_url is None
    assert settings.api_key is None
    assert settings.max_upload_bytes == 2 * 1024**3
    assert settings.backoff_base_seconds == 60.0
    assert settings.backoff_max_seconds == 3600.0
    assert settings.lease_grace_seconds == 30.0
    assert settings.reaper_interval_seconds == 5.0
    assert settings.reconcile_interval_seconds == 60.0


def test_data_dir_without_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert load_settings().data_dir == tmp_path / ".local" / "share" / "hypermedia"


def test_derived_paths(tmp_path):
    settings = load_settings(data_dir=tmp_path)
    assert settings.effective_database_url == f"sqlite:///{tmp_path / 'hypermedia.db'}"
    assert settings.storage_dir == tmp_path / "objects"
    explicit = load_settings(data_dir=tmp_path, database_url="sqlite:////x/y.db")
    assert explicit.effective_database_url == "sqlite:////x/y.db"


@pytest.mark.parametrize(
    ("variable", "value", "attribute", "expected"),
    [
        ("HYPERMEDIA_DATA_DIR", "/srv/hm", "data_dir", Path("/srv/hm")),
        ("HYPERMEDIA_DATABASE_URL", "sqlite:////srv/hm.db", "database_url", "sqlite:////srv/hm.db"),
        (
            "HYPERMEDIA_DATABASE_URL",
            "postgresql+psycopg://u:p@db:5432/hm",
            "database_url",
            "postgresql+psycopg://u:p@db:5432/hm",
        ),
        ("HYPERMEDIA_REDIS_URL", "redis://cache:6380/2", "redis_url", "redis://cache:6380/2"),
        ("HYPERMEDIA_REDIS_URL", "rediss://cache:6380/2", "redis_url", "rediss://cache:6380/2"),
        ("HYPERMEDIA_REDIS_URL", "unix:///run/redis.sock", "redis_url", "unix:///run/redis.sock"),
        ("HYPERMEDIA_REDIS_PREFIX", "prod-1.a_b", "redis_prefix", "prod-1.a_b"),
        ("HYPERMEDIA_PROFILES_PATH", "/etc/hm/p.toml", "profiles_path", Path("/etc/hm/p.toml")),
        ("HYPERMEDIA_API_HOST", "0.0.0.0", "api_host", "0.0.0.0"),
        ("HYPERMEDIA_API_PORT", "9000", "api_port", 9000),
        ("HYPERMEDIA_API_PORT", "65535", "api_port", 65535),
        ("HYPERMEDIA_API_URL", "http://head:8080", "api_url", "http://head:8080"),
        ("HYPERMEDIA_API_KEY", "secret", "api_key", "secret"),
        ("HYPERMEDIA_MAX_UPLOAD_BYTES", "1", "max_upload_bytes", 1),
        ("HYPERMEDIA_BACKOFF_BASE_SECONDS", "1.5", "backoff_base_seconds", 1.5),
        ("HYPERMEDIA_BACKOFF_MAX_SECONDS", "7200", "backoff_max_seconds", 7200.0),
        ("HYPERMEDIA_LEASE_GRACE_SECONDS", "0", "lease_grace_seconds", 0.0),
        ("HYPERMEDIA_REAPER_INTERVAL_SECONDS", "0.5", "reaper_interval_seconds", 0.5),
        ("HYPERMEDIA_RECONCILE_INTERVAL_SECONDS", "10", "reconcile_interval_seconds", 10.0),
        (
            "HYPERMEDIA_CALLBACK_HOSTS",
            "Hooks.Example.com, 10.0.0.5:8443,[::1]:9000",
            "callback_hosts",
            ["hooks.example.com", "10.0.0.5:8443", "[::1]:9000"],
        ),
        ("HYPERMEDIA_CALLBACK_MAX_ATTEMPTS", "3", "callback_max_attempts", 3),
        (
            "HYPERMEDIA_CALLBACK_FAILED_RETENTION_SECONDS",
            "86400",
            "callback_failed_retention_seconds",
            86400.0,
        ),
        (
            "HYPERMEDIA_CALLBACK_DELIVERED_RETENTION_SECONDS",
            "3600",
            "callback_delivered_retention_seconds",
            3600.0,
        ),
    ],
)
def test_environment_overrides(monkeypatch, variable, value, attribute, expected):
    monkeypatch.setenv(variable, value)
    assert getattr(load_settings(), attribute) == expected


def test_queues_from_the_environment_as_json(monkeypatch):
    monkeypatch.setenv("HYPERMEDIA_QUEUES", '{"images": {"concurrency": 8}, "thumbs": {}}')
    settings = load_settings()
    # Queues given are merged into the default five; new names add queues.
    assert settings.queue_names == (*DEFAULT_QUEUES, "thumbs")
    assert settings.queues["images"].concurrency == 8
    assert settings.queues["thumbs"].concurrency == 1


def test_nested_queue_variable_keeps_the_other_queues(monkeypatch):
    monkeypatch.setenv("HYPERMEDIA_QUEUES__IMAGES__CONCURRENCY", "8")
    settings = load_settings()
    assert settings.queues["images"].concurrency == 8
    assert settings.queue_names == DEFAULT_QUEUES


def test_each_queue_reserves_cpus_for_its_actors(monkeypatch):
    monkeypatch.setenv("HYPERMEDIA_QUEUES__OCR__CPUS", "1.5")
    settings = load_settings()
    assert settings.queues["ocr"].cpus == 1.5
    assert settings.queues["images"].cpus == 0.5  # the default: 4 actors on 2 cores
    assert settings.pool_cpus({"images": 2, "ocr": 1}) == 2.5
    monkeypatch.setenv("HYPERMEDIA_QUEUES__OCR__CPUS", "0.001")
    with pytest.raises(ConfigError, match=r"queues\.ocr\.cpus"):
        load_settings()


def test_a_worker_node_refuses_actors_its_cpus_cannot_hold():
    settings = load_settings()
    check_worker_cpus(settings, {"images": 4}, 2)  # 4 x 0.5
    with pytest.raises(ConfigError, match="--num-cpus") as refused:
        check_worker_cpus(settings, {"images": 4, "ocr": 1}, 2)
    assert "2.5 CPUs" in str(refused.value) and "HYPERMEDIA_WORKER_CPUS" in str(refused.value)
    with pytest.raises(ConfigError, match="'thumbs' is not a queue"):
        check_worker_cpus(settings, {"thumbs": 1}, 2)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u@h/db", "postgresql+psycopg://u@h/db"),
        (
            "postgresql://u:p@h:5433/db?sslmode=require",
            "postgresql+psycopg://u:p@h:5433/db?sslmode=require",
        ),
        ("postgresql+psycopg://u@h/db", "postgresql+psycopg://u@h/db"),
        ("sqlite:///relative.db", "sqlite:///relative.db"),
        ("sqlite:////abs/path.db", "sqlite:////abs/path.db"),
        ("sqlite+pysqlite:////abs/path.db", "sqlite+pysqlite:////abs/path.db"),
        ("sqlite://", "sqlite://"),
    ],
)
def test_database_url_is_normalized_to_psycopg(url, expected, monkeypatch):
    assert load_settings(database_url=url).database_url == expected
    monkeypatch.setenv("HYPERMEDIA_DATABASE_URL", url)
    assert load_settings().database_url == expected


def test_precedence_keyword_then_environment_then_file_then_default(config_file, monkeypatch):
    config_file("api_port = 7000\nredis_prefix = 'fromfile'\nlease_grace_seconds = 5\n")
    monkeypatch.setenv("HYPERMEDIA_API_PORT", "7001")
    monkeypatch.setenv("HYPERMEDIA_REDIS_PREFIX", "fromenv")
    settings = load_settings(api_port=7002)
    assert settings.api_port == 7002  # keyword beats environment and file
    assert settings.redis_prefix == "fromenv"  # environment beats file
    assert settings.lease_grace_seconds == 5.0  # file beats default
    assert settings.reaper_interval_seconds == 5.0  # default


def test_toml_file(config_file, tmp_path):
    config_file(
        f"""
data_dir = "{tmp_path / "data"}"
database_url = "postgresql://hm@db/hm"
redis_url = "redis://cache:6379/1"
api_port = 8443

[queues.images]
concurrency = 6

[queues.ocr]
concurrency = 2
"""
    )
    settings = load_settings()
    assert settings.data_dir == tmp_path / "data"
    assert settings.database_url == "postgresql+psycopg://hm@db/hm"
    assert settings.redis_url == "redis://cache:6379/1"
    assert settings.api_port == 8443
    # A [queues] table in the file tunes queues; the default five stay.
    assert settings.queue_names == DEFAULT_QUEUES
    assert settings.queues["images"].concurrency == 6
    assert settings.queues["ocr"].concurrency == 2
    assert settings.queues["documents"].concurrency == 2


def test_empty_toml_file_gives_defaults(config_file):
    config_file("# nothing set\n")
    settings = load_settings()
    assert settings.api_port == 8080
    assert settings.queue_names == DEFAULT_QUEUES


def test_missing_config_file(monkeypatch, tmp_path):
    missing = tmp_path / "nope.toml"
    monkeypatch.setenv("HYPERMEDIA_CONFIG", str(missing))
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert info.value.key == "HYPERMEDIA_CONFIG"
    assert str(missing) in info.value.message
    assert "does not exist" in info.value.message


def test_config_file_that_is_a_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("HYPERMEDIA_CONFIG", str(tmp_path))
    with pytest.raises(ConfigError, match="HYPERMEDIA_CONFIG"):
        load_settings()


def test_config_file_with_bad_toml(config_file):
    config_file("api_port = \n")
    with pytest.raises(ConfigError, match="HYPERMEDIA_CONFIG"):
        load_settings()


BAD_VALUES = [
    # (variable, value, key, fragment of the problem)
    ("HYPERMEDIA_API_PORT", "x", "api_port", "valid integer"),
    ("HYPERMEDIA_API_PORT", "0", "api_port", "greater than or equal to 1"),
    ("HYPERMEDIA_API_PORT", "65536", "api_port", "less than or equal to 65535"),
    ("HYPERMEDIA_API_PORT", "-1", "api_port", "greater than or equal to 1"),
    ("HYPERMEDIA_API_PORT", "80.5", "api_port", "integer"),
    ("HYPERMEDIA_MAX_UPLOAD_BYTES", "0", "max_upload_bytes", "greater than or equal to 1"),
    ("HYPERMEDIA_BACKOFF_BASE_SECONDS", "0", "backoff_base_seconds", "greater than 0"),
    ("HYPERMEDIA_BACKOFF_BASE_SECONDS", "soon", "backoff_base_seconds", "valid number"),
    ("HYPERMEDIA_BACKOFF_MAX_SECONDS", "-5", "backoff_max_seconds", "greater than 0"),
    ("HYPERMEDIA_LEASE_GRACE_SECONDS", "-1", "lease_grace_seconds", "greater than or equal to 0"),
    ("HYPERMEDIA_REAPER_INTERVAL_SECONDS", "0", "reaper_interval_seconds", "greater than 0"),
    ("HYPERMEDIA_RECONCILE_INTERVAL_SECONDS", "0", "reconcile_interval_seconds", "greater than 0"),
    ("HYPERMEDIA_DATA_DIR", "", "data_dir", "empty"),
    ("HYPERMEDIA_DATA_DIR", "  ", "data_dir", "empty"),
    ("HYPERMEDIA_DATABASE_URL", "mysql://u@h/db", "database_url", "postgresql+psycopg://"),
    ("HYPERMEDIA_DATABASE_URL", "db.sqlite", "database_url", "sqlite:///"),
    # Drivers SQLAlchemy knows but hypermedia does not install: refused here, not as an
    # internal ModuleNotFoundError at the first connection.
    (
        "HYPERMEDIA_DATABASE_URL",
        "postgresql+asyncpg://u@h/db",
        "database_url",
        "'postgresql+asyncpg'",
    ),
    ("HYPERMEDIA_DATABASE_URL", "postgresql+psycopg2://u@h/db", "database_url", "not supported"),
    ("HYPERMEDIA_DATABASE_URL", "sqlite+aiosqlite:///x.db", "database_url", "not supported"),
    ("HYPERMEDIA_DATABASE_URL", "sqlitex:///x.db", "database_url", "sqlite:///"),
    ("HYPERMEDIA_REDIS_URL", "http://cache:6379", "redis_url", "redis://"),
    ("HYPERMEDIA_REDIS_URL", "cache:6379", "redis_url", "redis://"),
    ("HYPERMEDIA_REDIS_PREFIX", "a:b", "redis_prefix", "pattern"),
    ("HYPERMEDIA_REDIS_PREFIX", "x" * 33, "redis_prefix", "pattern"),
    ("HYPERMEDIA_QUEUES", '{"Bad Name": {}}', "queues", "must match"),
    ("HYPERMEDIA_QUEUES", '{"Images": {}}', "queues", "must match"),
    ("HYPERMEDIA_QUEUES", '{"images": {"concurrency": 0}}', "queues.images.concurrency", ">= 1"),
    ("HYPERMEDIA_QUEUES", '{"images": {"concurrency": 65}}', "queues.images.concurrency", "<= 64"),
    ("HYPERMEDIA_QUEUES", '{"images": {"workers": -1}}', "queues.images.workers", ">= 0"),
    ("HYPERMEDIA_QUEUES", '{"images": {"workers": 17}}', "queues.images.workers", "<= 16"),
    # The variable set is named, not HYPERMEDIA_QUEUES (the README's per-queue form).
    ("HYPERMEDIA_QUEUES__IMAGES__PREFETCH", "0", "queues.images.prefetch", ">= 1"),
    ("HYPERMEDIA_QUEUES__OCR__CPUS", "0.001", "queues.ocr.cpus", "at least 0.01"),
    # PostgreSQL's limits are whole milliseconds, 0 none: a lock wait of 0.001 / 3 s
    # was no limit at all.
    (
        "HYPERMEDIA_DATABASE_STATEMENT_SECONDS",
        "0.001",
        "database_statement_seconds",
        "0 (no limits) or at least 0.003",
    ),
    ("HYPERMEDIA_QUEUES__MEDIA__WORKERS", "many", "queues.media.workers", "valid integer"),
    ("HYPERMEDIA_CALLBACK_HOSTS", "https://hooks.example.com", "callback_hosts", "no scheme"),
    ("HYPERMEDIA_CALLBACK_HOSTS", "a.example.com,b.example.com/x", "callback_hosts", "no path"),
    # In characters: pydantic's own words for a SecretStr were "at least 32 items".
    ("HYPERMEDIA_CALLBACK_SECRET", "short", "callback_secret", "at least 32 characters, not 5"),
    ("HYPERMEDIA_STORAGE_SECRET", "s" * 31, "storage_secret", "at least 32 characters, not 31"),
    ("HYPERMEDIA_CALLBACK_MAX_ATTEMPTS", "0", "callback_max_attempts", ">= 1"),
    (
        "HYPERMEDIA_CALLBACK_FAILED_RETENTION_SECONDS",
        "60",
        "callback_failed_retention_seconds",
        ">= 3600",
    ),
    (
        "HYPERMEDIA_CALLBACK_DELIVERED_RETENTION_SECONDS",
        "-1",
        "callback_delivered_retention_seconds",
        ">= 0",
    ),
    (
        "HYPERMEDIA_QUEUES",
        '{"images": {"claimers": 2}}',
        "queues.images.claimers",
        "unknown setting",
    ),
]


@pytest.mark.parametrize(("variable", "value", "key", "problem"), BAD_VALUES)
def test_bad_environment_value_names_key_and_variable(monkeypatch, variable, value, key, problem):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    error = info.value
    assert error.key == f"{key} ({variable})"
    assert error.message.startswith(f"{key} ({variable}): ")
    problem = problem.replace(">= ", "greater than or equal to ").replace(
        "<= ", "less than or equal to "
    )
    assert problem in error.message
    assert error.code == "config_invalid"
    assert error.details == {"key": error.key}


@pytest.mark.parametrize(
    ("toml", "key", "problem"),
    [
        ("api_port = 'high'", "api_port (HYPERMEDIA_API_PORT)", "got 'high'"),
        ("api_port = 0", "api_port (HYPERMEDIA_API_PORT)", "got 0"),
        ("redis_url = 'tcp://x'", "redis_url (HYPERMEDIA_REDIS_URL)", "redis://"),
        ("[queues.images]\nconcurrency = 0", "queues.images.concurrency (HYPERMEDIA_QUEUES)", ""),
    ],
)
def test_bad_file_value_names_key_and_variable(config_file, toml, key, problem):
    config_file(toml + "\n")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert info.value.key == key
    assert problem in info.value.message


@pytest.mark.parametrize(
    ("toml", "key", "problem"),
    [
        ("bogus = 1", "bogus (HYPERMEDIA_BOGUS)", "unknown setting"),
        (
            "apiport = 8080",
            "apiport (HYPERMEDIA_APIPORT)",
            "unknown setting (did you mean api_port?)",
        ),
        (
            "[queues.images]\nconcurrency = 2\nthreads = 4",
            "queues.images.threads (HYPERMEDIA_QUEUES)",
            "unknown setting",
        ),
        (
            "[queues.images]\nconcurency = 2",
            "queues.images.concurency (HYPERMEDIA_QUEUES)",
            "unknown setting (did you mean concurrency?)",
        ),
        ("[scheduler]\nmode = 'hybrid'", "scheduler (HYPERMEDIA_SCHEDULER)", "unknown setting"),
        # Beside a bad value the misspelt key is still the one named.
        (
            "api_port = 0\nredis_ulr = 'redis://localhost'",
            "redis_ulr (HYPERMEDIA_REDIS_ULR)",
            "unknown setting (did you mean redis_url?)",
        ),
    ],
)
def test_unknown_keys_in_the_file_are_refused(config_file, toml, key, problem):
    config_file(toml + "\n")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert info.value.key == key
    assert info.value.message == f"{key}: {problem}"


@pytest.mark.parametrize("name", ["bogus", "apiport", "redisurl"])
def test_unknown_keyword_settings_are_refused(name):
    with pytest.raises(ConfigError, match="unknown setting"):
        load_settings(**{name: 1})


def test_the_error_is_translated_from_pydantic(monkeypatch):
    monkeypatch.setenv("HYPERMEDIA_API_PORT", "x")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert isinstance(info.value.__cause__, ValidationError)


def test_settings_are_frozen(tmp_path):
    settings = load_settings(data_dir=tmp_path)
    with pytest.raises(Exception, match="frozen"):
        settings.api_port = 1  # type: ignore[misc]
    assert isinstance(settings, Settings)


SECRET_VALUES = [
    # (variable, value, what may be shown of it, the secret part)
    ("HYPERMEDIA_STORAGE_SECRET", "hunter2-topsecret", None, "hunter2-topsecret"),
    ("HYPERMEDIA_CALLBACK_SECRET", "hunter2", None, "hunter2"),
    (
        "HYPERMEDIA_DATABASE_URL",
        "mysql://bob:S3cretPass@db.example/x",
        "'mysql://bob:***@db.example/x'",
        "S3cretPass",
    ),
    (
        "HYPERMEDIA_REDIS_URL",
        "http://:R3disPass@127.0.0.1:6379/0",
        "'http://:***@127.0.0.1:6379/0'",
        "R3disPass",
    ),
    # No scheme, a port that is no number: nothing to mask by, so nothing shown.
    ("HYPERMEDIA_REDIS_URL", "bob:R3disPass@cache", None, "R3disPass"),
    ("HYPERMEDIA_REDIS_URL", "redis-x://u:R3disPass@cache:port/0", "u:***@cache", "R3disPass"),
]


@pytest.mark.parametrize(("variable", "value", "shown", "secret"), SECRET_VALUES)
def test_a_refused_secret_is_never_shown(monkeypatch, variable, value, shown, secret):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    error = info.value
    assert error.key.endswith(f"({variable})")
    assert secret not in error.message
    if shown is None:
        assert "the value given is not shown" in error.message
    else:
        assert shown in error.message
    # Nor in the ValidationError the error is raised from (a debug log's traceback).
    assert secret not in str(error.__cause__)


def test_a_refused_plain_value_is_still_shown(monkeypatch):
    monkeypatch.setenv("HYPERMEDIA_API_PORT", "high")
    with pytest.raises(ConfigError, match="got 'high'"):
        load_settings()


FLOAT_SETTINGS = sorted(
    name for name, field in Settings.model_fields.items() if field.annotation is float
)


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e300"])
@pytest.mark.parametrize("name", FLOAT_SETTINGS)
def test_a_float_setting_refuses_what_no_clock_can_wait(monkeypatch, name, value):
    """``HYPERMEDIA_REAPER_INTERVAL_SECONDS=inf`` was taken: ``serve`` came up with its
    maintenance thread dead (``OverflowError: timestamp out of range``), no reaper and no
    reconciler behind an API that answered. Every seconds setting is finite and bounded."""
    monkeypatch.setenv(f"HYPERMEDIA_{name.upper()}", value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert info.value.key == f"{name} (HYPERMEDIA_{name.upper()})"


def test_the_float_settings_are_the_seconds_ones():
    assert "reaper_interval_seconds" in FLOAT_SETTINGS
    assert "lease_grace_seconds" in FLOAT_SETTINGS
    assert len(FLOAT_SETTINGS) >= 10


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ("storage_secret = '" + "s3cr3t" * 6 + "'", "storage_secret"),
        ("callback_secret = '" + "s3cr3t" * 6 + "'", "callback_secret"),
        ("api_key = 'hm_s3cr3t'", "api_key"),
        ("database_url = 'postgresql://hm:s3cr3t@db/hm'", "database_url"),
        ("redis_url = 'redis://:s3cr3t@cache:6379/0'", "redis_url"),
        ("database_url = 'postgresql://hm@db/hm?password=s3cr3t'", "database_url"),
        ("redis_url = 'redis://cache:6379/0?password=s3cr3t'", "redis_url"),
    ],
)
def test_a_secret_in_a_settings_file_others_may_read_is_refused(config_file, toml, key):
    """The settings file may hold the storage and callback secrets, an API key, database
    and Redis passwords; the alert webhooks file with secrets is refused when others may
    read it, and this one was taken at 0644. Refused now, naming the file and the key,
    never the value; the same file at 0600, or at 0644 without a secret, loads."""
    path = config_file(toml + "\n")
    path.chmod(0o644)
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert info.value.key == f"{path}: {key}"
    assert "others may read" in info.value.message and "0644" in info.value.message
    assert "s3cr3t" not in str(info.value)
    path.chmod(0o640)
    load_settings()
    path.write_text("api_port = 8081\ndatabase_url = 'postgresql://hm@db/hm'\n")
    path.chmod(0o644)
    assert load_settings().api_port == 8081


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://hm:s3cr3t@db/hm", "postgresql://hm:***@db/hm"),
        # libpq and redis-py take the password from the query too.
        (
            "postgresql://hm@db:5432/hm?sslmode=require&password=s3cr3t",
            "postgresql://hm@db:5432/hm?sslmode=require&password=***",
        ),
        ("postgresql://hm@db/hm?PASSWORD=s3cr3t&x=1", "postgresql://hm@db/hm?PASSWORD=***&x=1"),
        (
            "postgresql://hm@db/hm?sslpassword=s3cr3t&sslkey=/k",
            "postgresql://hm@db/hm?sslpassword=***&sslkey=/k",
        ),
        ("redis://:s3cr3t@cache:6379/0?password=s3cr3t", "redis://:***@cache:6379/0?password=***"),
        ("redis://cache:6379/0", "redis://cache:6379/0"),
        ("sqlite:////srv/hm/hm.db", "sqlite:////srv/hm/hm.db"),
    ],
)
def test_a_shown_url_has_no_password(url, shown):
    """A password in the URL's query ('postgresql://hm@db/hm?password=...', which psycopg
    and redis-py both take) was shown in clear: `hypermedia db upgrade` printed 'database
    postgresql+psycopg://hm_role@127.0.0.1:5432/hm?password=<it> is at revision 0020',
    `up` logged 'record in ...' with it, a settings file holding it was taken at 0644."""
    from hypermedia.embedded import shown_url

    assert shown_url(url) == shown


@pytest.mark.parametrize("key", ["log_level", "log_format", "sandbox_pid_init"])
def test_an_environment_only_variable_in_the_file_says_where_it_goes(config_file, key):
    """They were refused as "sandbox_pid_init (HYPERMEDIA_SANDBOX_PID_INIT): unknown
    setting", naming as unknown a variable the README's settings table lists."""
    config_file(f"{key} = 'copy'\n")
    with pytest.raises(ConfigError) as info:
        load_settings()
    variable = f"HYPERMEDIA_{key.upper()}"
    assert info.value.message == (
        f"{key} ({variable}): not read from a settings file: set {variable} in the environment"
    )


def test_the_environment_only_variables_are_the_ones_read_so():
    from hypermedia import logs
    from hypermedia.cli import PID_INIT_VARIABLE
    from hypermedia.config import ENVIRONMENT_ONLY

    assert set(ENVIRONMENT_ONLY) == {logs.LEVEL_VARIABLE, logs.FORMAT_VARIABLE, PID_INIT_VARIABLE}
