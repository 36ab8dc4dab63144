"""Storage quota, upload rate and deleting objects (issue 11, item 10), through a real
uvicorn server."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select, update

from hypermedia import tls
from hypermedia.accounts import NewUser, add_pool_member
from hypermedia.db import tables as t
from hypermedia.db.conflicts import CONFLICT_ATTEMPTS
from hypermedia.db.engine import transaction
from hypermedia.errors import NotFound, StorageQuotaExceeded
from hypermedia.ingest.api import create_app
from hypermedia.ingest.auth import Authenticator
from hypermedia.ingest.client import HypermediaClient
from hypermedia.ingest.service import SubmitRequest
from hypermedia.jobs.repository import OutputRecord
from hypermedia.objects import mark_deleted, plan_deletion
from hypermedia.stack import Stack
from hypermedia.storage.base import derived_key, original_key
from tests import support
from tests.api_support import add_user, bearer, running_server

P = "/v1/hypermedia"
QUOTA = 100_000
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10\x00\x00\x00\x10\x08\x02\x00\x00\x00"


def png(size: int) -> bytes:
    return PNG + bytes(size - len(PNG))


@pytest.fixture
def stack(engine, settings) -> Iterator[Stack]:
    opened = Stack.open(
        settings(user_storage_quota_bytes=QUOTA, user_uploads_per_minute=1000),
        engine=engine,
        auto_migrate=True,
    )
    yield opened
    opened.close()


@pytest.fixture
def client(stack) -> Iterator[httpx.Client]:
    with (
        running_server(create_app(stack, auth_cache_seconds=0)) as url,
        httpx.Client(base_url=url, timeout=60, verify=tls.client_context()) as http,
    ):
        yield http


def upload(client: httpx.Client, user, data: bytes | Iterator[bytes], name: str = "a.png"):
    return client.put(f"{P}/objects", params={"filename": name}, content=data, headers=bearer(user))


def stored_files(stack: Stack) -> list[str]:
    root = stack.settings.storage_dir
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def live_objects(stack: Stack) -> int:
    with transaction(stack.engine) as conn:
        return int(
            conn.execute(
                select(func.count()).select_from(t.objects).where(t.objects.c.deleted_at.is_(None))
            ).scalar_one()
        )


def stored_bytes(stack: Stack) -> dict[str, int]:
    """Each user's count of stored bytes (``users.stored_bytes``, what the quota reads),
    after checking it against the sum of their live objects."""
    o = t.objects.c
    with transaction(stack.engine) as conn:
        counted = dict(conn.execute(select(t.users.c.user_id, t.users.c.stored_bytes)).all())
        summed = dict(
            conn.execute(
                select(o.owner_id, func.sum(o.size_bytes))
                .where(o.deleted_at.is_(None))
                .group_by(o.owner_id)
            ).all()
        )
    assert counted == {user: summed.get(user, 0) for user in counted}
    return {user: n for user, n in counted.items() if n}


def test_uploads_stop_at_the_storage_quota_and_a_delete_makes_room(stack, client):
    broke = add_user(stack, "broke", credits=0)  # credits do not bound storage
    first = upload(client, broke, png(40_000))
    second = upload(client, broke, png(40_000))
    assert first.status_code == second.status_code == 201, second.text

    over = upload(client, broke, png(40_000))  # Content-Length past what is left
    assert over.status_code == 413, over.text
    error = over.json()["error"]
    assert error["code"] == "storage_quota_exceeded"
    assert error["details"] == {"quota_bytes": QUOTA, "used_bytes": 80_000}
    assert "DELETE" in error["message"]
    chunked = upload(client, broke, iter([png(15_000), bytes(15_000)]))  # counted as it streams
    assert chunked.status_code == 413, chunked.text
    assert chunked.json()["error"]["code"] == "storage_quota_exceeded"
    assert live_objects(stack) == 2 and len(stored_files(stack)) == 2
    assert stored_bytes(stack) == {broke.user_id: 80_000}

    fits = upload(client, broke, png(20_000))  # exactly the room left
    assert fits.status_code == 201, fits.text
    full = upload(client, broke, png(100))
    assert full.status_code == 413 and full.json()["error"]["details"]["used_bytes"] == QUOTA

    # Another user has a quota of their own.
    assert upload(client, add_user(stack, "other"), png(40_000)).status_code == 201

    deleted = client.delete(f"{P}/objects/{first.json()['object_id']}", headers=bearer(broke))
    assert deleted.status_code == 200, deleted.text
    assert deleted.json() == {
        "object_id": first.json()["object_id"],
        "outputs_deleted": 0,
        "bytes_freed": 40_000,
    }
    assert upload(client, broke, png(40_000)).status_code == 201
    assert stored_bytes(stack)[broke.user_id] == QUOTA

    # The Python client deletes too, and maps the answers to the error tree.
    with HypermediaClient(str(client.base_url), broke.api_key) as typed:
        assert typed.delete(second.json()["object_id"]).bytes_freed == 40_000
        with pytest.raises(NotFound):
            typed.delete(second.json()["object_id"])
        with pytest.raises(StorageQuotaExceeded):
            typed.upload(png(QUOTA), filename="big.png")


def test_the_upload_rate_is_limited_per_user(engine, settings):
    stack = Stack.open(settings(user_uploads_per_minute=2), engine=engine, auto_migrate=True)
    try:
        alice, bob = add_user(stack, "alice"), add_user(stack, "bob")
        with (
            running_server(create_app(stack)) as url,
            httpx.Client(base_url=url, timeout=60, verify=tls.client_context()) as client,
        ):
            assert [upload(client, alice, png(1000)).status_code for _ in range(2)] == [201, 201]
            limited = upload(client, alice, png(1000))
            assert limited.status_code == 429, limited.text
            error = limited.json()["error"]
            assert error["code"] == "rate_limited"
            assert error["details"]["limit_per_minute"] == 2
            assert 1 <= int(limited.headers["Retry-After"]) <= 60
            assert upload(client, bob, png(1000)).status_code == 201
            ops = add_user(stack, "ops", operator=True)  # the platform's own: no rate
            assert [upload(client, ops, png(1000)).status_code for _ in range(3)] == [201] * 3
        assert live_objects(stack) == 6
    finally:
        stack.close()


def test_delete_takes_the_outputs_and_their_blobs_and_only_the_owner_may(stack, client):
    alice, bob, mallory = add_user(stack, "alice"), add_user(stack, "bob"), add_user(stack, "m")
    with transaction(stack.engine) as conn:
        add_pool_member(conn, alice.pool_id, bob.user_id)
    object_id = upload(client, alice, png(5000)).json()["object_id"]
    job = client.post(
        f"{P}/process",
        json={"object_id": object_id, "operations": ["thumbnail"]},
        headers=bearer(bob),  # Bob may use Alice's object: the job and its output are his
    )
    assert job.status_code == 202, job.text
    job_id = job.json()["job_ids"][0]

    busy = client.delete(f"{P}/objects/{object_id}", headers=bearer(alice))
    assert busy.status_code == 409, busy.text
    # Bob's job holds it up, but its id is his: Alice learns that one job of another
    # user's is unfinished (before: its id, in details.job_ids).
    error = busy.json()["error"]
    assert error["details"] == {"object_id": object_id, "job_ids": [], "other_users_jobs": 1}
    assert job_id not in busy.text
    assert "1 job of other users" in error["message"], error
    mine = client.post(
        f"{P}/process",
        json={"object_id": object_id, "operations": ["resize"]},
        headers=bearer(alice),
    ).json()["job_ids"][0]
    busy = client.delete(f"{P}/objects/{object_id}", headers=bearer(alice))
    error = busy.json()["error"]
    assert error["details"] == {"object_id": object_id, "job_ids": [mine], "other_users_jobs": 1}
    assert client.post(f"{P}/jobs/{mine}/cancel", headers=bearer(alice)).status_code == 200

    (claimed,) = stack.dispatcher.claim("images", "w")
    stack.dispatcher.start(claimed, "w")
    key = derived_key(alice.pool_id, object_id, 1, "thumbnail-64.webp")
    blob = stack.storage.put(key, [b"webp bytes"])
    output = OutputRecord("thumbnail-64.webp", key, blob.size_bytes, "image/webp")
    assert stack.dispatcher.complete(claimed, "w", [output])
    assert len(stored_files(stack)) == 2
    assert stored_bytes(stack) == {alice.user_id: 5000, bob.user_id: 10}  # the output: Bob's

    for other in (bob, mallory):  # a pool member may use it, but only its owner deletes
        refused = client.delete(f"{P}/objects/{object_id}", headers=bearer(other))
        assert refused.status_code == 404, refused.text
        assert refused.json()["error"]["code"] == "not_found"
    assert client.delete(f"{P}/objects/{'0' * 32}", headers=bearer(alice)).status_code == 404

    deleted = client.delete(f"{P}/objects/{object_id}", headers=bearer(alice))
    assert deleted.status_code == 200, deleted.text
    assert deleted.json() == {"object_id": object_id, "outputs_deleted": 1, "bytes_freed": 5010}
    assert stored_files(stack) == []
    assert not stack.storage.exists(original_key(alice.pool_id, object_id))
    assert live_objects(stack) == 0
    assert stored_bytes(stack) == {}

    assert client.get(f"{P}/objects/{object_id}", headers=bearer(alice)).status_code == 404
    again = client.delete(f"{P}/objects/{object_id}", headers=bearer(alice))
    assert again.status_code == 404
    resubmit = client.post(
        f"{P}/process",
        json={"object_id": object_id, "operations": ["thumbnail"]},
        headers=bearer(alice),
    )
    assert resubmit.status_code == 404
    # The job's history stays; its output is gone with the object.
    view = client.get(f"{P}/jobs/{job_id}", headers=bearer(bob)).json()
    assert view["status"] == "completed" and view["outputs"] == []


def test_a_rerun_that_overwrites_its_output_counts_the_new_size(stack, client):
    alice = add_user(stack, "alice")
    object_id = upload(client, alice, png(5000)).json()["object_id"]
    key = derived_key(alice.pool_id, object_id, 1, "thumbnail-64.webp")
    for size in (10, 30, 4):  # each run writes the same key: one object row, resized
        job = client.post(
            f"{P}/process",
            json={"object_id": object_id, "operations": ["thumbnail"]},
            headers=bearer(alice),
        )
        assert job.status_code == 202, job.text
        (claimed,) = stack.dispatcher.claim("images", "w")
        stack.dispatcher.start(claimed, "w")
        blob = stack.storage.put(key, [bytes(size)])
        output = OutputRecord("thumbnail-64.webp", key, blob.size_bytes, "image/webp")
        assert stack.dispatcher.complete(claimed, "w", [output])
        assert stored_bytes(stack) == {alice.user_id: 5000 + size}
    assert live_objects(stack) == 2
    deleted = client.delete(f"{P}/objects/{object_id}", headers=bearer(alice))
    assert deleted.json()["bytes_freed"] == 5004
    assert stored_bytes(stack) == {}


def run_thumbnail(stack: Stack, client: httpx.Client, user, object_id: str, size: int) -> str:
    """Submit a thumbnail of ``object_id`` as ``user`` and complete it (the worker's part
    through the dispatcher) with an output of ``size`` bytes; the job's id."""
    job = client.post(
        f"{P}/process",
        json={"object_id": object_id, "operations": ["thumbnail"]},
        headers=bearer(user),
    )
    assert job.status_code == 202, job.text
    (claimed,) = stack.dispatcher.claim("images", "w")
    stack.dispatcher.start(claimed, "w")
    with transaction(stack.engine) as conn:
        pool_id = conn.execute(
            select(t.objects.c.pool_id).where(t.objects.c.object_id == object_id)
        ).scalar_one()
    key = derived_key(pool_id, object_id, 1, "thumbnail-64.webp")
    blob = stack.storage.put(key, [bytes(size)])
    output = OutputRecord("thumbnail-64.webp", key, blob.size_bytes, "image/webp")
    assert stack.dispatcher.complete(claimed, "w", [output])
    return claimed.job_id


