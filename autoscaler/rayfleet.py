"""The scheduler's fleet on a Ray cluster: plans become Ray requests, drains and orders.

Runs in the head's services process (:mod:`autoscaler.head`), next to the supervisor
of the pipeline actors, with ``ray`` connected. Each turn's
:class:`~autoscaler.snapshot.Plan` becomes:

* **one** ``request_resources`` covering every queue: the baseline the VPS holds plus
  ``desired`` (:func:`~autoscaler.snapshot.actor_totals`), in bundles of
  ``{"queue_<name>": 1}`` (Ray counts total capacity, so the VPS's own queue
  resources are part of it). Nodes it needs are never idle-terminated; a
  queue's bundles going away lets its nodes go;
* launch orders (:mod:`autoscaler.orders`) so that the node provider puts each new
  node where the policy chose (provider, spot, price);
* the supervisor's actor pools resized to the same numbers: an actor waits (pending)
  for its burst node and serves the queue from it;
* a drain: the node's actors stop claiming, finish their jobs (or hand them back at
  the drain timeout) and exit; Ray drains the node (PREEMPTION, deadline = the drain
  timeout), so nothing new lands there; its raylet exits once idle;
* a terminate: the node provider terminates it (the driver deletes the instance and
  the ledger row closes). Ray's autoscaler does the same once the raylet is gone;
  both paths are idempotent.

The cloud workers the scheduler sees are the provider's worker nodes; ``starting``
until a Ray node with their instance id is alive, ``draining`` from the turn that
drained them (or from the spot interruption notice their actors reported), with the
jobs of the actors on their Ray node.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Engine

from autoscaler import orders, raynodes
from autoscaler.billing import Account, accounts
from autoscaler.config import ProviderName, SchedulerConfig
from autoscaler.leader import Term
from autoscaler.policy import Option
from autoscaler.provider import HypermediaNodeProvider, record_vps_node
from autoscaler.snapshot import Offer, Plan, WorkerState, actor_totals
from autoscaler.state import read_state, write_state
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction

log = logging.getLogger(__name__)

DRAINING = "draining"
SPOT_INTERRUPTED = "spot_interrupted"  # a worker row's status after the notice
ORDER_PREFIX = "order-"  # a worker ordered but not created yet


def ordered_workers(
    provider: HypermediaNodeProvider, waiting: Sequence[orders.Order]
) -> list[WorkerState]:
    """Ordered but not recorded yet (Ray asks the provider within seconds, and the
    launch takes its time): the launches of the last turns, starting workers until their
    node is recorded. Each costs what the provider will book it at (a spot one: the most
    it may bill, :meth:`~autoscaler.provider.HypermediaNodeProvider.at_most`), so the
    next turn's caps count it as the provider will."""
    return [
        WorkerState(
            worker_id=f"{ORDER_PREFIX}{int(order.at)}-{index}",
            queue=order.queue,
            status="starting",
            started_at=order.at,
            provider=order.provider,  # type: ignore[arg-type]
            spot=order.spot,
            cost_per_hour_cents=_booked(provider, order),
        )
        for index, order in enumerate(waiting)
    ]


def _booked(provider: HypermediaNodeProvider, order: orders.Order) -> float:
    """What the provider books an order's launch at (an order for a provider it has no
    driver for is never launched there: at the order's price)."""
    if order.provider not in provider.drivers:
        return order.cents_per_hour
    option = Option(order.provider, order.spot, order.cents_per_hour)
    return provider.at_most(option).cents_per_hour


