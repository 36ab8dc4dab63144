"""``hypermedia db upgrade``: the record made private, its migrations applied, the
configured profiles synced into it. Apart from :mod:`hypermedia.stack` (which opens
the record with it), so that the command imports no Redis client, ingest or storage
(half of its CPU on a record that is up to date)."""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from hypermedia.clock import Clock, SystemClock
from hypermedia.db.engine import (
    POOLING_SETTING,
    TRANSACTION_POOLING,
    settings_engine,
    sqlite_file,
    transaction,
)
from hypermedia.db.migrate import (
    current_revision,
    head_revision,
    take_turns,
    upgrade,
    upgrade_problem,
)
from hypermedia.embedded import private_directory
from hypermedia.errors import ConfigError
from hypermedia.jobs.catalog import sync_profiles
from hypermedia.profiles import load_profiles

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from hypermedia.config import Settings

log = logging.getLogger(__name__)


def prepare_data_dir(settings: Settings) -> None:
    """The data dir ``0700`` (record, objects, secrets, logs: no one else's), and a
    SQLite record ``0600``, made so before SQLite opens it: its ``-wal`` and ``-shm``
    files take the record's mode. The embedded one is made private again if it is
    not; one the URL names elsewhere is created private (SQLite would take the umask:
    0644, for every user to read), and one there already keeps the mode its operator
    gave it."""
    try:
        private_directory(settings.data_dir)
    except OSError as exc:
        raise ConfigError(
            "data_dir (HYPERMEDIA_DATA_DIR)",
            f"cannot make {settings.data_dir}: {exc.strerror or exc}",
        ) from exc
    if settings.database_url is None:
        record = settings.data_dir / "hypermedia.db"
        os.close(os.open(record, os.O_RDWR | os.O_CREAT, 0o600))
        for path in (record, *record.parent.glob(record.name + "-*")):
            with contextlib.suppress(FileNotFoundError):
                if stat.S_IMODE(path.stat().st_mode) != 0o600:
                    os.chmod(path, 0o600)
    elif (named := sqlite_file(settings.database_url)) is not None:
        try:
            named.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                os.close(os.open(named, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
        except OSError as exc:
            raise ConfigError(
                settings.database_setting,
                f"cannot make the SQLite record {named}: {exc.strerror or exc}",
            ) from exc
        _warn_if_others_read(named)


def _warn_if_others_read(record: Path) -> None:
    """A SQLite record made before elsewhere keeps its operator's mode, but one others
    may read (users, key hashes, callback URLs, the ledger) is said so, with the fix."""
    with contextlib.suppress(OSError):
        mode = stat.S_IMODE(record.stat().st_mode)
        if mode & 0o077:
            log.warning(
                "the SQLite record %s may be read by others (mode %04o): chmod 600 %s",
                record,
                mode,
                record,
            )


def _pooled_upgrade(at: str | None, newest: str | None) -> str:
    """Why a record behind a transaction pooler is not migrated, and what to do."""
    return (
        f"the record is at revision {at or 'none (empty)'} and this hypermedia needs"
        f" {newest}; a migration holds a lock for its whole session, which a pooler"
        " lending a server connection for one transaction at a time does not keep: run"
        " `hypermedia db upgrade` with HYPERMEDIA_DATABASE_URL pointing at PostgreSQL"
        " itself (past the pooler) and HYPERMEDIA_DATABASE_POOLING=session, then start"
        " again (README: Behind PgBouncer)"
    )


def migrate(
    settings: Settings, engine: Engine | None = None, *, clock: Clock | None = None
) -> None:
    """Apply migrations and sync profiles (``hypermedia db upgrade``). A database at
    the newest revision already is not handed to Alembic (nothing to apply; it costs
    its imports and a read of every migration file, on each start of a local stack),
    nor asked what keeps it from being upgraded (its tables listed, its revision read
    again: nothing, at the newest revision)."""
    owned = engine is None
    prepare_data_dir(settings)
    engine = engine or settings_engine(settings)
    try:
        if current_revision(engine) != head_revision():
            refused = upgrade_problem(engine)
            if refused is not None:
                raise ConfigError("database_url (HYPERMEDIA_DATABASE_URL)", refused)
            at, newest = current_revision(engine), head_revision()
            if at != newest:
                if settings.database_pooling == TRANSACTION_POOLING:
                    raise ConfigError(POOLING_SETTING, _pooled_upgrade(at, newest))
                upgrade(engine)
        profiles = load_profiles(settings.profiles_path, settings.queue_names)
        with transaction(engine) as conn:
            take_turns(conn)
            sync_profiles(conn, profiles, (clock or SystemClock()).now())
    finally:
        if owned:
            engine.dispose()
