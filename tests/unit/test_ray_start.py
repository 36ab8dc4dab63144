"""The head's ``ray start`` (hypermedia.worker.ray_start): Ray's own command line, in a
process of its own as the head starts it."""

from __future__ import annotations

import json
import subprocess
import sys

_PROBE = """
import json, sys, time
from hypermedia.worker.ray_start import lean_ray_start
lean_ray_start()
from ray._private import services
from ray.scripts import scripts
print(json.dumps({
    "commands": sorted(scripts.cli.commands),
    "loaded": sorted(m for m in ("ray.serve", "numpy", "ray.util.state") if m in sys.modules),
    "client": scripts.get_ray_client_dependency_error() is None,
    "dashboard_off": services.start_api_server(False, False, *[None] * 7),
}))
"""


def test_ray_start_loads_no_other_command_and_starts_no_client_nor_idle_dashboard():
    """Ray's command line adds `ray serve`, `ray job` and the state commands by
    importing them, Ray Serve and numpy among them (~0.7 CPU-s of a head's start), for
    a `start` that uses none: they are not loaded, `start` is there. The client server
    is not started (Ray starts it when its dependencies import) and a dashboard left
    off starts no process (Ray's answer for a dashboard that did not start)."""
    probe = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, check=True
    )
    seen = json.loads(probe.stdout)
    assert "start" in seen["commands"], seen["commands"]
    assert not {"serve", "job", "list"} & set(seen["commands"]), seen["commands"]
    assert seen["loaded"] == [], seen["loaded"]
    assert seen["client"] is False
    assert seen["dashboard_off"] == [None, None]


_OTHER_RAY = """
import json
from ray._private import services
def start_api_server(dashboard_host, *args, **kwargs):  # a Ray whose signature differs
    return "ray's own"
services.start_api_server = start_api_server
from hypermedia.worker.ray_start import lean_ray_start
lean_ray_start()
print(json.dumps(services.start_api_server(False)))
"""


def test_a_ray_whose_internals_differ_gets_its_own_dashboard_start():
    """Ray is not pinned for pip installs: a start_api_server whose first parameter is
    not include_dashboard is left as it is (Ray's own start), never called with a
    patch's reading of its arguments."""
    probe = subprocess.run(
        [sys.executable, "-c", _OTHER_RAY], capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(probe.stdout) == "ray's own"
