"""The spend ledger counts every instance the cloud runs for the cluster, once; a
launch made without the scheduler's order is routed as the policy would route it.

The node provider with its AWS driver on moto's server (boto3 over real HTTP) and the
record on PostgreSQL. A cloud can answer a launch with an error after it made the
instance (a read timeout, a 5xx, an operation still running), a process can die
between a launch and the ledger's update, and one listing can miss an instance: in
each case the instance's spend must stay counted against the caps, and a row must
close once no instance is behind it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from botocore.exceptions import ReadTimeoutError
from ray.autoscaler.node_launch_exception import NodeLaunchException
from ray.autoscaler.tags import (
    NODE_KIND_WORKER,
    TAG_RAY_LAUNCH_REQUEST,
    TAG_RAY_NODE_KIND,
    TAG_RAY_USER_NODE_TYPE,
)
from sqlalchemy import select

from autoscaler import billing
from autoscaler import provider as provider_module
from autoscaler.billing import Account
from autoscaler.cost import day_start as cost_day_start
from autoscaler.drivers.aws import AwsDriver
from autoscaler.drivers.base import Instance, LaunchRequest
from autoscaler.leader import Leadership
from autoscaler.provider import HypermediaNodeProvider
from autoscaler.scheduler import NoCloud, Scheduler, ledger_rows, ledger_spend
from hypermedia import tls
from hypermedia.clock import ManualClock, to_datetime
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from tests import support
from tests.factories import make_user, open_stack, submit
from tests.integration.test_driver_aws import cost_day, queue_cost_results
from tests.integration.test_node_provider import provider_config, scheduler_json

REGION = "us-east-1"
CENTS_AN_HOUR = 60.0  # the hourly cap is 100: one instance fits, two do not
WORKER = {TAG_RAY_NODE_KIND: NODE_KIND_WORKER, TAG_RAY_USER_NODE_TYPE: "burst_media"}
RESOURCES = {"queue_media": 1.0}


@pytest.fixture(scope="module")
def moto_server() -> Iterator[str]:
    with support.moto_server() as url:
        yield url


@pytest.fixture
def ami(moto_server: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """moto emptied, credentials in the environment, and an image to launch."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAHYPERMEDIATEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hypermedia-test-secret")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    httpx.post(
        f"{moto_server}/moto-api/reset", timeout=10, verify=tls.client_context()
    ).raise_for_status()
    ec2 = boto3.client("ec2", endpoint_url=moto_server, region_name=REGION)
    return str(ec2.register_image(Name="hm-burst-test")["ImageId"])


@pytest.fixture
def make_provider(
    tmp_path: Path, pg_database_url: str, moto_server: str, ami: str
) -> Callable[..., HypermediaNodeProvider]:
    def make(**changes: Any) -> HypermediaNodeProvider:
        """A provider object, as `ray up`, the monitor or a restart builds one."""
        scheduler = scheduler_json(
            tmp_path,
            queues__media__max_workers=5,
            cloud_providers__aws__region=REGION,
            cloud_providers__aws__instance_type="m5.large",
            cloud_providers__aws__ami_id=ami,
            cloud_providers__aws__max_instances=5,
            **changes,
        )
        drivers = {
            "aws": {
                "type": "aws",
                "endpoint_url": moto_server,
                "on_demand_cents_per_hour": CENTS_AN_HOUR,
            }
        }
        config = provider_config(tmp_path, pg_database_url, scheduler, drivers=drivers)
        return HypermediaNodeProvider(config, "hm-ledger")

    return make


def aws(provider: HypermediaNodeProvider) -> AwsDriver:
    driver = provider.drivers["aws"]
    assert isinstance(driver, AwsDriver)
    return driver


def running(provider: HypermediaNodeProvider) -> list[str]:
    """The cluster's instances EC2 runs (the driver's own listing)."""
    listed = aws(provider).instances("hm-ledger")
    assert isinstance(listed, list)
    return sorted(i.instance_id for i in listed if i.state != "terminating")


def open_rows(provider: HypermediaNodeProvider) -> list[str]:
    s = t.cloud_spend
    with transaction(provider.engine) as conn:
        return sorted(
            conn.execute(select(s.c.instance_id).where(s.c.terminated_at.is_(None))).scalars()
        )


