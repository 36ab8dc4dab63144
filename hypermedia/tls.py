"""One verifying TLS context per process for the HTTP clients hypermedia makes.

httpx builds a new ``SSLContext`` for every client (loading certifi's CA bundle):
17-70 ms of CPU each, measured, though most of ours talk plain HTTP on loopback. A
web tier that makes a :class:`~hypermedia.ingest.client.HypermediaClient` per request
paid that on each, and so did each pass of the callback sender. A context is made to
be shared; this is httpx's own default (certifi's bundle, or ``SSL_CERT_FILE`` /
``SSL_CERT_DIR`` when set), made once for each value of those two.
"""

from __future__ import annotations

import os
import ssl
import threading

_contexts: dict[tuple[str | None, str | None], ssl.SSLContext] = {}
_lock = threading.Lock()


def client_context() -> ssl.SSLContext:
    """The process's context that verifies servers as httpx does by default."""
    import httpx

    key = (os.environ.get("SSL_CERT_FILE") or None, os.environ.get("SSL_CERT_DIR") or None)
    with _lock:
        context = _contexts.get(key)
        if context is None:
            context = _contexts[key] = httpx.create_ssl_context()
    return context
