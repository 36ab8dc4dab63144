"""One webhook attempt (:func:`hypermedia.webhooks.send`, which job callbacks and alert
webhooks share) against a real HTTP receiver that misbehaves: what it costs the sender
is bounded by the attempt's timeout, whatever the receiver does."""

from __future__ import annotations

import time

import httpx

from hypermedia import tls, webhooks
from tests.webhook_receiver import Receiver, receiving

SECRET = "webhook-secret-for-tests-" + "x" * 20


def _send(receiver: Receiver, timeout: float) -> webhooks.Answer:
    with httpx.Client(follow_redirects=False, verify=tls.client_context()) as client:
        return webhooks.send(
            client,
            receiver.url,
            b'{"id": 1}',
            secret=SECRET,
            delivery_id="d1",
            timestamp=int(time.time()),
            timeout=timeout,
            user_agent="tests/1",
        )


def test_an_answers_body_is_never_read():
    """The answer was read whole into memory: a receiver answering 200 with a body of
    gigabytes had the sender hold them all. Only its status counts, and the sender
    hangs up after the head."""
    with receiving() as receiver:
        receiver.answer_bytes = 64 << 20
        answer = _send(receiver, timeout=30)
        assert (answer.code, answer.error) == (200, None)
        assert len(receiver.taken()) == 1
    assert receiver.sent < receiver.answer_bytes


def test_a_receiver_that_answers_a_byte_at_a_time_is_cut_off_at_the_timeout():
    """httpx's timeout bounds each read: a receiver writing a byte every 0.2 s held an
    attempt with a 0.5 s timeout until it had written all of its answer (about 9 s
    here; for ever if it wished), and the sender sends one delivery after another."""
    with receiving() as receiver:
        receiver.drip = 0.2
        answer = _send(receiver, timeout=0.5)
    assert (answer.code, answer.error) == (None, "no answer in 0.5 s")


def test_a_receiver_that_never_answers_is_no_answer_whichever_timer_fires_first(monkeypatch):
    """httpx's read timeout is the attempt's seconds too, and on a busy machine it can
    fire before the deadline's timer thread is let run: that attempt was recorded as
    'ReadTimeout' (a CI run's callback test saw it), where every other was 'no answer
    in 1 s'. Here the deadline's timer never runs, so httpx's fires alone."""
    monkeypatch.setattr(webhooks._Deadline, "_expire", lambda self: None)
    with receiving() as receiver:
        receiver.hold.set()
        try:
            answer = _send(receiver, timeout=0.5)
        finally:
            receiver.release.set()
    assert (answer.code, answer.error) == (None, "no answer in 0.5 s")
