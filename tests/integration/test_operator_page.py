"""The operator page (:mod:`autoscaler.page`) on the status scene, served by uvicorn and
read in a headless Chromium: the numbers it shows are the ones :func:`gather` and
``hypermedia status --json`` give, its four charts are drawn (checked on a screenshot),
and only an operator's key opens it.

Three hours of queue samples are written through :func:`autoscaler.samples.record` (the
scheduler's own writer) before the scene's turn, which samples the present."""

from __future__ import annotations

import base64
import io
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image
from sqlalchemy import func, select
from typer.testing import CliRunner

from autoscaler import config as scheduler_config
from autoscaler import samples
from autoscaler.leader import Leadership
from autoscaler.page.routes import STATIC_DIR, install
from autoscaler.scheduler import Scheduler
from autoscaler.snapshot import QueueState, Snapshot, Spend, WorkerState
from autoscaler.status import gather
from hypermedia import tls
from hypermedia.cli import app as cli
from hypermedia.clock import ManualClock, age_text, to_datetime
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.ingest.api import create_app
from hypermedia.stack import Stack
from tests import support
from tests.api_support import add_user, running_server
from tests.browser_support import chromium
from tests.status_scene import bulk_runs, clock, config_data, scene, stack

__all__ = ["clock", "scene", "stack"]  # the scene's fixtures, used here

HOURS = 3
PALETTE = {"images": (0x1F, 0x77, 0xB4), "documents": (0xFF, 0x7F, 0x0E)}  # page.js's
CAP_RED = (0xD6, 0x27, 0x28)


def write_history(stack: Stack) -> None:
    """A sample a minute for the last three hours (images' and documents' depth a wave, two
    images workers, three in the last hour, one documents worker) and a cloud instance that
    ran from 2 h 30 to 1 h 50 ago."""
    now = stack.clock.now()
    names = stack.settings.queue_names
    with transaction(stack.engine) as conn:
        for minutes in range(HOURS * 60, 0, -1):
            at = now - minutes * 60
            wave = round(20 + 15 * math.sin(minutes / 15))
            images = 3 if minutes <= 60 else 2
            workers = [WorkerState(f"w-{i}", "images", "active", at - 60) for i in range(images)]
            workers.append(WorkerState("w-docs", "documents", "active", at - 60))
            depth = {"images": wave, "documents": wave // 3}
            snapshot = Snapshot(
                now=at,
                queues={name: QueueState(name, depth.get(name, 0), 30.0) for name in names},
                workers=tuple(workers),
                offers={},
                spend=Spend(0.0, 0.0),
            )
            samples.record(conn, snapshot)
        conn.execute(
            t.cloud_spend.insert().values(
                provider="aws",
                instance_id="i-old",
                node_type="images",
                region="eu-west-3",
                spot=False,
                price_per_hour_microusd=2_000_000,
                launched_at=to_datetime(now - 9000),
                terminated_at=to_datetime(now - 6600),
            )
        )


@pytest.fixture
def served(stack: Stack, scene: scheduler_config.SchedulerConfig):
    write_history(stack)
    app = create_app(stack)
    install(app, scene)
    with running_server(app) as base_url:
        yield base_url


@pytest.fixture(scope="module")
def _chromium() -> Iterator[Any]:
    """One headless Chromium for the module's page tests (each start ~1 CPU-s)."""
    with chromium() as shared:
        yield shared


@pytest.fixture
def browser(_chromium: Any) -> Iterator[Any]:
    """The module's Chromium as a new one: a blank page, no cookies, 1400 x 1000 (a test
    makes it taller), its console read (what earlier tests' pages said is not this one's).
    Back on a blank page after the test, before the test's server stops."""
    _chromium.get("about:blank")
    _chromium.delete_all_cookies()
    _chromium.set_window_size(1400, 1000)
    _chromium.get_log("browser")
    yield _chromium
    _chromium.get("about:blank")


def basic(key: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"operator:{key}".encode()).decode()}


