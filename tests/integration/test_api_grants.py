"""What an API key may ask for: a priority range and a submit rate the operator grants
(issue 11, item 11), through a real uvicorn server."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import func, select

from hypermedia import tls
from hypermedia.accounts import KeyGrants, create_api_key, grant_api_key, key_id_of
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.ingest.api import create_app
from hypermedia.stack import Stack
from tests.api_support import add_user, running_server

P = "/v1/hypermedia"
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10\x00\x00\x00\x10\x08\x02\x00\x00\x00"


@pytest.fixture
def stack(engine, settings) -> Iterator[Stack]:
    opened = Stack.open(
        settings(key_priority_min=4, key_priority_max=10, key_submits_per_minute=1000),
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


def new_key(stack: Stack, user_id: str, grants: KeyGrants) -> str:
    with transaction(stack.engine) as conn:
        return create_api_key(conn, user_id, stack.clock.now(), grants=grants)


def jobs(stack: Stack) -> int:
    with transaction(stack.engine) as conn:
        return int(conn.execute(select(func.count()).select_from(t.jobs)).scalar_one())


class Submitter:
    def __init__(self, client: httpx.Client, key: str) -> None:
        self.client, self.headers = client, {"Authorization": f"Bearer {key}"}
        uploaded = client.put(
            f"{P}/objects", params={"filename": "a.png"}, content=PNG, headers=self.headers
        )
        assert uploaded.status_code == 201, uploaded.text
        self.object_id = uploaded.json()["object_id"]

    def __call__(self, priority: int | None = None) -> httpx.Response:
        body: dict[str, object] = {"object_id": self.object_id, "operations": ["thumbnail"]}
        if priority is not None:
            body["priority"] = priority
        return self.client.post(f"{P}/process", json=body, headers=self.headers)


def test_a_key_submits_only_within_its_priority_range(stack, client):
    user = add_user(stack, "alice", credits=100)
    plain = Submitter(client, user.api_key)  # no grant: the settings' 4-10

    refused = plain(1)
    assert refused.status_code == 403, refused.text
    error = refused.json()["error"]
    assert error["code"] == "priority_not_allowed"
    assert error["details"] == {"priority": 1, "allowed_min": 4, "allowed_max": 10}
    assert "4-10" in error["message"]
    assert plain(3).status_code == 403
    assert jobs(stack) == 0
    assert client.get(f"{P}/credits", headers=plain.headers).json()["reserved"] == 0
    accepted = plain(4)
    assert accepted.status_code == 202 and accepted.json()["jobs"][0]["priority"] == 4
    # Without a priority the profile's own default (the operator's choice) applies.
    default = plain()
    assert default.status_code == 202, default.text
    assert default.json()["jobs"][0]["priority"] == stack.catalog.get("thumbnail").default_priority

    urgent = Submitter(client, new_key(stack, user.user_id, KeyGrants(1, 3)))
    assert urgent(1).status_code == 202
    assert urgent(5).status_code == 403
    assert urgent(5).json()["error"]["details"]["allowed_max"] == 3

    # A grant changed on a running server applies to the next authentication.
    with transaction(stack.engine) as conn:
        grant_api_key(conn, key_id_of(user.api_key), KeyGrants(1, 10))
    assert plain(1).status_code == 202


def test_a_key_submits_at_most_its_rate(stack, client):
    user = add_user(stack, "alice", credits=100)
    limited = Submitter(client, new_key(stack, user.user_id, KeyGrants(submits_per_minute=3)))
    assert [limited(5).status_code for _ in range(3)] == [202, 202, 202]
    refused = limited(5)
    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert error["code"] == "rate_limited"
    assert error["details"]["limit_per_minute"] == 3
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert jobs(stack) == 3
    # Per key: another key of the same user has its own window.
    assert Submitter(client, user.api_key)(5).status_code == 202
    # The limit lives on Redis, under the stack's prefix, kept by the limits library.
    prefix = f"{stack.settings.redis_prefix}:ratelimit"
    assert any(k.startswith(prefix) for k in stack.redis.scan_iter(f"{prefix}*"))


def test_a_replayed_submit_is_answered_whatever_the_rate(stack, client):
    user = add_user(stack, "alice", credits=100)
    limited = Submitter(client, new_key(stack, user.user_id, KeyGrants(submits_per_minute=2)))

    def submit(key: str) -> httpx.Response:
        body = {"object_id": limited.object_id, "operations": ["thumbnail"], "idempotency_key": key}
        response: httpx.Response = client.post(f"{P}/process", json=body, headers=limited.headers)
        return response

    first = submit("k1")
    assert first.status_code == 202 and first.json()["replayed"] is False
    for _ in range(3):  # retries spend none of the key's rate
        retry = submit("k1")
        assert retry.status_code == 202, retry.text
        assert retry.json()["replayed"] is True
        assert retry.json()["job_ids"] == first.json()["job_ids"]
    assert submit("k2").status_code == 202
    refused = submit("k3")
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "rate_limited"
    assert submit("k2").json()["replayed"] is True  # past the rate, a replay still replays
    assert jobs(stack) == 2
