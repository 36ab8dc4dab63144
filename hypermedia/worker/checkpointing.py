"""A running job's checkpoints, kept by its worker (:mod:`pipelines.checkpoints`).

For a step that checkpoints, the worker

- before the step runs on a retry (attempt 2 on), asks the head for the pieces the job
  committed and downloads them into the workdir's checkpoint directory, where the step
  finds them and skips their work; a piece that cannot be fetched is left out (the step
  does that work again);
- while the step runs, looks at that directory every :data:`POLL_SECONDS` and stores
  each new whole piece: a PUT URL from the head (which records the key first), the
  upload, then the commit in the record (only while this worker holds the job). A
  restored piece the step made again (it found it damaged: bytes changed in storage,
  a zip that does not read) is a new piece, another file under the same name: it
  replaces the damaged one in storage, or every later retry would meet that again;
- once the child has ended without output (failed, killed, released for a spot notice
  or a drain), stores what it left before the job is handed back.

A piece that could not be stored is not committed: the next attempt does its work
again. Errors here never fail the job.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from hypermedia.errors import HypermediaError
from hypermedia.jobs.dispatcher import Dispatcher
from hypermedia.jobs.repository import ClaimedJob
from hypermedia.storage import transfer
from hypermedia.storage.grants import OutputGrant
from pipelines import checkpoints

log = logging.getLogger(__name__)

POLL_SECONDS = 0.25
MAX_PIECE_BYTES = 64 << 30


class CheckpointGrants(Protocol):
    def checkpoint_uploads(
        self, job_id: str, worker_id: str, names: Sequence[str]
    ) -> Mapping[str, OutputGrant]: ...

    def checkpoint_downloads(self, job_id: str, worker_id: str) -> Mapping[str, OutputGrant]: ...


class Checkpointer:
    def __init__(
        self,
        job: ClaimedJob,
        worker_id: str,
        grants: CheckpointGrants,
        dispatcher: Dispatcher,
        workdir: Path,
        *,
        poll_seconds: float = POLL_SECONDS,
        on_stored: Callable[[], None] | None = None,
    ) -> None:
        self.job = job
        self.worker_id = worker_id
        self.grants = grants
        self.dispatcher = dispatcher
        self.workdir = workdir
        self.poll_seconds = poll_seconds
        self.on_stored = on_stored  # called after pieces were stored (not restored ones)
        self.restored: list[str] = []
        self.stored: set[str] = set()
        self._as_restored: dict[str, _FileIdentity] = {}  # until made again and stored
        self._lock = threading.Lock()  # one store at a time (the thread, the last flush)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._extra = {"job_id": job.job_id, "worker_id": worker_id}

    def restore(self) -> list[str]:
        """Download the job's committed pieces (a retry); their names."""
        if self.job.attempt_number <= 1:
            return []
        try:
            pieces = self.grants.checkpoint_downloads(self.job.job_id, self.worker_id)
        except HypermediaError as exc:
            log.warning("job %s: its checkpoints are out of reach: %s", self.job.job_id, exc,
                        extra=self._extra)  # fmt: skip
            return []
        directory = checkpoints.directory(self.workdir)
        for name, grant in sorted(pieces.items()):
            if not checkpoints.valid_name(name):
                continue
            try:
                directory.mkdir(parents=True, exist_ok=True)
                transfer.download(grant.url, directory / name, MAX_PIECE_BYTES)
            except (transfer.TransferError, OSError) as exc:
                (directory / name).unlink(missing_ok=True)
                log.warning("job %s: checkpoint %s not restored: %s", self.job.job_id, name, exc,
                            extra=self._extra)  # fmt: skip
                continue
            identity = _identity(directory / name)
            if identity is None:
                continue
            self.restored.append(name)
            self.stored.add(name)  # already in storage, committed
            self._as_restored[name] = identity
        if self.restored:
            log.info(
                "job %s: %d checkpoints restored",
                self.job.job_id,
                len(self.restored),
                extra={**self._extra, "action": "checkpoints_restored"},
            )
        return self.restored

    def in_pieces(self) -> bool:
        """Whether the step works in pieces: it has begun one (or pieces were restored),
        so its checkpoint directory exists. An input under the chunking threshold runs in
        one pass and never makes it: a spot notice has nothing of it to wait for."""
        return checkpoints.directory(self.workdir).is_dir()

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"{self.worker_id}-checkpoints", daemon=True
        )
        self._thread.start()

    def stop(self, *, flush: bool) -> None:
        """Stop looking; ``flush``: store what is left first (the child has ended)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        if flush:
            self.store_new()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            self.store_new()

    def store_new(self) -> int:
        """Store and commit the whole pieces not stored yet; how many."""
        done = self._store_new()
        if done and self.on_stored is not None:
            self.on_stored()
        return done

    def _store_new(self) -> int:
        with self._lock:
            fresh = {n: p for n, p in checkpoints.finished(self.workdir).items()
                     if n not in self.stored or self._made_again(n, p)}  # fmt: skip
            if not fresh:
                return 0
            try:
                grants = self.grants.checkpoint_uploads(
                    self.job.job_id, self.worker_id, sorted(fresh)
                )
            except HypermediaError as exc:
                log.warning("job %s: no checkpoint URLs: %s", self.job.job_id, exc,
                            extra=self._extra)  # fmt: skip
                return 0
            done = 0
            for name, path in sorted(fresh.items()):
                grant = grants.get(name)
                if grant is None:
                    continue
                try:
                    size = path.stat().st_size
                    transfer.upload(path, grant.url, grant.content_type)
                    committed = self.dispatcher.commit_checkpoint(
                        self.job, self.worker_id, grant.key, size
                    )
                except (transfer.TransferError, HypermediaError, OSError) as exc:
                    log.warning("job %s: checkpoint %s not stored: %s", self.job.job_id, name,
                                exc, extra=self._extra)  # fmt: skip
                    continue
                if not committed:
                    return done  # the job is no longer ours
                self.stored.add(name)
                self._as_restored.pop(name, None)
                done += 1
            return done

    def _made_again(self, name: str, path: Path) -> bool:
        """Whether the restored piece ``name`` is another file now (the step replaced
        it: renamed a new piece onto it, or removed it and made it again)."""
        restored = self._as_restored.get(name)
        return restored is not None and _identity(path) not in (None, restored)


# A file as the directory holds it: (inode, size, modification time in ns). A piece made
# again is a new file renamed onto the name: another inode, or the same one reused with
# another modification time.
_FileIdentity = tuple[int, int, int]


def _identity(path: Path) -> _FileIdentity | None:
    try:
        found = path.stat()
    except OSError:
        return None
    return (found.st_ino, found.st_size, found.st_mtime_ns)