def test_only_an_operators_key_opens_the_page(stack, served):
    operator = add_user(stack, "ops", operator=True)
    someone = add_user(stack, "someone")
    page = f"{served}/operator"

    missing = httpx.get(page, verify=tls.client_context())
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"].startswith('Basic realm="hypermedia operator"')
    assert missing.json()["error"]["code"] == "unauthenticated"
    wrong = httpx.get(page, headers=basic("hm_not-a-key"), verify=tls.client_context())
    assert (wrong.status_code, wrong.headers["www-authenticate"][:5]) == (401, "Basic")
    for headers in (basic(someone.api_key), {"Authorization": f"Bearer {someone.api_key}"}):
        refused = httpx.get(page, headers=headers, verify=tls.client_context())
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "forbidden"
    # The key is checked before the query: no key and a bad window is still 401.
    assert httpx.get(page, params={"hours": "x"}, verify=tls.client_context()).status_code == 401
    for hours in ("0", "49", "x"):
        bad = httpx.get(
            page,
            params={"hours": hours},
            headers=basic(operator.api_key),
            verify=tls.client_context(),
        )
        assert bad.status_code == 422, hours
        assert bad.json()["error"]["code"] == "invalid_request"

    for headers in (basic(operator.api_key), {"Authorization": f"Bearer {operator.api_key}"}):
        shown = httpx.get(page, headers=headers, verify=tls.client_context())
        assert shown.status_code == 200
        assert shown.headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in shown.headers["content-security-policy"]
        assert shown.headers["cache-control"] == "no-store"
    # The chart library comes from the package, to anyone (it holds nothing of ours).
    library = httpx.get(f"{served}/operator/static/uPlot.iife.min.js", verify=tls.client_context())
    assert library.status_code == 200
    assert library.content == (STATIC_DIR / "uPlot.iife.min.js").read_bytes()
    # With the page's policy (Starlette's StaticFiles sent none of it), cached.
    for name in ("uPlot.iife.min.js", "page.js"):
        served_file = httpx.get(f"{served}/operator/static/{name}", verify=tls.client_context())
        assert served_file.headers["x-content-type-options"] == "nosniff", name
        assert "default-src 'none'" in served_file.headers["content-security-policy"], name
        assert served_file.headers["referrer-policy"] == "no-referrer", name
        assert "no-store" not in served_file.headers.get("cache-control", ""), name
    # A GET that writes nothing: no decision, no sample, no alert more than before.
    with transaction(stack.engine) as conn:
        before = [conn.execute(select(func.count()).select_from(x)).scalar() for x in TABLES]
    httpx.get(page, headers=basic(operator.api_key), verify=tls.client_context()).raise_for_status()
    with transaction(stack.engine) as conn:
        after = [conn.execute(select(func.count()).select_from(x)).scalar() for x in TABLES]
    assert after == before


TABLES = (t.scheduler_decisions, t.queue_samples, t.alerts, t.scheduler_state)


def status_json(stack: Stack, tmp_path: Path) -> dict[str, Any]:
    """``hypermedia status --json``, on the scene's database, Redis and scheduler.json."""
    config_file = tmp_path / "scheduler.json"
    config_file.write_text(json.dumps(config_data()))
    env = {
        "HYPERMEDIA_DATABASE_URL": support.url_string(stack.engine),
        "HYPERMEDIA_REDIS_URL": support.redis_server_url(),
        "HYPERMEDIA_REDIS_PREFIX": stack.settings.redis_prefix,
        "HYPERMEDIA_DATA_DIR": str(tmp_path),
        "HYPERMEDIA_SCHEDULER_CONFIG": str(config_file),
    }
    result = CliRunner().invoke(cli, ["status", "--json"], env=env)
    assert result.exit_code == 0, result.output
    shown: dict[str, Any] = json.loads(result.stdout)
    return shown


def money(cents: float) -> str:
    return f"${cents / 100:,.2f}"