def test_a_rerun_after_its_output_was_deleted_counts_the_output_again(stack, client):
    # Before: the re-run wrote its output through the deleted object row, so its bytes
    # counted against no quota and no later delete took them: delete the output, run
    # again, and the user stored without limit, downloadable, for ever.
    alice = add_user(stack, "alice")
    object_id = upload(client, alice, png(5000)).json()["object_id"]
    first = run_thumbnail(stack, client, alice, object_id, 10)
    (output,) = client.get(f"{P}/jobs/{first}", headers=bearer(alice)).json()["outputs"]
    deleted = client.delete(f"{P}/objects/{output['object_id']}", headers=bearer(alice))
    assert deleted.status_code == 200, deleted.text
    assert stored_bytes(stack) == {alice.user_id: 5000}
    assert len(stored_files(stack)) == 1

    second = run_thumbnail(stack, client, alice, object_id, 3000)
    (again,) = client.get(f"{P}/jobs/{second}", headers=bearer(alice)).json()["outputs"]
    assert again["size_bytes"] == 3000
    assert stored_bytes(stack) == {alice.user_id: 8000}
    revived = client.get(f"{P}/objects/{again['object_id']}", headers=bearer(alice))
    assert revived.status_code == 200, revived.text
    assert revived.json()["size_bytes"] == 3000

    deleted = client.delete(f"{P}/objects/{object_id}", headers=bearer(alice))
    assert deleted.json() == {"object_id": object_id, "outputs_deleted": 1, "bytes_freed": 8000}
    assert stored_files(stack) == []
    assert stored_bytes(stack) == {}


