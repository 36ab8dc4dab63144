"""A deleted object's blobs the storage failed to delete are recorded
(``blob_deletions``) and deleted later by the head's maintenance
(:mod:`hypermedia.storage.deletions`): through a real uvicorn server, on S3 (moto's
server, stopped while the delete runs, then started again on the same port) and on
the local disk (the blob made immutable: the unlink refused even to root)."""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import boto3
import httpx
import pytest
from moto.server import ThreadedMotoServer
from sqlalchemy import select, update

from hypermedia import tls
from hypermedia.accounts import Caller
from hypermedia.clock import ManualClock, to_datetime, to_epoch
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.errors import StorageQuotaExceeded
from hypermedia.ids import new_id
from hypermedia.ingest import uploads
from hypermedia.ingest.api import create_app
from hypermedia.server import Maintenance
from hypermedia.stack import Stack
from hypermedia.storage import deletions
from hypermedia.storage.base import StorageUnavailable, StoredBlob, original_key
from hypermedia.storage.grants import StorageGrants
from hypermedia.storage.local import LocalStorage
from tests.api_support import RequestHolder, add_user, bearer, running_server
from tests.factories import image_inspection
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
            httpx.Client(base_url=url, timeout=120, verify=tls.client_context()) as client,
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
            httpx.Client(base_url=url, timeout=120, verify=tls.client_context()) as client,
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
            report = deletions.sweep(stack.engine, stack.storage, clock)
            assert report.waiting == [output_key] and (root / output_key).exists()
            # It ran and wrote the key again (a row live again): kept, record dropped.
            claimed = stack.dispatcher.claim("images", "w")
            assert claimed is not None
            _complete_with(stack, claimed, output_key, 30)
            clock.advance(deletions.FIRST_DELAY_SECONDS)
            report = deletions.sweep(stack.engine, stack.storage, clock)
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


# How long S3's DELETE is kept from moto at most: kept until the other request was
# answered (old: it waited for all of it), so a slow machine only lengthens the wait.
HOLD_SECONDS = 30.0


def _s3_stack(settings, engine, endpoint: str, bucket: str, clock: ManualClock) -> Stack:
    return Stack.open(
        settings(
            storage_backend="s3", s3_bucket=bucket, s3_endpoint_url=endpoint, s3_region=REGION
        ),
        engine=engine,
        auto_migrate=True,
        clock=clock,
    )


@contextlib.contextmanager
def _releasing(holder: RequestHolder) -> Iterator[None]:
    """The requests kept let go on the way out (before the API stops: it waits for them)."""
    try:
        yield
    finally:
        holder.release()


class _Timed(threading.Thread):
    """``call()`` in a thread of its own: its answer, and how long it took."""

    def __init__(self, call: Callable[[], httpx.Response]) -> None:
        super().__init__(daemon=True)
        self.call = call
        self.answer: httpx.Response | None = None
        self.seconds = -1.0

    def run(self) -> None:
        began = time.monotonic()
        self.answer = self.call()
        self.seconds = time.monotonic() - began


def _submit(url: str, user, object_id: str) -> httpx.Response:
    with httpx.Client(base_url=url, timeout=120, verify=tls.client_context()) as client:
        return client.post(
            f"{P}/process",
            json={"object_id": object_id, "operations": ["thumbnail"]},
            headers=bearer(user),
        )


def _delete(url: str, user, object_id: str) -> httpx.Response:
    with httpx.Client(base_url=url, timeout=120, verify=tls.client_context()) as client:
        return client.delete(f"{P}/objects/{object_id}", headers=bearer(user))


