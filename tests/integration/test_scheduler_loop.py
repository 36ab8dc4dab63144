"""The scheduler loop on a real PostgreSQL and Redis: it reads queue depth and age per
band from Redis, decides through the real policy, records every decision with its
reason and term, applies it only while it leads, and keeps the cost lock across
restarts until an operator resets it.

The cloud side is the :class:`~autoscaler.scheduler.Fleet` seam; here a fleet that
keeps its instances in memory (the provider issue brings the drivers and a local one
that starts real Ray nodes)."""

from __future__ import annotations

import copy
import json
import logging
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, select
from typer.testing import CliRunner

from autoscaler import billing
from autoscaler import config as scheduler_config
from autoscaler.billing import Account
from autoscaler.config import ProviderName
from autoscaler.drivers.base import Charge, DriverError
from autoscaler.leader import Leadership, Term
from autoscaler.scheduler import COST_LOCK, RECONCILED, Scheduler, reset_cost_lock
from autoscaler.snapshot import RATE_WINDOW_SECONDS, Offer, Plan, WorkerState
from autoscaler.state import read_state
from hypermedia import ids, objects
from hypermedia.cli import app
from hypermedia.clock import Clock, ManualClock, SystemClock, to_datetime
from hypermedia.db import tables as t
from hypermedia.db.engine import snapshot, transaction
from hypermedia.metrics import (
    COST_LOCKED,
    DECISIONS,
    LAST_EVALUATION,
    SPEND,
    SPEND_ALERT,
    SPEND_CAP,
    MemoryRecorder,
)
from hypermedia.sandbox.inspect import Inspection
from hypermedia.stack import Stack
from tests import support
from tests.factories import Person, make_user, submit

SETTLE = 48 * 3600.0  # as Cost Explorer's reader


class MemoryFleet:
    """Cloud instances as values: launched, drained, terminated on request."""

    def __init__(self, price_cents: float = 17.0) -> None:
        self.price = price_cents
        self.workers: dict[str, WorkerState] = {}
        self.actions: list[tuple[str, int]] = []  # (action, term token)
        self.bill: list[Charge] | DriverError | Exception = []  # what the billing answers
        self.reads: list[tuple[str, str]] = []  # the days each read of it covered
        self.plans: list[Plan] = []

    def cloud_workers(self, now: float, actors: Sequence[WorkerState]) -> list[WorkerState]:
        return [w for w in self.workers.values() if w.status != "terminated"]

    def offers(self, now: float) -> dict[ProviderName, Offer]:
        return {"aws": Offer("aws", self.price, self.price / 3)}

    def billing(self) -> dict[str, Account]:
        return {"aws": Account(SETTLE, 6 * 3600.0, self.read_bill)}

    def read_bill(self, first_day: str, last_day: str) -> list[Charge] | DriverError:
        self.reads.append((first_day, last_day))
        if isinstance(self.bill, Exception):
            raise self.bill  # a driver's bug
        if isinstance(self.bill, DriverError):
            return self.bill
        return [c for c in self.bill if first_day <= c.day <= last_day]

    def apply(self, plan: Plan, term: Term) -> list[bool]:
        self.plans.append(plan)
        for decision in plan.actions:
            self.actions.append((decision.action, term.token))
            if decision.action != "launch":
                continue
            assert decision.queue is not None and decision.provider is not None
            for _ in range(decision.count):
                worker_id = f"i-{len(self.workers)}"
                self.workers[worker_id] = WorkerState(
                    worker_id=worker_id,
                    queue=decision.queue,
                    status="active",
                    started_at=time.time(),
                    provider=decision.provider,
                    spot=decision.spot,
                    cost_per_hour_cents=self.price,
                )
        return [True] * len(plan.actions)


def hybrid_config(**cost_limits: int) -> scheduler_config.SchedulerConfig:
    data: dict[str, Any] = copy.deepcopy(json.loads(scheduler_config.SHIPPED.read_text()))
    data["mode"] = "hybrid"
    data["cloud_providers"]["aws"].update(enabled=True, ami_id="ami-0123456789abcdef0")
    data["queues"]["ocr"].update(cloud_enabled=True, cloud_provider="aws")
    data["cost_limits"].update(cost_limits)
    return scheduler_config.parse(data)


