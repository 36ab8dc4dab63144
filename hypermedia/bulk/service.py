"""What an operator does with bulk runs: create one (or only estimate it), look at it,
pause, resume or cancel it. The CLI (``hypermedia bulk``) and the operator-only API
routes both call this; the head's :class:`~hypermedia.bulk.runner.BulkRunner` does the
work.
"""

from __future__ import annotations

import hashlib
import logging
import statistics
from collections.abc import Callable, Collection
from dataclasses import dataclass

from sqlalchemy import Engine, select
from sqlalchemy.exc import IntegrityError

from hypermedia.bulk import runs
from hypermedia.bulk import select as pages
from hypermedia.bulk.runner import plan_page, profile_of
from hypermedia.bulk.runs import (
    BULK_QUEUE,
    DEFAULT_PRIORITY,
    OWN_QUEUE_PRIORITY,
    RunSpec,
    RunState,
    RunView,
)
from hypermedia.clock import Clock, SystemClock
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.errors import IdempotencyKeyReused, InvalidRequest
from hypermedia.ingest.service import registered_operations, runnable_profile
from hypermedia.jobs.catalog import ProfileCatalog
from hypermedia.jobs.repository import JobRepository, forget_cancelled
from hypermedia.jobs.states import JobStatus
from hypermedia.queue.events import JobEvents
from hypermedia.queue.redis_queue import RedisQueue

log = logging.getLogger(__name__)

HISTORY_ATTEMPTS = 500  # completed attempts of the operation the CPU estimate averages


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a run's jobs go: a queue and a priority."""

    queue: str | None  # None: a migration (no job)
    priority: int


def place(
    spec: RunSpec, own_queue: str, configured: Collection[str], served: Collection[str]
) -> Placement:
    """The queue and priority of a run of ``spec`` whose operation's own queue is
    ``own_queue``: the one named (bulk or the own queue, configured and served by a
    worker, else InvalidRequest naming it); none named, the bulk queue at 8 where a
    worker serves it, else the operation's own queue at 10, the lowest, so that it runs
    after every user's job. ``served``: the queues that have or can get a worker; a run
    on another would be accepted and wait forever."""
    operation = spec.operation
    queue = spec.queue
    if queue is None:
        queue = BULK_QUEUE if BULK_QUEUE in served else own_queue
    elif queue not in (BULK_QUEUE, own_queue):
        raise InvalidRequest(
            f"queue must be {BULK_QUEUE!r} or {operation}'s own {own_queue!r}, not {queue!r}",
            queue=queue,
        )
    if queue not in configured:
        raise InvalidRequest(f"this server has no {queue!r} queue", queue=queue)
    if queue not in served:
        raise InvalidRequest(
            f"queue: no worker serves the {queue!r} queue here (the deployment gives it"
            f" none and no live worker has it): its jobs would wait forever; name"
            f" {operation}'s own queue {own_queue!r}, or give {queue!r} workers",
            queue=queue,
        )
    if spec.priority is not None:
        return Placement(queue, spec.priority)
    return Placement(queue, DEFAULT_PRIORITY if queue == BULK_QUEUE else OWN_QUEUE_PRIORITY)


@dataclass(frozen=True, slots=True)
class Estimate:
    """What a run would do, counted without writing anything."""

    kind: str
    operation: str | None
    queue: str | None
    priority: int
    objects: int  # jobs it would create (regenerate, backfill) or objects it would copy
    skipped: int
    unfit: int
    bytes: int
    mean_job_seconds: float | None  # from the operation's completed attempts
    history_attempts: int
    cpu_seconds: float | None


