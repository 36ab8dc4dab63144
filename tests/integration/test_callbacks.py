"""Completion webhooks on real PostgreSQL / SQLite and a real HTTP receiver: the outbox
row written with the terminal status, one signed delivery per event, retries with the
same event id, a sender killed mid-send, the allowlist."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from psycopg.sql import Literal
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.event import listen, remove

from hypermedia import callbacks, webhooks
from hypermedia.callbacks import CallbackSender
from hypermedia.clock import to_datetime
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.ingest.api import create_app
from hypermedia.jobs import callbacks as outbox
from hypermedia.jobs.repository import FinishedJob
from hypermedia.stack import Stack
from tests.factories import make_object, make_user, open_stack, submit
from tests.webhook_receiver import Received, receiving

SECRET = "callback-secret-for-tests-" + "x" * 20
P = "/v1/hypermedia"


@pytest.fixture
def stack(engine, settings, manual_clock) -> Iterator[Stack]:
    opened = open_stack(
        settings,
        engine,
        manual_clock,
        callback_hosts=["127.0.0.1"],
        callback_secret=SECRET,
        callback_max_attempts=2,
    )
    yield opened
    opened.close()


def _sender(stack: Stack) -> CallbackSender:
    return CallbackSender.from_settings(stack.engine, stack.settings, stack.clock, stack.metrics)


def _local_callbacks(settings, engine, clock, **overrides: Any) -> Stack:
    """A stack on SQLite whose callbacks may go to this machine's receivers."""
    return open_stack(
        settings, engine, clock, callback_hosts=["127.0.0.1"], callback_secret=SECRET, **overrides
    )


def _outbox(stack: Stack) -> dict[str, Any]:
    with transaction(stack.engine) as conn:
        return {r.job_id: r for r in conn.execute(select(t.callbacks)).all()}


def _key(person: Any) -> dict[str, str]:
    return {"Authorization": f"Bearer {person.api_key}"}


def _verified(request: Received) -> dict[str, Any]:
    signature = request.headers[webhooks.SIGNATURE_HEADER]
    assert webhooks.verify(SECRET, request.body, signature, time.time())
    assert not webhooks.verify("another-secret-" + "y" * 30, request.body, signature, time.time())
    body: dict[str, Any] = request.json()
    assert request.headers[webhooks.DELIVERY_HEADER] == body["id"]
    return body


def test_every_terminal_event_is_written_with_its_status_and_delivered_once(stack):
    person = make_user(stack)
    with receiving() as receiver:
        done, failed, queued_cancel, running_cancel = (
            submit(stack, person, ["thumbnail"], callback_url=receiver.url)[0] for _ in range(4)
        )
        plain = submit(stack, person, ["thumbnail"])[0]
        assert stack.ingest.cancel(person.caller, queued_cancel).value == "cancelled"
        claimed = {j.job_id: j for j in stack.dispatcher.claim_and_start("images", "w", 10)}
        assert set(claimed) == {done, failed, running_cancel, plain}
        assert stack.dispatcher.complete_many("w", [FinishedJob(done), FinishedJob(plain)]) == [
            True,
            True,
        ]
        stack.dispatcher.fail(claimed[failed], "w", "invalid_input", "bad bytes", retryable=False)
        stack.ingest.cancel(person.caller, running_cancel)  # running: asked to stop
        assert stack.dispatcher.honour_cancel(claimed[running_cancel], "w")

        # Each event's row came with its status (nothing was sent yet); none for the job
        # without a callback.
        rows = _outbox(stack)
        expected = {
            done: "completed",
            failed: "failed",
            queued_cancel: "cancelled",
            running_cancel: "cancelled",
        }
        assert {job_id: r.event for job_id, r in rows.items()} == expected
        for job_id, row in rows.items():
            assert row.event_id == outbox.event_id(job_id, row.event)
            assert (row.status, row.attempts) == ("pending", 0)
        assert receiver.taken() == []

        sent = _sender(stack).deliver_due()
        assert sorted(d.job_id for d in sent) == sorted(expected)
        assert all(d.delivered and d.response_code == 200 for d in sent)
        assert _sender(stack).deliver_due() == []  # once each
        got = {body["job"]["job_id"]: body for body in map(_verified, receiver.taken())}
    assert set(got) == set(expected)
    for job_id, event in expected.items():
        body = got[job_id]
        assert body["type"] == f"job.{event}"
        assert body["id"] == outbox.event_id(job_id, event)
        assert body["job"]["status"] == event
        assert "callback" not in body["job"]
    assert got[failed]["job"]["error_code"] == "invalid_input"
    assert got[done]["job"]["actual_credits"] is not None
    view = stack.ingest.get_job(person.caller, done)
    assert view.callback is not None
    assert (view.callback.status, view.callback.attempts, view.callback.response_code) == (
        "delivered",
        1,
        200,
    )
    assert stack.ingest.get_job(person.caller, plain).callback is None


def test_an_error_answer_is_retried_with_the_same_event_and_body_up_to_the_limit(
    stack, manual_clock
):
    person = make_user(stack)
    with receiving() as receiver:
        first, second = (
            submit(stack, person, ["thumbnail"], callback_url=receiver.url)[0] for _ in range(2)
        )
        for job_id in (first, second):
            stack.ingest.cancel(person.caller, job_id)
        receiver.answers = [500, 503, 500]  # the first attempts of both, then the second's
        sender = _sender(stack)
        assert [(d.delivered, d.response_code) for d in sender.deliver_due()] == [
            (False, 500),
            (False, 503),
        ]
        rows = _outbox(stack)
        assert (rows[first].status, rows[first].attempts, rows[first].last_error) == (
            "pending",
            1,
            "answered 500",
        )
        view = stack.ingest.get_job(person.caller, first)
        assert view.callback is not None and view.callback.response_code == 500
        assert sender.deliver_due() == []  # not due before its backoff
        manual_clock.advance(webhooks.backoff(1))
        outcome = {d.job_id: (d.attempt, d.delivered) for d in sender.deliver_due()}
        assert outcome == {first: (2, False), second: (2, True)}
        requests = receiver.taken()
    rows = _outbox(stack)
    assert (rows[first].status, rows[first].attempts) == ("failed", 2)  # callback_max_attempts
    assert (rows[second].status, rows[second].attempts) == ("delivered", 2)
    for job_id in (first, second):
        mine = [r for r in requests if _verified(r)["job"]["job_id"] == job_id]
        assert len(mine) == 2
        assert len({r.headers[webhooks.DELIVERY_HEADER] for r in mine}) == 1
        assert mine[0].body == mine[1].body
    manual_clock.advance(3600)
    assert sender.deliver_due() == []  # failed and delivered are final


