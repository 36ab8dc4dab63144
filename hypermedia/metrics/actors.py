"""The pipeline actors' metrics through ``ray.util.metrics``.

:class:`RayMetrics` is an actor's :class:`~hypermedia.metrics.Recorder`. Ray's metric
objects are made on first use (one per metric and process) and report to the metrics
agent of the actor's node, which exports them prefixed ``ray_`` with Ray's own labels
(``WorkerId``, ``NodeAddress``, ``SessionName`` ...) at the node's metrics export port:
the port ``ray.nodes()`` lists and Ray's Prometheus service discovery file names. A
counter of an actor that has died stays exported (its last value), so sums over
actors keep counting what the dead ones did.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from hypermedia.metrics import Labels, Metric, Recorder, check


class RayMetrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._metrics: dict[str, Any] = {}

    def count(self, metric: Metric, labels: Labels, amount: float = 1.0) -> None:
        values = check(metric, "counter", labels)
        self._metric(metric).inc(amount, tags=dict(zip(metric.labels, values, strict=True)))

    def observe(self, metric: Metric, labels: Labels, value: float) -> None:
        values = check(metric, "histogram", labels)
        self._metric(metric).observe(value, tags=dict(zip(metric.labels, values, strict=True)))

    def set(self, metric: Metric, labels: Labels, value: float) -> None:
        values = check(metric, "gauge", labels)
        self._metric(metric).set(value, tags=dict(zip(metric.labels, values, strict=True)))

    def place(self, cloud_nodes: Mapping[str, bool]) -> None:
        pass  # the head's business

    def _metric(self, metric: Metric) -> Any:
        found = self._metrics.get(metric.name)
        if found is not None:
            return found
        from ray.util import metrics

        with self._lock:
            if metric.name not in self._metrics:
                # Ray exports a counter under the name it is given (no _total added).
                tags = metric.labels or None
                made: Any
                if metric.kind == "counter":
                    made = metrics.Counter(metric.name, metric.help, tag_keys=tags)
                elif metric.kind == "histogram":
                    made = metrics.Histogram(
                        metric.name, metric.help, boundaries=list(metric.buckets), tag_keys=tags
                    )
                else:
                    made = metrics.Gauge(metric.name, metric.help, tag_keys=tags)
                self._metrics[metric.name] = made
            return self._metrics[metric.name]


def actor_metrics() -> Recorder:
    """:class:`RayMetrics` in a Ray actor; nothing elsewhere (the actor's body run
    in a plain process, as the benchmarks and tests do)."""
    import ray

    from hypermedia.metrics import NoMetrics

    if ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None:
        return RayMetrics()
    return NoMetrics()
