"""Local signed URLs, keys and the signing secret: pure checks, no server."""

from __future__ import annotations

import os
import stat
import threading
from urllib.parse import parse_qs, urlsplit

import pytest

from hypermedia.clock import ManualClock
from hypermedia.errors import ConfigError, InvalidRequest
from hypermedia.storage import signing
from hypermedia.storage.base import (
    InvalidSignature,
    UrlExpired,
    check_content_type,
    check_key,
    check_segment,
    check_ttl,
    derived_key,
    original_key,
    storable_content_type,
)
from hypermedia.storage.local import LocalStorage, load_or_create_secret

SECRET = "0123456789abcdef" * 4
OTHER = "fedcba9876543210" * 4
NOW = 1_800_000_000


def _query(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}


@pytest.fixture
def clock():
    return ManualClock(NOW)


@pytest.fixture
def storage(tmp_path, clock):
    return LocalStorage(tmp_path, base_url="http://api.test:8080/", secret=SECRET, clock=clock)


def test_a_url_names_the_key_expiry_and_signature(storage):
    url = storage.presign_get("originals/p1/o1", 900)
    parts = urlsplit(url)
    assert f"{parts.scheme}://{parts.netloc}" == "http://api.test:8080"
    assert parts.path == "/v1/hypermedia/blobs/originals/p1/o1"
    query = _query(url)
    assert query["expires"] == str(NOW + 900)
    assert query["sig"] == signing.signature(SECRET, "GET", "originals/p1/o1", NOW + 900, None)
    assert "content_type" not in query


def test_a_put_url_may_carry_its_content_type(storage):
    url = storage.presign_put("derived/p/o/1/thumb.webp", 60, "image/webp")
    query = _query(url)
    assert query["content_type"] == "image/webp"
    storage.verify("PUT", "derived/p/o/1/thumb.webp", query["expires"], query["sig"], "image/webp")


def _params(url: str) -> tuple[str, str]:
    query = _query(url)
    return query["expires"], query["sig"]


def test_verify_accepts_until_expiry_then_refuses(storage, clock):
    expires, sig = _params(storage.presign_get("a/b", 10))
    storage.verify("GET", "a/b", expires, sig)
    clock.advance(10)
    storage.verify("GET", "a/b", expires, sig)  # the last second still counts
    clock.advance(1)
    with pytest.raises(UrlExpired) as caught:
        storage.verify("GET", "a/b", expires, sig)
    assert caught.value.code == "url_expired"
    assert caught.value.status == 403


@pytest.mark.parametrize(
    ("method", "key", "content_type", "tamper"),
    [
        ("PUT", "a/b", None, None),  # a GET URL used to PUT
        ("GET", "a/c", None, None),  # another key
        ("GET", "a/b", "image/png", None),  # a content type that was not signed
        ("GET", "a/b", None, "expires"),  # expiry moved
        ("GET", "a/b", None, "sig"),  # one hex digit changed
    ],
)
def test_verify_refuses_anything_altered(storage, method, key, content_type, tamper):
    expires, sig = _params(storage.presign_get("a/b", 60))
    if tamper == "expires":
        expires = str(int(expires) + 3600)
    if tamper == "sig":
        sig = sig[:-1] + ("0" if sig[-1] != "0" else "1")
    with pytest.raises(InvalidSignature) as caught:
        storage.verify(method, key, expires, sig, content_type)
    assert caught.value.code == "invalid_signature"
    assert caught.value.status == 403


def test_a_url_signed_with_another_secret_is_refused(tmp_path, storage, clock):
    other = LocalStorage(tmp_path, base_url="http://x", secret=OTHER, clock=clock)
    expires, sig = _params(other.presign_get("a/b", 60))
    with pytest.raises(InvalidSignature):
        storage.verify("GET", "a/b", expires, sig)


@pytest.mark.parametrize(
    ("expires", "sig"),
    [
        (None, "0" * 64),
        (str(NOW + 60), None),
        ("", "0" * 64),
        ("-5", "0" * 64),
        ("9" * 5000, "0" * 64),  # no giant int parsing
        (str(NOW + 60), "XYZ"),
        (str(NOW + 60), "0" * 63),
    ],
)
def test_missing_or_malformed_parameters_are_an_invalid_signature(storage, expires, sig):
    with pytest.raises(InvalidSignature):
        storage.verify("GET", "a/b", expires, sig)


def test_a_forged_late_url_is_refused_as_forged_not_as_late(storage, clock):
    expires, _ = _params(storage.presign_get("a/b", 1))
    clock.advance(100)
    with pytest.raises(InvalidSignature):
        storage.verify("GET", "a/b", expires, "0" * 64)