def read_page(browser: Any) -> dict[str, Any]:
    """The numbers the page shows, as text, by the cells' classes."""
    from selenium.webdriver.common.by import By

    def text(root: Any, selector: str) -> str:
        return str(root.find_element(By.CSS_SELECTOR, selector).text)

    queues = {}
    for row in browser.find_elements(By.CSS_SELECTOR, "#queues tbody tr"):
        queues[row.get_attribute("data-queue")] = {
            "depth": text(row, ".depth"),
            "oldest": text(row, ".oldest"),
            "bands": [cell.text for cell in row.find_elements(By.CSS_SELECTOR, ".band")],
            "in_flight": text(row, ".in-flight"),
            "retry_wait": text(row, ".retry-wait"),
            "in": text(row, ".in-rate"),
            "out": text(row, ".out-rate"),
        }
    workers = {
        row.get_attribute("data-worker"): {
            "queue": text(row, ".queue"),
            "where": text(row, ".where"),
            "state": text(row, ".state"),
            "heartbeat": text(row, ".heartbeat"),
            "jobs": text(row, ".jobs"),
            "cpu": text(row, ".cpu"),
        }
        for row in browser.find_elements(By.CSS_SELECTOR, "#workers tbody tr[data-worker]")
    }
    return {
        "mode": text(browser, "#mode"),
        "leader": text(browser, "#leader"),
        "queues": queues,
        "workers": workers,
        "instances": [
            row.get_attribute("data-instance")
            for row in browser.find_elements(By.CSS_SELECTOR, "#instances tbody tr")
        ],
        "spend": [
            text(browser, f"#{name}")
            for name in ("spend-hour", "cap-hour", "spend-today", "cap-day", "alert-threshold")
        ],
        "lock": text(browser, "#lock"),
        "billing": [p.text for p in browser.find_elements(By.CSS_SELECTOR, "#spend .billing")],
        "alerts": [
            row.get_attribute("data-alert")
            for row in browser.find_elements(By.CSS_SELECTOR, "#alerts tbody tr[data-alert]")
        ],
        "decisions": [
            (text(row, ".action"), text(row, ".queue"), text(row, ".reason"))
            for row in browser.find_elements(By.CSS_SELECTOR, "#decisions tr.decision")
        ],
        "charts": json.loads(
            browser.find_element(By.ID, "chart-data").get_attribute("textContent")
        ),
    }


def expected_page(status: dict[str, Any]) -> dict[str, Any]:
    """What the page should show of a status (``as_json``'s shape), as text."""

    def band(queue: dict[str, Any], name: str) -> str:
        found = queue["bands"].get(name)
        return f"{found['depth']} · {age_text(found['oldest_age_seconds'])}" if found else "-"

    spend = status["spend"]
    return {
        "mode": status["mode"],
        "leader": status["leader"] or "none",
        "queues": {
            q["queue"]: {
                "depth": str(q["depth"]),
                "oldest": age_text(q["oldest_age_seconds"]) if q["depth"] else "-",
                "bands": [band(q, name) for name in ("1-3", "4-6", "7-10")],
                "in_flight": str(q["in_flight"]),
                "retry_wait": str(q["retry_wait"]),
                "in": f"{q['in_per_minute']:g}",
                "out": f"{q['out_per_minute']:g}",
            }
            for q in status["queues"]
        },
        "workers": {
            w["worker_id"]: {
                "queue": w["queue"],
                "where": w["location"],
                "state": w["state"],
                "heartbeat": f"{age_text(w['heartbeat_age_seconds'])} ago",
                "jobs": f"{w['current_jobs']}/{w['concurrency']}",
                "cpu": "-" if w["cpu_percent"] is None else f"{w['cpu_percent']:g} %",
            }
            for w in status["workers"]
        },
        "instances": [i["instance_id"] for i in status["instances"]],
        "spend": [
            money(spend[name])
            for name in (
                "last_hour_cents",
                "hourly_cap_cents",
                "today_cents",
                "daily_cap_cents",
                "alert_threshold_cents",
            )
        ],
        "lock": "not locked" if not spend["locked"] else spend["lock_reason"],
        "billing": [f"billing {b['provider']}: {b['error']}" for b in status["billing"]],
        "alerts": [a["key"] for a in status["alerts"]],
        "decisions": [(d["action"], d["queue"] or "-", d["reason"]) for d in status["decisions"]],
    }


