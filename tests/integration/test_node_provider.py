"""The node provider on a real PostgreSQL, with the local driver starting real Ray nodes.

What Ray's autoscaler asks of it (create, list, tags, terminate) and what it refuses:
every refusal raises NodeLaunchException with the reason, is written to the decision
log once (Ray v2 asks again every few seconds), and launches nothing; concurrent
launches never pass max_instances together; terminate drains first and closes the
ledger; a second provider object (``ray up`` and the monitor each build one) sees the
same nodes.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from ray.autoscaler.node_launch_exception import NodeLaunchException
from ray.autoscaler.tags import (
    NODE_KIND_HEAD,
    NODE_KIND_WORKER,
    TAG_RAY_LAUNCH_CONFIG,
    TAG_RAY_LAUNCH_REQUEST,
    TAG_RAY_NODE_KIND,
    TAG_RAY_USER_NODE_TYPE,
)
from sqlalchemy import select

from autoscaler import billing, cost, orders, policy, raynodes
from autoscaler.drivers.base import DriverError
from autoscaler.provider import HypermediaNodeProvider, record_vps_node
from autoscaler.rayfleet import RayFleet, ordered_workers
from autoscaler.scheduler import ledger_rows
from autoscaler.snapshot import QueueState, Snapshot, Spend
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.errors import ConfigError
from hypermedia.worker import cluster
from tests.conftest import RAY_TOKEN
from tests.factories import add_worker_row

WORKER = {TAG_RAY_NODE_KIND: NODE_KIND_WORKER, TAG_RAY_USER_NODE_TYPE: "burst_media"}
RESOURCES = {"queue_media": 1.0}


def scheduler_json(tmp_path: Path, **changes: Any) -> Path:
    data = json.loads(
        (Path(__file__).parents[2] / "ray_cluster" / "scheduler.local.json").read_text()
    )
    changes = {"scaling_rules__scale_down__drain_timeout_seconds": 20, **changes}
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = data
        for part in parents:
            node = node[part]
        node[last] = value
    path = tmp_path / f"scheduler-{len(list(tmp_path.glob('scheduler-*')))}.json"
    path.write_text(json.dumps(data))
    return path


def provider_config(
    tmp_path: Path, database_url: str, scheduler: Path, **extra: Any
) -> dict[str, Any]:
    return {
        "type": "external",
        "module": "autoscaler.provider.HypermediaNodeProvider",
        "head_ip": "127.0.0.10",
        "ray_port": 6390,
        "state_dir": str(tmp_path / "state"),
        "scheduler_config": str(scheduler),
        "database_url": database_url,
        "token_path": str(RAY_TOKEN),
        "drivers": {"aws": {"type": "local", "on_demand_cents_per_hour": 17}},
        **extra,
    }


@pytest.fixture
def make_provider(tmp_path, pg_database_url):
    made: list[HypermediaNodeProvider] = []

    def make(scheduler: Path | None = None, **extra: Any) -> HypermediaNodeProvider:
        config = provider_config(
            tmp_path, pg_database_url, scheduler or scheduler_json(tmp_path), **extra
        )
        provider = HypermediaNodeProvider(config, "hm-it")
        made.append(provider)
        return provider

    yield make
    for provider in made:  # nothing launched outlives the test
        for node_id in provider.non_terminated_nodes({TAG_RAY_NODE_KIND: NODE_KIND_WORKER}):
            record = provider.records()[node_id]
            provider.drivers[record["provider"]].terminate(record["instance_id"])


def decisions(provider: HypermediaNodeProvider) -> list[Any]:
    with transaction(provider.engine) as conn:
        return list(conn.execute(select(t.scheduler_decisions)))


def ledger(provider: HypermediaNodeProvider) -> list[Any]:
    with transaction(provider.engine) as conn:
        return list(conn.execute(select(t.cloud_spend).order_by(t.cloud_spend.c.spend_id)))


def refused(provider: HypermediaNodeProvider, times: int = 5) -> list[str]:
    """Ask as Ray v2 does (again every update); the reasons it raised."""
    reasons = []
    for n in range(times):
        with pytest.raises(NodeLaunchException) as caught:
            provider.create_node_with_resources_and_labels(
                {}, {**WORKER, TAG_RAY_LAUNCH_REQUEST: f"req-{n}"}, 1, RESOURCES, {}
            )
        assert caught.value.category == "cost_guard"
        reasons.append(caught.value.description)
    return reasons


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"mode": "vps_only"}, "mode is vps_only"),
        ({"queues__media__cloud_enabled": False}, "media is not cloud-enabled"),
        ({"queues__media__max_workers": 0}, "media has 0 workers, at max_workers (0)"),
    ],
)
def test_a_launch_the_rules_forbid_is_refused_once_logged_and_never_launched(
    tmp_path, make_provider, changes, why
):
    provider = make_provider(scheduler_json(tmp_path, **changes))
    reasons = refused(provider)
    assert all(why in reason for reason in reasons), reasons
    rows = decisions(provider)
    assert len(rows) == 1, rows  # Ray asked 5 times: one line in the log
    assert rows[0].action == "hold" and why in rows[0].reason and rows[0].queue == "media"
    assert rows[0].details["source"] == "node_provider"
    assert ledger(provider) == []
    assert provider.non_terminated_nodes({TAG_RAY_NODE_KIND: NODE_KIND_WORKER}) == []


def launch_outcome(provider: HypermediaNodeProvider, request: str) -> str:
    """What one launch came to: the refusal's reason, or how the launch itself failed."""
    with pytest.raises(NodeLaunchException) as caught:  # no token: every boot fails
        provider.create_node_with_resources_and_labels(
            {}, {**WORKER, TAG_RAY_LAUNCH_REQUEST: request}, 1, RESOURCES, {}
        )
    return caught.value.description if caught.value.category == "cost_guard" else "launched"


