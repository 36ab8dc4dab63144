"""A worker: one queue, N claim loops, a completion batcher, a heartbeat, metrics, drain.

Each claim loop pulls from Redis itself (a Ray call per job would cap
throughput) and, when the queue is empty, blocks on the queue's wake-up list for up
to :data:`IDLE_WAIT_SECONDS` (a new job or a stop wakes it at once). With
``prefetch`` 1 (the default) it leases one job, claims and starts it in the record in
one transaction and runs it (see ``execute``). With ``prefetch`` n it
takes up to n jobs in one claim, ``claimed`` and not started, and runs them one after
another: each is started as the loop reaches it, its start (claimed -> processing, the
moment it began) written by the completion batcher in its next transaction, so a
short job costs the record a share of one claim and of one group commit. A job taken
ahead waits its turn in ``claimed``: once the job before it has run
:data:`HOLD_SECONDS`, or a third of its own lease has passed, it goes back to its
queue (released: no attempt spent) for any worker to take, so a long job holds up no
other.

A job whose step succeeded goes to the :class:`CompletionBatcher`, and its loop
goes on to the next job. The batcher completes whatever has gathered in one
transaction (group commit) while the loops run the next jobs; a job is counted
completed when that transaction has committed. If the worker dies first, the job
is still ``processing`` in the record and runs again (at least once; outputs are
written to the same keys).

The worker registers in ``workers``, heartbeats every ``heartbeat_seconds`` and
writes a ``worker_metrics`` row every ``metrics_seconds``. While the disk of its
workdirs has less than ``min_free_disk_mb`` free it claims nothing (the disk guard,
:meth:`Worker.disk_low`), and its row says so: ``claims_paused_since`` and
``claims_paused_reason`` ("low disk (312 MB free, needs 1024)"), NULL again once it
claims; ``hypermedia status`` shows it, the alert rule ``worker_disk_low`` notifies it
and the scheduler drains a cloud node paused too long.

An outage pauses claiming too: a claim the record or Redis refused (the loops try
again, backing off), or a job that failed because a service it needs is down (no
claim for a while: see :data:`OUTAGE_CODES`), or, for a worker with nothing to claim,
the record refusing its upkeep's writes (the heartbeat: a claim that finds the queue
empty asks Redis only, never the record). That pause is kept in memory
(:class:`OutagePause`: since when and why) and ends at the first claim that finds the
queue empty, once the record took a write of the upkeep again, or the first job
completed; the row's ``outage_paused_since``,
``outage_paused_reason`` and ``outage_paused_seconds`` (how long it lasted, NULL while
it lasts) say the last one, written by the upkeep within a second of a change, or as
soon as the record takes it again: ``hypermedia status`` and the operator page show
it after an outage that no log reader saw.

``drain(timeout)``: stop claiming, hand back jobs claimed but not started, let
running jobs finish; whatever still runs after ``timeout`` is stopped and handed
straight back to its queue (no attempt spent); completions are committed before
the worker stops. This class knows nothing of Ray; the actor wraps it.

On a spot instance (``spot``: see :mod:`hypermedia.worker.spot`) a watcher thread
reads the cloud's interruption notice; :meth:`Worker.interrupt` is the answer:
stop claiming, mark the row ``draining``, kill the running jobs' children and hand
every job back to its queue at once, through the drain's release (no attempt
spent; each attempt is closed ``released`` with code ``spot_interrupted`` and the
notice as its message), commit what had finished, and stop with the row's status
``spot_interrupted``. The row is how the worker asks for a replacement: the
scheduler reads only ``active`` and ``draining`` rows and counts only active ones
as capacity, so from the notice on the queue has lost this worker while its
handed-back jobs wait again (the depth and age its scale-up rules read). A job whose
step checkpoints (a chunked transcode) first gets the notice's time, less
:data:`SPOT_CHECKPOINT_MARGIN_SECONDS`, to store the chunk it is on, and is stopped
as soon as it has (else it abandons that chunk); its finished chunks were stored as
they came, and the retry on another worker goes on from them.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import psutil
from sqlalchemy import Engine, insert, select, update

from hypermedia.clock import Clock, SystemClock, to_datetime
from hypermedia.db import tables as t
from hypermedia.db.engine import snapshot, transaction
from hypermedia.errors import (
    DatabaseConflict,
    DatabaseUnavailable,
    HypermediaError,
    QueueUnavailable,
)
from hypermedia.jobs.dispatcher import Dispatcher
from hypermedia.jobs.repository import ClaimedJob
from hypermedia.logs import Outage
from hypermedia.worker.execute import (
    HAND_BACK_SECONDS,
    Completion,
    JobExecution,
    Outcome,
    until_written,
)
from hypermedia.worker.spot import SpotNotice, SpotWatch, SpotWatcher

log = logging.getLogger(__name__)

# How long an idle claim loop blocks on its queue's wake-up list (BLPOP) before it claims
# again. Neither a job's arrival nor a stop waits for it: every push of a job to ready
# (enqueue, restore, unlease) leaves a token on the queue's list, and a drain, a spot
# notice or a stop one a loop on the worker's own (:meth:`Worker._stop_claiming`). A
# loop woke every second with nothing to do: 3 Redis commands a second each (the claim
# script, its ZPOPMIN, the BLPOP), 720 a minute of an idle worker of 4 loops. Under
# the Redis client's socket timeout (10 s).
IDLE_WAIT_SECONDS = 5.0
# How long a loop that claims nothing for now (its disk low, an outage met) waits before
# it looks again; a drain or a stop ends it within this.
PAUSED_WAIT_SECONDS = 1.0
MAX_ERROR_BACKOFF_SECONDS = 5.0
DISK_CHECK_SECONDS = 5.0  # how often a worker reads its free disk space (while low: waits)
# An attempt that failed because a service it needs is down (the storage its input and
# outputs move through, the head that signs their URLs): the job is retried later (one
# whose URLs the head could not sign is handed back, no attempt spent: execute's
# _outage), but the next jobs would meet the same outage at once (each spending an
# attempt on a transfer's: a 3-minute storage outage failed every queued job for good),
# and a handed back job would be claimed again at once. The worker claims nothing
# for a while instead: this long after the first such failure, twice as long after
# each next one, at most OUTAGE_PAUSE_MAX_SECONDS; a job that completes ends the pause.
OUTAGE_CODES = frozenset(
    {
        "transfer_unavailable",
        "storage_unavailable",
        "storage_full",
        "service_unavailable",
        "database_unavailable",
        "queue_unavailable",
    }
)
OUTAGE_PAUSE_SECONDS = 15.0
OUTAGE_PAUSE_MAX_SECONDS = 300.0
COMPLETION_BATCH = 256  # jobs per group commit, at most
COMPLETION_BACKLOG = 2 * COMPLETION_BATCH  # finished jobs waiting for their commit: then loops wait
# How long a job a claim loop took ahead may wait behind the one it runs (the upkeep
# thread, each second, hands back what waited longer).
HOLD_SECONDS = 2.0
# How long the start of a job taken ahead may wait for a completion to share its
# transaction with (the record says ``claimed`` meanwhile).
START_LINGER_SECONDS = 0.2
# How long past the loops' end a stopping worker tries its row's final status while the
# record is down (never past the hand backs' deadline): long enough for a short outage
# (a restart), short of the supervisor's bound (drain timeout + 30 s).
FINAL_STATUS_SECONDS = 10.0
SPOT_INTERRUPTED = "spot_interrupted"  # the row's final status, the attempts' code, the log action
# A workers row in one of these will not run again (the supervisor, the stale-worker
# sweep and a stopping worker write them).
ENDED_STATUSES = ("stopped", "dead", SPOT_INTERRUPTED)
SPOT_MARGIN_SECONDS = 5.0  # a notice's handing back should be over this long before its deadline
# Kept after a checkpointing job's last chance to store its piece: the kill, the last
# uploads and the hand back, before the notice's deadline.
SPOT_CHECKPOINT_MARGIN_SECONDS = 15.0


@dataclass(frozen=True, slots=True)
class OutagePause:
    """A worker's outage pause: since when (the clock's time), why, and how long it
    lasted (None while it lasts)."""

    since: float
    reason: str
    seconds: float | None = None


class _OutageMet(Exception):
    """What the pause's log line says: the job, its error and how long claims wait."""

    def __init__(self, outcome: Outcome, pause: float) -> None:
        super().__init__(f"job {outcome.job_id} {outcome.error_code}; no claim for {pause:.0f} s")


