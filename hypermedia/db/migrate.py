"""Apply Alembic migrations programmatically (``hypermedia db upgrade``), and tell
whether a database is at the newest revision.

The check runs at the start of every command and service that opens the job record,
so it reads the two revisions without importing Alembic (about half a CPU-second of
imports, a third of a short CLI command's time): the newest one from the migration
files' ``revision`` / ``down_revision`` lines, the database's from its
``alembic_version`` table. tests/integration/test_migrations.py holds both equal to
Alembic's own answers. Migrating imports Alembic.

On PostgreSQL a migration waits at most :data:`LOCK_TIMEOUT_SECONDS` for each lock it
takes (``lock_timeout``), and is tried :data:`LOCK_ATTEMPTS` times. A migration that
alters a table (``ACCESS EXCLUSIVE``) behind a long transaction on it (a backup, a
report, a session left open) would otherwise wait for it to end, and every query of
the running platform on that table (submits, claims, completions) would queue behind
the migration meanwhile. A migration that gives up changes nothing (one transaction)
and says which sessions held it up. Two processes migrating at once (two heads started
together) take turns (:func:`take_turns`).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, Row, column, inspect, select, table, text
from sqlalchemy.exc import OperationalError

from hypermedia.db.engine import snapshot
from hypermedia.errors import HypermediaError, ServiceUnavailable

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
VERSION_TABLE = "alembic_version"  # Alembic's default, which env.py keeps
_REVISION = re.compile(r"^revision\s*(?::\s*str\s*)?=\s*['\"]([^'\"]+)['\"]", re.M)
_DOWN = re.compile(r"^down_revision\s*(?::[^=]+)?=\s*(?:['\"]([^'\"]+)['\"]|None)", re.M)
# PostgreSQL: how long a migration waits for one lock, how often it is tried, the pause
# between tries (read at each call).
LOCK_TIMEOUT_SECONDS = 5.0
LOCK_ATTEMPTS = 6
LOCK_PAUSE_SECONDS = 5.0
_LOCK_NOT_AVAILABLE = "55P03"  # SQLSTATE of lock_timeout
# PostgreSQL: the advisory lock (pg_advisory_xact_lock's key, "hm_migra") a migration's
# and a profile sync's transaction hold, so that two processes doing either at once
# take turns (see :func:`take_turns`).
MIGRATION_LOCK_KEY = 0x686D5F6D69677261

log = logging.getLogger(__name__)


def alembic_config(url: str | None = None) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    if url:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    from alembic import command

    _migrate(engine, lambda cfg: command.upgrade(cfg, revision), f"to {revision}")


def downgrade(engine: Engine, revision: str) -> None:
    from alembic import command

    _migrate(engine, lambda cfg: command.downgrade(cfg, revision), f"down to {revision}")


def _migrate(engine: Engine, step: Callable[[Config], None], what: str) -> None:
    """``step`` in one transaction; on PostgreSQL under ``lock_timeout``, tried again
    while a lock is not to be had (see the module docstring)."""
    postgres = engine.dialect.name == "postgresql"
    timeout, attempts = LOCK_TIMEOUT_SECONDS, max(1, LOCK_ATTEMPTS)
    for attempt in range(1, attempts + 1):
        cfg = alembic_config()
        try:
            with engine.connect() as conn, _foreign_keys_checked_at_commit(conn), conn.begin():
                take_turns(conn)
                if postgres:
                    conn.exec_driver_sql(
                        f"SET LOCAL lock_timeout = '{max(1, round(timeout * 1000))}ms'"
                    )
                cfg.attributes["connection"] = conn
                step(cfg)
                _check_foreign_keys(conn)
            return
        except OperationalError as exc:
            if getattr(exc.orig, "sqlstate", None) != _LOCK_NOT_AVAILABLE:
                raise
            holders = _lock_holders(engine, timeout)
            if attempt == attempts:
                raise ServiceUnavailable(
                    f"the migration {what} waited {attempts} times {timeout:g} s for a lock on"
                    " the record's tables and gave up, changing nothing: other sessions hold"
                    f" them in long transactions ({holders}). Run it again once they have"
                    " ended (a backup, a report), or end them",
                    holders=holders,
                ) from exc
            log.warning(
                "the migration %s waited %g s for a lock (attempt %d of %d): held by %s;"
                " trying again in %g s",
                what,
                timeout,
                attempt,
                attempts,
                holders,
                LOCK_PAUSE_SECONDS,
                extra={"action": "migrate"},
            )
            time.sleep(LOCK_PAUSE_SECONDS)


def take_turns(conn: Connection) -> None:
    """Wait, to the end of ``conn``'s transaction, for any other process migrating the
    database or syncing its profiles. Two heads started at once (or ``db upgrade`` beside
    an ``up``) both migrated an empty database: the second's CREATE TABLE waited for the
    first's and then failed ('duplicate key value violates unique constraint
    "pg_type_typname_nsp_index"'), as did both syncing a new profile version. On
    PostgreSQL an advisory lock, taken before the lock timeout is set: a migration of a
    big table takes what it takes, and the one waiting then finds nothing left to do.
    SQLite needs none: such a transaction takes the write lock as it begins."""
    if conn.dialect.name != "postgresql":
        return
    key = MIGRATION_LOCK_KEY
    if conn.exec_driver_sql(f"SELECT pg_try_advisory_xact_lock({key})").scalar():
        return
    log.info(
        "another process is migrating this database or syncing its profiles: waiting for it",
        extra={"action": "migrate"},
    )
    conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({key})")


@contextmanager
def _foreign_keys_checked_at_commit(conn: Connection) -> Iterator[None]:
    """On SQLite, foreign keys off for the migration's transaction (then
    :func:`_check_foreign_keys` before it commits): the procedure SQLite documents for a
    schema change it cannot make in place. Alembic's batch mode makes such a change
    (a constraint added, a column dropped) by copying the table, dropping it and
    renaming the copy, and with foreign keys on, dropping a table other rows refer to
    fails: every database with a job that had an attempt could not be upgraded past
    0013. The pragma is a no-op inside a transaction, so it is set before it begins."""
    if conn.dialect.name != "sqlite":
        yield
        return
    driver = conn.connection.driver_connection
    assert driver is not None
    driver.execute("PRAGMA foreign_keys=OFF")
    try:
        yield
    finally:
        try:
            driver.execute("PRAGMA foreign_keys=ON")
        except Exception:
            conn.invalidate()  # never back in the pool without its foreign keys
            raise


def _check_foreign_keys(conn: Connection) -> None:
    if conn.dialect.name != "sqlite":
        return
    broken = conn.exec_driver_sql("PRAGMA foreign_key_check").all()
    if broken:
        shown = "; ".join(f"{r[0]} row {r[1]} -> {r[2]}" for r in broken[:5])
        raise HypermediaError(
            f"the migration would leave {len(broken)} row(s) referring to rows that do not"
            f" exist ({shown}); nothing was changed"
        )


def _lock_holders(engine: Engine, older_than: float) -> str:
    """The other sessions of this database holding table locks in a transaction begun
    more than ``older_than`` seconds ago: what a migration waited for."""
    query = text(
        "SELECT DISTINCT a.pid, a.application_name, a.state, a.xact_start,"
        " left(a.query, 80) AS query FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
        " WHERE l.locktype = 'relation' AND l.granted"
        " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        " AND a.pid <> pg_backend_pid()"
        " AND a.xact_start < now() - make_interval(secs => :older_than)"
        " ORDER BY a.xact_start LIMIT 5"
    )
    try:
        with engine.connect() as conn:
            rows = conn.execute(query, {"older_than": older_than}).all()
    except OperationalError as exc:
        return f"not known: {exc.orig or exc}"
    if not rows:
        return "none left now"
    return "; ".join(_holder(row) for row in rows)


def _holder(row: Row[Any]) -> str:
    name = f" {row.application_name!r}" if row.application_name else ""
    began = f"{row.xact_start:%Y-%m-%d %H:%M:%S%z}"
    return f"pid {row.pid}{name}, {row.state}, in a transaction since {began}: {row.query}"


def current_revision(engine: Engine) -> str | None:
    """The database's revision; None before the first migration. A database that cannot
    be reached is :class:`~hypermedia.errors.DatabaseUnavailable` (every command that
    opens the stack asks this first)."""
    with snapshot(engine) as conn:
        if not inspect(conn).has_table(VERSION_TABLE):
            return None
        version = table(VERSION_TABLE, column("version_num"))
        rows = conn.execute(select(version.c.version_num)).scalars().all()
    if len(rows) > 1:
        raise RuntimeError(f"the database is at several revisions at once: {sorted(rows)}")
    return rows[0] if rows else None


@cache
def known_revisions() -> frozenset[str]:
    """Every revision this code's migrations hold."""
    return frozenset(_read_revisions()[0])


