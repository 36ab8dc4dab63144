"""The alert rules in the scheduler's turn: what they read from the record, and where
their notifications go.

The scheduler's leader (:meth:`autoscaler.scheduler.Scheduler.evaluate`), after
recording its decisions, calls :meth:`Alerting.turn` with the turn's snapshot (queues
from Redis, the spend) and the decisions it carried out. :func:`observe` adds what only
the record knows: the live workers' heartbeat ages and last CPU (``workers``,
``worker_metrics``) and the last finished attempts' outcomes (``job_attempts``). The
pure rules (:mod:`autoscaler.alerts`) answer the notifications; one transaction then
writes each to ``alerts``, one ``alert_deliveries`` row per webhook whose
``min_level`` it reaches, and the rules' state (``scheduler_state`` row ``alerts``:
what is pending and firing, for the next turn and for ``hypermedia status``). Sending
is the :class:`~autoscaler.webhooks.Sender`'s, on another thread: nothing here waits
on a webhook.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import Connection, Engine

from autoscaler import alerts
from autoscaler.alerts import AlertState, Notification, Observation, WorkerHealth
from autoscaler.billing import Finding
from autoscaler.config import SchedulerConfig
from autoscaler.snapshot import Decision, Snapshot
from autoscaler.state import epoch, read_state, to_datetime, write_state
from autoscaler.webhooks import Webhook
from hypermedia import ids
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction

log = logging.getLogger(__name__)

STATE = "alerts"
# A metrics row older than this says nothing about the CPU now (workers write one a minute).
METRICS_FRESH_SECONDS = 180.0
LIVE = ("active", "draining")
_LOG_LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "critical": logging.ERROR}


def worker_health(conn: Connection, now: float) -> tuple[WorkerHealth, ...]:
    """The live workers (active, draining): heartbeat age, last recent CPU, and since
    when and why each has paused claiming (None: it claims)."""
    w, m = t.workers, t.worker_metrics
    latest = (
        select(m.c.worker_id, func.max(m.c.metric_id).label("metric_id"))
        .where(m.c.recorded_at >= to_datetime(now - METRICS_FRESH_SECONDS))
        .group_by(m.c.worker_id)
        .subquery()
    )
    rows = conn.execute(
        select(
            w.c.worker_id,
            w.c.queue,
            w.c.status,
            w.c.last_heartbeat,
            w.c.claims_paused_since,
            w.c.claims_paused_reason,
            m.c.cpu_percent,
        )
        .outerjoin(latest, latest.c.worker_id == w.c.worker_id)
        .outerjoin(m, m.c.metric_id == latest.c.metric_id)
        .where(w.c.status.in_(LIVE))
        .order_by(w.c.worker_id)
    )
    return tuple(
        WorkerHealth(
            worker_id=row.worker_id,
            queue=row.queue,
            status=row.status,
            heartbeat_age_seconds=max(0.0, now - epoch(row.last_heartbeat)),
            cpu_percent=row.cpu_percent,
            claims_paused_since=(
                None if row.claims_paused_since is None else epoch(row.claims_paused_since)
            ),
            claims_paused_reason=row.claims_paused_reason,
        )
        for row in rows
    )


def recent_outcomes(conn: Connection, count: int) -> tuple[bool, ...]:
    """The last ``count`` finished attempts (completed or failed), newest first: True =
    failed. A released attempt (handed back by a drain or a spot notice) is neither."""
    a = t.attempts
    rows = conn.execute(
        select(a.c.status)
        .where(a.c.status.in_(("completed", "failed")))
        .order_by(a.c.attempt_id.desc())
        .limit(count)
    ).scalars()
    return tuple(status == "failed" for status in rows)


def read_alert_state(conn: Connection) -> AlertState:
    return alerts.state_from(read_state(conn, STATE))


class Alerting:
    """The rules of ``config.alerts`` in the leader's turn, notifying ``webhooks``."""

    def __init__(
        self, config: SchedulerConfig, engine: Engine, webhooks: Sequence[Webhook] = ()
    ) -> None:
        self.config = config
        self.engine = engine
        self.webhooks = list(webhooks)

    def observe(
        self, conn: Connection, snapshot: Snapshot, decisions: Sequence[Decision]
    ) -> Observation:
        rules = self.config.alerts
        window = max(rules.failure_rate.last_jobs, rules.failure_spike.last_jobs)
        return Observation(
            now=snapshot.now,
            queues=snapshot.queues,
            workers=worker_health(conn, snapshot.now),
            outcomes=recent_outcomes(conn, window),
            spend=snapshot.spend,
            daily_cap_cents=self.config.cost_limits.max_daily_spend_cents,
            decisions=tuple(decisions),
        )

    def turn(
        self,
        snapshot: Snapshot,
        decisions: Sequence[Decision],
        applied: Sequence[bool],
        billing: Sequence[Finding] = (),
    ) -> list[Notification]:
        """Evaluate the rules and record what they notify (one transaction); the
        notifications. ``decisions`` and ``applied`` are the turn's, in parallel: only
        the ones carried out are events; ``billing``: the turn's reconciliation's
        findings (events too)."""
        done = [d for d, ok in zip(decisions, applied, strict=True) if ok]
        with transaction(self.engine) as conn:
            observed = replace(self.observe(conn, snapshot, done), billing=tuple(billing))
            result = alerts.evaluate(self.config.alerts, observed, read_alert_state(conn))
            for notification in result.notifications:
                self._record(conn, notification)
            write_state(conn, STATE, alerts.state_value(result.state), snapshot.now)
        for n in result.notifications:
            log.log(
                _LOG_LEVELS[n.level],
                "alert %s %s: %s",
                n.status,
                n.key,
                n.summary,
                extra={"action": f"alert_{n.status}", "queue": n.labels.get("queue")},
            )
        return result.notifications

    def _record(self, conn: Connection, n: Notification) -> None:
        at = to_datetime(n.at)
        alert_id = conn.execute(
            t.alerts.insert()
            .values(
                key=n.key,
                rule=n.rule,
                level=n.level,
                status=n.status,
                summary=n.summary,
                labels=dict(n.labels),
                details=dict(n.details),
                started_at=to_datetime(n.started_at),
                notified_at=at,
            )
            .returning(t.alerts.c.alert_id)
        ).scalar_one()
        rows: list[dict[str, Any]] = [
            {
                "delivery_id": ids.new_id(),
                "alert_id": alert_id,
                "webhook": webhook.name,
                "status": "pending",
                "attempts": 0,
                "next_attempt_at": at,
                "created_at": at,
            }
            for webhook in self.webhooks
            if alerts.at_least(n.level, webhook.min_level)
        ]
        if rows:
            conn.execute(t.alert_deliveries.insert(), rows)
