"""The HTTP API on real PostgreSQL / SQLite and Redis, through FastAPI's TestClient."""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from hypermedia.accounts import Caller, add_pool_member, balance, revoke_api_key
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.errors import AlreadyRegistered
from hypermedia.ingest import uploads
from hypermedia.ingest.api import create_app
from hypermedia.stack import Stack
from hypermedia.storage.base import original_key
from tests import support
from tests.api_support import add_user, bearer
from tests.metrics_support import parse, sum_by

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8
PDF = b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF\n"
P = "/v1/hypermedia"


@pytest.fixture
def stack(engine, settings) -> Iterator[Stack]:
    opened = Stack.open(settings(), engine=engine, auto_migrate=True)
    yield opened
    opened.close()


@pytest.fixture
def api(stack) -> Iterator[TestClient]:
    with TestClient(create_app(stack, auth_cache_seconds=0)) as client:
        yield client


# -- shared by the cases of a parametrized test -------------------------------------------
# Cases that each make a user of their own, and look only at that user's rows, share one
# database, one stack and one app per engine (module_engine): a clone, a Stack.open and
# a TestClient start per case cost them most of their CPU.

_users = itertools.count(1)


@pytest.fixture(scope="module")
def shared_api(module_engine, module_settings) -> Iterator[TestClient]:
    opened = Stack.open(module_settings(module_engine), engine=module_engine, auto_migrate=True)
    with TestClient(create_app(opened, auth_cache_seconds=0)) as client:
        yield client
    opened.close()


@pytest.fixture
def own_alice(shared_api):
    """The case's own user on the shared stack (a name of its own: "alice" is taken)."""
    return add_user(shared_api.app.state.stack, f"alice-{next(_users)}", credits=10)


@pytest.fixture
def alice(stack):
    return add_user(stack, "alice", credits=10)


@pytest.fixture
def bob(stack):
    return add_user(stack, "bob", credits=10)


def upload(api, user, data: bytes = PNG, filename: str = "cat.png", **params) -> Any:
    response = api.put(
        f"{P}/objects",
        params={"filename": filename, **params},
        content=data,
        headers={**bearer(user), "Content-Type": "image/png"},
    )
    assert response.status_code == 201, response.text
    return response.json()


def submit(api, user, object_id: str, operations=("thumbnail",), **extra):
    body = {"object_id": object_id, "operations": list(operations), **extra}
    return api.post(f"{P}/process", json=body, headers=bearer(user))


def count(stack, table, user=None) -> int:
    """Rows of ``table``; ``user``'s only when given (jobs, submissions: theirs; objects:
    they own): on a shared stack (``shared_api``) the other cases' rows are there too."""
    query = select(func.count()).select_from(table)
    if user is not None:
        owner = table.c.owner_id if table is t.objects else table.c.user_id
        query = query.where(owner == user.user_id)
    with transaction(stack.engine) as conn:
        return int(conn.execute(query).scalar_one())


def job_status(stack, job_id: str) -> str:
    with transaction(stack.engine) as conn:
        return str(conn.execute(select(t.jobs.c.status).where(t.jobs.c.job_id == job_id)).scalar())


def reserved(stack, user) -> int:
    with transaction(stack.engine) as conn:
        return balance(conn, user.user_id).reserved_millicredits


def assert_error(response, status: int, code: str) -> Any:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert set(body["error"]) <= {"code", "message", "details"}
    return body["error"]


# -- process ------------------------------------------------------------------------------


def test_process_creates_queued_jobs_in_the_record_and_in_redis(api, stack, alice):
    obj = upload(api, alice)
    response = submit(api, alice, obj["object_id"], ["thumbnail", "resize"], priority=5)
    assert response.status_code == 202, response.text
    body = response.json()
    assert body["replayed"] is False
    assert len(body["job_ids"]) == 2
    assert [j["job_id"] for j in body["jobs"]] == body["job_ids"]
    assert {j["operation"] for j in body["jobs"]} == {"thumbnail", "resize"}
    assert all(j["queue"] == "images" and j["priority"] == 5 for j in body["jobs"])
    assert body["estimated_credits"] == pytest.approx(
        sum(j["estimated_credits"] for j in body["jobs"])
    )
    assert body["estimated_credits"] > 0
    for job_id in body["job_ids"]:
        assert job_status(stack, job_id) == "queued"
    assert set(stack.queue.ready_ids("images")) == set(body["job_ids"])
    assert reserved(stack, alice) == round(body["estimated_credits"] * 1000)

    job = api.get(f"{P}/jobs/{body['job_ids'][0]}", headers=bearer(alice)).json()
    assert job["status"] == "queued"
    assert job["attempt_count"] == 0 and job["attempts"] == [] and job["outputs"] == []
    assert job["estimated_credits"] == body["jobs"][0]["estimated_credits"]
    assert job["actual_credits"] is None
    assert job["created_at"].endswith("Z") and "T" in job["created_at"]


