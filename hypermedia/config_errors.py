"""How a refused configuration names what is wrong: one rule for every loader (the
settings, profiles.toml, scheduler.json, the cluster yaml's provider section and its
drivers' options, the alert webhooks file, the ``HYPERMEDIA_*`` environment).

An unknown key is named as the operator wrote it, with the known key it most likely
misspells: ``profiles.thumbnail.default_prority: unknown key (did you mean
default_priority?)``. A misspelt *required* key is two errors to pydantic, the key
missing and the key unknown, and it lists the missing one first: reported as such,
the operator read a complaint about a key they believe they wrote. So an unknown key
is reported before any other error (:func:`chosen_error`). Where a model allows keys
it does not know (a cloud driver's options, which the driver checks), a misspelt
required key is no unknown key to pydantic, only the missing one:
:func:`misspelt_required_key` finds it among the keys given.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any, Union, get_args, get_origin, get_type_hints

from pydantic import AfterValidator, BaseModel, SecretStr, ValidationError
from pydantic_core import ErrorDetails

UNKNOWN_KEY_TYPES = ("extra_forbidden", "unexpected_keyword_argument")


def at_least_characters(minimum: int) -> AfterValidator:
    """A secret's shortest length, refused in characters: pydantic's ``min_length`` on a
    ``SecretStr`` says "Value should have at least 32 items after validation"."""

    def check(value: SecretStr) -> SecretStr:
        length = len(value.get_secret_value())
        if length < minimum:
            raise ValueError(f"at least {minimum} characters, not {length}")
        return value

    return AfterValidator(check)


def close_key(name: str, known: Iterable[str]) -> str | None:
    """The known name ``name`` most likely misspells, if one is close enough."""
    close = difflib.get_close_matches(name, sorted(known), n=1)
    return close[0] if close else None


def unknown_key(name: str, known: Iterable[str], what: str = "unknown key") -> str:
    """``unknown key (did you mean <known>?)``, or just ``unknown key``."""
    close = close_key(name, known)
    return f"{what} (did you mean {close}?)" if close else what


def chosen_error(exc: ValidationError) -> ErrorDetails:
    """The error a refusal names: the first unknown key, else the first error."""
    errors = exc.errors()
    return next((error for error in errors if error["type"] in UNKNOWN_KEY_TYPES), errors[0])


def is_unknown_key(error: ErrorDetails) -> bool:
    return error["type"] in UNKNOWN_KEY_TYPES


def unknown_key_problem(
    exc: ValidationError, error: ErrorDetails, model: type[Any], what: str = "unknown key"
) -> str:
    """The problem with ``error``'s unknown key, suggesting a key ``model`` knows at its
    place: first one reported missing beside it (the misspelt required key), else any."""
    *parent, name = error["loc"]
    missing = [
        str(other["loc"][-1])
        for other in exc.errors()
        if other["type"] == "missing" and list(other["loc"][:-1]) == parent
    ]
    close = close_key(str(name), missing) or close_key(str(name), keys_at(model, parent))
    return f"{what} (did you mean {close}?)" if close else what


def misspelt_required_key(
    exc: ValidationError, model: type[Any]
) -> tuple[tuple[int | str, ...], str] | None:
    """A key given where ``model`` reports a required key missing, which ``model`` does
    not know there and which misspells the missing one (``tpye`` beside a missing
    ``type``): its place as written and the problem, ``unknown key (did you mean
    type?)``; None when there is no such key."""
    for error in exc.errors():
        given = error.get("input")
        if error["type"] != "missing" or not isinstance(given, Mapping):
            continue
        *parent, name = error["loc"]
        known = set(keys_at(model, parent))
        written = close_key(str(name), [str(key) for key in given if key not in known])
        if written is not None:
            return (*parent, written), f"unknown key (did you mean {name}?)"
    return None


def keys_at(model: type[Any], loc: Sequence[int | str]) -> list[str]:
    """The keys allowed at ``loc`` of ``model`` (a pydantic model or a dataclass): its
    fields, or those of the model a field, a mapping's value or a list's item is; none
    where the place cannot be followed (a union of models, a free-form mapping)."""
    annotation: Any = model
    for part in loc:
        annotation = _inside(annotation, part)
        if annotation is None:
            return []
    for candidate in _alternatives(annotation):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return list(candidate.model_fields)
        if isinstance(candidate, type) and dataclasses.is_dataclass(candidate):
            return [field.name for field in dataclasses.fields(candidate)]
    return []


def _alternatives(annotation: Any) -> list[Any]:
    """``X``, ``Annotated[X, ...]``, ``X | None``: the types a value may be."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _alternatives(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return [
            alternative
            for arg in get_args(annotation)
            if arg is not type(None)
            for alternative in _alternatives(arg)
        ]
    return [annotation]


def _inside(annotation: Any, part: int | str) -> Any:
    """The type of ``annotation``'s member ``part``, or None."""
    alternatives = _alternatives(annotation)
    if len(alternatives) != 1:
        return None  # a union's loc names the member it tried: not followed
    (kind,) = alternatives
    origin = get_origin(kind)
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        field = kind.model_fields.get(str(part))
        return None if field is None else field.annotation
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return get_type_hints(kind, include_extras=True).get(str(part))
    args = get_args(kind)
    if isinstance(origin, type) and issubclass(origin, Mapping) and len(args) == 2:
        return args[1]
    if isinstance(origin, type) and issubclass(origin, Sequence) and isinstance(part, int):
        return args[0] if args else None
    return None
