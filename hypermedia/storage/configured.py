"""The storage the settings name, for whoever holds storage credentials (the head's
stack, the grants actor, ``hypermedia status``)."""

from __future__ import annotations

from hypermedia.clock import Clock
from hypermedia.config import Settings
from hypermedia.storage.base import Storage
from hypermedia.storage.local import LocalStorage, load_or_create_secret


def build_storage(settings: Settings, clock: Clock) -> Storage:
    """The configured storage: S3 (boto3 imported only then), else the local directory
    with URLs signed by ``storage_secret`` or the secret kept in ``data_dir``."""
    if settings.storage_backend == "s3":
        from hypermedia.storage.s3 import S3Storage

        assert settings.s3_bucket is not None  # the settings refuse s3 without a bucket
        return S3Storage(
            settings.s3_bucket,
            endpoint_url=settings.s3_endpoint_url,
            region=settings.s3_region,
            prefix=settings.s3_prefix,
        )
    secret = (
        settings.storage_secret.get_secret_value()
        if settings.storage_secret is not None
        else load_or_create_secret(settings.storage_secret_path)
    )
    return LocalStorage(
        settings.storage_dir, base_url=settings.public_api_url, secret=secret, clock=clock
    )