def test_a_sender_killed_mid_send_leaves_the_event_to_be_sent_again_once(stack, manual_clock):
    person = make_user(stack)
    with receiving() as receiver:
        job_id = submit(stack, person, ["thumbnail"], callback_url=receiver.url)[0]
        stack.ingest.cancel(person.caller, job_id)
        row = _outbox(stack)[job_id]
        sender = _sender(stack)
        hold = manual_clock.now() + sender.timeout_seconds + webhooks.backoff(1)
        with transaction(stack.engine) as conn:  # claimed, then the sender died
            assert outbox.claim(conn, row.event_id, 0, manual_clock.now(), hold)
        assert sender.deliver_due() == []
        manual_clock.advance(hold - manual_clock.now())
        assert [d.attempt for d in sender.deliver_due()] == [2]
        assert [_verified(r)["id"] for r in receiver.taken()] == [row.event_id]


def test_a_callback_url_off_the_allowlist_is_refused_and_creates_nothing(stack):
    person = make_user(stack)
    object_id = make_object(stack, person)
    with TestClient(create_app(stack, auth_cache_seconds=0)) as api:

        def process(url: str) -> Any:
            body = {"object_id": object_id, "operations": ["thumbnail"], "callback_url": url}
            return api.post(f"{P}/process", json=body, headers=_key(person))

        refused = {
            "http://169.254.169.254/latest/meta-data/": "callback_not_allowed",
            "http://localhost:8080/hook": "callback_not_allowed",
            "https://127.0.0.1.evil.example/hook": "callback_not_allowed",
            "http://127.0.0.1@evil.example/hook": "invalid_request",  # credentials
            "ftp://127.0.0.1/hook": "invalid_request",
            "http://127.0.0.1:99999/hook": "invalid_request",
            "not a url": "invalid_request",
        }
        for url, code in refused.items():
            response = process(url)
            assert response.status_code == 422, (url, response.text)
            assert response.json()["error"]["code"] == code, url
        accepted = process("http://127.0.0.1:9/hook?token=abc")
        assert accepted.status_code == 202, accepted.text
        job_id = accepted.json()["job_ids"][0]
        job = api.get(f"{P}/jobs/{job_id}", headers=_key(person)).json()
        assert job["callback_url"] == "http://127.0.0.1:9/hook?token=abc"
        assert job["callback"] is None  # not ended yet
    with transaction(stack.engine) as conn:
        assert conn.execute(select(t.jobs.c.job_id)).scalars().all() == [job_id]


def test_a_port_in_the_allowlist_allows_that_port_only(settings, sqlite_engine, manual_clock):
    stack = open_stack(settings, sqlite_engine, manual_clock, callback_hosts=["Hooks.Local:8443"])
    try:
        person = make_user(stack)
        allowed = submit(stack, person, ["thumbnail"], callback_url="https://hooks.local:8443/x")
        assert len(allowed) == 1
        for url in ("https://hooks.local/x", "http://hooks.local:8444/x"):
            with pytest.raises(Exception, match="callback_url") as refused:
                submit(stack, person, ["thumbnail"], callback_url=url)
            assert getattr(refused.value, "code", None) == "callback_not_allowed"
    finally:
        stack.close()


def test_an_ipv6_host_refused_is_named_in_brackets(settings, sqlite_engine, manual_clock):
    """The refusal named an IPv6 receiver '::1:9001', which reads as another address
    and no port (and is no entry callback_hosts takes): it is '[::1]:9001', as a URL
    and the allowlist write it; that entry allows it."""
    stack = open_stack(settings, sqlite_engine, manual_clock, callback_hosts=["[::1]:9000"])
    try:
        person = make_user(stack)
        assert len(submit(stack, person, ["thumbnail"], callback_url="http://[::1]:9000/x")) == 1
        with pytest.raises(Exception, match="callback_url") as refused:
            submit(stack, person, ["thumbnail"], callback_url="http://[::1]:9001/x")
        assert getattr(refused.value, "code", None) == "callback_not_allowed"
        assert str(refused.value).startswith("callback_url: [::1]:9001 is not a host"), str(
            refused.value
        )
        with pytest.raises(Exception, match=r"callback_url: hooks\.example:443 is not"):
            submit(stack, person, ["thumbnail"], callback_url="https://hooks.example/x")
    finally:
        stack.close()


def test_a_host_is_allowed_in_any_of_its_spellings_and_only_its_own(
    settings, sqlite_engine, manual_clock
):
    """The allowlist compares the name the HTTP client connects to: a trailing root dot
    and a Unicode name whose IDNA form is listed are the host they name (they were
    refused), and no spelling of another host passes."""
    hosts = ["xn--bcher-kva.example", "hooks.example."]
    stack = open_stack(settings, sqlite_engine, manual_clock, callback_hosts=hosts)
    try:
        person = make_user(stack)
        for url in (
            "https://bücher.example/x",
            "https://BÜCHER.example./x",
            "https://hooks.example/x",
            "https://hooks.example./x",
        ):
            assert len(submit(stack, person, ["thumbnail"], callback_url=url)) == 1, url
        for url in (
            "https://bucher.example/x",
            "https://hooks.example../x",
            "https://xn--bcher-kva.example.evil/x",
        ):
            with pytest.raises(Exception, match="callback_url") as refused:
                submit(stack, person, ["thumbnail"], callback_url=url)
            assert getattr(refused.value, "code", None) == "callback_not_allowed", url
    finally:
        stack.close()


