"""`ray up ray_cluster/local.yaml` end to end: the whole burst path on this machine.

A burst of video transcodes on ``media``, a queue only burst nodes serve -> the
scheduler wants a worker and asks Ray (``request_resources``) -> Ray's autoscaler v2
asks our node provider -> the local driver boots a Ray node from the user data a cloud
instance would get -> a pipeline actor there takes the jobs. A spot notice served by a
local metadata endpoint makes that worker hand its job back (the attempt not counted);
the instance is then reclaimed (terminated, as the cloud would), and the job completes
on the replacement node. Idle -> drained -> terminated; the ledger closes. With the
daily cap reached, the next burst is refused and the decision log says why. ``ray
down`` leaves no process behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from sqlalchemy import create_engine, text

from autoscaler.drivers.local import LocalDriver
from hypermedia.embedded import free_port
from tests.clouds.metadata_server import MetadataServer

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
JOBS = 4


def run(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(args), env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
    )


def wait_for(what: str, check: Callable[[], Any], timeout: float, debug: Callable[[], str]) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(1.0)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{debug()}")


def processes_with(marker: str) -> list[int]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if marker in " ".join(proc.info["cmdline"] or []):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


@pytest.fixture
def cluster(tmp_path):
    state = tmp_path / "state"
    data = tmp_path / "data"
    metadata = MetadataServer().start()

    scheduler = json.loads((REPO / "ray_cluster" / "scheduler.local.json").read_text())
    scheduler["cloud_providers"]["aws"]["spot_enabled"] = True  # 6 c/h spot: the cheaper
    scheduler_path = tmp_path / "scheduler.json"
    scheduler_path.write_text(json.dumps(scheduler))

    config = yaml.safe_load((REPO / "ray_cluster" / "local.yaml").read_text())
    config["cluster_name"] = f"hm-e2e-{os.getpid()}"
    provider = config["provider"]
    provider.update(
        ray_port=free_port(),
        state_dir=str(state),
        scheduler_config=str(scheduler_path),
        drain_timeout_seconds=30,
    )
    provider["drivers"]["aws"]["metadata_url"] = metadata.url
    cluster_yaml = tmp_path / "cluster.yaml"
    cluster_yaml.write_text(yaml.safe_dump(config))

    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "HYPERMEDIA_"))}
    env.update(
        HYPERMEDIA_DATA_DIR=str(data),
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=str(REPO),
        COLUMNS="1000",  # rich tables (scheduler log) one row per line
    )
    up = run(env, str(BIN / "ray"), "up", "-y", str(cluster_yaml), timeout=400)
    try:
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        assert "head services up" in up.stdout + up.stderr
        yield {
            "env": env,
            "state": state,
            "data": data,
            "metadata": metadata,
            "name": config["cluster_name"],
        }
    finally:
        down = run(env, str(BIN / "ray"), "down", "-y", str(cluster_yaml), timeout=400)
        metadata.stop()
        assert down.returncode == 0, down.stdout[-3000:] + down.stderr[-3000:]
        # Nothing of this cluster is left: no head services, no Ray process of the
        # head's or of any local instance's temp dir (all under one short /tmp dir).
        time.sleep(2)
        assert processes_with(f"{state}") == []
        from hypermedia.worker.cluster import short_temp_dir

        assert processes_with(str(short_temp_dir(state, "head").parent)) == []


def test_a_burst_runs_on_launched_nodes_survives_a_spot_notice_and_ends_drained(cluster, tmp_path):
    env, state, metadata = cluster["env"], cluster["state"], cluster["metadata"]
    engine = create_engine(f"sqlite:///{cluster['data'] / 'hypermedia.db'}")
    driver = LocalDriver({"state_dir": str(state / "local")})

    def instances() -> list[Any]:
        found = driver.instances(cluster["name"])
        assert isinstance(found, list), found
        return found

    def rows(sql: str) -> list[Any]:
        with engine.connect() as conn:
            return list(conn.execute(text(sql)))

    def debug() -> str:
        head_log = (state / "head.log").read_text(errors="replace").splitlines()
        return "\n".join(
            [
                f"jobs: {rows('select status, count(*) from processing_jobs group by status')}",
                f"attempts: {rows('select worker_id, status, error_code from job_attempts')}",
                f"instances: {[(i.instance_id, i.spot) for i in instances()]}",
                *[line for line in head_log if "alembic" not in line][-25:],
            ]
        )

    key = run(env, str(BIN / "hypermedia"), "user", "add", "eve", "--credits", "1000")
    assert key.returncode == 0, key.stderr
    api_key = key.stdout.strip().splitlines()[-1]
    client_env = {
        **env,
        "HYPERMEDIA_API_URL": (state / "head.url").read_text(),
        "HYPERMEDIA_API_KEY": api_key,
    }
    clip = tmp_path / "clip.mp4"
    subprocess.run(
        ["ffmpeg", "-loglevel", "error", "-y", "-f", "lavfi", "-i",
         "testsrc=size=640x360:rate=25:duration=30", "-pix_fmt", "yuv420p",
         "-c:v", "libx264", "-preset", "ultrafast", str(clip)],
        check=True,
    )  # fmt: skip
    files = []
    for n in range(JOBS):
        copy = tmp_path / f"clip{n}.mp4"
        copy.write_bytes(clip.read_bytes())
        files.append(str(copy))
    submitted = run(
        client_env, str(BIN / "hypermedia"), "submit", *files, "--op", "transcode_video"
    )
    assert submitted.returncode == 0, submitted.stderr
    assert submitted.stdout.count("queue=media") == JOBS

    # A burst node is launched, and a job runs on it (media has no worker on the head).
    running = wait_for(
        "a media job running on a burst node",
        lambda: rows("select job_id, worker_id from job_attempts where status = 'running'"),
        240,
        debug,
    )
    first_worker = running[0].worker_id
    launched = instances()
    assert launched and all(i.spot and i.queue == "media" for i in launched), launched

    # The cloud says the instance goes in two minutes: the worker hands its job back.
    metadata.serve_notice()
    released = wait_for(
        "the interrupted worker to hand its job back",
        lambda: rows(
            "select job_id, worker_id from job_attempts"
            " where status = 'released' and error_code = 'spot_interrupted'"
        ),
        90,
        debug,
    )
    assert released[0].worker_id == first_worker
    interrupted_job = released[0].job_id
    noticed = [i.instance_id for i in instances()]
    # The scheduler counts the noticed node as leaving: it launches a replacement and
    # terminates the noticed one (the cloud would take it anyway).
    wait_for(
        "the noticed instance to be terminated",
        lambda: not set(noticed) & {i.instance_id for i in instances()},
        120,
        debug,
    )
    metadata.clear_notice()  # the replacement is another instance: no notice there

    wait_for(
        "every job to complete",
        lambda: (
            rows("select count(*) from processing_jobs where status = 'completed'")[0][0] == JOBS
        ),
        360,
        debug,
    )
    attempts = rows(
        f"select worker_id, status from job_attempts where job_id = '{interrupted_job}'"
        " order by attempt_id"
    )
    assert attempts[0] == (first_worker, "released")
    assert attempts[-1].status == "completed" and attempts[-1].worker_id != first_worker
    (attempt_count,) = rows(
        f"select attempt_count from processing_jobs where job_id = '{interrupted_job}'"
    )[0]
    assert attempt_count == len(attempts) - 1  # the interrupted attempt was not counted

    # Idle for idle_minutes -> drained -> terminated; the ledger closes.
    wait_for(
        "the burst nodes to be drained and terminated",
        lambda: (
            not instances()
            and rows("select count(*) from cloud_spend where terminated_at is null")[0][0] == 0
        ),
        240,
        debug,
    )
    log = run(env, str(BIN / "hypermedia"), "scheduler", "log", "--limit", "200")
    assert log.returncode == 0, log.stderr
    for said in ("Scaling up media", "Scaling down worker", "Terminating worker"):
        assert said in log.stdout, log.stdout
    assert "spot" in log.stdout
    ledger = rows("select instance_id, spot from cloud_spend where instance_id != 'i-expensive'")
    assert len(ledger) >= 2 and all(spot for _, spot in ledger)  # the noticed one + replacement

    # The daily cap is reached (a minute of a very expensive instance): the next
    # burst is refused, and the log says why.
    now = time.time()
    with engine.begin() as conn:
        conn.execute(
            text(
                "insert into cloud_spend (provider, instance_id, node_type, region, spot,"
                " price_per_hour_microusd, launched_at, terminated_at)"
                " values ('aws', 'i-expensive', 'burst_media', 'local', 0, :price,"
                " datetime(:start, 'unixepoch'), datetime(:end, 'unixepoch'))"
            ),
            {"price": 60_000 * 10_000, "start": now - 120, "end": now - 60},  # $10 in a minute
        )
    again = run(
        client_env, str(BIN / "hypermedia"), "submit", *files[:3], "--op", "transcode_video"
    )
    assert again.returncode == 0, again.stderr
    refused = wait_for(
        "the scheduler to refuse the burst",
        lambda: [
            r
            for r in rows("select action, reason from scheduler_decisions")
            if r.action == "hold" and "locked to vps_only" in r.reason
        ],
        90,
        debug,
    )
    assert "media" in refused[0].reason
    time.sleep(15)  # a few more turns: still nothing launched
    assert instances() == []
    log = run(env, str(BIN / "hypermedia"), "scheduler", "log", "--limit", "50")
    assert "Daily cloud spend cap" in log.stdout and "locked to vps_only" in log.stdout
