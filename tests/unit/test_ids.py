"""Job and object ids: time-ordered, unique, 32 hex characters."""

from __future__ import annotations

import itertools
import re
import threading
import time
import uuid

import pytest

from hypermedia import ids
from hypermedia.ids import new_id

HEX32 = re.compile(r"^[0-9a-f]{32}$")


def test_fifty_thousand_ids_strictly_increase_and_are_unique():
    ids = [new_id() for _ in range(50_000)]
    assert len(set(ids)) == len(ids)
    assert all(earlier < later for earlier, later in itertools.pairwise(ids))


def test_format_is_32_lowercase_hex():
    for _ in range(1_000):
        assert HEX32.match(new_id())


def test_ids_are_uuid_version_7_with_the_rfc_variant():
    parsed = uuid.UUID(hex=new_id())
    assert parsed.version == 7
    assert parsed.variant == uuid.RFC_4122


def test_the_first_48_bits_are_the_time_in_milliseconds():
    before = time.time_ns() // 1_000_000
    value = int(new_id()[:12], 16)
    after = time.time_ns() // 1_000_000
    # May run ahead by a few ms when >4096 ids were made in one ms (borrowing).
    assert before <= value <= after + 50


def test_ids_sort_like_creation_order_across_a_sleep():
    first = new_id()
    time.sleep(0.002)
    assert new_id() > first


@pytest.mark.parametrize("threads", [2, 8, 16])
def test_unique_across_threads(threads):
    per_thread = 5_000
    results: list[list[str]] = [[] for _ in range(threads)]
    start = threading.Barrier(threads)

    def make(slot: int) -> None:
        start.wait()
        results[slot].extend(new_id() for _ in range(per_thread))

    workers = [threading.Thread(target=make, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    every = [i for chunk in results for i in chunk]
    assert len(every) == threads * per_thread
    assert len(set(every)) == len(every)
    for chunk in results:  # each thread sees its own ids increase
        assert chunk == sorted(chunk)
        assert len(set(chunk)) == len(chunk)


def test_an_id_made_after_another_sorts_after_it_whatever_this_clock_says(monkeypatch):
    """A derived output's id follows its source's even when the source was made on a
    machine whose clock runs ahead (an hour here): deletions and submits lock an object
    before its outputs, in id order."""
    # This process's ids go on an hour ahead after it: put its clock back for the rest.
    monkeypatch.setattr(ids, "_last_ms", ids._last_ms)
    monkeypatch.setattr(ids, "_counter", ids._counter)
    ahead = (time.time_ns() // 1_000_000 + 3_600_000) << 80 | 0x7 << 76 | 0x2 << 62
    source = f"{ahead:032x}"
    outputs = [new_id(after=source) for _ in range(5_000)]
    assert all(source < output for output in outputs)
    assert all(earlier < later for earlier, later in itertools.pairwise(outputs))
    assert new_id() > outputs[-1]  # and this process's ids go on from there
    # A source older than now changes nothing; one not of ours is no floor.
    before = time.time_ns() // 1_000_000
    assert int(new_id(after="0" * 32)[:12], 16) >= before
    assert HEX32.match(new_id(after="legacy-object-7"))