class _Passes:
    """A stop event for a sender's loop: runs ``then`` (pass number -> action) after
    those passes and is set after the last."""

    def __init__(self, then: dict[int, Any]) -> None:
        self.then = then
        self.passes = 0

    def is_set(self) -> bool:
        return self.passes >= max(self.then)

    def wait(self, timeout: float) -> bool:
        self.passes += 1
        self.then[self.passes]()
        return self.is_set()


def test_a_database_outage_is_one_warning_line_not_a_traceback_every_pass(
    sqlite_engine, settings, manual_clock, caplog
):
    """The sender polls every second: a database that is down was an ERROR with the
    whole traceback each pass (60 a minute in the head's log for a one-minute outage).
    It is one warning naming the cause when the outage starts, a line when it ends."""
    from hypermedia.db.engine import make_engine
    from hypermedia.embedded import free_port

    down = make_engine(f"postgresql+psycopg://hm:pw-never-logged@127.0.0.1:{free_port()}/hm")
    sender = CallbackSender.from_settings(down, settings(callback_secret=SECRET), manual_clock)

    def use(engine: Any) -> Any:
        return lambda: setattr(sender, "engine", engine)

    steps = {n: (lambda: None) for n in range(1, 29)}
    steps[20], steps[23] = use(sqlite_engine), use(down)  # down 20 passes, up 3, down 5
    caplog.set_level("INFO", logger="hypermedia.callbacks")
    try:
        sender.run(_Passes(steps), 0.0)  # type: ignore[arg-type]
    finally:
        down.dispose()
    records = [r for r in caplog.records if r.name == "hypermedia.callbacks"]
    assert [r.levelname for r in records] == ["WARNING", "INFO", "WARNING"]
    assert not any(r.exc_info for r in records)
    assert "database unreachable" in records[0].getMessage()
    assert "pw-never-logged" not in caplog.text


def test_a_callback_url_the_http_client_refuses_is_refused_at_submit_and_never_stalls_the_sender(
    settings, sqlite_engine, manual_clock
):
    """A control character in the URL (a DEL, a tab in the host ...) passed the submit's
    check but httpx refuses it with InvalidURL, which is no HTTPError: the sender's pass
    raised on that row, left it claimed and unanswered, and never sent the rows after it.
    The submit refuses it now, naming callback_url; a row that holds one anyway fails its
    attempt and the pass goes on."""
    stack = _local_callbacks(settings, sqlite_engine, manual_clock, callback_max_attempts=1)
    try:
        person = make_user(stack)
        with receiving() as receiver:
            for bad in (receiver.url + "\x7f", receiver.url.replace(":", ":\t", 2)):
                with pytest.raises(ValidationError, match="callback_url"):
                    submit(stack, person, ["thumbnail"], callback_url=bad)
            bad_job, good_job = (
                submit(stack, person, ["thumbnail"], callback_url=receiver.url)[0] for _ in range(2)
            )
            with transaction(stack.engine) as conn:  # as a row written before the check
                conn.execute(
                    t.jobs.update()
                    .where(t.jobs.c.job_id == bad_job)
                    .values(callback_url=receiver.url + "\x7f")
                )
            for job_id in (bad_job, good_job):
                stack.ingest.cancel(person.caller, job_id)
            sent = {d.job_id: d for d in _sender(stack).deliver_due()}
            assert (sent[bad_job].delivered, sent[bad_job].error) == (False, "InvalidURL")
            assert sent[good_job].delivered
            assert [_verified(r)["job"]["job_id"] for r in receiver.taken()] == [good_job]
        rows = _outbox(stack)
        assert (rows[bad_job].status, rows[bad_job].attempts) == ("failed", 1)
    finally:
        stack.close()


def test_a_receiver_that_does_not_answer_holds_its_own_callbacks_not_the_others(
    settings, sqlite_engine, manual_clock
):
    """The sender sent one row after another: a receiver that took its whole timeout to
    (not) answer held every other user's callbacks behind each of its own (8 attempts of
    10 s a row). Each receiver has its own lane now, the lanes side by side, and a lane
    whose attempt timed out leaves its other rows to the next pass."""
    # 3 s, not 1: on a loaded CI machine the quick receiver once took over 1 s to answer
    # (its second row failed "no answer in 3 s" and its third stayed behind it).
    stack = _local_callbacks(settings, sqlite_engine, manual_clock, callback_timeout_seconds=3)
    try:
        person = make_user(stack)
        with receiving() as slow, receiving() as quick:
            slow.hold.set()  # it reads each request and answers none
            held = [
                submit(stack, person, ["thumbnail"], callback_url=slow.url)[0] for _ in range(3)
            ]
            answered = [
                submit(stack, person, ["thumbnail"], callback_url=quick.url)[0] for _ in range(3)
            ]
            for job_id in (*held, *answered):
                stack.ingest.cancel(person.caller, job_id)
            sent = _sender(stack).deliver_due()
            tried = [d for d in sent if d.job_id in held]
            assert len(tried) == 1, tried  # one timed out: the other two wait for a pass
            assert tried[0].error == "no answer in 3 s"
            assert sorted(d.job_id for d in sent if d.delivered) == sorted(answered)
            assert len(quick.taken()) == 3
        rows = _outbox(stack)
        assert sorted(rows[j].attempts for j in held) == [0, 0, 1]
    finally:
        stack.close()


