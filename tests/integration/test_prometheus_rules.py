"""etc/prometheus/alerts.yml: promtool accepts it, its unit tests
(tests/prometheus/alerts_test.yml: each rule fires at its threshold and duration, not
before, and resolves) pass, and it carries every rule the scheduler evaluates."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from autoscaler import alerts

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "etc" / "prometheus" / "alerts.yml"
RULE_TESTS = REPO / "tests" / "prometheus" / "alerts_test.yml"
# Events (scaling, the policy's own alerts) are the scheduler's: Prometheus has no event.
EVENTS = {"scaling", "scheduler_alert", "billing"}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.fail("promtool is missing: ./scripts/setup installs it (Debian's prometheus)")
    return subprocess.run(
        [tool, *args], capture_output=True, text=True, timeout=60, cwd=RULE_TESTS.parent
    )


def test_promtool_checks_and_unit_tests_pass():
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", RULE_TESTS.name)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_scheduler_rule_has_its_prometheus_rule():
    loaded = yaml.safe_load(RULES.read_text())
    rules = [rule for group in loaded["groups"] for rule in group["rules"]]
    by_rule = {rule["labels"]["rule"]: rule for rule in rules}
    assert set(alerts.rules()) - EVENTS <= set(by_rule)
    for rule in rules:
        assert rule["labels"]["severity"] in alerts.LEVELS
        assert rule["annotations"]["summary"]
