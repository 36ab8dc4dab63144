"""The metric catalogue's rules, and the recorders' label checks."""

from __future__ import annotations

import re

import pytest

from hypermedia import metrics
from hypermedia.metrics import CATALOGUE, SCRAPED, MemoryRecorder, NoMetrics
from hypermedia.metrics.head import HeadMetrics
from tests.metrics_support import parse

# Labels that would name one job, object, user or worker: one series each, forever.
HIGH_CARDINALITY = re.compile(r"(^|_)(id|job|object|user|worker|key|pid|node)(_|$)")


def test_names_are_unique_prometheus_names_of_ours():
    names = [m.name for m in CATALOGUE]
    assert len(names) == len(set(names))
    for metric in CATALOGUE:
        assert re.fullmatch(r"hypermedia_[a-z_]+", metric.name), metric.name
        assert metric.name.endswith("_total") == (metric.kind == "counter"), metric.name
        assert bool(metric.buckets) == (metric.kind == "histogram"), metric.name
        assert list(metric.buckets) == sorted(metric.buckets)
        assert metric.help.endswith("."), metric.name


def test_labels_are_low_cardinality():
    for metric in CATALOGUE:
        for label in metric.labels:
            assert not HIGH_CARDINALITY.search(label), f"{metric.name}: {label}"


def test_the_module_docstring_lists_every_metric():
    doc = metrics.__doc__ or ""
    for metric in CATALOGUE:
        assert f"``{metric.name.removeprefix('hypermedia_')}``" in doc, metric.name
    assert set(SCRAPED) <= set(CATALOGUE)


def test_labels_must_be_exactly_the_metrics():
    recorder = MemoryRecorder()
    recorder.count(metrics.JOBS_COMPLETED, {"queue": "images", "operation": "thumbnail"})
    assert recorder.value(metrics.JOBS_COMPLETED, queue="images", operation="thumbnail") == 1
    with pytest.raises(ValueError, match="takes labels"):
        recorder.count(metrics.JOBS_COMPLETED, {"queue": "images"})
    with pytest.raises(ValueError, match="takes labels"):
        recorder.count(metrics.JOBS_COMPLETED, {"queue": "q", "operation": "o", "job_id": "x"})
    with pytest.raises(ValueError, match="is a counter"):
        recorder.set(metrics.JOBS_COMPLETED, {"queue": "q", "operation": "o"}, 3)
    with pytest.raises(ValueError, match="only goes up"):
        recorder.count(metrics.JOBS_COMPLETED, {"queue": "q", "operation": "o"}, -1)
    NoMetrics().count(metrics.JOBS_COMPLETED, {})  # records nothing, checks nothing


def test_the_head_exports_what_it_records_under_the_catalogue_names():
    head = HeadMetrics()
    head.count(metrics.JOBS_FAILED, {"queue": "images", "operation": "thumbnail", "code": "x"})
    head.observe(
        metrics.JOB_DURATION,
        {"queue": "images", "operation": "thumbnail", "outcome": "completed"},
        0.3,
    )
    head.set(metrics.COST_LOCKED, {}, 1)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for s in parse(head.exposition().decode())
    }
    failed = ("code", "x"), ("operation", "thumbnail"), ("queue", "images")
    assert samples[("hypermedia_jobs_failed_total", failed)] == 1
    assert samples[("hypermedia_cost_locked", ())] == 1
    bucket = (
        ("le", "0.5"),
        ("operation", "thumbnail"),
        ("outcome", "completed"),
        ("queue", "images"),
    )
    assert samples[("hypermedia_job_duration_seconds_bucket", bucket)] == 1
    # Two heads in one process (tests, a scheduler beside an API) do not share counts,
    # and a head exports only what it recorded: no scheduler "last evaluated at 0".
    assert "hypermedia_" not in HeadMetrics().exposition().decode()
