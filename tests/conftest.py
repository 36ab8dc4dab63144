"""Fixtures on real services: PostgreSQL, SQLite, the shared Redis and private ones.

Databases
    ``pg_url``            session: the migrated template database. Closed to
                          connections; clone it, don't use it.
    ``pg_database_url``   a PostgreSQL database of the test's own, cloned from the
                          template (``CREATE DATABASE ... TEMPLATE``); after the test
                          emptied for the next one of the process, or dropped when
                          the test changed more than its rows.
    ``pg_engine``         an engine on ``pg_database_url``.
    ``sqlite_url``        a fresh migrated SQLite file, ``<tmp_path>/hypermedia.db``.
    ``sqlite_engine``     an engine on it.
    ``engine``            parametrized ``postgresql`` / ``sqlite``: one of the two.
    ``module_pg_engine``, ``module_sqlite_engine``, ``module_engine``  the same, shared
                          by the tests of a module (one database for all its cases);
                          ``module_settings(engine, **overrides)``: Settings on it.
    ``private_postgres``  a :class:`~tests.support.PrivatePostgres` of the test's own,
                          running, with a migrated database at ``.url``: for tests
                          that stop it. A copy of ``private_postgres_template``.
    ``private_postgres_template``  session: a data directory (initdb's, with a
                          migrated template database) that each of those copies.

Redis
    ``redis_url``         the shared Redis (``HYPERMEDIA_TEST_REDIS_URL``). Never
                          flush it: write under ``redis_prefix`` only.
    ``redis_prefix``      ``hmtest-<8 hex>``; every key under it is deleted afterwards.
    ``redis_client``      a client on the shared Redis (``decode_responses=True``).
    ``private_redis``     an :class:`~hypermedia.embedded.EmbeddedRedis` of the test's
                          own, for tests that flush it or kill -9 it.

Other
    ``manual_clock``      a :class:`~hypermedia.clock.ManualClock`.
    ``settings``          ``settings(**overrides) -> Settings`` pointed at the above.

A service that cannot be reached fails the tests that need it; nothing skips.
``HYPERMEDIA_*`` variables from the caller's environment (other than
``HYPERMEDIA_TEST_*``) are removed for every test so they cannot leak in.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis
from sqlalchemy import Engine

from hypermedia.clock import ManualClock
from hypermedia.config import Settings, load_settings
from hypermedia.db.engine import make_engine
from hypermedia.embedded import EmbeddedRedis
from hypermedia.worker import cluster
from tests import support

# Generated inputs and the corpus tier; the order xdist workers get the tests in; CPU
# per test when HYPERMEDIA_TEST_CPU_REPORT names a directory.
pytest_plugins = ["tests.tiers", "tests.scheduling", "tests.cpu_report", "tests.slow_machine"]
TESTS = Path(__file__).resolve().parent

# Ray reads its auth settings once, at import: every Ray cluster the tests start uses
# this one token (token auth on, as in production), set before anything imports ray.
RAY_TOKEN = cluster.ensure_token(
    Path(tempfile.gettempdir()) / f"hypermedia-tests-{os.getuid()}" / "ray_auth_token"
)
cluster.apply_ray_environment(RAY_TOKEN)
# Where the worker tests' shared Ray head lives (tests/ray_support.py): a directory the
# session's first process makes, removes at the end, and every xdist worker inherits.
SHARED_RAY_DIR_ENV = "HYPERMEDIA_TEST_RAY_DIR"
SHARED_RAY_DIR_PREFIX = "hm-tests-ray-"
# In that directory: the pid of the session's first process, which stops the head.
SHARED_RAY_OWNER = "owner"
_TIER_MARKS = {"integration": pytest.mark.integration, "e2e": pytest.mark.e2e}


# A suite started in the background (`./scripts/test &` from a script, nohup) inherits
# SIGINT ignored, and so does every process its tests start: a `run` or a `status --watch`
# a test stops with Ctrl-C ran on (a CI-like run here failed both so). Python's own handler
# again, in each test process; what they start gets the default back at exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the session's first process: xdist's or the only
        stop_leftover_heads(Path(tempfile.gettempdir()))
        # Where the worker tests' shared Ray head goes (tests/ray_support.py).
        directory = Path(tempfile.mkdtemp(prefix=SHARED_RAY_DIR_PREFIX))
        (directory / SHARED_RAY_OWNER).write_text(str(os.getpid()))
        os.environ[SHARED_RAY_DIR_ENV] = str(directory)


def stop_shared_head(directory: Path) -> bool:
    """Stop the shared Ray head in ``directory``, if one was started there, and remove
    the directory and the head's temp dir; whether a head was running."""
    node = cluster.RayNode(cluster.short_temp_dir(directory, "head"), RAY_TOKEN)
    running = node.is_running()
    if running or node.temp_dir.exists():
        node.stop()  # also removes its temp dir, where a killed head's session stays
    shutil.rmtree(directory, ignore_errors=True)
    return running