def test_process_without_enough_credits_creates_nothing(api, stack):
    poor = add_user(stack, "poor", credits=0.05)
    obj = upload(api, poor)
    before = reserved(stack, poor)
    error = assert_error(submit(api, poor, obj["object_id"]), 402, "insufficient_credits")
    assert error["details"]["available_credits"] == 0.05
    assert count(stack, t.submissions) == 0
    assert count(stack, t.jobs) == 0
    for queue in stack.queue.queues:
        counts = stack.queue.counts(queue)
        assert (counts.ready, counts.leased, counts.delayed) == (0, 0, 0)
    assert reserved(stack, poor) == before


def test_process_rejects_bad_input(api, alice):
    obj = upload(api, alice)
    assert_error(submit(api, alice, obj["object_id"], ["no_such_op"]), 422, "unknown_operation")
    error = assert_error(submit(api, alice, obj["object_id"], []), 422, "invalid_request")
    assert "body.operations" in error["message"]
    error = assert_error(submit(api, alice, obj["object_id"], priority=11), 422, "invalid_request")
    assert "body.priority" in error["message"]
    error = assert_error(submit(api, alice, obj["object_id"], colour="red"), 422, "invalid_request")
    assert "body.colour" in error["message"]
    assert error["details"]["errors"][0]["path"] == "body.colour"
    response = api.post(
        f"{P}/process",
        content=b"{not json",
        headers={**bearer(alice), "Content-Type": "application/json"},
    )
    assert_error(response, 422, "invalid_request")
    bad_params = submit(api, alice, obj["object_id"], params={"resize": {"width": 3}})
    assert_error(bad_params, 400, "invalid_request")


@pytest.mark.parametrize(
    "content_type", [None, "application/x-www-form-urlencoded", "text/plain", "text/json"]
)
def test_a_json_body_sent_as_another_type_is_415_saying_which_type_to_send(
    shared_api, own_alice, content_type
):
    """`curl -d '{...}'` sends application/x-www-form-urlencoded: valid JSON under another
    type was 422 "body: Input should be a valid dictionary or object to extract fields
    from", which says nothing of the header a person has to change.

    The cases share a stack (``shared_api``): each counts its own user's jobs."""
    api, alice = shared_api, own_alice
    obj = upload(api, alice)
    body = f'{{"object_id": "{obj["object_id"]}", "operations": ["thumbnail"]}}'.encode()
    headers = (
        bearer(alice) if content_type is None else {**bearer(alice), "Content-Type": content_type}
    )
    error = assert_error(
        api.post(f"{P}/process", content=body, headers=headers), 415, "unsupported_media_type"
    )
    assert "Content-Type: application/json" in error["message"]
    if content_type is not None:
        assert content_type in error["message"]
    assert count(stack=api.app.state.stack, table=t.jobs, user=alice) == 0
    # The same body as JSON is taken; so is a JSON type with parameters.
    headers = {**bearer(alice), "Content-Type": "application/json; charset=utf-8"}
    assert api.post(f"{P}/process", content=body, headers=headers).status_code == 202
    # A JSON body of the wrong shape is still the schema's 422.
    wrong = api.post(f"{P}/process", json=[1, 2], headers=bearer(alice))
    assert_error(wrong, 422, "invalid_request")


def test_a_body_that_is_not_json_says_where_and_why(api, alice):
    response = api.post(
        f"{P}/process",
        content=b'{"object_id": "x", operations: []}',
        headers={**bearer(alice), "Content-Type": "application/json"},
    )
    error = assert_error(response, 422, "invalid_request")
    # json's own words and the position: "JSON decode error" alone said neither.
    assert "Expecting property name enclosed in double quotes" in error["message"]
    assert "character 19" in error["message"]


@pytest.mark.parametrize(
    ("operation", "params", "named"),
    [
        ("thumbnail", {"width": 10**40}, "width"),
        ("resize", {"width": 100, "height": 100, "format": "bmp"}, "format"),
        ("compress", {"quality": 0}, "quality"),
        ("convert", {"format": "png", "colour": "red"}, "colour"),
        ("pdf_preview", {"page": 0}, "page"),
        ("transcode_video", {"crf": 99}, "crf"),
        ("transcode_audio", {"codec": "flac"}, "codec"),
        ("docx_to_pdf", {"pages": 3}, "pages"),
        ("extract_text", {"shout": True}, "shout"),
    ],
)
def test_parameters_a_step_would_refuse_are_refused_at_submit(
    shared_api, own_alice, operation, params, named
):
    """What the worker's step would refuse of its parameters is a 422 before a job
    exists (each step registers its parser as its check), never a job that fails.

    The cases share a stack (``shared_api``): each lists its own user's jobs."""
    api, alice = shared_api, own_alice
    obj = upload(api, alice)
    response = submit(api, alice, obj["object_id"], [operation], params={operation: params})
    error = assert_error(response, 422, "invalid_params")
    assert named in error["message"], error
    assert api.get(f"{P}/jobs", headers=bearer(alice)).json()["jobs"] == []


