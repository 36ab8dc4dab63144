"""The blobs left to delete (``blob_deletions``): the storage's outbox, so that a
deleted object's bytes go even when the storage fails the first time.

Every write to ``blob_deletions`` is here. A blob's deletion:

1. **recorded** (:func:`record`) in the transaction that marks its object deleted
   (``DELETE /objects/{id}``): from its commit on, the record says the bytes must go,
   whatever happens to the process that committed it;
2. **tried** at once, after that commit (:func:`delete_blobs`, by the API): each blob
   the storage deleted loses its record; the first the storage fails (S3 down, a
   timeout, a disk error) keeps it, with its error and its next try
   (:func:`retry_delay` after this one), and the blobs after it are left as they are
   (a storage that failed one fails the next: the request is not held up for each);
3. **swept** (:func:`sweep`, by the head's maintenance every
   :data:`SWEEP_SECONDS`): the records whose next try is due, oldest first, tried as
   in 2., each failure pushing its next try further out (:func:`retry_delay`, up to
   :data:`MAX_DELAY_SECONDS`). A record is first due :data:`FIRST_TRY_SECONDS` after
   it was written (the API's own try, and one of an API that died after the commit).

Deleting a blob that is not there succeeds (S3's DELETE, the local unlink), so a key
deleted twice (the API and a sweep at once, or a record whose removal failed) is
harmless. An output's key can be written again, though: it is its source's and
profile's, and a job re-run on the source after the output was deleted writes it and
revives the row. Each blob is therefore deleted with its source's row locked (no job is
created on the source meanwhile), and not at all while its row is live again (the
record goes: the bytes are that row's) or a job on its source has yet to end (tried
again later). How many records are waiting, and the oldest one's age, are
``hypermedia_blob_deletions_*`` (:mod:`hypermedia.metrics`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy import Connection, Engine, delete, func, insert, select, update
from sqlalchemy.exc import DBAPIError

from hypermedia.clock import to_datetime, to_epoch
from hypermedia.db import tables as t
from hypermedia.db.engine import snapshot, transaction
from hypermedia.errors import HypermediaError
from hypermedia.jobs.states import TERMINAL
from hypermedia.storage.base import Storage

log = logging.getLogger(__name__)

# A record's first sweep, after it was written (the API tries it itself at once).
FIRST_TRY_SECONDS = 60.0
# The pause after a failed try: this, doubled with each failure, at most MAX_DELAY.
FIRST_DELAY_SECONDS = 60.0
MAX_DELAY_SECONDS = 3600.0
# How often the head's maintenance sweeps, and how many records at most a sweep reads.
SWEEP_SECONDS = 30.0
SWEEP_BATCH = 500
_ERROR_CHARS = 200
_FINISHED = [s.value for s in TERMINAL]


def retry_delay(failures: int) -> float:
    """Seconds until the next try of a blob whose deletion failed ``failures`` times."""
    if failures < 1:
        raise ValueError(f"failures must be 1 or more, not {failures}")
    return float(min(FIRST_DELAY_SECONDS * 2 ** min(failures - 1, 32), MAX_DELAY_SECONDS))


def record(conn: Connection, object_id: str, keys: Sequence[str], now: float) -> None:
    """Record ``keys`` to delete, in the caller's transaction (the one marking
    ``object_id``'s rows deleted). A key recorded already keeps its record."""
    if not keys:
        return
    b = t.blob_deletions.c
    existing = set(
        conn.execute(select(b.storage_key).where(b.storage_key.in_(list(keys)))).scalars()
    )
    when = to_datetime(now)
    due = to_datetime(now + FIRST_TRY_SECONDS)
    fresh = [
        {
            "storage_key": key,
            "object_id": object_id,
            "requested_at": when,
            "attempts": 0,
            "next_attempt_at": due,
        }
        for key in dict.fromkeys(keys)
        if key not in existing
    ]
    if fresh:
        conn.execute(insert(t.blob_deletions), fresh)


@dataclass
class DeleteReport:
    deleted: list[str] = field(default_factory=list)
    revived: list[str] = field(default_factory=list)  # its object is live again: kept
    waiting: list[str] = field(default_factory=list)  # a job on its source may write it
    failed: dict[str, str] = field(default_factory=dict)  # key -> error
    left: list[str] = field(default_factory=list)  # not tried: the one before failed


class _StorageFailed(Exception):
    def __init__(self, error: HypermediaError) -> None:
        super().__init__(str(error))
        self.error = error


