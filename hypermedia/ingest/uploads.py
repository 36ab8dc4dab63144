"""Getting files in: stream an upload into storage, or register one already stored
(and out again: :func:`delete_object`).

An upload goes to ``originals/<pool_id>/<new object id>`` (user file names never
become keys), is hashed while it streams, and stops at ``max_bytes`` with
nothing stored. Only then is the object row written; if that fails, the stored
bytes are deleted again.

Registering a file the web tier stored itself is allowed only under the pool's
own prefix, ``originals/<pool_id>/``, and only once per key: otherwise a caller
could register (and so process and read) a file of a pool they are not in.
The size is checked against storage; a given sha256 is recorded as given. The storage
key is a registration's idempotency key (an ``Idempotency-Key`` header is not read:
one rule): registering a key again, as its object's owner, with the file name, size
and sha256 (or none) the first registration recorded, is a retry whose answer was
lost: it is answered with the first object (:func:`registered_again`, ``replayed``),
nothing inspected nor counted again; anything else is
:class:`~hypermedia.errors.AlreadyRegistered` (409), naming the object only to its
owner, as is a key whose object was deleted since.

Either way the bytes count against the uploader's storage quota (checked again, with
the user's row locked, in the transaction that records them), and the stored bytes
are inspected (by the ``inspector`` given: the API's runs
:func:`inspect_stored` in a budgeted child, :mod:`.inspection`) before the object
row is written: its ``content_type`` is the detected type (an upload's bytes are
stored with it too, once known: S3 keeps it) and its ``inspection`` the
facts every later submit is judged on. What the client claimed (a ``Content-Type``
header, a ``content_type`` field) is not kept. A local file is read in place; an
object in S3 through ranged GETs of what inspection needs (a header, a ZIP or OLE2
directory, a PDF's two ends), never the whole object unless it is small.

An upload may carry an idempotency key (the ``Idempotency-Key`` header), kept on its
object row, unique per owner (``uk_object_idempotency_key``), and honoured as long as
the submit's are (for ever). A second upload under the same key stores nothing and is
not charged to the quota: its body is hashed as it arrives (:func:`hash_stream`) and,
when it is the first's (same sha256, size, file name and pool), answered with the
first object (:func:`replay`, ``replayed``); anything else is
:class:`~hypermedia.errors.IdempotencyKeyReused` (409), as is a key whose object was
deleted since. Two uploads under one key at once both store and inspect their bytes,
but the unique index lets only one row in: the other deletes its blob and answers as
a retry would (:func:`register_blob`). A key is written only with its object, so an
upload refused (too large, too slow, hostile, over quota) leaves none behind.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import anyio.from_thread
import anyio.to_thread
from sqlalchemy import ColumnElement, Connection, Engine, Row, bindparam, select
from sqlalchemy.exc import IntegrityError
from starlette.requests import ClientDisconnect

from hypermedia.accounts import Caller, default_pool_id, is_pool_member
from hypermedia.clock import Clock
from hypermedia.db import tables as t
from hypermedia.db.conflicts import rerun_on_conflict
from hypermedia.db.engine import snapshot, transaction
from hypermedia.errors import (
    AlreadyRegistered,
    ConcurrencyLimited,
    Conflict,
    IdempotencyKeyReused,
    InvalidRequest,
    NotFound,
    ServiceUnavailable,
    StorageQuotaExceeded,
    UploadTooSlow,
)
from hypermedia.jobs.repository import forget_cancelled
from hypermedia.objects import (
    Deletion,
    ObjectInfo,
    cancel_bulk_jobs,
    mark_deleted,
    plan_deletion,
    register_object,
)
from hypermedia.queue.events import JobEvents
from hypermedia.queue.redis_queue import RedisQueue
from hypermedia.sandbox.inspect import Inspection, inspect_file, inspect_source
from hypermedia.storage import deletions
from hypermedia.storage.base import Storage, StoredBlob, check_key, storable_content_type
from hypermedia.storage.local import LocalStorage
from pipelines.formats.source import CallbackSource

log = logging.getLogger(__name__)

_DONE = object()
_T = TypeVar("_T")


def pool_for(conn: Connection, caller: Caller, pool_id: str | None) -> str:
    """The pool an upload goes to: the one named (caller must belong to it), else
    the caller's default pool."""
    if pool_id is None:
        return default_pool_id(conn, caller.user_id)
    if not is_pool_member(conn, pool_id, caller.user_id):
        raise NotFound(f"no pool {pool_id!r}", pool_id=pool_id)
    return pool_id


