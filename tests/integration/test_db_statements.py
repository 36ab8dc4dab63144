"""hypermedia.db.engine.statements: on PostgreSQL each statement commits alone, and the
connection goes back to the pool as it came (the next transaction is one again)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import IntegrityError

from hypermedia.db.engine import make_engine, statements, transaction

Opener = Callable[[Engine], AbstractContextManager[Connection]]


def _insert(engine: Engine, opener: Opener, table: str, *values: int) -> list[Any]:
    """Insert ``values`` one statement each on one connection of ``opener``; answers
    that connection's driver connection and whether it committed each statement alone."""
    with opener(engine) as conn:
        raw = conn.connection.dbapi_connection
        seen = [raw, getattr(raw, "autocommit", None)]
        for n in values:
            conn.execute(text(f"INSERT INTO {table} VALUES ({n})"))
    return seen


def _count(engine: Engine, table: str) -> int:
    with transaction(engine) as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())


def test_each_statement_commits_alone_and_the_pool_gets_its_connection_back(pg_database_url):
    engine = make_engine(pg_database_url, pool_size=1, max_overflow=0)  # one connection
    try:
        with transaction(engine) as conn:
            conn.execute(text("CREATE TABLE t_statements (n int PRIMARY KEY)"))
        raw, alone = _insert(engine, statements, "t_statements", 1)
        assert alone is True
        with pytest.raises(IntegrityError):  # the second fails alone: the first stays
            _insert(engine, statements, "t_statements", 2, 2)
        assert _count(engine, "t_statements") == 2
        # The same connection, in a transaction again: a failure takes both rows.
        again, alone = _insert(engine, transaction, "t_statements")
        assert again is raw and alone is False
        with pytest.raises(IntegrityError):
            _insert(engine, transaction, "t_statements", 3, 1)
        assert _count(engine, "t_statements") == 2
        with transaction(engine) as conn:
            conn.execute(text("DROP TABLE t_statements"))
    finally:
        engine.dispose()


def test_on_sqlite_it_is_a_transaction(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        with transaction(engine) as conn:
            conn.execute(text("CREATE TABLE t (n int PRIMARY KEY)"))
        with pytest.raises(IntegrityError):
            _insert(engine, statements, "t", 1, 1)
        assert _count(engine, "t") == 0
    finally:
        engine.dispose()
