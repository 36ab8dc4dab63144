"""Objects (stored files) and who may use them.

A caller may use an object they own or one in a pool they belong to. Anything
else answers :class:`NotFound`, exactly as for an id that does not exist, so ids
of other users' objects reveal nothing. Only the owner may delete one
(:func:`plan_deletion`, :func:`mark_deleted`; bulk runs' jobs on it are cancelled first,
:func:`cancel_bulk_jobs`): its blobs and those of everything derived from
it (its outputs, the outputs of jobs on them...) go, their rows stay, marked
``deleted_at``, for the history of the jobs that ran on them.
An output is one object however many jobs wrote it (its key is deterministic), owned
by the user whose job made it first; deleting it while other users' jobs name it
takes it from the deleter's jobs and quota only: it passes, bytes and all, to the user
of the latest of those jobs (one pool member deletes nothing of another's).

Every user's live objects (uploads and their jobs' outputs) count against their
storage quota (:func:`check_quota`), through the count of bytes kept on the user's row
(``users.stored_bytes``): whatever inserts, resizes or deletes an object moves it in the
same transaction (:func:`~hypermedia.accounts.add_stored_bytes`).

An object registered with an :class:`~hypermedia.sandbox.inspect.Inspection` keeps it
(``inspection``) and its ``content_type`` is the detected mime type, never what the
uploader claimed; ingest judges every submit on it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Connection,
    bindparam,
    delete,
    func,
    insert,
    select,
    update,
)

from hypermedia.accounts import Caller, add_stored_bytes, is_pool_member
from hypermedia.clock import to_datetime
from hypermedia.db import tables as t
from hypermedia.errors import Conflict, NotFound, StorageQuotaExceeded
from hypermedia.jobs.repository import JobRepository, remove_outputs
from hypermedia.jobs.states import JobStatus
from hypermedia.sandbox.inspect import Inspection

_FINISHED = [JobStatus.COMPLETED.value, JobStatus.FAILED.value, JobStatus.CANCELLED.value]


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    object_id: str
    pool_id: str
    owner_id: str
    kind: str
    storage_key: str
    filename: str
    content_type: str | None
    size_bytes: int
    sha256: str | None
    created_at: datetime
    inspection: dict[str, Any] | None = None


_INSERT_OBJECT = insert(t.objects)  # built once: every upload runs it


def register_object(
    conn: Connection,
    caller: Caller,
    *,
    object_id: str,
    pool_id: str,
    storage_key: str,
    filename: str,
    size_bytes: int,
    now: float,
    content_type: str | None = None,
    sha256: str | None = None,
    inspection: Inspection | None = None,
    quota_bytes: int | None = None,
    idempotency_key: str | None = None,
) -> ObjectInfo:
    """Record a file already in storage. The caller must belong to ``pool_id``. With an
    ``inspection``, its mime type replaces ``content_type``; with ``quota_bytes``, the
    caller's stored bytes must stay within it (StorageQuotaExceeded); an
    ``idempotency_key`` the caller's objects already hold is an IntegrityError (the
    unique index ``uk_object_idempotency_key``)."""
    if not is_pool_member(conn, pool_id, caller.user_id):
        raise NotFound(f"no pool {pool_id!r}", pool_id=pool_id)
    if quota_bytes is not None:
        check_quota(conn, caller.user_id, size_bytes, quota_bytes)
    values: dict[str, Any] = {
        "object_id": object_id,
        "pool_id": pool_id,
        "owner_id": caller.user_id,
        "kind": "original",
        "storage_key": storage_key,
        "filename": filename[:255],
        "content_type": inspection.mime[:127] if inspection is not None else content_type,
        "size_bytes": size_bytes,
        "sha256": sha256,
        "created_at": to_datetime(now),
        "inspection": inspection.to_dict() if inspection is not None else None,
    }
    conn.execute(_INSERT_OBJECT, {**values, "idempotency_key": idempotency_key})
    add_stored_bytes(conn, {caller.user_id: size_bytes})
    return ObjectInfo(**{k: v for k, v in values.items() if k in ObjectInfo.__dataclass_fields__})


def usable_by(user_id: str | BindParameter[str]) -> ColumnElement[bool]:
    """The WHERE clause for objects the user may use: not deleted, and owned or in one
    of their pools. ``user_id``: a value, or a bound parameter (a statement built
    once)."""
    member = (
        select(t.pool_members.c.user_id)
        .where(
            t.pool_members.c.pool_id == t.objects.c.pool_id,
            t.pool_members.c.user_id == user_id,
        )
        .exists()
    )
    return t.objects.c.deleted_at.is_(None) & ((t.objects.c.owner_id == user_id) | member)


def storage_used(conn: Connection, user_id: str, *, lock: bool = False) -> int:
    """Bytes of the live objects ``user_id`` owns (uploads and the outputs of their jobs):
    the count kept on the user's row (:func:`~hypermedia.accounts.add_stored_bytes`).
    ``lock``: hold that row until the transaction ends, so that two uploads checking
    the quota at once are judged one after the other."""
    stmt = _STORED_BYTES_LOCKED if lock else _STORED_BYTES
    used = conn.execute(stmt, {"s_user": user_id}).scalar_one_or_none()
    return int(used or 0)


# Built once, as the insert above: every upload runs them.
_STORED_BYTES = select(t.users.c.stored_bytes).where(
    t.users.c.user_id == bindparam("s_user", type_=t.users.c.user_id.type)
)
_STORED_BYTES_LOCKED = _STORED_BYTES.with_for_update()


def check_quota(conn: Connection, user_id: str, adding: int, quota_bytes: int) -> None:
    """StorageQuotaExceeded unless ``adding`` more bytes fit the user's quota (locks
    the user's row: call it in the transaction that records the bytes)."""
    used = storage_used(conn, user_id, lock=True)
    if used + adding > quota_bytes:
        raise quota_exceeded(quota_bytes, used, adding)