def resolve_pool(engine: Engine, caller: Caller, pool_id: str | None) -> str:
    with snapshot(engine) as conn:
        return pool_for(conn, caller, pool_id)


HANDOFF_BYTES = 1 << 20


class UploadsInFlight:
    """The uploads each user has arriving now (this API process's), at most
    ``per_user``: the upload threads are shared, and one user's slow bodies, each
    within the pace, could otherwise hold them all. Used from the event loop only."""

    def __init__(self, per_user: int) -> None:
        self.per_user = per_user
        self._counts: dict[str, int] = {}

    @contextmanager
    def hold(self, user_id: str) -> Iterator[None]:
        held = self._counts.get(user_id, 0)
        if held >= self.per_user:
            raise ConcurrencyLimited(
                f"{held} uploads of this user are still arriving (at most {self.per_user}"
                " at once): retry when one has ended",
                limit=self.per_user,
                retry_after_seconds=1,
            )
        self._counts[user_id] = held + 1
        try:
            yield
        finally:
            left = self._counts[user_id] - 1
            if left:
                self._counts[user_id] = left
            else:
                del self._counts[user_id]


class UploadStop:
    """Ends the upload bodies still arriving when the API stops (:meth:`stop`, from
    the event loop): each read waiting for a body's bytes then, and every later one, is
    refused with :class:`~hypermedia.errors.ServiceUnavailable` (503, Retry-After), so
    storage's ``put`` removes what it wrote and the client is answered. A slow client
    would otherwise hold the API's graceful stop for as long as its body took (a 100 MB
    upload at 4 KB/s: seven hours), and uvicorn's own timeout cancels the handler
    instead: a 500 with a traceback. Used from the event loop only."""

    def __init__(self) -> None:
        self.stopped = False
        self._reads: set[anyio.CancelScope] = set()

    def stop(self) -> None:
        self.stopped = True
        for scope in self._reads:
            scope.cancel()

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Around the wait for a body's next bytes."""
        if not self.stopped:
            with anyio.CancelScope() as scope:
                self._reads.add(scope)
                try:
                    yield
                finally:
                    self._reads.discard(scope)
            if not scope.cancelled_caught:
                return
        raise ServiceUnavailable("the API is stopping: upload again later")


@dataclass(frozen=True, slots=True)
class ReadPace:
    """How slowly an upload's body may arrive: no part may take longer than
    ``idle_seconds``, and once that long the average must be ``min_bytes_per_second``
    (0: no minimum). A client trickling bytes would otherwise hold a thread for ever."""

    idle_seconds: float
    min_bytes_per_second: int = 0


async def store_stream(
    storage: Storage,
    key: str,
    stream: AsyncIterator[bytes],
    max_bytes: int,
    *,
    limiter: anyio.CapacityLimiter | None = None,
    pace: ReadPace | None = None,
    stop: UploadStop | None = None,
) -> StoredBlob:
    """Write an async byte stream through the (blocking) storage ``put`` in a worker
    thread, pulling chunks from the event loop as the thread asks for them: what has
    arrived, up to :data:`HANDOFF_BYTES` a trip (a trip between the thread and the
    loop costs more than the bytes of a small upload). The thread is borrowed from
    ``limiter`` (the API's own for uploads: anyio's default one runs every sync route),
    and a body slower than ``pace`` ends the upload with :class:`UploadTooSlow`; one
    still arriving when ``stop`` stops, with :class:`ServiceUnavailable`."""
    return await _pump(
        lambda chunks: storage.put(key, chunks, max_bytes),
        stream,
        limiter=limiter,
        pace=pace,
        stop=stop,
        target=key,
    )


