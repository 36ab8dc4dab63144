"""A scene for the status tests (``hypermedia status`` and the operator page): jobs in
every state on two queues moved by the real dispatcher, two workers, a cloud instance on
the ledger, and one scheduler turn (a launch decided, an alert firing), on PostgreSQL and
Redis, with a manual clock that ends at the real now (``status`` runs on the real one)."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

import pytest

from autoscaler import config as scheduler_config
from autoscaler.billing import Account
from autoscaler.config import ProviderName
from autoscaler.leader import Leadership, Term
from autoscaler.scheduler import Scheduler
from autoscaler.snapshot import Offer, Plan, WorkerState
from autoscaler.status import RATE_WINDOW_SECONDS
from hypermedia.clock import ManualClock, to_datetime
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.stack import Stack
from tests.factories import add_worker_row, make_user, open_stack, submit


class OneCloud:
    def __init__(self) -> None:
        self.launched: list[WorkerState] = []

    def cloud_workers(self, now: float, actors: Sequence[WorkerState]) -> list[WorkerState]:
        return list(self.launched)

    def offers(self, now: float) -> dict[ProviderName, Offer]:
        return {"aws": Offer("aws", 17.0, None)}

    def billing(self) -> dict[str, Account]:
        return {}

    def apply(self, plan: Plan, term: Term) -> list[bool]:
        for decision in plan.actions:
            assert decision.queue is not None
            self.launched.append(
                WorkerState("i-1", decision.queue, "active", time.time(), provider="aws")
            )
        return [True] * len(plan.actions)


def config_data() -> dict[str, Any]:
    data: dict[str, Any] = copy.deepcopy(json.loads(scheduler_config.SHIPPED.read_text()))
    data["mode"] = "hybrid"
    data["cloud_providers"]["aws"].update(enabled=True, ami_id="ami-0123456789abcdef0")
    data["queues"]["images"].update(max_workers=3, cloud_enabled=True, cloud_provider="aws")
    data["scaling_rules"]["scale_up"]["queue_depth_threshold"] = 5
    data["alerts"] = {"queue_depth": {"above": 5, "for_seconds": 0}}
    return data


@pytest.fixture
def clock() -> ManualClock:
    """20 minutes ago: the scene brings it to now (``status`` runs on the real clock)."""
    return ManualClock(time.time() - RATE_WINDOW_SECONDS - 300)


@pytest.fixture
def stack(pg_engine, settings, clock) -> Iterator[Stack]:
    opened = open_stack(settings, pg_engine, clock)
    yield opened
    opened.close()


@pytest.fixture
def scene(stack: Stack, clock: ManualClock) -> scheduler_config.SchedulerConfig:
    """Jobs in every state on two queues, two workers, an instance, a turn taken."""
    person = make_user(stack)
    old = submit(stack, person, ["thumbnail"], priority=2)  # created 20 min ago
    clock.advance(RATE_WINDOW_SECONDS + 300)
    images = [submit(stack, person, ["thumbnail"], priority=p)[0] for p in (2, 2, 5, 8) * 3]
    submit(stack, person, ["pdf_preview"], priority=5)
    now = to_datetime(clock.now())
    add_worker_row(stack.engine, "w-images", at=now, hostname="vps-1")
    add_worker_row(stack.engine, "w-docs", at=now - timedelta(seconds=50), queue="documents")
    with transaction(stack.engine) as conn:
        conn.execute(
            t.worker_metrics.insert().values(
                worker_id="w-images",
                recorded_at=now,
                cpu_percent=42.5,
                memory_mb=1.0,
                disk_free_mb=1.0,
                jobs_completed=0,
                jobs_failed=0,
                throughput_per_min=0.0,
            )
        )
        conn.execute(
            t.cloud_spend.insert().values(
                provider="aws",
                instance_id="i-0",
                node_type="images",
                region="eu-west-3",
                spot=True,
                price_per_hour_microusd=1_700_000,
                launched_at=now - timedelta(minutes=30),
            )
        )
    dispatcher = stack.dispatcher
    claimed = dispatcher.claim_and_start("images", "w-images", count=5)
    assert claimed[0].job_id == old[0]  # the oldest urgent one first
    dispatcher.complete(claimed[0], "w-images")
    dispatcher.complete(claimed[1], "w-images")
    dispatcher.fail(claimed[2], "w-images", "bad_input", "no", retryable=False)
    dispatcher.fail(claimed[3], "w-images", "timeout", "slow", retryable=True)
    # claimed[4] runs on: in flight
    assert images
    config = scheduler_config.parse(config_data())
    leadership = Leadership(stack.redis, stack.settings.redis_prefix, "status-test", 60)
    scheduler = Scheduler(config, stack.engine, stack.queue, leadership, clock, OneCloud(), [])
    evaluation = scheduler.evaluate()
    assert "launch" in [d.action for d in evaluation.decisions]
    return config


def bulk_runs(stack: Stack, clock: ManualClock) -> dict[str, str]:
    """Bulk runs as an operator watching a long one sees them (names -> run ids), each on
    its own pool: ``active`` (10 objects, 4 jobs a page: 3 completed and 1 failed 100 s
    after its create, 4 more queued: 40%, 0.04 jobs/s, ETA 150 s), ``paused`` (3 objects,
    none done), ``old`` (no total: from before migration 0027, while it scans: one job
    queued), ``completed`` (2 objects, both done) and three cancelled before any job:
    ``cancelled-1`` (finished first: older than the three shown), ``cancelled-2`` and
    ``cancelled-3`` (the last to finish)."""
    from hypermedia.bulk.runner import BulkRunner
    from hypermedia.bulk.runs import RunSpec
    from hypermedia.bulk.service import BulkService
    from hypermedia.jobs.catalog import ProfileCatalog
    from hypermedia.jobs.dispatcher import Dispatcher
    from hypermedia.jobs.repository import FinishedJob, OutputRecord
    from hypermedia.storage.base import derived_key
    from tests.factories import make_object

    catalog = ProfileCatalog.load(stack.engine)
    service = BulkService(stack.engine, stack.queue, catalog, clock=clock)
    runner = BulkRunner(stack.engine, stack.queue, clock=clock)
    dispatcher = Dispatcher(stack.engine, stack.queue, catalog, clock=clock)

    def pool(n: int) -> str:
        person = make_user(stack)
        for _ in range(n):
            make_object(stack, person)
        return person.pool_id

    def run(pool_id: str, **kw: Any) -> str:
        spec = RunSpec(kind="backfill", operation="thumbnail", filter={"pool_id": pool_id}, **kw)
        return service.create(spec, "ops").run_id

    def complete(job: Any, pool_id: str) -> FinishedJob:
        profile = catalog.by_id(job.profile_id)
        assert profile is not None
        key = derived_key(pool_id, job.object_id, profile.version, "thumbnail-out")
        return FinishedJob(job.job_id, [OutputRecord("thumbnail-out", key, 10, "image/webp")])

    made: dict[str, str] = {}
    done_pool, active_pool, other_pool = pool(2), pool(10), pool(3)
    made["cancelled-1"] = run(other_pool)
    service.act(made["cancelled-1"], "cancel")
    clock.advance(60)
    made["completed"] = run(done_pool)
    for _ in range(5):
        if runner.step(made["completed"]).state == "completed":
            break
        claimed = dispatcher.claim_and_start("bulk", "w-bulk", count=10)
        dispatcher.complete_many("w-bulk", [complete(job, done_pool) for job in claimed])
    clock.advance(60)
    for name in ("cancelled-2", "cancelled-3"):
        made[name] = run(other_pool)
        service.act(made[name], "cancel")
        clock.advance(60)

    made["active"] = run(active_pool, max_in_flight=4, batch_size=4)
    runner.step(made["active"])
    clock.advance(100)
    claimed = dispatcher.claim_and_start("bulk", "w-bulk", count=4)
    assert len(claimed) == 4
    dispatcher.complete_many("w-bulk", [complete(job, active_pool) for job in claimed[:3]])
    dispatcher.fail(claimed[3], "w-bulk", "bad_input", "no", retryable=False)
    runner.step(made["active"])  # 4 more queued

    made["paused"] = run(other_pool)
    service.act(made["paused"], "pause")
    made["old"] = run(other_pool, max_in_flight=1, batch_size=1)
    runner.step(made["old"])
    with transaction(stack.engine) as conn:  # as a run made before totals were counted
        conn.execute(
            t.bulk_runs.update().where(t.bulk_runs.c.run_id == made["old"]).values(total=None)
        )
    return made
