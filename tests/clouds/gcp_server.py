"""A local Compute Engine, and BigQuery's query API: the part of the REST APIs the GCP
driver's SDKs call.

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
* An instance's ``creationTimestamp`` is its insert's time, in RFC 3339 with
  milliseconds and a -08:00 offset as Compute Engine writes it (US Pacific);
  :meth:`GcpServer.set_created` moves it, :meth:`GcpServer.remove_label` takes a
  label off (an instance labelled by hand, a label removed in the console).
* :meth:`GcpServer.fail_next`: the next call of one kind answers an HTTP error
  with a reason, or (``in_operation``) an operation that ends with that error code,
  as Compute Engine reports stockouts and most quota failures.

BigQuery, as google-cloud-bigquery's ``Client.query_and_wait`` calls it (found by
running it against this server: jobs.query, then while a query runs or has more pages
jobs.get and jobs.getQueryResults, and jobs.cancel when the caller stops waiting)::

    POST /bigquery/v2/projects/{p}/queries                  jobs.query
    GET  /bigquery/v2/projects/{p}/jobs/{job}               jobs.get
    GET  /bigquery/v2/projects/{p}/queries/{job}            jobs.getQueryResults
    POST /bigquery/v2/projects/{p}/jobs/{job}/cancel        jobs.cancel

The SQL is recorded, never run: every query answers the rows a test set with
:meth:`GcpServer.set_billing_rows`, in the billing query's result schema
(:data:`BILLING_SCHEMA`) and BigQuery's ``f``/``v`` row encoding. Knobs:
``query_polls`` (a query reads as running that many times: jobs.query answers
``jobComplete: false``) and ``page_rows`` (rows per page; the rest behind a
``pageToken``). ``fail_next("query", ...)`` fails the next jobs.query,
``fail_next("results", ...)`` the next jobs.getQueryResults.
"""

from __future__ import annotations

import datetime
import itertools
import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

Action = Literal["insert", "list", "get", "delete", "query", "results"]

#: The result schema of the driver's billing query (autoscaler.drivers.gcp.billing_sql).
BILLING_SCHEMA = (
    ("usage_day", "DATE"),
    ("request_id", "STRING"),
    ("resource_name", "STRING"),
    ("currency", "STRING"),
    ("amount", "FLOAT"),
)
BIGQUERY_LOCATION = "EU"