@dataclass(frozen=True, slots=True)
class Digest:
    """A body read and hashed, stored nowhere."""

    size_bytes: int
    sha256: str


async def hash_stream(
    stream: AsyncIterator[bytes],
    max_bytes: int,
    *,
    limiter: anyio.CapacityLimiter | None = None,
    pace: ReadPace | None = None,
    stop: UploadStop | None = None,
) -> Digest | None:
    """Read an async byte stream as :func:`store_stream` does (same threads, same pace)
    but only hash it: a retried upload's body, compared with the first. None, and the
    rest left unread, once it passes ``max_bytes`` (then it is not the first's)."""

    def digest(chunks: Iterator[bytes]) -> Digest | None:
        sha = hashlib.sha256()
        size = 0
        for chunk in chunks:
            size += len(chunk)
            if size > max_bytes:
                return None
            sha.update(chunk)
        return Digest(size, sha.hexdigest())

    return await _pump(digest, stream, limiter=limiter, pace=pace, stop=stop, target="a replay")


async def _pump(
    sink: Callable[[Iterator[bytes]], _T],
    stream: AsyncIterator[bytes],
    *,
    limiter: anyio.CapacityLimiter | None,
    pace: ReadPace | None,
    stop: UploadStop | None = None,
    target: str,
) -> _T:
    """``sink`` over the chunks of ``stream``, in a worker thread (see
    :func:`store_stream`)."""
    iterator = stream.__aiter__()
    started: float | None = None
    received = 0

    async def next_part() -> bytes:
        if stop is None:
            return await paced_part()
        with stop.reading():
            return await paced_part()

    async def paced_part() -> bytes:
        nonlocal started, received
        if pace is None:
            return await iterator.__anext__()
        now = time.monotonic()
        started = now if started is None else started
        with anyio.move_on_after(pace.idle_seconds) as waited:
            part = await iterator.__anext__()
        if waited.cancelled_caught:
            raise UploadTooSlow(
                f"no upload bytes arrived for {pace.idle_seconds:g} s",
                idle_seconds=pace.idle_seconds,
            )
        received += len(part)
        elapsed = time.monotonic() - started
        if elapsed >= pace.idle_seconds and received < pace.min_bytes_per_second * elapsed:
            raise UploadTooSlow(
                f"the upload arrives slower than {pace.min_bytes_per_second} bytes/s",
                min_bytes_per_second=pace.min_bytes_per_second,
            )
        return part

    async def next_chunk() -> object:
        parts: list[bytes] = []
        size = 0
        while size < HANDOFF_BYTES:
            try:
                part = await next_part()
            except StopAsyncIteration:
                if not parts:
                    return _DONE
                break
            parts.append(part)
            size += len(part)
        return b"".join(parts)

    def chunks() -> Iterator[bytes]:
        while True:
            chunk = anyio.from_thread.run(next_chunk)
            if chunk is _DONE:
                return
            assert isinstance(chunk, bytes)
            if chunk:
                yield chunk

    try:
        return await anyio.to_thread.run_sync(sink, chunks(), limiter=limiter)
    except ClientDisconnect:
        # The client went away mid-upload (a Ctrl-C at `hypermedia run`): put() kept
        # nothing, and there is no one to answer. Not the server's error: it was logged
        # as an internal one, with a 4 KB traceback.
        log.info("upload to %s ended: the client disconnected", target, extra={"action": "upload"})
        raise InvalidRequest("the client disconnected during the upload") from None


def inspect_stored(storage: Storage, key: str, size: int) -> Inspection:
    """Inspect bytes already in storage (see the module docstring)."""
    if isinstance(storage, LocalStorage):
        return inspect_file(storage.path(key))
    return inspect_source(
        CallbackSource(size, lambda offset, length: storage.read_range(key, offset, length))
    )


Inspector = Callable[[Storage, str, int], Inspection]  # (storage, key, size) -> facts


@dataclass(frozen=True, slots=True)
class Keyed:
    """The object an earlier upload under an idempotency key made (``deleted``: since
    deleted)."""

    info: ObjectInfo
    deleted: bool


