"""A local instance metadata service: AWS IMDSv2 and GCP's, for the spot watcher's tests.

No installable mock serves the spot notices (see the shared cloud notes), so this is
a small :class:`~http.server.ThreadingHTTPServer` on ``127.0.0.1`` (port 0) in a
thread of the test process, answering both providers' paths the way they answer:

AWS (IMDSv2)
    ``PUT /latest/api/token`` needs ``X-aws-ec2-metadata-token-ttl-seconds`` (1-21600;
    400 without it or out of range; a GET there is 405) and answers a token valid for
    that long. ``GET /latest/meta-data/spot/instance-action`` needs a live token in
    ``X-aws-ec2-metadata-token`` (401 without, with an unknown or an expired one),
    answers 404 while no notice is served, then ``{"action": ..., "time": "...Z"}``.
GCP
    ``GET /computeMetadata/v1/instance/preempted`` needs ``Metadata-Flavor: Google``
    (403 otherwise) and answers ``FALSE``, or ``TRUE`` once a notice is served, with
    an ``ETag``. ``?wait_for_change=true`` long-polls: with a ``last_etag`` other than
    the current one it answers at once, else when the value changes or after
    ``timeout_sec`` (at most :data:`MAX_WAIT_SECONDS`), with the value then.

:meth:`MetadataServer.serve_notice` makes the instance "reclaimed" for both views;
:meth:`MetadataServer.expire_tokens` forces the AWS token flow again; ``requests``
records every request (method, path, query, headers, the status answered)::

    with MetadataServer() as server:
        watcher = SpotWatcher(SpotWatch("aws", metadata_url=server.url), ...)
        ...
        server.serve_notice(deadline=time.time() + 120)
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from urllib.parse import parse_qs, urlsplit

AWS_TOKEN_PATH = "/latest/api/token"
AWS_ACTION_PATH = "/latest/meta-data/spot/instance-action"
AWS_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
AWS_TOKEN_HEADER = "X-aws-ec2-metadata-token"
AWS_MAX_TTL = 21600
GCP_PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"
MAX_WAIT_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # names lower-cased
    status: int


@dataclass
class _State:
    notice: dict[str, str] | None = None  # the AWS instance-action body
    tokens: dict[str, float] = field(default_factory=dict)  # token -> expiry (monotonic)
    requests: list[Recorded] = field(default_factory=list)

    @property
    def preempted(self) -> str:
        return "FALSE" if self.notice is None else "TRUE"

    @property
    def etag(self) -> str:
        return hashlib.sha256(self.preempted.encode()).hexdigest()[:16]


class MetadataServer:
    def __init__(self) -> None:
        self._state = _State()
        self._changed = threading.Condition()
        self._closing = False
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_PUT(self) -> None:
                server._handle(self, "PUT")

            def do_GET(self) -> None:
                server._handle(self, "GET")

            def log_message(self, format: str, *args: object) -> None:
                pass  # the record is ``requests``

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self._thread = threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
        )

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> MetadataServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(5)

    def __enter__(self) -> MetadataServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # -- what the tests do ---------------------------------------------------------------

    def serve_notice(self, *, deadline: float | None = None, action: str = "terminate") -> None:
        """The instance is being reclaimed: AWS's instance-action appears (``deadline``:
        epoch seconds, default two minutes from now) and GCP's ``preempted`` turns TRUE."""
        moment = datetime.fromtimestamp(deadline or time.time() + 120, UTC)
        with self._changed:
            self._state.notice = {
                "action": action,
                "time": moment.strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
            self._changed.notify_all()

    def clear_notice(self) -> None:
        """The reclaimed instance is gone; the next one sees no notice."""
        with self._changed:
            self._state.notice = None
            self._changed.notify_all()

    def expire_tokens(self) -> None:
        with self._changed:
            self._state.tokens.clear()

    @property
    def requests(self) -> list[Recorded]:
        with self._changed:
            return list(self._state.requests)

    def requests_to(self, path: str, status: int | None = None) -> list[Recorded]:
        return [
            r for r in self.requests if r.path == path and (status is None or r.status == status)
        ]

    # -- answering -----------------------------------------------------------------------

    def _handle(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        parts = urlsplit(handler.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        headers = {k.lower(): v for k, v in handler.headers.items()}
        length = int(headers.get("content-length") or 0)
        if length:
            handler.rfile.read(length)
        if parts.path == AWS_TOKEN_PATH:
            status, body, extra = self._aws_token(method, headers)
        elif parts.path == AWS_ACTION_PATH and method == "GET":
            status, body, extra = self._aws_action(headers)
        elif parts.path == GCP_PREEMPTED_PATH and method == "GET":
            status, body, extra = self._gcp_preempted(query, headers)
        else:
            status, body, extra = 404, "Not Found", {}
        with self._changed:
            self._state.requests.append(Recorded(method, parts.path, query, headers, status))
        data = body.encode()
        handler.send_response(status)
        handler.send_header("Content-Type", extra.pop("Content-Type", "text/plain"))
        handler.send_header("Content-Length", str(len(data)))
        for name, value in extra.items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(data)

    def _aws_token(self, method: str, headers: dict[str, str]) -> tuple[int, str, dict[str, str]]:
        if method != "PUT":
            return 405, "Method Not Allowed", {}
        raw = headers.get(AWS_TTL_HEADER.lower())
        try:
            ttl = int(raw) if raw is not None else 0
        except ValueError:
            ttl = 0
        if not 1 <= ttl <= AWS_MAX_TTL:
            return 400, "Bad Request", {}
        token = secrets.token_urlsafe(32)
        with self._changed:
            self._state.tokens[token] = time.monotonic() + ttl
        return 200, token, {AWS_TTL_HEADER: str(ttl)}

    def _aws_action(self, headers: dict[str, str]) -> tuple[int, str, dict[str, str]]:
        token = headers.get(AWS_TOKEN_HEADER.lower())
        with self._changed:
            expiry = self._state.tokens.get(token or "")
            notice = self._state.notice
        if expiry is None or time.monotonic() >= expiry:
            return 401, "Unauthorized", {}
        if notice is None:
            return 404, "Not Found", {}
        return 200, json.dumps(notice), {"Content-Type": "application/json"}

    def _gcp_preempted(
        self, query: dict[str, str], headers: dict[str, str]
    ) -> tuple[int, str, dict[str, str]]:
        if headers.get("metadata-flavor") != "Google":
            return 403, "Missing Metadata-Flavor:Google header.", {}
        with self._changed:
            if query.get("wait_for_change") == "true":
                wait = min(float(query.get("timeout_sec") or MAX_WAIT_SECONDS), MAX_WAIT_SECONDS)
                until = time.monotonic() + wait
                start_etag = query.get("last_etag") or self._state.etag
                while self._state.etag == start_etag and not self._closing:
                    left = until - time.monotonic()
                    if left <= 0:
                        break
                    self._changed.wait(left)
            value, etag = self._state.preempted, self._state.etag
        return 200, value, {"ETag": etag, "Metadata-Flavor": "Google"}