def launch(provider: HypermediaNodeProvider, request: str) -> str:
    """One launch as Ray asks for it: "launched", or the exception's category."""
    try:
        provider.create_node_with_resources_and_labels(
            {}, {**WORKER, TAG_RAY_LAUNCH_REQUEST: request}, 1, RESOURCES, {}
        )
    except NodeLaunchException as exc:
        return str(exc.category)
    return "launched"


def time_out_after_create(driver: AwsDriver, *, create: bool = True) -> None:
    """EC2 makes the instance (unless ``create`` is False), but its answer never
    arrives: botocore's read timeout, which the driver reports as ``unavailable``."""
    real = driver.client.run_instances

    def run_instances(**request: Any) -> Any:
        if create:
            real(**request)
        raise ReadTimeoutError(endpoint_url="https://ec2.us-east-1.amazonaws.com")

    driver.client.run_instances = run_instances  # type: ignore[method-assign]


def test_an_instance_made_by_a_launch_that_timed_out_is_counted_and_adopted(make_provider):
    provider = make_provider()
    time_out_after_create(aws(provider))
    assert launch(provider, "t-1") == "unavailable"
    (made,) = running(provider)
    (row,) = open_rows(provider)  # still under the launch's request id
    assert row.startswith("r")
    # Its 60 cents an hour count: a second 60-cent instance would pass the $1 cap.
    assert launch(provider, "t-2") == "cost_guard"
    assert running(provider) == [made]

    # The next listing adopts it (Ray sees the node it pays for) and the row takes its id.
    nodes = provider.non_terminated_nodes({TAG_RAY_NODE_KIND: NODE_KIND_WORKER})
    assert [provider.records()[n]["instance_id"] for n in nodes] == [made]
    assert open_rows(provider) == [made]
    state = provider.state_dir / "launching.json"
    assert json.loads(state.read_text()) == {}  # its launch tags went to the node


def test_a_launch_that_timed_out_without_an_instance_is_closed_once_settled(
    make_provider, monkeypatch
):
    provider = make_provider()
    time_out_after_create(aws(provider), create=False)
    assert launch(provider, "n-1") == "unavailable"
    assert running(provider) == [] and len(open_rows(provider)) == 1
    provider.non_terminated_nodes({})  # settling: the row stays, the cloud may be slow
    assert len(open_rows(provider)) == 1
    monkeypatch.setattr(provider_module, "LAUNCH_SETTLE_SECONDS", 0.2)
    time.sleep(0.3)
    assert provider.non_terminated_nodes({}) == []
    assert open_rows(provider) == []
    assert json.loads((provider.state_dir / "launching.json").read_text()) == {}


def test_a_crash_between_the_launch_and_the_ledger_leaves_no_row_open_forever(make_provider):
    """The process ends after EC2 answered the launch and before the row was renamed to
    the instance's id: a later provider object adopts the instance, the row follows it,
    and when the instance is gone the row closes."""
    provider = make_provider()
    driver = aws(provider)
    real = driver.launch

    def launch_then_die(request: LaunchRequest) -> Any:
        real(request)
        raise SystemExit("killed")

    driver.launch = launch_then_die  # type: ignore[method-assign]
    with pytest.raises(SystemExit):
        launch(provider, "c-1")
    (made,) = running(provider)
    assert open_rows(provider) != [made]  # under the request id

    restarted = make_provider()
    (node_id,) = restarted.non_terminated_nodes({TAG_RAY_NODE_KIND: NODE_KIND_WORKER})
    assert open_rows(restarted) == [made]
    assert aws(restarted).terminate(made) is None
    record = restarted.records()[node_id]
    restarted._close_ledger("aws", provider_module._ledger_ids(record), time.time())
    assert open_rows(restarted) == []


def test_an_instance_missing_from_one_listing_is_not_taken_for_gone(make_provider, monkeypatch):
    monkeypatch.setattr(provider_module, "LISTING_GRACE_SECONDS", 0.3)
    provider = make_provider()
    assert launch(provider, "g-1") == "launched"
    (made,) = running(provider)
    time.sleep(0.4)  # older than the grace a fresh launch gets
    driver = aws(provider)
    real = driver.instances
    driver.instances = lambda cluster: []  # type: ignore[method-assign]
    (node_id,) = provider.non_terminated_nodes({})  # missed once: kept
    assert open_rows(provider) == [made]
    driver.instances = real  # type: ignore[method-assign]
    assert provider.non_terminated_nodes({}) == [node_id]
    assert "missing_since" not in provider.records()[node_id]

    driver.instances = lambda cluster: []  # type: ignore[method-assign]
    assert provider.non_terminated_nodes({}) == [node_id]
    time.sleep(0.4)  # missing for longer than the grace: gone
    assert provider.non_terminated_nodes({}) == []
    assert open_rows(provider) == []
    driver.instances = real  # type: ignore[method-assign]
    assert driver.terminate(made) is None


