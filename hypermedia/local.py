"""The embedded default on one machine: everything ``hypermedia run`` and
``hypermedia up`` need, started in order and stopped in reverse.

    private redis-server (unless HYPERMEDIA_REDIS_URL) -> SQLite record (unless
    HYPERMEDIA_DATABASE_URL), migrated -> Ray head on free ports, token auth (with
    its dashboard on 127.0.0.1 unless ``ray_dashboard`` is off or the caller says
    not: ``run``) -> the API (ingest + signed blob URLs for local storage, the head's
    ``/metrics``) on ``api_port`` for ``up`` (:func:`api_ports`), else a free port
    -> supervisor with one pipeline actor per queue that has pipelines -> reaper and
    reconciler

The head offers Ray as many CPUs as the machine has, or as its actors reserve
(``queues.<name>.cpus`` each) if that is more: every actor the stack starts is placed.
``<data_dir>/metrics/`` tells Prometheus where the API and (with the dashboard on) the
Ray nodes are (:mod:`hypermedia.metrics.targets`, ``etc/prometheus/``).

Ray reads its auth settings when first imported, so nothing here imports
``ray`` before :meth:`LocalStack.start` has set them.

One stack per data dir: :meth:`LocalStack.start` holds ``data_dir/stack.lock``
(an ``flock``, so it goes with the process however it dies) for the stack's life,
and refuses to start while another process holds it. Holding it, whatever still
runs of an earlier stack of the data dir (its Ray head: a head killed with -9
leaves it) is stopped first. A :class:`~hypermedia.watchdog.Watchdog` stops what the
stack started if its process dies without stopping it.
"""

from __future__ import annotations

import fcntl
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import urlsplit

from hypermedia.config import Settings, load_settings
from hypermedia.embedded import find_running, listening_socket, private_directory, shown_url
from hypermedia.errors import ConfigError, ServiceUnavailable

if TYPE_CHECKING:
    import uvicorn
    from fastapi import FastAPI
    from sqlalchemy import Engine

    from hypermedia.server import Maintenance
    from hypermedia.stack import Stack
    from hypermedia.watchdog import Watchdog
    from hypermedia.worker.cluster import RayNode
    from hypermedia.worker.supervisor import Supervisor

log = logging.getLogger(__name__)

LOCK_FILE = "stack.lock"


def ray_directory(settings: Settings) -> Path:
    return settings.data_dir / "ray"


def implemented_queues(settings: Settings, operations: list[str]) -> dict[str, int]:
    """Actors per queue that some of ``operations`` uses: ``queues.<name>.workers`` each
    (queues set to 0 are left out)."""
    from hypermedia.profiles import load_profiles

    profiles = load_profiles(settings.profiles_path, settings.queue_names)
    queues = {profiles[op].queue for op in operations if op in profiles}
    return {
        queue: settings.queues[queue].workers
        for queue in settings.queue_names
        if queue in queues and settings.queues[queue].workers > 0
    }


def served_operations(settings: Settings, pools: dict[str, int]) -> Callable[[], set[str]]:
    """What the ingest of a stack with these actors and no cluster accepts: the
    implemented operations whose queue has an actor (nothing else would run them)."""
    served = {queue for queue, count in pools.items() if count > 0}
    return operations_of(settings, lambda: served)


def operations_of(
    settings: Settings, queues: Callable[[], Collection[str]]
) -> Callable[[], set[str]]:
    """The implemented operations whose queue is among ``queues()`` (asked at each
    submit: what runs may change while the stack runs)."""
    from hypermedia.ingest.service import registered_operations
    from hypermedia.profiles import load_profiles

    profiles = load_profiles(settings.profiles_path, settings.queue_names)

    def served() -> set[str]:
        have = queues()
        return {
            op for op in registered_operations() if op in profiles and profiles[op].queue in have
        }

    return served