def add_instance(
    provider: HypermediaNodeProvider,
    instance_id: str,
    cents_per_hour: float,
    launched_ago: timedelta,
    stopped_ago: timedelta | None = None,
) -> None:
    """A burst_media instance on AWS in the ledger (running unless ``stopped_ago``)."""
    now = datetime.now(UTC)
    with transaction(provider.engine) as conn:
        conn.execute(
            t.cloud_spend.insert().values(
                provider="aws",
                instance_id=instance_id,
                node_type="burst_media",
                region="local",
                spot=False,
                price_per_hour_microusd=cost.to_microusd(cents_per_hour),
                launched_at=now - launched_ago,
                terminated_at=None if stopped_ago is None else now - stopped_ago,
            )
        )


def add_worker(provider: HypermediaNodeProvider, worker_id: str, node_id: str | None) -> None:
    add_worker_row(
        provider.engine,
        worker_id,
        at=datetime.now(UTC),
        queue="media",
        node_id=node_id,
        hostname="vps",
    )


def test_max_workers_counts_the_queues_workers_as_the_policy_does(tmp_path, make_provider):
    """The policy's rule (autoscaler.admission): every worker of the queue not yet
    terminated counts against max_workers, VPS and cloud, and the baseline is not
    subtracted on top. Its VPS workers are the workers rows on the head's Ray node (or
    outside Ray); an actor on a burst node counts with its node, through the ledger."""
    provider = make_provider(
        scheduler_json(tmp_path, queues__media__baseline_workers=1, queues__media__max_workers=2),
        token_path=str(tmp_path / "no-token"),
    )
    add_instance(provider, "i-burst", 17.0, timedelta(minutes=20))  # the queue's, running
    record_vps_node(provider.engine, "ray-head", time.time())
    add_worker(provider, "media-on-burst", "ray-burst")  # the instance's actor
    # 1 worker of 2 (max_workers - baseline - burst would say 0 and refuse).
    assert launch_outcome(provider, "m-1") == "launched"
    add_worker(provider, "media-on-vps", "ray-head")
    assert "media has 2 workers, at max_workers (2)" in launch_outcome(provider, "m-2")
    with transaction(provider.engine) as conn:  # the VPS worker stopped: room again
        w = t.workers
        conn.execute(w.update().where(w.c.worker_id == "media-on-vps").values(status="stopped"))
    assert launch_outcome(provider, "m-4") == "launched"


