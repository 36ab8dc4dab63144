"""What the record cannot store is refused at the edge with a 4xx naming the field, never
a 500 nor a dropped stream: NUL characters and lone UTF-16 surrogates in ids and text,
NaN and Infinity in params, numbers and times past their columns' range, a Last-Event-ID
past Redis's. Through a real uvicorn server on PostgreSQL (which refuses a NUL in text)
and SQLite (which would keep a NaN no JSON parser reads back).

The tests share one database, one stack and one server per engine (``module_engine``):
each has a user of its own, and counts only that user's rows (``_count(..., user)``), so
no test sees another's. A clone, a ``Stack.open`` and a uvicorn start per test (68 of
them, mostly parametrized cases) cost the file most of its CPU."""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import Table, func, select

from hypermedia import tls
from hypermedia.accounts import NewUser
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.ingest import api
from hypermedia.ingest.api import create_app
from hypermedia.stack import Stack
from tests.api_support import add_user, bearer, running_server

P = "/v1/hypermedia"
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10\x00\x00\x00\x10\x08\x02\x00\x00\x00"
MISSING_JOB = "0" * 32


@pytest.fixture(scope="module")
def stack(module_engine, module_settings) -> Iterator[Stack]:
    """Shared by the module's tests on one engine (see the module docstring)."""
    opened = Stack.open(module_settings(module_engine), engine=module_engine, auto_migrate=True)
    yield opened
    opened.close()


@pytest.fixture(scope="module")
def client(stack) -> Iterator[httpx.Client]:
    with (
        running_server(
            create_app(stack, auth_cache_seconds=0, events_keepalive_seconds=0.5)
        ) as url,
        httpx.Client(base_url=url, timeout=30, verify=tls.client_context()) as http,
    ):
        yield http


_users = itertools.count(1)


@pytest.fixture
def user(stack):
    """The test's own user (the stack is shared: a name of its own)."""
    return add_user(stack, f"alice-{next(_users)}", credits=100)


@pytest.fixture
def object_id(client, user) -> str:
    uploaded = client.put(
        f"{P}/objects", params={"filename": "a.png"}, content=PNG, headers=bearer(user)
    )
    assert uploaded.status_code == 201, uploaded.text
    return str(uploaded.json()["object_id"])


def _count(stack: Stack, table: Table, user: NewUser) -> int:
    """``user``'s rows of ``table`` (jobs, submissions: theirs; objects: they own): the
    other tests' rows are in the shared database too."""
    owner = table.c.owner_id if table is t.objects else table.c.user_id
    query = select(func.count()).select_from(table).where(owner == user.user_id)
    with transaction(stack.engine) as conn:
        return int(conn.execute(query).scalar_one())


def refused(response: httpx.Response, status: int, field: str, code: str = "invalid_request"):
    """The error ``response`` must be: its status, its code, a message naming ``field``."""
    assert response.status_code == status, (field, response.status_code, response.text)
    error = response.json()["error"]
    assert error["code"] == code, (field, error)
    assert field in error["message"], (field, error)
    return error


def raw_submit(client: httpx.Client, user, body: bytes) -> httpx.Response:
    headers = {**bearer(user), "Content-Type": "application/json"}
    return client.post(f"{P}/process", content=body, headers=headers)


