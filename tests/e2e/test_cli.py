"""The real CLI in subprocesses: db upgrade, user add, serve, submit, status, queues, cancel,
scheduler.

Everything runs against a fresh SQLite data directory and a private Redis on a
free port; ``hypermedia serve`` runs as its own process and is stopped with
SIGTERM like a service manager would.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from hypermedia.config import load_settings
from hypermedia.embedded import EmbeddedRedis, free_port, listening_socket
from hypermedia.stack import Stack
from hypermedia.storage import signing
from tests.api_support import serve_on_a_free_port
from tests.factories import make_user, submit
from tests.generated import Generated

REPO = Path(__file__).resolve().parents[2]
JOB_LINE = re.compile(r"^job ([0-9a-f]{32}) (\w+) queue=(\w+) priority=(\d+) estimated_credits=")


@dataclass(frozen=True)
class Upgraded:
    """A data dir the real ``hypermedia db upgrade`` made, and what the command said."""

    data: Path
    said: str


@dataclass
class Cli:
    env: dict[str, str]
    upgraded_record: Upgraded | None = None  # the session's (upgraded_record)

    def __call__(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "hypermedia.cli", *args],
            env={**self.env, **env},
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def ok(self, *args: str, **env: str) -> str:
        result = self(*args, **env)
        assert result.returncode == 0, f"{args} exited {result.returncode}:\n{result.stderr}"
        assert "Traceback" not in result.stderr
        return result.stdout

    def fails(self, *args: str, **env: str) -> str:
        result = self(*args, **env)
        assert result.returncode != 0, f"{args} unexpectedly succeeded:\n{result.stdout}"
        assert "Traceback" not in result.stderr, result.stderr
        return result.stderr

    def upgrade(self) -> None:
        """The data dir as ``db upgrade`` leaves it on a new one: a copy of
        :func:`upgraded_record`'s (the command run once a session, not in each test that
        needs a record: ~1 CPU-s a test; the whole flow's test reads what it said)."""
        assert self.upgraded_record is not None
        shutil.copytree(self.upgraded_record.data, self.env["HYPERMEDIA_DATA_DIR"])


def _environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("HYPERMEDIA_")}


@pytest.fixture(scope="session")
def upgraded_record(tmp_path_factory: pytest.TempPathFactory) -> Upgraded:
    """A data dir the real ``hypermedia db upgrade`` made on a new one, for
    :meth:`Cli.upgrade`; what it said is the whole flow's to check."""
    data = tmp_path_factory.mktemp("upgraded") / "data"
    said = Cli({**_environment(), "HYPERMEDIA_DATA_DIR": str(data), "PYTHONPATH": str(REPO)}).ok(
        "db", "upgrade"
    )
    return Upgraded(data, said)


@pytest.fixture
def cli(tmp_path: Path, private_redis: EmbeddedRedis, upgraded_record: Upgraded) -> Cli:
    env = _environment()
    env.update(
        HYPERMEDIA_DATA_DIR=str(tmp_path / "data"),
        HYPERMEDIA_REDIS_URL=private_redis.url,
        PYTHONPATH=str(REPO),
        COLUMNS="120",
    )
    return Cli(env, upgraded_record)


@contextmanager
def serving(cli: Cli, log_path: Path, pick: Callable[[], int] = free_port) -> Iterator[str]:
    """``hypermedia serve`` on a free port (``pick``'s, see serve_on_a_free_port);
    stopped with SIGTERM, which must exit 0."""
    process, url = serve_on_a_free_port(
        lambda port: [sys.executable, "-m", "hypermedia.cli", "serve", "--port", str(port)],
        cli.env,
        log_path,
        pick=pick,
    )
    try:
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
    output = log_path.read_text()
    assert code == 0, f"serve exited {code}:\n{output}"
    assert "Traceback" not in output, output


def _user(cli: Cli, *args: str) -> str:
    key = cli.ok("user", "add", *args).strip()
    assert re.fullmatch(r"hm_[0-9a-f]{12}_\S+", key), key
    return key