def test_a_backlog_on_a_receiver_that_does_not_answer_holds_no_other_receivers_callbacks(
    settings, engine, manual_clock
):
    """A pass takes the oldest due rows (callbacks.BATCH): a receiver that did not answer
    with more events due than one pass takes had them all taken again each pass, one of
    them tried (its timeout) and the rest left due, so another receiver's callback waited
    behind every one of them (5,000 events at 10 s: 14 hours). Now the first that gets no
    answer puts the receiver's other due events behind its own retry, attempts uncounted."""
    stack = _local_callbacks(settings, engine, manual_clock, callback_timeout_seconds=3)
    try:
        person = make_user(stack)
        with receiving() as slow, receiving() as quick:
            slow.hold.set()  # it reads each request and answers none
            held = [
                submit(stack, person, ["thumbnail"], callback_url=slow.url)[0]
                for _ in range(callbacks.BATCH + 10)
            ]
            for job_id in held:
                stack.ingest.cancel(person.caller, job_id)
            manual_clock.advance(1)
            answered = submit(stack, person, ["thumbnail"], callback_url=quick.url)[0]
            stack.ingest.cancel(person.caller, answered)
            sender = _sender(stack)
            first = {d.job_id: d for d in sender.deliver_due()}  # both lanes
            assert first.pop(answered).delivered
            assert [d.error for d in first.values()] == ["no answer in 3 s"]
            assert len(quick.taken()) == 1
            assert sender.deliver_due() == []  # the slow receiver's wait for its retry
            rows = _outbox(stack)
            assert sorted(rows[j].attempts for j in held) == [0] * (len(held) - 1) + [1]
            # The slow receiver's others are due with its retry, the first in line first.
            retry = max(rows[j].next_attempt_at for j in held)
            assert all(rows[j].next_attempt_at == retry for j in held if rows[j].attempts == 0)
            manual_clock.advance(webhooks.backoff(1) + 1)
            slow.hold.clear()
            slow.release.set()
            after = sender.deliver_due() + sender.deliver_due()  # a pass takes 50
            assert len(after) == len(held) and all(d.delivered for d in after)
            # All of them, each once more than the one it did not answer, in order.
            arrived = [r.json()["job"]["job_id"] for r in slow.taken()]
            assert arrived[-len(held) :] == held and len(arrived) == len(held) + 1
    finally:
        stack.close()


def test_a_receiver_busy_with_its_lane_never_holds_the_next_pass_for_the_others(
    settings, engine, manual_clock
):
    """A pass waited for its slowest lane before the next began: while one receiver
    took its timeout (or answered just inside it, each of up to 50 rows), a callback to
    any other receiver that became due waited for the whole lane. The head's loop now
    starts a pass every poll, lanes for the receivers not busy, and its due rows are
    read past a busy receiver's (however many)."""
    stack = _local_callbacks(settings, engine, manual_clock, callback_timeout_seconds=20)
    stop = threading.Event()
    sender = _sender(stack)
    loop = threading.Thread(target=sender.run, args=(stop, 0.05), daemon=True)
    try:
        person = make_user(stack)
        with receiving() as slow, receiving() as quick:
            slow.hold.set()  # it reads each request and answers none until released
            held = [
                submit(stack, person, ["thumbnail"], callback_url=slow.url)[0]
                for _ in range(callbacks.BATCH + 10)
            ]
            for job_id in held:
                stack.ingest.cancel(person.caller, job_id)
            loop.start()
            assert slow.arrived.wait(10)
            answered = submit(stack, person, ["thumbnail"], callback_url=quick.url)[0]
            stack.ingest.cancel(person.caller, answered)
            began = time.monotonic()
            while not quick.requests and time.monotonic() - began < 10:
                time.sleep(0.02)
            waited = time.monotonic() - began
            assert [r.json()["job"]["job_id"] for r in quick.taken()] == [answered]
            assert waited < 5, waited  # not the slow lane's 20 s
            assert not slow.requests  # still held
            slow.hold.clear()
            slow.release.set()
            began = time.monotonic()
            while len(slow.requests) < len(held) and time.monotonic() - began < 20:
                time.sleep(0.05)
            assert sorted(r.json()["job"]["job_id"] for r in slow.taken()) == sorted(held)
    finally:
        stop.set()
        if loop.ident is not None:
            loop.join(30)
        stack.close()


def _scraped(stack: Stack) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = stack.metrics.exposition().decode()  # type: ignore[attr-defined]
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith("hypermedia_callbacks_")
        for sample in family.samples
    }


def test_the_outbox_backlog_is_scraped(stack, manual_clock):
    """Callbacks had no metric: a receiver down for hours, or a sender stopped, showed
    nowhere but in each job's GET. The head's /metrics reads the outbox: pending
    (waiting for a retry too), given up, and the oldest pending one's age since its
    job ended."""
    person = make_user(stack)
    with receiving() as receiver:
        first, second, third = (
            submit(stack, person, ["thumbnail"], callback_url=receiver.url)[0] for _ in range(3)
        )
        assert _scraped(stack) == {
            "hypermedia_callbacks_pending": 0.0,
            "hypermedia_callbacks_failed": 0.0,
            "hypermedia_callbacks_oldest_pending_age_seconds": 0.0,
            "hypermedia_callbacks_oldest_overdue_seconds": 0.0,
        }
        for job_id in (first, second, third):
            stack.ingest.cancel(person.caller, job_id)
        manual_clock.advance(100)
        assert _scraped(stack) == {
            "hypermedia_callbacks_pending": 3.0,
            "hypermedia_callbacks_failed": 0.0,
            "hypermedia_callbacks_oldest_pending_age_seconds": 100.0,
            "hypermedia_callbacks_oldest_overdue_seconds": 100.0,  # due since their jobs ended
        }
        receiver.answers = [500, 200, 200]
        sender = _sender(stack)
        assert [d.delivered for d in sender.deliver_due()] == [False, True, True]
        manual_clock.advance(webhooks.backoff(1))
        scraped = _scraped(stack)
        assert scraped["hypermedia_callbacks_pending"] == 1.0  # waiting for its retry
        assert scraped["hypermedia_callbacks_oldest_pending_age_seconds"] == pytest.approx(
            100 + webhooks.backoff(1)
        )
        receiver.answers = [500]
        assert [d.delivered for d in sender.deliver_due()] == [False]  # the 2nd: given up
    assert _scraped(stack) == {
        "hypermedia_callbacks_pending": 0.0,
        "hypermedia_callbacks_failed": 1.0,
        "hypermedia_callbacks_oldest_pending_age_seconds": 0.0,
        "hypermedia_callbacks_oldest_overdue_seconds": 0.0,
        # The sender's last attempt (absent before its first, above).
        "hypermedia_callbacks_last_attempt_timestamp_seconds": manual_clock.now(),
    }