def test_a_listing_gives_a_row_its_request_id_and_takes_a_reopened_rows_bill_back(
    make_provider,
):
    """A row without a request id (kept before they were) gets it from the listed
    instance's tags: a bill may name only that. A row closed (and reconciled) while its
    instance runs on is reopened with its reconciliation undone: its bill is not
    settled."""
    provider = make_provider()
    assert launch(provider, "q-1") == "launched"
    (made,) = running(provider)
    provider.non_terminated_nodes({})
    s = t.cloud_spend
    with transaction(provider.engine) as conn:
        request_id = conn.execute(select(s.c.request_id)).scalar_one()
        conn.execute(s.update().values(request_id=None))
    provider.non_terminated_nodes({})
    with transaction(provider.engine) as conn:
        assert conn.execute(select(s.c.request_id)).scalar_one() == request_id
        now = to_datetime(time.time())
        conn.execute(
            s.update().values(
                request_id=None, terminated_at=now, reconciled_at=now, billed_microusd=1
            )
        )
    provider.non_terminated_nodes({})
    with transaction(provider.engine) as conn:
        row = conn.execute(select(s)).one()
    assert (row.instance_id, row.request_id) == (made, request_id)
    assert (row.terminated_at, row.reconciled_at, row.billed_microusd) == (None, None, None)
    assert aws(provider).terminate(made) is None


def test_an_instance_the_ledger_never_saw_gets_a_row_from_its_tags(make_provider):
    """Launched by hand with the cluster's tags, or before the ledger was kept: listed,
    so it is counted, from the launch time and price its tags carry."""
    provider = make_provider()
    launched_at = time.time() - 1800
    made = aws(provider).launch(
        LaunchRequest(
            request_id="rmanual000000000000001",
            cluster="hm-ledger",
            node_type="burst_media",
            queue="media",
            spot=False,
            price_cents_per_hour=42.0,
            launched_at=launched_at,
            user_data="#!/bin/sh\n",
        )
    )
    assert isinstance(made, Instance)
    provider.non_terminated_nodes({})
    s = t.cloud_spend
    with transaction(provider.engine) as conn:
        (row,) = conn.execute(select(s).where(s.c.terminated_at.is_(None))).all()
    assert row.instance_id == made.instance_id
    assert row.price_per_hour_microusd == 420_000
    assert abs(row.launched_at.timestamp() - int(launched_at)) < 1
    assert launch(provider, "m-1") == "cost_guard"  # 42 + 60 cents an hour: over $1
    assert aws(provider).terminate(made.instance_id) is None


def test_a_launch_without_an_order_is_routed_by_the_jobs_waiting(
    make_provider, settings, pg_engine, manual_clock
):
    """Ray may launch a node the scheduler did not order (or after its order expired):
    the provider then routes it by the seed's table from the queue's waiting jobs, as
    the policy would: priority 1-3 waiting, on demand even where spot is cheaper."""
    provider = make_provider(
        cloud_providers__aws__spot_enabled=True, cloud_providers__aws__spot_max_price="0.05"
    )
    stack = open_stack(settings, pg_engine, manual_clock)
    person = make_user(stack)
    background = submit(stack, person, ["transcode_video"], priority=8)
    assert launch(provider, "b-1") == "launched"  # only 7-10 waiting: spot, the cheaper
    urgent = submit(stack, person, ["transcode_video"], priority=2)
    assert launch(provider, "u-1") == "launched"  # 1-3 waiting: on demand
    s = t.cloud_spend
    with transaction(provider.engine) as conn:
        spots = conn.execute(select(s.c.spot).order_by(s.c.spend_id)).scalars().all()
    assert spots == [True, False], (background, urgent)
    for instance_id in running(provider):
        assert aws(provider).terminate(instance_id) is None
    stack.close()