def quota_exceeded(quota_bytes: int, used: int, adding: int | None) -> StorageQuotaExceeded:
    more = "" if adding is None else f"; this upload adds {adding}"
    return StorageQuotaExceeded(
        f"storage quota reached: {used} of {quota_bytes} bytes stored{more}."
        " Delete objects (DELETE /v1/hypermedia/objects/{id}) to make room",
        quota_bytes=quota_bytes,
        used_bytes=used,
    )


@dataclass(frozen=True, slots=True)
class Deletion:
    """What deleting one object removes: the object and everything derived from it
    (its outputs, the outputs of jobs on them, and so on: their rows, marked deleted)
    and every stored blob of them."""

    object_id: str
    object_ids: list[str]
    storage_keys: list[str]
    size_bytes: int
    # An output other users' jobs name too: it is not deleted but passed on to ``heir``
    # (from ``owner_id``, whose jobs no longer name it).
    owner_id: str | None = None
    heir: str | None = None

    @property
    def outputs(self) -> int:
        return len(self.object_ids) - 1


def plan_deletion(conn: Connection, caller: Caller, object_id: str) -> Deletion:
    """What deleting ``object_id`` takes. Only its owner may (anyone else: NotFound, as
    for an id that does not exist); not while a job on it is unfinished (Conflict)."""
    o = t.objects.c
    # Locked before the jobs on it are looked for: a submit (which locks the objects
    # it creates jobs on FOR SHARE, see jobs.statements.create_pg) either has
    # committed its jobs by then, and they are seen below, or waits and then finds the
    # object deleted.
    row = conn.execute(
        select(o.object_id, o.storage_key, o.size_bytes)
        .where(o.object_id == object_id, o.owner_id == caller.user_id, o.deleted_at.is_(None))
        .with_for_update()
    ).first()
    if row is None:
        raise NotFound(f"no object {object_id!r}", object_id=object_id)
    heir = _other_user_of(conn, caller, object_id)
    if heir is not None:
        return Deletion(
            object_id=object_id,
            object_ids=[object_id],
            storage_keys=[],
            size_bytes=int(row.size_bytes),
            owner_id=caller.user_id,
            heir=heir,
        )
    # Its own jobs first: one still completing may hold an output's row, and then wants
    # this one's (the foreign key of a new output): waiting for that output's lock
    # below would be a deadlock, refusing here is not.
    _refuse_unfinished_jobs(conn, caller, object_id, [object_id])
    rows = {object_id: row}
    # Then everything derived from it, however far (outputs of jobs on its outputs...):
    # locked too, as a submit locks its objects, so a submit on one either has committed
    # its job by then, and it is seen, or waits and then finds the object deleted. In
    # id order, as a submit and a bulk page lock theirs (descendants are younger than
    # the object: ids are time-ordered), and all in one statement, else a batch naming
    # a grandchild and an uncle younger than it could hold the one this waits for. Their
    # jobs are refused before they are locked too (one completing may hold a younger
    # output's row and want its source's), and again once they are: a job that ended
    # meanwhile may have made more outputs, found by the next round (younger still).
    while fresh := sorted(set(_descendants(conn, object_id)) - rows.keys()):
        _refuse_unfinished_jobs(conn, caller, object_id, fresh)
        locked = conn.execute(
            select(o.object_id, o.storage_key, o.size_bytes)
            .where(o.object_id.in_(fresh), o.deleted_at.is_(None))
            .order_by(o.object_id)
            .with_for_update()
        ).all()
        rows.update((r.object_id, r) for r in locked)
        _refuse_unfinished_jobs(conn, caller, object_id, list(rows))
    return Deletion(
        object_id=object_id,
        object_ids=list(rows),
        storage_keys=[r.storage_key for r in rows.values()],
        size_bytes=sum(int(r.size_bytes) for r in rows.values()),
    )


