"""The head's ``ray start`` (hypermedia.worker.ray_start): Ray's own command line, in a
process of its own as the head starts it."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hypermedia.worker import ray_start

_PROBE = """
import json, os, sys, time
from ray._private import services  # as lean_ray_start imports it (nothing more of Ray)
started = []
services.start_ray_process = lambda command, kind, *args, **kwargs: started.append(command)
from hypermedia.worker import ray_start
from hypermedia.worker.ray_start import lean_ray_start
stand_ins = lean_ray_start(agents=False)
from ray.scripts import scripts
dashboard = services.ray_constants.PROCESS_TYPE_DASHBOARD
services.start_ray_process(["python", "dashboard.py", "--port=1"], dashboard, False)
services.start_ray_process(["python", "dashboard.py", "--minimal"], dashboard, False)
raylet = services.ray_constants.PROCESS_TYPE_RAYLET
services.start_ray_process(["raylet", "--port=1"], raylet, False)
getattr(ray_start, "DASHBOARD_MODULES", {})["NoSuchHead"] = "ray.dashboard.modules.node.node_head"
services.start_ray_process(["python", "dashboard.py", "--port=1"], dashboard, False)
session_dir, raylet_command = sys.argv[1], json.loads(sys.argv[2])
services.start_ray_process(raylet_command, raylet, False)
from ray import _raylet
del _raylet.RUNTIME_ENV_AGENT_PORT_NAME  # a Ray without one of the names
print(json.dumps({
    "stand_ins": stand_ins,
    "no_writer_without_a_name": ray_start._port_writer() is None,
    "ports": {n: open(os.path.join(session_dir, n)).read() for n in os.listdir(session_dir)},
    "commands": sorted(scripts.cli.commands),
    "loaded": sorted(m for m in ("ray.serve", "numpy", "ray.util.state") if m in sys.modules),
    "client": scripts.get_ray_client_dependency_error() is None,
    "dashboard_off": services.start_api_server(False, False, *[None] * 7),
    "started": started,
    "patient_get_node": services.get_node.__qualname__.startswith("patient_get_node"),
}))
"""


@pytest.fixture(scope="module")
def seen(tmp_path_factory) -> dict[str, Any]:
    """What ``ray start``'s process looks like once lean_ray_start ran, told to stand in
    for the agents (one interpreter importing Ray, ~1.2 CPU-s, for the tests of this
    module that read it)."""
    session_dir = tmp_path_factory.mktemp("session")
    raylet = json.dumps(_raylet_command(session_dir))
    probe = subprocess.run(
        [sys.executable, "-c", _PROBE, str(session_dir), raylet],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
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
    trimmed, minimal, raylet, unknown, _raylet_without_agents = seen["started"]
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


def test_ray_start_waits_past_rays_30_s_for_its_raylet_to_register(seen):
    """Ray's 30 s wait for the raylet to register ran out on a loaded machine, and the
    node was started afresh (tests/integration/test_ray_node.py holds a real raylet)."""
    assert seen["patient_get_node"]


class _NotRegistered:
    """Ray's services.get_node as the GCS answers it: RuntimeError ``missing`` times."""

    def __init__(self, missing: int, error: Exception | None = None) -> None:
        self.missing, self.error, self.calls = missing, error, 0

    def __call__(self, gcs_address: str, node_id: str) -> dict[str, str]:
        self.calls += 1
        if self.error is not None:
            raise self.error
        if self.calls <= self.missing:
            raise RuntimeError(f"Node {node_id} not found")
        return {"node_id": node_id}


def test_get_node_waits_for_the_node_then_gives_up_or_stops_when_the_raylet_exited():
    patient = lambda get_node, alive=lambda: True: ray_start.patient_get_node(  # noqa: E731
        get_node, alive, patience=0.3, poll=0.01
    )
    registers_late = _NotRegistered(5)
    assert patient(registers_late)("gcs", "n1") == {"node_id": "n1"}
    assert registers_late.calls == 6
    never = _NotRegistered(10**6)
    wait = patient(never)
    with pytest.raises(RuntimeError, match="not found"):
        wait("gcs", "n1")
    assert 5 < never.calls < 40
    calls = never.calls
    with pytest.raises(RuntimeError):  # its patience is spent: Ray's loop's own pace
        wait("gcs", "n1")
    assert never.calls == calls + 1
    dead = _NotRegistered(10**6)
    with pytest.raises(RuntimeError):
        patient(dead, lambda: False)("gcs", "n1")
    assert dead.calls == 1
    unreachable = _NotRegistered(0, error=ConnectionError("GCS down"))
    with pytest.raises(ConnectionError):
        patient(unreachable)("gcs", "n1")
    assert unreachable.calls == 1


_NO_GET_NODE = """
from ray._private import services
del services.get_node  # a Ray without it
from hypermedia.worker.ray_start import lean_ray_start
lean_ray_start()
print(hasattr(services, "get_node"))
"""


