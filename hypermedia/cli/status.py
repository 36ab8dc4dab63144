"""``hypermedia status``: the platform on one screen; ``hypermedia status JOB_ID``: a job.

Without a job id it is an operator's command on the server: it reads the record and
Redis (the settings' ``database_url`` and ``redis_url``, like ``scheduler log``) and
``scheduler.json`` through :func:`autoscaler.status.gather`, and shows queues, workers,
spend, firing alerts, the last decisions, and the bulk runs not finished with their
progress (then the last few finished); ``--json`` prints the same values as JSON,
``--watch`` redraws (or, with ``--json``, prints one JSON line) every ``--interval``
seconds until Ctrl-C. With a job id it asks the API (:func:`hypermedia.cli.jobs.show_job`).
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from hypermedia.cli.common import (
    ApiKey,
    ApiUrl,
    Timeout,
    plain,
    read_settings,
    require_database,
    say,
)
from hypermedia.cli.jobs import show_job
from hypermedia.clock import age_text

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.text import Text

    from autoscaler.status import Status
    from hypermedia.stack import Stack
    from hypermedia.storage.health import StorageHealth


def status(
    job_id: Annotated[
        str | None,
        typer.Argument(help="A job id: show that job (over the API). None: the platform."),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", envvar="HYPERMEDIA_STATUS_JSON", help="The platform as JSON."),
    ] = False,
    watch: Annotated[
        bool,
        typer.Option("--watch", envvar="HYPERMEDIA_STATUS_WATCH", help="Refresh until Ctrl-C."),
    ] = False,
    interval: Annotated[
        float,
        typer.Option(
            "--interval", envvar="HYPERMEDIA_STATUS_INTERVAL", min=0.5, help="--watch's, s."
        ),
    ] = 2.0,
    config_path: Annotated[
        Path | None,
        typer.Option(
            "--config",
            envvar="HYPERMEDIA_SCHEDULER_CONFIG",
            help="scheduler.json (the caps and mode shown).",
            show_default=False,
        ),
    ] = None,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    timeout: Timeout = 30.0,
) -> None:
    """The platform at a glance: queues, workers, spend, alerts, decisions (on the
    server); or one job's status, attempts, credits and outputs (with a job id)."""
    if job_id is not None:
        show_job(job_id, api_url, api_key, timeout)
        return
    from autoscaler import config as scheduler_config

    loaded = scheduler_config.load(config_path)
    settings = read_settings()
    require_database(settings)  # else the open below would create it, empty
    from rich.console import Console
    from rich.live import Live

    from autoscaler.status import gather
    from hypermedia.stack import Stack

    stack = Stack.open(settings, with_storage=False)
    probe = _storage_probe(stack)
    try:
        if not watch:
            current = gather(stack, loaded, storage=probe)
            if as_json:
                say(json.dumps(current.as_json(), indent=2))
            else:
                Console(width=max(120, Console().width)).print(render(current))
            return
        # An outage of the record or Redis is shown, and the watch goes on: it is when
        # the operator watches most (before, the first failed read ended it).
        outage = _Outage()
        try:
            if as_json:
                while True:
                    say(json.dumps(outage.read(stack, loaded, probe, as_json=True)))
                    time.sleep(interval)
            with Live(outage.read(stack, loaded, probe), auto_refresh=False, screen=True) as live:
                while True:
                    time.sleep(interval)
                    live.update(outage.read(stack, loaded, probe), refresh=True)
        except KeyboardInterrupt:
            return
    finally:
        stack.close()


class _Outage:
    """``--watch``'s reads: the status, or what is down and since when."""

    def __init__(self) -> None:
        self.since: float | None = None

    def read(self, stack: Any, loaded: Any, probe: Any, *, as_json: bool = False) -> Any:
        from autoscaler.status import gather
        from hypermedia.errors import ServiceUnavailable

        try:
            current = gather(stack, loaded, storage=probe)
        except ServiceUnavailable as exc:
            now = time.time()
            self.since = self.since or now
            if as_json:
                return {"at": now, "error": exc.to_dict(), "since": self.since}
            return plain(
                f"hypermedia at {_when(now)} UTC: {exc.code}: {exc.message}\n"
                f"since {_when(self.since)} UTC; trying again every refresh (Ctrl-C stops)",
                style="bold red",
            )
        self.since = None
        return current.as_json() if as_json else render(current)