def _bob_in_alices_pool(stack, client) -> tuple[NewUser, NewUser, str]:
    """Alice, Bob (a member of her pool) and a 5,000-byte image of hers."""
    alice, bob = add_user(stack, "alice"), add_user(stack, "bob")
    with transaction(stack.engine) as conn:
        add_pool_member(conn, alice.pool_id, bob.user_id)
    return alice, bob, upload(client, alice, png(5000)).json()["object_id"]


def test_a_pool_members_rerun_after_another_deleted_the_output_is_the_members(stack, client):
    # The output row Bob's job made is Bob's; once he deleted it, Alice's re-run makes
    # the output hers: her quota counts it and she may delete it.
    alice, bob, object_id = _bob_in_alices_pool(stack, client)
    bobs = run_thumbnail(stack, client, bob, object_id, 10)
    (output,) = client.get(f"{P}/jobs/{bobs}", headers=bearer(bob)).json()["outputs"]
    assert (
        client.delete(f"{P}/objects/{output['object_id']}", headers=bearer(bob)).status_code == 200
    )

    run_thumbnail(stack, client, alice, object_id, 20)
    assert stored_bytes(stack) == {alice.user_id: 5020}
    assert client.get(f"{P}/objects/{output['object_id']}", headers=bearer(bob)).status_code == 200
    refused = client.delete(f"{P}/objects/{output['object_id']}", headers=bearer(bob))
    assert refused.status_code == 404, refused.text
    deleted = client.delete(f"{P}/objects/{output['object_id']}", headers=bearer(alice))
    assert deleted.json()["bytes_freed"] == 20
    assert stored_bytes(stack) == {alice.user_id: 5000}
    assert len(stored_files(stack)) == 1


