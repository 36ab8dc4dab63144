"""The child's progress sender (hypermedia.sandbox.child._ProgressSender): what a
step's reports become on the result socket."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hypermedia.sandbox import child
from hypermedia.sandbox.wire import PROGRESS_INTERVAL
from pipelines.progress import Progress


class _Socket:
    """Stands in for libc's ``send`` on the result descriptor."""

    def __init__(self) -> None:
        self.sent: list[tuple[float, float | None, str]] = []
        self.full = False

    def __call__(self, fd: int, data: bytes, size: int, flags: int) -> int:
        assert (fd, size, flags) == (child.RESULT_FD, len(data), child.MSG_DONTWAIT)
        if self.full:
            return -1
        body = json.loads(data)["progress"]
        self.sent.append((body["done"], body["total"], body["unit"]))
        return size


@pytest.fixture
def socket(monkeypatch: pytest.MonkeyPatch) -> _Socket:
    fake = _Socket()
    monkeypatch.setattr(child, "_send", fake)
    return fake


def _run(reports: list[tuple[float, float, float | None, str]]) -> child._ProgressSender:
    """Feed ``(at, done, total, unit)`` reports to a sender on a clock at ``at``."""
    now = [0.0]
    sender = child._ProgressSender(clock=lambda: now[0])
    for at, done, total, unit in reports:
        now[0] = at
        sender(Progress(done, total, unit))
    return sender


def test_a_report_the_same_as_the_last_sent_is_dropped(socket: Any) -> None:
    """FFmpeg's last out_time line reports the total, and progress=end again; a chunked
    transcode's last chunk and its concat too: the job's events held the end twice."""
    step = PROGRESS_INTERVAL * 2
    _run(
        [
            (1.0, 0.0, 10.0, "seconds"),
            (1.0 + step / 4, 2.0, 10.0, "seconds"),  # within the interval: dropped
            (1.0 + step, 5.0, 10.0, "seconds"),
            (1.0 + 2 * step, 5.0, 10.0, "seconds"),  # the same again: dropped
            (1.0 + 3 * step, 10.0, 10.0, "seconds"),  # out_time at the end
            (1.0 + 3 * step, 10.0, 10.0, "seconds"),  # progress=end
            (1.0 + 4 * step, 10.0, 10.0, "seconds"),  # the concat step, later
        ]
    )
    assert socket.sent == [(0.0, 10.0, "seconds"), (5.0, 10.0, "seconds"), (10.0, 10.0, "seconds")]


def test_another_unit_or_total_is_not_a_repeat(socket: Any) -> None:
    step = PROGRESS_INTERVAL * 2
    _run(
        [
            (1.0, 3.0, 3.0, "pages"),
            (1.0 + step, 3.0, 3.0, "seconds"),
            (1.0 + 2 * step, 3.0, 4.0, "seconds"),
            (1.0 + 3 * step, 3.0, None, "seconds"),
            (1.0 + 4 * step, 3.0, None, "seconds"),
        ]
    )
    assert socket.sent == [
        (3.0, 3.0, "pages"),
        (3.0, 3.0, "seconds"),
        (3.0, 4.0, "seconds"),
        (3.0, None, "seconds"),
    ]


def test_a_final_report_the_socket_could_not_take_is_sent_when_repeated(socket: Any) -> None:
    socket.full = True
    sender = _run([(1.0, 10.0, 10.0, "seconds")])
    socket.full = False
    sender(Progress(10.0, 10.0, "seconds"))
    sender(Progress(10.0, 10.0, "seconds"))
    assert socket.sent == [(10.0, 10.0, "seconds")]
