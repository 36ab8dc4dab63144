"""``hypermedia status``: the platform on one screen, on a real PostgreSQL and Redis.

The jobs move through the real dispatcher (claimed, completed, failed, retried), the
scheduler takes a real turn (a launch, an alert firing); then :func:`gather`,
``status --json`` and the screen each show the numbers the record and Redis hold."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, text
from typer.testing import CliRunner

from autoscaler.scheduler import RECONCILED, set_burst
from autoscaler.state import write_state
from autoscaler.status import RATE_WINDOW_SECONDS, BillingStatus, gather
from hypermedia.cli import app
from hypermedia.clock import to_datetime
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.stack import Stack
from tests import support
from tests.status_scene import bulk_runs, clock, config_data, scene, stack

__all__ = ["clock", "scene", "stack"]  # the scene's fixtures, used here


def record_numbers(stack: Stack) -> dict[str, Any]:
    """What the record and Redis say, read here without the status code."""
    now = stack.clock.now()
    since = to_datetime(now - RATE_WINDOW_SECONDS)
    j = t.jobs.c
    with transaction(stack.engine) as conn:
        queued: dict[str, int] = dict(
            conn.execute(
                select(j.queue, func.count()).where(j.status == "queued").group_by(j.queue)
            ).all()
        )
        in_flight: dict[str, int] = dict(
            conn.execute(
                select(j.queue, func.count())
                .where(j.status.in_(("claimed", "processing")))
                .group_by(j.queue)
            ).all()
        )
        retry: dict[str, int] = dict(
            conn.execute(
                select(j.queue, func.count()).where(j.status == "retry_wait").group_by(j.queue)
            ).all()
        )
        created: dict[str, int] = dict(
            conn.execute(
                select(j.queue, func.count()).where(j.created_at >= since).group_by(j.queue)
            ).all()
        )
        finished: dict[str, int] = dict(
            conn.execute(
                select(j.queue, func.count())
                .where(j.completed_at >= since, j.status.in_(("completed", "failed")))
                .group_by(j.queue)
            ).all()
        )
        running: dict[str, int] = dict(
            conn.execute(
                text(
                    "select worker_id, count(*) from job_attempts where status = 'running'"
                    " group by worker_id"
                )
            ).all()
        )
        decisions = [
            row.reason
            for row in conn.execute(
                select(t.scheduler_decisions).order_by(t.scheduler_decisions.c.decision_id.desc())
            )
        ]
        notified = {
            row.key: row.status
            for row in conn.execute(select(t.alerts).order_by(t.alerts.c.alert_id))
        }
    prefix = stack.settings.redis_prefix
    redis_counts = {
        q: (
            stack.redis.zcard(f"{prefix}:ready:{q}"),
            stack.redis.zcard(f"{prefix}:leased:{q}"),
            stack.redis.zcard(f"{prefix}:delayed:{q}"),
        )
        for q in stack.settings.queue_names
    }
    return {
        "queued": queued,
        "in_flight": in_flight,
        "retry": retry,
        "created": created,
        "finished": finished,
        "running": running,
        "decisions": decisions,
        "firing": sorted(k for k, s in notified.items() if s == "firing"),
        "redis": redis_counts,
    }


def test_gather_shows_what_the_record_and_redis_hold(stack, scene):
    status = gather(stack, scene)
    record = record_numbers(stack)
    by_queue = {q.queue: q for q in status.queues}
    assert list(by_queue) == list(stack.settings.queue_names)
    for name, q in by_queue.items():
        ready, leased, delayed = record["redis"][name]
        assert (q.depth, q.in_flight, q.retry_wait) == (ready, leased, delayed)
        assert q.depth == record["queued"].get(name, 0)
        assert q.in_flight == record["in_flight"].get(name, 0)
        assert q.retry_wait == record["retry"].get(name, 0)
        assert q.created == record["created"].get(name, 0)
        assert q.finished == record["finished"].get(name, 0)
    images = by_queue["images"]
    # 13 images jobs: 2 completed, 1 failed, 1 waiting to retry, 1 running, 8 ready; the
    # old one was created before the window and completed in it.
    assert (images.depth, images.in_flight, images.retry_wait) == (8, 1, 1)
    assert (images.created, images.finished) == (12, 3)
    assert images.in_per_minute == round(12 / 15, 2)
    assert {b: band.depth for b, band in images.bands.items()} == {"1-3": 2, "4-6": 3, "7-10": 3}
    assert by_queue["documents"].depth == 1

    workers = {w.worker_id: w for w in status.workers}
    assert set(workers) == {"w-images", "w-docs"}
    assert workers["w-images"].current_jobs == record["running"]["w-images"] == 1
    assert workers["w-images"].cpu_percent == 42.5 and workers["w-docs"].cpu_percent is None
    assert workers["w-docs"].heartbeat_age_seconds == pytest.approx(50, abs=1)
    assert (workers["w-images"].location, workers["w-images"].hostname) == ("vps", "vps-1")

    assert [(i.instance_id, i.spot, i.cents_per_hour) for i in status.instances] == [
        ("i-0", True, 170.0)
    ]
    assert status.spend.last_hour_cents == pytest.approx(85.0, abs=0.01)
    assert (status.spend.daily_cap_cents, status.spend.locked) == (5000, False)

    # The scene's fleet reads no bill: the ledger's provider says so.
    assert status.billing == [BillingStatus("aws", None, None, "its billing is not read")]
    assert [a.key for a in status.alerts] == record["firing"] == ["queue_depth:images"]
    assert [d.reason for d in status.decisions] == record["decisions"][:10]
    assert any(d.action == "launch" and d.queue == "images" for d in status.decisions)
    assert status.leader is not None and status.leader.startswith("status-test ")
    assert status.mode == "hybrid" and status.last_turn_at == pytest.approx(
        stack.clock.now(), abs=1
    )


def test_gather_reads_every_bulk_runs_progress_in_the_same_few_queries(stack, clock):
    """gather counted each bulk run's jobs in a query of its own (N+1: a page reload a
    query a run) and showed no progress; now the runs' jobs are counted in one query
    for all, with their rate, and the last finished runs come in one more."""
    from sqlalchemy import event

    from autoscaler import config as scheduler_config
    from hypermedia.bulk.runs import RunSpec
    from hypermedia.bulk.service import BulkService
    from hypermedia.jobs.catalog import ProfileCatalog

    made = bulk_runs(stack, clock)
    config = scheduler_config.parse(config_data())
    statements: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    event.listen(stack.engine, "before_cursor_execute", count)
    try:
        status = gather(stack, config)
        few = len(statements)
        service = BulkService(stack.engine, stack.queue, ProfileCatalog.load(stack.engine))
        for _ in range(6):  # 6 more, not finished
            service.create(RunSpec(kind="backfill", operation="thumbnail"), "ops")
        statements.clear()
        more = gather(stack, config)
    finally:
        event.remove(stack.engine, "before_cursor_execute", count)
    assert len(more.bulk) == len(status.bulk) + 6
    assert len(statements) == few, statements
    shown = {r.run_id: r for r in status.bulk}
    assert [r.run_id for r in status.bulk] == [made[n] for n in ("active", "paused", "old")]
    active = shown[made["active"]].progress
    assert (active.total, active.done, active.failed, active.in_flight) == (10, 3, 1, 4)
    assert (active.percent, active.jobs_per_second, active.eta_seconds) == (40.0, 0.04, 150.0)
    old = shown[made["old"]].progress
    assert (old.total, old.percent, old.remaining, old.eta_seconds) == (None, None, None, None)
    assert [r.run_id for r in status.bulk_finished] == [
        made[n] for n in ("cancelled-3", "cancelled-2", "completed")
    ]
    assert status.bulk_finished[2].progress.percent == 100.0
    assert status.bulk_finished[2].finished_at is not None
    # As JSON (status --json): the progress as the API's run says it.
    (listed,) = [r for r in status.as_json()["bulk"] if r["run_id"] == made["active"]]
    assert listed["progress"]["remaining"] == 6


def _status_env(stack, tmp_path: Path, data: Path | None = None) -> dict[str, str]:
    """The environment of a ``status`` run on ``stack`` with config_data()'s
    scheduler.json (written under ``tmp_path``) and ``data`` (``tmp_path``) its data dir."""
    config_file = tmp_path / "scheduler.json"
    config_file.write_text(json.dumps(config_data()))
    return {
        "HYPERMEDIA_DATABASE_URL": support.url_string(stack.engine),
        "HYPERMEDIA_REDIS_URL": support.redis_server_url(),
        "HYPERMEDIA_REDIS_PREFIX": stack.settings.redis_prefix,
        "HYPERMEDIA_DATA_DIR": str(data or tmp_path),
        "HYPERMEDIA_SCHEDULER_CONFIG": str(config_file),
    }


def test_the_command_shows_the_same_numbers(stack, scene, tmp_path: Path):
    env = _status_env(stack, tmp_path)
    runner = CliRunner()
    result = runner.invoke(app, ["status", "--json"], env=env)
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    expected = gather(stack, scene).as_json()

    def steady(status: dict[str, Any]) -> dict[str, Any]:
        """What does not move with the clock (the command's is the real one)."""
        return {
            "queues": [
                {k: q[k] for k in ("queue", "depth", "in_flight", "retry_wait", "created")}
                | {"bands": {b: v["depth"] for b, v in q["bands"].items()}}
                for q in status["queues"]
            ],
            "workers": [
                {k: w[k] for k in ("worker_id", "queue", "state", "current_jobs", "cpu_percent")}
                for w in status["workers"]
            ],
            "instances": [i["instance_id"] for i in status["instances"]],
            "spend": {k: status["spend"][k] for k in ("daily_cap_cents", "locked")},
            "alerts": [a["key"] for a in status["alerts"]],
            "decisions": status["decisions"],
            "mode": status["mode"],
            "leader": status["leader"],
        }

    assert steady(shown) == steady(expected)

    # What the last reconciliation found (autoscaler.scheduler.Scheduler.reconcile).
    with transaction(stack.engine) as conn:
        found = "aws's bill for instance i-9 is $0.40, the ledger counted $0.17"
        providers = {"aws": {"read_at": 1_800_000_000.0, "compared": ["2027-01-14"]}}
        value = {"at": 1.0, "providers": providers, "findings": [{"message": found}]}
        write_state(conn, RECONCILED, value, 1.0)
    # An operator's manual burst (autoscaler.scheduler.set_burst, what the command writes).
    set_burst(stack.engine, scene, "images", 2, 7200, time.time(), by="ops")
    shown = json.loads(runner.invoke(app, ["status", "--json"], env=env).stdout)
    assert [(b["queue"], b["workers"], b["by"]) for b in shown["bursts"]] == [("images", 2, "ops")]
    screen = runner.invoke(app, ["status"], env=env)
    assert screen.exit_code == 0, screen.output
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in screen.stdout.splitlines()]
    cells = next(row for row in rows if row[:1] == ["images"])
    assert cells[0:2] == ["images", "8"]
    assert cells[3].startswith("2 · ") and cells[6:10] == ["1", "1", "0.8", "0.2"]
    for word in ("w-images", "w-docs", "42.5 %", "queue_depth:images", "i-0", "hybrid"):
        assert word in screen.stdout, word
    assert "launch" in screen.stdout
    assert "Billing aws: read 2027-01-15 08:00:00, last day compared 2027-01-14" in screen.stdout
    assert found in screen.stdout
    assert "Manual burst images: 2 cloud workers until" in screen.stdout