def steady(shown: dict[str, Any]) -> dict[str, Any]:
    """What does not move with the clock (``status --json`` runs on the real one)."""
    return {
        "mode": shown["mode"],
        "leader": shown["leader"],
        "queues": {
            name: {k: v for k, v in q.items() if k in ("depth", "in_flight", "retry_wait")}
            | {"bands": [b.split(" · ")[0] for b in q["bands"]]}
            for name, q in shown["queues"].items()
        },
        "workers": {
            name: {k: v for k, v in w.items() if k in ("queue", "state", "jobs", "cpu")}
            for name, w in shown["workers"].items()
        },
        "instances": shown["instances"],
        "caps": shown["spend"][1::2],
        "billing": shown["billing"],
        "alerts": shown["alerts"],
    }


def colour_pixels(image: Image.Image, colour: tuple[int, int, int], tolerance: int = 40) -> int:
    """Pixels of an RGB image within ``tolerance`` of ``colour`` in each channel."""
    found = 0
    for count, pixel in image.getcolors(image.width * image.height) or []:
        assert isinstance(pixel, tuple)
        if all(abs(a - b) <= tolerance for a, b in zip(pixel, colour, strict=True)):
            found += count
    return found


def test_the_page_shows_what_status_shows_and_draws_its_charts(
    stack, scene, served, tmp_path, browser
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    operator = add_user(stack, "ops", operator=True)
    assert isinstance(stack.clock, ManualClock)  # the page gathers at the scene's now
    host = served.removeprefix("http://")
    # The browser's own Basic authentication: the key as the password.
    browser.get(f"http://operator:{operator.api_key}@{host}/operator?hours={HOURS}")
    WebDriverWait(browser, 30).until(
        lambda b: len(b.find_elements(By.CSS_SELECTOR, ".chart[data-drawn]")) == 4
    )
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1400, height + 300)  # the whole page in the screenshot
    charts = {  # where each chart's canvas is (its legend left out)
        chart.get_attribute("id"): chart.find_element(By.TAG_NAME, "canvas").rect
        for chart in browser.find_elements(By.CSS_SELECTOR, ".chart")
    }
    shot = tmp_path / "operator.png"
    assert browser.save_screenshot(str(shot))
    shown = read_page(browser)
    console = [
        entry for entry in browser.get_log("browser") if entry["level"] in ("SEVERE", "ERROR")
    ]
    assert console == []  # no script error, no CSP refusal, no missing file

    # The numbers: gather's (the page gathers on the same clock: all of them) ...
    status = gather(stack, scene, decisions=50)
    assert shown | {"charts": None} == expected_page(status.as_json()) | {"charts": None}
    # ... and status --json's (on the real clock: those that do not move with it).
    command = status_json(stack, tmp_path)
    assert steady(shown) == steady(expected_page(command))
    assert shown["decisions"][: len(command["decisions"])] == expected_page(command)["decisions"]
    assert [d["action"] for d in command["decisions"]] == ["launch"]

    # The charts' data: the samples of the last 3 hours, ending with the scene's turn.
    data = shown["charts"]
    with transaction(stack.engine) as conn:
        rows = samples.read(conn, status.at - HOURS * 3600, status.at)
    assert data["times"] == sorted({row.at for row in rows}) and len(data["times"]) == 181
    last = {q.queue: q.depth for q in status.queues}
    assert {name: depth[-1] for name, depth in data["depth"].items()} == last
    assert data["workers"]["images"][0] == 2 and data["workers"]["images"][-61] == 3
    assert (data["last_hour_cents"][-1], data["today_cents"][-1]) == (
        status.spend.last_hour_cents,
        status.spend.today_cents,
    )
    # i-old ran 40 min at $2/h: some hour of the window holds all of it.
    assert max(data["last_hour_cents"]) == pytest.approx(133.33, abs=0.01)

    # The screenshot: the page rendered, and each chart drew its lines.
    image = Image.open(io.BytesIO(shot.read_bytes())).convert("RGB")
    assert image.width == 1400
    drawn = {}
    for name, rect in charts.items():
        box = (rect["x"], rect["y"], rect["x"] + rect["width"], rect["y"] + rect["height"])
        assert rect["width"] > 300 and rect["height"] > 200, name
        assert box[3] <= image.height, name  # in the screenshot
        region = image.crop(tuple(round(v) for v in box))
        drawn[name] = {
            "blue": colour_pixels(region, PALETTE["images"]),
            "orange": colour_pixels(region, PALETTE["documents"]),
            "red": colour_pixels(region, CAP_RED),
        }
    for counts in ("chart-depth", "chart-workers"):  # the images and documents lines
        assert drawn[counts]["blue"] > 500 and drawn[counts]["orange"] > 500, drawn
    for spend in ("chart-spend-hour", "chart-spend-day"):  # the spend and the cap
        assert drawn[spend]["blue"] > 500 and drawn[spend]["red"] > 200, drawn
    print(f"screenshot: {shot} ({image.width}x{image.height}); pixels by chart: {drawn}")