def _storage_probe(stack: Stack) -> StorageHealth:
    """The storage's probe, as the API's /healthz runs it; a storage that cannot even be
    built (S3 credentials to be had nowhere) is down for that reason."""
    from hypermedia.errors import HypermediaError
    from hypermedia.stack import storage_health
    from hypermedia.storage.configured import build_storage
    from hypermedia.storage.health import StorageHealth

    try:
        storage = build_storage(stack.settings, stack.clock)
    except HypermediaError as exc:
        refusal = exc

        def refused() -> None:
            raise refusal

        return StorageHealth(refused, every=0, timeout=1, clock=stack.clock)
    return storage_health(storage, stack.settings, stack.clock)


def _money(cents: float) -> str:
    return f"${cents / 100:,.2f}"


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _add_row(table: Any, *cells: str | Text, style: str | None = None) -> None:
    table.add_row(*(plain(c) if isinstance(c, str) else c for c in cells), style=style)


def render(current: Status) -> RenderableType:
    """The screen: a few tables, one per part. Every string of ``current`` goes through
    :func:`plain`; only the labels around them are the code's."""
    from rich.console import Group
    from rich.table import Table

    parts: list[Any] = []
    leader = current.leader or "none"
    header = (
        f"hypermedia at {_when(current.at)} UTC · mode {current.mode} · scheduler leader"
        f" {leader} · last turn {_when(current.last_turn_at)}"
    )
    parts.append(plain(header, style="bold"))
    if current.storage is not None:
        if current.storage.ok:
            parts.append(plain("Storage: up"))
        else:
            parts.append(plain(f"Storage: down: {current.storage.problem}", style="bold red"))

    window = f"{current.rate_window_seconds / 60:.0f} min"
    queues = Table(
        "queue",
        "depth",
        "oldest",
        "1-3",
        "4-6",
        "7-10",
        "in flight",
        "retry wait",
        f"in/min ({window})",
        f"out/min ({window})",
        title="Queues (depth: ready jobs; per band: depth, oldest)",
        title_justify="left",
    )
    for q in current.queues:
        bands = [
            f"{band.depth} · {age_text(band.oldest_age_seconds)}" if band else "-"
            for band in (q.bands.get(name) for name in ("1-3", "4-6", "7-10"))
        ]
        _add_row(
            queues,
            q.queue,
            str(q.depth),
            age_text(q.oldest_age_seconds) if q.depth else "-",
            *bands,
            str(q.in_flight),
            str(q.retry_wait),
            f"{q.in_per_minute:g}",
            f"{q.out_per_minute:g}",
        )
    parts.append(queues)

    workers = Table(
        "worker",
        "queue",
        "where",
        "host",
        "state",
        "heartbeat",
        "jobs",
        "CPU",
        title=f"Workers ({len(current.workers)} live)",
        title_justify="left",
    )
    for w in current.workers:
        _add_row(
            workers,
            w.worker_id,
            w.queue,
            w.location,
            w.hostname,
            w.shown_state
            + (
                ""
                if w.claims_paused_seconds is None
                else f" for {age_text(w.claims_paused_seconds)}"
            )
            + ("" if w.outage_note is None else f"; {w.outage_note}"),
            f"{age_text(w.heartbeat_age_seconds)} ago",
            f"{w.current_jobs}/{w.concurrency}",
            "-" if w.cpu_percent is None else f"{w.cpu_percent:g} %",
        )
    parts.append(workers)
    if current.instances:
        instances = Table(
            "instance",
            "provider",
            "type",
            "spot",
            "price",
            "running",
            title="Cloud instances",
            title_justify="left",
        )
        for i in current.instances:
            _add_row(
                instances,
                i.instance_id,
                i.provider,
                i.node_type,
                "yes" if i.spot else "no",
                f"{_money(i.cents_per_hour)}/h",
                age_text(i.running_seconds),
            )
        parts.append(instances)

    s = current.spend
    lock = (
        f"LOCKED to vps_only since {_when(s.locked_at)}: {s.lock_reason}"
        if s.locked
        else "not locked"
    )
    parts.append(
        plain(
            f"Spend: last hour {_money(s.last_hour_cents)} (cap {_money(s.hourly_cap_cents)})"
            f" · today {_money(s.today_cents)} (cap {_money(s.daily_cap_cents)}, alert at"
            f" {_money(s.alert_threshold_cents)}) · {lock}",
            style="bold red" if s.locked else "",
        )
    )

    for b in current.billing:
        if b.error is not None:
            said = f"Billing {b.provider}: {b.error}"
        elif b.read_at is None:
            said = f"Billing {b.provider}: nothing settled to compare yet"
        else:
            through = f", last day compared {b.compared_through}" if b.compared_through else ""
            said = f"Billing {b.provider}: read {_when(b.read_at)}{through}"
        parts.append(plain(said, style="yellow" if b.error else ""))
    for finding in current.billing_findings:
        parts.append(plain(f"  {finding}", style="yellow"))
    for burst in current.bursts:
        by = f" (by {burst.by})" if burst.by else ""
        parts.append(
            plain(
                f"Manual burst {burst.queue}: {burst.workers} cloud workers until"
                f" {_when(burst.until)}{by}"
            )
        )

    styles = {"critical": "bold red", "warning": "yellow", "info": ""}
    alerts = Table(
        "level",
        "alert",
        "since",
        "summary",
        title=f"Alerts firing ({len(current.alerts)})",
        title_justify="left",
    )
    for a in current.alerts:
        level = plain(a.level, style=styles.get(a.level, ""))
        _add_row(alerts, level, a.key, _when(a.firing_since), a.summary)
    parts.append(alerts)

    decisions = Table(
        "when",
        "action",
        "queue",
        "applied",
        "reason",
        title="Last decisions",
        title_justify="left",
    )
    for d in current.decisions:
        _add_row(
            decisions,
            _when(d.decided_at),
            d.action,
            d.queue or "-",
            "yes" if d.applied else "no",
            d.reason,
        )
    parts.append(decisions)
    if current.bulk or current.bulk_finished:
        parts.append(_bulk_table(current))
    return Group(*parts)


