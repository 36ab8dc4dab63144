"""The scheduler's durable state: named JSON values in ``scheduler_state``.

Rows: ``history`` (cooldown clocks, launch times), ``cost_lock`` (the daily cap's lock,
which survives restarts until ``hypermedia scheduler reset-cost-lock``), ``alerted``
(the day of the last spend alert), ``billing_reconciled``, ``holds`` (the holds of the
last turn, so a standing hold is recorded once), ``draining`` (when each cloud worker's
drain began), ``launch_orders`` (:mod:`autoscaler.orders`) and ``vps_node`` (the head's
Ray node: :mod:`autoscaler.provider`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Connection

from hypermedia.db import tables as t


def to_datetime(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def epoch(moment: datetime) -> float:
    return moment.timestamp()


def read_state(conn: Connection, name: str) -> dict[str, Any] | None:
    row = conn.execute(
        select(t.scheduler_state.c.value).where(t.scheduler_state.c.name == name)
    ).first()
    return dict(row[0]) if row is not None else None


def write_state(conn: Connection, name: str, value: Mapping[str, Any], now: float) -> None:
    table = t.scheduler_state
    updated = conn.execute(
        table.update()
        .where(table.c.name == name)
        .values(value=dict(value), updated_at=to_datetime(now))
    )
    if updated.rowcount == 0:
        conn.execute(
            table.insert().values(name=name, value=dict(value), updated_at=to_datetime(now))
        )


def delete_state(conn: Connection, name: str) -> bool:
    deleted = conn.execute(t.scheduler_state.delete().where(t.scheduler_state.c.name == name))
    return bool(deleted.rowcount)