class BilledFleet(NoCloud):
    """No scaling: only the provider's drivers' billing, as a `ray up` head's fleet has it."""

    def __init__(self, provider: HypermediaNodeProvider) -> None:
        self.provider = provider

    def billing(self) -> dict[str, Account]:
        return billing.accounts(self.provider.drivers, self.provider.cluster)


def test_an_ended_instances_cost_explorer_bill_is_reconciled_with_its_row(
    make_provider, moto_server, settings, pg_engine
):
    """The whole path on real parts: a launch opens the row under its request id, the
    instance's terminate closes it, and two days later the scheduler reads Cost
    Explorer (boto3 over HTTP to moto, its answer queued) for that day, finds the bill
    by the request tag and compares it with the row."""
    provider = make_provider()
    assert launch(provider, "bill-1") == "launched"
    (node_id,) = provider.non_terminated_nodes({TAG_RAY_NODE_KIND: NODE_KIND_WORKER})
    provider.terminate_node(node_id)
    s = t.cloud_spend
    with transaction(provider.engine) as conn:
        row = conn.execute(select(s)).one()
    assert row.terminated_at is not None and row.request_id and row.instance_id.startswith("i-")
    day = row.terminated_at.strftime("%Y-%m-%d")
    after = (row.terminated_at + timedelta(days=1)).strftime("%Y-%m-%d")
    # The bill: 50 cents on the instance's request tag (its seconds on the ledger are
    # worth a fraction of a cent), 20 on the cluster's resources of no request.
    groups = {row.request_id: "0.50", "": "0.20"}
    queue_cost_results(moto_server, {"ResultsByTime": [cost_day(day, after, groups)]})
    clock = ManualClock(time.time() + 3 * 86_400)  # the day and the instance have settled
    stack = open_stack(settings, pg_engine, clock)
    leadership = Leadership(stack.redis, stack.settings.redis_prefix, "bill", 60)
    loop = Scheduler(
        provider.config, stack.engine, stack.queue, leadership, clock, BilledFleet(provider)
    )
    found = loop.reconcile(clock.now())
    assert [f.subject for f in found] == [f"instance {row.instance_id}", day]
    assert [(round(f.billed_cents, 6)) for f in found] == [50.0, 70.0]
    assert "$0.20 of it on resources the ledger does not know" in found[1].message()
    with transaction(provider.engine) as conn:
        row = conn.execute(select(s)).one()
    assert row.billed_microusd == 500_000 and row.reconciled_at is not None
    stack.close()


@pytest.mark.parametrize("content", [b"", b'{"hm-r1": {"provi', b"[]", b"\xff\xfe"])
def test_a_state_file_cut_short_is_set_aside_and_rebuilt_from_the_listing(make_provider, content):
    """nodes.json and launching.json cut short (a crash before their data reached the
    disk), or not an object: the provider still lists, terminates and launches (it
    raised JSONDecodeError on each, so Ray could stop none of the nodes it pays for);
    the listing adopts the instance again and the unreadable copy is kept beside."""
    provider = make_provider()
    assert launch(provider, "s-1") == "launched"
    (made,) = running(provider)
    (provider.state_dir / "nodes.json").write_bytes(content)
    (provider.state_dir / "launching.json").write_bytes(content)

    (node_id,) = provider.non_terminated_nodes({TAG_RAY_NODE_KIND: NODE_KIND_WORKER})
    assert provider.records()[node_id]["instance_id"] == made
    assert open_rows(provider) == [made]  # counted once, as before
    kept = sorted(p.name.split(".corrupt-")[0] for p in provider.state_dir.glob("*.corrupt-*"))
    assert kept == ["launching.json", "nodes.json"]
    provider.terminate_node(node_id)
    assert running(provider) == [] and open_rows(provider) == []
    assert launch(provider, "s-2") == "launched"
    for instance_id in running(provider):
        assert aws(provider).terminate(instance_id) is None