def test_a_slow_storage_delete_holds_no_sqlite_writer_back(sqlite_engine, settings, moto):
    """Before: on SQLite each blob was deleted inside BEGIN IMMEDIATE, the whole
    database's write lock: with S3's DELETE kept from moto for 5 s (a stalled path), a
    submit on another object waited for all of it (5.0 s), as would every upload and
    every worker's completion; with S3 unreachable, 30 s and more a try. Now the
    deletion is claimed in a short transaction and the storage called after its
    commit: the submit is answered while the DELETE is still kept."""
    bucket = "hm-deletions-slow"
    boto3.client("s3", endpoint_url=moto.url, region_name=REGION).create_bucket(Bucket=bucket)
    with RequestHolder(moto.url, b"DELETE ") as s3_path:
        stack = _s3_stack(settings, sqlite_engine, s3_path.url, bucket, ManualClock())
        try:
            with (
                running_server(create_app(stack, auth_cache_seconds=0)) as url,
                httpx.Client(base_url=url, timeout=120, verify=tls.client_context()) as client,
                _releasing(s3_path),
            ):
                alice = add_user(stack, "alice")
                doomed = upload(client, alice, PNG).json()["object_id"]
                other = upload(client, alice, PNG, "b.png").json()["object_id"]

                s3_path.hold()
                deleting = _Timed(lambda: _delete(url, alice, doomed))
                deleting.start()
                assert s3_path.held.wait(30), "the DELETE never reached S3"
                submitting = _Timed(lambda: _submit(url, alice, other))
                submitting.start()
                submitting.join(HOLD_SECONDS)
                answered_while_held = not submitting.is_alive()
                s3_path.release()
                submitting.join(60)
                deleting.join(60)
                assert submitting.answer is not None and submitting.answer.status_code == 202
                assert answered_while_held, (
                    f"the submit waited {submitting.seconds:.1f} s for S3's DELETE"
                )
                assert deleting.answer is not None and deleting.answer.status_code == 200
                assert _records(stack) == {}
                s3 = boto3.client("s3", endpoint_url=moto.url, region_name=REGION)
                assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 1
        finally:
            stack.close()


def test_a_job_writes_no_key_whose_deletion_is_under_way(engine, settings, moto):
    """The storage is called with no transaction open, so a job on the source may be
    submitted and run while its output's blob is being deleted: the deletion claimed
    the key first, and the job is granted no URL to write it until the storage has
    answered (a retryable refusal: else its new bytes could be taken by the late
    DELETE, the row revived with nothing behind it). Once deleted, the job writes it.
    Before, on PostgreSQL, the storage deleted inside the transaction that locked the
    source's row: with S3's DELETE kept from moto, a submit on the source waited for it
    all (5 s as it was kept then; 503 database_unavailable after lock_timeout, 10 s by
    default, with it kept 15 s), and a DELETE kept past idle_in_transaction_session_timeout had its
    session ended under it, the row let go while the delete was still under way."""
    bucket = "hm-deletions-claimed"
    boto3.client("s3", endpoint_url=moto.url, region_name=REGION).create_bucket(Bucket=bucket)
    clock = ManualClock()
    with RequestHolder(moto.url, b"DELETE ") as s3_path:
        stack = _s3_stack(settings, engine, s3_path.url, bucket, clock)
        grants = StorageGrants(stack.engine, stack.storage, 600, clock)
        try:
            with (
                running_server(create_app(stack, auth_cache_seconds=0)) as url,
                httpx.Client(base_url=url, timeout=120, verify=tls.client_context()) as client,
                _releasing(s3_path),
            ):
                alice = add_user(stack, "alice")
                source = upload(client, alice, PNG).json()["object_id"]
                job_id = run_thumbnail(stack, client, alice, source, 10)
                (output,) = client.get(f"{P}/jobs/{job_id}", headers=bearer(alice)).json()[
                    "outputs"
                ]
                (key,) = _keys_of(stack, output["object_id"])

                s3_path.hold()
                deleting = _Timed(lambda: _delete(url, alice, output["object_id"]))
                deleting.start()
                assert s3_path.held.wait(30), "the DELETE never reached S3"
                queued = _Timed(lambda: _submit(url, alice, source))
                queued.start()
                queued.join(HOLD_SECONDS)
                assert not queued.is_alive(), "the submit waited for S3's DELETE"
                assert queued.answer is not None and queued.answer.status_code == 202
                (claimed,) = stack.dispatcher.claim("images", "w")
                stack.dispatcher.start(claimed, "w")
                with pytest.raises(StorageUnavailable, match="being deleted"):
                    grants.output_urls(claimed.job_id, "w", ["thumbnail-64.webp"])
                s3_path.release()
                deleting.join(60)
                assert deleting.answer is not None and deleting.answer.status_code == 200
                assert _records(stack) == {}

                (granted,) = grants.output_urls(claimed.job_id, "w", ["thumbnail-64.webp"]).values()
                assert granted.key == key
                _complete_with(stack, [claimed], key, 30)
                assert stack.storage.size(key) == 30
        finally:
            stack.close()