@pytest.mark.parametrize("ttl", [0, -1, 7 * 24 * 3600 + 1])
def test_ttl_is_bounded(storage, ttl):
    with pytest.raises(InvalidRequest):
        storage.presign_get("a/b", ttl)
    with pytest.raises(InvalidRequest):
        check_ttl(ttl)


@pytest.mark.parametrize(
    "key", ["", "/a", "a/", "a//b", "../a", "a/../b", "a/.b", "a b", "a\nb", "a/b\n"]
)
def test_bad_keys_are_refused_before_signing(storage, key):
    with pytest.raises(InvalidRequest):
        storage.presign_get(key, 60)
    with pytest.raises(InvalidRequest):
        storage.presign_put(key, 60)
    with pytest.raises(InvalidRequest):
        check_key(key)


@pytest.mark.parametrize(
    "content_type",
    [
        "image",
        "image/png; charset=x",
        "text/plain; charset=latin-1",
        "text/plain; charset=utf-8; x=y",
        "a/b\nc",
        "/png",
        "text/ plain",
        "image/png\n",
    ],
)
def test_bad_content_types_are_refused(storage, content_type):
    with pytest.raises(InvalidRequest):
        storage.presign_put("a/b", 60, content_type)
    with pytest.raises(InvalidRequest):
        check_content_type(content_type)


@pytest.mark.parametrize(
    "content_type",
    [
        "image/png",
        "image/svg+xml",
        "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        "text/plain; charset=utf-8",  # extract_text's output
    ],
)
def test_real_content_types_pass(content_type):
    assert check_content_type(content_type) == content_type


@pytest.mark.parametrize(
    "content_type",
    [
        "text/html",
        "Text/HTML",
        "IMAGE/SVG+XML",
        "text/XML; charset=utf-8",
        "Application/Xml",
        "text/xsl",
        "Text/XSL",
    ],
)
def test_a_type_a_browser_runs_scripts_in_is_never_stored(content_type):
    """A user's bytes detected as one are stored untyped, in any letter case (a browser
    reading the bucket straight runs ``Text/HTML`` as it runs ``text/html``). Chromium
    renders ``text/xsl`` as an XML document: an XHTML script in it runs."""
    assert check_content_type(content_type) == content_type  # a store would take it
    assert storable_content_type(content_type) is None


def test_keys():
    assert original_key("p1", "o1") == "originals/p1/o1"
    assert derived_key("p1", "o1", 3, "thumbnail-320x320.webp") == (
        "derived/p1/o1/3/thumbnail-320x320.webp"
    )
    with pytest.raises(InvalidRequest):
        derived_key("p1", "o1", 3, "../../originals/p2/x")
    assert check_segment("convert.png", "output_type") == "convert.png"
    for bad in ["a/b", "..", ".hidden", ""]:
        with pytest.raises(InvalidRequest):
            check_segment(bad, "output_type")


def test_presigning_needs_a_base_url_and_a_secret(tmp_path):
    with pytest.raises(ConfigError, match="api_url"):
        LocalStorage(tmp_path, secret=SECRET).presign_get("a/b", 60)
    with pytest.raises(ConfigError, match="storage_secret"):
        LocalStorage(tmp_path, base_url="http://x").presign_get("a/b", 60)
    with pytest.raises(ConfigError, match="storage_secret"):
        LocalStorage(tmp_path, base_url="http://x", secret="short")


# -- the generated secret ------------------------------------------------------------------


def test_the_secret_is_generated_once_private_and_reused(tmp_path):
    path = tmp_path / "data" / "storage.secret"
    first = load_or_create_secret(path)
    assert len(first) == 64
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_or_create_secret(path) == first
    assert [p.name for p in path.parent.iterdir()] == ["storage.secret"]  # no temp files left


def test_concurrent_processes_agree_on_one_secret(tmp_path):
    path = tmp_path / "storage.secret"
    results: list[str] = []
    barrier = threading.Barrier(8)

    def create() -> None:
        barrier.wait()
        results.append(load_or_create_secret(path))

    threads = [threading.Thread(target=create) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 8
    assert len(set(results)) == 1
    assert path.read_text().strip() == results[0]


def test_a_truncated_secret_file_is_a_config_error(tmp_path):
    path = tmp_path / "storage.secret"
    path.write_text("abc\n")
    os.chmod(path, 0o600)
    with pytest.raises(ConfigError, match="delete it"):
        load_or_create_secret(path)