def test_the_whole_flow_through_the_cli(cli: Cli, tmp_path: Path, generated: Generated):
    """db upgrade (the session's, on a new data dir: a copy of it here), users and
    credits on the record, then the client commands against ``serve``: submit, status,
    queues, cancel, credits show, what another user's key, a bad key and no credits get,
    and --wait's timeout. The queues are read once after the cancel, the refused submit
    and --wait's submit: 2 queued, 2 in Redis (a job left there by the cancel, or queued
    by the refused submit, makes 3)."""
    assert cli.upgraded_record is not None
    out = cli.upgraded_record.said
    assert "is at revision" in out
    assert "hypermedia.db" in out  # the SQLite file in the data dir
    cli.upgrade()
    alice = _user(cli, "alice", "--credits", "5", "--operator")
    bob = _user(cli, "bob", "--credits", "1")
    assert "already exists" in cli.fails("user", "add", "alice")
    assert "balance 3.5" in cli.ok("credits", "grant", "bob", "2.5")
    assert "not_found" in cli.fails("credits", "grant", "nobody", "1")

    carol = _user(cli, "carol")
    with serving(cli, tmp_path / "serve.log") as url:
        env = {"HYPERMEDIA_API_URL": url, "HYPERMEDIA_API_KEY": alice}
        files = [generated / "images/photo.jpg", generated / "images/drawing.png"]
        out = cli.ok("submit", *map(str, files), "--op", "thumbnail", **env)
        objects = [line for line in out.splitlines() if line.startswith("object ")]
        jobs = [JOB_LINE.match(line) for line in out.splitlines() if line.startswith("job ")]
        assert len(objects) == 2 and len(jobs) == 2 and all(jobs), out
        job_ids = [m.group(1) for m in jobs if m]
        assert all(m.group(2) == "thumbnail" and m.group(3) == "images" for m in jobs if m)

        out = cli.ok("status", job_ids[0], **env)
        assert re.search(r"^status\s+queued$", out, re.M), out
        assert re.search(r"^operation\s+thumbnail \(queue images, priority 2\)$", out, re.M)
        assert re.search(r"^attempts\s+0 of 3$", out, re.M)

        out = cli.ok("queues", **env)
        assert _queue_row(out, "images")[:4] == ["images", "2", "0", "0"], out
        assert _queue_row(out, "images")[5] == "2/0/0", out
        for header in ("queue", "queued", "in flight", "retry wait", "oldest age"):
            assert header in out

        out = cli.ok("cancel", job_ids[0], **env)
        assert out.strip() == f"job {job_ids[0]} cancelled"
        assert re.search(r"^status\s+cancelled$", cli.ok("status", job_ids[0], **env), re.M)
        assert "balance 5, reserved" in cli.ok("credits", "show", **env)

        # Bob sees none of alice's work, and queues are for operators.
        bob_env = {**env, "HYPERMEDIA_API_KEY": bob}
        err = cli.fails("status", job_ids[1], **bob_env)
        assert "not_found" in err and job_ids[1] in err
        assert "not_found" in cli.fails("cancel", job_ids[1], **bob_env)
        assert "forbidden" in cli.fails("queues", **bob_env)
        bad_key = {**env, "HYPERMEDIA_API_KEY": "hm_000000000000_x"}
        assert "unauthenticated" in cli.fails("status", job_ids[1], **bad_key)
        # Carol has no credits: 402, and nothing is queued for her.
        camera = str(generated / "images/alpha.png")
        carol_env = {**env, "HYPERMEDIA_API_KEY": carol}
        assert "insufficient_credits" in cli.fails(
            "submit", camera, "--op", "thumbnail", **carol_env
        )

        # Nothing processes jobs in this test: --wait gives up after its timeout, exit 1.
        result = cli(
            "submit", camera, "--op", "thumbnail", "--wait", "--wait-timeout", "0.5", **env
        )
        assert result.returncode == 1
        assert "timeout" in result.stderr and "still queued" in result.stderr
        assert "Traceback" not in result.stderr
        # bob's, the cancelled one gone (from Redis too), nothing of carol's, --wait's.
        row = _queue_row(cli.ok("queues", **env), "images")
        assert row[1] == "2" and row[5] == "2/0/0", row
    assert "serving the API" in (tmp_path / "serve.log").read_text()


def _queue_row(table: str, queue: str) -> list[str]:
    row = next(line for line in table.splitlines() if f" {queue} " in line)
    return [cell.strip() for cell in re.split(r"[│|]", row) if cell.strip()]


