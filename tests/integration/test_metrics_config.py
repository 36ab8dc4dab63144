"""etc/prometheus/prometheus.yml and etc/grafana/: promtool accepts the scrape config as
shipped (pointed at a data dir), the dashboard file is the one the catalogue generates,
and every metric it draws is one the platform exports. That Prometheus scrapes a real
stack with it, and evaluates every panel's query, is tests/integration/
test_metrics_scrape.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import yaml

from hypermedia.metrics import CATALOGUE, grafana, targets
from tests.metrics_support import REPO, shipped_config

GRAFANA = REPO / "etc" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "hypermedia_grafana_dashboard.json"
HISTOGRAM_SERIES = re.compile(r"_(bucket|count|sum)$")


def test_promtool_accepts_the_scrape_config(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: ./scripts/setup installs it (Debian's prometheus)")
    data_dir = tmp_path / "data"
    targets.publish_api(data_dir, "http://127.0.0.1:8080")
    (targets.directory(data_dir) / targets.RAY_TARGETS).write_text(
        json.dumps([{"labels": {"job": "ray"}, "targets": ["127.0.0.1:9000"]}])
    )
    key = tmp_path / "key"
    key.write_text("hm_operator")
    config = shipped_config(tmp_path / "prometheus", data_dir, key, "15s")
    checked = subprocess.run(
        [promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout + checked.stderr


def test_the_api_target_file_is_what_prometheus_reads(tmp_path):
    written = targets.publish_api(tmp_path, "https://[::1]:8443/")
    assert json.loads(written.read_text()) == [
        {"targets": ["[::1]:8443"], "labels": {"__scheme__": "https"}}
    ]
    assert written.parent == tmp_path / "metrics"


def test_the_dashboard_file_is_the_generated_one():
    assert DASHBOARD.read_text() == grafana.render(), (
        "regenerate: python -m hypermedia.metrics.grafana > " + str(DASHBOARD.relative_to(REPO))
    )


def test_the_dashboard_draws_every_metric_and_only_ours_or_rays():
    names = {m.name for m in CATALOGUE}
    drawn: set[str] = set()
    for expr in grafana.queries():
        for word in re.findall(r"[a-z_]+(?=\{|\[|\)| |$)", expr):
            if word.startswith("hypermedia_"):
                metric = HISTOGRAM_SERIES.sub("", word) if word not in names else word
                assert metric in names, (metric, expr)
                drawn.add(metric)
            else:
                assert not word.endswith(("_total", "_seconds", "_cents")) or word.startswith(
                    "ray_"
                ), (word, expr)
    # Metrics named by a regular expression are drawn too.
    for expr in grafana.queries():
        for pattern in re.findall(r'__name__=~"([^"]+)"', expr):
            drawn |= {name for name in names if re.fullmatch(pattern, name)}
    assert drawn == names, names - drawn
    assert "hypermedia_queue_depth" in grafana.VARIABLE_QUERY


def test_grafana_provisioning_as_rays_integration_lays_it_out():
    datasources = yaml.safe_load((GRAFANA / "provisioning/datasources/default.yml").read_text())
    (prometheus,) = datasources["datasources"]
    assert prometheus["type"] == "prometheus" and prometheus["isDefault"]
    providers = yaml.safe_load((GRAFANA / "provisioning/dashboards/default.yml").read_text())
    paths = {p["name"]: p["options"]["path"] for p in providers["providers"]}
    assert paths == {
        "hypermedia": "${HYPERMEDIA_GRAFANA}/dashboards",
        "Ray": f"${{HYPERMEDIA_DATA_DIR}}/metrics/{targets.RAY_GRAFANA}",
    }
    ini = (GRAFANA / "grafana.ini").read_text()
    assert "allow_embedding = true" in ini and "http_addr = 127.0.0.1" in ini
    board = json.loads(DASHBOARD.read_text())
    assert board["uid"] == grafana.UID
    variables = {v["name"]: v["type"] for v in board["templating"]["list"]}
    assert variables == {"datasource": "datasource", "Queue": "query"}
    for panel in board["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}"
            assert panel["gridPos"]["w"] == 12 and panel["gridPos"]["h"] == 8


def test_a_panel_groups_and_names_its_series_by_labels_its_metrics_have():
    """The "Bulk runs" panel summed `by (run_id, kind, count)` and drew `{{run_id}}`, a
    label hypermedia_bulk_run_objects never has (the catalogue keeps ids out of labels):
    every run's series came out unnamed, two operations' runs of one kind added up."""
    labels = {m.name: set(m.labels) for m in CATALOGUE}
    # Prometheus's own (instance, job), a histogram's le, and Ray's node metrics' labels.
    theirs = {"instance", "job", "le"}
    for _, panels in grafana.ROWS:
        for panel in panels:
            for expr, legend in panel.targets:
                drawn = {
                    HISTOGRAM_SERIES.sub("", word) if word not in labels else word
                    for word in re.findall(r"hypermedia_[a-z_]+", expr)
                }
                if not drawn:
                    continue  # Ray's metrics
                have = set().union(*(labels[name] for name in drawn)) | theirs
                grouped = {
                    label.strip()
                    for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr)
                    for label in group.split(",")
                    if label.strip()
                }
                named = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend))
                assert grouped | named <= have, (panel.title, sorted((grouped | named) - have))