class StaffedQueues:
    """The queues that have or can get a worker, asked at each submit: ``staffed``
    (what the deployment gives a worker: a local stack's actors, a ``scheduler.json``'s
    baseline or bursts) and any of ``queues`` with a live worker (a node that joined
    with ``hypermedia worker --queue``). The live ones are read from the record at most
    every :data:`LIVE_SECONDS`, and only while ``staffed`` leaves some of ``queues`` out."""

    LIVE_SECONDS = 5.0

    def __init__(self, engine: Engine, staffed: Collection[str], queues: Collection[str]) -> None:
        self.configured = frozenset(staffed)
        self.missing = frozenset(queues) - self.configured
        self.engine = engine
        self._live: frozenset[str] = frozenset()
        self._read_at = -math.inf
        self._lock = threading.Lock()

    def __call__(self) -> Collection[str]:
        if not self.missing:
            return self.configured
        with self._lock:
            now = time.monotonic()
            if now - self._read_at >= self.LIVE_SECONDS:
                self._live = frozenset(self._read_live())
                self._read_at = now
            return self.configured | self._live

    def _read_live(self) -> set[str]:
        from sqlalchemy import select

        from hypermedia.db import tables as t
        from hypermedia.db.engine import transaction

        w = t.workers
        with transaction(self.engine) as conn:
            rows = conn.execute(select(w.c.queue).where(w.c.status == "active").distinct())
            return {row.queue for row in rows}