def test_an_instance_listed_without_a_price_tag_is_counted_at_the_list_price(make_provider):
    """An instance started by hand with only the cluster's and a request tag (or one
    whose price tag was removed) got a row at $0 an hour: the caps never counted it and
    a second launch passed the $1 hourly cap beside it. It is counted at the on-demand
    list price now."""
    provider = make_provider()
    driver = aws(provider)
    tags: list[Any] = [
        {"Key": "hypermedia-cluster", "Value": "hm-ledger"},
        {"Key": "hypermedia-request", "Value": "rbyhand000000000000001"},
    ]
    driver.client.run_instances(
        ImageId=driver.ami_id,
        InstanceType="m5.large",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
    )
    (made,) = running(provider)
    provider.non_terminated_nodes({})
    s = t.cloud_spend
    with transaction(provider.engine) as conn:
        (row,) = conn.execute(select(s).where(s.c.terminated_at.is_(None))).all()
    assert (row.instance_id, row.price_per_hour_microusd) == (made, 600_000)
    assert launch(provider, "p-1") == "cost_guard"  # 60 + 60 cents an hour: over $1
    assert running(provider) == [made]
    assert driver.terminate(made) is None


def test_an_adopted_instance_without_a_launch_time_tag_counts_from_its_launch(
    make_provider, monkeypatch
):
    """An instance started by hand with the cluster's tag (or a launch whose process
    died before tagging it, a tag removed) has no launch time tag: its row opened at the
    moment the provider first listed it, so the two hours it had billed were missing from
    the day's spend and a launch the $1.50 daily cap refuses went through. The row opens
    at EC2's LaunchTime now."""
    provider = make_provider(
        cost_limits__max_hourly_spend_cents=500,
        cost_limits__max_daily_spend_cents=150,
        cost_limits__alert_threshold_cents=100,
    )
    driver = aws(provider)
    tags: list[Any] = [
        {"Key": "hypermedia-cluster", "Value": "hm-ledger"},
        {"Key": "hypermedia-request", "Value": "rbyhand000000000000002"},
    ]
    reply = driver.client.run_instances(
        ImageId=driver.ami_id,
        InstanceType="m5.large",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
    )
    made = reply["Instances"][0]["InstanceId"]
    # The provider's clock at noon yesterday (UTC: one day's spend whatever the time of
    # day), EC2 started the instance two hours before.
    noon = cost_day_start(time.time()) - 12 * 3600
    support.set_moto_launch_time(made, noon - 2 * 3600, REGION)
    monkeypatch.setattr(provider_module, "time", SetClock(noon - time.time()))
    provider.non_terminated_nodes({})
    s = t.cloud_spend
    with transaction(provider.engine) as conn:
        (row,) = conn.execute(select(s).where(s.c.terminated_at.is_(None))).all()
    assert row.instance_id == made
    assert row.launched_at.timestamp() == noon - 2 * 3600
    # 2 h x 60 cents billed, + 2 x 60 cents an hour: over $1.50 (not counting them: 1.20).
    assert launch(provider, "d-1") == "cost_guard"
    assert running(provider) == [made]
    assert driver.terminate(made) is None


@pytest.mark.parametrize(
    ("max_price", "counted", "second"),
    [(None, 600_000, "cost_guard"), ("0.05", 50_000, "launched")],
)
def test_a_spot_instance_counts_at_the_most_it_may_bill_not_its_launch_price(
    make_provider, max_price, counted, second
):
    """A spot instance bills the market price of each moment, which may rise after the
    launch up to its maximum: spot_max_price when set, else the on-demand price (EC2's
    default maximum). Booked at its launch price (moto's m5.large: under a cent an
    hour), five spot instances passed the $1 hourly cap although they may bill $3 an
    hour together. The caps count the maximum now; the launch price stays on the row
    for the bill's reconciliation."""
    changes: dict[str, Any] = {"cloud_providers__aws__spot_enabled": True}
    if max_price is not None:
        changes["cloud_providers__aws__spot_max_price"] = max_price
    provider = make_provider(**changes)
    market = aws(provider).price(True)
    assert isinstance(market, float) and market < 5  # nothing waits: the cheaper, spot
    assert launch(provider, "s-1") == "launched"
    s = t.cloud_spend
    with transaction(provider.engine) as conn:
        (row,) = conn.execute(select(s)).all()
    assert row.spot
    assert row.price_per_hour_microusd == counted
    assert row.quoted_per_hour_microusd == round(market * 10_000)
    with transaction(provider.engine) as conn:  # what the reconciliation expects billed
        (ledger,) = ledger_rows(conn, 0)
    assert ledger.cents_per_hour == pytest.approx(market)
    # 60 + 60 cents an hour at most: over the $1 cap (5 + 5 cents: within it).
    assert launch(provider, "s-2") == second
    for instance_id in running(provider):
        assert aws(provider).terminate(instance_id) is None


