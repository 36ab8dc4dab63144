"""``ray start`` for a node of ours (``python -m hypermedia.worker.ray_start`` takes the
arguments of ``ray start``; :func:`hypermedia.worker.cluster.start_head` and
:func:`~hypermedia.worker.cluster.start_worker_node` run it, so do a ``ray up`` head's
``python -m autoscaler.head ray-start``, the local driver's instances' ``ray`` and a
burst node's, the worker image's through docker/host/ray). A head goes without two
processes Ray's head starts whatever it is told and that nothing of ours uses:

- Ray's client server (``ray://`` drivers): ``ray start --head`` starts one whenever
  grpc is importable (it is: Ray needs it) and refuses port 0 for it. Our drivers (the
  stack's, ``hypermedia worker``'s, the tests') connect to the GCS; nothing of ours
  speaks ``ray://``.
- With ``--include-dashboard=false``, the dashboard process all the same, loading only
  its usage-stats module (usage stats are off on every node of ours:
  ``RAY_USAGE_STATS_ENABLED=0``, ``--disable-usage-stats``). ``ray start`` also waited
  for it to come up.

And the dashboard asked for (``--include-dashboard=true``) loads the modules whose pages
an operator of ours opens (:data:`DASHBOARD_MODULES`), not Ray Serve's, Ray Train's and
Ray Data's: each of those is a process of its own polling the GCS for as long as the head
runs, for libraries nothing of ours uses (Ray Serve is not even installed: its page
answers 501 with the module loaded).

Each is a Python process importing Ray (~1.2 CPU-s at a head's start here), then
polling the GCS for as long as the head runs.

And ``ray start`` itself, on every node, goes without the command groups Ray's command
line adds for its other commands (``ray serve``, ``ray job``, ``ray list``/``get``/
``summary``/``logs``): importing them loads Ray Serve, numpy and the state API (~0.7
of the ~1.2 CPU-s of Ray's command line's imports here). Ray adds each only if it
imports, and ``start`` uses none.

A head nobody observes (``--without-agents``, ours only, taken off before Ray reads the
command line: :func:`~hypermedia.worker.cluster.start_head` with neither the dashboard
nor ``metrics``, `hypermedia run`'s) also goes without Ray's two agents, which its raylet
starts whatever it is told (~0.8 and ~0.45 CPU-s at a `run`'s start, then polling):

- the dashboard agent exports the node's metrics (the actors' ``ray.util.metrics``,
  Ray's own) at its metrics export port, and serves the dashboard its node's stats and
  logs and runs its job submissions. With no dashboard there is nobody to serve, and
  nobody scrapes a `run`'s metrics (no ``ray.json`` tells Prometheus where they are):
  metrics collection is off in the cluster's system config, so nothing records metrics
  nor tries to export them every 10 s;
- the runtime env agent sets up a task's or actor's ``runtime_env``, which nothing of
  ours asks (settings and secrets go to actors as constructor arguments, never there).

The raylet ends itself when an agent exits and waits for the port files the agents
write, so it gets stand-ins (:mod:`hypermedia.worker.agent_stand_in`) and the files are
written before it starts, by Ray's own writer, as a minimal Ray's agent writes them (-1:
not in use). The runtime env agent's stand-in listens on its port and becomes Ray's
agent when someone connects: a ``runtime_env`` asked for all the same works, as Ray's
(the raylet asks again every second meanwhile). A raylet command not as Ray 2.5x-2.6x
builds it (:func:`without_agents`) keeps Ray's agents.

And ``ray start`` waits longer for its raylet to register with the GCS: Ray waits 30 s,
then fails ("The current node timed out during startup"), and on a loaded machine (seen:
load 3-5 and 15-20 on 2 cores) a raylet took longer; the node was stopped and started
afresh (:func:`hypermedia.worker.cluster.start_with_retries`), its work thrown away, and
met the same wall again, three times. Now each of Ray's looks in the GCS for the node
(``services.get_node``, which raises RuntimeError while it is not there) looks again
every :data:`REGISTER_POLL_SECONDS` until :data:`REGISTER_PATIENCE_SECONDS` after the
first, unless the raylet exited (then Ray's own 30 s, as before). Nothing else of ``ray
start`` changes.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# ``--without-agents`` (a head's: hypermedia.worker.cluster.start_head for a head nobody
# observes): taken off the command line before Ray reads it.
WITHOUT_AGENTS = "--without-agents"
# The raylet's options that carry its agents' commands.
_DASHBOARD_AGENT_FLAG = "--dashboard_agent_command"
_RUNTIME_ENV_AGENT_FLAG = "--runtime_env_agent_command"
# ray._raylet's names of the port files the raylet waits for: the dashboard agent's
# three, the runtime env agent's.
_AGENT_PORT_NAMES = (
    "METRICS_AGENT_PORT_NAME",
    "METRICS_EXPORT_PORT_NAME",
    "DASHBOARD_AGENT_LISTEN_PORT_NAME",
    "RUNTIME_ENV_AGENT_PORT_NAME",
)
_NO_METRICS = {"enable_metrics_collection": False}
# How long in all `ray start` waits for its raylet to register with the GCS (Ray's own
# wait: 30 s), and how often it looks meanwhile (Ray's own loop looks again at once).
# hypermedia.worker.cluster.START_TIMEOUT_SECONDS is longer, with room for the rest.
REGISTER_PATIENCE_SECONDS = 120.0
REGISTER_POLL_SECONDS = 0.25

# Ray's command line adds these command groups only if they import (ray.scripts.scripts).
_OTHER_COMMANDS = (
    "ray.serve.scripts",
    "ray.dashboard.modules.job.cli",
    "ray.util.state.state_cli",
)

# The dashboard's modules a head of ours loads (``dashboard.py --modules-to-load``), by
# the pages and commands that ask them, and the module of Ray's that defines each.
DASHBOARD_MODULES = {
    # Cluster (the nodes, each node's page) and Actors (logical/actors).
    "NodeHead": "ray.dashboard.modules.node.node_head",
    # The cluster status (Overview, Cluster), stack traces and CPU/memory profiles of a
    # worker, Prometheus's service discovery (``ray.json``).
    "ReportHead": "ray.dashboard.modules.reporter.reporter_head",
    # Logs, tasks, an actor's page, `ray list`/`get`/`summary`/`logs`.
    "StateHead": "ray.dashboard.modules.state.state_head",
    # Metrics: Prometheus and Grafana found, Ray's Grafana dashboards (``ray-dashboards``).
    "MetricsHead": "ray.dashboard.modules.metrics.metrics_head",
    # Events (Overview, a job's page): what Ray reports of its nodes and workers.
    "EventHead": "ray.dashboard.modules.event.event_head",
    # Jobs (the drivers: the head's, `hypermedia worker`'s), ``/api/version``, `ray job`.
    "JobHead": "ray.dashboard.modules.job.job_head",
    # In the dashboard's own process (no process of its own): whether usage stats are
    # on (never on our nodes), the cluster's id. What Ray loads with the dashboard off.
    "UsageStatsHead": "ray.dashboard.modules.usage_stats.usage_stats_head",
    # Both off unless their switch is set (then loaded, as Ray would).
    "TaskEventsHead": "ray.dashboard.modules.task_events.task_events_head",
    "PlatformEventsHead": "ray.dashboard.modules.platform_events.platform_event_head",
}


def dashboard_modules() -> str | None:
    """``--modules-to-load`` for the dashboard; None (every module, Ray's own choice) in
    a Ray that does not define each of :data:`DASHBOARD_MODULES` where it is listed:
    the dashboard refuses to start when a module it is told to load is not there."""
    for name, module in DASHBOARD_MODULES.items():
        try:
            spec = importlib.util.find_spec(module)
        except ImportError:
            return None
        origin = spec.origin if spec is not None else None
        try:
            with open(origin or "", encoding="utf-8") as source:
                if f"class {name}(" not in source.read():
                    return None
        except OSError:
            return None
    return ",".join(DASHBOARD_MODULES)


def _with_modules(command: Sequence[str], modules: str | None) -> list[str]:
    """The dashboard's command, told which modules to load (one started with
    ``--minimal``, which loads none of its process modules, or told already: as it is)."""
    command = list(command)
    if modules is None or any(
        a == "--minimal" or a.startswith("--modules-to-load") for a in command
    ):
        return command
    return [*command, f"--modules-to-load={modules}"]


PortWriter = Callable[[str, str, Sequence[int]], None]


def _port_writer() -> PortWriter | None:
    """What writes the agents' port files in the session dir, which the raylet waits for
    (30 s, then it fails) whatever ports it was given: Ray's own writer (persist_port)
    under Ray's names (:data:`_AGENT_PORT_NAMES`, in that order), as the agents use
    them. None in a Ray without them."""
    try:
        from ray import _raylet
    except ImportError:
        return None
    names = [getattr(_raylet, name, None) for name in _AGENT_PORT_NAMES]
    persist = getattr(_raylet, "persist_port", None)
    if persist is None or not all(isinstance(name, str) and name for name in names):
        return None

    def write(session_dir: str, node_id: str, ports: Sequence[int]) -> None:
        for name, port in zip(names, ports, strict=True):
            persist(session_dir, node_id, name, port)

    return write


def _option(command: Sequence[str], name: str) -> str | None:
    return next((a.partition("=")[2] for a in command if a.startswith(f"{name}=")), None)


def _split(line: str) -> list[str] | None:
    """A command Ray joined with ``subprocess.list2cmdline`` for the raylet, split; None
    when splitting and joining again does not give it back (quoting we do not read)."""
    try:
        parts = shlex.split(line)
    except ValueError:
        return None
    return parts if subprocess.list2cmdline(parts) == line else None


def without_agents(command: Sequence[str], write_ports: PortWriter) -> list[str]:
    """The raylet's ``command`` with its two agents' commands replaced by
    :mod:`hypermedia.worker.agent_stand_in` (the runtime env agent's kept, for the stand-in
    to become when someone needs it), and the agents' port files written as a minimal
    Ray's dashboard agent writes them (-1: not in use) and as the runtime env agent would
    (its port), with ``write_ports`` (:func:`_port_writer`). A command not as Ray 2.5x-2.6x
    builds it (the options read here missing, quoting this does not read) is answered as
    it is: Ray's own agents."""
    command = list(command)
    flags = {}
    for i, arg in enumerate(command):
        flag = arg.partition("=")[0]
        if flag in (_DASHBOARD_AGENT_FLAG, _RUNTIME_ENV_AGENT_FLAG):
            flags[flag] = i
    if len(flags) != 2:
        return command
    dashboard_agent = _split(command[flags[_DASHBOARD_AGENT_FLAG]].partition("=")[2])
    runtime_env_agent = _split(command[flags[_RUNTIME_ENV_AGENT_FLAG]].partition("=")[2])
    if dashboard_agent is None or runtime_env_agent is None:
        return command
    session_dir = _option(dashboard_agent, "--session-dir")
    node_id = _option(dashboard_agent, "--node-id")
    host = _option(runtime_env_agent, "--node-ip-address")
    port = _option(runtime_env_agent, "--runtime-env-agent-port") or ""
    if not (session_dir and node_id and host and port.isdigit() and int(port) > 0):
        return command
    stand_in = [sys.executable, "-S", str(Path(__file__).with_name("agent_stand_in.py"))]
    replaced = {
        _DASHBOARD_AGENT_FLAG: [*stand_in, "dashboard_agent", f"--session-dir={session_dir}"],
        _RUNTIME_ENV_AGENT_FLAG: [
            *stand_in,
            "runtime_env_agent",
            f"--listen={host}:{port}",
            "--",
            *runtime_env_agent,
        ],
    }
    for flag, stand_in_command in replaced.items():
        line = subprocess.list2cmdline(stand_in_command)
        if _split(line) != stand_in_command:
            return command
        command[flags[flag]] = f"{flag}={line}"
    write_ports(session_dir, node_id, (-1, -1, -1, int(port)))
    return command