@dataclass
class LocalStack:
    settings: Settings
    stack: Stack | None = None
    node: RayNode | None = None
    supervisor: Supervisor | None = None
    maintenance: Maintenance | None = None
    api_url: str = ""
    started_redis: bool = False
    # Adds to the API's app what the core does not know (the operator page).
    extend_app: Callable[[FastAPI], None] | None = None
    # Attached to a cluster: given the record, what names the queues that have or can
    # get a worker (a `ray up` head: its scheduler.json and the live workers); ingest
    # refuses the others' operations. None: the queues of the stack's own actors, and of
    # the nodes that joined it (with ``ray_node_ip`` or a cluster to attach to).
    cluster_queues: Callable[[Engine], Callable[[], Collection[str]]] | None = None
    # `up`'s stack: the API listens on api_port (8080 unless set; README "Configuration"),
    # where a web tier and the CLI's client find it again after a `down` and `up`. Else
    # (`run`, the tests' stacks) on a port the kernel picks, unless api_url names one.
    fixed_api_port: bool = False
    _server: uvicorn.Server | None = None
    _server_thread: threading.Thread | None = None
    _api_socket: socket.socket | None = None
    _stopped: list[str] = field(default_factory=list)
    _lock: IO[str] | None = None
    _watchdog: Watchdog | None = None
    # The temp dir of the Ray head being started: one interrupted while `ray start` ran
    # has no ``node`` yet, and stop() must find its processes all the same.
    _head_temp_dir: Path | None = None

    @property
    def holds_data_dir(self) -> bool:
        """True from the moment this stack took the data dir's lock until it stopped. A
        stack refused the lock (another runs there) owns nothing of the data dir's."""
        return self._lock is not None

    def start(
        self,
        *,
        pools: dict[str, int] | None = None,
        progress: Any = None,
        dashboard: bool | None = None,
        status: bool = True,
        metrics: bool = True,
        before_workers: Callable[[Stack], None] | None = None,
    ) -> None:
        """``dashboard``: start Ray's dashboard (default: the ``ray_dashboard`` setting).
        ``status``: Ray's autoscaler monitor on the head, what ``ray status`` and the
        dashboard's cluster page show (``run``'s batch goes without).
        ``metrics``: the Ray head's metrics export port, which Prometheus scrapes (the
        actors' ``ray.util.metrics``, Ray's own); without it and the dashboard, the head
        runs neither of Ray's agents (``run``'s batch: no ``ray.json`` tells Prometheus
        where it is).
        ``before_workers``: given the stack once its record and Redis are open, before
        any pipeline actor or the reconciler runs (what it does to the record, no job
        of it has been claimed yet)."""
        from hypermedia.metrics import targets
        from hypermedia.watchdog import Watchdog
        from hypermedia.worker import cluster

        say = progress or (lambda message: log.info("%s", message))
        directory = ray_directory(self.settings)
        self._lock = hold_data_dir(self.settings.data_dir)
        self._watchdog = Watchdog(self.settings.data_dir)
        attached = self.settings.ray_address
        if attached is not None:
            # A cluster from `ray up`: its token is in the environment the head runs with.
            token = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or directory / cluster.TOKEN_FILE)
            if not token.exists():
                raise ServiceUnavailable(f"no Ray token at {token} for the cluster at {attached}")
        else:
            token = cluster.ensure_token(directory / cluster.TOKEN_FILE)
            leftover = cluster.RayNode(cluster.short_temp_dir(directory, "head"), token)
            if leftover.is_running():
                count = leftover.stop()
                say(f"stopped a Ray head left by an earlier stack ({count} processes)")
        # A head that nodes join (``ray up``'s, or one with ray_node_ip) is not loopback.
        loopback = attached is None and self.settings.ray_node_ip is None
        cluster.apply_ray_environment(token, loopback=loopback)

        settings = self.settings
        if settings.redis_url is None:
            from hypermedia.embedded import ensure_running

            redis_dir = settings.data_dir / "redis"
            was_running = find_running(redis_dir) is not None
            if not was_running:
                self._watchdog.watch_redis(redis_dir)
            self.started_redis = not was_running  # before: a Ctrl-C may come while it starts
            url = ensure_running(redis_dir)
            say(f"redis {'reused' if was_running else 'started'} at {shown_url(url)}")
        else:
            url = settings.redis_url
        # The API's socket listens from here on: nothing started below (Ray's head, its
        # workers) can take its port before uvicorn serves it.
        self._api_socket = api_socket(settings, fixed=self.fixed_api_port)
        port = self._api_socket.getsockname()[1]
        api_url = settings.api_url or f"http://127.0.0.1:{port}"
        self.settings = settings = load_settings(
            **{**settings.model_dump(exclude_none=True), "redis_url": url, "api_url": api_url}
        )
        self.api_url = api_url

        from hypermedia.stack import Stack

        if pools is None:
            import pipelines.registry

            pools = implemented_queues(settings, pipelines.registry.operations())
        if attached is None and settings.ray_node_ip is None:
            # No node but this one: a queue without an actor runs nothing.
            served = served_operations(settings, pools)
            actors = frozenset(q for q, n in pools.items() if n > 0)
            self.stack = Stack.open(
                settings, auto_migrate=True, implemented=served, served_queues=lambda: actors
            )
        else:
            from hypermedia.db.engine import settings_engine

            engine = settings_engine(settings)
            if self.cluster_queues is not None:
                queues = self.cluster_queues(engine)
            else:  # nodes may join this head: its actors' queues, and the joined ones'
                queues = StaffedQueues(
                    engine, {q for q, n in pools.items() if n > 0}, settings.queue_names
                )
            served = operations_of(settings, queues)
            self.stack = Stack.open(
                settings,
                auto_migrate=True,
                engine=engine,
                implemented=served,
                served_queues=queues,
            )
        say(f"record in {shown_url(settings.effective_database_url)}")
        if before_workers is not None:
            before_workers(self.stack)
        if attached is not None:
            address = attached
            say(f"ray cluster at {address}")
        else:
            node_ip = str(settings.ray_node_ip) if settings.ray_node_ip is not None else None
            self._head_temp_dir = cluster.short_temp_dir(directory, "head")
            self._watchdog.watch_ray_node(self._head_temp_dir)
            with_dashboard = settings.ray_dashboard if dashboard is None else dashboard
            self.node = cluster.start_head(
                directory,
                resources=cluster.queue_resources(pools),
                token_path=token,
                num_cpus=max(os.cpu_count() or 1, math.ceil(settings.pool_cpus(pools))),
                dashboard=with_dashboard,
                monitor=status,
                metrics=metrics,
                node_ip=node_ip,
                dashboard_env={
                    "RAY_PROMETHEUS_HOST": settings.prometheus_url,
                    "RAY_GRAFANA_HOST": settings.grafana_url,
                },
            )
            address = self.node.address
            say(f"ray head at {address}")
            if self.node.dashboard_url:
                targets.link_ray(settings.data_dir, self.node.temp_dir)
                say(f"ray dashboard at {self.node.dashboard_url} (token in {token})")
        self._start_api(self._api_socket)
        targets.publish_api(settings.data_dir, api_url)
        say(f"api at {api_url}")

        import ray

        from hypermedia.server import Maintenance
        from hypermedia.worker.supervisor import Supervisor, settings_for_actors

        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        self.supervisor = Supervisor(self.stack, settings_for_actors(settings, url), pools)
        self.supervisor.start()
        self.supervisor.wait_ready()
        say(f"pipeline actors ready: {', '.join(f'{q} x{n}' for q, n in pools.items())}")
        self.maintenance = Maintenance(
            self.stack,
            reaper_interval=settings.reaper_interval_seconds,
            reconcile_interval=settings.reconcile_interval_seconds,
        )
        self.maintenance.start()

    def _start_api(self, sock: socket.socket) -> None:
        import uvicorn

        from hypermedia.ingest.api import create_app
        from hypermedia.server import ApiServer

        assert self.stack is not None
        app = create_app(self.stack)
        if self.extend_app is not None:
            self.extend_app(app)
        config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off")
        self._server = ApiServer(config, app)
        self._server_thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [sock]},
            name="hypermedia-api",
            daemon=True,
        )
        self._server_thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._server_thread.is_alive() or time.monotonic() > deadline:
                host, port = sock.getsockname()[:2]
                raise ServiceUnavailable(f"the API server did not start on {host}:{port}")
            time.sleep(0.05)

    def stop(
        self,
        *,
        drain_timeout: float = 30.0,
        stop_redis: bool | None = None,
        progress: Any = None,
        keep_logs: Path | None = None,
    ) -> None:
        """Stop everything that was started, in reverse order, saying so through
        ``progress``. Safe to call twice, and after a start that failed or was
        interrupted: only what this stack started is stopped (``stop_redis`` too applies
        only to a stack that held the data dir, never to one refused it).
        ``keep_logs``: copy the actors' logs of the Ray head this stack started there
        first (:mod:`hypermedia.runlogs`; its session goes with the head)."""
        say = progress or (lambda message: log.info("%s", message))
        started = time.monotonic()
        if self.maintenance is not None:
            self.maintenance.stop()
            self.maintenance = None
        if self.supervisor is not None:
            say("stopping the pipeline actors")
            try:
                self.supervisor.stop(drain_timeout=drain_timeout)
            except Exception:
                log.exception("stopping the pipeline actors")
            self.supervisor = None
        import sys

        if "ray" in sys.modules:
            import ray

            if ray.is_initialized():
                ray.shutdown()
        if self._server is not None:
            self._server.should_exit = True
            if self._server_thread is not None:
                # Its uploads in flight get their time, then their answers (ApiServer).
                timeout = self._server.config.timeout_graceful_shutdown or 0
                self._server_thread.join(timeout + 5)
            self._server = None
        if self._api_socket is not None:
            self._api_socket.close()
            self._api_socket = None
        if self.node is not None and keep_logs is not None:
            self._keep_logs(keep_logs, say)
        if self.node is not None:
            say("stopping the Ray head")
            count = self.node.stop()
            say(f"stopped the Ray head ({count} processes)")
            self.node = None
        elif self._head_temp_dir is not None:
            from hypermedia.worker.cluster import RayNode

            # Interrupted in start_head: `ray start` may have started some daemons, or
            # none yet (its temp dir made, empty); stop() takes both.
            count = RayNode(self._head_temp_dir, Path("-")).stop()
            if count:
                say(f"stopped a Ray head that was starting ({count} processes)")
        self._head_temp_dir = None
        if self.stack is not None:
            self.stack.close()
            self.stack = None
        wanted = stop_redis if stop_redis is not None else self.started_redis
        if wanted and self.holds_data_dir:
            running = find_running(self.settings.data_dir / "redis")
            if running is not None:
                running.stop()
                say("stopped redis")
        if self._watchdog is not None:
            self._watchdog.done()
            self._watchdog = None
            say(f"stopped in {time.monotonic() - started:.1f} s")
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None

    def _keep_logs(self, dest: Path, say: Callable[[str], None]) -> None:
        from hypermedia import runlogs

        assert self.node is not None
        try:
            kept = runlogs.keep(runlogs.session_logs(self.node.temp_dir), dest)
        except OSError as exc:
            say(f"could not keep the workers' logs in {dest}: {exc}")
            log.warning("could not keep the workers' logs in %s: %s", dest, exc)
            return
        if kept:
            say(f"kept the workers' logs in {dest} ({len(kept)} files)")