def test_nul_in_an_id_or_text_is_refused_naming_the_field(stack, client, user, object_id):
    h = bearer(user)
    job = client.post(
        f"{P}/process", json={"object_id": object_id, "operations": ["thumbnail"]}, headers=h
    ).json()["job_ids"][0]
    nul = "a\x00b"
    body = {"object_id": object_id, "operations": ["thumbnail"]}
    requests: list[tuple[str, str, dict[str, Any], str]] = [
        ("GET", f"{P}/jobs/ab%00cd", {}, "path.job_id"),
        ("POST", f"{P}/jobs/ab%00cd/cancel", {}, "path.job_id"),
        ("GET", f"{P}/jobs/ab%00cd/events", {}, "path.job_id"),
        ("GET", f"{P}/jobs/ab%00cd/attempts/1/log", {}, "path.job_id"),
        ("GET", f"{P}/jobs/ab%00cd/outputs/thumbnail/url", {}, "path.job_id"),
        ("GET", f"{P}/jobs/{job}/outputs/a%00b/url", {}, "path.output_type"),
        ("GET", f"{P}/objects/ab%00cd", {}, "path.object_id"),
        ("DELETE", f"{P}/objects/ab%00cd", {}, "path.object_id"),
        ("GET", f"{P}/submissions/ab%00cd", {}, "path.submission_id"),
        ("GET", f"{P}/jobs", {"params": {"object_id": nul}}, "query.object_id"),
        ("GET", f"{P}/jobs", {"params": {"operation": nul}}, "query.operation"),
        ("GET", f"{P}/jobs", {"params": {"submission_id": nul}}, "query.submission_id"),
        ("PUT", f"{P}/objects", {"params": {"filename": nul}, "content": PNG}, "query.filename"),
        (
            "PUT",
            f"{P}/objects",
            {"params": {"filename": "a.png", "pool_id": nul}, "content": PNG},
            "query.pool_id",
        ),
        ("POST", f"{P}/process", {"json": {**body, "object_id": nul}}, "body.object_id"),
        (
            "POST",
            f"{P}/process",
            {"json": {**body, "idempotency_key": nul}},
            "body.idempotency_key",
        ),
        (
            "POST",
            f"{P}/process",
            {"json": {**body, "params": {"thumbnail": {"x": nul}}}},
            "params.thumbnail.x",
        ),
        (
            "POST",
            f"{P}/process",
            {"json": {**body, "callback_url": f"http://example.com/{nul}"}},
            "body.callback_url",
        ),
        (
            "POST",
            f"{P}/objects/register",
            {"json": {"storage_key": "originals/x/y", "filename": nul, "size_bytes": 1}},
            "body.filename",
        ),
        (
            "POST",
            f"{P}/objects/register",
            {"json": {"storage_key": nul, "filename": "a", "size_bytes": 1}},
            "body.storage_key",
        ),
    ]
    for method, path, extra, field in requests:
        error = refused(client.request(method, path, headers=h, **extra), 422, field)
        assert any(says in error["message"] for says in ("NUL", "pattern", "U+0000")), error
    assert _count(stack, t.jobs, user) == 1 and _count(stack, t.objects, user) == 1


def test_a_lone_surrogate_is_refused_naming_the_field(stack, client, user, object_id):
    oid = object_id.encode()
    for body, field in (
        (b'{"object_id": "\\ud800", "operations": ["thumbnail"]}', "body.object_id"),
        (b'{"object_id": "%s", "operations": ["\\ud800"]}' % oid, "body.operations.0"),
        (
            b'{"object_id": "%s", "operations": ["thumbnail"], "idempotency_key": "\\ud800"}' % oid,
            "body.idempotency_key",
        ),
        (
            b'{"object_id": "%s", "operations": ["thumbnail"],'
            b' "params": {"thumbnail": {"a": "\\ud800"}}}' % oid,
            "params.thumbnail.a",
        ),
        (
            b'{"object_id": "%s", "operations": ["thumbnail"],'
            b' "params": {"thumbnail": {"\\ud800": 1}}}' % oid,
            "params.thumbnail: a key",
        ),
    ):
        refused(raw_submit(client, user, body), 422, field)
    register = client.post(
        f"{P}/objects/register",
        content=b'{"storage_key": "originals/%s/%s", "filename": "\\ud800", "size_bytes": 1}'
        % (user.pool_id.encode(), oid),
        headers={**bearer(user), "Content-Type": "application/json"},
    )
    refused(register, 422, "body.filename")
    assert _count(stack, t.jobs, user) == 0 and _count(stack, t.objects, user) == 1