def test_an_instance_ended_within_its_first_minute_counts_the_minute_ec2_bills(make_provider):
    """EC2 bills a Linux instance by the second with a 60 s minimum (Google likewise,
    IONOS by the minute): one terminated a few seconds after its launch bills a minute,
    1 cent at 60 cents an hour, while the ledger counted its seconds (0.05 cents), so a
    fleet relaunched within the launch-rate cap billed more than the caps saw."""
    provider = make_provider()
    assert launch(provider, "q-1") == "launched"
    ((node_id, record),) = provider.records().items()
    provider._delete(node_id, record)
    assert running(provider) == [] and open_rows(provider) == []
    with transaction(provider.engine) as conn:
        spent = ledger_spend(conn, time.time(), False, False)
    assert spent.today_cents >= 1.0
    assert spent.last_hour_cents >= 1.0


class SetClock:
    """The provider's ``time`` module, ``offset`` seconds from the real clock."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def time(self) -> float:
        return time.time() + self.offset


def test_a_clock_set_back_does_not_forget_the_days_spend(make_provider, monkeypatch):
    """The ledger prices time by the clock: set back two hours, the 50 cents an instance
    had cost today read as nothing, and a launch the daily cap had refused went
    through. Launches wait for the clock to pass the last launch now."""
    provider = make_provider(
        cost_limits__max_hourly_spend_cents=500,
        cost_limits__max_daily_spend_cents=150,
        cost_limits__alert_threshold_cents=100,
    )
    # From noon: 50 minutes on from the real time of day crossed midnight UTC, where the
    # day's spend starts again, in a run at 23:19.
    noon = cost_day_start(time.time()) + 12 * 3600 - time.time()
    monkeypatch.setattr(provider_module, "time", SetClock(noon))
    assert launch(provider, "k-1") == "launched"
    monkeypatch.setattr(provider_module, "time", SetClock(noon + 50 * 60))  # 50 minutes on
    assert launch(provider, "k-2") == "cost_guard"  # 50 + 2 x 60 cents: over $1.50
    monkeypatch.setattr(provider_module, "time", SetClock(noon + 50 * 60 - 2 * 3600))  # back
    with pytest.raises(NodeLaunchException, match=r"the clock is 4,\d{3} s behind the last"):
        provider.create_node_with_resources_and_labels(
            {}, {**WORKER, TAG_RAY_LAUNCH_REQUEST: "k-3"}, 1, RESOURCES, {}
        )
    assert len(running(provider)) == 1
    for instance_id in running(provider):
        assert aws(provider).terminate(instance_id) is None


def test_a_launch_asked_again_is_the_same_instance_counted_once(make_provider):
    """Ray asking again for a launch it asked for (the same launch request), here from
    the cluster's other provider object: the driver answers the instance it made, and
    the ledger keeps one row. It raised UniqueViolation on uk_spend_instance before and
    left a second open row under the request id, counting the instance twice for as
    long as it ran."""
    caps = {"cost_limits__max_hourly_spend_cents": 500}
    tags = {**WORKER, TAG_RAY_LAUNCH_REQUEST: "again"}
    first = make_provider(**caps).create_node_with_resources_and_labels({}, tags, 1, RESOURCES, {})
    other = make_provider(**caps)
    again = other.create_node_with_resources_and_labels({}, tags, 1, RESOURCES, {})
    assert first is not None and again is not None
    assert {k: i.instance_id for k, i in again.items()} == {
        k: i.instance_id for k, i in first.items()
    }
    (made,) = running(other)
    assert open_rows(other) == [made]
    other.non_terminated_nodes({})
    assert open_rows(other) == [made]
    assert aws(other).terminate(made) is None


def a_turn(provider: HypermediaNodeProvider, stack: Any, at: float) -> None:
    """One evaluation of the scheduler (its leader) at ``at``: what a running loop does
    every interval, recording its turn."""
    leadership = Leadership(stack.redis, stack.settings.redis_prefix, "loop", 60)
    Scheduler(provider.config, stack.engine, stack.queue, leadership, ManualClock(at)).evaluate()


BACKSTOP_CAPS = {
    "cost_limits__max_hourly_spend_cents": 500,
    "cost_limits__max_daily_spend_cents": 100,
    "cost_limits__alert_threshold_cents": 80,
}


def test_the_provider_stops_the_cloud_at_the_daily_cap_when_the_scheduler_has_stopped(
    make_provider, monkeypatch, settings, pg_engine
):
    """Only the scheduler drained and terminated cloud workers at the daily cap; the
    provider only refused launches. With the scheduler dead or hung, a busy node (never
    idle to Ray) ran on past the cap for as long as nobody looked. The provider, in
    Ray's monitor, now terminates them itself when the cap is reached and the scheduler
    has not evaluated for ``scheduler_stale_seconds``; it says so in a decision, the
    log, and the cost lock that `scheduler status` shows."""
    noon = cost_day_start(time.time()) + 12 * 3600  # the day's spend stays within one day
    monkeypatch.setattr(provider_module, "time", SetClock(noon - time.time()))
    provider = make_provider(**BACKSTOP_CAPS)
    stack = open_stack(settings, pg_engine, ManualClock(noon))
    a_turn(provider, stack, noon)  # the scheduler ran, then stopped
    assert launch(provider, "cap-1") == "launched"
    (made,) = running(provider)

    # Two hours at 60 cents: $1.20 today, past the $1 daily cap; the scheduler's last
    # turn was two hours ago. A listing stops the instance and closes its row.
    monkeypatch.setattr(provider_module, "time", SetClock(noon + 2 * 3600 - time.time()))
    assert provider.non_terminated_nodes({TAG_RAY_NODE_KIND: NODE_KIND_WORKER}) == []
    assert running(provider) == [] and open_rows(provider) == []
    with transaction(provider.engine) as conn:
        (row,) = conn.execute(
            select(t.scheduler_decisions).where(t.scheduler_decisions.c.action == "terminate")
        ).all()
        lock = conn.execute(
            select(t.scheduler_state.c.value).where(t.scheduler_state.c.name == "cost_lock")
        ).scalar_one()
    assert row.applied and row.details["source"] == "node_provider"
    assert row.details["instance_id"] == made
    assert row.reason.startswith("Daily cloud spend cap $1.00 reached: $1.20 today"), row.reason
    assert "The scheduler's last turn was 2h 00m ago (stale after 300 s)" in row.reason
    assert lock["reason"] in row.reason
    assert launch(provider, "cap-2") == "cost_guard"  # locked until the reset
    stack.close()


def test_the_provider_leaves_the_cap_to_a_scheduler_that_is_running(
    make_provider, monkeypatch, settings, pg_engine
):
    """The scheduler drains its cloud workers at the cap (their jobs finish or go back
    first): while it evaluates, the provider terminates nothing; once its turns stop
    for ``scheduler_stale_seconds``, the next check (at most one every
    BACKSTOP_CHECK_SECONDS) does."""
    noon = cost_day_start(time.time()) + 12 * 3600
    monkeypatch.setattr(provider_module, "time", SetClock(noon - time.time()))
    provider = make_provider(**BACKSTOP_CAPS)
    stack = open_stack(settings, pg_engine, ManualClock(noon))
    assert launch(provider, "alive-1") == "launched"
    (made,) = running(provider)

    later = noon + 2 * 3600
    a_turn(provider, stack, later - 60)  # a minute ago: it locked, and drains the workers
    monkeypatch.setattr(provider_module, "time", SetClock(later - time.time()))
    (node_id,) = provider.non_terminated_nodes({TAG_RAY_NODE_KIND: NODE_KIND_WORKER})
    assert running(provider) == [made] and open_rows(provider) == [made]

    # Still within the stale time (300 s) of its last turn: nothing, however often Ray lists.
    monkeypatch.setattr(provider_module, "time", SetClock(later + 200 - time.time()))
    assert provider.non_terminated_nodes({}) == [node_id]
    # Past it, but within BACKSTOP_CHECK_SECONDS of the last check: not checked yet.
    monkeypatch.setattr(provider_module, "time", SetClock(later + 250 - time.time()))
    assert provider.non_terminated_nodes({}) == [node_id]
    assert running(provider) == [made]
    monkeypatch.setattr(provider_module, "time", SetClock(later + 300 - time.time()))
    assert provider.non_terminated_nodes({}) == []
    assert running(provider) == []
    with transaction(provider.engine) as conn:
        actions = conn.execute(select(t.scheduler_decisions.c.action)).scalars().all()
    assert actions.count("terminate") == 1
    stack.close()