def test_a_claim_left_by_a_deleter_that_died_runs_out_and_the_sweep_takes_it(
    sqlite_engine, settings
):
    """SQLite: a deleter that died between its claim and the storage's answer leaves the
    record claimed. Until the claim runs out the key is granted to no job and no sweep
    takes it (busy: another deleter may be at it); then the sweep deletes it."""
    clock = ManualClock()
    stack = Stack.open(settings(), engine=sqlite_engine, auto_migrate=True, clock=clock)
    try:
        key = "derived/p/o/1/thumbnail-64.webp"
        stack.storage.put(key, [b"left"])
        b = t.blob_deletions.c
        with transaction(stack.engine) as conn:
            deletions.record(conn, "o", [key], clock.now())
            claim = to_datetime(clock.now() + deletions.CLAIM_SECONDS)
            conn.execute(
                update(t.blob_deletions)
                .where(b.storage_key == key)
                .values(claimed_until=claim, next_attempt_at=claim)
            )
        with transaction(stack.engine) as conn:
            assert deletions.being_deleted(conn, [key, "other"], clock.now()) == [key]
        report = deletions.delete_blobs(stack.engine, stack.storage, [key], clock, action="t")
        assert report.busy == [key] and stack.storage.exists(key)
        clock.advance(deletions.FIRST_TRY_SECONDS)
        assert deletions.sweep(stack.engine, stack.storage, clock).deleted == []
        clock.advance(deletions.CLAIM_SECONDS)
        with transaction(stack.engine) as conn:
            assert deletions.being_deleted(conn, [key], clock.now()) == []
        assert deletions.sweep(stack.engine, stack.storage, clock).deleted == [key]
        assert not stack.storage.exists(key) and _records(stack) == {}
    finally:
        stack.close()


def test_an_upload_not_registered_has_its_blob_deleted_later_when_the_disk_refused(
    engine, settings
):
    """Before: the blob of an upload whose registration failed (its bytes leave no room
    in the quota: another upload counted first) was deleted once, and a disk refusing
    that raised the delete's storage_unavailable in place of the upload's own error,
    the blob left for ever, in no record. Now it is recorded first and deleted as a
    deleted object's: the quota's error stands, the record waits for the sweep."""
    clock = ManualClock()
    stack = Stack.open(settings(), engine=engine, auto_migrate=True, clock=clock)
    root = stack.settings.storage_dir
    alice = add_user(stack, "alice")

    def register(object_id: str, blob: StoredBlob) -> None:
        uploads.register_blob(
            stack.engine,
            stack.storage,
            lambda *_: image_inspection(),
            Caller(alice.user_id),
            object_id=object_id,
            pool_id=alice.pool_id,
            blob=blob,
            filename="a.png",
            clock=clock,
            quota_bytes=len(PNG) - 1,
        )

    try:
        deleted, kept = new_id(), new_id()
        blob = stack.storage.put(original_key(alice.pool_id, deleted), [PNG])
        with pytest.raises(StorageQuotaExceeded):
            register(deleted, blob)
        assert not (root / blob.key).exists() and _records(stack) == {}

        blob = stack.storage.put(original_key(alice.pool_id, kept), [PNG])
        _immutable(root / blob.key, True)
        try:
            with pytest.raises(StorageQuotaExceeded):
                register(kept, blob)
            assert _records(stack) == {blob.key: (1, True)}
        finally:
            _immutable(root / blob.key, False)
        assert (root / blob.key).exists()
        clock.advance(deletions.retry_delay(1))
        _maintenance(stack).sweep_blobs()
        assert not (root / blob.key).exists() and _records(stack) == {}
    finally:
        stack.close()


