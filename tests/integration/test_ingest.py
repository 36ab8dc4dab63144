"""The ingest library: access, estimates, the 402 path, idempotency, limits."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import event, func, select

from hypermedia import accounts
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.errors import (
    Conflict,
    IllegalTransition,
    InputTooLarge,
    InvalidParams,
    InvalidRequest,
    NotFound,
    PaymentRequired,
    UnknownOperation,
)
from hypermedia.ingest.service import SubmitRequest
from hypermedia.jobs.repository import FinishedJob
from hypermedia.jobs.states import JobStatus
from tests.factories import make_object, make_user, open_stack


def _count(engine, table) -> int:
    with transaction(engine) as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def _balance(stack, person) -> accounts.Balance:
    with transaction(stack.engine) as conn:
        return accounts.balance(conn, person.caller.user_id)


def test_estimate_is_base_plus_per_mb_and_is_reserved(engine, settings, manual_clock):
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack, credits=10)
    obj = make_object(stack, person, size_bytes=5 * 1024 * 1024)
    result = stack.ingest.submit(
        person.caller, SubmitRequest(object_id=obj, operations=["thumbnail", "ocr"])
    )
    # thumbnail: 0.1 + 0.02 x 5 = 0.2; ocr: 1.0 + 0.2 x 5 = 2.0
    assert [j.estimated_millicredits for j in result.jobs] == [200, 2000]
    assert result.estimated_millicredits == 2200
    assert _balance(stack, person) == accounts.Balance(10_000, 2200)
    # Completing charges the actual cost and releases the reservation.
    (job,) = stack.dispatcher.claim("images", "w")
    stack.dispatcher.start(job, "w")
    stack.dispatcher.complete(job, "w", actual_millicredits=150)
    assert _balance(stack, person) == accounts.Balance(9850, 2000)
    # Cancelling releases without charging.
    stack.ingest.cancel(person.caller, result.job_ids[1])
    assert _balance(stack, person) == accounts.Balance(9850, 0)
    with transaction(stack.engine) as conn:
        ledger = conn.execute(
            select(t.credit_ledger.c.kind, t.credit_ledger.c.amount_millicredits).order_by(
                t.credit_ledger.c.entry_id
            )
        ).all()
    assert [tuple(r) for r in ledger] == [("grant", 10_000), ("charge", -150)]
    stack.close()


def test_not_enough_credits_creates_nothing(engine, settings, manual_clock):
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack, credits=1.5)
    obj = make_object(stack, person, size_bytes=5 * 1024 * 1024)
    stack.ingest.submit(person.caller, SubmitRequest(object_id=obj, operations=["thumbnail"]))
    jobs_before = _count(stack.engine, t.jobs)
    subs_before = _count(stack.engine, t.submissions)
    balance_before = _balance(stack, person)
    ready_before = stack.queue.ready_ids("images")
    with pytest.raises(PaymentRequired) as caught:
        stack.ingest.submit(
            person.caller, SubmitRequest(object_id=obj, operations=["thumbnail", "ocr"])
        )
    assert caught.value.status == 402
    assert caught.value.details == {"required_credits": 2.2, "available_credits": 1.3}
    assert _count(stack.engine, t.jobs) == jobs_before
    assert _count(stack.engine, t.submissions) == subs_before
    assert _balance(stack, person) == balance_before
    assert stack.queue.ready_ids("images") == ready_before
    assert stack.queue.ready_ids("ocr") == []
    stack.close()


def test_batch_is_all_or_nothing(engine, settings, manual_clock):
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack, credits=1.1)
    obj = make_object(stack, person)  # 1 KiB: 0.101 credits per thumbnail
    requests = [SubmitRequest(object_id=obj, operations=["thumbnail"]) for _ in range(20)]
    with pytest.raises(PaymentRequired):
        stack.ingest.submit_many(person.caller, requests)  # 20 x 0.101 > 1.1
    assert _count(stack.engine, t.jobs) == 0
    assert len(stack.ingest.submit_many(person.caller, requests[:10])) == 10
    stack.close()


def test_other_users_objects_and_jobs_are_not_found(engine, settings, manual_clock):
    stack = open_stack(settings, engine, manual_clock)
    alice, mallory = make_user(stack, "alice"), make_user(stack, "mallory")
    obj = make_object(stack, alice)
    result = stack.ingest.submit(alice.caller, SubmitRequest(object_id=obj, operations=["ocr"]))
    job_id = result.job_ids[0]
    with pytest.raises(NotFound):
        stack.ingest.submit(mallory.caller, SubmitRequest(object_id=obj, operations=["ocr"]))
    with pytest.raises(NotFound):
        stack.ingest.get_job(mallory.caller, job_id)
    with pytest.raises(NotFound):
        stack.ingest.cancel(mallory.caller, job_id)
    with pytest.raises(NotFound):
        stack.ingest.get_job(mallory.caller, "0" * 32)
    assert stack.ingest.get_job(alice.caller, job_id).status == "queued"
    stack.close()


def test_pool_members_may_use_each_others_objects(engine, settings, manual_clock):
    stack = open_stack(settings, engine, manual_clock)
    alice, bob = make_user(stack, "alice"), make_user(stack, "bob")
    with transaction(stack.engine) as conn:
        accounts.add_pool_member(conn, alice.pool_id, bob.caller.user_id)
    obj = make_object(stack, alice)
    result = stack.ingest.submit(bob.caller, SubmitRequest(object_id=obj, operations=["ocr"]))
    # The job is Bob's: he pays, he sees it; Alice does not.
    assert stack.ingest.get_job(bob.caller, result.job_ids[0]).status == "queued"
    with pytest.raises(NotFound):
        stack.ingest.get_job(alice.caller, result.job_ids[0])
    assert _balance(stack, bob).reserved_millicredits == result.estimated_millicredits
    stack.close()


def test_idempotency_key_returns_the_same_jobs(engine, settings, manual_clock):
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    obj = make_object(stack, person)
    request = SubmitRequest(object_id=obj, operations=["thumbnail", "ocr"], idempotency_key="k-1")
    first = stack.ingest.submit(person.caller, request)
    again = stack.ingest.submit(person.caller, request)
    assert again.replayed and not first.replayed
    assert again.job_ids == first.job_ids
    assert again.estimated_millicredits == first.estimated_millicredits
    assert _balance(stack, person).reserved_millicredits == first.estimated_millicredits
    assert _count(stack.engine, t.jobs) == 2
    with pytest.raises(Conflict):
        stack.ingest.submit(
            person.caller,
            SubmitRequest(object_id=obj, operations=["thumbnail"], idempotency_key="k-1"),
        )
    # Keys are per user: someone else's "k-1" is a different submit.
    other = make_user(stack)
    other_obj = make_object(stack, other)
    mine = stack.ingest.submit(
        other.caller,
        SubmitRequest(object_id=other_obj, operations=["thumbnail"], idempotency_key="k-1"),
    )
    assert not mine.replayed
    stack.close()


def test_concurrent_retries_with_one_key_create_one_submission(pg_engine, settings, manual_clock):
    stack = open_stack(settings, pg_engine, manual_clock)
    person = make_user(stack)
    obj = make_object(stack, person)
    request = SubmitRequest(object_id=obj, operations=["thumbnail"], idempotency_key="race")
    results, errors = [], []
    barrier = threading.Barrier(6)

    def go() -> None:
        barrier.wait()
        try:
            results.append(stack.ingest.submit(person.caller, request))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=go) for _ in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert not errors, errors
    assert len({tuple(r.job_ids) for r in results}) == 1
    assert sum(not r.replayed for r in results) == 1
    assert _count(stack.engine, t.jobs) == 1
    assert _balance(stack, person).reserved_millicredits == results[0].estimated_millicredits
    assert len(stack.queue.ready_ids("images")) == 1
    stack.close()


def test_a_submit_writes_its_record_alike_on_both_databases(engine, settings, manual_clock):
    """Two requests in one call, two operations, params, a callback URL with a comma
    and a key: the rows are the same whichever database (PostgreSQL writes them in one
    statement, SQLite in three); on PostgreSQL the submit makes three statements (the
    key's replays, the objects, the write), each its own transaction."""
    stack = open_stack(settings, engine, manual_clock, callback_hosts=["127.0.0.1"])
    person = make_user(stack, credits=10)
    first, second = make_object(stack, person), make_object(stack, person)
    url = "http://127.0.0.1:9/done?a=1,2"
    requests = [
        SubmitRequest(
            object_id=first,
            operations=["thumbnail", "convert"],
            params={"convert": {"format": "png"}},
            priority=7,
            callback_url=url,
            idempotency_key="k-1",
        ),
        SubmitRequest(object_id=second, operations=["thumbnail"]),
    ]
    said: list[tuple[str, bool | None]] = []

    def statement(conn, _cursor, text, *_args) -> None:
        # (the statement's verb, whether the driver commits it alone: no BEGIN/COMMIT)
        alone = getattr(conn.connection.dbapi_connection, "autocommit", None)
        said.append((text.split()[0].upper(), alone))

    event.listen(stack.engine, "before_cursor_execute", statement)
    try:
        results = stack.ingest.submit_many(person.caller, requests)
    finally:
        event.remove(stack.engine, "before_cursor_execute", statement)
    if engine.dialect.name == "postgresql":  # the key's replays, the objects, the write
        assert said == [("SELECT", True), ("SELECT", True), ("WITH", True)], said
    jobs = [j for r in results for j in r.jobs]
    with transaction(stack.engine) as conn:
        rows = {
            r.job_id: r
            for r in conn.execute(select(t.jobs).where(t.jobs.c.user_id == person.caller.user_id))
        }
        submissions = conn.execute(
            select(t.submissions).where(t.submissions.c.user_id == person.caller.user_id)
        ).all()
    assert sorted(rows) == sorted(j.job_id for j in jobs)
    now = manual_clock.now()
    for result, request in zip(results, requests, strict=True):
        for job in result.jobs:
            row = rows[job.job_id]
            assert (row.submission_id, row.object_id) == (result.submission_id, request.object_id)
            assert (row.operation, row.queue, row.priority) == (
                job.operation,
                job.queue,
                job.priority,
            )
            assert row.status == JobStatus.QUEUED.value
            assert (row.attempt_count, row.cancel_requested, row.claimed_by) == (0, False, None)
            assert row.estimated_millicredits == job.estimated_millicredits
            assert row.callback_url == request.callback_url
            assert row.created_at.timestamp() == row.queued_at.timestamp() == now
            assert row.updated_at.timestamp() == now
            assert row.max_attempts >= 1
    convert = next(j for j in jobs if j.operation == "convert")
    assert rows[convert.job_id].params["format"] == "png"
    assert rows[convert.job_id].profile_id != rows[results[0].jobs[0].job_id].profile_id
    by_id = {s.submission_id: s for s in submissions}
    assert sorted(by_id) == sorted(r.submission_id for r in results)
    keyed = by_id[results[0].submission_id]
    assert (keyed.idempotency_key, keyed.request_hash) == ("k-1", requests[0].fingerprint())
    assert keyed.estimated_millicredits == results[0].estimated_millicredits
    assert by_id[results[1].submission_id].idempotency_key is None
    assert _balance(stack, person) == accounts.Balance(
        10_000, sum(r.estimated_millicredits for r in results)
    )
    assert sorted(stack.queue.ready_ids("images")) == sorted(j.job_id for j in jobs)
    stack.close()


def test_a_completion_records_its_units_and_charges_what_it_is_given(
    engine, settings, manual_clock
):
    """The worker's completion (group commit) with the step's units of work: the attempt
    keeps them, the job is charged the actual the worker priced (here one escalation
    of the ocr profile's 0.25 on top of the 1.2 estimate)."""
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack, credits=10)
    obj = make_object(stack, person, size_bytes=1024 * 1024)
    stack.ingest.submit(person.caller, SubmitRequest(object_id=obj, operations=["ocr"]))
    (job,) = stack.dispatcher.claim("ocr", "w")
    assert job.estimated_millicredits == 1200
    stack.dispatcher.start(job, "w")
    units = {"page": 1, "ocr_page": 1, "engine_pass": 2, "escalation": 1}
    actual = stack.catalog.get("ocr").charge_millicredits(1200, units)
    finished = FinishedJob(job.job_id, actual_millicredits=actual, units=units)
    assert stack.dispatcher.complete_many("w", [finished]) == [True]
    view = stack.ingest.get_job(person.caller, job.job_id)
    assert (view.actual_millicredits, view.attempts[0].units) == (1450, units)
    assert _balance(stack, person) == accounts.Balance(10_000 - 1450, 0)
    stack.close()


