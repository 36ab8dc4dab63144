"""SQLite: a read-only ``snapshot`` neither waits for the writer nor holds it up;
``transaction`` (reads included) takes the write lock."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import text

from hypermedia.db.engine import make_engine, snapshot, transaction


@pytest.fixture
def engine(tmp_path):
    made = make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    with transaction(made) as conn:
        conn.execute(text("create table t (n integer)"))
        conn.execute(text("insert into t values (1)"))
    yield made
    made.dispose()


def test_a_snapshot_reads_while_a_writer_holds_its_lock(engine):
    writing, release = threading.Event(), threading.Event()

    def writer() -> None:
        with transaction(engine) as conn:
            conn.execute(text("insert into t values (2)"))
            writing.set()
            release.wait(10)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert writing.wait(10)
        started = time.monotonic()
        with snapshot(engine) as conn:
            seen = conn.execute(text("select count(*) from t")).scalar_one()
        waited = time.monotonic() - started
        assert seen == 1  # the committed state, not the writer's row
        assert waited < 2  # not the 30 s busy timeout
        # A transaction() read takes the write lock: it waits until the writer is done.
        done = threading.Event()

        def locked_read() -> None:
            with transaction(engine) as conn:
                conn.execute(text("select count(*) from t")).scalar_one()
            done.set()

        reader = threading.Thread(target=locked_read)
        reader.start()
        assert not done.wait(0.5)
        release.set()
        reader.join(10)
        assert done.is_set()
    finally:
        release.set()
        thread.join(10)
    with snapshot(engine) as conn:
        assert conn.execute(text("select count(*) from t")).scalar_one() == 2


def test_a_snapshot_does_not_hold_up_a_writer(engine):
    with snapshot(engine) as conn:
        assert conn.execute(text("select n from t")).scalar_one() == 1
        started = time.monotonic()
        with transaction(engine) as other:
            other.execute(text("update t set n = 5"))
        assert time.monotonic() - started < 2
        # Still the snapshot it began with.
        assert conn.execute(text("select n from t")).scalar_one() == 1
