"""The local stack in the background: ``up`` starts ``head`` (the stack in the
foreground) as a detached process, ``down`` stops it and what a dead one left running.
The data dir holds the head's pid, its API URL and its log."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from hypermedia.cli.common import note, read_settings, say
from hypermedia.errors import HypermediaError

if TYPE_CHECKING:
    import subprocess

    from autoscaler.webhooks import Webhook
    from hypermedia.config import Settings

# The name head.log's lines have always carried (the module was hypermedia.cli).
log = logging.getLogger("hypermedia.cli")


def head(
    scheduler: Annotated[
        bool,
        typer.Option(
            "--scheduler/--no-scheduler",
            envvar="HYPERMEDIA_HEAD_SCHEDULER",
            help="Run the scheduler's loop here too, with no cloud to burst to: the alert"
            " rules and their webhooks, the queue samples of the operator page's charts.",
        ),
    ] = True,
) -> None:
    """Run the local stack in the foreground (what `up` starts in the background)."""
    import signal
    import threading
    from functools import partial

    from autoscaler import config as scheduler_config

    settings = read_settings()
    # Read before anything starts: a bad scheduler.json or webhooks file refuses here,
    # before the stack's and the page's modules are imported. The operator page shows
    # the same file's mode and caps.
    config = scheduler_config.load(None, settings.queue_names)
    hooks: list[Webhook] = []
    if scheduler:
        from autoscaler import webhooks

        hooks = webhooks.load()

    from autoscaler.page.routes import install as install_page
    from hypermedia.embedded import write_private
    from hypermedia.local import LocalStack

    local = LocalStack(
        settings, extend_app=partial(install_page, config=config), fixed_api_port=True
    )
    stop = threading.Event()
    loop: threading.Thread | None = None
    turns = None
    # `up` ends a head that does not come up in time with SIGTERM: while starting, it
    # ends like a Ctrl-C, through the `finally` that stops what was started.
    signal.signal(signal.SIGTERM, _interrupt)
    url_file = settings.data_dir / "head.url"
    try:
        local.start(progress=lambda message: log.info("%s", message))
        # After ray.init, which installs its own SIGTERM handler that would kill us
        # before the stack is stopped.
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        write_private(url_file, local.api_url)
        if scheduler and local.stack is not None:
            from autoscaler.scheduler import open_scheduler

            # No fleet: nothing bursts from here (a `ray up` head's services do that).
            turns = open_scheduler(config, local.stack, alert_webhooks=hooks)
            loop = threading.Thread(target=turns.run, args=(stop,), name="scheduler")
            loop.start()
            log.info("scheduler in %s mode, no cloud", config.mode)
        log.info("local stack up; API at %s", local.api_url)
        stop.wait()
    finally:
        stop.set()
        if loop is not None:
            loop.join(30)
        if turns is not None:
            # Its lease given up while Redis still runs: the next head leads at once.
            try:
                turns.stop()
            except Exception as exc:  # then the lease lapses by itself
                log.warning("the scheduler's lease was not given up: %s", exc)
        # A head refused the data dir (another stack runs there) owns none of its files
        # nor its Redis: stop() leaves that stack's alone.
        if local.holds_data_dir:
            url_file.unlink(missing_ok=True)
        local.stop(stop_redis=True, progress=lambda message: log.info("%s", message))


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


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

    from hypermedia.embedded import private_directory, write_private
    from hypermedia.errors import ServiceUnavailable
    from hypermedia.local import data_dir_holder, moved_api_note

    settings = read_settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    pidfile = settings.data_dir / PIDFILE
    url_file = settings.data_dir / "head.url"
    log_path = settings.data_dir / "head.log"
    running = running_head(settings.data_dir)
    if running is not None:
        if url_file.exists():
            api_url = url_file.read_text()
            say(f"already up: {api_url}")
            moved = moved_api_note(settings, api_url)
            if moved is not None:
                note(moved)
        else:
            say(f"already starting (pid {running}; log: {log_path})")
        return
    holder = data_dir_holder(settings.data_dir)
    if holder is not None:
        raise ServiceUnavailable(
            f"another local stack (pid {holder or '?'}) runs on {settings.data_dir}: end that "
            "`hypermedia run`, or use another HYPERMEDIA_DATA_DIR"
        )
    url_file.unlink(missing_ok=True)
    private_directory(settings.data_dir)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(log_fd, "ab") as log_file:
        began_at = log_file.tell()
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
        exited = proc.poll()
        if exited is not None or time.monotonic() > deadline:
            if exited is None:
                _end_process_group(proc)
                reason = f"within {wait:g} s (--wait) and was stopped"
            else:
                said = _error_line(log_path, began_at)
                reason = f"(its head exited with status {exited}{f': {said}' if said else ''})"
            pidfile.unlink(missing_ok=True)
            if data_dir_holder(settings.data_dir) is None:
                _stop_leftovers(settings)  # what a head killed while starting left
            raise HypermediaError(f"the local stack did not come up {reason}; see {log_path}")
        time.sleep(0.2)
    api_url = url_file.read_text()
    say(f"up: API at {api_url} (log: {log_path})")
    moved = moved_api_note(settings, api_url)
    if moved is not None:
        note(moved)


PIDFILE = "head.pid"
HEAD_STOP_SECONDS = 90.0  # the actors drain (30 s), then Ray's head stops


def _end_process_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the head's process group (the head stops what it started), SIGKILL it if
    still there after HEAD_STOP_SECONDS (the watchdog, in a session of its own, then
    stops what the head started)."""
    import os
    import signal
    import subprocess

    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(HEAD_STOP_SECONDS)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    with contextlib.suppress(ProcessLookupError):  # what is left of the group
        os.killpg(proc.pid, signal.SIGKILL)


