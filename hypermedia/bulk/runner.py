"""The head's side of bulk runs: create their jobs, copy their objects, finish them.

:meth:`BulkRunner.tick` drives every run that is ``creating`` or ``draining``:

- regenerate / backfill: while fewer than ``max_in_flight`` of the run's jobs are live
  (queued, running, waiting for a retry), the next keyset page of objects
  (:mod:`hypermedia.bulk.select`) becomes jobs: objects already done at the target
  version are skipped, objects the operation would refuse (its ``accepts``, its input
  limits, its largest input) are counted ``unfit``, the rest get one job each at the
  run's priority on the run's queue. The jobs, the cursor and the counts commit in one
  transaction (with the run's row locked), then the jobs go to Redis; a head killed
  between the two leaves them queued in the record for the reconciler. Those a cancel
  ended between the two are not made ready by the push (the cancel's removal left a
  tombstone the push honours), so they never stand as ready demand. A head killed
  anywhere resumes from the committed cursor, and the unique ``(bulk_run_id,
  object_id)`` makes a second job for an object impossible whatever happens.
- migrate: each object of the page is copied from the head's storage to the run's
  target, its SHA-256 checked three ways (what the record says, what was read, what
  the target holds when read back), and only then is its record switched
  (``objects.storage_backend``). A mismatch counts ``failed`` and switches nothing.
- a run whose profile is no longer active (a new version deployed: its outputs would be
  the old version's) is paused with that reason, creating nothing more;
- when no object is left, a run is ``draining``; once none of its jobs is live, it is
  ``completed``.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, select, update

from hypermedia import accounts
from hypermedia.bulk import runs
from hypermedia.bulk import select as pages
from hypermedia.bulk.runs import RunState
from hypermedia.clock import Clock, SystemClock
from hypermedia.db import tables as t
from hypermedia.db.engine import snapshot, transaction
from hypermedia.errors import HypermediaError, InputRejected, PaymentRequired
from hypermedia.ids import new_id
from hypermedia.jobs.catalog import ProfileRecord, record_from_row
from hypermedia.jobs.repository import JobRepository, NewJob, NewSubmission, enqueue_new
from hypermedia.logs import Outage
from hypermedia.queue.redis_queue import RedisQueue
from hypermedia.sandbox.inspect import InputLimits, Inspection, check_operation
from hypermedia.storage import deletions
from hypermedia.storage.base import Storage, StorageUnavailable, storable_content_type

log = logging.getLogger(__name__)


@dataclass
class StepReport:
    """What one tick did to one run."""

    run_id: str
    created: int = 0
    skipped: int = 0
    unfit: int = 0
    migrated: int = 0
    failed: int = 0
    pages: int = 0
    state: str = ""


@dataclass
class _Room:
    """Jobs a step may still create in a run, counted when its cursor was ``cursor``."""

    left: int
    cursor: str | None


@dataclass
class _Page:
    jobs: list[NewJob] = field(default_factory=list)
    skipped: int = 0
    unfit: int = 0
    scanned: int = 0
    cursor: str | None = None
    end: bool = False


def profile_of(conn: Connection, profile_id: int) -> ProfileRecord:
    return record_from_row(conn.execute(select_profile(profile_id)).mappings().one())


def _pause(conn: Connection, run_id: str, now: float, why: str) -> None:
    """A run creating jobs pauses, the reason kept for the operator."""
    runs.move(conn, run_id, {RunState.CREATING}, RunState.PAUSED, now, reason=f"paused: {why}")


def _affordable(conn: Connection, user_id: str, jobs: list[NewJob]) -> int:
    """How many of ``jobs``, in order, the account's available credits reserve."""
    held = accounts.balance(conn, user_id)
    available = held.balance_millicredits - held.reserved_millicredits
    count = 0
    for job in jobs:
        available -= job.reserved_millicredits
        if available < 0:
            break
        count += 1
    return count


def select_profile(profile_id: int) -> Any:
    return select(t.profiles).where(t.profiles.c.profile_id == profile_id)