def patient_get_node(
    get_node: Callable[[str, str], Any],
    raylet_alive: Callable[[], bool],
    *,
    patience: float = REGISTER_PATIENCE_SECONDS,
    poll: float = REGISTER_POLL_SECONDS,
) -> Callable[[str, str], Any]:
    """``get_node`` (Ray's ``services.get_node``: the node's info in the GCS, RuntimeError
    while the node has not registered) that, while the node is not there, looks again
    every ``poll`` seconds until ``patience`` seconds after its first call, and then
    raises what ``get_node`` raised; at once when ``raylet_alive`` answers False (Ray's
    own wait then, which ends in its 30 s). Any other error is raised as it comes."""
    deadline: float | None = None

    def wait(gcs_address: str, node_id: str) -> Any:
        nonlocal deadline
        if deadline is None:
            deadline = time.monotonic() + patience
        while True:
            try:
                return get_node(gcs_address, node_id)
            except RuntimeError:
                if time.monotonic() + poll >= deadline or not raylet_alive():
                    raise
            time.sleep(poll)

    return wait


def _running(info: Any) -> bool:
    """Whether the process of Ray's ``ProcessInfo`` ``info`` has not exited (True when
    ``info`` is not as Ray 2.5x-2.6x makes it: nothing read, nothing concluded)."""
    poll = getattr(getattr(info, "process", None), "poll", None)
    return poll is None or poll() is None


