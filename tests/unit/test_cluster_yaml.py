"""ray_cluster/*.yaml: valid for Ray, and saying what the issue asks of the cluster
(Ray off port 6379, the dashboard on localhost, token auth, metrics exported, no SSH,
nodes that start Ray themselves, one queue per burst node type, the head serving the
baseline queues)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from autoscaler.config import SHIPPED, parse
from autoscaler.provider import (
    HypermediaNodeProvider,
    head_environment,
    head_resources,
    parse_settings,
    queue_of,
)

REPO = Path(__file__).resolve().parents[2]
YAMLS = {
    "cluster.yaml": SHIPPED,  # the VPS: its scheduler.json starts as the shipped one
    "local.yaml": REPO / "ray_cluster" / "scheduler.local.json",
}


def load(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((REPO / "ray_cluster" / name).read_text())
    return loaded


@pytest.mark.parametrize("name", sorted(YAMLS))
def test_ray_accepts_it(name):
    validate_config(prepare_config(copy.deepcopy(load(name))))


@pytest.mark.parametrize("name", sorted(YAMLS))
def test_the_cluster_is_the_one_the_issue_describes(name):
    config = load(name)
    provider = config["provider"]
    assert provider["type"] == "external"
    assert provider["module"] == "autoscaler.provider.HypermediaNodeProvider"
    assert provider["disable_node_updaters"] is True
    settings = parse_settings(provider)
    assert settings.ray_port != 6379
    start = " ".join(config["head_start_ray_commands"])
    # `ray start` through autoscaler.head, which starts it again when Ray gave up waiting
    # for its raylet on a loaded machine.
    assert "python -m autoscaler.head ray-start --head" in start
    assert "--autoscaling-config=~/ray_bootstrap_config.yaml" in start
    assert "--port=$HM_RAY_PORT" in start
    if "--include-dashboard=true" in start:
        assert "--dashboard-host=127.0.0.1" in start
    if name == "cluster.yaml":  # the VPS: the dashboard, metrics where Prometheus expects
        assert "--include-dashboard=true" in start and "--metrics-export-port=8090" in start
        assert "RAY_PROMETHEUS_HOST=http://127.0.0.1:9090" in start
    assert config["worker_start_ray_commands"] == []  # nodes start Ray from user data

    scheduler = parse(json.loads(YAMLS[name].read_text()))
    types = config["available_node_types"]
    head = types.pop(config["head_node_type"])
    # The head's queue_<name> slots are scheduler.json's (head_resources), not the yaml's:
    # with the shipped files, the baseline queues (images, documents).
    assert not [k for k in head["resources"] if k.startswith("queue_")]
    assert head_resources(scheduler, head["resources"]) == {
        "queue_images": 1.0,
        "queue_documents": 1.0,
    }
    for node_type, spec in types.items():
        queue = queue_of(spec["resources"])
        assert node_type == f"burst_{queue}" and queue in scheduler.queues
    enabled_bursts = {q for q, c in scheduler.queues.items() if c.cloud_enabled}
    assert enabled_bursts <= {queue_of(spec["resources"]) for spec in types.values()}


def test_commands_on_the_head_run_with_token_auth_and_their_own_home(tmp_path):
    provider_section = dict(load("local.yaml")["provider"])
    provider_section.update(
        state_dir=str(tmp_path / "state"), scheduler_config=str(YAMLS["local.yaml"])
    )
    provider = HypermediaNodeProvider(provider_section, "hm-unit")
    env = head_environment(provider)
    assert env["RAY_AUTH_MODE"] == "token"
    token = Path(env["RAY_AUTH_TOKEN_PATH"])
    assert token.exists() and token.stat().st_mode & 0o077 == 0
    assert env["HOME"] == str(tmp_path / "state" / "home")
    assert env["PYTHONSAFEPATH"] == "1"  # Ray's monitor script dir holds an autoscaler.py
    assert env["HM_RAY_ADDRESS"] == f"127.0.0.10:{provider.settings.ray_port}"
    assert "--port=" not in env["HM_HEAD_PORTS"]


@pytest.mark.parametrize(
    ("mode", "media_baseline", "slots"),
    [
        # hybrid: the whole baseline on the VPS, media's too
        ("hybrid", 2, {"queue_images": 1.0, "queue_documents": 1.0, "queue_media": 2.0}),
        # cloud_first: one of cloud-enabled media's two on the VPS; images and documents,
        # not cloud-enabled, keep theirs
        ("cloud_first", 2, {"queue_images": 1.0, "queue_documents": 1.0, "queue_media": 1.0}),
        ("cloud_first", 0, {"queue_images": 1.0, "queue_documents": 1.0}),
    ],
)
def test_the_head_starts_ray_with_a_slot_per_vps_actor(tmp_path, mode, media_baseline, slots):
    """What the head's `ray start` runs with (RAY_OVERRIDE_RESOURCES, which Ray's
    updater fills from the head node type): the VPS's pools of scheduler.json's mode,
    the node type's other resources kept and its queue_<name> replaced."""
    from autoscaler.provider import LocalCommandRunner

    scheduler = json.loads(YAMLS["local.yaml"].read_text())
    scheduler["mode"] = mode
    scheduler["queues"]["media"].update(baseline_workers=media_baseline, max_workers=2)
    path = tmp_path / "scheduler.json"
    path.write_text(json.dumps(scheduler))
    section = dict(load("local.yaml")["provider"])
    section.update(state_dir=str(tmp_path / "state"), scheduler_config=str(path))
    runner = LocalCommandRunner(HypermediaNodeProvider(section, "hm-unit"), "test")
    out = runner.run(
        'echo "$RAY_OVERRIDE_RESOURCES"',
        with_output=True,
        silent=True,
        environment_variables={"RAY_OVERRIDE_RESOURCES": {"queue_media": 5, "disk": 1}},
    )
    assert json.loads(out) == {"disk": 1.0, **slots}
    out = runner.run('echo "$RAY_OVERRIDE_RESOURCES"', with_output=True, silent=True)
    assert json.loads(out) == slots


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"ray_port": 6379}, "provider.ray_port"),
        ({"ray_port": "6390"}, "provider.ray_port"),
        ({"state_dir": None}, "provider.state_dir"),
        ({"headip": "10.8.0.1"}, "provider.headip"),
        ({"scheduler_stale_seconds": 10}, "provider.scheduler_stale_seconds"),
        ({"drain_timeout_seconds": 60}, "provider.drain_timeout_seconds"),
        # A provider name scheduler.json does not have: named as given (it was
        # "provider.drivers.azure.[key]", pydantic's mark for a mapping's key).
        ({"drivers": {"azure": {"type": "aws"}}}, "provider.drivers.azure"),
        ({"drivers": {"aws": {"kind": "aws"}}}, "provider.drivers.aws.type"),
    ],
)
def test_a_bad_provider_section_is_refused_naming_the_key(change, key):
    from hypermedia.errors import ConfigError

    section = {k: v for k, v in load("cluster.yaml")["provider"].items() if k not in change}
    section.update({k: v for k, v in change.items() if v is not None})
    with pytest.raises(ConfigError) as info:
        parse_settings(section)
    assert info.value.key == key


