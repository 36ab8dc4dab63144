"""What a request's strings and values may hold (hypermedia.ingest.fields)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from hypermedia.ingest.fields import (
    MAX_ENTRY_PART,
    Text,
    entry_id,
    file_name_problem,
    idempotency_key_problem,
    json_problem,
    text_problem,
    undecodable_query,
)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("", None),
        ("cat.png", None),
        ("é ✓ 🐱", None),
        ("\t\n", None),
        ("a\x00b", "must not contain NUL characters"),
        ("\x00", "must not contain NUL characters"),
        ("\ud800", "must not contain lone UTF-16 surrogates"),
        ("a\udfffb", "must not contain lone UTF-16 surrogates"),
    ],
)
def test_text_problem(value, problem):
    assert text_problem(value) == problem


_CONTROL = "must not contain control characters"


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("cat.png", None),
        ("é ✓ 🐱.png", None),
        ("e\u0301.png", None),  # a combining accent is a letter's, not a control
        ("../../etc/passwd", None),  # only a name: never a key nor a path
        ("..", None),
        ("CON", None),
        ("a\x00b", "must not contain NUL characters"),
        ("\ud800", "must not contain lone UTF-16 surrogates"),
        ("a\tb", f"{_CONTROL} (U+0009 at 1)"),
        ("a\r\nX: 1", f"{_CONTROL} (U+000D at 1)"),
        ("\x1b[31m", f"{_CONTROL} (U+001B at 0)"),
        ("a\x7f", f"{_CONTROL} (U+007F at 1)"),
        ("a\x9b", f"{_CONTROL} (U+009B at 1)"),
        ("image\u202egpj.exe", None),  # the corpus's sanitize:filename: kept, in no key
        ("\u05e7\u05d5\u05d1\u05e5\u200f.png", None),  # a Hebrew name and its RLM
    ],
)
def test_file_name_problem(value, problem):
    assert file_name_problem(value) == problem


_KEY_RULE = "must be 1-200 printable ASCII characters"


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("order-42", None),
        ("3f2a9c1e-7b7d-4c1a-9a51-0e6d8f7d2b10", None),
        ("a b", None),  # a space inside is kept by HTTP
        ("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", None),
        ("k" * 200, None),
        ("", f"{_KEY_RULE} (U+0020 to U+007E)"),
        ("k" * 201, f"{_KEY_RULE} (U+0020 to U+007E)"),
        ("cl\u00e9", "U+00E9 at 2 is not"),  # Latin-1: its bytes would pass as a header's
        ("cl\u00c3\u00a9", "U+00C3 at 2 is not"),  # "clé" in UTF-8, read as Latin-1
        ("\U0001f511", "U+1F511 at 0 is not"),
        ("a\tb", "U+0009 at 1 is not"),
        ("a\x7f", "U+007F at 1 is not"),
        ("a\x00", "U+0000 at 1 is not"),
        (" a", "it has a space at an end"),  # HTTP strips it from a header
        ("a ", "it has a space at an end"),
    ],
)
def test_idempotency_key_problem(value, problem):
    found = idempotency_key_problem(value)
    if problem is None:
        assert found is None
    else:
        assert found is not None and found.startswith(_KEY_RULE) and problem in found, found
        assert "Idempotency-Key header" in found


class _Named(BaseModel):
    name: Text


def test_text_is_refused_by_pydantic_naming_the_field():
    with pytest.raises(ValidationError) as caught:
        _Named(name="a\x00")
    (error,) = caught.value.errors()
    assert error["loc"] == ("name",) and "NUL" in error["msg"]


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({}, None),
        ({"thumbnail": {"width": 10, "fit": "cover", "x": [1, 2.5, None, True]}}, None),
        ({"t": {"big": 10**30}}, None),
        ({"t": {"x": float("nan")}}, "params.t.x: nan is not a JSON number"),
        ({"t": {"x": [1, float("inf")]}}, "params.t.x[1]: inf is not a JSON number"),
        ({"t": {"x": {"y": -float("inf")}}}, "params.t.x.y: -inf is not a JSON number"),
        ({"t": {"x": "a\x00"}}, "params.t.x: must not contain NUL characters"),
        ({"t": {"x": ["ok", "\ud800"]}}, "params.t.x[1]: must not contain lone UTF-16 surrogates"),
        ({"t": {"\x00": 1}}, "params.t: a key must not contain NUL characters"),
        ({"\ud800": {}}, "params: a key must not contain lone UTF-16 surrogates"),
    ],
)
def test_json_problem_names_the_first_place(value: Any, problem):
    assert json_problem(value, "params") == problem


def test_json_problem_walks_any_depth():
    deep: list[Any] = [float("nan")]
    for _ in range(5000):
        deep = [deep]
    problem = json_problem(deep, "p")
    assert problem is not None and problem.endswith("[0]: nan is not a JSON number")


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (None, True),
        ("0-0", True),
        (f"{MAX_ENTRY_PART}-{MAX_ENTRY_PART}", True),
        (f"{MAX_ENTRY_PART + 1}-0", False),
        (f"0-{MAX_ENTRY_PART + 1}", False),
        ("99999999999999999999-0", False),
    ],
)
def test_entry_id_is_within_redis_range(value, ok):
    if ok:
        assert entry_id(value) == value
    else:
        with pytest.raises(ValueError, match="at most 18446744073709551615"):
            entry_id(value)


@pytest.mark.parametrize(
    ("query", "found"),
    [
        (b"", None),
        (b"filename=a.png&pool_id=p1", None),
        (b"filename=caf%C3%A9+%F0%9F%90%B1.png", None),
        (b"filename=%25FF", None),  # an escaped '%': the text "%FF"
        (b"a=%zz&b", None),  # not an escape: kept as given, as Starlette does
        (b"filename=%FF.png", ("filename", "FF at 0")),
        (b"filename=ok&pool_id=x%C3", ("pool_id", "C3 at 1")),
        (b"filename=%E9t%E9", ("filename", "E9 at 0")),  # Latin-1
        (b"filename=%ED%A0%80", ("filename", "ED at 0")),  # an encoded surrogate
        (b"%FFname=1", ("\ufffdname", "FF at 0")),
    ],
)
def test_undecodable_query(query, found):
    problem = undecodable_query(query)
    if found is None:
        assert problem is None
    else:
        assert problem is not None and problem[0] == found[0], problem
        assert "not UTF-8" in problem[1] and found[1] in problem[1], problem