def plan_page(run: Any, profile: ProfileRecord, rows: Iterable[Any], room: int) -> _Page:
    """Split a page of objects into jobs to create (at most ``room``), skipped and unfit;
    the cursor stops at the last object dealt with."""
    plan = _Page()
    limits = InputLimits.from_dict(profile.input_limits)
    platform = run.account_user_id is None
    submission_id = new_id()
    for row in rows:
        if len(plan.jobs) >= room:
            return plan  # the cursor stays before this object: the next tick takes it
        plan.scanned += 1
        plan.cursor = row.object_id
        if row.done:
            plan.skipped += 1
            continue
        if int(row.size_bytes) > profile.max_input_bytes:
            plan.unfit += 1
            continue
        inspection = None if row.inspection is None else Inspection.from_dict(row.inspection)
        if inspection is not None:
            try:
                check_operation(inspection, run.operation, profile.accepts, limits)
            except InputRejected:
                plan.unfit += 1
                continue
        params = dict(profile.params)
        try:
            timeout = profile.job_timeout_seconds(params, inspection)
        except InputRejected:  # more pages than its time limit allows
            plan.unfit += 1
            continue
        estimate = 0 if platform else profile.estimate_millicredits(int(row.size_bytes))
        plan.jobs.append(
            NewJob(
                job_id=new_id(),
                submission_id=submission_id,
                object_id=row.object_id,
                profile_id=profile.profile_id,
                operation=run.operation,
                queue=run.queue,
                priority=run.priority,
                params=params,
                estimated_millicredits=estimate,
                # The platform's too: the most its priced units may cost it (its
                # ledger's spend), though its account holds nothing.
                reserved_millicredits=profile.reserve_millicredits(estimate, params, inspection),
                max_attempts=profile.max_attempts,
                timeout_seconds=timeout,
            )
        )
    return plan


def _drained(conn: Connection, run_id: str, kind: str, state: str) -> bool:
    """Whether a run in ``state`` is done draining: a migration at once, else once none
    of its jobs is live."""
    return state == RunState.DRAINING and (
        kind == "migrate" or runs.live_jobs(conn, run_id, 1) == 0
    )


def _exhausted(conn: Connection, run: Any) -> bool:
    """Whether a run creating jobs has no object left after its cursor."""
    if run is None or run.state != RunState.CREATING:
        return False
    return conn.execute(pages.page(run, run.cursor, 1)).first() is None