def delete_blobs(
    engine: Engine, storage: Storage, keys: Sequence[str], now: float, *, action: str
) -> DeleteReport:
    """Delete the blobs of recorded ``keys`` from ``storage`` and their records (see
    the module docstring, 2.). Never raises for the storage or the record: what was not
    done stays recorded for the sweep. ``action``: for the log."""
    report = DeleteReport()
    for index, key in enumerate(keys):
        try:
            getattr(report, _delete_one(engine, storage, key, now)).append(key)
            continue
        except _StorageFailed as failed:
            report.failed[key] = str(failed.error)[:_ERROR_CHARS]
            problem: Exception = failed.error
        except (HypermediaError, DBAPIError) as exc:  # the record: the sweep tries again
            problem = exc
        report.left = list(keys[index + 1 :])
        log.warning(
            "blob %s not deleted (%s): tried again later, with %d more",
            key,
            problem,
            len(report.left),
            extra={"action": action},
        )
        if key in report.failed:
            with contextlib.suppress(HypermediaError, DBAPIError):
                _failed(engine, key, report.failed[key], now)
        break
    return report


def _delete_one(engine: Engine, storage: Storage, key: str, now: float) -> str:
    """Delete one recorded blob (the :class:`DeleteReport` list it goes in), unless its
    key may be written again. An output's key is its source's and profile's, and a job
    on the source re-run after the output was deleted writes the same key and revives
    its row (:meth:`~hypermedia.jobs.repository.JobRepository.complete`): a late
    deletion would take those new bytes. So the source's row is locked first (as a
    submit locks the objects it creates jobs on: no job on it is created until the
    blob is gone), and a blob whose row is live again is kept, one a job on the source
    still to end may write is left for later. The storage's failure:
    :class:`_StorageFailed`, nothing of the transaction kept."""
    o, b, j = t.objects.c, t.blob_deletions.c, t.jobs.c
    holder = select(o.object_id, o.source_object_id, o.deleted_at).where(o.storage_key == key)
    with transaction(engine) as conn:
        row = conn.execute(holder).first()
        source = None if row is None else row.source_object_id
        if source is not None:
            conn.execute(select(o.object_id).where(o.object_id == source).with_for_update())
            row = conn.execute(holder).first()  # as of the lock
        gone = delete(t.blob_deletions).where(b.storage_key == key)
        if row is not None and row.deleted_at is None:
            conn.execute(gone)
            return "revived"
        if (
            source is not None
            and conn.execute(
                select(j.job_id).where(j.object_id == source, j.status.not_in(_FINISHED)).limit(1)
            ).first()
        ):
            conn.execute(
                update(t.blob_deletions)
                .where(b.storage_key == key)
                .values(next_attempt_at=to_datetime(now + FIRST_DELAY_SECONDS))
            )
            return "waiting"
        try:
            storage.delete(key)
        except HypermediaError as exc:
            raise _StorageFailed(exc) from exc
        conn.execute(gone)
        return "deleted"


def _failed(engine: Engine, key: str, error: str, now: float) -> None:
    b = t.blob_deletions.c
    with transaction(engine) as conn:
        failures = 1 + int(
            conn.execute(select(b.attempts).where(b.storage_key == key)).scalar() or 0
        )
        conn.execute(
            update(t.blob_deletions)
            .where(b.storage_key == key)
            .values(
                attempts=failures,
                next_attempt_at=to_datetime(now + retry_delay(failures)),
                last_error=error,
            )
        )


def sweep(
    engine: Engine, storage: Storage, now: float, *, batch: int = SWEEP_BATCH
) -> DeleteReport:
    """Try the recorded deletions that are due (see the module docstring, 3.)."""
    b = t.blob_deletions.c
    with snapshot(engine) as conn:
        keys = list(
            conn.execute(
                select(b.storage_key)
                .where(b.next_attempt_at <= to_datetime(now))
                .order_by(b.next_attempt_at, b.storage_key)
                .limit(batch)
            ).scalars()
        )
    report = delete_blobs(engine, storage, keys, now, action="blob_sweep")
    if report.deleted:
        log.info(
            "deleted %d blobs left behind", len(report.deleted), extra={"action": "blob_sweep"}
        )
    return report


@dataclass(frozen=True, slots=True)
class Pending:
    """The deletions recorded and not done: how many, and the oldest one's age."""

    count: int
    oldest_age_seconds: float


def pending(conn: Connection, now: float) -> Pending:
    b = t.blob_deletions.c
    count, oldest = conn.execute(select(func.count(), func.min(b.requested_at))).one()
    age = 0.0 if oldest is None else max(0.0, now - to_epoch(oldest))
    return Pending(int(count), age)
