"""Processing profiles: what each operation costs, where it queues, its limits.

A profile binds an operation name (``thumbnail``, ``pdf_preview`` ...) to a queue,
a version (part of every output key, so bump it when the output would change),
credit costs, a timeout, a memory limit, the largest input it accepts, how many
attempts it gets, its default priority, which kinds of file it accepts and its input
limits. Profiles are read from TOML::

    [profiles.thumbnail]
    queue = "images"
    version = 1
    base_cost = 0.1          # credits
    cost_per_mb = 0.02       # credits per MB of input
    timeout_seconds = 30
    memory_limit_mb = 1024
    max_input_bytes = 52428800
    max_attempts = 3
    default_priority = 3
    params = { width = 256, height = 256 }
    accepts = ["image/jpeg", "image/png"]     # kinds or mime types, by content; "any"
    limits = { max_pixels = 100_000_000 }     # see hypermedia.sandbox.inspect.InputLimits
    unit_costs = { escalation = 0.25 }        # credits per unit of work the step reports
    timeout_seconds_per_page = 12             # with max_timeout_seconds: see below
    max_timeout_seconds = 7200

``accepts`` lists kinds of :mod:`hypermedia.sandbox.inspect` (``image``, ``pdf``,
``ooxml-word``, ``video`` ...) or mime types (``image/png``), as found in the file's
content at upload; a profile that leaves it out accepts any kind (the content verdicts:
macros, encryption, ZIP bombs ... still apply). Submitting an operation on a file it
does not accept is refused with ``input_type_mismatch`` or ``unsupported_format``.

Credits are stored as integer millicredits so sums are exact on every database; a job's
estimate is :meth:`hypermedia.jobs.catalog.ProfileRecord.estimate_millicredits` of the
profile's row. ``unit_costs`` prices the units of work a step reports when it completes
(:data:`pipelines.registry.USAGE_OUTPUT`; the ocr step: ``page``, ``ocr_page``,
``engine_pass``, ``escalation``): a completed job is charged its estimate plus each
priced unit times its count (:meth:`~hypermedia.jobs.catalog.ProfileRecord.
charge_millicredits`), and its attempt records the units.

Credits are a hard limit, so the reservation at submit is the worst case: the estimate
plus each priced unit at the most the step may report for this input and these params
(:meth:`~hypermedia.jobs.catalog.ProfileRecord.reserve_millicredits`, from the bound
the step declares with :func:`pipelines.registry.register_max_units`; ocr: pages, 1 for
an image, a PDF's page count from its inspection, else ``max_pages``, times the engines
of the chain after the first). The job keeps it (``jobs.reserved_millicredits``); the
completion charges at most it (a step that reports past its bound is charged the
reservation, and a warning is logged) and releases all of it, as a failure or a cancel
does: no balance goes below zero. A profile that prices a unit its step declares no
bound for is refused here (``profiles.<op>.unit_costs.<unit>``): the reservation could
not cover it. Units priced 0, and profiles of operations no step implements, pass.

A job's time limit is the profile's ``timeout_seconds``, or, for a profile that gives
``timeout_seconds_per_page`` (and with it ``max_timeout_seconds``), ``timeout_seconds``
plus that for each page the step may read (its bound of the unit ``page``: ocr's, from
the input's inspection), worked out at submit and kept on the job
(``processing_jobs.timeout_seconds``;
:meth:`~hypermedia.jobs.catalog.ProfileRecord.job_timeout_seconds`). The worker gives it
to the job's child (CPU rlimit, wall clock = x 1.5) and to its lease. A document whose
time would pass ``max_timeout_seconds`` is refused at submit with ``page_limit``, naming
the most pages the cap allows.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Any, get_type_hints

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    create_model,
    field_validator,
)

from hypermedia.config_errors import chosen_error, is_unknown_key, unknown_key, unknown_key_problem
from hypermedia.errors import ConfigError
from hypermedia.sandbox.inspect import ANY, KINDS, InputLimits
from hypermedia.sandbox.limits import DEFAULT_MAX_OUTPUT_BYTES, DEFAULT_MAX_PROCESSES
from pipelines import registry

MILLI = 1000
BYTES_PER_MB = 1024 * 1024
# What the record's columns and setrlimit hold: a cost (credits) below a billion, a
# memory limit up to 1 TiB (an INTEGER column of MB), sizes up to 1 PiB (RLIMIT_FSIZE
# and BIGINT stop at 2**63).
MAX_COST = 1e9
MAX_MEMORY_MB = 1024 * 1024
MAX_BYTES = 2**50
MAX_TIMEOUT_SECONDS = 24 * 3600
_MIME = re.compile(r"[a-z]+/[a-z0-9][a-z0-9.+-]*", re.I)
_UNIT = re.compile(r"[a-z][a-z0-9_]{0,31}")
# Strict: TOML has integers, floats and booleans of its own, so "30" for 30 or true for
# 1 is a mistake to name, not a value to convert (a float field still takes an integer).
Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]
Str = Annotated[str, Strict()]
# The limits table checked as strictly: InputLimits is a plain dataclass that pydantic
# validates leniently (its rows come back from the record as JSON too).
_LIMIT_TYPES = get_type_hints(InputLimits, include_extras=True)
_STRICT_LIMITS = create_model(
    "limits",
    __config__=ConfigDict(extra="forbid", strict=True, allow_inf_nan=False),
    **{f.name: (_LIMIT_TYPES[f.name], f.default) for f in fields(InputLimits)},  # type: ignore[call-overload]
)


class Profile(BaseModel):
    """One operation's processing profile, as configured."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    operation: Str = Field(pattern=r"^[a-z][a-z0-9_.]{0,63}$")
    queue: Str
    version: Int = Field(ge=1)
    base_cost: Float = Field(ge=0, lt=MAX_COST)
    cost_per_mb: Float = Field(ge=0, lt=MAX_COST)
    timeout_seconds: Int = Field(ge=1, le=MAX_TIMEOUT_SECONDS)
    # A job's time grows with its pages: timeout_seconds + this x the pages its step
    # may read (its bound of the unit ``page``), at most max_timeout_seconds; a longer
    # document is refused at submit (page_limit).
    timeout_seconds_per_page: Float | None = Field(default=None, gt=0, le=MAX_TIMEOUT_SECONDS)
    max_timeout_seconds: Int | None = Field(default=None, ge=1, le=MAX_TIMEOUT_SECONDS)
    memory_limit_mb: Int = Field(ge=16, le=MAX_MEMORY_MB)
    # Processes *and threads* of the job's child (RLIMIT_NPROC under its own uid):
    # raise it for a thread-hungry tool (LibreOffice, onnxruntime).
    max_processes: Int = Field(default=DEFAULT_MAX_PROCESSES, ge=1, le=4096)
    # The largest file a job may write (RLIMIT_FSIZE; 10 GB by default).
    max_output_bytes: Int = Field(default=DEFAULT_MAX_OUTPUT_BYTES, ge=1024, le=MAX_BYTES)
    max_input_bytes: Int = Field(ge=1, le=MAX_BYTES)
    max_attempts: Int = Field(ge=1, le=100)
    default_priority: Int = Field(ge=1, le=10)
    params: dict[str, Any] = Field(default_factory=dict)
    accepts: list[Str] = Field(default_factory=lambda: [ANY], min_length=1)
    limits: InputLimits = Field(default_factory=InputLimits)  # see _STRICT_LIMITS
    # Credits per unit of work the step reports (ocr: escalation = a page re-read by
    # the next engine of the chain); units without a price cost nothing.
    unit_costs: dict[str, Float] = Field(default_factory=dict)

    @field_validator("unit_costs")
    @classmethod
    def _unit_costs(cls, value: dict[str, float]) -> dict[str, float]:
        for unit, cost in value.items():
            if not _UNIT.fullmatch(unit):
                raise ValueError(f"{unit!r} is not a unit name (a-z, 0-9, _)")
            if not 0 <= cost < MAX_COST:
                raise ValueError(f"the cost of {unit} must be 0 or more, got {cost}")
        return value

    @field_validator("accepts")
    @classmethod
    def _known_kinds(cls, value: list[str]) -> list[str]:
        for entry in value:
            if entry != ANY and entry not in KINDS and not _MIME.fullmatch(entry):
                raise ValueError(
                    f"{entry!r} is neither a kind ({', '.join(sorted(KINDS))}),"
                    " a mime type nor 'any'"
                )
        return value

    @property
    def base_cost_millicredits(self) -> int:
        return round(self.base_cost * MILLI)

    @property
    def cost_per_mb_millicredits(self) -> int:
        return round(self.cost_per_mb * MILLI)

    @property
    def unit_costs_millicredits(self) -> dict[str, int]:
        return {unit: round(cost * MILLI) for unit, cost in self.unit_costs.items()}


