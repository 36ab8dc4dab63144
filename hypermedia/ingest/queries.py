"""What a caller may read of their jobs besides one job
(:func:`~hypermedia.ingest.service.job_view`): their jobs, filtered, a page at a time;
one submission and its jobs; an output.

Every query is the caller's own: a job, submission or output of anyone else is
``None`` here and 404 at the API, exactly as one that does not exist.

Pages are keyset pages, newest first: job ids are time-ordered (:mod:`hypermedia.ids`),
so a page is ``WHERE user_id = ? AND job_id < <cursor> ORDER BY job_id DESC LIMIT n``
on the ``(user_id, job_id)`` index, as fast on the thousandth page as on the first, and
a job created while a client pages never shifts what it has not read yet. The cursor
is the last job id of the page before (opaque to clients).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select

from hypermedia.db import tables as t

MAX_PAGE = 200


@dataclass(frozen=True, slots=True)
class JobFilters:
    statuses: Sequence[str] = ()
    operation: str | None = None
    object_id: str | None = None
    submission_id: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None


@dataclass(frozen=True, slots=True)
class JobPage:
    jobs: list[Any]  # rows of SUMMARY's columns
    next_cursor: str | None  # None: this was the last page


_j = t.jobs.c
SUMMARY = (
    _j.job_id,
    _j.submission_id,
    _j.object_id,
    _j.operation,
    _j.queue,
    _j.priority,
    _j.status,
    _j.attempt_count,
    _j.max_attempts,
    _j.estimated_millicredits,
    _j.actual_millicredits,
    _j.error_code,
    _j.created_at,
    _j.started_at,
    _j.completed_at,
)


def list_jobs(
    conn: Connection,
    user_id: str,
    filters: JobFilters,
    *,
    cursor: str | None = None,
    limit: int = 50,
) -> JobPage:
    """A page of the user's jobs, newest first (see the module docstring)."""
    limit = max(1, min(limit, MAX_PAGE))
    conds = [_j.user_id == user_id]
    if cursor is not None:
        conds.append(_j.job_id < cursor)
    if filters.statuses:
        conds.append(_j.status.in_(list(filters.statuses)))
    if filters.operation is not None:
        conds.append(_j.operation == filters.operation)
    if filters.object_id is not None:
        conds.append(_j.object_id == filters.object_id)
    if filters.submission_id is not None:
        conds.append(_j.submission_id == filters.submission_id)
    if filters.created_after is not None:
        conds.append(_j.created_at > filters.created_after)
    if filters.created_before is not None:
        conds.append(_j.created_at < filters.created_before)
    rows = conn.execute(
        select(*SUMMARY).where(*conds).order_by(_j.job_id.desc()).limit(limit + 1)
    ).all()
    more = len(rows) > limit
    rows = rows[:limit]
    return JobPage(list(rows), rows[-1].job_id if more else None)


def submission(conn: Connection, user_id: str, submission_id: str) -> tuple[Any, list[Any]] | None:
    """The user's submission and its jobs (in the order they were created)."""
    s = t.submissions.c
    row = conn.execute(
        select(s.submission_id, s.idempotency_key, s.estimated_millicredits, s.created_at).where(
            s.submission_id == submission_id, s.user_id == user_id
        )
    ).one_or_none()
    if row is None:
        return None
    jobs = conn.execute(
        select(*SUMMARY).where(_j.submission_id == submission_id).order_by(_j.job_id)
    ).all()
    return row, list(jobs)


def output(conn: Connection, user_id: str, job_id: str, output_type: str) -> Any | None:
    """The user's job's output of ``output_type`` (its newest profile version), with the
    file name of the object the job read (``filename``)."""
    o = t.outputs.c
    return conn.execute(
        select(o.output_type, o.storage_key, o.size_bytes, o.content_type, t.objects.c.filename)
        .join(t.jobs, t.jobs.c.job_id == o.job_id)
        .join(t.objects, t.objects.c.object_id == t.jobs.c.object_id)
        .where(o.job_id == job_id, o.output_type == output_type, t.jobs.c.user_id == user_id)
        .order_by(o.profile_version.desc())
        .limit(1)
    ).one_or_none()
