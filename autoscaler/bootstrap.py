"""The boot script a burst node runs from its user data: join the head, serve a queue.

No SSH and no node updater: the instance starts Ray itself. The script carries only
what is public inside the cluster (the head's address, the node type, the queue
resources, the instance's own id) and *where* the node finds the cluster's Ray token:
a file ``token_command`` writes at boot (for example an ``aws ssm get-parameter`` the
instance role may call), or one the operator's own provisioning puts there. Neither
the script nor the worker image carries the token or a cloud credential;
:func:`check_free_of_secrets` is the test every driver's user data passes.

``RAY_CLOUD_INSTANCE_ID`` and ``RAY_NODE_TYPE_NAME`` on ``ray start`` are how Ray's
autoscaler v2 matches the Ray node to the instance it launched; the
``hypermedia.io/instance`` label lets the scheduler do the same from ``ray.nodes()``.

A spot instance's script also sets ``HYPERMEDIA_SPOT_WATCH`` (``aws`` or ``gcp``): the
actors on it watch for the interruption notice (:mod:`hypermedia.worker.spot`).

``HM_WORKER_IMAGE``, when the cluster yaml names one (``provider.worker_image``), is
the worker image the machine image's ``ray`` (docker/host/ray) starts Ray in, instead
of the one its ``/etc/default/hypermedia-worker`` names.

``HM_RAY_START_ARGS`` (unset on a cloud) lets the local driver add a node's address,
temp dir and ports, so the same script starts every node in the tests.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable

INSTANCE_LABEL = "hypermedia.io/instance"
DEFAULT_TOKEN_PATH = "/etc/hypermedia/ray-auth-token"  # noqa: S105 (a path, not a secret)
# An image reference as Docker takes it: [registry[:port]/]path[:tag][@digest], no blanks.
IMAGE_REFERENCE = (
    r"^[a-z0-9][a-z0-9._:/-]*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?$"
)


def user_data(
    *,
    node_id: str,
    node_type: str,
    head_address: str,
    resources: dict[str, float],
    token_path: str = DEFAULT_TOKEN_PATH,
    token_command: str | None = None,
    num_cpus: int | None = None,
    spot_watch: str | None = None,
    worker_image: str | None = None,
) -> str:
    """The shell script (cloud-init runs a ``#!`` user data as one) for one node."""
    labels = json.dumps({INSTANCE_LABEL: node_id}, sort_keys=True)
    start = [
        "ray",
        "start",
        f"--address={head_address}",
        f"--resources={json.dumps(resources, sort_keys=True)}",
        f"--labels={labels}",
        "--disable-usage-stats",
        # No log monitor (as on the head, hypermedia.worker.cluster): it streams the
        # workers' output to drivers that ask for it, and ours never do
        # (log_to_driver=False); the actors' logs stay in their files on the node.
        "--include-log-monitor=false",
    ]
    if num_cpus is not None:
        start.append(f"--num-cpus={num_cpus}")
    lines = [
        "#!/bin/sh",
        "# hypermedia burst node: joins the Ray head and serves its queue (no secrets here).",
        "set -eu",
        f"export RAY_CLOUD_INSTANCE_ID={shlex.quote(node_id)}",
        f"export RAY_NODE_TYPE_NAME={shlex.quote(node_type)}",
        "export RAY_AUTH_MODE=token",
        f"export RAY_AUTH_TOKEN_PATH={shlex.quote(token_path)}",
        "export RAY_USAGE_STATS_ENABLED=0",
    ]
    if worker_image:
        # Read by docker/host/ray: the image to start Ray in, over the machine image's.
        lines.append(f"export HM_WORKER_IMAGE={shlex.quote(worker_image)}")
    if spot_watch:
        # Read by the pipeline actors on this node (their processes inherit Ray's
        # environment): watch the metadata service for the interruption notice.
        lines.append(f"export HYPERMEDIA_SPOT_WATCH={shlex.quote(spot_watch)}")
    if token_command:
        lines += [
            'umask 077; mkdir -p "$(dirname "$RAY_AUTH_TOKEN_PATH")"',
            f'{token_command} > "$RAY_AUTH_TOKEN_PATH"',
        ]
    lines += [
        'test -s "$RAY_AUTH_TOKEN_PATH" || { echo "no Ray token at $RAY_AUTH_TOKEN_PATH" >&2;'
        " exit 1; }",
        # Unquoted on purpose: the local driver's extra arguments split into words.
        f"exec {shlex.join(start)} ${{HM_RAY_START_ARGS:-}}",
        "",
    ]
    return "\n".join(lines)


_SECRET_SHAPES = (
    re.compile(r"AKIA[0-9A-Z]{16}"),  # AWS access key id
    re.compile(r"(?i)aws_secret_access_key|aws_session_token"),
    re.compile(r"(?i)-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    re.compile(r"(?i)password\s*="),
    re.compile(r"(?i)IONOS_(PASSWORD|TOKEN)"),
)


def check_free_of_secrets(script: str, secrets: Iterable[str] = ()) -> None:
    """Raise ValueError when ``script`` holds a known secret or the shape of one."""
    for secret in secrets:
        if secret and secret in script:
            raise ValueError("the user data contains a secret value")
    for shape in _SECRET_SHAPES:
        if shape.search(script):
            raise ValueError(f"the user data contains what looks like a secret ({shape.pattern})")