@pytest.mark.parametrize(
    ("rename", "drop", "key", "known"),
    [
        # Required keys misspelt: they were refused as "provider.head_ip: Field required",
        # a key the operator believes they wrote.
        ({"head_ip": "headip"}, (), "provider.headip", "head_ip"),
        ({"state_dir": "state_directory"}, (), "provider.state_directory", "state_dir"),
        # Another error beside it (a required key truly missing) does not hide it.
        ({"head_ip": "head_pi"}, ("state_dir",), "provider.head_pi", "head_ip"),
        # Not required: named as before, now with the key meant.
        ({"ray_port": "rayport"}, (), "provider.rayport", "ray_port"),
        (
            {"node_token_path": "node_token_file"},
            (),
            "provider.node_token_file",
            "node_token_path",
        ),
    ],
)
def test_a_misspelt_provider_key_is_named_as_written_with_the_known_one(rename, drop, key, known):
    from hypermedia.errors import ConfigError

    section = dict(load("cluster.yaml")["provider"])
    for right, typo in rename.items():
        section[typo] = section.pop(right)
    for name in drop:
        del section[name]
    with pytest.raises(ConfigError) as info:
        parse_settings(section)
    assert info.value.key == key
    assert str(info.value) == f"{key}: unknown key (did you mean {known}?)"