def test_a_members_delete_of_an_output_another_members_job_shares_leaves_it_theirs(stack, client):
    # Before: Bob's job made the output first, so its row was his; Alice's job of the
    # same thumbnail wrote the same key through that row. Bob's delete took the blob and
    # Alice's job's output row with it: a pool member destroyed another user's output.
    alice, bob, object_id = _bob_in_alices_pool(stack, client)
    bobs = run_thumbnail(stack, client, bob, object_id, 10)
    alices = run_thumbnail(stack, client, alice, object_id, 10)
    (output,) = client.get(f"{P}/jobs/{alices}", headers=bearer(alice)).json()["outputs"]
    assert stored_bytes(stack) == {alice.user_id: 5000, bob.user_id: 10}

    deleted = client.delete(f"{P}/objects/{output['object_id']}", headers=bearer(bob))
    assert deleted.status_code == 200, deleted.text
    # Gone from Bob's jobs and his quota; Alice's output stays, hers now.
    assert deleted.json() == {
        "object_id": output["object_id"],
        "outputs_deleted": 0,
        "bytes_freed": 10,
    }
    assert client.get(f"{P}/jobs/{bobs}", headers=bearer(bob)).json()["outputs"] == []
    assert client.get(f"{P}/jobs/{alices}", headers=bearer(alice)).json()["outputs"] == [output]
    url = client.get(
        f"{P}/jobs/{alices}/outputs/{output['output_type']}/url", headers=bearer(alice)
    )
    assert url.status_code == 200, url.text
    assert stack.storage.exists(output["storage_key"])
    assert stored_bytes(stack) == {alice.user_id: 5010}
    refused = client.delete(f"{P}/objects/{output['object_id']}", headers=bearer(bob))
    assert refused.status_code == 404, refused.text

    deleted = client.delete(f"{P}/objects/{output['object_id']}", headers=bearer(alice))
    assert deleted.json() == {
        "object_id": output["object_id"],
        "outputs_deleted": 0,
        "bytes_freed": 10,
    }
    assert not stack.storage.exists(output["storage_key"])
    assert client.get(f"{P}/jobs/{alices}", headers=bearer(alice)).json()["outputs"] == []
    assert stored_bytes(stack) == {alice.user_id: 5000}


def test_delete_takes_every_output_derived_from_the_object_and_their_blobs(stack, client):
    """Deleting an upload deletes what was derived from it, however far: an output of
    a job on one of its outputs too (a thumbnail of its thumbnail, a pool member's
    included). Before, only its direct outputs: a thumbnail of its thumbnail stayed,
    live, its blob stored, counted in the quota. Jobs unfinished anywhere below it
    hold the delete up as on the object (409: the caller's by id, others' counted)."""
    alice, bob, upload_id = _bob_in_alices_pool(stack, client)
    thumbnail = _output_of(stack, client, alice, upload_id)
    of_thumbnail = _output_of(stack, client, bob, thumbnail)  # Bob's, from Alice's object
    third = _output_of(stack, client, alice, of_thumbnail)
    assert stored_bytes(stack) == {alice.user_id: 5020, bob.user_id: 10}
    assert len(stored_files(stack)) == 4

    def submit(user, object_id: str) -> str:
        body = {"object_id": object_id, "operations": ["resize"]}
        job = client.post(f"{P}/process", json=body, headers=bearer(user))
        assert job.status_code == 202, job.text
        return str(job.json()["job_ids"][0])

    bobs, alices = submit(bob, third), submit(alice, of_thumbnail)
    busy = client.delete(f"{P}/objects/{upload_id}", headers=bearer(alice))
    assert busy.status_code == 409, busy.text
    error = busy.json()["error"]
    assert error["details"] == {"object_id": upload_id, "job_ids": [alices], "other_users_jobs": 1}
    assert bobs not in busy.text
    for user, job_id in ((alice, alices), (bob, bobs)):
        cancel = client.post(f"{P}/jobs/{job_id}/cancel", headers=bearer(user))
        assert cancel.status_code == 200, cancel.text

    deleted = client.delete(f"{P}/objects/{upload_id}", headers=bearer(alice))
    assert deleted.status_code == 200, deleted.text
    assert deleted.json() == {"object_id": upload_id, "outputs_deleted": 3, "bytes_freed": 5030}
    assert stored_files(stack) == []
    assert live_objects(stack) == 0
    assert stored_bytes(stack) == {}
    for object_id in (thumbnail, of_thumbnail, third):
        gone = client.get(f"{P}/objects/{object_id}", headers=bearer(alice))
        assert gone.status_code == 404, gone.text


