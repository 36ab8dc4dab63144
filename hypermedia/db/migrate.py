"""Apply Alembic migrations programmatically (``hypermedia db upgrade``), and tell
whether a database is at the newest revision.

The check runs at the start of every command and service that opens the job record,
so it reads the two revisions without importing Alembic (about half a CPU-second of
imports, a third of a short CLI command's time): the newest one from the migration
files' ``revision`` / ``down_revision`` lines, the database's from its
``alembic_version`` table. tests/integration/test_migrations.py holds both equal to
Alembic's own answers. Migrating imports Alembic.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine, column, inspect, select, table

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
VERSION_TABLE = "alembic_version"  # Alembic's default, which env.py keeps
_REVISION = re.compile(r"^revision\s*(?::\s*str\s*)?=\s*['\"]([^'\"]+)['\"]", re.M)
_DOWN = re.compile(r"^down_revision\s*(?::[^=]+)?=\s*(?:['\"]([^'\"]+)['\"]|None)", re.M)


def alembic_config(url: str | None = None) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    if url:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    from alembic import command

    cfg = alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def downgrade(engine: Engine, revision: str) -> None:
    from alembic import command

    cfg = alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)


def current_revision(engine: Engine) -> str | None:
    """The database's revision; None before the first migration."""
    with engine.connect() as conn:
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
    code must be upgraded (a worker or a head left on the old version after a deploy)."""
    return _problem(current_revision(engine))


def newer_than_code(engine: Engine) -> str | None:
    """:func:`schema_problem`'s answer when the database is newer than this code (what
    ``db upgrade`` must refuse: it cannot go back), else None."""
    revision = current_revision(engine)
    if revision is None or revision in known_revisions():
        return None
    return _problem(revision)


def _problem(revision: str | None) -> str | None:
    head = head_revision()
    if revision == head:
        return None
    if revision is None:
        return "the database has no schema yet: run `hypermedia db upgrade`"
    if revision not in known_revisions():
        return (
            f"the database schema is at revision {revision}, which this hypermedia does not"
            f" know (its newest is {head}): a newer hypermedia migrated it. Run that version"
            " here (upgrade this installation); `hypermedia db upgrade` cannot go back"
        )
    return (
        f"the database schema is at revision {revision}, this hypermedia needs {head}:"
        " run `hypermedia db upgrade`"
    )


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
