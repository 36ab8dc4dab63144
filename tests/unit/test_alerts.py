"""The alert rules (pure) and the webhooks file and signature."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from autoscaler import alerts, webhooks
from autoscaler.alerts import AlertState, Observation, WorkerHealth
from autoscaler.config import AlertsConfig
from autoscaler.snapshot import Band, Decision, QueueState, Spend
from hypermedia.errors import ConfigError

RULES = AlertsConfig()
T0 = 1_800_000_000.0


def observed(
    now: float = T0,
    depth: int = 0,
    oldest_urgent: float = 0.0,
    workers: tuple[WorkerHealth, ...] = (WorkerHealth("w1", "images", "active", 5.0),),
    outcomes: tuple[bool, ...] = (),
    today: float = 0.0,
    locked: bool = False,
    decisions: tuple[Decision, ...] = (),
) -> Observation:
    bands: dict[Band, float] = {"1-3": oldest_urgent} if oldest_urgent else {}
    counts: dict[Band, int] = {"1-3": depth} if depth else {}
    queue = QueueState("images", depth, oldest_urgent, counts, bands)
    return Observation(
        now=now,
        queues={"images": queue},
        workers=workers,
        outcomes=outcomes,
        spend=Spend(0.0, today, locked=locked),
        daily_cap_cents=5000,
        decisions=decisions,
    )


def run(*observations: Observation, rules: AlertsConfig = RULES) -> list[list[tuple[str, str]]]:
    """Each turn's notifications as (key, status)."""
    state = AlertState()
    turns: list[list[tuple[str, str]]] = []
    for observation in observations:
        result = alerts.evaluate(rules, observation, state)
        state = alerts.state_from(json.loads(json.dumps(alerts.state_value(result.state))))
        turns.append([(n.key, n.status) for n in result.notifications])
    return turns


def test_a_sustained_condition_fires_only_after_its_duration_and_starts_over_when_it_stops():
    assert run(
        observed(T0, depth=51),
        observed(T0 + 599, depth=51),
        observed(T0 + 600, depth=60),
        observed(T0 + 660, depth=60),
    ) == [[], [], [("queue_depth:images", "firing")], []]
    assert run(
        observed(T0, depth=51),
        observed(T0 + 300, depth=10),  # dipped: starts over
        observed(T0 + 600, depth=51),
        observed(T0 + 1199, depth=51),
        observed(T0 + 1200, depth=51),
    ) == [[], [], [], [], [("queue_depth:images", "firing")]]


def test_firing_repeats_after_the_interval_and_resolves_once():
    turns = run(
        observed(T0, oldest_urgent=901),
        observed(T0 + 3599, oldest_urgent=4500),
        observed(T0 + 3600, oldest_urgent=4501),
        observed(T0 + 3700, oldest_urgent=0),
        observed(T0 + 3800, oldest_urgent=0),
    )
    assert turns == [
        [("oldest_job:images", "firing")],
        [],
        [("oldest_job:images", "firing")],
        [("oldest_job:images", "resolved")],
        [],
    ]


def test_a_pending_condition_that_stops_resolves_nothing():
    assert run(observed(T0, depth=51), observed(T0 + 60, depth=0)) == [[], []]


@pytest.mark.parametrize(
    ("outcomes", "keys"),
    [
        ((True,) * 19, []),  # fewer than min_jobs (20) finished: says nothing
        ((True,) * 2 + (False,) * 18, []),  # 10 %: not above
        ((True,) * 3 + (False,) * 17, ["failure_rate"]),  # 15 % of 20 is not a spike
        ((False,) * 20 + (True,) * 10 + (False,) * 70, []),
        ((False,) * 20 + (True,) * 11 + (False,) * 69, ["failure_rate"]),  # 11 %
        ((False,) * 20 + (True,) * 11 + (False,) * 70, ["failure_rate"]),  # of the last 100
        ((True,) * 10 + (False,) * 90, ["failure_spike"]),  # 10 %, but 50 % of the last 20
        ((True,) * 11 + (False,) * 89, ["failure_rate", "failure_spike"]),
    ],
)
def test_failure_rules(outcomes, keys):
    found = alerts.conditions(RULES, observed(outcomes=outcomes), locked=False)
    assert sorted(c.key for c in found) == keys