def test_the_leader_samples_each_queue_once_a_minute_and_forgets_old_samples(stack, clock):
    config = scheduler_config.parse(config_data())
    leadership = Leadership(stack.redis, stack.settings.redis_prefix, "samples-test", 60)
    scheduler = Scheduler(config, stack.engine, stack.queue, leadership, clock)
    names = list(config.queues)
    old = Snapshot(clock.now() - samples.RETENTION_SECONDS - 1, {}, (), {}, Spend(0.0, 0.0))
    with transaction(stack.engine) as conn:
        conn.execute(
            t.queue_samples.insert().values(
                sampled_at=to_datetime(old.now),
                queue="images",
                depth=1,
                oldest_age_seconds=0.0,
                workers=0,
            )
        )

    def taken() -> list[tuple[float, str]]:
        with transaction(stack.engine) as conn:
            return [(round(s.at, 3), s.queue) for s in samples.read(conn, 0, clock.now())]

    first = round(clock.now(), 3)
    scheduler.evaluate()
    assert taken() == [(first, name) for name in sorted(names)]  # the old one is gone
    clock.advance(samples.SAMPLE_SECONDS - 1)
    scheduler.evaluate()
    assert len(taken()) == len(names)
    clock.advance(1)
    scheduler.evaluate()
    assert [at for at, _ in taken()] == [first] * len(names) + [first + 60] * len(names)
    # A scheduler that does not lead samples nothing.
    other = Scheduler(
        config,
        stack.engine,
        stack.queue,
        Leadership(stack.redis, stack.settings.redis_prefix, "other", 60),
        clock,
    )
    clock.advance(120)
    assert other.evaluate().term is None
    assert len(taken()) == 2 * len(names)


