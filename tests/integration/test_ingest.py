"""The ingest library: access, estimates, the 402 path, idempotency, limits."""

from __future__ import annotations

import logging
import threading
import time

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
from hypermedia.worker.execute import charge
from tests.factories import (
    image_inspection,
    make_object,
    make_user,
    open_stack,
    pdf_inspection,
    submit,
)


def _count(engine, table) -> int:
    with transaction(engine) as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def _balance(stack, person) -> accounts.Balance:
    with transaction(stack.engine) as conn:
        return accounts.balance(conn, person.caller.user_id)


def test_estimate_is_base_plus_per_mb_and_is_reserved(engine, settings, manual_clock):
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack, credits=10)
    obj = make_object(stack, person, size_bytes=5 * 1024 * 1024, inspection=image_inspection())
    result = stack.ingest.submit(
        person.caller, SubmitRequest(object_id=obj, operations=["thumbnail", "ocr"])
    )
    # thumbnail: 0.1 + 0.02 x 5 = 0.2; ocr: 1.0 + 0.2 x 5 = 2.0
    assert [j.estimated_millicredits for j in result.jobs] == [200, 2000]
    assert result.estimated_millicredits == 2200
    # ocr also holds its escalations at most: an image is one page, which the shipped
    # chain (3 engines) may escalate twice, at 0.25 each. thumbnail prices no unit.
    assert [j.reserved_millicredits for j in result.jobs] == [200, 2500]
    assert result.reserved_millicredits == 2700
    assert _balance(stack, person) == accounts.Balance(10_000, 2700)
    # Completing charges the actual cost and releases the reservation.
    (job,) = stack.dispatcher.claim("images", "w")
    stack.dispatcher.start(job, "w")
    stack.dispatcher.complete(job, "w", actual_millicredits=150)
    assert _balance(stack, person) == accounts.Balance(9850, 2500)
    # Cancelling releases the whole reservation without charging.
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
    obj = make_object(stack, person, size_bytes=5 * 1024 * 1024, inspection=image_inspection())
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
    # It needs its reservation (estimated 2.2, plus 0.5 for ocr's escalations at most).
    assert caught.value.details == {
        "required_credits": 2.7,
        "available_credits": 1.3,
        "estimated_credits": 2.2,
    }
    assert caught.value.message == (
        "not enough credits: this needs 2.7 reserved (estimated 2.2, plus 0.5 for the most"
        " its units of work may cost), 1.3 available"
    )
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
    assert _balance(stack, bob).reserved_millicredits == result.reserved_millicredits
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
    assert again.reserved_millicredits == first.reserved_millicredits
    assert [j.reserved_millicredits for j in again.jobs] == [
        j.reserved_millicredits for j in first.jobs
    ]
    assert _balance(stack, person).reserved_millicredits == first.reserved_millicredits
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
            # No unit of these profiles is priced: they reserve their estimates.
            assert row.reserved_millicredits == job.reserved_millicredits
            assert job.reserved_millicredits == job.estimated_millicredits
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
    of the ocr profile's 0.25 on top of the 1.2 estimate); the whole reservation (1.7:
    up to two escalations of the one page) is released."""
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack, credits=10)
    obj = make_object(stack, person, size_bytes=1024 * 1024, inspection=image_inspection())
    stack.ingest.submit(person.caller, SubmitRequest(object_id=obj, operations=["ocr"]))
    (job,) = stack.dispatcher.claim("ocr", "w")
    assert (job.estimated_millicredits, job.reserved_millicredits) == (1200, 1700)
    assert _balance(stack, person) == accounts.Balance(10_000, 1700)
    stack.dispatcher.start(job, "w")
    units = {"page": 1, "ocr_page": 1, "engine_pass": 2, "escalation": 1}
    actual = stack.catalog.get("ocr").charge_millicredits(1200, units)
    finished = FinishedJob(job.job_id, actual_millicredits=actual, units=units)
    assert stack.dispatcher.complete_many("w", [finished]) == [True]
    view = stack.ingest.get_job(person.caller, job.job_id)
    assert (view.actual_millicredits, view.attempts[0].units) == (1450, units)
    assert _balance(stack, person) == accounts.Balance(10_000 - 1450, 0)
    stack.close()


def test_an_ocr_job_needs_its_escalations_reserved(engine, settings, manual_clock):
    """An ocr job may be charged its estimate plus 0.25 per escalation: a submit holds
    the most its step may escalate for the input (a 3-page PDF, the shipped 3-engine
    chain: 2 escalations a page, 1.5) on top of the 1.2 estimate. An account holding
    exactly the estimate is refused (402, nothing created) instead of being charged
    past its balance; a chain of one engine (no escalation possible) reserves the
    estimate alone; an account holding the worst case is accepted."""
    stack = open_stack(settings, engine, manual_clock)
    short = make_user(stack, credits=1.2)
    obj = make_object(stack, short, size_bytes=1024 * 1024, inspection=pdf_inspection(3))
    with pytest.raises(PaymentRequired) as caught:
        stack.ingest.submit(short.caller, SubmitRequest(object_id=obj, operations=["ocr"]))
    assert caught.value.status == 402
    assert caught.value.details == {
        "required_credits": 2.7,
        "available_credits": 1.2,
        "estimated_credits": 1.2,
    }
    assert "this needs 2.7 reserved" in caught.value.message
    assert _count(stack.engine, t.jobs) == _count(stack.engine, t.submissions) == 0
    assert _balance(stack, short) == accounts.Balance(1200, 0)
    assert stack.queue.ready_ids("ocr") == []
    one_engine = SubmitRequest(
        object_id=obj, operations=["ocr"], params={"ocr": {"engines": ["ppocr"]}}
    )
    alone = stack.ingest.submit(short.caller, one_engine)
    assert (alone.estimated_millicredits, alone.reserved_millicredits) == (1200, 1200)
    assert _balance(stack, short) == accounts.Balance(1200, 1200)
    enough = make_user(stack, credits=2.7)
    mine = make_object(stack, enough, size_bytes=1024 * 1024, inspection=pdf_inspection(3))
    result = stack.ingest.submit(enough.caller, SubmitRequest(object_id=mine, operations=["ocr"]))
    assert (result.estimated_millicredits, result.reserved_millicredits) == (1200, 2700)
    (job,) = result.jobs
    assert (job.estimated_millicredits, job.reserved_millicredits) == (1200, 2700)
    assert _balance(stack, enough) == accounts.Balance(2700, 2700)
    view = stack.ingest.get_job(enough.caller, job.job_id)
    assert (view.estimated_millicredits, view.reserved_millicredits) == (1200, 2700)
    stack.close()


def test_a_completion_charges_at_most_the_reservation(engine, settings, manual_clock, caplog):
    """Accounts holding exactly ocr jobs' reservations (1.2 + 6 escalations of a 3-page
    PDF at 0.25): a completion that reports its worst case is charged all of it; one
    whose step reports more than it bounds (a bug in the bound) is charged the
    reservation, with a warning, never more; the completion's statement caps what it
    is handed too. Balances end at 0, never below; every reservation is released."""
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack, credits=3 * 2.7)
    for _ in range(3):
        obj = make_object(stack, person, size_bytes=1024 * 1024, inspection=pdf_inspection(3))
        stack.ingest.submit(person.caller, SubmitRequest(object_id=obj, operations=["ocr"]))
    assert _balance(stack, person) == accounts.Balance(8100, 8100)
    jobs = stack.dispatcher.claim("ocr", "w", count=3)
    assert [j.reserved_millicredits for j in jobs] == [2700] * 3
    profile = stack.catalog.get("ocr")

    def units(escalations: int) -> dict[str, int]:
        return {"page": 3, "ocr_page": 3, "engine_pass": 3 + escalations, "escalation": escalations}

    with caplog.at_level(logging.WARNING, logger="hypermedia.worker.execute"):
        assert charge(jobs[0], profile, units(6)) == 2700
        assert not caplog.records
        assert charge(jobs[1], profile, units(9)) == 2700  # 3450 reported
    (warning,) = caplog.records
    assert "more units of work than it bounds" in warning.getMessage()
    assert "charged the 2700 millicredits reserved, not 3450" in warning.getMessage()
    finished = [
        FinishedJob(jobs[0].job_id, actual_millicredits=2700, units=units(6)),
        FinishedJob(jobs[1].job_id, actual_millicredits=2700, units=units(9)),
        FinishedJob(jobs[2].job_id, actual_millicredits=3450, units=units(9)),
    ]
    for job in jobs:
        stack.dispatcher.start(job, "w")
    assert stack.dispatcher.complete_many("w", finished) == [True] * 3
    views = [stack.ingest.get_job(person.caller, j.job_id) for j in jobs]
    assert [v.actual_millicredits for v in views] == [2700] * 3
    assert views[2].attempts[0].units == units(9)  # recorded as reported
    assert _balance(stack, person) == accounts.Balance(0, 0)
    with transaction(stack.engine) as conn:
        ledger = conn.execute(
            select(t.credit_ledger.c.amount_millicredits).where(t.credit_ledger.c.kind == "charge")
        ).scalars()
        assert sorted(ledger) == [-2700] * 3
    stack.close()


def test_failure_and_cancel_release_the_whole_reservation(engine, settings, manual_clock):
    """An ocr job holds its estimate and its escalations at most (1.2 + 1.5 on a 3-page
    PDF): cancelled while queued, failed for good, cancelled while it runs, each gives
    all of it back and is charged nothing."""
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack, credits=10)
    job_ids = []
    for _ in range(3):
        obj = make_object(stack, person, size_bytes=1024 * 1024, inspection=pdf_inspection(3))
        result = stack.ingest.submit(
            person.caller, SubmitRequest(object_id=obj, operations=["ocr"])
        )
        job_ids.extend(result.job_ids)
    assert _balance(stack, person) == accounts.Balance(10_000, 3 * 2700)
    assert stack.ingest.cancel(person.caller, job_ids[0]) is JobStatus.CANCELLED
    assert _balance(stack, person) == accounts.Balance(10_000, 2 * 2700)
    failing, running = stack.dispatcher.claim("ocr", "w", count=2)
    stack.dispatcher.start(failing, "w")
    status = stack.dispatcher.fail(failing, "w", "invalid_input", "bad page", retryable=False)
    assert status is JobStatus.FAILED
    assert _balance(stack, person) == accounts.Balance(10_000, 2700)
    stack.dispatcher.start(running, "w")
    assert stack.ingest.cancel(person.caller, running.job_id) is JobStatus.PROCESSING
    assert stack.dispatcher.honour_cancel(running, "w")
    assert stack.ingest.get_job(person.caller, running.job_id).status == "cancelled"
    assert _balance(stack, person) == accounts.Balance(10_000, 0)
    assert _count(stack.engine, t.credit_ledger) == 1  # the grant: nothing charged
    stack.close()


def test_a_removal_of_credits_leaves_what_unfinished_jobs_hold(engine, settings, manual_clock):
    """An operator's removal (``credits grant USER -- -N``) takes at most what is
    available: the credits a queued job holds stay, so its charge never takes the
    balance below zero."""
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack, credits=0.2)
    user_id = person.caller.user_id
    submit(stack, person, ["thumbnail"])  # 0.1 + 0.02 x 1 KiB: 0.101 reserved
    assert _balance(stack, person) == accounts.Balance(200, 101)
    refused = r"cannot remove 0.2 credits: 0.099 available \(balance 0.2, 0.101 reserved"
    with pytest.raises(Conflict, match=refused), transaction(stack.engine) as conn:
        accounts.grant_credits(conn, user_id, -200, manual_clock.now())
    assert _balance(stack, person) == accounts.Balance(200, 101)
    with transaction(stack.engine) as conn:
        assert accounts.grant_credits(conn, user_id, -99, manual_clock.now()) == 101
    with pytest.raises(Conflict, match="0 available"), transaction(stack.engine) as conn:
        accounts.grant_credits(conn, user_id, -1, manual_clock.now())
    (job,) = stack.dispatcher.claim("images", "w")
    stack.dispatcher.start(job, "w")
    assert stack.dispatcher.complete(job, "w")
    assert _balance(stack, person) == accounts.Balance(0, 0)
    with transaction(stack.engine) as conn:
        ledger = conn.execute(
            select(t.credit_ledger.c.kind, t.credit_ledger.c.amount_millicredits).order_by(
                t.credit_ledger.c.entry_id
            )
        ).all()
    assert [tuple(r) for r in ledger] == [("grant", 200), ("adjust", -99), ("charge", -101)]
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


def test_a_cancel_between_a_submits_commit_and_its_push_leaves_no_ready_job(
    engine, settings, manual_clock
):
    """Each job of a submit cancelled (DELETE /jobs/{id}) after the submit committed but
    before its push reached Redis: the cancel's removal ran first and found nothing,
    then the push made the cancelled jobs ready, where the scheduler reads a queue's
    depth (Redis's, not the record's): 12 jobs that will never run read as demand for a
    burst worker until the reconciler's next pass. The cancel's removal now leaves a
    tombstone the push honours, and no read of the record is added to the submit."""
    from autoscaler.policy import table_row
    from autoscaler.scheduler import queue_state

    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    obj = make_object(stack, person)
    requests = [SubmitRequest(object_id=obj, operations=["thumbnail"]) for _ in range(12)]
    push = stack.queue.enqueue
    committed, go = threading.Event(), threading.Event()
    pushed: list[int] = []
    results, errors = [], []

    def held(name: str, entries: list[tuple[str, int]]) -> int:
        committed.set()  # the submit's transaction has committed: it pushes now
        assert go.wait(30)
        pushed.append(push(name, entries))
        return pushed[-1]

    def submitting() -> None:
        try:
            results.extend(stack.ingest.submit_many(person.caller, requests))
        except BaseException as exc:
            errors.append(exc)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stack.queue, "enqueue", held)
        submitter = threading.Thread(target=submitting)
        submitter.start()
        try:
            assert committed.wait(30)
            with transaction(stack.engine) as conn:
                job_ids = list(conn.execute(select(t.jobs.c.job_id)).scalars())
            assert len(job_ids) == 12
            for job_id in job_ids:
                assert stack.ingest.cancel(person.caller, job_id) is JobStatus.CANCELLED
        finally:
            go.set()
            submitter.join(30)
    assert not errors, errors
    assert sorted(job for r in results for job in r.job_ids) == sorted(job_ids)
    seen = queue_state(stack.queue, "images", time.time())  # ids: the wall clock's
    assert (seen.depth, table_row(seen.depth, seen.oldest_age_seconds).burst) == (0, 0)
    assert pushed == [0]  # none made ready
    assert stack.queue.members("images") == {}
    assert {stack.ingest.get_job(person.caller, j).status for j in job_ids} == {"cancelled"}
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
