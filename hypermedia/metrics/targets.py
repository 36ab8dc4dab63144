"""Where Prometheus and Grafana find a running stack's metrics: ``<data_dir>/metrics/``.

``etc/prometheus/prometheus.yml`` reads two ``file_sd_configs`` files here, and
``etc/grafana/`` Ray's own dashboards, so neither the API's port (a free one for
``hypermedia up``) nor the Ray head's temp dir (named by a hash) needs editing:

``ray.json``
    a link to Ray's own service discovery file in the head's temp dir (every live node's
    metrics export address, plus Ray's autoscaler and dashboard metrics), which Ray keeps
    current while the head's dashboard runs;
``ray-dashboards``
    a link to the Grafana dashboards Ray's dashboard writes for its session (the ones
    its Metrics page embeds);
``api.json``
    the API's address, written when the API starts (its ``/metrics`` wants an operator's
    key: the scrape config reads it from a file).

The data dir is ``0700``: Prometheus and Grafana run as the same user, or get copies.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

SERVICE_DISCOVERY_FILE = "prom_metrics_service_discovery.json"  # Ray's name for it
RAY_DASHBOARDS = Path("session_latest", "metrics", "grafana", "dashboards")  # Ray's too
RAY_TARGETS = "ray.json"
RAY_GRAFANA = "ray-dashboards"
API_TARGETS = "api.json"


def directory(data_dir: Path) -> Path:
    path = data_dir / "metrics"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def link_ray(data_dir: Path, head_temp_dir: Path) -> Path:
    """``ray.json`` and ``ray-dashboards`` -> the head's in ``head_temp_dir``."""
    for name, target in (
        (RAY_TARGETS, head_temp_dir / SERVICE_DISCOVERY_FILE),
        (RAY_GRAFANA, head_temp_dir / RAY_DASHBOARDS),
    ):
        link = directory(data_dir) / name
        link.unlink(missing_ok=True)
        link.symlink_to(target)
    return directory(data_dir) / RAY_TARGETS


def publish_api(data_dir: Path, api_url: str) -> Path:
    """``api.json``: the API of ``api_url`` as one Prometheus target (written whole, or
    not at all: Prometheus may read it at any moment)."""
    parts = urlsplit(api_url)
    if parts.hostname is None:
        raise ValueError(f"no host in {api_url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    content = [{"targets": [f"{host}:{port}"], "labels": {"__scheme__": parts.scheme}}]
    target = directory(data_dir) / API_TARGETS
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".api-")
    with os.fdopen(fd, "w") as out:
        json.dump(content, out)
    os.replace(tmp, target)
    return target
