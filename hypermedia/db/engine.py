"""Engines and transactions for PostgreSQL (psycopg 3) and SQLite.

SQLite is the embedded default: WAL journal, foreign keys on, and every
transaction opened with ``BEGIN IMMEDIATE`` so writers queue for the lock
instead of failing half-way with "database is locked" on lock upgrade.
Connection failures are translated into :class:`DatabaseUnavailable` here, and so
are PostgreSQL refusing work for what it lacks (a full disk, memory, connection slots:
:data:`_UNAVAILABLE_SQLSTATES`) or for being a standby (a write on a connection that a
failover left on a read-only server: the connection is dropped), a SQLite record
another process kept locked past :data:`SQLITE_BUSY_SECONDS`, one whose file could
not be read or written (a disk I/O error, a full disk) and one opened read-only (its
mount gone read-only: the connection is dropped, :data:`SQLITE_READONLY`).
"""

from __future__ import annotations

import math
import os
import re
import select
import time
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, create_engine, event, make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError, OperationalError

from hypermedia.errors import ConfigError, DatabaseUnavailable

if TYPE_CHECKING:
    from hypermedia.config import Settings


def make_engine(
    url: str,
    *,
    custom_plans: bool = False,
    setting: str = "database_url (HYPERMEDIA_DATABASE_URL)",
    sqlite_busy_seconds: float | None = None,
    dead_peer_seconds: float | None = None,
    statement_seconds: float | None = None,
    pooling: str = "session",
    **kwargs: Any,
) -> Engine:
    """An engine for ``url``. ``custom_plans``: on PostgreSQL every statement of its
    connections is planned for the parameters it runs with (see :data:`PLAN_CACHE_MODE`;
    the claim loops' engine). ``setting``: where ``url`` comes from, as a ConfigError
    names it (a SQLite file whose directory cannot be made). ``sqlite_busy_seconds``:
    how long a SQLite transaction waits for another's write lock (None:
    :data:`SQLITE_BUSY_SECONDS`). ``dead_peer_seconds``: how soon a PostgreSQL
    connection whose server went silent fails, and one not made gives up (None:
    :data:`DEAD_PEER_SECONDS`; 0: the kernel's and libpq's defaults).
    ``statement_seconds``: the PostgreSQL server's limits on each of its connections'
    statements, lock waits and idle transactions (see :data:`STATEMENT_SECONDS`; None:
    that; 0: none). ``pooling``: "transaction" behind a pooler that lends a server
    connection for one transaction at a time (see :data:`TRANSACTION_POOLING`)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if (database := sqlite_file(url)) is not None:
            directory = database.parent
            try:
                directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(
                    setting,
                    f"cannot make {directory}, the directory of the SQLite record"
                    f" {database}: {exc.strerror or exc}",
                ) from exc
        busy = SQLITE_BUSY_SECONDS if sqlite_busy_seconds is None else sqlite_busy_seconds
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": busy},
            **kwargs,
        )
        _configure_sqlite(engine, busy)
        _drop_sqlite_read_only_connections(engine)
        return engine
    kwargs.setdefault("pool_size", 10)
    kwargs.setdefault("max_overflow", 20)
    seconds = DEAD_PEER_SECONDS if dead_peer_seconds is None else dead_peer_seconds
    given = kwargs.get("connect_args", {})
    limits = STATEMENT_SECONDS if statement_seconds is None else statement_seconds
    kwargs["connect_args"] = {
        **_dead_peer_args(seconds, parsed.query),
        **given,
        **_statement_limit_args(limits, given.get("options", parsed.query.get("options"))),
    }
    pooled = pooling == TRANSACTION_POOLING
    if pooled:
        kwargs["connect_args"].setdefault("prepare_threshold", None)
    engine = create_engine(url, **kwargs)
    _drop_dead_session_connections(engine)
    if not kwargs.get("pool_pre_ping"):
        _ping_when_idle(engine)
    if custom_plans and not pooled:
        _plan_each_statement(engine)
    return engine


def settings_engine(settings: Settings, url: str | None = None, **options: Any) -> Engine:
    """:func:`make_engine` for the settings' database (``url`` instead, if given: one
    configured elsewhere, with the settings' connection limits all the same), with their
    limits (the dead peer's and the statement's), pooler mode and the key its URL comes
    from; ``options`` go to it too."""
    return make_engine(
        url or settings.effective_database_url,
        setting=settings.database_setting if url is None else "database_url",
        dead_peer_seconds=settings.database_dead_peer_seconds,
        statement_seconds=settings.database_statement_seconds,
        pooling=settings.database_pooling,
        **options,
    )


# Settings.database_pooling's value for a pooler that lends each transaction whichever
# server connection is free (PgBouncer's pool_mode = transaction). psycopg prepares a
# statement on the server once it has run it prepare_threshold (5) times on a
# connection, under a name of that connection's (_pg3_0, ...), and runs it by that name
# after: through such a pooler the name was missing on the server connection the next
# transaction got ("prepared statement "_pg3_0" does not exist"), or taken on it by
# another client's ("... already exists", seen with 6 threads). Nothing is prepared
# then (prepare_threshold None: each statement parsed and planned as it runs, as a
# custom plan, which is what PLAN_CACHE_MODE asks for), and nothing is SET for a
# session (plan_cache_mode would stay on whichever server connection it ran on).
TRANSACTION_POOLING = "transaction"
POOLING_SETTING = "database_pooling (HYPERMEDIA_DATABASE_POOLING)"


def sqlite_file(url: str) -> Path | None:
    """The file a SQLite ``url`` names (None: another database, SQLite in memory, or
    a ``file:`` URI, whose file SQLite finds itself)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    if parsed.database.startswith("file:"):
        return None
    return Path(parsed.database)