@pytest.mark.parametrize(
    "name",
    [
        "a.png\r\nX-Injected: 1",  # a header, once a web tier puts it in Content-Disposition
        "a\nb.png",
        "a\tb.png",
        "\x1b]0;owned\x07a.png",  # a terminal escape
        "a\x7fb.png",
        "a\x85b.png",  # C1: NEL
        "a\x9bb.png",  # C1: CSI
    ],
)
def test_a_file_name_with_control_characters_is_refused(stack, client, user, name):
    # Before: stored and answered as given (201): a name that ends a header line once a
    # web tier puts it in Content-Disposition, breaks a log line or drives a terminal.
    h = bearer(user)
    upload = client.put(f"{P}/objects", params={"filename": name}, content=PNG, headers=h)
    error = refused(upload, 422, "query.filename")
    assert "U+" in error["message"], error
    register = client.post(
        f"{P}/objects/register",
        json={"storage_key": f"originals/{user.pool_id}/web-1", "filename": name, "size_bytes": 1},
        headers=h,
    )
    refused(register, 422, "body.filename")
    assert _count(stack, t.objects, user) == 0


def test_a_file_name_that_looks_like_a_path_is_only_a_name(stack, client, user):
    # Names never become keys nor paths: these are kept as given, the bytes go to the
    # object's own key.
    names = ["../../etc/passwd", "/etc/passwd", "..", "CON", "e\u0301.png", "image\u202egpj.exe"]
    for name in names:
        uploaded = client.put(
            f"{P}/objects", params={"filename": name}, content=PNG, headers=bearer(user)
        )
        assert uploaded.status_code == 201, uploaded.text
        body = uploaded.json()
        assert body["filename"] == name
        with transaction(stack.engine) as conn:
            key = conn.execute(
                select(t.objects.c.storage_key).where(t.objects.c.object_id == body["object_id"])
            ).scalar_one()
        assert key == f"originals/{user.pool_id}/{body['object_id']}"


@pytest.mark.parametrize("number", [b"NaN", b"Infinity", b"-Infinity"])
def test_nan_and_infinity_in_params_are_refused(stack, client, user, object_id, number):
    body = (
        b'{"object_id": "%s", "operations": ["thumbnail"], "params": {"thumbnail": {"x": [1, %s]}}}'
    )
    error = refused(
        raw_submit(client, user, body % (object_id.encode(), number)), 422, "body.params"
    )
    assert "params.thumbnail.x[1]" in error["message"] and "not a JSON number" in error["message"]
    assert _count(stack, t.jobs, user) == 0 and _count(stack, t.submissions, user) == 0
    # A well-formed number goes through (to the step's check, which takes this one).
    accepted = raw_submit(
        client,
        user,
        b'{"object_id": "%s", "operations": ["thumbnail"], "params": {"thumbnail": {"width": 320}}}'
        % object_id.encode(),
    )
    assert accepted.status_code == 202, accepted.text


def test_an_attempt_number_is_bounded(client, user):
    h = bearer(user)
    for number in ("99999999999999999999999", str(2**31), "0", "-1"):
        path = f"{P}/jobs/{MISSING_JOB}/attempts/{number}/log"
        refused(client.get(path, headers=h), 422, "path.attempt_number")
    last = client.get(f"{P}/jobs/{MISSING_JOB}/attempts/{2**31 - 1}/log", headers=h)
    refused(last, 404, str(2**31 - 1), "not_found")


def test_a_creation_time_outside_the_record_years_or_without_a_zone_is_refused(client, user):
    """422 naming the parameter, as every other bad query parameter: it was 400, which
    listJobs does not document (its errors: 401, 422)."""
    h = bearer(user)
    for name, moment, why in (
        ("created_after", "9999-12-31T23:59:59-23:59", "outside the years 1-9999 in UTC"),
        ("created_before", "0001-01-01T00:00:00+01:00", "outside the years 1-9999 in UTC"),
        ("created_after", "2026-01-01T00:00:00", "needs a time zone"),
    ):
        answer = client.get(f"{P}/jobs", params={name: moment}, headers=h)
        error = refused(answer, 422, f"query.{name}")
        assert why in error["message"]
        assert [e["path"] for e in error["details"]["errors"]] == [f"query.{name}"]
    edge = {"created_after": "0001-01-01T00:00:00Z", "created_before": "9999-12-31T23:59:59Z"}
    answered = client.get(f"{P}/jobs", params=edge, headers=h)
    assert answered.status_code == 200 and answered.json()["jobs"] == [], answered.text


