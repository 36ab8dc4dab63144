"""One claimed job, end to end, on a worker.

start (claimed -> processing) -> input GET URL from the head -> download into the
job's workdir -> run the pipeline step in a child process -> output PUT URLs from
the head -> upload -> complete (outputs registered, credits charged). The job is
completed only after every output is stored; any failure fails the attempt with
a code and message (retry or failed, per the profile), and the workdir goes.

While the child runs, a watcher extends the lease (long jobs) and polls
``cancel_requested``, killing the child when the user cancelled.
"""

from __future__ import annotations

import logging
import mimetypes
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from hypermedia.errors import (
    DatabaseUnavailable,
    HypermediaError,
    IllegalTransition,
    NotFound,
    QueueUnavailable,
)
from hypermedia.jobs.catalog import ProfileCatalog
from hypermedia.jobs.dispatcher import Dispatcher, lease_seconds
from hypermedia.jobs.repository import ClaimedJob, OutputRecord
from hypermedia.sandbox.outcome import ChildFailed
from hypermedia.storage import transfer
from hypermedia.storage.grants import OutputGrant

log = logging.getLogger(__name__)

CANCEL_POLL_SECONDS = 2.0


class Grants(Protocol):
    """Where a worker gets its presigned URLs: StorageGrants in-process, or a
    client of the head's grants actor."""

    def input_url(self, job_id: str, worker_id: str) -> str: ...

    def output_urls(
        self, job_id: str, worker_id: str, output_types: Mapping[str, str | None]
    ) -> dict[str, OutputGrant]: ...


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
    def peak_memory_mb(self) -> float: ...


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
    ) -> ChildResultLike: ...

    def cancel(self, job_id: str) -> bool: ...

    def cleanup(self, job_id: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Outcome:
    job_id: str
    status: str  # completed | retry_wait | failed | cancelled | released | lost
    error_code: str | None = None


class JobExecution:
    """Runs claimed jobs for one worker. Thread-safe: each loop calls ``run``."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        catalog: ProfileCatalog,
        grants: Grants,
        executor: Executor,
        worker_id: str,
    ) -> None:
        self.dispatcher = dispatcher
        self.catalog = catalog
        self.grants = grants
        self.executor = executor
        self.worker_id = worker_id
        self._running: dict[str, ClaimedJob] = {}
        self._releasing: set[str] = set()
        self._lock = threading.Lock()

    def running(self) -> list[str]:
        with self._lock:
            return list(self._running)

    def release_all(self) -> list[str]:
        """Drain timeout: stop every running job and hand it back to its queue
        without spending an attempt."""
        with self._lock:
            jobs = list(self._running)
            self._releasing.update(jobs)
        for job_id in jobs:
            self.executor.cancel(job_id)
        return jobs

    def run(self, job: ClaimedJob) -> Outcome:
        with self._lock:
            self._running[job.job_id] = job
        try:
            return self._run(job)
        finally:
            with self._lock:
                self._running.pop(job.job_id, None)
                self._releasing.discard(job.job_id)

    def _run(self, job: ClaimedJob) -> Outcome:
        if not self.dispatcher.start(job, self.worker_id):
            return Outcome(job.job_id, "lost")
        profile = self.catalog.by_id(job.profile_id)
        if profile is None:
            return self._fail(job, "profile_missing", "the job's profile is not active", False)
        stop_watch = threading.Event()
        cancelled = threading.Event()
        watcher = threading.Thread(
            target=self._watch,
            args=(
                job,
                lease_seconds(profile.timeout_seconds, self.dispatcher.grace),
                stop_watch,
                cancelled,
            ),
            name=f"watch-{job.job_id[-8:]}",
            daemon=True,
        )
        watcher.start()
        try:
            return self._execute(
                job,
                profile.timeout_seconds,
                profile.memory_limit_mb,
                profile.max_input_bytes,
                cancelled,
            )
        finally:
            stop_watch.set()
            watcher.join(5)
            self.executor.cleanup(job.job_id)

    def _execute(
        self,
        job: ClaimedJob,
        timeout_seconds: int,
        memory_limit_mb: int,
        max_input_bytes: int,
        cancelled: threading.Event,
    ) -> Outcome:
        try:
            workdir = self.executor.prepare(job.job_id)
            input_path = workdir / "input" / "source"
            transfer.download(
                self.grants.input_url(job.job_id, self.worker_id), input_path, max_input_bytes
            )
            result = self.executor.run(
                job.job_id,
                job.operation,
                input_path,
                job.params,
                timeout_seconds=timeout_seconds,
                memory_limit_mb=memory_limit_mb,
            )
            records = self._store(job, result.outputs)
        except ChildFailed as exc:
            with self._lock:
                releasing = job.job_id in self._releasing
            if releasing:
                released = self.dispatcher.release(job, self.worker_id)
                return Outcome(job.job_id, "released" if released else "lost")
            if exc.code == "cancelled" or cancelled.is_set():
                return self._cancelled(job)
            return self._fail(job, exc.code, exc.message, exc.retryable)
        except (NotFound, IllegalTransition) as exc:
            # The head no longer lets us have this job (reaped, cancelled): not ours.
            log.info("job %s is no longer ours: %s", job.job_id, exc, extra={"job_id": job.job_id})
            self.dispatcher.mirror([job.job_id])
            return Outcome(job.job_id, "lost")
        except transfer.TransferError as exc:
            return self._fail(job, exc.code, exc.message, exc.retryable)
        except HypermediaError as exc:
            retryable = isinstance(exc, QueueUnavailable | DatabaseUnavailable)
            return self._fail(job, exc.code, exc.message, retryable)
        if cancelled.is_set() and self.dispatcher.honour_cancel(job, self.worker_id):
            return Outcome(job.job_id, "cancelled")
        if self.dispatcher.complete(
            job, self.worker_id, records, peak_memory_mb=result.peak_memory_mb
        ):
            return Outcome(job.job_id, "completed")
        return Outcome(job.job_id, "lost")

    def _store(self, job: ClaimedJob, outputs: Sequence[ChildOutput]) -> list[OutputRecord]:
        if not outputs:
            return []
        wanted = {o.output_type: o.content_type for o in outputs}
        grants = self.grants.output_urls(job.job_id, self.worker_id, wanted)
        records = []
        for output in outputs:
            grant = grants[output.output_type]
            transfer.upload(output.path, grant.url, grant.content_type)
            records.append(
                OutputRecord(
                    output_type=output.output_type,
                    storage_key=grant.key,
                    size_bytes=output.path.stat().st_size,
                    content_type=output.content_type or mimetypes.guess_type(output.output_type)[0],
                )
            )
        return records

    def _fail(self, job: ClaimedJob, code: str, message: str, retryable: bool) -> Outcome:
        status = self.dispatcher.fail(job, self.worker_id, code, message, retryable=retryable)
        log.info(
            "job %s attempt %d failed: %s: %s",
            job.job_id,
            job.attempt_number,
            code,
            message,
            extra={"job_id": job.job_id, "worker_id": self.worker_id, "action": "fail"},
        )
        return Outcome(job.job_id, status.value if status else "lost", code)

    def _cancelled(self, job: ClaimedJob) -> Outcome:
        if self.dispatcher.honour_cancel(job, self.worker_id):
            return Outcome(job.job_id, "cancelled")
        return Outcome(job.job_id, "lost")

    def _watch(
        self, job: ClaimedJob, lease: float, stop: threading.Event, cancelled: threading.Event
    ) -> None:
        """Extend the lease every third of it; kill the child if the user cancels."""
        next_extend = lease / 3
        waited = 0.0
        while not stop.wait(CANCEL_POLL_SECONDS):
            waited += CANCEL_POLL_SECONDS
            try:
                if self.dispatcher.cancel_requested(job):
                    cancelled.set()
                    self.executor.cancel(job.job_id)
                    return
                if waited >= next_extend:
                    self.dispatcher.extend(job, self.worker_id, lease)
                    next_extend += lease / 3
            except HypermediaError as exc:
                log.warning("watcher of %s: %s", job.job_id, exc, extra={"job_id": job.job_id})
