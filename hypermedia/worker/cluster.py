"""A Ray head (and worker nodes) on this machine, started and stopped by us.

Never on port 6379 (Redis's): every port is chosen free. Token authentication is
on: a random token lives at ``<dir>/auth_token`` (mode 0600) and every process of
ours sets ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN_PATH``. Each node gets its
own ``--temp-dir``. We stop exactly the processes we started, found by that temp
dir (``ray stop`` would kill every Ray process on the host).

Node resources advertise the queues: ``queue_<name>: n`` lets ``n`` pipeline
actors of that queue live on the node.

A head started without ``node_ip`` is a single-machine cluster: Ray takes
127.0.0.1 as the node's address (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, Ray's
own single-machine mode: ``ray start --node-ip-address=127.0.0.1`` alone is
rewritten to the host's address), so the GCS, the raylet, the agents, the
metrics endpoints, the client server and every actor listen on loopback only,
and no node can join. A head that nodes join is asked for by naming its address.

``ray start`` and so every Ray process (raylet, GCS, agents, actors) gets an
allowlisted environment (:data:`INHERITED`), never the caller's whole one: the
head's credentials (``AWS_*``, database passwords in ``HYPERMEDIA_*``) stay in the
head's process. Every node's temp dir sits in a ``0700`` directory of ours (Ray
makes its session dirs ``0777`` and its logs ``0644``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from hypermedia.errors import ServiceUnavailable
from hypermedia.secret_files import SANDBOX_HIDDEN_VARIABLE, secret_files
from hypermedia.worker.ray_start import WITHOUT_AGENTS

log = logging.getLogger(__name__)

TOKEN_FILE = "auth_token"  # noqa: S105 (a file name, not a secret)
ADDRESS_FILE = "ray_current_cluster"
# A try of `ray start`: its raylet alone may take ray_start.REGISTER_PATIENCE_SECONDS
# (120 s) to register on a loaded machine; the rest of a start took ~13 s at load 15-20.
START_TIMEOUT_SECONDS = 180.0


STOP_GRACE_SECONDS = 2.0
# What Ray's processes may inherit from the caller: how to find programs and
# libraries, the locale, the clock, the temp dir. Nothing that can hold a secret.
INHERITED = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "PYTHONPATH",
        "PYTHONSAFEPATH",
        "VIRTUAL_ENV",
        "LD_LIBRARY_PATH",
        "VIPS_CONCURRENCY",
        "OMP_NUM_THREADS",
        # How the actors log (hypermedia.logs): no secret in either.
        "HYPERMEDIA_LOG_FORMAT",
        "HYPERMEDIA_LOG_LEVEL",
    }
)
INHERITED_PREFIXES = ("LC_",)
# Ray's single-machine mode: the node's address is 127.0.0.1 and nothing binds wider.
_LOOPBACK = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def ray_environment(token_path: Path, *, loopback: bool = False) -> dict[str, str]:
    """The environment of ``ray start``, and so of every Ray process of the node: the
    allowlisted part of ours (:data:`INHERITED`), the token settings, and with
    ``loopback`` Ray's single-machine mode."""
    env = {
        k: v for k, v in os.environ.items() if k in INHERITED or k.startswith(INHERITED_PREFIXES)
    }
    env.update(_client_variables(token_path, loopback=loopback))
    # Where the secrets of this machine's stack are (the settings file, the token):
    # paths only, for the sandbox of the node's pipeline actors to hide.
    hidden = secret_files({**os.environ, "RAY_AUTH_TOKEN_PATH": str(token_path)})
    env[SANDBOX_HIDDEN_VARIABLE] = os.pathsep.join(hidden)
    return env


def _client_variables(token_path: Path, *, loopback: bool) -> dict[str, str]:
    variables = {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token_path),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    if loopback:
        # In a driver this only stops ray.init from rewriting 127.0.0.1 into the
        # host's address (which a loopback head does not listen on). A node that joins
        # others, or that others join (``ray up``'s head), must go without it: its
        # drivers would look for their raylet on 127.0.0.1.
        variables[_LOOPBACK] = "0"
    return variables


