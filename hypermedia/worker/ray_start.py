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
imports, and ``start`` uses none. Nothing else of ``ray start`` changes.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from typing import Any

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


def lean_ray_start() -> None:
    """Make this process's ``ray start`` start neither, load no other command, and
    start a dashboard with :data:`DASHBOARD_MODULES` (see the module's docstring)."""
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
    real = getattr(services, "start_api_server", None)
    if real is None or next(iter(inspect.signature(real).parameters), "") != "include_dashboard":
        return

    def start_api_server(include_dashboard: bool | None, *args: Any, **kwargs: Any) -> Any:
        if include_dashboard is False:
            # What Ray's node does when the dashboard could not start: no process, no
            # URL in the GCS (raise_on_failure is False with the dashboard off).
            return None, None
        return real(include_dashboard, *args, **kwargs)

    services.start_api_server = start_api_server
    start_process = getattr(services, "start_ray_process", None)
    dashboard = getattr(ray_constants, "PROCESS_TYPE_DASHBOARD", None)
    if start_process is None or dashboard is None:
        return

    def start_ray_process(
        command: Sequence[str], process_type: str, *args: Any, **kwargs: Any
    ) -> Any:
        if process_type == dashboard:
            command = _with_modules(command, dashboard_modules())
        return start_process(command, process_type, *args, **kwargs)

    services.start_ray_process = start_ray_process


def main() -> None:
    from hypermedia.exits import freeze_at_exit

    freeze_at_exit()  # the interpreter's last collection, skipped (hypermedia.exits)
    lean_ray_start()
    from ray.scripts.scripts import main as ray_main

    sys.argv[0] = "ray"
    sys.exit(ray_main())  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    main()