def test_a_check_the_head_cannot_make_does_not_refuse_the_parameters(api, alice, monkeypatch):
    """transcode_audio's check asks FFmpeg which codecs it has. On a head without FFmpeg
    (the media workers are elsewhere: a burst node's image has it) a codec the step
    takes is no invalid parameter: the submit is accepted, and the worker's step, which
    has FFmpeg, decides. Only what the check finds wrong is a 422."""
    import pipelines.media
    from pipelines.registry import PipelineError
    from tests.error_inputs import flac_declaring

    def missing(name: str) -> str:
        raise PipelineError("tool_unavailable", f"{name} is not installed", retryable=True)

    monkeypatch.setattr(pipelines.media, "_tool", missing)
    pipelines.media.ffmpeg_encoders.cache_clear()
    try:
        obj = upload(api, alice, flac_declaring(10), "sound.flac")
        params = {"transcode_audio": {"codec": "opus", "bitrate": "96k"}}
        response = submit(api, alice, obj["object_id"], ["transcode_audio"], params=params)
        assert response.status_code == 202, response.text
        wrong = {"transcode_audio": {"codec": "opus", "bitrate": "lots"}}
        refused = submit(api, alice, obj["object_id"], ["transcode_audio"], params=wrong)
        assert_error(refused, 422, "invalid_params")
    finally:
        pipelines.media.ffmpeg_encoders.cache_clear()


# -- other users' ids ---------------------------------------------------------------------


def test_other_users_jobs_and_objects_answer_404(api, stack, alice, bob):
    obj = upload(api, alice)
    job_id = submit(api, alice, obj["object_id"]).json()["job_ids"][0]

    assert_error(api.get(f"{P}/jobs/{job_id}", headers=bearer(bob)), 404, "not_found")
    assert_error(api.post(f"{P}/jobs/{job_id}/cancel", headers=bearer(bob)), 404, "not_found")
    assert_error(api.get(f"{P}/objects/{obj['object_id']}", headers=bearer(bob)), 404, "not_found")
    assert_error(submit(api, bob, obj["object_id"]), 404, "not_found")
    response = api.put(
        f"{P}/objects",
        params={"filename": "x", "pool_id": obj["pool_id"]},
        content=b"x",
        headers=bearer(bob),
    )
    assert_error(response, 404, "not_found")
    # The same answers as for ids that do not exist at all.
    assert_error(api.get(f"{P}/jobs/{'0' * 32}", headers=bearer(bob)), 404, "not_found")
    assert_error(api.get(f"{P}/objects/{'0' * 32}", headers=bearer(bob)), 404, "not_found")

    assert job_status(stack, job_id) == "queued"
    assert count(stack, t.jobs) == 1
    assert reserved(stack, bob) == 0


# -- cancel ---------------------------------------------------------------------------------


def test_cancel_a_queued_job(api, stack, alice):
    obj = upload(api, alice)
    job_id = submit(api, alice, obj["object_id"]).json()["job_ids"][0]
    assert reserved(stack, alice) > 0

    response = api.post(f"{P}/jobs/{job_id}/cancel", headers=bearer(alice))
    assert response.status_code == 200, response.text
    assert response.json() == {"job_id": job_id, "status": "cancelled", "cancel_requested": False}
    assert job_status(stack, job_id) == "cancelled"
    assert stack.queue.members("images") == {}
    assert reserved(stack, alice) == 0
    # Cancelling again is harmless.
    again = api.post(f"{P}/jobs/{job_id}/cancel", headers=bearer(alice))
    assert again.status_code == 200
    assert again.json()["status"] == "cancelled"


def test_cancel_a_processing_job_is_a_request_the_worker_honours(api, stack, alice):
    obj = upload(api, alice)
    job_id = submit(api, alice, obj["object_id"]).json()["job_ids"][0]
    [claimed] = stack.dispatcher.claim("images", "worker-1")
    assert claimed.job_id == job_id
    assert stack.dispatcher.start(claimed, "worker-1")

    response = api.post(f"{P}/jobs/{job_id}/cancel", headers=bearer(alice))
    assert response.status_code == 202, response.text
    assert response.json() == {"job_id": job_id, "status": "processing", "cancel_requested": True}
    job = api.get(f"{P}/jobs/{job_id}", headers=bearer(alice)).json()
    assert job["status"] == "processing"
    assert job["cancel_requested"] is True

    assert stack.dispatcher.cancel_requested(claimed)
    assert stack.dispatcher.honour_cancel(claimed, "worker-1")
    job = api.get(f"{P}/jobs/{job_id}", headers=bearer(alice)).json()
    assert job["status"] == "cancelled"
    assert job["attempt_count"] == 1
    assert stack.queue.members("images") == {}
    assert reserved(stack, alice) == 0


def test_cancel_a_finished_job_conflicts(api, stack, alice):
    obj = upload(api, alice)
    job_id = submit(api, alice, obj["object_id"]).json()["job_ids"][0]
    [claimed] = stack.dispatcher.claim("images", "worker-1")
    assert stack.dispatcher.start(claimed, "worker-1")
    assert stack.dispatcher.complete(claimed, "worker-1", actual_millicredits=50)

    assert_error(
        api.post(f"{P}/jobs/{job_id}/cancel", headers=bearer(alice)), 409, "illegal_transition"
    )
    job = api.get(f"{P}/jobs/{job_id}", headers=bearer(alice)).json()
    assert job["status"] == "completed"
    assert job["actual_credits"] == 0.05
    assert [a["status"] for a in job["attempts"]] == ["completed"]
    assert job["completed_at"] is not None


