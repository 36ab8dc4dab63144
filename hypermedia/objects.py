"""Objects (stored files) and who may use them.

A caller may use an object they own or one in a pool they belong to. Anything
else answers :class:`NotFound`, exactly as for an id that does not exist, so ids
of other users' objects reveal nothing.

An object registered with an :class:`~hypermedia.sandbox.inspect.Inspection` keeps it
(``inspection``) and its ``content_type`` is the detected mime type, never what the
uploader claimed; ingest judges every submit on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, insert, select

from hypermedia.accounts import Caller, is_pool_member
from hypermedia.clock import to_datetime
from hypermedia.db import tables as t
from hypermedia.errors import NotFound
from hypermedia.sandbox.inspect import Inspection


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
) -> ObjectInfo:
    """Record a file already in storage. The caller must belong to ``pool_id``. With an
    ``inspection``, its mime type replaces ``content_type``."""
    if not is_pool_member(conn, pool_id, caller.user_id):
        raise NotFound(f"no pool {pool_id!r}", pool_id=pool_id)
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
    conn.execute(insert(t.objects).values(**values))
    return ObjectInfo(**{k: v for k, v in values.items() if k in ObjectInfo.__dataclass_fields__})


def usable_by(caller: Caller) -> ColumnElement[bool]:
    """The WHERE clause for objects ``caller`` may use: owned, or in one of their pools."""
    member = (
        select(t.pool_members.c.user_id)
        .where(
            t.pool_members.c.pool_id == t.objects.c.pool_id,
            t.pool_members.c.user_id == caller.user_id,
        )
        .exists()
    )
    return (t.objects.c.owner_id == caller.user_id) | member


def get_object(conn: Connection, caller: Caller, object_id: str) -> ObjectInfo:
    """The object if ``caller`` may use it; NotFound otherwise (or if it does not exist)."""
    row = conn.execute(
        select(*[t.objects.c[name] for name in ObjectInfo.__dataclass_fields__]).where(
            t.objects.c.object_id == object_id, usable_by(caller)
        )
    ).first()
    if row is None:
        raise NotFound(f"no object {object_id!r}", object_id=object_id)
    return ObjectInfo(**row._mapping)
