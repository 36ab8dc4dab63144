"""The long-running services a machine runs in the foreground (for systemd or a
container): the API (``serve``) and a worker node of an existing cluster (``worker``)."""

from __future__ import annotations

import os
import re
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from hypermedia.cli.common import note, read_settings, say
from hypermedia.errors import ConfigError, HypermediaError

if TYPE_CHECKING:
    from hypermedia.config import Settings


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
    reconciler until interrupted. It accepts the operations of the queues that
    scheduler.json gives a worker (a baseline, or bursts) and of those a live worker
    serves (a node that joined with `hypermedia worker --queue`)."""
    from autoscaler import config

    settings = read_settings(api_host=host, api_port=port)
    # Read now: a bad file, or one naming a queue the settings lack, stops the start,
    # before the server's modules are imported (FastAPI, the stack: ~0.7 CPU-s).
    scheduler = config.load(scheduler_config, settings.queue_names)

    from autoscaler.head import staffed_queues
    from autoscaler.page.routes import install
    from hypermedia.server import serve as run

    run(
        settings,
        host=settings.api_host,
        port=settings.api_port,
        access_log=access_log,
        extend=partial(install, config=scheduler),
        queues=partial(staffed_queues, scheduler),
    )


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
    num_cpus: Annotated[
        int, typer.Option("--num-cpus", envvar="HYPERMEDIA_WORKER_CPUS", min=1)
    ] = 2,
    wait: Annotated[
        float,
        typer.Option(
            "--wait",
            envvar="HYPERMEDIA_WORKER_WAIT",
            min=1,
            help="Seconds to wait for the head to answer before giving up.",
        ),
    ] = 60.0,
) -> None:
    """Join this machine to an existing cluster as a worker node for some queues.

    Runs in the foreground (for systemd or a container); the head's supervisor
    places pipeline actors here through the queue resources it advertises.
    """
    import signal
    import threading

    from hypermedia.worker import cluster

    counts = parse_worker_queues(queues)
    check_head_address(address)
    check_token_file(token_file)
    settings = read_settings()
    check_worker_cpus(settings, counts, num_cpus)
    check_worker_schema(settings)
    note(f"waiting for the head at {address} (up to {wait:g} s)")
    cluster.wait_for_head(address, wait)
    note(f"joining the cluster at {address} (`ray start`)")
    node = cluster.start_worker_node(
        settings.data_dir / "ray",
        address,
        token_file,
        name=f"worker-{os.getpid()}",
        resources=cluster.queue_resources(counts),
        num_cpus=num_cpus,
    )
    say(f"joined {address} for {counts}")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        while not stop.wait(5):
            if not node.is_running():
                raise HypermediaError("the Ray node stopped")
    finally:
        node.stop()


_QUEUES_KEY = "--queue (HYPERMEDIA_WORKER_QUEUES)"
_HEAD_ADDRESS = re.compile(r"^([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]):([0-9]{1,5})$")


def parse_worker_queues(specs: list[str]) -> dict[str, int]:
    """``--queue name[=actors]`` (repeatable; the environment twin takes them separated
    by spaces): actors per queue, each at least 1."""
    counts: dict[str, int] = {}
    for spec in (part for given in specs for part in given.split()):
        name, equals, count = spec.partition("=")
        if not name:
            raise ConfigError(_QUEUES_KEY, f"{spec!r}: expected name or name=actors")
        if not equals:
            counts[name] = 1
            continue
        if not count.isdigit() or int(count) < 1:
            raise ConfigError(
                _QUEUES_KEY, f"{spec!r}: the actors of a queue are a whole number, at least 1"
            )
        counts[name] = int(count)
    if not counts:
        raise ConfigError(_QUEUES_KEY, "expected at least one queue")
    return counts


def check_head_address(address: str) -> None:
    """``--address``: the head's GCS as host:port."""
    found = _HEAD_ADDRESS.fullmatch(address)
    if found is None or not 1 <= int(found.group(2)) <= 65535:
        raise ConfigError(
            "--address (HYPERMEDIA_RAY_ADDRESS)",
            f"{address!r}: expected the head's host:port (e.g. 10.0.0.5:6380)",
        )


def check_token_file(path: Path) -> None:
    """``--token-file``: the cluster's token, a file this process reads and that is not
    empty (Ray answers a missing one with a traceback)."""
    key = "--token-file (HYPERMEDIA_RAY_TOKEN_FILE)"
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(key, f"no file at {path}: copy the head's token here") from None
    except IsADirectoryError:
        raise ConfigError(key, f"{path} is a directory, not the token file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            key, f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}"
        ) from None
    if not text.strip():
        raise ConfigError(key, f"{path} is empty")


def check_worker_schema(settings: Settings) -> None:
    """A node whose settings name the database (``database_url``): its schema must be
    the one this hypermedia knows, checked as ``serve`` checks it. A node left on an old
    hypermedia after a deploy joined, and each actor placed on it failed at start, on the
    head's logs only. A database this node cannot reach now is said and not refused:
    the actors connect with the head's settings, and retry."""
    if settings.database_url is None:
        return  # the usual node: its actors get the database from the head
    from hypermedia.cli.common import open_engine
    from hypermedia.errors import DatabaseUnavailable

    try:
        # ConfigError: the schema, named as serve does.
        open_engine(settings, connect_timeout=10).dispose()
    except DatabaseUnavailable as exc:
        note(f"the schema is not checked: {exc.message}")


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
