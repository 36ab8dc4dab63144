"""The storage failing under the API: its disk full, then read-only, then back.

The local backend's directory is a tmpfs of its own (1 MiB), filled and remounted
read-only for real: root ignores file modes, a mount's size and ``ro`` it does not.
Mounting needs root, as the sandbox's tests do.

What must hold: an upload the storage cannot take is 507 ``storage_full`` (the disk)
or 503 ``storage_unavailable`` (anything else), with ``Retry-After``, the outage in
its own words (never the directory); nothing is kept (no object row, no blob, no
temporary file) and nothing counted on the quota; a worker's PUT through its signed
URL gets the same codes, which its transfer takes as retryable; reads of what is
stored go on; once the disk is back, uploads are stored again.
"""

from __future__ import annotations

import errno
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from hypermedia import tls
from hypermedia.db import tables as t
from hypermedia.db.engine import snapshot
from hypermedia.embedded import listening_socket
from hypermedia.ingest.api import create_app
from hypermedia.ingest.http_errors import (
    OUTAGE_RETRY_AFTER_SECONDS,
    STORAGE_FULL_RETRY_AFTER_SECONDS,
)
from hypermedia.objects import storage_used
from hypermedia.stack import Stack
from hypermedia.storage import transfer
from hypermedia.storage.base import StorageFull, StorageUnavailable
from hypermedia.storage.local import LocalStorage
from tests.api_support import add_user, bearer, running_server
from tests.metrics_support import parse

pytestmark = pytest.mark.root("mounting a tmpfs needs root")

