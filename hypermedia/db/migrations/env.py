"""Alembic environment: the engine comes from ``config.attributes['connection']``
(set by :func:`hypermedia.db.migrate.upgrade`) or from ``sqlalchemy.url``."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from hypermedia.db.engine import make_engine
from hypermedia.db.models import metadata

config = context.config
target_metadata = metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        # On PostgreSQL (a connection not in a transaction: hypermedia.db.migrate) a
        # migration's locks end with it; SQLite's single transaction (begun by migrate,
        # for its foreign-key check) is left as it is.
        transaction_per_migration=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    assert url, "sqlalchemy.url is not set"
    # Alembic's own command line: no statement limits (hypermedia.db.migrate lifts the
    # engine's on the connection it hands over).
    engine = make_engine(url, statement_seconds=0)
    try:
        with engine.connect() as conn:
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
