"""Which objects a bulk run deals with, a keyset page at a time.

A page is ``object_id > cursor ORDER BY object_id LIMIT n`` over the objects the run's
filter matches (ids are time-ordered, so objects stored after the run began come last
and are dealt with too). Each row says whether the object is already *done*: it has an
output of the operation at the target version, or a live job of the operation at that
profile (queued, running or waiting for a retry). Nothing ever holds more than one
page of ids.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, Exists, Select, and_, exists, func, literal, select

from hypermedia.bulk.runs import LIVE_JOB_STATUSES
from hypermedia.db import tables as t
from hypermedia.objects import usable_by

o = t.objects.c


def filter_clause(flt: dict[str, Any]) -> list[ColumnElement[bool]]:
    """The run's filter (``BulkFilter.to_json()``) as WHERE conditions on objects."""
    from hypermedia.bulk.runs import BulkFilter

    f = BulkFilter.model_validate(flt)
    conds: list[ColumnElement[bool]] = [o.deleted_at.is_(None)]
    if f.pool_id is not None:
        conds.append(o.pool_id == f.pool_id)
    if f.owner_id is not None:
        conds.append(o.owner_id == f.owner_id)
    if f.detected_kind is not None:
        conds.append(o.inspection["kind"].as_string() == f.detected_kind)
    if f.created_after is not None:
        conds.append(o.created_at >= f.created_after)
    if f.created_before is not None:
        conds.append(o.created_at < f.created_before)
    return conds


def _outputs_of(operation: str, *version: ColumnElement[bool]) -> Exists:
    j, out = t.jobs.c, t.outputs.c
    return exists(
        select(literal(1))
        .select_from(t.outputs.join(t.jobs, j.job_id == out.job_id))
        .where(j.object_id == o.object_id, j.operation == operation, *version)
    )


def done_clause(run: Any) -> ColumnElement[bool]:
    """The object needs no job of ``run``: its output at the target version exists (for a
    regeneration of every version: one made since the run began), or a live job of the
    operation at the run's profile is on it."""
    out = t.outputs.c
    version = [out.profile_version == run.target_version]
    if run.kind == "regenerate" and run.filter.get("all_versions"):
        version.append(out.created_at >= run.created_at)
    j = t.jobs.c
    live = exists(
        select(literal(1)).where(
            j.object_id == o.object_id,
            j.operation == run.operation,
            j.profile_id == run.profile_id,
            j.status.in_(LIVE_JOB_STATUSES),
        )
    )
    return _outputs_of(run.operation, *version) | live


def selection(run: Any, target_name: str | None = None) -> Select[Any]:
    """How many objects the run deals with (its pages' rows, from the start; a
    migration's: those not at ``target_name``): one count over the filter, done or not
    (a run's progress: ``bulk_runs.total``)."""
    conds = _conditions(run) if target_name is None else _migrate_conditions(run, target_name)
    return select(func.count()).select_from(t.objects).where(and_(*conds))


def _conditions(run: Any) -> list[ColumnElement[bool]]:
    conds = filter_clause(run.filter)
    conds.append(o.kind == "original")
    if run.account_user_id is not None:
        # The account's jobs are the account's to see and fetch the outputs of: only
        # the objects it may use (its own, its pools') are dealt with.
        conds.append(usable_by(run.account_user_id))
    if run.kind == "regenerate":
        older = (
            []
            if run.filter.get("all_versions")
            else [t.outputs.c.profile_version < run.target_version]
        )
        conds.append(_outputs_of(run.operation, *older))
    return conds


def page(run: Any, cursor: str | None, limit: int) -> Select[Any]:
    """The next page of a regenerate/backfill run: object_id, pool_id, size_bytes,
    inspection, done. A run that names an account deals with the objects that account
    may use only (their jobs are its: it sees them and fetches their outputs)."""
    conds = _conditions(run)
    if cursor is not None:
        conds.append(o.object_id > cursor)
    return (
        select(
            o.object_id,
            o.pool_id,
            o.size_bytes,
            o.inspection,
            done_clause(run).label("done"),
        )
        .where(and_(*conds))
        .order_by(o.object_id)
        .limit(limit)
    )


def _migrate_conditions(run: Any, target_name: str) -> list[ColumnElement[bool]]:
    conds = filter_clause(run.filter)
    conds.append(o.storage_backend.is_(None) | (o.storage_backend != target_name))
    return conds


def migrate_page(run: Any, target_name: str, cursor: str | None, limit: int) -> Select[Any]:
    """The next page of a migration: every object (uploads and outputs) the filter
    matches whose verified copy is not at ``target_name`` yet."""
    conds = _migrate_conditions(run, target_name)
    if cursor is not None:
        conds.append(o.object_id > cursor)
    return (
        select(
            o.object_id,
            o.storage_key,
            o.size_bytes,
            o.sha256,
            o.storage_backend,
            o.content_type,
        )
        .where(and_(*conds))
        .order_by(o.object_id)
        .limit(limit)
    )
