"""Helpers behind the fixtures in ``conftest.py``: real PostgreSQL databases
(created from a migrated template, one per test) and Redis key clean-up.

Nothing here skips: a service that cannot be reached raises
:class:`ServiceNotReachable` with what was tried and how to fix it, and the
fixtures turn that into a test failure.
"""

from __future__ import annotations

import contextlib
import datetime
import glob
import os
import pwd
import shutil
import sqlite3
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import redis
from sqlalchemy import Connection, Engine, create_engine, event, make_url, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from hypermedia.db import migrate
from hypermedia.db.engine import make_engine

DEFAULT_PG_SERVER_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
PG_ENV = "HYPERMEDIA_TEST_PG_URL"
REDIS_ENV = "HYPERMEDIA_TEST_REDIS_URL"
NAME_PREFIX = "hmtest"


class ServiceNotReachable(RuntimeError):
    """A service the tests need is down; the message says which and how to start it."""


def pg_server_url() -> str:
    """The PostgreSQL server (any existing database on it) the tests create databases on."""
    url = os.environ.get(PG_ENV) or DEFAULT_PG_SERVER_URL
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    return url


def redis_server_url() -> str:
    return os.environ.get(REDIS_ENV) or DEFAULT_REDIS_URL


def unique_name(kind: str = "db") -> str:
    """``hmtest_<kind>_<pid>_<8 hex>``: a valid, lower-case PostgreSQL identifier."""
    return f"{NAME_PREFIX}_{kind}_{os.getpid()}_{uuid.uuid4().hex[:8]}"


def unique_redis_prefix() -> str:
    """A key prefix valid for ``Settings.redis_prefix`` (no colon allowed there)."""
    return f"{NAME_PREFIX}-{uuid.uuid4().hex[:8]}"


def database_name(url: str) -> str:
    name = make_url(url).database
    if not name:
        raise ValueError("the URL names no database")
    return name


def url_string(engine: Engine) -> str:
    """An engine's URL with its password, as Settings and subprocesses need it."""
    return engine.url.render_as_string(hide_password=False)


_OTHER_SESSIONS = (
    "SELECT count(*) FROM pg_stat_activity"
    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
)
_TABLES = (
    "SELECT tablename FROM pg_tables"
    f" WHERE schemaname = 'public' AND tablename <> '{migrate.VERSION_TABLE}'"
)
_SEQUENCES = "SELECT sequencename FROM pg_sequences WHERE schemaname = 'public'"
_FINGERPRINT = f"""
SELECT md5(string_agg(x, E'\n' ORDER BY x)) FROM (
  SELECT 'c:' || table_schema || '.' || table_name || '.' || column_name || ':' || data_type
         || ':' || coalesce(column_default, '') || ':' || is_nullable AS x
    FROM information_schema.columns
   WHERE table_schema NOT IN ('pg_catalog', 'information_schema')
  UNION ALL SELECT 'i:' || indexdef FROM pg_indexes WHERE schemaname <> 'pg_catalog'
  UNION ALL SELECT 'k:' || conname || ':' || pg_get_constraintdef(oid) FROM pg_constraint
   WHERE connamespace = 'public'::regnamespace
  UNION ALL SELECT 'v:' || version_num FROM {migrate.VERSION_TABLE}
  UNION ALL SELECT 't:' || tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
   WHERE c.relnamespace = 'public'::regnamespace AND NOT tgisinternal
  UNION ALL SELECT 'f:' || proname FROM pg_proc WHERE pronamespace = 'public'::regnamespace
  UNION ALL SELECT 'n:' || nspname FROM pg_namespace
   WHERE nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema'
  UNION ALL SELECT 'a:' || relname || ':' || coalesce(relacl::text, '') FROM pg_class
   WHERE relnamespace = 'public'::regnamespace
  UNION ALL SELECT 'e:' || extname FROM pg_extension
  UNION ALL SELECT 'd:' || array_to_string(setconfig, ',') FROM pg_db_role_setting
   WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
) AS q
"""


