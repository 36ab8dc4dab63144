"""The IONOS driver: the real ionoscloud SDK over real HTTP to tests/clouds/ionos_server.py.

Nothing of the SDK or of the driver is mocked; what the SDK sent is read back from the
server's record.
"""

from __future__ import annotations

import base64
import datetime
import json
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from autoscaler.config import IonosConfig
from autoscaler.drivers.base import (
    TAG_CLUSTER,
    TAG_KEYS,
    TAG_LAUNCHED,
    TAG_REQUEST,
    DriverError,
    Instance,
)
from autoscaler.drivers.ionos import SDK_TRIES, IonosDriver, server_state
from hypermedia import tls
from hypermedia.errors import ConfigError
from tests.clouds.ionos_server import IonosServer
from tests.driver_contract import check_contract, eventually, listed, request

KEY = "provider.drivers.ionos"  # where these options live in the cluster yaml

SCRIPT = "#!/bin/sh\n# hypermedia worker boot\nexport RAY_TOKEN_FILE=/etc/hm/ray-token\necho up\n"


@pytest.fixture
def ionos(monkeypatch: pytest.MonkeyPatch) -> Iterator[IonosServer]:
    with IonosServer() as server:
        monkeypatch.delenv("IONOS_TOKEN", raising=False)
        monkeypatch.setenv("IONOS_USERNAME", server.username)
        monkeypatch.setenv("IONOS_PASSWORD", server.password)
        yield server