@pytest.fixture
def stack(pg_engine, settings):
    opened = Stack.open(settings(), engine=pg_engine, auto_migrate=True)
    yield opened
    opened.close()


def scheduler(
    stack: Stack,
    holder: str,
    fleet: MemoryFleet,
    ttl: float = 60,
    clock: Clock | None = None,
    metrics: MemoryRecorder | None = None,
    **limits: int,
) -> Scheduler:
    leadership = Leadership(stack.redis, stack.settings.redis_prefix, holder, ttl)
    return Scheduler(
        hybrid_config(**limits),
        stack.engine,
        stack.queue,
        leadership,
        clock or SystemClock(),
        fleet,
        metrics=metrics,
    )


def backlog(stack: Stack, queue: str, count: int, priority: int = 5) -> list[str]:
    jobs = [ids.new_id() for _ in range(count)]
    stack.queue.enqueue(queue, [(job, priority) for job in jobs])
    return jobs


def recorded(stack: Stack) -> list[Any]:
    with transaction(stack.engine) as conn:
        d = t.scheduler_decisions
        return list(conn.execute(select(d).order_by(d.c.decision_id)))


def test_the_snapshot_reads_depth_and_age_per_band(stack):
    backlog(stack, "ocr", 4, priority=2)
    backlog(stack, "ocr", 7, priority=8)
    observed = scheduler(stack, "a", MemoryFleet()).observe()
    ocr = observed.queues["ocr"]
    assert ocr.depth == 11
    assert dict(ocr.depth_by_band) == {"1-3": 4, "7-10": 7}
    assert 0 <= ocr.oldest_age_seconds < 60
    assert observed.queues["images"].depth == 0
    assert observed.spend.last_hour_cents == 0 and not observed.spend.locked


def test_only_the_leader_acts_and_the_other_takes_over(stack):
    backlog(stack, "ocr", 30)
    fleet_a, fleet_b = MemoryFleet(), MemoryFleet()
    a = scheduler(stack, "host-a", fleet_a, ttl=1.0)
    b = scheduler(stack, "host-b", fleet_b, ttl=1.0)

    first = a.evaluate()
    assert first.term is not None
    assert [d.action for d in first.decisions if d.action == "launch"], first.decisions
    second = b.evaluate()
    assert second.term is None  # it decided, but applied and recorded nothing
    assert fleet_a.actions and not fleet_b.actions
    rows = recorded(stack)
    assert rows and {r.details["holder"] for r in rows} == {"host-a"}
    launch = next(r for r in rows if r.action == "launch")
    assert launch.applied and launch.queue == "ocr" and "ocr" in launch.reason

    time.sleep(1.2)  # host-a dies: its lease runs out
    taken = b.evaluate()
    assert taken.term is not None and taken.term.token > first.term.token
    assert a.evaluate().term is None
    assert {r.details["holder"] for r in recorded(stack)} == {"host-a", "host-b"}


def test_the_daily_cap_locks_until_reset_and_the_lock_survives_a_restart(stack):
    # Noon UTC on the scheduler's clock: three hours of today are behind it at any hour
    # the test runs (just after midnight, a real clock's "today" holds minutes).
    now = datetime.now(UTC).replace(hour=12, minute=0, second=0, microsecond=0)
    noon = ManualClock(now.timestamp())
    with transaction(stack.engine) as conn:
        conn.execute(
            t.cloud_spend.insert().values(
                provider="aws",
                instance_id="i-old",
                node_type="ocr",
                region="eu-west-3",
                spot=False,
                price_per_hour_microusd=2_000_000,  # $2/h = 200 cents/h
                launched_at=now - timedelta(hours=3),
                terminated_at=None,
            )
        )
    backlog(stack, "ocr", 50)
    fleet = MemoryFleet()
    metrics = MemoryRecorder()
    # 200 c/h for 3 hours today; a daily cap of 100 cents is passed.
    first = scheduler(
        stack,
        "a",
        fleet,
        clock=noon,
        metrics=metrics,
        max_daily_spend_cents=100,
        alert_threshold_cents=50,
    )
    evaluation = first.evaluate()
    actions = [d.action for d in evaluation.decisions]
    assert "lock" in actions and "launch" not in actions
    with transaction(stack.engine) as conn:
        assert read_state(conn, COST_LOCK) is not None
    # The turn's spend against the caps (the lock comes with this turn's decisions).
    assert metrics.value(SPEND, window="day") == pytest.approx(600, abs=1)
    assert metrics.value(SPEND, window="hour") == pytest.approx(200, abs=1)
    assert metrics.value(SPEND_CAP, window="day") == 100
    assert metrics.value(SPEND_CAP, window="hour") == 500
    assert metrics.value(SPEND_ALERT) == 50
    assert metrics.value(COST_LOCKED) == 0
    assert metrics.value(LAST_EVALUATION) == noon.now()
    first.stop()

    # A new process (a restart) finds the lock and stays on the VPS.
    again = scheduler(
        stack,
        "b",
        fleet,
        clock=noon,
        metrics=metrics,
        max_daily_spend_cents=100_000,
        alert_threshold_cents=50,
    )
    observed = again.observe()
    assert observed.spend.locked
    assert "launch" not in [d.action for d in again.evaluate().decisions]
    assert metrics.value(COST_LOCKED) == 1
    # Every decision written is counted by its action, and only those.
    by_action: dict[str, int] = {}
    for row in recorded(stack):
        by_action[row.action] = by_action.get(row.action, 0) + 1
    assert by_action and "lock" in by_action
    assert {a: metrics.value(DECISIONS, action=a) for a in by_action} == by_action
    assert metrics.total(DECISIONS) == sum(by_action.values())
    lock = reset_cost_lock(stack.engine)
    assert lock is not None and "daily" in lock["reason"].lower()
    assert not again.observe().spend.locked


