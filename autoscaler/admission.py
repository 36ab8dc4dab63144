"""Whether a queue may get another cloud worker: one rule, asked twice.

Seed 000, "Scale-Up Decision": *if queue.cloud_enabled AND active_workers <
queue.max_workers*, under its "Modes" (``vps_only`` launches nothing) and "Cost
Control" (the daily cap locks to ``vps_only`` until the reset; the hourly cap stops new
instances). The policy (:mod:`autoscaler.policy`) asks :func:`admit` while it decides,
counting the workers of its snapshot; the node provider (:mod:`autoscaler.provider`)
asks again when Ray wants a node, counting the workers table and the ``cloud_spend``
ledger at that moment, under its launch lock. Two observations, one rule: the provider
refuses nothing the policy would allow on the same facts, and lets nothing through
that it would refuse.

In this order, the first that applies:

1. **Closed** (no cloud worker for the queue at all): locked by the daily cap; mode
   ``vps_only``; the queue is not in ``scheduler.json``; it is not cloud-enabled. The
   last three are the configuration (``configured``), the lock a state that passes.
2. **At max_workers**: ``max_workers`` counts every worker of the queue not yet
   terminated, VPS and cloud, starting, active *and draining* (a draining instance
   still exists and costs money). The room is ``max_workers`` minus that count; the
   baseline is not subtracted again (the VPS workers are counted as they are, and in
   ``cloud_first`` the baseline beyond the VPS's share is on the cloud:
   :mod:`autoscaler.placement`).
3. **The cost guard refuses every launch** (:attr:`~autoscaler.cost.GuardVerdict.
   launch_refusal`: the hourly cap, the launch rate). A launch it allows is still
   checked at its price, instance by instance (:meth:`~autoscaler.cost.Budget.refusal`).

Then each launch needs a provider with room under ``max_instances`` (its instances not
yet terminated counted): :func:`provider_room`.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autoscaler.cost import RESET_COMMAND, GuardVerdict
from autoscaler.placement import vps_pools

if TYPE_CHECKING:  # config values come in built: importing pydantic is the loader's job
    from autoscaler.config import ProviderName, SchedulerConfig

LOCKED = f"locked to vps_only by the daily cost cap until `{RESET_COMMAND}`"


@dataclass(frozen=True, slots=True)
class Admission:
    """The answer for one queue. ``room``: cloud workers it may still get under
    ``max_workers`` (0 when refused); ``refusal``: why none (None: up to ``room``);
    ``closed``: none at all, whatever the load (step 1); ``configured``: closed by the
    configuration, not by a state that passes (the lock)."""

    room: int
    refusal: str | None = None
    closed: bool = False
    configured: bool = False


def closed(config: SchedulerConfig, queue: str, *, locked: bool) -> tuple[str, bool] | None:
    """Why ``queue`` may have no cloud worker at all now, and whether the configuration
    says so (None: it may have some)."""
    if locked:
        return LOCKED, False
    if config.mode == "vps_only":
        return "mode is vps_only", True
    queue_config = config.queues.get(queue)
    if queue_config is None:
        return f"queue {queue} is not in scheduler.json", True
    if not queue_config.cloud_enabled:
        return f"{queue} is not cloud-enabled", True
    return None


def staffed(config: SchedulerConfig) -> set[str]:
    """The queues this configuration gives a worker, now or under load: VPS workers
    (:func:`autoscaler.placement.vps_pools`: in ``cloud_first`` a queue that is not
    cloud-enabled keeps its whole baseline there), or cloud workers (a cloud-enabled
    queue in a mode that launches; the daily cap's lock passes with a reset). A queue
    outside it has none: no VPS share and no cloud (a baseline of 0 in ``vps_only``, or
    not cloud-enabled): its jobs would wait forever, so the head's ingest refuses them
    unless a worker of the queue is live (a node that joined with it)."""
    bursts = config.mode != "vps_only"
    vps = vps_pools(config)
    return {
        name
        for name, queue in config.queues.items()
        if vps[name] > 0 or (bursts and queue.cloud_enabled)
    }


def admit(
    config: SchedulerConfig, queue: str, *, verdict: GuardVerdict, queue_workers: int
) -> Admission:
    """May ``queue`` get cloud workers now, and how many at most (see the module
    docstring). ``queue_workers``: its workers not yet terminated, VPS and cloud."""
    shut = closed(config, queue, locked=verdict.locked)
    if shut is not None:
        why, configured = shut
        return Admission(0, why, closed=True, configured=configured)
    limit = config.queues[queue].max_workers
    room = limit - queue_workers
    if room <= 0:
        return Admission(0, f"{queue} has {queue_workers} workers, at max_workers ({limit})")
    refusal = verdict.launch_refusal
    if refusal is not None:
        return Admission(0, refusal)
    return Admission(room)


def provider_room(
    config: SchedulerConfig,
    providers: Iterable[ProviderName],
    instances: Mapping[ProviderName, int],
) -> dict[ProviderName, int]:
    """Instances each of ``providers`` may still start: its ``max_instances`` minus
    ``instances`` (its instances not yet terminated, and any launched meanwhile)."""
    return {
        name: config.cloud_providers.get(name).max_instances - instances.get(name, 0)
        for name in providers
    }