class BulkRunner:
    def __init__(
        self,
        engine: Engine,
        queue: RedisQueue,
        *,
        storage: Storage | None = None,
        clock: Clock | None = None,
        repository: JobRepository | None = None,
        max_pages_per_tick: int = 20,
        target_storage: Callable[[dict[str, Any]], Storage] | None = None,
    ) -> None:
        self.engine = engine
        self.queue = queue
        self.storage = storage
        self.clock = clock or SystemClock()
        self.repository = repository or JobRepository()
        self.max_pages = max_pages_per_tick
        self._target_storage = target_storage or open_target
        self._targets: dict[str, Storage] = {}

    # -- the loop -------------------------------------------------------------------

    def tick(self) -> list[StepReport]:
        """One pass over the active runs. What a pass only reads it reads in a
        :func:`~hypermedia.db.engine.snapshot`, a write transaction taken only for what
        it has to write (its condition read again in it): on SQLite a transaction takes
        the write lock, reads included, and this pass runs every ``bulk_poll_seconds``
        whether any run is active or not (an idle head took it 30 times a minute for
        the list of active runs, each API submit beside it waiting its turn)."""
        with snapshot(self.engine) as conn:
            run_ids = runs.active_ids(conn)
        return [self.step(run_id) for run_id in run_ids]

    def run(self, stop: threading.Event, interval: float) -> None:
        """Tick until ``stop`` (the head's bulk thread); a failed tick is logged (an
        outage once, then every few minutes while it lasts)."""
        outage = Outage(log, "bulk tick failed", extra={"action": "bulk"})
        while not stop.is_set():
            busy = False
            try:
                reports = self.tick()
                busy = any(r.pages and r.state == RunState.CREATING for r in reports)
                outage.succeeded()
            except HypermediaError as exc:
                outage.failed(exc)
            except Exception:
                log.exception("bulk tick failed unexpectedly", extra={"action": "bulk"})
            # A run with room goes on at once; else wait for jobs to finish.
            stop.wait(0.0 if busy else interval)

    def step(self, run_id: str) -> StepReport:
        """Up to ``max_pages_per_tick`` pages of one run. The cap is read once a step:
        the run's live jobs counted (up to the cap), then pages made until that room is
        used; jobs only end meanwhile, so one head never passes the cap. A page that
        finds the run's cursor moved by someone else (two heads driving one run at
        once) counts the room again under the run's lock, so two never pass it either."""
        report = StepReport(run_id)
        r = t.bulk_runs.c
        with snapshot(self.engine) as conn:
            row = conn.execute(
                select(r.kind, r.state, r.max_in_flight, r.cursor).where(r.run_id == run_id)
            ).one_or_none()
            if row is None:
                return report
            room = _Room(0, row.cursor)
            if row.kind != "migrate" and row.state == RunState.CREATING:
                room.left = row.max_in_flight - runs.live_jobs(conn, run_id, row.max_in_flight)
        if row.kind != "migrate" and row.state == RunState.CREATING and room.left <= 0:
            self._end_if_exhausted(run_id)  # at its cap: done creating if nothing is left
        for _ in range(self.max_pages):
            if row.kind == "migrate":
                more = self._migrate_page(run_id, report)
            else:
                more = self._one_page(run_id, report, room) and room.left > 0
            if not more:
                break
        with snapshot(self.engine) as conn:
            state = conn.execute(select(r.state).where(r.run_id == run_id)).scalar_one()
            drained = _drained(conn, run_id, row.kind, state)
        if drained:
            with transaction(self.engine) as conn:
                state = conn.execute(select(r.state).where(r.run_id == run_id)).scalar_one()
                if _drained(conn, run_id, row.kind, state):
                    runs.move(
                        conn, run_id, {RunState.DRAINING}, RunState.COMPLETED, self.clock.now()
                    )
                    state = RunState.COMPLETED.value
        report.state = state
        return report

    def _end_if_exhausted(self, run_id: str) -> None:
        """A run at its cap whose last page ended exactly at a page's end: if no object
        is left after its cursor, it is done creating (one row read, at most; the write
        lock only then)."""
        with snapshot(self.engine) as conn:
            if not _exhausted(conn, runs.read(conn, run_id)):
                return
        with transaction(self.engine) as conn:
            if _exhausted(conn, runs.lock(conn, run_id)):
                runs.move(conn, run_id, {RunState.CREATING}, RunState.DRAINING, self.clock.now())

    def _one_page(self, run_id: str, report: StepReport, room: _Room) -> bool:
        """One page of the run in one transaction, within ``room`` (updated); whether
        another may follow now."""
        now = self.clock.now()
        fresh: list[NewJob] = []
        if room.left <= 0:
            return False
        with transaction(self.engine) as conn:
            run = runs.lock(conn, run_id)
            if run is None or run.state != RunState.CREATING:
                return False
            if run.cursor != room.cursor:  # another head made pages since the count
                room.left = run.max_in_flight - runs.live_jobs(conn, run_id, run.max_in_flight)
                room.cursor = run.cursor
                if room.left <= 0:
                    return False
            row = conn.execute(select_profile(run.profile_id)).mappings().one()
            if not row["active"]:
                # A new version of the operation's profile was deployed: this run's jobs
                # would make the old version's outputs. Made no more; the operator
                # starts a run for the new version.
                _pause(
                    conn,
                    run_id,
                    now,
                    f"{run.operation}'s profile version {run.target_version} is no longer"
                    " active (a new version was deployed): cancel this run and start one"
                    " for the new version",
                )
                return False
            profile = record_from_row(row)
            rows = conn.execute(pages.page(run, run.cursor, run.batch_size)).all()
            plan = plan_page(run, profile, rows, room.left)
            if not rows:
                runs.move(conn, run_id, {RunState.CREATING}, RunState.DRAINING, now)
                return False
            user_id = run.account_user_id or runs.PLATFORM_USER_ID
            short: PaymentRequired | None = None
            try:
                fresh = self._create(conn, run_id, user_id, plan, now, run.account_user_id)
            except PaymentRequired as exc:
                # The account pays for fewer than the page's jobs: the ones it can pay
                # for are made (the cursor stops after the last), then the run pauses.
                short = exc
                affordable = _affordable(conn, user_id, plan.jobs)
                plan = plan_page(run, profile, rows, affordable)
                try:
                    fresh = self._create(conn, run_id, user_id, plan, now, run.account_user_id)
                except PaymentRequired:  # spent by another meanwhile
                    plan = _Page()
                if not plan.jobs:
                    _pause(conn, run_id, now, f"the account to charge is short: {exc.message}")
                    return False
            runs.advance(
                conn,
                run_id,
                plan.cursor,
                now,
                scanned=plan.scanned,
                created_jobs=len(fresh),
                skipped=plan.skipped + (len(plan.jobs) - len(fresh)),
                unfit=plan.unfit,
            )
            # A short page dealt with to its end was the last: no object is left (one
            # stored since comes after the cursor and is not this run's to wait for).
            last = len(rows) < run.batch_size and plan.scanned == len(rows)
            if short is not None:
                _pause(conn, run_id, now, f"the account to charge is short: {short.message}")
            elif last:
                runs.move(conn, run_id, {RunState.CREATING}, RunState.DRAINING, now)
        room.left -= len(fresh)
        if plan.cursor is not None:
            room.cursor = plan.cursor
        enqueue_new(self.queue, fresh, action="bulk_enqueue")
        report.pages += 1
        report.created += len(fresh)
        report.skipped += plan.skipped
        report.unfit += plan.unfit
        return not last and short is None

    def _create(
        self,
        conn: Connection,
        run_id: str,
        user_id: str,
        plan: _Page,
        now: float,
        account_user_id: str | None,
    ) -> list[NewJob]:
        """A page's jobs in the record (reserved first when the run names an account)."""
        submission = NewSubmission(
            plan.jobs[0].submission_id if plan.jobs else new_id(),
            None,
            f"bulk:{run_id}",
            tuple(plan.jobs),
        )
        return self.repository.create_bulk(
            conn, run_id, user_id, submission, now, reserve=account_user_id is not None
        )

    # -- migrate --------------------------------------------------------------------------

    def _migrate_page(self, run_id: str, report: StepReport) -> bool:
        if self.storage is None:
            raise HypermediaError("this runner has no storage to migrate from")
        with transaction(self.engine) as conn:
            run = runs.lock(conn, run_id)
            if run is None or run.state != RunState.CREATING:
                return False
            target_spec = runs.MigrateTarget.model_validate(run.target)
            rows = conn.execute(
                pages.migrate_page(run, target_spec.name, run.cursor, run.batch_size)
            ).all()
            if not rows:
                runs.move(conn, run_id, {RunState.CREATING}, RunState.DRAINING, self.clock.now())
                return False
        target = self._target(target_spec)
        migrated = failed = 0
        for row in rows:
            problem = copy_verified(
                self.storage, target, row.storage_key, row.sha256, row.content_type
            )
            if problem is None:
                with transaction(self.engine) as conn:
                    # Switched only now that its copy is verified, only if nobody
                    # switched it elsewhere meanwhile, and only while it is not deleted:
                    # a deletion that committed first recorded no copy here (its row
                    # said none, as of its lock), so this one records its copy's.
                    switched = conn.execute(
                        update(t.objects)
                        .where(
                            t.objects.c.object_id == row.object_id,
                            t.objects.c.deleted_at.is_(None),
                            t.objects.c.storage_backend.is_(None)
                            if row.storage_backend is None
                            else t.objects.c.storage_backend == row.storage_backend,
                        )
                        .values(storage_backend=target_spec.name)
                    ).rowcount
                    if (
                        not switched
                        and conn.execute(
                            select(t.objects.c.deleted_at.is_not(None)).where(
                                t.objects.c.object_id == row.object_id
                            )
                        ).scalar()
                    ):
                        deletions.record(
                            conn,
                            row.object_id,
                            [row.storage_key],
                            self.clock.now(),
                            backend=target_spec.name,
                        )
                migrated += 1
            else:
                failed += 1
                log.warning(
                    "bulk migrate: %s not switched: %s",
                    row.object_id,
                    problem,
                    extra={"action": "bulk_migrate", "object_id": row.object_id},
                )
        with transaction(self.engine) as conn:
            runs.advance(
                conn,
                run_id,
                rows[-1].object_id,
                self.clock.now(),
                scanned=len(rows),
                migrated=migrated,
                failed=failed,
            )
            last = len(rows) < run.batch_size
            if last:
                runs.move(conn, run_id, {RunState.CREATING}, RunState.DRAINING, self.clock.now())
        report.pages += 1
        report.migrated += migrated
        report.failed += failed
        return not last

    def _target(self, spec: runs.MigrateTarget) -> Storage:
        storage = self._targets.get(spec.name)
        if storage is None:
            storage = self._target_storage(spec.model_dump())
            self._targets[spec.name] = storage
        return storage


