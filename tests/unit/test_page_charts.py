"""The operator page's chart columns (pure) and how it reads a key from a header."""

from __future__ import annotations

import base64

import pytest

from autoscaler import cost
from autoscaler.page.charts import GAP_INTERVALS, charts, queue_columns, spend_columns
from autoscaler.page.routes import presented_key
from autoscaler.samples import Sample, samples_of
from autoscaler.snapshot import QueueState, Snapshot, Spend, WorkerState


def sample(at: float, queue: str, depth: int, workers: int = 1) -> Sample:
    return Sample(at, queue, depth, 0.0, workers)


def test_queue_columns_align_the_queues_and_break_the_line_over_a_gap():
    taken = [
        sample(0, "images", 3),
        sample(0, "ocr", 1, 0),
        sample(60, "images", 4),  # ocr not sampled at 60 (a queue added later, say)
        sample(60 + GAP_INTERVALS * 60, "images", 5),  # just within: no break
        sample(60 + GAP_INTERVALS * 60 + GAP_INTERVALS * 60 + 1, "images", 6, 2),  # a gap
    ]
    times, depth, workers = queue_columns(taken, ["images", "ocr"], 60)
    assert times == [0, 60, 240, 300, 421]
    assert depth == {"images": [3, 4, 5, None, 6], "ocr": [1, None, None, None, None]}
    assert workers == {"images": [1, 1, 1, None, 2], "ocr": [0, None, None, None, None]}
    assert queue_columns([], ["images"], 60) == ([], {"images": []}, {"images": []})


def test_spend_columns_are_the_ledgers_spend_at_each_time():
    day = 86_400.0 * 20_000
    runs = [cost.Interval(day + 600, day + 4200, 120.0), cost.Interval(day + 3000, None, 60.0)]
    times, last_hour, today = spend_columns(runs, day, day + 7200, points=4)
    assert times == [day, day + 1800, day + 3600, day + 5400, day + 7200]
    for at, hour, so_far in zip(times, last_hour, today, strict=True):
        spent = cost.spend(runs, at)
        assert (hour, so_far) == (round(spent.last_hour_cents, 2), round(spent.today_cents, 2))
    assert last_hour[2] == pytest.approx(120 * 3000 / 3600 + 60 * 600 / 3600, abs=0.01)
    assert today[-1] == pytest.approx(120.0 + 60 * 4200 / 3600, abs=0.01)


def test_charts_carry_the_caps():
    built = charts(
        [sample(10, "images", 2)],
        [],
        ["images"],
        since=0,
        until=20,
        sample_interval=60,
        hourly_cap_cents=500,
        daily_cap_cents=5000,
        alert_threshold_cents=3000,
    )
    data = built.as_json()
    assert (data["hourly_cap_cents"], data["daily_cap_cents"]) == (500, 5000)
    assert data["times"] == [10] and data["depth"] == {"images": [2]}
    assert data["spend_times"][0] == 0 and data["spend_times"][-1] == 20
    assert set(data["last_hour_cents"]) == {0.0}


def test_a_sample_counts_the_workers_that_are_not_terminated():
    snapshot = Snapshot(
        now=100.0,
        queues={"images": QueueState("images", 4, 12.34), "ocr": QueueState("ocr", 0)},
        workers=(
            WorkerState("a", "images", "active", 0),
            WorkerState("b", "images", "draining", 0),
            WorkerState("c", "images", "starting", 0, provider="aws"),
            WorkerState("d", "images", "terminated", 0, provider="aws"),
        ),
        offers={},
        spend=Spend(0.0, 0.0),
    )
    assert samples_of(snapshot) == [
        Sample(100.0, "images", 4, 12.3, 3),
        Sample(100.0, "ocr", 0, 0.0, 0),
    ]


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize(
    ("header", "key"),
    [
        ("Bearer hm_abc", "hm_abc"),
        ("bearer   hm_abc ", "hm_abc"),
        (f"Basic {b64('operator:hm_abc')}", "hm_abc"),
        (f"Basic {b64(':hm_abc')}", "hm_abc"),  # no user name
        (f"basic {b64('x:hm:with:colons')}", "hm:with:colons"),
        (f"Basic {b64('operator:')}", None),  # no password
        (f"Basic {b64('operator')}", None),  # no colon
        ("Basic not base64!", None),
        ("Basic " + base64.b64encode(b"op:\xff").decode(), None),  # not UTF-8
        ("Bearer ", None),
        ("Digest abc", None),
        ("", None),
    ],
)
def test_the_key_comes_from_a_bearer_token_or_a_basic_password(header, key):
    assert presented_key(header) == key
