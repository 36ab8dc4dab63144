"""Profiles' ``accepts`` and ``limits``: validated when loaded, stated for every shipped
operation, and the image operations accept exactly what the image pipeline decodes."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from hypermedia.errors import ConfigError
from hypermedia.profiles import load_profiles, parse_profiles
from hypermedia.sandbox.inspect import InputLimits
from pipelines.formats.signatures import IMAGE_MIMES

REPO = Path(__file__).resolve().parents[2]
PROFILES = REPO / "etc" / "profiles.toml"
QUEUES = ["images", "documents", "ocr", "media", "bulk"]
BASE: dict[str, Any] = {
    "queue": "images",
    "version": 1,
    "base_cost": 0.1,
    "cost_per_mb": 0.0,
    "timeout_seconds": 10,
    "memory_limit_mb": 64,
    "max_input_bytes": 1000,
    "max_attempts": 1,
    "default_priority": 1,
}


def test_every_shipped_profile_says_what_it_accepts():
    raw = tomllib.loads(PROFILES.read_text())["profiles"]
    assert all("accepts" in body for body in raw.values()), [
        op for op, body in raw.items() if "accepts" not in body
    ]


def test_image_operations_accept_what_the_image_pipeline_decodes():
    from pipelines.images import SUPPORTED

    decodable = {IMAGE_MIMES[kind] for kind in SUPPORTED}
    profiles = load_profiles(PROFILES, QUEUES)
    for operation in ("thumbnail", "resize", "compress", "convert"):
        assert set(profiles[operation].accepts) == decodable, operation


def test_shipped_limits():
    profiles = load_profiles(PROFILES, QUEUES)
    assert profiles["thumbnail"].limits == InputLimits(
        max_pixels=100_000_000, max_source_pixels=400_000_000, jpeg_shrink_on_load=True
    )
    assert profiles["regenerate"].accepts == ["any"]
    # 500 pages: 300 s + 12 s a page is 6,300 s, within its cap of 7,200 s.
    ocr = profiles["ocr"]
    assert ocr.limits.max_pages == ocr.params["max_pages"] == 500
    assert (ocr.timeout_seconds, ocr.timeout_seconds_per_page, ocr.max_timeout_seconds) == (
        300,
        12,
        7200,
    )
    assert ocr.timeout_seconds + 12 * 500 <= 7200
    assert profiles["transcode_video"].limits.max_duration_seconds == 7200


def test_accepts_defaults_to_any_and_limits_to_the_defaults():
    profile = parse_profiles({"profiles": {"op": BASE}}, QUEUES, "f")["op"]
    assert profile.accepts == ["any"] and profile.limits == InputLimits()


@pytest.mark.parametrize(
    ("extra", "key", "problem"),
    [
        ({"accepts": ["imgae"]}, "profiles.op.accepts", "neither a kind"),
        ({"accepts": []}, "profiles.op.accepts", "at least 1"),
        ({"limits": {"max_pixels": 0}}, "profiles.op.limits.max_pixels", "greater than or equal"),
        ({"limits": {"max_pixel": 5}}, "profiles.op.limits.max_pixel", "unknown key"),
        ({"limits": {"max_zip_ratio": 1}}, "profiles.op.limits.max_zip_ratio", "greater than"),
    ],
)
def test_bad_accepts_and_limits_name_the_key(extra, key, problem):
    with pytest.raises(ConfigError) as refused:
        parse_profiles({"profiles": {"op": {**BASE, **extra}}}, QUEUES, "f")
    assert refused.value.key == f"f: {key}"
    assert problem in refused.value.message


def test_limits_round_trip_through_a_profile_row():
    limits = InputLimits(max_pixels=5, jpeg_shrink_on_load=True)
    assert limits.to_dict() == {"max_pixels": 5, "jpeg_shrink_on_load": True}
    assert InputLimits.from_dict(limits.to_dict()) == limits
