"""The parameter checks every pipeline shares (pipelines.params)."""

from __future__ import annotations

from typing import Any

import pytest

from pipelines.params import integer, reject_unknown
from pipelines.registry import PipelineError


@pytest.mark.parametrize(
    ("params", "default", "expected"),
    [
        ({"n": 1}, 5, 1),
        ({"n": 10}, 5, 10),
        ({}, 5, 5),
        ({"n": None}, 5, 5),  # null is "not given"
    ],
)
def test_integer_in_range_or_the_default(params: dict[str, Any], default: int, expected: int):
    assert integer(params, "n", 1, 10, default) == expected


@pytest.mark.parametrize(
    ("params", "default", "words"),
    [
        ({"n": 0}, 5, "n must be in 1..10, got 0"),
        ({"n": 11}, 5, "n must be in 1..10, got 11"),
        ({"n": True}, 5, "n must be an integer, got True"),
        ({"n": 2.0}, 5, "n must be an integer, got 2.0"),
        ({"n": "2"}, 5, "n must be an integer, got '2'"),
        ({}, None, "missing parameter n"),
    ],
)
def test_integer_refusals_name_the_key(params: dict[str, Any], default: int | None, words: str):
    with pytest.raises(PipelineError) as caught:
        integer(params, "n", 1, 10, default)
    assert caught.value.code == "invalid_params"
    assert caught.value.message == words


def test_unknown_keys_are_named_with_the_allowed_ones():
    reject_unknown("resize", {"width": 1}, ("width", "height"))
    with pytest.raises(PipelineError) as caught:
        reject_unknown("resize", {"width": 1, "Width": 2, "colour": 3}, ("width", "height"))
    assert caught.value.code == "invalid_params"
    assert caught.value.message == (
        "resize: unknown parameter(s) Width, colour (allowed: width, height)"
    )
