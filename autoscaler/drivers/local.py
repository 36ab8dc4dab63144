"""The local driver: "instances" are Ray worker nodes on this machine.

It lets the whole burst path (scheduler -> ``request_resources`` -> node provider ->
driver -> a node joining the head -> actors -> drain -> terminate) run on one machine,
in the tests and in ``ray_cluster/local.yaml``. Each instance gets its own loopback
address (127.0.0.11, .12, ...: Ray rewrites 127.0.0.1 to the routable address, so
the head sits on 127.0.0.10), its own short temp dir, and free ports; it boots by
running the request's user data, exactly as cloud-init would, with
``HM_RAY_START_ARGS`` adding the address, temp dir and ports, without the
launching process's ``RAY_*`` variables (a node that inherits them registers the
head's resources), and with a ``ray`` whose ``start`` is
:mod:`hypermedia.worker.ray_start`, as the worker image's is (docker/host/ray).

Its "billing" (:meth:`LocalDriver.charges`) is what the machine kept of each instance's
life, in ``<state_dir>/billing.json``: from the launch to the terminate, at the driver's
list price times ``billing_factor`` (default 1: the bill is the ledger; above 1 a cloud
that bills what the ledger does not price, as disks), settled ``billing_settle_seconds``
after it ended (default 0). The whole reconciliation runs against it on one machine.

State lives in ``<state_dir>/instances.json`` under an exclusive ``flock``: ``ray up``
and the head's monitor each build a provider (and a driver), and both must see the
same instances. An instance stays listed until it is terminated, even when its Ray
processes have exited (a drained node's raylet exits; the "machine" is still there
until someone terminates it, as on a cloud). Each record keeps when it was made
(``created``, the bill's start): an instance whose launch time tag was removed from the
file is listed as launched then, as the cloud drivers list one at its creation time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autoscaler import statefile
from autoscaler.billing import KEEP_SECONDS, day_of, day_start
from autoscaler.cost import DAY_SECONDS, HOUR_SECONDS
from autoscaler.drivers.base import Charge, DriverError, Instance, LaunchRequest
from hypermedia.config_errors import unknown_key
from hypermedia.errors import ConfigError, ServiceUnavailable
from hypermedia.worker.cluster import (
    RayNode,
    port_arguments,
    ray_binary,
    ray_start_command,
    short_temp_dir,
)

log = logging.getLogger(__name__)

BOOT_TIMEOUT_SECONDS = 120.0
FIRST_HOST = 11  # 127.0.0.11; the head is on 127.0.0.10
LAST_HOST = 250
OPTIONS = {
    "state_dir",
    "on_demand_cents_per_hour",
    "spot_cents_per_hour",
    "num_cpus",
    "object_store_bytes",
    "metadata_url",
    "spot_poll_seconds",
    "billing_factor",
    "billing_settle_seconds",
}


def _number(
    options: Mapping[str, Any], key: str, default: float | None = None, label: str = "local"
) -> float:
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(
            f"provider.drivers.{label}.{key}", f"expected a positive number, got {value!r}"
        )
    return float(value)


def _ray_command(temp_dir: Path) -> Path:
    """The directory of the instance's ``ray``, as a cloud machine's is docker/host/ray:
    ``ray start`` through :mod:`hypermedia.worker.ray_start` (the worker image runs the
    same), which goes without Ray's other commands' imports (Ray Serve, numpy, the state
    API: ~1.2 of the ~2.3 CPU-s of a node's ``ray start`` here); any other command is
    Ray's own."""
    bin_dir = temp_dir / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "ray"
    start = shlex.join([*ray_start_command(), "start"])
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "${{1:-}}" = start ]; then shift; exec {start} "$@"; fi\n'
        f'exec {shlex.quote(ray_binary())} "$@"\n'
    )
    script.chmod(0o755)
    return bin_dir