def test_the_last_hour_chart_counts_an_instance_of_the_day_before(stack, clock):
    """A window that starts in the first hour of a UTC day: its first points' last hour
    reaches into the day before, and an instance that ended there costs in it (the
    ledger was read from the window's midnight on: it counted nothing)."""
    from autoscaler import cost
    from autoscaler.page.routes import history

    midnight = cost.day_start(clock.now()) + cost.DAY_SECONDS  # the next, a fixed point
    clock.advance(midnight + 3 * 3600 + 20 * 60 - clock.now())  # 03:20 UTC: since 00:20
    with transaction(stack.engine) as conn:
        conn.execute(
            t.cloud_spend.insert().values(
                provider="aws",
                instance_id="i-late",
                node_type="images",
                region="eu-west-3",
                spot=False,
                price_per_hour_microusd=2_000_000,  # $2/h
                launched_at=to_datetime(midnight - 3600),  # 23:00 to 23:50 the day before
                terminated_at=to_datetime(midnight - 600),
            )
        )
    config = scheduler_config.parse(config_data())
    status = gather(stack, config)
    drawn = history(stack, config, status, HOURS)
    assert drawn.spend_times[0] == midnight + 20 * 60
    # At 00:20 the last hour holds its 30 minutes from 23:20: $1; today nothing.
    assert (drawn.last_hour_cents[0], drawn.today_cents[0]) == (100.0, 0.0)
    assert drawn.last_hour_cents[-1] == drawn.today_cents[-1] == 0.0


def test_the_page_says_the_record_is_down_and_reloads_until_it_is_back(
    private_postgres: support.PrivatePostgres, settings
):
    """With PostgreSQL down the page answered the API's JSON 503 (the key cannot be
    checked, nothing can be read), and a browser showing it stopped reloading: it is an
    HTML page now that says what is down, in the page's own words, and reloads itself."""
    stack = Stack.open(settings(database_url=private_postgres.url), auto_migrate=True)
    try:
        operator = add_user(stack, "ops", operator=True)
        app = create_app(stack)
        install(app, scheduler_config.parse(config_data()))
        with running_server(app) as base_url:
            page = f"{base_url}/operator"
            assert (
                httpx.get(
                    page, headers=basic(operator.api_key), verify=tls.client_context()
                ).status_code
                == 200
            )
            private_postgres.stop()
            down = httpx.get(
                page, headers=basic(operator.api_key), timeout=60, verify=tls.client_context()
            )
            assert down.status_code == 503, down.text
            assert down.headers["content-type"].startswith("text/html")
            assert down.headers["retry-after"] == "10"
            assert '<meta http-equiv="refresh" content="10">' in down.text
            assert "database_unavailable" in down.text and "database is unavailable" in down.text
            assert str(private_postgres.port) not in down.text  # the driver's words: the log's
            private_postgres.start()
            back = httpx.get(
                page, headers=basic(operator.api_key), timeout=60, verify=tls.client_context()
            )
            assert back.status_code == 200, back.text
    finally:
        stack.close()