def test_a_user_whose_outputs_filled_the_quota_starts_no_job_until_a_delete(stack, client):
    """The quota counts the jobs' outputs too: past it (a big output can take a user
    there) a submit is refused (413, nothing created) as an upload is; a delete makes
    room again. An operator has no quota."""
    alice = add_user(stack, "alice")
    object_id = upload(client, alice, png(5000)).json()["object_id"]
    first = run_thumbnail(stack, client, alice, object_id, QUOTA)  # 5000 + QUOTA stored
    refused = client.post(
        f"{P}/process",
        json={"object_id": object_id, "operations": ["resize"]},
        headers=bearer(alice),
    )
    assert refused.status_code == 413, refused.text
    error = refused.json()["error"]
    assert error["code"] == "storage_quota_exceeded"
    assert f"{QUOTA + 5000} of {QUOTA} bytes stored" in error["message"]
    with transaction(stack.engine) as conn:
        assert conn.execute(select(func.count()).select_from(t.jobs)).scalar_one() == 1
    operator = add_user(stack, "ops", operator=True)
    mine = upload(client, operator, png(2000)).json()["object_id"]
    ok = client.post(
        f"{P}/process",
        json={"object_id": mine, "operations": ["thumbnail"]},
        headers=bearer(operator),
    )
    assert ok.status_code == 202, ok.text
    (output,) = client.get(f"{P}/jobs/{first}", headers=bearer(alice)).json()["outputs"]
    assert client.delete(f"{P}/objects/{output['object_id']}", headers=bearer(alice)).is_success
    again = client.post(
        f"{P}/process",
        json={"object_id": object_id, "operations": ["resize"]},
        headers=bearer(alice),
    )
    assert again.status_code == 202, again.text


def keyed(client: httpx.Client, user, data, key: str, name: str = "a.png", **params: str):
    return client.put(
        f"{P}/objects",
        params={"filename": name, **params},
        content=data,
        headers={**bearer(user), "Idempotency-Key": key},
    )


def test_an_upload_retried_under_its_key_is_the_first_object_stored_and_counted_once(stack, client):
    """The same user, key and bytes again: the first object (``replayed``), nothing
    stored nor counted again, even with the quota full; anything else under the key
    (other bytes, size, file name or pool; the object deleted since) is 409
    ``idempotency_key_reused`` and stores nothing. Keys are per user."""
    alice, bob = add_user(stack, "alice"), add_user(stack, "bob")
    data = png(QUOTA)  # fills alice's quota: a second copy could not be stored
    first = keyed(client, alice, data, "upload-1")
    assert first.status_code == 201, first.text
    assert first.json()["replayed"] is False
    again = keyed(client, alice, data, "upload-1")
    assert again.status_code == 201, again.text
    assert again.json() == {**first.json(), "replayed": True}
    chunked = keyed(client, alice, iter([data[:5000], data[5000:]]), "upload-1")  # no length
    assert chunked.status_code == 201 and chunked.json()["replayed"] is True, chunked.text
    assert live_objects(stack) == 1 and len(stored_files(stack)) == 1
    assert stored_bytes(stack) == {alice.user_id: QUOTA}

    other = data[:-1] + b"\x01"  # same size, other sha256
    for response in (
        keyed(client, alice, other, "upload-1"),
        keyed(client, alice, iter([other[:5000], other[5000:]]), "upload-1"),
        keyed(client, alice, png(500), "upload-1"),  # refused by its Content-Length, unread
        keyed(client, alice, iter([data, b"more"]), "upload-1"),  # past the first's size
        keyed(client, alice, data, "upload-1", name="b.png"),
    ):
        assert response.status_code == 409, response.text
        error = response.json()["error"]
        assert error["code"] == "idempotency_key_reused"
        assert "upload-1" in error["message"] and "new key" in error["message"]
        assert error["details"] == {
            "idempotency_key": "upload-1",
            "object_id": first.json()["object_id"],
        }
    assert live_objects(stack) == 1 and len(stored_files(stack)) == 1
    assert stored_bytes(stack) == {alice.user_id: QUOTA}

    # Bob's key of the same name is his own.
    bobs = keyed(client, bob, png(1000), "upload-1")
    assert bobs.status_code == 201 and bobs.json()["replayed"] is False, bobs.text
    assert bobs.json()["object_id"] != first.json()["object_id"]

    # A key whose object was deleted makes no second one.
    deleted = client.delete(f"{P}/objects/{first.json()['object_id']}", headers=bearer(alice))
    assert deleted.status_code == 200, deleted.text
    gone = keyed(client, alice, data, "upload-1")
    assert gone.status_code == 409 and "deleted" in gone.json()["error"]["message"], gone.text
    assert keyed(client, alice, data, "upload-2").status_code == 201
    assert stored_bytes(stack) == {alice.user_id: QUOTA, bob.user_id: 1000}