def test_given_up_callbacks_are_kept_for_their_retention_and_scraped_for_the_last_hour(
    stack, manual_clock
):
    """``hypermedia_callbacks_failed`` counted every ``failed`` row the outbox held, and
    nothing ever deleted one: the table grew with every event given up and the gauge
    only went up (the dashboard drew its ``delta`` for the new ones). Now the head's
    maintenance deletes those given up longer ago than ``callback_failed_retention_
    seconds`` (7 days), and the gauge counts those given up in the last hour: an event
    given up two days ago is no longer counted, one given up 8 days ago is gone, those
    given up 6 days ago are kept. The job whose event is gone showed ``callback: null``,
    as if it had named none; it now says its callback failed after its 2 attempts (in
    ``GET /jobs/{id}`` too), without the outbox's times and last answer."""
    from hypermedia.server import Maintenance
    from tests.support import within

    assert stack.settings.callback_failed_retention_seconds == 7 * 86_400
    person = make_user(stack)
    maintenance = Maintenance(stack, reaper_interval=1, reconcile_interval=60)

    def give_up(job_ids: list[str]) -> None:
        for job_id in job_ids:
            stack.ingest.cancel(person.caller, job_id)
        for attempt in (1, 2):  # callback_max_attempts
            deliveries = _sender(stack).deliver_due()
            assert [(d.job_id, d.delivered) for d in deliveries] == [(j, False) for j in job_ids]
            manual_clock.advance(webhooks.backoff(attempt))

    with receiving() as receiver:
        receiver.answers = [500] * 6
        old, *recent = (
            submit(stack, person, ["thumbnail"], callback_url=receiver.url)[0] for _ in range(3)
        )
        give_up([old])
        manual_clock.advance(2 * 86_400)
        give_up(recent)
    assert {r.job_id: r.status for r in _outbox(stack).values()} == dict.fromkeys(
        [old, *recent], "failed"
    )
    assert _scraped(stack)["hypermedia_callbacks_failed"] == 2.0  # the last hour's
    manual_clock.advance(3600)
    assert _scraped(stack)["hypermedia_callbacks_failed"] == 0.0
    maintenance.prune_callbacks()
    assert len(_outbox(stack)) == 3  # none past its retention yet
    manual_clock.advance(6 * 86_400)
    maintenance.start()  # its loop prunes at once, then every CALLBACK_PRUNE_SECONDS
    try:
        assert within(30, lambda: len(_outbox(stack)) == 2)
    finally:
        maintenance.stop()
    assert sorted(_outbox(stack)) == sorted(recent)
    kept = stack.ingest.get_job(person.caller, recent[0]).callback
    assert kept is not None and (kept.status, kept.response_code) == ("failed", 500)
    with TestClient(create_app(stack, auth_cache_seconds=0)) as api:
        job = api.get(f"{P}/jobs/{old}", headers=_key(person)).json()
    assert job["callback"] == {
        "event_id": outbox.event_id(old, "cancelled"),
        "event": "cancelled",
        "status": "failed",
        "attempts": 2,
        "next_attempt_at": None,
        "last_attempt_at": None,
        "response_code": None,
        "last_error": None,
        "delivered_at": None,
    }
    assert _status_lines(stack, person, old)["callback"] == "failed after 2 attempts"
    assert _status_lines(stack, person, recent[0])["callback"] == (
        "failed after 2 attempts, last answer 500"
    )


def test_delivered_callbacks_are_pruned_a_day_after_their_delivery(stack, manual_clock):
    """Nothing deleted a delivered row: the outbox grew by one row with every job that
    named a callback, for ever (the prune took the given-up ones only), N jobs leaving N
    rows. Now the head's maintenance deletes a delivered row
    ``callback_delivered_retention_seconds`` (a day) after its delivery, and its job
    keeps what became of it: delivered, after its attempts."""
    from hypermedia.server import Maintenance

    person = make_user(stack)
    maintenance = Maintenance(stack, reaper_interval=1, reconcile_interval=60)
    with receiving() as receiver:
        older = [
            submit(stack, person, ["thumbnail"], callback_url=receiver.url)[0] for _ in range(5)
        ]
        for job_id in older:
            stack.ingest.cancel(person.caller, job_id)
        assert all(d.delivered for d in _sender(stack).deliver_due())
        manual_clock.advance(86_400 - 60)
        newer = submit(stack, person, ["thumbnail"], callback_url=receiver.url)[0]
        stack.ingest.cancel(person.caller, newer)
        assert [d.delivered for d in _sender(stack).deliver_due()] == [True]
    assert len(_outbox(stack)) == 6
    assert maintenance.prune_callbacks().deleted == 0  # a day not passed yet
    manual_clock.advance(61)
    assert maintenance.prune_callbacks().deleted == 5
    assert list(_outbox(stack)) == [newer]
    for job_id in older:
        sent = stack.ingest.get_job(person.caller, job_id).callback
        assert sent is not None and (sent.status, sent.attempts) == ("delivered", 1)
        assert sent.event_id == outbox.event_id(job_id, "cancelled")
    assert _status_lines(stack, person, older[0])["callback"] == "delivered after 1 attempt"
    manual_clock.advance(86_400)
    assert maintenance.prune_callbacks().deleted == 1
    assert _outbox(stack) == {}
    assert stack.settings.callback_delivered_retention_seconds == 86_400


