"""``hypermedia submit FILE... --op OP`` against a real API (uvicorn in a thread): a
refused file is one of several. Every file is tried, each job is printed as it is
submitted (its id never lost), each refused file is named with its error's code and
message, and the command exits 1 at the end when any file was refused. A refusal that
holds for every file (the key's priority range, an unknown operation) uploads no
other file for nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Table, func, select
from typer.testing import CliRunner

from hypermedia.cli import app
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.ingest.api import create_app
from hypermedia.stack import Stack
from tests import error_inputs as make
from tests.api_support import add_user, running_server


@pytest.fixture
def stack(sqlite_engine, settings) -> Iterator[Stack]:
    opened = Stack.open(
        settings(key_priority_min=4, key_priority_max=10, key_submits_per_minute=1000),
        engine=sqlite_engine,
        auto_migrate=True,
    )
    yield opened
    opened.close()


@pytest.fixture
def env(stack) -> Iterator[dict[str, str]]:
    alice = add_user(stack, "alice", credits=100)
    with running_server(create_app(stack, auth_cache_seconds=0)) as base_url:
        yield {"HYPERMEDIA_API_URL": base_url, "HYPERMEDIA_API_KEY": alice.api_key}


@pytest.fixture
def files(tmp_path) -> list[Path]:
    """Two images around a text file no thumbnail takes."""
    first, text, last = tmp_path / "a.png", tmp_path / "b.txt", tmp_path / "c.png"
    first.write_bytes(make.png())
    text.write_text("plain words, no image\n" * 20)
    last.write_bytes(make.png(16, 16))
    return [first, text, last]


def count(stack: Stack, table: Table) -> int:
    with transaction(stack.engine) as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def job_ids(stdout: str) -> list[str]:
    return [line.split()[1] for line in stdout.splitlines() if line.startswith("job ")]


def test_a_file_the_operation_refuses_is_reported_and_the_others_still_submitted(stack, env, files):
    result = CliRunner().invoke(app, ["submit", *map(str, files), "--op", "thumbnail"], env=env)

    assert result.exit_code == 1, result.output
    submitted = job_ids(result.stdout)
    assert len(submitted) == 2  # a.png's and c.png's: the file after the refused one too
    assert count(stack, t.jobs) == 2
    assert f"not submitted {files[1]}: input_type_mismatch: " in result.stderr
    assert "1 of 3 files not submitted" in result.stderr
    for job_id in submitted:  # each printed id is a job of the record
        assert job_id in _record_job_ids(stack)


def test_a_priority_the_key_may_not_use_refuses_every_file_uploading_none_for_nothing(
    stack, env, files
):
    images = [files[0], files[2]]
    result = CliRunner().invoke(
        app, ["submit", *map(str, images), "--op", "thumbnail", "--priority", "2"], env=env
    )

    assert result.exit_code == 1, result.output
    assert job_ids(result.stdout) == []
    for path in images:
        assert f"not submitted {path}: priority_not_allowed: " in result.stderr
    assert "4-10" in result.stderr  # the reason, as the API gave it
    assert "2 of 2 files not submitted" in result.stderr
    assert count(stack, t.objects) == 1  # the first upload learns it; the second is spared


def test_an_unknown_operation_uploads_no_more_files(stack, env, files):
    images = [files[0], files[2]]
    result = CliRunner().invoke(app, ["submit", *map(str, images), "--op", "thumbnale"], env=env)

    assert result.exit_code == 1, result.output
    for path in images:
        assert f"not submitted {path}: unknown_operation: " in result.stderr
    assert count(stack, t.objects) == 1  # the first upload learns it; the second is spared


def test_every_file_accepted_prints_its_jobs_and_exits_0(stack, env, files):
    images = [files[0], files[2]]
    result = CliRunner().invoke(
        app, ["submit", *map(str, images), "--op", "thumbnail", "--op", "compress"], env=env
    )

    assert result.exit_code == 0, result.output
    assert len(job_ids(result.stdout)) == 4
    assert "not submitted" not in result.output


def _record_job_ids(stack: Stack) -> list[str]:
    with transaction(stack.engine) as conn:
        return [str(row[0]) for row in conn.execute(select(t.jobs.c.job_id))]