@dataclass(frozen=True, slots=True)
class Uploaded:
    info: ObjectInfo
    replayed: bool = False


def keyed_object(conn: Connection, user_id: str, key: str) -> Keyed | None:
    """The object ``user_id`` uploaded under idempotency ``key``, if any."""
    return _object_of(conn.execute(_KEYED_OBJECT, {"k_user": user_id, "k_key": key}).first())


def stored_object(conn: Connection, storage_key: str) -> Keyed | None:
    """The object (anyone's, deleted or not) whose bytes are at ``storage_key``, if any."""
    return _object_where(conn, t.objects.c.storage_key == storage_key)


def _object_where(conn: Connection, *where: ColumnElement[bool]) -> Keyed | None:
    return _object_of(conn.execute(_OBJECT.where(*where)).first())


_OBJECT = select(
    *[t.objects.c[name] for name in ObjectInfo.__dataclass_fields__], t.objects.c.deleted_at
)
# Built once: every upload under an idempotency key (the HTTP client sends one with
# each) looks its key up.
_KEYED_OBJECT = _OBJECT.where(
    t.objects.c.owner_id == bindparam("k_user", type_=t.objects.c.owner_id.type),
    t.objects.c.idempotency_key == bindparam("k_key", type_=t.objects.c.idempotency_key.type),
)


def _object_of(row: Row[*tuple[Any, ...]] | None) -> Keyed | None:
    if row is None:
        return None
    fields = {k: v for k, v in row._mapping.items() if k != "deleted_at"}
    return Keyed(ObjectInfo(**fields), deleted=row.deleted_at is not None)


def replay(
    earlier: Keyed,
    key: str,
    *,
    pool_id: str,
    filename: str,
    size_bytes: int | None = None,
    sha256: str | None = None,
) -> Uploaded:
    """A retried upload under ``key`` answered as the first (``earlier``) was, when it
    is the same upload: same pool and file name and, once its body is known (``None``:
    not yet), the same size and sha256. IdempotencyKeyReused otherwise."""
    info = earlier.info
    if earlier.deleted:
        problem = f"made object {info.object_id!r}, deleted since"
    elif pool_id != info.pool_id:
        problem = f"uploaded to pool {info.pool_id!r}, not {pool_id!r}"
    elif filename[:255] != info.filename:
        problem = f"uploaded {info.filename!r}, not {filename!r}"
    elif size_bytes is not None and size_bytes != info.size_bytes:
        problem = f"uploaded {info.size_bytes} bytes, not {size_bytes}"
    elif sha256 is not None and sha256 != info.sha256:
        problem = "uploaded other content (another sha256)"
    else:
        return Uploaded(info, replayed=True)
    raise IdempotencyKeyReused(
        f"Idempotency-Key {key!r} already {problem}: nothing was stored. Upload it with a new key",
        idempotency_key=key,
        object_id=info.object_id,
    )