def test_uploads_under_one_key_at_once_make_one_object(stack, client):
    """Two uploads with one key whose bodies arrive together: both are past the key's
    look-up before either is stored; the unique index lets one row in, the other
    answers as its retry (or 409 with other bytes) and its blob is deleted."""
    alice = add_user(stack, "alice")
    data = png(40_000)

    def race(bodies: list[bytes], key: str) -> list[httpx.Response]:
        barrier = threading.Barrier(len(bodies))

        def body(content: bytes) -> Iterator[bytes]:
            yield content[:1000]
            barrier.wait(30)  # both requests admitted, their first bytes stored
            yield content[1000:]

        with ThreadPoolExecutor(len(bodies)) as pool:
            futures = [pool.submit(keyed, client, alice, body(b), key) for b in bodies]
            return [f.result() for f in futures]

    same = race([data, data], "together")
    assert [r.status_code for r in same] == [201, 201], [r.text for r in same]
    assert same[0].json()["object_id"] == same[1].json()["object_id"]
    assert sorted(r.json()["replayed"] for r in same) == [False, True]
    assert live_objects(stack) == 1 and len(stored_files(stack)) == 1
    assert stored_bytes(stack) == {alice.user_id: 40_000}

    different = race([png(30_000), png(30_000)[:-1] + b"\x01"], "apart")
    assert sorted(r.status_code for r in different) == [201, 409], [r.text for r in different]
    [conflict] = [r for r in different if r.status_code == 409]
    assert conflict.json()["error"]["code"] == "idempotency_key_reused"
    assert live_objects(stack) == 2 and len(stored_files(stack)) == 2
    assert stored_bytes(stack) == {alice.user_id: 70_000}


def test_an_upload_refused_leaves_no_key_behind(stack, client):
    """Past the quota as it streams: refused, nothing stored, and its key free: the
    retry with a file that fits is a new object, not a 409."""
    alice = add_user(stack, "alice")
    over = keyed(client, alice, iter([png(60_000), bytes(60_000)]), "retry-me")
    assert over.status_code == 413, over.text
    assert over.json()["error"]["code"] == "storage_quota_exceeded"
    assert live_objects(stack) == 0 and stored_files(stack) == []
    fits = keyed(client, alice, png(60_000), "retry-me")
    assert fits.status_code == 201 and fits.json()["replayed"] is False, fits.text
    assert keyed(client, alice, png(60_000), "retry-me").json()["replayed"] is True
    assert live_objects(stack) == 1 and stored_bytes(stack) == {alice.user_id: 60_000}


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_a_submit_while_its_object_is_being_deleted_is_refused(stack, client):
    """Before, on PostgreSQL: a submit that read the object before a concurrent delete
    marked it, and wrote its job after the delete had looked for jobs on it, was 202
    as the delete was 200: a queued job, its credits reserved, on an object deleted and
    its blob gone (21 of 150 such races through the API). Now the delete locks the
    object before it looks, and the submit's statement locks it too: the submit waits
    for the delete, then finds the object gone (404), nothing reserved. SQLite runs
    one writer at a time: the two never interleave (PostgreSQL only)."""
    alice = add_user(stack, "alice", credits=10)
    object_id = upload(client, alice, PNG).json()["object_id"]
    body = {"object_id": object_id, "operations": ["thumbnail"]}
    answer = _submit_while_deleting(stack, client, alice, object_id, body, [object_id])
    assert answer.status_code == 404, answer.text
    assert answer.json()["error"] == {
        "code": "not_found",
        "message": f"no object {object_id!r}",
        "details": {"object_id": object_id},
    }
    with transaction(stack.engine) as conn:
        assert conn.execute(select(func.count()).select_from(t.jobs)).scalar_one() == 0
        account = conn.execute(select(t.credit_accounts.c.reserved_millicredits)).scalar_one()
    assert account == 0


def _submit_while_deleting(
    stack: Stack, client: httpx.Client, user, deleted: str, body: dict[str, Any], planned: list[str]
) -> httpx.Response:
    """``body`` submitted over HTTP while a deletion of ``deleted`` (which takes
    ``planned``) holds its locks; the deletion commits once the submit answered or waits
    for it. The submit's answer."""
    caller = Authenticator(stack.engine, ttl=0)(user.api_key)
    with ThreadPoolExecutor(1) as pool, stack.engine.connect() as conn:
        deleting = conn.begin()
        deletion = plan_deletion(conn, caller, deleted)  # no job on them yet
        assert deletion.object_ids == planned
        submitted = pool.submit(client.post, f"{P}/process", json=body, headers=bearer(user))
        # The submit either answers at once (it did, 202) or waits for the delete.
        while not submitted.done() and not support.waits_for_a_lock(stack.engine):
            time.sleep(0.01)
        mark_deleted(conn, deletion, stack.clock.now())
        deleting.commit()
        return submitted.result()


def _output_of(stack: Stack, client: httpx.Client, user, object_id: str) -> str:
    """The object id of a thumbnail of ``object_id`` (a job run for it, completed)."""
    job_id = run_thumbnail(stack, client, user, object_id, 10)
    (output,) = client.get(f"{P}/jobs/{job_id}", headers=bearer(user)).json()["outputs"]
    return str(output["object_id"])