_PATH = re.compile(
    r"^/compute/v1/projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/"
    r"(?P<kind>instances|operations)(?:/(?P<name>[^/]+))?(?P<wait>/wait)?$"
)
_BIGQUERY_PATH = re.compile(
    r"^/bigquery/v2/projects/(?P<project>[^/]+)/(?P<kind>queries|jobs)"
    r"(?:/(?P<job>[^/]+))?(?P<cancel>/cancel)?$"
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
class _Job:
    project: str
    query: str
    rows: list[dict[str, Any]]  # the answer, encoded as f/v rows
    polls_left: int
    cancelled: bool = False


@dataclass
class _Store:
    instances: dict[tuple[str, str], _Instance] = field(default_factory=dict)  # (project, name)
    operations: dict[str, _Operation] = field(default_factory=dict)
    jobs: dict[str, _Job] = field(default_factory=dict)
    billing_rows: list[dict[str, Any]] = field(default_factory=list)
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
        query_polls: int = 0,
        page_rows: int | None = None,
    ) -> None:
        self.provisioning_reads = provisioning_reads
        self.list_lag = list_lag
        self.deleting_reads = deleting_reads
        self.operation_polls = operation_polls
        self.query_polls = query_polls
        self.page_rows = page_rows
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

    def set_created(self, name: str, when: float, project: str = "hm-test") -> None:
        """Say the instance was created at ``when`` (epoch seconds)."""
        with self._lock:
            self._store.instances[project, name].resource["creationTimestamp"] = _rfc3339(when)

    def remove_label(self, name: str, key: str, project: str = "hm-test") -> None:
        with self._lock:
            self._store.instances[project, name].resource.get("labels", {}).pop(key, None)

    def set_billing_rows(self, rows: list[dict[str, Any]]) -> None:
        """What every query answers from now on: rows keyed by :data:`BILLING_SCHEMA`'s
        names (a missing key is NULL), encoded as BigQuery encodes them."""
        with self._lock:
            self._store.billing_rows = [_encode_row(row) for row in rows]

    def job(self, job_id: str) -> dict[str, Any] | None:
        with self._lock:
            found = self._store.jobs.get(job_id)
            return None if found is None else {"cancelled": found.cancelled}

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
            found = _BIGQUERY_PATH.match(path)
            if found is not None:
                return self._bigquery(method, found, query, body)
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
            creationTimestamp=_rfc3339(time.time()),
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

    # -- BigQuery ----------------------------------------------------------------------

    def _bigquery(
        self, method: str, match: re.Match[str], query: dict[str, list[str]], body: Any
    ) -> tuple[int, dict[str, Any]]:
        project, kind, job_id, cancel = match.group("project", "kind", "job", "cancel")
        if kind == "queries" and job_id is None and method == "POST":
            return self._query(project, body)
        job = self._store.jobs.get(job_id or "")
        if job is None or job.project != project:
            return _error(404, "notFound", f"Not found: Job {project}:{job_id}")
        if kind == "jobs" and method == "GET" and cancel is None:
            return 200, self._job_resource(job_id or "", job, advance=True)
        if kind == "jobs" and method == "POST" and cancel is not None:
            job.cancelled = True
            resource = self._job_resource(job_id or "", job, advance=False)
            return 200, {"kind": "bigquery#jobCancelResponse", "job": resource}
        if kind == "queries" and method == "GET":
            failure = self._failure("results")
            if failure is not None:
                return _error(failure.status, failure.reason, failure.message)
            return 200, self._results(job_id or "", job, query)
        return _error(405, "badRequest", f"{method} {match.string} is not implemented here")

    def _query(self, project: str, body: Any) -> tuple[int, dict[str, Any]]:
        """jobs.query: a job that answers the billing rows set."""
        if not isinstance(body, dict) or not isinstance(body.get("query"), str):
            return _error(400, "invalid", "a query request needs its query")
        failure = self._failure("query")
        if failure is not None:
            return _error(failure.status, failure.reason, failure.message)
        job_id = f"job_{next(self._ids)}"
        job = _Job(project, body["query"], list(self._store.billing_rows), self.query_polls)
        self._store.jobs[job_id] = job
        answer = self._results(job_id, job, {})
        return 200, {**answer, "kind": "bigquery#queryResponse", "queryId": f"q{job_id}"}

    def _results(self, job_id: str, job: _Job, query: dict[str, list[str]]) -> dict[str, Any]:
        """One page of the job's rows (jobs.query, jobs.getQueryResults), or that it
        is still running."""
        reference = {"projectId": job.project, "jobId": job_id, "location": BIGQUERY_LOCATION}
        answer: dict[str, Any] = {
            "kind": "bigquery#getQueryResultsResponse",
            "jobReference": reference,
        }
        if job.polls_left > 0:
            job.polls_left -= 1
            return {**answer, "jobComplete": False}
        start = int((query.get("pageToken") or ["rows-0"])[0].removeprefix("rows-"))
        size = len(job.rows) if self.page_rows is None else self.page_rows
        if "maxResults" in query:
            size = min(size, int(query["maxResults"][0]))
        page = job.rows[start : start + size]
        answer.update(
            schema={
                "fields": [{"name": n, "type": t, "mode": "NULLABLE"} for n, t in BILLING_SCHEMA]
            },
            totalRows=str(len(job.rows)),
            totalBytesProcessed="10485760",
            cacheHit=False,
            jobComplete=True,
        )
        if page:
            answer["rows"] = page
        if page and start + len(page) < len(job.rows):
            answer["pageToken"] = f"rows-{start + len(page)}"
        return answer

    def _job_resource(self, job_id: str, job: _Job, *, advance: bool) -> dict[str, Any]:
        if advance and job.polls_left > 0:
            job.polls_left -= 1
        reference = {"projectId": job.project, "jobId": job_id, "location": BIGQUERY_LOCATION}
        return {
            "kind": "bigquery#job",
            "id": f"{job.project}:{BIGQUERY_LOCATION}.{job_id}",
            "jobReference": reference,
            "configuration": {
                "jobType": "QUERY",
                "query": {"query": job.query, "useLegacySql": False},
            },
            "status": {"state": "RUNNING" if job.polls_left > 0 else "DONE"},
            "statistics": {"creationTime": "1714521600000", "query": {"statementType": "SELECT"}},
        }


def _rfc3339(when: float) -> str:
    """``when`` as Compute Engine writes times: ``2026-12-05T22:02:03.456-08:00``."""
    pacific = datetime.timezone(datetime.timedelta(hours=-8))
    return datetime.datetime.fromtimestamp(when, pacific).isoformat(timespec="milliseconds")


def _encode_row(row: dict[str, Any]) -> dict[str, Any]:
    """A row in BigQuery's JSON encoding: ``{"f": [{"v": "text"}, ...]}``, NULL as null."""
    unknown = set(row) - {name for name, _type in BILLING_SCHEMA}
    if unknown:
        raise ValueError(f"not in the billing schema: {sorted(unknown)}")
    cells = []
    for name, _type in BILLING_SCHEMA:
        value = row.get(name)
        cells.append({"v": None if value is None else str(value)})
    return {"f": cells}


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
def gcp_server(**knobs: Any) -> Iterator[GcpServer]:
    """A running :class:`GcpServer` (see its knobs), shut down afterwards."""
    server = GcpServer(**knobs)
    server.start()
    try:
        yield server
    finally:
        server.close()