def test_each_turn_names_the_cloud_nodes_for_the_workers_gauge(stack):
    fleet = MemoryFleet()
    started = time.time()
    fleet.workers["i-0"] = WorkerState(
        "i-0", "ocr", "active", started, provider="aws", spot=True, node_id="ab12"
    )
    # Launched, not joined yet: no Ray node, no actor to label.
    fleet.workers["i-1"] = WorkerState("i-1", "ocr", "starting", started, provider="aws")
    metrics = MemoryRecorder()
    scheduler(stack, "a", fleet, metrics=metrics).evaluate()
    assert metrics.cloud_nodes == {"ab12": True}


def test_a_flood_alerts_the_operator_once_not_every_evaluation(stack):
    backlog(stack, "ocr", 150)
    fleet = MemoryFleet()
    first = scheduler(stack, "a", fleet)
    for _ in range(3):
        first.evaluate()
    alerts = [r for r in recorded(stack) if r.action == "alert" and r.queue == "ocr"]
    assert len(alerts) == 1, [r.reason for r in recorded(stack)]
    assert "150" in alerts[0].reason
    # The history that paces it is kept across a restart.
    again = scheduler(stack, "a", fleet)
    assert "ocr" in again.observe().history.last_alert


def spend_row(conn, instance: str, start: float, end: float | None, request: str | None = None):
    conn.execute(
        t.cloud_spend.insert().values(
            provider="aws",
            instance_id=instance,
            request_id=request,
            node_type="ocr",
            region="eu-west-3",
            spot=False,
            price_per_hour_microusd=170_000,  # 17 cents an hour
            launched_at=to_datetime(start),
            terminated_at=to_datetime(end) if end is not None else None,
        )
    )