def test_a_creation_time_given_as_a_number_is_refused(client, user):
    """pydantic reads a number as Unix time (seconds, or milliseconds past 2e10):
    created_before=-1 was 1969-12-31T23:59:59Z and answered an empty list, 200."""
    h = bearer(user)
    for name, number in (
        ("created_before", "-1"),
        ("created_after", "1700000000"),
        ("created_before", "1e12"),
        ("created_after", "-99999999999999"),
    ):
        answer = client.get(f"{P}/jobs", params={name: number}, headers=h)
        error = refused(answer, 422, f"query.{name}")
        assert f"'{number}' is not an ISO 8601 time" in error["message"], error
    written = {"created_after": "1970-01-01T00:00:00Z", "created_before": "2999-01-01T00:00+02:00"}
    assert client.get(f"{P}/jobs", params=written, headers=h).status_code == 200


def test_a_query_parameter_given_twice_with_different_values_is_refused(client, user):
    """Starlette took the last (``limit=1&limit=500`` was 500), Flask and others take the
    first: a proxy and the API could read two different requests in one URL."""
    h = bearer(user)
    twice = client.get(f"{P}/jobs", params=[("limit", "1"), ("limit", "500")], headers=h)
    error = refused(twice, 422, "query.limit")
    assert "given 2 times with different values ['1', '500']: give it once" in error["message"]
    cursor = [("cursor", "a" * 32), ("limit", "5"), ("cursor", "b" * 32)]
    refused(client.get(f"{P}/jobs", params=cursor, headers=h), 422, "query.cursor")
    # What the Python client sends: a list parameter repeated, each other one once.
    for taken in (
        [("status", "queued"), ("status", "failed"), ("limit", "5")],
        [("limit", "5"), ("limit", "5")],  # the same value twice says one thing
    ):
        answer = client.get(f"{P}/jobs", params=taken, headers=h)
        assert answer.status_code == 200, (taken, answer.text)
    uploaded = client.put(
        f"{P}/objects",
        params=[("filename", "a.png"), ("filename", "b.png")],
        content=PNG,
        headers=bearer(user),
    )
    refused(uploaded, 422, "query.filename")


def test_a_routes_list_parameters_are_found_once_not_at_every_request(stack, user):
    """The check above walked the route's dependencies for its list parameters at each
    request with two query parameters or more (~17 us for GET /jobs, ~40 us for the
    deepest route): found once per route now, answers unchanged."""
    walks = 0

    def count(frame: Any, event: str, _arg: object) -> None:
        nonlocal walks
        if event == "call" and frame.f_code is api._list_query_names.__code__:
            walks += frame.f_back.f_code is not api._list_query_names.__code__

    async def ask() -> list[int]:
        app = create_app(stack, auth_cache_seconds=60)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            statuses = []
            asked: list[list[tuple[str, str | int | float | bool | None]]] = [
                [("status", "queued"), ("status", "failed"), ("limit", "5")],
                [("limit", "5"), ("limit", "5")],
                [("limit", "1"), ("limit", "500")],
            ]
            for params in 20 * asked:
                answer = await http.get(f"{P}/jobs", params=params, headers=bearer(user))
                statuses.append(answer.status_code)
            return statuses

    sys.setprofile(count)
    try:
        statuses = asyncio.run(ask())
    finally:
        sys.setprofile(None)
    assert statuses == 20 * [200, 200, 422]
    assert walks == 1  # old: 60, one a request


