"""`hypermedia up` leaves a local stack running for other commands; `down` stops it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from hypermedia.embedded import find_running, free_port
from hypermedia.worker.cluster import RayNode, short_temp_dir
from tests.e2e import test_secrets
from tests.stack_support import leftovers, ray_processes, wait_gone, watchdog_pid
from tests.support import IMAGES_ONLY

REPO = Path(__file__).resolve().parents[2]


def _cli(env: dict[str, str], *args: str, timeout: float = 420) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hypermedia.cli", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# No queue staffed: a stack with its grants actor and no pipeline actor (~5 CPU-s less).
NO_PIPELINE_ACTOR = {**IMAGES_ONLY, "HYPERMEDIA_QUEUES__IMAGES__WORKERS": "0"}


# One stack for all of it: a `up` costs ~10 CPU-s.
@pytest.mark.timeout(600)  # `up` may try `ray start` three times under load
def test_up_submit_down(tmp_path, pg_database_url):
    """`up` leaves a stack running for other commands, `down` stops it. A head.pid whose
    pid the system gave to another process is not taken for the head (`down` killed that
    process, `up` said "already up"); a second head on the data dir is refused and stops
    nothing of the running stack (it stopped its Redis); `down` stops a head that holds
    the data dir even without head.pid. The API listens on api_port (it was a port the
    kernel picked, another at each `up`), where the CLI's client finds it.
    And test_secrets' local storage and database case (it was a test with a stack of
    its own, the same as this one): run with canary credentials (an AWS secret, a
    PostgreSQL password, a storage and a callback signing secret; the callback secret
    once kept every actor from starting), no file of the data dir or of Ray's (the
    dashboard's logs among them) holds one, running and after `down`, but redis.conf
    its Redis password; no process has one on its command line, only the head in its
    environment (test_secrets.check_running, check_stopped)."""
    data = tmp_path / "data"
    data.mkdir()
    env = test_secrets.base_env(data)  # IMAGES_ONLY, the AWS canary
    canaries = test_secrets.local_canaries(env, pg_database_url)
    env["HYPERMEDIA_API_PORT"] = str(free_port())  # 8080, the default, may be taken here
    stranger = subprocess.Popen(["sleep", "300"])
    try:
        (data / "head.pid").write_text(f"{stranger.pid}\n")
        down = _cli(env, "down")
        assert down.stdout.strip() == "not running", down.stdout + down.stderr
        assert stranger.poll() is None
        (data / "head.pid").write_text(f"{stranger.pid}\n")
        up = _cli(env, "up")
        assert up.returncode == 0, up.stderr + (data / "head.log").read_text()[-3000:]
        assert up.stdout.startswith("up: API at "), up.stdout
        api_url = (data / "head.url").read_text()
        assert api_url == f"http://127.0.0.1:{env['HYPERMEDIA_API_PORT']}"
        assert api_url in up.stdout, up.stdout
        assert ray_processes(data), (data / "head.log").read_text()[-3000:]
        # Its head runs Ray's autoscaler monitor (`ray status`, the dashboard's cluster
        # page), which `run`'s head and the tests' go without.
        assert "monitor.py" in " ".join(map(_cmdline, ray_processes(data)))
        redis = find_running(data / "redis")
        assert redis is not None
        again = _cli(env, "up")
        assert again.returncode == 0, again.stdout + again.stderr
        assert again.stdout.strip() == f"already up: {api_url}", again.stdout + again.stderr

        second = _cli(env, "head", timeout=120)
        assert second.returncode == 1, second.stdout + second.stderr
        assert second.stderr.startswith("error: service_unavailable: another local stack ")
        assert "Traceback" not in second.stderr
        running = find_running(data / "redis")
        assert running is not None and running.pid == redis.pid
        assert (data / "head.url").read_text() == api_url
        assert httpx.get(f"{api_url}/healthz", timeout=30).status_code == 200

        added = _cli(env, "user", "add", "alice", "--credits", "100")
        key = added.stdout.strip()
        assert key.startswith("hm_"), added.stdout + added.stderr
        # The stack's API serves the operator page (autoscaler/page), not to alice.
        page = httpx.get(f"{api_url}/operator", headers={"Authorization": f"Bearer {key}"})
        assert page.status_code == 403, page.text
        client_env = {**env, "HYPERMEDIA_API_KEY": key}  # no HYPERMEDIA_API_URL: api_port
        submitted = _cli(
            client_env,
            "submit",
            str(REPO / "examples" / "banner.webp"),
            "--op",
            "thumbnail",
            "--wait",
            "--wait-timeout",
            "120",
        )
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        assert "completed" in submitted.stdout, submitted.stdout
        # The head runs the scheduler's loop (no cloud): it leads, has had its turns
        # (the alert rules, the page's queue samples).
        shown = _cli(env, "status", "--json")
        assert shown.returncode == 0, shown.stdout + shown.stderr
        status = json.loads(shown.stdout)
        assert status["leader"] and status["last_turn_at"], status
        assert "scheduler in vps_only mode, no cloud" in (data / "head.log").read_text()
        # Last: Ray writes its targets' file some seconds after its dashboard starts (the
        # wait was an idle stack's, up to 90 s, before the commands above).
        _dashboard_and_metric_targets(data, api_url)
        # The dashboard's forkserver listens in a multiprocessing temp dir; the
        # dashboard leaves by os._exit on SIGTERM, past the hook that removes it (each
        # `down` left a /tmp/pymp-*): the stop removes it.
        mp_dirs = _multiprocessing_dirs(data)
        assert mp_dirs, "no multiprocessing temp dir among the head's sockets"
        canaries = test_secrets.check_running(data, canaries, dashboard=True)

        (data / "head.pid").unlink()
        down = _cli(env, "down")
        assert down.returncode == 0, down.stdout + down.stderr
        assert down.stdout.strip() == "down", down.stdout + down.stderr
        assert wait_gone([int(line.split()[0]) for line in leftovers(data)], timeout=30) == []
        assert ray_processes(data) == []
        assert find_running(data / "redis") is None
        assert [d for d in mp_dirs if d.exists()] == []
        test_secrets.check_stopped(data, canaries)
        assert _cli(env, "down").stdout.strip() == "not running"
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()
        _cli(env, "down")


def _dashboard_and_metric_targets(data: Path, api_url: str) -> None:
    """Ray's dashboard listens on 127.0.0.1 behind the cluster's token; Prometheus finds
    the API and Ray's nodes (Ray's own service discovery file) under data/metrics/."""
    found = re.search(
        r"ray dashboard at (http://127\.0\.0\.1:(\d+))", (data / "head.log").read_text()
    )
    assert found, (data / "head.log").read_text()[-3000:]
    dashboard, port = found.group(1), int(found.group(2))
    listening = [
        c.laddr[0]
        for c in psutil.net_connections("tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr[1] == port
    ]
    assert listening and set(listening) <= {"127.0.0.1", "::ffff:127.0.0.1"}, listening
    assert httpx.get(f"{dashboard}/api/version", timeout=10).status_code == 401
    token = (data / "ray" / "auth_token").read_text().strip()
    answer = httpx.get(
        f"{dashboard}/api/version", headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    assert answer.status_code == 200, answer.text
    assert json.loads((data / "metrics" / "api.json").read_text())[0]["targets"] == [
        api_url.removeprefix("http://")
    ]
    # Ray writes its file a few seconds after the dashboard starts, then keeps it current
    # (every few seconds; slower on a loaded machine).
    listed = _ray_targets(data / "metrics" / "ray.json", timeout=90)
    assert listed["labels"] == {"job": "ray"} and listed["targets"], listed
    for target in listed["targets"]:  # each answers in Prometheus's text format
        assert "# TYPE" in httpx.get(f"http://{target}/metrics", timeout=30).text
    # The modules behind the pages an operator opens answer (Cluster and a node's page,
    # Actors, Jobs, an actor's page and Logs through the state API, the cluster status,
    # the events); Ray Serve's, Ray Train's and Ray Data's are not loaded (they were:
    # three processes more). Each module is a process named for it.
    auth = {"Authorization": f"Bearer {token}"}
    for path in (
        "/nodes?view=summary",
        "/logical/actors",
        "/api/jobs/",
        "/api/v0/actors",
        "/api/cluster_status",
        "/events",
    ):
        assert httpx.get(dashboard + path, headers=auth, timeout=30).status_code == 200, path
    assert httpx.get(f"{dashboard}/api/train/v2/runs", headers=auth, timeout=30).status_code == 404
    (head,) = [p for p in ray_processes(data) if "dashboard/dashboard.py" in _cmdline(p)]
    modules = {
        found.group(1)
        for child in psutil.Process(head).children(recursive=True)
        if (found := re.match(r"ray-dashboard-(\w+)-\d", _cmdline(child.pid)))
    }
    assert modules == {"NodeHead", "ReportHead", "StateHead", "MetricsHead", "EventHead", "JobHead"}


def _multiprocessing_dirs(data: Path) -> set[Path]:
    """The multiprocessing temp dirs (pymp-*) the head's Ray processes listen in."""
    found = set()
    for proc in RayNode(short_temp_dir(data / "ray", "head"), Path("-")).processes():
        with contextlib.suppress(psutil.Error):
            for connection in proc.net_connections(kind="unix"):
                path = Path(str(connection.laddr))  # a unix socket's: its path
                if path.parent.name.startswith("pymp-"):
                    found.add(path.parent)
    return found


