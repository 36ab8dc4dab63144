"""The local driver: the driver contract, and a real Ray worker node booted from the
boot script joining a head on 127.0.0.10, drained, and terminated without a trace."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from autoscaler import billing, bootstrap, raynodes, statefile
from autoscaler.drivers.base import TAG_LAUNCHED, BillingReader, DriverError, Instance
from autoscaler.drivers.local import LocalDriver
from hypermedia.errors import ConfigError
from hypermedia.worker import cluster
from tests.conftest import RAY_TOKEN
from tests.driver_contract import check_contract, listed, request


@pytest.fixture
def driver(tmp_path):
    made = LocalDriver({"state_dir": str(tmp_path / "local"), "on_demand_cents_per_hour": 9})
    yield made
    for instance in listed(made, "contract") + listed(made, "hm-test"):
        made.terminate(instance.instance_id)


def test_the_contract(driver):
    check_contract(driver)
    check_contract(driver, spot=True)


def test_its_bill_is_each_instances_life_at_its_price_per_utc_day(tmp_path):
    made = LocalDriver(
        {"state_dir": str(tmp_path / "bill"), "on_demand_cents_per_hour": 36, "billing_factor": 1.5}
    )
    assert isinstance(made, BillingReader) and made.billing_settle_seconds == 0
    before = time.time()
    launched = made.launch(request("bill-0001"))
    assert isinstance(launched, Instance)
    running = made.charges("contract", billing.day_of(before), billing.day_of(time.time()))
    assert [(c.request_id, c.instance_id) for c in running] == [("bill-0001", "lc-bill-0001")]
    assert made.terminate(launched.instance_id) is None
    after = time.time()
    today = billing.day_of(after)
    (charge,) = made.charges("contract", billing.day_of(before), today)
    assert 0 < charge.cents <= 54 * (after - before) / 3600  # 36 c/h x 1.5
    assert made.charges("another-cluster", today, today) == []
    # An instance that ran 30 hours, from 20:00 two days ago: billed on three days.
    end = billing.day_start(today) + 2 * 3600
    with statefile.locked_json(made.state_dir / "billing.json") as bill:
        bill["lc-bill-0001"].update(start=end - 30 * 3600, end=end)
    first = billing.day_of(end - 30 * 3600)
    charges = made.charges("contract", first, today)
    assert [c.day for c in charges] == [first, billing.day_of(end - 3 * 3600), today]
    assert [round(c.cents, 6) for c in charges] == [4 * 54.0, 24 * 54.0, 2 * 54.0]
    # A read of fewer days answers only those.
    assert [c.day for c in made.charges("contract", today, today)] == [today]


def test_two_drivers_on_one_state_dir_see_the_same_instances(tmp_path, driver):
    other = LocalDriver({"state_dir": str(driver.state_dir)})
    launched = driver.launch(request("shared-0001"))
    assert isinstance(launched, Instance)
    again = other.launch(request("shared-0001"))
    assert isinstance(again, Instance) and again.instance_id == launched.instance_id
    assert [i.instance_id for i in listed(other, "contract")] == [launched.instance_id]


def test_an_instance_without_a_launch_time_tag_is_launched_when_it_was_made(driver):
    """Its launch time tag removed from the state file: it was listed as launched at 0
    (the provider then counted it from when it saw it); it is listed as launched when
    the driver made it now, the start of its bill, as a cloud's creation time."""
    before = time.time()
    made = driver.launch(request("untagged-01"))
    assert isinstance(made, Instance)
    with driver._state() as state:
        del state[made.instance_id]["tags"][TAG_LAUNCHED]
    with driver._bill() as bill:
        start = bill[made.instance_id]["start"]
    (found,) = listed(driver, "contract")
    assert found.launched_at == start
    assert before <= start < time.time()


def test_a_boot_script_that_fails_is_an_error_value_and_leaves_nothing(driver):
    failed = driver.launch(request("broken-0001", user_data="#!/bin/sh\necho nope >&2\nexit 3\n"))
    assert isinstance(failed, DriverError)
    assert (
        failed.code == "unavailable" and "exited 3" in failed.message and "nope" in failed.message
    )
    assert listed(driver, "contract") == []


def test_a_terminating_instance_keeps_its_address_and_temp_dir_until_it_has_stopped(driver):
    """A launch while another instance is being stopped must not take its address and
    temp dir: the stop removes that dir, and the new node would lose its sockets and
    session files (the CI run where every actor on the replacement node died at once)."""
    # A process that sits out SIGTERM: the stop waits its grace, then kills it.
    slow = '#!/bin/sh\nsh -c \'trap "" TERM; sleep 120\' "$PWD" >/dev/null 2>&1 &\n'
    first = driver.launch(request("slow-0001", user_data=slow))
    assert isinstance(first, Instance) and driver.running(first.instance_id)
    stopping = threading.Thread(target=driver.terminate, args=(first.instance_id,))
    stopping.start()
    try:
        deadline = time.monotonic() + 10
        while listed(driver, "contract"):
            assert time.monotonic() < deadline, "the terminated instance is still listed"
            time.sleep(0.05)
        assert stopping.is_alive()  # still stopping: its address must not be free yet
        second = driver.launch(request("slow-0002", user_data=slow))
        assert isinstance(second, Instance), second
        assert second.private_ip != first.private_ip
    finally:
        stopping.join(30)
    assert not driver.running(first.instance_id)
    assert driver.running(second.instance_id)
    (record,) = driver_records(driver).values()
    assert Path(record["temp_dir"]).is_dir()  # the first one's stop left it alone
    # Once stopped, the address is free again.
    assert driver.terminate(second.instance_id) is None
    third = driver.launch(request("slow-0003", user_data=slow))
    assert isinstance(third, Instance) and third.private_ip == first.private_ip


