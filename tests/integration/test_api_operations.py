"""Only operations with a pipeline step are accepted: a profile alone would reserve
credits for a job that no actor ever serves (issue 11, item 12)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select

import pipelines.registry
from autoscaler import admission
from autoscaler import config as scheduler_config
from autoscaler.head import staffed_queues
from hypermedia import tls
from hypermedia.clock import to_datetime
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.ingest.api import create_app
from hypermedia.local import implemented_queues, operations_of, served_operations
from hypermedia.profiles import load_profiles
from hypermedia.stack import Stack
from tests.api_support import add_user, bearer, running_server

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10\x00\x00\x00\x10\x08\x02\x00\x00\x00"
P = "/v1/hypermedia"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def stack(engine, settings) -> Iterator[Stack]:
    opened = Stack.open(settings(), engine=engine, auto_migrate=True)
    yield opened
    opened.close()


@pytest.fixture
def client(stack) -> Iterator[httpx.Client]:
    with (
        running_server(create_app(stack, auth_cache_seconds=0)) as url,
        httpx.Client(base_url=url, timeout=30, verify=tls.client_context()) as http,
    ):
        yield http


@contextmanager
def _submitting(stack: Stack, name: str) -> Iterator[Callable[[str], httpx.Response]]:
    """A server on ``stack`` and a user with an uploaded PNG: what submits one
    operation of it."""
    with (
        running_server(create_app(stack, auth_cache_seconds=0)) as url,
        httpx.Client(base_url=url, timeout=30, verify=tls.client_context()) as client,
    ):
        user = add_user(stack, name, credits=100)
        uploaded = client.put(
            f"{P}/objects", params={"filename": "a.png"}, content=PNG, headers=bearer(user)
        )
        object_id = uploaded.json()["object_id"]

        def submit(operation: str) -> httpx.Response:
            return client.post(
                f"{P}/process",
                json={"object_id": object_id, "operations": [operation]},
                headers=bearer(user),
            )

        yield submit


def _count(stack: Stack, table) -> int:
    with transaction(stack.engine) as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def test_profiles_without_a_step_are_refused_at_submit(stack, client):
    user = add_user(stack, "alice", credits=100)
    uploaded = client.put(
        f"{P}/objects", params={"filename": "a.png"}, content=PNG, headers=bearer(user)
    )
    assert uploaded.status_code == 201, uploaded.text
    object_id = uploaded.json()["object_id"]
    assert "ocr" in stack.catalog.operations() and "regenerate" in stack.catalog.operations()

    for operations in (["regenerate"], ["thumbnail", "regenerate"]):
        response = client.post(
            f"{P}/process",
            json={"object_id": object_id, "operations": operations},
            headers=bearer(user),
        )
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["code"] == "unknown_operation"
        assert error["details"]["operation"] == "regenerate"
        assert "thumbnail" in error["details"]["implemented"]
    assert _count(stack, t.jobs) == 0 and _count(stack, t.submissions) == 0
    assert client.get(f"{P}/credits", headers=bearer(user)).json()["reserved"] == 0
    assert stack.queue.ready_ids("ocr") == [] and stack.queue.ready_ids("bulk") == []

    accepted = client.post(
        f"{P}/process",
        json={"object_id": object_id, "operations": ["thumbnail"]},
        headers=bearer(user),
    )
    assert accepted.status_code == 202, accepted.text


def test_a_bulk_run_of_an_operation_without_a_step_is_refused(stack, client):
    operator = add_user(stack, "op", credits=10, operator=True)
    for body in (
        {"kind": "backfill", "operation": "regenerate"},
        {"kind": "backfill", "operation": "regenerate", "dry_run": True},
        {"kind": "regenerate", "operation": "regenerate"},
    ):
        response = client.post(f"{P}/bulk/runs", json=body, headers=bearer(operator))
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["code"] == "unknown_operation"
        assert (
            error["message"] == "'regenerate' is not accepted: no pipeline step implements it yet"
        )
        assert error["details"]["operation"] == "regenerate"
        assert "thumbnail" in error["details"]["implemented"]
    assert _count(stack, t.bulk_runs) == 0
    accepted = client.post(
        f"{P}/bulk/runs",
        json={"kind": "backfill", "operation": "thumbnail", "dry_run": True},
        headers=bearer(operator),
    )
    assert accepted.status_code == 200, accepted.text


def test_a_bulk_run_on_another_queue_is_a_400_its_route_documents(stack, client):
    # Before: answered 400 invalid_request, which createBulkRun's OpenAPI entry did not
    # list (a generated client had no error type for it).
    operator = add_user(stack, "op", credits=10, operator=True)
    for queue, says in (("ocr", "queue must be 'bulk'"), ("nowhere", "queue must be 'bulk'")):
        body = {"kind": "backfill", "operation": "thumbnail", "queue": queue, "dry_run": True}
        response = client.post(f"{P}/bulk/runs", json=body, headers=bearer(operator))
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "invalid_request" and says in error["message"], error
    document = client.get("/openapi.json").json()
    responses = document["paths"][f"{P}/bulk/runs"]["post"]["responses"]
    assert responses["400"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ErrorResponse"
    }
    assert _count(stack, t.bulk_runs) == 0


def test_run_and_up_start_an_actor_for_every_queue_with_an_implemented_operation(settings):
    chosen = settings()
    profiles = load_profiles(chosen.profiles_path, chosen.queue_names)
    registered = pipelines.registry.operations()
    pools = implemented_queues(chosen, registered)
    served = {profiles[op].queue for op in registered if op in profiles}
    assert set(pools) == served
    assert {"images", "documents", "media", "ocr"} <= set(pools)
    # Nothing implements regenerate (bulk) yet: no actor, and ingest refuses it.
    assert "regenerate" not in registered


def test_a_queue_without_workers_here_is_refused_at_submit(engine, settings):
    """``queues.<name>.workers``: how many actors of the queue a local stack starts; 0
    and nothing runs its jobs, so ingest refuses them and says why."""
    chosen = settings(queues={"documents": {"workers": 0}, "images": {"workers": 2}})
    assert chosen.queues["media"].workers == 1  # the other queues keep their defaults
    pools = implemented_queues(chosen, pipelines.registry.operations())
    assert pools["images"] == 2 and "documents" not in pools and pools["media"] == 1
    stack = Stack.open(
        chosen, engine=engine, auto_migrate=True, implemented=served_operations(chosen, pools)
    )
    try:
        with _submitting(stack, "bob") as submit:
            refused = submit("pdf_preview")
            assert refused.status_code == 422, refused.text
            error = refused.json()["error"]
            assert error["code"] == "unknown_operation"
            assert "no worker here runs the 'documents' queue" in error["message"]
            assert "thumbnail" in error["details"]["implemented"]
            assert "pdf_preview" not in error["details"]["implemented"]
            accepted = submit("thumbnail")
            assert accepted.status_code == 202, accepted.text
        assert _count(stack, t.jobs) == 1
    finally:
        stack.close()


def test_a_ray_up_head_refuses_a_queue_its_scheduler_json_gives_no_worker(engine, settings):
    """The head of `ray up` starts the VPS's actors per queue (the baseline; in
    cloud_first one of a cloud-enabled queue's) and bursts only cloud-enabled queues
    outside ``vps_only``: the shipped scheduler.json (vps_only, ocr with a baseline of
    0) gives ocr none, so ingest refuses ocr (accepted, it waited forever) until a
    worker of that queue is live (a node joined with it)."""
    config = scheduler_config.load(REPO / "etc/scheduler.json")
    assert admission.staffed(config) == {"images", "documents"}
    hybrid = config.model_copy(update={"mode": "hybrid"})
    burst = hybrid.model_copy(
        update={"queues": {**config.queues, "ocr": _cloud_enabled(config.queues["ocr"])}}
    )
    assert admission.staffed(burst) == {"images", "documents", "ocr"}
    # cloud_first: images and documents, not cloud-enabled, keep their VPS baseline
    cloud_first = burst.model_copy(update={"mode": "cloud_first"})
    assert admission.staffed(cloud_first) == {"images", "documents", "ocr"}
    closed = config.model_copy(update={"mode": "cloud_first"})
    assert admission.staffed(closed) == {"images", "documents"}
    assert admission.staffed(config.model_copy(update={"queues": burst.queues})) == {
        "images",
        "documents",
    }  # vps_only launches nothing, cloud_enabled or not

    chosen = settings()
    staffed = staffed_queues(config, engine)
    stack = Stack.open(
        chosen, engine=engine, auto_migrate=True, implemented=operations_of(chosen, staffed)
    )
    try:
        with _submitting(stack, "carol") as submit:
            refused = submit("ocr")
            assert refused.status_code == 422, refused.text
            error = refused.json()["error"]
            assert error["code"] == "unknown_operation"
            assert "no worker here runs the 'ocr' queue" in error["message"]
            assert "ocr" not in error["details"]["implemented"]
            assert "thumbnail" in error["details"]["implemented"]
            assert submit("thumbnail").status_code == 202
            assert _count(stack, t.jobs) == 1

            # A worker of the queue joins: its operations are accepted once it is live
            # (read again after LIVE_SECONDS), refused again once it stopped.
            _worker(stack, "ocr", "active")
            staffed._read_at -= staffed.LIVE_SECONDS
            accepted = submit("ocr")
            assert accepted.status_code == 202, accepted.text
            with transaction(stack.engine) as conn:
                conn.execute(t.workers.update().values(status="stopped"))
            staffed._read_at -= staffed.LIVE_SECONDS
            assert submit("ocr").status_code == 422
        assert _count(stack, t.jobs) == 2
    finally:
        stack.close()


def _cloud_enabled(queue: scheduler_config.QueueConfig) -> scheduler_config.QueueConfig:
    return queue.model_copy(update={"cloud_enabled": True})


def _worker(stack: Stack, queue: str, status: str) -> None:
    now = stack.clock.now()
    with transaction(stack.engine) as conn:
        conn.execute(
            t.workers.insert().values(
                worker_id=f"w-{queue}",
                queue=queue,
                hostname="joined-node",
                status=status,
                concurrency=1,
                started_at=to_datetime(now),
                last_heartbeat=to_datetime(now),
            )
        )