def _status_lines(stack: Stack, person: Any, job_id: str) -> dict[str, str]:
    """``hypermedia status JOB_ID`` over HTTP: its rows by label."""
    from typer.testing import CliRunner

    from hypermedia.cli import app
    from tests.api_support import running_server

    with running_server(create_app(stack, auth_cache_seconds=0)) as url:
        env = {"HYPERMEDIA_API_URL": url, "HYPERMEDIA_API_KEY": person.api_key}
        shown = CliRunner().invoke(app, ["status", job_id], env=env)
    assert shown.exit_code == 0, shown.output
    return {line[:11].strip(): line[11:] for line in shown.stdout.splitlines()}


def _give_up(stack: Stack, person: Any, clock: Any, count: int) -> list[str]:
    """``count`` jobs cancelled whose callbacks were given up (callback_max_attempts 2,
    each answered 500)."""
    with receiving() as receiver:
        receiver.answers = [500] * (2 * count)
        jobs = [
            submit(stack, person, ["thumbnail"], callback_url=receiver.url)[0] for _ in range(count)
        ]
        for job_id in jobs:
            stack.ingest.cancel(person.caller, job_id)
        for attempt in (1, 2):
            assert [d.delivered for d in _sender(stack).deliver_due()] == [False] * count
            clock.advance(webhooks.backoff(attempt))
    return jobs


def test_the_api_document_says_when_a_delivered_callback_is_pruned():
    """GET /jobs/{id}'s callback loses its times and last answer once the outbox prunes
    its event: the document said that came only to one given up, though a delivered one
    is pruned a day after its delivery."""
    from hypermedia.ingest.schemas import CallbackOut

    said = CallbackOut.model_json_schema()["description"]
    assert "callback_delivered_retention_seconds" in said, said
    assert "callback_failed_retention_seconds" in said, said


def test_a_pruning_backlog_is_deleted_a_few_batches_a_round(stack, manual_clock, monkeypatch):
    """prune_failed went through a whole backlog in one call, a transaction per 1,000 rows
    (no long lock), but on the maintenance thread, whose reaper waited meanwhile: 180,000
    given-up rows on PostgreSQL held it 8.0 s. A call now runs at most PRUNE_BATCHES
    transactions, and the maintenance loop's next round goes on with the rest instead of
    waiting CALLBACK_PRUNE_SECONDS (5 min). Here 2 rows a batch, 2 batches a call."""
    from hypermedia.server import Maintenance
    from tests.support import within

    monkeypatch.setattr(outbox, "PRUNE_BATCH", 2)
    monkeypatch.setattr(outbox, "PRUNE_BATCHES", 2, raising=False)
    person = make_user(stack)
    _give_up(stack, person, manual_clock, 9)
    manual_clock.advance(stack.settings.callback_failed_retention_seconds + 1)
    kept = _give_up(stack, person, manual_clock, 1)  # given up within its retention
    maintenance = Maintenance(stack, reaper_interval=0.05, reconcile_interval=60)
    assert len(_outbox(stack)) == 10
    pruned = maintenance.prune_callbacks()
    assert len(_outbox(stack)) == 6  # 2 batches of 2
    assert (pruned.deleted, pruned.more) == (4, True)
    # Its first round deletes 4 more and stops at its bound; the last one goes the next
    # round, not CALLBACK_PRUNE_SECONDS later.
    maintenance.start()
    try:
        assert within(30, lambda: len(_outbox(stack)) == 1)
    finally:
        maintenance.stop()
    assert list(_outbox(stack)) == kept
    # A backlog of a batch and a half, a bound of three: one call, nothing left.
    more = _give_up(stack, person, manual_clock, 3)
    manual_clock.advance(stack.settings.callback_failed_retention_seconds + 1)
    monkeypatch.setattr(outbox, "PRUNE_BATCHES", 3)
    pruned = maintenance.prune_callbacks()
    assert (pruned.deleted, pruned.more) == (4, False)
    assert not set(more) & set(_outbox(stack))


KEPT_ROWS = 20_000  # of each status, within its retention


def _plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _plan_nodes(child)