@dataclass
class WorkerStats:
    completed: int = 0
    failed: int = 0
    retried: int = 0
    cancelled: int = 0
    released: int = 0
    lost: int = 0
    claimed: int = 0
    errors: int = 0
    outcomes: list[Outcome] = field(default_factory=list)

    def count(self, outcome: Outcome) -> None:
        attribute = {
            "completed": "completed",
            "failed": "failed",
            "retry_wait": "retried",
            "cancelled": "cancelled",
            "released": "released",
        }.get(outcome.status, "lost")
        setattr(self, attribute, getattr(self, attribute) + 1)


@dataclass
class Held:
    """What one claim loop took ahead (``claimed``, not begun, in order) and since when
    it runs the job before them (monotonic seconds)."""

    jobs: deque[ClaimedJob] = field(default_factory=deque)
    since: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take_all(self) -> list[ClaimedJob]:
        with self.lock:
            jobs = list(self.jobs)
            self.jobs.clear()
            return jobs


@dataclass(frozen=True, slots=True)
class Start:
    """A job taken ahead that its loop has begun, at ``at`` (epoch seconds)."""

    job: ClaimedJob
    at: float
    queued: float = field(default_factory=time.monotonic)


class CompletionBatcher:
    """Group commit of finished jobs for one worker (see the module docstring).

    ``add`` returns at once (it waits only when ``max_backlog`` jobs are waiting);
    one thread completes up to ``max_batch`` of what has gathered per transaction
    with :meth:`Dispatcher.complete_many` and reports each job's :class:`Outcome`
    to ``on_outcome``. ``start`` hands it the start of a job a loop took ahead: written
    in the same transaction, before any completion after it. A batch whose
    transaction fails because the database is down is tried again, with backoff,
    until it is written: the jobs are done and their outputs stored, so running them
    again would be waste. ``close`` commits what is left and stops the thread; what it
    cannot commit within its timeout is given up (left in flight: their leases expire
    and they run again).
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        worker_id: str,
        on_outcome: Callable[[Outcome], None],
        *,
        max_batch: int = COMPLETION_BATCH,
        max_backlog: int = COMPLETION_BACKLOG,
    ) -> None:
        self.dispatcher = dispatcher
        self.worker_id = worker_id
        self.on_outcome = on_outcome
        self.max_batch = max_batch
        self.max_backlog = max_backlog
        self.commits = 0
        self._pending: list[Completion | Start] = []
        self._cond = threading.Condition()
        self._closing = False
        self._idle = False  # waiting for anything at all (else for a batch or a timer)
        self._abandoned = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{worker_id}-complete", daemon=True)
        self._thread.start()

    def add(self, completion: Completion) -> None:
        self._put(completion)

    def start(self, job: ClaimedJob, at: float) -> None:
        self._put(Start(job, at))

    def _put(self, item: Completion | Start) -> None:
        with self._cond:
            while len(self._pending) >= self.max_backlog and not self._closing:
                self._cond.wait()
            self._pending.append(item)
            # A start alone need not wake a batcher that has a batch to wait for.
            if isinstance(item, Completion) or self._idle:
                self._cond.notify_all()

    def close(self, timeout: float = 60.0) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning(
                "completion batcher of %s still busy after %.0f s: giving up what is left",
                self.worker_id,
                timeout,
            )
            self._abandoned.set()
            self._thread.join(5)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closing:
                    if any(isinstance(item, Completion) for item in self._pending):
                        break
                    if not self._pending:
                        self._idle = True
                        self._cond.wait()
                        self._idle = False
                        continue
                    # Starts alone wait a moment for a completion to go with.
                    oldest = min(i.queued for i in self._pending if isinstance(i, Start))
                    left = oldest + START_LINGER_SECONDS - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                if not self._pending:
                    return
                batch = self._take()
                self._cond.notify_all()
            self._commit(batch)

    def _take(self) -> list[Completion | Start]:
        """The next batch: up to ``max_batch`` completions and the starts that go with
        them; a start whose job has not finished stays for a later batch until it has
        waited :data:`START_LINGER_SECONDS` (or the batcher closes)."""
        window = self._pending[: self.max_batch]
        ending = {item.job.job_id for item in window if isinstance(item, Completion)}
        ripe = time.monotonic() - START_LINGER_SECONDS
        batch: list[Completion | Start] = []
        kept: list[Completion | Start] = []
        for item in window:
            go = (
                isinstance(item, Completion)
                or item.job.job_id in ending
                or item.queued <= ripe
                or self._closing
            )
            (batch if go else kept).append(item)
        self._pending[: len(window)] = kept
        return batch

    def _commit(self, items: Sequence[Completion | Start]) -> None:
        batch = [item for item in items if isinstance(item, Completion)]
        starts = [(item.job, item.at) for item in items if isinstance(item, Start)]
        backoff = 0.1
        attempt = 0
        done: list[bool] | None = None
        while done is None:
            attempt += 1
            try:
                done = self.dispatcher.complete_many(
                    self.worker_id, [c.finished() for c in batch], starts
                )
            except (DatabaseUnavailable, DatabaseConflict) as exc:
                if self._abandoned.is_set():
                    break
                log.warning(
                    "completing %d jobs (try %d): %s; retrying in %.1fs",
                    len(items),
                    attempt,
                    exc,
                    backoff,
                    extra={"worker_id": self.worker_id, "action": "complete"},
                )
                self._abandoned.wait(backoff)
                backoff = min(backoff * 2, MAX_ERROR_BACKOFF_SECONDS)
            except Exception:
                log.exception(
                    "completing %d jobs failed", len(items), extra={"worker_id": self.worker_id}
                )
                break
        if done is None or len(done) != len(batch):
            # Left processing in the record: the reaper fails them when their leases
            # expire and they run again.
            done = [False] * len(batch)
        self.commits += 1
        for completion, ok in zip(batch, done, strict=True):
            self.on_outcome(Outcome(completion.job.job_id, "completed" if ok else "lost"))


class Worker:
    def __init__(
        self,
        *,
        worker_id: str,
        queue: str,
        concurrency: int,
        engine: Engine,
        dispatcher: Dispatcher,
        execution: JobExecution,
        work_root: str,
        node_id: str | None = None,
        clock: Clock | None = None,
        heartbeat_seconds: float = 30.0,
        metrics_seconds: float = 60.0,
        on_outcome: Callable[[Outcome], None] | None = None,
        prefetch: int = 1,
        spot: SpotWatch | None = None,
        min_free_disk_mb: int = 0,
        disk_check_seconds: float = DISK_CHECK_SECONDS,
        outage_pause_seconds: float = OUTAGE_PAUSE_SECONDS,
    ) -> None:
        self.worker_id = worker_id
        self.queue = queue
        self.concurrency = concurrency
        self.engine = engine
        self.dispatcher = dispatcher
        self.execution = execution
        self.work_root = work_root
        self.node_id = node_id
        self.clock = clock or SystemClock()
        self.heartbeat_seconds = heartbeat_seconds
        self.metrics_seconds = metrics_seconds
        self.on_outcome = on_outcome
        self.prefetch = max(1, prefetch)
        self.spot = spot
        self.min_free_disk_mb = min_free_disk_mb
        self.disk_check_seconds = disk_check_seconds
        self._disk_checked = (-math.inf, False)  # (monotonic time, low)
        self._disk_lock = threading.Lock()
        # Claiming paused (the disk guard): since when (the clock's time) and why, as
        # the row says it (claims_paused_since, claims_paused_reason); None: claiming.
        self.paused: tuple[float, str] | None = None
        self.outage_pause_seconds = outage_pause_seconds
        self._outage_failures = 0
        self._outage_until = 0.0  # monotonic: no claim before it
        self._outage_log = Outage(
            log, "claims paused: a job met an outage", extra={"worker_id": worker_id}
        )
        # The last outage pause, as the row's outage_paused_* say it once written.
        self.outage_pause: OutagePause | None = None
        self._outage_pause_written: OutagePause | None = None
        # The upkeep's last write to the record failed for the record (an idle worker's
        # only sign of its outage): an empty claim, which asks Redis only, ends no pause.
        self._record_unreachable = False
        self.notice: SpotNotice | None = None
        # Draining, or after a spot notice: the monotonic time until which a hand back
        # the record refuses, down, is tried again (None: tried once).
        self._hand_back_by: float | None = None
        self.completions: CompletionBatcher | None = None
        self.stats = WorkerStats()
        self._stats_lock = threading.Lock()
        self._claiming = threading.Event()
        self._stopped = threading.Event()
        self._loops: list[threading.Thread] = []
        self._held: list[Held] = []
        self._handed_back: list[str] = []  # the jobs a drain (a notice) handed back
        self._upkeep: threading.Thread | None = None
        self._spot_watcher: SpotWatcher | None = None
        self._shutdown_lock = threading.Lock()
        self._process = psutil.Process()
        self._last_metrics = (time.monotonic(), 0)
        self._last_cpu = (time.monotonic(), self.cpu_seconds())

    # -- lifecycle --------------------------------------------------------------

    def start(self) -> None:
        self._register()
        self.completions = CompletionBatcher(self.dispatcher, self.worker_id, self._record)
        self._claiming.set()
        if self.spot is not None:
            self._spot_watcher = SpotWatcher(
                self.spot, self.interrupt, clock=self.clock, name=f"{self.worker_id}-spot"
            )
            self._spot_watcher.start()
        for index in range(self.concurrency):
            held = Held()
            self._held.append(held)
            loop = threading.Thread(
                target=self._claim_loop,
                args=(held,),
                name=f"{self.worker_id}-loop{index}",
                daemon=True,
            )
            loop.start()
            self._loops.append(loop)
        self._upkeep = threading.Thread(
            target=self._upkeep_loop, name=f"{self.worker_id}-upkeep", daemon=True
        )
        self._upkeep.start()
        log.info(
            "worker %s started: queue %s, %d loops",
            self.worker_id,
            self.queue,
            self.concurrency,
            extra={"worker_id": self.worker_id, "queue": self.queue, "action": "start"},
        )

    def drain(self, timeout: float) -> list[str]:
        """Stop claiming; wait up to ``timeout`` for running jobs; release the rest.
        Answers the ids of the jobs handed back (the record took it)."""
        deadline = time.monotonic() + timeout
        # Hand backs the record refuses, down, are tried again until the loops' wait
        # after release_all is over (then left to their leases). Set before the loops
        # stop claiming: each hand back of the drain is retried and answered.
        self._hand_back_by = deadline + HAND_BACK_SECONDS
        self._stop_claiming()
        # The record down, tried again while the running jobs are waited for (not once
        # the loops have ended: an idle worker's drain waited its whole timeout).
        self._set_status("draining", by=deadline, busy=self._loops_running)
        for loop in self._loops:
            loop.join(max(0.0, deadline - time.monotonic()))
        if any(loop.is_alive() for loop in self._loops):
            self.execution.release_all(
                hand_back_by=max(self._hand_back_by, time.monotonic() + HAND_BACK_SECONDS)
            )
            for loop in self._loops:
                loop.join(30)
        self.stop()
        with self._stats_lock:
            return self.execution.handed_back() + self._handed_back

    def interrupt(self, notice: SpotNotice) -> list[str]:
        """The instance is being reclaimed (the spot watcher's callback; see the module
        docstring): hand everything back and stop. Answers the ids of the jobs handed
        back; a second notice, or one after the worker stopped, answers [] and changes
        nothing."""
        with self._stats_lock:
            if self.notice is not None or self._stopped.is_set():
                return []
            self.notice = notice
        # The children are killed: the loops hand their jobs back and end within
        # moments; an upload in progress gets until just before the deadline, and so
        # does a hand back the record refuses, down (tried again until then). Set
        # before the loops stop claiming: each hand back of the notice is answered.
        wait = max(SPOT_MARGIN_SECONDS, notice.deadline - self.clock.now() - SPOT_MARGIN_SECONDS)
        until = time.monotonic() + wait
        self._hand_back_by = until
        self._stop_claiming()
        log.warning(
            "worker %s: spot instance reclaimed (%s %s, %.0f s left): stopping claims, "
            "handing its jobs back",
            self.worker_id,
            notice.provider,
            notice.action,
            notice.deadline - self.clock.now(),
            extra={
                "worker_id": self.worker_id,
                "queue": self.queue,
                "action": SPOT_INTERRUPTED,
                "provider": notice.provider,
                "deadline": notice.deadline,
            },
        )
        # A job that checkpoints may store the piece it is on while the notice leaves
        # time for that, the kill and the hand back; else it is abandoned.
        window = notice.deadline - self.clock.now() - SPOT_CHECKPOINT_MARGIN_SECONDS
        self.execution.release_all(
            SPOT_INTERRUPTED,
            notice.reason,
            checkpoint_seconds=max(0.0, window),
            hand_back_by=until,
        )
        # After: the record down, tried again while the loops hand their jobs back.
        self._set_status("draining", by=until, busy=self._loops_running)
        for loop in self._loops:
            loop.join(max(0.0, until - time.monotonic()))
        self.stop()
        with self._stats_lock:
            handed_back = self.execution.handed_back() + self._handed_back
        log.info(
            "worker %s stopped for the spot notice: %d jobs handed back",
            self.worker_id,
            len(handed_back),
            extra={"worker_id": self.worker_id, "queue": self.queue, "action": "stop"},
        )
        return handed_back

    def stop(self) -> None:
        """Stop claiming, let the loops finish, commit, and record the row as
        ``stopped`` (``spot_interrupted`` after a notice). Idempotent."""
        with self._shutdown_lock:
            if self._stopped.is_set():
                return
            self._stop_claiming()
            for loop in self._loops:
                loop.join(30)
            if self.completions is not None:
                self.completions.close()
            self.execution.close()
            self._stopped.set()
            if self._upkeep is not None:
                self._upkeep.join(10)
            if self._spot_watcher is not None:
                self._spot_watcher.stop()
            status = "stopped" if self.notice is None else SPOT_INTERRUPTED
            # Within the hand backs' deadline, and not much past the loops' end: a
            # drain of an idle worker with the record down took its timeout + 30 s,
            # the supervisor's bound for an actor that does not answer.
            by = self._hand_back_by
            if by is not None:
                by = min(by, time.monotonic() + FINAL_STATUS_SECONDS)
            self._set_status(status, stopped=True, by=by)

    def _stop_claiming(self) -> None:
        """The loops claim no more; those blocked on the queue's wake-up list are woken
        (a token each on the worker's own list), from a thread of its own: Redis down
        or silent, the push's retries hold neither the drain nor the stop (the loops
        then wake within IDLE_WAIT_SECONDS, or are not waiting on Redis at all)."""
        self._claiming.clear()
        threading.Thread(
            target=self._wake_loops, name=f"{self.worker_id}-wake", daemon=True
        ).start()

    def _wake_loops(self) -> None:
        try:
            self.dispatcher.queue.wake_worker(self.queue, self.worker_id, self.concurrency)
        except Exception as exc:  # the loops wake by themselves, later
            log.warning(
                "worker %s: could not wake its idle claim loops: %s",
                self.worker_id,
                exc,
                extra={"worker_id": self.worker_id, "queue": self.queue, "action": "wake"},
            )

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the worker has stopped; True if it has."""
        return self._stopped.wait(timeout)

    @property
    def draining(self) -> bool:
        return not self._claiming.is_set()

    # -- the claim loop ------------------------------------------------------------

    def disk_low(self) -> bool:
        """Whether the disk of the workdirs has less than ``min_free_disk_mb`` free
        (read at most every ``disk_check_seconds``); the change is logged once and
        written to the row at once (``claims_paused_since``, ``claims_paused_reason``:
        what ``hypermedia status``, the ``worker_disk_low`` alert and the scheduler
        read); the heartbeat keeps the reason's free space current."""
        if self.min_free_disk_mb <= 0:
            if self.paused is not None:  # the guard turned off while paused
                self.paused = None
                self._record_pause()
            return False
        with self._disk_lock:
            checked_at, was_low = self._disk_checked
            now = time.monotonic()
            if now - checked_at < self.disk_check_seconds:
                return was_low
            try:
                free_mb = shutil.disk_usage(self.work_root).free / 2**20
            except OSError as exc:  # the workdirs' root is gone: claiming would fail too
                log.warning("cannot read the free disk space of %s: %s", self.work_root, exc)
                free_mb = 0.0
            low = free_mb < self.min_free_disk_mb
            self._disk_checked = (now, low)
            if low:
                since = self.paused[0] if self.paused is not None else self.clock.now()
                reason = f"low disk ({free_mb:.0f} MB free, needs {self.min_free_disk_mb})"
                self.paused = (since, reason)
            else:
                self.paused = None
        if low != was_low:
            self._record_pause()
        if low and not was_low:
            log.warning(
                "%s: %.0f MB free on the disk of %s, below worker_min_free_disk_mb (%d):"
                " claiming no job until there is more",
                self.worker_id,
                free_mb,
                self.work_root,
                self.min_free_disk_mb,
                extra={"worker_id": self.worker_id, "action": "disk_low"},
            )
        elif was_low and not low:
            log.info(
                "%s: %.0f MB free again: claiming",
                self.worker_id,
                free_mb,
                extra={"worker_id": self.worker_id, "action": "disk_ok"},
            )
        return low

    def _claim_loop(self, held: Held) -> None:
        backoff = 0.1
        while self._claiming.is_set():
            if self.disk_low():  # read every disk_check_seconds; a drain ends the wait
                self._stopped.wait(PAUSED_WAIT_SECONDS)
                continue
            waiting = self._outage_until - time.monotonic()
            if waiting > 0:  # a job met an outage: the next would too
                self._stopped.wait(min(waiting, PAUSED_WAIT_SECONDS))
                continue
            try:
                if self.prefetch == 1:
                    jobs = self.dispatcher.claim_and_start(self.queue, self.worker_id)
                else:
                    jobs = self.dispatcher.claim_ahead(self.queue, self.worker_id, self.prefetch)
                if not jobs:
                    with self._stats_lock:
                        if time.monotonic() >= self._outage_until and not self._record_unreachable:
                            self._outage_ended()  # a claim went through: services answer
                    self.dispatcher.queue.wait(self.queue, IDLE_WAIT_SECONDS, self.worker_id)
                    continue
                with self._stats_lock:
                    self.stats.claimed += len(jobs)
                if self.prefetch == 1:
                    self._run_batch(jobs)
                else:
                    self._run_ahead(jobs, held)
                backoff = 0.1
            except (QueueUnavailable, DatabaseUnavailable) as exc:
                # A backing service is down: nothing is lost (the record is the
                # truth); try again a little later.
                with self._stats_lock:
                    self.stats.errors += 1
                    self._outage_began(f"{exc.code}: {exc}")
                log.warning("claim loop: %s; retrying in %.1fs", exc, backoff)
                self._stopped.wait(backoff)
                backoff = min(backoff * 2, MAX_ERROR_BACKOFF_SECONDS)
            except Exception:
                with self._stats_lock:
                    self.stats.errors += 1
                log.exception("claim loop error", extra={"worker_id": self.worker_id})
                self._stopped.wait(backoff)
                backoff = min(backoff * 2, MAX_ERROR_BACKOFF_SECONDS)

    def _run_batch(self, jobs: Sequence[ClaimedJob]) -> None:
        """Run the jobs one claim gave this loop, in order; once the worker drains,
        hand back the ones not begun."""
        assert self.completions is not None
        for index, job in enumerate(jobs):
            # Draining, a loop runs the job it holds; after a spot notice, none.
            if not self._claiming.is_set() and (index or self.notice is not None):
                self._hand_back(jobs[index:])
                return
            try:
                result = self.execution.run_started(job)
            except BaseException:
                self._hand_back(jobs[index + 1 :])
                raise
            if isinstance(result, Completion):
                self.completions.add(result)
            else:
                self._record(result)

    def _run_ahead(self, jobs: Sequence[ClaimedJob], held: Held) -> None:
        """Run the jobs of one claim (:meth:`Dispatcher.claim_ahead`: the first
        started, the others ``claimed``) in order, each started as the loop reaches it;
        the upkeep thread may hand back those still waiting (:meth:`_return_held`).
        Draining, the loop runs the one it began and hands back the others."""
        assert self.completions is not None
        with held.lock:
            held.jobs.extend(jobs)
        while True:
            with held.lock:
                if not held.jobs:
                    return
                # Draining, a loop runs the job it began; after a spot notice, none.
                begun = held.jobs[0].started and self.notice is None
                draining = not self._claiming.is_set() and not begun
                job = None if draining else held.jobs.popleft()
                held.since = time.monotonic()
            if job is None:
                self._hand_back(held.take_all())
                return
            if not job.started:
                began = self.clock.now()
                job = replace(job, attempt_started_at=began, started=True)
                self.completions.start(job, began)
            try:
                result = self.execution.run_started(job)
            except BaseException:
                self._hand_back(held.take_all())
                raise
            if isinstance(result, Completion):
                self.completions.add(result)
            else:
                self._record(result)

    def _return_held(self) -> None:
        """Hand back the jobs a loop took ahead that waited too long: the job before
        them has run :data:`HOLD_SECONDS`, or a third of their lease has passed."""
        now_mono, now = time.monotonic(), self.clock.now()
        for held in self._held:
            with held.lock:
                if not held.jobs:
                    continue
                late = now_mono - held.since > HOLD_SECONDS or any(
                    (job.deadline - now) < (job.deadline - (job.attempt_started_at or now)) * 2 / 3
                    for job in held.jobs
                )
            if late:
                jobs = held.take_all()
                if jobs:
                    log.info(
                        "handing back %d jobs taken ahead: the job before them runs long",
                        len(jobs),
                        extra={"worker_id": self.worker_id, "action": "release"},
                    )
                    self._hand_back(jobs)

    def _hand_back(self, jobs: Sequence[ClaimedJob]) -> None:
        notice = self.notice
        code, reason = (None, None) if notice is None else (SPOT_INTERRUPTED, notice.reason)
        for job in jobs:
            try:
                released = self._release_one(job, code, reason)
            except HypermediaError as exc:
                # Still processing in the record: the lease reaper hands it back.
                log.warning("could not hand back %s: %s; left to its lease", job.job_id, exc)
                continue
            # Answered by drain() and interrupt(): their own hand backs only, not the
            # upkeep's before them (jobs since taken again, perhaps completed).
            if released and self._hand_back_by is not None:
                with self._stats_lock:
                    self._handed_back.append(job.job_id)
            self._record(Outcome(job.job_id, "released" if released else "lost"))

    def _release_one(self, job: ClaimedJob, code: str | None, reason: str | None) -> bool:
        """One hand back; draining (or after a spot notice) tried again while the record
        is down (:func:`until_written`), until the drain's (the notice's) deadline: else
        the job stays ``processing`` until its lease runs out, whose expiry counts the
        attempt. Otherwise (the upkeep's) tried once. Given up when the worker stops:
        its waits end then (the upkeep's would hold up stop())."""
        return until_written(
            lambda: self.dispatcher.release(job, self.worker_id, reason_code=code, reason=reason),
            job.job_id,
            "hand it back",
            self.worker_id,
            lambda: 0.0 if self._hand_back_by is None else self._hand_back_by,
            self._stopped,
        )

    def _record(self, outcome: Outcome) -> None:
        with self._stats_lock:
            if outcome.error_code in OUTAGE_CODES:
                self._outage_failures += 1
                pause = min(
                    OUTAGE_PAUSE_MAX_SECONDS,
                    self.outage_pause_seconds * 2 ** (self._outage_failures - 1),
                )
                self._outage_until = time.monotonic() + pause
                self._outage_began(f"job {outcome.job_id} failed: {outcome.error_code}")
                self._outage_log.failed(_OutageMet(outcome, pause))
            elif outcome.status == "completed":
                if self._outage_failures:
                    self._outage_failures, self._outage_until = 0, 0.0
                    self._outage_log.succeeded()
                self._outage_ended()
            # Counted last: whoever sees the count (unlocked) sees the pause it began.
            self.stats.count(outcome)
        if self.on_outcome is not None:
            self.on_outcome(outcome)

    def _outage_began(self, reason: str) -> None:
        """Claims pause for an outage (called holding ``_stats_lock``); a pause that
        lasts keeps its start and first reason."""
        pause = self.outage_pause
        if pause is None or pause.seconds is not None:
            self.outage_pause = OutagePause(self.clock.now(), reason[:200])

    def _outage_ended(self) -> None:
        """Claims go on (called holding ``_stats_lock``): the pause gets its length."""
        pause = self.outage_pause
        if pause is None or pause.seconds is not None:
            return
        ended = replace(pause, seconds=round(max(0.0, self.clock.now() - pause.since), 1))
        self.outage_pause = ended
        log.info(
            "%s: claiming again after an outage pause of %.0f s (%s)",
            self.worker_id,
            ended.seconds,
            ended.reason,
            extra={"worker_id": self.worker_id, "action": "outage_pause_over"},
        )

    # -- registration, heartbeat, metrics ---------------------------------------------

    def _register(self) -> None:
        now = to_datetime(self.clock.now())
        with transaction(self.engine) as conn:
            conn.execute(
                insert(t.workers).values(
                    worker_id=self.worker_id,
                    queue=self.queue,
                    node_id=self.node_id,
                    hostname=socket.gethostname(),
                    pid=os.getpid(),
                    status="active",
                    concurrency=self.concurrency,
                    started_at=now,
                    last_heartbeat=now,
                )
            )

    def _loops_running(self) -> bool:
        return any(loop.is_alive() for loop in self._loops)

    def _set_status(
        self,
        status: str,
        *,
        stopped: bool = False,
        by: float | None = None,
        busy: Callable[[], bool] | None = None,
    ) -> None:
        """Write the row's status; the record down, tried again until ``by`` (monotonic:
        a drain's, a spot notice's deadline; None: tried once), and while ``busy()``
        when given (the loops still running). Else the row says
        ``active`` after the worker stopped (the scheduler counts it as capacity) until
        the stale-worker sweep calls it dead."""
        now = to_datetime(self.clock.now())
        values: dict[str, object] = {"status": status, "last_heartbeat": now}
        if stopped:
            values["stopped_at"] = now

        def write() -> None:
            with transaction(self.engine) as conn:
                conn.execute(
                    update(t.workers).where(t.workers.c.worker_id == self.worker_id).values(values)
                )

        try:
            until_written(
                write,
                None,
                f"record its status {status}",
                self.worker_id,
                lambda: 0.0 if by is None or (busy is not None and not busy()) else by,
                None if stopped else self._stopped,
            )
        except HypermediaError as exc:
            log.warning("could not record worker status %s: %s", status, exc)

    def _pause_values(self) -> dict[str, object]:
        paused = self.paused
        return {
            "claims_paused_since": None if paused is None else to_datetime(paused[0]),
            "claims_paused_reason": None if paused is None else paused[1],
        }

    def _record_pause(self) -> None:
        """Write whether claiming is paused, and why, to the row (the next heartbeat
        tries again if the record is away)."""
        try:
            with transaction(self.engine) as conn:
                conn.execute(
                    update(t.workers)
                    .where(t.workers.c.worker_id == self.worker_id)
                    .values(self._pause_values())
                )
        except HypermediaError as exc:
            log.warning("could not record the claims' pause: %s", exc)

    def heartbeat(self) -> None:
        pause = self.outage_pause
        with transaction(self.engine) as conn:
            conn.execute(
                update(t.workers)
                .where(t.workers.c.worker_id == self.worker_id)
                .values(
                    last_heartbeat=to_datetime(self.clock.now()),
                    **self._pause_values(),
                    **_outage_values(pause),
                )
            )
        self._outage_pause_written = pause
        self._record_answers()

    def record_outage_pause(self) -> None:
        """Write the last outage pause to the row if it changed since it was written
        (the upkeep, each pass: at once while the record answers, else once it is back)."""
        pause = self.outage_pause
        if pause is self._outage_pause_written:
            return
        with transaction(self.engine) as conn:
            conn.execute(
                update(t.workers)
                .where(t.workers.c.worker_id == self.worker_id)
                .values(_outage_values(pause))
            )
        self._outage_pause_written = pause
        self._record_answers()

    def _record_answers(self) -> None:
        with self._stats_lock:
            self._record_unreachable = False

    def _record_unreachable_for_upkeep(self, exc: DatabaseUnavailable) -> None:
        """The upkeep's write to the record failed: the worker is in an outage, claiming
        or not (idle, its claims never reach the record)."""
        with self._stats_lock:
            self._record_unreachable = True
            self._outage_began(f"{exc.code}: {exc}")

    def cpu_seconds(self) -> float:
        """CPU seconds of this process and everything it started: the fork server and
        the jobs' children, running or ended (a process's ``children_*`` times hold its
        waited-for descendants', so an ended job counts in its parent's)."""
        total = 0.0
        for process in [self._process, *self._process.children(recursive=True)]:
            try:
                times = process.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system + times.children_user + times.children_system
        return total

    def cpu_percent(self) -> float:
        """The worker's CPU use since the last call, its jobs' included, as a share of
        the cores it may use (its concurrency, at most the machine's): 100 is a worker
        whose every loop keeps a core busy (the alert's "worker CPU > 90 %")."""
        now, total = time.monotonic(), self.cpu_seconds()
        then, before = self._last_cpu
        self._last_cpu = (now, total)
        cores = max(1, min(self.concurrency, os.cpu_count() or 1))
        return max(0.0, total - before) / max(now - then, 1e-6) / cores * 100.0

    def write_metrics(self) -> None:
        now_mono = time.monotonic()
        with self._stats_lock:
            done = self.stats.completed + self.stats.failed + self.stats.retried
            completed, failed = self.stats.completed, self.stats.failed + self.stats.retried
        last_mono, last_done = self._last_metrics
        minutes = max((now_mono - last_mono) / 60, 1e-9)
        self._last_metrics = (now_mono, done)
        try:
            rss = self._process.memory_info().rss
            for child in self._process.children(recursive=True):
                try:
                    rss += child.memory_info().rss
                except psutil.Error:
                    continue
        except psutil.Error:
            rss = 0
        disk = psutil.disk_usage(self.work_root) if os.path.isdir(self.work_root) else None
        with transaction(self.engine) as conn:
            conn.execute(
                insert(t.worker_metrics).values(
                    worker_id=self.worker_id,
                    recorded_at=to_datetime(self.clock.now()),
                    cpu_percent=round(self.cpu_percent(), 1),
                    memory_mb=rss / 2**20,
                    disk_free_mb=(disk.free / 2**20) if disk else 0.0,
                    jobs_completed=completed,
                    jobs_failed=failed,
                    throughput_per_min=(done - last_done) / minutes,
                )
            )

    def _upkeep_loop(self) -> None:
        # The record or Redis down fails every pass alike: told when that starts, every
        # few minutes while it lasts, and when it ends.
        outage = Outage(log, "upkeep", extra={"worker_id": self.worker_id})
        next_beat = time.monotonic() + self.heartbeat_seconds
        next_metrics = time.monotonic() + self.metrics_seconds
        self.cpu_percent()  # from now: the time before the loops started is not theirs
        while not self._stopped.wait(min(1.0, self.heartbeat_seconds)):
            now = time.monotonic()
            try:
                self._return_held()
                self.record_outage_pause()
                if now >= next_beat:
                    self.heartbeat()
                    next_beat = now + self.heartbeat_seconds
                if now >= next_metrics:
                    self.write_metrics()
                    next_metrics = now + self.metrics_seconds
                outage.succeeded()
            except HypermediaError as exc:
                if isinstance(exc, DatabaseUnavailable):
                    self._record_unreachable_for_upkeep(exc)
                outage.failed(exc)


def _outage_values(pause: OutagePause | None) -> dict[str, object]:
    if pause is None:
        return {}
    return {
        "outage_paused_since": to_datetime(pause.since),
        "outage_paused_reason": pause.reason,
        "outage_paused_seconds": pause.seconds,
    }


def ended_workers(engine: Engine, worker_ids: Sequence[str]) -> set[str]:
    """Which of ``worker_ids`` the record says have ended."""
    with snapshot(engine) as conn:  # a read: on SQLite it takes no write lock
        rows = conn.execute(
            select(t.workers.c.worker_id).where(
                t.workers.c.worker_id.in_(list(worker_ids)),
                t.workers.c.status.in_(ENDED_STATUSES),
            )
        )
        return {row.worker_id for row in rows}
