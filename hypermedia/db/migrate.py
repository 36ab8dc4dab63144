"""Apply Alembic migrations programmatically (``hypermedia db upgrade``), and tell
whether a database is at the newest revision.

The check runs at the start of every command and service that opens the job record,
so it reads the two revisions without importing Alembic (about half a CPU-second of
imports, a third of a short CLI command's time): the newest one from the migration
files' ``revision`` / ``down_revision`` lines, the database's from its
``alembic_version`` table. tests/integration/test_migrations.py holds both equal to
Alembic's own answers. Migrating imports Alembic.

On PostgreSQL each migration runs in its own transaction, waits at most
:data:`LOCK_TIMEOUT_SECONDS` for each lock it takes (``lock_timeout``), and is tried
:data:`LOCK_ATTEMPTS` times. A migration that alters a table (``ACCESS EXCLUSIVE``)
behind a long transaction on it (a backup, a report, a session left open) would
otherwise wait for it to end, and every query of the running platform on that table
(submits, claims, completions) would queue behind the migration meanwhile. A migration
that gives up changes nothing of its own (those before it stay applied) and says which
one it is, what it was running and which sessions held it up. Two processes migrating
at once (two heads started together) take turns (:func:`take_turns`). On SQLite the
migrations run in one transaction (a writer waits for it whatever it does).
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
TURN_POLL_SECONDS = 0.2
# The engine's limits a migration's session goes without (see _migrate_postgresql).
_LIFTED = ("statement_timeout", "idle_in_transaction_session_timeout")

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
    """``step``: on SQLite in one transaction; on PostgreSQL each migration in its own,
    under ``lock_timeout``, tried again while a lock is not to be had (see the module
    docstring)."""
    if engine.dialect.name == "postgresql":
        _migrate_postgresql(engine, step, what)
        return
    cfg = alembic_config()
    with engine.connect() as conn, _foreign_keys_checked_at_commit(conn), conn.begin():
        cfg.attributes["connection"] = conn
        step(cfg)
        _check_foreign_keys(conn)


def _migrate_postgresql(engine: Engine, step: Callable[[Config], None], what: str) -> None:
    """One transaction a migration (env.py's ``transaction_per_migration``): a lock a
    migration takes is let go when it commits, not held through every migration after
    it. In one transaction, 0021's ACCESS EXCLUSIVE lock on processing_jobs was held
    while 0026 indexed objects and 0029 read it: an upgrade from 0019 of a record of 2M
    objects and 1M jobs stopped every claim for 4.9 s and every upload for 9.7 s. A
    migration may also build an index outside any transaction (:mod:`.online_ddl`). The
    session holds the advisory lock of :func:`take_turns` and its ``lock_timeout``
    from the first migration to the last."""
    timeout, attempts = LOCK_TIMEOUT_SECONDS, max(1, LOCK_ATTEMPTS)
    failures: dict[str | None, int] = {}
    with engine.connect() as conn:
        _take_turns_for_session(conn)
        try:
            # The engine's limits on statements (engine.STATEMENT_SECONDS) are not a
            # migration's: an index built concurrently on a big table, a batched fill
            # take what they take. Its lock waits get its own bound. RESET at the end
            # gives the connection the engine's back.
            for name in _LIFTED:
                conn.exec_driver_sql(f"SET {name} = 0")
            conn.exec_driver_sql(f"SET lock_timeout = '{max(1, round(timeout * 1000))}ms'")
            conn.commit()  # Alembic begins and commits each migration's transaction
            while True:
                cfg = alembic_config()
                cfg.attributes["connection"] = conn
                try:
                    step(cfg)
                    return
                except OperationalError as exc:
                    conn.rollback()
                    if getattr(exc.orig, "sqlstate", None) != _LOCK_NOT_AVAILABLE:
                        raise
                    at = current_revision(engine)
                    stuck = _next_migration(at, upgrading=what.startswith("to "))
                    failures[stuck] = failures.get(stuck, 0) + 1
                    holders = _lock_holders(engine, timeout)
                    if failures[stuck] == attempts:
                        raise ServiceUnavailable(
                            _gave_up(stuck, at, what, attempts, timeout, holders, exc),
                            holders=holders,
                            migration=stuck,
                        ) from exc
                    log.warning(
                        "the migration %s waited %g s for a lock (attempt %d of %d): held by"
                        " %s; trying again in %g s",
                        stuck,
                        timeout,
                        failures[stuck],
                        attempts,
                        holders,
                        LOCK_PAUSE_SECONDS,
                        extra={"action": "migrate"},
                    )
                    time.sleep(LOCK_PAUSE_SECONDS)
        finally:
            try:
                conn.rollback()
                for name in ("lock_timeout", *_LIFTED):
                    conn.exec_driver_sql(f"RESET {name}")
                conn.exec_driver_sql(f"SELECT pg_advisory_unlock({MIGRATION_LOCK_KEY})")
                conn.commit()
            except Exception:
                # Never back in the pool holding the lock (closing the session ends it);
                # the error that brought us here, if any, is the one to tell.
                conn.invalidate()


def _gave_up(
    stuck: str | None,
    at: str | None,
    what: str,
    attempts: int,
    timeout: float,
    holders: str,
    exc: OperationalError,
) -> str:
    done = (
        f"the database is at {at or 'no revision'}: the migrations before it are applied"
        if what.startswith("to ")
        else f"the database is at {at or 'no revision'}"
    )
    statement = " ".join(str(exc.statement or "").split())[:120]
    doing = f" (it was running: {statement})" if statement else ""
    return (
        f"the migration {stuck} (of the upgrade {what}) waited {attempts} times {timeout:g} s"
        f" for a lock on the record's tables and gave up, changing nothing of it{doing};"
        f" {done}. Other sessions hold the tables in long transactions ({holders}). Run"
        " `hypermedia db upgrade` again once they have ended (a backup, a report), or end"
        " them (SELECT pg_terminate_backend(pid)); the platform runs meanwhile"
    )


def _next_migration(at: str | None, *, upgrading: bool) -> str | None:
    """The migration that comes after revision ``at`` (``upgrading``), or undoes it,
    named by its file ("0026_objects_source_index")."""
    names = _migration_names()
    if not upgrading:
        return names.get(at, at) if at else None
    downs = _read_down_revisions()
    following = [rev for rev, down in downs.items() if down == at]
    return names.get(following[0], following[0]) if len(following) == 1 else None


def _take_turns_for_session(conn: Connection) -> None:
    """:func:`take_turns` for a whole session: a migration's transactions commit one by
    one (and an index built concurrently commits its own), so the lock is the session's,
    let go by :func:`_migrate_postgresql` at the end. It is the same key as the
    transaction's: a profile sync waits for it too."""
    _wait_for_turn(conn, f"SELECT pg_try_advisory_lock({MIGRATION_LOCK_KEY})", conn.commit)
    conn.commit()


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
    _wait_for_turn(conn, f"SELECT pg_try_advisory_xact_lock({MIGRATION_LOCK_KEY})")


def _wait_for_turn(
    conn: Connection, try_lock: str, between: Callable[[], None] = lambda: None
) -> None:
    """Try ``try_lock`` until it is had, :data:`TURN_POLL_SECONDS` apart. Not
    ``pg_advisory_lock``: a session waiting in it holds a snapshot, and an index built
    concurrently by the process whose turn it is (:mod:`.online_ddl`) waits for every
    snapshot older than its own: each waited for the other (deadlock detected). Between
    tries a session holds none (READ COMMITTED)."""
    if conn.exec_driver_sql(try_lock).scalar():
        return
    log.info(
        "another process is migrating this database or syncing its profiles: waiting for it",
        extra={"action": "migrate"},
    )
    while True:
        between()
        time.sleep(TURN_POLL_SECONDS)
        if conn.exec_driver_sql(try_lock).scalar():
            return


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
    # The tables first, then the revision: another process's first migration commits
    # its tables with its revision, so tables seen mean its revision is seen after them.
    # The other way round, a second head starting beside the first read no revision,
    # then the first's new tables: "another application's database" (CI, 1 run).
    taken = _hypermedias_names(engine)
    revision = current_revision(engine)
    if revision in known_revisions() or (revision is None and not taken):
        return None
    return _problem(engine, revision, taken)


def _problem(engine: Engine, revision: str | None, taken: list[str] | None = None) -> str | None:
    head = head_revision()
    if revision == head:
        return None
    if revision is None:
        taken = _hypermedias_names(engine) if taken is None else taken
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
    from hypermedia.db.models import metadata

    with snapshot(engine) as conn:
        present = set(inspect(conn).get_table_names())
    return sorted(present & set(metadata.tables))


def _read_revisions() -> tuple[set[str], set[str]]:
    """The migrations' revisions, and those another names as its ``down_revision``."""
    downs = _read_down_revisions()
    return set(downs), {down for down in downs.values() if down}


@cache
def _read_down_revisions() -> dict[str, str | None]:
    """Each migration's revision and its ``down_revision``."""
    return {rev: down for rev, (down, _) in _read_migrations().items()}


@cache
def _migration_names() -> dict[str, str]:
    """Each migration's revision and its file's name ("0026_objects_source_index")."""
    return {rev: name for rev, (_, name) in _read_migrations().items()}


def _read_migrations() -> dict[str, tuple[str | None, str]]:
    found: dict[str, tuple[str | None, str]] = {}
    for path in (MIGRATIONS / "versions").glob("*.py"):
        source = path.read_text(encoding="utf-8")
        revision = _REVISION.search(source)
        if revision is None:
            raise RuntimeError(f"{path.name}: a migration without a revision")
        down = _DOWN.search(source)
        if down is None:
            raise RuntimeError(f"{path.name}: a migration without a down_revision")
        found[revision.group(1)] = (down.group(1) or None, path.stem)
    return found