def register_blob(
    engine: Engine,
    storage: Storage,
    inspector: Inspector,
    caller: Caller,
    *,
    object_id: str,
    pool_id: str,
    blob: StoredBlob,
    filename: str,
    clock: Clock,
    quota_bytes: int | None = None,
    idempotency_key: str | None = None,
) -> Uploaded:
    """Inspect and record an uploaded blob; delete it again if that fails (recorded
    first, :func:`hypermedia.storage.deletions.discard`: a delete the storage fails is
    tried again later). An ``idempotency_key`` another upload recorded meanwhile (a
    concurrent one: the unique index lets one in; or its bytes, counted first, leave
    these no room in the quota) answers as that upload's retry: :func:`replay` (the
    blob deleted)."""
    now = clock.now()
    try:
        inspection = inspector(storage, blob.key, blob.size_bytes)
        # Stored before anyone knew their type: the bytes take the one detected (what a
        # reader of the bucket, or a URL asking none, meets), before any job reads them.
        storage.set_content_type(blob.key, storable_content_type(inspection.mime))

        def registering() -> ObjectInfo:
            with transaction(engine) as conn:
                return register_object(
                    conn,
                    caller,
                    object_id=object_id,
                    pool_id=pool_id,
                    storage_key=blob.key,
                    filename=filename,
                    size_bytes=blob.size_bytes,
                    sha256=blob.sha256,
                    inspection=inspection,
                    now=now,
                    quota_bytes=quota_bytes,
                    idempotency_key=idempotency_key,
                )

        # Run again whole if PostgreSQL aborts it in a deadlock: the bytes are stored
        # and inspected already, the transaction only records them. Spent: the blob
        # goes, and the 503 says to upload again.
        return Uploaded(rerun_on_conflict(registering, what="upload"))
    except BaseException as exc:
        # Recorded before it is deleted: a storage failing the delete leaves it to the
        # head's sweep (and the error that failed the upload stands).
        deletions.discard(engine, storage, object_id, [blob.key], clock, action="upload")
        if idempotency_key is None or not isinstance(exc, IntegrityError | StorageQuotaExceeded):
            raise
        with snapshot(engine) as conn:
            earlier = keyed_object(conn, caller.user_id, idempotency_key)
        if earlier is None:
            raise
        return replay(
            earlier,
            idempotency_key,
            pool_id=pool_id,
            filename=filename,
            size_bytes=blob.size_bytes,
            sha256=blob.sha256,
        )


def registered_again(
    earlier: Keyed,
    caller: Caller,
    *,
    storage_key: str,
    filename: str,
    size_bytes: int,
    sha256: str | None,
) -> Uploaded:
    """A registration of ``storage_key``, which ``earlier`` already has, answered as
    the first registration was when it is its retry: the owner's, with the file name,
    size and sha256 (or none) the first recorded. AlreadyRegistered otherwise, naming
    the object only to its owner."""
    info = earlier.info
    if info.owner_id != caller.user_id:
        raise AlreadyRegistered(
            f"{storage_key!r} is already registered, by another user: nothing was"
            " registered. Store the file under a key of its own",
            storage_key=storage_key,
        )
    if earlier.deleted:
        problem = "deleted since"
    elif filename[:255] != info.filename:
        problem = f"named {info.filename!r}, not {filename!r}"
    elif size_bytes != info.size_bytes:
        problem = f"of {info.size_bytes} bytes, not {size_bytes}"
    elif sha256 != info.sha256:
        recorded = "no sha256" if info.sha256 is None else f"sha256 {info.sha256}"
        given = "none" if sha256 is None else sha256
        problem = f"recorded with {recorded}, not {given}"
    else:
        return Uploaded(info, replayed=True)
    raise AlreadyRegistered(
        f"{storage_key!r} is already registered as your object {info.object_id!r}, {problem}:"
        " nothing was registered. Store another file under a key of its own",
        storage_key=storage_key,
        object_id=info.object_id,
    )


@dataclass(frozen=True, slots=True)
class Registration:
    """What ``POST /objects/register`` asks for, its storage key checked."""

    storage_key: str
    filename: str
    size_bytes: int
    pool_id: str | None
    sha256: str | None

    @classmethod
    def of(
        cls,
        storage_key: str,
        filename: str,
        size_bytes: int,
        pool_id: str | None,
        sha256: str | None,
    ) -> Registration:
        return cls(check_key(storage_key), filename, size_bytes, pool_id, sha256)

    def pool(self, engine: Engine, caller: Caller) -> str:
        """The pool it goes to; the key must lie under that pool's prefix."""
        pool = resolve_pool(engine, caller, self.pool_id)
        if not self.storage_key.startswith(f"originals/{pool}/"):
            raise InvalidRequest(
                f"storage_key must lie under originals/{pool}/", storage_key=self.storage_key
            )
        return pool

    def again(self, engine: Engine, caller: Caller) -> Uploaded | None:
        """The first object when this registers a key registered already (its retry),
        else None (AlreadyRegistered when that object is another file, or not the
        caller's: :func:`registered_again`)."""
        with snapshot(engine) as conn:
            earlier = stored_object(conn, self.storage_key)
        if earlier is None:
            return None
        return registered_again(
            earlier,
            caller,
            storage_key=self.storage_key,
            filename=self.filename,
            size_bytes=self.size_bytes,
            sha256=self.sha256,
        )


