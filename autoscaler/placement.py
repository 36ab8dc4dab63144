"""Where each queue's standing workers run: the VPS's share of the baseline, by mode.

Seed 000, "Modes": ``vps_only``, only the VPS worker; ``hybrid``, the VPS handles the
baseline and the cloud the bursts; ``cloud_first``, a minimal VPS worker and most
processing on cloud instances. :func:`vps_pools` is that rule, and every part that
needs it asks it rather than deciding again:

- the ``ray up`` head (:mod:`autoscaler.head`) starts these pipeline actors on the VPS,
  and its Ray node advertises exactly these ``queue_<name>`` resources (the node
  provider's head command runner sets them, :func:`autoscaler.provider.head_resources`):
  a slot more would take a cloud worker's actor, a slot less would send a VPS actor to
  the cloud;
- the policy (:mod:`autoscaler.policy`) keeps the rest of the baseline on the cloud:
  its floor is ``baseline_workers`` less this share (less the queue's non-cloud workers
  live, if more: a machine joined with ``hypermedia worker --queue``), 0 in ``hybrid``;
- the fleet's request (:func:`autoscaler.snapshot.actor_totals`) is this share plus
  the cloud workers the plan wants;
- the head's ingest (:func:`autoscaler.admission.staffed`) counts a queue with a share
  as staffed;
- the simulator and the property tests start their VPS with it.

Pure: no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # config values come in built: importing pydantic is the loader's job
    from autoscaler.config import SchedulerConfig

# cloud_first's "minimal VPS worker": at most this many of a cloud-enabled queue's
# baseline stay on the VPS.
MINIMAL_VPS_WORKERS = 1


def vps_pools(config: SchedulerConfig) -> dict[str, int]:
    """The pipeline actors the VPS (the head's own Ray node) runs for each queue of
    ``config`` (every queue, 0 included).

    - ``vps_only`` and ``hybrid``: the queue's ``baseline_workers``.
    - ``cloud_first``: a cloud-enabled queue keeps ``min(baseline_workers,``
      :data:`MINIMAL_VPS_WORKERS` ``)`` on the VPS, and the policy launches the rest of
      its baseline on the cloud, even with the queue empty. A queue that is not
      cloud-enabled keeps its whole baseline on the VPS: nothing else could run it.

    Why one and not none: the daily cost cap's lock (``vps_only`` until the reset) drains
    every cloud worker; the VPS worker keeps running the queue's jobs meanwhile, at one
    worker's pace, where none would leave them waiting for the reset. A queue with a
    baseline of 0 keeps none in any mode: the operator asked for no standing worker,
    its jobs wait for a burst (and, while locked, for the reset), as in ``hybrid``.

    The lock does not change the answer: the head's Ray node advertises these slots
    from the moment ``ray up`` starts it, and its pools follow the same numbers.
    """
    cloud_first = config.mode == "cloud_first"
    return {
        name: (
            min(queue.baseline_workers, MINIMAL_VPS_WORKERS)
            if cloud_first and queue.cloud_enabled
            else queue.baseline_workers
        )
        for name, queue in config.queues.items()
    }