def test_workers_unhealthy_one_and_all():
    fresh = WorkerHealth("w1", "images", "active", 119.0)
    stale = WorkerHealth("w2", "ocr", "draining", 121.0)
    found = alerts.conditions(RULES, observed(workers=(fresh, stale)), locked=False)
    assert [(c.key, c.level) for c in found] == [("heartbeat:w2", "warning")]
    found = alerts.conditions(RULES, observed(workers=(stale,)), locked=False)
    assert sorted((c.key, c.level) for c in found) == [
        ("all_workers_unhealthy", "critical"),
        ("heartbeat:w2", "warning"),
    ]
    # No worker at all: only an alert when jobs wait.
    assert alerts.conditions(RULES, observed(workers=()), locked=False) == []
    found = alerts.conditions(RULES, observed(workers=(), depth=3), locked=False)
    assert [c.key for c in found] == ["all_workers_unhealthy"]


def test_spend_and_the_cap():
    assert alerts.conditions(RULES, observed(today=4000), locked=False) == []
    found = alerts.conditions(RULES, observed(today=4001), locked=False)
    assert [(c.key, c.level) for c in found] == [("daily_spend", "warning")]
    lock = Decision("lock", "Daily cloud spend cap reached")
    turns = run(
        observed(today=5000, decisions=(lock,)),  # the turn that locks
        observed(T0 + 60, today=5000, locked=True),
        observed(T0 + 120, today=0, locked=False),  # the next day, after the reset
    )
    assert turns == [
        [("daily_spend", "firing"), ("daily_cap", "firing")],
        [],
        [("daily_spend", "resolved"), ("daily_cap", "resolved")],
    ]


def test_decisions_carried_out_are_events():
    launch = Decision("launch", "Scaling up ocr", queue="ocr", provider="aws", count=2)
    flood = Decision("alert", "ocr flooded", queue="ocr")
    hold = Decision("hold", "cooldown", queue="ocr")
    result = alerts.evaluate(RULES, observed(decisions=(launch, flood, hold)), AlertState())
    assert [(n.rule, n.level, n.status, n.summary) for n in result.notifications] == [
        ("scaling", "info", "event", "Scaling up ocr"),
        ("scheduler_alert", "warning", "event", "ocr flooded"),
    ]
    assert result.notifications[0].details["count"] == 2
    assert result.state.active == {}


def test_a_worker_paused_by_low_disk_fires_after_five_minutes_and_clears_when_it_claims():
    """``worker_disk_low``: from the row's ``claims_paused_since``, a warning once paused
    for ``for_seconds`` (300 by default), resolved when the worker claims again; a
    worker that stops being listed resolves it too."""
    reason = "low disk (312 MB free, needs 1024)"

    def paused(since: float | None) -> tuple[WorkerHealth, ...]:
        return (
            WorkerHealth(
                "w1",
                "images",
                "active",
                5.0,
                claims_paused_since=since,
                claims_paused_reason=None if since is None else reason,
            ),
        )

    turns = run(
        observed(T0, workers=paused(T0 - 60)),
        observed(T0 + 239, workers=paused(T0 - 60)),  # 299 s
        observed(T0 + 240, workers=paused(T0 - 60)),  # 300 s: fires
        observed(T0 + 300, workers=paused(T0 - 60)),  # once, not every turn
        observed(T0 + 360, workers=paused(None)),  # claims again
        observed(T0 + 420, workers=paused(None)),
    )
    key = "worker_disk_low:w1"
    assert turns == [[], [], [(key, "firing")], [], [(key, "resolved")], []]
    (found,) = alerts.conditions(RULES, observed(T0 + 240, workers=paused(T0 - 60)), False)
    assert (found.rule, found.level, found.value, found.threshold) == (
        "worker_disk_low",
        "warning",
        300.0,
        300,
    )
    assert found.labels == {"worker_id": "w1", "queue": "images"}
    assert found.summary == (
        f"worker w1 (images) has claimed no job for 5 min: {reason} (more than 5 min)"
    )
    # The worker gone from the list resolves it; the rule's own threshold is the config's.
    assert run(observed(T0, workers=paused(T0 - 300)), observed(T0 + 60, workers=())) == [
        [(key, "firing")],
        [(key, "resolved")],
    ]
    quick = AlertsConfig.model_validate({"worker_disk_low": {"for_seconds": 0}})
    assert run(observed(T0, workers=paused(T0)), rules=quick) == [[(key, "firing")]]


def test_thresholds_come_from_the_config():
    rules = AlertsConfig.model_validate({"queue_depth": {"above": 5, "for_seconds": 0}})
    assert run(observed(depth=6), rules=rules) == [[("queue_depth:images", "firing")]]


# -- the webhooks file and the signature ------------------------------------------------------


def write(tmp_path: Path, data: object, mode: int = 0o600) -> Path:
    path = tmp_path / "alert-webhooks.json"
    path.write_text(json.dumps(data))
    os.chmod(path, mode)
    return path


GOOD = {"name": "ops", "url": "https://hooks.example.com/x?token=t0ps3cret", "secret": "s" * 16}


