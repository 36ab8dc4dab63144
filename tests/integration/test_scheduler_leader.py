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


def test_the_heads_scheduler_hands_the_lead_over_when_the_head_stops(
    pg_engine, settings, monkeypatch
):
    """``hypermedia head`` runs the scheduler's loop; stopped (SIGTERM: systemd, `down`),
    it gives the lease up as `hypermedia scheduler run` does, so the next head (or a
    scheduler beside it) on the same Redis leads at once, not a lease (3 turns) later."""
    import os
    import signal
    import threading

    from hypermedia.cli import local as local_cli
    from hypermedia.stack import Stack

    stack = Stack.open(settings(), engine=pg_engine, auto_migrate=True)
    stopped: list[bool] = []

    class Local:
        """The local stack, its services left out: the head's scheduler on this stack."""

        def __init__(
            self, _settings: object, extend_app: object = None, fixed_api_port: bool = False
        ) -> None:
            self.stack, self.api_url, self.holds_data_dir = stack, "http://127.0.0.1:9", True

        def start(self, progress: object = None) -> None:
            pass

        def stop(self, stop_redis: bool = False, progress: object = None) -> None:
            stopped.append(stop_redis)

    monkeypatch.setattr("hypermedia.local.LocalStack", Local)
    monkeypatch.setattr(local_cli, "read_settings", lambda: stack.settings)
    other = Leadership(stack.redis, stack.settings.redis_prefix, "next-head:2", 180)

    def end_once_it_leads() -> None:
        deadline = time.monotonic() + 30
        while other.current() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    ender = threading.Thread(target=end_once_it_leads)
    ender.start()
    try:
        local_cli.head(scheduler=True)
    finally:
        signal.signal(signal.SIGTERM, handlers[0])
        signal.signal(signal.SIGINT, handlers[1])
        ender.join()
    assert stopped == [True]
    assert other.current() is None  # given up: the next one leads now
    assert other.acquire() is not None
    stack.close()
