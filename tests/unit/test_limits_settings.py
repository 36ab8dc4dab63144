"""The settings and grants of issue 11's limits: typed, validated, the key named."""

from __future__ import annotations

import pytest

from hypermedia.accounts import KeyGrants
from hypermedia.config import load_settings
from hypermedia.errors import ConfigError, InvalidRequest


@pytest.mark.parametrize(
    ("overrides", "key", "problem"),
    [
        ({"max_json_body_bytes": 10}, "max_json_body_bytes", "greater than or equal to 1024"),
        ({"inspection_cpu_seconds": 0}, "inspection_cpu_seconds", "greater than or equal"),
        (
            {"inspection_cpu_seconds": 20, "inspection_wall_seconds": 5},
            "inspection_wall_seconds",
            "at least inspection_cpu_seconds (20)",
        ),
        ({"inspection_memory_mb": 64}, "inspection_memory_mb", "greater than or equal"),
        ({"key_priority_min": 0}, "key_priority_min", "greater than or equal to 1"),
        (
            {"key_priority_min": 6, "key_priority_max": 3},
            "key_priority_max",
            "at least key_priority_min (6)",
        ),
        ({"key_submits_per_minute": 0}, "key_submits_per_minute", "greater than or equal"),
        ({"user_storage_quota_bytes": "lots"}, "user_storage_quota_bytes", "integer"),
        ({"user_uploads_per_minute": -1}, "user_uploads_per_minute", "greater than or equal"),
    ],
)
def test_bad_limits_name_their_key(tmp_path, overrides, key, problem):
    with pytest.raises(ConfigError) as caught:
        load_settings(data_dir=tmp_path, **overrides)
    assert caught.value.key == f"{key} (HYPERMEDIA_{key.upper()})"
    assert problem in caught.value.message


def test_the_defaults_hold_together(tmp_path):
    settings = load_settings(data_dir=tmp_path)
    assert settings.max_json_body_bytes == 1024**2
    assert settings.inspection_wall_seconds >= settings.inspection_cpu_seconds
    assert (settings.key_priority_min, settings.key_priority_max) == (4, 10)


def test_grants_are_checked_and_resolved():
    with pytest.raises(InvalidRequest, match="empty"):
        KeyGrants(5, 2)
    with pytest.raises(InvalidRequest, match="1 to 10"):
        KeyGrants(0, 3)
    with pytest.raises(InvalidRequest, match="no limit"):
        KeyGrants(submits_per_minute=-1)
    defaults = KeyGrants(4, 10, 600)
    assert KeyGrants().resolved(defaults) == defaults
    assert KeyGrants(1, None, 0).resolved(defaults) == KeyGrants(1, 10, 0)
