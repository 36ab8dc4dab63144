"""The GCP driver: the real google-cloud-compute SDK over real HTTP against the local
Compute Engine of :mod:`tests.clouds.gcp_server` (no mock of the SDK or of our code).

The shared contract runs for standard and spot instances on a server that is
eventually consistent (new instances missing from lists, PROVISIONING before
RUNNING, operations RUNNING before DONE); the rest checks what went over the wire,
the error translation, and the options.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from autoscaler.config import GoogleConfig
from autoscaler.drivers.base import TAG_KEYS, DriverError, Instance
from autoscaler.drivers.gcp import GcpDriver
from hypermedia.errors import ConfigError
from tests.clouds.gcp_server import GcpServer, gcp_server
from tests.driver_contract import check_contract, listed, request

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "hm-test"
ZONE = "europe-west4-a"
BASE = f"/compute/v1/projects/{PROJECT}/zones/{ZONE}"
USER_DATA = "#!/bin/sh\n# the node reads its Ray token from /etc/hypermedia/ray_token\nexec true\n"
# A 64-hex run is what a Ray token (secrets.token_hex(32)) looks like.
SECRET_LOOKS = re.compile(r"[0-9a-f]{64}|PRIVATE KEY|private_key|client_secret|BEGIN ")

KEY = "provider.drivers.google"  # where these options live in the cluster yaml


def config(*, preemptible: bool = False) -> GoogleConfig:
    return GoogleConfig(
        enabled=True,
        max_instances=5,
        zone=ZONE,
        machine_type="e2-standard-4",
        image="projects/debian-cloud/global/images/family/debian-12",
        preemptible=preemptible,
    )


def options(server_url: str, **overrides: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "project": PROJECT,
        "api_endpoint": server_url,
        "anonymous_credentials": True,
        "on_demand_cents_per_hour": 13.4,
        "spot_cents_per_hour": 4.1,
    }
    values.update(overrides)
    return {key: value for key, value in values.items() if value is not None}


def make_driver(
    server_url: str,
    *,
    preemptible: bool = True,
    operation_timeout: float = 10.0,
    **overrides: Any,
) -> GcpDriver:
    if not preemptible:
        overrides.setdefault("spot_cents_per_hour", None)
    return GcpDriver(
        config(preemptible=preemptible),
        options(server_url, **overrides),
        request_timeout=5.0,
        operation_timeout=operation_timeout,
    )


@pytest.fixture
def server() -> Iterator[GcpServer]:
    with gcp_server() as running:
        yield running


@pytest.fixture
def lagging_server() -> Iterator[GcpServer]:
    """Eventually consistent: lists lag, PROVISIONING first, operations RUNNING first."""
    with gcp_server(provisioning_reads=3, list_lag=2, deleting_reads=2, operation_polls=2) as s:
        yield s


def inserted(server: GcpServer) -> list[dict[str, Any]]:
    return [r.body for r in server.requests("POST", "/instances")]


# -- the contract -----------------------------------------------------------------------


@pytest.mark.parametrize("spot", [False, True], ids=["standard", "spot"])
def test_contract(lagging_server: GcpServer, spot: bool) -> None:
    driver = make_driver(lagging_server.url, preemptible=spot)
    launched = check_contract(driver, spot=spot, timeout=15.0)

    assert launched.instance_id == "hm-contract-0001"
    assert launched.extra["zone"] == ZONE
    # Two launches, one instance: the second insert was refused (409) and answered.
    assert len(inserted(lagging_server)) == 2
    assert lagging_server.requests("POST", "/wait"), "the operations were not waited on"
    assert lagging_server.requests("DELETE", "/instances/hm-contract-0001")


def test_launch_answers_pending_then_lists_running(lagging_server: GcpServer) -> None:
    driver = make_driver(lagging_server.url)
    launched = driver.launch(request("eventual-0001", cluster="ev"))
    assert isinstance(launched, Instance), launched
    assert launched.state == "pending"
    assert launched.extra["status"] == "PROVISIONING"
    assert launched.private_ip == "10.128.0.10"

    states = [[i.state for i in listed(driver, "ev")] for _ in range(5)]
    assert states[0] == [], "a new instance is missing from the first lists"
    assert ["running"] in states
    assert states[-1] == ["running"]


# -- what went over the wire ------------------------------------------------------------


@pytest.mark.parametrize("spot", [False, True], ids=["standard", "spot"])
def test_insert_body(server: GcpServer, spot: bool) -> None:
    driver = make_driver(server.url, preemptible=True)
    launch = request("wire-0001", cluster="wire", spot=spot, price=7.25, user_data=USER_DATA)
    launched = driver.launch(launch)
    assert isinstance(launched, Instance), launched

    [body] = inserted(server)
    assert body["name"] == "hm-wire-0001"
    assert body["machineType"] == f"zones/{ZONE}/machineTypes/e2-standard-4"
    [disk] = body["disks"]
    assert disk["boot"] is True and disk["autoDelete"] is True
    assert disk["initializeParams"]["sourceImage"] == config().image
    assert int(disk["initializeParams"]["diskSizeGb"]) == 20
    # The boot disk is labelled like the instance: its cost in the billing export is
    # the cluster's and the request's.
    assert disk["initializeParams"]["labels"] == launch.tags()

    labels = body["labels"]
    assert set(TAG_KEYS) <= set(labels)
    assert labels == launch.tags()
    assert labels["hypermedia-price-microusd"] == "72500"
    assert labels["hypermedia-spot"] == ("true" if spot else "false")

    scheduling = body["scheduling"]
    if spot:
        assert scheduling["provisioningModel"] == "SPOT"
        assert scheduling["instanceTerminationAction"] == "DELETE"
        assert scheduling["automaticRestart"] is False
        assert scheduling["onHostMaintenance"] == "TERMINATE"
    else:
        assert scheduling.get("provisioningModel") == "STANDARD"
        assert "instanceTerminationAction" not in scheduling

    [item] = body["metadata"]["items"]
    assert item == {"key": "startup-script", "value": USER_DATA}
    [interface] = body["networkInterfaces"]
    assert interface["network"] == "global/networks/default"
    assert interface["accessConfigs"][0]["type"] == "ONE_TO_ONE_NAT"
    assert "serviceAccounts" not in body


def test_nothing_secret_goes_over_the_wire(server: GcpServer) -> None:
    driver = make_driver(server.url)
    assert isinstance(driver.launch(request("secret-0001", user_data=USER_DATA)), Instance)
    assert isinstance(driver.instances("contract"), list)
    assert driver.terminate("hm-secret-0001") is None

    assert server.records
    for record in server.records:
        assert not record.authorized, "anonymous credentials sent an Authorization header"
        text = json.dumps(record.body) + json.dumps(record.query)
        assert not SECRET_LOOKS.search(text), (record.path, text)
    [body] = inserted(server)
    assert body["metadata"]["items"][0]["value"] == USER_DATA


def test_network_and_service_account_options(server: GcpServer) -> None:
    driver = make_driver(
        server.url,
        network="projects/hm-test/global/networks/burst",
        subnetwork="regions/europe-west4/subnetworks/burst-a",
        external_ip=False,
        service_account_email="burst@hm-test.iam.gserviceaccount.com",
        disk_size_gb=50,
    )
    assert isinstance(driver.launch(request("options-0001")), Instance)
    [body] = inserted(server)
    [interface] = body["networkInterfaces"]
    assert interface["network"] == "projects/hm-test/global/networks/burst"
    assert interface["subnetwork"] == "regions/europe-west4/subnetworks/burst-a"
    assert "accessConfigs" not in interface
    assert body["serviceAccounts"] == [
        {
            "email": "burst@hm-test.iam.gserviceaccount.com",
            "scopes": ["https://www.googleapis.com/auth/cloud-platform"],
        }
    ]
    assert int(body["disks"][0]["initializeParams"]["diskSizeGb"]) == 50


def test_list_by_cluster_label(server: GcpServer) -> None:
    driver = make_driver(server.url)
    assert isinstance(driver.launch(request("blue-000001", cluster="blue")), Instance)
    assert isinstance(driver.launch(request("green-00001", cluster="green")), Instance)

    [blue] = listed(driver, "blue")
    assert (blue.instance_id, blue.cluster, blue.provider) == ("hm-blue-000001", "blue", "google")
    assert blue.state == "running"
    [lister] = server.requests("GET", "/instances")
    assert lister.path == f"{BASE}/instances"
    assert lister.query["filter"] == ['labels.hypermedia-cluster = "blue"']
    assert listed(driver, "nobody") == []

    refused = driver.instances('blue" OR labels.x = "y')
    assert isinstance(refused, DriverError) and refused.code == "invalid"


def test_terminate_deletes_and_gone_is_success(server: GcpServer) -> None:
    driver = make_driver(server.url)
    assert isinstance(driver.launch(request("delete-0001")), Instance)
    assert driver.terminate("hm-delete-0001") is None
    [deleted] = server.requests("DELETE")
    assert deleted.path == f"{BASE}/instances/hm-delete-0001"
    assert [i.state for i in listed(driver, "contract")] == ["terminating"]
    assert listed(driver, "contract") == []
    assert driver.terminate("hm-delete-0001") is None
    assert driver.terminate("hm-never-launched") is None


def test_launch_after_a_lost_answer_finds_the_instance(server: GcpServer) -> None:
    """Another process (or a retry after a timeout) launches the same request."""
    first = make_driver(server.url).launch(request("twice-00001"))
    again = make_driver(server.url).launch(request("twice-00001"))
    assert isinstance(first, Instance) and isinstance(again, Instance), (first, again)
    assert again.instance_id == first.instance_id
    assert len(listed(make_driver(server.url), "contract")) == 1


# -- errors as values -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "reason", "in_operation", "code", "retryable"),
    [
        (403, "quotaExceeded", False, "quota", False),
        (403, "QUOTA_EXCEEDED", True, "quota", False),
        (429, "rateLimitExceeded", False, "quota", True),
        (503, "ZONE_RESOURCE_POOL_EXHAUSTED", True, "capacity", True),
        (503, "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", True, "capacity", True),
        (403, "forbidden", False, "auth", False),
        (401, "authError", False, "auth", False),
        (400, "invalid", False, "invalid", False),
        (503, "backendError", False, "unavailable", True),
        (500, "internalError", True, "unavailable", True),
        (400, "resourceNotReady", False, "unavailable", True),
    ],
)
def test_launch_errors_are_values(
    server: GcpServer, status: int, reason: str, in_operation: bool, code: str, retryable: bool
) -> None:
    driver = make_driver(server.url)
    server.fail_next("insert", status, reason, "refused here", in_operation=in_operation)
    failed = driver.launch(request("failing-0001"))
    assert isinstance(failed, DriverError), failed
    assert (failed.code, failed.retryable) == (code, retryable), failed
    if status != 401:  # on a 401 the SDK refreshes the credentials: anonymous ones can't
        assert "refused here" in failed.message
    assert server.instance("hm-failing-0001") is None

    retried = driver.launch(request("failing-0001"))
    assert isinstance(retried, Instance), retried


def test_list_and_delete_errors_are_values(server: GcpServer) -> None:
    driver = make_driver(server.url)
    server.fail_next("list", 403, "forbidden")
    failed = driver.instances("contract")
    assert isinstance(failed, DriverError) and failed.code == "auth", failed

    assert isinstance(driver.launch(request("delete-0002")), Instance)
    server.fail_next("delete", 403, "forbidden")
    refused = driver.terminate("hm-delete-0002")
    assert isinstance(refused, DriverError) and refused.code == "auth", refused
    server.fail_next("delete", 503, "backendError", in_operation=True)
    flaky = driver.terminate("hm-delete-0002")
    assert isinstance(flaky, DriverError), flaky
    assert (flaky.code, flaky.retryable) == ("unavailable", True)
    assert driver.terminate("hm-delete-0002") is None


def test_operations_that_never_finish() -> None:
    """A launch still running at the deadline is retryable (the name keeps a retry
    from starting a second instance); a deletion still running is a success."""
    with gcp_server(operation_polls=1_000_000) as slow:
        driver = make_driver(slow.url, operation_timeout=1.0)
        pending = driver.launch(request("slowly-00001"))
        assert isinstance(pending, DriverError), pending
        assert (pending.code, pending.retryable) == ("unavailable", True), pending
        assert pending.maybe_launched  # the provider keeps its spend counted meanwhile
        assert len(slow.requests("POST", "/wait")) > 1

        again = driver.launch(request("slowly-00001"))
        assert isinstance(again, Instance) and again.instance_id == "hm-slowly-00001", again
        assert driver.terminate("hm-slowly-00001") is None
        assert slow.requests("DELETE", "/instances/hm-slowly-00001")


def test_unreachable_endpoint_is_unavailable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    driver = make_driver(f"http://127.0.0.1:{port}")  # nothing listens there any more
    for answer in (
        driver.launch(request("nowhere-0001")),
        driver.instances("contract"),
        driver.terminate("hm-nowhere-0001"),
    ):
        assert isinstance(answer, DriverError), answer
        assert (answer.code, answer.retryable) == ("unavailable", True), answer


def test_spot_needs_preemptible(server: GcpServer) -> None:
    driver = make_driver(server.url, preemptible=False)
    refused = driver.launch(request("spotless-001", spot=True))
    assert isinstance(refused, DriverError) and refused.code == "invalid", refused
    price = driver.price(True)
    assert isinstance(price, DriverError) and price.code == "invalid", price
    assert driver.price(False) == 13.4
    assert server.records == []
    assert make_driver(server.url).price(True) == 4.1


# -- options ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "preemptible", "key"),
    [
        ({"zone_hint": "x"}, True, f"{KEY}.zone_hint"),
        ({"project": None}, True, f"{KEY}.project"),
        ({"project": ""}, True, f"{KEY}.project"),
        ({"disk_size_gb": "20"}, True, f"{KEY}.disk_size_gb"),
        ({"disk_size_gb": 5}, True, f"{KEY}.disk_size_gb"),
        (
            {"on_demand_cents_per_hour": None},
            True,
            f"{KEY}.on_demand_cents_per_hour",
        ),
        ({"on_demand_cents_per_hour": 0}, True, f"{KEY}.on_demand_cents_per_hour"),
        (
            {"on_demand_cents_per_hour": True},
            True,
            f"{KEY}.on_demand_cents_per_hour",
        ),
        ({"spot_cents_per_hour": None}, True, f"{KEY}.spot_cents_per_hour"),
        ({"spot_cents_per_hour": 3.0}, False, f"{KEY}.spot_cents_per_hour"),
        ({"anonymous_credentials": "yes"}, True, f"{KEY}.anonymous_credentials"),
        ({"api_endpoint": "127.0.0.1:80"}, True, f"{KEY}.api_endpoint"),
        (
            {"service_account_email": "nobody"},
            True,
            f"{KEY}.service_account_email",
        ),
        ({"external_ip": 1}, True, f"{KEY}.external_ip"),
    ],
)
def test_bad_option_names_its_key(overrides: dict[str, Any], preemptible: bool, key: str) -> None:
    values = options("http://127.0.0.1:9", **overrides)
    with pytest.raises(ConfigError) as raised:
        GcpDriver(config(preemptible=preemptible), values)
    assert raised.value.details["key"] == key
    assert str(raised.value).startswith(key + ":")


def test_missing_config_field_names_it() -> None:
    incomplete = GoogleConfig(max_instances=0, zone=ZONE, image="debian-12")
    with pytest.raises(ConfigError, match=r"cloud_providers\.google\.machine_type"):
        GcpDriver(incomplete, options("http://127.0.0.1:9"))


def test_sdk_loads_lazily_with_an_install_hint() -> None:
    """In a fresh interpreter: importing the module loads no SDK, and building a
    driver without the SDK says what to install."""
    probe = f"""
import sys
from autoscaler.drivers.gcp import GcpDriver
from autoscaler.config import GoogleConfig
from hypermedia.errors import ConfigError

loaded = [m for m in sys.modules if m.startswith(("google.cloud", "google.api_core"))]
assert not loaded, loaded
sys.modules["google.cloud.compute_v1"] = None  # as if not installed
try:
    GcpDriver(GoogleConfig.model_validate({config(preemptible=True).model_dump()!r}),
              {options("http://127.0.0.1:9")!r})
except ConfigError as exc:
    print(exc)
"""
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'hypermedia[gcp]'" in done.stdout, done.stdout