def _live_jobs_and_reserved(stack: Stack) -> tuple[int, int]:
    j = t.jobs.c
    with transaction(stack.engine) as conn:
        live = conn.execute(
            select(func.count()).where(j.status.not_in(["completed", "failed", "cancelled"]))
        ).scalar_one()
        reserved = conn.execute(select(func.sum(t.credit_accounts.c.reserved_millicredits)))
        return int(live), int(reserved.scalar_one() or 0)


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_a_submit_on_an_output_while_its_source_is_being_deleted_is_refused(stack, client):
    """Deleting an object deletes its outputs. Before, on PostgreSQL, the delete locked
    the object only: a submit on one of its outputs went through while the delete was
    under way (202), and the delete then marked that output deleted (200): a queued
    job, its credits reserved, on an output whose blob was gone. Now the delete locks
    the outputs too: the submit waits for it, then finds the output gone (404),
    nothing reserved."""
    alice = add_user(stack, "alice", credits=10)
    source = upload(client, alice, PNG).json()["object_id"]
    output = _output_of(stack, client, alice, source)
    body = {"object_id": output, "operations": ["resize"]}
    answer = _submit_while_deleting(stack, client, alice, source, body, [source, output])
    assert answer.status_code == 404, answer.text
    assert answer.json()["error"] == {
        "code": "not_found",
        "message": f"no object {output!r}",
        "details": {"object_id": output},
    }
    assert _live_jobs_and_reserved(stack) == (0, 0)


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_a_batch_on_an_object_and_its_output_while_the_object_is_deleted_is_refused(stack, client):
    """A batch submit naming an object and one of its outputs, while the object's
    delete waits for the output's row (a submit on the output under way holds it FOR
    SHARE). Before, the batch locked its objects in the order its plan read them (the
    table's, where a row updated since its output was made comes after the output): it
    took the output, then waited for the object the delete holds, as the delete waited
    for the output: PostgreSQL's deadlock detected, one of the two aborted (a 500).
    Now a submit locks its objects in id order, as the delete does (the object, then
    its younger outputs): it waits for the object holding nothing, the delete goes on,
    and the batch answers 404 for the object, nothing reserved. PostgreSQL only:
    SQLite's writers take turns."""
    alice = add_user(stack, "alice", credits=10)
    source = upload(client, alice, PNG).json()["object_id"]
    output = _output_of(stack, client, alice, source)
    o = t.objects.c
    # The object's row updated after its output was made (as a migration's switch of
    # its storage_backend does): a new row version, after the output's in the table.
    # The table compacted first: the test's database may be an emptied clone a test
    # before used, whose freed slots the new version could take, ahead of the output
    # (seen once in a run: [source, output]).
    with stack.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM FULL objects")
    with transaction(stack.engine) as conn:
        conn.execute(update(t.objects).where(o.object_id == source).values(storage_backend=None))
        in_the_table = conn.execute(select(o.object_id).where(o.kind.is_not(None))).scalars()
        assert list(in_the_table) == [output, source]  # no index on kind: the table's order
    caller = Authenticator(stack.engine, ttl=0)(alice.api_key)
    batch = [
        SubmitRequest(object_id=object_id, operations=["resize"]) for object_id in (source, output)
    ]
    headers = bearer(alice)
    with ThreadPoolExecutor(2) as pool, stack.engine.connect() as other:
        holding = other.begin()  # a submit on the output, under way
        other.execute(select(o.object_id).where(o.object_id == output).with_for_update(read=True))
        deleted = pool.submit(client.delete, f"{P}/objects/{source}", headers=headers)
        while not deleted.done() and not support.waits_for_a_lock(stack.engine):
            time.sleep(0.01)
        submitted = pool.submit(stack.ingest.submit_many, caller, batch)
        while not submitted.done() and not support.waits_for_a_lock(stack.engine, 2):
            time.sleep(0.01)
        holding.commit()
        answer = deleted.result()
        with pytest.raises(NotFound) as refused:
            submitted.result()
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs_deleted"] == 1
    assert (refused.value.message, refused.value.details) == (
        f"no object {source!r}",
        {"object_id": source},
    )
    assert _live_jobs_and_reserved(stack) == (0, 0)