def test_serve_reconciles_redis_at_start(
    cli: Cli, private_redis: EmbeddedRedis, tmp_path: Path, generated: Generated
):
    """A job queued, Redis restarted empty: serve, started again, puts it back. (Its
    second start is on a port another process took before it bound: serve says so and
    exits, and the tests' helper starts it on another, as when free_port()'s pick is
    taken before the bind.)"""
    cli.upgrade()
    key = _user(cli, "ops", "--credits", "1", "--operator")
    log = tmp_path / "serve.log"
    with serving(cli, log) as url:
        env = {"HYPERMEDIA_API_URL": url, "HYPERMEDIA_API_KEY": key}
        cli.ok("submit", str(generated / "images/drawing.png"), "--op", "thumbnail", **env)
        assert _queue_row(cli.ok("queues", **env), "images")[5] == "1/0/0"
        # serve mounts the operator page (autoscaler/page), for the operator's key only.
        assert httpx.get(f"{url}/operator").status_code == 401
        page = httpx.get(f"{url}/operator", headers={"Authorization": f"Bearer {key}"})
        assert page.status_code == 200 and 'data-queue="images"' in page.text
    private_redis.restart()  # Redis loses everything
    with listening_socket() as taken:
        busy = taken.getsockname()[1]
        ports = iter([busy, free_port()])
        with serving(cli, log, pick=lambda: next(ports)) as url:
            assert not url.endswith(f":{busy}")
            env = {"HYPERMEDIA_API_URL": url, "HYPERMEDIA_API_KEY": key}
            deadline = time.monotonic() + 15
            while True:
                row = _queue_row(cli.ok("queues", **env), "images")
                if row[5] == "1/0/0" or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert row[1] == "1" and row[5] == "1/0/0", row
    assert f"the API server could not start on 127.0.0.1:{busy}" in log.read_text()


def test_serve_refuses_what_no_worker_runs(cli: Cli, tmp_path: Path, generated: Generated):
    """`serve` runs no worker: it accepts the operations of the queues its
    scheduler.json gives a worker (a baseline, or bursts) and of those a joined node
    serves. The shipped file gives ocr none (vps_only, a baseline of 0): an ocr job would
    wait forever, so it is refused at submit, and nothing is queued."""
    cli.upgrade()
    key = _user(cli, "ops", "--credits", "10", "--operator")
    page = str(generated / "images/photo.jpg")
    shipped = json.loads((REPO / "etc/scheduler.json").read_text())
    cli.env["HYPERMEDIA_SCHEDULER_CONFIG"] = str(REPO / "etc/scheduler.json")
    with serving(cli, tmp_path / "serve.log") as url:
        env = {"HYPERMEDIA_API_URL": url, "HYPERMEDIA_API_KEY": key}
        err = cli.fails("submit", page, "--op", "ocr", **env)
        assert "unknown_operation" in err and "no worker here runs the 'ocr' queue" in err, err
        out = cli.ok("submit", page, "--op", "thumbnail", **env)
        assert "estimated_credits=" in out and "reserved_credits" not in out, out
        queues = cli.ok("queues", **env)
        assert _queue_row(queues, "ocr")[1] == "0"
        assert _queue_row(queues, "images")[1] == "1"

    shipped["queues"]["ocr"]["baseline_workers"] = 1  # the VPS runs an ocr worker now
    staffed = tmp_path / "scheduler.json"
    staffed.write_text(json.dumps(shipped))
    cli.env["HYPERMEDIA_SCHEDULER_CONFIG"] = str(staffed)
    with serving(cli, tmp_path / "serve.log") as url:
        env = {"HYPERMEDIA_API_URL": url, "HYPERMEDIA_API_KEY": key}
        out = cli.ok("submit", page, "--op", "ocr", **env)
        assert re.search(r"^job [0-9a-f]{32} ocr queue=ocr ", out, re.M), out
        # Beside the estimate, what the submit holds: the one page may escalate twice
        # along the shipped 3-engine chain, 0.25 each.
        held = re.search(r"estimated_credits=([0-9.]+) reserved_credits=([0-9.]+)$", out, re.M)
        assert held and float(held[2]) - float(held[1]) == pytest.approx(0.5), out
        assert _queue_row(cli.ok("queues", **env), "ocr")[1] == "1"


def test_errors_are_one_red_line(cli: Cli):
    err = cli.fails(
        "status",
        "x",
        HYPERMEDIA_API_KEY="hm_x_y",
        HYPERMEDIA_API_URL=f"http://127.0.0.1:{free_port()}",
    )
    assert err.strip().startswith("error: service_unavailable: cannot reach the API")
    assert len(err.strip().splitlines()) == 1
    err = cli.fails("status", "x")
    assert "unauthenticated" in err and "HYPERMEDIA_API_KEY" in err
    err = cli.fails("user", "add", "carol")  # no db upgrade yet
    assert "hypermedia db upgrade" in err


