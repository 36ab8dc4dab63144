"""The storage contract (``hypermedia.storage.base``), one suite for every backend.

* ``local``: :class:`LocalStorage` in a Stack served by a real uvicorn API, whose
  blob routes answer the signed URLs.
* ``s3``: :class:`S3Storage` built from settings, against moto's server over real
  HTTP. moto checks neither the signature nor the expiry of a presigned URL, so
  the HTTP client here goes through :class:`S3Gate`, a transport that checks what
  S3 checks (SigV4 query signature over method, path and signed headers; expiry)
  before forwarding to moto. The URLs themselves are exactly what workers get.

Worker-side transfers (:mod:`hypermedia.storage.transfer`) run against both too.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import hmac
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

import boto3
import httpx
import pytest
from botocore.auth import S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from hypermedia import tls
from hypermedia.clock import SystemClock
from hypermedia.embedded import free_port, listening_socket
from hypermedia.errors import InputTooLarge, InvalidRequest, NotFound
from hypermedia.ingest.api import create_app
from hypermedia.ingest.downloads import content_disposition
from hypermedia.stack import Stack
from hypermedia.storage import transfer
from hypermedia.storage.base import InvalidSignature, Storage, StorageUnavailable
from hypermedia.storage.local import LocalStorage
from hypermedia.storage.s3 import S3Storage
from hypermedia.storage.transfer import TransferDenied, TransferNotFound
from tests import support
from tests.api_support import running_server
from tests.support import open_handles, within

REGION = "us-east-1"
KEY_ID = "AKIAHYPERMEDIATEST"
SECRET_KEY = "hypermedia-test-secret"
LOCAL_UPLOAD_LIMIT = 1 << 20
MiB = 1 << 20


# -- moto, and a gate that checks what S3 checks ---------------------------------------------


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    with support.moto_server() as url:
        yield url


@pytest.fixture
def aws_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Credentials for the S3 client from the environment, as on a real head node."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))


def make_bucket(endpoint: str) -> str:
    name = f"hm-test-{uuid.uuid4().hex[:12]}"
    admin_client(endpoint).create_bucket(Bucket=name)
    return name


@functools.cache
def admin_client(endpoint: str) -> Any:
    """One per moto server (a boto3 client is thread-safe; each cost ~20 ms to make)."""
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=SECRET_KEY,
    )


@dataclass
class S3Gate(httpx.BaseTransport):
    """Refuses presigned requests as S3 would (moto does not): a SigV4 query
    signature that does not match the method, path, query and signed headers is
    403 SignatureDoesNotMatch; one past ``X-Amz-Date + X-Amz-Expires`` is 403
    AccessDenied. Everything else goes on to moto."""

    offset: float = 0.0  # seconds the gate's clock runs ahead of the real one
    # The process's TLS context (HTTPTransport() loads the CA bundle, ~20 ms each).
    inner: httpx.HTTPTransport = field(
        default_factory=lambda: httpx.HTTPTransport(verify=tls.client_context())
    )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        problem = self.refusal(request)
        if problem is None:
            return self.inner.handle_request(request)
        body = f"<?xml version='1.0'?><Error><Code>{problem}</Code></Error>".encode()
        return httpx.Response(
            403, stream=httpx.ByteStream(body), headers={"content-type": "application/xml"}
        )

    def refusal(self, request: httpx.Request) -> str | None:
        parts = urlsplit(str(request.url))
        params = dict(parse_qsl(parts.query, keep_blank_values=True))
        if "X-Amz-Signature" not in params:
            return None
        unsigned = "&".join(
            p for p in parts.query.split("&") if not p.startswith("X-Amz-Signature=")
        )
        signed_headers = params["X-Amz-SignedHeaders"].split(";")
        aws = AWSRequest(
            method=request.method,
            url=urlunsplit(parts._replace(query=unsigned)),
            headers={h: request.headers[h] for h in signed_headers if h in request.headers},
        )
        aws.context["timestamp"] = params["X-Amz-Date"]
        expires = int(params["X-Amz-Expires"])
        auth = S3SigV4QueryAuth(Credentials(KEY_ID, SECRET_KEY), "s3", REGION, expires=expires)
        canonical = auth.canonical_request(aws)
        expected = auth.signature(auth.string_to_sign(aws, canonical), aws)
        if not hmac.compare_digest(expected, params["X-Amz-Signature"]):
            return "SignatureDoesNotMatch"
        made = datetime.strptime(params["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
        if time.time() + self.offset > made.timestamp() + expires:
            return "AccessDenied"
        return None

    def close(self) -> None:
        self.inner.close()


# -- the local backend: a Stack served by uvicorn ---------------------------------------------


# -- the backends -----------------------------------------------------------------------------


@dataclass
class Backend:
    kind: str
    storage: Storage
    http: httpx.Client  # what a worker's HTTP client meets
    advance: Callable[[float], Any]  # move the time the URLs are checked against
    stack: Stack | None = None


@pytest.fixture
def local_backend(settings, manual_clock) -> Iterator[Backend]:
    sock = listening_socket()
    stack = Stack.open(
        settings(
            api_url=f"http://127.0.0.1:{sock.getsockname()[1]}",
            max_upload_bytes=LOCAL_UPLOAD_LIMIT,
        ),
        clock=manual_clock,
        auto_migrate=True,
    )
    try:
        with (
            running_server(create_app(stack), sock),
            httpx.Client(timeout=30, verify=tls.client_context()) as http,
        ):
            yield Backend("local", stack.storage, http, manual_clock.advance, stack)
    finally:
        stack.close()


@pytest.fixture
def s3_backend(moto_endpoint, aws_environment, settings) -> Iterator[Backend]:
    bucket = make_bucket(moto_endpoint)
    from hypermedia.storage.configured import build_storage

    storage = build_storage(
        settings(
            storage_backend="s3",
            s3_bucket=bucket,
            s3_endpoint_url=moto_endpoint,
            s3_region=REGION,
            s3_prefix="hm/",
        ),
        SystemClock(),  # unused: S3 keeps its own time
    )
    assert isinstance(storage, S3Storage)
    gate = S3Gate()

    def advance(seconds: float) -> None:
        gate.offset += seconds

    with httpx.Client(transport=gate, timeout=30) as http:
        yield Backend("s3", storage, http, advance)


@pytest.fixture(params=["local", "s3"])
def backend(request: pytest.FixtureRequest) -> Backend:
    value: Backend = request.getfixturevalue(f"{request.param}_backend")
    return value


def _read(storage: Storage, key: str) -> bytes:
    return b"".join(storage.read(key))


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- check (what /healthz probes) -------------------------------------------------------------


def test_a_working_backend_passes_its_check_and_keeps_nothing(backend):
    backend.storage.check()
    if isinstance(backend.storage, LocalStorage):
        assert not [p for p in backend.storage.root.iterdir() if p.name.startswith(".probe")]


def test_the_check_of_a_bucket_that_is_not_there_says_so(moto_endpoint, aws_environment):
    storage = S3Storage("hm-no-such-bucket", endpoint_url=moto_endpoint, region=REGION)
    with pytest.raises(StorageUnavailable, match="'hm-no-such-bucket' does not exist"):
        storage.check()


# -- put / read / exists / size / delete ------------------------------------------------------


def test_put_read_exists_size_delete(backend):
    storage = backend.storage
    key = "originals/p1/o1"
    assert not storage.exists(key)
    blob = storage.put(key, [b"hello ", b"", b"world"])
    assert (blob.key, blob.size_bytes, blob.sha256) == (key, 11, _sha(b"hello world"))
    assert storage.exists(key)
    assert storage.size(key) == 11
    assert _read(storage, key) == b"hello world"
    assert list(storage.read(key, chunk_size=4)) == [b"hell", b"o wo", b"rld"]
    storage.delete(key)
    assert not storage.exists(key)
    storage.delete(key)  # deleting what is gone is fine


def test_an_empty_object(backend):
    blob = backend.storage.put("derived/p/o/1/empty.txt", [])
    assert (blob.size_bytes, blob.sha256) == (0, _sha(b""))
    assert backend.storage.size("derived/p/o/1/empty.txt") == 0
    assert _read(backend.storage, "derived/p/o/1/empty.txt") == b""


def test_missing_keys_are_not_found(backend):
    with pytest.raises(NotFound):
        _read(backend.storage, "originals/p1/nothing")
    with pytest.raises(NotFound):
        backend.storage.size("originals/p1/nothing")


def test_read_range(backend):
    storage = backend.storage
    key = "originals/p1/ranged"
    storage.put(key, [bytes(range(256)) * 4])
    assert storage.read_range(key, 0, 4) == b"\x00\x01\x02\x03"
    assert storage.read_range(key, 1020, 100) == bytes([252, 253, 254, 255])  # short at the end
    assert storage.read_range(key, 1024, 10) == b""
    assert storage.read_range(key, 5000, 10) == b""
    assert storage.read_range(key, 10, 0) == b""
    with pytest.raises(NotFound):
        storage.read_range("originals/p1/nothing", 0, 10)
    with pytest.raises(NotFound):
        storage.read_range("originals/p1/nothing", 0, 0)
    with pytest.raises(InvalidRequest):
        storage.read_range(key, -1, 10)


def test_a_second_put_replaces_atomically(backend):
    storage = backend.storage
    key = "derived/p/o/1/thumb.webp"
    storage.put(key, [b"old" * 1000])
    seen_during_put: list[bytes] = []

    def new_bytes() -> Iterator[bytes]:
        yield b"new" * 1000
        seen_during_put.append(_read(storage, key))  # mid-write: the old bytes, whole
        yield b"NEW" * 1000

    blob = storage.put(key, new_bytes())
    assert seen_during_put == [b"old" * 1000]
    assert _read(storage, key) == b"new" * 1000 + b"NEW" * 1000
    assert blob.size_bytes == 6000


def test_a_large_put_streams_in_parts(backend):
    chunk = os.urandom(MiB)
    chunks = [chunk] * 12  # 12 MiB: several S3 parts
    blob = backend.storage.put("originals/p/big", iter(chunks))
    assert blob.size_bytes == 12 * MiB
    assert blob.sha256 == _sha(chunk * 12)
    assert backend.storage.size("originals/p/big") == 12 * MiB
    digest = hashlib.sha256()
    for piece in backend.storage.read("originals/p/big"):
        digest.update(piece)
    assert digest.hexdigest() == blob.sha256


@pytest.mark.parametrize("limit", [2000, 11 * MiB], ids=["small", "multipart"])
def test_more_than_max_bytes_stores_nothing(backend, limit):
    def one_byte_too_many(fill: bytes) -> Iterator[bytes]:
        yield from [fill * MiB] * (limit // MiB)
        yield fill * (limit % MiB + 1)

    storage = backend.storage
    with pytest.raises(InputTooLarge):
        storage.put("originals/p/new", one_byte_too_many(b"x"), limit)
    assert not storage.exists("originals/p/new")

    storage.put("originals/p/kept", [b"kept"])
    with pytest.raises(InputTooLarge):
        storage.put("originals/p/kept", one_byte_too_many(b"y"), limit)
    assert _read(storage, "originals/p/kept") == b"kept"


def test_exactly_max_bytes_is_fine(backend):
    assert backend.storage.put("originals/p/full", [b"x" * 10], max_bytes=10).size_bytes == 10


@pytest.mark.parametrize("key", ["", "/abs", "a//b", "../etc/passwd", "a/../b", "a/.hidden", "a\n"])
def test_bad_keys_are_refused(backend, key):
    storage = backend.storage
    for call in (
        lambda: storage.put(key, [b"x"]),
        lambda: _read(storage, key),
        lambda: storage.exists(key),
        lambda: storage.size(key),
        lambda: storage.delete(key),
        lambda: storage.presign_get(key, 60),
        lambda: storage.presign_put(key, 60),
    ):
        with pytest.raises(InvalidRequest):
            call()


@pytest.mark.parametrize("ttl", [0, 7 * 24 * 3600 + 1])
def test_url_lifetimes_are_bounded(backend, ttl):
    with pytest.raises(InvalidRequest):
        backend.storage.presign_get("a/b", ttl)
    with pytest.raises(InvalidRequest):
        backend.storage.presign_put("a/b", ttl)


# -- presigned URLs ---------------------------------------------------------------------------


def test_presigned_get_round_trip(backend):
    data = os.urandom(300_000)
    backend.storage.put("originals/p/o", [data])
    url = backend.storage.presign_get("originals/p/o", 60)
    response = backend.http.get(url)
    assert response.status_code == 200, response.text
    assert response.content == data
    assert int(response.headers["content-length"]) == len(data)
    assert backend.http.get(url).content == data  # usable more than once until it expires


@pytest.mark.parametrize(
    ("asked", "start", "end"),
    [("bytes=0-9", 0, 9), ("bytes=299990-", 299_990, 299_999), ("bytes=-5", 299_995, 299_999)],
)
def test_a_get_url_serves_a_byte_range(backend, asked, start, end):
    """A download URL goes to a browser: a <video> seeks with Range requests (Safari
    plays nothing from a server that answers them 200), and a large output resumes.
    The local blob route answered every Range with the whole file (200); S3 answers 206."""
    data = os.urandom(300_000)
    backend.storage.put("derived/p/o/1/video", [data])
    url = backend.storage.presign_get("derived/p/o/1/video", 60)
    response = backend.http.get(url, headers={"Range": asked})
    assert response.status_code == 206, response.text
    assert response.content == data[start : end + 1]
    assert response.headers["content-range"] == f"bytes {start}-{end}/{len(data)}"
    assert int(response.headers["content-length"]) == end + 1 - start
    assert response.headers["accept-ranges"] == "bytes"


def test_a_get_url_answers_its_content_type_an_etag_and_304(backend):
    """A download is shown by a browser as its type, and revalidated, not fetched again.
    The local blob route answered every blob as application/octet-stream with no
    validator (S3 answers an ETag, and the type the URL asks for)."""
    key = "derived/p/o/1/thumbnail"
    data = os.urandom(1000)
    backend.storage.put(key, [data])
    url = backend.storage.presign_get(key, 60, "image/webp")
    got = backend.http.get(url)
    assert got.status_code == 200 and got.content == data
    assert got.headers["content-type"] == "image/webp"
    etag = got.headers["etag"]
    assert etag.startswith('"') and etag.endswith('"') and len(etag) > 2
    assert "last-modified" in got.headers
    if backend.kind == "local":  # a URL S3 signs for GET is no HEAD's
        head = backend.http.head(url)
        assert (head.headers["etag"], head.headers["content-type"]) == (etag, "image/webp")
    # moto reads one tag; the blob route any list, weak comparison as RFC 9110 says.
    for asked in (etag,) if backend.kind == "s3" else (etag, f'"other", {etag}', f"W/{etag}"):
        same = backend.http.get(url, headers={"If-None-Match": asked})
        assert (same.status_code, same.content) == (304, b""), asked
        assert same.headers["etag"] == etag
    assert backend.http.get(url, headers={"If-None-Match": '"other"'}).content == data
    # If-Range: the range while the blob is the one its tag names, else the whole blob.
    ranged = backend.http.get(url, headers={"Range": "bytes=0-9", "If-Range": etag})
    assert (ranged.status_code, ranged.content) == (206, data[:10])
    if backend.kind == "local":  # moto serves the range whatever the If-Range
        stale = backend.http.get(url, headers={"Range": "bytes=0-9", "If-Range": '"other"'})
        assert (stale.status_code, stale.content) == (200, data)
    # Replaced: another tag, and the old one no longer answers 304.
    time.sleep(0.01)
    backend.storage.put(key, [b"new bytes"])
    again = backend.http.get(url, headers={"If-None-Match": etag})
    assert (again.status_code, again.content) == (200, b"new bytes")
    assert again.headers["etag"] != etag
    text = backend.storage.presign_get(key, 60, "text/plain; charset=utf-8")
    assert backend.http.get(text).headers["content-type"] == "text/plain; charset=utf-8"
    with pytest.raises(InvalidRequest, match="content type"):
        backend.storage.presign_get(key, 60, "text/html; charset=latin-1")


def test_a_get_urls_content_type_is_signed(local_backend):
    storage, http = local_backend.storage, local_backend.http
    storage.put("derived/p/o/1/page", [b"<script>alert(1)</script>"])
    url = storage.presign_get("derived/p/o/1/page", 60, "text/plain; charset=utf-8")
    swapped = url.replace("text%2Fplain", "text%2Fhtml")
    assert swapped != url and http.get(swapped).status_code == 403
    plain = http.get(storage.presign_get("derived/p/o/1/page", 60))
    assert plain.headers["content-type"] == "application/octet-stream"
    assert plain.headers["x-content-type-options"] == "nosniff"
    # A type a browser runs scripts in is served sandboxed from the API's origin.
    html = http.get(storage.presign_get("derived/p/o/1/page", 60, "text/html"))
    assert html.headers["content-security-policy"] == "sandbox"
    assert "content-security-policy" not in plain.headers
    # Whatever its letter case or parameters: a browser reads Text/HTML as text/html.
    # text/xsl: Chromium renders it as an XML document (its XHTML scripts run).
    scripted_types = ("Text/HTML", "IMAGE/SVG+XML", "text/XML; charset=utf-8")
    for scripted in (*scripted_types, "text/xsl; charset=utf-8"):
        served = http.get(storage.presign_get("derived/p/o/1/page", 60, scripted))
        assert served.headers["content-type"] == scripted
        assert served.headers.get("content-security-policy") == "sandbox", scripted


def test_a_put_keeps_the_type_it_is_given_and_an_untyped_url_answers_the_default(backend, request):
    """S3 stored no type (a reader of the bucket, or an untyped URL, met S3's
    binary/octet-stream where the local backend answers application/octet-stream):
    it stores the one the caller knows, the default without, as the local backend
    answers an untyped URL; a typed URL answers its type on both."""
    small, large = os.urandom(1000), os.urandom(9 * MiB)  # one PutObject; a multipart
    backend.storage.put("originals/p/typed", [small], content_type="image/png")
    backend.storage.put("originals/p/large", [large], content_type="video/mp4")
    backend.storage.put("originals/p/untyped", [small])
    untyped = backend.http.get(backend.storage.presign_get("originals/p/untyped", 60))
    assert untyped.content == small
    assert untyped.headers["content-type"] == "application/octet-stream"
    asked = backend.http.get(backend.storage.presign_get("originals/p/typed", 60, "image/gif"))
    assert asked.headers["content-type"] == "image/gif"
    large_url = backend.storage.presign_get("originals/p/large", 60)
    expected = "video/mp4" if backend.kind == "s3" else "application/octet-stream"
    assert backend.http.get(large_url).headers["content-type"] == expected
    with pytest.raises(InvalidRequest, match="content type"):
        backend.storage.put("originals/p/bad", [small], content_type="text/html\r\nX-A: b")
    assert not backend.storage.exists("originals/p/bad")
    if isinstance(backend.storage, S3Storage):
        admin = admin_client(request.getfixturevalue("moto_endpoint"))
        stored = {
            key: admin.head_object(Bucket=backend.storage.bucket, Key=backend.storage.name(key))
            for key in ("originals/p/typed", "originals/p/large", "originals/p/untyped")
        }
        assert {key: head["ContentType"] for key, head in stored.items()} == {
            "originals/p/typed": "image/png",
            "originals/p/large": "video/mp4",
            "originals/p/untyped": "application/octet-stream",
        }


def test_a_get_url_answers_its_content_disposition(backend):
    """A browser saving a download named it after the key's last segment (nothing on
    either backend said otherwise): a URL signed with a disposition answers it, on a
    GET, a range and a 304 alike, whatever quotes, backslashes, CR/LF or other script
    the name held (the header is built from it as printable ASCII)."""
    key = "derived/p/o/1/thumbnail-64x64.webp"
    backend.storage.put(key, [b"RIFF-bytes"])
    name = 'a"b\\c\r\nSet-Cookie: x=1 تقرير.webp'
    value = content_disposition(name, "image/webp")
    url = backend.storage.presign_get(key, 60, "image/webp", value)
    got = backend.http.get(url)
    assert (got.status_code, got.content) == (200, b"RIFF-bytes")
    assert got.headers["content-disposition"] == value
    assert value.startswith('inline; filename="a_b_c_Set-Cookie_ x_1 _.webp"; filename*=')
    assert "set-cookie" not in got.headers
    ranged = backend.http.get(url, headers={"Range": "bytes=0-3"})
    assert (ranged.status_code, ranged.headers["content-disposition"]) == (206, value)
    same = backend.http.get(url, headers={"If-None-Match": got.headers["etag"]})
    assert same.status_code == 304
    if backend.kind == "local":  # moto answers a 304 without it; S3 sends it
        assert same.headers["content-disposition"] == value
    assert (
        "content-disposition" not in backend.http.get(backend.storage.presign_get(key, 60)).headers
    )
    for bad in ("inline\r\nSet-Cookie: x=1", 'inline; filename="\u00e9"', ""):
        with pytest.raises(InvalidRequest, match="content disposition"):
            backend.storage.presign_get(key, 60, "image/webp", bad)


def test_a_get_urls_disposition_is_signed(local_backend):
    storage, http = local_backend.storage, local_backend.http
    storage.put("derived/p/o/1/page", [b"bytes"])
    url = storage.presign_get("derived/p/o/1/page", 60, None, 'inline; filename="a.txt"')
    assert http.get(url).status_code == 200
    swapped = url.replace("inline", "attachment")
    assert swapped != url and http.get(swapped).status_code == 403
    dropped = re.sub(r"&disposition=[^&]*", "", url)
    assert dropped != url and http.get(dropped).status_code == 403
    # Neither a content type nor a disposition passes for both (a line break in the first).
    both = storage.presign_get("derived/p/o/1/page", 60, "text/plain", 'inline; filename="a"')
    query = dict(parse_qsl(urlsplit(both).query))
    merged = (
        f"{both.split('?')[0]}?expires={query['expires']}&sig={query['sig']}"
        f"&content_type={quote(query['content_type'] + chr(10) + query['disposition'], safe='')}"
    )
    assert http.get(merged).status_code == 403


def test_a_stored_objects_type_is_set_its_bytes_unchanged(backend, request, monkeypatch):
    """An upload is stored before it is inspected: set_content_type gives the stored
    bytes their type once known (S3: a copy onto itself, in parts past copy_part_size,
    here 5 MiB for a 12 MiB object); the default without. A local file keeps none."""
    small, large = os.urandom(1000), os.urandom(12 * MiB)
    backend.storage.put("originals/p/small", [small])
    backend.storage.put("originals/p/large", [large])
    if isinstance(backend.storage, S3Storage):
        monkeypatch.setattr(backend.storage, "copy_part_size", 5 * MiB)
    backend.storage.set_content_type("originals/p/small", "image/png")
    backend.storage.set_content_type("originals/p/large", "video/mp4")
    backend.storage.set_content_type("originals/p/small", "image/png")  # as it is: no copy
    assert b"".join(backend.storage.read("originals/p/small")) == small
    assert b"".join(backend.storage.read("originals/p/large")) == large
    with pytest.raises(NotFound):
        backend.storage.set_content_type("originals/p/missing", "image/png")
    with pytest.raises(InvalidRequest, match="content type"):
        backend.storage.set_content_type("originals/p/small", "text/html\r\nX-A: b")
    small_url = backend.storage.presign_get("originals/p/small", 60)
    expected = "image/png" if backend.kind == "s3" else "application/octet-stream"
    assert backend.http.get(small_url).headers["content-type"] == expected
    if isinstance(backend.storage, S3Storage):
        admin = admin_client(request.getfixturevalue("moto_endpoint"))
        name = backend.storage.name
        types = {
            key: admin.head_object(Bucket=backend.storage.bucket, Key=name(key))["ContentType"]
            for key in ("originals/p/small", "originals/p/large")
        }
        assert types == {"originals/p/small": "image/png", "originals/p/large": "video/mp4"}
        backend.storage.set_content_type("originals/p/small", None)
        head = admin.head_object(Bucket=backend.storage.bucket, Key=name("originals/p/small"))
        assert head["ContentType"] == "application/octet-stream"
        uploads = admin.list_multipart_uploads(Bucket=backend.storage.bucket)
        assert uploads.get("Uploads", []) == []


def test_a_get_url_answers_a_range_past_the_end_416(backend):
    backend.storage.put("derived/p/o/1/video", [b"x" * 100])
    url = backend.storage.presign_get("derived/p/o/1/video", 60)
    response = backend.http.get(url, headers={"Range": "bytes=100-"})
    assert response.status_code == 416
    if backend.kind == "local":
        assert response.headers["content-range"] == "bytes */100"


def test_the_local_blob_route_answers_head_and_what_it_cannot_serve_as_a_range_whole(
    local_backend,
):
    storage, http = local_backend.storage, local_backend.http
    data = os.urandom(1000)
    storage.put("derived/p/o/1/video", [data])
    url = storage.presign_get("derived/p/o/1/video", 60)
    head = http.head(url)  # was 405 method_not_allowed
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == "1000"
    assert head.headers["accept-ranges"] == "bytes"
    assert http.head(_tamper(url, "sig")).status_code == 403
    # Several ranges, a unit other than bytes, a malformed one, or an If-Range that is
    # not the blob's ETag (another tag, a date): the whole blob, as RFC 9110 allows.
    for headers in (
        {"Range": "bytes=0-1,5-6"},
        {"Range": "items=0-1"},
        {"Range": "bytes=9-1"},
        {"Range": "bytes=0-1", "If-Range": '"abc"'},
        {"Range": "bytes=0-1", "If-Range": "Wed, 21 Oct 2015 07:28:00 GMT"},
    ):
        whole = http.get(url, headers=headers)
        assert (whole.status_code, whole.content) == (200, data), headers
    error = http.get(url, headers={"Range": "bytes=2000-"}).json()["error"]
    assert error["code"] == "range_not_satisfiable" and "1000 bytes" in error["message"]


def test_the_local_blob_route_documents_what_a_head_of_a_range_answers(local_backend):
    # Before: a HEAD with a Range answered 206 (416 past the end), as a GET does, but
    # headBlob's OpenAPI entry listed neither.
    storage, http = local_backend.storage, local_backend.http
    storage.put("derived/p/o/1/video", [b"x" * 100])
    url = storage.presign_get("derived/p/o/1/video", 60)
    ranged = http.head(url, headers={"Range": "bytes=0-9"})
    assert ranged.status_code == 206 and ranged.headers["content-range"] == "bytes 0-9/100"
    past = http.head(url, headers={"Range": "bytes=100-"})
    assert past.status_code == 416 and past.headers["content-range"] == "bytes */100"
    base = url.split("/v1/", 1)[0]
    document = http.get(f"{base}/openapi.json").json()
    head = document["paths"]["/v1/hypermedia/blobs/{key}"]["head"]["responses"]
    get = document["paths"]["/v1/hypermedia/blobs/{key}"]["get"]["responses"]
    assert {"206", "416"} <= set(head), sorted(head)
    assert "Content-Range" in head["206"]["headers"]
    assert head["416"] == get["416"]


def test_presigned_put_round_trip_and_replace(backend):
    key = "derived/p/o/2/convert.png"
    url = backend.storage.presign_put(key, 60)
    assert not backend.storage.exists(key)  # issuing a URL stores nothing
    response = backend.http.put(url, content=b"first")
    assert response.status_code == 200, response.text
    assert _read(backend.storage, key) == b"first"
    assert backend.http.put(url, content=b"second!").status_code == 200
    assert _read(backend.storage, key) == b"second!"
    assert backend.storage.size(key) == 7


def test_a_put_url_for_a_content_type_needs_that_content_type(backend):
    key = "derived/p/o/1/thumb.webp"
    url = backend.storage.presign_put(key, 60, "image/webp")
    wrong = backend.http.put(url, content=b"RIFF", headers={"Content-Type": "text/html"})
    assert wrong.status_code == 403
    assert not backend.storage.exists(key)
    right = backend.http.put(url, content=b"RIFF", headers={"Content-Type": "image/webp"})
    assert right.status_code == 200, right.text
    assert _read(backend.storage, key) == b"RIFF"


def test_a_get_url_of_a_missing_key_is_404(backend):
    response = backend.http.get(backend.storage.presign_get("originals/p/none", 60))
    assert response.status_code == 404


def test_expired_urls_are_refused(backend):
    backend.storage.put("originals/p/o", [b"secret bytes"])
    get_url = backend.storage.presign_get("originals/p/o", 30)
    put_url = backend.storage.presign_put("derived/p/o/1/out", 30)
    backend.advance(31)
    response = backend.http.get(get_url)
    assert response.status_code == 403
    assert b"secret bytes" not in response.content
    assert backend.http.put(put_url, content=b"late").status_code == 403
    assert not backend.storage.exists("derived/p/o/1/out")


def test_a_put_url_for_one_key_cannot_write_another(backend):
    url = backend.storage.presign_put("derived/p/o/1/a.png", 60)
    other = url.replace("/derived/p/o/1/a.png", "/derived/p/o/1/b.png")
    assert other != url
    assert backend.http.put(other, content=b"sneaky").status_code == 403
    assert not backend.storage.exists("derived/p/o/1/b.png")
    backend.storage.put("originals/p/o", [b"original"])
    elsewhere = url.replace("/derived/p/o/1/a.png", "/originals/p/o")
    assert backend.http.put(elsewhere, content=b"overwritten").status_code == 403
    assert _read(backend.storage, "originals/p/o") == b"original"


def test_a_get_url_cannot_put(backend):
    backend.storage.put("originals/p/o", [b"original"])
    url = backend.storage.presign_get("originals/p/o", 60)
    assert backend.http.put(url, content=b"overwritten").status_code == 403
    assert _read(backend.storage, "originals/p/o") == b"original"


def _tamper(url: str, name: str) -> str:
    """The URL with the last hex digit of parameter ``name`` changed."""
    value = dict(parse_qsl(urlsplit(url).query))[name]
    changed = value[:-1] + ("0" if value[-1] != "0" else "1")
    tampered = url.replace(f"{name}={value}", f"{name}={changed}")
    assert tampered != url
    return tampered


def test_a_tampered_signature_is_refused(backend):
    backend.storage.put("originals/p/o", [b"original"])
    signature = "sig" if backend.kind == "local" else "X-Amz-Signature"
    get_url = _tamper(backend.storage.presign_get("originals/p/o", 60), signature)
    assert backend.http.get(get_url).status_code == 403
    put_url = _tamper(backend.storage.presign_put("originals/p/o", 60), signature)
    assert backend.http.put(put_url, content=b"x").status_code == 403
    assert _read(backend.storage, "originals/p/o") == b"original"


def test_a_url_with_a_longer_life_written_in_is_refused(backend):
    backend.storage.put("originals/p/o", [b"original"])
    url = backend.storage.presign_get("originals/p/o", 30)
    expiry = "expires" if backend.kind == "local" else "X-Amz-Expires"
    pairs = parse_qsl(urlsplit(url).query)
    value = dict(pairs)[expiry]
    longer = url.replace(f"{expiry}={value}", f"{expiry}={int(value) + 86400}")
    assert backend.http.get(longer).status_code == 403


# -- transfers, as a worker makes them ---------------------------------------------------------


def test_transfer_download_and_upload(backend, tmp_path):
    data = os.urandom(3 * MiB // 4)
    backend.storage.put("originals/p/o", [data])
    dest = tmp_path / "in" / "input.bin"
    size, sha = transfer.download(
        backend.storage.presign_get("originals/p/o", 60), dest, len(data), client=backend.http
    )
    assert (size, sha) == (len(data), _sha(data))
    assert dest.read_bytes() == data

    out = tmp_path / "out.webp"
    out.write_bytes(b"RIFF" + data[:1000])
    url = backend.storage.presign_put("derived/p/o/1/thumb.webp", 60, "image/webp")
    transfer.upload(out, url, "image/webp", client=backend.http)
    assert _read(backend.storage, "derived/p/o/1/thumb.webp") == out.read_bytes()


def test_transfer_download_refuses_more_than_max_bytes(backend, tmp_path):
    backend.storage.put("originals/p/o", [b"x" * 5000])
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(InputTooLarge):
        transfer.download(
            backend.storage.presign_get("originals/p/o", 60),
            work / "input.bin",
            4999,
            client=backend.http,
        )
    assert list(work.iterdir()) == []  # no partial file


def test_transfer_errors_name_the_status_and_the_stores_code(backend, tmp_path):
    backend.storage.put("originals/p/o", [b"x"])
    late = backend.storage.presign_get("originals/p/o", 10)
    late_put = backend.storage.presign_put("a/b", 10)
    missing = backend.storage.presign_get("originals/p/none", 600)
    backend.advance(11)
    (tmp_path / "work").mkdir()
    with pytest.raises(TransferDenied) as denied:
        transfer.download(late, tmp_path / "work" / "a", 100, client=backend.http)
    assert denied.value.http_status == 403
    assert denied.value.remote_code == (
        "url_expired" if backend.kind == "local" else "AccessDenied"
    )
    assert "sig" not in str(denied.value) and "Signature" not in str(denied.value)
    with pytest.raises(TransferNotFound) as absent:
        transfer.download(missing, tmp_path / "work" / "b", 100, client=backend.http)
    assert absent.value.http_status == 404
    assert absent.value.remote_code == ("not_found" if backend.kind == "local" else "NoSuchKey")
    source = tmp_path / "up"
    source.write_bytes(b"x")
    with pytest.raises(TransferDenied) as refused:
        transfer.upload(source, late_put, client=backend.http)
    assert refused.value.http_status == 403
    assert not backend.storage.exists("a/b")
    assert list((tmp_path / "work").iterdir()) == []  # no half-downloaded files left


# -- the local backend's routes -----------------------------------------------------------------


def _error_code(response: httpx.Response) -> str:
    code: str = response.json()["error"]["code"]
    return code


def test_local_refusals_say_why(local_backend):
    storage, http = local_backend.storage, local_backend.http
    storage.put("originals/p/o", [b"x"])
    url = storage.presign_get("originals/p/o", 30)
    assert _error_code(http.get(_tamper(url, "sig"))) == "invalid_signature"
    assert _error_code(http.get(url.split("?")[0])) == "invalid_signature"
    local_backend.advance(31)
    response = http.get(url)
    assert (response.status_code, _error_code(response)) == (403, "url_expired")


def test_local_blob_puts_are_capped(local_backend):
    storage, http = local_backend.storage, local_backend.http
    url = storage.presign_put("derived/p/o/1/big", 60)
    too_big = http.put(url, content=b"x" * (LOCAL_UPLOAD_LIMIT + 1))
    assert (too_big.status_code, _error_code(too_big)) == (413, "input_too_large")

    def undeclared() -> Iterator[bytes]:  # chunked: no Content-Length to check first
        for _ in range(LOCAL_UPLOAD_LIMIT // 65536 + 1):
            yield b"x" * 65536

    streamed = http.put(url, content=undeclared())
    assert streamed.status_code == 413
    assert not storage.exists("derived/p/o/1/big")
    assert isinstance(storage, LocalStorage)
    assert not list(storage.root.rglob(".upload-*"))
    ok = http.put(url, content=b"x" * LOCAL_UPLOAD_LIMIT)
    assert ok.status_code == 200
    assert ok.json() == {
        "key": "derived/p/o/1/big",
        "size_bytes": LOCAL_UPLOAD_LIMIT,
        "sha256": _sha(b"x" * LOCAL_UPLOAD_LIMIT),
    }


def test_a_download_its_client_abandons_closes_its_file_at_once(local_backend):
    # Before: a GET whose client went away while the route waited to send (a reader
    # that stopped reading, then closed) left its file open until Python's cyclic
    # garbage collector came by: 300 abandoned 20 MB downloads held 300 descriptors
    # (and, a blob deleted since, its disk space) for as long as it did not.
    storage = local_backend.storage
    assert isinstance(storage, LocalStorage)
    key = "derived/p/o/1/video"
    storage.put(key, [os.urandom(8 * MiB)])
    parts = urlsplit(storage.presign_get(key, 60))
    assert parts.hostname is not None and parts.port is not None
    readers = []
    collecting = gc.isenabled()
    gc.disable()  # what closes the file must not be the collector's pass
    try:
        for _ in range(10):
            reader = socket.socket()
            reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            reader.connect((parts.hostname, parts.port))
            request = f"GET {parts.path}?{parts.query} HTTP/1.1\r\nHost: test\r\n\r\n"
            reader.sendall(request.encode())
            readers.append(reader)
        assert within(20, lambda: open_handles(storage.path(key)) == 10)
        for reader in readers:
            reader.close()
        assert within(10, lambda: open_handles(storage.path(key)) == 0), (
            f"{open_handles(storage.path(key))} of 10 still open"
        )
    finally:
        for reader in readers:
            reader.close()
        if collecting:
            gc.enable()


def test_local_blob_routes_need_no_api_key_but_other_routes_still_do(local_backend):
    local_backend.storage.put("originals/p/o", [b"x"])
    base = local_backend.storage.presign_get("originals/p/o", 60).split("/v1/")[0]
    assert local_backend.http.get(local_backend.storage.presign_get("originals/p/o", 60)).is_success
    assert local_backend.http.get(f"{base}/v1/hypermedia/credits").status_code == 401


def test_the_stack_builds_local_storage_with_a_kept_secret(local_backend):
    storage = local_backend.storage
    assert isinstance(storage, LocalStorage)
    secret_file = local_backend.stack.settings.storage_secret_path
    assert secret_file.is_file()
    assert oct(secret_file.stat().st_mode & 0o777) == "0o600"
    # another process of the deployment (same data_dir) signs URLs the API accepts
    from hypermedia.storage.configured import build_storage

    sibling = build_storage(local_backend.stack.settings, local_backend.stack.clock)
    storage.put("originals/p/o", [b"shared"])
    assert local_backend.http.get(sibling.presign_get("originals/p/o", 60)).content == b"shared"


def test_a_configured_secret_is_used_instead(settings, tmp_path, manual_clock):
    from hypermedia.storage.configured import build_storage

    configured = build_storage(settings(storage_secret="c" * 40), manual_clock)
    generated = build_storage(settings(), manual_clock)
    assert isinstance(configured, LocalStorage)
    assert isinstance(generated, LocalStorage)
    query = dict(parse_qsl(urlsplit(configured.presign_get("a/b", 60)).query))
    configured.verify("GET", "a/b", query["expires"], query["sig"])
    with pytest.raises(InvalidSignature):
        generated.verify("GET", "a/b", query["expires"], query["sig"])


# -- the S3 backend -----------------------------------------------------------------------------


def test_s3_urls_are_sigv4_with_the_ttl(s3_backend):
    url = s3_backend.storage.presign_get("originals/p/o", 900)
    params = dict(parse_qsl(urlsplit(url).query))
    assert params["X-Amz-Algorithm"] == "AWS4-HMAC-SHA256"
    assert params["X-Amz-Expires"] == "900"
    assert urlsplit(url).path.endswith("/hm/originals/p/o")  # path-style, under the prefix
    put = dict(parse_qsl(urlsplit(s3_backend.storage.presign_put("a/b", 60, "image/png")).query))
    assert "content-type" in put["X-Amz-SignedHeaders"].split(";")


def test_s3_objects_live_under_the_prefix(s3_backend, moto_endpoint):
    storage = s3_backend.storage
    storage.put("originals/p/o", [b"x"])
    listed = admin_client(moto_endpoint).list_objects_v2(Bucket=storage.bucket)
    assert [o["Key"] for o in listed["Contents"]] == ["hm/originals/p/o"]


def test_s3_a_refused_multipart_upload_leaves_no_parts(s3_backend, moto_endpoint):
    storage = s3_backend.storage
    with pytest.raises(InputTooLarge):
        storage.put("originals/p/o", iter([b"x" * MiB] * 20), max_bytes=19 * MiB)
    uploads = admin_client(moto_endpoint).list_multipart_uploads(Bucket=storage.bucket)
    assert uploads.get("Uploads", []) == []

    def broken() -> Iterator[bytes]:
        yield b"x" * 9 * MiB
        raise OSError("the source went away")

    with pytest.raises(OSError, match="went away"):
        storage.put("originals/p/o", broken())
    uploads = admin_client(moto_endpoint).list_multipart_uploads(Bucket=storage.bucket)
    assert uploads.get("Uploads", []) == []
    assert not storage.exists("originals/p/o")


def test_s3_unreachable_is_storage_unavailable(aws_environment):
    storage = S3Storage(
        "hm-test-gone", endpoint_url=f"http://127.0.0.1:{free_port()}", region=REGION
    )
    with pytest.raises(StorageUnavailable):
        storage.exists("a/b")
    with pytest.raises(StorageUnavailable):
        storage.put("a/b", [b"x"])


def test_s3_a_missing_bucket_is_storage_unavailable(moto_endpoint, aws_environment):
    storage = S3Storage("hm-test-never-made", endpoint_url=moto_endpoint, region=REGION)
    with pytest.raises(StorageUnavailable, match="does not exist"):
        storage.put("a/b", [b"x"])


def test_blob_routes_are_not_found_when_storage_is_s3(settings, moto_endpoint, aws_environment):
    bucket = make_bucket(moto_endpoint)
    sock = listening_socket()
    stack = Stack.open(
        settings(
            storage_backend="s3",
            s3_bucket=bucket,
            s3_endpoint_url=moto_endpoint,
            s3_region=REGION,
            api_url=f"http://127.0.0.1:{sock.getsockname()[1]}",
        ),
        auto_migrate=True,
    )
    try:
        assert isinstance(stack.storage, S3Storage)
        stack.storage.put("originals/p/o", [b"x"])
        assert _read(stack.storage, "originals/p/o") == b"x"
        with running_server(create_app(stack), sock) as base:
            response = httpx.get(
                f"{base}/v1/hypermedia/blobs/originals/p/o?expires=1&sig=00",
                verify=tls.client_context(),
            )
            assert (response.status_code, _error_code(response)) == (404, "not_found")
    finally:
        stack.close()


def test_local_deletes_take_the_directories_they_empty(local_backend):
    """Keys name no directories (as in S3): a checkpoint sweep left checkpoints/<job>/
    <version>/<digest>/ behind for every job. A directory another blob is in stays, as
    does the root; a put into a directory a delete just emptied still lands."""
    storage = local_backend.storage
    assert isinstance(storage, LocalStorage)
    storage.put("checkpoints/j1/1/d1/chunk-0", [b"a"])
    storage.put("checkpoints/j1/1/d1/chunk-1", [b"b"])
    storage.put("checkpoints/j2/1/d2/chunk-0", [b"c"])
    storage.delete("checkpoints/j1/1/d1/chunk-0")
    assert (storage.root / "checkpoints/j1/1/d1").is_dir()  # chunk-1 is still there
    storage.delete("checkpoints/j1/1/d1/chunk-1")
    assert not (storage.root / "checkpoints/j1").exists()
    assert (storage.root / "checkpoints/j2/1/d2/chunk-0").is_file()
    storage.delete("checkpoints/j2/1/d2/chunk-0")
    assert not (storage.root / "checkpoints").exists() and storage.root.is_dir()
    storage.delete("checkpoints/j2/1/d2/chunk-0")  # gone already: nothing to do
    storage.put("checkpoints/j2/1/d2/chunk-0", [b"c"])
    assert b"".join(storage.read("checkpoints/j2/1/d2/chunk-0")) == b"c"


def test_local_puts_and_deletes_in_one_directory_at_once_lose_no_blob(local_backend):
    storage = local_backend.storage
    assert isinstance(storage, LocalStorage)
    errors: list[BaseException] = []

    def churn(name: str) -> None:
        try:
            for i in range(200):
                storage.put(f"outputs/p/o/{name}", [b"x"])
                assert storage.exists(f"outputs/p/o/{name}"), i
                storage.delete(f"outputs/p/o/{name}")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=churn, args=(f"b{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert not (storage.root / "outputs").exists()
