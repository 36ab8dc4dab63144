"""boto3 sessions that share one process-wide botocore data loader.

Each ``boto3.session.Session()`` reads botocore's JSON models again (the endpoint
rules, the partitions, the service's model: several megabytes for EC2) before its
first client: 50-200 ms of CPU a client, measured, in every process that builds one
(the API, each worker, each CLI command, the node provider's drivers). The loader
only reads those files and keeps what it read, so one per process serves every
session; everything else (credentials above all) stays each session's own, read again
for each one as before. boto3 is imported here only when a session is asked for.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import boto3

# One loader per data path (AWS_DATA_PATH / the profile's data_path, as botocore's own
# session would make it; None for botocore's files alone).
_loaders: dict[str | None, Any] = {}
_lock = threading.Lock()


def session() -> boto3.session.Session:
    """A new boto3 session on the process's shared data loader."""
    import boto3
    import botocore.loaders
    import botocore.session

    core = botocore.session.Session()
    data_path = core.get_config_variable("data_path")
    with _lock:
        loader = _loaders.get(data_path)
        if loader is None:
            loader = _loaders[data_path] = botocore.loaders.create_loader(data_path)
    core.register_component("data_loader", loader)
    return boto3.session.Session(botocore_session=core)