@pytest.mark.parametrize("typo", ["tpye", "typ", "Type"])
def test_a_misspelt_driver_type_is_named_as_written_with_the_known_one(typo):
    """A driver's ``type`` misspelt (``tpye: aws``) was refused as
    "provider.drivers.aws.type: Field required": a driver's options are its own (extra
    keys allowed here, checked by the driver), so the misspelling was no unknown key."""
    from hypermedia.errors import ConfigError

    section = dict(load("cluster.yaml")["provider"])
    drivers = {name: dict(options) for name, options in section["drivers"].items()}
    drivers["aws"][typo] = drivers["aws"].pop("type")
    section["drivers"] = drivers
    with pytest.raises(ConfigError) as info:
        parse_settings(section)
    key = f"provider.drivers.aws.{typo}"
    assert info.value.key == key
    assert str(info.value) == f"{key}: unknown key (did you mean type?)"


def test_a_misspelt_driver_option_is_named_with_the_known_one(tmp_path):
    """The drivers' options (provider.drivers.<name>) name the option meant too."""
    from autoscaler.config import GoogleConfig
    from autoscaler.drivers.aws import _parse_options
    from autoscaler.drivers.gcp import GcpDriver
    from autoscaler.drivers.ionos import IonosOptions
    from autoscaler.drivers.local import LocalDriver
    from hypermedia.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^provider\.drivers\.aws\.subnet: unknown key \("):
        _parse_options({"subnet": "subnet-1", "on_demand_cents_per_hour": 5})
    with pytest.raises(ConfigError, match=r"did you mean subnet_id\? expected one of "):
        _parse_options({"subnet": "subnet-1", "on_demand_cents_per_hour": 5})
    google = GoogleConfig(max_instances=1, zone="z", machine_type="m", image="i")
    with pytest.raises(ConfigError) as info:
        GcpDriver(google, {"projekt": "p", "on_demand_cents_per_hour": 5})
    assert str(info.value) == (
        "provider.drivers.google.projekt: unknown key (did you mean project?)"
    )
    with pytest.raises(ConfigError, match=r"did you mean ram_mb\? known: "):
        IonosOptions.parse({"ram": 1024, "on_demand_cents_per_hour": 5})
    with pytest.raises(ConfigError) as info:
        LocalDriver({"state_directory": str(tmp_path)})
    assert str(info.value) == (
        "provider.drivers.local.state_directory: unknown option (did you mean state_dir?)"
    )


def test_a_scheduler_json_the_cluster_yaml_names_must_be_there(tmp_path):
    """cluster.yaml names /etc/hypermedia/scheduler.json: with that file missing `ray up`
    is refused naming it, as the README says (the shipped defaults apply only where
    nothing names a file), and passes once it is installed."""
    import shutil

    from hypermedia.errors import ConfigError

    cluster = load("cluster.yaml")
    named = cluster["provider"]["scheduler_config"]
    assert named == "/etc/hypermedia/scheduler.json"
    missing = tmp_path / "etc" / "scheduler.json"
    cluster["provider"]["scheduler_config"] = str(missing)
    with pytest.raises(ConfigError) as info:
        HypermediaNodeProvider.bootstrap_config(copy.deepcopy(cluster))
    assert info.value.key == str(missing)
    said = str(info.value).replace(str(missing), named)
    readme = " ".join((REPO / "README.md").read_text().split())
    assert f"`{said}`" in readme
    missing.parent.mkdir()
    shutil.copy(SHIPPED, missing)
    HypermediaNodeProvider.bootstrap_config(copy.deepcopy(cluster))