# -- idempotency ------------------------------------------------------------------------------


def test_idempotency_key_replays_the_first_submit(api, stack, alice):
    obj = upload(api, alice)
    headers = {**bearer(alice), "Idempotency-Key": "order-42"}
    body = {"object_id": obj["object_id"], "operations": ["thumbnail", "resize"]}

    first = api.post(f"{P}/process", json=body, headers=headers)
    assert first.status_code == 202
    held = reserved(stack, alice)
    second = api.post(f"{P}/process", json=body, headers=headers)
    assert second.status_code == 202
    assert second.json()["replayed"] is True
    assert second.json()["job_ids"] == first.json()["job_ids"]
    assert second.json()["submission_id"] == first.json()["submission_id"]
    # The key may also come in the body.
    in_body = submit(
        api, alice, obj["object_id"], ["thumbnail", "resize"], idempotency_key="order-42"
    )
    assert in_body.json()["job_ids"] == first.json()["job_ids"]
    assert reserved(stack, alice) == held
    assert count(stack, t.jobs) == 2

    other = api.post(f"{P}/process", json={**body, "operations": ["thumbnail"]}, headers=headers)
    assert_error(other, 409, "idempotency_key_reused")
    mismatch = api.post(f"{P}/process", json={**body, "idempotency_key": "other"}, headers=headers)
    assert_error(mismatch, 400, "invalid_request")
    assert count(stack, t.jobs) == 2
    assert reserved(stack, alice) == held


# -- objects ---------------------------------------------------------------------------------


def test_upload_round_trip(api, stack, alice):
    obj = upload(api, alice, PNG, "my cat.png")
    assert obj["pool_id"] == alice.pool_id
    assert obj["size_bytes"] == len(PNG)
    assert obj["sha256"] == hashlib.sha256(PNG).hexdigest()
    assert obj["filename"] == "my cat.png"
    assert obj["content_type"] == "image/png"
    key = original_key(alice.pool_id, obj["object_id"])
    assert b"".join(stack.storage.read(key)) == PNG

    fetched = api.get(f"{P}/objects/{obj['object_id']}", headers=bearer(alice))
    assert fetched.status_code == 200
    assert fetched.json() == obj


def test_streamed_upload_in_many_chunks(api, stack, alice):
    chunks = [bytes([i]) * 10_000 for i in range(20)]
    response = api.put(
        f"{P}/objects", params={"filename": "big.bin"}, content=iter(chunks), headers=bearer(alice)
    )
    assert response.status_code == 201, response.text
    data = b"".join(chunks)
    assert response.json()["sha256"] == hashlib.sha256(data).hexdigest()
    key = original_key(alice.pool_id, response.json()["object_id"])
    assert b"".join(stack.storage.read(key)) == data


@pytest.mark.parametrize("streamed", [False, True], ids=["content-length", "chunked"])
def test_oversize_upload_is_refused_and_nothing_is_kept(engine, settings, streamed):
    stack = Stack.open(settings(max_upload_bytes=1000), engine=engine, auto_migrate=True)
    try:
        user = add_user(stack, "alice")
        data = b"x" * 1001
        content = iter([data[:600], data[600:]]) if streamed else data
        with TestClient(create_app(stack)) as api:
            response = api.put(
                f"{P}/objects", params={"filename": "big"}, content=content, headers=bearer(user)
            )
            error = assert_error(response, 413, "input_too_large")
            assert error["details"] == {"max_bytes": 1000}
            exact = api.put(
                f"{P}/objects", params={"filename": "ok"}, content=data[:1000], headers=bearer(user)
            )
            assert exact.status_code == 201
        assert count(stack, t.objects) == 1
        stored = [p for p in stack.settings.storage_dir.rglob("*") if p.is_file()]
        assert len(stored) == 1  # only the upload within the limit
        assert stored[0].stat().st_size == 1000
    finally:
        stack.close()


def test_register_a_file_the_web_tier_stored(api, stack, alice, bob):
    key = original_key(alice.pool_id, "web-tier-0001")
    blob = stack.storage.put(key, [PNG])
    body = {
        "storage_key": key,
        "filename": "cat.png",
        "size_bytes": len(PNG),
        "sha256": blob.sha256,
    }

    response = api.post(f"{P}/objects/register", json=body, headers=bearer(alice))
    assert response.status_code == 201, response.text
    obj = response.json()
    assert obj["pool_id"] == alice.pool_id and obj["sha256"] == blob.sha256
    assert submit(api, alice, obj["object_id"]).status_code == 202

    again = api.post(f"{P}/objects/register", json=body, headers=bearer(alice))
    assert again.status_code == 201, again.text  # a retry: the first object (below)
    assert again.json() == {**obj, "replayed": True}
    missing = {**body, "storage_key": original_key(alice.pool_id, "nothing-here")}
    assert_error(
        api.post(f"{P}/objects/register", json=missing, headers=bearer(alice)),
        400,
        "invalid_request",
    )
    wrong_size = {**body, "storage_key": original_key(alice.pool_id, "web-tier-0004")}
    stack.storage.put(wrong_size["storage_key"], [PNG])
    wrong_size["size_bytes"] = 1
    assert_error(
        api.post(f"{P}/objects/register", json=wrong_size, headers=bearer(alice)),
        400,
        "invalid_request",
    )
    bad_key = {**body, "storage_key": "../etc/passwd"}
    assert_error(
        api.post(f"{P}/objects/register", json=bad_key, headers=bearer(alice)),
        400,
        "invalid_request",
    )
    # Bob may not register a file in alice's pool, nor claim it for his own.
    theirs = {**body, "storage_key": original_key(alice.pool_id, "web-tier-0002")}
    stack.storage.put(theirs["storage_key"], [PNG])
    assert_error(
        api.post(f"{P}/objects/register", json=theirs, headers=bearer(bob)), 400, "invalid_request"
    )
    as_pool = {**theirs, "pool_id": alice.pool_id}
    assert_error(
        api.post(f"{P}/objects/register", json=as_pool, headers=bearer(bob)), 404, "not_found"
    )
    assert count(stack, t.objects) == 1


