"""``hypermedia scheduler``: the scaling rules and cost limits of scheduler.json,
run, explained, replayed on a trace, and the daily-cap lock lifted."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from hypermedia.cli.common import note, open_engine, plain, read_settings, require_database, say

if TYPE_CHECKING:
    from autoscaler.webhooks import Webhook

app = typer.Typer(
    help="The scheduler: scaling rules and cost limits from scheduler.json.", no_args_is_help=True
)

SchedulerConfigPath = Annotated[
    Path | None,
    typer.Option(
        "--config",
        envvar="HYPERMEDIA_SCHEDULER_CONFIG",
        help="scheduler.json (default: /etc/hypermedia/scheduler.json, else the shipped"
        " vps_only defaults).",
        show_default=False,
    ),
]
AlertWebhooksPath = Annotated[
    Path | None,
    typer.Option(
        "--alert-webhooks",
        envvar="HYPERMEDIA_ALERT_WEBHOOKS",
        help="The alert webhooks (JSON, not readable by others; default:"
        " /etc/hypermedia/alert-webhooks.json if it exists, else none).",
        show_default=False,
    ),
]


def _scheduler(
    config_path: Path | None, webhooks_path: Path | None = None, alerts: bool = True
) -> tuple[Any, Any]:
    """(the scheduler, its stack); the caller closes the stack. ``alerts`` False: no
    webhooks (a command that only looks). Its recorder holds what the scheduler records
    only (the queue and worker gauges are the API's to serve)."""
    from autoscaler import config as scheduler_config

    settings = read_settings()
    loaded = scheduler_config.load(config_path, settings.queue_names)
    hooks: list[Webhook] = []
    if alerts:
        from autoscaler import webhooks

        hooks = webhooks.load(webhooks_path)
    require_database(settings)  # else the open below would create it, empty
    # What refuses a bad file or a data dir nothing has run with comes first, cheaply;
    # then the scheduler and the stack (~0.4 CPU-s of imports).
    from autoscaler.scheduler import open_scheduler
    from hypermedia.metrics.head import HeadMetrics
    from hypermedia.stack import Stack

    stack = Stack.open(settings, metrics=HeadMetrics())
    try:
        return open_scheduler(loaded, stack, alert_webhooks=hooks), stack
    except BaseException:
        stack.close()
        raise


@app.command("run")
def scheduler_run(
    config_path: SchedulerConfigPath = None,
    once: Annotated[
        bool,
        typer.Option(
            "--once",
            envvar="HYPERMEDIA_SCHEDULER_ONCE",
            help="One evaluation (and one pass of alert deliveries), then exit.",
        ),
    ] = False,
    webhooks_path: AlertWebhooksPath = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            envvar="HYPERMEDIA_SCHEDULER_METRICS_PORT",
            min=1,
            max=65535,
            help="Serve its metrics (spend against the caps, the cost lock, decisions) to"
            " Prometheus on 127.0.0.1:PORT; where it runs in the API's process (ray up's"
            " head) the API's /metrics has them.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Evaluate the rules every evaluation_interval_seconds (one leader at a time), and
    deliver the alerts to the webhooks."""
    import signal
    import threading

    scheduler, stack = _scheduler(config_path, webhooks_path)
    server = None
    try:
        if metrics_port is not None and not once:
            from prometheus_client import start_http_server

            from hypermedia.errors import ServiceUnavailable

            try:
                server, _thread = start_http_server(
                    metrics_port, addr="127.0.0.1", registry=stack.metrics.registry
                )
            except OSError as exc:
                raise ServiceUnavailable(
                    f"the scheduler's metrics could not start on 127.0.0.1:{metrics_port}"
                    f" (--metrics-port / HYPERMEDIA_SCHEDULER_METRICS_PORT): {exc.strerror}"
                ) from exc
        if once:
            evaluation = scheduler.evaluate()
            for decision in evaluation.decisions:
                say(f"{decision.action:9} {decision.reason}")
            if evaluation.term is None:
                note(f"not the leader ({scheduler.leadership.current()} is): nothing applied")
            for attempt in scheduler.sender.deliver_due():
                outcome = "delivered" if attempt.delivered else attempt.error
                note(f"alert delivery {attempt.delivery_id} to {attempt.webhook}: {outcome}")
            return
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        note(
            f"scheduler: mode {scheduler.config.mode}, every"
            f" {scheduler.config.evaluation_interval_seconds} s"
        )
        scheduler.run(stop)
    finally:
        if server is not None:
            server.shutdown()
        scheduler.stop()
        stack.close()


@app.command("log")
def scheduler_log(
    limit: Annotated[
        int,
        typer.Option(
            "--limit", "-n", envvar="HYPERMEDIA_SCHEDULER_LOG_LIMIT", min=1, help="How many."
        ),
    ] = 20,
) -> None:
    """The most recent decisions and their reasons."""
    from rich.console import Console
    from rich.table import Table
    from sqlalchemy import select

    from hypermedia.db import tables as t
    from hypermedia.db.engine import transaction

    engine = open_engine(read_settings())
    try:
        with transaction(engine) as conn:
            d = t.scheduler_decisions
            rows = conn.execute(select(d).order_by(d.c.decision_id.desc()).limit(limit)).all()
    finally:
        engine.dispose()
    table = Table("when", "mode", "action", "queue", "applied", "reason")
    for row in reversed(rows):
        table.add_row(
            row.decided_at.strftime("%Y-%m-%d %H:%M:%S"),
            plain(row.mode),
            plain(row.action),
            plain(row.queue or "-"),
            "yes" if row.applied else "no",
            plain(row.reason),
        )
    Console().print(table)


@app.command("explain")
def scheduler_explain(config_path: SchedulerConfigPath = None) -> None:
    """What the scheduler would do now, and why (nothing is applied)."""
    scheduler, stack = _scheduler(config_path, alerts=False)
    try:
        for line in scheduler.explain():
            say(line)
    finally:
        stack.close()


@app.command("simulate")
def scheduler_simulate(
    trace: Annotated[
        Path | None,
        typer.Option(
            "--trace",
            envvar="HYPERMEDIA_SCHEDULER_TRACE",
            help="Arrivals: at_seconds,queue,priority,duration_seconds[,count] (CSV).",
            show_default=False,
        ),
    ] = None,
    config_path: SchedulerConfigPath = None,
    chart: Annotated[
        Path | None,
        typer.Option(
            "--chart",
            envvar="HYPERMEDIA_SCHEDULER_CHART",
            help="Write a PNG: workers per queue, waits per band, spend against the caps.",
            show_default=False,
        ),
    ] = None,
    json_path: Annotated[
        Path | None,
        typer.Option(
            "--json",
            envvar="HYPERMEDIA_SCHEDULER_JSON",
            help="Write the results as JSON: {policies: [{policy, cost_cents, launches,"
            " cap_breaches, p95_wait_seconds: {1-3, 4-6, 7-10}, ...}], capacity: [...]}.",
            show_default=False,
        ),
    ] = None,
    from_db: Annotated[
        bool,
        typer.Option(
            "--from-db",
            envvar="HYPERMEDIA_SCHEDULER_FROM_DB",
            help="Replay the record's real arrivals and run times instead of a trace file.",
        ),
    ] = False,
    since: Annotated[
        str,
        typer.Option(
            "--since",
            envvar="HYPERMEDIA_SCHEDULER_SINCE",
            help="With --from-db: how far back (7d, 12h, 90m, 3600s).",
        ),
    ] = "7d",
) -> None:
    """Replay a trace through the real policy and cost guard on simulated clouds: cost,
    launches, churn and waits per priority band, beside the seed's rules alone, a static
    fleet sized for the peak and a KEDA-style rule, and capacity advice. Exit 1 when the
    policy passed a cap (it must not). Traces: etc/traces/, or the record (--from-db)."""
    from autoscaler import recorded, simulate

    if from_db == (trace is not None):
        raise typer.BadParameter("give one of --trace FILE or --from-db")
    arrivals = None
    source = None
    if from_db:
        import time

        from hypermedia.db.engine import snapshot, unlimited

        try:
            span = recorded.parse_span(since)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
        engine = open_engine(read_settings())
        try:
            # An operator's offline read, one statement as long as the window's jobs
            # are many (7 days of 233k jobs: 4 s): without the engine's statement
            # limit, and on SQLite without its writer's lock.
            with snapshot(engine) as conn, unlimited(conn):
                arrivals = recorded.arrivals(conn, time.time(), span)
        finally:
            engine.dispose()
        if not arrivals:
            note(f"no jobs were created in the last {since}: nothing to replay")
            raise SystemExit(2)
        source = f"the record, last {since} ({len(arrivals)} jobs)"
    code = simulate.main(config_path, trace, chart, json_path, arrivals, source)
    if code:
        raise SystemExit(code)


_DURATION = {"m": 60, "h": 3600, "d": 86_400}


def parse_duration(text: str) -> float:
    """``90m``, ``2h``, ``1d``: seconds."""
    number, unit = text[:-1], text[-1:].lower()
    if unit not in _DURATION or not number.isdigit() or int(number) == 0:
        raise typer.BadParameter(f"{text!r}: a whole number of minutes, hours or days (2h)")
    return int(number) * _DURATION[unit]


@app.command("burst")
def scheduler_burst(
    queue: Annotated[str, typer.Argument(help="The queue (scheduler.json's queues).")],
    workers: Annotated[
        int,
        typer.Option(
            "--workers", "-n", envvar="HYPERMEDIA_BURST_WORKERS", min=1, help="Cloud workers."
        ),
    ] = 1,
    duration: Annotated[
        str,
        typer.Option(
            "--for", envvar="HYPERMEDIA_BURST_FOR", help="How long: 90m, 2h, 1d (7 days at most)."
        ),
    ] = "1h",
    end: Annotated[
        bool, typer.Option("--end", envvar="HYPERMEDIA_BURST_END", help="End the queue's burst.")
    ] = False,
    config_path: SchedulerConfigPath = None,
) -> None:
    """Burst by hand (the seed's stage 2): keep WORKERS cloud workers for QUEUE for a
    while, whatever its depth. The scheduler leading a `ray up` head launches them at its
    next turn, within the cost caps, max_workers and the cooldowns, and lets them go
    once the burst ends and they are idle. On the server only."""
    import getpass
    import time

    from autoscaler import config as scheduler_config

    seconds = parse_duration(duration)  # the arguments first, then the database
    settings = read_settings()
    loaded = scheduler_config.load(config_path, settings.queue_names)
    from autoscaler.scheduler import end_burst, set_burst

    now = time.time()
    engine = open_engine(settings)
    try:
        if end:
            ended = end_burst(engine, queue, now)
            say(f"{queue}: burst ended" if ended else f"{queue}: no burst to end")
            return
        burst = set_burst(engine, loaded, queue, workers, seconds, now, by=getpass.getuser())
    finally:
        engine.dispose()
    until = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(burst.until))
    say(
        f"{queue}: {burst.workers} cloud workers until {until}; the scheduler launches them"
        " at its next turn, within the caps"
    )


@app.command("reset-cost-lock")
def scheduler_reset_cost_lock() -> None:
    """Lift the daily-cap lock (back to the mode scheduler.json sets). On the server only."""
    from autoscaler.scheduler import reset_cost_lock

    engine = open_engine(read_settings())
    try:
        lock = reset_cost_lock(engine)
    finally:
        engine.dispose()
    if lock is None:
        say("no cost lock was set")
    else:
        say(f"cost lock lifted (set for: {lock.get('reason', '?')})")