P = "/v1/hypermedia"
KiB = 1024


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs where the stack keeps its objects (``<data_dir>/objects``)."""
    mount = tmp_path / "objects"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def _remount(mount: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(mount)], check=True)


def _stored_rows(stack: Stack) -> int:
    with snapshot(stack.engine) as conn:
        return int(conn.execute(select(func.count()).select_from(t.objects)).scalar_one())


def test_a_full_or_read_only_disk_refuses_uploads_cleanly_and_keeps_nothing(
    sqlite_engine, settings, small_disk, caplog, tmp_path
):
    sock = listening_socket()
    stack = Stack.open(
        settings(api_url=f"http://127.0.0.1:{sock.getsockname()[1]}"), auto_migrate=True
    )
    storage = stack.storage
    assert isinstance(storage, LocalStorage) and storage.root == small_disk
    person = add_user(stack, "uploader")
    try:
        with (
            running_server(create_app(stack), sock) as base,
            httpx.Client(timeout=30, verify=tls.client_context()) as http,
        ):
            upload = f"{base}{P}/objects"
            stored = http.put(
                upload, params={"filename": "a.txt"}, content=b"a" * 64, headers=bearer(person)
            )
            assert stored.status_code == 201, stored.text
            kept = stored.json()["object_id"]
            used = 64
            (small_disk / "filler").write_bytes(b"\0" * (1024 - 96) * KiB)

            # The disk is full: 507 storage_full, told when to come back, nothing kept.
            caplog.set_level(logging.WARNING)
            caplog.clear()
            full = http.put(
                upload,
                params={"filename": "b.txt"},
                content=b"b" * 200 * KiB,
                headers=bearer(person),
            )
            assert full.status_code == 507, full.text  # was 500 internal, a traceback
            assert full.headers["Retry-After"] == str(STORAGE_FULL_RETRY_AFTER_SECONDS)
            error = full.json()["error"]
            assert error["code"] == "storage_full" and "full" in error["message"]
            assert str(small_disk) not in full.text  # the operator's directory: the log's
            [line] = [r for r in caplog.records if r.levelno >= logging.WARNING]
            assert line.exc_info is None and "No space left" in line.getMessage()
            assert _stored_rows(stack) == 1
            with snapshot(stack.engine) as conn:
                assert storage_used(conn, person.user_id) == used
            assert not list(small_disk.rglob(".upload-*"))

            # A worker's output PUT through its signed URL: the same answer, retryable.
            output = tmp_path / "output"
            output.write_bytes(b"o" * 200 * KiB)
            url = storage.presign_put("derived/p/o/1/out", 60)
            with pytest.raises(transfer.TransferUnavailable) as refused:
                transfer.upload(output, url)
            assert refused.value.retryable and refused.value.remote_code == "storage_full"
            with pytest.raises(StorageFull):
                storage.put("derived/p/o/1/out", [b"o" * 200 * KiB])
            assert not storage.exists("derived/p/o/1/out")

            # Read-only: 503 storage_unavailable; what is stored still reads.
            _remount(small_disk, "ro")
            read_only = http.put(
                upload, params={"filename": "c.txt"}, content=b"c", headers=bearer(person)
            )
            assert read_only.status_code == 503, read_only.text
            assert read_only.headers["Retry-After"] == str(OUTAGE_RETRY_AFTER_SECONDS)
            assert read_only.json()["error"]["code"] == "storage_unavailable"
            assert str(small_disk) not in read_only.text
            with pytest.raises(transfer.TransferUnavailable):
                transfer.upload(output, url)
            with pytest.raises(StorageUnavailable, match="Read-only"):
                storage.delete(f"originals/{person.pool_id}/{kept}")
            got = http.get(storage.presign_get(f"originals/{person.pool_id}/{kept}", 60))
            assert got.status_code == 200 and got.content == b"a" * 64
            assert _stored_rows(stack) == 1

            # Back: room made, writable again; uploads are stored.
            _remount(small_disk, "rw")
            (small_disk / "filler").unlink()
            again = http.put(
                upload,
                params={"filename": "b.txt"},
                content=b"b" * 200 * KiB,
                headers=bearer(person),
            )
            assert again.status_code == 201, again.text
            transfer.upload(output, url)
            assert storage.size("derived/p/o/1/out") == 200 * KiB
            with snapshot(stack.engine) as conn:
                assert storage_used(conn, person.user_id) == used + 200 * KiB
    finally:
        stack.close()


def test_healthz_tells_a_full_or_read_only_disk(sqlite_engine, settings, small_disk):
    """``/healthz`` probes the storage too: 503 ``storage: false`` while the local
    directory cannot take a file (read-only) or has no room left, ``ok`` once it is
    back; the database and Redis fields mean what they did. ``/metrics`` says the same
    (``hypermedia_storage_up`` 0 or 1: what the HypermediaStorageDown alert reads)."""
    # Every ask probes; the limit on a probe's time is not what this test is about.
    stack = Stack.open(
        settings(storage_probe_seconds=0, storage_probe_timeout_seconds=60), auto_migrate=True
    )
    try:
        api = TestClient(create_app(stack))
        operator = bearer(add_user(stack, "ops", operator=True))

        def storage_up() -> list[float]:
            response = api.get("/metrics", headers=operator)
            assert response.status_code == 200, response.text
            samples = parse(response.text)
            return [s.value for s in samples if s.name == "hypermedia_storage_up"]

        up = {"status": "ok", "database": True, "redis": True, "storage": True}
        down = {"status": "unavailable", "database": True, "redis": True, "storage": False}
        healthy = api.get("/healthz")
        assert (healthy.status_code, healthy.json()) == (200, up)
        assert storage_up() == [1.0]

        _remount(small_disk, "ro")
        read_only = api.get("/healthz")
        assert (read_only.status_code, read_only.json()) == (503, down)  # was 200 ok
        assert storage_up() == [0.0]  # no such series before
        _remount(small_disk, "rw")
        assert api.get("/healthz").json() == up
        assert storage_up() == [1.0]

        _fill(small_disk / "filler")
        full = api.get("/healthz")
        assert (full.status_code, full.json()) == (503, down)  # was 200 ok
        assert storage_up() == [0.0]
        (small_disk / "filler").unlink()
        assert api.get("/healthz").json() == up
    finally:
        stack.close()


def _fill(path: Path) -> None:
    """Write ``path`` until its disk refuses: not a byte of room left."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                os.write(fd, b"\0" * 4 * KiB)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                return
    finally:
        os.close(fd)
