"""scheduler.json: the shipped defaults load, and every class of bad input refuses to
start with a ConfigError naming the key path."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from autoscaler import config
from hypermedia.errors import ConfigError

SHIPPED = json.loads(config.SHIPPED.read_text())


def hybrid() -> dict[str, Any]:
    """The shipped file with AWS enabled (real values) and OCR bursting to it."""
    data: dict[str, Any] = copy.deepcopy(SHIPPED)
    data["mode"] = "hybrid"
    data["cloud_providers"]["aws"].update(enabled=True, ami_id="ami-0123456789abcdef0")
    data["queues"]["ocr"].update(cloud_enabled=True, cloud_provider="aws")
    return data


def test_the_shipped_file_is_the_seeds_vps_only_defaults():
    loaded = config.parse(SHIPPED)
    assert loaded.mode == "vps_only"
    assert loaded.evaluation_interval_seconds == 60
    assert list(loaded.queues) == ["images", "documents", "ocr", "media", "bulk"]
    assert (loaded.queues["images"].baseline_workers, loaded.queues["images"].max_workers) == (1, 1)
    assert loaded.queues["bulk"].spot_preferred and loaded.queues["bulk"].max_workers == 5
    assert not any(q.cloud_enabled for q in loaded.queues.values())
    assert loaded.cloud_providers.enabled() == []
    assert loaded.cloud_providers.aws.spot_max_price_cents == pytest.approx(5.0)
    assert loaded.scaling_rules.scale_up.queue_depth_threshold == 10
    assert loaded.scaling_rules.scale_down.idle_minutes == 10
    assert loaded.scaling_rules.scale_down.drain_timeout_seconds == 300  # the seed's 5 min
    # Ours, not the seed's: a cloud worker whose disk is low, drained after 10 minutes;
    # the alert after 5. The shipped file says the defaults.
    assert loaded.scaling_rules.scale_down.claims_paused_drain_seconds == 600
    assert loaded.alerts.worker_disk_low.for_seconds == 300
    assert loaded.alerts == config.AlertsConfig()
    limits = loaded.cost_limits
    assert (limits.max_hourly_spend_cents, limits.max_daily_spend_cents) == (500, 5000)
    assert loaded.burst_providers("ocr") == []


def test_a_hybrid_file_names_where_each_queue_bursts():
    loaded = config.parse(hybrid())
    assert loaded.burst_providers("ocr") == ["aws"]
    assert loaded.burst_providers("images") == []
    data = hybrid()
    data["queues"]["ocr"]["cloud_provider"] = None  # the cheapest enabled one
    data["cloud_providers"]["google"].update(enabled=True, image="projects/p/global/images/w")
    assert config.parse(data).burst_providers("ocr") == ["aws", "google"]


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for part in parents:
            data = data[part]
        data[last] = value

    return change


def _drop(path: str) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for part in parents:
            data = data[part]
        del data[last]

    return change


@pytest.mark.parametrize(
    ("change", "key", "words"),
    [
        # unknown keys, at every level
        (_set("turbo", True), "turbo", "unknown key"),
        (_set("queues.ocr.priority", 1), "queues.ocr.priority", "unknown key"),
        (_set("scaling_rules.scale_up.burst", 2), "scaling_rules.scale_up.burst", "unknown key"),
        (_set("cloud_providers.azure", {}), "cloud_providers.azure", "unknown key"),
        # wrong types (no coercion: "10" is not 10, 1 is not true)
        (_set("queues.ocr.max_workers", "3"), "queues.ocr.max_workers", "integer"),
        (_set("queues.ocr.cloud_enabled", 1), "queues.ocr.cloud_enabled", "boolean"),
        (_set("evaluation_interval_seconds", 60.5), "evaluation_interval_seconds", "integer"),
        (
            _set("cloud_providers.aws.spot_max_price", 0.05),
            "cloud_providers.aws.spot_max_price",
            "string",
        ),
        (_set("mode", "turbo"), "mode", "vps_only"),
        # JSON as Python reads it has Infinity and NaN: a threshold that never fires
        (
            _set("alerts.worker_cpu.above_percent", float("inf")),
            "alerts.worker_cpu.above_percent",
            "finite number",
        ),
        (
            _set("alerts.failure_rate.above_percent", float("nan")),
            "alerts.failure_rate.above_percent",
            "finite number",
        ),
        (_set("queues", []), "queues", "dictionary"),
        # missing sections
        (_drop("cost_limits"), "cost_limits", "required"),
        (
            _drop("scaling_rules.scale_down.idle_minutes"),
            "scaling_rules.scale_down.idle_minutes",
            "required",
        ),
        # negative or zero where it makes no sense
        (
            _set("queues.media.max_workers", -1),
            "queues.media.max_workers",
            "greater than or equal to 0",
        ),
        (
            _set("cost_limits.max_daily_spend_cents", -5),
            "cost_limits.max_daily_spend_cents",
            "greater",
        ),
        (_set("evaluation_interval_seconds", 0), "evaluation_interval_seconds", "greater"),
        (
            _set("scaling_rules.scale_up.queue_depth_threshold", 0),
            "scaling_rules.scale_up.queue_depth_threshold",
            "greater",
        ),
        (
            _set("scaling_rules.scale_down.drain_timeout_seconds", 0),
            "scaling_rules.scale_down.drain_timeout_seconds",
            "greater",
        ),
        (
            _set("scaling_rules.scale_down.claims_paused_drain_seconds", 0),
            "scaling_rules.scale_down.claims_paused_drain_seconds",
            "greater",
        ),
        (
            _set("alerts.worker_disk_low.for_seconds", -1),
            "alerts.worker_disk_low.for_seconds",
            "greater",
        ),
        (
            _set("alerts.worker_disk_low.for_seconds", "300"),
            "alerts.worker_disk_low.for_seconds",
            "integer",
        ),
        (
            _set("cloud_providers.aws.spot_max_price", "-1"),
            "cloud_providers.aws.spot_max_price",
            "positive",
        ),
        (
            _set("cloud_providers.aws.spot_max_price", "cheap"),
            "cloud_providers.aws.spot_max_price",
            "not a price",
        ),
        # relations between keys
        (
            _set("queues.images.max_workers", 0),
            "queues.images.max_workers",
            "below baseline_workers",
        ),
        (
            _set("cost_limits.alert_threshold_cents", 6000),
            "cost_limits.alert_threshold_cents",
            "above max_daily",
        ),
        (_set("queues.media.cloud_enabled", True), "queues.media.cloud_enabled", "no provider"),
        # an enabled provider must be complete and real
        (_set("cloud_providers.aws.enabled", True), "cloud_providers.aws.ami_id", "placeholder"),
        (
            _set("cloud_providers.google.enabled", True),
            "cloud_providers.google.image",
            "placeholder",
        ),
        # The shipped (the seed's) IONOS server_type, c6i.xlarge, is AWS's: it passed
        # here and `ray up`, and was refused first by the driver, in Ray's monitor.
        (
            _set("cloud_providers.ionos.enabled", True),
            "cloud_providers.ionos.server_type",
            "'c6i.xlarge' is not an IONOS server type: use ENTERPRISE or VCPU",
        ),
    ],
)
def test_bad_input_refuses_to_start_naming_the_key(change, key, words):
    data = copy.deepcopy(SHIPPED)
    change(data)
    with pytest.raises(ConfigError) as caught:
        config.parse(data)
    assert caught.value.key == f"scheduler.json: {key}"
    assert words in str(caught.value)


def _misspell(path: str, typo: str) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for part in parents:
            data = data[part]
        data[typo] = data.pop(last)

    return change


@pytest.mark.parametrize(
    ("change", "key", "known"),
    [
        # Required keys misspelt: they were refused as "<the right key>: Field required".
        (
            _misspell("cost_limits.max_daily_spend_cents", "max_daily_spend_cent"),
            "cost_limits.max_daily_spend_cent",
            "max_daily_spend_cents",
        ),
        (
            _misspell("queues.ocr.max_workers", "max_worker"),
            "queues.ocr.max_worker",
            "max_workers",
        ),
        (_misspell("cost_limits", "cost_limit"), "cost_limit", "cost_limits"),
        (
            _misspell("scaling_rules.scale_up.cooldown_seconds", "cooldown_second"),
            "scaling_rules.scale_up.cooldown_second",
            "cooldown_seconds",
        ),
        # Not required: named as before, now with the key meant.
        (
            _set("alerts.worker_cpu.above_percnt", 80.0),
            "alerts.worker_cpu.above_percnt",
            "above_percent",
        ),
        (_set("mod", "hybrid"), "mod", "mode"),
        (_set("turbo", True), "turbo", ""),  # nothing close: unknown key, no guess
    ],
)
def test_a_misspelt_key_is_named_as_written_with_the_known_one(change, key, known):
    data = copy.deepcopy(SHIPPED)
    change(data)
    with pytest.raises(ConfigError) as caught:
        config.parse(data)
    assert caught.value.key == f"scheduler.json: {key}"
    hint = f" (did you mean {known}?)" if known else ""
    assert str(caught.value) == f"scheduler.json: {key}: unknown key{hint}"


@pytest.mark.parametrize(
    ("change", "key", "words"),
    [
        (_set("queues.ocr.cloud_provider", "google"), "queues.ocr.cloud_provider", "not enabled"),
        (_set("queues.ocr.cloud_provider", "azure"), "queues.ocr.cloud_provider", "'aws'"),
        (_set("cloud_providers.aws.region", ""), "cloud_providers.aws.region", "required"),
        (
            _drop("cloud_providers.aws.instance_type"),
            "cloud_providers.aws.instance_type",
            "required",
        ),
        (
            _set("cloud_providers.aws.max_instances", 0),
            "cloud_providers.aws.max_instances",
            "at least 1",
        ),
        (_set("cloud_providers.ionos.enabled", True), "cloud_providers.ionos", "max_instances"),
    ],
)
def test_bad_cloud_settings_name_the_key(change, key, words):
    data = hybrid()
    change(data)
    if key == "cloud_providers.ionos":  # the shipped IONOS block is complete: break it
        del data["cloud_providers"]["ionos"]["image"]
        key, words = "cloud_providers.ionos.image", "required"
    with pytest.raises(ConfigError) as caught:
        config.parse(data)
    assert caught.value.key == f"scheduler.json: {key}"
    assert words in str(caught.value)


def test_load_precedence(tmp_path, monkeypatch):
    monkeypatch.delenv(config.ENV_VAR, raising=False)
    monkeypatch.setattr(config, "DEFAULT_PATH", tmp_path / "absent.json")
    assert config.load() == config.parse(SHIPPED)  # nothing installed: the shipped defaults

    installed = tmp_path / "etc-scheduler.json"
    installed.write_text(json.dumps(hybrid()))
    monkeypatch.setattr(config, "DEFAULT_PATH", installed)
    assert config.load().mode == "hybrid"

    chosen = tmp_path / "chosen.json"
    data = hybrid()
    data["mode"] = "cloud_first"
    chosen.write_text(json.dumps(data))
    monkeypatch.setenv(config.ENV_VAR, str(chosen))
    assert config.load().mode == "cloud_first"
    assert config.load(installed).mode == "hybrid"  # an explicit path wins


def test_a_named_file_that_is_missing_or_not_json_refuses(tmp_path, monkeypatch):
    monkeypatch.setenv(config.ENV_VAR, str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match="cannot be read"):
        config.load()
    broken = tmp_path / "broken.json"
    broken.write_text('{"mode": "hybrid",')
    with pytest.raises(ConfigError, match="not JSON") as caught:
        config.load(broken)
    assert caught.value.key == str(broken)
    listed = tmp_path / "list.json"
    listed.write_text("[]")
    with pytest.raises(ConfigError, match="expected a JSON object"):
        config.load(Path(listed))


def test_a_key_given_twice_refuses_naming_its_path(tmp_path):
    """JSON keeps the last of two equal keys without a word: a file that says vps_only
    and, further down, cloud_first would burst to the cloud unnoticed."""
    text = json.dumps(hybrid(), indent=1)
    twice = tmp_path / "twice.json"
    twice.write_text(text.replace('"mode": "hybrid",', '"mode": "vps_only", "mode": "hybrid",', 1))
    with pytest.raises(ConfigError, match="given twice") as caught:
        config.load(twice)
    assert caught.value.key == f"{twice}: mode"
    nested = tmp_path / "nested.json"
    nested.write_text(text.replace('"max_workers": ', '"max_workers": 1, "max_workers": ', 1))
    with pytest.raises(ConfigError, match="given twice") as caught:
        config.load(nested)
    assert caught.value.key.startswith(f"{nested}: queues.")
    assert caught.value.key.endswith(".max_workers")


def test_a_queue_the_deployment_lacks_refuses_naming_the_file(tmp_path):
    """A queue of scheduler.json that is not one of the deployment's (HYPERMEDIA_QUEUES)
    would get VPS slots and bursts no pipeline serves: refused where the file is loaded,
    naming the file as given (it said "scheduler.json" whatever the path)."""
    data = hybrid()
    data["queues"]["thumbs"] = {"baseline_workers": 1, "max_workers": 1}
    path = tmp_path / "etc-scheduler.json"
    path.write_text(json.dumps(data))
    assert "thumbs" in config.load(path).queues  # the file alone is well formed
    deployment = ("images", "documents", "ocr", "media", "bulk")
    with pytest.raises(ConfigError) as caught:
        config.load(path, queues=deployment)
    assert caught.value.key == f"{path}: queues.thumbs"
    assert "not a queue of this deployment (images, documents, ocr, media, bulk;" in (
        caught.value.message
    )
    assert config.load(path, queues=(*deployment, "thumbs")).queues["thumbs"].baseline_workers == 1


def test_a_queue_of_the_deployment_the_file_lacks_is_said(tmp_path, caplog):
    """A queue added to the settings and forgotten in scheduler.json gets no worker:
    its operations are refused at submit, and nothing said why at the start."""
    path = tmp_path / "scheduler.json"
    path.write_text(json.dumps(hybrid()))
    named = set(config.load(path).queues)
    with caplog.at_level("WARNING", logger="autoscaler.config"):
        config.load(path, queues=(*sorted(named), "thumbs"))
    (said,) = [r.getMessage() for r in caplog.records if r.name == "autoscaler.config"]
    assert said.startswith(f"{path} has no entry for the queue(s) thumbs: no worker")
    caplog.clear()
    with caplog.at_level("WARNING", logger="autoscaler.config"):
        config.load(path, queues=sorted(named))
    assert [r for r in caplog.records if r.name == "autoscaler.config"] == []


@pytest.mark.parametrize("server_type", ["VCPU", "enterprise", " ENTERPRISE "])
def test_an_ionos_server_type_the_driver_launches_loads(server_type):
    data = copy.deepcopy(SHIPPED)
    data["cloud_providers"]["ionos"].update(enabled=True, server_type=server_type)
    assert config.parse(data).cloud_providers.ionos.enabled


def test_a_cube_ionos_server_is_refused_at_load():
    data = copy.deepcopy(SHIPPED)
    data["cloud_providers"]["ionos"].update(enabled=True, server_type="CUBE")
    with pytest.raises(ConfigError) as caught:
        config.parse(data)
    assert caught.value.key == "scheduler.json: cloud_providers.ionos.server_type"
    assert "CUBE servers are sized by a template" in str(caught.value)