# A PostgreSQL server that goes silent, neither answering nor closing (a NAT's or a
# firewall's table dropped the connection, a partition, a host powered off), is given up
# within this long (Settings.database_dead_peer_seconds). The kernel's defaults leave a
# statement sent to it waiting ~15 min (tcp_retries2 retransmissions) and one whose
# answer it awaits for ever (nothing to retransmit, no keepalive): an API request, a
# completion batch, the pool's ping of an idle connection, each held that long. TCP
# keepalives find a silent server while a connection waits or sits in the pool (the
# pool's checkout then sees its socket in error and makes another), TCP_USER_TIMEOUT
# one that does not acknowledge what was sent; both abort the connection at about this
# many seconds of silence: the statement fails DatabaseUnavailable, as when the server
# is down. Neither times a slow statement: the server's kernel answers for it. Measured
# on a private PostgreSQL in a network namespace of its own whose loopback was taken
# down (tests/integration/test_db_dead_peer.py): with 3 s, a SELECT 1 sent into the
# silence failed after 3.4 s, a pg_sleep awaiting its answer 2.1 s after the silence
# began (3 s after the server's last word), an idle pooled connection was found dead
# and a new one's connect gave up after 3.0 s; without, the first two still waited 20 s
# later, the third (the idle connection, used untried) 115 s later.
DEAD_PEER_SECONDS = 30.0


