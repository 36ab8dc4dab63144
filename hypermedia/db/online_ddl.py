"""Schema changes a migration makes beside a live platform without stopping its writes.

On PostgreSQL ``CREATE INDEX`` holds a SHARE lock on its table for the whole build: no
row of it is written meanwhile (0026 on 2M objects: every upload stopped 3.6 s; it
grows with the table). :func:`create_index` builds it ``CONCURRENTLY``, which lets
writes go on; PostgreSQL refuses that inside a transaction, so it runs in Alembic's
autocommit block: the migration's transaction is committed before it (what came
before the index in the migration must be safe to run again: the build may fail, or
the process end, before the revision is recorded) and a new one begun after it.
Likewise ``DROP INDEX`` takes an ACCESS EXCLUSIVE lock on the table (brief, but behind
any transaction in flight on it, with every query of the table queued behind it):
:func:`drop_index` drops ``CONCURRENTLY``, and :func:`replace_indexes` gives an index a
new definition under its name without a moment when there is none (its uniqueness
kept throughout). A foreign key added ``NOT VALID`` (a moment) is checked against the
rows already there by :func:`validate_constraint`, which lets reads and writes go on,
and a column's fill of the rows already there runs in batches by
:func:`update_in_batches`, each holding only its rows.

A concurrent build waits for the transactions begun before it to end (a backup, a
report: the writes go on meanwhile), so it runs without the migration's
``lock_timeout``: giving up there would throw the build away. One that fails (a
duplicate under a unique index, a cancelled statement, a killed server) leaves an
INVALID index of that name, which PostgreSQL keeps up to date but never reads: the
next attempt drops it and builds it again; a valid one (built before the process
ended) is kept. On SQLite an index is built as before, in the migration's transaction.

Only for migrations: Alembic's ``op`` is that of the migration running.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

from alembic import op
from sqlalchemy import Connection, text

log = logging.getLogger(__name__)

# The name a replacement is built under (see replace_indexes); PostgreSQL's names are
# at most 63 bytes.
_NEW = "_new"
_MAX_NAME = 63


class IndexSpec(NamedTuple):
    """An index as :func:`create_index` takes it."""

    name: str
    columns: Sequence[str]
    unique: bool = False
    where: str | None = None


def create_index(
    name: str,
    table: str,
    columns: Sequence[str],
    *,
    unique: bool = False,
    where: str | None = None,
) -> None:
    """``op.create_index``; on PostgreSQL built concurrently (see the module docstring).
    ``where``: a partial index's predicate (SQL, on both databases). Call it last in a
    migration's ``upgrade`` (or followed only by more of this module's calls)."""
    if not _postgres():
        op.create_index(name, table, list(columns), unique=unique, **_partial(where))
        return
    with _autocommit() as conn:
        _build(conn, IndexSpec(name, columns, unique, where), table)


def drop_index(name: str, table: str) -> None:
    """``op.drop_index``; on PostgreSQL ``DROP INDEX CONCURRENTLY IF EXISTS`` (no
    lock on the table that stops its reads or writes; it waits for the transactions
    using the index to end), outside the migration's transaction as
    :func:`create_index` builds. Call it last in a migration (or followed only by more
    of this module's calls)."""
    if not _postgres():
        op.drop_index(name, table_name=table)
        return
    with _autocommit() as conn:
        _drop(conn, name, table)


def replace_indexes(table: str, indexes: Sequence[IndexSpec]) -> None:
    """Give each of ``indexes`` (existing under its name) the definition it holds.

    On SQLite: each dropped, then each created, in the migration's transaction (as a
    migration's ``op.drop_index`` and ``op.create_index`` did). On PostgreSQL, for each
    one: the new definition built concurrently under a temporary name (``<name>_new``)
    while the old index still serves queries and, for a unique one, keeps its rule
    (a plain drop and build stopped every write for the build, and dropping first
    concurrently would leave a moment with neither), then the old one dropped
    concurrently and the new one renamed to its name (``ALTER INDEX ... RENAME``:
    a SHARE UPDATE EXCLUSIVE lock on the index alone). Run again after it was cut
    short, it goes on from where it was: an index of the name with the new definition
    (columns, uniqueness, partial or not) and no ``<name>_new`` is done. Call it last in
    a migration (or followed only by more of this module's calls)."""
    if not _postgres():
        for spec in indexes:
            op.drop_index(spec.name, table_name=table)
        for spec in indexes:
            op.create_index(
                spec.name, table, list(spec.columns), unique=spec.unique, **_partial(spec.where)
            )
        return
    for spec in indexes:
        new = f"{spec.name}{_NEW}"
        if len(new.encode()) > _MAX_NAME:
            raise ValueError(f"index name too long for its replacement's: {new}")
        with _autocommit() as conn:
            if _is_defined_as(conn, spec) and _validity(conn, new) is None:
                log.info(
                    "index %s on %s has its new definition already (by an attempt that"
                    " ended before it was recorded)",
                    spec.name,
                    table,
                    extra={"action": "migrate"},
                )
                continue
            _build(conn, spec._replace(name=new), table)
            _drop(conn, spec.name, table)
            conn.exec_driver_sql(f'ALTER INDEX "{new}" RENAME TO "{spec.name}"')


def validate_constraint(name: str, table: str) -> None:
    """PostgreSQL only: ``ALTER TABLE ... VALIDATE CONSTRAINT`` of a constraint added
    ``NOT VALID`` (a foreign key: ``op.create_foreign_key(..., postgresql_not_valid=True)``,
    a moment's lock, checked for the rows written from then on), in a transaction of its
    own, outside the migration's as :func:`create_index` builds. Adding it valid read
    every row of ``table`` under a lock that stopped its writes (SHARE ROW EXCLUSIVE,
    or the ACCESS EXCLUSIVE of an ADD COLUMN before it in the transaction); validating
    reads them under SHARE UPDATE EXCLUSIVE, which stops no reader or writer (a foreign
    key's referenced table: ROW SHARE). It runs without the migration's
    ``lock_timeout``, as a build does: nothing but another schema change or a VACUUM
    of the table waits behind it. Validating a valid constraint does nothing, so a
    re-run goes on. Call it last in a migration (or followed only by more of this
    module's calls)."""
    if not _postgres():
        raise ValueError("validate_constraint is for PostgreSQL only")
    with _autocommit() as conn:
        log.info(
            "validating constraint %s of %s: reads and writes of it go on",
            name,
            table,
            extra={"action": "migrate"},
        )
        conn.exec_driver_sql(f'ALTER TABLE "{table}" VALIDATE CONSTRAINT "{name}"')


def update_in_batches(
    table: str, key: str, assignments: str, where: str | None = None, rows: int = 1000
) -> int:
    """PostgreSQL only: ``UPDATE <table> SET <assignments> [WHERE <where>]`` of the rows
    already there, ``rows`` at a time in the order of ``key`` (the table's primary
    key), each batch a transaction of its own, outside the migration's as
    :func:`create_index` builds. In the migration's transaction such an UPDATE ran
    under the ACCESS EXCLUSIVE lock of the column it fills (added before it), which
    stopped every read and write of the table until it ended; a batch holds only its
    rows' locks, for its moment (a write of another row never waits). ``assignments``
    and ``where`` are SQL on the table's columns (``<table>.<column>`` where a
    subquery needs it). Each batch waits at most the migration's ``lock_timeout`` for
    a row a transaction in flight holds (then the migration is tried again, the
    batches from the first). Returns the rows updated. Call it last in a migration (or
    followed only by more of this module's calls)."""
    if not _postgres():
        raise ValueError("update_in_batches is for PostgreSQL only")
    condition = "TRUE" if where is None else f"({where})"

    def batch(after: str) -> str:
        return (
            f'WITH batch AS (SELECT "{key}" AS batch_key FROM "{table}"'  # noqa: S608 - ours
            f' WHERE {after}{condition} ORDER BY "{key}" LIMIT :rows),'
            f' updated AS (UPDATE "{table}" SET {assignments} FROM batch'
            f' WHERE "{table}"."{key}" = batch.batch_key AND {condition} RETURNING 1)'
            " SELECT (SELECT max(batch_key) FROM batch), (SELECT count(*) FROM updated)"
        )

    statement, params = text(batch("")), {"rows": rows}
    updated = batches = 0
    with _autocommit(lift_lock_timeout=False) as conn:
        log.info(
            "updating %s in batches of %d rows: reads and writes of it go on",
            table,
            rows,
            extra={"action": "migrate"},
        )
        while True:
            last, count = conn.execute(statement, params).one()
            if last is None:
                break
            updated += count
            batches += 1
            statement = text(batch(f'"{key}" > :after AND '))
            params = {"rows": rows, "after": last}
    log.info(
        "updated %d rows of %s in %d batches",
        updated,
        table,
        batches,
        extra={"action": "migrate"},
    )
    return updated


def _postgres() -> bool:
    return bool(op.get_bind().dialect.name == "postgresql")


def _partial(where: str | None) -> dict[str, Any]:
    predicate = None if where is None else text(where)
    return {"postgresql_where": predicate, "sqlite_where": predicate}


@contextmanager
def _autocommit(*, lift_lock_timeout: bool = True) -> Iterator[Connection]:
    """Alembic's autocommit block on the migration's connection (see the module
    docstring); ``lift_lock_timeout``: without its ``lock_timeout`` (restored after): a
    concurrent build or drop waits for the transactions begun before it, and giving up
    would throw its work away (it stops no reader or writer meanwhile).

    What failed in the block is what its caller is told. A failure that ended the
    connection (its session terminated, the server restarted, the process interrupted
    mid-statement) leaves it invalid: the restore and Alembic's end of the block each
    raised PendingRollbackError in its place."""
    failure: BaseException | None = None
    try:
        with op.get_context().autocommit_block():
            conn = op.get_bind()
            lock_timeout = None
            if lift_lock_timeout:
                lock_timeout = conn.exec_driver_sql("SHOW lock_timeout").scalar()
                conn.exec_driver_sql("SET lock_timeout = 0")
            try:
                yield conn
            except BaseException as exc:
                failure = exc
                raise
            finally:
                if lock_timeout is not None and not conn.invalidated:
                    conn.execute(
                        text("SELECT set_config('lock_timeout', :value, false)"),
                        {"value": lock_timeout},
                    )
        return
    except BaseException as ending:
        if failure is None or ending is failure:
            raise
        masking = ending
    log.warning(
        "could not end the autocommit block after its %s: %s",
        type(failure).__name__,
        masking,
        extra={"action": "migrate"},
    )
    raise failure


def _validity(conn: Connection, name: str) -> bool | None:
    """Whether index ``name`` of the current schema is valid; None: there is none."""
    valid: bool | None = conn.execute(
        text(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " WHERE c.relname = :name AND c.relnamespace = current_schema()::regnamespace"
        ),
        {"name": name},
    ).scalar()
    return valid


def _is_defined_as(conn: Connection, spec: IndexSpec) -> bool:
    """Whether index ``spec.name`` is there, valid, on ``spec``'s columns (in order),
    unique as it says and partial as it says (its predicate's text is not compared)."""
    row = conn.execute(
        text(
            "SELECT i.indisvalid, i.indisunique, i.indpred IS NOT NULL AS partial,"
            " array(SELECT a.attname::text FROM unnest(i.indkey::int2[]) WITH ORDINALITY"
            " AS k(attnum, n) JOIN pg_attribute a ON a.attrelid = i.indrelid"
            " AND a.attnum = k.attnum ORDER BY k.n) AS columns"
            " FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " WHERE c.relname = :name AND c.relnamespace = current_schema()::regnamespace"
        ),
        {"name": spec.name},
    ).first()
    return (
        row is not None
        and row.indisvalid
        and row.indisunique == spec.unique
        and row.partial == (spec.where is not None)
        and list(row.columns) == list(spec.columns)
    )


def _build(conn: Connection, spec: IndexSpec, table: str) -> None:
    """Build ``spec`` concurrently, unless a valid index of its name is there; an
    INVALID one is dropped first."""
    name = spec.name
    valid = _validity(conn, name)
    if valid:
        log.info(
            "index %s on %s is already built (by an attempt that ended before it was recorded)",
            name,
            table,
            extra={"action": "migrate"},
        )
        return
    if valid is False:
        log.warning(
            "index %s on %s was left INVALID by a build that failed: dropping it to build it again",
            name,
            table,
            extra={"action": "migrate"},
        )
        conn.exec_driver_sql(f'DROP INDEX CONCURRENTLY IF EXISTS "{name}"')
    log.info(
        "building index %s on %s concurrently: writes to it go on; it waits for"
        " the transactions begun before it to end",
        name,
        table,
        extra={"action": "migrate"},
    )
    op.create_index(
        name,
        table,
        list(spec.columns),
        unique=spec.unique,
        postgresql_concurrently=True,
        **_partial(spec.where),
    )


def _drop(conn: Connection, name: str, table: str) -> None:
    if _validity(conn, name) is None:
        return
    log.info(
        "dropping index %s on %s concurrently: reads and writes of it go on; it waits"
        " for the transactions using it to end",
        name,
        table,
        extra={"action": "migrate"},
    )
    conn.exec_driver_sql(f'DROP INDEX CONCURRENTLY IF EXISTS "{name}"')
