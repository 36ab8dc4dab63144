"""``hypermedia run``'s submission through the real HTTP API on the embedded default
(SQLite): a file that cannot be read when its turn comes (removed since the directory
was walked, or unreadable) is reported skipped with the reason, and the others are
submitted all the same."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import pipelines.registry
from hypermedia.ingest.api import create_app
from hypermedia.runner import local_operator, submit_files
from hypermedia.stack import Stack
from tests.api_support import running_server

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def stack(sqlite_engine, settings) -> Iterator[Stack]:
    opened = Stack.open(settings(), engine=sqlite_engine, auto_migrate=True)
    yield opened
    opened.close()


def test_a_file_gone_before_its_upload_is_skipped_and_the_others_submitted(stack, tmp_path):
    first, gone, last = tmp_path / "a.webp", tmp_path / "b.jpg", tmp_path / "c.webp"
    for path in (first, gone, last):
        path.write_bytes((EXAMPLES / "banner.webp").read_bytes())
    gone.unlink()  # walked, then removed (a sync client, an editor's temp file)
    # One that fails when the upload opens it (as a file root may not read does for
    # anyone else: the tests run as root, for whom no mode makes a file unreadable).
    unopened = tmp_path / "d.jpg"
    unopened.mkdir()
    _caller, key = local_operator(stack)
    with running_server(create_app(stack, auth_cache_seconds=0)) as url:
        report = submit_files(
            url,
            key,
            [first, gone, unopened, last],
            ["thumbnail"],
            pipelines.registry.operations(),
        )
    assert [s.path for s in report.submitted] == [first, last]
    assert report.skipped == [
        (gone, "cannot read the file: No such file or directory"),
        (unopened, "cannot read the file: Is a directory"),
    ]