@pytest.fixture
def credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials in the environment, for drivers that need no server."""
    monkeypatch.delenv("IONOS_TOKEN", raising=False)
    monkeypatch.setenv("IONOS_USERNAME", "ops@example.com")
    monkeypatch.setenv("IONOS_PASSWORD", "pw")


def make_config(**overrides: Any) -> IonosConfig:
    fields: dict[str, Any] = {
        "enabled": True,
        "max_instances": 3,
        "datacenter": "de/fra",
        "server_type": "ENTERPRISE",
        "image": "ubuntu:latest",
        **overrides,
    }
    return IonosConfig(**fields)


def make_driver(server: IonosServer, config: IonosConfig | None = None, **options: Any):
    merged = {
        "host": server.url,
        "on_demand_cents_per_hour": 15,
        "wait_seconds": 0.02,
        "lan_id": 1,
        **options,
    }
    return IonosDriver(config or make_config(), merged)


def launched(driver: IonosDriver, request_id: str, **kwargs: Any) -> Instance:
    instance = driver.launch(request(request_id, **kwargs))
    assert isinstance(instance, Instance), instance
    return instance


def failed(result: object) -> DriverError:
    assert isinstance(result, DriverError), result
    return result


# -- the contract and what went over the wire ----------------------------------------


def test_contract(ionos: IonosServer) -> None:
    dc = ionos.add_datacenter("de/fra")
    ionos.add_datacenter("es/vit")
    instance = check_contract(make_driver(ionos))

    assert len(ionos.records("POST", r"/servers$")) == 1, "launched twice"
    deletes = ionos.records("DELETE", rf"^/datacenters/{dc}/servers/{instance.instance_id}$")
    assert deletes and all(d.query == {"deleteVolumes": ["True"]} for d in deletes)
    eventually(lambda: ionos.servers(dc) == [])


def test_create_request_as_sent(ionos: IonosServer) -> None:
    dc = ionos.add_datacenter("de/fra")
    ionos.add_image("hypermedia-worker-latest", "us/las")  # same name, other location
    image = ionos.add_image("hypermedia-worker-latest", "de/fra")
    config = make_config(server_type="vcpu", image="hypermedia-worker-latest")
    keys = ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFake ops@hm"]
    driver = make_driver(ionos, config, cores=2, ram_mb=4096, disk_gb=30, ssh_keys=keys)
    first = request("sent-0001", user_data=SCRIPT)
    instance = driver.launch(first)
    assert isinstance(instance, Instance), instance
    assert (instance.state, instance.private_ip) == ("running", "10.7.0.10")

    basic = base64.b64encode(f"{ionos.username}:{ionos.password}".encode()).decode()
    assert {r.authorization for r in ionos.records()} == {f"Basic {basic}"}
    (post,) = ionos.records("POST", r"/servers$")
    assert post.path == f"/datacenters/{dc}/servers"
    assert post.body["properties"] == {
        "name": "hm-sent-0001.contract",
        "cores": 2,
        "ram": 4096,
        "type": "VCPU",
    }
    (volume,) = post.body["entities"]["volumes"]["items"]
    properties = volume["properties"]
    assert properties["image"] == image and "imageAlias" not in properties
    assert (properties["size"], properties["type"]) == (30, "SSD Standard")
    assert properties["sshKeys"] == keys and "imagePassword" not in properties
    assert base64.b64decode(properties["userData"]).decode() == SCRIPT
    (nic,) = post.body["entities"]["nics"]["items"]
    assert (nic["properties"]["lan"], nic["properties"]["dhcp"]) == (1, True)

    sent = json.dumps(post.body)
    for secret in (ionos.password, ionos.token, basic, ionos.username):
        assert secret not in sent
        assert secret not in base64.b64decode(properties["userData"]).decode()

    labels = [r.body["properties"] for r in ionos.records("POST", r"/labels$")]
    assert {(lab["key"], lab["value"]) for lab in labels} == set(first.tags().items())
    assert ionos.labels(instance.instance_id) == first.tags()
    assert set(first.tags()) == set(TAG_KEYS)


def test_token_auth_sends_bearer(ionos: IonosServer, monkeypatch: pytest.MonkeyPatch) -> None:
    ionos.add_datacenter("de/fra")
    monkeypatch.delenv("IONOS_USERNAME")
    monkeypatch.delenv("IONOS_PASSWORD")
    monkeypatch.setenv("IONOS_TOKEN", ionos.token)
    launched(make_driver(ionos), "token-0001")
    assert {r.authorization for r in ionos.records()} == {f"Bearer {ionos.token}"}


def test_a_fresh_driver_rebuilds_instances_from_labels(ionos: IonosServer) -> None:
    ionos.add_datacenter("de/fra")
    first = launched(make_driver(ionos), "restart-01", cluster="prod", queue="media", price=21.25)

    fresh = make_driver(ionos)
    (seen,) = listed(fresh, "prod")
    assert seen == first
    assert (seen.node_type, seen.queue, seen.price_cents_per_hour) == (
        "burst_media",
        "media",
        21.25,
    )
    assert listed(fresh, "contract") == []
    again = fresh.launch(request("restart-01", cluster="prod", queue="media", price=21.25))
    assert isinstance(again, Instance) and again.instance_id == first.instance_id
    assert len(ionos.records("POST", r"/servers$")) == 1


def test_pagination_reads_every_server(ionos: IonosServer, monkeypatch: pytest.MonkeyPatch) -> None:
    ionos.add_datacenter("de/fra")
    monkeypatch.setattr("autoscaler.drivers.ionos.PAGE", 2)
    driver = make_driver(ionos)
    ids = {launched(driver, f"page-000{n}").instance_id for n in range(5)}
    assert {i.instance_id for i in listed(driver, "contract")} == ids
    offsets = [r.query["offset"] for r in ionos.records("GET", r"/servers$")[-3:]]
    assert offsets == [["0"], ["2"], ["4"]]


# -- where it launches ---------------------------------------------------------------


def test_location_resolves_to_exactly_one_datacenter(ionos: IonosServer) -> None:
    fra = ionos.add_datacenter("de/fra")
    txl = [ionos.add_datacenter("de/txl"), ionos.add_datacenter("de/txl")]

    launched(make_driver(ionos), "where-0001")
    assert ionos.records("POST", r"/servers$")[-1].path == f"/datacenters/{fra}/servers"

    ambiguous = failed(
        make_driver(ionos, make_config(datacenter="de/txl")).launch(request("w-0002"))
    )
    assert ambiguous.code == "invalid" and "2 datacenters" in ambiguous.message
    assert all(dc in ambiguous.message for dc in txl)
    nowhere = failed(make_driver(ionos, make_config(datacenter="us/ewr")).instances("contract"))
    assert nowhere.code == "invalid" and "0 datacenters" in nowhere.message

    launched(make_driver(ionos, make_config(datacenter=txl[1])), "where-0003")
    assert ionos.records("POST", r"/servers$")[-1].path == f"/datacenters/{txl[1]}/servers"
    unknown = make_driver(ionos, make_config(datacenter=str(uuid.uuid4())))
    assert failed(unknown.launch(request("where-0004"))).code == "not_found"
    assert len(ionos.records("POST", r"/servers$")) == 2


def test_image_id_alias_or_name(ionos: IonosServer) -> None:
    ionos.add_datacenter("de/fra")
    image = ionos.add_image("worker", "de/fra")
    cases = [
        (image, "image", image),
        ("ubuntu:latest", "imageAlias", "ubuntu:latest"),
        ("worker", "image", image),
    ]
    for n, (reference, field, value) in enumerate(cases):
        launched(make_driver(ionos, make_config(image=reference)), f"image-000{n}")
        properties = ionos.records("POST", r"/servers$")[-1].body["entities"]["volumes"]
        assert properties["items"][0]["properties"][field] == value
    missing = make_driver(ionos, make_config(image="no-such-image")).launch(request("image-0009"))
    assert failed(missing).code == "invalid" and "no-such-image" in failed(missing).message


# -- when IONOS says no ------------------------------------------------------------


def test_failed_request_is_an_error_and_is_cleaned_up(ionos: IonosServer) -> None:
    dc = ionos.add_datacenter("de/fra")
    driver = make_driver(ionos)
    ionos.fail_next_request("insufficient resources in de/fra")
    error = failed(driver.launch(request("failed-0001")))
    assert (error.code, error.retryable) == ("capacity", True)
    assert "insufficient resources in de/fra" in error.message
    (broken,) = ionos.servers(dc)
    deletes = ionos.records("DELETE", rf"/servers/{broken['id']}$")
    assert [d.query for d in deletes] == [{"deleteVolumes": ["True"]}]

    again = launched(driver, "failed-0001")
    assert again.instance_id != broken["id"]
    eventually(lambda: [s["id"] for s in ionos.servers(dc)] == [again.instance_id])


def test_a_refused_label_is_written_again_after_the_wait(ionos: IonosServer) -> None:
    ionos.add_datacenter("de/fra")
    ionos.fail_next(500, path=r"/labels$")
    first = request("labels-0001")
    instance = make_driver(ionos).launch(first)  # this request: its launch time is in a label
    assert isinstance(instance, Instance), instance
    assert ionos.labels(instance.instance_id) == first.tags()
    assert len(ionos.records("POST", r"/labels$")) == 1 + len(TAG_KEYS)


def test_labels_that_cannot_be_written_undo_the_launch(ionos: IonosServer) -> None:
    dc = ionos.add_datacenter("de/fra")
    driver = make_driver(ionos)
    ionos.fail_next(500, path=r"/labels$", times=2)
    error = failed(driver.launch(request("labels-0002")))
    assert (error.code, error.retryable) == ("unavailable", True)
    (server,) = ionos.servers(dc)
    (delete,) = ionos.records("DELETE", rf"/servers/{server['id']}$")
    assert delete.query == {"deleteVolumes": ["True"]}
    eventually(lambda: ionos.servers(dc) == [])


def test_a_server_neither_labelled_nor_deleted_stays_listed_and_counted(
    ionos: IonosServer,
) -> None:
    """IONOS refuses the labels (a 400, every try) and then the delete that undoes the
    launch (a 500): the server runs on, unlabelled. It was invisible to instances() and
    the launch answered a plain error, so the provider closed its ledger row at once and
    nothing ever counted or terminated it. The launch now answers maybe_launched (the
    row stays open) and the driver lists the server under the launch's tags until it is
    gone, so the provider adopts it and Ray can terminate it."""
    dc = ionos.add_datacenter("de/fra")
    driver = make_driver(ionos)
    ionos.fail_next(400, path=r"/labels$", times=50)
    ionos.fail_next(500, method="DELETE", path=r"/servers/[^/]+$")
    wanted = request("labels-0004")
    error = failed(driver.launch(wanted))
    assert error.maybe_launched
    (server,) = ionos.servers(dc)
    assert ionos.labels(server["id"]) == {}
    (found,) = listed(driver, "contract")
    assert (found.instance_id, found.request_id) == (server["id"], "labels-0004")
    assert found.price_cents_per_hour == wanted.price_cents_per_hour
    assert driver.terminate(found.instance_id) is None
    eventually(lambda: ionos.servers(dc) == [])
    assert listed(driver, "contract") == []


def test_an_unlabelled_server_is_labelled_by_the_next_launch(ionos: IonosServer) -> None:
    ionos.add_datacenter("de/fra")
    driver = make_driver(ionos)
    first = launched(driver, "labels-0003")
    ionos.drop_labels(first.instance_id)  # as if the launcher died before labelling
    (named,) = listed(make_driver(ionos), "contract")  # by its name
    assert (named.instance_id, named.request_id, named.node_type) == (
        first.instance_id,
        "labels-0003",
        "",
    )

    again = launched(make_driver(ionos), "labels-0003")
    assert again.instance_id == first.instance_id
    assert [i.instance_id for i in listed(driver, "contract")] == [first.instance_id]
    assert set(ionos.labels(first.instance_id)) == set(TAG_KEYS)
    assert len(ionos.records("POST", r"/servers$")) == 1


class Crash(BaseException):
    """The launcher's process dying (not an error the driver answers)."""