def _error_line(log_path: Path, offset: int) -> str:
    """The head's own error line (``error: ...``) in what it wrote to its log, if any."""
    try:
        with log_path.open("rb") as handle:
            handle.seek(offset)
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    said = [line for line in text.splitlines() if line.startswith("error: ")]
    return said[-1].removeprefix("error: ") if said else ""


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
    pidfile = settings.data_dir / PIDFILE
    pid = running_head(settings.data_dir)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + wait
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
        pidfile.unlink(missing_ok=True)
        _stop_leftovers(settings)
        say("down")
        return
    pidfile.unlink(missing_ok=True)
    if data_dir_in_use(settings.data_dir):
        say("not running (a `hypermedia run` uses this data dir; it stops itself)")
        return
    stopped = _stop_leftovers(settings)
    if stopped:
        say(f"down: stopped what a stack that died left running ({', '.join(stopped)})")
    else:
        say("not running")


def running_head(data_dir: Path) -> int | None:
    """The pid of the data dir's head (`up`'s or a `hypermedia head`), or None. A pid is
    trusted only if its process is a head (`hypermedia ... head`): the one head.pid
    names if that process is older than the file (a pid the system gave again to
    another process after is not), or the one that holds the data dir's lock (a
    head.pid lost or never written)."""
    from hypermedia.local import data_dir_holder

    recorded = _read_pidfile(data_dir / PIDFILE)
    if recorded is not None and _is_head(*recorded):
        return recorded[0]
    holder = data_dir_holder(data_dir)
    if holder and _is_head(holder, None):
        return holder
    return None


def _read_pidfile(pidfile: Path) -> tuple[int, float] | None:
    """The pid in ``pidfile`` and when the file was written."""
    try:
        return int(pidfile.read_text()), pidfile.stat().st_mtime
    except (OSError, ValueError):
        return None


def _is_head(pid: int, started_before: float | None) -> bool:
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        if started_before is not None and proc.create_time() > started_before + 1:
            return False  # the pid was given again, after the file was written
        args = proc.cmdline()
    except psutil.Error:
        return False
    # `python -m hypermedia.cli ... head` (up's) or `.../bin/hypermedia ... head`.
    ours = "hypermedia.cli" in args or any(Path(arg).name == "hypermedia" for arg in args[:2])
    return ours and "head" in args[1:]


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
