"""hypermedia.tls: the one TLS context our HTTP clients share still verifies servers as
httpx's default does, on a real HTTPS server with a certificate made here: refused
without its CA, trusted once SSL_CERT_FILE names it (a context of its own for that
value); HypermediaClient and the callback sender use it."""

from __future__ import annotations

import http.server
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from hypermedia import tls
from hypermedia.ingest.client import HypermediaClient


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def https_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An HTTPS server on 127.0.0.1 with a self-signed certificate; (its URL, the cert)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", cert
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_the_shared_context_verifies_and_follows_ssl_cert_file(https_server, monkeypatch):
    url, cert = https_server
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    default = tls.client_context()
    assert tls.client_context() is default  # one per process
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(url, verify=default)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    trusting = tls.client_context()
    assert trusting is not default
    assert httpx.get(url, verify=trusting).text == "ok"
    with HypermediaClient(url, "key", retries=0) as client:
        assert client._http._transport._pool._ssl_context is trusting  # type: ignore[attr-defined]
        assert client._http.get("/").text == "ok"