@dataclass(frozen=True, slots=True)
class ApiPorts:
    """Where a local stack's API listens: ``ports`` in order (0: one the kernel picks),
    each taken one passed over for the next; ``setting``: the setting that asked for
    the first, which is never passed over (a web tier was told it)."""

    ports: tuple[int, ...]
    setting: str | None = None


def api_ports(settings: Settings, *, fixed: bool) -> ApiPorts:
    """The ports the local stack's API may listen on: ``api_url``'s when it is set;
    with ``fixed`` (``up``'s stack, which a web tier and the CLI's client find at
    ``http://api_host:api_port``, as ``serve``'s) ``api_port`` as set, else its default
    (8080) or, that one taken, a port the kernel picks; without (``run``'s stack, whose
    API is its own) a port the kernel picks."""
    if settings.api_url:
        port = urlsplit(settings.api_url).port or 0
        if not port:
            raise ConfigError(
                "api_url (HYPERMEDIA_API_URL)",
                f"{settings.api_url!r} names no port for the local stack's API to listen on",
            )
        return ApiPorts((port,), "api_url (HYPERMEDIA_API_URL)")
    if not fixed:
        return ApiPorts((0,))
    if "api_port" in settings.model_fields_set:
        return ApiPorts((settings.api_port,), "api_port (HYPERMEDIA_API_PORT)")
    return ApiPorts((settings.api_port, 0))


