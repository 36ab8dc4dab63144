"""One claimed job, end to end, on a worker.

start (claimed -> processing) -> input GET URL from the head -> download into the
job's workdir -> run the pipeline step in a child process -> output PUT URLs from
the head -> upload -> complete (outputs registered, credits charged). The job is
completed only after every output is stored; any failure fails the attempt with
a code and message (retry or failed, per the profile), and the workdir goes. A
failure that is the platform's outage (the head could not sign the job's URLs: the
record, Redis or the storage down, a ServiceUnavailable) hands the job back to wait
instead, its attempt not counted (:meth:`Dispatcher.fail_for_outage`, a few times a
job at most).

The worker's claim loops claim and start jobs in one transaction, then hand each to
:meth:`JobExecution.run_started`; it stops short of the record's complete and answers
a :class:`Completion`, which the worker's batcher commits with others (group commit).

A step that checkpoints (a long transcode) has its finished pieces stored while it
runs and put back before a retry (:mod:`hypermedia.worker.checkpointing`).

A step's report of its units of work (the output :data:`pipelines.registry.USAGE_OUTPUT`:
the ocr step's pages, engine passes, escalations) is not stored: the completion charges
the job what its profile's ``unit_costs`` make of it
(:meth:`~hypermedia.jobs.catalog.ProfileRecord.charge_millicredits`), at most what its
submit reserved (the step's declared bound: a report past it is charged the
reservation, with a warning), and records it on the attempt. A report that is not a
small JSON object of counts is logged and ignored.

An operation whose profile sets ``params.needs_input = false`` gets no input: no
GET URL, no download; its step is handed a path where no file is. A step that
returns no outputs asks for no PUT URLs and uploads nothing.

A job runs under its own time limit (``ClaimedJob.timeout_seconds``, worked out from
its pages at submit), its profile's for a job from before: its child's CPU rlimit and
wall clock, and its lease, follow it.

While jobs run, one watcher thread per execution polls ``cancel_requested`` for all
of them in one query (killing the child of a job its user cancelled) and extends
the lease of each long one every third of it.

:meth:`JobExecution.release_all` (a drain's timeout, a spot notice) kills every
running job's child and hands the job back to its queue without spending an
attempt (a spot notice first lets a job that checkpoints store the piece it is on,
while the notice leaves time); from then on a job that reaches this execution is
handed back before its step starts, and the watcher kills again any child that
started in between.
"""

from __future__ import annotations

import json
import logging
import mimetypes
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from hypermedia.errors import (
    DatabaseConflict,
    DatabaseUnavailable,
    HypermediaError,
    IllegalTransition,
    NotFound,
    ServiceUnavailable,
)
from hypermedia.jobs.catalog import ProfileCatalog, ProfileRecord
from hypermedia.jobs.dispatcher import Dispatcher, lease_seconds
from hypermedia.jobs.repository import ClaimedJob, FinishedJob, OutputRecord
from hypermedia.jobs.states import JobStatus
from hypermedia.metrics import LIMIT_OF_CODE, SANDBOX_KILLS
from hypermedia.queue.events import JobEvents, progress_event
from hypermedia.sandbox.outcome import ChildFailed
from hypermedia.storage import transfer
from hypermedia.storage.grants import OutputGrant
from hypermedia.worker.checkpointing import Checkpointer
from pipelines import registry
from pipelines.registry import USAGE_OUTPUT

log = logging.getLogger(__name__)
_T = TypeVar("_T")

CANCEL_POLL_SECONDS = 2.0
PROGRESS_INTERVAL = 0.25  # seconds between a transfer's progress events, at least
MAX_USAGE_BYTES = 4096
OUTAGE_RETRY_MAX_SECONDS = 5.0  # the longest wait between tries of an outage's hand back
# How long release_all's hand backs are tried, the record down, unless its caller says
# (a drain: as long as it waits for its loops after release_all).
HAND_BACK_SECONDS = 30.0
NEEDS_INPUT = "needs_input"  # profile param: false for operations that read no input