def test_a_ray_without_get_node_starts_as_it_would():
    probe = subprocess.run(
        [sys.executable, "-c", _NO_GET_NODE],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert probe.stdout.strip() == "False"


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


NODE_ID = "ab" * 28


def _raylet_command(session_dir: Path, runtime_env_port: str = "47007") -> list[str]:
    """A raylet's command as Ray's services.start_raylet builds it (the parts read)."""
    dashboard_agent = [
        sys.executable,
        "-u",
        "/ray/dashboard/agent.py",
        f"--node-id={NODE_ID}",
        "--node-ip-address=127.0.0.1",
        "--metrics-export-port=47004",
        "--grpc-port=47006",
        "--listen-port=47005",
        f"--session-dir={session_dir}",
        "--logging-filename=dashboard_agent.log",
        "--head",
    ]
    runtime_env_agent = [
        sys.executable,
        "-u",
        "/ray/_private/runtime_env/agent/main.py",
        f"--node-id={NODE_ID}",
        "--node-ip-address=127.0.0.1",
        f"--runtime-env-agent-port={runtime_env_port}",
        f"--session-dir={session_dir}",
        "--logging-filename=runtime_env_agent.log",
    ]
    return [
        "/ray/raylet",
        "--node_manager_port=47002",
        f"--dashboard_agent_command={subprocess.list2cmdline(dashboard_agent)}",
        f"--runtime_env_agent_command={subprocess.list2cmdline(runtime_env_agent)}",
        "--head",
    ]


def test_a_head_nobody_observes_starts_stand_ins_for_rays_agents(tmp_path, seen):
    """The raylet of a head started ``--without-agents`` starts stand-ins in place of
    Ray's dashboard agent (~0.8 CPU-s at a `hypermedia run`'s start, then polling) and
    runtime env agent (~0.45): the runtime env one keeps Ray's command, to become Ray's
    agent when a runtime_env is asked for. The port files the raylet waits for are
    written as a minimal Ray's agent writes them (-1) and, for the runtime env agent's
    port, as the agent would; the rest of the command is Ray's."""
    written: list[tuple[str, str, tuple[int, ...]]] = []
    command = _raylet_command(tmp_path)
    replaced = ray_start.without_agents(
        command, lambda *args: written.append((args[0], args[1], tuple(args[2])))
    )
    assert written == [(str(tmp_path), NODE_ID, (-1, -1, -1, 47007))]
    assert [replaced[0], replaced[1], replaced[4]] == [command[0], command[1], command[4]]
    flag, _, dashboard = replaced[2].partition("=")
    assert flag == "--dashboard_agent_command"
    stand_in = [sys.executable, "-S", str(Path(ray_start.__file__).with_name("agent_stand_in.py"))]
    assert shlex.split(dashboard) == [*stand_in, "dashboard_agent", f"--session-dir={tmp_path}"]
    flag, _, runtime_env = replaced[3].partition("=")
    assert flag == "--runtime_env_agent_command"
    rays = shlex.split(command[3].partition("=")[2])
    assert shlex.split(runtime_env) == [
        *stand_in,
        "runtime_env_agent",
        "--listen=127.0.0.1:47007",
        "--",
        *rays,
    ]
    # In this Ray: ray start's raylet gets them, the port files written by Ray's writer.
    assert seen["stand_ins"] is True
    (raylet,) = [c for c in seen["started"] if "--node_manager_port=47002" in c]
    assert "agent_stand_in.py" in raylet[2] and "agent_stand_in.py" in raylet[3]
    assert seen["ports"] == {
        f"{name}_{NODE_ID}": port
        for name, port in (
            ("metrics_agent_port", "-1"),
            ("metrics_export_port", "-1"),
            ("dashboard_agent_listen_port", "-1"),
            ("runtime_env_agent_port", "47007"),
        )
    }


@pytest.mark.parametrize(
    "change",
    [
        lambda c: [a for a in c if not a.startswith("--runtime_env_agent_command=")],
        lambda c: [a.replace("--session-dir=", "--session_dir=") for a in c],
        lambda c: [
            a.replace("--runtime-env-agent-port=47007", "--runtime-env-agent-port=0") for a in c
        ],
        # Quoting list2cmdline makes and a POSIX split reads otherwise: not read.
        lambda c: [a.replace("--head", 'say="x\\\\"') if "dashboard" in a else a for a in c],
    ],
    ids=["one-agent", "no-session-dir", "port-0", "quoting"],
)
def test_a_raylet_command_not_as_ray_builds_it_keeps_rays_agents(tmp_path, change, seen):
    """A Ray whose raylet command differs (an option read here missing or renamed,
    quoting not read back the same) starts its own agents: the command as it is, no port
    file written (the agents write theirs). So does a Ray without the port files' writer
    or one of their names (no stand-in could start: nothing would write them)."""
    command = change(_raylet_command(tmp_path))
    written: list[object] = []
    assert ray_start.without_agents(command, lambda *args: written.append(args)) == command
    assert written == []
    assert seen["no_writer_without_a_name"] is True


def test_metrics_collection_goes_off_in_the_heads_system_config():
    """A head without agents has nothing to export metrics to: collection is off in its
    system config (which the GCS hands to every process of the cluster), beside a system
    config the command line already has."""
    no_metrics = {"enable_metrics_collection": False}
    args = ray_start._metrics_off(["start", "--head"])
    assert args[:2] == ["start", "--head"]
    assert json.loads(args[2].removeprefix("--system-config=")) == no_metrics
    given = ray_start._metrics_off(["start", '--system-config={"a": 1}', "--head"])
    assert given[0] == "start" and given[2] == "--head"
    assert json.loads(given[1].removeprefix("--system-config=")) == {"a": 1, **no_metrics}
