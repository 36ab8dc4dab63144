"""The files the environment names that hold the stack's secrets, for sandboxes to hide.

The settings file (``HYPERMEDIA_CONFIG``: storage secret, database password), a node's
Ray token, the alert webhooks file (their secrets). A job's sandbox
(:mod:`hypermedia.sandbox.executor`) and the upload inspection's
(:mod:`hypermedia.ingest.inspection`) hide them wherever they are, not only under a
cover; a node's Ray processes, whose environment has none of these variables, get
their paths in :data:`SANDBOX_HIDDEN_VARIABLE` (set by
:func:`hypermedia.worker.cluster.ray_environment`).

Pure: the standard library only (the fork servers' and ``ray start``'s processes import
it without pydantic).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

SECRET_FILE_VARIABLES = (
    "HYPERMEDIA_CONFIG",
    "HYPERMEDIA_RAY_TOKEN_FILE",
    "RAY_AUTH_TOKEN_PATH",
    "HYPERMEDIA_ALERT_WEBHOOKS",
)
SANDBOX_HIDDEN_VARIABLE = "HYPERMEDIA_SANDBOX_HIDDEN"  # paths, os.pathsep-separated


def secret_files(environ: Mapping[str, str]) -> list[str]:
    """The absolute paths of the secret-holding files ``environ`` names (relative ones
    taken from this process's working directory), those of
    ``HYPERMEDIA_SANDBOX_HIDDEN`` included; each once, in order."""
    named = [environ.get(name) or "" for name in SECRET_FILE_VARIABLES]
    named += (environ.get(SANDBOX_HIDDEN_VARIABLE) or "").split(os.pathsep)
    return list(dict.fromkeys(os.path.abspath(path) for path in named if path))
