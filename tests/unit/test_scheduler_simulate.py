"""The simulator against hand-computed expectations (issue 5, "Simulator").

Each case is small enough to work out on paper; the comments show the arithmetic.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

import pytest

from autoscaler import config as scheduler_config
from autoscaler import simulate
from autoscaler.config import ProviderName, SchedulerConfig
from autoscaler.sim_baselines import KedaRule, StaticFleet, peak_fleet
from autoscaler.sim_report import percentile
from autoscaler.sim_world import Arrival, Cloud, World, read_trace, write_trace
from autoscaler.snapshot import Decision, History, QueueState, Snapshot, Spend, next_history

SHIPPED: dict[str, Any] = json.loads(scheduler_config.SHIPPED.read_text())
TRACES = Path(__file__).resolve().parents[2] / "etc" / "traces"
# 10 cents an hour on demand, no spot, a minute to boot, never interrupted.
AWS: dict[ProviderName, Cloud] = {"aws": Cloud("aws", 10.0, None, launch_delay_seconds=60.0)}


def hybrid(daily: int = 5000, hourly: int = 500, **queues: dict[str, Any]) -> SchedulerConfig:
    data = copy.deepcopy(SHIPPED)
    data["mode"] = "hybrid"
    data["cloud_providers"]["aws"].update(enabled=True, ami_id="ami-0123456789abcdef0")
    for name in ("ocr", "media", "bulk"):
        data["queues"][name]["cloud_enabled"] = True
    for name, changes in queues.items():
        data["queues"][name].update(changes)
    data["cost_limits"] = {
        "max_hourly_spend_cents": hourly,
        "max_daily_spend_cents": daily,
        "alert_threshold_cents": daily // 2,
    }
    return scheduler_config.parse(data)


def vps_only() -> SchedulerConfig:
    return scheduler_config.parse(SHIPPED)


def test_steady_trace_below_the_thresholds_costs_nothing_and_waits_nothing():
    """One image every 2 min (30 s) and a document every 5 min (60 s), each queue with
    its VPS worker: every job starts on arrival."""
    report = simulate.simulate(hybrid(), read_trace(TRACES / "steady.csv"))
    assert report.cloud_cost_cents == 0
    assert report.launches == 0
    assert report.jobs == 120 + 48 and report.unfinished == 0
    for waits in report.waits.values():
        assert (waits.p50, waits.p95, waits.max) == (0, 0, 0)
    assert report.cap_breaches == 0


def test_a_burst_in_vps_only_queues_behind_the_one_vps_worker():
    """5 images of 60 s at once on 1 VPS worker: waits 0, 60, 120, 180, 240 s;
    p50 is the 3rd (120 s), p95 the 5th (240 s)."""
    report = simulate.simulate(vps_only(), [Arrival(0.0, "images", 5, 60.0, 5)], clouds=AWS)
    waits = report.waits["4-6"]
    assert (waits.jobs, waits.p50, waits.p95, waits.max) == (5, 120, 240, 240)
    assert report.cloud_cost_cents == 0 and report.launches == 0
    assert report.duration_seconds == 300  # the evaluation after the last job ends


def test_vps_only_never_serves_a_queue_without_a_vps_worker():
    report = simulate.simulate(vps_only(), [Arrival(0.0, "ocr", 5, 60.0)], clouds=AWS)
    assert report.launches == 0 and report.unfinished == 1
    assert report.waits["4-6"].max == simulate.DEFAULT_TAIL_SECONDS


def test_a_hybrid_burst_launches_three_and_costs_price_times_running_time():
    """100 OCR jobs of 60 s at t=0 (depth 100: the table's "up to 3" row). t=0: launch 3
    (max_workers 3); they boot at 60 s and take 3 jobs a minute: job i starts at
    60 + 60 * (i // 3). The queue is empty from 2040 s (the 100th job starts); 10
    minutes later (2640 s) the three idle workers are drained, at 2700 s terminated.
    Cost: 3 x 2700 s x 10 c/h = 22.5 c."""
    report = simulate.simulate(hybrid(), [Arrival(0.0, "ocr", 5, 60.0, 100)], clouds=AWS)
    assert report.launches == 3
    assert report.peak_cloud() == 3
    assert report.cloud_cost_cents == pytest.approx(3 * 2700 / 3600 * 10)
    waits = report.waits["4-6"]
    # p50: the 50th job (i=49) -> 60 + 60*16; p95: the 95th (i=94) -> 60 + 60*31; max i=99.
    assert (waits.p50, waits.p95, waits.max) == (1020, 1920, 2040)
    assert report.unfinished == 0 and report.cap_breaches == 0
    assert report.duration_seconds == 2700
    # churn: each paid 60 s of boot before taking work: 3 minutes, 3 x 60 s x 10 c/h
    assert report.boot_billed_seconds == 180
    assert report.churn_cents == pytest.approx(0.5)


def test_billing_charges_the_providers_minimum_and_its_steps():
    """A 10 c/h instance up for 30 s is billed AWS's minute; the boot it paid for (20 s)
    and the top-up (30 s) are churn. Per-second steps bill 61.5 s as 62 s, minute steps
    (IONOS) 61 s as 120 s."""
    clouds: dict[ProviderName, Cloud] = {"aws": Cloud("aws", 10.0, None, 20.0)}
    world = World(hybrid(), clouds, random.Random(0))
    world.launch(Decision("launch", "test", "ocr", provider="aws"))
    world.now = 30.0
    world.remove("sim-00001")
    [interval] = world.ledger.values()
    assert (interval.start, interval.end) == (0.0, 60.0)
    assert world.boot_billed_seconds == 20.0
    assert world.churn_cents == pytest.approx(10.0 * 50 / 3600)
    assert Cloud("aws", 1.0).billed_seconds(61.5) == 62  # per second, rounded up
    assert Cloud("ionos", 1.0, billing_step_seconds=60.0).billed_seconds(61) == 120
    assert Cloud("ionos", 1.0, billing_step_seconds=60.0).billed_seconds(0.5) == 60


def test_launches_never_exceed_max_workers_over_a_long_burst():
    config = hybrid(ocr={"max_workers": 2}, bulk={"max_workers": 2})
    arrivals = [Arrival(t * 300.0, q, 5, 120.0, 40) for t in range(12) for q in ("ocr", "bulk")]
    report = simulate.simulate(config, arrivals, clouds=AWS)
    assert max(s.cloud["ocr"] for s in report.timeline) == 2
    assert max(s.cloud["bulk"] for s in report.timeline) == 2
    assert report.launches >= 4 and report.cap_breaches == 0


def test_a_runaway_flood_locks_at_the_daily_cap_without_breaching_it():
    """$1/h instances and a $3 day: the guard locks before the day's spend passes $3,
    and every cloud worker is gone within the drain horizon."""
    clouds: dict[ProviderName, Cloud] = {
        "aws": Cloud("aws", 100.0, None, launch_delay_seconds=60.0)
    }
    config = hybrid(daily=300, hourly=500)
    flood = read_trace(TRACES / "runaway_flood.csv")
    report = simulate.simulate(config, [a for a in flood if a.at < 6 * 3600], clouds=clouds)
    assert report.locked_at is not None
    assert report.cap_breaches == 0
    assert report.cloud_cost_cents <= 300
    horizon = report.locked_at + 300 + 2 * config.evaluation_interval_seconds
    assert all(sum(s.cloud.values()) == 0 for s in report.timeline if s.at >= horizon)
    assert report.unfinished > 0  # the flood outruns everything


def test_static_fleet_costs_its_size_times_the_run():
    """2 prewarmed on-demand OCR workers at 10 c/h; 4 jobs of 30 min at t=0: two rounds,
    done at 3600 s: 2 x 1 h x 10 c = 20 c; waits 0, 0, 1800, 1800."""
    arrivals = [Arrival(0.0, "ocr", 5, 1800.0, 4)]
    report = simulate.simulate(hybrid(), arrivals, StaticFleet({"ocr": 2}), clouds=AWS)
    assert report.cloud_cost_cents == pytest.approx(20.0)
    assert report.waits["4-6"].max == 1800 and report.waits["4-6"].p50 == 0
    assert report.launches == 2


def test_peak_fleet_serves_the_busiest_hour():
    """OCR: 100 x 60 s in one hour = 6000 s of work -> 2 workers; bulk: nothing."""
    arrivals = [Arrival(0.0, "ocr", 5, 60.0, 100), Arrival(7200.0, "ocr", 5, 60.0, 10)]
    assert peak_fleet(hybrid(), arrivals) == {"ocr": 2, "media": 0, "bulk": 0}


def test_keda_rule_scales_on_depth_and_waits_out_its_cooldown():
    """23 jobs / 5 per worker -> ceil = 5, capped at max_workers 3: 3 launched at t=0."""
    report = simulate.simulate(hybrid(), [Arrival(0.0, "ocr", 5, 60.0, 23)], KedaRule(), clouds=AWS)
    assert report.launches == 3
    assert report.timeline[1].at - report.timeline[0].at == 30
    # boot at 60 s; 23 jobs on 3 workers: the last starts at 60 + 7*60 = 480 s and ends
    # at 540 s; the queue's target was 1 until 480 s: drained when 300 s of zero targets
    # have passed, no earlier than 780 s.
    assert report.waits["4-6"].max == 480
    assert report.duration_seconds >= 780


def test_an_interrupted_spot_job_goes_back_to_the_queue():
    """Bulk (spot preferred, max 1 worker) on 2 c/h spot instances that die twice an hour
    on average: with seed 3, two are interrupted mid-job and relaunched; all three 10-min
    jobs are done in the end, and never more than one instance ran at a time."""
    clouds: dict[ProviderName, Cloud] = {
        "aws": Cloud("aws", 10.0, 2.0, launch_delay_seconds=0.0, interruptions_per_hour=2)
    }
    config = hybrid(bulk={"max_workers": 1, "spot_preferred": True})
    aws = config.cloud_providers.aws.model_copy(update={"spot_enabled": True})
    providers = config.cloud_providers.model_copy(update={"aws": aws})
    config = config.model_copy(update={"cloud_providers": providers})
    report = simulate.simulate(config, [Arrival(0.0, "bulk", 9, 600.0, 3)], clouds=clouds, seed=3)
    assert (report.interruptions, report.launches, report.unfinished) == (2, 3, 0)
    assert max(s.cloud["bulk"] for s in report.timeline) == 1
    assert report.cloud_cost_cents <= 2.0 * report.duration_seconds / 3600  # all spot
    assert report.waits["7-10"].max > 1200  # the third job waited for two reruns


def test_running_spot_instances_count_against_the_caps_at_what_the_provider_books():
    """Spot at 4 c/h with a 30 c/h spot_max_price, on-demand 40 c/h, a $1 hourly cap;
    150 bulk jobs of 60 s at t=0 (the flood row: up to max_workers 5). The node provider
    books a spot launch at its maximum and counts the running ones so: the plan's first
    turn launches 3 spot (90 c/h; a 4th, 120 c/h, or on-demand, 130 c/h, passes the cap),
    and no turn after it launches more while they run. Counted at the market's 4 c/h,
    the three left 88 c/h of room in the next turn's view: 2 more spot instances the
    provider would refuse. What they cost stays the market's price: 3 x 4 c/h."""
    clouds: dict[ProviderName, Cloud] = {"aws": Cloud("aws", 40.0, 4.0, launch_delay_seconds=60.0)}
    config = hybrid(hourly=100)
    aws = config.cloud_providers.aws.model_copy(update={"spot_max_price": "0.30"})
    providers = config.cloud_providers.model_copy(update={"aws": aws})
    config = config.model_copy(update={"cloud_providers": providers})
    report = simulate.simulate(config, [Arrival(0.0, "bulk", 9, 60.0, 150)], clouds=clouds)
    assert (report.launches, report.peak_cloud()) == (3, 3)
    assert report.cap_holds > 0 and report.cap_breaches == 0
    assert report.unfinished == 0
    # billed at the market price: 3 instances x 4 c/h, from launch to termination
    assert report.cloud_cost_cents <= 3 * 4.0 * report.duration_seconds / 3600


def test_same_seed_same_report():
    arrivals = read_trace(TRACES / "burst.csv")
    first = simulate.simulate(hybrid(), arrivals, seed=7)
    assert simulate.simulate(hybrid(), arrivals, seed=7) == first


def test_next_history_records_what_was_done():
    """As the loop and the simulator record a turn (one function, in autoscaler.snapshot)."""
    snapshot = Snapshot(
        now=5000.0,
        queues={"ocr": QueueState("ocr", 0), "bulk": QueueState("bulk", 4)},
        workers=(),
        offers={},
        spend=Spend(0.0, 0.0),
        history=History(
            last_scale_up={"bulk": 10.0},
            launches=(1000.0, 1500.0, 4900.0),
            empty_since={"bulk": 100.0},
        ),
    )
    decisions = [
        Decision("launch", "up", "bulk", provider="aws", count=2),
        Decision("drain", "down", "ocr", worker_id="w1"),
        Decision("alert", "flood", "bulk"),
        Decision("alert", "spend"),
        Decision("hold", "cooldown", "ocr"),
    ]
    after = next_history(snapshot, decisions)
    assert dict(after.last_scale_up) == {"bulk": 5000.0}
    assert dict(after.last_scale_down) == {"ocr": 5000.0}
    assert after.launches == (1500.0, 4900.0, 5000.0, 5000.0)  # an hour kept, one per instance
    assert dict(after.last_alert) == {"bulk": 5000.0}  # the spend alert has no queue
    assert dict(after.empty_since) == {"ocr": 5000.0}  # bulk has jobs again
    applied = [False, True, True, True, True]  # the launch was not carried out
    assert dict(next_history(snapshot, decisions, applied).last_scale_up) == {"bulk": 10.0}
    assert next_history(snapshot, decisions, applied).launches == (1500.0, 4900.0)


def test_read_trace_rejects_bad_rows(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("at_seconds,queue,priority,duration_seconds\n0,ocr,11,60\n")
    with pytest.raises(ValueError, match=r"t.csv:2: priority 11"):
        read_trace(path)
    path.write_text("at,queue\n0,ocr\n")
    with pytest.raises(ValueError, match="header"):
        read_trace(path)
    with pytest.raises(ValueError, match="'nope' is not in the config"):
        simulate.simulate(hybrid(), [Arrival(0.0, "nope", 5, 1.0)])


@pytest.mark.parametrize(
    "text",
    [
        "at_seconds,queue,priority,duration_seconds\r\n0,ocr,5,60\r\n10,ocr,3,30\r\n",
        "# exported 2026-12-01\nat_seconds,queue,priority,duration_seconds\n0,ocr,5,60\n"
        "# a comment between rows\n10,ocr,3,30\n",
        "\ufeffat_seconds, queue ,priority,duration_seconds\r0, ocr ,5,60\r10,ocr,3,30\r",
        "at_seconds,queue,priority,duration_seconds,count\r\n0,ocr,5,60,\r\n10,ocr,3,30,1\r\n"
        ",,,,\r\n\r\n",
    ],
    ids=["crlf", "comments", "bom-cr-spaces", "empty-cells-and-lines"],
)
def test_read_trace_takes_what_spreadsheets_and_exports_write(tmp_path, text):
    path = tmp_path / "t.csv"
    path.write_bytes(text.encode())
    assert read_trace(path) == [Arrival(0.0, "ocr", 5, 60.0), Arrival(10.0, "ocr", 3, 30.0)]


def test_read_trace_names_an_empty_cell(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(b"at_seconds,queue,priority,duration_seconds\r\n0,ocr,5,60\r\n,ocr,5,60\r\n")
    with pytest.raises(ValueError, match=r"t.csv:3: at_seconds is empty"):
        read_trace(path)


def test_write_then_read_round_trips(tmp_path):
    arrivals = [Arrival(0.0, "ocr", 3, 1.5, 2), Arrival(10.0, "bulk", 9, 60.0)]
    write_trace(tmp_path / "t.csv", arrivals)
    assert read_trace(tmp_path / "t.csv") == arrivals


def test_shipped_traces_are_what_the_generator_writes(tmp_path):
    from autoscaler import traces

    for path in traces.write_all(tmp_path):
        assert path.read_text() == (TRACES / path.name).read_text(), path.name


def test_main_prints_the_table_and_draws_the_chart(tmp_path, capsys):
    config = tmp_path / "scheduler.json"
    data = copy.deepcopy(SHIPPED)
    data["mode"] = "hybrid"
    data["cloud_providers"]["aws"].update(enabled=True, ami_id="ami-0123456789abcdef0")
    data["queues"]["ocr"]["cloud_enabled"] = True
    config.write_text(json.dumps(data))
    chart = tmp_path / "out.png"
    written = tmp_path / "out.json"
    assert simulate.main(config, TRACES / "burst.csv", chart, written) == 0
    out = capsys.readouterr().out
    assert "hypermedia" in out and "static-for-peak" in out and "keda-style" in out
    assert "seed-rules-only" in out
    document = json.loads(written.read_text())
    assert document["trace"] == "burst.csv" and document["mode"] == "hybrid"
    policies = {p["policy"]: p for p in document["policies"]}
    assert set(policies) == {"hypermedia", "seed-rules-only", "static-for-peak", "keda-style"}
    ours = policies["hypermedia"]
    assert set(ours["p95_wait_seconds"]) == {"1-3", "4-6", "7-10"}
    assert ours["cap_breaches"] == 0 and ours["launches"] >= 1 and ours["cost_cents"] > 0
    # ocr (max_workers 3) cannot keep up with 200 jobs in an hour; bulk (not
    # cloud-enabled, no VPS worker) never runs its 60: advice for both, replayed
    advice = {a["queue"]: a for a in document["capacity"]}
    assert set(advice) == {"ocr", "bulk"}
    ocr, bulk = advice["ocr"], advice["bulk"]
    assert ocr["saturated"] and ocr["max_workers"] == 3 and ocr["workers_for_p95"] > 3
    assert ocr["cost_cents_after"] > 0
    assert "capacity: ocr is saturated at max_workers 3" in out
    assert bulk["saturated"] and bulk["max_workers"] == 0
    assert bulk["change"] == f"bulk cloud-enabled with max_workers {bulk['workers_for_p95']}"
    assert "capacity: bulk is saturated at its VPS workers 0" in out
    pytest.importorskip("matplotlib")
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_main_reports_an_unusable_config(tmp_path, capsys):
    config = tmp_path / "scheduler.json"
    config.write_text("{}")
    assert simulate.main(config, TRACES / "steady.csv", None) == 2
    assert "scheduler simulate" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("count", "fraction", "rank"),
    [
        (10, 0.5, 5),  # ceil(5): rounding 5.5 half to even would say 6
        (4, 0.5, 2),
        (3, 0.5, 2),
        (20, 0.95, 19),  # 0.95 x 20 is 19.000000000000004 in floating point
        (100, 0.99, 99),
        (1, 0.99, 1),
        (7, 1.0, 7),
    ],
)
def test_percentile_is_the_nearest_rank(count: int, fraction: float, rank: int):
    values = [float(i) for i in range(1, count + 1)]
    assert percentile(values, fraction) == rank
    assert percentile([], fraction) == 0.0


def test_advice_replays_the_trace_with_the_workers_that_keep_up():
    """OCR at max_workers 1, 40 jobs of 60 s an hour for two hours (0.67 busy workers,
    but bunched: 20 at once every half hour): max_workers 1 leaves a p95 over 300 s; the
    advice's fleet is replayed and waits less."""
    config = hybrid(ocr={"max_workers": 1})
    arrivals = [Arrival(t * 1800.0, "ocr", 5, 60.0, 20) for t in range(4)]
    ours = simulate.simulate(config, arrivals, clouds=AWS)
    advice = simulate.advise(config, arrivals, ours, clouds=AWS)
    [item] = advice
    assert item.capacity is not None and item.capacity.queue == "ocr"
    assert item.capacity.workers_needed is not None and item.capacity.workers_needed > 1
    assert item.after is not None and item.after.waits["4-6"].p95 < ours.waits["4-6"].p95
    assert f"max_workers {item.capacity.workers_needed} for ocr" in item.describe()


def test_advice_on_the_caps_when_they_held_launches():
    clouds: dict[ProviderName, Cloud] = {"aws": Cloud("aws", 100.0, None, 60.0)}
    config = hybrid(hourly=150, daily=5000)
    arrivals = [Arrival(0.0, "ocr", 5, 600.0, 60)]
    ours = simulate.simulate(config, arrivals, clouds=clouds)
    assert ours.cap_holds > 0  # one $1/h instance fits the $1.50 hourly cap, not two
    caps = [a for a in simulate.advise(config, arrivals, ours, clouds=clouds) if a.capacity is None]
    [item] = caps
    assert "the caps doubled (hourly $3.00, daily $100.00)" in item.describe()
    assert item.after is not None and item.after.duration_seconds < ours.duration_seconds
