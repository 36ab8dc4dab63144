"""Load through a real local cluster, then scrape Ray's metrics endpoint and the API's
/metrics: depth, completions and failures by code equal the record, read directly and
through a real Prometheus on the shipped config (etc/prometheus/), which also evaluates
every query of the shipped Grafana dashboard.

The pipeline actors count through ``ray.util.metrics`` (Ray's metrics agent exports them
at the node's metrics export port, prefixed ``ray_``, which our Prometheus config strips);
the head counts what it writes and reads Redis and the record when scraped. The shared
Ray head outlives this test's actors and keeps the counters of earlier tests' actors:
only this stack's actors' series are summed (Ray's ``WorkerId`` label). It runs no
dashboard, so no Ray service discovery file: the test writes ``ray.json`` as Ray would
(the e2e test of ``hypermedia up`` checks Ray's own)."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path

import httpx
import ray
from sqlalchemy import select

from hypermedia import tls
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.ingest.service import SubmitRequest
from hypermedia.metrics import grafana, targets
from tests.api_support import add_user
from tests.factories import make_user, stored_object
from tests.metrics_support import (
    Sample,
    by_labels,
    parse,
    prometheus,
    query,
    scrape,
    shipped_config,
    sum_by,
)
from tests.ray_support import RayStack, ray_stack

FAIL_NOW = {"code": "invalid_input", "message": "bad bytes", "retryable": False}
FAIL_TWICE = {"code": "unsupported_format", "message": "not this", "retryable": True}
TERMINAL = ("completed", "failed", "cancelled")


def _submit(rs: RayStack, person, object_id: str, op: str, params=None) -> str:
    request = SubmitRequest(
        object_id=object_id, operations=[op], params={op: params} if params else {}
    )
    return rs.stack.ingest.submit(person.caller, request).job_ids[0]


def _record(rs: RayStack):
    with transaction(rs.stack.engine) as conn:
        jobs = conn.execute(
            select(t.jobs.c.queue, t.jobs.c.operation, t.jobs.c.status, t.jobs.c.error_code)
        ).all()
        attempts = conn.execute(
            select(t.jobs.c.queue, t.jobs.c.operation, t.attempts.c.status, t.attempts.c.error_code)
            .select_from(t.attempts)
            .join(t.jobs, t.jobs.c.job_id == t.attempts.c.job_id)
        ).all()
    return jobs, attempts


def _ray_samples(worker_ids: set[str]) -> list[Sample]:
    """This stack's actors' samples from every node's metrics export port."""
    samples = []
    for node in ray.nodes():
        if node["Alive"]:
            url = f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
            samples += parse(scrape(url), strip_ray_prefix=True)
    return [s for s in samples if s.labels.get("WorkerId") in worker_ids]


def _ray_targets(data_dir: Path) -> None:
    """``metrics/ray.json`` in the format of Ray's service discovery file."""
    addresses = [f"{n['NodeManagerAddress']}:{n['MetricsExportPort']}" for n in ray.nodes()]
    content = [{"labels": {"job": "ray"}, "targets": addresses}]
    (targets.directory(data_dir) / targets.RAY_TARGETS).write_text(json.dumps(content))


def _prometheus_config(rs: RayStack, api_key: str, directory: Path) -> Path:
    data_dir = rs.settings.data_dir
    targets.publish_api(data_dir, rs.settings.public_api_url)
    _ray_targets(data_dir)
    key_file = directory / "api-key"
    key_file.write_text(api_key)
    os.chmod(key_file, 0o600)
    return shipped_config(directory / "prometheus", data_dir, key_file, "1s")


def test_scraped_metrics_equal_the_record(pg_engine, settings, tmp_path):
    with ray_stack(settings, pg_engine, tmp_path, {"images": 1}, backoff_base_seconds=0.2) as rs:
        person = make_user(rs.stack)
        operator = add_user(rs.stack, "ops", operator=True)
        api = f"{rs.settings.public_api_url}/metrics"
        config = _prometheus_config(rs, operator.api_key, tmp_path)
        with prometheus(config) as prom:
            _load_and_check(rs, person, operator, api, prom)


