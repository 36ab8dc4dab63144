"""The head's hand-off of storage credentials to the grants actor."""

from __future__ import annotations

import stat

import pytest

from hypermedia.config import load_settings
from hypermedia.errors import ConfigError
from hypermedia.storage import credentials

ENVIRON = {"AWS_SECRET_ACCESS_KEY": "k", "AWS_REGION": "eu-west-1", "HOME": "/root"}


def test_the_local_backend_hands_over_its_configured_secret_only(tmp_path):
    settings = load_settings(data_dir=tmp_path, storage_secret="s" * 40)
    handed = credentials.of_head(settings, ENVIRON)
    assert handed.storage_secret == "s" * 40
    assert dict(handed.environment) == {}


def test_s3_hands_over_the_aws_variables_only(tmp_path):
    settings = load_settings(data_dir=tmp_path, storage_backend="s3", s3_bucket="bucket-a")
    handed = credentials.of_head(settings, ENVIRON)
    assert handed.storage_secret is None
    assert dict(handed.environment) == {"AWS_SECRET_ACCESS_KEY": "k", "AWS_REGION": "eu-west-1"}


def test_nothing_to_hand_over_is_falsy(tmp_path):
    assert not credentials.of_head(load_settings(data_dir=tmp_path), ENVIRON)


def test_the_file_is_private_and_reads_back(tmp_path):
    handed = credentials.StorageCredentials("s" * 40, {"AWS_SECRET_ACCESS_KEY": "k"})
    first = credentials.write(tmp_path / "data", handed)
    second = credentials.write(tmp_path / "data", handed)
    assert first != second  # each head start its own file
    assert stat.S_IMODE(first.stat().st_mode) == 0o600
    assert stat.S_IMODE(first.parent.stat().st_mode) == 0o700
    assert credentials.read(first) == handed
    credentials.remove(first)
    credentials.remove(first)
    with pytest.raises(ConfigError, match="head's node"):
        credentials.read(first)