def test_the_command_shows_each_bulk_runs_progress(stack, clock, tmp_path: Path):
    """``status`` listed the bulk runs not finished with their raw counts and nothing of
    how far each was. Each now shows its progress as ``bulk status`` says it (a bar,
    percent, done + failed of the total, failed, in flight, rate, ETA; "—" where there is
    none: a run from before totals), then the last three finished of the day; --json
    has each run's progress and the finished ones."""
    # The scene's runs end at the real now (status runs on the real clock): the active
    # run's 4 jobs ended about 100 s ago.
    clock.advance(time.time() - clock.now() - 340)
    made = bulk_runs(stack, clock)
    env = _status_env(stack, tmp_path)
    runner = CliRunner()
    screen = runner.invoke(app, ["status"], env=env)
    assert screen.exit_code == 0, screen.output
    assert "Bulk runs (3 not finished; the last 3 finished, dimmed)" in screen.stdout
    rows: dict[str, list[str]] = {}  # a row's cells, its wrapped lines joined
    for line in screen.stdout.splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if cells and cells[0] in made.values():
            run = rows[cells[0]] = cells
        elif rows and len(cells) == len(run) and not cells[0]:
            run[:] = [f"{a} {b}".strip() for a, b in zip(run, cells, strict=True)]
        elif rows:
            break
    names = {run_id: name for name, run_id in made.items()}
    assert [names[r] for r in rows] == [
        "active",
        "paused",
        "old",
        "cancelled-3",
        "cancelled-2",
        "completed",
    ]
    shown = {names[r]: cells for r, cells in rows.items()}
    active = shown["active"]
    assert active[1:6] == ["backfill thumbnail, bulk · 8", "creating", "40.0% 4/10", "1", "4/4"]
    # Its rate and ETA are measured to the real moment status ran: checked against the
    # JSON below (the same numbers), not against a time a loaded machine may miss.
    assert re.fullmatch(r"0\.0\d/s", active[6]) and re.fullmatch(r"\d+m \d\ds", active[7]), active
    assert shown["paused"][2:4] == ["paused", "0.0% 0/3"] and shown["paused"][6:] == ["—", "—"]
    # A run from before totals, while it scans: no percent, no total, no crash.
    assert shown["old"][2:8] == ["creating", "— 0/—", "0", "1/1", "—", "—"]
    assert re.fullmatch(r"completed \dm \d\ds ago", shown["completed"][2]), shown["completed"]
    assert shown["completed"][3] == "100.0% 2/2"
    assert re.fullmatch(r"cancelled \dm \d\ds ago", shown["cancelled-3"][2])

    result = runner.invoke(app, ["status", "--json"], env=env)
    assert result.exit_code == 0, result.output
    listed = json.loads(result.stdout)
    progress = {names[r["run_id"]]: r["progress"] for r in listed["bulk"]}
    assert {k: progress["active"][k] for k in ("total", "done", "failed", "in_flight")} == {
        "total": 10,
        "done": 3,
        "failed": 1,
        "in_flight": 4,
    }
    assert progress["active"]["percent"] == 40.0
    # 4 jobs ended over the time since its create (~100 s; more on a loaded machine);
    # the ETA is what is left (4 in flight, 2 not scanned: 6 jobs) at that rate.
    rate, eta = progress["active"]["jobs_per_second"], progress["active"]["eta_seconds"]
    assert 0.01 < rate <= 0.04 and abs(eta * rate / 6 - 1) < 0.05, progress["active"]
    assert active[6] == f"{rate:.2f}/s" or abs(float(active[6][:-2]) - rate) <= 0.01
    assert progress["old"]["total"] is None and progress["old"]["percent"] is None
    finished = [names[r["run_id"]] for r in listed["bulk_finished"]]
    assert finished == ["cancelled-3", "cancelled-2", "completed"]
    assert listed["bulk_finished"][2]["finished_at"] is not None