def _cmdline(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""


def _ray_targets(path: Path, timeout: float) -> dict[str, Any]:
    """Ray's service discovery entry once it lists a target (or the last one read)."""
    deadline = time.monotonic() + timeout
    listed: dict[str, Any] = {}
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):  # not yet written, or mid-write
            (listed,) = json.loads(path.read_text())
        if listed.get("targets"):
            break
        time.sleep(0.5)
    return listed


# A head killed with -9 (the watchdog stops its Ray head and Redis): test_secrets'
# test_s3_credentials_reach_the_grants_actor_and_nothing_else ends its stack so.


# Two `up`s and a `down`: ~1 minute quiet; 254 s in a CI-like run at load 27 on 2 cores.
@pytest.mark.timeout(600)
def test_up_and_down_stop_what_a_killed_stack_left(tmp_path):
    """Head and watchdog killed together (the OOM killer, a kill of everything): the next
    `up` stops the old cluster before starting its own, and `down` stops what is left.
    Without Ray's dashboard (an operator's `ray_dashboard = false`): its processes are
    the dashboard process's children, stopped as every node process's are; a killed
    stack's with the dashboard on is test_secrets' S3 test's (its head killed with -9).
    Its two dashboards cost 10 of its 44 CPU-s.
    And without a pipeline actor (no queue staffed; it submits nothing): each stack's
    Ray workers are its grants actor's. A pipeline actor's fork server (a child of the
    actor, outside Ray's environment) is stopped by the same RayNode.stop, checked in
    test_secrets' S3 test; its two cost ~10 CPU-s here."""
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYPERMEDIA_", "RAY_"))}
    env["HYPERMEDIA_DATA_DIR"] = str(data)
    env["HYPERMEDIA_RAY_DASHBOARD"] = "false"
    env.update(NO_PIPELINE_ACTOR)

    def kill_head_and_watchdog() -> list[int]:
        pids = ray_processes(data)
        assert pids
        os.kill(watchdog_pid(data), signal.SIGKILL)
        os.kill(int((data / "head.pid").read_text()), signal.SIGKILL)
        return pids

    try:
        up = _cli(env, "up")
        assert up.returncode == 0, up.stderr + (data / "head.log").read_text()[-3000:]
        orphans = kill_head_and_watchdog()
        again = _cli(env, "up")
        assert again.returncode == 0, again.stderr + (data / "head.log").read_text()[-3000:]
        assert "already up" not in again.stdout
        assert wait_gone(orphans, timeout=0) == []  # stopped before the new head started
        assert "stopped a Ray head left by an earlier stack" in (data / "head.log").read_text()
        kill_head_and_watchdog()
        assert leftovers(data)  # the Ray head and Redis of the killed stack
    finally:
        down = _cli(env, "down")
    assert down.returncode == 0, down.stderr
    assert "stopped what a stack that died left running" in down.stdout
    assert leftovers(data) == []
    assert find_running(data / "redis") is None
    assert _cli(env, "down").stdout.strip() == "not running"


@pytest.mark.timeout(600)
def test_up_that_does_not_come_up_in_time_stops_its_head(tmp_path):
    """`up --wait` that runs out stops the head it started and everything that head had
    started (it deleted head.pid and left the head starting: ~50 processes came up
    later, and `down` said "not running")."""
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYPERMEDIA_", "RAY_"))}
    env["HYPERMEDIA_DATA_DIR"] = str(data)
    env.update(IMAGES_ONLY)
    try:
        up = _cli(env, "up", "--wait", "3")
        assert up.returncode == 1, up.stdout + up.stderr
        assert up.stderr.startswith("error: the local stack did not come up within 3 s"), up.stderr
        assert leftovers(data) == []
        assert find_running(data / "redis") is None
        assert not (data / "head.pid").exists()
        time.sleep(5)  # nothing comes up later either
        assert leftovers(data) == []
    finally:
        down = _cli(env, "down")
    assert down.stdout.strip() == "not running", down.stdout + down.stderr