def test_the_page_shows_each_bulk_runs_progress(stack, clock, tmp_path, browser):
    """The page listed the bulk runs not finished with their raw counts (created,
    skipped, migrated, failed) and nothing of how far each was: an operator watching a
    long regeneration could not tell. Each run not finished now shows its progress as
    ``bulk status`` says it (percent, done + failed of the total, failed, in flight,
    rate, ETA; "—" where there is none: a run from before totals), and the last three
    finished of the day follow, greyed."""
    from selenium.webdriver.common.by import By

    made = bulk_runs(stack, clock)
    config = scheduler_config.parse(config_data())
    operator = add_user(stack, "ops", operator=True)
    app = create_app(stack)
    install(app, config)
    with running_server(app) as base_url:
        host = base_url.removeprefix("http://")
        browser.get(f"http://operator:{operator.api_key}@{host}/operator")
        heading = browser.find_element(By.CSS_SELECTOR, "#bulk h2").text
        rows = {
            row.get_attribute("data-run"): {
                "class": row.get_attribute("class"),
                **{
                    name: row.find_element(By.CSS_SELECTOR, f".{name}").text
                    for name in (
                        "kind",
                        "state",
                        "queue",
                        "percent",
                        "objects",
                        "failed",
                        "live",
                        "rate",
                        "eta",
                    )
                },
                "bar": row.find_element(By.TAG_NAME, "progress").get_attribute("value"),
                "title": row.find_element(By.CSS_SELECTOR, ".objects").get_attribute("title"),
            }
            for row in browser.find_elements(By.CSS_SELECTOR, "#bulk tbody tr[data-run]")
        }
        order = list(rows)
        console = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert console == []
    assert heading == "Bulk runs 3 not finished · the last 3 finished below"
    names = {run_id: name for name, run_id in made.items()}
    # Not finished, oldest first; then the last three finished, the latest first.
    assert [names[r] for r in order] == [
        "active",
        "paused",
        "old",
        "cancelled-3",
        "cancelled-2",
        "completed",
    ]
    shown = {names[r]: row for r, row in rows.items()}
    assert shown["active"] == {
        "class": "",
        "kind": "backfill thumbnail",
        "state": "creating",
        "queue": "bulk · 8",
        "percent": "40.0%",
        "objects": "4/10",
        "failed": "1",
        "live": "4/4",
        "rate": "0.04/s",
        "eta": "2m 30s",
        "bar": "40",
        "title": "3 done, 1 failed, 6 remaining",
    }
    assert {k: shown["paused"][k] for k in ("state", "percent", "objects", "rate", "eta")} == {
        "state": "paused",
        "percent": "0.0%",
        "objects": "0/3",
        "rate": "—",
        "eta": "—",
    }
    # A run from before totals, while it scans: no percent, no total, no crash.
    assert {k: shown["old"][k] for k in ("state", "percent", "objects", "live", "eta")} == {
        "state": "creating",
        "percent": "—",
        "objects": "0/—",
        "live": "1/1",
        "eta": "—",
    }
    assert shown["old"]["title"] == "0 done, 0 failed"
    assert shown["completed"]["class"] == "finished"
    assert shown["completed"]["state"].startswith("completed 20")  # and when
    assert (shown["completed"]["percent"], shown["completed"]["objects"]) == ("100.0%", "2/2")
    assert shown["cancelled-3"]["state"].startswith("cancelled ")
    # The numbers are gather's (the page gathers on the same clock).
    status = gather(stack, config)
    assert [r.run_id for r in status.bulk + status.bulk_finished] == order
    (active,) = [r for r in status.bulk if r.run_id == made["active"]]
    assert active.progress.percent == 40.0 and active.progress.eta_seconds == 150.0


# What another wrote that the page shows: markup, a script, an attribute broken out of,
# a javascript: URL, a bidi override, a terminal's escape. And what is long without a
# space: a host name as long as DNS allows, a URL in a reason.
HOSTILE = (
    '<script>document.title="ran"</script>"><img src=x onerror="document.title=\'ran\'">'
    "'><svg onload=document.title='ran'> javascript:document.title='ran' \u202eevil \x1b[2J"
)
LONG_HOST = ".".join(["a" * 63] * 4)[:253]
LEADER = f"{HOSTILE} 7"  # the scheduler's lease: its holder (a host name) and term
LONG_URL = "https://billing.example/" + "x" * 600

# The words of the page's own text after ``value`` in ``element`` (within its block),
# each as [its letters' left edges]: in reading order unless a bidi override of the
# value (U+202E) runs on past it.
WORDS_AFTER = """
const [element, value] = arguments;
const walker = document.createTreeWalker(element, NodeFilter.SHOW_TEXT);
const nodes = [];
let text = "";
while (walker.nextNode()) {
  nodes.push([walker.currentNode, text.length]);
  text += walker.currentNode.data;
}
const end = text.indexOf(value) + value.length;
const words = {};
for (const word of text.slice(end).matchAll(/[A-Za-z0-9]{2,}/g)) {
  words[word[0]] = [...word[0]].map((_, i) => {
    const at = end + word.index + i;
    const [node, start] = nodes.findLast(([, start]) => start <= at);
    const range = document.createRange();
    range.setStart(node, at - start);
    range.setEnd(node, at - start + 1);
    return range.getBoundingClientRect().left;
  });
}
return [text.indexOf(value), words];
"""