NONE = "—"  # a value a run has not (yet): no total, no rate, no ETA


def _bulk_table(current: Status) -> RenderableType:
    """The bulk runs not finished, each with its progress (as ``bulk status`` says it),
    then the last few finished, dimmed."""
    from rich.table import Column, Table

    finished = current.bulk_finished
    title = f"Bulk runs ({len(current.bulk)} not finished" + (
        f"; the last {len(finished)} finished, dimmed)" if finished else ")"
    )
    table = Table(
        Column("run", no_wrap=True),  # whole: what bulk pause/cancel take
        Column("kind, queue · priority", min_width=9),
        Column("state", min_width=9),
        Column("progress", min_width=6, overflow="fold"),
        "failed",
        "in flight",
        "rate",
        "ETA",
        title=title,
        title_justify="left",
    )
    rows = [(r, False) for r in current.bulk] + [(r, True) for r in finished]
    for r, ended in rows:
        p = r.progress
        state = r.shown_state + (f" ({r.reason})" if r.reason else "")
        if ended and r.finished_at is not None:
            state += f" {age_text(current.at - r.finished_at)} ago"
        _add_row(
            table,
            r.run_id,
            f"{r.kind} {r.operation or ''}".strip() + f", {r.queue or '-'} · {r.priority}",
            state,
            (NONE if p.percent is None else f"{p.percent:.1f}%")
            + f" {p.done + p.failed:,}/{NONE if p.total is None else f'{p.total:,}'}",
            f"{p.failed:,}",
            f"{r.counts['live']}/{r.max_in_flight}",
            NONE if p.jobs_per_second is None else f"{p.jobs_per_second:.2f}/s",
            NONE if p.eta_seconds is None else age_text(p.eta_seconds),
            style="dim" if ended else None,
        )
    return table