def test_bad_config_names_the_key(cli: Cli):
    """A bad setting refuses the command and names its key (a log format that does not
    exist too)."""
    result = cli("queues", HYPERMEDIA_API_PORT="abc", HYPERMEDIA_API_KEY="hm_x_y")
    assert result.returncode != 0
    assert "HYPERMEDIA_API_PORT" in result.stderr
    assert "Traceback" not in result.stderr
    result = cli("serve", HYPERMEDIA_API_PORT="abc")
    assert result.returncode != 0
    assert "HYPERMEDIA_API_PORT" in result.stderr
    assert "Traceback" not in result.stderr
    result = cli("serve", HYPERMEDIA_SCHEDULER_CONFIG=str(REPO / "pyproject.toml"))
    assert result.returncode != 0
    assert "pyproject.toml: not JSON" in result.stderr
    assert "Traceback" not in result.stderr
    result = cli("db", "upgrade", HYPERMEDIA_DATABASE_URL="mysql://x")
    assert result.returncode == 1
    assert "HYPERMEDIA_DATABASE_URL" in result.stderr
    result = cli("db", "upgrade", HYPERMEDIA_LOG_LEVEL="loud")
    assert result.returncode == 1
    assert "HYPERMEDIA_LOG_LEVEL" in result.stderr
    result = cli("db", "upgrade", HYPERMEDIA_LOG_FORMAT="yaml")
    assert result.returncode == 1
    assert "log_format (HYPERMEDIA_LOG_FORMAT): expected one of json, text" in result.stderr


def _json_log_lines(stderr: str) -> None:
    """HYPERMEDIA_LOG_FORMAT=json: every stderr line of a command is a JSON record, its
    ``extra=`` fields included (here: the storage secret made by the command's stack,
    the first on its data dir)."""
    records = [json.loads(line) for line in stderr.splitlines()]
    assert records
    for record in records:
        assert {"timestamp", "level", "logger", "message"} <= set(record), record
    (secret,) = [r for r in records if r["logger"] == "hypermedia.storage.local"]
    assert secret["level"] == "INFO"
    assert secret["action"] == "secret"


def test_the_scheduler_commands(cli: Cli, tmp_path: Path):
    """explain / run --once / log / reset-cost-lock on the embedded SQLite and a private
    Redis, with the shipped vps_only defaults and with a file that is wrong. run --once,
    the first on the record, logs JSON at debug (:func:`_json_log_lines`)."""
    # A data dir nothing has run with: said plainly, and nothing is created there (old:
    # `scheduler explain` / `run` and the `bulk` commands made an empty hypermedia.db).
    for command in (
        ("scheduler", "log"),
        ("status",),
        ("scheduler", "explain"),
        ("bulk", "status"),
    ):
        err = cli.fails(*command)
        assert "data_dir (HYPERMEDIA_DATA_DIR): no database at" in err, command
        assert "not up to date" not in err
        assert not (tmp_path / "data").exists()
    cli.upgrade()
    ran = cli(
        "scheduler", "run", "--once", HYPERMEDIA_LOG_FORMAT="json", HYPERMEDIA_LOG_LEVEL="debug"
    )
    assert ran.returncode == 0, ran.stderr
    assert "Traceback" not in ran.stdout
    _json_log_lines(ran.stderr)
    explained = cli.ok("scheduler", "explain")
    assert "vps_only" in explained
    _scheduler_metrics(cli, tmp_path / "scheduler.log")
    logged = cli.ok("scheduler", "log")
    assert "when" in logged and "reason" in logged
    assert "no cost lock was set" in cli.ok("scheduler", "reset-cost-lock")

    bad = tmp_path / "scheduler.json"
    shipped = json.loads((REPO / "etc" / "scheduler.json").read_text())
    shipped["queues"]["ocr"]["max_workers"] = -1
    bad.write_text(json.dumps(shipped))
    err = cli.fails("scheduler", "explain", "--config", str(bad))
    assert "queues.ocr.max_workers" in err
    err = cli.fails("scheduler", "run", "--once", HYPERMEDIA_SCHEDULER_CONFIG=str(bad))
    assert "queues.ocr.max_workers" in err


