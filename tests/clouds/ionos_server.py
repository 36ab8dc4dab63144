"""A local stand-in for the IONOS Cloud API v6: the part :mod:`autoscaler.drivers.ionos` uses.

A real HTTP server (``ThreadingHTTPServer`` on 127.0.0.1, port 0, in a thread) that the
real ``ionoscloud`` SDK talks to at :attr:`IonosServer.url`. State is in memory;
every request is recorded (:class:`Recorded`) for assertions.

Paths (under ``/cloudapi/v6``): ``GET /datacenters``, ``GET /images``, ``GET /labels``,
``GET|POST /datacenters/{dc}/servers``, ``GET|DELETE /datacenters/{dc}/servers/{id}``,
``POST /datacenters/{dc}/servers/{id}/labels``, ``GET /requests/{id}/status``.

Behaviour mimicked: Basic or Bearer auth (401 otherwise); create and delete answer 202
with ``Location: …/requests/{id}/status``; a create request reads QUEUED, RUNNING, …,
then DONE after :attr:`IonosServer.polls_to_done` polls (the server goes from
BUSY/no vmState to AVAILABLE/RUNNING and gets its NIC's address), or FAILED after
:meth:`IonosServer.fail_next_request`; a deleted server stays listed as BUSY for
:attr:`IonosServer.delete_seconds`; write-only volume fields (``userData``,
``imagePassword``, ``sshKeys``) are never answered; errors carry IONOS's body
(``{"httpStatus": …, "messages": [{"errorCode", "message"}]}``). :meth:`fail_next`
makes the next matching requests answer a given status.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

PREFIX = "/cloudapi/v6"
_ID = r"([^/]+)"


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str  # without /cloudapi/v6
    query: dict[str, list[str]]
    authorization: str | None
    body: Any  # the decoded JSON body, or None


@dataclass
class _Failure:
    status: int
    method: str
    path: re.Pattern[str]
    times: int
    message: str
    retry_after: str | None


@dataclass
class _Provisioning:
    server: tuple[str, str] | None  # (datacenter id, server id) a create is building
    failure: str | None = None
    polls: int = 0
    status: str = "QUEUED"


@dataclass
class _Answer:
    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


class _ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class IonosServer:
    """In-memory IONOS Cloud API; use as a context manager or start()/stop()."""

    def __init__(
        self,
        *,
        username: str = "ops@example.com",
        password: str = "s3cret-pass",
        token: str = "tok-0123456789abcdef",
    ) -> None:
        self.username = username
        self.password = password
        self.token = token
        self.polls_to_done = 2  # status polls answered QUEUED/RUNNING before the final one
        self.hold_requests = False  # True: provisioning requests never finish
        self.delete_seconds = 0.3  # how long a deleted server stays listed (BUSY)
        self._lock = threading.Lock()
        self._records: list[Recorded] = []
        self._failures: list[_Failure] = []
        self._fail_next_request: str | None = None
        self._datacenters: dict[str, dict[str, Any]] = {}
        self._images: dict[str, dict[str, Any]] = {}
        self._servers: dict[str, dict[str, dict[str, Any]]] = {}  # dc -> id -> server
        self._labels: dict[str, dict[str, str]] = {}  # server id -> key -> value
        self._deleting: dict[str, float] = {}  # server id -> when it disappears
        self._requests: dict[str, _Provisioning] = {}
        self._next_ip = 10
        self._http: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> IonosServer:
        api = self

        class Handler(_Handler):
            server_api = api

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self._thread = threading.Thread(target=self._http.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> IonosServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def origin(self) -> str:
        assert self._http is not None, "not started"
        host, port = self._http.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def url(self) -> str:
        """What the SDK's ``Configuration(host=…)`` takes."""
        return self.origin + PREFIX

    # -- set-up and control ----------------------------------------------------------

    def add_datacenter(self, location: str, name: str = "") -> str:
        dc_id = str(uuid.uuid4())
        with self._lock:
            self._datacenters[dc_id] = {
                "id": dc_id,
                "type": "datacenter",
                "href": f"{self.url}/datacenters/{dc_id}",
                "metadata": {"state": "AVAILABLE"},
                "properties": {"name": name or f"dc-{location}", "location": location},
            }
            self._servers[dc_id] = {}
        return dc_id

    def add_image(self, name: str, location: str, *, image_type: str = "HDD") -> str:
        image_id = str(uuid.uuid4())
        with self._lock:
            self._images[image_id] = {
                "id": image_id,
                "type": "image",
                "href": f"{self.url}/images/{image_id}",
                "metadata": {"state": "AVAILABLE"},
                "properties": {
                    "name": name,
                    "location": location,
                    "imageType": image_type,
                    "public": False,
                    "imageAliases": [],
                },
            }
        return image_id

    def fail_next(
        self,
        status: int,
        *,
        method: str = "POST",
        path: str = r"/servers$",
        times: int = 1,
        message: str = "injected failure",
        retry_after: str | None = "0",
    ) -> None:
        """The next ``times`` requests matching ``method`` and the ``path`` regex (searched
        in the path without /cloudapi/v6) answer ``status`` (429s with ``Retry-After``)."""
        with self._lock:
            self._failures.append(
                _Failure(status, method, re.compile(path), times, message, retry_after)
            )

    def fail_next_request(self, message: str = "insufficient resources") -> None:
        """The next server create is accepted (202) but its request ends FAILED."""
        with self._lock:
            self._fail_next_request = message

    # -- inspection ------------------------------------------------------------------

    def records(self, method: str | None = None, path: str | None = None) -> list[Recorded]:
        """Recorded requests, optionally those of ``method`` whose path matches ``path``."""
        with self._lock:
            return [
                r
                for r in self._records
                if (method is None or r.method == method)
                and (path is None or re.search(path, r.path))
            ]

    def servers(self, datacenter: str) -> list[dict[str, Any]]:
        with self._lock:
            self._settle()
            return [json.loads(json.dumps(s)) for s in self._servers[datacenter].values()]

    def labels(self, server_id: str) -> dict[str, str]:
        with self._lock:
            return dict(self._labels.get(server_id, {}))

    def drop_labels(self, server_id: str) -> None:
        """Remove a server's labels (what a launcher that died before labelling leaves)."""
        with self._lock:
            self._labels.pop(server_id, None)

    def remove_label(self, server_id: str, key: str) -> None:
        """Remove one label (as in the console, or a server labelled by hand without it)."""
        with self._lock:
            self._labels.get(server_id, {}).pop(key, None)

    def set_created(self, datacenter: str, server_id: str, when: float) -> None:
        """Say the server was created at ``when`` (epoch seconds): its ``createdDate``."""
        with self._lock:
            server = self._servers[datacenter][server_id]
            server["metadata"]["createdDate"] = _iso(when)

    # -- the API ---------------------------------------------------------------------

    def handle(self, method: str, raw_path: str, headers: dict[str, str], body: Any) -> _Answer:
        parts = urlsplit(raw_path)
        path = parts.path.removeprefix(PREFIX).rstrip("/")
        query = parse_qs(parts.query)
        authorization = headers.get("authorization")
        with self._lock:
            self._records.append(Recorded(method, path, query, authorization, body))
            self._settle()
            failure = self._take_failure(method, path)
            if failure is not None:
                extra = {"Retry-After": failure.retry_after} if failure.retry_after else {}
                return _error(failure.status, failure.message, extra)
            if not parts.path.startswith(PREFIX + "/"):
                return _error(404, f"no such path {parts.path}")
            if authorization not in self._accepted():
                return _error(401, "Unauthorized")
            try:
                return self._route(method, path, query, body)
            except _ApiError as exc:
                return _error(exc.status, exc.message)

    def _accepted(self) -> set[str]:
        basic = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return {f"Basic {basic}", f"Bearer {self.token}"}

    def _take_failure(self, method: str, path: str) -> _Failure | None:
        for failure in self._failures:
            if failure.method == method and failure.path.search(path):
                failure.times -= 1
                if failure.times <= 0:
                    self._failures.remove(failure)
                return failure
        return None

    def _settle(self) -> None:
        now = time.monotonic()
        for server_id, at in list(self._deleting.items()):
            if at <= now:
                del self._deleting[server_id]
                self._labels.pop(server_id, None)
                for servers in self._servers.values():
                    servers.pop(server_id, None)

    def _route(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> _Answer:
        routes: list[tuple[str, str, Any]] = [
            ("GET", r"/datacenters", self._list_datacenters),
            ("GET", r"/images", self._list_images),
            ("GET", r"/labels", self._list_labels),
            ("GET", rf"/datacenters/{_ID}/servers", self._list_servers),
            ("POST", rf"/datacenters/{_ID}/servers", self._create_server),
            ("GET", rf"/datacenters/{_ID}/servers/{_ID}", self._get_server),
            ("DELETE", rf"/datacenters/{_ID}/servers/{_ID}", self._delete_server),
            ("POST", rf"/datacenters/{_ID}/servers/{_ID}/labels", self._add_label),
            ("GET", rf"/requests/{_ID}/status", self._request_status),
        ]
        for verb, pattern, action in routes:
            match = re.fullmatch(pattern, path)
            if match and verb == method:
                answer: _Answer = action(*match.groups(), query=query, body=body)
                return answer
        raise _ApiError(404, f"no route for {method} {path}")

    def _collection(self, kind: str, items: list[Any], query: dict[str, list[str]]) -> _Answer:
        offset = int(query.get("offset", ["0"])[0])
        limit = int(query.get("limit", ["1000"])[0])
        page = items[offset : offset + limit]
        body = {"id": kind, "type": "collection", "items": page, "offset": offset, "limit": limit}
        return _Answer(200, body)

    def _datacenter(self, dc_id: str) -> dict[str, dict[str, Any]]:
        if dc_id not in self._servers:
            raise _ApiError(404, f"datacenter {dc_id} not found")
        return self._servers[dc_id]

    def _server(self, dc_id: str, server_id: str) -> dict[str, Any]:
        server = self._datacenter(dc_id).get(server_id)
        if server is None:
            raise _ApiError(404, f"server {server_id} not found")
        return server

    def _list_datacenters(self, *, query: dict[str, list[str]], body: Any) -> _Answer:
        return self._collection("datacenters", list(self._datacenters.values()), query)

    def _list_images(self, *, query: dict[str, list[str]], body: Any) -> _Answer:
        return self._collection("images", list(self._images.values()), query)

    def _list_labels(self, *, query: dict[str, list[str]], body: Any) -> _Answer:
        items = []
        for servers in self._servers.values():
            for server_id, server in servers.items():
                for key, value in self._labels.get(server_id, {}).items():
                    properties = {
                        "key": key,
                        "value": value,
                        "resourceId": server_id,
                        "resourceType": "server",
                        "resourceHref": server["href"],
                    }
                    urn = f"urn:label:server:{server_id}:{key}"
                    items.append({"id": urn, "type": "label", "properties": properties})
        return self._collection("labels", items, query)

    def _list_servers(self, dc_id: str, *, query: dict[str, list[str]], body: Any) -> _Answer:
        return self._collection("servers", list(self._datacenter(dc_id).values()), query)

    def _get_server(self, dc_id: str, server_id: str, **_: Any) -> _Answer:
        return _Answer(200, self._server(dc_id, server_id))

    def _create_server(self, dc_id: str, *, query: dict[str, list[str]], body: Any) -> _Answer:
        servers = self._datacenter(dc_id)
        properties = _dict(body, "properties")
        name = properties.get("name")
        cores, ram = properties.get("cores"), properties.get("ram")
        if not isinstance(name, str) or not name:
            raise _ApiError(422, "[VDC-5-1] server name is required")
        if not isinstance(cores, int) or cores < 1:
            raise _ApiError(422, f"[VDC-5-2] cores {cores!r} is not a positive integer")
        if not isinstance(ram, int) or ram < 256 or ram % 256:
            raise _ApiError(422, f"[VDC-5-3] ram {ram!r} is not a multiple of 256 MB")
        if properties.get("type", "ENTERPRISE") not in ("ENTERPRISE", "CUBE", "VCPU"):
            raise _ApiError(422, f"[VDC-5-4] unknown server type {properties.get('type')!r}")
        entities = _dict(body, "entities")
        volumes = [self._volume(v) for v in _dict(entities, "volumes").get("items", [])]
        if not volumes:
            raise _ApiError(422, "[VDC-5-5] a boot volume is required")
        nics = [self._nic(n) for n in _dict(entities, "nics").get("items", [])]
        server_id = str(uuid.uuid4())
        href = f"{self.url}/datacenters/{dc_id}/servers/{server_id}"
        server = {
            "id": server_id,
            "type": "server",
            "href": href,
            "metadata": {
                "state": "BUSY",
                "createdDate": _iso(time.time()),
            },
            "properties": {**properties, "vmState": None, "availabilityZone": "AUTO"},
            "entities": {
                "volumes": {"id": f"{server_id}/volumes", "type": "collection", "items": volumes},
                "nics": {"id": f"{server_id}/nics", "type": "collection", "items": nics},
            },
        }
        servers[server_id] = server
        request = _Provisioning((dc_id, server_id), self._fail_next_request)
        self._fail_next_request = None
        return _Answer(202, server, {"Location": self._new_request(request)})

    def _volume(self, volume: Any) -> dict[str, Any]:
        properties = _dict(volume, "properties")
        if properties.get("type") not in ("HDD", "SSD", "SSD Standard", "SSD Premium", "DAS"):
            raise _ApiError(422, f"[VDC-6-1] unknown volume type {properties.get('type')!r}")
        size = properties.get("size")
        if not isinstance(size, int | float) or size < 1:
            raise _ApiError(422, f"[VDC-6-2] volume size {size!r} is not a positive number")
        image, alias = properties.get("image"), properties.get("imageAlias")
        if (image is None) == (alias is None):
            raise _ApiError(422, "[VDC-6-3] give exactly one of image and imageAlias")
        if image is not None and image not in self._images:
            raise _ApiError(404, f"[VDC-6-4] image {image} not found")
        user_data = properties.get("userData")
        if user_data is not None:
            try:
                base64.b64decode(user_data, validate=True)
            except (binascii.Error, TypeError):
                raise _ApiError(422, "[VDC-6-5] userData is not base64") from None
        answered = {
            k: v for k, v in properties.items() if k not in ("userData", "imagePassword", "sshKeys")
        }
        return {"id": str(uuid.uuid4()), "type": "volume", "properties": answered}

    def _nic(self, nic: Any) -> dict[str, Any]:
        properties = _dict(nic, "properties")
        if not isinstance(properties.get("lan"), int):
            raise _ApiError(422, f"[VDC-7-1] nic lan {properties.get('lan')!r} is not an id")
        return {"id": str(uuid.uuid4()), "type": "nic", "properties": {**properties, "ips": []}}

    def _delete_server(self, dc_id: str, server_id: str, **_: Any) -> _Answer:
        server = self._server(dc_id, server_id)
        server["metadata"]["state"] = "BUSY"
        self._deleting.setdefault(server_id, time.monotonic() + self.delete_seconds)
        location = self._new_request(_Provisioning(None, status="DONE"))
        return _Answer(202, None, {"Location": location})

    def _add_label(self, dc_id: str, server_id: str, *, body: Any, **_: Any) -> _Answer:
        self._server(dc_id, server_id)
        properties = _dict(body, "properties")
        key, value = properties.get("key"), properties.get("value")
        if not isinstance(key, str) or not isinstance(value, str) or not key:
            raise _ApiError(422, "[VDC-8-1] a label needs a string key and value")
        labels = self._labels.setdefault(server_id, {})
        if key in labels:
            raise _ApiError(422, f"[VDC-8-2] label {key} already exists")
        labels[key] = value
        href = f"{self.url}/datacenters/{dc_id}/servers/{server_id}/labels/{key}"
        label = {"id": key, "type": "label", "href": href, "properties": properties}
        return _Answer(201, label)

    def _new_request(self, request: _Provisioning) -> str:
        request_id = str(uuid.uuid4())
        self._requests[request_id] = request
        return f"{self.url}/requests/{request_id}/status"

    def _request_status(self, request_id: str, **_: Any) -> _Answer:
        request = self._requests.get(request_id)
        if request is None:
            raise _ApiError(404, f"request {request_id} not found")
        if request.status not in ("DONE", "FAILED"):
            request.polls += 1
            if request.polls > 1:
                request.status = "RUNNING"
            if request.polls > self.polls_to_done and not self.hold_requests:
                self._finish(request)
        message = request.failure if request.status == "FAILED" else "Request has been processed"
        metadata = {"status": request.status, "message": message, "etag": "0"}
        return _Answer(200, {"id": request_id, "type": "request-status", "metadata": metadata})

    def _finish(self, request: _Provisioning) -> None:
        request.status = "FAILED" if request.failure else "DONE"
        if request.server is None:
            return
        dc_id, server_id = request.server
        server = self._servers.get(dc_id, {}).get(server_id)
        if server is None:
            return
        if request.failure:
            server["metadata"]["state"] = "FAILED"
            return
        server["metadata"]["state"] = "AVAILABLE"
        server["properties"]["vmState"] = "RUNNING"
        for nic in server["entities"]["nics"]["items"]:
            nic["properties"]["ips"] = [f"10.7.0.{self._next_ip}"]
            self._next_ip += 1


def _iso(when: float) -> str:
    """A time as IONOS writes it: ``2026-12-06T05:31:43Z`` (UTC, whole seconds)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))


def _dict(value: Any, key: str) -> dict[str, Any]:
    found = value.get(key) if isinstance(value, dict) else None
    if found is None:
        return {}
    if not isinstance(found, dict):
        raise _ApiError(400, f"{key} must be an object")
    return found


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> _Answer:
    body = {"httpStatus": status, "messages": [{"errorCode": "100", "message": message}]}
    return _Answer(status, body, headers or {})


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms stall
    server_api: IonosServer

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            body = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            answer = _error(400, "body is not JSON")
        else:
            answer = self.server_api.handle(self.command, self.path, headers, body)
        payload = b"" if answer.body is None else json.dumps(answer.body).encode()
        self.send_response(answer.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        for name, value in answer.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_DELETE = _serve

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass
