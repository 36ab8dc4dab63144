"""How the head hands its storage credentials to the grants actor: a private file.

The grants actor is the one process besides the head's own that signs storage
URLs, so it needs what the head has: the configured ``storage_secret`` (local
backend) or the ``AWS_*`` variables boto3 reads (S3). Ray offers two ways to give
an actor values, and neither keeps a secret: ``runtime_env`` is written in clear
to ``runtime_env_agent.log``, and constructor arguments live in the GCS's actor
table for the cluster's lifetime, where any process holding the cluster token (a
burst node's too) can read them. So the head writes them to a file in the data dir
(created ``0600``, never replaced in place), the actor, pinned to the head's node,
reads it while it starts, and the head deletes the file as soon as the actor
answers. The secret travels only as a path, and is at rest only for that moment.

The generated local signing secret needs no hand-off: it already lives in
``data_dir/storage.secret`` (``0600``), which the grants actor reads itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hypermedia.config import Settings
from hypermedia.errors import ConfigError

_ENVIRONMENT_PREFIX = "AWS_"


@dataclass(frozen=True)
class StorageCredentials:
    storage_secret: str | None = None
    environment: Mapping[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.storage_secret is not None or bool(self.environment)

    def apply_environment(self) -> None:
        """Put the ``AWS_*`` variables into this process's environment, where
        boto3 looks (the grants actor's process holds nothing else)."""
        os.environ.update(self.environment)


def of_head(settings: Settings, environ: Mapping[str, str]) -> StorageCredentials:
    """What the grants actor needs of the head's settings and environment."""
    secret = settings.storage_secret
    environment = (
        {k: v for k, v in environ.items() if k.startswith(_ENVIRONMENT_PREFIX)}
        if settings.storage_backend == "s3"
        else {}
    )
    return StorageCredentials(
        storage_secret=secret.get_secret_value() if secret is not None else None,
        environment=environment,
    )


def write(directory: Path, credentials: StorageCredentials) -> Path:
    """The credentials in a new file in ``directory`` (``0600``, a name of its own);
    its path."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=directory, prefix="grants-", suffix=".credentials")
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(
                {
                    "storage_secret": credentials.storage_secret,
                    "environment": dict(credentials.environment),
                },
                out,
            )
    except BaseException:
        remove(Path(name))
        raise
    return Path(name)


def read(path: Path) -> StorageCredentials:
    try:
        with path.open() as handle:
            data = json.load(handle)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            "storage credentials",
            f"the head's hand-off file {path} cannot be read ({exc}): the grants actor "
            "must run on the head's node",
        ) from exc
    return StorageCredentials(
        storage_secret=data.get("storage_secret"), environment=data.get("environment") or {}
    )


def remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