def stored_bytes(stack, user) -> int:
    with transaction(stack.engine) as conn:
        used = conn.execute(select(t.users.c.stored_bytes).where(t.users.c.user_id == user.user_id))
        return int(used.scalar_one())


def test_registering_a_key_again_is_the_first_object_or_already_registered(api, stack, alice, bob):
    """The storage key is a registration's idempotency key: its owner registering it
    again as the same file (name, size, sha256 as first recorded) gets the first object,
    replayed, counted once; another file under the key, an object deleted since, or
    another member of the pool gets 409 already_registered, the object named only to its
    owner."""
    with transaction(stack.engine) as conn:
        add_pool_member(conn, alice.pool_id, bob.user_id)
    key = original_key(alice.pool_id, "web-tier-0001")
    blob = stack.storage.put(key, [PNG])
    body = {"storage_key": key, "filename": "cat.png", "size_bytes": len(PNG)}

    def register(user, **changes: Any) -> Any:
        return api.post(f"{P}/objects/register", json={**body, **changes}, headers=bearer(user))

    first = register(alice, sha256=blob.sha256)
    assert first.status_code == 201, first.text
    obj = first.json()
    assert not obj["replayed"]
    for _ in range(2):
        retried = register(alice, sha256=blob.sha256, pool_id=alice.pool_id)
        assert retried.status_code == 201, retried.text
        assert retried.json() == {**obj, "replayed": True}
    assert count(stack, t.objects) == 1
    assert stored_bytes(stack, alice) == len(PNG)  # counted once

    for changes, said in (
        ({"sha256": "0" * 64}, f"recorded with sha256 {blob.sha256}, not {'0' * 64}"),
        ({}, f"recorded with sha256 {blob.sha256}, not none"),
        ({"sha256": blob.sha256, "filename": "dog.png"}, "named 'cat.png', not 'dog.png'"),
    ):
        refused = assert_error(register(alice, **changes), 409, "already_registered")
        assert refused["details"] == {"storage_key": key, "object_id": obj["object_id"]}
        assert obj["object_id"] in refused["message"] and said in refused["message"]
    # Another file put under the key since: its size (checked against the record first).
    stack.storage.put(key, [PNG + b"more"])
    grown = assert_error(register(alice, size_bytes=len(PNG) + 4), 409, "already_registered")
    assert f"of {len(PNG)} bytes, not {len(PNG) + 4}" in grown["message"]
    stack.storage.put(key, [PNG])

    # Bob, a member of the pool, is told the key is taken, never by which object.
    theirs = assert_error(
        register(bob, sha256=blob.sha256, pool_id=alice.pool_id), 409, "already_registered"
    )
    assert theirs["details"] == {"storage_key": key}
    assert obj["object_id"] not in theirs["message"] and "another user" in theirs["message"]

    assert api.delete(f"{P}/objects/{obj['object_id']}", headers=bearer(alice)).status_code == 200
    stack.storage.put(key, [PNG])  # the web tier stores the file again under the key
    gone = assert_error(register(alice, sha256=blob.sha256), 409, "already_registered")
    assert "deleted since" in gone["message"]
    assert count(stack, t.objects) == 1
    assert stored_bytes(stack, alice) == 0


def test_a_registration_without_a_sha256_is_replayed_without_one(api, stack, alice):
    key = original_key(alice.pool_id, "web-tier-0003")
    stack.storage.put(key, [PNG])
    body = {"storage_key": key, "filename": "cat.png", "size_bytes": len(PNG)}
    first = api.post(f"{P}/objects/register", json=body, headers=bearer(alice))
    assert first.status_code == 201, first.text
    again = api.post(f"{P}/objects/register", json=body, headers=bearer(alice))
    assert again.status_code == 201, again.text
    assert again.json() == {**first.json(), "replayed": True} and again.json()["sha256"] is None
    assert count(stack, t.objects) == 1 and stored_bytes(stack, alice) == len(PNG)