def apply_ray_environment(token_path: Path, *, loopback: bool = True) -> None:
    """Make this process a client of the cluster (``loopback``: of a head that listens
    on 127.0.0.1 only). Ray reads these variables once, when it is first imported:
    call this before anything imports ``ray``."""
    wanted: dict[str, str | None] = {
        _LOOPBACK: None,
        **_client_variables(token_path, loopback=loopback),
    }
    if "ray" in sys.modules:
        # Only the auth settings matter once ray is loaded (usage stats are cosmetic).
        wanted = {k: v for k, v in wanted.items() if k.startswith(("RAY_AUTH_", _LOOPBACK))}
        current = {k: os.environ.get(k) for k in wanted}
        if current != wanted:
            raise RuntimeError(
                "ray was imported before its auth settings were made; "
                f"call apply_ray_environment() first (have {current}, need {wanted})"
            )
        return
    for key in [k for k in os.environ if k.startswith("RAY_")]:
        del os.environ[key]
    os.environ.update({k: v for k, v in wanted.items() if v is not None})


def ensure_token(token_path: Path) -> Path:
    """A random cluster token at ``token_path`` (mode 0600), made once."""
    if not token_path.exists():
        token_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(token_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_hex(32))
    return token_path


def short_temp_dir(directory: Path, name: str) -> Path:
    """A node's Ray temp dir: short (Ray's unix socket paths must stay under 108
    bytes), stable for ``directory`` (so a later ``down`` finds it), under /tmp."""
    digest = hashlib.sha1(str(directory.resolve()).encode(), usedforsecurity=False).hexdigest()
    return Path(tempfile.gettempdir()) / f"hmray-{digest[:10]}" / name