def lean_ray_start(*, agents: bool = True) -> bool:
    """Make this process's ``ray start`` start neither, load no other command, and
    start a dashboard with :data:`DASHBOARD_MODULES`; with ``agents`` False, its raylet
    starts stand-ins for its agents (:func:`without_agents`; see the module's
    docstring). And it waits :data:`REGISTER_PATIENCE_SECONDS` for its raylet to
    register (:func:`patient_get_node`), in a Ray that has ``services.get_node``.
    Answers whether the raylet starts stand-ins (Ray's internals as measured)."""
    for name in _OTHER_COMMANDS:
        # None in sys.modules: importing it raises ImportError at once, its package
        # not imported either.
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]
    import inspect

    from ray._private import ray_constants, services
    from ray.scripts import scripts

    # Ray's internals as of the versions it was measured on (2.50-2.60): a Ray whose
    # differ gets its own `ray start`, whole, rather than a patch that misreads it.
    if hasattr(scripts, "get_ray_client_dependency_error"):

        def no_client() -> ImportError:
            return ImportError("the Ray client server is not started for heads of hypermedia")

        # `ray start` starts the client server when this answers None (grpc imports).
        scripts.get_ray_client_dependency_error = no_client
    start_process = getattr(services, "start_ray_process", None)
    write_ports = None if agents else _port_writer()
    raylet_type = getattr(ray_constants, "PROCESS_TYPE_RAYLET", None)
    raylet = raylet_type if write_ports else None
    # The raylets this `ray start` started (Ray's ProcessInfo), seen by start_ray_process.
    raylets: list[Any] = []
    get_node = getattr(services, "get_node", None)
    if get_node is not None:
        services.get_node = patient_get_node(
            get_node, lambda: all(_running(info) for info in raylets)
        )
    dashboard = None
    real = getattr(services, "start_api_server", None)
    if real is not None and next(iter(inspect.signature(real).parameters), "") == (
        "include_dashboard"
    ):

        def start_api_server(include_dashboard: bool | None, *args: Any, **kwargs: Any) -> Any:
            if include_dashboard is False:
                # What Ray's node does when the dashboard could not start: no process, no
                # URL in the GCS (raise_on_failure is False with the dashboard off).
                return None, None
            return real(include_dashboard, *args, **kwargs)

        services.start_api_server = start_api_server
        dashboard = getattr(ray_constants, "PROCESS_TYPE_DASHBOARD", None)
    if start_process is None or (dashboard is None and raylet_type is None):
        return False

    def start_ray_process(
        command: Sequence[str], process_type: str, *args: Any, **kwargs: Any
    ) -> Any:
        if process_type == dashboard:
            command = _with_modules(command, dashboard_modules())
        elif process_type == raylet and write_ports is not None:
            command = without_agents(command, write_ports)
        info = start_process(command, process_type, *args, **kwargs)
        if process_type == raylet_type:
            raylets.append(info)
        return info

    services.start_ray_process = start_ray_process
    return raylet is not None


def _metrics_off(args: list[str]) -> list[str]:
    """``ray start``'s ``args`` with Ray's metrics collection off in the cluster's system
    config (the GCS hands it to every raylet, worker and driver): nothing records metrics
    for an agent that is not there, nor tries to export them every 10 s."""
    for i, arg in enumerate(args):
        flag, _, value = arg.partition("=")
        if flag == "--system-config":
            return [
                *args[:i],
                f"{flag}={json.dumps({**json.loads(value), **_NO_METRICS})}",
                *args[i + 1 :],
            ]
    return [*args, f"--system-config={json.dumps(_NO_METRICS)}"]


def main() -> None:
    from hypermedia.exits import freeze_at_exit

    freeze_at_exit()  # the interpreter's last collection, skipped (hypermedia.exits)
    args = sys.argv[1:]
    # A head's option only (the system config is the head's): a node joining a head
    # runs Ray's agents.
    agents = WITHOUT_AGENTS not in args or "--head" not in args
    args = [a for a in args if a != WITHOUT_AGENTS]
    if lean_ray_start(agents=agents):
        args = _metrics_off(args)
    from ray.scripts.scripts import main as ray_main

    sys.argv = ["ray", *args]
    sys.exit(ray_main())  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    main()
