"""The cluster yaml's ``provider.worker_image``: checked when the provider starts, exported
by a burst node's boot script, and the image docker/host/ray starts Ray in (over the
machine image's /etc/default/hypermedia-worker)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from autoscaler import bootstrap
from autoscaler.provider import parse_settings
from hypermedia.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
HOST_RAY = REPO / "docker" / "host" / "ray"
BASE = {"head_ip": "10.8.0.1", "state_dir": "/var/lib/hypermedia/cluster"}
IMAGE = "123456789012.dkr.ecr.eu-west-3.amazonaws.com/hypermedia-worker:3f2c1ab"


@pytest.mark.parametrize(
    "image",
    [
        IMAGE,
        "hypermedia-worker:ci",
        "localhost:5000/team/hypermedia-worker",
        "registry.example.com/hypermedia-worker:v1@sha256:" + "0" * 64,
    ],
)
def test_a_reference_is_taken_as_written(image):
    assert parse_settings({**BASE, "worker_image": image}).worker_image == image


@pytest.mark.parametrize(
    "image", ["hypermedia worker:1", "x:1; rm -rf /", "$(curl evil)", "Registry/x:1", ""]
)
def test_anything_else_refuses_to_start_naming_the_key(image):
    with pytest.raises(ConfigError) as caught:
        parse_settings({**BASE, "worker_image": image})
    assert "provider.worker_image" in str(caught.value)


def test_unset_by_default_and_then_the_boot_script_leaves_the_machine_image_its_own():
    assert parse_settings(BASE).worker_image is None
    script = bootstrap.user_data(
        node_id="i-1", node_type="burst_ocr", head_address="10.8.0.1:6390", resources={}
    )
    assert "HM_WORKER_IMAGE" not in script


def boot(tmp_path: Path, worker_image: str | None) -> list[list[str]]:
    """The boot script of a node, run with docker/host/ray as its ``ray`` and a stub
    ``docker`` that records what it is asked to run (each call's arguments); the
    machine image's settings name machine/hypermedia-worker:old."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ray").symlink_to(HOST_RAY)
    calls = tmp_path / "docker-calls"
    stub = bin_dir / "docker"
    stub.write_text(f"#!/bin/sh\nprintf '%s\\037' \"$@\" >> {calls}\nprintf '\\036' >> {calls}\n")
    stub.chmod(0o755)
    config = tmp_path / "hypermedia-worker"
    config.write_text("HM_WORKER_IMAGE=machine/hypermedia-worker:old\nHM_SHM_SIZE=1g\n")
    token = tmp_path / "ray-auth-token"
    token.write_text("not-a-real-token\n")
    script = bootstrap.user_data(
        node_id="i-1",
        node_type="burst_ocr",
        head_address="10.8.0.1:6390",
        resources={"queue_ocr": 1},
        token_path=str(token),
        worker_image=worker_image,
    )
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HM_WORKER_CONFIG": str(config),
        "HM_DOCKER": str(stub),
    }
    subprocess.run(["sh", "-c", script], env=env, check=True, timeout=60)
    return [call.split("\x1f")[:-1] for call in calls.read_text().split("\x1e")[:-1]]


def run_call(calls: list[list[str]], image: str) -> tuple[list[str], list[str]]:
    """``docker run``'s options, and the command it runs in ``image``."""
    (call,) = [call for call in calls if call[0] == "run"]
    at = call.index(image)
    return call[:at], call[at + 1 :]


def test_the_node_runs_ray_in_the_image_the_cluster_yaml_names(tmp_path):
    calls = boot(tmp_path, IMAGE)
    options, command = run_call(calls, IMAGE)
    assert command[:2] == ["sh", "-c"]
    assert command[3:5] == ["ray", "start"] and "--address=10.8.0.1:6390" in command
    assert "machine/hypermedia-worker:old" not in options + command
    # The job uid blocks' locks are the host's: no other sandbox takes the same uids.
    lock_dir = "/run/hypermedia-sandbox"
    assert f"type=bind,source={lock_dir},target={lock_dir}" in options


def test_without_one_the_node_runs_the_machine_images_default(tmp_path):
    _options, command = run_call(boot(tmp_path, None), "machine/hypermedia-worker:old")
    assert command[3:5] == ["ray", "start"] and "--address=10.8.0.1:6390" in command


@pytest.mark.parametrize(
    ("module", "ran"),
    [
        (True, "python -m hypermedia.worker.ray_start start"),
        (False, "ray start"),  # an image built before the module: Ray's own
    ],
)
def test_in_the_image_ray_start_is_the_lean_one_where_the_image_has_it(tmp_path, module, ran):
    """The command docker/host/ray runs in the image, there with a ``python`` that has
    hypermedia.worker.ray_start or not (stubs that say what they were asked to run)."""
    _options, command = run_call(boot(tmp_path, IMAGE), IMAGE)
    image_bin = tmp_path / "image-bin"
    image_bin.mkdir()
    (image_bin / "python").write_text(
        f'#!/bin/sh\n[ "$1" = -c ] && exit {0 if module else 1}\necho python "$@"\n'
    )
    (image_bin / "ray").write_text('#!/bin/sh\necho ray "$@"\n')
    for stub in image_bin.iterdir():
        stub.chmod(0o755)
    said = subprocess.run(
        command,
        env={"PATH": f"{image_bin}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert said.startswith(f"{ran} --address=10.8.0.1:6390 "), said
    assert said.rstrip().endswith(" --block"), said
