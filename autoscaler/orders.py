"""Launch orders: how the scheduler's provider choice reaches the node provider.

The scheduler decides *how many* burst workers each queue needs and *where* each new
one goes (provider, spot or on-demand, at what price); Ray decides *when* a node is
created (``request_resources``, then the autoscaler calls the node provider). The
scheduler leaves one order per launch it decided in ``scheduler_state`` (row
``launch_orders``); the provider takes the oldest order of the node's queue when
Ray asks it for a node. An order expires after :data:`ORDER_TTL_SECONDS` (Ray may
never ask, for example when the capacity appeared some other way). Without an order
the provider chooses the same way the policy does (:func:`autoscaler.policy.pick`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy.engine import Connection

from autoscaler.state import read_state, write_state

ORDERS = "launch_orders"
ORDER_TTL_SECONDS = 900.0


@dataclass(frozen=True, slots=True)
class Order:
    queue: str
    provider: str
    spot: bool
    cents_per_hour: float
    reason: str
    term: int  # the scheduler's fencing token when it decided
    at: float


def _live(value: dict[str, Any] | None, now: float) -> list[Order]:
    orders = [Order(**item) for item in (value or {}).get("orders", [])]
    return [o for o in orders if now - o.at < ORDER_TTL_SECONDS]


def place(conn: Connection, orders: list[Order], now: float) -> None:
    """Add orders (the scheduler, as the leader, inside its decision transaction)."""
    current = _live(read_state(conn, ORDERS), now)
    write_state(conn, ORDERS, {"orders": [asdict(o) for o in current + orders]}, now)


def take(conn: Connection, queue: str, now: float) -> Order | None:
    """The oldest live order for ``queue``, removed (None: there is none)."""
    current = _live(read_state(conn, ORDERS), now)
    chosen = next((o for o in current if o.queue == queue), None)
    if chosen is not None:
        current.remove(chosen)
    write_state(conn, ORDERS, {"orders": [asdict(o) for o in current]}, now)
    return chosen


def pending(conn: Connection, now: float) -> list[Order]:
    return _live(read_state(conn, ORDERS), now)
