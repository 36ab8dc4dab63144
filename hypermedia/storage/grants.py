"""The head's issuer of a job's storage URLs: workers hold no storage credentials.

A worker asks for the URL of its job's input and, once its step has run, for
PUT URLs of the outputs it produced. URLs are granted only to the worker that
holds the job in flight (status ``claimed`` or ``processing`` and
``claimed_by == worker_id``, its lease not yet run out): any other worker, a
finished, requeued or expired job, gets
:class:`~hypermedia.errors.IllegalTransition`; an unknown job
:class:`~hypermedia.errors.NotFound`.

The worker names output *types* only, never keys: every output key is
``derived/{pool_id}/{object_id}/{profile_version}/{output_type}``, computed here
from the job's object and profile, so a worker can write nowhere else (and a
re-run overwrites the same keys). A key whose blob the storage may be deleting now
(an earlier run's output, deleted since: :func:`hypermedia.storage.deletions.being_deleted`)
is refused with :class:`~hypermedia.storage.base.StorageUnavailable`, which the worker
retries later. Each URL lives ``ttl_seconds``. URLs are never logged.

A step that checkpoints (:mod:`pipelines.checkpoints`) has its finished pieces stored
while it runs: :meth:`StorageGrants.checkpoint_uploads` grants PUT URLs for pieces by
name (recording each key in ``job_checkpoints`` first, see
:mod:`hypermedia.jobs.checkpoints`), and :meth:`StorageGrants.checkpoint_downloads`
GET URLs for the pieces the job committed under its current profile version and
parameters, for a retry to go on from them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, Select, bindparam, select

from hypermedia.clock import Clock, to_datetime
from hypermedia.db import tables as t
from hypermedia.db.engine import snapshot, transaction
from hypermedia.errors import IllegalTransition, InvalidRequest, NotFound
from hypermedia.jobs import checkpoints
from hypermedia.jobs.states import IN_FLIGHT
from hypermedia.storage import deletions
from hypermedia.storage.base import (
    Storage,
    StorageUnavailable,
    check_content_type,
    check_segment,
    check_ttl,
    derived_key,
)

log = logging.getLogger(__name__)

MAX_OUTPUTS = 64


@dataclass(frozen=True, slots=True)
class OutputGrant:
    """Where one output goes: its key, a PUT URL for it, and the ``Content-Type``
    the upload must send (None: any)."""

    key: str
    url: str
    content_type: str | None = None


@dataclass(frozen=True, slots=True)
class HeldJob:
    job_id: str
    pool_id: str
    object_id: str
    input_key: str
    profile_version: int
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def checkpoint_prefix(self) -> str:
        return checkpoints.checkpoint_prefix(self.job_id, self.profile_version, self.params)


def _held_query() -> Select[Any]:
    j, o, p = t.jobs.c, t.objects.c, t.profiles.c
    return (
        select(
            j.status,
            j.claimed_by,
            j.visibility_timeout,
            o.pool_id,
            o.object_id,
            o.storage_key,
            p.version,
            j.params,
        )
        .select_from(
            t.jobs.join(t.objects, j.object_id == o.object_id).join(
                t.profiles, j.profile_id == p.profile_id
            )
        )
        .where(j.job_id == bindparam("job_id"))
    )


# Built once: every grant a worker asks for runs it. SQLAlchemy memoizes a statement's
# cache key on the object; building a new one per call cost 190 us a call against
# 70 (SQLite, the whole held() measured in a loop).
_HELD = _held_query()


class StorageGrants:
    def __init__(self, engine: Engine, storage: Storage, ttl_seconds: int, clock: Clock) -> None:
        self.engine = engine
        self.storage = storage
        self.ttl_seconds = check_ttl(ttl_seconds)
        self.clock = clock

    def input_url(self, job_id: str, worker_id: str) -> str:
        """A GET URL for the job's input object."""
        job = self.held(job_id, worker_id)
        url = self.storage.presign_get(job.input_key, self.ttl_seconds)
        log.info(
            "granted the input of %s to %s",
            job_id,
            worker_id,
            extra={"job_id": job_id, "worker_id": worker_id, "action": "grant_input"},
        )
        return url

    def output_urls(
        self,
        job_id: str,
        worker_id: str,
        output_types: Sequence[str] | Mapping[str, str | None],
    ) -> dict[str, OutputGrant]:
        """PUT URLs for the job's outputs, by output type. A mapping gives each type
        the content type its upload must send."""
        if isinstance(output_types, str):
            raise InvalidRequest("output_types must be a list of output types, not a string")
        wanted = (
            dict(output_types)
            if isinstance(output_types, Mapping)
            else dict.fromkeys(output_types, None)
        )
        if not 1 <= len(wanted) <= MAX_OUTPUTS:
            raise InvalidRequest(f"expected 1..{MAX_OUTPUTS} output types, got {len(wanted)}")
        for output_type, content_type in wanted.items():
            check_segment(output_type, "output_type")
            check_content_type(content_type)
        with snapshot(self.engine) as conn:
            job = self._held(conn, job_id, worker_id)
            keys = {
                output_type: derived_key(
                    job.pool_id, job.object_id, job.profile_version, output_type
                )
                for output_type in wanted
            }
            busy = deletions.being_deleted(conn, list(keys.values()), self.clock.now())
        if busy:
            # The blob of an output deleted since, which the storage is deleting now:
            # bytes put before its delete lands would be taken.
            raise StorageUnavailable(
                f"{busy[0]!r} is being deleted (an earlier run's output): try again later",
                job_id=job_id,
                storage_key=busy[0],
            )
        grants = {}
        for output_type, content_type in wanted.items():
            key = keys[output_type]
            url = self.storage.presign_put(key, self.ttl_seconds, content_type)
            grants[output_type] = OutputGrant(key=key, url=url, content_type=content_type)
        log.info(
            "granted %d output(s) of %s to %s",
            len(grants),
            job_id,
            worker_id,
            extra={"job_id": job_id, "worker_id": worker_id, "action": "grant_outputs"},
        )
        return grants

    def checkpoint_uploads(
        self, job_id: str, worker_id: str, names: Sequence[str]
    ) -> dict[str, OutputGrant]:
        """PUT URLs for the job's pieces ``names``, each key recorded before it is
        handed out."""
        if isinstance(names, str) or not 1 <= len(names) <= MAX_OUTPUTS:
            raise InvalidRequest(f"expected a list of 1..{MAX_OUTPUTS} checkpoint names")
        for name in names:
            check_segment(name, "name")
        job = self.held(job_id, worker_id)
        keys = {name: job.checkpoint_prefix + name for name in names}
        with transaction(self.engine) as conn:
            checkpoints.grant(conn, job_id, keys, self.clock.now())
        return {
            name: OutputGrant(key=key, url=self.storage.presign_put(key, self.ttl_seconds))
            for name, key in keys.items()
        }

    def checkpoint_downloads(self, job_id: str, worker_id: str) -> dict[str, OutputGrant]:
        """GET URLs of the pieces the job committed (its profile version and params)."""
        job = self.held(job_id, worker_id)
        with snapshot(self.engine) as conn:
            pieces = checkpoints.committed(conn, job_id, job.checkpoint_prefix)
        return {
            piece.name: OutputGrant(
                key=piece.storage_key,
                url=self.storage.presign_get(piece.storage_key, self.ttl_seconds),
            )
            for piece in pieces
        }

    def held(self, job_id: str, worker_id: str) -> HeldJob:
        """The job, if ``worker_id`` holds it in flight; else NotFound / IllegalTransition."""
        with snapshot(self.engine) as conn:
            return self._held(conn, job_id, worker_id)

    def _held(self, conn: Connection, job_id: str, worker_id: str) -> HeldJob:
        row = conn.execute(_HELD, {"job_id": job_id}).one_or_none()
        if row is None:
            raise NotFound(f"no job {job_id!r}", job_id=job_id)
        held = row.status in {s.value for s in IN_FLIGHT} and row.claimed_by == worker_id
        lease = row.visibility_timeout
        if not held or (lease is not None and lease <= to_datetime(self.clock.now())):
            raise IllegalTransition(
                f"job {job_id!r} is not held by worker {worker_id!r}",
                job_id=job_id,
                worker_id=worker_id,
                status=row.status,
            )
        return HeldJob(
            job_id=job_id,
            pool_id=row.pool_id,
            object_id=row.object_id,
            input_key=row.storage_key,
            profile_version=row.version,
            params=dict(row.params or {}),
        )
