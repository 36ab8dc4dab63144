"""The embedded run: files in, jobs recorded and queued, progress on screen.

``hypermedia run PATH...`` uses the embedded default (SQLite in ``data_dir``, a
private ``redis-server``; local-directory storage), registers every file under
the local operator account, submits the requested operations and reports each
job's state as it changes. Directories are walked; hidden files are skipped.

When no ``--op`` is given, operations are chosen from the file's guessed type
(a convenience only: the worker checks the real type by content before any
decoder sees the file).
"""

from __future__ import annotations

import mimetypes
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import select

from hypermedia import accounts, objects
from hypermedia.accounts import Caller
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.ids import new_id
from hypermedia.ingest.service import SubmitRequest
from hypermedia.stack import Stack
from hypermedia.storage.base import original_key

LOCAL_OPERATOR = "local-operator"
LOCAL_CREDITS_MILLICREDITS = 1_000_000_000  # the embedded operator pays itself

DEFAULT_OPERATIONS: dict[str, list[str]] = {
    "image": ["thumbnail"],
    "application/pdf": ["pdf_preview", "extract_text"],
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": ["docx_to_pdf"],
    "application/msword": ["docx_to_pdf"],
    "application/vnd.oasis.opendocument.text": ["docx_to_pdf"],
    "video": ["transcode_video"],
    "audio": ["transcode_audio"],
}


def default_operations(path: Path) -> list[str]:
    guessed, _ = mimetypes.guess_type(path.name)
    if guessed is None:
        return []
    return DEFAULT_OPERATIONS.get(guessed) or DEFAULT_OPERATIONS.get(guessed.split("/")[0], [])


def walk(paths: Iterable[Path]) -> Iterator[Path]:
    for path in paths:
        if path.is_dir():
            for child in sorted(path.rglob("*")):
                relative = child.relative_to(path)
                if child.is_file() and not any(p.startswith(".") for p in relative.parts):
                    yield child
        elif path.is_file():
            yield path
        else:
            raise FileNotFoundError(f"no such file or directory: {path}")


def local_operator(stack: Stack) -> tuple[Caller, str]:
    """The embedded operator account (created on first use) and its pool."""
    now = stack.clock.now()
    with transaction(stack.engine) as conn:
        row = conn.execute(
            select(t.users.c.user_id, t.users.c.is_operator).where(t.users.c.name == LOCAL_OPERATOR)
        ).first()
        if row is None:
            user = accounts.create_user(
                conn,
                LOCAL_OPERATOR,
                now,
                credits_millicredits=LOCAL_CREDITS_MILLICREDITS,
                is_operator=True,
            )
            return Caller(user.user_id, True), user.pool_id
        return Caller(row.user_id, bool(row.is_operator)), f"user-{row.user_id}"


@dataclass
class RunReport:
    files: int = 0
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    jobs: dict[str, tuple[Path, str]] = field(default_factory=dict)  # job_id -> (file, op)
    statuses: Counter[str] = field(default_factory=Counter)


def submit_files(
    stack: Stack,
    paths: Iterable[Path],
    operations: list[str] | None = None,
    priority: int | None = None,
    on_file: Callable[[Path], None] | None = None,
) -> RunReport:
    """Store, register and submit every file. Files with no applicable operation,
    or that a profile refuses, are reported as skipped with the reason."""
    caller, pool_id = local_operator(stack)
    report = RunReport()
    for path in walk(paths):
        if on_file is not None:
            on_file(path)
        ops = list(operations) if operations else default_operations(path)
        if not ops:
            report.skipped.append((path, "no default operation for this type; pass --op"))
            continue
        object_id = new_id()
        key = original_key(pool_id, object_id)
        with path.open("rb") as handle:
            blob = stack.storage.put(key, iter(lambda: handle.read(1 << 20), b""))
        with transaction(stack.engine) as conn:
            objects.register_object(
                conn,
                caller,
                object_id=object_id,
                pool_id=pool_id,
                storage_key=key,
                filename=path.name,
                size_bytes=blob.size_bytes,
                sha256=blob.sha256,
                content_type=mimetypes.guess_type(path.name)[0],
                now=stack.clock.now(),
            )
        report.files += 1
        try:
            result = stack.ingest.submit(
                caller, SubmitRequest(object_id=object_id, operations=ops, priority=priority)
            )
        except Exception as exc:
            code = getattr(exc, "code", type(exc).__name__)
            report.skipped.append((path, f"{code}: {exc}"))
            continue
        for job in result.jobs:
            report.jobs[job.job_id] = (path, job.operation)
    return report


def job_statuses(stack: Stack, job_ids: Iterable[str]) -> dict[str, str]:
    ids = list(job_ids)
    found: dict[str, str] = {}
    with transaction(stack.engine) as conn:
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            rows = conn.execute(
                select(t.jobs.c.job_id, t.jobs.c.status).where(t.jobs.c.job_id.in_(chunk))
            ).all()
            found.update({r.job_id: r.status for r in rows})
    return found