def test_the_command_shows_the_storage(stack, scene, tmp_path: Path):
    """``status`` probes the storage as /healthz does: up, or down and why (here the
    local directory is a file, where nothing can be stored)."""
    data = tmp_path / "status-data"
    env = _status_env(stack, tmp_path, data)
    runner = CliRunner()
    result = runner.invoke(app, ["status", "--json"], env=env)
    assert result.exit_code == 0, result.output
    storage = json.loads(result.stdout)["storage"]  # was no storage at all
    assert (storage["ok"], storage["problem"]) == (True, None)
    (data / "objects").rmdir()
    (data / "objects").write_bytes(b"")
    storage = json.loads(runner.invoke(app, ["status", "--json"], env=env).stdout)["storage"]
    assert storage["ok"] is False and str(data / "objects") in storage["problem"]
    screen = runner.invoke(app, ["status"], env=env)
    assert screen.exit_code == 0, screen.output
    assert "Storage: down: local storage at" in screen.stdout


def test_watch_shows_an_outage_and_goes_on_when_it_ends(stack, scene, tmp_path: Path):
    """`status --watch` ended at the first read that failed (Redis or the record down):
    when the operator watches most. It shows what is down and since when, then the
    platform again once it is back."""
    import queue as lines_queue
    import signal
    import subprocess
    import sys
    import threading

    from hypermedia.embedded import EmbeddedRedis

    redis = EmbeddedRedis(tmp_path / "redis")
    redis.start()
    port = redis.port
    config_file = tmp_path / "scheduler.json"
    config_file.write_text(json.dumps(config_data()))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("HYPERMEDIA_")},
        "HYPERMEDIA_DATABASE_URL": support.url_string(stack.engine),
        "HYPERMEDIA_REDIS_URL": redis.url,
        "HYPERMEDIA_DATA_DIR": str(tmp_path),
        "HYPERMEDIA_SCHEDULER_CONFIG": str(config_file),
    }
    watching = subprocess.Popen(
        [sys.executable, "-m", "hypermedia.cli", "status", "--watch", "--json"],
        env={**env, "HYPERMEDIA_STATUS_INTERVAL": "0.5"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: lines_queue.Queue[dict[str, Any]] = lines_queue.Queue()

    def read() -> None:
        assert watching.stdout is not None
        for line in watching.stdout:
            seen.put(json.loads(line))

    threading.Thread(target=read, daemon=True).start()

    def next_line(kind: str) -> dict[str, Any]:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = seen.get(timeout=max(0.1, deadline - time.monotonic()))
            if ("error" in line) == (kind == "error"):
                return line
        raise AssertionError(f"no {kind} line within 60 s")

    try:
        assert "queues" in next_line("status")
        redis.stop()
        down = next_line("error")
        assert down["error"]["code"] == "queue_unavailable", down
        assert down["since"] <= down["at"]
        redis = EmbeddedRedis(tmp_path / "redis", port)
        redis.start()
        assert "queues" in next_line("status")
        assert watching.poll() is None  # still watching
    finally:
        watching.send_signal(signal.SIGINT)
        try:
            _out, err = watching.communicate(timeout=30)
        finally:  # neither left running if the watch did not end
            watching.kill()
            watching.wait()
            redis.stop()
    assert watching.returncode == 0, err
    assert "Traceback" not in err


def test_watch_on_screen_ends_at_ctrl_c_between_two_reads(stack, scene, tmp_path: Path):
    """Ctrl-C ends the on-screen watch too (exit 0, no traceback), with reads every 0.5 s:
    it ends it once the read under way is done (a KeyboardInterrupt in the middle of a
    read could leave a connection's lock held for the close to wait on)."""
    import signal
    import subprocess
    import sys

    config_file = tmp_path / "scheduler.json"
    config_file.write_text(json.dumps(config_data()))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("HYPERMEDIA_")},
        "HYPERMEDIA_DATABASE_URL": support.url_string(stack.engine),
        "HYPERMEDIA_REDIS_URL": stack.settings.redis_url,
        "HYPERMEDIA_DATA_DIR": str(tmp_path),
        "HYPERMEDIA_SCHEDULER_CONFIG": str(config_file),
        "HYPERMEDIA_STATUS_INTERVAL": "0.5",
        "COLUMNS": "160",
    }
    watching = subprocess.Popen(
        [sys.executable, "-m", "hypermedia.cli", "status", "--watch"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(10)  # started, and reading every 0.5 s (off a terminal it draws nothing)
        watching.send_signal(signal.SIGINT)
        _out, err = watching.communicate(timeout=30)
    finally:
        watching.kill()  # none left behind if it did not end
        watching.wait()
    assert watching.returncode == 0, err
    assert "Traceback" not in err