class DiesAfterTheCreate(IonosDriver):
    """A launcher that dies once IONOS has accepted the create, before any label."""

    def _write_labels(self, *args: Any, **kwargs: Any) -> Any:
        raise Crash


def test_a_server_whose_launcher_died_before_labelling_is_listed_by_its_name(
    ionos: IonosServer,
) -> None:
    """IONOS takes no labels at create time: they are written right after. A launcher
    that died in between (or a restart, which forgets the in-memory list of servers it
    could not label) left a server that bills but that instances() never listed: the
    provider neither counted it against the caps nor terminated it. The name now carries
    the cluster as well as the request id, so a fresh driver lists the server under its
    cluster (state from IONOS, cluster and request id from the name) and can delete it."""
    dc = ionos.add_datacenter("de/fra")
    dying = DiesAfterTheCreate(make_config(), {"host": ionos.url, "on_demand_cents_per_hour": 15})
    wanted = request("crash-0001")
    started = time.time()
    with pytest.raises(Crash):
        dying.launch(wanted)
    (server,) = ionos.servers(dc)
    assert ionos.labels(server["id"]) == {}

    fresh = make_driver(ionos)
    (found,) = listed(fresh, "contract")
    assert (found.instance_id, found.cluster, found.request_id) == (
        server["id"],
        "contract",
        "crash-0001",
    )
    assert found.provider == "ionos" and found.state == "pending" and not found.spot
    assert started - 1 <= found.launched_at <= time.time()
    assert found.price_cents_per_hour == 0  # no price label: the provider counts the list price
    assert listed(fresh, "another") == []
    assert fresh.terminate(found.instance_id) is None
    assert all(i.state == "terminating" for i in listed(fresh, "contract"))  # or gone
    eventually(lambda: ionos.servers(dc) == [])
    assert listed(make_driver(ionos), "contract") == []