def _descendants(conn: Connection, object_id: str) -> list[str]:
    """The live objects derived from ``object_id``, however far (an output of a job on
    one of its outputs...), through deleted ones too (a row marked before deletions
    took the whole tree may have live outputs)."""
    o = t.objects.c
    tree = select(o.object_id).where(o.source_object_id == object_id).cte(recursive=True)
    # UNION, not UNION ALL: a cycle (which no insert makes) would end, not loop.
    tree = tree.union(select(o.object_id).where(o.source_object_id == tree.c.object_id))
    live = select(o.object_id).where(o.object_id.in_(select(tree.c.object_id)))
    return list(conn.execute(live.where(o.deleted_at.is_(None))).scalars())


def _refuse_unfinished_jobs(
    conn: Connection, caller: Caller, object_id: str, ids: list[str]
) -> None:
    """Conflict if a job on one of ``ids`` (``object_id`` and what was derived from it) is
    unfinished."""
    j = t.jobs.c
    live = (j.object_id.in_(ids), j.status.not_in(_FINISHED))
    # The caller's own jobs by id (theirs to cancel); other users' only counted: the ids
    # of another user's jobs are not the caller's to learn.
    mine = (
        conn.execute(
            select(j.job_id).where(*live, j.user_id == caller.user_id).order_by(j.job_id).limit(10)
        )
        .scalars()
        .all()
    )
    others = int(
        conn.execute(
            select(func.count()).select_from(t.jobs).where(*live, j.user_id != caller.user_id)
        ).scalar_one()
    )
    if mine or others:
        waiting = f"; {others} job{'s' if others != 1 else ''} of other users must finish"
        raise Conflict(
            "the object has unfinished jobs: cancel yours (or let them finish) first"
            + (waiting if others else ""),
            object_id=object_id,
            job_ids=list(mine),
            other_users_jobs=others,
        )


def _other_user_of(conn: Connection, caller: Caller, object_id: str) -> str | None:
    """The user of the latest job not ``caller``'s whose output is ``object_id`` (an
    output two users' jobs wrote), if any."""
    o = t.outputs.c
    return conn.execute(
        select(t.jobs.c.user_id)
        .join(t.jobs, t.jobs.c.job_id == o.job_id)
        .where(o.object_id == object_id, t.jobs.c.user_id != caller.user_id)
        .order_by(o.created_at.desc(), o.output_id.desc())
        .limit(1)
    ).scalar_one_or_none()