def test_the_webhooks_file(tmp_path, monkeypatch):
    (hook,) = webhooks.load(write(tmp_path, {"webhooks": [GOOD]}, 0o640))
    assert (hook.name, hook.min_level, hook.max_attempts) == ("ops", "info", 8)
    assert "t0ps3cret" not in repr(hook) and "ssss" not in repr(hook)
    monkeypatch.setenv(webhooks.ENV_VAR, str(write(tmp_path, {"webhooks": []})))
    assert webhooks.load() == []


@pytest.mark.parametrize(
    ("data", "mode", "words"),
    [
        ({"webhooks": [GOOD]}, 0o644, "others may read it"),
        ({"webhooks": [{**GOOD, "extra": 1}]}, 0o600, "webhooks.0.extra: unknown key"),
        # A misspelt required key: named as written, not as "webhooks.0.url: Field required".
        (
            {"webhooks": [{**{k: v for k, v in GOOD.items() if k != "url"}, "urls": GOOD["url"]}]},
            0o600,
            "webhooks.0.urls: unknown key (did you mean url?)",
        ),
        ({"webhook": [GOOD]}, 0o600, ": webhook: unknown key (did you mean webhooks?)"),
        ({"webhooks": [{**GOOD, "url": "ftp://x.example/"}]}, 0o600, "webhooks.0.url"),
        (
            {"webhooks": [{**GOOD, "secret": "short"}]},
            0o600,
            "webhooks.0.secret: Value error, at least 16 characters, not 5",
        ),
        ({"webhooks": [{**GOOD, "min_level": "loud"}]}, 0o600, "webhooks.0.min_level"),
        ({"webhooks": [GOOD, GOOD]}, 0o600, "used twice"),
        ([], 0o600, "expected a JSON object"),
    ],
)
def test_a_bad_webhooks_file_refuses_to_start(tmp_path, data, mode, words):
    with pytest.raises(ConfigError) as caught:
        webhooks.load(write(tmp_path, data, mode))
    assert words in str(caught.value)
    assert "t0ps3cret" not in str(caught.value)


def test_a_key_given_twice_in_the_webhooks_file_is_refused(tmp_path):
    # JSON keeps the last silently: a second "url" would send the alerts elsewhere.
    path = write(tmp_path, {})
    text = json.dumps({"webhooks": [GOOD]})
    path.write_text(text.replace('"name": "ops"', '"name": "ops", "url": "https://b.example/"'))
    with pytest.raises(ConfigError) as caught:
        webhooks.load(path)
    assert caught.value.key == f"{path}: webhooks.0.url"
    assert "given twice" in caught.value.message
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="not JSON"):
        webhooks.load(path)


def test_the_readmes_webhooks_file_loads_as_written(tmp_path):
    """The README's example held a 15-character secret ("...16+ chars..."): refused as
    "Value should have at least 16 items after validation"."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    after = readme[readme.index("Webhooks are named only in a file") :]
    start = after.index("```json\n") + len("```json\n")
    example = after[start : after.index("\n```", start)]
    path = tmp_path / "alert-webhooks.json"
    path.write_text(example)
    os.chmod(path, 0o600)
    (hook,) = webhooks.load(path)
    assert (hook.name, hook.min_level) == ("ops", "warning")


def test_a_named_file_that_is_missing_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot be read"):
        webhooks.load(tmp_path / "nope.json")


def test_signature_binds_body_secret_and_time():
    body = b'{"alert": 1}'
    header = webhooks.sign("k" * 16, body, 1_000)
    assert webhooks.verify("k" * 16, body, header, 1_100)
    assert not webhooks.verify("k" * 16, body + b" ", header, 1_100)
    assert not webhooks.verify("j" * 16, body, header, 1_100)
    assert not webhooks.verify("k" * 16, body, header, 1_000 + 301)  # too old: a replay
    assert not webhooks.verify("k" * 16, body, "garbage", 1_000)
    assert [webhooks.backoff(n) for n in (1, 2, 3, 8, 20)] == [10, 20, 40, 900, 900]


def test_a_signature_header_of_any_characters_is_not_valid_and_never_raises():
    """A receiver reads the header as Latin-1 (Starlette, http.server): a forged ``v1=é``
    raised TypeError out of verify (hmac.compare_digest takes ASCII strings only), a
    500 for the receiver instead of a refused request."""
    body = b'{"alert": 1}'
    for header in ("t=1000,v1=\xe9", "t=1000,v1=\u0100" * 2, "t=\xe9,v1=00", "t=1000,v1="):
        assert not webhooks.verify("k" * 16, body, header, 1_000), header