def test_an_apps_first_requests_build_none_of_its_routes_again(stack, user):
    """Each app (create_app) had FastAPI build every route of the API again, as it
    included the module's router, at its first request: each route's dependencies
    and models, ~100 ms of CPU an app (``serve`` makes one; a test process hundreds).
    An app serves the routes built once a process now; its answers are unchanged."""
    from fastapi.dependencies import utils

    builds = 0

    def count(frame: Any, event: str, _arg: object) -> None:
        nonlocal builds
        if event == "call" and frame.f_code is utils.get_dependant.__code__:
            builds += 1

    async def ask(app: Any) -> list[int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            credits = await http.get(f"{P}/credits", headers=bearer(user))
            job = await http.get(f"{P}/jobs/{MISSING_JOB}", headers=bearer(user))
            return [credits.status_code, job.status_code]

    assert asyncio.run(ask(create_app(stack))) == [200, 404]  # a first app of the process
    app = create_app(stack)
    sys.setprofile(count)
    try:
        statuses = asyncio.run(ask(app))
    finally:
        sys.setprofile(None)
    assert statuses == [200, 404]
    assert builds == 0  # old: 112, each route's and its dependencies'


@pytest.mark.parametrize("charset", ["latin1", "ISO-8859-1", '"utf-16"', "windows-1252"])
def test_a_json_body_said_to_be_in_another_charset_than_utf8_is_415_naming_it(
    stack, client, user, charset
):
    """Such a body was read as UTF-8 all the same: taken when its bytes happened to be
    ASCII, its accented letters refused or read as other letters when not."""
    body = b'{"object_id": "caf\xe9", "operations": ["thumbnail"]}'
    headers = {**bearer(user), "Content-Type": f"application/json; charset={charset}"}
    answer = client.post(f"{P}/process", content=body, headers=headers)
    said = charset.strip('"').lower()
    error = refused(answer, 415, f"charset={said}", code="unsupported_media_type")
    assert error["details"]["content_type"] == f"application/json; charset={charset}"
    assert _count(stack, t.jobs, user) == 0
    for utf8 in ("utf-8", "UTF-8", '"utf-8"', "utf8"):
        headers = {**bearer(user), "Content-Type": f"application/json ; charset={utf8}"}
        taken = client.post(
            f"{P}/process",
            content=b'{"object_id": "caf\xc3\xa9", "operations": ["thumbnail"]}',
            headers=headers,
        )
        refused(taken, 404, "caf\u00e9", code="not_found")  # past the guard: no such object


def test_a_last_event_id_past_redis_range_is_refused_and_its_edge_streams(client, user, object_id):
    h = bearer(user)
    job = client.post(
        f"{P}/process", json={"object_id": object_id, "operations": ["thumbnail"]}, headers=h
    ).json()["job_ids"][0]
    assert client.post(f"{P}/jobs/{job}/cancel", headers=h).status_code == 200
    events = f"{P}/jobs/{job}/events"
    for past in ("99999999999999999999-0", "0-18446744073709551616"):
        refused(client.get(events, headers={**h, "Last-Event-ID": past}), 422, "Last-Event-ID")
    # In range, but Redis refuses to read after it (no id follows the largest): the stream
    # starts over rather than breaking, and ends with the job's end.
    last = "18446744073709551615-18446744073709551615"
    with client.stream("GET", events, headers={**h, "Last-Event-ID": last}) as response:
        assert response.status_code == 200
        text = "".join(response.iter_text())
    data = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    assert data and data[-1]["status"] == "cancelled", text


@pytest.mark.parametrize(
    "key",
    [
        "cl\u00e9".encode(),  # UTF-8: read as Latin-1 it was stored as "cl\u00c3\u00a9"
        "cl\u00e9".encode("latin-1"),
        b"\xff\xfe",
    ],
)
def test_an_idempotency_key_header_not_ascii_is_refused(stack, client, user, object_id, key):
    # Before: a header's bytes were read as Latin-1 and kept (201/202): a UTF-8 key was
    # stored as another string than the caller's, which the same key sent in the body
    # (as JSON, read as UTF-8) then did not match.
    h = [(b"Authorization", f"Bearer {user.api_key}".encode()), (b"Idempotency-Key", key)]
    upload = client.put(f"{P}/objects", params={"filename": "b.png"}, content=PNG, headers=h)
    error = refused(upload, 422, "header.Idempotency-Key")
    assert "printable ASCII" in error["message"], error
    submit = client.post(
        f"{P}/process", json={"object_id": object_id, "operations": ["thumbnail"]}, headers=h
    )
    refused(submit, 422, "header.Idempotency-Key")
    body = {"object_id": object_id, "operations": ["thumbnail"], "idempotency_key": "cl\u00e9"}
    in_body = client.post(f"{P}/process", json=body, headers=bearer(user))
    refused(in_body, 422, "body.idempotency_key")
    assert _count(stack, t.jobs, user) == 0 and _count(stack, t.objects, user) == 1


def test_a_query_parameter_not_utf8_is_refused_naming_it(stack, client, user, object_id):
    # Before: Starlette decoded the bytes with U+FFFD in place of the bad ones, and the
    # upload stored "\ufffdcat\ufffd.png" (201), a name nobody gave.
    h = bearer(user)
    for query, field, bad in (
        ("filename=%FFcat%C3.png", "query.filename", "FF at 0"),
        ("filename=a.png&pool_id=%C3%28", "query.pool_id", "C3 at 0"),
        ("filename=%ED%A0%80.png", "query.filename", "ED at 0"),  # a UTF-8 surrogate
        ("filename=a.png&%FF=1", "query.\ufffd", "FF at 0"),
    ):
        upload = client.put(f"{P}/objects?{query}", content=PNG, headers=h)
        error = refused(upload, 422, field)
        assert "not UTF-8" in error["message"] and bad in error["message"], error
    listed = client.get(f"{P}/jobs?object_id=caf%E9", headers=h)  # Latin-1, not UTF-8
    refused(listed, 422, "query.object_id")
    assert _count(stack, t.objects, user) == 1
    # Percent-encoded UTF-8 is the name, exactly; so is '+' for a space.
    named = client.put(f"{P}/objects?filename=caf%C3%A9+%F0%9F%90%B1.png", content=PNG, headers=h)
    assert named.status_code == 201, named.text
    assert named.json()["filename"] == "caf\u00e9 \U0001f431.png"


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b'{"object_id": "caf\xe9", "operations": ["thumbnail"]}', "not UTF-8 text"),
        (b"\x00" * 10, "not UTF-8 text"),
        (b'{"a": ' * 5000 + b"1" + b"}" * 5000, "nested too deeply"),
        (b"[" * 5000 + b"]" * 5000, "nested too deeply"),
        (
            b'{"object_id": "x", "operations": ["thumbnail"], "priority": 1%s}' % (b"0" * 5000),
            "4300 digits",
        ),
    ],
)
def test_a_json_body_the_parser_cannot_read_is_422_saying_why(stack, client, user, body, why):
    # Before: 400 http_error "There was an error parsing the body" (FastAPI's, for any
    # error of json.loads but a JSONDecodeError): no reason, and a status neither
    # registerObject nor the bulk routes document.
    headers = {**bearer(user), "Content-Type": "application/json"}
    for path in (f"{P}/process", f"{P}/objects/register"):
        error = refused(client.post(path, content=body, headers=headers), 422, "body")
        assert error["message"].startswith("body: not valid JSON: "), error
        assert why in error["message"], error
        assert "sys." not in error["message"], error
        assert error["details"]["errors"][0]["type"] == "json_invalid", error
    assert _count(stack, t.jobs, user) == 0 and _count(stack, t.objects, user) == 0


def test_an_empty_id_is_404_not_a_redirect_to_another_route(client, user, object_id):
    # Before: 307 to the path without its last slash: GET /jobs/ (an empty job id) led
    # to the caller's list of jobs, DELETE /objects/ to a 405 from the upload route.
    h = bearer(user)
    for method, path in (
        ("GET", f"{P}/jobs/"),
        ("GET", f"{P}/jobs/%2F"),
        ("GET", f"{P}/submissions/"),
        ("GET", f"{P}/objects/"),
        ("DELETE", f"{P}/objects/"),
        ("GET", f"{P}/bulk/runs/"),
        ("PATCH", f"{P}/bulk/runs/"),
        ("GET", f"{P}/credits/"),
    ):
        answer = client.request(method, path, headers=h)
        assert answer.status_code == 404, (method, path, answer.status_code, answer.headers)
        assert answer.json()["error"]["code"] == "not_found", (method, path, answer.text)
    assert client.get(f"{P}/objects/{object_id}", headers=h).status_code == 200