def test_bad_requests_are_refused_before_anything_is_written(engine, settings, manual_clock):
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    big = make_object(stack, person, size_bytes=200 * 1024 * 1024)
    with pytest.raises(UnknownOperation) as caught:
        stack.ingest.submit(person.caller, SubmitRequest(object_id=big, operations=["nope"]))
    assert "thumbnail" in caught.value.details["known"]
    with pytest.raises(InputTooLarge):
        stack.ingest.submit(person.caller, SubmitRequest(object_id=big, operations=["thumbnail"]))
    with pytest.raises(InvalidRequest):
        stack.ingest.submit(
            person.caller,
            SubmitRequest(object_id=big, operations=["ocr"], params={"thumbnail": {"width": 1}}),
        )
    # A path on the worker is the operator's: a request may not point the engine at one.
    models = {"det": "/tmp/det", "rec": "/tmp/rec", "dict": "/tmp/k.txt", "languages": ["en"]}
    with pytest.raises(InvalidParams, match="paddle_models: set by the operator"):
        stack.ingest.submit(
            person.caller,
            SubmitRequest(
                object_id=big, operations=["ocr"], params={"ocr": {"paddle_models": models}}
            ),
        )
    with pytest.raises(ValueError, match="limits come from the profile"):
        SubmitRequest(
            object_id=big, operations=["thumbnail"], params={"thumbnail": {"max_pixels": 10**12}}
        )
    with pytest.raises(ValueError, match="operations must not repeat"):
        SubmitRequest(object_id=big, operations=["ocr", "ocr"])
    assert _count(stack.engine, t.jobs) == 0
    assert _balance(stack, person).reserved_millicredits == 0
    stack.close()