def test_a_prune_with_nothing_past_retention_reads_no_row_kept(pg_engine, settings, manual_clock):
    """The prune looked for its rows through ix_job_callbacks_status_next_attempt_at and
    filtered on when they ended: with fewer than a batch past retention, as every round
    once a backlog is gone, it read every row of the status still kept, every 5 minutes
    (measured: 200k delivered rows, a parallel scan of the whole table, 25-70 ms a
    prune deleting 0; 84 ms by a prepared statement's generic plan). By 0032's indexes
    of (status, when they ended) it reads the rows past retention only, whatever the
    statement's plan. Here 20k rows of each status kept and one past retention each:
    deleted, then the prune's statement explained as psycopg runs it once prepared: no
    row read that it does not take."""
    stack = open_stack(settings, pg_engine, manual_clock)
    try:
        person = make_user(stack)
        [job] = submit(stack, person, ["thumbnail"])
        day = 86_400.0
        now = manual_clock.now()
        with transaction(stack.engine) as conn:
            # KEPT_ROWS + 1 jobs of each status, copies of the one submitted.
            names = [c.name for c in t.jobs.columns]
            copied = ", ".join("md5(%(job)s || n::text)" if n == "job_id" else n for n in names)
            conn.exec_driver_sql(
                f"INSERT INTO processing_jobs ({', '.join(names)}) SELECT {copied}"
                " FROM processing_jobs, generate_series(1, %(n)s::int) AS n"
                " WHERE job_id = %(job)s",
                {"job": job, "n": 2 * (KEPT_ROWS + 1)},
            )
            conn.exec_driver_sql(
                "INSERT INTO job_callbacks (event_id, job_id, event, status, attempts,"
                " next_attempt_at, last_attempt_at, delivered_at, created_at)"
                " SELECT md5(job_id), job_id, 'cancelled', s.status, 1, e.at, e.at,"
                " CASE WHEN s.status = 'delivered' THEN e.at END, e.at"
                " FROM (SELECT md5(%(job)s || n::text) AS job_id, n FROM"
                "       generate_series(1, %(n)s::int) AS n) AS j,"
                " LATERAL (SELECT CASE WHEN j.n %% 2 = 0 THEN 'delivered' ELSE 'failed'"
                "          END AS status) AS s,"
                # the first two past retention, the others within it
                " LATERAL (SELECT %(now)s - CASE WHEN j.n <= 2 THEN %(old)s ELSE %(young)s"
                "          END * interval '1 s' AS at) AS e",
                {
                    "job": job,
                    "n": 2 * (KEPT_ROWS + 1),
                    "now": to_datetime(now).replace(tzinfo=None),
                    "old": 8 * day,
                    "young": day / 2,
                },
            )
            conn.exec_driver_sql("ANALYZE job_callbacks")
        seen: list[tuple[str, Any]] = []

        def _keep(_conn, _cursor, statement, parameters, _context, _many) -> None:
            if statement.lstrip().startswith("SELECT") and "ORDER BY" in statement:
                seen.append((statement, parameters))

        listen(stack.engine, "before_cursor_execute", _keep)
        try:
            for status, retention in (
                (outbox.DELIVERED, stack.settings.callback_delivered_retention_seconds),
                (outbox.FAILED, stack.settings.callback_failed_retention_seconds),
            ):
                assert outbox.prune(stack.engine, status, now - retention).deleted == 1
        finally:
            remove(stack.engine, "before_cursor_execute", _keep)
        read: dict[str, Any] = {}
        with transaction(stack.engine) as conn:
            # Each status's statement (the last of its call: nothing left to take),
            # prepared as psycopg prepares it from its sixth run on a connection and
            # planned for any parameters (PostgreSQL's generic plan, which a partial
            # index over one status's rows is of no use to).
            conn.exec_driver_sql("SET LOCAL plan_cache_mode = force_generic_plan")
            raw = conn.connection.driver_connection
            for number, (statement, parameters) in enumerate(seen):
                names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", statement)))
                numbered = statement
                for place, name in enumerate(names, start=1):
                    numbered = numbered.replace(f"%({name})s", f"${place}")
                conn.exec_driver_sql(f"PREPARE prune_{number} AS {numbered}")
                values = ", ".join(Literal(parameters[name]).as_string(raw) for name in names)
                [[plan]] = conn.exec_driver_sql(
                    f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE prune_{number}({values})"
                ).all()
                conn.exec_driver_sql(f"DEALLOCATE prune_{number}")
                nodes = list(_plan_nodes(plan[0]["Plan"]))
                read[statement] = [
                    (n["Node Type"], n.get("Index Name"), n.get("Rows Removed by Filter", 0))
                    for n in nodes
                    if "Scan" in n["Node Type"]
                ]
        assert len(_outbox(stack)) == 2 * KEPT_ROWS
    finally:
        stack.close()
    # Old: a Bitmap Heap Scan by ix_job_callbacks_status_next_attempt_at, 20000 rows
    # removed by its filter, for each status.
    assert len(read) == 4, read  # each status's look in a snapshot and its batch
    for statement, scans in read.items():
        assert all(removed == 0 for _node, _index, removed in scans), (statement, scans)
        assert {index for _node, index, _removed in scans} <= {
            "ix_job_callbacks_status_delivered_at",
            "ix_job_callbacks_status_last_attempt_at",
        }, (statement, scans)