def _load_and_check(rs: RayStack, person, operator, api: str, prom: str) -> None:
    object_id = stored_object(rs.stack, person, b"payload")
    ops = [("test.copy_input", None)] * 3 + [("test.fail", FAIL_NOW)] * 2
    ops += [("test.fail", FAIL_TWICE), ("test.allocate_on_images", None)]
    job_ids = [_submit(rs, person, object_id, op, params) for op, params in ops]

    def finished() -> bool:
        jobs = {row.status for row in _record(rs)[0]}
        rs.last_seen = str(jobs)
        return jobs <= set(TERMINAL)

    rs.wait_for(finished, timeout=90, what="every job to finish")
    live = parse(scrape(api, operator.api_key))
    assert sum_by(live, "hypermedia_workers", ("queue", "state", "location", "spot")) == {
        ("images", "active", "vps", "false"): 1
    }
    # Read as it is, not through sum_by (which leaves zeros out): a heartbeat written
    # between the scrape's clock reading and its read of the workers is 0 s old.
    (age,) = [s.value for s in live if s.name == "hypermedia_worker_heartbeat_age_seconds"]
    assert 0 <= age < 10  # the tests' heartbeat: every second
    # With the actors stopped, new jobs stay queued: the depth the head reads.
    members = rs.supervisor.actors()
    worker_ids = {ray.get(m.actor.health.remote())["ray_worker_id"] for m in members}
    rs.supervisor.drain(timeout=10)
    waiting = [_submit(rs, person, object_id, "test.copy_input") for _ in range(2)]

    jobs, attempts = _record(rs)
    assert len(jobs) == len(job_ids) + len(waiting)
    completed = Counter((j.queue, j.operation) for j in jobs if j.status == "completed")
    failed = Counter((j.queue, j.operation, j.error_code) for j in jobs if j.status == "failed")
    assert completed == {("images", "test.copy_input"): 3}
    assert failed == {
        ("images", "test.fail", "invalid_input"): 2,
        ("images", "test.fail", "unsupported_format"): 1,
        ("images", "test.allocate_on_images", "memory_limit"): 1,
    }
    retried = Counter(
        (a.queue, a.operation, a.error_code) for a in attempts if a.status == "failed"
    )
    retried.subtract(failed)
    started = Counter((a.queue, a.operation) for a in attempts)

    # Ray exports what the actors counted within its report interval (~10 s).
    deadline = time.monotonic() + 60
    while True:
        ray_samples = _ray_samples(worker_ids)
        seen = sum_by(ray_samples, "hypermedia_jobs_completed_total", ("queue", "operation"))
        seen_failed = sum_by(
            ray_samples, "hypermedia_jobs_failed_total", ("queue", "operation", "code")
        )
        if (seen, seen_failed) == (completed, failed) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    head = parse(scrape(api, operator.api_key))
    both = ray_samples + head  # one Prometheus sees both endpoints

    assert sum_by(both, "hypermedia_jobs_completed_total", ("queue", "operation")) == completed
    by_code = sum_by(both, "hypermedia_jobs_failed_total", ("queue", "operation", "code"))
    assert by_code == failed
    # What an operator asks Prometheus: failures by code, whoever counted them.
    per_code: Counter[tuple[str, ...]] = Counter()
    for (_, _, code), n in failed.items():
        per_code[(code,)] += n
    assert sum_by(both, "hypermedia_jobs_failed_total", ("code",)) == per_code
    assert sum_by(both, "hypermedia_jobs_retried_total", ("queue", "operation", "code")) == (
        +retried
    )
    assert sum_by(both, "hypermedia_jobs_started_total", ("queue", "operation")) == started
    submitted = Counter((j.queue, j.operation) for j in jobs)
    assert sum_by(head, "hypermedia_jobs_submitted_total", ("queue", "operation")) == submitted
    kills = Counter((a.queue, "memory") for a in attempts if a.error_code == "memory_limit")
    assert sum_by(both, "hypermedia_sandbox_kills_total", ("queue", "limit")) == kills
    durations = sum_by(both, "hypermedia_job_duration_seconds_count", ("queue", "outcome"))
    assert durations[("images", "completed")] == 3
    waits = sum_by(both, "hypermedia_job_queue_wait_seconds_count", ("queue",))
    first_attempts = Counter(j.queue for j in jobs if j.status in TERMINAL)
    assert waits == {(q,): n for q, n in first_attempts.items()}

    queued = Counter(j.queue for j in jobs if j.status == "queued")
    assert queued == {"images": 2}
    assert sum_by(head, "hypermedia_queue_depth", ("queue",)) == {
        (q,): n for q, n in queued.items()
    }
    assert sum_by(head, "hypermedia_workers", ("queue",)) == {}  # drained: none live

    # The same through Prometheus on the shipped config: Ray's ray_hypermedia_* arrive
    # as hypermedia_* (relabelled), the API is scraped with the operator's key.
    ours = f'job="ray",WorkerId=~"{"|".join(sorted(worker_ids))}"'

    def both_jobs(metric: str) -> str:
        return f'{metric}{{job="hypermedia"}} or {metric}{{{ours}}}'

    per_code_query = f"sum by (code) ({both_jobs('hypermedia_jobs_failed_total')})"
    completed_query = f"sum by (queue, operation) ({both_jobs('hypermedia_jobs_completed_total')})"
    depth_query = "sum by (queue) (hypermedia_queue_depth)"
    deadline = time.monotonic() + 30
    while True:
        through = (
            by_labels(query(prom, per_code_query), "code"),
            by_labels(query(prom, completed_query), "queue", "operation"),
            by_labels(query(prom, depth_query), "queue"),
        )
        expected: tuple[dict[tuple[str, ...], float], ...] = (
            dict(per_code),
            dict(completed),
            {(q,): n for q, n in queued.items()},
        )
        if through == expected or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert through == expected
    assert query(prom, "ray_hypermedia_jobs_completed_total") == []  # renamed on the way in
    # Both targets were scraped (a scrape of Ray's agent may time out on a loaded
    # machine: its latest "up" then says 0, the one before it 1).
    for job in ("hypermedia", "ray"):
        assert query(prom, f'max_over_time(up{{job="{job}"}}[5m]) == 1'), job
    # Every query of the shipped dashboard is one Prometheus takes. Those of gauges on
    # what ran here have data (a rate needs two samples of a series: not asked). Asked
    # again for a while: a scrape of Ray's agent that timed out on a loaded machine
    # (1 s here) marks its series stale, and they answer nothing until the next one.
    idle = (
        "cloud_spend",
        "cost_locked",
        "scheduler_",
        "hypermedia_workers",
        "heartbeat",
        "claims_paused",  # per queue of live workers, as the heartbeat's age
        "bulk_run",
        "callbacks_last_attempt",  # absent until the head's sender attempts one: none here
    )
    deadline = time.monotonic() + 30
    while True:
        answered = {e: query(prom, e.replace("$Queue", ".+")) for e in grafana.queries()}
        empty = {expr for expr, result in answered.items() if not result and "[" not in expr}
        should = {e for e in answered if "[" not in e and any(name in e for name in idle)}
        if empty == should or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert empty == should
    rules = httpx.get(f"{prom}/api/v1/rules", timeout=10, verify=tls.client_context()).json()[
        "data"
    ]["groups"]
    assert [group["name"] for group in rules] == ["hypermedia"]  # alerts.yml loaded