NOW = 1_800_000_000.0


def test_a_copy_recorded_while_its_key_is_being_deleted_is_deleted_too(engine, tmp_path):
    """A bulk migrate that finds its object deleted while it copied it records the copy
    on its target backend (9c8b7ce) while the API deletes the same key: the deleter,
    which read no backend, then removed the record the migrate had just given one (or
    the migrate's read-then-update missed the record the deleter removed), and the copy
    stayed in the target for good. Now the record is written in one statement and
    removed only as it was when its blob went: the sweep deletes the copy."""
    key = original_key("p", "obj1")
    server, target = LocalStorage(tmp_path / "server"), LocalStorage(tmp_path / "target")
    for storage in (server, target):
        storage.put(key, [b"bytes"])
    with transaction(engine) as conn:
        deletions.record(conn, "obj1", [key], NOW)

    class MigratedMeanwhile(LocalStorage):
        def delete(self, key: str) -> None:
            super().delete(key)
            with transaction(engine) as conn:  # the migrate's switch, meanwhile
                deletions.record(conn, "obj1", [key], NOW, backend="local:target")

    racing = MigratedMeanwhile(tmp_path / "server")
    report = deletions.delete_blobs(
        engine, racing, [key], ManualClock(NOW), action="test", backends=lambda _name: target
    )
    assert report.deleted == [key]
    assert target.exists(key)  # not yet: the deleter knew of no copy
    b = t.blob_deletions.c
    with transaction(engine) as conn:
        left = conn.execute(select(b.storage_key, b.storage_backend)).all()
    assert [tuple(r) for r in left] == [(key, "local:target")]
    deletions.sweep(engine, server, ManualClock(NOW + 3600), backends=lambda _name: target)
    assert not target.exists(key) and not server.exists(key)
    with transaction(engine) as conn:
        assert conn.execute(select(b.storage_key)).all() == []


class _HangsThenFails(LocalStorage):
    """A storage whose delete hangs ``seconds`` on ``clock`` (S3's retries of a path
    that stalled) and then fails."""

    def __init__(self, root: Path, clock: ManualClock, seconds: float) -> None:
        super().__init__(root)
        self.hung_on, self.seconds, self.calls = clock, seconds, 0

    def delete(self, key: str) -> None:
        self.calls += 1
        self.hung_on.advance(self.seconds)
        raise StorageUnavailable(f"deleting {key}: timed out")


def test_a_try_that_hung_before_failing_backs_off_from_its_failure(engine, settings):
    """Before: a failed try's next one was set from the start of the sweep's pass, so a
    storage call that hung 4 minutes before it failed was due again at once (its 60 s
    backoff long past when it failed), and every pass tried it again without a pause.
    Now the backoff counts from the failure: the next pass leaves it until then."""
    clock = ManualClock()
    stack = Stack.open(settings(), engine=engine, auto_migrate=True, clock=clock)
    try:
        key = original_key("p", "obj1")
        with transaction(stack.engine) as conn:
            deletions.record(conn, "obj1", [key], clock.now())
        hanging = _HangsThenFails(stack.settings.storage_dir, clock, 240.0)
        maintenance = _maintenance(dataclasses.replace(stack, _storage=hanging))
        clock.advance(deletions.FIRST_TRY_SECONDS)
        maintenance.sweep_blobs()
        failed_at = clock.now()
        assert hanging.calls == 1 and _records(stack) == {key: (1, True)}
        b = t.blob_deletions.c
        with transaction(stack.engine) as conn:
            due = conn.execute(select(b.next_attempt_at).where(b.storage_key == key)).scalar_one()
        assert to_epoch(due) == failed_at + deletions.retry_delay(1)
        maintenance.sweep_blobs()  # the next pass, at once: not due
        assert hanging.calls == 1
        clock.advance(deletions.retry_delay(1))
        maintenance.sweep_blobs()
        assert hanging.calls == 2 and _records(stack) == {key: (2, True)}
    finally:
        stack.close()
