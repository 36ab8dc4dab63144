"""boto3 is loaded only when an S3 storage is built; the URL signing core does no I/O."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _loaded(code: str, **env: str) -> set[str]:
    result = subprocess.run(
        [sys.executable, "-c", f"{code}; import json, sys; print(json.dumps(sorted(sys.modules)))"],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return {name.split(".")[0] for name in json.loads(result.stdout.splitlines()[-1])}


@pytest.mark.parametrize(
    "module",
    [
        "hypermedia.storage.s3",
        "hypermedia.storage.grants",
        "hypermedia.storage.transfer",
        "hypermedia.stack",
    ],
)
def test_importing_does_not_load_boto3(module):
    loaded = _loaded(f"import {module}")
    assert not loaded & {"boto3", "botocore", "s3transfer"}


def test_building_an_s3_storage_does():
    code = "from hypermedia.storage.s3 import S3Storage; S3Storage('hm-test', region='us-east-1')"
    # Credentials of its own: building the client looks them up.
    credentials = {"AWS_ACCESS_KEY_ID": "hm-test", "AWS_SECRET_ACCESS_KEY": "hm-test-secret"}
    assert "boto3" in _loaded(code, **credentials)


def test_signing_is_pure():
    loaded = _loaded("import hypermedia.storage.signing")
    assert not loaded & {"httpx", "sqlalchemy", "redis", "socket", "boto3", "fastapi"}