class PostgresServer:
    """Creates, clones and drops databases on one server (AUTOCOMMIT, no pool)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._admin = create_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool)

    def check(self) -> None:
        try:
            with self._admin.connect() as conn:
                conn.execute(text("SELECT 1"))
        except SQLAlchemyError as exc:
            shown = make_url(self.url).render_as_string(hide_password=True)
            raise ServiceNotReachable(
                f"PostgreSQL is not reachable at {shown}: {exc.__class__.__name__}: "
                f"{getattr(exc, 'orig', exc)}\n"
                f"Start it (./.ci/run does) or point {PG_ENV} at a server where this user "
                "may CREATE DATABASE."
            ) from exc

    def database_url(self, name: str) -> str:
        return make_url(self.url).set(database=name).render_as_string(hide_password=False)

    def _quote(self, name: str) -> str:
        return self._admin.dialect.identifier_preparer.quote_identifier(name)

    def create_database(self, name: str, template: str | None = None) -> str:
        """Create ``name`` (a copy of ``template`` if given) and return its URL."""
        sql = f"CREATE DATABASE {self._quote(name)}"
        if template is not None:
            sql += f" TEMPLATE {self._quote(template)}"
        with self._admin.connect() as conn:
            conn.execute(text(sql))
        return self.database_url(name)

    def create_template(self, name: str) -> str:
        """Create ``name``, migrate it to head, then close it to connections.

        Closed (``ALLOW_CONNECTIONS false``) because CREATE DATABASE ... TEMPLATE
        fails while anyone is connected to the template, and so no test can
        change what every later test starts from.
        """
        url = self.create_database(name)
        engine = make_engine(url)
        try:
            migrate.upgrade(engine)
        finally:
            engine.dispose()
        with self._admin.connect() as conn:
            conn.execute(
                text(f"ALTER DATABASE {self._quote(name)} IS_TEMPLATE true ALLOW_CONNECTIONS false")
            )
        return url

    def drop_database(self, name: str) -> None:
        with self._admin.connect() as conn:
            if self._is_template(conn, name):
                conn.execute(text(f"ALTER DATABASE {self._quote(name)} IS_TEMPLATE false"))
            conn.execute(text(f"DROP DATABASE IF EXISTS {self._quote(name)} WITH (FORCE)"))

    def fingerprint(self, name: str) -> str:
        """What a test could change of ``name`` besides its rows (schema, revision,
        grants, extensions), as one digest: :meth:`reset` hands on only a database
        whose digest is still its template's."""
        with self._database(name).connect() as conn:
            return str(conn.execute(text(_FINGERPRINT)).scalar_one())

    def reset(self, name: str, fingerprint: str) -> bool:
        """Make ``name`` (a clone of the migrated template) as it was cloned again, for
        the next test of this process: every row deleted (the template's only rows are
        its Alembic revision), every sequence restarted. ~35 ms where a drop and a new
        clone cost ~290 ms (mostly the server's CPU: ~300 of them a default run).
        False, nothing done, when the database is no longer its template's
        (:meth:`fingerprint`) or someone is still connected to it: drop it then."""
        engine = self._database(name)
        try:
            with engine.connect() as conn:
                others = conn.execute(text(_OTHER_SESSIONS)).scalar_one()
                if others or conn.execute(text(_FINGERPRINT)).scalar_one() != fingerprint:
                    return False
                tables = conn.execute(text(_TABLES)).scalars().all()
                sequences = conn.execute(text(_SEQUENCES)).scalars().all()
                conn.execute(text("SET LOCAL session_replication_role = replica"))  # no FKs
                statements = [f"DELETE FROM {self._quote(t)}" for t in tables]
                statements += [f"ALTER SEQUENCE {self._quote(q)} RESTART" for q in sequences]
                conn.execute(text("; ".join(statements)))
                conn.commit()
            return True
        except SQLAlchemyError:
            return False
        finally:
            engine.dispose()

    def _database(self, name: str) -> Engine:
        return create_engine(self.database_url(name), poolclass=NullPool)

    def drop_leftovers(self) -> list[str]:
        """Drop the test databases (:func:`unique_name`) of test processes no longer
        running: what a run killed before its teardown left. Only on a server of this
        machine, where the pid in each name is one of this machine's processes."""
        host = make_url(self.url).host
        if host not in (None, "", "127.0.0.1", "localhost", "::1"):
            return []
        with self._admin.connect() as conn:
            names = conn.execute(
                text("SELECT datname FROM pg_database WHERE datname LIKE :prefix"),
                {"prefix": f"{NAME_PREFIX}\\_%"},
            ).scalars()
            found = list(names)
        dropped = []
        for name in found:
            parts = name.split("_")
            if len(parts) == 4 and parts[2].isdigit() and not psutil.pid_exists(int(parts[2])):
                try:
                    self.drop_database(name)
                except SQLAlchemyError:
                    continue  # another xdist worker dropped it first
                dropped.append(name)
        return dropped

    @staticmethod
    def _is_template(conn: Connection, name: str) -> bool:
        row = conn.execute(
            text("SELECT datistemplate FROM pg_database WHERE datname = :name"), {"name": name}
        ).first()
        return bool(row and row[0])

    def database_exists(self, name: str) -> bool:
        with self._admin.connect() as conn:
            row = conn.execute(
                text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": name}
            ).first()
        return row is not None

    def dispose(self) -> None:
        self._admin.dispose()


