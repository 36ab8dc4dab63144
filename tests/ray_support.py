"""A real local Ray cluster, the API (for signed blob URLs) and the supervisor, for
worker tests.

The Ray head is shared by every process of a test session (each xdist worker is a
driver of its own on it), because starting one costs ~10 s and ~20 CPU-seconds and an
idle one ~5 % of a core: started by the first test that needs it, in the directory the
session's first process made (``SHARED_RAY_DIR_ENV``, under a lock), and stopped when
the session ends (``conftest.stop_shared_head``, in that first process). A session
killed before its end leaves its head running; the next session stops it
(``conftest.stop_leftover_heads``).
Nothing a test starts outlives it: the supervisor, its actors and the grants actor
are stopped at its teardown, and any actor this process's driver made that is still
alive then is killed (never another worker's). Tests that kill or restart Ray itself
start their own nodes (test_ray_node, the e2e tests)."""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from hypermedia.config import Settings
from hypermedia.embedded import listening_socket
from hypermedia.ingest.api import create_app
from hypermedia.server import Maintenance
from hypermedia.stack import Stack
from hypermedia.worker import cluster
from hypermedia.worker.supervisor import NAMESPACE, Supervisor, settings_for_actors
from tests import cpu_report, slow_machine
from tests.api_support import running_server
from tests.conftest import RAY_TOKEN, SHARED_RAY_DIR_ENV
from tests.pipelines_for_tests import PRELOAD

REPO = Path(__file__).resolve().parents[1]
# Room for every pool a test asks for: a queue resource only places actors.
SHARED_QUEUES = ("images", "documents", "media", "ocr", "bulk")
SHARED_SLOTS = 16
# The machine's two cores; actors reserve their queue's ``cpus`` (0.5 by default), so
# four default actors fit at once, per test process (the head offers that many times
# the number of xdist workers).
SHARED_CPUS = 2

_shared: cluster.RayNode | None = None


def shared_head() -> cluster.RayNode:
    """The session's Ray head (started on first use by whichever process needs it
    first), with this process's driver connected."""
    global _shared
    if _shared is None:
        directory = Path(os.environ[SHARED_RAY_DIR_ENV])
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        with (directory / "lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one starts it, the others find it running
            _shared = cluster.start_head(
                directory,
                resources=cluster.queue_resources(
                    dict.fromkeys(SHARED_QUEUES, SHARED_SLOTS * workers)
                ),
                token_path=RAY_TOKEN,
                num_cpus=SHARED_CPUS * workers,
            )
            # HYPERMEDIA_TEST_CPU_REPORT: the head's CPU (every worker's actors) apart.
            cpu_report.adopt((p.pid for p in _shared.processes()), cpu_report.SHARED_HEAD)
    if not ray.is_initialized():
        ray.init(address=_shared.address, logging_level=logging.WARNING, log_to_driver=False)
    return _shared


def disconnect() -> None:
    """This process's driver leaves the shared head (which the session's end stops)."""
    if ray.is_initialized():
        ray.shutdown()


def kill_our_actors() -> list[str]:
    """Kill every pipeline actor this process's driver made that is still alive on the
    shared head (other workers' are theirs); their names."""
    killed = []
    job = ray.get_runtime_context().get_job_id()
    for named in ray.util.list_named_actors(all_namespaces=True):
        if named["namespace"] != NAMESPACE:
            continue
        try:
            actor = ray.get_actor(named["name"], namespace=NAMESPACE)
        except ValueError:
            continue  # gone meanwhile
        if actor._actor_id.job_id.hex() != job:
            continue
        ray.kill(actor)
        killed.append(str(named["name"]))
    return killed


def test_profiles(directory: Path) -> Path:
    """etc/profiles.toml plus the test operations, as one file."""
    path = directory / "profiles.toml"
    path.write_text(
        (REPO / "etc" / "profiles.toml").read_text()
        + "\n"
        + (REPO / "tests" / "profiles_for_tests.toml").read_text()
    )
    return path


@contextmanager
def api_server(stack: Stack, sock: socket.socket) -> Iterator[str]:
    """The stack's API served on ``sock`` (a listening socket) in a thread."""
    with running_server(create_app(stack), sock, access_log=False) as base_url:
        yield base_url


@dataclass
class RayStack:
    stack: Stack
    supervisor: Supervisor
    settings: Settings
    last_seen: str = ""

    def wait_for(
        self, predicate: Callable[[], bool], timeout: float = 60.0, what: str = "condition"
    ) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.1)
        raise AssertionError(
            f"timed out after {timeout}s waiting for {what}; last seen: {self.last_seen}"
        )


@contextmanager
def ray_stack(
    make_settings: Callable[..., Settings],
    engine: Any,
    tmp_path: Path,
    pools: dict[str, int],
    *,
    heartbeat_seconds: float = 1.0,
    **overrides: Any,
) -> Iterator[RayStack]:
    """``heartbeat_seconds``: the actors' beat, and the supervisor's sweep for workers
    whose heartbeat is stale (a test of what Ray's notice does alone sets it long)."""
    sock = listening_socket()
    settings = make_settings(
        api_url=f"http://127.0.0.1:{sock.getsockname()[1]}",
        profiles_path=test_profiles(tmp_path),
        # The corpus runs upload hundreds of files as one user: no upload rate.
        **{"user_uploads_per_minute": 10**6, **overrides},
    )
    unknown = set(pools) - set(SHARED_QUEUES)
    assert not unknown, f"the shared Ray head has no resources for {unknown}"
    needed = settings.pool_cpus(pools)
    assert needed <= SHARED_CPUS, f"{pools} reserve {needed:g} CPUs; the shared head has 2"
    stack = Stack.open(settings, engine=engine, auto_migrate=True)
    supervisor: Supervisor | None = None
    maintenance = Maintenance(stack, reaper_interval=0.5, reconcile_interval=30)
    try:
        shared_head()
        with api_server(stack, sock):
            assert settings.redis_url is not None
            supervisor = Supervisor(
                stack,
                settings_for_actors(settings, settings.redis_url),
                pools,
                preload=PRELOAD,
                heartbeat_seconds=heartbeat_seconds,
                metrics_seconds=2.0,
            )
            supervisor.start()
            # Actors start slowly on a loaded machine; said by name before the test's
            # 240 s limit cuts it (both stretched alike on a slower one).
            supervisor.wait_ready(timeout=200 * slow_machine.current_scale())
            maintenance.start()
            try:
                yield RayStack(stack, supervisor, settings)
            finally:
                maintenance.stop()
                supervisor.stop(drain_timeout=10)
    finally:
        maintenance.stop()
        if ray.is_initialized():
            kill_our_actors()  # what a failed start or stop left: not the next test's
        stack.close()
        sock.close()  # (api_server closes it; not when the start failed before it)
