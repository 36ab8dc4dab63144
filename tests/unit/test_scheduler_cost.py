"""The cost ledger's arithmetic and the cost guard's verdicts, at every edge."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from autoscaler import cost
from autoscaler.config import CloudProviders, CostLimits
from autoscaler.cost import Interval
from autoscaler.snapshot import Spend, WorkerState

MIDNIGHT = datetime(2027, 1, 15, tzinfo=UTC).timestamp()
HOUR = 3600.0
LIMITS = CostLimits(
    max_hourly_spend_cents=500, max_daily_spend_cents=5000, alert_threshold_cents=3000
)


def verdict(
    spend: Spend,
    *,
    committed: float = 0.0,
    launches: tuple[float, ...] = (),
    max_launches: int = 10,
    horizon: float = 420.0,
    limits: CostLimits = LIMITS,
    now: float = MIDNIGHT + 12 * HOUR,
) -> cost.GuardVerdict:
    return cost.guard(
        limits,
        spend,
        now=now,
        committed_cents_per_hour=committed,
        launches=launches,
        max_launches=max_launches,
        stop_horizon_seconds=horizon,
    )


# -- the ledger ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("interval", "start", "end", "cents"),
    [
        (Interval(0, 3600, 100), 0, 3600, 100.0),  # a whole hour
        (Interval(0, 1800, 100), 0, 3600, 50.0),  # half the window
        (Interval(-1800, 1800, 100), 0, 3600, 50.0),  # started before the window
        (Interval(1800, None, 100), 0, 3600, 50.0),  # still running: until the window's end
        (Interval(0, 3600, 100), 3600, 7200, 0.0),  # ended exactly at the window's start
        (Interval(7200, None, 100), 0, 3600, 0.0),  # started after the window
        (Interval(0, 0, 100), 0, 3600, 0.0),  # never ran
        (Interval(0, 36, 100), 0, 3600, 1.0),  # 36 s at $1/h is one cent
    ],
)
def test_an_interval_costs_its_overlap_with_the_window(interval, start, end, cents):
    assert interval.cents_between(start, end) == pytest.approx(cents)


def test_day_start_is_midnight_utc():
    assert cost.day_start(MIDNIGHT) == MIDNIGHT
    assert cost.day_start(MIDNIGHT + 86_399.5) == MIDNIGHT
    assert cost.day_start(MIDNIGHT - 0.5) == MIDNIGHT - 86_400
    assert cost.day_start(3600.0) == 0.0  # the simulator's virtual day


@pytest.mark.parametrize(
    ("intervals", "now", "last_hour", "today"),
    [
        # running for two hours at $1/h, at noon: one hour in the window, two today
        ([Interval(MIDNIGHT + 10 * HOUR, None, 100)], MIDNIGHT + 12 * HOUR, 100.0, 200.0),
        # started an hour before midnight, now 30 min past: the hour sees 1 h, today 30 min
        ([Interval(MIDNIGHT - HOUR, None, 100)], MIDNIGHT + 1800, 100.0, 50.0),
        # exactly midnight: a new day has spent nothing
        ([Interval(MIDNIGHT - HOUR, None, 100)], MIDNIGHT, 100.0, 0.0),
        # terminated 90 minutes ago after 2 hours: outside the hour, still today
        (
            [Interval(MIDNIGHT + 8 * HOUR, MIDNIGHT + 10 * HOUR, 100)],
            MIDNIGHT + 11.5 * HOUR,
            0.0,
            200.0,
        ),
        # several instances add up (on-demand and spot prices)
        (
            [
                Interval(MIDNIGHT + 11 * HOUR, None, 17.0),
                Interval(MIDNIGHT + 11.5 * HOUR, None, 4.2),
                Interval(MIDNIGHT + 2 * HOUR, MIDNIGHT + 3 * HOUR, 20.0),
            ],
            MIDNIGHT + 12 * HOUR,
            17.0 + 2.1,
            17.0 + 2.1 + 20.0,
        ),
        ([], MIDNIGHT, 0.0, 0.0),
    ],
)
def test_spend_sums_the_ledger_over_the_last_hour_and_the_day(intervals, now, last_hour, today):
    spent = cost.spend(intervals, now, locked=True, alerted_today=True)
    assert spent.last_hour_cents == pytest.approx(last_hour)
    assert spent.today_cents == pytest.approx(today)
    assert spent.locked and spent.alerted_today


def test_the_running_rate_counts_cloud_instances_not_yet_terminated():
    def worker(status, provider, cents):
        return WorkerState("w", "ocr", status, 0.0, provider=provider, cost_per_hour_cents=cents)

    workers = [
        worker("active", "aws", 17.0),
        worker("starting", "google", 20.0),
        worker("draining", "aws", 4.0),  # still costs until it is gone
        worker("terminated", "aws", 100.0),
        worker("active", None, 999.0),  # the VPS is not cloud spend
    ]
    assert cost.running_rate(workers) == pytest.approx(41.0)
    assert cost.Interval.of(workers[0]) == Interval(0.0, None, 17.0)


def test_a_launch_commits_its_price_for_one_hour():
    assert cost.launch_commitment_cents(17.0) == pytest.approx(17.0)


def test_the_launch_rate_cap_is_the_enabled_providers_max_instances():
    providers = CloudProviders.model_validate(
        {
            "aws": {
                "enabled": True,
                "region": "eu-west-3",
                "instance_type": "c6i.xlarge",
                "ami_id": "ami-1",
                "max_instances": 5,
            },
            "google": {"enabled": False, "max_instances": 7},
            "ionos": {
                "enabled": True,
                "datacenter": "de/fra",
                "server_type": "ENTERPRISE",
                "image": "img",
                "max_instances": 3,
            },
        }
    )
    assert cost.launch_rate_cap(providers) == 8
    assert cost.launch_rate_cap(CloudProviders()) == 1


@pytest.mark.parametrize(
    ("ago", "counted"),
    [(0.0, 1), (599.0, 1), (600.0, 0), (601.0, 0), (-1.0, 1), (-7200.0, 1)],
)
def test_recent_launches_are_the_last_ten_minutes(ago, counted):
    """A launch after ``now`` is recent too: the clock went back since."""
    now = MIDNIGHT + HOUR
    assert cost.recent_launches([now - ago], now) == counted


# -- the guard: hourly cap -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("last_hour", "allowed"),
    [(0.0, True), (499.99, True), (500.0, False), (800.0, False)],
)
def test_hourly_spend_at_the_cap_stops_new_instances(last_hour, allowed):
    v = verdict(Spend(last_hour_cents=last_hour, today_cents=last_hour))
    assert v.launches_allowed is allowed
    assert (v.launch_refusal is None) is allowed
    assert not v.lock
    if not allowed:
        assert v.launch_refusal == (
            f"hourly spend {cost.money(last_hour)} is at the $5.00 cap: no new instances"
        )
        assert v.launch_refusal in v.reasons


@pytest.mark.parametrize(
    ("committed", "price", "allowed"),
    [
        (0.0, 500.0, True),  # exactly the cap
        (0.0, 500.01, False),
        (400.0, 100.0, True),
        (400.0, 100.5, False),
        (450.0, 17.0, True),
    ],
)
def test_a_launch_is_refused_when_its_hour_would_pass_the_hourly_cap(committed, price, allowed):
    budget = verdict(Spend(0.0, 0.0), committed=committed).budget
    refusal = budget.refusal(price)
    assert (refusal is None) is allowed
    if not allowed:
        assert refusal is not None and "over the $5.00 hourly cap" in refusal


def test_launches_in_one_evaluation_are_checked_together():
    budget = verdict(Spend(0.0, 0.0), committed=300.0).budget
    first = budget.after_launch(100.0)
    assert first.refusal(100.0) is None
    second = first.after_launch(100.0)
    assert second.committed_cents_per_hour == pytest.approx(500.0)
    assert second.refusal(0.01) is not None
    assert budget.committed_cents_per_hour == pytest.approx(300.0)  # values, not mutation


# -- the guard: daily cap and lock -----------------------------------------------------------


@pytest.mark.parametrize(
    ("today", "price", "allowed"),
    [
        (4900.0, 100.0, True),  # exactly the daily cap within the hour
        (4900.0, 100.5, False),
        (4000.0, 500.0, True),
        (4999.0, 2.0, False),
    ],
)
def test_a_launch_is_refused_when_its_hour_would_pass_the_daily_cap(today, price, allowed):
    budget = verdict(Spend(0.0, today)).budget
    refusal = budget.refusal(price)
    assert (refusal is None) is allowed
    if not allowed:
        assert refusal is not None and "over the $50.00 daily cap" in refusal


@pytest.mark.parametrize(
    ("today", "committed", "lock"),
    [
        (5000.0, 0.0, True),  # at the cap
        (6000.0, 0.0, True),
        (4999.99, 0.0, False),
        # 4900 + 1000 c/h over the 420 s it takes to stop them = 5016.67: lock now
        (4900.0, 1000.0, True),
        # 4900 + 800 c/h over 420 s = 4993.33: not yet
        (4900.0, 800.0, False),
        # exactly at the cap once stopped
        (4930.0, 600.0, True),
    ],
)
def test_the_daily_cap_counts_what_running_instances_cost_until_stopped(today, committed, lock):
    v = verdict(Spend(0.0, today), committed=committed, horizon=420.0)
    assert v.lock is lock
    assert v.locked is lock
    if lock:
        assert not v.launches_allowed
        assert v.lock_reason is not None
        assert v.lock_reason.startswith("Daily cloud spend cap $50.00 reached")
        assert "hypermedia scheduler reset-cost-lock" in v.lock_reason


def test_a_lock_is_emitted_once_and_lasts():
    v = verdict(Spend(0.0, 9000.0, locked=True))
    assert v.locked and not v.lock
    assert not v.launches_allowed
    assert v.launch_refusal is not None and "reset-cost-lock" in v.launch_refusal
    # the lock outlives the day: a new day with nothing spent stays locked
    assert verdict(Spend(0.0, 0.0, locked=True)).locked


def test_a_zero_daily_cap_refuses_launches_but_locks_nothing_unspent():
    zero = CostLimits(max_hourly_spend_cents=500, max_daily_spend_cents=0, alert_threshold_cents=0)
    v = verdict(Spend(0.0, 0.0), limits=zero)
    assert not v.lock and not v.alert
    assert v.budget.refusal(1.0) is not None
    assert verdict(Spend(0.0, 0.0), limits=zero, committed=10.0).lock


# -- the guard: alert ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("today", "alerted", "alert"),
    [(2999.99, False, False), (3000.0, False, True), (4000.0, False, True), (4000.0, True, False)],
)
def test_the_alert_goes_out_once_a_day_at_the_threshold(today, alerted, alert):
    v = verdict(Spend(0.0, today, alerted_today=alerted))
    assert v.alert is alert
    if alert:
        assert v.alert_reason == (
            f"Daily cloud spend {cost.money(today)} reached the alert threshold $30.00"
            " (daily cap $50.00)"
        )
        assert v.launches_allowed  # an alert stops nothing


# -- the guard: launch-rate cap --------------------------------------------------------------


def test_the_launch_rate_cap_stops_a_relaunch_loop():
    now = MIDNIGHT + HOUR
    launches = tuple(now - 60 * i for i in range(5))  # 5 in the last 5 minutes
    capped = verdict(Spend(0.0, 0.0), launches=launches, max_launches=5, now=now)
    assert not capped.launches_allowed
    assert capped.launch_refusal == "launch-rate cap: 5 instances launched in the last 10 minutes"
    assert capped.launch_refusal in capped.reasons
    one_left = verdict(Spend(0.0, 0.0), launches=launches[:4], max_launches=5, now=now)
    assert one_left.launches_allowed
    budget = one_left.budget
    assert budget.refusal(10.0) is None
    assert budget.after_launch(10.0).refusal(10.0) == capped.launch_refusal
    # ten minutes later the window is clear
    later = verdict(Spend(0.0, 0.0), launches=launches, max_launches=5, now=now + 600)
    assert later.launches_allowed


@pytest.mark.parametrize(("ahead", "allowed"), [(0.0, True), (60.0, True), (61.0, False)])
def test_a_clock_set_back_behind_the_last_launch_stops_new_instances(ahead, allowed):
    """The ledger's spend against a clock set back misses what ran since: every launch
    waits until the clock passes the last one again (a second of NTP jitter does not)."""
    now = MIDNIGHT + 12 * HOUR
    checked = verdict(Spend(0.0, 0.0), launches=(now - 3000, now + ahead), now=now)
    assert checked.launches_allowed is allowed
    if not allowed:
        assert checked.launch_refusal == (
            "the clock is 61 s behind the last launch (set back?): the spend against the"
            " caps cannot be computed; no new instances until it passes it"
        )
        assert checked.launch_refusal in checked.reasons
        assert checked.budget.refusal(1.0) == checked.launch_refusal
        assert not checked.lock  # nothing locks: it passes with the clock


def test_the_summary_reads_like_a_sentence():
    line = cost.summary(LIMITS, Spend(120.0, 1200.0, locked=True), 80.0)
    assert line == (
        "Spend: $1.20 in the last hour (cap $5.00), $12.00 today (cap $50.00, alert at $30.00);"
        " running instances $0.80/h; locked to vps_only until"
        " `hypermedia scheduler reset-cost-lock`"
    )


def test_an_ended_instance_costs_what_its_cloud_bills():
    """Per second with a minute's minimum (AWS, Google), by the started minute (IONOS);
    the bill counts in the window the instance ended in, a running one by the second."""
    now = 10_000.0
    aws = cost.Interval.billed("aws", now - 100, now - 95, 60.0)  # 5 s: a minute billed
    assert aws.cents_between(now - 3600, now) == pytest.approx(1.0)
    longer = cost.Interval.billed("google", now - 100, now - 10, 60.0)  # 90 s: 90 s
    assert longer.cents_between(now - 3600, now) == pytest.approx(1.5)
    ionos = cost.Interval.billed("ionos", now - 100, now - 10, 60.0)  # 90 s: 2 minutes
    assert ionos.cents_between(now - 3600, now) == pytest.approx(2.0)
    running = cost.Interval.billed("aws", now - 30, None, 60.0)
    assert running.cents_between(now - 3600, now) == pytest.approx(0.5)
    assert cost.Interval(now - 100, now - 95, 60.0).cents_between(now - 3600, now) == (
        pytest.approx(60.0 * 5 / 3600)
    )