def test_a_scheduler_json_queue_the_deployment_lacks_refuses_before_anything_starts(
    cli: Cli, tmp_path: Path
):
    """``serve`` took a scheduler.json with a queue no setting defines (``thumbs``) and
    served; ``head`` started Redis, Ray, the API and four actors, then refused (40 s
    later). Each refuses at once now, naming the file and the queue, and starts nothing."""
    cli.upgrade()
    path = tmp_path / "my-scheduler.json"
    data = json.loads((REPO / "etc" / "scheduler.json").read_text())
    data["queues"]["thumbs"] = {"baseline_workers": 1, "max_workers": 1}
    path.write_text(json.dumps(data))
    expected = f"{path}: queues.thumbs: not a queue of this deployment"
    assert expected in cli.fails(
        "serve", "--port", str(free_port()), "--scheduler-config", str(path)
    )
    env = {"HYPERMEDIA_SCHEDULER_CONFIG": str(path), "HYPERMEDIA_RAY_DASHBOARD": "false"}
    assert expected in cli.fails("head", **env)
    assert not (tmp_path / "data" / "redis").exists()
    assert not (tmp_path / "data" / "ray").exists()
    assert expected in cli.fails("scheduler", "explain", "--config", str(path))
    assert expected in cli.fails("scheduler", "burst", "ocr", "--config", str(path))


def _scheduler_metrics(cli: Cli, log_path: Path) -> None:
    """``scheduler run`` with HYPERMEDIA_SCHEDULER_METRICS_PORT: its own metrics on
    loopback, not the API's (started again on another port if its pick was taken)."""

    def command(port: int) -> list[str]:
        run = [sys.executable, "-m", "hypermedia.cli", "scheduler", "run"]
        return ["env", f"HYPERMEDIA_SCHEDULER_METRICS_PORT={port}", *run]

    process, url = serve_on_a_free_port(command, cli.env, log_path, ready="/metrics")
    try:
        deadline = time.monotonic() + 60  # an interpreter's start on a busy machine
        text = ""
        while "hypermedia_scheduler_last_evaluation_timestamp_seconds" not in text:
            assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()
            with suppress(httpx.TransportError):
                text = httpx.get(f"{url}/metrics", timeout=2).text
            time.sleep(0.1)
        assert 'hypermedia_cloud_spend_cap_cents{window="day"} 5000.0' in text
        assert "hypermedia_cost_locked 0.0" in text
        assert "hypermedia_queue_depth" not in text  # the API's, read when it is scraped
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(20)
    assert code == 0, log_path.read_text()


def test_a_taken_scheduler_metrics_port_is_one_clear_line(cli: Cli):
    cli.upgrade()
    with listening_socket("127.0.0.1") as taken:
        port = taken.getsockname()[1]
        err = cli.fails("scheduler", "run", "--metrics-port", str(port))
    assert err.strip() == (
        f"error: service_unavailable: the scheduler's metrics could not start on"
        f" 127.0.0.1:{port} (--metrics-port / HYPERMEDIA_SCHEDULER_METRICS_PORT):"
        " Address already in use"
    ), err


def test_serve_stops_while_a_client_follows_a_running_job(
    cli: Cli, private_redis: EmbeddedRedis, tmp_path: Path
):
    """SIGTERM stops serve while a client follows a running job's events: the stream
    ends cleanly (the client takes it up on the next server, Last-Event-ID) and serve
    exits 0. Before, uvicorn waited for every open response, and a job's stream lasts
    as long as the job: serve was still 'Waiting for connections to close' 40 s after
    SIGTERM (a service manager then kills it, and the stack is never closed).

    The same serve's access log shows no signature (:func:`_signed_blob_requests`)."""
    cli.upgrade()
    log_path = tmp_path / "serve.log"
    stack = Stack.open(load_settings(data_dir=tmp_path / "data", redis_url=private_redis.url))
    try:
        person = make_user(stack)
        job_id = submit(stack, person, ["thumbnail"])[0]
        stack.dispatcher.claim_and_start("images", "w")
        with ExitStack() as streams, httpx.Client(timeout=30) as http:
            with serving(cli, log_path) as url:
                response = streams.enter_context(
                    http.stream(
                        "GET",
                        f"{url}/v1/hypermedia/jobs/{job_id}/events",
                        headers={"Authorization": f"Bearer {person.api_key}"},
                    )
                )
                lines = response.iter_lines()
                first = next(line for line in lines if line.startswith("data: "))
                assert '"status":"processing"' in first
                logged = _signed_blob_requests(url, tmp_path / "data")
            rest = list(lines)  # the body ends: no error, no end of the job
        assert not [line for line in rest if line.startswith("data: ")], rest
    finally:
        stack.close()
    logged(log_path.read_text())


