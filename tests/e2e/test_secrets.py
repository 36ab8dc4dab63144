"""Credentials reach only the process that needs them (issue 11, item 1).

``hypermedia up`` runs real jobs with canary credentials: an ``AWS_SECRET_ACCESS_KEY``,
a configured storage signing secret, a callback signing secret, a database password,
and the embedded Redis's generated password. Then every file under the data dir (the
head's log included) and the Ray temp dir (session logs, ``runtime_env_agent.log``, the
GCS's, the raylet's, every worker's) is read while the cluster runs, and again once it
stopped: no copy of any canary but in ``redis.conf``, the one file that holds the
Redis password (0600).
No process has a canary on its command line, and only the head has one in its
environment (where the operator put it).

The S3 case is here (its stack stopped by the watchdog, its head killed with -9); the
local storage and database case (a PostgreSQL password, a storage and a callback
signing secret) runs on test_up_down's test_up_submit_down's stack (stopped by
``down``), through :func:`check_running` and :func:`check_stopped`.
"""

from __future__ import annotations

import os
import secrets
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import boto3
import psutil
import pytest

from hypermedia.embedded import find_running, read_password
from hypermedia.ingest.client import HypermediaClient
from hypermedia.worker.cluster import short_temp_dir
from tests import support
from tests.stack_support import leftovers, ray_processes, wait_gone, watchdog_pid

REPO = Path(__file__).resolve().parents[2]
SAMPLES = [REPO / "examples" / "banner.webp", REPO / "examples" / "logo-alpha.png"]
# One set per test process: xdist runs this module's two tests side by side, and
# each must find only its own stack's copies.
_RUN = secrets.token_hex(4)
CANARY_AWS = f"canaryAwsSecretKey0x5f3759df{_RUN}"
CANARY_STORAGE = f"canary-storage-signing-secret-0x1badb002{_RUN}"
CANARY_DB = f"canaryDbPassword0xdeadbeef{_RUN}"
CANARY_CALLBACK = f"canary-callback-signing-secret-0xcafef00d{_RUN}"


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hypermedia.cli", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=420,
        check=False,
    )


def base_env(data: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYPERMEDIA_", "RAY_", "AWS_"))}
    env["HYPERMEDIA_DATA_DIR"] = str(data)
    env.update(support.IMAGES_ONLY)
    env["AWS_ACCESS_KEY_ID"] = "canary-access-key-id"
    env["AWS_SECRET_ACCESS_KEY"] = CANARY_AWS
    env["AWS_DEFAULT_REGION"] = "us-east-1"
    env["AWS_SHARED_CREDENTIALS_FILE"] = str(data.parent / "no-aws-credentials")
    env["AWS_CONFIG_FILE"] = str(data.parent / "no-aws-config")
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    return env


def _files(*roots: Path) -> list[Path]:
    found = []
    for root in roots:
        for directory, _dirs, names in os.walk(root):
            for name in names:
                path = Path(directory) / name
                try:
                    if stat.S_ISREG(path.lstat().st_mode):
                        found.append(path)
                except FileNotFoundError:
                    continue
    return found


def _copies(canaries: list[str], *roots: Path) -> dict[Path, list[str]]:
    hits: dict[Path, list[str]] = {}
    for path in _files(*roots):
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue
        found = [c for c in canaries if c.encode() in data]
        if found:
            hits[path] = found
    return hits


def _processes_holding(canaries: list[str]) -> tuple[list[int], list[int]]:
    """Pids with a canary on their command line, and pids with one in their environment."""
    on_cmdline: list[int] = []
    in_environ: list[int] = []
    for proc in psutil.process_iter():
        for part, found in (("cmdline", on_cmdline), ("environ", in_environ)):
            try:
                data = Path(f"/proc/{proc.pid}/{part}").read_bytes()
            except OSError:
                continue
            if any(c.encode() in data for c in canaries):
                found.append(proc.pid)
    return on_cmdline, in_environ


def _cmdline(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())[:200]
    except psutil.Error:
        return "?"


def check_running(data: Path, canaries: list[str], *, dashboard: bool) -> list[str]:
    """The stack of ``data`` runs and has run jobs: no file under the data dir or the
    Ray temp dir holds a canary but ``redis.conf`` its Redis password (0600); no process
    has one on its command line, and only the head has one in its environment.
    ``dashboard``: the stack runs Ray's dashboard, whose logs are among those read.
    Returns the canaries and the Redis password, for :func:`check_stopped`."""
    ray_dir = short_temp_dir(data / "ray", "head").parent
    conf = data / "redis" / "redis.conf"
    redis_password = read_password(data / "redis")
    assert redis_password is not None
    canaries = [*canaries, redis_password]
    files = _files(data, ray_dir)
    assert any(p.name == "runtime_env_agent.log" for p in files)  # Ray's logs are read
    assert any(p.name.startswith("python-core-worker-") for p in files)
    assert any(p.name == "dashboard.log" for p in files) == dashboard
    assert (data / "head.log") in files
    assert _copies(canaries, data, ray_dir) == {conf: [redis_password]}
    assert stat.S_IMODE(conf.stat().st_mode) == 0o600
    assert not list(data.glob("grants-*")), "the hand-off file outlived the grants actor"

    head_pid = int((data / "head.pid").read_text())
    on_cmdline, in_environ = _processes_holding(canaries)
    assert on_cmdline == []
    assert head_pid in in_environ  # the operator's environment
    # Nothing else: not Ray's processes, Redis, the watchdog, nor the upload
    # inspection server (it starts with an allowlisted environment).
    others = {pid: _cmdline(pid) for pid in in_environ if pid != head_pid}
    assert others == {}
    return canaries


def check_stopped(data: Path, canaries: list[str]) -> None:
    """The stack of ``data`` stopped: its files hold no canary either, but the Redis
    password (the last of ``canaries``, :func:`check_running`'s) in ``redis.conf``."""
    assert _copies(canaries, data) == {data / "redis" / "redis.conf": canaries[-1:]}


def local_canaries(env: dict[str, str], pg_database_url: str) -> list[str]:
    """A database password, a storage and a callback signing secret in ``env`` (the
    AWS secret is there already: :func:`base_env`); all the canaries."""
    assert "postgres@" in pg_database_url
    # Trust auth ignores the password, but the URL carries it wherever the URL goes.
    env["HYPERMEDIA_DATABASE_URL"] = pg_database_url.replace(
        "postgres@", f"postgres:{CANARY_DB}@", 1
    )
    env["HYPERMEDIA_STORAGE_SECRET"] = CANARY_STORAGE
    # The head alone signs callbacks (set, it once kept every actor from starting).
    env["HYPERMEDIA_CALLBACK_SECRET"] = CANARY_CALLBACK
    return [CANARY_AWS, CANARY_STORAGE, CANARY_DB, CANARY_CALLBACK]


@pytest.fixture
def moto() -> Iterator[tuple[str, str]]:
    with support.moto_server() as endpoint:
        bucket = "hm-secrets-canary"
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="test",
            aws_secret_access_key="test",
        ).create_bucket(Bucket=bucket)
        yield endpoint, bucket