def test_a_server_whose_launcher_died_is_labelled_by_launching_again(ionos: IonosServer) -> None:
    dc = ionos.add_datacenter("de/fra")
    dying = DiesAfterTheCreate(make_config(), {"host": ionos.url, "on_demand_cents_per_hour": 15})
    wanted = request("crash-0002", cluster="prod_eu")
    with pytest.raises(Crash):
        dying.launch(wanted)
    (server,) = ionos.servers(dc)
    assert server["properties"]["name"] == "hm-crash-0002.prod_eu"

    again = make_driver(ionos).launch(wanted)
    assert isinstance(again, Instance) and again.instance_id == server["id"]
    assert ionos.labels(server["id"]) == wanted.tags()
    assert len(ionos.records("POST", r"/servers$")) == 1
    (seen,) = listed(make_driver(ionos), "prod_eu")
    assert (seen.node_type, seen.queue, seen.price_cents_per_hour) == ("burst_ocr", "ocr", 12.5)


def test_servers_named_the_old_way_keep_working(
    ionos: IonosServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server a driver from before the cluster was in the name made (``hm-<request
    id>``): listed by its labels, found again by a launch of its request id."""
    dc = ionos.add_datacenter("de/fra")
    with monkeypatch.context() as before:
        before.setattr("autoscaler.drivers.ionos.server_name", lambda cluster, rid: f"hm-{rid}")
        old = launched(make_driver(ionos), "old-00001")
    assert [s["properties"]["name"] for s in ionos.servers(dc)] == ["hm-old-00001"]

    fresh = make_driver(ionos)
    (seen,) = listed(fresh, "contract")
    assert (seen.instance_id, seen.request_id, seen.node_type) == (
        old.instance_id,
        "old-00001",
        "burst_ocr",
    )
    assert launched(fresh, "old-00001").instance_id == old.instance_id
    assert len(ionos.records("POST", r"/servers$")) == 1
    ionos.drop_labels(old.instance_id)  # its name does not say its cluster
    assert listed(fresh, "contract") == []
    assert launched(fresh, "old-00001").instance_id == old.instance_id  # labelled again
    assert {ionos.labels(old.instance_id)[k] for k in (TAG_CLUSTER, TAG_REQUEST)} == {
        "contract",
        "old-00001",
    }


def by_hand(ionos: IonosServer, dc: str, name: str, labels: dict[str, str]) -> str:
    """A server made in the console (or by a script), not by the driver, with ``labels``."""
    body = {
        "properties": {"name": name, "cores": 1, "ram": 1024},
        "entities": {
            "volumes": {
                "items": [
                    {"properties": {"type": "HDD", "size": 10, "imageAlias": "ubuntu:latest"}}
                ]
            }
        },
    }
    auth = (ionos.username, ionos.password)
    made = httpx.post(
        f"{ionos.url}/datacenters/{dc}/servers",
        json=body,
        auth=auth,
        timeout=10,
        verify=tls.client_context(),
    )
    made.raise_for_status()
    server_id = str(made.json()["id"])
    for key, value in labels.items():
        labelled = httpx.post(
            f"{ionos.url}/datacenters/{dc}/servers/{server_id}/labels",
            json={"properties": {"key": key, "value": value}},
            auth=auth,
            timeout=10,
            verify=tls.client_context(),
        )
        labelled.raise_for_status()
    return server_id


def test_a_server_without_a_launch_time_label_is_launched_at_its_creation(
    ionos: IonosServer,
) -> None:
    """Made by hand with the cluster's label, or its launch time label removed: it was
    listed as launched at 0 (unless its name was the driver's), so the provider counted
    its spend from when it first saw it and the hours it had billed before were missing
    from the daily cap. It is listed as launched at its createdDate now; a launch time
    label stays what counts, and a creation time ahead of our clock counts as now."""
    dc = ionos.add_datacenter("de/fra")
    driver = make_driver(ionos)
    old = by_hand(ionos, dc, "ocr-by-hand", {TAG_CLUSTER: "contract"})
    fresh = by_hand(ionos, dc, "fresh-by-hand", {TAG_CLUSTER: "contract"})
    ahead = launched(driver, "ahead-0001")
    ionos.remove_label(ahead.instance_id, TAG_LAUNCHED)
    tagged = request("tagged-0001")
    made = driver.launch(tagged)
    assert isinstance(made, Instance), made
    tagged_id = made.instance_id
    three_hours_ago = float(int(time.time()) - 3 * 3600)
    ionos.set_created(dc, old, three_hours_ago)
    ionos.set_created(dc, tagged_id, three_hours_ago)
    ionos.set_created(dc, ahead.instance_id, time.time() + 3600)

    before = time.time()
    found = {i.instance_id: i for i in listed(driver, "contract")}
    assert found[old].launched_at == three_hours_ago
    (server,) = [s for s in ionos.servers(dc) if s["id"] == fresh]
    created = datetime.datetime.fromisoformat(server["metadata"]["createdDate"]).timestamp()
    assert found[fresh].launched_at == created < before
    assert before <= found[ahead.instance_id].launched_at <= time.time()
    assert found[tagged_id].launched_at == tagged.launched_at > three_hours_ago


def test_a_launch_that_outlasts_its_timeout_answers_the_labelled_server(
    ionos: IonosServer,
) -> None:
    ionos.add_datacenter("de/fra")
    driver = make_driver(ionos, launch_timeout_seconds=0.2)
    ionos.hold_requests = True
    started = time.monotonic()
    instance = launched(driver, "slow-0001")
    assert instance.state == "pending" and time.monotonic() - started < 5
    assert [(i.instance_id, i.state) for i in listed(make_driver(ionos), "contract")] == [
        (instance.instance_id, "pending")
    ]
    assert launched(driver, "slow-0001").instance_id == instance.instance_id
    assert len(ionos.records("POST", r"/servers$")) == 1


@pytest.mark.parametrize(
    ("status", "code", "retryable"),
    [
        (400, "invalid", False),
        (403, "auth", False),
        (404, "not_found", False),
        (422, "invalid", False),
        (429, "quota", True),
        (500, "unavailable", True),
        (503, "unavailable", True),
    ],
)
def test_error_translation(ionos: IonosServer, status: int, code: str, retryable: bool) -> None:
    ionos.add_datacenter("de/fra")
    driver = make_driver(ionos)
    sdk_retries = status in (429, 503)  # the SDK's own retry statuses (with 502, 504)
    tries = SDK_TRIES if sdk_retries else 1
    ionos.fail_next(status, times=tries, message=f"refused with {status}")
    started = time.monotonic()
    error = failed(driver.launch(request("errors-0001")))
    assert (error.code, error.retryable) == (code, retryable)
    assert f"refused with {status}" in error.message
    assert len(ionos.records("POST", r"/servers$")) == tries
    assert time.monotonic() - started < 5
    assert launched(driver, "errors-0001").request_id == "errors-0001"


def test_429_without_retry_after_is_still_a_value(ionos: IonosServer) -> None:
    ionos.add_datacenter("de/fra")
    driver = make_driver(ionos)
    listed(driver, "contract")  # resolves the datacenter first
    ionos.fail_next(429, method="GET", path=r"/servers$", retry_after=None)
    error = failed(driver.instances("contract"))
    assert (error.code, error.retryable) == ("quota", True)


def test_refused_credentials(ionos: IonosServer, monkeypatch: pytest.MonkeyPatch) -> None:
    ionos.add_datacenter("de/fra")
    monkeypatch.setenv("IONOS_PASSWORD", "wrong-password")
    driver = make_driver(ionos)
    for result in (driver.launch(request("auth-0001")), driver.instances("contract")):
        error = failed(result)
        assert (error.code, error.retryable) == ("auth", False)
        assert "wrong-password" not in error.message


def test_unreachable_endpoint_is_a_quick_value(credentials: None) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    driver = IonosDriver(
        make_config(),
        {"host": f"http://127.0.0.1:{port}/cloudapi/v6", "on_demand_cents_per_hour": 15},
    )
    started = time.monotonic()
    results = [
        driver.launch(request("down-0001")),
        driver.instances("contract"),
        driver.terminate(str(uuid.uuid4())),
    ]
    for result in results:
        error = failed(result)
        assert (error.code, error.retryable) == ("unavailable", True), error
    assert time.monotonic() - started < 5


def test_terminating_a_gone_server_succeeds(ionos: IonosServer) -> None:
    ionos.add_datacenter("de/fra")
    gone = str(uuid.uuid4())
    assert make_driver(ionos).terminate(gone) is None
    (delete,) = ionos.records("DELETE")
    assert delete.path.endswith(f"/servers/{gone}") and delete.query == {"deleteVolumes": ["True"]}


def test_price_is_on_demand_only(ionos: IonosServer) -> None:
    driver = make_driver(ionos, on_demand_cents_per_hour=15.5)
    assert driver.price(False) == 15.5
    error = failed(driver.price(True))
    assert error.code == "invalid" and "spot" in error.message
    assert ionos.records() == []  # prices and construction need no API call


# -- configuration -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("cores", 0),
        ("cores", "4"),
        ("cores", True),
        ("ram_mb", 1000),
        ("ram_mb", 128),
        ("disk_gb", 0),
        ("lan_id", "1"),
        ("on_demand_cents_per_hour", 0),
        ("on_demand_cents_per_hour", float("nan")),
        ("on_demand_cents_per_hour", "15"),
        ("wait_seconds", -1),
        ("launch_timeout_seconds", 0),
        ("host", "api.ionos.com"),
        ("ssh_keys", "ssh-ed25519 AAAA"),
        ("colour", "red"),
        ("password", "hunter2"),
        ("token", "tok"),
    ],
)
def test_bad_option_names_its_key(credentials: None, key: str, value: object) -> None:
    options = {"on_demand_cents_per_hour": 15, key: value}
    with pytest.raises(ConfigError) as caught:
        IonosDriver(make_config(), options)
    assert caught.value.key == f"{KEY}.{key}"


def test_price_option_is_required(credentials: None) -> None:
    with pytest.raises(ConfigError) as caught:
        IonosDriver(make_config(), {})
    assert caught.value.key == f"{KEY}.on_demand_cents_per_hour"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("server_type", "c6i.xlarge"),  # the seed's example (an AWS type)
        ("server_type", "CUBE"),
        ("server_type", None),
        ("datacenter", None),
        ("image", " "),
    ],
)
def test_config_the_driver_cannot_honour(credentials: None, field: str, value: object) -> None:
    config = make_config(enabled=False, **{field: value})
    with pytest.raises(ConfigError) as caught:
        IonosDriver(config, {"on_demand_cents_per_hour": 15})
    assert caught.value.key == f"cloud_providers.ionos.{field}"


@pytest.mark.parametrize(
    ("environment", "key"),
    [
        ({}, "IONOS_TOKEN"),
        ({"IONOS_USERNAME": "ops@example.com"}, "IONOS_PASSWORD"),
        ({"IONOS_PASSWORD": "pw"}, "IONOS_USERNAME"),
    ],
)
def test_missing_credentials(
    monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], key: str
) -> None:
    for name in ("IONOS_TOKEN", "IONOS_USERNAME", "IONOS_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as caught:
        IonosDriver(make_config(), {"on_demand_cents_per_hour": 15})
    assert caught.value.key == key


def test_missing_sdk_says_what_to_install(
    credentials: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ionoscloud", None)  # makes `import ionoscloud` fail
    with pytest.raises(ConfigError, match=r"pip install 'hypermedia\[ionos\]'"):
        IonosDriver(make_config(), {"on_demand_cents_per_hour": 15})


def test_importing_the_driver_imports_no_sdk() -> None:
    code = "import sys, autoscaler.drivers.ionos; assert 'ionoscloud' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize(
    ("metadata_state", "vm_state", "expected"),
    [
        ("BUSY", None, "pending"),
        ("DEPLOYING", "NOSTATE", "pending"),
        ("AVAILABLE", None, "pending"),
        ("BUSY", "SHUTOFF", "pending"),
        ("AVAILABLE", "RUNNING", "running"),
        ("BUSY", "RUNNING", "running"),
        ("AVAILABLE", "SHUTOFF", "terminating"),
        ("AVAILABLE", "CRASHED", "terminating"),
        ("INACTIVE", "SHUTOFF", "terminating"),
        ("DESTROYING", "RUNNING", "terminating"),
        ("FAILED", None, "terminating"),
    ],
)
def test_server_state(metadata_state: str, vm_state: str | None, expected: str) -> None:
    assert server_state(metadata_state, vm_state) == expected


def test_silent_endpoint_times_out_as_a_value(
    credentials: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("autoscaler.drivers.ionos.TIMEOUT", (0.5, 0.5))
    with socket.socket() as silent:  # connections queue in the backlog, never answered
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        host = f"http://127.0.0.1:{silent.getsockname()[1]}/cloudapi/v6"
        driver = IonosDriver(make_config(), {"host": host, "on_demand_cents_per_hour": 15})
        started = time.monotonic()
        error = failed(driver.instances("contract"))
    assert (error.code, error.retryable) == ("unavailable", True)
    assert "Timeout" in error.message and time.monotonic() - started < 5
