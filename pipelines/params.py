"""The checks every pipeline's parameters share: no unknown key, integers in range.

A bad value is ``PipelineError("invalid_params", ...)`` naming the key; a missing or
``null`` value takes the default. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from pipelines.registry import PipelineError, UnsetParameters


def reject_unknown(operation: str, params: Mapping[str, Any], allowed: Collection[str]) -> None:
    """Refuse a key ``operation`` does not take, naming it and those it does."""
    unknown = sorted(str(key) for key in params if key not in allowed)
    if unknown:
        raise PipelineError(
            "invalid_params",
            f"{operation}: unknown parameter(s) {', '.join(unknown)}"
            f" (allowed: {', '.join(allowed)})",
        )


def integer(params: Mapping[str, Any], key: str, low: int, high: int, default: int | None) -> int:
    """``params[key]``, an integer in ``low..high``; ``default`` when it is missing or
    null (None: it is required)."""
    value = params.get(key)
    if value is None:
        if default is None:
            raise UnsetParameters(f"missing parameter {key}")
        return default
    # bool is an int subclass: width=True is a mistake, not 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise PipelineError("invalid_params", f"{key} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise PipelineError("invalid_params", f"{key} must be in {low}..{high}, got {value}")
    return value
