"""The scheduling policy, rule by rule and edge by edge (seed 000, "Scaling Logic")."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any

import pytest

from autoscaler import config as scheduler_config
from autoscaler import policy
from autoscaler.config import SchedulerConfig
from autoscaler.snapshot import (
    Decision,
    History,
    ManualBurst,
    Offer,
    QueueState,
    Snapshot,
    Spend,
    WorkerState,
)

NOW = 1_800_000_000.0
SHIPPED = json.loads(scheduler_config.SHIPPED.read_text())
# aws: on-demand $0.17/h, spot $0.04/h (under its $0.05 spot_max_price); google: $0.20/$0.03.
OFFERS = {"aws": Offer("aws", 17.0, 4.0), "google": Offer("google", 20.0, 3.0)}


def make_config(mode: str = "hybrid", **changes: Any) -> SchedulerConfig:
    """The shipped file with AWS and Google enabled and OCR (max 10) bursting to either.
    ``changes``: dotted paths (``queues__ocr__max_workers=3``) to values."""
    data: dict[str, Any] = copy.deepcopy(SHIPPED)
    data["mode"] = mode
    data["cloud_providers"]["aws"].update(enabled=True, ami_id="ami-0123456789abcdef0")
    data["cloud_providers"]["google"].update(enabled=True, image="projects/p/global/images/w")
    data["queues"]["ocr"].update(cloud_enabled=True, max_workers=10)
    data["queues"]["bulk"].update(cloud_enabled=True)
    for path, value in changes.items():
        *parents, last = path.split("__")
        node = data
        for part in parents:
            node = node[part]
        node[last] = value
    return scheduler_config.parse(data)


def queue(
    name: str = "ocr",
    depth: int = 0,
    oldest: float = 0.0,
    bands: dict[str, int] | None = None,
    long_jobs: int = 0,
) -> QueueState:
    return QueueState(
        name=name,
        depth=depth,
        oldest_age_seconds=oldest,
        depth_by_band=bands or {},  # type: ignore[arg-type]
        long_jobs=long_jobs,
    )


def cloud(
    worker_id: str,
    queue_name: str = "ocr",
    status: str = "active",
    provider: str = "aws",
    jobs: int = 0,
    idle: float = 0.0,
    cents: float = 17.0,
    drain_for: float | None = None,
    spot: bool = False,
) -> WorkerState:
    """A cloud worker that finished its last job ``idle`` seconds ago; ``cents``: what
    the provider booked it at (a spot one: the most it may bill)."""
    return WorkerState(
        worker_id=worker_id,
        queue=queue_name,
        status=status,  # type: ignore[arg-type]
        started_at=NOW - 7200,
        current_jobs=jobs,
        last_job_at=NOW - idle,
        provider=provider,  # type: ignore[arg-type]
        spot=spot,
        cost_per_hour_cents=cents,
        drain_started_at=None if drain_for is None else NOW - drain_for,
    )


def vps(worker_id: str, queue_name: str = "ocr", jobs: int = 0) -> WorkerState:
    return WorkerState(worker_id, queue_name, "active", NOW - 86_400, current_jobs=jobs)


def snap(
    *queues: QueueState,
    workers: tuple[WorkerState, ...] = (),
    offers: dict[str, Offer] | None = None,
    spend: Spend | None = None,
    history: History | None = None,
    bursts: dict[str, ManualBurst] | None = None,
) -> Snapshot:
    return Snapshot(
        now=NOW,
        queues={q.name: q for q in queues},
        workers=workers,
        offers=OFFERS if offers is None else offers,  # type: ignore[arg-type]
        spend=spend or Spend(0.0, 0.0),
        history=history or History(),
        bursts=bursts or {},
    )


def of(decisions: list[Decision], action: str) -> list[Decision]:
    return [d for d in decisions if d.action == action]


def launched(decisions: list[Decision]) -> int:
    return sum(d.count for d in of(decisions, "launch"))


# -- scale-up: the thresholds gate, the table sizes ------------------------------------------


@pytest.mark.parametrize(
    ("depth", "oldest", "row"),
    [
        (0, 0, policy.QUIET),
        (5, 119.9, policy.QUIET),
        (6, 0, policy.ONE),
        (20, 0, policy.ONE),
        (21, 0, policy.THREE),
        (100, 0, policy.THREE),
        (101, 0, policy.FLOOD),
        (0, 120, policy.ONE),
        (0, 299.9, policy.ONE),
        (0, 300, policy.THREE),
        (0, 600, policy.THREE),
        (0, 600.1, policy.FLOOD),
        (7, 301, policy.THREE),  # the higher of the two rows
        (150, 30, policy.FLOOD),
    ],
)
def test_the_policy_table_rows_at_their_edges(depth, oldest, row):
    assert policy.table_row(depth, oldest) is row


@pytest.mark.parametrize(
    ("depth", "oldest", "launches", "alert"),
    [
        (0, 0, 0, False),
        (5, 119, 0, False),
        (9, 299, 0, False),  # the table's 6-20 row, but below both thresholds
        (10, 0, 1, False),  # depth at the threshold: 6-20 row, 1 burst worker
        (20, 0, 1, False),
        (21, 0, 3, False),
        (100, 0, 3, False),
        (101, 0, 10, True),  # up to max_workers, and alert the operator
        (0, 299, 0, False),
        (0, 300, 3, False),  # oldest at the threshold: 5-10 min row
        (0, 600, 3, False),
        (0, 601, 10, True),
    ],
)
def test_scale_up_gated_by_the_thresholds_and_sized_by_the_table(depth, oldest, launches, alert):
    decisions = policy.decide(make_config(), snap(queue(depth=depth, oldest=oldest)))
    assert launched(decisions) == launches
    assert bool(of(decisions, "alert")) is alert
    if launches:
        first = of(decisions, "launch")[0]
        assert first.reason.startswith(f"Scaling up ocr: depth={depth}, oldest={oldest}s")
        assert first.queue == "ocr"


def test_a_low_threshold_launches_one_worker_below_the_tables_rows():
    config = make_config(scaling_rules__scale_up__queue_depth_threshold=3)
    assert launched(policy.decide(config, snap(queue(depth=3)))) == 1
    assert launched(policy.decide(config, snap(queue(depth=2)))) == 0


def test_the_table_is_a_target_not_a_step():
    busy = (cloud("w-1", jobs=1),)
    assert launched(policy.decide(make_config(), snap(queue(depth=15), workers=busy))) == 0
    assert launched(policy.decide(make_config(), snap(queue(depth=30), workers=busy))) == 2
    starting = (cloud("w-1", status="starting"),)
    assert launched(policy.decide(make_config(), snap(queue(depth=30), workers=starting))) == 2
    # a draining worker is not capacity: it is replaced
    draining = (cloud("w-1", status="draining", jobs=1, drain_for=10),)
    assert launched(policy.decide(make_config(), snap(queue(depth=30), workers=draining))) == 3


def test_max_workers_counts_vps_and_cloud_workers_draining_included():
    config = make_config(queues__ocr__max_workers=3)
    flood = queue(depth=150)
    # the VPS worker leaves room for 2 cloud workers
    assert launched(policy.decide(config, snap(flood, workers=(vps("v-1"),)))) == 2
    # one draining worker still counts against the maximum
    workers = (vps("v-1"), cloud("w-1", status="draining", jobs=1, drain_for=10))
    assert launched(policy.decide(config, snap(flood, workers=workers))) == 1
    full = (vps("v-1"), cloud("w-1", jobs=1), cloud("w-2", status="draining", jobs=1, drain_for=9))
    decisions = policy.decide(config, snap(flood, workers=full))
    assert launched(decisions) == 0
    [hold] = of(decisions, "hold")
    assert hold.reason == (
        "Not scaling up ocr (depth=150, oldest=0s): ocr has 3 workers, at max_workers (3)"
    )


def test_only_cloud_enabled_queues_scale_up():
    config = make_config(queues__ocr__cloud_enabled=False)
    decisions = policy.decide(config, snap(queue(depth=50)))
    assert decisions == []
    assert any(
        "ocr: depth=50, oldest=0s; ocr is not cloud-enabled: no cloud workers" in line
        for line in policy.explain(config, snap(queue(depth=50)))
    )


@pytest.mark.parametrize(("since", "launches"), [(120, 1), (121, 1), (119, 0), (0, 0)])
def test_scale_up_cooldown_edges(since, launches):
    history = History(last_scale_up={"ocr": NOW - since})
    decisions = policy.decide(make_config(), snap(queue(depth=14), history=history))
    assert launched(decisions) == launches
    if not launches:
        [hold] = of(decisions, "hold")
        assert hold.reason == (
            f"Not scaling up ocr (depth=14, oldest=0s): cooldown, {since}s of 120s since its"
            " last scale-up"
        )


def test_the_cooldown_is_per_queue():
    history = History(last_scale_up={"bulk": NOW})
    assert launched(policy.decide(make_config(), snap(queue(depth=14), history=history))) == 1


def test_the_flood_alert_repeats_at_most_hourly():
    flood = queue(depth=150)
    [alert] = of(policy.decide(make_config(), snap(flood)), "alert")
    assert alert.queue == "ocr"
    assert alert.reason.startswith("Queue ocr flooded (depth=150, oldest=0s)")
    assert "daily" not in alert.reason  # the loop tells it from the spend alert
    recent = History(last_alert={"ocr": NOW - 3599})
    assert of(policy.decide(make_config(), snap(flood, history=recent)), "alert") == []
    old = History(last_alert={"ocr": NOW - 3600})
    assert len(of(policy.decide(make_config(), snap(flood, history=old)), "alert")) == 1


# -- scale-down ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("idle", "jobs", "depth", "drained"),
    [
        (600, 0, 0, True),  # idle exactly idle_minutes
        (599, 0, 0, False),
        (3600, 0, 1, True),  # depth 1 < queue_depth_below 2
        (3600, 0, 2, False),  # depth at queue_depth_below
        (3600, 1, 0, False),  # busy
    ],
)
def test_scale_down_edges(idle, jobs, depth, drained):
    worker = cloud("w-3", idle=idle, jobs=jobs)
    decisions = policy.decide(make_config(), snap(queue(depth=depth), workers=(worker,)))
    assert [d.worker_id for d in of(decisions, "drain")] == (["w-3"] if drained else [])
    assert of(decisions, "terminate") == []  # never straight to terminate
    if drained:
        assert of(decisions, "drain")[0].reason == (
            f"Scaling down worker w-3: idle for {idle // 60} minutes (ocr depth={depth} < 2)"
        )


def test_idle_counts_from_the_start_of_a_worker_that_never_ran_a_job():
    fresh = WorkerState("w-1", "ocr", "active", NOW - 600, provider="aws")
    assert of(policy.decide(make_config(), snap(queue(), workers=(fresh,))), "drain")
    newer = WorkerState("w-1", "ocr", "active", NOW - 599, provider="aws")
    assert not of(policy.decide(make_config(), snap(queue(), workers=(newer,))), "drain")


@pytest.mark.parametrize(("since", "drained"), [(300, 1), (299, 0)])
def test_scale_down_cooldown_edges(since, drained):
    history = History(last_scale_down={"ocr": NOW - since})
    workers = (cloud("w-1", idle=900),)
    decisions = policy.decide(make_config(), snap(queue(depth=1), workers=workers, history=history))
    assert len(of(decisions, "drain")) == drained
    if not drained:
        [hold] = of(decisions, "hold")
        assert hold.worker_id == "w-1"
        assert "cooldown, 299s of 300s since ocr's last scale-down" in hold.reason


def test_one_drain_per_queue_per_cooldown_longest_idle_first():
    workers = (cloud("w-1", idle=700), cloud("w-2", idle=1200), cloud("w-3", idle=900))
    decisions = policy.decide(make_config(), snap(queue(depth=1), workers=workers))
    assert [d.worker_id for d in of(decisions, "drain")] == ["w-2"]
    assert [d.worker_id for d in of(decisions, "hold")] == ["w-3"]
    no_cooldown = make_config(scaling_rules__scale_down__cooldown_seconds=0)
    decisions = policy.decide(no_cooldown, snap(queue(depth=1), workers=workers))
    assert [d.worker_id for d in of(decisions, "drain")] == ["w-2", "w-3", "w-1"]


def test_a_queue_scaling_up_is_not_scaled_down():
    workers = (cloud("w-1", idle=3600),)
    # one old job, an idle worker (say it cannot take it): scale-up wins, nothing drained
    decisions = policy.decide(make_config(), snap(queue(depth=1, oldest=400), workers=workers))
    assert of(decisions, "drain") == []
    assert launched(decisions) == 2  # the 5-10 min row wants 3 burst workers, 1 is there


@pytest.mark.parametrize(("empty_for", "drained"), [(600, ["w-1", "w-2"]), (599, ["w-1"])])
def test_a_queue_empty_for_ten_minutes_drains_every_idle_burst_worker(empty_for, drained):
    workers = (cloud("w-1", idle=900), cloud("w-2", idle=60), cloud("w-3", jobs=1))
    history = History(empty_since={"ocr": NOW - empty_for})
    decisions = policy.decide(make_config(), snap(queue(), workers=workers, history=history))
    assert [d.worker_id for d in of(decisions, "drain")] == drained
    if empty_for >= 600:
        assert of(decisions, "drain")[0].reason == (
            "Scaling down worker w-1: ocr empty for 10 minutes, terminating all burst workers"
        )
    # the empty rule ignores the scale-down cooldown
    cooled = History(empty_since={"ocr": NOW - 600}, last_scale_down={"ocr": NOW - 1})
    decisions = policy.decide(make_config(), snap(queue(), workers=workers, history=cooled))
    assert [d.worker_id for d in of(decisions, "drain")] == ["w-1", "w-2"]


# -- drain, then terminate -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("jobs", "drain_for", "terminated", "words"),
    [
        (0, 1, True, "drained, no jobs left"),
        (2, 299, False, ""),
        (2, 300, True, "drain timed out after 5 minutes, force-killing 2 jobs"),
        (2, None, False, ""),  # drain start unknown: wait for the jobs
    ],
)
def test_a_draining_worker_is_terminated_when_empty_or_after_five_minutes(
    jobs, drain_for, terminated, words
):
    worker = cloud("w-3", status="draining", jobs=jobs, drain_for=drain_for)
    decisions = policy.decide(make_config(), snap(queue(), workers=(worker,)))
    terminate = of(decisions, "terminate")
    assert [d.worker_id for d in terminate] == (["w-3"] if terminated else [])
    if terminated:
        assert terminate[0].reason == f"Terminating worker w-3 (aws): {words}" + (
            " (they return to the queue)" if jobs else ""
        )
        assert terminate[0].provider == "aws"
    assert of(decisions, "drain") == []


def test_vps_workers_are_never_drained_or_terminated():
    workers = (vps("v-1"), WorkerState("v-2", "ocr", "draining", NOW - 9000))
    config = make_config()
    history = History(empty_since={"ocr": NOW - 9999})
    decisions = policy.decide(config, snap(queue(), workers=workers, history=history))
    assert decisions == []


# -- modes -----------------------------------------------------------------------------------


def test_vps_only_never_launches_and_drains_leftover_cloud_workers():
    config = make_config("vps_only")
    workers = (
        cloud("w-1", jobs=3),
        cloud("w-2", status="starting"),
        cloud("w-3", status="draining", drain_for=30),
        vps("v-1"),
    )
    decisions = policy.decide(config, snap(queue(depth=500, oldest=3600), workers=workers))
    assert launched(decisions) == 0
    assert of(decisions, "hold") == []  # the configuration, not a passing state
    assert [(d.action, d.worker_id) for d in decisions] == [
        ("terminate", "w-3"),
        ("drain", "w-1"),
        ("drain", "w-2"),
    ]
    assert of(decisions, "drain")[0].reason == "Draining worker w-1: mode is vps_only"


def test_the_shipped_defaults_do_nothing():
    config = scheduler_config.parse(SHIPPED)
    flood = snap(queue(depth=500, oldest=3600), queue("bulk", depth=1000), offers={})
    assert policy.decide(config, flood) == []


def test_hybrid_keeps_no_baseline_on_the_cloud():
    config = make_config(queues__ocr__baseline_workers=2)
    assert policy.decide(config, snap(queue())) == []


def test_cloud_first_keeps_the_baseline_on_the_cloud_but_the_vps_worker():
    """cloud_first: the VPS keeps one worker of a cloud-enabled queue (the head's pools,
    autoscaler.placement.vps_pools); the cloud the rest of the baseline, queue empty."""
    config = make_config("cloud_first", queues__ocr__baseline_workers=3)
    decisions = policy.decide(config, snap(queue()))
    assert launched(decisions) == 2
    assert of(decisions, "launch")[0].reason.startswith(
        "Keeping ocr's baseline on the cloud (cloud_first): 0 of 2 cloud workers"
        " (baseline 3, 1 on the VPS)"
    )
    # the VPS worker live: the same two; it is being replaced (not live): still two,
    # not a third for the moment it is missing
    assert launched(policy.decide(config, snap(queue(), workers=(vps("v-1"),)))) == 2
    # a second non-cloud worker (a machine joined with `hypermedia worker --queue ocr`)
    # holds a part of the baseline too
    joined = (vps("v-1"), vps("joined-1"))
    assert launched(policy.decide(config, snap(queue(), workers=joined))) == 1
    # bursts come on top of the baseline
    baseline = (vps("v-1", jobs=1), cloud("w-1", jobs=1), cloud("w-2", jobs=1))
    assert launched(policy.decide(config, snap(queue(depth=14), workers=baseline))) == 1


@pytest.mark.parametrize(
    ("mode", "changes"),
    [
        # a baseline of one is the VPS's minimal worker
        ("cloud_first", {"queues__ocr__baseline_workers": 1}),
        # not cloud-enabled: the whole baseline on the VPS, nothing on the cloud
        ("cloud_first", {"queues__ocr__baseline_workers": 2, "queues__ocr__cloud_enabled": False}),
        ("hybrid", {"queues__ocr__baseline_workers": 3}),
        ("vps_only", {"queues__ocr__baseline_workers": 3}),
    ],
)
def test_no_cloud_baseline_where_the_vps_holds_it(mode, changes):
    config = make_config(mode, **changes)
    assert policy.decide(config, snap(queue(), workers=(vps("v-1"),))) == []


def test_cloud_first_locked_drains_the_cloud_baseline_and_launches_none():
    config = make_config("cloud_first", queues__ocr__baseline_workers=3)
    workers = (vps("v-1"), cloud("w-1"), cloud("w-2"))
    decisions = policy.decide(config, snap(queue(), workers=workers, spend=Spend(0, 0, True)))
    assert launched(decisions) == 0
    assert sorted(str(d.worker_id) for d in of(decisions, "drain")) == ["w-1", "w-2"]


def test_cloud_first_never_scales_down_below_the_baseline():
    config = make_config("cloud_first", queues__ocr__baseline_workers=2)
    idle = (cloud("w-1", idle=3600), cloud("w-2", idle=1800))
    decisions = policy.decide(config, snap(queue(), workers=idle))
    assert [d.worker_id for d in of(decisions, "drain")] == ["w-1"]
    history = History(empty_since={"ocr": NOW - 3600})
    decisions = policy.decide(config, snap(queue(), workers=idle, history=history))
    assert [d.worker_id for d in of(decisions, "drain")] == ["w-1"]
    decisions = policy.decide(config, snap(queue(), workers=idle[:1], history=history))
    assert of(decisions, "drain") == []


def test_cloud_first_baseline_launches_obey_the_cooldown():
    config = make_config("cloud_first", queues__ocr__baseline_workers=2)
    history = History(last_scale_up={"ocr": NOW - 10})
    decisions = policy.decide(config, snap(queue(), history=history))
    assert launched(decisions) == 0
    assert "cooldown" in of(decisions, "hold")[0].reason


def test_a_manual_burst_keeps_its_cloud_workers_until_it_ends():
    """The seed's stage 2, "manual cloud burst": an operator's burst launches up to its
    workers with an empty queue (same cooldown, caps and max_workers as any launch),
    and scale-down keeps them until it ends; then they go as idle workers do."""
    config = make_config()
    burst = {"ocr": ManualBurst(workers=3, until=NOW + 3600, by="ops")}
    decisions = policy.decide(config, snap(queue(), bursts=burst))
    assert launched(decisions) == 3
    assert of(decisions, "launch")[0].reason.startswith(
        "Keeping ocr's manual burst by ops: 0 of 3 cloud workers until"
    )
    # at max_workers 2, two; in the cooldown, none
    capped = make_config(queues__ocr__max_workers=2)
    assert launched(policy.decide(capped, snap(queue(), bursts=burst))) == 2
    cooling = History(last_scale_up={"ocr": NOW - 10})
    assert launched(policy.decide(config, snap(queue(), history=cooling, bursts=burst))) == 0
    # idle for an hour, the queue empty for an hour: kept while the burst lasts
    idle = tuple(cloud(f"w-{n}", idle=3600) for n in range(3))
    empty = History(empty_since={"ocr": NOW - 3600})
    kept = policy.decide(config, snap(queue(), workers=idle, history=empty, bursts=burst))
    assert of(kept, "drain") == [] and launched(kept) == 0
    # ended: they drain as any idle workers
    ended = {"ocr": ManualBurst(workers=3, until=NOW - 1)}
    gone = policy.decide(config, snap(queue(), workers=idle, history=empty, bursts=ended))
    assert len(of(gone, "drain")) == 3
    # a queue that may not burst, or vps_only: nothing
    assert policy.decide(config, snap(queue("images"), bursts={"images": burst["ocr"]})) == []
    assert launched(policy.decide(make_config("vps_only"), snap(queue(), bursts=burst))) == 0


# -- misplaced cloud workers -----------------------------------------------------------------


def test_cloud_workers_the_configuration_no_longer_allows_are_drained():
    config = make_config(queues__ocr__cloud_provider="google")
    workers = (
        cloud("w-1", provider="aws", jobs=1),
        cloud("w-2", queue_name="images", jobs=1),
        cloud("w-3", queue_name="thumbnails", jobs=1),
        cloud("w-4", provider="google", jobs=1),
    )
    decisions = policy.decide(config, snap(queue(), workers=workers))
    assert [d.reason for d in of(decisions, "drain")] == [
        "Draining worker w-1: ocr does not burst to aws",
        "Draining worker w-2: images is not cloud-enabled",
        "Draining worker w-3: queue thumbnails is not in scheduler.json",
    ]


# -- routing by priority ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "bands", "long_jobs", "spot", "why"),
    [
        ("ocr", {"1-3": 2, "7-10": 20}, 0, False, "priority 1-3 jobs waiting: on-demand"),
        ("ocr", {"4-6": 12}, 0, True, "priority 4-6: on-demand or spot, the cheaper"),
        ("ocr", {"7-10": 12}, 0, True, "priority 7-10 only: spot preferred"),
        ("ocr", {"4-6": 12}, 1, True, "long transcodes waiting: spot with checkpoints"),
        ("ocr", {"1-3": 1, "4-6": 12}, 3, False, "priority 1-3 jobs waiting: on-demand"),
        ("bulk", {"4-6": 12}, 0, True, "bulk prefers spot"),
        ("bulk", {"1-3": 12}, 0, False, "priority 1-3 jobs waiting: on-demand"),
        ("ocr", {}, 0, True, "on-demand or spot, the cheaper"),
    ],
)
def test_routing_by_priority_band(name, bands, long_jobs, spot, why):
    state = queue(name, depth=12, bands=bands, long_jobs=long_jobs)
    [launch] = of(policy.decide(make_config(), snap(state)), "launch")
    assert launch.spot is spot
    assert launch.provider == ("google" if spot else "aws")  # the cheapest of each kind
    assert f"({why};" in launch.reason


def test_either_takes_on_demand_when_it_is_cheaper():
    offers = {"aws": Offer("aws", 3.0, 4.0)}
    config = make_config(cloud_providers__google__enabled=False)
    [launch] = of(policy.decide(config, snap(queue(depth=12), offers=offers)), "launch")
    assert (launch.provider, launch.spot) == ("aws", False)
    # spot-preferred work takes spot even so
    state = queue(depth=12, bands={"7-10": 12})
    [launch] = of(policy.decide(config, snap(state, offers=offers)), "launch")
    assert (launch.provider, launch.spot) == ("aws", True)


def test_spot_preferred_falls_back_to_on_demand_without_a_spot_market():
    config = make_config(
        cloud_providers__aws__spot_enabled=False, cloud_providers__google__preemptible=False
    )
    [launch] = of(policy.decide(config, snap(queue("bulk", depth=12))), "launch")
    assert (launch.provider, launch.spot) == ("aws", False)


# -- provider choice -------------------------------------------------------------------------


def test_the_configured_provider_is_used_even_when_dearer():
    config = make_config(queues__ocr__cloud_provider="google")
    offers = {"aws": Offer("aws", 1.0, 0.5), "google": Offer("google", 20.0, 3.0)}
    [launch] = of(policy.decide(config, snap(queue(depth=12), offers=offers)), "launch")
    assert launch.provider == "google"


def test_the_cheapest_eligible_offer_wins():
    offers = {"aws": Offer("aws", 17.0, 4.0), "google": Offer("google", 20.0, 4.5)}
    [launch] = of(policy.decide(make_config(), snap(queue(depth=12), offers=offers)), "launch")
    assert (launch.provider, launch.spot) == ("aws", True)
    assert launch.reason == (
        "Scaling up ocr: depth=12, oldest=0s; 1 on aws spot at $0.04/h (counted at its"
        " maximum, $0.05/h) (on-demand or spot, the cheaper; depth 6-20 or oldest 2-5 min:"
        " 1 burst worker)"
    )
    assert (
        launch.cents_per_hour == 4.0
    )  # the order's price: the market's (the provider books the maximum)


def test_a_spot_price_over_spot_max_price_is_not_eligible():
    offers = {"aws": Offer("aws", 17.0, 6.0), "google": Offer("google", 20.0, 9.0)}
    [launch] = of(policy.decide(make_config(), snap(queue(depth=12), offers=offers)), "launch")
    # aws spot at $0.06 is over its $0.05 cap; google preemptible at $0.09 has no cap
    assert (launch.provider, launch.spot) == ("google", True)


def test_a_tie_goes_to_on_demand_then_to_aws():
    offers = {"aws": Offer("aws", 5.0, 5.0), "google": Offer("google", 5.0, 5.0)}
    [launch] = of(policy.decide(make_config(), snap(queue(depth=12), offers=offers)), "launch")
    assert (launch.provider, launch.spot) == ("aws", False)


def test_the_tie_break_order_is_the_configs():
    assert policy.PROVIDER_ORDER == scheduler_config.PROVIDERS


def test_max_instances_counts_every_queue_and_spills_to_the_next_cheapest():
    # aws (max 5) already runs 4 instances for bulk (one draining): 1 left for ocr
    workers = (
        *(cloud(f"b-{i}", queue_name="bulk", jobs=1) for i in range(3)),
        cloud("b-3", queue_name="bulk", status="draining", jobs=1, drain_for=5),
    )
    offers = {"aws": Offer("aws", 17.0, 3.0), "google": Offer("google", 20.0, 4.0)}
    decisions = policy.decide(make_config(), snap(queue(depth=30), workers=workers, offers=offers))
    assert [(d.provider, d.spot, d.count) for d in of(decisions, "launch")] == [
        ("aws", True, 1),
        ("google", True, 2),
    ]


def test_no_provider_with_room_is_a_hold():
    config = make_config(
        cloud_providers__aws__max_instances=1, cloud_providers__google__max_instances=1
    )
    workers = (cloud("w-1", jobs=1), cloud("w-2", provider="google", jobs=1))
    decisions = policy.decide(config, snap(queue(depth=30), workers=workers))
    assert launched(decisions) == 0
    [hold] = of(decisions, "hold")
    assert hold.reason == (
        "Not scaling up ocr (depth=30, oldest=0s): no eligible provider"
        " (aws at max_instances 1, google at max_instances 1)"
    )


def test_a_provider_without_an_offer_is_not_eligible():
    decisions = policy.decide(make_config(), snap(queue(depth=12), offers={}))
    assert launched(decisions) == 0
    assert of(decisions, "hold")[0].reason.endswith(
        "no eligible provider (aws offers no price, google offers no price)"
    )


# -- the cost guard applied ------------------------------------------------------------------


def test_hourly_spend_at_the_cap_holds_every_launch():
    decisions = policy.decide(make_config(), snap(queue(depth=50), spend=Spend(500.0, 900.0)))
    assert launched(decisions) == 0
    [hold] = of(decisions, "hold")
    assert hold.reason == (
        "Not scaling up ocr (depth=50, oldest=0s): hourly spend $5.00 is at the $5.00 cap:"
        " no new instances"
    )


def test_a_launch_that_would_pass_the_hourly_cap_is_held_instance_by_instance():
    # 490 c/h committed; the caps count a spot instance at the most it may bill: google
    # spot (3 c/h) at its 20 c/h on-demand price does not fit; aws spot (4 c/h) at its
    # 5 c/h spot_max_price does: 2 fit (500 c/h), a 3rd does not
    workers = (cloud("w-0", queue_name="bulk", jobs=1, cents=490.0),)
    decisions = policy.decide(make_config(), snap(queue(depth=150), workers=workers))
    assert [(d.provider, d.spot, d.count) for d in of(decisions, "launch")] == [("aws", True, 2)]
    [hold] = of(decisions, "hold")
    assert hold.reason.startswith("Not scaling up ocr further (depth=150, oldest=0s): a launch")
    assert "over the $5.00 hourly cap" in hold.reason


def test_the_daily_cap_locks_and_drains_every_cloud_worker():
    workers = (cloud("w-1", jobs=2), cloud("w-2", queue_name="bulk"), vps("v-1"))
    decisions = policy.decide(
        make_config(), snap(queue(depth=50), workers=workers, spend=Spend(100.0, 5000.0))
    )
    assert [d.action for d in decisions] == ["alert", "lock", "drain", "drain", "hold"]
    lock = of(decisions, "lock")[0]
    assert lock.reason.startswith("Daily cloud spend cap $50.00 reached: $50.00 today")
    assert of(decisions, "alert")[0].queue is None
    assert [d.worker_id for d in of(decisions, "drain")] == ["w-1", "w-2"]
    assert of(decisions, "drain")[0].reason.startswith(
        "Draining worker w-1: locked to vps_only by the daily cost cap"
    )


def test_while_locked_nothing_scales_up_and_drained_workers_terminate():
    workers = (
        cloud("w-1", status="draining", drain_for=60),
        cloud("w-2", status="draining", jobs=1, drain_for=300),
        cloud("w-3", jobs=1),
    )
    spend = Spend(0.0, 0.0, locked=True, alerted_today=True)
    decisions = policy.decide(make_config(), snap(queue(depth=150), workers=workers, spend=spend))
    assert [(d.action, d.worker_id) for d in decisions if d.action != "hold"] == [
        ("terminate", "w-1"),
        ("terminate", "w-2"),
        ("drain", "w-3"),
    ]
    assert of(decisions, "lock") == []  # locked before: not again
    [hold] = of(decisions, "hold")
    assert "reset-cost-lock" in hold.reason


def test_the_spend_alert_goes_out_once():
    decisions = policy.decide(make_config(), snap(queue(), spend=Spend(0.0, 3000.0)))
    [alert] = decisions
    assert alert.action == "alert" and alert.queue is None
    assert "daily" in alert.reason  # what the loop looks for
    assert policy.decide(make_config(), snap(queue(), spend=Spend(0.0, 3000.0, False, True))) == []


@pytest.mark.parametrize(
    "cap",
    [
        {"cost_limits__max_hourly_spend_cents": 20},
        {"cost_limits__max_daily_spend_cents": 20, "cost_limits__alert_threshold_cents": 20},
    ],
    ids=["hourly", "daily"],
)
@pytest.mark.parametrize(("max_price", "spot"), [("0.30", False), ("0.20", True)])
def test_a_spot_instance_counts_against_the_caps_at_the_most_it_may_bill(cap, max_price, spot):
    """The node provider counts a spot launch at the most it may bill (spot_max_price)
    and refuses it when that passes a cap. The plan counts it so too: spot at 4 c/h
    with a 30 c/h maximum over a 20 c/h cap gives way to the on-demand instance at
    17 c/h that fits (the plan chose spot, the provider refused it, and nothing was
    launched, turn after turn); with a 20 c/h maximum spot still fits and wins."""
    config = make_config(
        cloud_providers__aws__spot_max_price=max_price, queues__ocr__cloud_provider="aws", **cap
    )
    decisions = policy.decide(config, snap(queue(depth=12)))
    [launch] = of(decisions, "launch")
    assert (launch.provider, launch.spot, launch.count) == ("aws", spot, 1)
    assert launch.cents_per_hour == (4.0 if spot else 17.0)
    assert of(decisions, "hold") == []
    if not spot:
        assert "; not aws spot at $0.04/h (counted at its maximum, $0.30/h): a launch at" in (
            launch.reason
        )
    else:
        assert "(counted at its maximum, $0.20/h)" in launch.reason


def test_a_spot_maximum_over_the_cap_with_no_on_demand_that_fits_is_a_hold():
    config = make_config(
        cloud_providers__aws__spot_max_price="0.30",
        queues__ocr__cloud_provider="aws",
        cost_limits__max_hourly_spend_cents=10,
    )
    decisions = policy.decide(config, snap(queue(depth=12)))
    assert launched(decisions) == 0
    [hold] = of(decisions, "hold")
    assert hold.reason == (
        "Not scaling up ocr (depth=12, oldest=0s): a launch at $0.30/h would commit"
        " $0.30/h, over the $0.10 hourly cap"
    )


def test_a_spot_route_falls_back_to_on_demand_when_only_that_fits_the_caps():
    config = make_config(
        cloud_providers__aws__spot_max_price="0.30",
        queues__bulk__cloud_provider="aws",
        cost_limits__max_hourly_spend_cents=20,
    )
    [launch] = of(policy.decide(config, snap(queue("bulk", depth=12))), "launch")
    assert (launch.provider, launch.spot) == ("aws", False)
    assert launch.reason.startswith("Scaling up bulk: depth=12, oldest=0s; 1 on aws on-demand")
    assert "bulk prefers spot; not aws spot" in launch.reason


def test_the_launch_rate_cap_holds_launches():
    history = History(launches=(NOW - 30,) * 10)  # aws 5 + google 5 per 10 minutes
    decisions = policy.decide(make_config(), snap(queue(depth=50), history=history))
    assert launched(decisions) == 0
    assert of(decisions, "hold")[0].reason.endswith(
        "launch-rate cap: 10 instances launched in the last 10 minutes"
    )


def test_launches_across_queues_share_the_budget():
    workers = (cloud("w-0", queue_name="images", status="draining", jobs=1, drain_for=1),)
    config = make_config(cost_limits__max_hourly_spend_cents=30)
    # images' draining worker commits 17 c/h: 13 c/h left: ocr gets 2 aws spot counted at
    # their 5 c/h maximum (google spot counts its 20 c/h on-demand price: it fits no more)
    decisions = policy.decide(
        config, snap(queue(depth=150), queue("bulk", depth=150), workers=workers)
    )
    assert [(d.queue, d.count) for d in of(decisions, "launch")] == [("ocr", 2)]
    assert [d.queue for d in of(decisions, "hold")] == ["ocr", "bulk"]


# -- explain ---------------------------------------------------------------------------------


def test_explain_says_what_and_why():
    workers = (cloud("w-3", idle=720), cloud("w-4", status="draining", jobs=1, drain_for=100))
    lines = policy.explain(
        make_config(), snap(queue(depth=1), queue("bulk", depth=3), workers=workers)
    )
    assert lines[0] == "Mode: hybrid"
    assert lines[1].startswith("Spend: $0.00 in the last hour")
    assert "drain: Scaling down worker w-3: idle for 12 minutes (ocr depth=1 < 2)" in lines
    assert "worker w-4 (aws): draining, 1 jobs left, force-killed in 200s" in lines
    assert "bulk: depth=3, oldest=0s; below the scale-up thresholds, no cloud workers" in lines
    assert "images: depth=0, oldest=0s; images is not cloud-enabled: no cloud workers" in lines
    quiet = policy.explain(scheduler_config.parse(SHIPPED), snap(offers={}))
    assert "Nothing to do." in quiet
    assert "ocr: depth=0, oldest=0s; mode is vps_only: no cloud workers" in quiet


def test_decide_is_deterministic_and_leaves_the_snapshot_alone():
    state = snap(queue(depth=150), workers=(cloud("w-1", idle=900),))
    before = repr(state)
    assert policy.decide(make_config(), state) == policy.decide(make_config(), state)
    assert repr(state) == before


def test_explain_shows_the_cost_guard_even_when_nothing_was_wanted():
    lines = policy.explain(make_config(), snap(queue(), spend=Spend(500.0, 600.0)))
    assert "Nothing to do." in lines
    assert "cost: hourly spend $5.00 is at the $5.00 cap: no new instances" in lines


# -- a worker whose disk is low ------------------------------------------------------------

LOW_DISK = "low disk (312 MB free, needs 1024)"


def starved(worker: WorkerState, paused_for: float) -> WorkerState:
    """``worker`` as its row says after the disk guard paused its claims ``paused_for`` s ago."""
    return replace(worker, claims_paused_since=NOW - paused_for, claims_paused_reason=LOW_DISK)


@pytest.mark.parametrize(("paused_for", "drained"), [(599, False), (600, True), (7200, True)])
def test_a_cloud_worker_paused_by_low_disk_is_drained_after_the_grace_period(paused_for, drained):
    """The default ``claims_paused_drain_seconds`` is 10 minutes: before it, a note; from
    it on, a drain naming why (then the usual termination once it has no jobs)."""
    worker = starved(cloud("w-disk", jobs=0, idle=30), paused_for)
    config = make_config()
    assert config.scaling_rules.scale_down.claims_paused_drain_seconds == 600
    state = snap(queue(depth=3), workers=(worker,))
    drains = of(policy.decide(config, state), "drain")
    if not drained:
        assert drains == []
        assert any(
            "w-disk" in line and "claiming paused for 599s" in line
            for line in policy.explain(config, state)
        )
        return
    assert [d.worker_id for d in drains] == ["w-disk"]
    assert drains[0].queue == "ocr" and drains[0].provider == "aws"
    assert drains[0].reason.startswith("Draining worker w-disk: unhealthy, it has claimed no job")
    assert LOW_DISK in drains[0].reason and "claims_paused_drain_seconds 600" in drains[0].reason
    # Drained, it is terminated the next turn (no jobs) like any drained worker.
    after = replace(worker, status="draining", drain_started_at=NOW)
    terminate = of(policy.decide(config, snap(queue(depth=3), workers=(after,))), "terminate")
    assert [d.worker_id for d in terminate] == ["w-disk"]


def test_a_drained_disk_starved_worker_is_replaced_when_the_queue_needs_one():
    """Its queue deep (50 jobs: the table's 3 burst workers), the starved worker was counted
    as capacity; drained, it no longer is, and the same turn launches in its place."""
    config = make_config()
    busy = [cloud(f"w-{i}", jobs=1) for i in range(2)]
    worker = starved(cloud("w-disk"), 3600)
    history = History(last_scale_up={"ocr": NOW - 3600})
    before = policy.decide(
        config, snap(queue(depth=50, oldest=60), workers=(*busy, cloud("w-ok")), history=history)
    )
    assert of(before, "launch") == []  # three workers up: the table's target
    decisions = policy.decide(
        config, snap(queue(depth=50, oldest=60), workers=(*busy, worker), history=history)
    )
    assert [d.worker_id for d in of(decisions, "drain")] == ["w-disk"]
    launches = of(decisions, "launch")
    assert sum(d.count for d in launches) == 1, decisions


def test_a_vps_worker_paused_by_low_disk_is_never_drained():
    """On the VPS the operator is alerted (``worker_disk_low``); nothing is stopped."""
    worker = starved(vps("v-disk"), 86_400)
    decisions = policy.decide(make_config(), snap(queue(depth=3), workers=(worker,)))
    assert [d for d in decisions if d.action in ("drain", "terminate")] == []


def test_the_grace_period_is_the_configs():
    config = make_config(scaling_rules__scale_down__claims_paused_drain_seconds=60)
    worker = starved(cloud("w-disk"), 61)
    drains = of(policy.decide(config, snap(queue(), workers=(worker,))), "drain")
    assert [d.worker_id for d in drains] == ["w-disk"]
    assert "claims_paused_drain_seconds 60" in drains[0].reason