@cache
def head_revision() -> str | None:
    """The newest migration: the one no other names as its ``down_revision``."""
    revisions, revised = _read_revisions()
    heads = sorted(revisions - revised)
    if len(heads) > 1:
        raise RuntimeError(f"the migrations have several heads: {heads}")
    return heads[0] if heads else None


def schema_problem(engine: Engine) -> str | None:
    """What keeps this code from using the database's schema, said so that the operator
    knows which way to go; None when it is at :func:`head_revision`.

    A database at a revision these migrations do not hold was migrated by a newer
    hypermedia: ``db upgrade`` cannot help (Alembic cannot find the revision), the
    code must be upgraded (a worker or a head left on the old version after a deploy).
    Another application's database (tables of hypermedia's names but no revision, or a
    revision and no job table) is said to be one."""
    return _problem(engine, current_revision(engine))


def upgrade_problem(engine: Engine) -> str | None:
    """:func:`schema_problem`'s answer when ``db upgrade`` must refuse the database (it
    is newer than this code, or another application's), else None."""
    revision = current_revision(engine)
    if revision in known_revisions() or (revision is None and not _hypermedias_names(engine)):
        return None
    return _problem(engine, revision)


def _problem(engine: Engine, revision: str | None) -> str | None:
    head = head_revision()
    if revision == head:
        return None
    if revision is None:
        taken = _hypermedias_names(engine)
        if taken:
            return (
                f"the database has no hypermedia schema but tables named as hypermedia's"
                f" ({', '.join(taken)}): another application's database? Point it at an"
                " empty database or at hypermedia's"
            )
        return "the database has no schema yet: run `hypermedia db upgrade`"
    if revision not in known_revisions():
        if "processing_jobs" not in _hypermedias_names(engine):
            return (
                f"the database is at revision {revision} and has no job record: another"
                " application's database? Point it at hypermedia's"
            )
        return (
            f"the database schema is at revision {revision}, which this hypermedia does not"
            f" know (its newest is {head}): a newer hypermedia migrated it. Run that version"
            " here (upgrade this installation); `hypermedia db upgrade` cannot go back"
        )
    return (
        f"the database schema is at revision {revision}, this hypermedia needs {head}:"
        " run `hypermedia db upgrade`"
    )


def _hypermedias_names(engine: Engine) -> list[str]:
    """The database's tables that bear the name of one of hypermedia's."""
    from hypermedia.db.models import Base

    with snapshot(engine) as conn:
        present = set(inspect(conn).get_table_names())
    return sorted(present & set(Base.metadata.tables))


def _read_revisions() -> tuple[set[str], set[str]]:
    """The migrations' revisions, and those another names as its ``down_revision``."""
    revisions: set[str] = set()
    revised: set[str] = set()
    for path in (MIGRATIONS / "versions").glob("*.py"):
        source = path.read_text(encoding="utf-8")
        found = _REVISION.search(source)
        if found is None:
            raise RuntimeError(f"{path.name}: a migration without a revision")
        revisions.add(found.group(1))
        down = _DOWN.search(source)
        if down is None:
            raise RuntimeError(f"{path.name}: a migration without a down_revision")
        if down.group(1):
            revised.add(down.group(1))
    return revisions, revised