def stop_leftover_heads(root: Path) -> list[Path]:
    """Stop the shared Ray heads (and remove the directories) that sessions no longer
    running left under ``root``: a pytest killed from outside skips its
    ``pytest_sessionfinish``, and its head's GCS, raylet and actors would run on.
    A directory whose owner is alive, or that names no owner yet (a session starting
    now, or one of a checkout older than the owner file), is left alone."""
    stopped = []
    for directory in sorted(root.glob(f"{SHARED_RAY_DIR_PREFIX}*")):
        try:
            owner = int((directory / SHARED_RAY_OWNER).read_text())
        except (OSError, ValueError):
            continue
        if psutil.pid_exists(owner):
            continue
        stop_shared_head(directory)
        stopped.append(directory)
    return stopped


def pytest_sessionfinish(session: pytest.Session) -> None:
    ray_support = sys.modules.get("tests.ray_support")
    if ray_support is not None:  # a test of this process used the shared Ray head
        ray_support.disconnect()
    if not hasattr(session.config, "workerinput"):  # every worker is done with it
        from tests.cpu_report import read_shared_head  # a plugin: rewritten before this

        read_shared_head()
        stop_shared_head(Path(os.environ[SHARED_RAY_DIR_ENV]))
        _fail_on_leaked_sandbox_processes(session)
    else:
        _note_leaked_sandbox_processes(session)


LEAKS_NOTE = "sandbox-leaks-{}.txt"  # an xdist worker's, in the session's base directory


def _basetemp(session: pytest.Session) -> Path | None:
    """The process's base temporary directory if a tmp_path made it (none: no test ran
    anything there; getbasetemp() would make one now, and prune old ones)."""
    factory = getattr(session.config, "_tmp_path_factory", None)  # pytest's, for tmp_path
    basetemp = getattr(factory, "_basetemp", None)
    return None if basetemp is None else Path(basetemp)


def _leaked_here(basetemp: Path) -> list[str]:
    from tests.sandbox_leaks import leaked_sandbox_processes

    inspection = sys.modules.get("hypermedia.ingest.inspection")
    if inspection is not None:  # this process's own, which it closes at its exit
        inspection.close_server()
    return [str(found) for found in leaked_sandbox_processes(basetemp)]


def _note_leaked_sandbox_processes(session: pytest.Session) -> None:
    """An xdist worker's: its tests' sandbox processes still running as it ends would die
    with it (their parent-death signal) before the first process looks, unseen; named in
    a note the first process reads (:func:`_fail_on_leaked_sandbox_processes`)."""
    basetemp = _basetemp(session)
    if basetemp is None:
        return
    leaked = _leaked_here(basetemp)
    if leaked:
        worker = session.config.workerinput["workerid"]  # type: ignore[attr-defined]
        (basetemp.parent / LEAKS_NOTE.format(worker)).write_text("\n".join(leaked))


def _fail_on_leaked_sandbox_processes(session: pytest.Session) -> None:
    """Sandbox processes of this session that outlived their owners (every test, and the
    shared head's actors, are done), its xdist workers' included (their notes): named,
    killed, and the run fails (:mod:`tests.sandbox_leaks`)."""
    basetemp = _basetemp(session)
    if basetemp is None:
        return
    leaked = _leaked_here(basetemp)
    for note in sorted(basetemp.glob(LEAKS_NOTE.format("*"))):
        worker = note.name.removeprefix("sandbox-leaks-").removesuffix(".txt")
        leaked += [f"{line} (xdist worker {worker})" for line in note.read_text().splitlines()]
    if not leaked:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [
        f"{len(leaked)} sandbox process(es) of this session outlived their owners (killed now):",
        *(f"  {found}" for found in leaked),
    ]
    if reporter is not None:
        reporter.write_line("")
        for line in lines:
            reporter.write_line(line, red=True, bold=True)
    else:
        print("\n".join(lines), file=sys.stderr)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):
        from tests.cpu_report import remove_groups

        remove_groups()
    # The session's heap (Ray, SQLAlchemy, FastAPI, the pipelines, every test's leftovers)
    # is not collected once more as the interpreter ends (hypermedia.exits): ~0.2 CPU-s
    # of each pytest process, an xdist worker's too.
    from hypermedia.exits import freeze_at_exit

    freeze_at_exit()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for tier, mark in _TIER_MARKS.items():
            if item.path.is_relative_to(TESTS / tier):
                item.add_marker(mark)


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("HYPERMEDIA_") and not name.startswith("HYPERMEDIA_TEST_"):
            monkeypatch.delenv(name)