def test_the_cost_caps_and_the_lock_refuse_with_their_reason(make_provider):
    provider = make_provider()
    # an hour at $2: over the $1 hourly cap
    add_instance(provider, "i-old", 200.0, timedelta(minutes=61), timedelta(minutes=1))
    now = datetime.now(UTC)
    assert "is at the $1.00 cap: no new instances" in refused(provider, 1)[0]
    with transaction(provider.engine) as conn:
        conn.execute(
            t.scheduler_state.insert().values(
                name="cost_lock", value={"at": time.time(), "reason": "test"}, updated_at=now
            )
        )
    assert "locked to vps_only by the daily cost cap" in refused(provider, 1)[0]
    assert len(decisions(provider)) == 2


def test_the_launch_rate_cap_stops_a_relaunch_loop(tmp_path, make_provider):
    """Nodes that die at start-up are not relaunched forever (v1 relaunched 69 in 110 s)."""
    provider = make_provider(
        scheduler_json(tmp_path, queues__media__max_workers=5),
        token_path=str(tmp_path / "no-token"),  # every boot fails at once
    )
    attempts = []
    for n in range(6):
        try:
            provider.create_node_with_resources_and_labels(
                {}, {**WORKER, TAG_RAY_LAUNCH_REQUEST: f"loop-{n}"}, 1, RESOURCES, {}
            )
        except NodeLaunchException as exc:
            attempts.append((exc.category, exc.description))
    categories = [category for category, _ in attempts]
    assert categories[:2] == ["unavailable", "unavailable"], attempts  # boot failed, twice
    assert set(categories[2:]) == {"cost_guard"}
    assert all("launch-rate cap" in why for _, why in attempts[2:])
    assert len(ledger(provider)) == 2 and all(row.terminated_at for row in ledger(provider))


