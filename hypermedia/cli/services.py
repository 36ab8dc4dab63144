"""The long-running services a machine runs in the foreground (for systemd or a
container): the API (``serve``) and a worker node of an existing cluster (``worker``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from hypermedia.cli.common import read_settings
from hypermedia.errors import ConfigError, HypermediaError

if TYPE_CHECKING:
    from hypermedia.config import Settings

if TYPE_CHECKING:
    from fastapi import FastAPI


def serve(
    host: Annotated[
        str | None,
        typer.Option(
            "--host", envvar="HYPERMEDIA_API_HOST", help="Bind address (default: 127.0.0.1)."
        ),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(
            "--port", envvar="HYPERMEDIA_API_PORT", min=1, max=65535, help="Port (default: 8080)."
        ),
    ] = None,
    access_log: Annotated[
        bool, typer.Option("--access-log/--no-access-log", envvar="HYPERMEDIA_ACCESS_LOG")
    ] = True,
    scheduler_config: Annotated[
        Path | None,
        typer.Option(
            "--scheduler-config",
            envvar="HYPERMEDIA_SCHEDULER_CONFIG",
            help="scheduler.json, for the operator page's mode and caps (default:"
            " /etc/hypermedia/scheduler.json, else the shipped vps_only defaults).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run the HTTP API (and the operator page at /operator), the reaper and the
    reconciler until interrupted."""
    from hypermedia.server import serve as run

    settings = read_settings(api_host=host, api_port=port)
    run(
        settings,
        host=settings.api_host,
        port=settings.api_port,
        access_log=access_log,
        extend=operator_page(scheduler_config),
    )


def operator_page(scheduler_config: Path | None) -> Callable[[FastAPI], None]:
    """What mounts the operator page (:mod:`autoscaler.page`) on the API's app, showing
    ``scheduler_config``'s mode and caps (read now: a bad file stops the start)."""
    from functools import partial

    from autoscaler import config
    from autoscaler.page.routes import install

    return partial(install, config=config.load(scheduler_config))


def worker(
    address: Annotated[
        str,
        typer.Option("--address", envvar="HYPERMEDIA_RAY_ADDRESS", help="Head's GCS host:port."),
    ],
    token_file: Annotated[
        Path,
        typer.Option("--token-file", envvar="HYPERMEDIA_RAY_TOKEN_FILE", help="Cluster token."),
    ],
    queues: Annotated[
        list[str],
        typer.Option("--queue", "-q", envvar="HYPERMEDIA_WORKER_QUEUES", help="name[=actors]"),
    ],
    num_cpus: Annotated[int, typer.Option("--num-cpus", envvar="HYPERMEDIA_WORKER_CPUS")] = 2,
) -> None:
    """Join this machine to an existing cluster as a worker node for some queues.

    Runs in the foreground (for systemd or a container); the head's supervisor
    places pipeline actors here through the queue resources it advertises.
    """
    import signal
    import threading

    from hypermedia.worker import cluster

    counts: dict[str, int] = {}
    for spec in queues:
        name, _, n = spec.partition("=")
        counts[name] = int(n or 1)
    settings = read_settings()
    check_worker_cpus(settings, counts, num_cpus)
    node = cluster.start_worker_node(
        settings.data_dir / "ray",
        address,
        token_file,
        name=f"worker-{os.getpid()}",
        resources=cluster.queue_resources(counts),
        num_cpus=num_cpus,
    )
    typer.echo(f"joined {address} for {counts}")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        while not stop.wait(5):
            if not node.is_running():
                raise HypermediaError("the Ray node stopped")
    finally:
        node.stop()


def check_worker_cpus(settings: Settings, counts: dict[str, int], num_cpus: int) -> None:
    """A node must have the CPUs its actors reserve (``queues.<name>.cpus`` each), or
    Ray would leave the last of them unplaced: refuse, naming the keys."""
    unknown = sorted(set(counts) - set(settings.queue_names))
    if unknown:
        raise ConfigError(
            "--queue (HYPERMEDIA_WORKER_QUEUES)",
            f"{unknown[0]!r} is not a queue ({', '.join(settings.queue_names)})",
        )
    needed = settings.pool_cpus(counts)
    if needed > num_cpus:
        shares = ", ".join(
            f"{n} x {settings.queues[q].cpus:g} for {q}" for q, n in sorted(counts.items())
        )
        raise ConfigError(
            "--num-cpus (HYPERMEDIA_WORKER_CPUS)",
            f"{num_cpus} is fewer than the {needed:g} CPUs the actors reserve ({shares}): "
            "raise it, or lower HYPERMEDIA_QUEUES__<NAME>__CPUS",
        )
