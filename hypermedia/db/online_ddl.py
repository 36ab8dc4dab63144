"""Schema changes a migration makes beside a live platform without stopping its writes.

On PostgreSQL ``CREATE INDEX`` holds a SHARE lock on its table for the whole build: no
row of it is written meanwhile (0026 on 2M objects: every upload stopped 3.6 s; it
grows with the table). :func:`create_index` builds it ``CONCURRENTLY``, which lets
writes go on; PostgreSQL refuses that inside a transaction, so it runs in Alembic's
autocommit block: the migration's transaction is committed before it (what came
before the index in the migration must be safe to run again: the build may fail, or
the process end, before the revision is recorded) and a new one begun after it.

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
from collections.abc import Sequence
from typing import Any

from alembic import op
from sqlalchemy import text

log = logging.getLogger(__name__)


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
    migration's ``upgrade``."""
    predicate = None if where is None else text(where)
    partial: dict[str, Any] = {"postgresql_where": predicate, "sqlite_where": predicate}
    if op.get_bind().dialect.name != "postgresql":
        op.create_index(name, table, list(columns), unique=unique, **partial)
        return
    with op.get_context().autocommit_block():
        conn = op.get_bind()
        valid = conn.execute(
            text(
                "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                " WHERE c.relname = :name AND c.relnamespace = current_schema()::regnamespace"
            ),
            {"name": name},
        ).scalar()
        if valid:
            log.info(
                "index %s on %s is already built (by an attempt that ended before it was recorded)",
                name,
                table,
                extra={"action": "migrate"},
            )
            return
        lock_timeout = conn.exec_driver_sql("SHOW lock_timeout").scalar()
        conn.exec_driver_sql("SET lock_timeout = 0")
        try:
            if valid is False:
                log.warning(
                    "index %s on %s was left INVALID by a build that failed: dropping it to"
                    " build it again",
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
                list(columns),
                unique=unique,
                postgresql_concurrently=True,
                **partial,
            )
        finally:
            conn.execute(
                text("SELECT set_config('lock_timeout', :value, false)"), {"value": lock_timeout}
            )
