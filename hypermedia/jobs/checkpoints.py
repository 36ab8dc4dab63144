"""The record of a job's checkpoints: finished pieces of a long step, kept in storage
so that a retry, on any worker, goes on from them (:mod:`pipelines.checkpoints`).

Every write to ``job_checkpoints`` is here. A piece's life:

1. **granted** (:func:`grant`, by the head's grants, in the transaction that checks
   the worker holds the job): a row with the piece's key, before the worker may store
   a byte under it, so every stored piece has a row;
2. **committed** (:func:`commit`, by the worker, once the piece is whole in storage):
   only by the worker holding the job in flight; a retry reads the committed pieces
   (:func:`committed`) and the step skips them;
3. **swept** (:func:`sweep`, by the head's maintenance): the pieces of a job that
   ended (completed, failed for good, cancelled), and pieces granted over
   :data:`ORPHAN_SECONDS` ago and never committed (an upload that died with its
   worker), are deleted from storage and then from the record. A deletion that fails
   leaves the row, and the next sweep tries again.

Keys: ``checkpoints/{job_id}/{profile_version}/{params digest}/{name}``
(:func:`checkpoint_key`): a piece is only ever read back for the same job, profile
version and parameters. Its name carries the build that made it (FFmpeg's, the OCR
engines': :func:`pipelines.checkpoints.build_tag`), and a step takes only its own
build's pieces.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import Connection, Engine, and_, delete, exists, insert, or_, select, update

from hypermedia.clock import to_datetime
from hypermedia.db import tables as t
from hypermedia.db.engine import snapshot, transaction
from hypermedia.errors import HypermediaError
from hypermedia.jobs.states import IN_FLIGHT, TERMINAL
from hypermedia.storage.base import Storage, check_segment

log = logging.getLogger(__name__)

PREFIX = "checkpoints"
ORPHAN_SECONDS = 24 * 3600.0
SWEEP_BATCH = 500


@dataclass(frozen=True, slots=True)
class Piece:
    name: str
    storage_key: str
    size_bytes: int


def params_digest(params: Mapping[str, Any]) -> str:
    """16 hex digits naming the job's parameters in its checkpoint keys."""
    canonical = json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def checkpoint_prefix(job_id: str, profile_version: int, params: Mapping[str, Any]) -> str:
    check_segment(job_id, "job_id")
    return f"{PREFIX}/{job_id}/{int(profile_version)}/{params_digest(params)}/"


def checkpoint_key(job_id: str, profile_version: int, params: Mapping[str, Any], name: str) -> str:
    return checkpoint_prefix(job_id, profile_version, params) + check_segment(name, "name")


def grant(conn: Connection, job_id: str, keys: Mapping[str, str], now: float) -> None:
    """Rows for pieces about to be stored (name -> key); a piece granted again and not
    committed has its grant time renewed (its upload is alive)."""
    when = to_datetime(now)
    c = t.checkpoints.c
    existing = set(
        conn.execute(select(c.storage_key).where(c.storage_key.in_(list(keys.values())))).scalars()
    )
    fresh = [
        {"storage_key": key, "job_id": job_id, "name": name, "granted_at": when}
        for name, key in keys.items()
        if key not in existing
    ]
    if fresh:
        conn.execute(insert(t.checkpoints), fresh)
    if existing:
        conn.execute(
            update(t.checkpoints)
            .where(c.storage_key.in_(existing), c.committed_at.is_(None))
            .values(granted_at=when)
        )


def commit(
    engine: Engine, job_id: str, worker_id: str, storage_key: str, size_bytes: int, now: float
) -> bool:
    """The piece at ``storage_key`` is whole in storage: committed, if ``worker_id``
    still holds the job in flight (False: it does not, or the piece was never granted)."""
    j, c = t.jobs.c, t.checkpoints.c
    held = exists().where(
        j.job_id == job_id,
        j.claimed_by == worker_id,
        j.status.in_([s.value for s in IN_FLIGHT]),
    )
    with transaction(engine) as conn:
        done = conn.execute(
            update(t.checkpoints)
            .where(c.storage_key == storage_key, c.job_id == job_id, held)
            .values(committed_at=to_datetime(now), size_bytes=size_bytes)
        )
    return bool(done.rowcount)


def committed(conn: Connection, job_id: str, prefix: str) -> list[Piece]:
    """The job's committed pieces under ``prefix`` (its current version and params)."""
    c = t.checkpoints.c
    rows = conn.execute(
        select(c.name, c.storage_key, c.size_bytes)
        .where(c.job_id == job_id, c.committed_at.is_not(None))
        .order_by(c.name)
    )
    return [
        Piece(row.name, row.storage_key, int(row.size_bytes or 0))
        for row in rows
        if row.storage_key.startswith(prefix)
    ]


def count(engine: Engine, job_id: str, *, only_committed: bool = True) -> int:
    """How many pieces the record holds for the job."""
    c = t.checkpoints.c
    query = select(c.storage_key).where(c.job_id == job_id)
    if only_committed:
        query = query.where(c.committed_at.is_not(None))
    with snapshot(engine) as conn:
        return len(conn.execute(query).all())


@dataclass
class SweepReport:
    deleted: int = 0
    failed: int = 0


def sweep(
    engine: Engine, storage: Storage, now: float, *, orphan_seconds: float = ORPHAN_SECONDS
) -> SweepReport:
    """Delete the pieces of ended jobs and the orphans (see the module docstring):
    storage first, then the row."""
    j, c = t.jobs.c, t.checkpoints.c
    ended = exists().where(j.job_id == c.job_id, j.status.in_([s.value for s in TERMINAL]))
    stale = and_(
        c.committed_at.is_(None),
        c.granted_at < to_datetime(now) - timedelta(seconds=orphan_seconds),
    )
    with snapshot(engine) as conn:
        keys: Sequence[str] = (
            conn.execute(select(c.storage_key).where(or_(ended, stale)).limit(SWEEP_BATCH))
            .scalars()
            .all()
        )
    report = SweepReport()
    gone = []
    for key in keys:
        try:
            storage.delete(key)
        except HypermediaError as exc:
            report.failed += 1
            log.warning("could not delete checkpoint %s: %s", key, exc, extra={"action": "sweep"})
            continue
        gone.append(key)
    if gone:
        with transaction(engine) as conn:
            conn.execute(delete(t.checkpoints).where(c.storage_key.in_(gone)))
        report.deleted = len(gone)
        log.info("deleted %d checkpoints", len(gone), extra={"action": "checkpoints_swept"})
    return report