def test_a_registration_that_loses_the_race_for_its_key_answers_as_the_winners_retry(
    api, stack, alice, bob
):
    """Two registrations of one key at once both find it free and inspect it; the unique
    index lets one row in, and the other answers as a retry would: the first object to
    its owner, already_registered to anyone else. (Here the second starts after the
    first ended, skipping the route's look-up, as a concurrent one does.)"""
    with transaction(stack.engine) as conn:
        add_pool_member(conn, alice.pool_id, bob.user_id)
    key = original_key(alice.pool_id, "web-tier-0005")
    stack.storage.put(key, [PNG])
    body = {"storage_key": key, "filename": "cat.png", "size_bytes": len(PNG)}
    first = api.post(f"{P}/objects/register", json=body, headers=bearer(alice))
    assert first.status_code == 201, first.text

    def racing(user_id: str) -> uploads.Uploaded:
        registration = uploads.Registration.of(key, "cat.png", len(PNG), alice.pool_id, None)
        return uploads.register_stored(
            stack.engine,
            stack.storage,
            uploads.inspect_stored,
            Caller(user_id),
            registration,
            object_id="0" * 32,
            now=stack.clock.now(),
            quota_bytes=10**9,
        )

    late = racing(alice.user_id)
    assert late.replayed and late.info.object_id == first.json()["object_id"]
    with pytest.raises(AlreadyRegistered) as refused:
        racing(bob.user_id)
    assert refused.value.details == {"storage_key": key}
    assert count(stack, t.objects) == 1 and stored_bytes(stack, alice) == len(PNG)


# -- authentication, operators, credits, health ------------------------------------------------


def test_requests_without_a_valid_key_are_401(api, stack, alice):
    routes = [
        ("post", f"{P}/process"),
        ("get", f"{P}/jobs/x"),
        ("post", f"{P}/jobs/x/cancel"),
        ("put", f"{P}/objects?filename=a"),
        ("post", f"{P}/objects/register"),
        ("get", f"{P}/objects/x"),
        ("get", f"{P}/queues"),
        ("get", f"{P}/credits"),
    ]
    for method, path in routes:
        for headers in (
            {},
            {"Authorization": "Bearer hm_000000000000_nope"},
            {"Authorization": "Bearer garbage"},
            {"Authorization": f"Basic {alice.api_key}"},
        ):
            response = api.request(method, path, headers=headers)
            assert_error(response, 401, "unauthenticated")
            assert response.headers["www-authenticate"] == "Bearer"
    with transaction(stack.engine) as conn:
        assert revoke_api_key(conn, alice.api_key.split("_")[1], stack.clock.now())
    assert_error(api.get(f"{P}/credits", headers=bearer(alice)), 401, "unauthenticated")


def test_authentications_are_cached_for_the_ttl(stack, alice):
    with TestClient(create_app(stack, auth_cache_seconds=30)) as api:
        assert api.get(f"{P}/credits", headers=bearer(alice)).status_code == 200
        with transaction(stack.engine) as conn:
            assert revoke_api_key(conn, alice.api_key.split("_")[1], stack.clock.now())
        # Revocation takes effect within the TTL, not at once.
        assert api.get(f"{P}/credits", headers=bearer(alice)).status_code == 200
        api.app.state.authenticator.forget()  # type: ignore[attr-defined]
        assert_error(api.get(f"{P}/credits", headers=bearer(alice)), 401, "unauthenticated")


def test_queues_are_for_operators(api, stack, alice):
    operator = add_user(stack, "ops", operator=True)
    assert_error(api.get(f"{P}/queues", headers=bearer(alice)), 403, "forbidden")

    obj = upload(api, alice)
    document = upload(api, alice, PDF, "doc.pdf")
    assert submit(api, alice, obj["object_id"], ["thumbnail"]).status_code == 202
    assert submit(api, alice, document["object_id"], ["pdf_preview"]).status_code == 202
    response = api.get(f"{P}/queues", headers=bearer(operator))
    assert response.status_code == 200, response.text
    queues = {q["queue"]: q for q in response.json()["queues"]}
    assert set(queues) == set(stack.settings.queue_names)
    assert queues["images"]["queued"] == 1
    assert queues["documents"]["queued"] == 1
    assert queues["images"]["in_flight"] == 0 and queues["images"]["retry_wait"] == 0
    assert queues["images"]["oldest_age_seconds"] >= 0
    assert queues["images"]["redis"] == {"ready": 1, "leased": 0, "delayed": 0}
    assert queues["ocr"]["oldest_age_seconds"] is None


def test_metrics_are_for_operators_and_count_what_the_api_did(api, stack, alice):
    assert_error(api.get("/metrics"), 401, "unauthenticated")
    assert_error(api.get("/metrics", headers=bearer(alice)), 403, "forbidden")
    operator = add_user(stack, "ops", operator=True)
    obj = upload(api, alice)
    assert submit(api, alice, obj["object_id"], ["thumbnail"]).status_code == 202
    response = api.get("/metrics", headers=bearer(operator))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = parse(response.text)
    submitted = sum_by(samples, "hypermedia_jobs_submitted_total", ("queue", "operation"))
    assert submitted == {("images", "thumbnail"): 1}
    depth = sum_by(samples, "hypermedia_queue_depth", ("queue", "priority_band"))
    assert depth == {("images", "1-3"): 1}  # thumbnail: default priority 2