def parse_profiles(
    data: Mapping[str, Any], queues: Iterable[str], source: str
) -> dict[str, Profile]:
    """Validate a ``{"profiles": {...}}`` mapping; errors name ``profiles.<op>.<key>``.

    Strictly: TOML has integers, floats and booleans of its own, so ``"30"`` for 30 or
    ``true`` for 1 is a mistake to name, not a value to convert."""
    known_queues = set(queues)
    extra = set(data) - {"profiles"}
    if extra:
        name = sorted(extra)[0]
        raise ConfigError(
            f"{source}: {name}", unknown_key(name, ["profiles"], "unknown top-level key")
        )
    raw = data.get("profiles")
    if not isinstance(raw, Mapping) or not raw:
        raise ConfigError(f"{source}: profiles", "expected at least one [profiles.<operation>]")
    profiles: dict[str, Profile] = {}
    for operation, body in raw.items():
        key = f"{source}: profiles.{operation}"
        if not isinstance(body, Mapping):
            raise ConfigError(key, "expected a table")
        try:
            if isinstance(body.get("limits"), Mapping):
                _STRICT_LIMITS.model_validate(body["limits"])
            profile = Profile.model_validate({**body, "operation": operation})
        except ValidationError as exc:
            first = chosen_error(exc)
            loc = ".".join(str(p) for p in first["loc"])
            model = _STRICT_LIMITS if exc.title == "limits" else Profile
            if model is _STRICT_LIMITS:
                loc = f"limits.{loc}"
            msg = unknown_key_problem(exc, first, model) if is_unknown_key(first) else first["msg"]
            raise ConfigError(f"{key}.{loc}", msg) from exc
        if profile.queue not in known_queues:
            raise ConfigError(
                f"{key}.queue",
                f"unknown queue {profile.queue!r}; expected one of {sorted(known_queues)}",
            )
        try:
            registry.check_profile(operation, profile.params)
        except registry.PipelineError as exc:  # every submit would be refused for it
            raise ConfigError(f"{key}.params", exc.message) from None
        bounded = registry.bounded_units(operation)
        priced = [unit for unit, cost in profile.unit_costs.items() if cost]
        unbounded = sorted(set(priced) - (bounded or set()))
        if bounded is not None and unbounded:
            raise ConfigError(
                f"{key}.unit_costs.{unbounded[0]}",
                f"the {operation} step declares no bound for {unbounded[0]!r}: a submit could"
                " not reserve what it may cost, and a balance could go below zero; it bounds"
                f" {', '.join(sorted(bounded)) or 'no unit'}",
            )
        _check_page_timeouts(key, profile, bounded)
        profiles[operation] = profile
    return profiles


