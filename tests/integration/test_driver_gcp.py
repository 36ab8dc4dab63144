"""The GCP driver: the real google-cloud-compute and google-cloud-bigquery SDKs over
real HTTP against the local Compute Engine and BigQuery of :mod:`tests.clouds.gcp_server`
(no mock of the SDKs or of our code).

The shared contract runs for standard and spot instances on a server that is
eventually consistent (new instances missing from lists, PROVISIONING before
RUNNING, operations RUNNING before DONE); the rest checks what went over the wire,
the error translation, and the options. The billing tests check the query the driver
sends to BigQuery and what it makes of BigQuery's answers; the SQL itself is checked
against BigQuery's documented billing export schema only, not run by a real BigQuery.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from autoscaler.config import GoogleConfig
from autoscaler.drivers.base import (
    TAG_KEYS,
    TAG_LAUNCHED,
    BillingReader,
    Charge,
    DriverError,
    Instance,
)
from autoscaler.drivers.gcp import GcpDriver, billing_sql
from hypermedia.errors import ConfigError
from tests.clouds.gcp_server import Action, GcpServer, gcp_server
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


def test_an_instance_without_a_launch_time_label_is_launched_at_its_creation(
    server: GcpServer,
) -> None:
    """Created by hand with the cluster's label, or its launch time label removed: it
    was listed as launched at 0, so the provider counted its spend from when it first
    saw it and the hours it had billed before were missing from the daily cap. It is
    listed as launched at its creationTimestamp now; a launch time label stays what
    counts, and a creation time ahead of our clock counts as now."""
    driver = make_driver(server.url)
    tagged = request("tagged-0001")
    for wanted in (request("old-000001"), request("fresh-00001"), request("ahead-00001"), tagged):
        assert isinstance(driver.launch(wanted), Instance)
    for name in ("old-000001", "fresh-00001", "ahead-00001"):
        server.remove_label(f"hm-{name}", TAG_LAUNCHED)
    three_hours_ago = float(int(time.time()) - 3 * 3600)
    server.set_created("hm-old-000001", three_hours_ago)
    server.set_created("hm-tagged-0001", three_hours_ago)
    server.set_created("hm-ahead-00001", time.time() + 3600)

    before = time.time()
    found = {i.instance_id: i for i in listed(driver, "contract")}
    assert found["hm-old-000001"].launched_at == three_hours_ago
    fresh = server.instance("hm-fresh-00001")
    assert fresh is not None
    created = datetime.fromisoformat(fresh["creationTimestamp"]).timestamp()
    assert found["hm-fresh-00001"].launched_at == created < before
    assert before <= found["hm-ahead-00001"].launched_at <= time.time()
    assert found["hm-tagged-0001"].launched_at == tagged.launched_at > three_hours_ago


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


# -- billing: the detailed billing export, read with the real BigQuery SDK ---------------
#
# The local server speaks BigQuery's REST API (jobs.query, jobs.get, getQueryResults,
# jobs.cancel) and answers the rows a test sets: what is checked is what the driver sends
# (the SQL text, its parameters) and what it makes of BigQuery's answers. The SQL itself
# is checked against BigQuery's documented export schema only, never run here.

EXPORT = "billing-admin.billing_export.gcp_billing_export_resource_v1_01A2B3_C4D5E6_F7G8H9"


def billing_driver(server_url: str, **overrides: Any) -> GcpDriver:
    overrides.setdefault("billing_export_table", EXPORT)
    return make_driver(server_url, operation_timeout=5.0, **overrides)


def charged(driver: GcpDriver, cluster: str, first: str, last: str) -> list[Charge]:
    found = driver.charges(cluster, first, last)
    assert not isinstance(found, DriverError), found
    return found


def parameters(body: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """The named query parameters of a jobs.query body: name -> (type, value)."""
    return {
        p["name"]: (p["parameterType"]["type"], p["parameterValue"]["value"])
        for p in body["queryParameters"]
    }


def test_the_driver_is_a_billing_reader(server: GcpServer) -> None:
    reader: BillingReader = billing_driver(server.url)  # mypy checks the protocol
    assert reader.billing_settle_seconds == 48 * 3600
    assert reader.billing_interval_seconds == 3600


def test_charges_from_the_export_rows(server: GcpServer) -> None:
    server.set_billing_rows(
        [
            # An instance's day: its name and its request label (cost + credits, dollars).
            {
                "usage_day": "2024-05-01",
                "request_id": "blue-000001",
                "resource_name": "hm-blue-000001",
                "currency": "USD",
                "amount": 1.2345,
            },
            # A day whose credits outweigh the cost.
            {
                "usage_day": "2024-05-02",
                "request_id": "blue-000001",
                "resource_name": "hm-blue-000001",
                "currency": "USD",
                "amount": -0.015,
            },
            # The cluster's label and nothing else: a charge of no instance.
            {"usage_day": "2024-05-02", "currency": "USD", "amount": 0.25},
            # The request label without a resource name.
            {
                "usage_day": "2024-05-03",
                "request_id": "blue-000002",
                "currency": "USD",
                "amount": 2,
            },
        ]
    )
    found = charged(billing_driver(server.url), "blue", "2024-05-01", "2024-05-03")

    assert [(c.day, c.request_id, c.instance_id) for c in found] == [
        ("2024-05-01", "blue-000001", "hm-blue-000001"),
        ("2024-05-02", "blue-000001", "hm-blue-000001"),
        ("2024-05-02", "", ""),
        ("2024-05-03", "blue-000002", ""),
    ]
    assert [c.cents for c in found] == pytest.approx([123.45, -1.5, 25.0, 200.0])
    assert all(type(c) is Charge for c in found)


def test_one_parameterized_query_over_the_wire(server: GcpServer) -> None:
    """One jobs.query in the driver's project: the cluster, the label keys, the days and
    the partition bounds are query parameters, not text; the table is back-quoted."""
    server.set_billing_rows([])
    assert charged(billing_driver(server.url), "blue", "2024-05-01", "2024-05-03") == []

    [request] = server.requests("POST", "/queries")
    assert request.path == f"/bigquery/v2/projects/{PROJECT}/queries"
    assert not request.authorized, "anonymous credentials sent an Authorization header"
    body = request.body
    assert body["useLegacySql"] is False
    assert body["parameterMode"] == "NAMED"
    assert parameters(body) == {
        "cluster_key": ("STRING", "hypermedia-cluster"),
        "cluster": ("STRING", "blue"),
        "request_key": ("STRING", "hypermedia-request"),
        "project": ("STRING", PROJECT),
        "usage_start": ("TIMESTAMP", "2024-05-01 00:00:00+00:00"),
        "usage_end": ("TIMESTAMP", "2024-05-04 00:00:00+00:00"),
        # The days' partitions, a day's margin on each side.
        "partition_start": ("TIMESTAMP", "2024-04-30 00:00:00+00:00"),
        "partition_end": ("TIMESTAMP", "2024-05-05 00:00:00+00:00"),
    }
    sql = " ".join(body["query"].split())
    assert f"FROM `{EXPORT}`" in sql
    assert "_PARTITIONTIME >= @partition_start AND _PARTITIONTIME < @partition_end" in sql
    assert "usage_start_time >= @usage_start AND usage_start_time < @usage_end" in sql
    assert "kv.key = @cluster_key AND kv.value = @cluster" in sql
    assert "project.id = @project" in sql
    assert 'DATE(usage_start_time, "UTC") AS usage_day' in sql
    assert "SUM(credit.amount) FROM UNNEST(credits)" in sql
    assert "resource.name AS resource_name" in sql
    for value in ("blue", "2024-05", "hypermedia-"):
        assert value not in sql, f"{value!r} is formatted into the SQL"


def test_a_running_query_and_pages(server: GcpServer) -> None:
    """A query still running when jobs.query answers, and its rows over three pages."""
    rows = [
        {"usage_day": f"2024-05-0{d}", "request_id": "pages-00001", "currency": "USD", "amount": d}
        for d in (1, 2, 3, 4, 5)
    ]
    with gcp_server(query_polls=2, page_rows=2) as slow:
        slow.set_billing_rows(rows)
        found = charged(billing_driver(slow.url), "pages", "2024-05-01", "2024-05-05")
        assert [c.day for c in found] == [f"2024-05-0{d}" for d in (1, 2, 3, 4, 5)]
        assert [c.cents for c in found] == [100.0, 200.0, 300.0, 400.0, 500.0]
        [job_path] = {r.path for r in slow.requests("GET", "") if "/queries/" in r.path}
        tokens = [r.query.get("pageToken") for r in slow.requests("GET", job_path)]
        assert ["rows-2"] in tokens and ["rows-4"] in tokens, tokens


def test_a_query_that_never_finishes_is_unavailable() -> None:
    with gcp_server(query_polls=1_000_000) as slow:
        slow.set_billing_rows([])
        driver = make_driver(slow.url, operation_timeout=1.0, billing_export_table=EXPORT)
        started = time.monotonic()
        failed = driver.charges("blue", "2024-05-01", "2024-05-01")
        assert isinstance(failed, DriverError), failed
        assert (failed.code, failed.retryable) == ("unavailable", True), failed
        assert time.monotonic() - started < 30
        [cancel] = slow.requests("POST", "/cancel")  # the SDK gives the job up
        assert slow.job(cancel.path.split("/")[-2]) == {"cancelled": True}


def test_a_currency_other_than_usd_is_invalid(server: GcpServer) -> None:
    server.set_billing_rows(
        [{"usage_day": "2024-05-01", "currency": "EUR", "amount": 1.0, "request_id": "x"}]
    )
    failed = billing_driver(server.url).charges("blue", "2024-05-01", "2024-05-01")
    assert isinstance(failed, DriverError), failed
    assert failed.code == "invalid" and "'EUR'" in failed.message, failed


@pytest.mark.parametrize(
    ("action", "status", "reason", "code", "retryable", "says"),
    [
        ("query", 403, "accessDenied", "auth", False, "roles/bigquery.jobUser"),
        ("query", 404, "notFound", "invalid", False, EXPORT),
        ("query", 400, "invalidQuery", "invalid", False, "refused here"),
        ("query", 403, "rateLimitExceeded", "quota", True, "refused here"),
        ("query", 503, "backendError", "unavailable", True, "refused here"),
        ("query", 500, "internalError", "unavailable", True, "refused here"),
        ("results", 503, "backendError", "unavailable", True, "refused here"),
    ],
)
def test_billing_errors_are_values(
    action: Action, status: int, reason: str, code: str, retryable: bool, says: str
) -> None:
    with gcp_server(page_rows=1) as server:  # two pages: a getQueryResults call to fail
        server.set_billing_rows([{"usage_day": "2024-05-01", "currency": "USD", "amount": 1.0}] * 2)
        driver = billing_driver(server.url)
        server.fail_next(action, status, reason, "refused here")
        failed = driver.charges("blue", "2024-05-01", "2024-05-01")
        assert isinstance(failed, DriverError), failed
        assert (failed.code, failed.retryable) == (code, retryable), failed
        assert says in failed.message, failed.message
        if code == "auth":
            assert "roles/bigquery.dataViewer on the dataset billing-admin.billing_export" in (
                failed.message
            )
        assert len(charged(driver, "blue", "2024-05-01", "2024-05-01")) == 2  # and again


def test_billing_on_an_unreachable_endpoint_is_unavailable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    driver = billing_driver(f"http://127.0.0.1:{port}")  # nothing listens there any more
    started = time.monotonic()
    failed = driver.charges("blue", "2024-05-01", "2024-05-01")
    assert isinstance(failed, DriverError), failed
    assert (failed.code, failed.retryable) == ("unavailable", True), failed
    assert time.monotonic() - started < 30, "the SDK retried"


def test_no_export_table_says_what_to_set(server: GcpServer) -> None:
    failed = make_driver(server.url).charges("blue", "2024-05-01", "2024-05-01")
    assert isinstance(failed, DriverError), failed
    assert failed.code == "invalid" and not failed.retryable
    assert f"set {KEY}.billing_export_table to the detailed billing export table" in (
        failed.message
    )
    assert server.records == []


@pytest.mark.parametrize(
    ("cluster", "first", "last"),
    [
        ('blue" OR TRUE --', "2024-05-01", "2024-05-01"),
        ("blue", "2024-5-1", "2024-05-01"),
        ("blue", "2024-05-01", "20240502"),
        ("blue", "2024-02-30", "2024-03-01"),
    ],
)
def test_bad_arguments_are_invalid_and_send_nothing(
    server: GcpServer, cluster: str, first: str, last: str
) -> None:
    failed = billing_driver(server.url).charges(cluster, first, last)
    assert isinstance(failed, DriverError) and failed.code == "invalid", failed
    assert server.records == []


def test_a_reversed_range_is_no_charges(server: GcpServer) -> None:
    assert charged(billing_driver(server.url), "blue", "2024-05-02", "2024-05-01") == []
    assert server.records == []


@pytest.mark.parametrize(
    "table",
    [
        "billing_export.gcp_billing_export_resource_v1_X",  # no project
        "billing-admin.billing_export",
        "billing-admin.billing_export.t.extra",
        "billing-admin.billing_export.t`; DROP TABLE x; --",
        "billing-admin.billing export.t",
        "Billing-Admin.billing_export.t",
        "billing-admin.billing-export.t",  # datasets have no hyphens
        "",
        42,
    ],
)
def test_a_bad_export_table_names_its_key(table: Any) -> None:
    with pytest.raises(ConfigError) as raised:
        GcpDriver(
            config(preemptible=True), options("http://127.0.0.1:9", billing_export_table=table)
        )
    assert raised.value.details["key"] == f"{KEY}.billing_export_table"


@pytest.mark.parametrize(
    "table",
    [EXPORT, "example.com:billing-admin.billing_export.gcp_billing_export_resource_v1_X"],
)
def test_export_tables_accepted(table: str) -> None:
    driver = GcpDriver(
        config(preemptible=True), options("http://127.0.0.1:9", billing_export_table=table)
    )
    assert driver.billing_export_table == table
    assert f"`{table}`" in billing_sql(table)


def test_bigquery_loads_for_the_billing_export_only() -> None:
    """In a fresh interpreter: a driver without ``billing_export_table`` builds without
    google-cloud-bigquery (a head that bursts without reading the bill needs only
    google-cloud-compute); one with it says what to install when BigQuery's SDK is
    missing."""
    google = config(preemptible=True).model_dump()
    probe = f"""
import sys
from autoscaler.config import GoogleConfig
from autoscaler.drivers.gcp import GcpDriver
from hypermedia.errors import ConfigError

sys.modules["google.cloud.bigquery"] = None  # as if not installed
google = GoogleConfig.model_validate({google!r})
GcpDriver(google, {options("http://127.0.0.1:9")!r})
try:
    GcpDriver(google, {options("http://127.0.0.1:9", billing_export_table=EXPORT)!r})
except ConfigError as exc:
    print(exc)
"""
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{KEY}.billing_export_table: "), done.stdout
    assert "google-cloud-bigquery" in done.stdout, done.stdout
    assert "pip install 'hypermedia[gcp]'" in done.stdout, done.stdout
