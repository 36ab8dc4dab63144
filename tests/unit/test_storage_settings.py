"""Storage settings: backend choice, S3 options, the signing secret and URL lifetime."""

from __future__ import annotations

import pytest

from hypermedia.config import load_settings
from hypermedia.errors import ConfigError

SECRET = "s" * 32


def test_defaults(tmp_path):
    settings = load_settings(data_dir=tmp_path)
    assert settings.storage_backend == "local"
    assert settings.s3_bucket is None
    assert settings.s3_endpoint_url is None
    assert settings.s3_region is None
    assert settings.s3_prefix == ""
    assert settings.storage_secret is None
    assert settings.presign_ttl_seconds == 900
    assert settings.storage_secret_path == tmp_path / "storage.secret"
    assert settings.public_api_url == "http://127.0.0.1:8080"


def test_s3_from_the_environment(monkeypatch):
    monkeypatch.setenv("HYPERMEDIA_STORAGE_BACKEND", "s3")
    monkeypatch.setenv("HYPERMEDIA_S3_BUCKET", "hm-media")
    monkeypatch.setenv("HYPERMEDIA_S3_ENDPOINT_URL", "http://127.0.0.1:9000")
    monkeypatch.setenv("HYPERMEDIA_S3_REGION", "eu-central-1")
    monkeypatch.setenv("HYPERMEDIA_S3_PREFIX", "prod/hypermedia/")
    monkeypatch.setenv("HYPERMEDIA_PRESIGN_TTL_SECONDS", "600")
    settings = load_settings()
    assert settings.storage_backend == "s3"
    assert settings.s3_bucket == "hm-media"
    assert settings.s3_endpoint_url == "http://127.0.0.1:9000"
    assert settings.s3_region == "eu-central-1"
    assert settings.s3_prefix == "prod/hypermedia/"
    assert settings.presign_ttl_seconds == 600


def test_the_secret_is_not_shown(monkeypatch):
    monkeypatch.setenv("HYPERMEDIA_STORAGE_SECRET", SECRET)
    settings = load_settings()
    assert settings.storage_secret is not None
    assert settings.storage_secret.get_secret_value() == SECRET
    assert SECRET not in repr(settings)


@pytest.mark.parametrize(
    ("overrides", "key", "problem"),
    [
        ({"storage_backend": "s3"}, "s3_bucket (HYPERMEDIA_S3_BUCKET)", "required when"),
        ({"storage_backend": "gcs"}, "storage_backend (HYPERMEDIA_STORAGE_BACKEND)", "'local'"),
        (
            {"storage_backend": "s3", "s3_bucket": "Bad_Bucket"},
            "s3_bucket (HYPERMEDIA_S3_BUCKET)",
            "bucket name",
        ),
        ({"s3_bucket": "hm-media"}, "s3_bucket (HYPERMEDIA_S3_BUCKET)", "storage_backend is"),
        (
            {"s3_endpoint_url": "http://127.0.0.1:9000"},
            "s3_endpoint_url (HYPERMEDIA_S3_ENDPOINT_URL)",
            "storage_backend is",
        ),
        (
            {"storage_backend": "s3", "s3_bucket": "hm-media", "s3_endpoint_url": "minio:9000"},
            "s3_endpoint_url (HYPERMEDIA_S3_ENDPOINT_URL)",
            "http://",
        ),
        (
            {"storage_backend": "s3", "s3_bucket": "hm-media", "s3_prefix": "../up"},
            "s3_prefix (HYPERMEDIA_S3_PREFIX)",
            "key segments",
        ),
        ({"storage_secret": "short"}, "storage_secret (HYPERMEDIA_STORAGE_SECRET)", "32"),
        ({"presign_ttl_seconds": 0}, "presign_ttl_seconds (HYPERMEDIA_PRESIGN_TTL_SECONDS)", "1"),
        (
            {"presign_ttl_seconds": 7 * 24 * 3600 + 1},
            "presign_ttl_seconds (HYPERMEDIA_PRESIGN_TTL_SECONDS)",
            "604800",
        ),
    ],
)
def test_bad_storage_settings_name_the_key(overrides, key, problem):
    with pytest.raises(ConfigError) as caught:
        load_settings(**overrides)
    assert caught.value.key == key
    assert problem in str(caught.value)


def test_the_s3_bucket_error_names_the_key_from_the_environment(monkeypatch):
    monkeypatch.setenv("HYPERMEDIA_STORAGE_BACKEND", "s3")
    with pytest.raises(ConfigError, match=r"^s3_bucket \(HYPERMEDIA_S3_BUCKET\): "):
        load_settings()


@pytest.mark.parametrize(
    ("overrides", "url"),
    [
        ({"api_url": "https://media.example.com/"}, "https://media.example.com"),
        ({"api_host": "10.0.0.5", "api_port": 9000}, "http://10.0.0.5:9000"),
        ({"api_host": "::1"}, "http://[::1]:8080"),
    ],
)
def test_public_api_url(overrides, url):
    assert load_settings(**overrides).public_api_url == url