def test_settled_bills_are_reconciled_with_the_ledger_and_differences_alerted(stack, caplog):
    monday = billing.day_start("2026-11-30")
    hour = 3600.0
    with transaction(stack.engine) as conn:
        spend_row(conn, "i-fair", monday + 10 * hour, monday + 11 * hour, "req-fair")
        spend_row(conn, "i-odd", monday + 10 * hour, monday + 11 * hour, "req-odd")
        spend_row(conn, "i-long", monday + 9 * hour, None, "req-long")  # still running
    fleet = MemoryFleet()
    fleet.bill = [
        Charge("2026-11-30", 17.1, instance_id="i-fair"),
        Charge("2026-11-30", 40.0, request_id="req-odd"),  # a surprise, found by its tag
        Charge("2026-11-30", 15 * 17.0, request_id="req-long"),  # 09:00 .. 24:00
        Charge("2026-11-30", 60.0, request_id="req-stray"),  # nothing the ledger knows
        Charge("2026-12-01", 24 * 17.0, request_id="req-long"),
    ]
    # Tuesday noon: nothing has settled (48 h): the bill is not read.
    clock = ManualClock(monday + 36 * hour)
    loop = scheduler(stack, "a", fleet, clock=clock)
    assert loop.reconcile(clock.now()) == []
    assert fleet.reads == []
    # Thursday 00:30: Monday and both ended instances have settled; one read covers them.
    clock.advance(36.5 * hour)
    with caplog.at_level(logging.WARNING, logger="autoscaler.scheduler"):
        loop.evaluate()
    assert fleet.reads == [("2026-11-30", "2026-11-30")]
    warned = [r.getMessage() for r in caplog.records if r.name == "autoscaler.scheduler"]
    assert warned == [
        "aws's bill for instance i-odd is $0.40, the ledger counted $0.17",
        "aws's bill for the day 2026-11-30 is $3.72, the ledger counted $2.89 ($0.60 of it on"
        " resources the ledger does not know)",
    ]
    with transaction(stack.engine) as conn:
        rows = {r.instance_id: r for r in conn.execute(select(t.cloud_spend))}
        sent = conn.execute(select(t.alerts).where(t.alerts.c.rule == "billing")).all()
        state = read_state(conn, RECONCILED)
    assert rows["i-fair"].billed_microusd == 171_000 and rows["i-fair"].reconciled_at is not None
    assert rows["i-odd"].billed_microusd == 400_000 and rows["i-odd"].reconciled_at is not None
    assert rows["i-long"].reconciled_at is None  # running: never settled as a whole
    assert sorted(a.summary for a in sent) == sorted(warned)
    assert {a.level for a in sent} == {"warning"}
    assert state is not None and state["providers"]["aws"]["compared"] == ["2026-11-30"]
    # Within 15 minutes nothing is checked; after them nothing is pending: no read.
    loop.evaluate()
    clock.advance(20 * 60)
    loop.evaluate()
    assert fleet.reads == [("2026-11-30", "2026-11-30")]
    # Friday 00:30: Tuesday has settled: the running instance's day, read alone, agrees.
    clock.advance(24 * hour)
    assert loop.reconcile(clock.now()) == []
    assert fleet.reads[1:] == [("2026-12-01", "2026-12-01")]


@pytest.mark.parametrize("failure", ["error", "exception"])
def test_a_bill_that_cannot_be_read_is_tried_again_after_its_interval(stack, caplog, failure):
    monday = billing.day_start("2026-11-30")
    with transaction(stack.engine) as conn:
        spend_row(conn, "i-1", monday + 3600, monday + 7200)
    fleet = MemoryFleet()
    fleet.bill = (
        DriverError("auth", "AccessDenied: ce:GetCostAndUsage")
        if failure == "error"
        else KeyError("AccessDenied: ce:GetCostAndUsage")  # a parse that went wrong
    )
    clock = ManualClock(monday + 4 * 86_400)
    loop = scheduler(stack, "a", fleet, clock=clock)
    with caplog.at_level(logging.WARNING, logger="autoscaler.scheduler"):
        assert loop.reconcile(clock.now()) == []
    assert any("ce:GetCostAndUsage" in r.getMessage() for r in caplog.records)
    clock.advance(3600)  # a check every 15 min, but the reader's interval is 6 h
    loop.reconcile(clock.now())
    assert len(fleet.reads) == 1
    with transaction(stack.engine) as conn:
        state = read_state(conn, RECONCILED)
        row = conn.execute(select(t.cloud_spend)).one()
    assert state is not None and "AccessDenied" in state["providers"]["aws"]["error"]
    assert row.reconciled_at is None
    fleet.bill = [Charge("2026-11-30", 17.0, instance_id="i-1")]
    clock.advance(5 * 3600)
    assert loop.reconcile(clock.now()) == []
    assert len(fleet.reads) == 2
    with transaction(stack.engine) as conn:
        state = read_state(conn, RECONCILED)
        row = conn.execute(select(t.cloud_spend)).one()
    assert state is not None and state["providers"]["aws"]["error"] is None
    assert row.reconciled_at is not None and row.billed_microusd == 170_000