def _unreachable(check: Callable[[], None]) -> str | None:
    """The problem ``check`` reports, failed outside the except block (no chained noise)."""
    try:
        check()
    except support.ServiceNotReachable as exc:
        return str(exc)
    return None


# -- PostgreSQL -----------------------------------------------------------------------


@pytest.fixture(scope="session")
def pg_server() -> Iterator[support.PostgresServer]:
    server = support.PostgresServer(support.pg_server_url())
    problem = _unreachable(server.check)
    if problem:
        server.dispose()
        pytest.fail(problem, pytrace=False)
    server.drop_leftovers()
    yield server
    server.dispose()


@pytest.fixture(scope="session")
def pg_url(pg_server: support.PostgresServer) -> Iterator[str]:
    """The migrated template database (closed to connections: clone it)."""
    name = support.unique_name("tmpl")
    try:
        url = pg_server.create_template(name)
    except BaseException:
        pg_server.drop_database(name)
        raise
    yield url
    pg_server.drop_database(name)


@dataclass
class _Clones:
    """This process's clones of the template between two tests, emptied, and the
    template's :meth:`~tests.support.PostgresServer.fingerprint`."""

    fingerprint: str | None = None
    idle: list[str] = field(default_factory=list)


@pytest.fixture(scope="session")
def _pg_clones(pg_server: support.PostgresServer, pg_url: str) -> Iterator[_Clones]:
    clones = _Clones()
    yield clones
    for name in clones.idle:
        pg_server.drop_database(name)


@contextmanager
def _clone(pg_server: support.PostgresServer, pg_url: str, clones: _Clones) -> Iterator[str]:
    """A clone of the template, new or an emptied one of this process's, while in the
    block; emptied for the next after it (dropped if it cannot be: see below)."""
    if clones.idle:
        name = clones.idle.pop()
    else:
        name = support.unique_name()
        pg_server.create_database(name, template=support.database_name(pg_url))
        if clones.fingerprint is None:
            clones.fingerprint = pg_server.fingerprint(name)
    yield pg_server.database_url(name)
    fingerprint = clones.fingerprint
    if fingerprint is not None and pg_server.reset(name, fingerprint):
        clones.idle.append(name)
    else:
        pg_server.drop_database(name)


@pytest.fixture
def pg_database_url(
    pg_server: support.PostgresServer, pg_url: str, _pg_clones: _Clones
) -> Iterator[str]:
    """A migrated PostgreSQL database for this test only: a clone of the template, new
    or emptied after an earlier test of this process (:meth:`~tests.support.
    PostgresServer.reset`: a test that changed more than rows, or left a connection
    open, has its clone dropped)."""
    with _clone(pg_server, pg_url, _pg_clones) as url:
        yield url


@pytest.fixture
def pg_engine(pg_database_url: str) -> Iterator[Engine]:
    engine = make_engine(pg_database_url)
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def private_postgres_template() -> Iterator[Path]:
    """This process's data directory that each ``private_postgres`` copies."""
    path = support.PrivatePostgres.make_template()
    yield path
    shutil.rmtree(path.parent, ignore_errors=True)


@pytest.fixture
def private_postgres(private_postgres_template: Path) -> Iterator[support.PrivatePostgres]:
    server = support.PrivatePostgres(template=private_postgres_template)
    try:
        server.start()
        server.create_migrated()
        yield server
    finally:
        server.close()


# -- SQLite ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def _sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return support.make_sqlite_template(tmp_path_factory.mktemp("sqlite-template") / "template.db")


def _sqlite_copy(template: Path, directory: Path) -> str:
    """A copy of the migrated ``template`` as ``directory``'s record: its URL."""
    path = directory / "hypermedia.db"
    shutil.copyfile(template, path)
    path.chmod(0o600)  # as hypermedia makes its record (else every start warns)
    return f"sqlite:///{path}"


@pytest.fixture
def sqlite_url(_sqlite_template: Path, tmp_path: Path) -> str:
    """A fresh migrated SQLite file where ``Settings(data_dir=tmp_path)`` looks for it."""
    return _sqlite_copy(_sqlite_template, tmp_path)


@pytest.fixture
def sqlite_engine(sqlite_url: str) -> Iterator[Engine]:
    engine = make_engine(sqlite_url)
    yield engine
    engine.dispose()


@pytest.fixture(params=["postgresql", "sqlite"])
def engine(request: pytest.FixtureRequest) -> Engine:
    """Each test runs twice: on PostgreSQL and on SQLite. Only the one needed is built."""
    return _engine_of(request, "")


