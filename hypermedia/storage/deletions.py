"""The blobs left to delete (``blob_deletions``): the storage's outbox, so that a
deleted object's bytes go even when the storage fails the first time.

Every write to ``blob_deletions`` is here. A blob's deletion:

1. **recorded** (:func:`record`) in the transaction that marks its object deleted
   (``DELETE /objects/{id}``), or in one of its own for an upload's blob that was not
   registered after all (:func:`discard`): from its commit on, the record says the
   bytes must go, whatever happens to the process that committed it;
2. **tried** at once, after that commit (:func:`delete_blobs`, by the API): each blob
   the storage deleted loses its record; the first the storage fails (S3 down, a
   timeout, a disk error) keeps it, with its error and its next try
   (:func:`retry_delay` after this one failed: a call that hung minutes before it
   failed is not due again at once), and the blobs after it are left as they are
   (a storage that failed one fails the next: the request is not held up for each);
3. **swept** (:func:`sweep`, by the head's maintenance every
   :data:`SWEEP_SECONDS`): the records whose next try is due, oldest first, tried as
   in 2., each failure pushing its next try further out (:func:`retry_delay`, up to
   :data:`MAX_DELAY_SECONDS`). A record is first due :data:`FIRST_TRY_SECONDS` after
   it was written (the API's own try, and one of an API that died after the commit).

A migrated object (``objects.storage_backend``: a bulk ``migrate`` copied it to another
backend and verified the copy) has its key in two places: the copy there and the
original the migration left in the server's storage. Its record says which backend
(``storage_backend``, from its object's row when recorded; one that names none, as
code before migration 0029 wrote them, takes its deleted object's row's), and each try
deletes the key from the server's storage and then from that backend (reached through
:data:`Backends`); either one failing keeps the record, and the next try deletes both
again.

Deleting a blob that is not there succeeds (S3's DELETE, the local unlink), so a key
deleted twice (the API and a sweep at once, or a record whose removal failed) is
harmless. An output's key can be written again, though: it is its source's and
profile's, and a job re-run on the source after the output was deleted writes it and
revives the row. A blob is therefore not deleted while its row is live again (the
record goes: the bytes are that row's) or a job on its source has yet to end (tried
again later), and no job on the source may write it while the storage deletes it. No
transaction is open during the storage's call: on SQLite one holds the whole database's
write lock (every upload, submit and completion would wait), and on PostgreSQL one
would hold the source's row for as long as the storage takes (a submit on the source
waits ``lock_timeout`` for it, then fails; a call past
``idle_in_transaction_session_timeout`` has its session ended under it, the row let go
while the delete is still under way). So a short transaction decides (an output's
source row locked on PostgreSQL, as a submit locks the objects it creates jobs on: a
job on the source is either seen, and the blob waits, or created after the claim) and
**claims** the record (``claimed_until``, :data:`CLAIM_SECONDS` on), the storage
deletes, another removes the record. A job created meanwhile is granted no URL for a
key whose deletion is claimed (:func:`being_deleted`,
:meth:`~hypermedia.storage.grants.StorageGrants.output_urls`: a retryable refusal), so
its bytes are written after the storage's answer, never before a late delete. Left
open: a storage call that outlasts its claim (logged; S3's is bounded well below it),
and a worker that lost its job but still holds a PUT URL granted before (it lives
``presign_ttl_seconds``).

How many records are waiting, and the oldest one's age, are
``hypermedia_blob_deletions_*`` (:mod:`hypermedia.metrics`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Connection, Engine, bindparam, delete, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import ColumnElement

from hypermedia.clock import Clock, to_datetime, to_epoch
from hypermedia.db import tables as t
from hypermedia.db.engine import snapshot, transaction
from hypermedia.errors import HypermediaError
from hypermedia.jobs.states import TERMINAL
from hypermedia.storage.base import Storage, StorageUnavailable

log = logging.getLogger(__name__)

# A record's first sweep, after it was written (the API tries it itself at once).
FIRST_TRY_SECONDS = 60.0
# The pause after a failed try: this, doubled with each failure, at most MAX_DELAY.
FIRST_DELAY_SECONDS = 60.0
MAX_DELAY_SECONDS = 3600.0
# How often the head's maintenance sweeps, and how many records at most a sweep reads.
SWEEP_SECONDS = 30.0
SWEEP_BATCH = 500
# How long a claimed deletion keeps its key from the jobs that would write it,
# and from other deleters: longer than the storage's longest delete (S3: botocore's 3
# attempts of a 10 s connect and a 60 s read, about 4 min with its backoff). A claim
# that ran out (its deleter died, or a local disk hung longer) is tried again by the
# sweep; a delete still under way then could take a re-run's new bytes, and says so.
CLAIM_SECONDS = 600.0
_ERROR_CHARS = 200
_FINISHED = [s.value for s in TERMINAL]

Backends = Callable[[str], Storage]
"""The storage an ``objects.storage_backend`` names (where a migration copied it);
raises a :class:`~hypermedia.errors.HypermediaError` when it cannot be reached."""


def retry_delay(failures: int) -> float:
    """Seconds until the next try of a blob whose deletion failed ``failures`` times."""
    if failures < 1:
        raise ValueError(f"failures must be 1 or more, not {failures}")
    return float(min(FIRST_DELAY_SECONDS * 2 ** min(failures - 1, 32), MAX_DELAY_SECONDS))


def record(
    conn: Connection,
    object_id: str,
    keys: Sequence[str],
    now: float,
    *,
    backend: str | None = None,
) -> None:
    """Record ``keys`` to delete, in the caller's transaction (the one marking
    ``object_id``'s rows deleted), each with the backend its object's row says a copy
    was migrated to. A key recorded already keeps its record. ``backend``: the keys
    have a copy there (a migration's, of an object deleted while it copied it), also
    recorded on a record that names none."""
    if not keys:
        return
    b, o = t.blob_deletions.c, t.objects.c
    if backend is not None:
        migrated = dict.fromkeys(keys, backend)
    else:
        migrated = dict(
            conn.execute(
                select(o.storage_key, o.storage_backend).where(
                    o.storage_key.in_(list(keys)), o.storage_backend.is_not(None)
                )
            ).all()
        )
    when = to_datetime(now)
    due = to_datetime(now + FIRST_TRY_SECONDS)
    rows = [
        {
            "storage_key": key,
            "object_id": object_id,
            "requested_at": when,
            "attempts": 0,
            "next_attempt_at": due,
            "storage_backend": migrated.get(key),
        }
        for key in dict.fromkeys(keys)
    ]
    # One statement: a record a deleter removes meanwhile is written afresh, never lost
    # between a read of which exist and a write to them.
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(t.blob_deletions).values(rows)
    if backend is None:
        conn.execute(stmt.on_conflict_do_nothing(index_elements=[b.storage_key]))
    else:
        conn.execute(
            stmt.on_conflict_do_update(
                index_elements=[b.storage_key],
                set_={"storage_backend": stmt.excluded.storage_backend},
                where=b.storage_backend.is_(None),
            )
        )


@dataclass
class DeleteReport:
    deleted: list[str] = field(default_factory=list)
    revived: list[str] = field(default_factory=list)  # its object is live again: kept
    waiting: list[str] = field(default_factory=list)  # a job on its source may write it
    busy: list[str] = field(default_factory=list)  # another deleter has it, or is done
    failed: dict[str, str] = field(default_factory=dict)  # key -> error
    left: list[str] = field(default_factory=list)  # not tried: the one before failed


class _StorageFailed(Exception):
    def __init__(self, error: HypermediaError, claim: datetime | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.claim = claim


def delete_blobs(
    engine: Engine,
    storage: Storage,
    keys: Sequence[str],
    clock: Clock,
    *,
    action: str,
    backends: Backends | None = None,
) -> DeleteReport:
    """Delete the blobs of recorded ``keys`` from ``storage`` (and a migrated one's
    from its backend, through ``backends``) and their records (see the module docstring,
    2.). Never raises for the storage or the record: what was not done stays recorded
    for the sweep. ``action``: for the log. ``clock`` is read for each key and after a
    failure (a storage call may take minutes: its claim, and the next try, count from
    when they are made)."""
    report = DeleteReport()
    for index, key in enumerate(keys):
        claim: datetime | None = None
        try:
            outcome = _delete_one(engine, storage, backends, key, clock.now())
            getattr(report, outcome).append(key)
            continue
        except _StorageFailed as failed:
            report.failed[key] = str(failed.error)[:_ERROR_CHARS]
            problem: Exception = failed.error
            claim = failed.claim
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
                _failed(engine, key, report.failed[key], clock.now(), claim)
        break
    return report


def discard(
    engine: Engine,
    storage: Storage,
    object_id: str,
    keys: Sequence[str],
    clock: Clock,
    *,
    action: str,
) -> DeleteReport | None:
    """Delete blobs stored for ``object_id`` that no row records (an upload whose
    registration failed): recorded first, in a transaction of their own, then deleted
    as by :func:`delete_blobs`, what the storage fails left to the sweep. Never raises
    for the storage or the record. When not even the record can be written (the
    database down, maybe what failed the registration): one try at once (None), and a
    blob it fails too is left behind, logged (nothing else knows of it)."""
    try:
        with transaction(engine) as conn:
            record(conn, object_id, keys, clock.now())
    except (HypermediaError, DBAPIError) as unrecorded:
        for key in keys:
            try:
                storage.delete(key)
            except HypermediaError as exc:
                log.error(
                    "blob %s of %s left behind: not recorded (%s), not deleted (%s)",
                    key,
                    object_id,
                    unrecorded,
                    exc,
                    extra={"action": action},
                )
        return None
    return delete_blobs(engine, storage, keys, clock, action=action)


def _delete_one(
    engine: Engine, storage: Storage, backends: Backends | None, key: str, now: float
) -> str:
    """Delete one recorded blob (the :class:`DeleteReport` list it goes in), unless its
    key may be written again (see the module docstring), with no transaction open while
    the storage deletes: a short one decides and claims the record until
    :data:`CLAIM_SECONDS` on (no output URL for ``key`` is granted meanwhile:
    :func:`being_deleted`; the sweep passes it by), the storage deletes, one more
    removes the record if the claim is still this one's. A claim another deleter holds:
    ``busy``. The storage's failure: :class:`_StorageFailed`, with the claim."""
    b = t.blob_deletions.c
    claim = to_datetime(now + CLAIM_SECONDS)
    with transaction(engine) as conn:
        held = conn.execute(
            select(b.claimed_until, b.storage_backend).where(b.storage_key == key)
        ).first()
        if held is None or (
            held.claimed_until is not None and held.claimed_until > to_datetime(now)
        ):
            return "busy"
        verdict = _decide(conn, key, now)
        if verdict is not None:
            return verdict
        copy = _copy_backend(conn, key, held.storage_backend)
        # Claimed only if no other deleter claimed it since it was read (PostgreSQL: a
        # claim committed meanwhile is seen by this statement, which waited for it).
        claimed = conn.execute(
            update(t.blob_deletions)
            .where(
                b.storage_key == key,
                (b.claimed_until.is_(None)) | (b.claimed_until <= to_datetime(now)),
            )
            .values(claimed_until=claim, next_attempt_at=claim)
        )
        if claimed.rowcount == 0:
            return "busy"
    began = time.monotonic()
    try:
        _delete_everywhere(storage, backends, key, copy)
    except HypermediaError as exc:
        raise _StorageFailed(exc, claim) from exc
    finally:
        took = time.monotonic() - began
        if took > CLAIM_SECONDS:
            log.warning(
                "blob %s: the storage took %.0f s to delete it, more than its claim"
                " (%.0f s): a job on its source may have written it meanwhile",
                key,
                took,
                CLAIM_SECONDS,
                extra={"action": "blob_delete"},
            )
    with transaction(engine) as conn:
        gone = conn.execute(
            delete(t.blob_deletions).where(
                *_as_deleted(key, held.storage_backend), b.claimed_until == claim
            )
        )
        if gone.rowcount == 0:  # a copy recorded meanwhile: the sweep's, at once
            conn.execute(
                update(t.blob_deletions)
                .where(b.storage_key == key, b.claimed_until == claim)
                .values(claimed_until=None, next_attempt_at=to_datetime(now))
            )
    return "deleted"


def _delete_everywhere(
    storage: Storage, backends: Backends | None, key: str, backend: str | None
) -> None:
    """``key`` deleted from the server's storage and, when its object was migrated,
    from that backend too."""
    storage.delete(key)
    if backend is None:
        return
    if backends is None:
        raise StorageUnavailable(
            f"blob {key} is also in {backend!r}, which this deleter cannot reach"
        )
    backends(backend).delete(key)


def _copy_backend(conn: Connection, key: str, recorded: str | None) -> str | None:
    """The backend ``key`` has a migrated copy on: its record's, else the one its
    deleted object's row names. Code from before 0029 recorded no backend (the column
    was not there), and a record of its still pending when 0029 ran (a try that failed,
    a sweep not yet due) or written by a process not yet restarted after it names none,
    though its object was migrated (a migrate before 9c8b7ce also switched a row
    deleted while it copied it): its copy is deleted all the same."""
    if recorded is not None:
        return recorded
    o = t.objects.c
    backend: str | None = conn.execute(
        select(o.storage_backend).where(o.storage_key == key, o.deleted_at.is_not(None))
    ).scalar()
    return backend


def _as_deleted(key: str, backend: str | None) -> tuple[ColumnElement[bool], ...]:
    """The record of ``key`` as it was when its blob was deleted (from ``backend`` too):
    a migration that recorded a copy on a backend meanwhile (of an object deleted while
    it copied it) leaves it standing, for the sweep to delete that copy."""
    b = t.blob_deletions.c
    same = b.storage_backend.is_(None) if backend is None else b.storage_backend == backend
    return b.storage_key == key, same


def _decide(conn: Connection, key: str, now: float) -> str | None:
    """Whether a recorded key is to be deleted now (None), else what became of it:
    ``revived`` (its row is live again: the bytes are that row's, the record goes) or
    ``waiting`` (a job on its source has yet to end and may write it: tried again
    later). An output's source row is locked first (PostgreSQL; SQLite's transaction
    holds the database's)."""
    o, b, j = t.objects.c, t.blob_deletions.c, t.jobs.c
    holder = select(o.object_id, o.source_object_id, o.deleted_at).where(o.storage_key == key)
    row = conn.execute(holder).first()
    source = None if row is None else row.source_object_id
    if source is not None:
        conn.execute(select(o.object_id).where(o.object_id == source).with_for_update())
        row = conn.execute(holder).first()  # as of the lock
    if row is not None and row.deleted_at is None:
        conn.execute(delete(t.blob_deletions).where(b.storage_key == key))
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
    return None


# Built once: the grants actor runs it for every job's outputs.
_BEING_DELETED = select(t.blob_deletions.c.storage_key).where(
    t.blob_deletions.c.storage_key.in_(bindparam("d_keys", expanding=True)),
    t.blob_deletions.c.claimed_until
    > bindparam("d_now", type_=t.blob_deletions.c.claimed_until.type),
)


def being_deleted(conn: Connection, keys: Sequence[str], now: float) -> list[str]:
    """The ``keys`` whose deletion is claimed (the storage may be deleting them now):
    none is to be written until its claim is gone (:func:`_delete_one`)."""
    if not keys:
        return []
    params = {"d_keys": list(keys), "d_now": to_datetime(now)}
    return list(conn.execute(_BEING_DELETED, params).scalars())


def _failed(
    engine: Engine, key: str, error: str, now: float, claim: datetime | None = None
) -> None:
    """The failed try recorded, and its claim (``claim``) let go; nothing done when
    another deleter holds the record now."""
    b = t.blob_deletions.c
    ours: ColumnElement[bool] = (
        b.claimed_until.is_(None) if claim is None else b.claimed_until == claim
    )
    with transaction(engine) as conn:
        failures = 1 + int(
            conn.execute(select(b.attempts).where(b.storage_key == key)).scalar() or 0
        )
        conn.execute(
            update(t.blob_deletions)
            .where(b.storage_key == key, ours)
            .values(
                attempts=failures,
                next_attempt_at=to_datetime(now + retry_delay(failures)),
                last_error=error,
                claimed_until=None,
            )
        )


def sweep(
    engine: Engine,
    storage: Storage,
    clock: Clock,
    *,
    batch: int = SWEEP_BATCH,
    backends: Backends | None = None,
) -> DeleteReport:
    """Try the recorded deletions that are due (see the module docstring, 3.)."""
    b = t.blob_deletions.c
    with snapshot(engine) as conn:
        keys = list(
            conn.execute(
                select(b.storage_key)
                .where(b.next_attempt_at <= to_datetime(clock.now()))
                .order_by(b.next_attempt_at, b.storage_key)
                .limit(batch)
            ).scalars()
        )
    report = delete_blobs(engine, storage, keys, clock, action="blob_sweep", backends=backends)
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