def cancel_bulk_jobs(
    conn: Connection, caller: Caller, object_id: str, now: float
) -> dict[str, list[str]]:
    """Before its owner deletes ``object_id``: cancel the unfinished jobs of bulk runs on
    it (the platform's background work, or a named account's: not the owner's to cancel,
    nor to see). Those not running are cancelled, the running ones asked to stop (the
    deletion waits for them as for any unfinished job). Nothing for a caller who does
    not own the object (the deletion then answers NotFound). The jobs cancelled, by
    queue: once committed, they leave Redis and their followers hear of it
    (:func:`~hypermedia.jobs.repository.forget_cancelled`)."""
    o, j = t.objects.c, t.jobs.c
    owned = select(o.object_id).where(
        o.object_id == object_id, o.owner_id == caller.user_id, o.deleted_at.is_(None)
    )
    rows = conn.execute(
        select(j.job_id, j.user_id, j.queue).where(
            j.object_id.in_(owned), j.bulk_run_id.is_not(None), j.status.not_in(_FINISHED)
        )
    ).all()
    repository = JobRepository()
    cancelled: dict[str, list[str]] = defaultdict(list)
    for row in rows:
        if repository.cancel(conn, row.job_id, row.user_id, now) is JobStatus.CANCELLED:
            cancelled[row.queue].append(row.job_id)
    return dict(cancelled)


def mark_deleted(conn: Connection, deletion: Deletion, now: float) -> None:
    """Record a deletion whose blobs are gone: the rows are marked, the outputs' rows of
    its jobs removed. The rows stay for the jobs that ran on them. An output passed on
    (``heir``) is the heir's from now on, and no longer an output of the deleter's jobs."""
    if deletion.heir is not None:
        _pass_on(conn, deletion)
        return
    remove_outputs(conn, deletion.object_ids)
    marked = conn.execute(
        update(t.objects)
        .where(t.objects.c.object_id.in_(deletion.object_ids), t.objects.c.deleted_at.is_(None))
        .values(deleted_at=to_datetime(now))
        .returning(t.objects.c.owner_id, t.objects.c.size_bytes)
    ).all()
    freed: dict[str, int] = defaultdict(int)
    for owner_id, size_bytes in marked:
        freed[owner_id] -= int(size_bytes)
    add_stored_bytes(conn, freed)


def _pass_on(conn: Connection, deletion: Deletion) -> None:
    assert deletion.owner_id is not None and deletion.heir is not None
    deleters_jobs = select(t.jobs.c.job_id).where(t.jobs.c.user_id == deletion.owner_id)
    conn.execute(
        delete(t.outputs).where(
            t.outputs.c.object_id == deletion.object_id, t.outputs.c.job_id.in_(deleters_jobs)
        )
    )
    moved = conn.execute(
        update(t.objects)
        .where(
            t.objects.c.object_id == deletion.object_id,
            t.objects.c.owner_id == deletion.owner_id,
            t.objects.c.deleted_at.is_(None),
        )
        .values(owner_id=deletion.heir)
        .returning(t.objects.c.size_bytes)
    ).scalar_one_or_none()
    if moved is not None:
        add_stored_bytes(conn, {deletion.owner_id: -int(moved), deletion.heir: int(moved)})


def get_object(conn: Connection, caller: Caller, object_id: str) -> ObjectInfo:
    """The object if ``caller`` may use it; NotFound otherwise (or if it does not exist)."""
    row = conn.execute(
        select(*[t.objects.c[name] for name in ObjectInfo.__dataclass_fields__]).where(
            t.objects.c.object_id == object_id, usable_by(caller.user_id)
        )
    ).first()
    if row is None:
        raise NotFound(f"no object {object_id!r}", object_id=object_id)
    return ObjectInfo(**row._mapping)