def private_directory(path: Path) -> Path:
    """``path`` as a directory only we can enter (``0700``, ours, not a symlink).

    The name under /tmp is predictable: one another user made first (to read Ray's
    logs, or to plant sockets) is refused, not used."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise ServiceUnavailable(
            f"{path} is not a directory of this user: remove it (someone else made it)"
        )
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


def _prepare_temp_dir(temp_dir: Path) -> None:
    private_directory(temp_dir.parent)
    temp_dir.mkdir(mode=0o700, exist_ok=True)


# Two ports Ray's head binds at fixed defaults (the autoscaler's and the dashboard's own
# metrics, 44217 and 44227) unless told otherwise: a second cluster on the host would
# find them taken.
_FIXED_METRIC_PORTS = ("AUTOSCALER_METRIC_PORT", "DASHBOARD_METRIC_PORT")


def queue_resources(counts: Mapping[str, int]) -> dict[str, float]:
    return {f"queue_{name}": float(n) for name, n in counts.items() if n > 0}


@dataclass
class RayNode:
    """One Ray node (head or worker) that we started, in its own temp dir."""

    temp_dir: Path
    token_path: Path
    address: str = ""
    dashboard_url: str = ""  # Ray's dashboard, if this head started one

    def processes(self, groups: set[int] | None = None) -> list[psutil.Process]:
        """Every process of this node: those naming its temp dir, the Ray client
        server (which names only the GCS address), all their children, and the members
        of the node's process groups (``ray start`` runs in a group of its own, each Ray
        worker makes one): a group is the node's when every process in it is, and what
        a member starts stays in it even once its parent has ended (an orphan naming
        nothing of the node: the dashboard's multiprocessing resource tracker).
        ``groups``: the node's groups found before (a stop's earlier rounds), to which
        those found now are added."""
        marker = str(self.temp_dir)
        every: list[tuple[psutil.Process, list[str]]] = []
        group_of: dict[int, int] = {}
        for proc in psutil.process_iter(["cmdline"]):
            try:
                args = proc.info["cmdline"] or []
                group_of[proc.pid] = os.getpgid(proc.pid)
            except (psutil.Error, OSError):
                continue
            if proc.pid == os.getpid():
                continue  # a caller that names the temp dir on its own command line
            every.append((proc, args))
        ours = [args for _proc, args in every if marker in " ".join(args)]
        # A `ray start` cut short (a Ctrl-C, `up --wait` running out) may have started the
        # client server but not yet written the address file: the GCS names the address.
        address = self.address or _read_address(self.temp_dir) or _gcs_address(ours)
        client_server = f"--address={address}" if address else None
        found: dict[int, psutil.Process] = {}
        for proc, args in every:
            if marker in " ".join(args) or (client_server is not None and client_server in args):
                _add_with_children(found, proc)
        known = groups if groups is not None else set()
        known |= _whole_groups(found, every, group_of)
        for proc, _args in every:
            if group_of[proc.pid] in known and proc.pid not in found:
                _add_with_children(found, proc)
        return list(found.values())

    def stop(self, timeout: float = STOP_GRACE_SECONDS) -> int:
        """SIGTERM the processes of the node, SIGKILL those still there after
        ``timeout``; answers how many there were. The GCS and the autoscaler's
        monitor sit out a SIGTERM for 10 s and more, and a node of ours keeps no
        state worth that wait: its session dir is removed with it.

        Then the node's processes are listed again, and stopped the same way, until
        none is left (:data:`_STOP_ROUNDS` at most): a process may start after the
        first list (a daemon of a `ray start` still starting, a resource tracker of a
        dashboard already told to stop). A process has ended when gone or a zombie
        without threads (:func:`_running`): the node's daemons are init's children
        (``ray start`` leaves them), which an init that reaps late (1-2 s a round on
        some machines) would otherwise make every stop wait for."""
        groups: set[int] = set()
        stopped: set[int] = set()
        mp_dirs: set[Path] = set()
        killed = 0
        stuck: list[psutil.Process] = []
        procs = self._running_processes(groups, [])
        for _round in range(_STOP_ROUNDS):
            if not procs:
                break
            stopped.update(proc.pid for proc in procs)
            mp_dirs |= _multiprocessing_dirs(procs)
            # The raylet, the workers and the agents stop on SIGTERM, and the raylet at
            # once while the GCS still answers it; the GCS and the monitor would only
            # run the grace out, so they get SIGKILL when the others are gone.
            polite = [p for p in procs if not _sits_out(p)]
            for proc in polite:
                try:
                    proc.send_signal(signal.SIGTERM)
                except psutil.Error:
                    continue
            _wait_ended(polite, timeout)
            alive = _wait_ended(procs, 0)
            for proc in alive:
                try:
                    proc.kill()
                except psutil.Error:
                    continue
            killed += len(alive)
            stuck = _wait_ended(alive, 5)
            procs = self._running_processes(groups, stuck)
        if procs:
            log.error(
                "ray node in %s: %d processes outlived its stop: %s",
                self.temp_dir,
                len(procs),
                ", ".join(_described(proc) for proc in procs),
                extra={"action": "ray_stop_leftover"},
            )
        # Ray's session logs and sockets go with the node; a stopped node leaves nothing.
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.temp_dir.parent.rmdir()
        for directory in () if procs else mp_dirs:  # the dashboard's, which it leaves
            shutil.rmtree(directory, ignore_errors=True)
        log.info(
            "ray node in %s stopped (%d processes, %d killed)",
            self.temp_dir,
            len(stopped),
            killed,
        )
        return len(stopped)

    def _running_processes(
        self, groups: set[int], stuck: list[psutil.Process]
    ) -> list[psutil.Process]:
        """The node's processes not ended, with ``stuck`` (those a kill did not end in
        time, which a list may miss: a zombie leader has no command line)."""
        listed = {proc.pid: proc for proc in [*self.processes(groups), *stuck]}
        return [proc for proc in listed.values() if _running(proc)]

    def is_running(self) -> bool:
        """Whether a process of the node has not ended (:func:`_running`): a zombie
        its parent (init, for the node's daemons) has not reaped yet has."""
        return any(_running(proc) for proc in self.processes())


_SITS_OUT_SIGTERM = ("gcs_server", "autoscaler/_private/monitor.py")
# A stop lists the node's processes again after each round; past these many rounds what
# is left is logged (each new round so far found the few a round's signals made start).
_STOP_ROUNDS = 4


def _add_with_children(found: dict[int, psutil.Process], proc: psutil.Process) -> None:
    found[proc.pid] = proc
    with contextlib.suppress(psutil.Error):
        for child in proc.children(recursive=True):
            found[child.pid] = child


def _whole_groups(
    found: Mapping[int, psutil.Process],
    every: list[tuple[psutil.Process, list[str]]],
    group_of: Mapping[int, int],
) -> set[int]:
    """The process groups of ``found`` in which every process is one of ``found`` (a
    zombie aside: it starts nothing, and shows no command line). Never the caller's
    group: a node a shell script started (the local driver's) shares its caller's."""
    candidates = {group_of[pid] for pid in found if pid in group_of} - {0, os.getpgrp()}
    for proc, args in every:
        group = group_of[proc.pid]
        if group in candidates and proc.pid not in found and (args or _running(proc)):
            candidates.discard(group)
    return candidates


def _wait_ended(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Those of ``procs`` still running (:func:`_running`) after up to ``timeout``
    seconds. Our own children are reaped, by their pids (the others are init's)."""
    deadline = time.monotonic() + timeout
    alive = list(procs)
    while True:
        _gone, alive = psutil.wait_procs(alive, timeout=0)
        alive = [proc for proc in alive if _running(proc)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.02)


def _running(proc: psutil.Process) -> bool:
    """Not ended: running, or a zombie thread-group leader whose other threads still
    exit: its files and sockets close with the last of them (a GCS whose leader showed
    Z still took connections on its port). A zombie alone has ended, whether or not its
    parent has reaped it yet."""
    try:
        if not proc.is_running():
            return False  # gone, or its pid given to another process
        if proc.status() != psutil.STATUS_ZOMBIE:
            return True
        return len(os.listdir(f"/proc/{proc.pid}/task")) > 1
    except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError):
        return False
    except psutil.AccessDenied:
        return True


def _described(proc: psutil.Process) -> str:
    try:
        return f"{proc.pid} ({proc.status()}: {' '.join(proc.cmdline())[:100]})"
    except psutil.Error:
        return str(proc.pid)


_MP_DIR_PREFIX = "pymp-"  # multiprocessing's temp dir: util.get_temp_dir()


def _multiprocessing_dirs(procs: list[psutil.Process]) -> set[Path]:
    """The multiprocessing temp dirs (``$TMPDIR/pymp-*``) whose sockets the node's
    processes listen on. Ray's dashboard runs its modules' processes from a forkserver,
    whose socket lies in such a dir; the dashboard leaves on SIGTERM by ``os._exit``,
    past the exit hook that would remove it: each stop of a head with the dashboard left
    one in /tmp."""
    found = set()
    for proc in procs:
        try:
            connections = proc.net_connections(kind="unix")
        except psutil.Error:
            continue
        for connection in connections:
            path = Path(str(connection.laddr))  # a unix socket's: its path
            if path.parent.name.startswith(_MP_DIR_PREFIX):
                found.add(path.parent)
    return found


def _sits_out(proc: psutil.Process) -> bool:
    try:
        line = " ".join(proc.cmdline())
    except psutil.Error:
        return False
    return any(part in line for part in _SITS_OUT_SIGTERM)


def _gcs_address(cmdlines: list[list[str]]) -> str:
    """The GCS address (ip:port) on a ``gcs_server`` command line among ``cmdlines``."""
    for args in cmdlines:
        if not args or not args[0].endswith("gcs_server"):
            continue
        options = dict(arg.removeprefix("--").partition("=")[::2] for arg in args[1:])
        ip, port = options.get("node-ip-address"), options.get("gcs_server_port")
        if ip and port:
            return f"{ip}:{port}"
    return ""


def _read_address(temp_dir: Path) -> str:
    try:
        return (temp_dir / ADDRESS_FILE).read_text().strip()
    except OSError:
        return ""


def ray_binary() -> str:
    candidate = Path(sys.executable).parent / "ray"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("ray")
    if found is None:
        raise ServiceUnavailable("the `ray` command is not installed (pip install 'ray[default]')")
    return found


def ray_start_command() -> list[str]:
    """``ray`` for a node's ``ray start``: :mod:`hypermedia.worker.ray_start`, Ray's own
    command line without its other commands' imports and, on a head, without the client
    server and, the dashboard off, without its process."""
    ray_binary()  # the same error when Ray is not installed
    return [sys.executable, "-m", "hypermedia.worker.ray_start"]


def _free_ports(count: int) -> list[int]:
    """``count`` distinct free ports: every socket stays bound until all are chosen,
    so the kernel cannot hand the same port out twice."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def port_arguments(head: bool, *, client_server: bool = True) -> list[str]:
    """Free ports for a node's ``ray start``; a head's ``client_server`` port too (Ray
    starts one on 10001 unless told: two clusters on a host would collide), unless its
    ``ray start`` runs none (:mod:`hypermedia.worker.ray_start`)."""
    names = [
        "--node-manager-port",
        "--object-manager-port",
        "--metrics-export-port",
        "--dashboard-agent-listen-port",
        "--dashboard-agent-grpc-port",
        "--runtime-env-agent-port",
    ]
    if head:
        names += ["--port", "--dashboard-port"]
        if client_server:
            names.append("--ray-client-server-port")
    return [f"{name}={port}" for name, port in zip(names, _free_ports(len(names)), strict=True)]


def start_head(
    directory: Path,
    *,
    resources: Mapping[str, float],
    token_path: Path | None = None,
    num_cpus: int | None = None,
    object_store_bytes: int = 256 * 2**20,
    dashboard: bool = False,
    node_ip: str | None = None,
    dashboard_env: Mapping[str, str] | None = None,
    monitor: bool = False,
    metrics: bool = True,
) -> RayNode:
    """Start a Ray head with its own temp dir under ``directory``; wait until it answers.

    Without ``node_ip`` it listens on loopback only and no node can join; with one
    (an address of this machine) nodes join it there. ``dashboard`` starts Ray's
    dashboard on 127.0.0.1 (behind the token); ``dashboard_env`` is for it
    (``RAY_PROMETHEUS_HOST``, ``RAY_GRAFANA_HOST``: where its Metrics page looks).
    ``monitor``: Ray's autoscaler monitor, whose reports ``ray status`` and the
    dashboard's cluster page show (it scales nothing: no autoscaling config here); a
    head nobody looks at (``run``'s, the tests') goes without it. ``metrics`` False
    (and no dashboard): nobody scrapes the node's metrics export port, so Ray's two
    agents are not started (:mod:`hypermedia.worker.ray_start`, ``--without-agents``):
    no metrics are collected, and a ``runtime_env`` (which nothing of ours asks) starts
    Ray's runtime env agent when one is asked for."""
    directory.mkdir(parents=True, exist_ok=True)
    token_path = ensure_token(token_path or directory / TOKEN_FILE)
    temp_dir = short_temp_dir(directory, "head")
    node = RayNode(temp_dir=temp_dir, token_path=token_path)
    if node.is_running():
        node.address = _read_address(temp_dir)
        if node.address:
            return node
        # Running without the address file its start writes last: what a `ray start`
        # cut short left (killed, or past its time). Not a head a driver can use (its
        # address was taken for "", which ray.init refuses): stopped, started afresh.
        log.warning(
            "ray head in %s was left half-started (no address file): stopping it",
            temp_dir,
            extra={"action": "ray_start_leftover"},
        )
        node.stop()
    _prepare_temp_dir(temp_dir)
    (temp_dir / ADDRESS_FILE).unlink(missing_ok=True)
    args = [
        *ray_start_command(),
        "start",
        "--head",
        f"--temp-dir={temp_dir}",
        f"--num-cpus={num_cpus if num_cpus is not None else os.cpu_count() or 1}",
        f"--object-store-memory={object_store_bytes}",
        f"--resources={json.dumps(dict(resources))}",
        f"--include-dashboard={'true' if dashboard else 'false'}",
        "--dashboard-host=127.0.0.1",
        "--disable-usage-stats",
        *port_arguments(head=True, client_server=False),
        # Worker nodes on this machine join a head on 127.0.0.10 (Ray rewrites 127.0.0.1).
        *([f"--node-ip-address={node_ip}"] if node_ip else []),
        *([] if monitor else ["--no-monitor"]),
        *([] if dashboard or metrics else [WITHOUT_AGENTS]),
    ]
    extra = dict(zip(_FIXED_METRIC_PORTS, map(str, _free_ports(2)), strict=True))
    if dashboard:
        extra.update(dashboard_env or {})
    try:
        _run_start(args, token_path, temp_dir, loopback=node_ip is None, extra=extra)
    except subprocess.TimeoutExpired as exc:
        raise ServiceUnavailable(
            f"`ray start` of the head did not finish within {exc.timeout:g} s"
            f" ({START_ATTEMPTS} tries): the machine is too loaded, or Ray cannot start"
            f" here (its logs: {temp_dir})"
        ) from None
    node.address = _read_address(temp_dir)
    if dashboard:
        port = next(a for a in args if a.startswith("--dashboard-port=")).partition("=")[2]
        node.dashboard_url = f"http://127.0.0.1:{port}"
    log.info("ray head at %s (temp dir %s)", node.address, temp_dir)
    return node


def start_worker_node(
    directory: Path,
    address: str,
    token_path: Path,
    *,
    name: str,
    resources: Mapping[str, float],
    num_cpus: int = 1,
    object_store_bytes: int = 128 * 2**20,
) -> RayNode:
    """Join a worker node to ``address`` (the local driver's scale-up path uses this)."""
    temp_dir = short_temp_dir(directory, name)
    _prepare_temp_dir(temp_dir)
    args = [
        *ray_start_command(),
        "start",
        f"--address={address}",
        f"--temp-dir={temp_dir}",
        f"--num-cpus={num_cpus}",
        f"--object-store-memory={object_store_bytes}",
        f"--resources={json.dumps(dict(resources))}",
        "--disable-usage-stats",
        *port_arguments(head=False),
    ]
    try:
        _run_start(args, token_path, temp_dir)
    except subprocess.TimeoutExpired as exc:
        RayNode(temp_dir, token_path).stop()  # what the `ray start` cut short began
        raise ServiceUnavailable(
            f"cannot reach the head at {address}: `ray start` did not join it within "
            f"{exc.timeout:g} s"
        ) from None
    return RayNode(temp_dir=temp_dir, token_path=token_path, address=address)


def wait_for_head(address: str, timeout: float) -> None:
    """Until the head's GCS at ``address`` (host:port) takes a TCP connection; a
    head that does not within ``timeout`` seconds is one this node cannot reach
    (`ray start` would try for minutes, silently)."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=5):
                return
        except OSError as exc:
            if time.monotonic() >= deadline:
                reason = exc.strerror or type(exc).__name__
                raise ServiceUnavailable(
                    f"cannot reach the head at {address}: {reason} (waited {timeout:g} s)"
                ) from None
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


# What a node of ours goes without (2.3 CPU-s of the ~12 a head costs to start, here):
# Ray's log monitor, which streams the workers' output to drivers that ask for it (ours
# never do: log_to_driver=False; each process logs to its files in the session dir,
# which the dashboard reads), and the idle workers a raylet starts, one per CPU, when
# the first driver connects (the actors' workers start with the actors).
_LEAN_ARGS = ("--include-log-monitor=false",)
_LEAN_ENV = {"RAY_prestart_worker_first_driver": "0"}
# Ray's `ray start` waits a fixed 30 s for its raylet to register with the GCS and fails
# with this; ours waits ray_start.REGISTER_PATIENCE_SECONDS (120 s: three tries of Ray's
# each failed at load 15-20 on 2 cores), and a node whose raylet did not register by then
# (or exited) is started again. Any other failure is reported at once.
_SLOW_START = "timed out during startup"
START_ATTEMPTS = 3


def _run_start(
    args: list[str],
    token_path: Path,
    temp_dir: Path,
    *,
    loopback: bool = False,
    extra: Mapping[str, str] | None = None,
) -> None:
    started = time.monotonic()
    result = start_with_retries(
        [*args, *_LEAN_ARGS],
        temp_dir,
        token_path,
        env={**ray_environment(token_path, loopback=loopback), **_LEAN_ENV, **(extra or {})},
        timeout=START_TIMEOUT_SECONDS,
    )
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-5:])
        raise ServiceUnavailable(f"`ray start` failed (exit {result.returncode}): {tail}")
    log.debug("ray start took %.1fs", time.monotonic() - started)


def start_with_retries(
    command: list[str],
    temp_dir: Path,
    token_path: Path,
    *,
    env: Mapping[str, str] | None = None,
    timeout: float | None = START_TIMEOUT_SECONDS,
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` (a ``ray start`` of the node whose temp dir is ``temp_dir``); when
    it fails, stop what it started, and when Ray gave up waiting for its raylet
    (:data:`_SLOW_START`) or the try ran past ``timeout`` try again,
    :data:`START_ATTEMPTS` tries in all. Answers the last try (exit 0 when the node came
    up); raises :class:`subprocess.TimeoutExpired` when that ran past ``timeout``, what
    it started stopped (its daemons outlive the ``ray start`` the timeout kills)."""
    attempt = 1
    while True:
        try:
            result = _run_ray_start(command, env, timeout)
        except subprocess.TimeoutExpired:
            RayNode(temp_dir, token_path).stop()
            if attempt == START_ATTEMPTS:
                raise
            log.warning(
                "`ray start` ran past %g s (a loaded machine): starting the node again",
                timeout,
                extra={"action": "ray_start_retry", "attempt": attempt},
            )
            attempt += 1
            continue
        if result.returncode == 0:
            return result
        RayNode(temp_dir, token_path).stop()
        if _SLOW_START not in result.stderr + result.stdout or attempt == START_ATTEMPTS:
            return result
        log.warning(
            "`ray start` gave up waiting for its raylet to register (a loaded machine, or "
            "the raylet exited): starting the node again",
            extra={"action": "ray_start_retry", "attempt": attempt},
        )
        attempt += 1


def _run_ray_start(
    command: list[str], env: Mapping[str, str] | None, timeout: float | None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        # The node's daemons (GCS, raylet, the actors under it) out of the caller's
        # process group: a Ctrl-C at `hypermedia run`'s terminal killed them under
        # the run, which then could not stop its actors in order. The caller stops
        # the node itself (RayNode.stop), its watchdog if it dies. A process group,
        # not a session: with the kernel's autogroup scheduling a session is a CPU
        # group of its own, and the niced actors in one would take a full share
        # beside the API, the client and everything else of the caller's session.
        process_group=0,
    )
