"""A local Compute Engine: the part of the REST API the GCP driver's SDK calls.

A real HTTP server (``ThreadingHTTPServer`` on 127.0.0.1, port 0, in a thread) with
an in-memory store. It records every request (method, path, query, JSON body,
whether it carried credentials) for assertions, and answers what google-cloud-compute
needs::

    POST   /compute/v1/projects/{p}/zones/{z}/instances                 409 if the name exists
    GET    /compute/v1/projects/{p}/zones/{z}/instances?filter=labels.K = "V"
    GET    /compute/v1/projects/{p}/zones/{z}/instances/{name}
    DELETE /compute/v1/projects/{p}/zones/{z}/instances/{name}
    GET    /compute/v1/projects/{p}/zones/{z}/operations/{op}
    POST   /compute/v1/projects/{p}/zones/{z}/operations/{op}/wait

Knobs for the contract's hard parts:

* ``provisioning_reads``: an instance reads as ``PROVISIONING`` for that many reads
  (GET or list), then ``RUNNING``.
* ``list_lag``: a new instance is missing from that many lists after its insert.
* ``deleting_reads``: a deleted instance reads as ``STOPPING`` that many times
  before it is gone.
* ``operation_polls``: an operation answers ``RUNNING`` that many times first.
* :meth:`GcpServer.fail_next`: the next call of one kind answers an HTTP error
  with a reason, or (``in_operation``) an operation that ends with that error code,
  as Compute Engine reports stockouts and most quota failures.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

Action = Literal["insert", "list", "get", "delete"]

_PATH = re.compile(
    r"^/compute/v1/projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/"
    r"(?P<kind>instances|operations)(?:/(?P<name>[^/]+))?(?P<wait>/wait)?$"
)
_FILTER_TERM = re.compile(r'\s*labels\.(?P<key>[a-z][a-z0-9_-]*)\s*=\s*"(?P<value>[^"]*)"\s*')


@dataclass(frozen=True)
class Recorded:
    """One request as the server saw it."""

    method: str
    path: str
    query: dict[str, list[str]]
    body: Any  # the decoded JSON body, or None
    authorized: bool  # an Authorization header was sent


@dataclass
class _Failure:
    status: int
    reason: str
    message: str
    in_operation: bool


@dataclass
class _Instance:
    zone: str
    resource: dict[str, Any]
    provisioning_reads: int
    hidden_lists: int
    deleting_reads: int | None = None  # set once deleted


@dataclass
class _Operation:
    body: dict[str, Any]
    polls_left: int


@dataclass
class _Store:
    instances: dict[tuple[str, str], _Instance] = field(default_factory=dict)  # (project, name)
    operations: dict[str, _Operation] = field(default_factory=dict)
    failures: dict[Action, _Failure] = field(default_factory=dict)
    records: list[Recorded] = field(default_factory=list)


class GcpServer:
    """The fake Compute Engine; use :func:`gcp_server` to run one."""

    def __init__(
        self,
        *,
        provisioning_reads: int = 0,
        list_lag: int = 0,
        deleting_reads: int = 1,
        operation_polls: int = 0,
    ) -> None:
        self.provisioning_reads = provisioning_reads
        self.list_lag = list_lag
        self.deleting_reads = deleting_reads
        self.operation_polls = operation_polls
        self._store = _Store()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._http.daemon_threads = True
        self._thread = threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(timeout=5)

    # -- for assertions and failure injection ---------------------------------------

    @property
    def records(self) -> list[Recorded]:
        with self._lock:
            return list(self._store.records)

    def requests(self, method: str, path_suffix: str = "") -> list[Recorded]:
        """The recorded requests with ``method`` whose path ends with ``path_suffix``."""
        return [r for r in self.records if r.method == method and r.path.endswith(path_suffix)]

    def instance(self, name: str, project: str = "hm-test") -> dict[str, Any] | None:
        with self._lock:
            found = self._store.instances.get((project, name))
            return None if found is None else json.loads(json.dumps(found.resource))

    def fail_next(
        self,
        action: Action,
        status: int,
        reason: str,
        message: str = "injected failure",
        *,
        in_operation: bool = False,
    ) -> None:
        """The next ``action`` fails: an HTTP ``status`` error whose ``errors[].reason`` is
        ``reason``, or (``in_operation``, insert/delete) an operation that ends with
        ``error.errors[].code = reason`` and ``httpErrorStatusCode = status``."""
        with self._lock:
            self._store.failures[action] = _Failure(status, reason, message, in_operation)

    # -- the API ---------------------------------------------------------------------

    def handle(
        self, method: str, path: str, query: dict[str, list[str]], body: Any, authorized: bool
    ) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self._store.records.append(Recorded(method, path, query, body, authorized))
            match = _PATH.match(path)
            if match is None:
                return _error(404, "notFound", f"no route for {method} {path}")
            project, zone, kind, name, wait = match.group("project", "zone", "kind", "name", "wait")
            if kind == "operations" and name is not None:
                if (method, wait) in (("GET", None), ("POST", "/wait")):
                    return self._poll(name)
            elif kind == "instances" and wait is None:
                if method == "POST" and name is None:
                    return self._insert(project, zone, body)
                if method == "GET" and name is None:
                    return self._list(project, zone, query)
                if method == "GET":
                    return self._get(project, zone, name)
                if method == "DELETE":
                    return self._delete(project, zone, name)
            return _error(405, "badRequest", f"{method} {path} is not implemented here")

    def _failure(self, action: Action) -> _Failure | None:
        return self._store.failures.pop(action, None)

    def _insert(self, project: str, zone: str, body: Any) -> tuple[int, dict[str, Any]]:
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            return _error(400, "invalid", "an instance needs a name")
        name = body["name"]
        failure = self._failure("insert")
        if failure is not None and not failure.in_operation:
            return _error(failure.status, failure.reason, failure.message)
        if (project, name) in self._store.instances:
            return _error(409, "alreadyExists", f"The resource '{name}' already exists")
        link = f"projects/{project}/zones/{zone}/instances/{name}"
        if failure is not None:  # the operation fails; no instance is made
            return 200, self._operation(project, zone, "insert", link, failure)
        resource = dict(body)
        resource.update(
            id=str(next(self._ids) + 1000),
            kind="compute#instance",
            selfLink=f"https://compute.example/compute/v1/{link}",
            zone=zone,
        )
        interfaces = resource.get("networkInterfaces") or [{}]
        resource["networkInterfaces"] = [
            {**interface, "networkIP": f"10.128.0.{index + 10}"}
            for index, interface in enumerate(interfaces[:1])
        ]
        self._store.instances[project, name] = _Instance(
            zone, resource, self.provisioning_reads, self.list_lag
        )
        return 200, self._operation(project, zone, "insert", link)

    def _list(
        self, project: str, zone: str, query: dict[str, list[str]]
    ) -> tuple[int, dict[str, Any]]:
        failure = self._failure("list")
        if failure is not None:
            return _error(failure.status, failure.reason, failure.message)
        wanted: dict[str, str] = {}
        for text in query.get("filter", []):
            for term in re.split(r"\s+AND\s+", text.strip()):
                found = _FILTER_TERM.fullmatch(term)
                if found is None:
                    return _error(400, "invalid", f"unsupported filter {text!r}")
                wanted[found["key"]] = found["value"]
        items = []
        for (owner, _name), instance in list(self._store.instances.items()):
            if owner != project or instance.zone != zone:
                continue
            if instance.hidden_lists > 0:
                instance.hidden_lists -= 1
                continue
            labels = instance.resource.get("labels") or {}
            if all(labels.get(key) == value for key, value in wanted.items()):
                read = self._read(project, instance)
                if read is not None:
                    items.append(read)
        return 200, {"kind": "compute#instanceList", "items": items} if items else {}

    def _get(self, project: str, zone: str, name: str) -> tuple[int, dict[str, Any]]:
        failure = self._failure("get")
        if failure is not None:
            return _error(failure.status, failure.reason, failure.message)
        instance = self._store.instances.get((project, name))
        read = None if instance is None or instance.zone != zone else self._read(project, instance)
        if read is None:
            return _error(404, "notFound", f"The resource '{name}' was not found")
        return 200, read

    def _read(self, project: str, instance: _Instance) -> dict[str, Any] | None:
        """The instance as one read sees it (advancing its state), None once deleted."""
        if instance.deleting_reads is not None:
            if instance.deleting_reads <= 0:
                del self._store.instances[project, instance.resource["name"]]
                return None
            instance.deleting_reads -= 1
            status = "STOPPING"
        elif instance.provisioning_reads > 0:
            instance.provisioning_reads -= 1
            status = "PROVISIONING"
        else:
            status = "RUNNING"
        return {**instance.resource, "status": status}

    def _delete(self, project: str, zone: str, name: str) -> tuple[int, dict[str, Any]]:
        failure = self._failure("delete")
        if failure is not None and not failure.in_operation:
            return _error(failure.status, failure.reason, failure.message)
        instance = self._store.instances.get((project, name))
        if instance is None or instance.zone != zone:
            return _error(404, "notFound", f"The resource '{name}' was not found")
        link = f"projects/{project}/zones/{zone}/instances/{name}"
        if failure is None and instance.deleting_reads is None:
            instance.deleting_reads = self.deleting_reads
        return 200, self._operation(project, zone, "delete", link, failure)

    def _operation(
        self, project: str, zone: str, kind: str, target: str, failure: _Failure | None = None
    ) -> dict[str, Any]:
        name = f"operation-{next(self._ids)}-{kind}"
        body: dict[str, Any] = {
            "kind": "compute#operation",
            "name": name,
            "operationType": kind,
            "targetLink": f"https://compute.example/compute/v1/{target}",
            "zone": f"projects/{project}/zones/{zone}",
            "status": "DONE",
        }
        if failure is not None:
            body["error"] = {"errors": [{"code": failure.reason, "message": failure.message}]}
            body["httpErrorStatusCode"] = failure.status
            body["httpErrorMessage"] = failure.message
        self._store.operations[name] = _Operation(body, self.operation_polls)
        return self._status(self._store.operations[name])

    def _poll(self, name: str) -> tuple[int, dict[str, Any]]:
        operation = self._store.operations.get(name)
        if operation is None:
            return _error(404, "notFound", f"The resource '{name}' was not found")
        operation.polls_left -= 1
        return 200, self._status(operation)

    @staticmethod
    def _status(operation: _Operation) -> dict[str, Any]:
        if operation.polls_left > 0:
            running = {
                k: v for k, v in operation.body.items() if not k.startswith(("error", "http"))
            }
            return {**running, "status": "RUNNING"}
        return operation.body


def _error(status: int, reason: str, message: str) -> tuple[int, dict[str, Any]]:
    errors = [{"message": message, "domain": "global", "reason": reason}]
    return status, {"error": {"code": status, "message": message, "errors": errors}}


def _handler(server: GcpServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                status, answer = _error(400, "parseError", "the body is not JSON")
            else:
                authorized = self.headers.get("Authorization") is not None
                query = parse_qs(parts.query)
                status, answer = server.handle(self.command, parts.path, query, body, authorized)
            payload = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the record is the log

    return Handler


@contextmanager
def gcp_server(**knobs: int) -> Iterator[GcpServer]:
    """A running :class:`GcpServer` (see its knobs), shut down afterwards."""
    server = GcpServer(**knobs)
    server.start()
    try:
        yield server
    finally:
        server.close()