def _resized(stack: Stack, client: httpx.Client, user, object_id: str) -> str:
    """The object id of a resize of ``object_id`` (a job run for it, completed)."""
    body = {"object_id": object_id, "operations": ["resize"]}
    job = client.post(f"{P}/process", json=body, headers=bearer(user))
    assert job.status_code == 202, job.text
    (claimed,) = stack.dispatcher.claim("images", "w")
    stack.dispatcher.start(claimed, "w")
    key = derived_key(user.pool_id, object_id, 1, "resize.webp")
    blob = stack.storage.put(key, [bytes(20)])
    output = OutputRecord("resize.webp", key, blob.size_bytes, "image/webp")
    assert stack.dispatcher.complete(claimed, "w", [output])
    (made,) = client.get(f"{P}/jobs/{claimed.job_id}", headers=bearer(user)).json()["outputs"]
    return str(made["object_id"])


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_a_batch_on_a_grandchild_and_a_younger_output_while_the_object_is_deleted(stack, client):
    """The delete locks the whole tree derived from the object in one id order, as a
    submit locks its objects: a batch naming a thumbnail of a thumbnail and an output
    made after it (younger, so after it in id order, though nearer the object) takes
    both before the delete, waiting at the grandchild, reaches either; the delete then
    sees its jobs (409). Locked a generation at a time (the outputs, then theirs), the
    delete would hold the younger output while it waited for the grandchild the batch
    holds, the batch waiting for it: deadlock detected. Before, the grandchild was not
    deleted at all: the delete was 200 and the batch 404 on the younger output."""
    alice = add_user(stack, "alice", credits=10)
    source = upload(client, alice, PNG).json()["object_id"]
    child = _output_of(stack, client, alice, source)
    grandchild = _output_of(stack, client, alice, child)
    younger = _resized(stack, client, alice, source)
    assert sorted([younger, grandchild, child, source]) == [source, child, grandchild, younger]
    caller = Authenticator(stack.engine, ttl=0)(alice.api_key)
    batch = [SubmitRequest(object_id=i, operations=["resize"]) for i in (grandchild, younger)]
    o = t.objects.c
    with ThreadPoolExecutor(2) as pool, stack.engine.connect() as other:
        holding = other.begin()  # a submit on the grandchild, under way
        held = select(o.object_id).where(o.object_id == grandchild)
        other.execute(held.with_for_update(read=True))
        deleted = pool.submit(client.delete, f"{P}/objects/{source}", headers=bearer(alice))
        while not deleted.done() and not support.waits_for_a_lock(stack.engine):
            time.sleep(0.01)
        submitted = pool.submit(stack.ingest.submit_many, caller, batch)
        results = submitted.result(timeout=10)
        holding.commit()
        answer = deleted.result()
    job_ids = sorted(job.job_id for result in results for job in result.jobs)
    assert len(job_ids) == 2
    assert answer.status_code == 409, answer.text
    assert answer.json()["error"]["details"] == {
        "object_id": source,
        "job_ids": job_ids,
        "other_users_jobs": 0,
    }
    assert live_objects(stack) == 4


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
@pytest.mark.parametrize("deadlocks", [1, CONFLICT_ATTEMPTS])
def test_a_delete_caught_in_a_deadlock_is_run_again_then_answers_503(stack, client, deadlocks):
    """A delete holding its object and waiting for an output another transaction holds
    (a submit on the output under way), which then wants the object: PostgreSQL's
    deadlock detected, the delete aborted. Before: an untranslated OperationalError, 500
    ``internal``. Now its transaction is run again: once the other is done, the delete
    is 200; still deadlocked on its last run, 503 ``database_conflict`` with
    Retry-After, nothing deleted.

    Which of the two PostgreSQL aborts is the one whose deadlock check finds the cycle,
    and a waiting backend checks once, deadlock_timeout (1 s) after its wait began. Were
    the delete to wait for the output's holder from the start, its check would find the
    cycle only if the holder asked for the object within that second; on a loaded
    machine it sometimes did not, and the holder's own check then found the cycle and
    aborted the test's side. So that is made certain: the holder (``other``) checks
    never (its deadlock_timeout past its lock limit, SET as the suite's superuser), and
    the delete's wait that closes the cycle begins only once the holder waits for the
    object. A second session (``first``) locks the output FOR SHARE before the holder
    does, and the delete waits for the output's lockers in their order: for ``first``
    while the holder asks for the object, then, ``first`` done, for the holder: a new
    wait, whose check finds the cycle. Each run again has a ``first`` of its own ahead
    of the holder (the holder's lock on the output taken again after it, in a
    savepoint)."""
    alice = add_user(stack, "alice", credits=10)
    source = upload(client, alice, PNG).json()["object_id"]
    output = _output_of(stack, client, alice, source)
    o = t.objects.c
    share_output = select(o.object_id).where(o.object_id == output).with_for_update(read=True)
    share_source = select(o.object_id).where(o.object_id == source).with_for_update(read=True)
    with (
        ThreadPoolExecutor(2) as pool,
        stack.engine.connect() as first,
        stack.engine.connect() as other,
    ):
        ahead = first.begin()
        first.execute(share_output)
        holding = other.begin()
        other.exec_driver_sql("SET LOCAL deadlock_timeout = '1min'")
        kept = other.begin_nested()  # the holder's lock on the output
        other.execute(share_output)
        deleted = pool.submit(client.delete, f"{P}/objects/{source}", headers=bearer(alice))
        for run in range(1, deadlocks + 1):
            while not support.waits_for_a_lock(stack.engine):  # the delete, for `first`
                assert not deleted.done(), deleted.result().text
                time.sleep(0.01)

            def want_source() -> None:
                wanting = other.begin_nested()
                other.execute(share_source)  # granted once the delete is aborted
                wanting.rollback()

            wanted = pool.submit(want_source)
            while not support.waits_for_a_lock(stack.engine, 2):  # and the holder
                assert not wanted.done(), wanted.result()
                time.sleep(0.01)
            ahead.commit()  # the delete then waits for the holder: a cycle, its to find
            wanted.result(timeout=30)
            if run < deadlocks:
                ahead = first.begin()  # the next run's `first`, then the holder after it
                first.execute(share_output)
                kept.rollback()
                kept = other.begin_nested()
                other.execute(share_output)
        holding.commit()
        answer = deleted.result()
    if deadlocks < CONFLICT_ATTEMPTS:
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs_deleted"] == 1
        assert live_objects(stack) == 0
        return
    assert answer.status_code == 503, answer.text
    assert answer.headers["Retry-After"] == "1"
    error = answer.json()["error"]
    assert (error["code"], error["details"]["sqlstate"]) == ("database_conflict", "40P01")
    assert live_objects(stack) == 2
    assert len(stored_files(stack)) == 2
