"""A Ray head of ours on one machine: loopback only, private temp dir, stopped whole."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import stat
import threading
import time
from typing import Any

import psutil
import pytest
import ray

from hypermedia.errors import ServiceUnavailable
from hypermedia.worker import cluster
from tests.conftest import RAY_TOKEN


class _Probe:
    def pid(self) -> int:
        return os.getpid()

    def env(self, name: str) -> str | None:
        return os.environ.get(name)


_ProbeActor = ray.remote(num_cpus=0)(_Probe)


def _listening(procs: list[psutil.Process]) -> list[tuple[str, str, int]]:
    found = []
    for proc in procs:
        try:
            name = proc.name()
            for conn in proc.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    found.append((name, conn.laddr.ip, conn.laddr.port))
        except psutil.NoSuchProcess:
            continue
    return found


def _is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


@pytest.fixture
def head(tmp_path):
    node = cluster.start_head(
        tmp_path / "ray", resources={"queue_images": 1}, token_path=RAY_TOKEN, num_cpus=1
    )
    try:
        yield node
    finally:
        if ray.is_initialized():
            ray.shutdown()
        node.stop()


def test_a_single_machine_head_listens_on_loopback_only_and_stops_whole(head, tmp_path):
    """Listens on loopback only, keeps its temp dir to this user, and its stop leaves
    no process. It runs no Ray client server (nothing of ours speaks ray://), no
    dashboard process (Ray started one with the dashboard off, for its usage stats,
    which are off) and no autoscaler monitor (a head nobody asks `ray status`): three
    Python processes importing Ray, ~3 CPU-s of a head's start, then polling. And a
    `ray start` interrupted (Ctrl-C, `up --wait` running out) before it wrote the
    address file: a node that knows no address finds the same processes, and the stop
    of such a head leaves nothing either. And the next start on that directory: such a
    head's daemons ran without the address file its start writes last, which the next
    start took for a running head with the address "" (every test after it on the
    shared head: ValueError: Invalid address format); it stops them and starts afresh.
    That next one is a head nobody observes (``metrics=False``, `hypermedia run`'s): it
    runs stand-ins for Ray's two agents (~1.2 CPU-s at a head's start), its metrics
    collection is off, and an actor with a runtime_env (nothing of ours asks one) gets
    it: Ray's runtime env agent starts when the raylet asks for it.
    One head for these checks (they were three tests, two of them with a head of their
    own and test_a_head_left_half_started_is_stopped_and_started_afresh with two: a
    head's start costs ~7 CPU-s; its checks are the last part here)."""
    if ray.is_initialized():  # the shared head's driver (tests/ray_support.py) reconnects
        ray.shutdown()
    ray.init(address=head.address, logging_level=logging.WARNING, log_to_driver=False)
    probe: Any = _ProbeActor.remote()
    actor_pid = ray.get(probe.pid.remote())
    procs = head.processes()
    sockets = _listening([*procs, psutil.Process()])
    assert len(sockets) >= 7, sockets  # GCS, raylet, agents, metrics, actor
    wide = [s for s in sockets if not _is_loopback(s[1])]
    assert wide == [], f"listening beyond loopback: {wide}"
    assert head.address.startswith("127.0.0.1:")
    assert actor_pid in {p.pid for p in procs}  # actors are the raylet's children
    names = " ".join(_cmdline(p) for p in procs)
    for part in ("gcs_server", "raylet", "DashboardAgent", "RuntimeEnvAgent"):
        assert part in names, f"no {part} among the node's processes"
    for part in ("ray.util.client.server", "dashboard/dashboard.py", "monitor.py"):
        assert part not in names, f"{part} among the node's processes"

    info = os.lstat(head.temp_dir.parent)  # the temp dir is private
    assert stat.S_IMODE(info.st_mode) == 0o700
    assert info.st_uid == os.geteuid()

    ray.shutdown()  # stop leaves no process (the probe ends with its driver)
    # A moment after shutdown returns: taken in one list of the node's processes and not
    # in the next, it failed the comparison below now and then.
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(actor_pid).wait(timeout=30)  # TimeoutExpired: it outlived its driver
    procs = head.processes()

    # The start cut short: no address file, and a node that knows no address.
    (head.temp_dir / cluster.ADDRESS_FILE).unlink()
    cut_short = cluster.RayNode(head.temp_dir, RAY_TOKEN)
    found = cut_short.processes()
    assert {p.pid for p in found} == {p.pid for p in head.processes()}
    left = {p.pid for p in found}

    # The next start stops the head left half-started (the same stop as cut_short's:
    # a node of that temp dir without an address) and starts afresh.
    again = cluster.start_head(
        tmp_path / "ray", resources={}, token_path=RAY_TOKEN, num_cpus=0, metrics=False
    )
    try:
        assert again.temp_dir == head.temp_dir
        assert again.address.startswith("127.0.0.1:"), again.address
        cluster.wait_for_head(again.address, timeout=30)
        # The stop of the head cut short left no process running (a zombie init has not
        # reaped yet has ended: cluster._running).
        alive = cluster._wait_ended([*procs, *found], 0)
        assert alive == [], [p.pid for p in alive]
        assert left.isdisjoint(p.pid for p in again.processes() if p.is_running())

        # Unobserved: stand-ins, not Ray's agents; Ray's runtime env agent on demand.
        assert _agents(again.processes()) == ["dashboard_agent", "runtime_env_agent"]
        ray.init(address=again.address, logging_level=logging.WARNING, log_to_driver=False)
        state = ray._private.state.state._global_state_accessor
        assert state is not None
        assert json.loads(state.get_system_config())["enable_metrics_collection"] is False
        asks: Any = _ProbeActor.options(runtime_env={"env_vars": {"HM_PROBE": "1"}}).remote()
        assert ray.get(asks.env.remote("HM_PROBE"), timeout=120) == "1"
        assert _agents(again.processes()) == ["RuntimeEnvAgent", "dashboard_agent"]
        ray.shutdown()
    finally:
        if ray.is_initialized():
            ray.shutdown()
        again.stop()
    assert head.processes() == []
    assert not head.temp_dir.exists()


def _agents(procs: list[psutil.Process]) -> list[str]:
    """The agents among a node's processes: Ray's (by their titles, ``ray::...``, or
    their scripts before they set one), the stand-ins (hypermedia.worker.agent_stand_in)
    by the agent they stand in for."""
    rays = {"dashboard/agent.py": "DashboardAgent", "agent/main.py": "RuntimeEnvAgent"}
    found = []
    for proc in procs:
        try:
            args = proc.cmdline()
        except psutil.Error:
            continue
        if args[:1] in (["ray::DashboardAgent"], ["ray::RuntimeEnvAgent"]):
            found.append(args[0].removeprefix("ray::"))
        elif len(args) > 3 and args[2].endswith("agent_stand_in.py"):
            found.append(args[3])
        else:
            found += [name for script, name in rays.items() if script in " ".join(args[1:3])]
    return sorted(found)


def _cmdline(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:  # gone, or a zombie until its parent reaps it
        return ""


def test_the_temp_dir_of_another_user_is_refused(tmp_path):
    squatted = tmp_path / "squatted"
    squatted.mkdir(mode=0o777)
    os.chown(squatted, 65534, 65534)
    with pytest.raises(ServiceUnavailable, match="not a directory of this user"):
        cluster.private_directory(squatted)
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    with pytest.raises(ServiceUnavailable, match="not a directory of this user"):
        cluster.private_directory(link)


def test_ray_start_gets_an_allowlisted_environment(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "canary-aws")
    monkeypatch.setenv("HYPERMEDIA_DATABASE_URL", "postgresql://u:canary-db@h/d")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    env = cluster.ray_environment(RAY_TOKEN, loopback=True)
    assert "canary-aws" not in str(env)
    assert "canary-db" not in str(env)
    assert env["LC_ALL"] == "C.UTF-8"
    assert env["PATH"] == os.environ["PATH"]
    assert env["RAY_AUTH_TOKEN_PATH"] == str(RAY_TOKEN)
    assert env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in cluster.ray_environment(RAY_TOKEN)


RAY_SLOW_START = """Traceback (most recent call last):
    node = ray._private.node.Node(
Exception: The current node timed out during startup. This could happen because some \
of the raylet failed to startup or the GCS has become overloaded."""


def _fake_ray(tmp_path, answers: list[tuple[int, str]]):
    """A `ray` that answers ``answers`` in turn (exit code, stderr) and counts its calls."""
    calls = tmp_path / "calls"
    script = tmp_path / "ray"
    lines = ["#!/bin/sh", f'echo x >> "{calls}"', f'n=$(wc -l < "{calls}")']
    for n, (code, err) in enumerate(answers, start=1):
        (tmp_path / f"err{n}").write_text(err)
        lines.append(f'if [ "$n" -eq {n} ]; then cat "{tmp_path}/err{n}" >&2; exit {code}; fi')
    lines.append("exit 99")
    script.write_text("\n".join(lines) + "\n")
    script.chmod(0o755)
    return script, lambda: len(calls.read_text().splitlines()) if calls.exists() else 0


@pytest.mark.parametrize(
    ("answers", "calls", "error"),
    [
        ([(1, RAY_SLOW_START), (0, "")], 2, None),  # Ray's 30 s wait ran out once
        ([(1, RAY_SLOW_START), (1, RAY_SLOW_START), (0, "")], 3, None),  # twice
        (
            [(1, RAY_SLOW_START)] * cluster.START_ATTEMPTS,
            cluster.START_ATTEMPTS,
            "timed out during startup",
        ),
        ([(1, "ValueError: bad --resources"), (0, "")], 1, "bad --resources"),  # no retry
    ],
)
def test_ray_start_is_tried_again_only_when_its_raylet_was_slow_to_register(
    tmp_path, answers, calls, error
):
    ray_binary, called = _fake_ray(tmp_path, answers)
    temp_dir = tmp_path / "node"
    temp_dir.mkdir()
    start = lambda: cluster._run_start([str(ray_binary), "start"], RAY_TOKEN, temp_dir)  # noqa: E731
    if error is None:
        start()
    else:
        with pytest.raises(ServiceUnavailable, match=error):
            start()
    assert called() == calls


def test_a_stack_stopped_as_its_head_starts_leaves_no_temp_dir(settings):
    """A Ctrl-C after start_head made the head's temp dir but before `ray start` ran
    anything: the stack's stop removes the dir (it was left, empty, under /tmp)."""
    from hypermedia.local import LocalStack, ray_directory

    stack = LocalStack(settings())
    temp_dir = cluster.short_temp_dir(ray_directory(stack.settings), "head")
    cluster._prepare_temp_dir(temp_dir)  # what start_head does before `ray start`
    stack._head_temp_dir = temp_dir  # what start() had set when the interrupt came
    stack.stop()
    assert not temp_dir.parent.exists()


def test_a_ray_start_past_its_time_is_tried_again_then_refused_leaving_nothing(
    tmp_path, monkeypatch
):
    """Past its time, `ray start` is killed but the daemons it started are not: they were
    left running and the raw TimeoutExpired reached the caller. Now each try's daemons
    are stopped, the start is tried again, and the head refuses in one line."""
    monkeypatch.setattr(cluster, "START_TIMEOUT_SECONDS", 1.0)
    monkeypatch.setattr(cluster, "START_ATTEMPTS", 2)
    directory = tmp_path / "ray"
    node = cluster.RayNode(cluster.short_temp_dir(directory, "head"), RAY_TOKEN)
    try:
        with pytest.raises(ServiceUnavailable, match=r"did not finish within 1 s \(2 tries\)"):
            cluster.start_head(directory, resources={}, token_path=RAY_TOKEN, num_cpus=0)
        assert node.processes() == []
    finally:
        node.stop()


def _hold_the_first_raylet(held: dict[str, float], seconds: float, stop: threading.Event) -> None:
    """SIGSTOP the first raylet under this process (a `ray start`'s child) as soon as it
    appears, for ``seconds``; ``held`` gets when it was stopped and let go."""
    me = psutil.Process()
    deadline = time.monotonic() + 60
    raylet = None
    while raylet is None and not stop.is_set() and time.monotonic() < deadline:
        for proc in me.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if proc.name() == "raylet":
                    proc.suspend()
                    raylet = proc
                    break
        else:
            time.sleep(0.002)
    if raylet is None:
        return
    held["stopped"] = time.monotonic()
    try:
        stop.wait(seconds)
    finally:
        with contextlib.suppress(psutil.Error):
            raylet.resume()
        held["resumed"] = time.monotonic()


def test_a_raylet_slower_than_ray_s_30_s_to_register_starts_the_head_at_once(tmp_path, caplog):
    """A raylet that registers with the GCS past Ray's 30 s wait (a loaded machine: seen
    at load 3-5 and 15-20 on 2 cores): `ray start` gave up, the node was stopped and
    started afresh, three times, each meeting the same wall (`hypermedia up` failed).
    Now our `ray start` waits for it longer (hypermedia.worker.ray_start), and the head
    comes up on its first try. Here the raylet is held (SIGSTOP) for 35 s before it
    registers; the test mostly sleeps."""
    held: dict[str, float] = {}
    stop = threading.Event()
    holder = threading.Thread(target=_hold_the_first_raylet, args=(held, 35.0, stop))
    holder.start()
    caplog.set_level(logging.WARNING, logger=cluster.__name__)
    node = None
    try:
        node = cluster.start_head(tmp_path / "ray", resources={}, token_path=RAY_TOKEN, num_cpus=0)
        up = time.monotonic()
    finally:
        stop.set()
        holder.join()
        if node is not None:
            node.stop()
    retries = [r for r in caplog.records if getattr(r, "action", "") == "ray_start_retry"]
    assert retries == []
    # The raylet was caught before it registered: the head came up only once let go.
    assert "resumed" in held
    assert held["resumed"] - held["stopped"] >= 34
    assert up >= held["resumed"]
