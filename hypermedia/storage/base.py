"""The storage contract.

A backend stores opaque bytes under keys. Keys are ``/``-separated, relative,
without ``..`` or empty segments (:func:`check_key`); user-chosen file names never
become keys. Output keys are deterministic,
``derived/{pool_id}/{object_id}/{profile_version}/{output_type}`` (:func:`derived_key`).

Every backend honours this, and ``tests/integration/test_storage_contract.py``
runs the same suite against each:

* ``put(key, chunks, max_bytes, content_type=None)`` streams the chunks in and is
  atomic: a reader sees the old bytes or the new bytes, never a partial object;
  writing a key twice replaces it (deterministic output keys make a re-run harmless).
  More than ``max_bytes`` raises :class:`~hypermedia.errors.InputTooLarge` and stores
  nothing (a key that held bytes keeps them). Returns size and sha256.
  ``content_type`` (what the caller knows of the bytes; :data:`DEFAULT_CONTENT_TYPE`
  without, as the local backend answers) is what S3 stores with the object, for those
  who read the bucket itself; a local file keeps none.
* ``set_content_type(key, content_type)`` stores ``content_type`` (the default without)
  with the bytes already at ``key``, unchanged: the type of an upload, known only once
  the stored bytes were inspected. S3 copies the object onto itself (in parts past
  5 GiB); a local file keeps none. A missing key raises ``NotFound``.
* ``read(key)`` streams the bytes; a missing key raises
  :class:`~hypermedia.errors.NotFound` (on first iteration: ``read`` is lazy).
* ``read_range(key, offset, length)`` answers up to ``length`` bytes from ``offset``
  (fewer only at the end, none past it): what input inspection reads, a header or a
  ZIP directory, without fetching the whole object. A missing key raises ``NotFound``.
* ``exists(key)``; ``size(key)`` (``NotFound`` when missing); ``delete(key)``
  (deleting a missing key is not an error).
* ``presign_get(key, ttl_seconds, content_type=None, disposition=None)`` and
  ``presign_put(key, ttl_seconds, content_type=None)`` return URLs any HTTP client can
  use without other credentials: ``GET`` answers the bytes, ``PUT`` stores the request
  body at that key (replacing, atomically). A GET answers ``content_type`` when given (a
  download's type: a browser shows an image, plays a video; without,
  :data:`DEFAULT_CONTENT_TYPE`, or on S3 the type a put stored), ``disposition`` as its
  ``Content-Disposition`` when given (what a browser saves it as:
  :mod:`hypermedia.ingest.downloads`; printable ASCII, :func:`check_disposition`), an
  ``ETag`` that changes when the bytes are replaced, ``304`` to an ``If-None-Match``
  naming it, one ``Range`` of bytes (206; past the end: 416) and honours that range
  under an ``If-Range`` naming the current ``ETag`` (another: the whole blob). A URL is
  bound to its method, its key and, when given, its content type (the one a GET
  answers, the ``Content-Type`` a PUT must send) and disposition; it stops working
  ``ttl_seconds`` after it was made (403). ``ttl_seconds`` is 1 s to 7 days (the
  SigV4 maximum). Issuing a URL touches no object: the key need not exist yet.
  These URLs are how workers, which hold no storage credentials, move bytes; the
  head issues them per job (:mod:`hypermedia.storage.grants`).
* ``check()`` is a cheap look at whether the backend works now (S3: a HEAD of the
  bucket; local: its directory takes a file and has room left), what ``/healthz``
  probes (:mod:`hypermedia.storage.health`): it returns, or raises what a write would.
* A bad key raises :class:`~hypermedia.errors.InvalidRequest` before any I/O; a
  backend that cannot be reached, or cannot write (a read-only disk, a refusal),
  raises :class:`StorageUnavailable`; one with no room left :class:`StorageFull`.
  Either way nothing is stored (a key that held bytes keeps them).

Errors of this package (under :mod:`hypermedia.errors`)::

    Forbidden (403)
    ├── InvalidSignature     a signed URL that was altered, or made for another key or method
    └── UrlExpired           a signed URL past its expiry
    ServiceUnavailable (503)
    └── StorageUnavailable   the object store cannot be reached, or refused us
        └── StorageFull (507)   no room left on the storage's disk
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from hypermedia.errors import Forbidden, InputTooLarge, InvalidRequest, ServiceUnavailable

_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=-]{0,199}$")
_CONTENT_TYPE = re.compile(
    r"^[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,63}/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,62}$"
)
# Text is stored with its charset, or a browser guesses it: UTF-8 is the only one.
_TEXT_CONTENT_TYPE = re.compile(r"^text/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,62}; charset=utf-8$")
_DISPOSITION = re.compile(r"^[\x20-\x7e]{1,2000}$")

MAX_TTL_SECONDS = 7 * 24 * 3600
# The type of bytes nobody said the type of.
DEFAULT_CONTENT_TYPE = "application/octet-stream"


class InvalidSignature(Forbidden):
    code = "invalid_signature"


class UrlExpired(Forbidden):
    code = "url_expired"


class StorageUnavailable(ServiceUnavailable):
    code = "storage_unavailable"


class StorageFull(StorageUnavailable):
    """The storage's disk (or the quota of its file system) has no room left: a retry
    may succeed once the operator made room, not a few seconds later."""

    code = "storage_full"
    status = 507


@dataclass(frozen=True, slots=True)
class StoredBlob:
    key: str
    size_bytes: int
    sha256: str


def check_key(key: str) -> str:
    parts = key.split("/")
    if len(key) > 512 or not parts or not all(_SEGMENT.fullmatch(p) for p in parts):
        raise InvalidRequest(f"invalid storage key {key!r}", key=key)
    return key


def check_segment(value: str, what: str) -> str:
    """One key segment (an output type, a pool id ...): no ``/``, no ``..``."""
    if not _SEGMENT.fullmatch(value):
        raise InvalidRequest(
            f"invalid {what} {value!r}: expected {_SEGMENT.pattern}", **{what: value}
        )
    return value


def check_ttl(ttl_seconds: int) -> int:
    if not 1 <= ttl_seconds <= MAX_TTL_SECONDS:
        raise InvalidRequest(
            f"ttl_seconds must be 1..{MAX_TTL_SECONDS}, got {ttl_seconds}", ttl_seconds=ttl_seconds
        )
    return ttl_seconds


def check_content_type(content_type: str | None) -> str | None:
    """A bare ``type/subtype``, ``text/<subtype>; charset=utf-8`` (no other
    parameters), or None."""
    if content_type is not None and not (
        _CONTENT_TYPE.fullmatch(content_type) or _TEXT_CONTENT_TYPE.fullmatch(content_type)
    ):
        raise InvalidRequest(f"invalid content type {content_type!r}", content_type=content_type)
    return content_type


# Types a browser runs scripts in. A user's bytes are never stored as one of them: a
# bucket read by browsers straight (a CDN in front, public access) would run the user's
# script in its own origin. What hypermedia serves itself is sandboxed (nosniff, CSP).
# text/xsl: Chromium renders it as an XML document, and runs an XHTML script in it.
SCRIPTED_TYPES = frozenset(
    {"text/html", "application/xhtml+xml", "image/svg+xml", "text/xml", "application/xml"}
    | {"text/xsl"}
)


def scripted(content_type: str) -> bool:
    """Whether a browser runs scripts in what is served as ``content_type``: one of
    :data:`SCRIPTED_TYPES`, whatever its parameters and letter case (a browser reads
    ``Text/HTML`` as ``text/html``)."""
    return content_type.partition(";")[0].strip().lower() in SCRIPTED_TYPES


def storable_content_type(content_type: str | None) -> str | None:
    """The type a user's bytes recorded as ``content_type`` are stored as: itself when a
    store takes it (:func:`check_content_type`), else None (untyped: application/octet-
    stream). None too for a type a browser runs scripts in (:data:`SCRIPTED_TYPES`); a
    type a store would refuse (libmagic's, with parameters) stores them untyped rather
    than refuses them."""
    if content_type is not None and scripted(content_type):
        return None
    try:
        return check_content_type(content_type)
    except InvalidRequest:
        return None


def check_disposition(disposition: str | None) -> str | None:
    """A ``Content-Disposition`` value of printable ASCII (no CR/LF: nothing a header
    could be ended or another added with), at most 2000 characters, or None."""
    if disposition is not None and not _DISPOSITION.fullmatch(disposition):
        raise InvalidRequest(
            "invalid content disposition: expected 1-2000 printable ASCII characters"
        )
    return disposition


def check_range(offset: int, length: int) -> None:
    if offset < 0 or length < 0:
        raise InvalidRequest(
            f"invalid byte range: offset {offset}, length {length}", offset=offset, length=length
        )


def original_key(pool_id: str, object_id: str) -> str:
    return check_key(f"originals/{pool_id}/{object_id}")


def derived_key(pool_id: str, object_id: str, profile_version: int, output_type: str) -> str:
    return check_key(f"derived/{pool_id}/{object_id}/{profile_version}/{output_type}")


class Storage(Protocol):
    def put(
        self,
        key: str,
        chunks: Iterable[bytes],
        max_bytes: int | None = None,
        content_type: str | None = None,
    ) -> StoredBlob: ...

    def set_content_type(self, key: str, content_type: str | None) -> None: ...

    def read(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]: ...

    def read_range(self, key: str, offset: int, length: int) -> bytes: ...

    def exists(self, key: str) -> bool: ...

    def size(self, key: str) -> int: ...

    def delete(self, key: str) -> None: ...

    def presign_get(
        self,
        key: str,
        ttl_seconds: int,
        content_type: str | None = None,
        disposition: str | None = None,
    ) -> str: ...

    def presign_put(self, key: str, ttl_seconds: int, content_type: str | None = None) -> str: ...

    def check(self) -> None: ...


def too_large(max_bytes: int) -> InputTooLarge:
    return InputTooLarge(f"upload exceeds the limit of {max_bytes} bytes", max_bytes=max_bytes)