class LocalDriver:
    """Ray worker nodes on this machine (see the module docstring)."""

    name = "local"

    def __init__(self, options: Mapping[str, Any], *, label: str = "local") -> None:
        unknown = sorted(set(options) - OPTIONS)
        if unknown:
            raise ConfigError(
                f"provider.drivers.{label}.{unknown[0]}",
                unknown_key(str(unknown[0]), OPTIONS, "unknown option"),
            )
        state_dir = options.get("state_dir")
        if not isinstance(state_dir, str) or not state_dir:
            raise ConfigError(f"provider.drivers.{label}.state_dir", "required: a directory path")
        self.state_dir = Path(state_dir).expanduser()
        self.on_demand = _number(options, "on_demand_cents_per_hour", 10.0, label)
        self.spot = _number(options, "spot_cents_per_hour", self.on_demand / 3, label)
        self.num_cpus = int(_number(options, "num_cpus", 1, label))
        self.object_store_bytes = int(_number(options, "object_store_bytes", 128 * 2**20, label))
        # Where the nodes' spot watchers find "the instance metadata service" (a cloud's
        # is link-local; here a local server in the tests).
        metadata_url = options.get("metadata_url")
        if metadata_url is not None and not (
            isinstance(metadata_url, str) and metadata_url.startswith("http")
        ):
            raise ConfigError(f"provider.drivers.{label}.metadata_url", "expected an http(s) URL")
        self.metadata_url: str | None = metadata_url
        # How often those watchers read it (the nodes' HYPERMEDIA_SPOT_POLL_SECONDS;
        # unset: the settings' default).
        self.spot_poll_seconds: float | None = None
        if "spot_poll_seconds" in options:
            self.spot_poll_seconds = _number(options, "spot_poll_seconds", label=label)
            if self.spot_poll_seconds > 60:
                raise ConfigError(
                    f"provider.drivers.{label}.spot_poll_seconds", "at most 60 seconds"
                )
        self.billing_factor = _number(options, "billing_factor", 1.0, label)
        settle = options.get("billing_settle_seconds", 0.0)
        if isinstance(settle, bool) or not isinstance(settle, int | float) or settle < 0:
            raise ConfigError(
                f"provider.drivers.{label}.billing_settle_seconds",
                f"expected a number of seconds >= 0, got {settle!r}",
            )
        self.billing_settle_seconds = float(settle)
        self.billing_interval_seconds = 60.0
        self.state_dir.mkdir(parents=True, exist_ok=True)

    # -- the shared state file ------------------------------------------------------------

    def _state(self) -> contextlib.AbstractContextManager[dict[str, dict[str, Any]]]:
        """The instances, read and written under an exclusive lock."""
        return statefile.locked_json(self.state_dir / "instances.json")

    def _bill(self) -> contextlib.AbstractContextManager[dict[str, dict[str, Any]]]:
        """What the "cloud" bills: each instance's life and price, kept after it is gone."""
        return statefile.locked_json(self.state_dir / "billing.json")

    def _node(self, record: Mapping[str, Any]) -> RayNode:
        return RayNode(temp_dir=Path(record["temp_dir"]), token_path=Path("/dev/null"))

    def _instance(self, instance_id: str, record: Mapping[str, Any]) -> Instance:
        return Instance.from_tags(
            instance_id,
            self.name,
            record["tags"],
            record["state"],
            record["ip"],
            created=record.get("created"),
        )

    # -- the driver interface ---------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> Instance | DriverError:
        instance_id = f"lc-{request.request_id}"
        with self._state() as state:
            if instance_id in state:
                return self._instance(instance_id, state[instance_id])
            used = {record["ip"] for record in state.values()}
            free = [
                f"127.0.0.{n}" for n in range(FIRST_HOST, LAST_HOST) if f"127.0.0.{n}" not in used
            ]
            if not free:
                return DriverError("capacity", "no free loopback address left", retryable=True)
            created = time.time()
            record: dict[str, Any] = {
                "ip": free[0],
                # Short: Ray's socket paths under it must stay within 107 bytes.
                "temp_dir": str(short_temp_dir(self.state_dir, f"n{free[0].rsplit('.', 1)[1]}")),
                "tags": request.tags(),
                "state": "pending",
                "created": created,
            }
            state[instance_id] = record
        with self._bill() as bill:
            # Forgotten once the reconciliation no longer reads back that far.
            gone = [
                i for i, r in bill.items() if r["end"] and r["end"] < time.time() - KEEP_SECONDS
            ]
            for old in gone:
                del bill[old]
            bill.setdefault(
                instance_id,
                {
                    "cluster": request.cluster,
                    "request_id": request.request_id,
                    "start": created,
                    "end": None,
                    "cents_per_hour": self.price_of(request.spot) * self.billing_factor,
                },
            )
        # Booting takes seconds: the lock is not held meanwhile (listing goes on).
        problem = self._boot(record, request.user_data, request.spot)
        with self._state() as state:
            if state.get(instance_id, {}).get("state", "terminating") == "terminating":
                return DriverError("capacity", f"{instance_id} was terminated while booting")
            if problem is None:
                state[instance_id]["state"] = "running"
                record = state[instance_id]
        if problem is not None:
            self.terminate(instance_id)  # its address is free once what booted is stopped
            return DriverError("unavailable", f"{instance_id} did not boot: {problem}", True)
        log.info("local instance %s up at %s", instance_id, record["ip"])
        return self._instance(instance_id, record)

    def _boot(self, record: Mapping[str, Any], user_data: str, spot: bool) -> str | None:
        """Run the user data as cloud-init would; what went wrong (None: it booted)."""
        temp_dir = Path(record["temp_dir"])
        temp_dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "HYPERMEDIA_"))}
        try:
            bin_dir = _ray_command(temp_dir)
        except ServiceUnavailable as exc:  # Ray is not installed
            return str(exc)
        path = [str(bin_dir), str(Path(sys.executable).parent), env.get("PATH", "")]
        env["PATH"] = os.pathsep.join(path)
        if spot and self.metadata_url is not None:
            env["HYPERMEDIA_METADATA_URL"] = self.metadata_url
            if self.spot_poll_seconds is not None:
                env["HYPERMEDIA_SPOT_POLL_SECONDS"] = str(self.spot_poll_seconds)
        env["HM_RAY_START_ARGS"] = " ".join(
            [
                f"--node-ip-address={record['ip']}",
                f"--temp-dir={temp_dir}",
                f"--object-store-memory={self.object_store_bytes}",
                f"--num-cpus={self.num_cpus}",
                *port_arguments(head=False),
            ]
        )
        script = temp_dir / "user-data.sh"
        script.write_text(user_data)
        try:
            result = subprocess.run(
                ["/bin/sh", str(script)],
                env=env,
                cwd=temp_dir,
                capture_output=True,
                text=True,
                timeout=BOOT_TIMEOUT_SECONDS,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return f"the boot script ran over {BOOT_TIMEOUT_SECONDS:.0f} s"
        if result.returncode != 0:
            tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-5:])
            return f"the boot script exited {result.returncode}: {tail}"
        return None

    def instances(self, cluster: str) -> list[Instance] | DriverError:
        with self._state() as state:
            return [
                self._instance(instance_id, record)
                for instance_id, record in sorted(state.items())
                if record["tags"].get("hypermedia-cluster") == cluster
                and record["state"] != "terminating"
            ]

    def terminate(self, instance_id: str) -> DriverError | None:
        """Stop the node, then free its address and temp dir. Until the stop has
        ended the record stays (unlisted, ``terminating``): a launch meanwhile must
        not take the same address and temp dir, which the stop is about to remove
        (the new node would lose its sockets and session files under it)."""
        with self._state() as state:
            record = state.get(instance_id)
            if record is None or record["state"] == "terminating":
                return None
            record["state"] = "terminating"
        with self._bill() as bill:
            if instance_id in bill and bill[instance_id]["end"] is None:
                bill[instance_id]["end"] = time.time()
        try:
            self._node(record).stop()
        finally:
            with self._state() as state:
                state.pop(instance_id, None)
        log.info("local instance %s terminated", instance_id)
        return None

    def price(self, spot: bool) -> float | DriverError:
        return self.price_of(spot)

    def price_of(self, spot: bool) -> float:
        return self.spot if spot else self.on_demand

    def charges(self, cluster: str, first_day: str, last_day: str) -> list[Charge]:
        """Each instance's cost per UTC day from ``first_day`` to ``last_day``, as the
        machine kept it (see the module docstring)."""
        start = day_start(first_day)
        end = day_start(last_day) + DAY_SECONDS
        now = time.time()
        with self._bill() as bill:
            lives = [(i, dict(r)) for i, r in sorted(bill.items()) if r["cluster"] == cluster]
        found = []
        for instance_id, life in lives:
            day = max(start, day_start(day_of(life["start"])))
            stop = min(end, life["end"] if life["end"] is not None else now)
            while day < stop:
                seconds = min(stop, day + DAY_SECONDS) - max(day, life["start"])
                if seconds > 0:
                    found.append(
                        Charge(
                            day=day_of(day),
                            cents=life["cents_per_hour"] * seconds / HOUR_SECONDS,
                            request_id=life["request_id"],
                            instance_id=instance_id,
                        )
                    )
                day += DAY_SECONDS
        return found

    def running(self, instance_id: str) -> bool:
        """Whether the instance's Ray processes are alive (the tests look)."""
        with self._state() as state:
            record = state.get(instance_id)
        return record is not None and self._node(record).is_running()