def test_the_fleet_gets_one_plan_with_the_workers_wanted_per_queue(stack):
    backlog(stack, "ocr", 30)
    fleet = MemoryFleet()
    first = scheduler(stack, "host-a", fleet).evaluate()
    launched = sum(d.count for d in first.decisions if d.action == "launch")
    assert launched >= 1
    assert len(fleet.plans) == 1
    plan = fleet.plans[0]
    assert plan.desired["ocr"] == launched
    assert set(plan.desired) == set(hybrid_config().queues)
    assert all(n == 0 for q, n in plan.desired.items() if q != "ocr")
    assert [d.action for d in plan.actions] == ["launch"] * len(plan.actions)


def test_a_standing_hold_is_recorded_once_not_every_turn(stack):
    jobs = backlog(stack, "ocr", 30)
    fleet = MemoryFleet(price_cents=17.0)
    leader = scheduler(stack, "host-a", fleet, max_hourly_spend_cents=10)  # below one instance
    turns = [leader.evaluate() for _ in range(4)]
    for turn in turns:
        assert [d.action for d in turn.decisions] == ["hold"], turn.decisions
        assert "hourly cap" in turn.decisions[0].reason
    rows = [r for r in recorded(stack) if r.action == "hold"]
    assert len(rows) == 1  # recorded when it began, not on each of the 4 turns

    jobs += backlog(stack, "ocr", 1)
    time.sleep(1.1)  # the numbers in the reason change; the hold is the same
    assert [d.action for d in leader.evaluate().decisions] == ["hold"]
    assert len([r for r in recorded(stack) if r.action == "hold"]) == 1

    stack.queue.remove("ocr", jobs)  # the hold ends ...
    assert leader.evaluate().decisions == []
    backlog(stack, "ocr", 30)  # ... and begins again: recorded again
    assert [d.action for d in leader.evaluate().decisions] == ["hold"]
    assert len([r for r in recorded(stack) if r.action == "hold"]) == 2


# -- long transcodes: counted from the record, routed to spot ---------------------------------


def media(stack: Stack, person: Person, kind: str, seconds: float) -> str:
    """An upload whose inspection states its length, as ingest records it."""
    object_id = ids.new_id()
    mime = "video/mp4" if kind == "video" else "audio/mp4"
    with transaction(stack.engine) as conn:
        objects.register_object(
            conn,
            person.caller,
            object_id=object_id,
            pool_id=person.pool_id,
            storage_key=f"originals/{person.pool_id}/{object_id}",
            filename=f"take.{kind}",
            size_bytes=50 * 1024 * 1024,
            now=stack.clock.now(),
            inspection=Inspection(kind, mime, {"label": mime, "duration_seconds": seconds}),
        )
    return object_id


def test_the_loop_counts_long_transcodes_from_the_record_and_sends_them_to_spot(engine, settings):
    """The routing rule for long transcodes fires on the live loop: queued jobs whose
    input states a length over 30 minutes, under a profile whose wall clock lets them
    run that long, make ``long_jobs``; the launch for their queue is spot."""
    stack = Stack.open(settings(), engine=engine, auto_migrate=True)
    try:
        person = make_user(stack)

        def transcode(kind: str, seconds: float) -> str:
            object_id = media(stack, person, kind, seconds)
            (job_id,) = submit(stack, person, [f"transcode_{kind}"], object_id=object_id)
            return job_id

        transcode("video", 2400.0)  # 40 min: long
        transcode("video", 6000.0)  # 100 min: long
        transcode("video", 600.0)  # 10 min
        # 3 h of audio, but its profile's wall clock (900 s x 1.5) ends it before 30 min.
        transcode("audio", 10800.0)
        # Long, but cancelled: not waiting.
        stack.ingest.cancel(person.caller, transcode("video", 3000.0))
        backlog(stack, "media", 10)  # the depth that triggers a scale-up

        data: dict[str, Any] = copy.deepcopy(json.loads(scheduler_config.SHIPPED.read_text()))
        data["mode"] = "hybrid"
        data["cloud_providers"]["aws"].update(enabled=True, ami_id="ami-0123456789abcdef0")
        data["queues"]["media"].update(cloud_enabled=True, cloud_provider="aws")
        fleet = MemoryFleet(price_cents=12.0)  # spot at 4 c/h, under spot_max_price
        loop = Scheduler(
            scheduler_config.parse(data),
            stack.engine,
            stack.queue,
            Leadership(stack.redis, stack.settings.redis_prefix, "host-a", 60),
            SystemClock(),
            fleet,
        )

        observed = loop.observe()
        assert observed.queues["media"].depth == 14
        assert observed.queues["media"].long_jobs == 2
        assert {q.long_jobs for name, q in observed.queues.items() if name != "media"} == {0}

        evaluation = loop.evaluate()
        launches = [d for d in evaluation.decisions if d.action == "launch"]
        assert launches and {d.queue for d in launches} == {"media"}, evaluation.decisions
        assert all(d.spot for d in launches)
        assert "long transcodes waiting: spot with checkpoints" in launches[0].reason
        (row,) = [r for r in recorded(stack) if r.action == "launch"]
        assert row.details["spot"] and "long transcodes" in row.reason

        # Once they no longer wait, they no longer count.
        with transaction(stack.engine) as conn:
            waiting = list(
                conn.execute(
                    select(t.jobs.c.job_id).where(
                        t.jobs.c.queue == "media", t.jobs.c.status == "queued"
                    )
                ).scalars()
            )
        assert len(waiting) == 4
        for job_id in waiting:
            stack.ingest.cancel(person.caller, job_id)
        assert loop.observe().queues["media"].long_jobs == 0
    finally:
        stack.close()


