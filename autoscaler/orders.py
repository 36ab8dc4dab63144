"""Launch orders: how the scheduler's provider choice reaches the node provider.

The scheduler decides *how many* burst workers each queue needs and *where* each new
one goes (provider, spot or on-demand, at what price); Ray decides *when* a node is
created (``request_resources``, then the autoscaler calls the node provider). The
scheduler leaves one order per launch it decided in ``scheduler_state`` (row
``launch_orders``); the provider takes the oldest order of the node's queue when
Ray asks it for a node. An order expires after :data:`ORDER_TTL_SECONDS` (Ray may
never ask, for example when the capacity appeared some other way). Without an order
the provider chooses the same way the policy does (:func:`autoscaler.policy.pick`).

An order the provider takes for a launch stays, marked with the launch's request id,
until the node is recorded (:func:`finish`): a launch takes seconds to minutes (the
cloud's API, the local driver's node), and until its record exists the scheduler must
still count the worker it ordered, or it orders another (it did, in a loaded e2e run:
two nodes for a burst its table gave one). Nothing takes a launching order again.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
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
    launching: str | None = None  # the request id of the launch that took it


def _live(value: dict[str, Any] | None, now: float) -> list[Order]:
    orders = [Order(**item) for item in (value or {}).get("orders", [])]
    return [o for o in orders if now - o.at < ORDER_TTL_SECONDS]


def place(conn: Connection, orders: list[Order], now: float) -> None:
    """Add orders (the scheduler, as the leader, inside its decision transaction)."""
    current = _live(read_state(conn, ORDERS), now)
    write_state(conn, ORDERS, {"orders": [asdict(o) for o in current + orders]}, now)


def take(conn: Connection, queue: str, now: float, launching: str | None = None) -> Order | None:
    """The oldest live order for ``queue`` that no launch holds (None: there is none):
    removed, or with ``launching`` (a launch's request id) kept and marked until
    :func:`finish`."""
    current = _live(read_state(conn, ORDERS), now)
    chosen = next((o for o in current if o.queue == queue and o.launching is None), None)
    if chosen is not None:
        index = current.index(chosen)
        if launching is None:
            del current[index]
        else:
            current[index] = replace(chosen, launching=launching)
    write_state(conn, ORDERS, {"orders": [asdict(o) for o in current]}, now)
    return chosen


def finish(conn: Connection, launching: str, now: float) -> None:
    """The launch ``launching`` is over (its node recorded, or it failed): its order goes."""
    current = _live(read_state(conn, ORDERS), now)
    kept = [o for o in current if o.launching != launching]
    if len(kept) != len(current):
        write_state(conn, ORDERS, {"orders": [asdict(o) for o in kept]}, now)


def pending(conn: Connection, now: float) -> list[Order]:
    """Every live order, those launching included (workers the scheduler ordered that
    have no node record yet)."""
    return _live(read_state(conn, ORDERS), now)