def open_target(spec: dict[str, Any]) -> Storage:
    """The S3 storage a migration copies to (boto3 from the head's environment)."""
    from hypermedia.storage.s3 import S3Storage

    return S3Storage(
        spec["bucket"],
        endpoint_url=spec.get("endpoint_url"),
        region=spec.get("region"),
        prefix=spec.get("prefix") or "",
    )


class MigrateTargets:
    """The storage a migration copied objects to, by what ``objects.storage_backend``
    says of them (:data:`hypermedia.storage.deletions.Backends`): the latest migrate
    run to that name says where it is, opened as the runner opens it (the head's
    environment). One storage per name, kept. A name no run records raises
    :class:`~hypermedia.storage.base.StorageUnavailable` (the deletion stays recorded)."""

    def __init__(
        self, engine: Engine, open_storage: Callable[[dict[str, Any]], Storage] | None = None
    ) -> None:
        self.engine = engine
        self._open = open_storage or open_target
        self._opened: dict[str, Storage] = {}
        self._lock = threading.Lock()

    def __call__(self, name: str) -> Storage:
        with self._lock:
            storage = self._opened.get(name)
        if storage is not None:
            return storage
        with transaction(self.engine) as conn:
            spec = runs.migrate_target(conn, name)
        if spec is None:
            raise StorageUnavailable(f"no migrate run copied objects to {name!r}")
        storage = self._open(spec.model_dump())
        with self._lock:
            return self._opened.setdefault(name, storage)


def _hashing(chunks: Iterable[bytes], digest: Any) -> Iterator[bytes]:
    for chunk in chunks:
        digest.update(chunk)
        yield chunk


def copy_verified(
    source: Storage,
    target: Storage,
    key: str,
    recorded: str | None,
    content_type: str | None = None,
) -> str | None:
    """Copy ``key`` (stored as ``content_type``, the record's, when it is one a store
    takes); None once the target's bytes are verified, else what is wrong."""
    read = hashlib.sha256()
    try:
        stored = target.put(
            key, _hashing(source.read(key), read), content_type=storable_content_type(content_type)
        )
    except HypermediaError as exc:
        return f"copy failed: {exc.code}: {exc.message}"
    if recorded is not None and read.hexdigest() != recorded:
        return f"the source's bytes do not match the record's sha256 ({read.hexdigest()})"
    if stored.sha256 != read.hexdigest():
        return "the target stored other bytes than were read"
    back = hashlib.sha256()
    try:
        for chunk in target.read(key):
            back.update(chunk)
    except HypermediaError as exc:
        return f"read-back failed: {exc.code}: {exc.message}"
    if back.hexdigest() != read.hexdigest():
        return f"the target's copy reads back as sha256 {back.hexdigest()}"
    return None