def within(seconds: float, check: Callable[[], bool]) -> bool:
    """Whether ``check`` came true within ``seconds`` (asked every 50 ms)."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def open_handles(path: Path) -> int:
    """This process's descriptors open on ``path`` (an API serving in a thread of it)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{fd}") == str(path)
    return count


def waits_for_a_lock(engine: Engine, sessions: int = 1) -> bool:
    """At least ``sessions`` sessions of ``engine``'s PostgreSQL database wait for a
    lock (statements a test holds back with row locks of its own are under way)."""
    with engine.connect() as conn:
        waiting = conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
        ).scalar_one()
    return int(waiting) >= sessions


@contextlib.contextmanager
def statements_sent(engine: Engine, *starts: str) -> Iterator[list[str]]:
    """The statements ``engine`` sends in the block that start with one of ``starts``
    (case and leading space aside; an executemany is one), the list filled as they go."""
    sent: list[str] = []
    wanted = tuple(start.upper() for start in starts)

    def note(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith(wanted):
            sent.append(statement)

    event.listen(engine, "before_cursor_execute", note)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", note)


def write_locks(engine: Engine) -> contextlib.AbstractContextManager[list[str]]:
    """The SQLite write locks ``engine`` takes while in the block: one ``BEGIN
    IMMEDIATE`` each (:func:`hypermedia.db.engine.transaction`; a snapshot's is a
    plain ``BEGIN``), the list filled as they are taken."""
    return statements_sent(engine, "BEGIN IMMEDIATE")


def make_sqlite_template(path: Path) -> Path:
    """A migrated SQLite file, checkpointed so a plain file copy is complete."""
    engine = make_engine(f"sqlite:///{path}")
    try:
        migrate.upgrade(engine)
    finally:
        engine.dispose()
    # Outside any transaction (make_engine opens every one with BEGIN IMMEDIATE).
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path


def check_redis(url: str) -> None:
    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        raise ServiceNotReachable(
            f"Redis is not reachable at {url}: {exc}\n"
            f"Start it (./.ci/run does) or point {REDIS_ENV} at a Redis server."
        ) from exc
    finally:
        client.close()


def delete_keys(client: redis.Redis, prefix: str) -> int:
    """Delete every key starting with ``prefix`` (SCAN + UNLINK; never FLUSH*)."""
    if not prefix or any(char in prefix for char in "*?[]\\"):
        raise ValueError(f"refusing to delete keys under prefix {prefix!r}")
    deleted = 0
    batch: list[bytes | str] = []
    for key in client.scan_iter(match=f"{prefix}*", count=1000):
        batch.append(key)
        if len(batch) >= 500:
            deleted += int(client.unlink(*batch))
            batch.clear()
    if batch:
        deleted += int(client.unlink(*batch))
    return deleted


_MOTO_DEFAULT_AMIS = "MOTO_EC2_LOAD_DEFAULT_AMIS"


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """moto's server mode on a free port of 127.0.0.1 (real HTTP for boto3); its URL.

    Its EC2 without moto's catalogue of public AMIs (thousands of images, made again
    at every reset and in every region a test touched: a quarter of the AWS driver
    tests' CPU): a test registers the image it launches."""
    from moto.server import ThreadedMotoServer

    previous = os.environ.get(_MOTO_DEFAULT_AMIS)
    os.environ[_MOTO_DEFAULT_AMIS] = "false"  # read by moto's EC2 as it builds a region
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        if previous is None:
            os.environ.pop(_MOTO_DEFAULT_AMIS, None)
        else:
            os.environ[_MOTO_DEFAULT_AMIS] = previous


def set_moto_launch_time(instance_id: str, launched: float, region: str = "us-east-1") -> None:
    """Say that EC2 started ``instance_id`` at ``launched`` (epoch seconds): what
    DescribeInstances answers as its ``LaunchTime`` from now on. EC2's API cannot set it;
    :func:`moto_server` runs in this process, so its backend can."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ec2.models import ec2_backends

    instance = ec2_backends[DEFAULT_ACCOUNT_ID][region].get_instance(instance_id)
    # moto keeps it as a naive UTC datetime, as its own clock gives it.
    moment = datetime.datetime.fromtimestamp(launched, datetime.UTC).replace(tzinfo=None)
    instance.launch_time = moment


@contextlib.contextmanager
def moto_bucket(
    monkeypatch: Any, prefix: str, region: str = "us-east-1"
) -> Iterator[dict[str, str]]:
    """A bucket on :func:`moto_server` (its test credentials in the environment), as
    the settings that name it: ``storage_backend``, ``s3_bucket``, ``s3_endpoint_url``,
    ``s3_region``."""
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "hypermedia-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hypermedia-test-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", region)
    with moto_server() as endpoint:
        bucket = f"{prefix}-{uuid.uuid4().hex[:10]}"
        boto3.client("s3", endpoint_url=endpoint, region_name=region).create_bucket(Bucket=bucket)
        yield {
            "storage_backend": "s3",
            "s3_bucket": bucket,
            "s3_endpoint_url": endpoint,
            "s3_region": region,
        }


MIGRATED = "hmtest_migrated"  # PrivatePostgres.make_template's migrated template database


class PrivatePostgres:
    """A PostgreSQL server of one test's own (``initdb`` + ``pg_ctl`` on a free port of
    127.0.0.1, trust auth), for tests that stop and start it. ``url`` names a migrated
    database on it. As root, the server runs as the ``postgres`` user (PostgreSQL
    refuses to run as root).

    ``template``, a data directory :meth:`make_template` made, is copied instead of
    running initdb, and :meth:`create_migrated` clones its migrated database instead of
    migrating one from nothing: initdb and the migrations cost ~1.5 CPU-s a server,
    the copy and the clone ~0.1 (measured)."""

    def __init__(self, template: Path | None = None) -> None:
        from hypermedia.embedded import free_port

        self.bindir = _postgres_bindir()
        self.port = free_port()
        self._user = "postgres" if os.geteuid() == 0 else None
        self.base = Path(tempfile.mkdtemp(prefix="hmtest-pg-", dir=_memory_dir()))
        self.data = self.base / "data"
        if self._user is not None:
            entry = pwd.getpwnam(self._user)
            os.chown(self.base, entry.pw_uid, entry.pw_gid)
        if template is None:
            self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-sync")
        else:  # -a: the postgres user's files, modes and all
            subprocess.run(["cp", "-a", str(template), str(self.data)], check=True)
        self._migrated_template = template is not None
        self.url = ""
        self._started = False

    @classmethod
    def make_template(cls) -> Path:
        """A data directory for ``PrivatePostgres(template=...)`` (the caller removes
        it): initdb's, with a migrated template database (:data:`MIGRATED`), shut down
        cleanly (a copy starts with no recovery to do)."""
        server = cls()
        try:
            server.start()
            admin = PostgresServer(server.server_url())
            try:
                admin.create_template(MIGRATED)
            finally:
                admin.dispose()
            server.stop("fast")
            path = Path(tempfile.mkdtemp(prefix="hmtest-pg-template-", dir=_memory_dir()))
            subprocess.run(["cp", "-a", str(server.data), str(path / "data")], check=True)
        finally:
            server.close()
        return path / "data"

    def _run(self, program: str, *args: str) -> None:
        done = subprocess.run(
            [str(Path(self.bindir) / program), *args],
            user=self._user,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise ServiceNotReachable(
                f"{program} {' '.join(args)} failed ({done.returncode}): "
                f"{done.stderr.strip() or done.stdout.strip()}"
            )

    def server_url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        """Start the server. Its first start moves to another free port if its pick was
        taken meanwhile (by any process of a parallel run); later ones keep the port
        the tests' URLs name."""
        from hypermedia.embedded import free_port

        for tries_left in reversed(range(3)):
            try:
                self._start()
                break
            except ServiceNotReachable:
                log = (self.base / "server.log").read_text(errors="replace")
                if self._started or not tries_left or "could not bind" not in log:
                    raise
                self.port = free_port()
        self._started = True

    def _start(self) -> None:
        # fsync off: an immediate stop keeps every commit (the OS still has them);
        # synchronous_commit must stay on or it would not.
        options = f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1 -c fsync=off"
        log = str(self.base / "server.log")
        self._run("pg_ctl", "-D", str(self.data), "-l", log, "-o", options, "-w", "start")

    def stop(self, mode: str = "immediate") -> None:
        """Stop the server (``immediate``: as a crash would, no shutdown checkpoint)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def create_migrated(self, name: str = "hypermedia") -> str:
        server = PostgresServer(self.server_url())
        try:
            template = MIGRATED if self._migrated_template else None
            self.url = server.create_database(name, template=template)
        finally:
            server.dispose()
        if template is None:
            engine = make_engine(self.url)
            try:
                migrate.upgrade(engine)
            finally:
                engine.dispose()
        return self.url

    def close(self) -> None:
        with contextlib.suppress(ServiceNotReachable):
            self.stop()
        shutil.rmtree(self.base, ignore_errors=True)


MEMORY_DIR = Path("/dev/shm")
MEMORY_DIR_ROOM = 2 << 30  # bytes free that it must have (a server's files: ~50 MB)


def _memory_dir() -> str | None:
    """Where a private server's files go: Linux's shared-memory tmpfs when it has room
    (a container's may be 64 MB), else the temp dir. Written to a disk, each server's
    ~50 MB of new files (initdb's or a copy) cost ~1.4 CPU-s; in memory 0.15-0.7."""
    try:
        found = os.statvfs(MEMORY_DIR)
    except OSError:
        return None
    room = found.f_bavail * found.f_frsize
    return str(MEMORY_DIR) if room >= MEMORY_DIR_ROOM and os.access(MEMORY_DIR, os.W_OK) else None


def _postgres_bindir() -> str:
    """Where initdb and pg_ctl are: on PATH, else Debian's versioned directory."""
    found = shutil.which("initdb")
    if found:
        return str(Path(found).resolve().parent)
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4])
    )
    if not candidates:
        raise ServiceNotReachable(
            "initdb is not installed: a private PostgreSQL needs the server binaries "
            "(Debian: postgresql)"
        )
    return str(Path(candidates[-1]).parent)


# A local stack (`hypermedia up`) whose tests submit images only: one actor, for the
# images queue, instead of one per queue (each a Ray worker and a fork server with
# every pipeline loaded); ingest then refuses the other queues' operations.
IMAGES_ONLY = {
    f"HYPERMEDIA_QUEUES__{queue.upper()}__WORKERS": "0"
    for queue in ("documents", "ocr", "media", "bulk")
}
