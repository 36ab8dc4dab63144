"""SQLite's connections sync each commit (``synchronous=FULL`` in WAL mode): what the
record acknowledged survives a power loss, as on PostgreSQL (synchronous_commit on).
NORMAL would sync only at checkpoints, every commit since the last one lost with the
power (see :data:`hypermedia.db.engine.SQLITE_SYNCHRONOUS`)."""

from __future__ import annotations

from hypermedia.db.engine import make_engine, snapshot, transaction

FULL = 2  # PRAGMA synchronous's answer: 0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA


def test_every_connection_syncs_each_commit_in_wal_mode(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'record.db'}")
    try:
        for opened in (transaction, snapshot):
            with opened(engine) as conn:
                assert conn.exec_driver_sql("PRAGMA journal_mode").scalar_one() == "wal"
                assert conn.exec_driver_sql("PRAGMA synchronous").scalar_one() == FULL
                assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar_one() == 30_000
    finally:
        engine.dispose()
