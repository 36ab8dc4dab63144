"""Reading metrics as Prometheus would: scrape the text format, sum series by labels."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from hypermedia.metrics import RAY_PREFIX


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
    response = httpx.get(url, headers=headers, timeout=10)
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