def register_stored(
    engine: Engine,
    storage: Storage,
    inspector: Inspector,
    caller: Caller,
    registration: Registration,
    *,
    object_id: str,
    now: float,
    quota_bytes: int | None = None,
) -> Uploaded:
    """Register a file the web tier already put in storage (see the module docstring).
    The bytes are inspected between two short transactions, not inside one: a slow
    object store must not hold a database lock (SQLite's is the whole file). The key
    registered meanwhile (a concurrent registration: the unique index lets one in; or
    its bytes, counted first, leave these no room in the quota) answers as that
    registration's retry: :meth:`Registration.again`."""
    key, size_bytes = registration.storage_key, registration.size_bytes
    pool = registration.pool(engine, caller)
    if not storage.exists(key):
        raise InvalidRequest(f"nothing is stored at {key!r}", storage_key=key)
    stored = storage.size(key)
    if stored != size_bytes:
        raise InvalidRequest(
            f"size_bytes is {size_bytes} but {key!r} holds {stored} bytes", storage_key=key
        )
    inspection = inspector(storage, key, stored)

    def registering() -> ObjectInfo:
        with transaction(engine) as conn:
            return register_object(  # checks pool membership again, in this transaction
                conn,
                caller,
                object_id=object_id,
                pool_id=pool,
                storage_key=key,
                filename=registration.filename,
                size_bytes=size_bytes,
                sha256=registration.sha256,
                inspection=inspection,
                now=now,
                quota_bytes=quota_bytes,
            )

    try:
        # Run again whole if PostgreSQL aborts it in a deadlock: it only records.
        return Uploaded(rerun_on_conflict(registering, what="register"))
    except (IntegrityError, StorageQuotaExceeded) as exc:
        again = registration.again(engine, caller)
        if again is not None:
            return again
        if isinstance(exc, IntegrityError):
            raise Conflict(f"{key!r} could not be registered", storage_key=key) from exc
        raise


def delete_object(
    engine: Engine,
    storage: Storage,
    queue: RedisQueue,
    events: JobEvents,
    caller: Caller,
    object_id: str,
    clock: Clock,
    backends: deletions.Backends | None = None,
) -> Deletion:
    """Delete an object of the caller's, its outputs and all their blobs (a migrated
    one's also where it was migrated to, reached through ``backends``). The rows are
    marked first, in one transaction (from then on nothing can submit on it, and the
    quota counts it no more) that also records the blobs to delete
    (:mod:`hypermedia.storage.deletions`); the blobs go after, with no database lock
    held on the object store, each losing its record once the store has deleted it. One
    the store fails to delete keeps it, and the head's maintenance tries it again
    later. Bulk runs' jobs on the object are cancelled first, in a transaction of their
    own (a running one asked to stop even when the deletion must wait for it); those
    cancelled then leave their Redis queue and publish their end, as a user's cancel
    does."""
    now = clock.now()

    # Each transaction run again whole if PostgreSQL aborts it in a deadlock (with a
    # submit, a completion): what it did outside the database comes after its commit.
    def cancelling() -> dict[str, list[str]]:
        with transaction(engine) as conn:
            return cancel_bulk_jobs(conn, caller, object_id, now)

    def deleting() -> Deletion:
        with transaction(engine) as conn:
            deletion = plan_deletion(conn, caller, object_id)
            mark_deleted(conn, deletion, now)
            deletions.record(conn, object_id, deletion.storage_keys, now)
        return deletion

    cancelled = rerun_on_conflict(cancelling, what="delete_object")
    forget_cancelled(queue, events, cancelled, now, action="delete_object")
    deletion = rerun_on_conflict(deleting, what="delete_object")
    deletions.delete_blobs(
        engine, storage, deletion.storage_keys, clock, action="delete_object", backends=backends
    )
    return deletion