def _signed_blob_requests(url: str, data_dir: Path) -> Callable[[str], None]:
    """A signed blob URL is a credential until it expires: the access log keeps the
    request line and the other parameters, not ``sig``. Sends a signed GET and PUT to
    the API at ``url``; the check of its log, once it has stopped."""
    secret = (data_dir / "storage.secret").read_text().strip()
    expires = int(time.time()) + 600
    signed = signing.signed_url(url, secret, "GET", "originals/p/o", expires)
    put = signing.signed_url(url, secret, "PUT", "derived/p/o/1/t", expires, "image/png")
    assert httpx.get(signed).status_code == 404  # a good signature, no such object
    assert httpx.put(put, content=b"x", headers={"Content-Type": "image/png"}).is_success
    signatures = [
        signing.signature(secret, "GET", "originals/p/o", expires, None),
        signing.signature(secret, "PUT", "derived/p/o/1/t", expires, "image/png"),
    ]
    assert all(sig in signed + put for sig in signatures)

    def check(output: str) -> None:
        assert f"GET /v1/hypermedia/blobs/originals/p/o?expires={expires}&sig=[redacted]" in output
        assert "PUT /v1/hypermedia/blobs/derived/p/o/1/t?expires=" in output
        assert "content_type=image%2Fpng" in output
        assert not [sig for sig in signatures if sig in output]

    return check


def _s3_without_credentials(cli: Cli, tmp_path: Path, **aws: str) -> dict[str, str]:
    """The S3 backend with no AWS credentials anywhere: none in the environment, no
    config or credentials file, the instance metadata service a closed port. ``aws``
    adds to that (a container credentials endpoint that answers nothing ...)."""
    env = {k: v for k, v in cli.env.items() if not k.startswith("AWS_")}
    env.update(
        HYPERMEDIA_STORAGE_BACKEND="s3",
        HYPERMEDIA_S3_BUCKET="hm-bucket",
        HYPERMEDIA_S3_ENDPOINT_URL=f"http://127.0.0.1:{free_port()}",
        HYPERMEDIA_S3_REGION="us-east-1",
        AWS_CONFIG_FILE=str(tmp_path / "no-aws-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "no-aws-credentials"),
        AWS_EC2_METADATA_SERVICE_ENDPOINT=f"http://127.0.0.1:{free_port()}",
        **aws,
    )
    return env


def test_s3_credentials_that_cannot_be_had_refuse_the_start_in_one_line(cli: Cli, tmp_path: Path):
    """``serve`` with the S3 backend and no credentials to be had stops at its start with
    the one error line naming them, and no secret of the environment in it; it neither
    answers 500 to every upload later (none at all) nor ends in an ``internal`` error (a
    container credentials endpoint that does not answer)."""
    cli.upgrade()
    none = Cli(_s3_without_credentials(cli, tmp_path))
    err = none.fails("serve", "--port", str(free_port()))
    assert err.strip().startswith("error: config_invalid: AWS credentials: "), err
    assert len(err.strip().splitlines()) == 1, err
    unreachable = Cli(
        _s3_without_credentials(
            cli,
            tmp_path,
            AWS_CONTAINER_CREDENTIALS_FULL_URI=f"http://127.0.0.1:{free_port()}/credentials",
            AWS_CONTAINER_AUTHORIZATION_TOKEN="canary-container-token",
            AWS_SECRET_ACCESS_KEY="canary-secret-key",  # without its key id: unused
        )
    )
    err = unreachable.fails("serve", "--port", str(free_port()))
    assert err.strip().startswith("error: config_invalid: AWS credentials: "), err
    assert "container" in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert "canary" not in err, err


def test_db_upgrade_shows_no_password_of_the_url(cli: Cli, pg_database_url: str):
    """'hypermedia db upgrade' printed 'database postgresql+psycopg://...?password=<it>
    is at revision ...' for a password in the URL's query (psycopg takes it there),
    SQLAlchemy's hide_password masking only the user info's. Trust auth ignores both."""
    for url in (
        pg_database_url.replace("postgres@", "postgres:CanaryInfo0x1@", 1) + "?password=Canary0x2",
        pg_database_url + "?sslmode=disable&password=Canary0x3",
    ):
        result = cli("db", "upgrade", HYPERMEDIA_DATABASE_URL=url)
        assert result.returncode == 0, result.stderr
        said = result.stdout + result.stderr
        assert "is at revision" in said
        assert "Canary0x" not in said and "CanaryInfo" not in said
        assert "password=***" in said