def test_request_params_override_profile_params(engine, settings, manual_clock):
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    obj = make_object(stack, person)
    stack.ingest.submit(
        person.caller,
        SubmitRequest(object_id=obj, operations=["thumbnail"], params={"thumbnail": {"width": 64}}),
    )
    (job,) = stack.dispatcher.claim("images", "w")
    assert job.params == {**stack.catalog.get("thumbnail").params, "width": 64}
    stack.close()


def test_cancel_queued_and_finished(engine, settings, manual_clock):
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    obj = make_object(stack, person)
    result = stack.ingest.submit(
        person.caller, SubmitRequest(object_id=obj, operations=["thumbnail", "ocr"])
    )
    queued, other = result.job_ids
    assert stack.ingest.cancel(person.caller, queued) is JobStatus.CANCELLED
    assert stack.queue.members("images") == {}
    # Cancelling again is harmless: same answer.
    assert stack.ingest.cancel(person.caller, queued) is JobStatus.CANCELLED
    (job,) = stack.dispatcher.claim("ocr", "w")
    stack.dispatcher.start(job, "w")
    stack.dispatcher.complete(job, "w")
    with pytest.raises(IllegalTransition) as caught:
        stack.ingest.cancel(person.caller, other)
    assert caught.value.status == 409
    stack.close()


def test_queue_overview_reports_depth_and_oldest_age(engine, settings, manual_clock):
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    obj = make_object(stack, person)
    stack.ingest.submit(person.caller, SubmitRequest(object_id=obj, operations=["thumbnail"]))
    manual_clock.advance(30)
    for _ in range(2):
        stack.ingest.submit(person.caller, SubmitRequest(object_id=obj, operations=["thumbnail"]))
    stack.dispatcher.claim("images", "w")
    manual_clock.advance(12)
    stats = {s.queue: s for s in stack.ingest.queue_overview()}
    images = stats["images"]
    assert (images.queued, images.in_flight, images.retry_wait) == (2, 1, 0)
    assert images.oldest_age_seconds == pytest.approx(12, abs=0.01)
    assert (images.redis_ready, images.redis_leased) == (2, 1)
    assert stats["ocr"].queued == 0 and stats["ocr"].oldest_age_seconds is None
    stack.close()
