"""The head's services on a ``ray up`` cluster: API, pipeline actors, maintenance, scheduler.

``ray up ray_cluster/cluster.yaml`` runs the yaml's ``head_start_ray_commands`` on this
machine (the provider's :class:`~autoscaler.provider.LocalCommandRunner`): ``ray start
--head`` with the autoscaling config (through ``python -m autoscaler.head ray-start``,
which starts it again when Ray gave up waiting for its raylet on a loaded machine), then
``python -m autoscaler.head start``, which
starts :func:`run` in the background and waits until the API answers. ``ray down``
runs ``ray stop`` on the head, which here means ``python -m autoscaler.head stop``:
the services stop (the actors finish or hand back their jobs) and then this cluster's
Ray head processes, found by their temp dir; Ray's other clusters on the host are
left alone.

:func:`run` attaches the local stack (:mod:`hypermedia.local`) to the cluster
(``HYPERMEDIA_RAY_ADDRESS``) with the VPS's pipeline actors per queue
(:func:`autoscaler.placement.vps_pools`: the baseline in ``vps_only`` and ``hybrid``;
in ``cloud_first`` at most one of a cloud-enabled queue, the rest of its baseline
launched on the cloud by the scheduler), once it has checked that the head's Ray node
advertises exactly those ``queue_<name>`` slots, and runs the
scheduler with the :class:`~autoscaler.rayfleet.RayFleet` over the same node
provider that Ray's monitor uses (built from ``~/ray_bootstrap_config.yaml``); the API
serves the operator page (:mod:`autoscaler.page`) with that provider's ``scheduler.json``
and accepts the operations of the queues that have or can get a worker
(:func:`staffed_queues`).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from autoscaler.config import SchedulerConfig
    from hypermedia.local import StaffedQueues

log = logging.getLogger(__name__)

START_TIMEOUT_SECONDS = 240.0
STOP_TIMEOUT_SECONDS = 120.0
BOOTSTRAP = "~/ray_bootstrap_config.yaml"


def state_dir() -> Path:
    value = os.environ.get("HM_STATE_DIR")
    if not value:
        raise SystemExit(
            "HM_STATE_DIR is not set: run this through `ray up` (the provider sets it)"
        )
    return Path(value)


def _pid(path: Path) -> int | None:
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if psutil.pid_exists(pid) else None


def staffed_queues(config: SchedulerConfig, engine: Engine) -> StaffedQueues:
    """The queues a head's ingest accepts operations of: those ``config`` gives a
    worker (:func:`autoscaler.admission.staffed`), and any with a live worker."""
    from autoscaler.admission import staffed
    from hypermedia.local import StaffedQueues

    return StaffedQueues(engine, staffed(config), config.queues)


def check_head_slots(address: str, pools: Mapping[str, int], mode: str) -> None:
    """Stop (naming both) unless the head's Ray node advertises one ``queue_<name>`` per
    actor of ``pools``: with a slot more, Ray would place a cloud worker's actor on the
    VPS (and launch nothing); with one less, a VPS actor would wait for a burst node.
    Both come from scheduler.json when ``ray up`` starts the head
    (:func:`autoscaler.provider.head_resources`); the file edited since then is the
    way they differ."""
    from autoscaler import raynodes
    from hypermedia.worker.cluster import queue_resources

    heads = [n for n in raynodes.nodes(address) if n.alive and n.head]
    if not heads:
        raise SystemExit(f"no live Ray head at {address}")
    have = {k: v for k, v in heads[0].resources.items() if k.startswith("queue_")}
    wanted = queue_resources(pools)
    if have != wanted:
        raise SystemExit(
            f"the head's Ray node advertises {have or 'no queue resources'}, but"
            f" scheduler.json (mode {mode}) puts {wanted or 'no actors'} on the VPS:"
            " `ray up` again (it restarts the head from the file)"
        )


def run() -> None:
    """The services, in the foreground, until SIGTERM."""
    import yaml

    from autoscaler.config import check_queues, chosen_path
    from autoscaler.page.routes import install as install_page
    from autoscaler.placement import vps_pools
    from autoscaler.provider import HypermediaNodeProvider
    from autoscaler.rayfleet import RayFleet
    from autoscaler.scheduler import open_scheduler
    from hypermedia.config import load_settings
    from hypermedia.embedded import write_private
    from hypermedia.local import LocalStack
    from hypermedia.metrics import targets

    directory = state_dir()
    bootstrap = yaml.safe_load(Path(BOOTSTRAP).expanduser().read_text())
    provider = HypermediaNodeProvider(bootstrap["provider"], bootstrap["cluster_name"])
    config = provider.config
    settings = load_settings(ray_address=provider.head_address)
    check_queues(config, settings.queue_names, str(chosen_path(provider.settings.scheduler_config)))
    pools = {name: count for name, count in vps_pools(config).items() if count}
    check_head_slots(provider.head_address, pools, config.mode)
    local = LocalStack(
        settings,
        extend_app=partial(install_page, config=config),
        cluster_queues=partial(staffed_queues, config),
        # On api_port (8080 unless set), as `hypermedia up`'s and `serve`'s: the web tier
        # finds the API at the same address after `ray up` restarts the head.
        fixed_api_port=True,
    )
    stop = threading.Event()
    thread: threading.Thread | None = None
    scheduler = None
    try:
        local.start(pools=pools, progress=lambda message: log.info("%s", message))
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        assert local.stack is not None and local.supervisor is not None
        fleet = RayFleet(config, provider, local.supervisor, local.stack.engine)
        scheduler = open_scheduler(config, local.stack, fleet)
        thread = threading.Thread(target=scheduler.run, args=(stop,), name="scheduler")
        thread.start()
        # Whole or not at all: `start` reads it as soon as it exists.
        write_private(directory / "head.url", local.api_url)
        write_private(settings.data_dir / "head.url", local.api_url)
        temp_dir = os.environ.get("HM_HEAD_TEMP_DIR")
        if temp_dir:  # where Prometheus finds the Ray nodes (etc/prometheus/)
            targets.link_ray(settings.data_dir, Path(temp_dir))
        log.info(
            "cluster head services up: API at %s, scheduler in %s mode", local.api_url, config.mode
        )
        stop.wait()
    finally:
        stop.set()
        if thread is not None:
            thread.join(30)
        if scheduler is not None:
            scheduler.stop()
        local.stop(stop_redis=True)
        (directory / "head.url").unlink(missing_ok=True)
        (settings.data_dir / "head.url").unlink(missing_ok=True)


def start() -> int:
    """Start :func:`run` in the background; 0 once the API answers."""
    directory = state_dir()
    pidfile, url = directory / "head.pid", directory / "head.url"
    if _pid(pidfile) is not None and url.exists():
        print(f"head services already up: {url.read_text()}")
        return 0
    url.unlink(missing_ok=True)
    log_path = directory / "head.log"
    with log_path.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "autoscaler.head", "run"],
            stdout=out,
            stderr=out,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    pidfile.write_text(str(proc.pid))
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while not url.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
            print(f"the head services did not come up (log {log_path}):\n{tail}", file=sys.stderr)
            return 1
        time.sleep(0.3)
    print(f"head services up: API at {url.read_text()} (log {log_path})")
    return 0


def stop() -> int:
    """Stop the services, then this cluster's Ray head (by its temp dir)."""
    from hypermedia.worker.cluster import RayNode

    directory = state_dir()
    pid = _pid(directory / "head.pid")
    if pid is not None:
        proc = psutil.Process(pid)
        proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT_SECONDS)
        except psutil.TimeoutExpired:
            proc.kill()
        print("head services stopped")
    (directory / "head.pid").unlink(missing_ok=True)
    temp_dir = os.environ.get("HM_HEAD_TEMP_DIR")
    if temp_dir:
        RayNode(temp_dir=Path(temp_dir), token_path=Path("/dev/null")).stop()
        print("ray head stopped")
    return 0


