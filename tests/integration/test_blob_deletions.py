"""A deleted object's blobs the storage failed to delete are recorded
(``blob_deletions``) and deleted later by the head's maintenance
(:mod:`hypermedia.storage.deletions`): through a real uvicorn server, on S3 (moto's
server, stopped while the delete runs, then started again on the same port) and on
the local disk (the blob made immutable: the unlink refused even to root)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import boto3
import httpx
import pytest
from moto.server import ThreadedMotoServer
from sqlalchemy import select

from hypermedia.clock import ManualClock
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.ingest.api import create_app
from hypermedia.server import Maintenance
from hypermedia.stack import Stack
from hypermedia.storage import deletions
from tests.api_support import add_user, bearer, running_server
from tests.integration.test_api_quota import PNG, run_thumbnail, upload

P = "/v1/hypermedia"
REGION = "us-east-1"


class Moto:
    """moto's server on one port of 127.0.0.1, stopped and started again on it (its
    buckets live in this process: they outlast a stop)."""

    def __init__(self) -> None:
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, self.port = self.server.get_host_and_port()
        self.url = f"http://{host}:{self.port}"

    def stop(self) -> None:
        self.server.stop()

    def start(self) -> None:
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()


@pytest.fixture
def moto(monkeypatch) -> Iterator[Moto]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "hypermedia-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hypermedia-test-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    server = Moto()
    yield server
    with contextlib.suppress(Exception):
        server.stop()


def _records(stack: Stack) -> dict[str, tuple[int, bool]]:
    """The recorded deletions: key -> (failed tries, an error recorded)."""
    b = t.blob_deletions.c
    with transaction(stack.engine) as conn:
        rows = conn.execute(select(b.storage_key, b.attempts, b.last_error)).all()
    return {r.storage_key: (r.attempts, r.last_error is not None) for r in rows}


def _pending(stack: Stack) -> deletions.Pending:
    with transaction(stack.engine) as conn:
        return deletions.pending(conn, stack.clock.now())


def _keys_of(stack: Stack, *object_ids: str) -> list[str]:
    o = t.objects.c
    with transaction(stack.engine) as conn:
        found = dict(
            conn.execute(
                select(o.object_id, o.storage_key).where(o.object_id.in_(object_ids))
            ).all()
        )
    return [found[i] for i in object_ids]


def _maintenance(stack: Stack) -> Maintenance:
    return Maintenance(stack, reaper_interval=1, reconcile_interval=60)


def test_blobs_s3_failed_to_delete_are_deleted_later_by_the_sweep(engine, settings, moto):
    """Before: with S3 down, DELETE answered 200 and the blobs stayed in the bucket for
    ever (a warning in the log). Now each is recorded in the transaction that marks the
    rows deleted; the first failure stops the request's tries (the other blob is left
    as it was); the sweep leaves them until due, then deletes both and their records."""
    bucket = "hm-deletions"
    boto3.client("s3", endpoint_url=moto.url, region_name=REGION).create_bucket(Bucket=bucket)
    clock = ManualClock()
    stack = Stack.open(
        settings(
            storage_backend="s3", s3_bucket=bucket, s3_endpoint_url=moto.url, s3_region=REGION
        ),
        engine=engine,
        auto_migrate=True,
        clock=clock,
    )
    try:
        with (
            running_server(create_app(stack, auth_cache_seconds=0)) as url,
            httpx.Client(base_url=url, timeout=120) as client,
        ):
            alice = add_user(stack, "alice")
            source = upload(client, alice, PNG).json()["object_id"]
            job_id = run_thumbnail(stack, client, alice, source, 10)
            (output,) = client.get(f"{P}/jobs/{job_id}", headers=bearer(alice)).json()["outputs"]
            keys = _keys_of(stack, source, output["object_id"])

            moto.stop()
            deleted = client.delete(f"{P}/objects/{source}", headers=bearer(alice))
            assert deleted.status_code == 200, deleted.text
            assert deleted.json()["outputs_deleted"] == 1
            # The first key failed (its error kept), the second was not tried.
            assert _records(stack) == {keys[0]: (1, True), keys[1]: (0, False)}
            assert _pending(stack) == deletions.Pending(2, 0.0)
            scraped = stack.metrics.exposition().decode()  # type: ignore[attr-defined]
            assert "hypermedia_blob_deletions_pending 2.0" in scraped
        moto.start()
        s3 = boto3.client("s3", endpoint_url=moto.url, region_name=REGION)

        def stored() -> list[str]:
            listed = s3.list_objects_v2(Bucket=bucket).get("Contents", [])
            return sorted(item["Key"] for item in listed)

        assert len(stored()) == 2  # still there

        maintenance = _maintenance(stack)
        maintenance.sweep_blobs()  # not due yet
        assert len(stored()) == 2 and len(_records(stack)) == 2
        clock.advance(deletions.retry_delay(1))
        assert _pending(stack).oldest_age_seconds == deletions.retry_delay(1)
        maintenance.sweep_blobs()
        assert stored() == []
        assert _records(stack) == {}
        assert _pending(stack) == deletions.Pending(0, 0.0)
    finally:
        stack.close()


def _immutable(path: Path, on: bool) -> None:
    subprocess.run(["chattr", "+i" if on else "-i", str(path)], check=True)


def test_a_local_blob_the_disk_refused_is_deleted_later_and_a_rewritten_one_kept(engine, settings):
    """On the local disk: the source's blob immutable (the unlink refused, as a disk
    error would), its delete leaves it recorded and the sweep deletes it once the disk
    lets it. An output deleted alone whose blob the disk refused, then written again
    by a re-run on its source (its row live again): the sweep keeps the new bytes and
    drops the record; while a job on the source may still write it, the sweep waits."""
    clock = ManualClock()
    stack = Stack.open(settings(), engine=engine, auto_migrate=True, clock=clock)
    root = stack.settings.storage_dir
    try:
        with (
            running_server(create_app(stack, auth_cache_seconds=0)) as url,
            httpx.Client(base_url=url, timeout=120) as client,
        ):
            alice = add_user(stack, "alice", credits=10)
            source = upload(client, alice, PNG).json()["object_id"]
            job_id = run_thumbnail(stack, client, alice, source, 10)
            (output,) = client.get(f"{P}/jobs/{job_id}", headers=bearer(alice)).json()["outputs"]
            source_key, output_key = _keys_of(stack, source, output["object_id"])

            _immutable(root / output_key, True)
            try:
                gone = client.delete(f"{P}/objects/{output['object_id']}", headers=bearer(alice))
                assert gone.status_code == 200, gone.text
                assert _records(stack) == {output_key: (1, True)}
            finally:
                _immutable(root / output_key, False)
            # A job on the source may write the key again: the sweep waits for it.
            queued = client.post(
                f"{P}/process",
                json={"object_id": source, "operations": ["thumbnail"]},
                headers=bearer(alice),
            )
            assert queued.status_code == 202, queued.text
            clock.advance(deletions.retry_delay(1))
            report = deletions.sweep(stack.engine, stack.storage, clock.now())
            assert report.waiting == [output_key] and (root / output_key).exists()
            # It ran and wrote the key again (a row live again): kept, record dropped.
            claimed = stack.dispatcher.claim("images", "w")
            assert claimed is not None
            _complete_with(stack, claimed, output_key, 30)
            clock.advance(deletions.FIRST_DELAY_SECONDS)
            report = deletions.sweep(stack.engine, stack.storage, clock.now())
            assert report.revived == [output_key]
            assert (root / output_key).stat().st_size == 30
            assert _records(stack) == {}

            _immutable(root / source_key, True)
            try:
                deleted = client.delete(f"{P}/objects/{source}", headers=bearer(alice))
                assert deleted.status_code == 200, deleted.text
                assert _records(stack) == {source_key: (1, True), output_key: (0, False)}
                clock.advance(deletions.retry_delay(1))
                _maintenance(stack).sweep_blobs()  # still refused: backs off
                assert _records(stack)[source_key] == (2, True)
            finally:
                _immutable(root / source_key, False)
            clock.advance(deletions.retry_delay(2))
            _maintenance(stack).sweep_blobs()
            assert _records(stack) == {}
            assert not (root / source_key).exists() and not (root / output_key).exists()
    finally:
        stack.close()


def _complete_with(stack: Stack, claimed, key: str, size: int) -> None:
    from hypermedia.jobs.repository import OutputRecord

    (job,) = claimed
    stack.dispatcher.start(job, "w")
    blob = stack.storage.put(key, [bytes(size)])
    output = OutputRecord("thumbnail-64.webp", key, blob.size_bytes, "image/webp")
    assert stack.dispatcher.complete(job, "w", [output])