def _check_page_timeouts(key: str, profile: Profile, bounded: frozenset[str] | None) -> None:
    """``timeout_seconds_per_page`` and ``max_timeout_seconds`` come together, the cap
    leaves time for a page, and the step bounds the pages it reads (a submit counts
    them with that bound)."""
    per_page, cap = profile.timeout_seconds_per_page, profile.max_timeout_seconds
    if per_page is None and cap is None:
        return
    if per_page is None or cap is None:
        given, missing = (
            ("timeout_seconds_per_page", "max_timeout_seconds")
            if cap is None
            else ("max_timeout_seconds", "timeout_seconds_per_page")
        )
        raise ConfigError(f"{key}.{missing}", f"expected beside {given}")
    if cap < profile.timeout_seconds + per_page:
        raise ConfigError(
            f"{key}.max_timeout_seconds",
            f"{cap} leaves no time for a page: timeout_seconds ({profile.timeout_seconds})"
            f" + timeout_seconds_per_page ({per_page:g}) is more",
        )
    if bounded is not None and "page" not in bounded:
        raise ConfigError(
            f"{key}.timeout_seconds_per_page",
            f"the {profile.operation} step declares no bound for the pages it reads:"
            " a submit could not give its job the time they need",
        )


def load_profiles(path: Path, queues: Iterable[str]) -> dict[str, Profile]:
    """Read and validate the profiles file."""
    key = "profiles_path (HYPERMEDIA_PROFILES_PATH)"
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(key, f"no file at {path}") from exc
    except OSError as exc:
        raise ConfigError(key, f"{path} cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}", f"not UTF-8 text (byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}", f"not valid TOML: {exc}") from exc
    return parse_profiles(data, queues, str(path))