def ray_start(args: list[str]) -> int:
    """``ray start`` with ``args``, through :func:`~hypermedia.worker.cluster.start_with_retries`
    (tried again when Ray gave up waiting for its raylet on a loaded machine, after what
    the failed try started, found by ``HM_HEAD_TEMP_DIR``, is stopped); its output and
    exit status are ``ray start``'s. The ``ray start`` of
    :mod:`hypermedia.worker.ray_start`, as every head of ours: no Ray client server
    (nothing of ours speaks ``ray://``), no dashboard process when the yaml leaves the
    dashboard off, none of Ray's other commands imported."""
    from hypermedia.worker.cluster import ray_start_command, start_with_retries

    temp_dir = os.environ.get("HM_HEAD_TEMP_DIR")
    if not temp_dir:
        print(
            "ray-start: HM_HEAD_TEMP_DIR is not set (the provider's runner sets it)",
            file=sys.stderr,
        )
        return 2
    result = start_with_retries(
        [*ray_start_command(), "start", *args], Path(temp_dir), Path("/dev/null"), timeout=None
    )
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    return result.returncode


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["ray-start"]:  # the rest is ray's: not parsed here
        from hypermedia import logs

        logs.configure_from_environment()
        return ray_start(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m autoscaler.head")
    parser.add_argument("command", choices=("run", "start", "stop"))
    args = parser.parse_args(argv)
    from hypermedia import logs

    logs.configure_from_environment()
    if args.command == "run":
        run()
        return 0
    return start() if args.command == "start" else stop()


if __name__ == "__main__":
    raise SystemExit(main())