def test_credits_show_balance_reserved_available(api, alice):
    assert api.get(f"{P}/credits", headers=bearer(alice)).json() == {
        "balance": 10.0,
        "reserved": 0.0,
        "available": 10.0,
    }
    obj = upload(api, alice)
    estimate = submit(api, alice, obj["object_id"]).json()["estimated_credits"]
    account = api.get(f"{P}/credits", headers=bearer(alice)).json()
    assert account["reserved"] == estimate
    assert account["available"] == pytest.approx(10.0 - estimate)


def test_healthz_needs_no_key(api):
    response = api.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": True, "redis": True, "storage": True}


def test_healthz_reports_redis_down(sqlite_engine, settings, private_redis):
    stack = Stack.open(
        settings(redis_url=private_redis.url), engine=sqlite_engine, auto_migrate=True
    )
    try:
        with TestClient(create_app(stack)) as api:
            private_redis.stop()
            response = api.get("/healthz")
        assert response.status_code == 503
        assert response.json() == {
            "status": "unavailable",
            "database": True,
            "redis": False,
            "storage": True,
        }
    finally:
        stack.close()


def test_healthz_reports_s3_down(sqlite_engine, settings, monkeypatch, tmp_path):
    """The S3 bucket probed (a HEAD of it): 503 ``storage: false`` once the S3 server is
    gone, where it said ``ok`` before."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "hypermedia-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hypermedia-test-secret")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    with support.moto_server() as endpoint:
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
            Bucket="hm-health"
        )
        stack = Stack.open(
            settings(
                storage_backend="s3",
                s3_bucket="hm-health",
                s3_endpoint_url=endpoint,
                s3_region="us-east-1",
                storage_probe_seconds=0,
                # A HEAD of moto's bucket on a loaded machine may take seconds: the
                # probe's own limit is not what this test is about.
                storage_probe_timeout_seconds=60,
            ),
            engine=sqlite_engine,
            auto_migrate=True,
        )
        api = TestClient(create_app(stack))
        response = api.get("/healthz")
        assert response.status_code == 200
        assert response.json() == {"status": "ok", "database": True, "redis": True, "storage": True}
    try:
        response = api.get("/healthz")  # the S3 server stopped
        assert response.status_code == 503  # was 200 ok
        assert response.json() == {
            "status": "unavailable",
            "database": True,
            "redis": True,
            "storage": False,
        }
    finally:
        stack.close()


# -- error shape, OpenAPI -----------------------------------------------------------------------


def test_unknown_routes_and_methods_answer_json_errors(api, alice):
    assert_error(api.get("/v1/hypermedia/nothing", headers=bearer(alice)), 404, "not_found")
    assert_error(api.delete(f"{P}/credits", headers=bearer(alice)), 405, "method_not_allowed")


def test_unexpected_errors_are_500_internal_without_a_trace(stack, alice):
    app = create_app(stack)

    def boom() -> None:
        raise RuntimeError("secret detail /etc/hypermedia")

    app.add_api_route("/boom", boom)
    with TestClient(app) as api:
        response = api.get("/boom")
    error = assert_error(response, 500, "internal")
    assert "secret" not in response.text
    assert "Traceback" not in response.text
    assert error["message"] == "internal server error"


# The OpenAPI document is the app's, whatever its record: the tests that read it read the
# module's PostgreSQL app's (shared_api), generated once.
@pytest.mark.parametrize("module_engine", ["postgresql"], indirect=True)
def test_openapi_document_is_valid_and_complete(shared_api):
    from openapi_spec_validator import validate

    document = shared_api.get("/openapi.json").json()
    validate(document)
    assert document["openapi"].startswith("3.")
    paths = document["paths"]
    expected = {
        f"{P}/process": {"post"},
        f"{P}/jobs/{{job_id}}": {"get"},
        f"{P}/jobs/{{job_id}}/cancel": {"post"},
        f"{P}/objects": {"put"},
        f"{P}/objects/register": {"post"},
        f"{P}/objects/{{object_id}}": {"get"},
        f"{P}/queues": {"get"},
        f"{P}/credits": {"get"},
        "/healthz": {"get"},
    }
    for path, methods in expected.items():
        assert path in paths, path
        assert methods <= set(paths[path]), path
    schemas = document["components"]["schemas"]

    def body_schema(path: str, method: str) -> Any:
        return paths[path][method]["requestBody"]["content"]

    assert body_schema(f"{P}/process", "post")["application/json"]["schema"]["$ref"].endswith(
        "/SubmitRequest"
    )
    assert body_schema(f"{P}/objects/register", "post")["application/json"]["schema"][
        "$ref"
    ].endswith("/RegisterRequest")
    assert "application/octet-stream" in body_schema(f"{P}/objects", "put")
    for name in (
        "SubmitRequest",
        "RegisterRequest",
        "ProcessResponse",
        "JobResponse",
        "ErrorResponse",
    ):
        assert name in schemas
    process = paths[f"{P}/process"]["post"]["responses"]
    assert process["202"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/ProcessResponse"
    )
    for status in ("401", "402", "404", "409", "422"):
        assert process[status]["content"]["application/json"]["schema"]["$ref"].endswith(
            "/ErrorResponse"
        )
    assert "ApiKey" in document["components"]["securitySchemes"]
    assert "security" not in paths["/healthz"]["get"]


@pytest.mark.parametrize("module_engine", ["postgresql"], indirect=True)
def test_openapi_error_answers_have_the_one_shape_the_server_sends(shared_api):
    """Every error a route documents is ErrorResponse (what the handlers answer, a
    request FastAPI cannot validate included: never FastAPI's HTTPValidationError),
    a 429 and a 503 say they come with Retry-After, and the streamed uploads document their 408."""
    document = shared_api.get("/openapi.json").json()
    assert "HTTPValidationError" not in document["components"]["schemas"]
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            for status, response in operation["responses"].items():
                if int(status) < 400 or path == "/healthz":
                    continue
                schema = response["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/ErrorResponse"}, (
                    method,
                    path,
                    status,
                )
                if status in ("429", "503"):
                    assert "Retry-After" in response.get("headers", {}), (method, path)
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            if "application/json" in operation.get("requestBody", {}).get("content", {}):
                # Every JSON body can be too large, or sent under another type.
                assert {"413", "415"} <= set(operation["responses"]), (method, path)
    assert "unsupported_media_type" in document["components"]["schemas"]["ErrorCode"]["enum"]
    for path in (f"{P}/objects", f"{P}/blobs/{{key}}"):
        assert "408" in document["paths"][path]["put"]["responses"], path
    upload = document["paths"][f"{P}/objects"]["put"]
    assert "409" in upload["responses"]
    [key] = [p for p in upload["parameters"] if p["name"] == "Idempotency-Key"]
    assert key["in"] == "header" and not key.get("required")
    assert "idempotency_key_reused" in key["description"]
    assert "idempotency_key_reused" in document["components"]["schemas"]["ErrorCode"]["enum"]
    assert "replayed" in document["components"]["schemas"]["ObjectResponse"]["properties"]
    register = document["paths"][f"{P}/objects/register"]["post"]
    assert "409" in register["responses"] and "already_registered" in register["description"]
    assert "already_registered" in document["components"]["schemas"]["ErrorCode"]["enum"]


@pytest.mark.parametrize("module_engine", ["postgresql"], indirect=True)
def test_openapi_names_every_operation_and_enumerates_operations_and_error_codes(shared_api):
    stack = shared_api.app.state.stack
    document = shared_api.get("/openapi.json").json()
    ids = [
        operation["operationId"]
        for path in document["paths"].values()
        for operation in path.values()
    ]
    assert len(ids) == len(set(ids))
    assert all(re.fullmatch(r"[a-z]+(?:[A-Z][a-z]+)*", i) for i in ids), ids  # set, not derived
    for expected in ("submitJobs", "listJobs", "getJob", "streamJobEvents", "getSubmission"):
        assert expected in ids
    assert document["paths"][f"{P}/jobs"]["get"]["operationId"] == "listJobs"
    assert (
        document["paths"][f"{P}/jobs/{{job_id}}/outputs/{{output_type}}/url"]["get"]["operationId"]
        == "getOutputUrl"
    )
    schemas = document["components"]["schemas"]
    served = sorted(set(stack.catalog.operations()) & set(stack.ingest.implemented()))
    assert schemas["Operation"]["enum"] == served and "thumbnail" in served
    assert schemas["SubmitRequest"]["properties"]["operations"]["items"] == {
        "$ref": "#/components/schemas/Operation"
    }
    codes = schemas["ErrorCode"]["enum"]
    for code in (
        "not_found",
        "invalid_request",
        "callback_not_allowed",
        "internal",
        "rate_limited",
    ):
        assert code in codes
    assert schemas["ErrorBody"]["properties"]["code"]["$ref"] == "#/components/schemas/ErrorCode"


def test_every_keyed_route_documents_the_503_it_answers_while_the_database_is_down(
    private_postgres: support.PrivatePostgres, settings
):
    """The key is checked in the database before anything else: with PostgreSQL down every
    keyed route answers 503 database_unavailable with Retry-After, while the document
    listed a 503 for submitJobs, uploadObject and streamJobEvents only: a generated
    client met a status its route does not know."""
    stack = Stack.open(settings(database_url=private_postgres.url), auto_migrate=True)
    try:
        alice = add_user(stack, "alice")
        with TestClient(create_app(stack, auth_cache_seconds=0)) as api:
            document = api.get("/openapi.json").json()
            private_postgres.stop()
            keyed = [
                (method, path)
                for path, methods in document["paths"].items()
                for method, operation in methods.items()
                if operation.get("security")
            ]
            assert len(keyed) > 15
            values = {"job_id": "0" * 32, "submission_id": "0" * 32, "run_id": "0" * 32}
            for method, path in keyed:
                operation = document["paths"][path][method]
                assert "503" in operation["responses"], (method, path)
                assert "Retry-After" in operation["responses"]["503"]["headers"]
                url = re.sub(r"\{(\w+)\}", lambda m: values.get(m[1], "1"), path)
                response = api.request(method.upper(), url, headers=bearer(alice))
                assert_error(response, 503, "database_unavailable")
                assert response.headers["retry-after"] == "5"
    finally:
        stack.close()
