"""hypermedia.jobs.checkpoints: grants, commits and the head's sweep on PostgreSQL and
SQLite with the local storage: a live job keeps its pieces, an ended job loses them
(storage first, then the record), and an upload never committed is an orphan a day
after its grant."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select, update

from hypermedia.clock import to_datetime
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.jobs import checkpoints
from tests.factories import make_user, open_stack, submit

PARAMS = {"height": 120}


def _rows(engine, job_id: str) -> dict[str, bool]:
    c = t.checkpoints.c
    with engine.connect() as conn:
        rows = conn.execute(select(c.name, c.committed_at).where(c.job_id == job_id))
        return {row.name: row.committed_at is not None for row in rows}


def test_the_sweep_keeps_live_pieces_and_deletes_ended_and_orphaned_ones(
    engine, settings, tmp_path
):
    stack = open_stack(settings, engine, None)
    person = make_user(stack)
    (job_id,) = submit(stack, person, ["thumbnail"])
    now = stack.clock.now()
    keys = {
        name: checkpoints.checkpoint_key(job_id, 1, PARAMS, name)
        for name in ("chunk-00000.mp4", "chunk-00001.mp4", "chunk-00002.mp4")
    }
    assert keys["chunk-00000.mp4"].startswith(f"checkpoints/{job_id}/1/")
    assert checkpoints.checkpoint_key(
        job_id, 1, {"height": 240}, "x"
    ) != checkpoints.checkpoint_key(job_id, 1, PARAMS, "x")
    with transaction(engine) as conn:
        checkpoints.grant(conn, job_id, keys, now - 2 * 86400)
        checkpoints.grant(conn, job_id, {"chunk-00002.mp4": keys["chunk-00002.mp4"]}, now)
        # chunk 0 committed (as a worker holding the job would)
        conn.execute(
            update(t.checkpoints)
            .where(t.checkpoints.c.storage_key == keys["chunk-00000.mp4"])
            .values(committed_at=to_datetime(now - 86400 - 60), size_bytes=3)
        )
    for key in keys.values():
        stack.storage.put(key, [b"abc"])
    # Not held by this worker (the job is queued): no commit.
    assert not checkpoints.commit(engine, job_id, "w-1", keys["chunk-00001.mp4"], 3, now)
    with transaction(engine) as conn:
        prefix = checkpoints.checkpoint_prefix(job_id, 1, PARAMS)
        assert [p.name for p in checkpoints.committed(conn, job_id, prefix)] == ["chunk-00000.mp4"]
        assert (
            checkpoints.committed(conn, job_id, checkpoints.checkpoint_prefix(job_id, 2, PARAMS))
            == []
        )

    # Live job: the committed piece and the fresh grant stay; the upload granted two
    # days ago and never committed is an orphan.
    report = checkpoints.sweep(engine, stack.storage, now)
    assert report.deleted == 1
    assert _rows(engine, job_id) == {"chunk-00000.mp4": True, "chunk-00002.mp4": False}
    assert not stack.storage.exists(keys["chunk-00001.mp4"])
    assert stack.storage.exists(keys["chunk-00000.mp4"])

    # The job ends (failed for good): everything goes.
    with transaction(engine) as conn:
        conn.execute(update(t.jobs).where(t.jobs.c.job_id == job_id).values(status="failed"))
    assert checkpoints.sweep(engine, stack.storage, now).deleted == 2
    assert _rows(engine, job_id) == {}
    assert not any(stack.storage.exists(key) for key in keys.values())
    assert (
        checkpoints.sweep(engine, stack.storage, now + timedelta(days=9).total_seconds()).deleted
        == 0
    )
    stack.close()


def test_the_sweep_with_the_database_down_is_database_unavailable(sqlite_engine, settings):
    """The head sweeps every few seconds: its read was a raw connection, so a database
    that was down raised SQLAlchemy's OperationalError, logged as 'checkpoints failed
    unexpectedly' with the whole traceback each time. It is DatabaseUnavailable, the
    one warning line every other step of the head logs for it."""
    import pytest

    from hypermedia.db.engine import make_engine
    from hypermedia.embedded import free_port
    from hypermedia.errors import DatabaseUnavailable

    stack = open_stack(settings, sqlite_engine, None)
    down = make_engine(f"postgresql+psycopg://hm@127.0.0.1:{free_port()}/hm")
    try:
        with pytest.raises(DatabaseUnavailable, match="database unreachable"):
            checkpoints.sweep(down, stack.storage, stack.clock.now())
    finally:
        down.dispose()
        stack.close()
