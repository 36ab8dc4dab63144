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


def test_the_claim_loops_plan_every_statement_for_its_parameters(pg_database_url):
    """A generic plan made while a table is small goes on scanning it as it grows: the
    claim loops' engine (custom_plans) plans each statement for its own parameters on
    every connection, whatever the pool did; other engines keep PostgreSQL's default."""
    default = make_engine(pg_database_url, pool_size=1, max_overflow=0)
    try:
        with transaction(default) as conn:
            assert conn.execute(text("SHOW plan_cache_mode")).scalar_one() == "auto"
    finally:
        default.dispose()
    engine = make_engine(pg_database_url, custom_plans=True, pool_size=1, max_overflow=0)
    try:
        for opener in (transaction, statements, transaction):
            with opener(engine) as conn:
                mode = conn.execute(text("SHOW plan_cache_mode")).scalar_one()
                assert mode == "force_custom_plan"
        with engine.connect() as conn:  # a transaction rolled back
            conn.execute(text("SELECT 1"))
            conn.rollback()
        with transaction(engine) as conn:
            assert conn.execute(text("SHOW plan_cache_mode")).scalar_one() == "force_custom_plan"
            # psycopg prepares a statement on its fifth run; PostgreSQL plans it anew each time.
            for n in range(12):
                conn.execute(text("SELECT :n + 1 AS probe"), {"n": n})
            row = conn.execute(
                text(
                    "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                    " WHERE statement LIKE '%AS probe%'"
                )
            ).one()
            assert (row.generic_plans, row.custom_plans) == (0, 7), row
    finally:
        engine.dispose()
