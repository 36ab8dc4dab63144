"""Leadership on a real Redis: one scheduler holds the lease, a second waits, takes
over when the first stops renewing, and the first's term is then fenced off."""

from __future__ import annotations

import time

from autoscaler.leader import Leadership


def test_one_holds_the_other_takes_over_when_it_stops_renewing(redis_client, redis_prefix):
    # A lease of 2 s renewed every 0.6 s: room for a loaded machine's late wake-ups
    # (with 0.4 s and 0.2 s, one late sleep let the lease lapse mid-renewal).
    first = Leadership(redis_client, redis_prefix, "host-a:1", ttl_seconds=2.0)
    second = Leadership(redis_client, redis_prefix, "host-b:2", ttl_seconds=2.0)

    term = first.acquire()
    assert term is not None and term.token == 1
    assert second.acquire() is None
    assert first.current() == "host-a:1 1"
    # Renewing keeps the same term, past several lease lengths.
    for _ in range(4):
        time.sleep(0.6)
        assert first.acquire() == term
        assert second.acquire() is None
    assert first.holds(term)

    time.sleep(2.2)  # the first stopped renewing (it died, or froze)
    taken = second.acquire()
    assert taken is not None and taken.token == 2
    assert not first.holds(term)  # fenced: its actions check this first
    assert first.acquire() is None  # and it cannot take the lease back while held
    assert second.holds(taken)


def test_a_clean_release_hands_over_at_once(redis_client, redis_prefix):
    first = Leadership(redis_client, redis_prefix, "a", ttl_seconds=60)
    second = Leadership(redis_client, redis_prefix, "b", ttl_seconds=60)
    term = first.acquire()
    assert term is not None
    stale = type(term)("a", term.token - 1)
    first.release(stale)  # an old term cannot release the current lease
    assert first.holds(term)
    first.release(term)
    taken = second.acquire()
    assert taken is not None and taken.token == term.token + 1