def backwards(browser: Any, selector: str, value: str) -> list[str]:
    """The words of the page's own after ``value`` in ``selector`` drawn right to left."""
    from selenium.webdriver.common.by import By

    element = browser.find_element(By.CSS_SELECTOR, selector)
    found, words = browser.execute_script(WORDS_AFTER, element, value)
    assert found >= 0 and words, (selector, found, words)
    return [word for word, lefts in words.items() if lefts != sorted(lefts)]


def test_the_page_shows_what_others_wrote_as_text_and_within_the_window(stack, served, browser):
    from selenium.webdriver.common.by import By

    from autoscaler.alerting import STATE
    from autoscaler.scheduler import BURSTS, COST_LOCK, RECONCILED
    from autoscaler.state import write_state
    from tests.factories import add_worker_row

    operator = add_user(stack, "ops", operator=True)
    now = stack.clock.now()
    add_worker_row(stack.engine, "w-long", at=to_datetime(now - 5), hostname=LONG_HOST)
    add_worker_row(stack.engine, "w-hostile", at=to_datetime(now - 5), hostname=HOSTILE)
    with transaction(stack.engine) as conn:
        conn.execute(
            t.workers.update()
            .where(t.workers.c.worker_id == "w-hostile")
            .values(claims_paused_since=to_datetime(now - 60), claims_paused_reason=HOSTILE)
        )
        conn.execute(
            t.scheduler_decisions.insert().values(
                decided_at=to_datetime(now),
                mode="hybrid",
                action="launch",
                queue="images",
                applied=True,
                reason=f"{HOSTILE} {LONG_URL}",
                details={},
            )
        )
        active = {"rule": "r", "level": "warning", "labels": {}, "since": now - 60}
        alerts = {"k": active | {"summary": f"{HOSTILE} {LONG_URL}", "firing_since": now - 60}}
        write_state(conn, STATE, {"active": alerts}, now)
        write_state(conn, COST_LOCK, {"at": now - 10, "reason": f"{HOSTILE} {LONG_URL}"}, now)
        write_state(
            conn, BURSTS, {"images": {"workers": 1, "until": now + 600, "by": HOSTILE}}, now
        )
        billing = {"aws": {"read_at": now, "error": f"{HOSTILE} {LONG_URL}"}}
        write_state(
            conn, RECONCILED, {"providers": billing, "findings": [{"message": HOSTILE}]}, now
        )
    stack.redis.set(Leadership(stack.redis, stack.settings.redis_prefix, "x", 60).lease_key, LEADER)
    host = served.removeprefix("http://")
    browser.get(f"http://operator:{operator.api_key}@{host}/operator")
    title = browser.title
    cells = {
        row.get_attribute("data-worker"): row.find_element(By.CSS_SELECTOR, ".host").text
        for row in browser.find_elements(By.CSS_SELECTOR, "#workers tr[data-worker]")
    }
    reason = browser.find_element(By.CSS_SELECTOR, "#decisions td.reason").text
    planted = browser.execute_script(
        "return document.querySelectorAll('body img, body svg, a[href^=javascript]').length"
    )
    widths = browser.execute_script(
        "return [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    # The page's own words after a value with a bidi override, in the same cell or
    # line: the worker's "for 1 min" after its pause reason, the header's "last turn"
    # after the leader.
    reversed_words = {
        selector: backwards(browser, selector, value)
        for selector, value in (
            ("#workers tr[data-worker=w-hostile] td.state", HOSTILE),
            ("#summary", LEADER),
        )
    }
    console = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    # Nothing of it ran, nor was even tried (the CSP would have refused it, and said so).
    assert (title, planted, console) == ("hypermedia · operator", 0, [])
    # The override ends with the value: the page's own words read as written.
    assert all(words == [] for words in reversed_words.values()), reversed_words
    # It is shown as written ...
    assert (cells["w-hostile"], cells["w-long"]) == (HOSTILE, LONG_HOST)
    assert reason == f"{HOSTILE} {LONG_URL}"
    # ... and the long words wrap in their cells: the page is no wider than the window.
    assert widths[0] <= widths[1], widths