class BulkService:
    def __init__(
        self,
        engine: Engine,
        queue: RedisQueue,
        catalog: ProfileCatalog,
        *,
        clock: Clock | None = None,
        repository: JobRepository | None = None,
        queues: Collection[str] = (),
        implemented: Callable[[], Collection[str]] = registered_operations,
        served_queues: Callable[[], Collection[str]] | None = None,
    ) -> None:
        """``implemented``: the operations something here runs, as the stack's ingest
        has them (:attr:`~hypermedia.ingest.service.IngestService.implemented`);
        ``served_queues``: the queues that have or can get a worker
        (:attr:`~hypermedia.stack.Stack.served_queues`; None: every queue)."""
        self.engine = engine
        self.queue = queue
        self.catalog = catalog
        self.clock = clock or SystemClock()
        self.repository = repository or JobRepository()
        self.queues = tuple(queues) or tuple(queue.queues)
        self.implemented = implemented
        self.served_queues = served_queues
        self.events = JobEvents(queue.client, queue.prefix)

    def _resolve(self, spec: RunSpec) -> tuple[int | None, int | None, Placement]:
        """(profile_id, target version, placement) of a spec, refusing what cannot run."""
        if spec.kind == "migrate":
            return None, None, Placement(None, spec.priority or DEFAULT_PRIORITY)
        assert spec.operation is not None
        # As a submit: UnknownOperation for a name without a profile or without a step.
        profile = runnable_profile(self.catalog, spec.operation, self.implemented())
        served = self.queues if self.served_queues is None else self.served_queues()
        return profile.profile_id, profile.version, place(spec, profile.queue, self.queues, served)

    def create(self, spec: RunSpec, created_by: str, idempotency_key: str | None = None) -> RunView:
        """A new run; with ``idempotency_key``, a create ``created_by`` repeats (same key,
        same spec: a retry whose answer was lost) answers the first run and starts none,
        and the key under another spec is IdempotencyKeyReused. ``created_by`` (``api:
        <user id>``, ``cli:<login>``) is never None: keys are unique per creator, and a
        NULL one would collide with none (``uk_bulk_run_idempotency_key``)."""
        if idempotency_key is None:
            return self._create(spec, created_by, None, None)
        asked = hashlib.sha256(spec.model_dump_json().encode()).hexdigest()
        try:
            return self._create(spec, created_by, idempotency_key, asked)
        except IntegrityError:  # a concurrent create under the key won: answer its run
            return self._create(spec, created_by, idempotency_key, asked)

    def _create(
        self,
        spec: RunSpec,
        created_by: str,
        idempotency_key: str | None,
        asked: str | None,
    ) -> RunView:
        profile_id, version, placed = self._resolve(spec)
        now = self.clock.now()
        with transaction(self.engine) as conn:
            if idempotency_key is not None:
                first = runs.created_under(conn, created_by, idempotency_key)
                if first is not None:
                    if first.request_hash != asked:
                        raise IdempotencyKeyReused(
                            f"Idempotency-Key {idempotency_key!r} already created run"
                            f" {first.run_id} of another request: send this one under a"
                            " new key",
                            run_id=first.run_id,
                        )
                    return runs.view(conn, first.run_id, now)
            runs.check_filter(conn, spec.filter)
            account = None if spec.account is None else runs.find_account(conn, spec.account)
            if account is None and spec.kind != "migrate":
                runs.ensure_platform_user(conn, now)
            run_id = runs.insert_run(
                conn,
                spec,
                profile_id=profile_id,
                target_version=version,
                queue=placed.queue,
                priority=placed.priority,
                account_user_id=account,
                created_by=created_by,
                now=now,
                idempotency_key=idempotency_key,
                request_hash=asked,
            )
            if runs.count_total(conn, run_id) is None:
                log.warning(
                    "bulk run %s: its selection was not counted within %s s; it has no"
                    " total until its scan ends",
                    run_id,
                    runs.COUNT_SECONDS,
                    extra={"action": "bulk_create", "run_id": run_id},
                )
            view = runs.view(conn, run_id, now)
        log.info(
            "bulk run %s created: %s %s",
            run_id,
            spec.kind,
            spec.operation or "",
            extra={"action": "bulk_create", "run_id": run_id},
        )
        return view

    def estimate(self, spec: RunSpec) -> Estimate:
        """``--dry-run``: stream the run's pages as the runner would (nothing written)."""
        profile_id, version, placed = self._resolve(spec)
        objects = skipped = unfit = size = 0
        with transaction(self.engine) as conn:
            runs.check_filter(conn, spec.filter)
            # The account as the run would have it: its user id (a name is resolved).
            account = None if spec.account is None else runs.find_account(conn, spec.account)
            fake = _DryRun(spec, profile_id, version, placed, self.clock.now(), account)
            cursor: str | None = None
            if spec.kind == "migrate":
                assert spec.target is not None
                while True:
                    rows = conn.execute(
                        pages.migrate_page(fake, spec.target.name, cursor, spec.batch_size)
                    ).all()
                    if not rows:
                        break
                    objects += len(rows)
                    size += sum(int(r.size_bytes) for r in rows)
                    cursor = rows[-1].object_id
                return Estimate(
                    spec.kind, None, None, placed.priority, objects, 0, 0, size, None, 0, None
                )
            assert profile_id is not None
            profile = profile_of(conn, profile_id)
            while True:
                rows = conn.execute(pages.page(fake, cursor, spec.batch_size)).all()
                if not rows:
                    break
                plan = plan_page(fake, profile, rows, len(rows))
                objects += len(plan.jobs)
                skipped += plan.skipped
                unfit += plan.unfit
                sizes = {r.object_id: int(r.size_bytes) for r in rows}
                size += sum(sizes[j.object_id] for j in plan.jobs)
                cursor = rows[-1].object_id
            durations = list(
                conn.execute(
                    select(t.attempts.c.duration_ms)
                    .join(t.jobs, t.jobs.c.job_id == t.attempts.c.job_id)
                    .where(
                        t.jobs.c.operation == spec.operation,
                        t.attempts.c.status == "completed",
                        t.attempts.c.duration_ms.is_not(None),
                    )
                    .order_by(t.attempts.c.attempt_id.desc())
                    .limit(HISTORY_ATTEMPTS)
                ).scalars()
            )
        mean = statistics.fmean(durations) / 1000 if durations else None
        return Estimate(
            spec.kind,
            spec.operation,
            placed.queue,
            placed.priority,
            objects,
            skipped,
            unfit,
            size,
            mean,
            len(durations),
            None if mean is None else mean * objects,
        )

    def get(self, run_id: str) -> RunView:
        with transaction(self.engine) as conn:
            return runs.view(conn, run_id, self.clock.now())

    def list(self, limit: int = 50, cursor: str | None = None) -> runs.RunPage:
        """A page of runs, newest first; pass its ``next_cursor`` as ``cursor`` for the
        next (older) page."""
        with transaction(self.engine) as conn:
            return runs.list_runs(conn, limit, cursor, self.clock.now())

    def act(self, run_id: str, action: str) -> RunView:
        """``pause`` (no new jobs; those live finish), ``resume``, ``cancel`` (its queued
        jobs cancelled, its running ones asked to stop)."""
        now = self.clock.now()
        with transaction(self.engine) as conn:
            state = runs.change_state(conn, run_id, action, now)
        if state is RunState.CANCELLED:
            self._cancel_jobs(run_id)
        with transaction(self.engine) as conn:
            return runs.view(conn, run_id, self.clock.now())

    def throttle(self, run_id: str, max_in_flight: int) -> RunView:
        """Change a run's ``max_in_flight`` while it runs (or is paused)."""
        with transaction(self.engine) as conn:
            runs.set_max_in_flight(conn, run_id, max_in_flight, self.clock.now())
            return runs.view(conn, run_id, self.clock.now())

    def _cancel_jobs(self, run_id: str) -> None:
        j = t.jobs.c
        now = self.clock.now()
        with transaction(self.engine) as conn:
            live = conn.execute(
                select(j.job_id, j.user_id, j.queue).where(
                    j.bulk_run_id == run_id, j.status.in_(runs.LIVE_JOB_STATUSES)
                )
            ).all()
            cancelled: dict[str, list[str]] = {}
            for row in live:
                status = self.repository.cancel(conn, row.job_id, row.user_id, now)
                if status is JobStatus.CANCELLED:
                    cancelled.setdefault(row.queue, []).append(row.job_id)
        forget_cancelled(self.queue, self.events, cancelled, now, action="bulk_cancel")


@dataclass(frozen=True)
class _DryRun:
    """A run row's shape for the page queries, from a spec (nothing inserted)."""

    spec: RunSpec
    profile_id: int | None
    target_version: int | None
    placed: Placement
    now: float
    account_user_id: str | None  # the named account's user id (the spec may name it)

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def operation(self) -> str | None:
        return self.spec.operation

    @property
    def filter(self) -> dict[str, object]:
        return self.spec.filter.to_json()

    @property
    def queue(self) -> str | None:
        return self.placed.queue

    @property
    def priority(self) -> int:
        return self.placed.priority

    @property
    def created_at(self) -> object:
        from hypermedia.clock import to_datetime

        return to_datetime(self.now)