def test_a_prune_on_sqlite_goes_by_when_its_rows_ended(sqlite_engine):
    """SQLite keeps no statistics unless asked: the prune's statement went by the
    status's index (ix_job_callbacks_status_next_attempt_at), reading every row of the
    status kept (measured: 200k delivered rows, 80-170 ms a prune deleting 0); by 0032's
    index of (status, when they ended) it reads the rows past retention alone."""
    seen: list[tuple[str, Any]] = []

    def _keep(_conn, _cursor, statement, parameters, _context, _many) -> None:
        if statement.lstrip().startswith("SELECT") and "ORDER BY" in statement:
            seen.append((statement, parameters))

    listen(sqlite_engine, "before_cursor_execute", _keep)
    try:
        for status in (outbox.DELIVERED, outbox.FAILED):
            assert outbox.prune(sqlite_engine, status, time.time()).deleted == 0
    finally:
        remove(sqlite_engine, "before_cursor_execute", _keep)
    with transaction(sqlite_engine) as conn:
        plans = [
            [row[3] for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", values)]
            for statement, values in seen
        ]
    # Old: ['SEARCH job_callbacks USING INDEX ix_job_callbacks_status_next_attempt_at
    # (status=?)'] for each status.
    assert plans == [
        [
            "SEARCH job_callbacks USING INDEX ix_job_callbacks_status_delivered_at"
            " (status=? AND delivered_at<?)"
        ],
        [
            "SEARCH job_callbacks USING INDEX ix_job_callbacks_status_last_attempt_at"
            " (status=? AND last_attempt_at<?)"
        ],
    ], plans


def _closed_port() -> int:
    """A port of this machine nobody listens on (bound, then closed)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_a_receiver_down_holds_its_callbacks_past_an_hour_yet_none_is_overdue(
    engine, settings, manual_clock
):
    """``HypermediaCallbacksStuck`` fired on ``hypermedia_callbacks_oldest_pending_age_
    seconds`` past an hour, "longer than its attempts take": with the default
    callback_max_attempts (8) an event is delivered or given up within about 25 minutes.
    But a receiver that does not answer has its events tried one at a time (each the
    next once the one before is given up), so its fifth event waited 1 h 46 min
    (6,389 s) with the sender working at every due moment (and callback_max_attempts
    above 10 keeps a single event pending past an hour). The alert now reads how long
    the oldest *due* event has waited for its attempt
    (``hypermedia_callbacks_oldest_overdue_seconds``): a poll's second or two here,
    however long a receiver's events wait; an hour when the sender stops."""
    stack = _local_callbacks(settings, engine, manual_clock)
    assert stack.settings.callback_max_attempts == 8
    person = make_user(stack)
    url = f"http://127.0.0.1:{_closed_port()}/hook"
    jobs = [submit(stack, person, ["thumbnail"], callback_url=url)[0] for _ in range(5)]
    for job_id in jobs:
        stack.ingest.cancel(person.caller, job_id)
    sender = _sender(stack)
    oldest = overdue = 0.0
    while any(r.status == "pending" for r in _outbox(stack).values()):
        scraped = _scraped(stack)  # as Prometheus would between the sender's passes
        oldest = max(oldest, scraped["hypermedia_callbacks_oldest_pending_age_seconds"])
        overdue = max(overdue, scraped.get("hypermedia_callbacks_oldest_overdue_seconds", -1))
        assert len(sender.deliver_due()) == 1  # one attempt a pass: the others wait behind it
        waiting = [r.next_attempt_at for r in _outbox(stack).values() if r.status == "pending"]
        if waiting:  # the sender's next pass: a poll's second after the next is due
            manual_clock.advance(max(0.0, min(waiting).timestamp() - manual_clock.now()) + 1)
    rows = _outbox(stack).values()
    assert [(r.status, r.attempts) for r in rows] == [("failed", 8)] * 5
    assert oldest > 3600 + 600, oldest  # the fifth's age at its last attempt: ~1 h 46 min
    # A poll's second; two where an event was due with the one before it, given up.
    assert 0 < overdue <= 2, overdue
    stack.close()


def test_a_slow_receiver_with_a_backlog_is_overdue_while_the_sender_works(
    engine, settings, manual_clock
):
    """``HypermediaCallbacksStuck`` said "the head's callback sender is not working
    through the outbox" once the oldest due event had waited an hour for its attempt.
    But a receiver that answers every event, each in 119 s (under callback_timeout_
    seconds, 120 here, its most), is sent its events one at a time: with 51 due at once
    the oldest still due had waited 5,950 s after the first lane of 50, the sender busy
    all along (29 s each in 30 does the same with 200 due, after the third lane; the
    default 10 s timeout with 450). What tells the two apart is the sender's own last
    attempt (``hypermedia_callbacks_last_attempt_timestamp_seconds``): seconds old
    here; the rules read it (``HypermediaCallbacksBehind`` for this one,
    ``HypermediaCallbacksStuck`` only when it is old or absent)."""
    stack = _local_callbacks(settings, engine, manual_clock, callback_timeout_seconds=120)
    person = make_user(stack)
    sender = _sender(stack)
    overdue: list[float] = []
    with receiving() as receiver:
        receiver.on_request = lambda: manual_clock.advance(119)
        for _ in range(51):
            job_id = submit(stack, person, ["thumbnail"], callback_url=receiver.url)[0]
            stack.ingest.cancel(person.caller, job_id)
        while delivered := sender.deliver_due():
            assert all(d.delivered for d in delivered)
            scraped = _scraped(stack)  # as Prometheus would between two lanes
            overdue.append(scraped["hypermedia_callbacks_oldest_overdue_seconds"])
            last = scraped["hypermedia_callbacks_last_attempt_timestamp_seconds"]
            assert last == manual_clock.now()  # its last answer's moment
    assert len(receiver.requests) == 51
    assert overdue == [5950.0, 0.0]  # past the alert's hour, sender working
    stack.close()


def test_a_stopped_sender_leaves_its_due_callbacks_overdue(stack, manual_clock):
    """The other side: nobody sends (the head's maintenance stopped), and the oldest due
    event's wait is the alert's measure, from the moment it was due."""
    person = make_user(stack)
    first, second = (
        submit(stack, person, ["thumbnail"], callback_url="http://127.0.0.1:9/hook")[0]
        for _ in range(2)
    )
    stack.ingest.cancel(person.caller, first)
    assert _scraped(stack)["hypermedia_callbacks_oldest_overdue_seconds"] == 0.0
    manual_clock.advance(3000)
    stack.ingest.cancel(person.caller, second)
    manual_clock.advance(601)
    scraped = _scraped(stack)
    assert scraped["hypermedia_callbacks_oldest_overdue_seconds"] == pytest.approx(3601)
    assert scraped["hypermedia_callbacks_oldest_pending_age_seconds"] == pytest.approx(3601)
    assert scraped["hypermedia_callbacks_pending"] == 2.0


def test_a_prune_with_nothing_past_retention_takes_no_write_lock(sqlite_engine):
    """Every 300 s each kind's prune looked for rows past retention in a write
    transaction: on SQLite two write locks, which every submit and claim wait behind,
    to find nothing. It now looks in a snapshot and writes only when there is some."""
    from tests import support

    with support.write_locks(sqlite_engine) as taken:
        for status in (outbox.DELIVERED, outbox.FAILED):
            assert outbox.prune(sqlite_engine, status, time.time()) == outbox.Pruned(0, more=False)
    assert taken == []