def _dead_peer_args(seconds: float, named: Mapping[str, Any]) -> dict[str, int]:
    """libpq's connection parameters that give up a silent server after ``seconds``:
    keepalive probes from half that idle, three, at a sixth apart (the kernel aborts
    when the user timeout has passed and a probe went unanswered), the user timeout
    itself for what was sent and not acknowledged, and as long for a connection to be
    made (``connect_timeout``, whole seconds, 2 at least: libpq's and psycopg's
    floor). One the database URL names (``?keepalives_idle=60``) is left to it."""
    if seconds <= 0:
        return {}
    whole = math.ceil(seconds)
    chosen = {
        # A server that took the connection and says nothing (its postmaster stopped
        # or hung, a proxy whose server is gone): its kernel acknowledges the startup
        # packet and answers the keepalives, so neither ends the wait; the connect of
        # an API request, a completion batch or the head's upkeep waited for ever
        # (still waiting after 40 s on a SIGSTOPped postmaster, at any dead-peer
        # time). A SYN dropped is given up by the user timeout already (3.0 s with 3).
        "connect_timeout": max(2, whole),
        "keepalives": 1,
        "keepalives_idle": max(1, whole // 2),
        "keepalives_interval": max(1, whole // 6),
        "keepalives_count": 3,
        "tcp_user_timeout": round(seconds * 1000),
    }
    return {name: value for name, value in chosen.items() if name not in named}


# The PostgreSQL server's own limits on every connection, so that nothing the record is
# asked waits on another session for ever (Settings.database_statement_seconds, T):
# a statement is cancelled after T (statement_timeout), a wait for a lock after T/3
# (lock_timeout), and a session left idle in a transaction is ended after 2T
# (idle_in_transaction_session_timeout), its locks let go. Without them an operator's
# `BEGIN; LOCK TABLE processing_jobs;` left open in psql held every API submit, claim,
# completion batch and scheduler turn for as long as it lasted (measured: 60 s of lock,
# 60 s each, tests/integration/test_db_statement_limits.py), and a process of ours
# stopped in a transaction (SIGSTOP, a VM paused) held the rows it had locked for ever.
# The record's own statements take milliseconds; what legitimately runs long either
# goes in batches (prunes, sweeps, a bulk run's pages) or lifts the limit for its
# transaction (:func:`unlimited`: migrations, `hypermedia credits check`, `hypermedia
# scheduler simulate --from-db`). A statement cut short fails DatabaseUnavailable (the
# API's 503, the batcher's and the loops' retries): the transaction was rolled back whole.
# The server enforces them, so a backend that cannot run at all (stopped, stuck in the
# kernel) is not bounded by them.
STATEMENT_SECONDS = 30.0
STATEMENT_SETTING = "database_statement_seconds (HYPERMEDIA_DATABASE_STATEMENT_SECONDS)"
# The limits go to the server in libpq's startup parameter ``options``, which PgBouncer
# refuses ("unsupported startup parameter: options", unless its ignore_startup_parameters
# lists it, and then it drops them): every connection failed, reported as the database
# being unreachable (`db upgrade`, every command, the API's 503), which no retry cures.
_REFUSED_OPTIONS = "unsupported startup parameter: options"
_REFUSED_OPTIONS_FIX = (
    "the database server refuses the startup parameter `options`, which carries"
    " hypermedia's statement limits (a pooler such as PgBouncer does): set"
    " HYPERMEDIA_DATABASE_STATEMENT_SECONDS=0 and give the database role the limits"
    " instead (ALTER ROLE <role> SET statement_timeout = '30s'; ... SET lock_timeout ="
    " '10s'; ... SET idle_in_transaction_session_timeout = '60s'), or connect to"
    " PostgreSQL directly (README: Behind PgBouncer)"
)
_LIMITS = ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")
# A server parameter that a libpq ``options`` string sets: ``-c name=value``, ``-cname=``,
# ``--name=value`` (dashes in the name read as underscores).
_OPTION_NAME = re.compile(r"(?:^|\s)(?:-c\s*|--)([A-Za-z0-9_.-]+)=")


def statement_limits(seconds: float) -> dict[str, int]:
    """The server parameters :data:`STATEMENT_SECONDS` stands for, in milliseconds
    (none for 0; 1 at least for any other, never the server's 0, no limit: see
    :data:`hypermedia.db.MIN_STATEMENT_SECONDS`)."""
    if seconds <= 0:
        return {}
    return dict(
        zip(
            _LIMITS,
            (max(1, round(ms)) for ms in (seconds * 1000, seconds * 1000 / 3, seconds * 2000)),
            strict=True,
        )
    )


def _statement_limit_args(seconds: float, named: Any) -> dict[str, str]:
    """libpq's ``options`` with the limits of ``seconds`` after those ``named`` already
    (the database URL's or the caller's ``options``; else ``PGOPTIONS``, which libpq
    reads only when no ``options`` is given): a limit they set is left to them."""
    if isinstance(named, tuple | list):
        named = " ".join(named)
    given = named if isinstance(named, str) else os.environ.get("PGOPTIONS", "")
    taken = {name.replace("-", "_").lower() for name in _OPTION_NAME.findall(given)}
    ours = [
        f"-c {name}={ms}" for name, ms in statement_limits(seconds).items() if name not in taken
    ]
    if not ours:
        return {} if named is None else {"options": given}
    return {"options": " ".join([given.strip(), *ours]).strip()}


@contextmanager
def unlimited(conn: Connection) -> Iterator[Connection]:
    """``conn``'s transaction without :data:`STATEMENT_SECONDS`'s statement and
    idle-transaction limits (SET LOCAL: they come back at its end), for work that
    legitimately runs long in one statement (a report over every account). The lock
    wait stays bounded."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("SET LOCAL statement_timeout = 0")
        conn.exec_driver_sql("SET LOCAL idle_in_transaction_session_timeout = 0")
    yield conn


# A pooled connection is tried (a round trip) before use only when it has sat idle this
# long: one a server restart or an idle timeout may have closed. SQLAlchemy's
# pool_pre_ping tries every checkout, a round trip more for each transaction: on the
# claim loops (a claim, a completion batch) it was a third of entering a transaction
# (py-spy --gil of a pipeline actor on the child path). One used more recently is tried
# only if its socket has something to read: an idle connection is owed nothing, so that
# is the server having closed it (a restart, pg_terminate_backend: its FATAL message and
# the end of the stream), or a rare notice. Without that look (a poll, no round trip)
# every pool's first transaction after a restart of PostgreSQL failed on the connection
# the restart had closed ("server closed the connection unexpectedly": an API request's
# 503, a completion batch's retry, a grant's failed attempt) though the database was up.
# A connection that breaks while in use fails its statement whichever way
# (DatabaseUnavailable, which the callers retry; its work is not run again), and
# SQLAlchemy then discards every connection of the pool.
PING_AFTER_IDLE_SECONDS = 5.0


def _ping_when_idle(engine: Engine) -> None:
    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_conn: Any, record: Any) -> None:
        record.info[_IDLE_SINCE] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get(_IDLE_SINCE)
        if since is None:
            return  # just connected
        if time.monotonic() - since < PING_AFTER_IDLE_SECONDS and not _has_input(dbapi_conn):
            return
        try:
            engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:
            # The pool drops this connection and checks out another (a new one).
            raise DisconnectionError(f"pooled connection is gone: {exc}") from exc


def _has_input(dbapi_conn: Any) -> bool:
    """Whether the connection's socket can be read (the server wrote or closed it);
    True too when it has no socket left."""
    try:
        fd = dbapi_conn.fileno()
    except Exception:
        return True
    if not hasattr(select, "poll"):  # Windows
        return bool(select.select([fd], [], [], 0)[0])
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))


_IDLE_SINCE = "hypermedia_idle_since"


# A server that refuses every write of a connection, "cannot execute INSERT in a
# read-only transaction" (SQLSTATE 25006), is a standby: after a failover, a connection
# made to the old primary's address once it was demoted, or through a name not yet
# updated, is one for as long as it lives; it answers reads and pings, so the pool kept
# it and handed it out again, and every write on it failed for good (the API's 500
# internal, a completion batch given up: its job, done, run again once its lease ran
# out). The record never asks for a read-only transaction on PostgreSQL (its snapshot
# is a transaction like any other), so the error is never the statement's own. It
# invalidates the connection, and every other one of the pool made before it (they
# went where it went): the next checkout connects again, reaching the new primary by
# its name or address, and the statement fails DatabaseUnavailable (the API's 503,
# the batcher's retry with backoff) meanwhile.
READ_ONLY_SQLSTATE = "25006"
# The server ended the session of a connection left idle in a transaction longer than
# idle_in_transaction_session_timeout (:data:`STATEMENT_SECONDS`): its next statement
# fails so (an InternalError to the driver) and the connection is closed.
IDLE_IN_TRANSACTION_SQLSTATE = "25P03"
_DEAD_SESSION_SQLSTATES = (READ_ONLY_SQLSTATE, IDLE_IN_TRANSACTION_SQLSTATE)


def _drop_dead_session_connections(engine: Engine) -> None:
    @event.listens_for(engine, "handle_error")
    def _on_error(context: Any) -> None:
        if getattr(context.original_exception, "sqlstate", None) in _DEAD_SESSION_SQLSTATES:
            context.is_disconnect = True


# For the claim loops: every statement planned for the parameters it runs with. psycopg
# prepares a statement on its fifth run, and PostgreSQL then keeps a generic plan if it
# costs no more than the custom ones did; a claim or completion finds its jobs by id,
# and a generic plan made while processing_jobs held a few hundred rows scans the table,
# and goes on scanning it as a burst fills it (statistics change only when autovacuum
# analyzes, a minute or more later; never where it is off). Measured on the child path
# (bench/throughput.py, 12,000 jobs, pg_stat_statements): the claim 2.99 ms and 495
# buffers a call with the generic plan, 0.33 ms (0.16 of it planning) and 42 with this;
# PostgreSQL's CPU a job 2.99 -> 0.90 ms. Not for every engine: the foreign key checks
# are planned each time too (five a submitted job), and submit_many of 500 jobs took
# ~25 % longer with it.
PLAN_CACHE_MODE = "force_custom_plan"


def _plan_each_statement(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        with dbapi_conn.cursor() as cursor:
            cursor.execute(f"SET plan_cache_mode = {PLAN_CACHE_MODE}")
        dbapi_conn.commit()  # a setting made in a transaction rolled back would be undone


# FULL: each commit syncs the WAL before it returns, so what the record acknowledged (a
# 202's job, a charge in the ledger, cloud spend counted against its caps, an API key
# shown once) survives a power loss or a kernel crash, as PostgreSQL's default
# (synchronous_commit on) does, and as the local storage's blobs do (fsynced before
# their row is written). NORMAL syncs the WAL only at checkpoints (every 1000 pages):
# no corruption, but every commit since the last one may be gone after a power loss:
# hundreds of acknowledged jobs under load, a blob left with no row. Measured on a
# virtio disk: 0.44 ms a commit against 0.16 (2,300 commits/s); a 100-client upload
# and submit burst on a hypermedia up stack did not slow (CPU-bound).
SQLITE_SYNCHRONOUS = "FULL"

# The WAL file is cut back to this once a checkpoint has emptied it. Any read transaction
# holds the checkpoints back to its snapshot (SQLite cannot overwrite pages a reader may
# still need), so the WAL grows while one lasts: under a 100-client burst on a hypermedia
# up stack, a 30 s read (an operator's backup or sqlite3 shell) took it from 5 MB to
# 124 MB. Without a limit SQLite reuses the file from its start and keeps it at its
# largest for good; the stack's own reads are short, its WAL 5-9 MB under that burst.
SQLITE_WAL_KEEP_BYTES = 64 * 1024 * 1024

# How long a SQLite transaction waits for the write lock another connection holds (any
# process's: the API, the pipeline actors, the CLI) before it gives up with SQLITE_BUSY,
# translated into DatabaseUnavailable (503 from the API; the worker loops retry it).
# Writers hold it for milliseconds (under 100 uploads and submits at once and the
# actors completing, a wait of 2.5 s at most): 30 s of waiting is something else (an
# operator's `sqlite3` shell left in a transaction, a stopped process holding it).
SQLITE_BUSY_SECONDS = 30.0


def _configure_sqlite(engine: Engine, busy_seconds: float) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event issue BEGIN itself (pysqlite's own is deferred).
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA synchronous={SQLITE_SYNCHRONOUS}")
        cursor.execute(f"PRAGMA journal_size_limit={SQLITE_WAL_KEEP_BYTES}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={round(busy_seconds * 1000)}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # A read-only transaction (``snapshot``) takes no lock: in WAL mode it reads a
        # snapshot beside the one writer. Any other takes the write lock at once, so
        # that one which reads then writes never fails on a lock it could not upgrade.
        if conn.get_execution_options().get(_READ_ONLY):
            conn.exec_driver_sql("BEGIN")
        else:
            conn.exec_driver_sql("BEGIN IMMEDIATE")


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


@contextmanager
def transaction(engine: Engine) -> Iterator[Connection]:
    """One transaction; database connection errors become DatabaseUnavailable."""
    with _translated(), engine.begin() as conn:
        yield conn


@contextmanager
def statements(engine: Engine) -> Iterator[Connection]:
    """For work whose writes are one statement: on PostgreSQL a connection on which
    each statement is its own transaction (autocommit: no BEGIN and COMMIT round
    trips; a statement fails or commits whole); on SQLite a :func:`transaction`.
    Connection errors become DatabaseUnavailable."""
    if is_sqlite(engine):
        with transaction(engine) as conn:
            yield conn
        return
    with (
        _translated(),
        engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn,
    ):
        yield conn


@contextmanager
def snapshot(engine: Engine) -> Iterator[Connection]:
    """A read-only transaction: on SQLite it neither waits for the writer nor holds
    it up (``transaction`` takes SQLite's write lock, reads included); on PostgreSQL
    it is a transaction like any other. Writing in it is a mistake SQLite may refuse
    with "database is locked"."""
    with (
        _translated(),
        engine.connect().execution_options(**{_READ_ONLY: True}) as conn,
        conn.begin(),
    ):
        yield conn


@contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except DBAPIError as exc:
        if (refusal := _unavailable_sqlstate(exc)) is not None:
            state, meaning = refusal
            raise DatabaseUnavailable(
                f"the database cannot take it now ({meaning}, SQLSTATE {state}): {exc.orig}"
            ) from exc
        if not isinstance(exc, OperationalError):
            raise  # a statement's own fault (a constraint, a bad query): as it came
        if _REFUSED_OPTIONS in str(exc.orig):
            raise ConfigError(STATEMENT_SETTING, _REFUSED_OPTIONS_FIX) from exc
        if _is_sqlite_read_only(exc):  # before the connection's check: it is dropped too
            _let_go_of_the_statement(exc)
            raise DatabaseUnavailable(
                f"the SQLite record's file is read-only (its mount or its permissions): {exc.orig}"
            ) from exc
        if _is_connection_error(exc):
            raise DatabaseUnavailable(f"database unreachable: {exc.orig}") from exc
        if _is_sqlite_busy(exc):
            raise DatabaseUnavailable(
                f"the SQLite record stayed locked by another writer: {exc.orig}"
            ) from exc
        if _is_sqlite_disk_error(exc):
            raise DatabaseUnavailable(
                f"the SQLite record's file could not be read or written: {exc.orig}"
            ) from exc
        raise


_READ_ONLY = "hypermedia_read_only"


def _is_sqlite_busy(exc: DBAPIError) -> bool:
    """SQLITE_BUSY (any of its extended codes): the lock was not had within the busy
    timeout. Only that: SQLITE_LOCKED is a conflict inside one connection, a bug."""
    code = getattr(exc.orig, "sqlite_errorcode", None)
    return isinstance(code, int) and code & 0xFF == _SQLITE_BUSY


_SQLITE_BUSY = 5


def _is_sqlite_disk_error(exc: DBAPIError) -> bool:
    """SQLite's file failed it (any extended code of SQLITE_IOERR, SQLITE_FULL,
    SQLITE_CANTOPEN): the record out of reach until the disk is, as PostgreSQL down
    is (a write refused on a full disk, a flaky or lost mount). Not a statement's
    fault: run again, it goes through once the disk does."""
    code = getattr(exc.orig, "sqlite_errorcode", None)
    return isinstance(code, int) and code & 0xFF in _SQLITE_DISK_ERRORS


_SQLITE_DISK_ERRORS = (10, 13, 14)  # SQLITE_IOERR, SQLITE_FULL, SQLITE_CANTOPEN


# A SQLite connection that could open its file only for reading (its file system or bind
# mount read-only, the file or its directory made unwritable, its WAL index unwritable)
# refuses every write, "attempt to write a readonly database" (SQLITE_READONLY and its
# extended codes: _RECOVERY, _CANTLOCK, _ROLLBACK, _DBMOVED: the file renamed or deleted
# under it, _CANTINIT, _DIRECTORY), for as long as it lives: SQLite chose read-only when
# it opened the file and never tries again, so once the mount is writable again the
# pooled connection still refuses (checked: a bind mount remounted rw). It went through
# _translated raw: the API answered 500 internal, a worker's completion batch was given
# up at once, its job, done, left processing until its lease ran out. Now it is the
# record unavailable (the API's 503, the batcher's retry) and drops the connection (and
# the pool's others opened before it): the next checkout opens the file again, for
# writing once it can be. The project never opens its record read-only on purpose (a
# snapshot is a deferred BEGIN, no query_only, no mode=ro), so it is never a statement's
# own fault.
SQLITE_READONLY = 8


def _drop_sqlite_read_only_connections(engine: Engine) -> None:
    @event.listens_for(engine, "handle_error")
    def _on_error(context: Any) -> None:
        code = getattr(context.original_exception, "sqlite_errorcode", None)
        if isinstance(code, int) and code & 0xFF == SQLITE_READONLY:
            context.is_disconnect = True
            engine.pool.dispose()  # the pool's others opened read-only too, idle


def _let_go_of_the_statement(exc: BaseException) -> None:
    """Clear the locals of the finished frames ``exc`` went through (the failed
    statement's cursor and SQLite statement among them), kept in a reference cycle
    until the garbage collector's next full pass: SQLite closes a connection whose
    statements are not finalized only once they are (sqlite3_close_v2), so the
    read-only connection, invalidated, kept its files open, and its WAL index, shared
    by every connection of the process to that file, read-only: the next connections,
    opened for writing once the mount was, were refused as it was (measured: for as
    long as no gc.collect() ran)."""
    seen: BaseException | None = exc
    while seen is not None:
        traceback.clear_frames(seen.__traceback__)
        seen = seen.__cause__ or seen.__context__


def _is_sqlite_read_only(exc: DBAPIError) -> bool:
    code = getattr(exc.orig, "sqlite_errorcode", None)
    return isinstance(code, int) and code & 0xFF == SQLITE_READONLY


def _unavailable_sqlstate(exc: DBAPIError) -> tuple[str, str] | None:
    """The SQLSTATE of a PostgreSQL error that is the server unable to take any such
    work for now, and what it means (None: another error, or no SQLSTATE: a failed
    connect, which :func:`_is_connection_error` reads)."""
    state = getattr(exc.orig, "sqlstate", None)
    if not isinstance(state, str):
        return None
    if state in _UNAVAILABLE_SQLSTATES:
        return state, _UNAVAILABLE_SQLSTATES[state]
    if state.startswith("08") and state != _PROTOCOL_VIOLATION:
        return state, "connection exception"
    return None


# PostgreSQL refusing a statement for what it lacks, not for what the statement is: run
# again once the server has it back, it goes through, as the same work did before (the
# transaction was rolled back whole). A full disk is the one an operator meets most:
# every write that needs a new page of a table or an index, or a temporary file, fails
# "could not extend file ...: No space left on device" (53100) while reads go on; WAL
# that cannot be written is a PANIC instead, the server restarting (connections lost).
# Left out: 53400 configuration_limit_exceeded (a statement too big for a limit, again
# each time) and the class's other states, faults of the statement or the code, which
# must not be tried for ever.
_UNAVAILABLE_SQLSTATES = {
    "53000": "insufficient resources",
    "53100": "disk full",
    "53200": "out of memory",
    "53300": "too many connections",
    "57P01": "administrator shutdown",
    "57P02": "crash shutdown",
    "57P03": "cannot connect now",
    "58000": "system error",
    "58030": "I/O error",
    # The server's limits (:data:`STATEMENT_SECONDS`): what the statement waited for (a
    # lock another session held, a stalled server) is not its own fault; run again, it
    # goes through once that is over. A cancel an operator sent (pg_cancel_backend) is
    # 57014 too, and is as much worth running again.
    "57014": "statement cancelled: statement_timeout, or an operator's cancel",
    "55P03": "a lock another session held past lock_timeout",
    IDLE_IN_TRANSACTION_SQLSTATE: "the session was ended, idle in a transaction too long",
    # Not of this class, and an InternalError, not an OperationalError, to the driver:
    # a standby's answer to a write (see READ_ONLY_SQLSTATE).
    READ_ONLY_SQLSTATE: "read-only: a standby, not the primary",
}
_PROTOCOL_VIOLATION = "08P01"  # a message the server could not read: a bug, not an outage


def _is_connection_error(exc: DBAPIError) -> bool:
    if exc.connection_invalidated:
        return True
    text = str(exc.orig).lower()
    return any(marker in text for marker in _CONNECTION_ERRORS)


# What the driver's message says when the server cannot be reached (or a host name not
# resolved: psycopg's own "failed to resolve host", libpq's "could not translate host
# name").
_CONNECTION_ERRORS = (
    "connection",
    "could not connect",
    "server closed",
    "terminating",
    "resolve host",
    "translate host name",
)