class RayFleet:
    def __init__(
        self,
        config: SchedulerConfig,
        provider: HypermediaNodeProvider,
        supervisor: Any,  # hypermedia.worker.supervisor.Supervisor (needs ray connected)
        engine: Engine,
    ) -> None:
        self.config = config
        self.provider = provider
        self.supervisor = supervisor
        self.engine = engine
        self.drain_timeout = config.scaling_rules.scale_down.drain_timeout_seconds
        self.last_request: list[dict[str, float]] | None = None
        # This process is the head's driver: its Ray node is the VPS, which the node
        # provider needs to tell the queue's VPS workers from those on burst nodes.
        import ray

        record_vps_node(engine, ray.get_runtime_context().get_node_id(), time.time())

    @property
    def address(self) -> str:
        return self.provider.head_address

    # -- what there is ---------------------------------------------------------------------

    def cloud_workers(self, now: float, actors: Sequence[WorkerState]) -> list[WorkerState]:
        from ray.autoscaler.tags import NODE_KIND_WORKER, TAG_RAY_NODE_KIND

        # The orders before the records: a launch records its node, then ends its order
        # (autoscaler.orders); read the other way round, a node recorded in between
        # would be in neither, and the policy would order it again.
        with transaction(self.engine) as conn:
            waiting = orders.pending(conn, now)
        records = self.provider.records({TAG_RAY_NODE_KIND: NODE_KIND_WORKER})
        alive = {n.instance_id: n for n in raynodes.nodes(self.address) if n.alive}
        with transaction(self.engine) as conn:
            draining: dict[str, float] = dict(read_state(conn, DRAINING) or {})
            kept = {k: v for k, v in draining.items() if k in records}
            if kept != draining:
                write_state(conn, DRAINING, kept, now)
            # A node whose actors got the spot notice is leaving: count it as draining,
            # so the policy replaces it now and terminates it once its jobs are back.
            noticed = set(
                conn.execute(
                    select(t.workers.c.node_id).where(t.workers.c.status == SPOT_INTERRUPTED)
                ).scalars()
            )
        workers = []
        for node_id, record in sorted(records.items()):
            ray_node = alive.get(node_id)
            on_node = [a for a in actors if ray_node is not None and a.node_id == ray_node.node_id]
            finished = [a.last_job_at for a in on_node if a.last_job_at is not None]
            if ray_node is not None and ray_node.node_id in noticed and node_id not in kept:
                kept[node_id] = now
                log.info("%s got a spot interruption notice", node_id)
            status = "draining" if node_id in kept else "active" if ray_node else "starting"
            # The node claims nothing once every actor on it has paused (its disk low):
            # since the last of them paused.
            paused = [a for a in on_node if a.claims_paused_since is not None]
            last_paused = (
                max(paused, key=lambda a: a.claims_paused_since or 0.0)
                if paused and len(paused) == len(on_node)
                else None
            )
            workers.append(
                WorkerState(
                    worker_id=node_id,
                    queue=record["queue"],
                    status=status,  # type: ignore[arg-type]
                    started_at=float(record["created_at"]),
                    current_jobs=sum(a.current_jobs for a in on_node),
                    last_job_at=max(finished) if finished else None,
                    provider=record["provider"],
                    spot=bool(record.get("spot")),
                    cost_per_hour_cents=float(record.get("price") or 0.0),
                    drain_started_at=kept.get(node_id),
                    node_id=ray_node.node_id if ray_node else None,
                    claims_paused_since=(
                        None if last_paused is None else last_paused.claims_paused_since
                    ),
                    claims_paused_reason=(
                        None if last_paused is None else last_paused.claims_paused_reason
                    ),
                )
            )
        # A launch under way holds its order until create_node has recorded the node, but
        # a listing adopts the instance as soon as the cloud shows it: such a node counts
        # itself, its order no longer (counted twice, its order was drained as idle).
        recorded = {record.get("request_id") for record in records.values()}
        unrecorded = [o for o in waiting if o.launching is None or o.launching not in recorded]
        return workers + ordered_workers(self.provider, unrecorded)

    def offers(self, now: float) -> dict[ProviderName, Offer]:
        return self.provider.offers()

    def billing(self) -> dict[str, Account]:
        """The drivers that can read their cloud's billing (``charges``), bound to the
        cluster; the others (IONOS) are not reconciled."""
        return accounts(self.provider.drivers, self.provider.cluster)

    # -- making it so ------------------------------------------------------------------------

    def apply(self, plan: Plan, term: Term) -> list[bool]:
        now = time.time()
        new_orders = [
            orders.Order(
                queue=d.queue or "",
                provider=d.provider or "",
                spot=d.spot,
                cents_per_hour=d.cents_per_hour,
                reason=d.reason,
                term=term.token,
                at=now,
            )
            for d in plan.actions
            if d.action == "launch"
            for _ in range(d.count)
        ]
        if new_orders:
            with transaction(self.engine) as conn:
                orders.place(conn, new_orders, now)
        done = []
        for decision in plan.actions:
            if decision.action == "launch":
                done.append(True)
            elif decision.action == "drain" and decision.worker_id is not None:
                if decision.worker_id.startswith(ORDER_PREFIX):
                    done.append(self._cancel_order(decision.queue or "", now))
                else:
                    done.append(self._drain(decision.worker_id, decision.reason, now))
            elif decision.action == "terminate" and decision.worker_id is not None:
                done.append(self._terminate(decision.worker_id))
            else:
                done.append(False)
        totals = actor_totals(self.config, plan)
        self._request(totals)
        self.supervisor.resize(totals)
        return done

    def _request(self, totals: dict[str, int]) -> None:
        from ray.autoscaler.sdk import request_resources

        bundles = [{f"queue_{name}": 1.0} for name, n in sorted(totals.items()) for _ in range(n)]
        if bundles != self.last_request:
            log.info("requesting %s", totals, extra={"action": "request_resources"})
        request_resources(bundles=bundles)
        self.last_request = bundles

    def _cancel_order(self, queue: str, now: float) -> bool:
        """A worker that was only ordered leaves by taking its order back."""
        with transaction(self.engine) as conn:
            return orders.take(conn, queue, now) is not None

    def _drain(self, node_id: str, reason: str, now: float) -> bool:
        with transaction(self.engine) as conn:
            draining = dict(read_state(conn, DRAINING) or {})
            draining.setdefault(node_id, now)
            write_state(conn, DRAINING, draining, now)
        ray_node = raynodes.alive_node(self.address, node_id)
        if ray_node is None:
            return True  # never joined, or already gone: the terminate follows
        retired = self.supervisor.retire_node(ray_node.node_id, self.drain_timeout)
        raynodes.drain(self.address, ray_node.node_id, reason[:500], self.drain_timeout)
        log.info("draining %s (actors %s)", node_id, ", ".join(retired) or "none")
        return True

    def _terminate(self, node_id: str) -> bool:
        try:
            self.provider.terminate_node(node_id)
        except Exception:
            log.exception("terminating %s failed; the next turn tries again", node_id)
            return False
        return True
