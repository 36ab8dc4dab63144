"""At-least-once execution leaves one output: the same job run twice (an attempt that
stored its output and then died, and the retry that completes) writes the same key and
registers one output row and one derived object."""

from __future__ import annotations

import time

from sqlalchemy import func, select

from hypermedia import ids
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.jobs.repository import OutputRecord
from hypermedia.storage.base import derived_key
from tests.factories import make_object, make_user, open_stack, submit


def _count(engine, table, **where) -> int:
    stmt = select(func.count()).select_from(table)
    for column, value in where.items():
        stmt = stmt.where(table.c[column] == value)
    with transaction(engine) as conn:
        return int(conn.execute(stmt).scalar_one())


def test_same_job_twice_gives_one_output(engine, settings, manual_clock):
    stack = open_stack(settings, engine, manual_clock, backoff_base_seconds=1)
    person = make_user(stack)
    object_id = make_object(stack, person)
    (job_id,) = submit(stack, person, ["thumbnail"], object_id=object_id)
    key = derived_key(person.pool_id, object_id, 1, "thumbnail-320x320-q80.webp")

    # Attempt 1 stores its output, then its worker vanishes before completing.
    (first,) = stack.dispatcher.claim("images", "w1")
    stack.dispatcher.start(first, "w1")
    stack.storage.put(key, [b"attempt one"])
    manual_clock.advance(stack.dispatcher.queue_lease_seconds("images") + 1)
    assert stack.reaper.tick().expired == 1
    manual_clock.advance(2)
    assert stack.reaper.tick().promoted == 1

    # Attempt 2 writes the same key and completes.
    (second,) = stack.dispatcher.claim("images", "w2")
    stack.dispatcher.start(second, "w2")
    blob = stack.storage.put(key, [b"attempt two"])
    record = OutputRecord("thumbnail-320x320-q80.webp", key, blob.size_bytes, "image/webp")
    assert stack.dispatcher.complete(second, "w2", [record])
    # The ghost of attempt 1 cannot complete it again.
    assert not stack.dispatcher.complete(first, "w1", [record])

    view = stack.ingest.get_job(person.caller, job_id)
    assert view.status == "completed"
    assert [o.storage_key for o in view.outputs] == [key]
    assert _count(stack.engine, t.outputs, job_id=job_id) == 1
    assert _count(stack.engine, t.objects, storage_key=key) == 1
    assert b"".join(stack.storage.read(key)) == b"attempt two"

    # A later job for the same object and parameters reuses the key and the object row.
    (again,) = submit(stack, person, ["thumbnail"], object_id=object_id)
    (third,) = stack.dispatcher.claim("images", "w3")
    stack.dispatcher.start(third, "w3")
    assert stack.dispatcher.complete(third, "w3", [record])
    assert _count(stack.engine, t.objects, storage_key=key) == 1
    assert stack.ingest.get_job(person.caller, again).outputs[0].object_id == (
        view.outputs[0].object_id
    )
    stack.close()


def test_an_outputs_id_sorts_after_its_sources_made_by_a_clock_running_ahead(
    engine, settings, manual_clock, monkeypatch
):
    """The upload's id was made by an API whose clock runs an hour ahead of the
    worker's: the output's id still sorts after it (a deletion locks an object, then
    its outputs, and a submit naming both locks them in id order: the same order)."""
    monkeypatch.setattr(ids, "_last_ms", ids._last_ms)  # this process's clock, put back
    monkeypatch.setattr(ids, "_counter", ids._counter)
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    ahead = (time.time_ns() // 1_000_000 + 3_600_000) << 80 | 0x7 << 76 | 0x2 << 62
    object_id = make_object(stack, person, object_id=f"{ahead:032x}")
    submit(stack, person, ["thumbnail"], object_id=object_id)
    (job,) = stack.dispatcher.claim("images", "w1")
    stack.dispatcher.start(job, "w1")
    key = derived_key(person.pool_id, object_id, 1, "thumbnail-320x320-q80.webp")
    record = OutputRecord("thumbnail-320x320-q80.webp", key, 10, "image/webp")
    assert stack.dispatcher.complete(job, "w1", [record])
    with transaction(stack.engine) as conn:
        (output_id,) = conn.execute(
            select(t.objects.c.object_id).where(t.objects.c.source_object_id == object_id)
        ).scalars()
    assert output_id > object_id
    stack.close()