def api_socket(settings: Settings, *, fixed: bool = False) -> socket.socket:
    """The local stack API's listening socket, on ``api_host`` (:func:`api_ports`)."""
    return listen_api(settings.api_host, api_ports(settings, fixed=fixed))


def listen_api(host: str, chosen: ApiPorts) -> socket.socket:
    """A socket listening on the first of ``chosen.ports`` that is free (a warning says
    which was passed over); ServiceUnavailable naming the address if none is."""
    first = chosen.ports[0]
    for port in chosen.ports:
        try:
            sock = listening_socket(host, port)
        except OSError as exc:
            if port != chosen.ports[-1]:
                continue
            named = f" ({chosen.setting})" if chosen.setting else ""
            raise ServiceUnavailable(
                f"the API cannot listen on {host}:{port}{named}: {exc.strerror or exc}"
            ) from None
        if port != first:
            log.warning(
                "%s:%d is taken: the API listens on port %d instead (set"
                " HYPERMEDIA_API_PORT for a port that stays)",
                host,
                first,
                sock.getsockname()[1],
                extra={"action": "api_port"},
            )
        return sock
    raise AssertionError("no port to listen on")  # ApiPorts holds at least one


def moved_api_note(settings: Settings, api_url: str) -> str | None:
    """What ``up`` says when its stack's API is not at ``api_port``'s default: that
    port was taken (:func:`api_ports`), how the CLI's client commands reach it (they go
    to ``api_port``), and that a web tier told this URL loses it at the next ``up``."""
    port = urlsplit(api_url).port
    if settings.api_url or "api_port" in settings.model_fields_set or port == settings.api_port:
        return None
    return (
        f"port {settings.api_port} (api_port's default) was taken: the API listens on"
        f" {port} until `down`; the CLI's client commands (submit, watch, status JOB_ID)"
        f" reach it with HYPERMEDIA_API_URL={api_url}; set HYPERMEDIA_API_PORT (or free"
        f" {settings.api_port}) for a port that stays"
    )


def hold_data_dir(data_dir: Path) -> IO[str]:
    """``data_dir/stack.lock``, locked for this process: one local stack per data dir.
    The lock goes with the process, however it ends."""
    private_directory(data_dir)
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    handle = os.fdopen(fd, "r+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = handle.read().strip() or "?"
        handle.close()
        raise ServiceUnavailable(
            f"another local stack (pid {holder}) runs on {data_dir}: "
            "stop it (`hypermedia down`, or end that `hypermedia run`) or use another "
            "HYPERMEDIA_DATA_DIR"
        ) from None
    handle.truncate(0)
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def data_dir_in_use(data_dir: Path) -> bool:
    """True if a live local stack holds ``data_dir``'s lock."""
    return data_dir_holder(data_dir) is not None


def data_dir_holder(data_dir: Path) -> int | None:
    """The pid of the live local stack that holds ``data_dir``'s lock (0 if it has not
    written it yet), or None if none does."""
    try:
        handle = open(data_dir / LOCK_FILE)  # noqa: SIM115 (closed below)
    except FileNotFoundError:
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = handle.read().strip()
            return int(text) if text.isdigit() else 0
        return None
