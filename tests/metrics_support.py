"""Reading metrics as Prometheus would (scrape the text format, sum series by labels),
and a real Prometheus on the shipped config."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from hypermedia import tls
from hypermedia.embedded import free_port
from hypermedia.metrics import RAY_PREFIX
from tests.api_support import serve_on_a_free_port


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


def parse(text: str, *, strip_ray_prefix: bool = False) -> list[Sample]:
    """Every sample of a scrape; ``strip_ray_prefix`` does what our Prometheus config
    does to Ray's ``ray_hypermedia_*`` names."""
    samples = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if strip_ray_prefix and name.startswith(RAY_PREFIX + "hypermedia_"):
                name = name.removeprefix(RAY_PREFIX)
            samples.append(Sample(name, dict(sample.labels), sample.value))
    return samples


def scrape(url: str, token: str | None = None) -> str:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.get(url, headers=headers, timeout=10, verify=tls.client_context())
    response.raise_for_status()
    return response.text


def sum_by(
    samples: Iterable[Sample],
    name: str,
    labels: tuple[str, ...],
    where: Callable[[Sample], bool] = lambda _: True,
) -> dict[tuple[str, ...], float]:
    """``sum by (labels) (name)``, leaving out zero sums (as a count of rows would)."""
    sums: dict[tuple[str, ...], float] = defaultdict(float)
    for sample in samples:
        if sample.name == name and where(sample):
            sums[tuple(sample.labels[label] for label in labels)] += sample.value
    return {key: value for key, value in sums.items() if value}


# -- a real Prometheus on the shipped config -------------------------------------------

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "etc" / "prometheus"
SHIPPED_DATA_DIR = "/var/lib/hypermedia"
SHIPPED_KEY_FILE = "/etc/prometheus/hypermedia-api-key"


def shipped_config(directory: Path, data_dir: Path, key_file: Path, interval: str) -> Path:
    """etc/prometheus/ copied into ``directory``, pointed at ``data_dir``'s targets and
    ``key_file``, scraping every ``interval``: nothing else changed."""
    text = (SHIPPED / "prometheus.yml").read_text()
    for old, new in (
        (SHIPPED_DATA_DIR, str(data_dir)),
        (SHIPPED_KEY_FILE, str(key_file)),
        ("scrape_interval: 15s", f"scrape_interval: {interval}"),
    ):
        assert old in text, old
        text = text.replace(old, new)
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(SHIPPED / "alerts.yml", directory / "alerts.yml")
    config = directory / "prometheus.yml"
    config.write_text(text)
    return config


@contextmanager
def prometheus(config: Path) -> Iterator[str]:
    """Debian's prometheus on ``config``, on a free loopback port; yields its URL
    (started again on another port if its pick was taken before it bound it)."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus is missing: ./scripts/setup installs it (Debian's prometheus)"

    def command(port: int) -> list[str]:
        return [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={config.parent / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ]

    process, url = serve_on_a_free_port(
        command,
        dict(os.environ),
        config.parent / "prometheus.log",
        timeout=30,
        pick=free_port,
        ready="/-/ready",
        taken="address already in use",
    )
    try:
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def query(url: str, expr: str) -> list[dict[str, Any]]:
    """An instant query's result; an expression Prometheus refuses fails the test."""
    response = httpx.get(
        f"{url}/api/v1/query", params={"query": expr}, timeout=10, verify=tls.client_context()
    )
    body = response.json()
    assert response.status_code == 200 and body["status"] == "success", (expr, body)
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def by_labels(result: list[dict[str, Any]], *labels: str) -> dict[tuple[str, ...], float]:
    """A query's vector as ``{label values: value}``, zeros left out."""
    found = {
        tuple(item["metric"].get(label, "") for label in labels): float(item["value"][1])
        for item in result
    }
    return {key: value for key, value in found.items() if value}
