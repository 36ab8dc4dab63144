"""`hypermedia worker` refuses what it cannot run with before `ray start`, by option."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hypermedia.cli.services import check_head_address, check_token_file, parse_worker_queues
from hypermedia.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("specs", "counts"),
    [
        (["images"], {"images": 1}),
        (["images=3", "ocr"], {"images": 3, "ocr": 1}),
        (["images=2 ocr=1"], {"images": 2, "ocr": 1}),  # the environment twin's form
    ],
)
def test_queues_and_their_actors(specs, counts):
    assert parse_worker_queues(specs) == counts


@pytest.mark.parametrize(
    "spec", ["images=x", "images=-1", "images=0", "images=", "=2", "images=1.5"]
)
def test_a_bad_queue_spec_is_refused_naming_the_option(spec):
    with pytest.raises(ConfigError) as info:
        parse_worker_queues([spec])
    assert info.value.key == "--queue (HYPERMEDIA_WORKER_QUEUES)"
    assert repr(spec) in info.value.message


@pytest.mark.parametrize("address", ["10.0.0.5:6380", "head.internal:6380", "[::1]:6380"])
def test_a_head_address(address):
    check_head_address(address)


@pytest.mark.parametrize("address", ["x", "10.0.0.5", ":6380", "10.0.0.5:0", "h:99999", "h:port"])
def test_a_bad_head_address_is_refused(address):
    with pytest.raises(ConfigError) as info:
        check_head_address(address)
    assert info.value.key == "--address (HYPERMEDIA_RAY_ADDRESS)"


def test_the_token_file_must_be_there_and_hold_a_token(tmp_path):
    key = "--token-file (HYPERMEDIA_RAY_TOKEN_FILE)"
    for path, problem in [
        (tmp_path / "missing", "no file at"),
        (tmp_path, "is a directory"),
        (tmp_path / "empty", "is empty"),
    ]:
        (tmp_path / "empty").write_text("\n")
        with pytest.raises(ConfigError, match=problem) as info:
            check_token_file(path)
        assert info.value.key == key
    (tmp_path / "token").write_text("abc\n")
    check_token_file(tmp_path / "token")


def _worker(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "token").write_text("abc\n")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "hypermedia.cli",
            "worker",
            "--token-file",
            str(tmp_path / "token"),
            *args,
        ],
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(REPO),
            "HYPERMEDIA_DATA_DIR": str(tmp_path / "data"),
            "COLUMNS": "1000",
            **(env or {}),
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_head_that_does_not_answer_is_named_not_a_timeout(tmp_path):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = _worker(tmp_path, "--address", f"127.0.0.1:{port}", "--queue", "images", "--wait", "2")
    assert result.returncode == 1
    assert f"waiting for the head at 127.0.0.1:{port}" in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: service_unavailable: cannot reach the head at 127.0.0.1:{port}: "
        "Connection refused (waited 2 s)"
    )
    assert not (tmp_path / "data").exists()  # no Ray node was started


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--queue", "nope=x"], "--queue (HYPERMEDIA_WORKER_QUEUES): 'nope=x'"),
        (["--queue", "nope"], "--queue (HYPERMEDIA_WORKER_QUEUES): 'nope' is not a queue"),
        (["--queue", "images", "--address", "x"], "--address (HYPERMEDIA_RAY_ADDRESS): 'x'"),
    ],
)
def test_the_command_refuses_a_mistake_in_one_line(tmp_path, args, said):
    result = _worker(tmp_path, "--address", "127.0.0.1:6380", *args)
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()  # one line: no traceback
    assert line.startswith(f"error: config_invalid: {said}"), line


def test_a_node_whose_hypermedia_does_not_know_the_schema_refuses_before_ray_start(tmp_path):
    """A worker node left on an old hypermedia after a deploy (the record migrated by a
    newer one): its command joined the cluster, and each actor placed on it failed at
    start, on the head's logs only. With the database URL in its settings it now checks
    the schema first and refuses as `serve` does, naming the key, before `ray start`."""
    import sqlite3

    record = tmp_path / "newer.db"
    with sqlite3.connect(record) as db:  # as a newer hypermedia left it
        db.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)")
        db.execute("INSERT INTO alembic_version VALUES ('9999_from_the_future')")
        db.execute("CREATE TABLE processing_jobs (job_id TEXT PRIMARY KEY)")
    with socket.socket() as probe:  # a port nothing listens on: no head
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = _worker(
        tmp_path,
        *("--address", f"127.0.0.1:{port}", "--queue", "images", "--wait", "2"),
        env={"HYPERMEDIA_DATABASE_URL": f"sqlite:///{record}"},
    )
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()  # refused before waiting for the head
    assert line.startswith(
        "error: config_invalid: database_url (HYPERMEDIA_DATABASE_URL): the database schema"
        " is at revision 9999_from_the_future, which this hypermedia does not know"
    ), line
    assert not (tmp_path / "data" / "ray").exists()
