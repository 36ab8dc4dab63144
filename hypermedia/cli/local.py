"""The local stack in the background: ``up`` starts ``head`` (the stack in the
foreground) as a detached process, ``down`` stops it and what a dead one left running.
The data dir holds the head's pid, its API URL and its log."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from hypermedia.cli.common import read_settings
from hypermedia.errors import HypermediaError

if TYPE_CHECKING:
    from hypermedia.config import Settings

# The name head.log's lines have always carried (the module was hypermedia.cli).
log = logging.getLogger("hypermedia.cli")


def head() -> None:
    """Run the local stack in the foreground (what `up` starts in the background)."""
    import signal
    import threading

    from hypermedia.cli.services import operator_page
    from hypermedia.embedded import write_private
    from hypermedia.local import LocalStack

    settings = read_settings()
    local = LocalStack(settings, extend_app=operator_page(None))
    stop = threading.Event()
    try:
        local.start(progress=lambda message: log.info("%s", message))
        # After ray.init, which installs its own SIGTERM handler that would kill us
        # before the stack is stopped.
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        write_private(settings.data_dir / "head.url", local.api_url)
        log.info("local stack up; API at %s", local.api_url)
        stop.wait()
    finally:
        local.stop(stop_redis=True, progress=lambda message: log.info("%s", message))
        (settings.data_dir / "head.url").unlink(missing_ok=True)


def up(
    wait: Annotated[
        float,
        typer.Option(
            "--wait",
            envvar="HYPERMEDIA_UP_WAIT",
            min=1,
            help="Seconds (a loaded machine may need three tries of `ray start`).",
        ),
    ] = 300.0,
) -> None:
    """Start the local stack in the background (Redis, Ray head, API, actors)."""
    import os
    import subprocess

    settings = read_settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    pidfile = settings.data_dir / "head.pid"
    url_file = settings.data_dir / "head.url"
    if _alive(pidfile):
        typer.echo(f"already up: {url_file.read_text() if url_file.exists() else '?'}")
        return
    url_file.unlink(missing_ok=True)
    from hypermedia.embedded import private_directory, write_private

    private_directory(settings.data_dir)
    log_path = settings.data_dir / "head.log"
    log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(log_fd, "ab") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hypermedia.cli", "--log-level", "info", "head"],
            stdout=log_file,
            stderr=log_file,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=os.environ.copy(),
        )
    write_private(pidfile, str(proc.pid))
    deadline = time.monotonic() + wait
    while not url_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            pidfile.unlink(missing_ok=True)
            raise HypermediaError(f"the local stack did not come up; see {log_path}")
        time.sleep(0.2)
    typer.echo(f"up: API at {url_file.read_text()} (log: {log_path})")


def down(
    wait: Annotated[
        float, typer.Option("--wait", envvar="HYPERMEDIA_DOWN_WAIT", min=1, help="Seconds.")
    ] = 90.0,
) -> None:
    """Stop the local stack that `up` started, and whatever a stack of this data dir
    that died without stopping left running (its Ray head, its Redis)."""
    import os
    import signal

    from hypermedia.local import data_dir_in_use

    settings = read_settings()
    pidfile = settings.data_dir / "head.pid"
    if _alive(pidfile):
        pid = int(pidfile.read_text())
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + wait
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
        pidfile.unlink(missing_ok=True)
        _stop_leftovers(settings)
        typer.echo("down")
        return
    pidfile.unlink(missing_ok=True)
    if data_dir_in_use(settings.data_dir):
        typer.echo("not running (a `hypermedia run` uses this data dir; it stops itself)")
        return
    stopped = _stop_leftovers(settings)
    if stopped:
        typer.echo(f"down: stopped what a stack that died left running ({', '.join(stopped)})")
    else:
        typer.echo("not running")


def _stop_leftovers(settings: Settings) -> list[str]:
    """Stop the Ray head and the embedded Redis of the data dir, if they still run."""
    from hypermedia.embedded import find_running
    from hypermedia.worker.cluster import RayNode, short_temp_dir

    stopped = []
    node = RayNode(short_temp_dir(settings.data_dir / "ray", "head"), Path("-"))
    if node.is_running():
        stopped.append(f"the Ray head, {node.stop()} processes")
    redis = find_running(settings.data_dir / "redis")
    if redis is not None:
        redis.stop()
        stopped.append("redis")
    return stopped


def _pid_alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _alive(pidfile: Path) -> bool:
    try:
        return _pid_alive(int(pidfile.read_text()))
    except (OSError, ValueError):
        return False
