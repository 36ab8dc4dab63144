"""hypermedia.logs.Outage: a loop's failures of one kind, told once, not once a pass."""

from __future__ import annotations

import logging

import pytest

from hypermedia.errors import DatabaseUnavailable, QueueUnavailable
from hypermedia.logs import Outage


def test_an_outage_is_told_when_it_starts_every_few_minutes_and_when_it_ends(caplog):
    now = [0.0]
    outage = Outage(logging.getLogger("hm.test"), "reap failed", monotonic=lambda: now[0])
    caplog.set_level("INFO", logger="hm.test")
    down = DatabaseUnavailable("database unreachable: connection refused")
    for _ in range(60):  # a pass a second for a minute
        outage.failed(down)
        now[0] += 1
    assert outage.failing
    now[0] = 301.0  # five minutes on, still down: said again
    outage.failed(down)
    outage.failed(QueueUnavailable("redis unreachable"))  # another kind: said at once
    outage.succeeded()
    outage.succeeded()  # nothing more to say
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in said] == ["WARNING", "WARNING", "WARNING", "INFO"]
    assert said[0][1].startswith("reap failed: database unreachable: connection refused (1 ")
    assert "(61 passes failed so far" in said[1][1]
    assert said[2][1].startswith("reap failed: redis unreachable (62 ")
    assert said[3][1] == "reap failed: over after 62 failed passes"
    assert not outage.failing


@pytest.mark.parametrize("passes", [1, 5])
def test_a_new_outage_after_a_good_pass_is_told_again(caplog, passes):
    outage = Outage(logging.getLogger("hm.test"), "bulk tick failed", monotonic=lambda: 0.0)
    caplog.set_level("INFO", logger="hm.test")
    for _ in range(passes):
        outage.failed(DatabaseUnavailable("down"))
    outage.succeeded()
    outage.failed(DatabaseUnavailable("down"))
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO", "WARNING"]
    assert caplog.records[2].getMessage().startswith("bulk tick failed: down (1 ")
