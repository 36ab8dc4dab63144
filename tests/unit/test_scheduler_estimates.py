"""The policy's load estimates (issue 19): scale-ups sized from the arrival rate and the
mean run time, burst workers kept while the rate says they will be needed again, and
the arithmetic behind them (:mod:`autoscaler.estimate`)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from autoscaler import estimate, policy
from autoscaler.estimate import Load
from autoscaler.snapshot import History, Offer, QueueState
from tests.unit.test_scheduler_policy import NOW, cloud, launched, make_config, of, snap, vps

# aws boots in 90 s here (the offer says so); cooldown 120 s: a replacement takes 210 s.
OFFERS = {"aws": Offer("aws", 17.0, 4.0, launch_delay_seconds=90.0)}


def loaded(
    depth: int = 0,
    oldest: float = 0.0,
    per_hour: float | None = 0.0,
    mean: float | None = 90.0,
    bands: dict[str, int] | None = None,
) -> QueueState:
    return QueueState(
        "ocr",
        depth,
        oldest,
        depth_by_band=bands or ({"4-6": depth} if depth else {}),  # type: ignore[arg-type]
        arrivals_per_hour=per_hour,
        mean_run_seconds=mean,
    )


def test_a_lone_old_job_gets_one_worker_not_the_tables_three():
    """Depth 1 at 330 s: the seed's table says up to 3 (oldest 5-10 min); 4 arrivals an
    hour of 90 s keep 0.1 workers busy, the backlog when a node is ready is 1.1 jobs:
    one worker clears it within 300 s."""
    config = make_config(queues__ocr__cloud_provider="aws")
    blind = snap(replace(loaded(1, 330.0), arrivals_per_hour=None), offers=OFFERS)
    assert launched(policy.decide(config, blind)) == 3  # the depth-only rule
    decisions = policy.decide(config, snap(loaded(1, 330.0, per_hour=4.0), offers=OFFERS))
    [launch] = of(decisions, "launch")
    assert launch.count == 1
    assert "estimate: 4 arrivals/h x 90 s mean keep 0.1 workers busy" in launch.reason
    assert "backlog 1 when a node is ready (boot 90 s)" in launch.reason
    assert "the backlog estimate sets 1 burst worker" in launch.reason


def test_the_arrival_rate_sizes_a_scale_up_above_the_depths_row():
    """Depth 12 (row 6-20: 1 worker), but 120 arrivals an hour of 90 s keep 3 workers
    busy: 3 are launched (the arrivals' busy workers)."""
    config = make_config(queues__ocr__cloud_provider="aws")
    decisions = policy.decide(config, snap(loaded(12, 30.0, per_hour=120.0), offers=OFFERS))
    [launch] = of(decisions, "launch")
    assert launch.count == 3
    assert "the arrivals' busy workers sets 3" in launch.reason


def test_the_backlog_at_ready_counts_what_active_workers_run_meanwhile():
    load = Load(rate=60 / 3600, mean_run=90.0)
    # 20 waiting + 1.5 arriving during a 90 s boot - 2 active workers x 1 job each
    assert estimate.backlog_at_ready(20, load, active=2, boot=90.0) == pytest.approx(19.5)
    assert estimate.backlog_at_ready(1, load, active=5, boot=90.0) == 0.0
    # the more of 1.5 busy and 19.5 waiting x 90 s over 300 s = 5.85: 6 workers; never a
    # worker per more than a job: 2 waiting jobs of an hour want 2, not 24
    assert estimate.workers_wanted(19.5, load, 300.0) == 6
    assert estimate.workers_wanted(2, Load(0.0, 3600.0), 300.0) == 2
    # a lone job and a twentieth of one arriving during the boot: one worker, not two
    assert estimate.workers_wanted(1.05, Load(2 / 3600, 600.0), 600.0) == 1
    assert [estimate.whole(x) for x in (0.3, 0.5, 0.51, 1.05, 1.5, 1.6, 2.6)] == [
        0,
        0,
        1,
        1,
        1,
        2,
        3,
    ]


def test_non_urgent_backlogs_are_cleared_within_idle_minutes_urgent_ones_within_the_age():
    """60 bulk-like jobs of 120 s, nothing arriving: within 300 s they want 24 workers,
    within idle_minutes (600 s) 12; max_workers 10 bounds both."""
    config = make_config(queues__ocr__cloud_provider="aws", queues__ocr__max_workers=30)
    for band, count in (("1-3", 24), ("7-10", 12)):
        state = loaded(60, 0.0, per_hour=0.0, mean=120.0, bands={band: 60})
        decisions = policy.decide(config, snap(state, offers=OFFERS))
        # the table's 21-100 row caps at 3 when oldest is 0: read the estimate from the reason
        assert f"{count} workers clear it within" in of(decisions, "launch")[0].reason


def test_a_worker_the_arrivals_keep_busy_is_kept_past_the_scale_down_rule():
    """Idle 15 minutes, depth 0 (the idle rule would drain it): 30 arrivals an hour of
    90 s keep 0.75 workers busy, more than the 0 that would remain: kept (a hold)."""
    config = make_config(queues__ocr__cloud_provider="aws")
    worker = cloud("w-1", idle=900, cents=4.0)  # spot: what a replacement would be
    decisions = policy.decide(config, snap(loaded(per_hour=30.0), workers=(worker,), offers=OFFERS))
    assert of(decisions, "drain") == []
    [hold] = of(decisions, "hold")
    assert hold.worker_id == "w-1"
    assert hold.reason.startswith("Keeping worker w-1 (would drain: idle for 15 minutes")
    assert "keep-alive estimate: 30 arrivals/h x 90 s mean" in hold.reason
    assert "boot 90 s + cooldown 120 s" in hold.reason
    # no arrivals in the window: drained as the seed's rule says
    quiet = policy.decide(config, snap(loaded(per_hour=0.0), workers=(worker,), offers=OFFERS))
    assert [d.worker_id for d in of(quiet, "drain")] == ["w-1"]


@pytest.mark.parametrize(
    ("per_hour", "idle_minutes", "kept"),
    [
        # 4 jobs an hour of 14 s keep 0.02 of a worker busy; 2 are expected within three
        # idle windows of 10 minutes: kept (relaunched, it would boot 4 times an hour).
        (4.0, 10, True),
        # One an hour: 0.5 expected within 30 minutes: drained as the idle rule says.
        (1.0, 10, False),
        # The ray up e2e's idle window of a minute: 0.2 of those 4 expected within 3
        # minutes: drained (kept, it would never retire).
        (4.0, 1, False),
    ],
)
def test_the_last_worker_is_kept_while_a_job_is_expected_within_three_idle_windows(
    per_hour, idle_minutes, kept
):
    config = make_config(
        queues__ocr__cloud_provider="aws", scaling_rules__scale_down__idle_minutes=idle_minutes
    )
    worker = cloud("w-1", idle=900, cents=4.0)
    state = loaded(per_hour=per_hour, mean=14.0)
    decisions = policy.decide(config, snap(state, workers=(worker,), offers=OFFERS))
    if kept:
        (hold,) = of(decisions, "hold")
        assert f"jobs expected within {int(idle_minutes * 180)} s, none left" in hold.reason
        assert of(decisions, "drain") == []
    else:
        assert of(decisions, "hold") == []
        assert [d.worker_id for d in of(decisions, "drain")] == ["w-1"]


def test_keep_alive_does_not_keep_a_worker_dearer_than_its_replacement():
    """An on-demand worker ($0.17/h) where a launch now would be spot ($0.04/h): idle,
    it costs more than a replacement's boot: drained as the rule says. With urgent work
    waiting a launch would be on-demand too, so it is kept."""
    config = make_config(queues__ocr__cloud_provider="aws")
    worker = cloud("w-1", idle=900, cents=17.0)
    decisions = policy.decide(config, snap(loaded(per_hour=30.0), workers=(worker,), offers=OFFERS))
    assert [d.worker_id for d in of(decisions, "drain")] == ["w-1"]
    urgent = loaded(1, 10.0, per_hour=30.0, bands={"1-3": 1})
    decisions = policy.decide(config, snap(urgent, workers=(worker,), offers=OFFERS))
    assert [d.worker_id for d in of(decisions, "hold")] == ["w-1"]


@pytest.mark.parametrize(("provider", "booked"), [("aws", 5.0), ("google", 20.0)])
def test_keep_alive_ranks_a_spot_worker_by_what_it_bills_not_its_booked_maximum(provider, booked):
    """The node provider books a spot worker at the most it may bill (AWS: the 5 c/h
    spot_max_price; Google: the 20 c/h on-demand price), and the caps count it so; it
    bills the market price (4 c/h, 3 c/h), as its spot replacement would. Compared at
    its maximum with the replacement's market price it looked dearer than its
    replacement, and was drained although the arrivals need it again. An on-demand
    worker booked at the same price is still no keeper where a launch now is spot."""
    config = make_config(queues__ocr__cloud_provider=provider)
    offers = {
        "aws": Offer("aws", 17.0, 4.0, launch_delay_seconds=90.0),
        "google": Offer("google", 20.0, 3.0, launch_delay_seconds=90.0),
    }
    worker = cloud("w-1", provider=provider, idle=900, cents=booked, spot=True)
    state = loaded(per_hour=30.0)
    decisions = policy.decide(config, snap(state, workers=(worker,), offers=offers))
    assert of(decisions, "drain") == []
    [hold] = of(decisions, "hold")
    assert hold.reason.startswith("Keeping worker w-1 (would drain: idle for 15 minutes")
    # On-demand at its list price it is dearer than the spot replacement: drained.
    on_demand = replace(
        worker, spot=False, cost_per_hour_cents=offers[provider].on_demand_cents_per_hour
    )
    decisions = policy.decide(config, snap(state, workers=(on_demand,), offers=offers))
    assert [d.worker_id for d in of(decisions, "drain")] == ["w-1"]


def test_keep_alive_keeps_only_the_workers_the_rate_needs():
    """Empty for 10 minutes, three idle burst workers and a VPS worker; 100 arrivals an
    hour of 90 s keep 2.5 workers busy: the VPS and two burst workers stay, one goes."""
    config = make_config(queues__ocr__cloud_provider="aws", queues__ocr__baseline_workers=1)
    workers = (
        vps("v-1"),
        cloud("w-1", idle=900, cents=4.0),
        cloud("w-2", idle=800, cents=4.0),
        cloud("w-3", idle=700, cents=4.0),
    )
    history = History(empty_since={"ocr": NOW - 600})
    state = loaded(per_hour=100.0)
    decisions = policy.decide(config, snap(state, workers=workers, offers=OFFERS, history=history))
    assert [d.worker_id for d in of(decisions, "drain")] == ["w-1"]
    assert [d.worker_id for d in of(decisions, "hold")] == ["w-2"]


def test_keep_alive_never_keeps_a_worker_vps_only_or_the_lock_drains():
    worker = cloud("w-1", idle=900)
    state = loaded(per_hour=500.0)
    config = make_config("vps_only")
    decisions = policy.decide(config, snap(state, workers=(worker,), offers=OFFERS))
    assert [d.worker_id for d in of(decisions, "drain")] == ["w-1"]


def test_the_load_is_unknown_without_a_rate_or_a_run_time():
    assert Load.of(loaded(per_hour=None)) is None
    assert Load.of(loaded(per_hour=10.0, mean=None)) is None
    assert Load.of(loaded(per_hour=36.0, mean=100.0)) == Load(0.01, 100.0)


def test_erlang_c_and_the_p95_wait():
    # two servers at one Erlang: P(wait) = 1/3 (the textbook value)
    assert estimate.erlang_c(2, 1.0) == pytest.approx(1 / 3)
    assert estimate.erlang_c(1, 0.5) == pytest.approx(0.5)
    load = Load(rate=1 / 60, mean_run=90.0)  # 1.5 busy workers
    assert estimate.p95_wait(1, load) == math.inf
    # P(wait > t) = C e^{-(c/d - λ) t} = 0.05
    c2 = estimate.erlang_c(2, 1.5)
    assert estimate.p95_wait(2, load) == pytest.approx(math.log(c2 / 0.05) / (2 / 90 - 1 / 60))
    assert estimate.p95_wait(2, load) > estimate.p95_wait(3, load) >= 0
    needed = estimate.workers_for_p95(load, 60.0)
    assert needed is not None
    assert estimate.p95_wait(needed, load) <= 60.0 < estimate.p95_wait(needed - 1, load)


def test_explain_says_when_a_queue_is_saturated_at_max_workers():
    """200 arrivals an hour of 90 s keep 5 workers busy; max_workers 3 runs 120 an hour:
    the backlog grows by 80 jobs/h, and the workers that keep the p95 within 300 s."""
    config = make_config(queues__ocr__cloud_provider="aws", queues__ocr__max_workers=3)
    lines = policy.explain(config, snap(loaded(50, 400.0, per_hour=200.0), offers=OFFERS))
    [advice] = [line for line in lines if line.startswith("capacity:")]
    needed = estimate.workers_for_p95(Load(200 / 3600, 90.0), 300.0)
    assert advice == (
        "capacity: ocr is saturated at max_workers 3 (200 arrivals/h x 90 s mean keep 5.0"
        f" workers busy): its backlog grows by 80 jobs/h; {needed} workers would keep its p95"
        " wait <= 300 s"
    )
    # a queue that keeps up says nothing
    calm = policy.explain(config, snap(loaded(0, 0.0, per_hour=20.0), offers=OFFERS))
    assert not [line for line in calm if line.startswith("capacity:")]


def test_only_the_urgent_jobs_workers_are_on_demand():
    """60 waiting: 5 of priority 1-3, 55 of 4-6. The seed's routing sends every launch
    on-demand while 1-3 jobs wait; with the run time known, the 5 urgent jobs (90 s
    each, 1.5 workers over 300 s: 1) get one on-demand worker, the other two launches
    take the 4-6 route (the cheaper: spot). Without the load: all three on-demand."""
    config = make_config(queues__ocr__cloud_provider="aws")
    bands = {"1-3": 5, "4-6": 55}
    state = loaded(60, 30.0, per_hour=60.0, bands=bands)
    launches = of(policy.decide(config, snap(state, offers=OFFERS)), "launch")
    assert [(d.spot, d.count) for d in launches] == [(False, 1), (True, 2)]
    assert "priority 1-3 jobs waiting: on-demand" in launches[0].reason
    assert "the 5 priority 1-3 jobs have their on-demand workers (1 new, 0 up)" in (
        launches[1].reason
    )
    blind = replace(state, arrivals_per_hour=None, mean_run_seconds=None)
    launches = of(policy.decide(config, snap(blind, offers=OFFERS)), "launch")
    assert [(d.spot, d.count) for d in launches] == [(False, 3)]


def test_explain_weighs_a_queue_that_does_not_burst_against_its_vps_workers():
    """images: one VPS worker, not cloud-enabled; 400 arrivals an hour of 10 s keep 1.1
    workers busy: saturated at its VPS workers, growing by 40 jobs an hour."""
    config = make_config()
    state = QueueState(
        "images",
        30,
        200.0,
        depth_by_band={"1-3": 30},
        arrivals_per_hour=400.0,
        mean_run_seconds=10.0,
    )
    lines = [line for line in policy.explain(config, snap(state)) if line.startswith("capacity:")]
    assert lines and lines[0].startswith(
        "capacity: images is saturated at its VPS workers 1 (400 arrivals/h x 10 s mean keep"
        " 1.1 workers busy): its backlog grows by 40 jobs/h; 2 workers would keep"
    )
