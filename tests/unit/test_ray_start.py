"""The head's ``ray start`` (hypermedia.worker.ray_start): Ray's own command line, in a
process of its own as the head starts it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from typing import Any

import pytest

_PROBE = """
import json, sys, time
from ray._private import services  # as lean_ray_start imports it (nothing more of Ray)
started = []
services.start_ray_process = lambda command, kind, *args, **kwargs: started.append(command)
from hypermedia.worker import ray_start
from hypermedia.worker.ray_start import lean_ray_start
lean_ray_start()
from ray.scripts import scripts
dashboard = services.ray_constants.PROCESS_TYPE_DASHBOARD
services.start_ray_process(["python", "dashboard.py", "--port=1"], dashboard, False)
services.start_ray_process(["python", "dashboard.py", "--minimal"], dashboard, False)
raylet = services.ray_constants.PROCESS_TYPE_RAYLET
services.start_ray_process(["raylet", "--port=1"], raylet, False)
getattr(ray_start, "DASHBOARD_MODULES", {})["NoSuchHead"] = "ray.dashboard.modules.node.node_head"
services.start_ray_process(["python", "dashboard.py", "--port=1"], dashboard, False)
print(json.dumps({
    "commands": sorted(scripts.cli.commands),
    "loaded": sorted(m for m in ("ray.serve", "numpy", "ray.util.state") if m in sys.modules),
    "client": scripts.get_ray_client_dependency_error() is None,
    "dashboard_off": services.start_api_server(False, False, *[None] * 7),
    "started": started,
}))
"""


@pytest.fixture(scope="module")
def seen() -> dict[str, Any]:
    """What ``ray start``'s process looks like once lean_ray_start ran (one interpreter
    importing Ray, ~1.2 CPU-s, for the tests of this module that read it)."""
    probe = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, check=True
    )
    found: dict[str, Any] = json.loads(probe.stdout)
    return found


def test_ray_start_loads_no_other_command_and_starts_no_client_nor_idle_dashboard(seen):
    """Ray's command line adds `ray serve`, `ray job` and the state commands by
    importing them, Ray Serve and numpy among them (~0.7 CPU-s of a head's start), for
    a `start` that uses none: they are not loaded, `start` is there. The client server
    is not started (Ray starts it when its dependencies import) and a dashboard left
    off starts no process (Ray's answer for a dashboard that did not start)."""
    assert "start" in seen["commands"], seen["commands"]
    assert not {"serve", "job", "list"} & set(seen["commands"]), seen["commands"]
    assert seen["loaded"] == [], seen["loaded"]
    assert seen["client"] is False
    assert seen["dashboard_off"] == [None, None]


def test_the_dashboard_loads_the_modules_of_the_pages_an_operator_opens(seen):
    """The dashboard a head of ours starts loads the modules behind its Cluster, Actors,
    Jobs, Logs and Metrics pages, the cluster status and the events, and not Ray Serve's,
    Ray Train's or Ray Data's (it loaded all nine, a process each: the dashboard's
    processes took 6.5 CPU-s by an `up`'s first idle minute's end, 5.3 now). A dashboard
    started ``--minimal`` (no process modules) and Ray's other processes are started as
    Ray says; so is the whole dashboard in a Ray that does not define one of the modules
    (the dashboard would refuse to start)."""
    trimmed, minimal, raylet, unknown = seen["started"]
    assert trimmed[:-1] == ["python", "dashboard.py", "--port=1"]
    loaded = trimmed[-1].removeprefix("--modules-to-load=").split(",")
    assert trimmed[-1].startswith("--modules-to-load="), trimmed
    pages = {"NodeHead", "ReportHead", "StateHead", "MetricsHead", "EventHead", "JobHead"}
    assert pages <= set(loaded), loaded
    assert not {"ServeHead", "TrainHead", "DataHead"} & set(loaded), loaded
    assert minimal == ["python", "dashboard.py", "--minimal"]
    assert raylet == ["raylet", "--port=1"]
    assert unknown == ["python", "dashboard.py", "--port=1"]


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


def test_a_worker_node_starts_through_the_lean_launcher_too(tmp_path, monkeypatch):
    """`hypermedia worker`'s node (cluster.start_worker_node) ran Ray's whole command
    line, whose other commands' imports (Ray Serve, numpy, the state API) are ~1.2 of the
    ~2.3 CPU-s of a worker's `ray start` here; it runs hypermedia.worker.ray_start as a
    head does. Nothing is started: the command is what is checked."""
    from hypermedia.worker import cluster

    ran: list[list[str]] = []

    def run(command, env, timeout):
        ran.append(command)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(cluster, "_run_ray_start", run)
    token = tmp_path / "token"
    token.write_text("x")
    try:
        cluster.start_worker_node(tmp_path, "127.0.0.10:6390", token, name="w", resources={})
    finally:  # its temp dir, under /tmp
        shutil.rmtree(cluster.short_temp_dir(tmp_path, "w").parent)
    ((python, dash_m, module, start, address, *_rest),) = ran
    assert [python, dash_m, module, start] == [
        sys.executable,
        "-m",
        "hypermedia.worker.ray_start",
        "start",
    ]
    assert address == "--address=127.0.0.10:6390"
