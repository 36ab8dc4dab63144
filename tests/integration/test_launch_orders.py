"""Launch orders in scheduler_state (PostgreSQL and SQLite): the scheduler places one per
launch it decided; the node provider takes the oldest of the node's queue; orders expire."""

from __future__ import annotations

from autoscaler import orders
from autoscaler.orders import ORDER_TTL_SECONDS, Order
from hypermedia.db.engine import transaction


def order(queue: str, at: float, provider: str = "aws", spot: bool = False) -> Order:
    return Order(queue, provider, spot, 6.0 if spot else 17.0, f"{queue} at {at}", 3, at)


def test_the_oldest_order_of_the_queue_is_taken_once(engine):
    now = 1_000_000.0
    with transaction(engine) as conn:
        orders.place(conn, [order("media", now, spot=True), order("ocr", now + 1)], now)
        orders.place(conn, [order("media", now + 2, provider="google")], now + 2)
    with transaction(engine) as conn:
        first = orders.take(conn, "media", now + 3)
        second = orders.take(conn, "media", now + 3)
        third = orders.take(conn, "media", now + 3)
    assert first is not None and (first.provider, first.spot) == ("aws", True)
    assert second is not None and second.provider == "google"
    assert third is None
    with transaction(engine) as conn:
        assert [o.queue for o in orders.pending(conn, now + 3)] == ["ocr"]


def test_orders_ray_never_asked_for_expire(engine):
    now = 2_000_000.0
    with transaction(engine) as conn:
        orders.place(conn, [order("bulk", now)], now)
    with transaction(engine) as conn:
        assert len(orders.pending(conn, now + ORDER_TTL_SECONDS - 1)) == 1
        assert orders.pending(conn, now + ORDER_TTL_SECONDS) == []
        assert orders.take(conn, "bulk", now + ORDER_TTL_SECONDS) is None


def test_an_order_a_launch_took_counts_until_the_launch_is_over(engine):
    """While the node provider launches (seconds to minutes), the order it took stays
    pending, so the scheduler still counts that worker and does not order another."""
    now = 3_000_000.0
    with transaction(engine) as conn:
        orders.place(conn, [order("media", now), order("media", now + 1)], now)
    with transaction(engine) as conn:
        taken = orders.take(conn, "media", now + 2, launching="r-first")
        assert taken is not None and taken.at == now
        assert [o.launching for o in orders.pending(conn, now + 2)] == ["r-first", None]
        # Nothing takes it again: the next launch, or the scheduler taking an order back.
        again = orders.take(conn, "media", now + 2)
        assert again is not None and again.at == now + 1
        assert orders.take(conn, "media", now + 2) is None
        assert [o.launching for o in orders.pending(conn, now + 2)] == ["r-first"]
    with transaction(engine) as conn:
        orders.finish(conn, "r-first", now + 3)
        assert orders.pending(conn, now + 3) == []
        orders.finish(conn, "r-unknown", now + 3)  # a launch that had no order
        assert orders.pending(conn, now + 3) == []