def driver_records(driver: LocalDriver) -> dict[str, dict[str, Any]]:
    with driver._state() as state:
        return dict(state)


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({}, "provider.drivers.local.state_dir"),
        ({"state_dir": "/tmp/x", "surprise": 1}, "provider.drivers.local.surprise"),
        (
            {"state_dir": "/tmp/x", "on_demand_cents_per_hour": 0},
            "provider.drivers.local.on_demand_cents_per_hour",
        ),
        ({"state_dir": "/tmp/x", "num_cpus": "2"}, "provider.drivers.local.num_cpus"),
        (
            {"state_dir": "/tmp/x", "spot_poll_seconds": 61},
            "provider.drivers.local.spot_poll_seconds",
        ),
        (
            {"state_dir": "/tmp/x", "spot_poll_seconds": 0},
            "provider.drivers.local.spot_poll_seconds",
        ),
        ({"state_dir": "/tmp/x", "billing_factor": 0}, "provider.drivers.local.billing_factor"),
        (
            {"state_dir": "/tmp/x", "billing_settle_seconds": -1},
            "provider.drivers.local.billing_settle_seconds",
        ),
    ],
)
def test_bad_options_name_their_key(options, key):
    with pytest.raises(ConfigError) as caught:
        LocalDriver(options)
    assert caught.value.key == key


def test_a_real_node_boots_from_its_user_data_joins_drains_and_goes(tmp_path, driver):
    head = cluster.start_head(
        tmp_path / "ray",
        resources={},
        token_path=RAY_TOKEN,
        num_cpus=1,
        node_ip="127.0.0.10",
        metrics=False,  # nobody scrapes it: no Ray agents (~1.2 CPU-s)
    )
    try:
        node_id = "hm-rnode-0001"
        script = bootstrap.user_data(
            node_id=node_id,
            node_type="burst_ocr",
            head_address=head.address,
            resources={"queue_ocr": 1.0},
            token_path=str(RAY_TOKEN),
        )
        bootstrap.check_free_of_secrets(script, [RAY_TOKEN.read_text()])
        launched = driver.launch(request("rnode-0001", cluster="hm-test", user_data=script))
        assert isinstance(launched, Instance), launched
        assert launched.state == "running" and launched.private_ip == "127.0.0.11"
        assert driver.running(launched.instance_id)
        # Lean as the head: no log monitor (~0.8 CPU-s a node to start, then polling).
        with driver._state() as state:
            node = driver._node(state[launched.instance_id])
        commands = [" ".join(process.cmdline()) for process in node.processes()]
        assert any("raylet" in c for c in commands), commands
        assert not [c for c in commands if "log_monitor" in c], commands

        joined = raynodes.alive_node(head.address, node_id)
        assert joined is not None, raynodes.nodes(head.address)
        assert joined.node_type == "burst_ocr"
        assert joined.labels[bootstrap.INSTANCE_LABEL] == node_id

        said = raynodes.drain_and_wait(head.address, node_id, "test: drain", 60)
        assert said.startswith("drained"), said
        assert raynodes.alive_node(head.address, node_id) is None
        assert raynodes.drain_and_wait(head.address, node_id, "again", 5).startswith("no live")

        started = time.monotonic()
        assert driver.terminate(launched.instance_id) is None
        assert not driver.running(launched.instance_id)
        assert time.monotonic() - started < 30
        assert listed(driver, "hm-test") == []
    finally:
        head.stop()
    assert raynodes.drain_and_wait(head.address, "hm-rnode-0001", "gone", 5).startswith(
        "the head is not reachable"
    )


def test_an_instance_runs_ray_start_through_the_lean_launcher(driver):
    """The `ray` a local instance's user data runs: `ray start` is
    hypermedia.worker.ray_start (as in the worker image, docker/host/ray), without the
    imports of Ray's other commands (~1.2 CPU-s of a node's `ray start`); anything else is
    Ray's own `ray`. Read from the boot's error (the script shows its `ray` and fails)."""
    shown = driver.launch(
        request("shim-0001", user_data='#!/bin/sh\ncat "$(command -v ray)" >&2\nexit 1\n')
    )
    assert isinstance(shown, DriverError)
    assert f"{sys.executable} -m hypermedia.worker.ray_start start" in shown.message
    assert f"exec {cluster.ray_binary()} " in shown.message
    assert listed(driver, "contract") == []
