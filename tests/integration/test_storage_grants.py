"""The head's grants: only the worker holding a job gets its URLs; output keys are
derived from the job's object and profile, never chosen by the worker.

Runs on PostgreSQL and SQLite (the ``engine`` fixture)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from urllib.parse import parse_qsl, urlsplit

import pytest

from hypermedia.config import REPO_ETC
from hypermedia.errors import IllegalTransition, InvalidRequest, NotFound
from hypermedia.jobs.repository import ClaimedJob
from hypermedia.stack import Stack
from hypermedia.storage.base import derived_key, original_key
from hypermedia.storage.grants import OutputGrant, StorageGrants
from hypermedia.storage.local import LocalStorage
from tests.factories import Person, make_user, open_stack, submit

TTL = 600
THUMBNAIL_VERSION = 7


@pytest.fixture
def stack(engine, settings, manual_clock, tmp_path) -> Iterator[Stack]:
    # A profile version other than 1, to see it land in the output keys.
    profiles = tmp_path / "profiles.toml"
    text = (REPO_ETC / "profiles.toml").read_text()
    profiles.write_text(
        re.sub(
            r"(\[profiles\.thumbnail\][^\[]*?)version = 1",
            rf"\g<1>version = {THUMBNAIL_VERSION}",
            text,
        )
    )
    opened = open_stack(settings, engine, manual_clock, profiles_path=profiles)
    yield opened
    opened.close()


@pytest.fixture
def grants(stack) -> StorageGrants:
    return StorageGrants(stack.engine, stack.storage, TTL, stack.clock)


@pytest.fixture
def person(stack) -> Person:
    return make_user(stack)


def _claim(stack: Stack, person: Person, worker_id: str = "worker-1") -> ClaimedJob:
    [job_id] = submit(stack, person, ["thumbnail"])
    [claimed] = stack.dispatcher.claim("images", worker_id)
    assert claimed.job_id == job_id
    return claimed


def _key_of(url: str) -> str:
    return urlsplit(url).path.removeprefix("/v1/hypermedia/blobs/")


def _query(url: str) -> dict[str, str]:
    return dict(parse_qsl(urlsplit(url).query))


def test_the_holding_worker_gets_a_url_for_the_input(stack, grants, person):
    job = _claim(stack, person)
    url = grants.input_url(job.job_id, "worker-1")
    assert _key_of(url) == original_key(person.pool_id, job.object_id)
    query = _query(url)
    assert int(query["expires"]) == int(stack.clock.now()) + TTL
    assert isinstance(stack.storage, LocalStorage)
    stack.storage.verify("GET", _key_of(url), query["expires"], query["sig"])  # a real URL


def test_output_keys_are_derived_from_the_job_not_the_worker(stack, grants, person):
    job = _claim(stack, person)
    types = ["thumbnail-320x320.webp", "thumbnail-640x640.webp"]
    granted = grants.output_urls(job.job_id, "worker-1", types)
    assert set(granted) == set(types)
    for output_type, grant in granted.items():
        expected = derived_key(person.pool_id, job.object_id, THUMBNAIL_VERSION, output_type)
        assert grant.key == expected
        assert _key_of(grant.url) == expected
        assert grant.content_type is None
    again = grants.output_urls(job.job_id, "worker-1", types)
    assert {t: g.key for t, g in again.items()} == {t: g.key for t, g in granted.items()}


def test_output_urls_can_bind_content_types(stack, grants, person):
    job = _claim(stack, person)
    granted = grants.output_urls(
        job.job_id, "worker-1", {"thumbnail-320x320.webp": "image/webp", "meta.json": None}
    )
    webp = granted["thumbnail-320x320.webp"]
    assert webp == OutputGrant(
        key=derived_key(person.pool_id, job.object_id, THUMBNAIL_VERSION, "thumbnail-320x320.webp"),
        url=webp.url,
        content_type="image/webp",
    )
    assert _query(webp.url)["content_type"] == "image/webp"
    assert "content_type" not in _query(granted["meta.json"].url)


def test_a_processing_job_is_still_granted(stack, grants, person):
    job = _claim(stack, person)
    assert stack.dispatcher.start(job, "worker-1")
    assert grants.input_url(job.job_id, "worker-1")
    assert grants.output_urls(job.job_id, "worker-1", ["a.png"])


def test_another_worker_gets_nothing(stack, grants, person):
    job = _claim(stack, person)
    with pytest.raises(IllegalTransition):
        grants.input_url(job.job_id, "worker-2")
    with pytest.raises(IllegalTransition):
        grants.output_urls(job.job_id, "worker-2", ["a.png"])


def test_a_queued_job_gets_nothing(stack, grants, person):
    [job_id] = submit(stack, person, ["thumbnail"])
    with pytest.raises(IllegalTransition):
        grants.input_url(job_id, "worker-1")


def test_an_unknown_job_is_not_found(grants):
    with pytest.raises(NotFound):
        grants.input_url("0" * 32, "worker-1")
    with pytest.raises(NotFound):
        grants.output_urls("0" * 32, "worker-1", ["a.png"])


def test_a_finished_job_gets_none(stack, grants, person):
    job = _claim(stack, person)
    assert stack.dispatcher.start(job, "worker-1")
    assert stack.dispatcher.complete(job, "worker-1")
    with pytest.raises(IllegalTransition):
        grants.input_url(job.job_id, "worker-1")
    with pytest.raises(IllegalTransition):
        grants.output_urls(job.job_id, "worker-1", ["a.png"])


def test_a_failed_attempt_gets_none(stack, grants, person):
    job = _claim(stack, person)
    assert stack.dispatcher.start(job, "worker-1")
    stack.dispatcher.fail(job, "worker-1", "boom", "it broke", retryable=True)
    with pytest.raises(IllegalTransition):
        grants.input_url(job.job_id, "worker-1")


def test_a_job_whose_lease_ran_out_gets_none(stack, grants, person, manual_clock):
    job = _claim(stack, person)
    manual_clock.advance(job.deadline - manual_clock.now() - 1)
    assert grants.input_url(job.job_id, "worker-1")  # still held, just
    manual_clock.advance(2)
    with pytest.raises(IllegalTransition):
        grants.input_url(job.job_id, "worker-1")


@pytest.mark.parametrize(
    "output_types",
    [
        ["../../originals/p/o"],
        ["a/b"],
        [""],
        [".hidden"],
        [],
        [f"t{i}.png" for i in range(65)],
        {"a.png": "image/png; charset=x"},
    ],
    ids=["dotdot", "slash", "empty", "hidden", "none", "too-many", "bad-content-type"],
)
def test_bad_output_types_are_refused(stack, grants, person, output_types):
    job = _claim(stack, person)
    with pytest.raises(InvalidRequest):
        grants.output_urls(job.job_id, "worker-1", output_types)


def test_a_string_is_not_a_list_of_output_types(stack, grants, person):
    job = _claim(stack, person)
    with pytest.raises(InvalidRequest):
        grants.output_urls(job.job_id, "worker-1", "convert.png")


def test_the_lifetime_is_bounded(stack):
    with pytest.raises(InvalidRequest):
        StorageGrants(stack.engine, stack.storage, 0, stack.clock)
    with pytest.raises(InvalidRequest):
        StorageGrants(stack.engine, stack.storage, 7 * 24 * 3600 + 1, stack.clock)
