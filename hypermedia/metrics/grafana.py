"""The Grafana dashboard of these metrics, built from the catalogue.

``python -m hypermedia.metrics.grafana > etc/grafana/dashboards/hypermedia_grafana_dashboard.json``
writes the file ``etc/grafana/`` provisions (a test checks the two agree). It follows the
dashboards Ray's own Grafana integration generates: a ``datasource`` variable for a
Prometheus data source, rows of two panels 12 columns wide and 8 high, time series with
their units. Every query names catalogue metrics (after our scrape config has stripped
Ray's ``ray_`` prefix) or Ray's own ``ray_*`` node metrics.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

UID = "hypermedia"
TITLE = "hypermedia"
QUEUE = 'queue=~"$Queue"'
RATE = "5m"


def per_minute(counter: str, by: str = "queue") -> str:
    return f"sum by ({by}) (rate({counter}{{{QUEUE}}}[{RATE}])) * 60"


def last_hour(counter: str, by: str) -> str:
    return f"sum by ({by}) (increase({counter}{{{QUEUE}}}[1h]))"


def plus(a: str, b: str) -> str:
    """``a + b`` series by series, keeping a series only one side has (PromQL's ``+``
    drops those; ``increase`` over several metric names at once is refused)."""
    return f"(({a}) + ({b})) or ({a}) or ({b})"


_FAILED = plus(
    last_hour("hypermedia_jobs_failed_total", "queue"),
    last_hour("hypermedia_jobs_retried_total", "queue"),
)
FAILED_SHARE = (
    f"({_FAILED}) / ({plus(last_hour('hypermedia_jobs_completed_total', 'queue'), _FAILED)})"
)


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    targets: tuple[tuple[str, str], ...]  # (PromQL, legend)
    unit: str = "short"
    kind: str = "timeseries"
    thresholds: tuple[float, ...] = field(default=())


ROWS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    (
        "Queues",
        (
            Panel(
                "Queue depth",
                "Jobs ready to run, per queue and priority band (Redis, read when scraped).",
                (
                    (
                        f"sum by (queue, priority_band) (hypermedia_queue_depth{{{QUEUE}}})",
                        "{{queue}} {{priority_band}}",
                    ),
                ),
                thresholds=(50,),
            ),
            Panel(
                "Oldest ready job",
                "Age of the oldest ready job per queue and band; band 1-3 alerts at 15 min.",
                (
                    (
                        "max by (queue, priority_band) "
                        f"(hypermedia_queue_oldest_age_seconds{{{QUEUE}}})",
                        "{{queue}} {{priority_band}}",
                    ),
                ),
                unit="s",
                thresholds=(900,),
            ),
            Panel(
                "In flight and waiting for a retry",
                "Jobs leased by a worker, and jobs waiting for their retry.",
                (
                    (
                        f"sum by (queue) (hypermedia_queue_in_flight{{{QUEUE}}})",
                        "{{queue}} in flight",
                    ),
                    (
                        f"sum by (queue) (hypermedia_queue_retry_wait{{{QUEUE}}})",
                        "{{queue}} retry wait",
                    ),
                ),
            ),
            Panel(
                "Submitted and started per minute",
                "Jobs created by submits; attempts started by the workers.",
                (
                    (per_minute("hypermedia_jobs_submitted_total"), "{{queue}} submitted"),
                    (per_minute("hypermedia_jobs_started_total"), "{{queue}} started"),
                ),
            ),
        ),
    ),
    (
        "Jobs",
        (
            Panel(
                "Finished per minute",
                "Jobs completed and failed, and failed attempts that will be retried.",
                (
                    (
                        per_minute("hypermedia_jobs_completed_total"),
                        "{{queue}} completed",
                    ),
                    (
                        per_minute("hypermedia_jobs_failed_total"),
                        "{{queue}} failed",
                    ),
                    (
                        per_minute("hypermedia_jobs_retried_total"),
                        "{{queue}} retried",
                    ),
                ),
            ),
            Panel(
                "Failures by error code (last hour)",
                "Jobs failed and attempts retried, by the code the record holds.",
                (
                    (
                        last_hour("hypermedia_jobs_failed_total", "code"),
                        "{{code}} failed",
                    ),
                    (
                        last_hour("hypermedia_jobs_retried_total", "code"),
                        "{{code}} retried",
                    ),
                ),
            ),
            Panel(
                "Failed share of finished attempts (last hour)",
                "Failed attempts (failed and retried) among finished ones; alerts above 10 %.",
                ((FAILED_SHARE, "{{queue}}"),),
                unit="percentunit",
                thresholds=(0.1,),
            ),
            Panel(
                "Sandbox kills by limit (last hour)",
                "Jobs stopped by a sandbox limit: wall clock, CPU, memory, disk, processes.",
                (
                    (
                        last_hour("hypermedia_sandbox_kills_total", "queue, limit"),
                        "{{queue}} {{limit}}",
                    ),
                ),
            ),
            Panel(
                "Job duration (p50, p95)",
                "Completed attempts, from their start to their completion, per operation.",
                (
                    (
                        "histogram_quantile(0.5, sum by (le, operation) (rate("
                        f'hypermedia_job_duration_seconds_bucket{{outcome="completed",{QUEUE}}}[{RATE}])))',
                        "{{operation}} p50",
                    ),
                    (
                        "histogram_quantile(0.95, sum by (le, operation) (rate("
                        f'hypermedia_job_duration_seconds_bucket{{outcome="completed",{QUEUE}}}[{RATE}])))',
                        "{{operation}} p95",
                    ),
                ),
                unit="s",
            ),
            Panel(
                "Queue wait (p95)",
                "From a job's creation to its first attempt, per queue and priority band.",
                (
                    (
                        "histogram_quantile(0.95, sum by (le, queue, priority_band) (rate("
                        f"hypermedia_job_queue_wait_seconds_bucket{{{QUEUE}}}[{RATE}])))",
                        "{{queue}} {{priority_band}}",
                    ),
                ),
                unit="s",
            ),
        ),
    ),
    (
        "Workers",
        (
            Panel(
                "Pipeline actors",
                "Live workers per queue, on the VPS or on cloud instances (spot or not).",
                (
                    (
                        f"sum by (queue, location, spot) (hypermedia_workers{{{QUEUE}}})",
                        "{{queue}} {{location}} spot={{spot}}",
                    ),
                    (
                        f'sum by (queue) (hypermedia_workers{{state="draining",{QUEUE}}})',
                        "{{queue}} draining",
                    ),
                ),
            ),
            Panel(
                "Oldest heartbeat",
                "The oldest heartbeat among a queue's live workers; alerts past 2 minutes.",
                (
                    (
                        f"max by (queue) (hypermedia_worker_heartbeat_age_seconds{{{QUEUE}}})",
                        "{{queue}}",
                    ),
                ),
                unit="s",
                thresholds=(120,),
            ),
            Panel(
                "Claims paused",
                "The longest a live worker of the queue has claimed nothing because its disk"
                " is low (worker_min_free_disk_mb); alerts past 5 minutes, and the scheduler"
                " drains a cloud node past claims_paused_drain_seconds.",
                (
                    (
                        f"max by (queue) (hypermedia_worker_claims_paused_seconds{{{QUEUE}}})",
                        "{{queue}}",
                    ),
                ),
                unit="s",
                thresholds=(300,),
            ),
            Panel(
                "Storage down",
                "1 while the head's probe of the storage (S3: a HEAD of the bucket; local: the"
                " directory takes a file and has room) fails: uploads, job inputs and outputs"
                " cannot move, /healthz answers 503; alerts past 2 minutes.",
                (("1 - min(hypermedia_storage_up)", "down"),),
                kind="stat",
                thresholds=(1,),
            ),
            Panel(
                "Blob deletions waiting",
                "Blobs of deleted objects the storage failed to delete (S3 down, a timeout, a"
                " disk error): still stored, and paid for; the head's maintenance tries each"
                " again, backing off up to an hour between tries.",
                (("max(hypermedia_blob_deletions_pending)", "waiting"),),
            ),
            Panel(
                "Oldest blob deletion waiting",
                "How long the oldest of them has waited to be deleted; alerts past an hour"
                " (the storage has refused it at every try: the head's log, action"
                " blob_sweep, says why).",
                (("max(hypermedia_blob_deletions_oldest_age_seconds)", "oldest"),),
                unit="s",
                thresholds=(3600,),
            ),
            Panel(
                "Callbacks waiting",
                "Job callbacks (completion webhooks) not delivered yet: due, or waiting for"
                " a retry after their receiver failed; and those given up in the last hour"
                " (callback_max_attempts failed attempts: GET /jobs/{id} shows each one's"
                " last answer for callback_failed_retention_seconds, 7 days); alerts on"
                " any given up.",
                (
                    ("max(hypermedia_callbacks_pending)", "pending"),
                    ("max(hypermedia_callbacks_failed)", "given up, last hour"),
                ),
            ),
            Panel(
                "Oldest callback waiting",
                "How long the oldest callback not delivered has waited since its job ended"
                " (a receiver that does not answer has its events tried one at a time, about"
                " 25 minutes each with the default attempts), how long the oldest one due"
                " for an attempt has waited for it, and how long ago the head's sender"
                " finished its last attempt. Overdue past an hour alerts: Stuck when the"
                " sender has made no attempt for 10 minutes (its log, action callback, says"
                " why), Behind when it is working but its receivers answer too slowly for"
                " their backlog (one event at a time each).",
                (
                    ("max(hypermedia_callbacks_oldest_pending_age_seconds)", "oldest"),
                    ("max(hypermedia_callbacks_oldest_overdue_seconds)", "overdue"),
                    (
                        "time() - max(hypermedia_callbacks_last_attempt_timestamp_seconds)",
                        "since the last attempt",
                    ),
                ),
                unit="s",
                thresholds=(3600,),
            ),
            Panel(
                "Node CPU",
                "Ray's measure of each node's CPU; the seed alerts past 90 % for 10 minutes.",
                (("ray_node_cpu_utilization", "{{instance}}"),),
                unit="percent",
                thresholds=(90,),
            ),
            Panel(
                "CPUs reserved in Ray",
                "Logical CPUs taken on each node: each pipeline actor reserves its queue's cpus.",
                (
                    (
                        'sum by (instance) (ray_resources{Name="CPU",State="USED"})',
                        "{{instance}} used",
                    ),
                    (
                        'sum by (instance) (ray_resources{Name="CPU",State=~"USED|AVAILABLE"})',
                        "{{instance}} total",
                    ),
                ),
            ),
        ),
    ),
    (
        "Cloud spend and the scheduler",
        (
            Panel(
                "Spend against the caps",
                "The ledger's last hour and today (UTC), beside scheduler.json's caps.",
                (
                    ('max(hypermedia_cloud_spend_cents{window="hour"})', "last hour"),
                    ('max(hypermedia_cloud_spend_cap_cents{window="hour"})', "hourly cap"),
                    ('max(hypermedia_cloud_spend_cents{window="day"})', "today"),
                    ('max(hypermedia_cloud_spend_cap_cents{window="day"})', "daily cap"),
                    ("max(hypermedia_cloud_spend_alert_cents)", "alert threshold"),
                ),
                unit="none",
            ),
            Panel(
                "Scheduler decisions (last hour)",
                "Decisions written to scheduler_decisions, by action.",
                (
                    (
                        "sum by (action) (increase(hypermedia_scheduler_decisions_total[1h]))",
                        "{{action}}",
                    ),
                ),
            ),
            Panel(
                "Cost lock",
                "1 while the daily cap holds the scheduler in vps_only (until reset-cost-lock).",
                (("max(hypermedia_cost_locked)", "locked"),),
                kind="stat",
                thresholds=(1,),
            ),
            Panel(
                "Bulk runs",
                "Runs not finished: jobs created, objects skipped (done at the target"
                " version), migrated, and their jobs queued or running (the cap).",
                (
                    (
                        "sum by (kind, operation, count) (hypermedia_bulk_run_objects{count=~"
                        '"created|skipped|migrated|failed|live"})',
                        "{{kind}} {{operation}} {{count}}",
                    ),
                ),
            ),
            Panel(
                "Since the scheduler's last turn",
                "Seconds since the scheduler last evaluated.",
                (("time() - max(hypermedia_scheduler_last_evaluation_timestamp_seconds)", "age"),),
                unit="s",
                kind="stat",
                thresholds=(300,),
            ),
        ),
    ),
)


def queries() -> list[str]:
    """Every PromQL expression of the dashboard's panels (``$Queue`` is Grafana's)."""
    return [expr for _, panels in ROWS for panel in panels for expr, _ in panel.targets]


# The Queue variable's values (Grafana's label_values, not PromQL).
VARIABLE_QUERY = "label_values(hypermedia_queue_depth, queue)"
_DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def _panel(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
    steps += [{"color": "red", "value": value} for value in panel.thresholds]
    body: dict[str, Any] = {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": _DATASOURCE,
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {
            "defaults": {
                "unit": panel.unit,
                "thresholds": {"mode": "absolute", "steps": steps},
            },
            "overrides": [],
        },
        "options": {"legend": {"displayMode": "table", "placement": "right"}},
        "targets": [
            {
                "datasource": _DATASOURCE,
                "expr": expr,
                "legendFormat": legend,
                "refId": chr(ord("A") + index),
            }
            for index, (expr, legend) in enumerate(panel.targets)
        ],
    }
    if panel.thresholds and panel.kind == "timeseries":
        body["fieldConfig"]["defaults"]["custom"] = {"thresholdsStyle": {"mode": "line"}}
    return body


def dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    y = 0
    panel_id = 1
    for title, row in ROWS:
        panels.append(
            {
                "id": panel_id,
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        panel_id += 1
        y += 1
        for index, panel in enumerate(row):
            panels.append(_panel(panel, panel_id, 12 * (index % 2), y + 8 * (index // 2)))
            panel_id += 1
        y += 8 * ((len(row) + 1) // 2)
    return {
        "uid": UID,
        "title": TITLE,
        "description": "hypermedia's queues, jobs, workers, cloud spend and scheduler "
        "(the metrics listed in hypermedia/metrics/__init__.py).",
        "tags": ["hypermedia"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 27,
        "style": "dark",
        "time": {"from": "now-6h", "to": "now"},
        "timezone": "utc",
        "annotations": {"list": []},
        "links": [],
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "type": "datasource",
                    "query": "prometheus",
                    "description": "The Prometheus of etc/prometheus/prometheus.yml.",
                    "hide": 0,
                    "includeAll": False,
                    "multi": False,
                    "current": {},
                    "options": [],
                    "refresh": 1,
                },
                {
                    "name": "Queue",
                    "type": "query",
                    "datasource": _DATASOURCE,
                    "definition": VARIABLE_QUERY,
                    "query": {"query": VARIABLE_QUERY, "refId": "Queue"},
                    "description": "The queues to show.",
                    "includeAll": True,
                    "allValue": ".+",
                    "multi": True,
                    "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
                    "options": [],
                    "refresh": 2,
                    "sort": 1,
                },
            ]
        },
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    print(render(), end="")