def test_the_snapshot_carries_each_queues_recent_load(stack):
    """The policy's estimates on the live loop: jobs created in the last 30 minutes, as a
    rate per hour, and the mean run time of the queue's recently completed attempts."""
    person = make_user(stack)
    job_ids = submit(stack, person, ["thumbnail"]) + submit(stack, person, ["thumbnail"])
    now = datetime.now(UTC)
    with transaction(stack.engine) as conn:
        (queue,) = set(
            conn.execute(select(t.jobs.c.queue).where(t.jobs.c.job_id.in_(job_ids))).scalars()
        )
        for n, (job_id, ms) in enumerate(zip(job_ids, (2000, 4000), strict=True)):
            conn.execute(
                t.attempts.insert().values(
                    job_id=job_id,
                    attempt_number=1,
                    worker_id=f"w-{n}",
                    status="completed",
                    started_at=now,
                    finished_at=now,
                    duration_ms=ms,
                )
            )
        conn.execute(t.jobs.update().where(t.jobs.c.job_id.in_(job_ids)).values(completed_at=now))
        # a job created an hour ago is out of the rate (its attempt still counts in the mean)
        conn.execute(
            t.jobs.update()
            .where(t.jobs.c.job_id == job_ids[0])
            .values(created_at=now - timedelta(hours=1))
        )
    observed = scheduler(stack, "a", MemoryFleet()).observe().queues
    assert observed[queue].arrivals_per_hour == pytest.approx(1 * 3600 / RATE_WINDOW_SECONDS)
    assert observed[queue].mean_run_seconds == pytest.approx(3.0)
    others = [q for name, q in observed.items() if name != queue]
    assert {(q.arrivals_per_hour, q.mean_run_seconds) for q in others} == {(0.0, None)}


def test_the_record_replays_as_a_trace(stack):
    """``simulate --from-db --since``: the jobs created in the window, at their times
    from the first, with their last completed attempt's run time, else their queue's
    mean; then simulated like a trace file."""
    from autoscaler import recorded, simulate

    person = make_user(stack)
    job_ids = [submit(stack, person, ["thumbnail"], priority=p)[0] for p in (2, 5, 8)]
    base = datetime.now(UTC) - timedelta(hours=2)
    with transaction(stack.engine) as conn:
        for n, job_id in enumerate(job_ids):
            conn.execute(
                t.jobs.update()
                .where(t.jobs.c.job_id == job_id)
                .values(created_at=base + timedelta(seconds=30 * n))
            )
        for number, ms, status in ((1, 9000, "failed"), (2, 4000, "completed")):
            conn.execute(
                t.attempts.insert().values(
                    job_id=job_ids[0],
                    attempt_number=number,
                    worker_id="w-1",
                    status=status,
                    started_at=base,
                    finished_at=base,
                    duration_ms=ms,
                )
            )
        (queue,) = set(conn.execute(select(t.jobs.c.queue)).scalars())
    now = time.time()
    with transaction(stack.engine) as conn:
        replayed = recorded.arrivals(conn, now, recorded.parse_span("3h"))
        assert recorded.arrivals(conn, now, recorded.parse_span("90m")) == []
    assert [(a.at, a.queue, a.priority, a.duration) for a in replayed] == [
        (0.0, queue, 2, 4.0),  # its completed attempt, not the failed one
        (30.0, queue, 5, 4.0),  # never ran: the queue's mean
        (60.0, queue, 8, 4.0),
    ]
    assert recorded.parse_span("7d") == 7 * 86_400 and recorded.parse_span("90") == 90
    with pytest.raises(ValueError, match="--since 'soon'"):
        recorded.parse_span("soon")
    report = simulate.simulate(hybrid_config(), replayed)
    assert report.jobs == 3 and report.unfinished == 0