class Grants(Protocol):
    """Where a worker gets its presigned URLs: StorageGrants in-process, or a
    client of the head's grants actor."""

    def input_url(self, job_id: str, worker_id: str) -> str: ...

    def output_urls(
        self, job_id: str, worker_id: str, output_types: Mapping[str, str | None]
    ) -> dict[str, OutputGrant]: ...

    def checkpoint_uploads(
        self, job_id: str, worker_id: str, names: Sequence[str]
    ) -> Mapping[str, OutputGrant]: ...

    def checkpoint_downloads(self, job_id: str, worker_id: str) -> Mapping[str, OutputGrant]: ...


class ChildOutput(Protocol):
    @property
    def output_type(self) -> str: ...

    @property
    def path(self) -> Path: ...

    @property
    def content_type(self) -> str: ...


class ChildResultLike(Protocol):
    @property
    def outputs(self) -> Sequence[ChildOutput]: ...

    @property
    def duration_ms(self) -> int: ...

    @property
    def peak_memory_mb(self) -> float | None: ...


class Executor(Protocol):
    def prepare(self, job_id: str) -> Path: ...

    def run(
        self,
        job_id: str,
        operation: str,
        input_path: Path,
        params: Mapping[str, Any],
        *,
        timeout_seconds: float,
        memory_limit_mb: int,
        max_processes: int = ...,
        max_output_bytes: int = ...,
        on_progress: Callable[[Any], None] | None = ...,
    ) -> ChildResultLike: ...

    def cancel(self, job_id: str) -> bool: ...

    def cleanup(self, job_id: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Outcome:
    job_id: str
    status: str  # completed | retry_wait | failed | cancelled | released | lost
    error_code: str | None = None


@dataclass(frozen=True, slots=True)
class Completion:
    """A job whose step succeeded and whose outputs are stored: only the record's
    complete is left to do."""

    job: ClaimedJob
    outputs: list[OutputRecord]
    peak_memory_mb: float | None
    units: dict[str, int] | None = None  # the step's units of work, as it reported them
    actual_millicredits: int | None = None  # None: the estimate
    # When its work ended (outputs stored), epoch seconds: its attempt's end, not the
    # later commit of the batch it waits for. None: that commit's moment.
    ended_at: float | None = None

    def finished(self) -> FinishedJob:
        return FinishedJob(
            self.job.job_id,
            self.outputs,
            actual_millicredits=self.actual_millicredits,
            peak_memory_mb=self.peak_memory_mb,
            attempt_started_at=self.job.attempt_started_at,
            units=self.units,
            attempt_finished_at=self.ended_at,
        )


@dataclass(slots=True)
class _Watched:
    """A running job as the watcher sees it."""

    job: ClaimedJob
    lease: float
    next_extend: float  # monotonic seconds
    lease_ends: float  # monotonic seconds: when the record's lease runs out, as last set
    cancelled: threading.Event = field(default_factory=threading.Event)
    # Its child was told to die. A cancel that comes while the input downloads (no
    # child yet) is sent again each poll until one reaches the child.
    killed: bool = False


class _Progress:
    """A transfer's progress as the job's events: one per :data:`PROGRESS_INTERVAL`
    from the first interval on, and the last if any came before (a transfer shorter
    than the interval publishes nothing: most are)."""

    def __init__(self, events: JobEvents, job: ClaimedJob, phase: str, unit: str) -> None:
        self.events = events
        self.job = job
        self.phase = phase
        self.unit = unit
        self.last = time.monotonic()
        self.published = False

    def __call__(self, done: float, total: float | None) -> None:
        now = time.monotonic()
        if now - self.last < PROGRESS_INTERVAL and not (done == total and self.published):
            return
        self.last = now
        self.published = True
        event = progress_event(
            self.phase, done, total, self.unit, time.time(), self.job.attempt_number
        )
        self.events.publish(self.job.job_id, event)


def job_timeout(job: ClaimedJob, profile: ProfileRecord | None) -> int | None:
    """The time limit ``job`` runs under: its own (worked out from its pages at
    submit), else its profile's; None when neither is known."""
    if job.timeout_seconds is not None:
        return job.timeout_seconds
    return profile.timeout_seconds if profile is not None else None


class JobExecution:
    """Runs claimed jobs for one worker. Thread-safe: each loop calls ``run`` or
    ``run_started``."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        catalog: ProfileCatalog,
        grants: Grants,
        executor: Executor,
        worker_id: str,
        *,
        poll_seconds: float = CANCEL_POLL_SECONDS,
    ) -> None:
        self.dispatcher = dispatcher
        self.catalog = catalog
        self.grants = grants
        self.executor = executor
        self.worker_id = worker_id
        self.poll_seconds = poll_seconds
        self._running: dict[str, _Watched] = {}
        self._releasing: set[str] = set()
        # Jobs released once their piece in progress is stored: the monotonic time by
        # which they are stopped anyway (release_all's checkpoint_seconds).
        self._deferred: dict[str, float] = {}
        self._checkpointers: dict[str, Checkpointer] = {}
        self._release_everything = False
        # Once release_all: the monotonic time by which a hand back the record refused
        # is given up (left to its lease).
        self._hand_back_by = 0.0
        self._release_reason: tuple[str | None, str | None] = (None, None)
        self._handed_back: list[str] = []  # the jobs release_all handed back, written
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._watcher: threading.Thread | None = None

    def running(self) -> list[str]:
        with self._lock:
            return list(self._running)

    def handed_back(self) -> list[str]:
        """The jobs handed back since :meth:`release_all` (the record took it): not one
        whose step ended first, nor one whose hand back was given up."""
        with self._lock:
            return list(self._handed_back)

    def release_all(
        self,
        reason_code: str | None = None,
        reason: str | None = None,
        *,
        checkpoint_seconds: float = 0.0,
        hand_back_by: float | None = None,
    ) -> list[str]:
        """Drain timeout, spot notice: stop every running job and hand it back to its
        queue without spending an attempt (``reason_code`` / ``reason`` go on the
        released attempt). Jobs that come after this are handed back unrun. Answers
        the jobs running now (which of them are handed back: :meth:`handed_back`).

        ``checkpoint_seconds``: a job whose step works in pieces (one begun or restored)
        may run that long more to finish the piece it is on (a single pass is stopped at
        once); it is stopped as soon as that piece is stored (the
        retry goes on from it), or when the time is up (the piece is abandoned).

        ``hand_back_by`` (monotonic; default :data:`HAND_BACK_SECONDS` from now): a hand
        back (or an outage's) the record refuses, down, is tried again with backoff
        until then; after it the job is left to its lease (whose expiry counts the
        attempt)."""
        cutoff = time.monotonic() + checkpoint_seconds
        with self._lock:
            self._release_everything = True
            self._hand_back_by = (
                time.monotonic() + HAND_BACK_SECONDS if hand_back_by is None else hand_back_by
            )
            if reason_code is not None or reason is not None:
                self._release_reason = (reason_code, reason)
            jobs = [job_id for job_id in self._running if job_id not in self._releasing]
            deferred = [
                j
                for j in jobs
                if checkpoint_seconds > 0
                and j in self._checkpointers
                and self._checkpointers[j].in_pieces()
            ]
            stopped = [j for j in jobs if j not in deferred and j not in self._deferred]
            self._releasing.update(stopped)
            for job_id in deferred:
                self._deferred[job_id] = cutoff
        for job_id in stopped:
            self.executor.cancel(job_id)
        return jobs

    def _checkpointed(self, job_id: str) -> None:
        """A piece of ``job_id`` was stored: a job waiting for it to be handed back
        (see :meth:`release_all`) stops now."""
        with self._lock:
            if self._deferred.pop(job_id, None) is None:
                return
            self._releasing.add(job_id)
        log.info(
            "job %s: its piece in progress is stored; handing it back",
            job_id,
            extra={"job_id": job_id, "worker_id": self.worker_id, "action": "checkpointed"},
        )
        self.executor.cancel(job_id)

    def close(self) -> None:
        """Stop the watcher (running jobs are the caller's to finish first)."""
        self._closed.set()
        watcher = self._watcher
        if watcher is not None:
            watcher.join(5)

    def run_started(self, job: ClaimedJob) -> Outcome | Completion:
        """Run a job this worker holds (``processing``, or ``claimed`` with its start on
        its way to the record: :class:`~hypermedia.worker.worker.CompletionBatcher`);
        a :class:`Completion` when only the record's complete is left."""
        profile = self.catalog.by_id(job.profile_id)
        lease = lease_seconds(job_timeout(job, profile), self.dispatcher.grace)
        # Extended once a third of its lease has passed: since the claim, which for a
        # job its loop took ahead was a moment before it began. A job whose pages gave
        # it more time than its profile's (the claim's lease) is extended at once.
        passed = lease - (job.deadline - self.dispatcher.clock.now())
        now = time.monotonic()
        watched = _Watched(job, lease, now + max(0.0, lease / 3 - passed), now + lease - passed)
        with self._lock:
            self._running[job.job_id] = watched
            if self._release_everything:
                self._releasing.add(job.job_id)
            if self._watcher is None and not self._closed.is_set():
                self._watcher = threading.Thread(
                    target=self._watch, name=f"{self.worker_id}-watch", daemon=True
                )
                self._watcher.start()
        try:
            if profile is None:
                return self._fail(
                    job, "profile_missing", "the job's profile is not in the record", False
                )
            return self._execute(job, profile, watched.cancelled)
        finally:
            with self._lock:
                self._running.pop(job.job_id, None)
                self._releasing.discard(job.job_id)
                self._deferred.pop(job.job_id, None)
                self._checkpointers.pop(job.job_id, None)
            self.executor.cleanup(job.job_id)

    def _execute(
        self, job: ClaimedJob, profile: ProfileRecord, cancelled: threading.Event
    ) -> Outcome | Completion:
        try:
            workdir = self.executor.prepare(job.job_id)
            input_path = workdir / "input" / "source"
            if profile.params.get(NEEDS_INPUT, True) is not False:
                downloading = self._progress(job, "download")
                transfer.download(
                    self.grants.input_url(job.job_id, self.worker_id),
                    input_path,
                    profile.max_input_bytes,
                    progress=downloading,
                )
                if downloading.published:
                    # The step may report nothing (a DOCX conversion): without this,
                    # a watcher shows the download's full bar while it runs.
                    self._run_starts(job)
            if self._is_releasing(job.job_id):
                return self._release(job)
            if cancelled.is_set():  # asked while the input came: no child to start
                return self._cancelled(job)
            checkpointer = self._checkpointer(job, workdir)
            try:
                result = self.executor.run(
                    job.job_id,
                    job.operation,
                    input_path,
                    job.params,
                    timeout_seconds=(
                        profile.timeout_seconds
                        if job.timeout_seconds is None
                        else job.timeout_seconds
                    ),
                    memory_limit_mb=profile.memory_limit_mb,
                    max_processes=profile.max_processes,
                    max_output_bytes=profile.max_output_bytes,
                    on_progress=self._step_progress(job),
                )
            except BaseException:
                if checkpointer is not None:
                    # What the child finished before it ended is kept for the retry
                    # (a job its user cancelled has none).
                    checkpointer.stop(flush=not cancelled.is_set())
                raise
            if checkpointer is not None:
                checkpointer.stop(flush=False)
            if cancelled.is_set():  # asked while the step ran: nothing is stored
                return self._cancelled(job)
            reported = [o for o in result.outputs if o.output_type == USAGE_OUTPUT]
            units = read_units(job, reported[0].path) if reported else None
            records = self._store(job, [o for o in result.outputs if o not in reported])
        except ChildFailed as exc:
            if self._is_releasing(job.job_id):
                return self._release(job)
            if exc.code == "cancelled" or cancelled.is_set():
                return self._cancelled(job)
            limit = LIMIT_OF_CODE.get(exc.code)
            if limit is not None:
                self.dispatcher.metrics.count(SANDBOX_KILLS, {"queue": job.queue, "limit": limit})
            return self._fail(job, exc.code, exc.message, exc.retryable, exc.log)
        except (NotFound, IllegalTransition) as exc:
            # The head no longer lets us have this job (reaped, cancelled): not ours.
            log.info("job %s is no longer ours: %s", job.job_id, exc, extra={"job_id": job.job_id})
            self.dispatcher.mirror([job.job_id])
            return Outcome(job.job_id, "lost")
        except transfer.TransferError as exc:
            return self._fail(job, exc.code, exc.message, exc.retryable)
        except ServiceUnavailable as exc:
            # The record, Redis or the storage down (here or where the grants are made):
            # the platform's outage, not the job's doing.
            return self._outage(job, exc)
        except HypermediaError as exc:
            return self._fail(job, exc.code, exc.message, False)
        # A cancel asked once the outputs are stored comes too late to save the work:
        # the job completes, its outputs registered (counted on the quota, deletable),
        # rather than ending cancelled with blobs in storage that no row accounts for.
        actual = None
        if units is not None and job.estimated_millicredits is not None:
            actual = charge(job, profile, units)
        ended = self.dispatcher.clock.now()
        return Completion(job, records, result.peak_memory_mb, units, actual, ended)

    def _checkpointer(self, job: ClaimedJob, workdir: Path) -> Checkpointer | None:
        """For a step that checkpoints: its pieces restored (a retry) and watched."""
        if not registry.checkpointing(job.operation):
            return None
        checkpointer = Checkpointer(
            job,
            self.worker_id,
            self.grants,
            self.dispatcher,
            workdir,
            on_stored=lambda: self._checkpointed(job.job_id),
        )
        checkpointer.restore()
        checkpointer.start()
        with self._lock:
            self._checkpointers[job.job_id] = checkpointer
        return checkpointer

    def _store(self, job: ClaimedJob, outputs: Sequence[ChildOutput]) -> list[OutputRecord]:
        if not outputs:
            return []
        wanted = {o.output_type: o.content_type for o in outputs}
        grants = self.grants.output_urls(job.job_id, self.worker_id, wanted)
        records = []
        # One upload phase for all the outputs, in bytes.
        total = sum(output.path.stat().st_size for output in outputs)
        uploaded = 0
        report = self._progress(job, "upload")
        for output in outputs:
            grant = grants[output.output_type]

            def progress(done: int, _total: int | None, before: int = uploaded) -> None:
                report(before + done, total)

            transfer.upload(output.path, grant.url, grant.content_type, progress=progress)
            uploaded += output.path.stat().st_size
            records.append(
                OutputRecord(
                    output_type=output.output_type,
                    storage_key=grant.key,
                    size_bytes=output.path.stat().st_size,
                    content_type=output.content_type or mimetypes.guess_type(output.output_type)[0],
                )
            )
        return records

    def _progress(self, job: ClaimedJob, phase: str, unit: str = "bytes") -> _Progress:
        return _Progress(self.dispatcher.events, job, phase, unit)

    def _run_starts(self, job: ClaimedJob) -> None:
        """The run phase begins, measure unknown until the step reports one."""
        event = progress_event("run", 0.0, None, "", time.time(), job.attempt_number)
        self.dispatcher.events.publish(job.job_id, event)

    def _step_progress(self, job: ClaimedJob) -> Callable[[Any], None]:
        """The step's reports (already at most a few a second: the executor's)."""

        def report(progress: Any) -> None:
            event = progress_event(
                "run",
                progress.done,
                progress.total,
                progress.unit,
                time.time(),
                job.attempt_number,
            )
            self.dispatcher.events.publish(job.job_id, event)

        return report

    def _is_releasing(self, job_id: str) -> bool:
        with self._lock:
            return job_id in self._releasing

    def _release(self, job: ClaimedJob) -> Outcome:
        reason_code, reason = self._release_reason
        released = self._written(
            job,
            "hand it back",
            lambda: self.dispatcher.release(
                job, self.worker_id, reason_code=reason_code, reason=reason
            ),
        )
        if not released:
            return Outcome(job.job_id, "lost")
        with self._lock:
            self._handed_back.append(job.job_id)
        return Outcome(job.job_id, "released")

    def _written(self, job: ClaimedJob, what: str, write: Callable[[], _T]) -> _T | None:
        """:meth:`_until_written`, also given up once the job's lease has run out (its
        expiry then does what the write would have); None once given up (the job left
        to its lease). Not raised: a write in the job's run would be taken for the
        outage that ended its attempt (:meth:`_outage`: a cancel closed as a failure, a
        hand back past the drain's deadline made one of the job's outage hand backs)."""
        with self._lock:
            watched = self._running.get(job.job_id)
        try:
            # Read at each retry: an extend the record takes meanwhile moves it on.
            return self._until_written(
                job, what, write, None if watched is None else lambda: watched.lease_ends
            )
        except (DatabaseUnavailable, DatabaseConflict):
            return None

    def _until_written(
        self,
        job: ClaimedJob,
        what: str,
        write: Callable[[], _T],
        lease_ends: Callable[[], float] | None = None,
    ) -> _T:
        """``write`` tried again while the record is down (:func:`until_written`; else
        the job would stay ``processing`` until its lease ran out, whose expiry counts
        the attempt), until written; or until the worker stops, or, once
        :meth:`release_all`, until its hand-back deadline, or ``lease_ends()`` (monotonic,
        as it is then) has passed: then the error is raised, the job left to its lease."""

        def give_up_at() -> float | None:
            by = self._give_up_at()
            if lease_ends is None:
                return by
            ends = lease_ends()
            return ends if by is None else min(by, ends)

        try:
            return until_written(write, job.job_id, what, self.worker_id, give_up_at, self._closed)
        except (DatabaseUnavailable, DatabaseConflict) as down:
            if self._closed.is_set():
                before = "the worker stopped"
            elif lease_ends is not None and time.monotonic() >= lease_ends():
                before = "its lease ran out"
            else:
                before = "the worker had to hand its jobs back"
            log.warning(
                "job %s: could not %s (%s) before %s: left to its lease",
                job.job_id,
                what,
                down,
                before,
                extra={"job_id": job.job_id, "worker_id": self.worker_id},
            )
            raise

    def _give_up_at(self) -> float | None:
        """Once :meth:`release_all`, its hand-back deadline (monotonic); else None."""
        with self._lock:
            return self._hand_back_by if self._release_everything else None

    def _fail(
        self, job: ClaimedJob, code: str, message: str, retryable: bool, log_tail: str = ""
    ) -> Outcome:
        """The attempt failed (the job's own doing): written with its code, message and
        log tail, the record down tried again until its lease runs out (:meth:`_written`)."""
        status = self._written(
            job,
            f"record its failure ({code})",
            lambda: self.dispatcher.fail(
                job, self.worker_id, code, message, retryable=retryable, log_tail=log_tail or None
            ),
        )
        log.info(
            "job %s attempt %d failed: %s: %s",
            job.job_id,
            job.attempt_number,
            code,
            message,
            extra={"job_id": job.job_id, "worker_id": self.worker_id, "action": "fail"},
        )
        return Outcome(job.job_id, status.value if status else "lost", code)

    def _outage(self, job: ClaimedJob, exc: ServiceUnavailable) -> Outcome:
        """The platform's outage ended the attempt: the job goes back without spending
        an attempt (:meth:`Dispatcher.fail_for_outage`; bounded per job), answered
        ``released`` with the error's code (the worker pauses its claims for it). The
        record is often what is down: the hand back waits for it as a failure's does
        (:meth:`_written`: until written, or given up once the job's lease has run out,
        the worker stopped or the deadline of :meth:`release_all` passed); given up, the
        job is left to its lease, answered ``lost`` with the error's code (the worker
        still pauses its claims)."""
        written = self._written(
            job,
            f"hand it back for the outage ({exc.code})",
            lambda: self.dispatcher.fail_for_outage(job, self.worker_id, exc.code, exc.message),
        )
        if written is None:
            return Outcome(job.job_id, "lost", exc.code)
        status, counted = written
        if status is None:
            return Outcome(job.job_id, "lost")
        log.info(
            "job %s attempt %d %s: %s: %s",
            job.job_id,
            job.attempt_number,
            "failed" if counted else "handed back, not counted",
            exc.code,
            exc.message,
            extra={"job_id": job.job_id, "worker_id": self.worker_id, "action": "fail"},
        )
        if not counted and status is JobStatus.RETRY_WAIT:
            return Outcome(job.job_id, "released", exc.code)
        return Outcome(job.job_id, status.value, exc.code)

    def _cancelled(self, job: ClaimedJob) -> Outcome:
        if self._written(
            job, "cancel it", lambda: self.dispatcher.honour_cancel(job, self.worker_id)
        ):
            return Outcome(job.job_id, "cancelled")
        return Outcome(job.job_id, "lost")

    def _watch(self) -> None:
        """Every ``poll_seconds``: one query for the running jobs' cancel requests
        (their children are killed), and a longer lease for each job a third of
        whose lease has passed since it started or was last extended. A job being
        released has its child killed again (it may have started after
        :meth:`release_all`), and so has one whose time to store its piece is up. A
        cancelled job's lease is extended too: it is ours until its run returns, and a
        cancel once its outputs upload comes too late (the job completes)."""
        while not self._closed.wait(self.poll_seconds):
            with self._lock:
                running = list(self._running.values())
                watched = [w for w in running if not w.cancelled.is_set()]
                unkilled = [
                    w for w in self._running.values() if w.cancelled.is_set() and not w.killed
                ]
                due = [j for j, cutoff in self._deferred.items() if cutoff <= time.monotonic()]
                for job_id in due:
                    del self._deferred[job_id]
                    self._releasing.add(job_id)
                releasing = [job_id for job_id in self._running if job_id in self._releasing]
            for job_id in releasing:
                self.executor.cancel(job_id)
            for w in unkilled:
                w.killed = self.executor.cancel(w.job.job_id)
            if not running:
                continue
            try:
                requested = (
                    self.dispatcher.cancel_requested_among([w.job.job_id for w in watched])
                    if watched
                    else set()
                )
                now = time.monotonic()
                for w in running:
                    if w.job.job_id in requested:
                        w.cancelled.set()
                        w.killed = self.executor.cancel(w.job.job_id)
                    elif now >= w.next_extend:
                        if self.dispatcher.extend(w.job, self.worker_id, w.lease):
                            w.lease_ends = now + w.lease
                        w.next_extend = now + w.lease / 3
            except HypermediaError as exc:
                log.warning("watcher: %s", exc, extra={"worker_id": self.worker_id})


def read_units(job: ClaimedJob, path: Path) -> dict[str, int] | None:
    """The units of work a step reported (a JSON object of unit names to counts);
    None, with a warning, for anything else."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_USAGE_BYTES + 1)
        units = json.loads(data) if len(data) <= MAX_USAGE_BYTES else None
    except (OSError, ValueError):
        units = None
    if isinstance(units, dict) and all(
        isinstance(k, str) and type(v) is int and v >= 0 for k, v in units.items()
    ):
        return units
    log.warning(
        "job %s: its step reported units of work that are not a JSON object of counts",
        job.job_id,
        extra={"job_id": job.job_id, "queue": job.queue, "action": "usage_ignored"},
    )
    return None


def charge(job: ClaimedJob, profile: ProfileRecord, units: Mapping[str, int]) -> int:
    """What the completion charges ``job``: its estimate plus the priced ``units`` its
    step reported, at most what its submit reserved. More than the reservation means
    the step reported past the bound it declared (:func:`pipelines.registry.max_units`):
    charged the reservation, and a warning says so (the bound is wrong)."""
    assert job.estimated_millicredits is not None
    actual = profile.charge_millicredits(job.estimated_millicredits, units)
    reserved = job.reserved_millicredits
    if reserved is None or actual <= reserved:
        return actual
    log.warning(
        "job %s: its step reported more units of work than it bounds (%s): charged the"
        " %d millicredits reserved, not %d",
        job.job_id,
        ", ".join(f"{unit}={count}" for unit, count in sorted(units.items())),
        reserved,
        actual,
        extra={"job_id": job.job_id, "queue": job.queue, "action": "charge_capped"},
    )
    return reserved


def until_written(
    write: Callable[[], _T],
    job_id: str | None,
    what: str,
    worker_id: str,
    give_up_at: Callable[[], float | None],
    stopped: threading.Event | None = None,
) -> _T:
    """``write`` (a job's hand back to the record; ``job_id`` None: the worker's row)
    tried again while the record is down (DatabaseUnavailable, DatabaseConflict), 0.1 s
    apart doubling to :data:`OUTAGE_RETRY_MAX_SECONDS`, until written; the error raised
    once ``give_up_at()`` (a monotonic time; None: never) has passed or ``stopped`` is
    set. The waits end early when ``stopped`` is set."""
    backoff = 0.1
    while True:
        try:
            return write()
        except (DatabaseUnavailable, DatabaseConflict) as down:
            by = give_up_at()
            left = None if by is None else by - time.monotonic()
            if (stopped is not None and stopped.is_set()) or (left is not None and left <= 0):
                raise
            wait = backoff if left is None else min(backoff, left)
            log.warning(
                "%s %s: could not %s: %s; retrying in %.1fs",
                "worker" if job_id is None else "job",
                worker_id if job_id is None else job_id,
                what,
                down,
                wait,
                extra={"worker_id": worker_id, **({} if job_id is None else {"job_id": job_id})},
            )
            if stopped is None:
                time.sleep(wait)
            else:
                stopped.wait(wait)
            backoff = min(backoff * 2, OUTAGE_RETRY_MAX_SECONDS)