def test_concurrent_launches_never_pass_max_instances_together(tmp_path, make_provider):
    provider = make_provider(
        scheduler_json(
            tmp_path, cloud_providers__aws__max_instances=2, queues__media__max_workers=5
        ),
        token_path=str(tmp_path / "no-token"),
    )
    outcomes: list[str] = []

    def launch(n: int) -> None:
        try:
            provider.create_node_with_resources_and_labels(
                {}, {**WORKER, TAG_RAY_LAUNCH_REQUEST: f"c-{n}"}, 1, RESOURCES, {}
            )
            outcomes.append("launched")
        except NodeLaunchException as exc:
            outcomes.append(exc.category)

    threads = [threading.Thread(target=launch, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    # The boots fail (no token), but only two launches were let through the guard.
    assert sorted(outcomes).count("cost_guard") == 2, outcomes
    assert len(ledger(provider)) == 2


@pytest.mark.parametrize(
    ("max_price", "spot", "counted"), [("1.50", False, 17), ("0.50", True, 50)]
)
def test_a_spot_maximum_over_the_cap_launches_the_on_demand_instance_that_fits(
    tmp_path, make_provider, max_price, spot, counted
):
    """Spot at 4 c/h, on demand at 17 c/h, the $1 hourly cap. The provider counts a
    spot launch at its spot_max_price: at $1.50 it passes the cap, and the policy chose
    spot (the cheaper at its market price), the provider refused it and launched
    nothing, though the on-demand instance fits. Both now take the cheapest the caps
    allow: on demand, by the scheduler's order and by Ray's own launch; at $0.50 spot
    still fits and wins."""
    scheduler = scheduler_json(
        tmp_path,
        cloud_providers__aws__spot_enabled=True,
        cloud_providers__aws__spot_max_price=max_price,
    )
    provider = make_provider(
        scheduler,
        token_path=str(tmp_path / "no-token"),  # the boots fail at once: only the choice counts
        drivers={
            "aws": {"type": "local", "on_demand_cents_per_hour": 17, "spot_cents_per_hour": 4}
        },
    )
    # Ray's own launch, without an order: routed as the policy routes it.
    assert launch_outcome(provider, "unordered") == "launched"
    # The scheduler's turn on the provider's prices: its plan, and the order it leaves.
    now = time.time()
    snapshot = Snapshot(
        now=now,
        queues={"media": QueueState("media", depth=5)},
        workers=(),
        offers=provider.offers(),
        spend=Spend(0.0, 0.0),
    )
    [planned] = [d for d in policy.decide(provider.config, snapshot) if d.action == "launch"]
    assert (planned.provider, planned.spot) == ("aws", spot)
    order = orders.Order("media", "aws", planned.spot, planned.cents_per_hour, "test", 1, now)
    with transaction(provider.engine) as conn:
        orders.place(conn, [order], now)
    assert launch_outcome(provider, "ordered") == "launched"
    with transaction(provider.engine) as conn:
        assert orders.pending(conn, time.time()) == []  # taken
    rows = ledger(provider)
    assert [(r.spot, r.price_per_hour_microusd) for r in rows] == [
        (spot, cost.to_microusd(counted))
    ] * 2
    assert [r.quoted_per_hour_microusd for r in rows] == [40_000 if spot else None] * 2
    assert not [d for d in decisions(provider) if d.action == "hold"]  # nothing refused


def test_a_spot_order_not_launched_yet_counts_at_what_the_provider_books(tmp_path, make_provider):
    """The scheduler counts the workers it ordered, not yet launched, against the caps
    of its next turn. A spot order at 4 c/h counted so (the provider books it at its
    60 c/h spot_max_price) left 96 c/h of the $1 hourly cap in that turn's view: it
    ordered a second spot worker the provider would refuse (120 c/h), where the
    on-demand one (77 c/h) fits."""
    scheduler = scheduler_json(
        tmp_path,
        cloud_providers__aws__spot_enabled=True,
        cloud_providers__aws__spot_max_price="0.60",
    )
    provider = make_provider(
        scheduler,
        token_path=str(tmp_path / "no-token"),  # the boot fails at once: only the booking counts
        drivers={
            "aws": {"type": "local", "on_demand_cents_per_hour": 17, "spot_cents_per_hour": 4}
        },
    )
    now = time.time()
    with transaction(provider.engine) as conn:  # the last turn's order: spot, at its market price
        orders.place(conn, [orders.Order("media", "aws", True, 4.0, "test", 1, now)], now)
        waiting = orders.pending(conn, now)
    ordered = ordered_workers(provider, waiting)
    assert [(w.status, w.spot, w.cost_per_hour_cents) for w in ordered] == [("starting", True, 60)]
    snapshot = Snapshot(
        now=now,
        queues={"media": QueueState("media", depth=30)},  # 2 burst workers wanted
        workers=tuple(ordered),
        offers=provider.offers(),
        spend=Spend(0.0, 0.0),
    )
    [planned] = [d for d in policy.decide(provider.config, snapshot) if d.action == "launch"]
    assert (planned.provider, planned.spot, planned.count) == ("aws", False, 1)
    # The provider books the ordered launch at what the scheduler counted.
    assert launch_outcome(provider, "ordered") == "launched"
    (row,) = ledger(provider)
    assert (row.spot, row.price_per_hour_microusd) == (True, cost.to_microusd(60))


def test_bad_provider_sections_stop_ray_up_naming_the_key(tmp_path, pg_database_url):
    good = provider_config(tmp_path, pg_database_url, scheduler_json(tmp_path))
    cases: list[tuple[dict[str, Any], str]] = [
        ({"surprise": 1}, "provider.surprise"),
        ({"ray_port": 6379}, "provider.ray_port"),
        ({"head_ip": None}, "provider.head_ip"),
        ({"drivers": {"gcp": {"type": "local"}}}, "provider.drivers.gcp"),
        # moved to scheduler.json: one drain timeout for the policy and the provider
        ({"drain_timeout_seconds": 60}, "provider.drain_timeout_seconds"),
        ({"scheduler_stale_seconds": 30}, "provider.scheduler_stale_seconds"),
        # Ray copies the section into files others may read: no secret in it.
        ({"database_url": "postgresql://hm:s3cr3t@db/hm"}, "provider.database_url"),
        ({"database_url": "postgresql://hm@db/hm?password=s3cr3t"}, "provider.database_url"),
        (
            {"drivers": {"aws": {"type": "aws", "aws_secret_access_key": "s3cr3t"}}},
            "provider.drivers.aws.aws_secret_access_key",
        ),
    ]
    for broken, key in cases:
        config = {"provider": {**copy.deepcopy(good), **broken}}
        with pytest.raises(ConfigError) as caught:
            HypermediaNodeProvider.bootstrap_config(config)
        assert caught.value.key.startswith(key), (broken, caught.value.key)
        assert "s3cr3t" not in str(caught.value)
    # The daily cap's backstop may not act between a running scheduler's turns.
    slow = str(scheduler_json(tmp_path, evaluation_interval_seconds=120))
    with pytest.raises(ConfigError, match=r"less than 3 of scheduler\.json's evaluation") as stale:
        HypermediaNodeProvider.bootstrap_config(
            {
                "provider": {
                    **copy.deepcopy(good),
                    "scheduler_config": slow,
                    "scheduler_stale_seconds": 300,
                }
            }
        )
    assert stale.value.key == "provider.scheduler_stale_seconds"
    slow_config = {**copy.deepcopy(good), "scheduler_config": slow}
    assert HypermediaNodeProvider(slow_config, "hm-it").stale_seconds == 600  # 5 intervals
    assert HypermediaNodeProvider(good, "hm-it").stale_seconds == 300
    bad_json = tmp_path / "bad.json"
    bad_json.write_text('{"mode": "sometimes"}')
    with pytest.raises(ConfigError):
        HypermediaNodeProvider.bootstrap_config(
            {"provider": {**copy.deepcopy(good), "scheduler_config": str(bad_json)}}
        )
    # A queue the settings lack (the head's services would start Ray and the actors,
    # then refuse): `ray up` stops first, naming the file and the queue.
    other_queue = tmp_path / "other-queue.json"
    data = json.loads((Path(__file__).parents[2] / "etc" / "scheduler.json").read_text())
    data["queues"]["thumbs"] = {"baseline_workers": 1, "max_workers": 1}
    other_queue.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as caught:
        HypermediaNodeProvider.bootstrap_config(
            {"provider": {**copy.deepcopy(good), "scheduler_config": str(other_queue)}}
        )
    assert caught.value.key == f"{other_queue}: queues.thumbs"
    # Node types: one queue each, a queue scheduler.json knows, one node type a queue
    # (the provider counts a queue's cloud workers by its node type).
    head = {"resources": {"queue_images": 1, "queue_documents": 1}, "max_workers": 0}
    for node_types, key, words in [
        ({"burst": {"resources": {"CPU": 2}}}, "burst", "exactly one queue_<name> (none)"),
        ({"burst": {"resources": {"queue_ocr": 1, "queue_media": 1}}}, "burst", "exactly one"),
        ({"burst": {"resources": {"queue_imagez": 1}}}, "burst", "no queue 'imagez'"),
        (
            {
                "a_media": {"resources": {"queue_media": 1}},
                "b_media": {"resources": {"queue_media": 1}},
            },
            "b_media",
            "served by node type 'a_media' already",
        ),
    ]:
        cluster_yaml: dict[str, Any] = {
            "provider": copy.deepcopy(good),
            "head_node_type": "head",
            "available_node_types": {"head": head, **node_types},
        }
        with pytest.raises(ConfigError) as caught:
            HypermediaNodeProvider.bootstrap_config(cluster_yaml)
        assert caught.value.key == f"available_node_types.{key}.resources", node_types
        assert words in str(caught.value), caught.value
    fine: dict[str, Any] = {
        "provider": copy.deepcopy(good),
        "head_node_type": "head",
        "available_node_types": {"head": head, "burst_media": {"resources": {"queue_media": 1}}},
    }
    HypermediaNodeProvider.bootstrap_config(fine)
    # The head's queue_<name> slots are scheduler.json's VPS pools (head_resources): a
    # yaml may leave them out, or say the same; other numbers stop `ray up`. media is
    # cloud-enabled (hybrid): without a node type its bursts would find none.
    bare = {"resources": {"CPU": 2}, "max_workers": 0}
    for head_type, others, key, words in [
        (
            {"resources": {"queue_images": 2, "queue_documents": 1}},
            {"burst_media": {"resources": {"queue_media": 1}}},
            "available_node_types.head.resources",
            "(mode hybrid: queue_documents: 1, queue_images: 1); leave queue_<name> out",
        ),
        (bare, {}, "available_node_types", "no node type serves queue_media"),
    ]:
        cluster_yaml = {
            "provider": copy.deepcopy(good),
            "head_node_type": "head",
            "available_node_types": {"head": head_type, **others},
        }
        with pytest.raises(ConfigError) as caught:
            HypermediaNodeProvider.bootstrap_config(cluster_yaml)
        assert caught.value.key == key, caught.value
        assert words in str(caught.value), caught.value
    fine["available_node_types"]["head"] = bare
    HypermediaNodeProvider.bootstrap_config(fine)
    # cloud_first with media's baseline of 2: one of them is the head's
    cloud_first = scheduler_json(tmp_path, mode="cloud_first", queues__media__baseline_workers=2)
    fine["provider"]["scheduler_config"] = str(cloud_first)
    fine["available_node_types"]["head"] = {
        "resources": {"queue_images": 1, "queue_documents": 1, "queue_media": 1}
    }
    HypermediaNodeProvider.bootstrap_config(fine)
    fine["available_node_types"]["head"] = {
        "resources": {"queue_images": 1, "queue_documents": 1, "queue_media": 2}
    }
    with pytest.raises(ConfigError, match=r"mode cloud_first: .*queue_media: 1"):
        HypermediaNodeProvider.bootstrap_config(fine)
    relative = {"provider": {**copy.deepcopy(good), "scheduler_config": "ray_cluster/x.json"}}
    with pytest.raises(ConfigError):  # made absolute, then found missing
        HypermediaNodeProvider.bootstrap_config(relative)
    assert Path(relative["provider"]["scheduler_config"]).is_absolute()


def test_launch_list_adopt_and_terminate_a_real_node(tmp_path, make_provider):
    """One real node's whole life through the provider, and two facts of its launch
    (folded here from two tests that each started a head and a node of their own):

    - A node listed while it launches keeps its launch tags. Autoscaler v1 lists nodes
      (another thread) while create_node runs, and the head's services list them every
      scheduler turn (another process): an instance the driver already lists but the
      provider has not recorded yet must carry the tags it is being launched with, or v1
      finds no launch hash and terminates it as "outdated".
    - A launch under way counts once while the cloud lists its instance. An ordered
      launch whose instance the cloud already lists (the head services' listing adopts it
      before create_node returns) counted twice in the scheduler's fleet: the node's
      record and its order, still held until the launch ends. Under a manual burst of 1
      (`ray up` of local.yaml, whose local instances boot for seconds) the turns in
      between drained the order ("Scaling down worker order-...: media empty") and its
      caps counted the launch twice."""
    # The head's Ray where a `ray up` head's is: in the state dir's short temp dir.
    head = cluster.start_head(
        tmp_path / "state",
        resources={},
        token_path=RAY_TOKEN,
        num_cpus=1,
        node_ip="127.0.0.10",
        metrics=False,  # nobody scrapes it: no Ray agents (~1.2 CPU-s)
    )
    try:
        scheduler = scheduler_json(tmp_path, cloud_providers__aws__spot_enabled=True)
        port = int(head.address.rsplit(":", 1)[1])
        provider = make_provider(scheduler, ray_port=port)
        provider.create_node({}, {TAG_RAY_NODE_KIND: NODE_KIND_HEAD}, 1)  # ray up's head
        assert provider.non_terminated_nodes({TAG_RAY_NODE_KIND: NODE_KIND_HEAD}) == ["hm-it-head"]
        assert provider.internal_ip("hm-it-head") == "127.0.0.10"

        # While the driver boots the node, the head services' provider object lists it
        # first, then v1's, and the scheduler's fleet (on the services' object) counts it.
        services = make_provider(scheduler, ray_port=port)
        fleet = RayFleet.__new__(RayFleet)  # cloud_workers reads the provider, the record
        fleet.config, fleet.provider, fleet.engine = services.config, services, services.engine
        driver = provider.drivers["aws"]
        launch = driver.launch
        seen: list[dict[str, str]] = []
        during: list[list[str]] = []

        def launch_then_list(request: Any) -> Any:
            result = launch(request)  # the instance exists: the driver lists it from now on
            node_id = f"hm-{request.request_id}"
            assert node_id in services.records({TAG_RAY_NODE_KIND: NODE_KIND_WORKER})
            assert node_id in provider.non_terminated_nodes({TAG_RAY_NODE_KIND: NODE_KIND_WORKER})
            seen.append(provider.node_tags(node_id))
            during.append([w.worker_id for w in fleet.cloud_workers(time.time(), [])])
            return result

        driver.launch = launch_then_list
        # The scheduler ordered a spot worker: the provider takes that order.
        with transaction(provider.engine) as conn:
            orders.place(
                conn, [orders.Order("media", "aws", True, 6.0, "test", 1, time.time())], time.time()
            )
        tags = {**WORKER, TAG_RAY_LAUNCH_REQUEST: "real-1", TAG_RAY_LAUNCH_CONFIG: "hash-1"}
        created = provider.create_node_with_resources_and_labels({}, tags, 1, RESOURCES, {})
        assert created is not None
        (node_id,) = created
        assert seen and seen[0][TAG_RAY_LAUNCH_CONFIG] == "hash-1"
        assert provider.node_tags(node_id)[TAG_RAY_LAUNCH_CONFIG] == "hash-1"
        assert during == [[node_id]]  # the node alone, not its order beside it
        assert [w.worker_id for w in fleet.cloud_workers(time.time(), [])] == [node_id]
        assert provider.non_terminated_nodes({TAG_RAY_NODE_KIND: NODE_KIND_WORKER}) == [node_id]
        assert provider.node_tags(node_id)[TAG_RAY_USER_NODE_TYPE] == "burst_media"
        assert provider.internal_ip(node_id) == "127.0.0.11"
        joined = raynodes.alive_node(head.address, node_id)
        assert joined is not None and joined.node_type == "burst_media"
        (row,) = ledger(provider)
        # Counted at the most a spot instance may bill (the 17-cent on-demand price),
        # the 6-cent order quoted for the bill's reconciliation.
        assert (row.provider, row.spot, row.price_per_hour_microusd) == ("aws", True, 170_000)
        assert row.quoted_per_hour_microusd == 60_000
        assert row.terminated_at is None
        with transaction(provider.engine) as conn:
            assert orders.pending(conn, time.time()) == []  # taken

        # ray up's provider object and the monitor's are two: the other one sees it.
        other = make_provider(scheduler, ray_port=int(head.address.rsplit(":", 1)[1]))
        assert other.non_terminated_nodes({TAG_RAY_NODE_KIND: NODE_KIND_WORKER}) == [node_id]
        other.set_node_tags(node_id, {"ray-node-status": "up-to-date"})
        assert provider.node_tags(node_id)["ray-node-status"] == "up-to-date"

        # Terminate drains a live node first, then deletes it and closes the ledger.
        provider.terminate_node(node_id)
        assert raynodes.alive_node(head.address, node_id) is None
        assert provider.non_terminated_nodes({}) == ["hm-it-head"]
        (row,) = ledger(provider)
        assert row.terminated_at is not None
        # The row kept its launch's request id; the driver's bill names the instance by
        # both and agrees with the ledger (billing.compare: no finding).
        assert row.request_id and row.instance_id == f"lc-{row.request_id}"
        (account,) = billing.accounts(provider.drivers, provider.cluster).values()
        with transaction(provider.engine) as conn:
            (settled,) = ledger_rows(conn, time.time() - 3600)
        first, last = billing.window([settled], [])
        charges = account.read(first, last)
        assert not isinstance(charges, DriverError)
        assert [(c.request_id, c.instance_id) for c in charges] == [
            (row.request_id, row.instance_id)
        ]
        outcome = billing.compare("aws", [settled], charges, [settled], [], time.time())
        assert outcome.findings == () and outcome.billed[settled.spend_id] > 0
        # ray down: the VPS itself is not deleted, but its Ray head is stopped even when
        # `ray down`'s own `ray stop` on the head did not run (it swallows why).
        assert head.is_running()
        provider.terminate_node("hm-it-head")
        assert provider.non_terminated_nodes({}) == []
        assert not head.is_running(), [p.cmdline() for p in head.processes()]
    finally:
        head.stop()
