"""The profile catalog: configured profiles written to ``processing_profiles``.

Jobs reference a profile row (operation + version), so changing what an
operation produces means bumping its version: a new row, and new output keys.
Syncing a profile whose version exists with different ``params`` is refused,
because its outputs would silently differ under the same keys.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, RowMapping, bindparam, insert, select, update

from hypermedia.clock import to_datetime
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.errors import ConfigError, InvalidParams, PageLimit, UnknownOperation
from hypermedia.profiles import BYTES_PER_MB, Profile
from hypermedia.sandbox.limits import DEFAULT_MAX_OUTPUT_BYTES, DEFAULT_MAX_PROCESSES

if TYPE_CHECKING:
    from hypermedia.sandbox.inspect import Inspection

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ProfileRecord:
    profile_id: int
    operation: str
    version: int
    queue: str
    base_cost_millicredits: int
    cost_per_mb_millicredits: int
    timeout_seconds: int
    memory_limit_mb: int
    max_input_bytes: int
    max_attempts: int
    default_priority: int
    params: dict[str, Any]
    max_processes: int = DEFAULT_MAX_PROCESSES  # RLIMIT_NPROC of the job's child (threads)
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES  # RLIMIT_FSIZE: the largest file
    # Input validation (hypermedia.sandbox.inspect): checked by ingest at submit.
    accepts: list[str] = field(default_factory=lambda: ["any"])
    input_limits: dict[str, Any] = field(default_factory=dict)
    # Millicredits per unit of work the step reports (profiles.py's unit_costs).
    unit_costs_millicredits: dict[str, int] = field(default_factory=dict)
    # A job's time grows with its pages up to a cap (profiles.py; job_timeout_seconds).
    timeout_seconds_per_page: float | None = None
    max_timeout_seconds: int | None = None

    def job_timeout_seconds(self, params: Mapping[str, Any], inspection: Inspection | None) -> int:
        """A job's time limit on an input of ``inspection`` with ``params`` (checked
        already): ``timeout_seconds``, plus ``timeout_seconds_per_page`` for each page
        its step may read (:func:`pipelines.registry.max_units`' ``page``), rounded up.
        Past ``max_timeout_seconds``: :class:`~hypermedia.errors.PageLimit`, naming the
        most pages the cap allows."""
        per_page, cap = self.timeout_seconds_per_page, self.max_timeout_seconds
        if per_page is None or cap is None:
            return self.timeout_seconds
        from pipelines import registry

        try:
            pages = registry.max_units(self.operation, params, inspection).get("page", 0)
        except registry.PipelineError as exc:
            raise InvalidParams(exc.message, operation=self.operation) from exc
        seconds = math.ceil(self.timeout_seconds + per_page * pages)
        if seconds <= cap:
            return seconds
        most = max(0, math.floor((cap - self.timeout_seconds) / per_page))
        about = {} if inspection is None else {"kind": inspection.kind, "mime": inspection.mime}
        raise PageLimit(
            f"{self.operation} of {pages:,} pages needs {seconds:,} s"
            f" ({self.timeout_seconds:,} + {per_page:g} a page), over its limit of"
            f" {cap:,} s: at most {most:,} pages",
            **about,
            pages=pages,
            limit=most,
        )

    def estimate_millicredits(self, size_bytes: int) -> int:
        """``base_cost + cost_per_mb x size_mb``, rounded up to a millicredit: what a
        job on ``size_bytes`` of input costs before the units of work its step reports."""
        per_byte_numerator = self.cost_per_mb_millicredits * size_bytes
        variable = -(-per_byte_numerator // BYTES_PER_MB)  # ceil division, exact
        return self.base_cost_millicredits + variable

    def reserve_millicredits(
        self, estimate: int, params: Mapping[str, Any], inspection: Inspection | None
    ) -> int:
        """What a submit holds for a job on an input of ``inspection`` with ``params``
        (the profile's merged with the request's, checked already): its ``estimate``
        plus each priced unit of work at the most its step may report
        (:func:`pipelines.registry.max_units`), so that no charge exceeds it. Parameters
        the step refuses raise :class:`InvalidParams`; a priced unit the step does not
        bound, :class:`ConfigError` (the profiles' load refuses such a price first)."""
        costs = {unit: cost for unit, cost in self.unit_costs_millicredits.items() if cost}
        if not costs:
            return estimate
        from pipelines import registry

        try:
            bound = registry.max_units(self.operation, params, inspection)
        except registry.PipelineError as exc:
            raise InvalidParams(exc.message, operation=self.operation) from exc
        unbounded = sorted(set(costs) - set(bound))
        if unbounded:
            raise ConfigError(
                f"profiles.{self.operation}.unit_costs.{unbounded[0]}",
                f"the {self.operation} step declares no bound for {unbounded[0]!r}:"
                " a submit cannot reserve what it may cost",
            )
        return estimate + sum(cost * bound[unit] for unit, cost in costs.items())

    def charge_millicredits(self, estimate: int, units: Mapping[str, int] | None) -> int:
        """What a completed job costs: its ``estimate`` plus each priced unit of work
        its step reported times its count (ocr: ``escalation`` per page re-read). The
        completion charges at most the job's reservation (:meth:`reserve_millicredits`)."""
        if not units:
            return estimate
        costs = self.unit_costs_millicredits
        return estimate + sum(costs[unit] * count for unit, count in units.items() if unit in costs)


def record_values(profile: Profile) -> dict[str, Any]:
    """A configured profile's columns, as :func:`sync_profiles` writes them (credits in
    millicredits, limits as a dict): every field of its :class:`ProfileRecord` but the
    id, operation and version."""
    return {
        "queue": profile.queue,
        "base_cost_millicredits": profile.base_cost_millicredits,
        "cost_per_mb_millicredits": profile.cost_per_mb_millicredits,
        "timeout_seconds": profile.timeout_seconds,
        "memory_limit_mb": profile.memory_limit_mb,
        "max_processes": profile.max_processes,
        "max_output_bytes": profile.max_output_bytes,
        "max_input_bytes": profile.max_input_bytes,
        "max_attempts": profile.max_attempts,
        "default_priority": profile.default_priority,
        "params": profile.params,
        "accepts": list(profile.accepts),
        "input_limits": profile.limits.to_dict(),
        "unit_costs_millicredits": profile.unit_costs_millicredits,
        "timeout_seconds_per_page": profile.timeout_seconds_per_page,
        "max_timeout_seconds": profile.max_timeout_seconds,
    }


def sync_profiles(conn: Connection, profiles: Mapping[str, Profile], now: float) -> None:
    """Upsert the configured profiles; only they stay active. A statement per kind of
    write, not one per profile (this runs at every ``Stack.open(auto_migrate=True)``):
    one INSERT of the new versions, one UPDATE (an executemany) of the ones there
    already, and before it the deactivation of every row, when there is any. A changed
    ``params`` under an existing version is refused before anything is written."""
    existing = {
        (r.operation, r.version): r
        for r in conn.execute(
            select(
                t.profiles.c.profile_id,
                t.profiles.c.operation,
                t.profiles.c.version,
                t.profiles.c.params,
            )
        )
    }
    at = to_datetime(now)
    new: list[dict[str, Any]] = []
    kept: list[dict[str, Any]] = []
    for operation, profile in profiles.items():
        found = existing.get((operation, profile.version))
        values = record_values(profile)
        if found is None:
            new.append(
                {
                    "operation": operation,
                    "version": profile.version,
                    "active": True,
                    "created_at": at,
                    "updated_at": at,
                    **values,
                }
            )
        elif found.params != profile.params:
            raise ConfigError(
                f"profiles.{operation}.version",
                f"params changed but version {profile.version} already exists; bump the version",
            )
        else:
            kept.append({"kept_profile_id": found.profile_id, **values})
    if existing:
        conn.execute(update(t.profiles).values(active=False))
    if kept:
        conn.execute(
            update(t.profiles)
            .where(t.profiles.c.profile_id == bindparam("kept_profile_id"))
            .values(active=True, updated_at=at),
            kept,
        )
    if new:
        conn.execute(insert(t.profiles), new)


def record_from_row(row: RowMapping) -> ProfileRecord:
    """A ``processing_profiles`` row as its :class:`ProfileRecord`."""
    return ProfileRecord(**{k: row[k] for k in ProfileRecord.__dataclass_fields__})


class ProfileCatalog:
    """Active profiles by operation, read once from the database (what ingest submits
    jobs with), and any profile by id (what a job runs with).

    A job keeps the profile it was submitted with. A deploy (``db upgrade`` syncing a
    new version) can come between a submit and the job's run, on either side of a
    process's read: a worker started before it meets jobs of the new version, one
    started after meets jobs queued at the old one. :meth:`by_id` reads a profile it
    does not hold from the record (once; active or not), so both run, each with its
    own version's settings, and nothing submitted is lost to a deploy."""

    def __init__(self, records: Mapping[str, ProfileRecord], engine: Engine | None = None) -> None:
        self._by_operation = dict(records)
        self._by_id = {r.profile_id: r for r in records.values()}
        self._engine = engine

    @classmethod
    def load(cls, engine: Engine) -> ProfileCatalog:
        with transaction(engine) as conn:
            return cls(cls._active(conn), engine)

    @classmethod
    def from_connection(cls, conn: Connection) -> ProfileCatalog:
        return cls(cls._active(conn))

    @staticmethod
    def _active(conn: Connection) -> dict[str, ProfileRecord]:
        rows = conn.execute(select(t.profiles).where(t.profiles.c.active.is_(True))).mappings()
        return {r["operation"]: record_from_row(r) for r in rows}

    def get(self, operation: str) -> ProfileRecord:
        try:
            return self._by_operation[operation]
        except KeyError:
            raise UnknownOperation(
                f"unknown operation {operation!r}",
                operation=operation,
                known=sorted(self._by_operation),
            ) from None

    def by_id(self, profile_id: int) -> ProfileRecord | None:
        """The profile ``profile_id``, active or not (see the class docstring); None if
        the record has no such row (or this catalog has no record to ask)."""
        found = self._by_id.get(profile_id)
        if found is not None or self._engine is None:
            return found
        with transaction(self._engine) as conn:
            row = (
                conn.execute(select(t.profiles).where(t.profiles.c.profile_id == profile_id))
                .mappings()
                .first()
            )
        if row is None:
            return None
        found = self._by_id.setdefault(profile_id, record_from_row(row))
        log.info(
            "profile %s v%s (id %d, %s) read for a job",
            found.operation,
            found.version,
            profile_id,
            "active" if row["active"] else "no longer active",
        )
        return found

    def operations(self) -> list[str]:
        return sorted(self._by_operation)

    def __len__(self) -> int:
        return len(self._by_operation)
