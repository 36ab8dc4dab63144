"""Ray's view of the burst nodes: find one by its instance id, drain it, wait for it.

Ray matches a node to the instance that runs it by ``RAY_CLOUD_INSTANCE_ID`` (set by
the boot script, :mod:`autoscaler.bootstrap`); the GCS reports it as the node's
``instance_id``. A drain with reason PREEMPTION and a deadline cannot be rejected:
the node takes no new work, and its raylet exits once idle (our actors there are
told to finish first); the deadline is when whoever terminates may stop waiting.

The node provider calls :func:`drain_and_wait` in a subprocess
(``python -m autoscaler.raynodes``) with the cluster's token in its environment:
``ray up``, ``ray down`` and the head's monitor import ``ray`` with whatever
environment they were started in, and Ray reads its auth settings once, at import.
"""

from __future__ import annotations

import argparse
import logging
import socket
import time
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

GCS_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class RayNodeInfo:
    node_id: str  # Ray's hex node id
    instance_id: str  # RAY_CLOUD_INSTANCE_ID: the provider's node id
    node_type: str
    alive: bool
    labels: dict[str, str]
    resources: dict[str, float] = field(default_factory=dict)  # its total, as it registered
    head: bool = False


def reachable(address: str, timeout: float = 2.0) -> bool:
    """Whether the GCS at ``host:port`` accepts connections (a stopped head does not)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def _gcs(address: str) -> Any:
    import ray._raylet

    return ray._raylet.GcsClient(address=address)  # type: ignore[attr-defined]


def nodes(address: str) -> list[RayNodeInfo]:
    """Every node the GCS knows (alive and dead)."""
    from ray.core.generated import gcs_pb2

    found = _gcs(address).get_all_node_info(timeout=GCS_TIMEOUT_SECONDS)
    return [
        RayNodeInfo(
            node_id=node_id.hex(),
            instance_id=info.instance_id,
            node_type=info.node_type_name,
            alive=info.state == gcs_pb2.GcsNodeInfo.ALIVE,  # type: ignore[attr-defined]
            labels=dict(info.labels),
            resources=dict(info.resources_total),
            head=info.is_head_node,
        )
        for node_id, info in found.items()
    ]


def alive_node(address: str, instance_id: str) -> RayNodeInfo | None:
    for node in nodes(address):
        if node.alive and node.instance_id == instance_id:
            return node
    return None


def drain(address: str, node_id: str, reason: str, deadline_seconds: float) -> None:
    """Ask the GCS to drain a node (PREEMPTION: it cannot be refused)."""
    from ray.core.generated import autoscaler_pb2

    deadline_ms = int((time.time() + deadline_seconds) * 1000)
    accepted, why = _gcs(address).drain_node(
        node_id,
        autoscaler_pb2.DrainNodeReason.Value(  # type: ignore[attr-defined]
            "DRAIN_NODE_REASON_PREEMPTION"
        ),
        reason,
        deadline_ms,
    )
    if not accepted:  # documented as impossible for PREEMPTION; say so if it happens
        raise RuntimeError(f"Ray refused to drain {node_id}: {why}")


def drain_and_wait(address: str, instance_id: str, reason: str, deadline_seconds: float) -> str:
    """Drain the node of ``instance_id`` and wait until it is gone or the deadline
    passes; what happened, in words."""
    if not reachable(address):
        return "the head is not reachable: nothing to drain"
    node = alive_node(address, instance_id)
    if node is None:
        return "no live Ray node: already drained"
    drain(address, node.node_id, reason, deadline_seconds)
    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        if alive_node(address, instance_id) is None:
            return f"drained: Ray node {node.node_id[:12]} exited"
        time.sleep(1.0)
    return f"drain deadline of {deadline_seconds:.0f} s passed: terminating anyway"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autoscaler.raynodes")
    parser.add_argument("--address", required=True)
    parser.add_argument("--instance", required=True)
    parser.add_argument("--reason", default="hypermedia: terminating the instance")
    parser.add_argument("--deadline", type=float, default=300.0)
    args = parser.parse_args(argv)
    print(drain_and_wait(args.address, args.instance, args.reason, args.deadline))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
