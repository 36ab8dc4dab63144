"""Worker transfers against scripted HTTP answers: error mapping, retries, limits.

(The same functions run against real servers in tests/integration/test_storage_contract.py.)
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator

import httpx
import pytest

from hypermedia.errors import InputTooLarge
from hypermedia.storage import transfer
from hypermedia.storage.transfer import (
    TransferDenied,
    TransferError,
    TransferNotFound,
    TransferUnavailable,
)

URL = "http://store.test/bucket/derived/p/o/1/out.png?X-Amz-Signature=deadbeef&sig=cafe"


def _client(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.Client:
    return httpx.Client(transport=httpx.MockTransport(handler))


def _stream(data: bytes, pieces: int = 4) -> Iterator[bytes]:
    step = max(1, len(data) // pieces)
    return iter([data[i : i + step] for i in range(0, len(data), step)])


def test_download_hashes_and_writes_atomically(tmp_path):
    data = b"0123456789" * 1000
    client = _client(lambda request: httpx.Response(200, stream=httpx.ByteStream(data)))
    size, sha = transfer.download(URL, tmp_path / "in" / "source", 10_000, client=client)
    assert (size, sha) == (10_000, hashlib.sha256(data).hexdigest())
    assert (tmp_path / "in" / "source").read_bytes() == data
    assert [p.name for p in (tmp_path / "in").iterdir()] == ["source"]


def test_download_stops_at_max_bytes_even_without_a_content_length(tmp_path):
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=_stream(b"x" * 5000))  # chunked, no length

    with pytest.raises(InputTooLarge):
        transfer.download(URL, tmp_path / "source", 4096, client=_client(handler))
    assert list(tmp_path.iterdir()) == []


def test_download_refuses_a_declared_length_over_the_limit_before_reading(tmp_path):
    client = _client(lambda request: httpx.Response(200, content=b"x" * 5000))
    with pytest.raises(InputTooLarge):
        transfer.download(URL, tmp_path / "source", 10, client=client)
    assert list(tmp_path.iterdir()) == []


def test_download_keeps_a_previous_file_when_it_fails(tmp_path):
    (tmp_path / "source").write_bytes(b"before")
    client = _client(lambda request: httpx.Response(200, content=b"x" * 50))
    with pytest.raises(InputTooLarge):
        transfer.download(URL, tmp_path / "source", 10, client=client)
    assert (tmp_path / "source").read_bytes() == b"before"


@pytest.mark.parametrize(
    ("status", "body", "kind", "remote", "retryable"),
    [
        (
            403,
            b'{"error": {"code": "url_expired", "message": "x"}}',
            TransferDenied,
            "url_expired",
            True,
        ),
        (403, b"<Error><Code>AccessDenied</Code></Error>", TransferDenied, "AccessDenied", True),
        (404, b"<Error><Code>NoSuchKey</Code></Error>", TransferNotFound, "NoSuchKey", False),
        (413, b'{"error": {"code": "input_too_large"}}', TransferError, "input_too_large", False),
        (500, b"oops", TransferUnavailable, None, True),
        (503, b"<Error><Code>SlowDown</Code></Error>", TransferUnavailable, "SlowDown", True),
        (302, b"", TransferError, None, False),
    ],
)
def test_http_errors_name_status_and_code_and_are_not_retried(
    tmp_path, status, body, kind, remote, retryable
):
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(status, content=body)

    with pytest.raises(kind) as caught:
        transfer.download(URL, tmp_path / "source", 100, client=_client(handler))
    error = caught.value
    assert type(error) is kind
    assert (error.http_status, error.remote_code, error.retryable) == (status, remote, retryable)
    assert str(status) in error.message
    assert "deadbeef" not in error.message and "cafe" not in error.message  # no credential
    assert error.url == "http://store.test/bucket/derived/p/o/1/out.png"
    assert len(calls) == 1

    source = tmp_path / "out.png"
    source.write_bytes(b"png")
    with pytest.raises(kind):
        transfer.upload(source, URL, client=_client(handler))


def test_connection_errors_are_retried(tmp_path):
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) < 3:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200, stream=httpx.ByteStream(b"data"))

    size, _ = transfer.download(
        URL, tmp_path / "source", 100, client=_client(handler), backoff_seconds=0.001
    )
    assert (size, len(calls)) == (4, 3)


def test_connection_errors_give_up_after_the_attempts(tmp_path):
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        raise httpx.RemoteProtocolError("server disconnected", request=request)

    with pytest.raises(TransferUnavailable) as caught:
        transfer.download(
            URL, tmp_path / "s", 100, client=_client(handler), attempts=2, backoff_seconds=0.001
        )
    assert len(calls) == 2
    assert caught.value.retryable
    assert caught.value.http_status is None
    assert "deadbeef" not in caught.value.message


def test_timeouts_are_not_retried_here(tmp_path):
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        raise httpx.ReadTimeout("stuck", request=request)

    with pytest.raises(TransferUnavailable):
        transfer.download(URL, tmp_path / "s", 100, client=_client(handler))
    assert len(calls) == 1


def test_a_real_refused_connection_is_retried_then_unavailable(tmp_path):
    from hypermedia.embedded import free_port

    url = f"http://127.0.0.1:{free_port()}/x?sig=secret"
    with pytest.raises(TransferUnavailable) as caught:
        transfer.download(url, tmp_path / "s", 100, attempts=2, backoff_seconds=0.001)
    assert "secret" not in caught.value.message


def test_upload_sends_a_length_the_content_type_and_the_bytes(tmp_path):
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        request.read()
        seen.append(request)
        return httpx.Response(200)

    source = tmp_path / "out.webp"
    source.write_bytes(b"RIFF" * 100_000)
    transfer.upload(source, URL, "image/webp", client=_client(handler))
    [request] = seen
    assert request.method == "PUT"
    assert request.headers["content-length"] == "400000"
    assert "transfer-encoding" not in request.headers  # S3 refuses chunked uploads
    assert request.headers["content-type"] == "image/webp"
    assert request.content == source.read_bytes()


def test_upload_retries_resend_the_whole_file(tmp_path):
    bodies: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(request.read())
        if len(bodies) == 1:
            raise httpx.WriteError("broken pipe", request=request)
        return httpx.Response(200)

    source = tmp_path / "out.bin"
    source.write_bytes(b"abc" * 1000)
    transfer.upload(source, URL, client=_client(handler), backoff_seconds=0.001)
    assert bodies == [b"abc" * 1000, b"abc" * 1000]


def test_an_empty_file_uploads(tmp_path):
    seen: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.read())
        assert request.headers["content-length"] == "0"
        return httpx.Response(200)

    source = tmp_path / "empty"
    source.write_bytes(b"")
    transfer.upload(source, URL, client=_client(handler))
    assert seen == [b""]


def test_redact():
    assert transfer.redact(URL) == "http://store.test/bucket/derived/p/o/1/out.png"


def test_a_threads_transfers_share_one_connection_and_one_tls_context(tmp_path, monkeypatch):
    """Building a TLS context loads the CA bundle (~17 ms of CPU), a client and its
    connection ~1 ms more on each side: a worker builds one context, and each of its
    threads keeps one client whose connection its consecutive transfers reuse."""
    import http.server
    import threading

    peers: list[int] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive

        def do_GET(self) -> None:
            peers.append(self.client_address[1])
            self.send_response(200)
            self.send_header("Content-Length", "5")
            self.end_headers()
            self.wfile.write(b"hello")

        def do_PUT(self) -> None:
            peers.append(self.client_address[1])
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    built: list[object] = []
    real = httpx.create_ssl_context

    def counting(*args: object, **kwargs: object) -> object:
        built.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(httpx, "create_ssl_context", counting)
    transfer._ssl_context.cache_clear()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/blob"
    failures: list[BaseException] = []

    def transfers(name: str) -> None:
        try:
            for n in range(3):
                assert transfer.download(url, tmp_path / f"{name}{n}", 100)[0] == 5
                transfer.upload(tmp_path / f"{name}{n}", url)
        except BaseException as exc:  # shown by the assertion below
            failures.append(exc)

    try:
        for name in ("a", "b"):  # fresh threads: fresh thread-local clients
            thread = threading.Thread(target=transfers, args=(name,))
            thread.start()
            thread.join(30)
    finally:
        server.shutdown()
        server.server_close()
        transfer._ssl_context.cache_clear()
    assert failures == []
    assert (tmp_path / "b2").read_bytes() == b"hello"
    assert len(peers) == 12
    # One connection a thread: six transfers each, two client ports in all.
    assert len(set(peers[:6])) == 1 and len(set(peers[6:])) == 1 and peers[0] != peers[6]
    assert len(built) == 1
