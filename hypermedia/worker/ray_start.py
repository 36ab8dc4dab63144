"""``ray start`` for a head of ours, less two processes Ray's head starts whatever it is
told and that nothing of ours uses (``python -m hypermedia.worker.ray_start`` takes the
arguments of ``ray start``; :func:`hypermedia.worker.cluster.start_head` runs it):

- Ray's client server (``ray://`` drivers): ``ray start --head`` starts one whenever
  grpc is importable (it is: Ray needs it) and refuses port 0 for it. Our drivers (the
  stack's, ``hypermedia worker``'s, the tests') connect to the GCS; nothing of ours
  speaks ``ray://``.
- With ``--include-dashboard=false``, the dashboard process all the same, loading only
  its usage-stats module (usage stats are off on every node of ours:
  ``RAY_USAGE_STATS_ENABLED=0``, ``--disable-usage-stats``). ``ray start`` also waited
  for it to come up. The dashboard asked for (``--include-dashboard=true``) starts as
  before.

Each is a Python process importing Ray (~1.2 CPU-s at a head's start here), then
polling the GCS for as long as the head runs.

And ``ray start`` itself goes without the command groups Ray's command line adds for
its other commands (``ray serve``, ``ray job``, ``ray list``/``get``/``summary``/
``logs``): importing them loads Ray Serve, numpy and the state API (~0.7 of the ~1.2
CPU-s of Ray's command line's imports here). Ray adds each only if it imports, and
``start`` uses none. Nothing else of ``ray start`` changes.
"""

from __future__ import annotations

import sys
from typing import Any

# Ray's command line adds these command groups only if they import (ray.scripts.scripts).
_OTHER_COMMANDS = (
    "ray.serve.scripts",
    "ray.dashboard.modules.job.cli",
    "ray.util.state.state_cli",
)


def lean_ray_start() -> None:
    """Make this process's ``ray start`` start neither, and load no other command
    (see the module's docstring)."""
    for name in _OTHER_COMMANDS:
        # None in sys.modules: importing it raises ImportError at once, its package
        # not imported either.
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]
    import inspect

    from ray._private import services
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


def main() -> None:
    lean_ray_start()
    from ray.scripts.scripts import main as ray_main

    sys.argv[0] = "ray"
    sys.exit(ray_main())  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    main()
