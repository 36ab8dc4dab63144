"""Storage in a local directory: the embedded default.

Presigned URLs point at the hypermedia API itself (``base_url``), whose blob
routes check the HMAC signature (:mod:`hypermedia.storage.signing`) and stream
the file in or out. The signing secret is ``storage_secret``, or one generated
once into ``data_dir/storage.secret`` (:func:`load_or_create_secret`) so that
every process of a deployment agrees on it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import secrets
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from hypermedia.clock import Clock, SystemClock
from hypermedia.errors import ConfigError, NotFound
from hypermedia.storage import signing
from hypermedia.storage.base import (
    StorageFull,
    StorageUnavailable,
    StoredBlob,
    check_content_type,
    check_disposition,
    check_key,
    check_range,
    check_ttl,
    too_large,
)

log = logging.getLogger(__name__)

_SIGNING_SETTING = "storage_secret (HYPERMEDIA_STORAGE_SECRET)"
# Where a put writes before its file is renamed into place: one directory (a key's
# segments start with a letter or digit, so no key is in it), on the same file system.
STAGING = ".staging"
# A staged file not written for this long belongs to a put that died with its process
# (a kill -9, the OOM killer): an upload idle for upload_idle_seconds (at most an hour)
# is refused long before. Removed by :meth:`LocalStorage.check`.
STALE_STAGING_SECONDS = 2 * 3600.0
# A put's rename into a directory that deletes of other keys keep emptying: 4 threads
# churning one directory lost 1 rename in ~10 runs after 4 tries.
_PLACE_ATTEMPTS = 50
# A disk (or the file system's quota) with no room left.
_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


class LocalStorage:
    def __init__(
        self,
        root: Path,
        *,
        base_url: str | None = None,
        secret: str | None = None,
        clock: Clock | None = None,
    ) -> None:
        """``base_url`` (the API's public URL) and ``secret`` are needed only to sign
        and check URLs; without them the presign methods raise ConfigError."""
        if secret is not None and len(secret) < signing.MIN_SECRET_LENGTH:
            raise ConfigError(
                _SIGNING_SETTING, f"expected at least {signing.MIN_SECRET_LENGTH} characters"
            )
        self.root = root
        self.base_url = base_url
        self._secret = secret
        self.clock: Clock = clock or SystemClock()

    def path(self, key: str) -> Path:
        return self.root / check_key(key)

    def put(
        self,
        key: str,
        chunks: Iterable[bytes],
        max_bytes: int | None = None,
        content_type: str | None = None,
    ) -> StoredBlob:
        """``content_type`` is checked, not kept: a file has no type, and the blob route
        answers the one its URL was signed with."""
        check_content_type(content_type)
        target = self.path(key)
        digest = hashlib.sha256()
        size = 0
        with self._disk(key, "store"):
            fd, tmp = self._staged()
        try:
            try:
                for chunk in chunks:
                    size += len(chunk)
                    if max_bytes is not None and size > max_bytes:
                        raise too_large(max_bytes)
                    digest.update(chunk)
                    with self._disk(key, "store"):
                        _write_all(fd, chunk)
                with self._disk(key, "store"):
                    os.fsync(fd)
            finally:
                os.close(fd)
            with self._disk(key, "store"):
                self._move_into_place(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return StoredBlob(key=key, size_bytes=size, sha256=digest.hexdigest())

    def set_content_type(self, key: str, content_type: str | None) -> None:
        """Checked, not kept (as :meth:`put`'s); NotFound for a missing key."""
        check_content_type(content_type)
        self.size(key)

    def read(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        handle, _size = self.open(key)
        with handle:
            while True:
                with self._disk(key, "read"):
                    chunk = handle.read(chunk_size)
                if not chunk:
                    return
                yield chunk

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        check_range(offset, length)
        handle, _size = self.open(key)
        with handle, self._disk(key, "read"):
            return os.pread(handle.fileno(), length, offset) if length else b""

    def open(self, key: str) -> tuple[BinaryIO, int]:
        """The open file and its size, taken from the same file: a concurrent
        replace cannot make them disagree."""
        path = self.path(key)
        with self._disk(key, "read"):
            try:
                handle = path.open("rb")
            except FileNotFoundError:
                raise NotFound(f"no stored object at {key!r}", key=key) from None
            return handle, os.fstat(handle.fileno()).st_size

    def exists(self, key: str) -> bool:
        return self.path(key).is_file()

    def size(self, key: str) -> int:
        path = self.path(key)
        with self._disk(key, "read"):
            try:
                return path.stat().st_size
            except FileNotFoundError:
                raise NotFound(f"no stored object at {key!r}", key=key) from None

    def delete(self, key: str) -> None:
        """Delete the blob, and the directories that leaves empty (keys name no
        directories, as in S3: a sweep of checkpoints/<job>/... left one per job)."""
        path = self.path(key)
        with self._disk(key, "delete"), contextlib.suppress(FileNotFoundError):
            path.unlink()
        for directory in path.parents:
            if directory == self.root or self.root not in directory.parents:
                break
            try:
                directory.rmdir()
            except OSError:  # not empty (or gone): what is above is not empty either
                break

    def check(self) -> None:
        """The directory (made if need be) takes a file, and has room left; what puts
        that died left staged is removed (:data:`STALE_STAGING_SECONDS`)."""
        with self._disk(".probe", "store"):
            self.root.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(dir=self.root, prefix=".probe-")
            os.close(fd)
            os.unlink(name)
            room = os.statvfs(self.root)
        if room.f_bavail == 0:
            raise StorageFull(f"local storage at {self.root} has no room left", key=".probe")
        self.sweep_staging()

    def sweep_staging(self, older_than: float = STALE_STAGING_SECONDS) -> int:
        """Remove staged files not written for ``older_than`` seconds (their puts' processes
        were killed mid-write); how many."""
        removed = 0
        cutoff = self.clock.now() - older_than
        with contextlib.suppress(FileNotFoundError), os.scandir(self.root / STAGING) as found:
            for entry in found:
                with contextlib.suppress(FileNotFoundError):
                    if entry.is_file(follow_symlinks=False) and entry.stat().st_mtime < cutoff:
                        os.unlink(entry.path)
                        removed += 1
        if removed:
            log.info("local storage: removed %d staged file(s) of puts that died", removed)
        return removed

    @contextlib.contextmanager
    def _disk(self, key: str, doing: str) -> Iterator[None]:
        """The disk's refusals (full, read-only, no permission, I/O errors) as the
        contract's errors: a full disk is StorageFull, anything else
        StorageUnavailable. The message is the operator's (the directory, the OS's
        words); an API caller reads the outage's own (see ingest.http_errors)."""
        try:
            yield
        except OSError as exc:
            raise self._refused(exc, key, doing) from exc

    def _refused(self, exc: OSError, key: str, doing: str) -> StorageUnavailable:
        reason = exc.strerror or type(exc).__name__
        message = f"local storage at {self.root} cannot {doing} {key!r}: {reason}"
        if exc.errno in _FULL:
            return StorageFull(message, key=key)
        return StorageUnavailable(message, key=key)

    def _staged(self) -> tuple[int, str]:
        """A new private file in :data:`STAGING`, the directory made if need be."""
        staging = self.root / STAGING
        with contextlib.suppress(FileNotFoundError):
            return tempfile.mkstemp(dir=staging, prefix=".upload-")
        staging.mkdir(parents=True, exist_ok=True)
        return tempfile.mkstemp(dir=staging, prefix=".upload-")

    @staticmethod
    def _move_into_place(staged: str, target: Path) -> None:
        """Rename ``staged`` to ``target``, its directory made if needed, and again
        while deletes of the directory's last other blobs take it away meanwhile."""
        for attempt in range(_PLACE_ATTEMPTS):
            # Either fails when a delete takes the directory between its two moves
            # (mkdir's exist_ok looks again, and finds none).
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(staged, target)
                return
            except (FileNotFoundError, FileExistsError):
                if attempt == _PLACE_ATTEMPTS - 1:
                    raise

    # -- signed URLs ---------------------------------------------------------------------

    def presign_get(
        self,
        key: str,
        ttl_seconds: int,
        content_type: str | None = None,
        disposition: str | None = None,
    ) -> str:
        return self._sign(
            "GET",
            key,
            ttl_seconds,
            check_content_type(content_type),
            check_disposition(disposition),
        )

    def presign_put(self, key: str, ttl_seconds: int, content_type: str | None = None) -> str:
        return self._sign("PUT", key, ttl_seconds, check_content_type(content_type))

    def verify(
        self,
        method: str,
        key: str,
        expires: str | None,
        sig: str | None,
        content_type: str | None = None,
        disposition: str | None = None,
    ) -> None:
        """Check a signed URL's parameters as the blob routes received them; raise
        InvalidSignature / UrlExpired (403) when it must be refused."""
        signing.verify(
            self._require_secret(),
            method,
            key,
            expires,
            sig,
            content_type,
            self.clock.now(),
            disposition=disposition,
        )

    def _sign(
        self,
        method: str,
        key: str,
        ttl_seconds: int,
        content_type: str | None,
        disposition: str | None = None,
    ) -> str:
        check_key(key)
        check_ttl(ttl_seconds)
        if self.base_url is None:
            raise ConfigError("api_url (HYPERMEDIA_API_URL)", "local storage URLs need the API URL")
        expires = int(self.clock.now()) + ttl_seconds
        return signing.signed_url(
            self.base_url,
            self._require_secret(),
            method,
            key,
            expires,
            content_type,
            disposition=disposition,
        )

    def _require_secret(self) -> str:
        if self._secret is None:
            raise ConfigError(
                _SIGNING_SETTING, "this local storage was built without a signing secret"
            )
        return self._secret


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def load_or_create_secret(
    path: Path, setting: str = _SIGNING_SETTING, forged: str = "storage URLs"
) -> str:
    """The signing secret stored at ``path``, generated (mode 0600) if there is none.
    ``setting`` names the setting that replaces it, ``forged`` what a reader could forge.

    Creation is atomic: the secret is written to a private temporary file, then
    hard-linked into place, which fails if another process got there first; both
    then read the one that won."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".storage-secret-")  # mode 0600
        try:
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_hex(32) + "\n")
                out.flush()
                os.fsync(out.fileno())
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
        finally:
            os.unlink(tmp)
        log.info("generated the secret for %s at %s", forged, path, extra={"action": "secret"})
    if path.stat().st_mode & 0o077:
        log.warning(
            "%s is readable by other users: anyone who reads it can forge %s",
            path,
            forged,
            extra={"action": "secret"},
        )
    secret = path.read_text().strip()
    if len(secret) < signing.MIN_SECRET_LENGTH:
        raise ConfigError(
            setting,
            f"{path} holds fewer than {signing.MIN_SECRET_LENGTH} characters: "
            "delete it to have a new one generated",
        )
    return secret
