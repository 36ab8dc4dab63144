"""Building blocks for tests: a wired stack on the test's database, users, objects."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, insert

from hypermedia import accounts, objects
from hypermedia.accounts import Caller
from hypermedia.clock import Clock
from hypermedia.config import Settings
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.ids import new_id
from hypermedia.ingest.service import SubmitRequest
from hypermedia.profiles import load_profiles
from hypermedia.sandbox.inspect import Inspection
from hypermedia.stack import Stack
from hypermedia.storage.base import original_key


def open_stack(
    settings: Callable[..., Settings], engine: Engine, clock: Clock | None, **overrides: Any
) -> Stack:
    """A stack whose ingest accepts every profiled operation, implemented or not: these
    tests drive the queues (ocr, bulk) by hand. Ingest's refusal of an operation without
    a pipeline step is tested on a stack opened with ``Stack.open``'s default."""
    chosen = settings(**overrides)
    profiled = frozenset(load_profiles(chosen.profiles_path, chosen.queue_names))
    return Stack.open(
        chosen, engine=engine, clock=clock, auto_migrate=True, implemented=lambda: profiled
    )


@dataclass
class Person:
    caller: Caller
    api_key: str
    pool_id: str


def make_user(stack: Stack, name: str | None = None, credits: float = 1_000_000.0) -> Person:
    with transaction(stack.engine) as conn:
        user = accounts.create_user(
            conn,
            name or f"user-{new_id()[-8:]}",
            stack.clock.now(),
            credits_millicredits=round(credits * 1000),
            grants=accounts.UNLIMITED,  # a web tier's key: any priority, no submit rate
        )
        caller = accounts.authenticate(conn, user.api_key)
    return Person(caller, user.api_key, user.pool_id)


def make_object(
    stack: Stack,
    person: Person,
    size_bytes: int = 1024,
    inspection: Inspection | None = None,
    object_id: str | None = None,
) -> str:
    """An object's row (no bytes stored); ``inspection``: what its upload found in it
    (None: never inspected, like another job's output); ``object_id``: its id, if not
    a new one."""
    object_id = object_id or new_id()
    with transaction(stack.engine) as conn:
        objects.register_object(
            conn,
            person.caller,
            object_id=object_id,
            pool_id=person.pool_id,
            storage_key=f"originals/{person.pool_id}/{object_id}",
            filename="file.bin",
            size_bytes=size_bytes,
            now=stack.clock.now(),
            inspection=inspection,
        )
    return object_id


def image_inspection() -> Inspection:
    """What an upload finds in a PNG (ocr reads it as one page)."""
    return Inspection("image", "image/png", {"label": "PNG image", "width": 800, "height": 600})


def pdf_inspection(pages: int) -> Inspection:
    """What an upload finds in a PDF of ``pages`` pages."""
    return Inspection("pdf", "application/pdf", {"label": "PDF document", "pages": pages})


def stored_object(stack: Stack, person: Person, payload: bytes) -> str:
    """An object whose bytes are in the stack's storage (what workers download)."""
    object_id = new_id()
    key = original_key(person.pool_id, object_id)
    blob = stack.storage.put(key, [payload])
    with transaction(stack.engine) as conn:
        objects.register_object(
            conn,
            person.caller,
            object_id=object_id,
            pool_id=person.pool_id,
            storage_key=key,
            filename="in.bin",
            size_bytes=blob.size_bytes,
            now=stack.clock.now(),
        )
    return object_id


def submit(
    stack: Stack, person: Person, operations: list[str], priority: int | None = None, **kw: Any
) -> list[str]:
    object_id = kw.pop("object_id", None) or make_object(stack, person)
    result = stack.ingest.submit(
        person.caller,
        SubmitRequest(object_id=object_id, operations=operations, priority=priority, **kw),
    )
    return result.job_ids


def add_worker_row(
    engine: Engine,
    worker_id: str,
    *,
    at: datetime,
    queue: str = "images",
    status: str = "active",
    node_id: str | None = None,
    hostname: str = "a-node",
) -> None:
    """A ``workers`` row as a worker elsewhere would have written it, last beating ``at``."""
    with transaction(engine) as conn:
        conn.execute(
            insert(t.workers).values(
                worker_id=worker_id,
                queue=queue,
                node_id=node_id,
                hostname=hostname,
                pid=1,
                status=status,
                concurrency=1,
                started_at=at,
                last_heartbeat=at,
            )
        )