# Attempts enough that reading them all takes a while: 600k, read in 0.45 s by two
# parallel workers on the shared machine (1.4-2 s by their index); the window's own job
# by its attempts' index in a few ms.
MANY_ATTEMPTS = 60_000


def _replayed_record(stack: Stack, old_attempts: int, window_failed: int) -> str:
    """Two jobs: one created 30 days ago with ``old_attempts`` completed attempts, one a
    minute ago whose first attempt completed in 4 s and ``window_failed`` later ones
    failed; answers the second's queue."""
    person = make_user(stack)
    old, new = (submit(stack, person, ["thumbnail"])[0] for _ in range(2))
    now = datetime.now(UTC)
    naive = now.replace(tzinfo=None)  # job_attempts' timestamps: UTC, without a zone
    with transaction(stack.engine) as conn:
        for job_id, age in ((old, timedelta(days=30)), (new, timedelta(minutes=1))):
            conn.execute(
                t.jobs.update().where(t.jobs.c.job_id == job_id).values(created_at=now - age)
            )
        for job_id, first, last, status in (
            (old, 1, old_attempts, "completed"),
            (new, 1, 1, "completed"),
            (new, 2, window_failed + 1, "failed"),
        ):
            conn.exec_driver_sql(
                "INSERT INTO job_attempts (job_id, attempt_number, worker_id, status,"
                " started_at, finished_at, duration_ms)"
                " SELECT %(job)s, n, 'w-1', %(status)s, %(at)s, %(at)s, 4000"
                " FROM generate_series(%(first)s::int, %(last)s::int) AS n",
                {"job": job_id, "status": status, "at": naive, "first": first, "last": last},
            )
        conn.exec_driver_sql("ANALYZE job_attempts")
        queue: str = conn.execute(select(t.jobs.c.queue).where(t.jobs.c.job_id == new)).scalar_one()
    return queue


def test_the_records_replay_reads_the_attempts_of_its_windows_jobs_only(stack):
    """The replay's run times come from the attempts of the window's jobs: with
    60k attempts of a job a month old, an hour's replay reads a few pages of the
    record (its statement, explained with its buffers), not job_attempts' thousands.
    Old: a GROUP BY over every completed attempt ever made (10 s on 3.2M attempts for
    any window, past the engine's 30 s limit at some 10M), cancelled."""
    from autoscaler import recorded

    queue = _replayed_record(stack, old_attempts=MANY_ATTEMPTS, window_failed=0)
    statements: list[tuple[str, Any]] = []

    def _keep(conn, cursor, statement, parameters, context, executemany):
        statements.append((statement, parameters))

    event.listen(stack.engine, "before_cursor_execute", _keep)
    try:
        with snapshot(stack.engine) as conn:
            replayed = recorded.arrivals(conn, time.time(), 3600.0)
    finally:
        event.remove(stack.engine, "before_cursor_execute", _keep)
    assert [(a.at, a.queue, a.duration) for a in replayed] == [(0.0, queue, 4.0)]
    [(statement, parameters)] = [s for s in statements if "job_attempts" in s[0]]
    with snapshot(stack.engine) as conn:
        pages = conn.exec_driver_sql(
            "SELECT relpages FROM pg_class WHERE relname = 'job_attempts'"
        ).scalar_one()
        [plan] = conn.exec_driver_sql(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, parameters
        ).scalar_one()
    top = plan["Plan"]
    touched = top["Shared Hit Blocks"] + top["Shared Read Blocks"]
    assert pages > 300, pages  # the month-old job's attempts: what the old one read
    assert touched < 50, (touched, pages)