@pytest.mark.timeout(600)  # `up` may try `ray start` three times under load
def test_s3_credentials_reach_the_grants_actor_and_nothing_else(tmp_path, moto):
    """The head's S3 credentials (the AWS canary) reach the grants actor, which signs
    the jobs' URLs with them, and no other process nor any file, running and once the
    stack is stopped.
    And test_up_down's test_a_head_killed_with_9_takes_its_cluster_with_it (it was a
    test with a stack of its own, this one but for the storage and the jobs): the stack
    ends with its head killed with -9, and the watchdog stops the Ray head (with Ray's
    dashboard on: its modules' processes, and the pipeline actor's fork server, outside
    Ray's environment, among them) and the Redis that head started; then the stopped
    stack's files (the watchdog's log among them) hold no canary either."""
    endpoint, bucket = moto
    data = tmp_path / "data"
    env = base_env(data)
    env["HYPERMEDIA_STORAGE_BACKEND"] = "s3"
    env["HYPERMEDIA_S3_BUCKET"] = bucket
    env["HYPERMEDIA_S3_ENDPOINT_URL"] = endpoint
    env["HYPERMEDIA_S3_REGION"] = "us-east-1"
    canaries = [CANARY_AWS]
    try:
        up = _cli(env, "up")
        assert up.returncode == 0, up.stderr + (data / "head.log").read_text()[-3000:]
        api_url = (data / "head.url").read_text()
        key = _cli(env, "user", "add", "alice", "--credits", "100").stdout.strip()
        assert key.startswith("hm_")
        with HypermediaClient(api_url, key, timeout=120) as client:
            jobs = []
            for sample in SAMPLES:
                obj = client.upload(sample)
                jobs += client.process(obj.object_id, ["thumbnail"]).jobs
            for job in jobs:
                # The grants actor signed these URLs with the handed-over credentials.
                assert client.wait(job.job_id, timeout=240).status == "completed"
        canaries = check_running(data, canaries, dashboard=True)

        ray_pids = ray_processes(data)
        redis = find_running(data / "redis")
        assert ray_pids and redis is not None and redis.pid is not None
        watchdog = watchdog_pid(data)
        os.kill(int((data / "head.pid").read_text()), signal.SIGKILL)
        assert wait_gone([*ray_pids, redis.pid, watchdog]) == []
        assert leftovers(data) == []
        assert "died without stopping" in (data / "watchdog.log").read_text()
    finally:
        down = _cli(env, "down")
    assert down.returncode == 0, down.stderr
    assert down.stdout.strip() == "not running"
    check_stopped(data, canaries)
