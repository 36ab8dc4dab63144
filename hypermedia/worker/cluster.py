"""A Ray head (and worker nodes) on this machine, started and stopped by us.

Never on port 6379 (Redis's): every port is chosen free. Token authentication is
on: a random token lives at ``<dir>/auth_token`` (mode 0600) and every process of
ours sets ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN_PATH``. Each node gets its
own ``--temp-dir``. We stop exactly the processes we started, found by that temp
dir (``ray stop`` would kill every Ray process on the host).

Node resources advertise the queues: ``queue_<name>: n`` lets ``n`` pipeline
actors of that queue live on the node.
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
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from hypermedia.errors import ServiceUnavailable

log = logging.getLogger(__name__)

TOKEN_FILE = "auth_token"  # noqa: S105 (a file name, not a secret)
ADDRESS_FILE = "ray_current_cluster"
START_TIMEOUT_SECONDS = 90.0


def ray_environment(token_path: Path) -> dict[str, str]:
    """The environment every process of this cluster needs (and no inherited RAY_*)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["RAY_AUTH_MODE"] = "token"
    env["RAY_AUTH_TOKEN_PATH"] = str(token_path)
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env


def apply_ray_environment(token_path: Path) -> None:
    """Make this process a client of the cluster. Ray reads these variables once,
    when it is first imported: call this before anything imports ``ray``."""
    wanted = {k: v for k, v in ray_environment(token_path).items() if k.startswith("RAY_")}
    if "ray" in sys.modules:
        # Only the auth settings matter once ray is loaded (usage stats are cosmetic).
        wanted = {k: v for k, v in wanted.items() if k.startswith("RAY_AUTH_")}
        current = {k: os.environ.get(k) for k in wanted}
        if current != wanted:
            raise RuntimeError(
                "ray was imported before its auth settings were made; "
                f"call apply_ray_environment() first (have {current}, need {wanted})"
            )
        return
    for key in [k for k in os.environ if k.startswith("RAY_")]:
        del os.environ[key]
    os.environ.update(wanted)


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


def queue_resources(counts: Mapping[str, int]) -> dict[str, float]:
    return {f"queue_{name}": float(n) for name, n in counts.items() if n > 0}


@dataclass
class RayNode:
    """One Ray node (head or worker) that we started, in its own temp dir."""

    temp_dir: Path
    token_path: Path
    address: str = ""

    def processes(self) -> list[psutil.Process]:
        marker = str(self.temp_dir)
        found: dict[int, psutil.Process] = {}
        for proc in psutil.process_iter(["cmdline"]):
            try:
                cmdline = " ".join(proc.info["cmdline"] or [])
            except psutil.Error:
                continue
            if marker in cmdline:
                found[proc.pid] = proc
                try:
                    for child in proc.children(recursive=True):
                        found[child.pid] = child
                except psutil.Error:
                    continue
        return list(found.values())

    def stop(self, timeout: float = 10.0) -> None:
        procs = self.processes()
        for proc in procs:
            try:
                proc.send_signal(signal.SIGTERM)
            except psutil.Error:
                continue
        _gone, alive = psutil.wait_procs(procs, timeout=timeout)
        for proc in alive:
            try:
                proc.kill()
            except psutil.Error:
                continue
        psutil.wait_procs(alive, timeout=5)
        # Ray's session logs and sockets go with the node; a stopped node leaves nothing.
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.temp_dir.parent.rmdir()
        log.info("ray node in %s stopped (%d processes)", self.temp_dir, len(procs))

    def is_running(self) -> bool:
        return bool(self.processes())


def _ray_binary() -> str:
    candidate = Path(sys.executable).parent / "ray"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("ray")
    if found is None:
        raise ServiceUnavailable("the `ray` command is not installed (pip install 'ray[default]')")
    return found


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


def port_arguments(head: bool) -> list[str]:
    names = [
        "--node-manager-port",
        "--object-manager-port",
        "--metrics-export-port",
        "--dashboard-agent-listen-port",
        "--dashboard-agent-grpc-port",
        "--runtime-env-agent-port",
    ]
    if head:
        names += ["--port", "--dashboard-port", "--ray-client-server-port"]
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
) -> RayNode:
    """Start a Ray head with its own temp dir under ``directory``; wait until it answers."""
    directory.mkdir(parents=True, exist_ok=True)
    token_path = ensure_token(token_path or directory / TOKEN_FILE)
    temp_dir = short_temp_dir(directory, "head")
    node = RayNode(temp_dir=temp_dir, token_path=token_path)
    if node.is_running():
        node.address = (temp_dir / ADDRESS_FILE).read_text().strip()
        return node
    temp_dir.mkdir(parents=True, exist_ok=True)
    (temp_dir / ADDRESS_FILE).unlink(missing_ok=True)
    args = [
        _ray_binary(),
        "start",
        "--head",
        f"--temp-dir={temp_dir}",
        f"--num-cpus={num_cpus if num_cpus is not None else os.cpu_count() or 1}",
        f"--object-store-memory={object_store_bytes}",
        f"--resources={json.dumps(dict(resources))}",
        f"--include-dashboard={'true' if dashboard else 'false'}",
        "--dashboard-host=127.0.0.1",
        "--disable-usage-stats",
        *port_arguments(head=True),
        # Worker nodes on this machine join a head on 127.0.0.10 (Ray rewrites 127.0.0.1).
        *([f"--node-ip-address={node_ip}"] if node_ip else []),
    ]
    _run_start(args, token_path, temp_dir)
    node.address = (temp_dir / ADDRESS_FILE).read_text().strip()
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
    temp_dir.mkdir(parents=True, exist_ok=True)
    args = [
        _ray_binary(),
        "start",
        f"--address={address}",
        f"--temp-dir={temp_dir}",
        f"--num-cpus={num_cpus}",
        f"--object-store-memory={object_store_bytes}",
        f"--resources={json.dumps(dict(resources))}",
        "--disable-usage-stats",
        *port_arguments(head=False),
    ]
    _run_start(args, token_path, temp_dir)
    return RayNode(temp_dir=temp_dir, token_path=token_path, address=address)


def _run_start(args: list[str], token_path: Path, temp_dir: Path) -> None:
    started = time.monotonic()
    result = subprocess.run(
        args,
        env=ray_environment(token_path),
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_SECONDS,
        check=False,
    )
    if result.returncode != 0:
        RayNode(temp_dir, token_path).stop()
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-5:])
        raise ServiceUnavailable(f"`ray start` failed (exit {result.returncode}): {tail}")
    log.debug("ray start took %.1fs", time.monotonic() - started)