def test_the_records_replay_goes_without_the_statement_limit(stack, tmp_path):
    """``scheduler simulate --from-db`` is an operator's offline read, one statement as
    long as its window's jobs are many: the command lifts the engine's statement limit
    for it (as ``credits check`` does). Old: "database_unavailable: the database cannot
    take it now (statement cancelled ...)" past the limit, which asking again never
    cures.

    Checked on the setting itself: the server's statement_timeout in force when the
    replay's statement (the one reading job_attempts) runs is 0, under a limit of 5 s
    for everything else. (Racing a 3 ms limit with 60k attempts instead failed now and
    then on a loaded machine, on the command's other statements: its schema check,
    SQLAlchemy's first-connect queries.)"""
    from sqlalchemy.engine import Engine

    _replayed_record(stack, old_attempts=3, window_failed=3)
    env = {
        "HYPERMEDIA_DATABASE_URL": support.url_string(stack.engine),
        "HYPERMEDIA_DATA_DIR": str(tmp_path),
        "HYPERMEDIA_DATABASE_STATEMENT_SECONDS": "5",
    }
    limits: list[str] = []

    def _limit_in_force(conn, cursor, statement, parameters, context, executemany):
        if "job_attempts" in statement:
            shown = cursor.connection.execute("SHOW statement_timeout").fetchone()
            limits.append(shown[0])

    event.listen(Engine, "before_cursor_execute", _limit_in_force)
    try:
        said = CliRunner().invoke(
            app, ["scheduler", "simulate", "--from-db", "--since", "1h"], env=env
        )
    finally:
        event.remove(Engine, "before_cursor_execute", _limit_in_force)
    assert said.exit_code == 0, f"{said.output}{said.exception!r}"
    assert "the record, last 1h (1 jobs)" in said.output, said.output
    assert limits == ["0"], limits  # old: ["5s"]


def test_a_manual_burst_from_the_command_launches_with_an_empty_queue_until_it_ends(
    stack, tmp_path
):
    """`hypermedia scheduler burst ocr --workers 2 --for 2h` (the seed's stage 2): the
    leader's next turn launches two ocr workers with nothing queued; `--end` lets them
    go. Where nothing could launch them the command refuses, naming the key."""
    data: dict[str, Any] = copy.deepcopy(json.loads(scheduler_config.SHIPPED.read_text()))
    data["mode"] = "hybrid"
    data["cloud_providers"]["aws"].update(enabled=True, ami_id="ami-0123456789abcdef0")
    data["queues"]["ocr"].update(cloud_enabled=True, cloud_provider="aws")
    config_file = tmp_path / "scheduler.json"
    config_file.write_text(json.dumps(data))
    env = {
        "HYPERMEDIA_DATABASE_URL": support.url_string(stack.engine),
        "HYPERMEDIA_DATA_DIR": str(tmp_path),
        "HYPERMEDIA_SCHEDULER_CONFIG": str(config_file),
    }
    runner = CliRunner()
    said = runner.invoke(
        app, ["scheduler", "burst", "ocr", "--workers", "2", "--for", "2h"], env=env
    )
    assert said.exit_code == 0, said.output
    assert "ocr: 2 cloud workers until" in said.output
    fleet = MemoryFleet()
    loop = scheduler(stack, "a", fleet)
    first = loop.evaluate()
    launches = [d for d in first.decisions if d.action == "launch"]
    assert sum(d.count for d in launches) == 2 and launches[0].queue == "ocr"
    assert "manual burst" in launches[0].reason
    assert stack.queue.counts("ocr").ready == 0  # nothing was queued
    ended = runner.invoke(app, ["scheduler", "burst", "ocr", "--end"], env=env)
    assert ended.exit_code == 0 and "burst ended" in ended.output, ended.output
    assert scheduler(stack, "a", fleet).observe().bursts == {}
    # Refused where nothing could launch them, naming the key.
    for args, key in (
        (["images"], "queues.images.cloud_enabled"),
        (["ocr", "--workers", "11"], "queues.ocr.max_workers"),
        (["nope"], "queues.nope"),
    ):
        refused = runner.invoke(app, ["scheduler", "burst", *args], env=env)
        said_why = refused.output + str(refused.exception)  # the CLI's main prints it
        assert refused.exit_code != 0 and key in said_why, said_why
    data["mode"] = "vps_only"
    config_file.write_text(json.dumps(data))
    refused = runner.invoke(app, ["scheduler", "burst", "ocr"], env=env)
    assert refused.exit_code != 0 and "vps_only" in str(refused.exception), refused.output