def _engine_of(request: pytest.FixtureRequest, scope: str) -> Engine:
    """The ``{scope}pg_engine`` or ``{scope}sqlite_engine`` fixture, as ``request.param``
    names the database."""
    database = "pg" if request.param == "postgresql" else "sqlite"
    value: Engine = request.getfixturevalue(f"{scope}{database}_engine")
    return value


# -- shared by a module's tests ------------------------------------------------------
# For many cases (a parametrized test) that each make rows of their own (their user,
# their job) and look at no other: one database, and one stack on it, for all of them
# instead of a clone and a Stack.open each.


@pytest.fixture(scope="module")
def module_pg_engine(
    pg_server: support.PostgresServer, pg_url: str, _pg_clones: _Clones
) -> Iterator[Engine]:
    """``pg_engine`` shared by the module's tests; emptied after its last one."""
    with _clone(pg_server, pg_url, _pg_clones) as url:
        engine = make_engine(url)
        yield engine
        engine.dispose()


@pytest.fixture(scope="module")
def module_sqlite_engine(
    _sqlite_template: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Engine]:
    """``sqlite_engine`` shared by the module's tests."""
    engine = make_engine(_sqlite_copy(_sqlite_template, tmp_path_factory.mktemp("module-sqlite")))
    yield engine
    engine.dispose()


@pytest.fixture(scope="module", params=["postgresql", "sqlite"])
def module_engine(request: pytest.FixtureRequest) -> Engine:
    """``engine`` shared by the module's tests: each runs on both, one database each."""
    return _engine_of(request, "module_")


@pytest.fixture(scope="module")
def module_settings(
    tmp_path_factory: pytest.TempPathFactory, _shared_redis_url: str
) -> Iterator[Callable[..., Settings]]:
    """``module_settings(engine, **overrides) -> Settings`` on ``engine``'s database, a
    data dir and a Redis prefix of the module's (its keys deleted after its last test)."""
    data_dir = tmp_path_factory.mktemp("module-data")
    prefix = support.unique_redis_prefix()

    def build(engine: Engine, **overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "data_dir": data_dir,
            "database_url": support.url_string(engine),
            "redis_url": _shared_redis_url,
            "redis_prefix": prefix,
        }
        values.update(overrides)
        return load_settings(**values)

    yield build
    _delete_keys(_shared_redis_url, prefix)


# -- Redis ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def _shared_redis_url() -> str:
    url = support.redis_server_url()
    problem = _unreachable(lambda: support.check_redis(url))
    if problem:
        pytest.fail(problem, pytrace=False)
    return url


@pytest.fixture
def redis_url(_shared_redis_url: str) -> str:
    return _shared_redis_url


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix of this test's own on the shared Redis; its keys go afterwards."""
    prefix = support.unique_redis_prefix()
    yield prefix
    _delete_keys(redis_url, prefix)


def _delete_keys(url: str, prefix: str) -> None:
    client = redis.Redis.from_url(url)
    try:
        support.delete_keys(client, prefix)
    finally:
        client.close()


@pytest.fixture
def redis_client(redis_url: str, redis_prefix: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(tmp_path / "redis")
    server.start()
    yield server
    server.stop()


# -- everything else ------------------------------------------------------------------


@pytest.fixture
def manual_clock() -> ManualClock:
    return ManualClock()


_DATABASE_FIXTURES = ("engine", "pg_engine", "pg_database_url", "sqlite_engine", "sqlite_url")


@pytest.fixture
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., Settings]:
    """``settings(**overrides)``: Settings on this test's database, Redis prefix and tmp_path.

    The database is the one the test already asked for (``engine``, ``pg_engine``,
    ``sqlite_engine`` ...), else a fresh SQLite file. Redis is the shared one under
    ``redis_prefix`` unless ``redis_url`` is overridden (e.g. ``private_redis.url``).
    """

    def build(**overrides: Any) -> Settings:
        values: dict[str, Any] = {"data_dir": tmp_path}
        if "database_url" not in overrides:
            values["database_url"] = _database_url(request)
        if "redis_url" not in overrides:
            values["redis_url"] = request.getfixturevalue("redis_url")
        if "redis_prefix" not in overrides:
            values["redis_prefix"] = request.getfixturevalue("redis_prefix")
        values.update(overrides)
        return load_settings(**values)

    return build


def _database_url(request: pytest.FixtureRequest) -> str:
    for name in _DATABASE_FIXTURES:
        if name in request.fixturenames:
            value = request.getfixturevalue(name)
            return support.url_string(value) if isinstance(value, Engine) else str(value)
    return str(request.getfixturevalue("sqlite_url"))
