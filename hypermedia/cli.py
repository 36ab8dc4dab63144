"""The command line: ``hypermedia <command>``.

Operator commands work on the database named by the settings (``db upgrade``,
``user add``, ``credits grant``, ``serve``); client commands (``submit``,
``status``, ``cancel``, ``queues``, ``credits show``) talk HTTP to
``--api-url`` / ``HYPERMEDIA_API_URL`` with ``--api-key`` / ``HYPERMEDIA_API_KEY``.
Every option has a ``HYPERMEDIA_*`` environment twin (shown in ``--help``).

An error prints one red line, ``error: <code>: <message>``, and exits 1; a bad
setting names its key. ``--log-level debug`` shows tracebacks in the log.
This is the only module that configures logging handlers. Importing it is
cheap: everything heavy is imported inside the command that needs it.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from hypermedia.errors import AuthenticationFailed, ConfigError, HypermediaError

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy import Engine

    from hypermedia.config import Settings
    from hypermedia.ingest.client import HypermediaClient
    from hypermedia.ingest.schemas import JobResponse

log = logging.getLogger("hypermedia.cli")

app = typer.Typer(
    name="hypermedia",
    help="Processing platform for user files.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
db_app = typer.Typer(help="The job record's schema.", no_args_is_help=True)
user_app = typer.Typer(help="Users and their API keys.", no_args_is_help=True)
credits_app = typer.Typer(help="Credit accounts.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(user_app, name="user")
app.add_typer(credits_app, name="credits")
scheduler_app = typer.Typer(
    help="The scheduler: scaling rules and cost limits from scheduler.json.", no_args_is_help=True
)
app.add_typer(scheduler_app, name="scheduler")

ApiUrl = Annotated[
    str | None,
    typer.Option(
        "--api-url",
        envvar="HYPERMEDIA_API_URL",
        help="Base URL of the API (default: http://<api_host>:<api_port>).",
        show_default=False,
    ),
]
ApiKey = Annotated[
    str | None,
    typer.Option("--api-key", envvar="HYPERMEDIA_API_KEY", help="hm_... key.", show_default=False),
]
Timeout = Annotated[
    float,
    typer.Option("--timeout", envvar="HYPERMEDIA_API_TIMEOUT", min=0.1, help="HTTP timeout, s."),
]

_LEVELS = ("debug", "info", "warning", "error")


@app.callback()
def _root(
    ctx: typer.Context,
    log_level: Annotated[
        str | None,
        typer.Option(
            "--log-level",
            envvar="HYPERMEDIA_LOG_LEVEL",
            help="debug, info, warning or error (default: info for serve, else warning).",
            show_default=False,
        ),
    ] = None,
) -> None:
    default = "info" if ctx.invoked_subcommand == "serve" else "warning"
    _configure_logging(log_level or default)


def _configure_logging(level_name: str) -> None:
    if level_name.lower() not in _LEVELS:
        raise ConfigError(
            "log_level (HYPERMEDIA_LOG_LEVEL)", f"expected one of {', '.join(_LEVELS)}"
        )
    level = getattr(logging, level_name.upper())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    if level > logging.DEBUG:
        # Both log routine steps at INFO (every request; plugin set-up): noise here.
        for noisy in ("httpx", "alembic"):
            logging.getLogger(noisy).setLevel(logging.WARNING)


# -- helpers ------------------------------------------------------------------------------


def _settings(**overrides: Any) -> Settings:
    from hypermedia.config import load_settings

    return load_settings(**{k: v for k, v in overrides.items() if v is not None})


def _engine(settings: Settings) -> Engine:
    """An engine on an existing database whose schema is up to date. A SQLite file that
    is not there is not created: a data dir nothing has run with is an error."""
    from sqlalchemy import make_url

    from hypermedia.db.engine import make_engine
    from hypermedia.db.migrate import current_revision, head_revision

    url = make_url(settings.effective_database_url)
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        path = Path(url.database or "")
        if not path.exists():
            key = (
                "database_url (HYPERMEDIA_DATABASE_URL)"
                if settings.database_url
                else "data_dir (HYPERMEDIA_DATA_DIR)"
            )
            raise ConfigError(
                key,
                f"no database at {path}: nothing has run with this data dir (the services'"
                " one? a new deployment starts with `hypermedia db upgrade`)",
            )
    engine = make_engine(settings.effective_database_url)
    if current_revision(engine) != head_revision():
        engine.dispose()
        raise ConfigError(
            "database_url (HYPERMEDIA_DATABASE_URL)",
            "the database schema is not up to date: run `hypermedia db upgrade`",
        )
    return engine


def _client(api_url: str | None, api_key: str | None, timeout: float) -> HypermediaClient:
    from hypermedia.ingest.client import HypermediaClient

    settings = _settings(api_url=api_url, api_key=api_key)
    url = settings.api_url or f"http://{settings.api_host}:{settings.api_port}"
    if not settings.api_key:
        raise AuthenticationFailed("no API key: pass --api-key or set HYPERMEDIA_API_KEY")
    return HypermediaClient(url, settings.api_key, timeout=timeout)


def _note(message: str) -> None:
    """Human commentary, on stderr, so stdout stays what scripts parse."""
    typer.echo(message, err=True)


def _fail(message: str, code: int = 1) -> NoReturn:
    from rich.console import Console
    from rich.markup import escape

    Console(stderr=True, highlight=False, soft_wrap=True).print(f"[red]error: {escape(message)}[/]")
    raise SystemExit(code)


def _millicredits(amount: float) -> int:
    return round(amount * 1000)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"


# -- operators: database, users, credits, server -------------------------------------------


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Apply migrations and sync the processing profiles."""
    from sqlalchemy import make_url

    from hypermedia.db.engine import make_engine
    from hypermedia.db.migrate import current_revision
    from hypermedia.stack import migrate

    settings = _settings()
    engine = make_engine(settings.effective_database_url)
    try:
        migrate(settings, engine)
        revision = current_revision(engine)
    finally:
        engine.dispose()
    shown = make_url(settings.effective_database_url).render_as_string(hide_password=True)
    typer.echo(f"database {shown} is at revision {revision}; profiles synced")


KeyPriority = Annotated[
    str | None,
    typer.Option(
        "--priority",
        envvar="HYPERMEDIA_GRANT_PRIORITY",
        help="Priorities the key may ask for, MIN-MAX or N (1 is the most urgent and goes"
        " to on-demand capacity; default: key_priority_min-key_priority_max).",
        show_default=False,
    ),
]
KeySubmits = Annotated[
    int | None,
    typer.Option(
        "--submits-per-minute",
        envvar="HYPERMEDIA_GRANT_SUBMITS_PER_MINUTE",
        min=0,
        help="Submits a minute the key may make, 0: no limit (default: key_submits_per_minute).",
        show_default=False,
    ),
]


def _grants(priority: str | None, submits_per_minute: int | None) -> Any:
    from hypermedia.accounts import KeyGrants

    low = high = None
    if priority is not None:
        first, _, last = priority.partition("-")
        if not first.strip().isdigit() or not (last or first).strip().isdigit():
            raise ConfigError("--priority (HYPERMEDIA_GRANT_PRIORITY)", "expected MIN-MAX or N")
        low, high = int(first), int(last or first)
    return KeyGrants(low, high, submits_per_minute)


@user_app.command("add")
def user_add(
    name: Annotated[str, typer.Argument(help="Unique user name.")],
    credits: Annotated[
        float, typer.Option("--credits", envvar="HYPERMEDIA_USER_CREDITS", min=0)
    ] = 0.0,
    operator: Annotated[
        bool, typer.Option("--operator", envvar="HYPERMEDIA_USER_OPERATOR", help="May see queues.")
    ] = False,
    pool: Annotated[
        str | None,
        typer.Option(
            "--pool",
            envvar="HYPERMEDIA_USER_POOL",
            help="Join this existing pool instead of getting a personal one.",
        ),
    ] = None,
    priority: KeyPriority = None,
    submits_per_minute: KeySubmits = None,
) -> None:
    """Create a user; prints the API key (on stdout, shown this once only)."""
    from hypermedia.accounts import create_user
    from hypermedia.db.engine import transaction

    engine = _engine(_settings())
    try:
        with transaction(engine) as conn:
            user = create_user(
                conn,
                name,
                time.time(),
                credits_millicredits=_millicredits(credits),
                is_operator=operator,
                pool_id=pool,
                grants=_grants(priority, submits_per_minute),
            )
    finally:
        engine.dispose()
    role = " (operator)" if operator else ""
    _note(f"created user {user.name}{role}: id {user.user_id}, pool {user.pool_id}")
    _note(f"credits: {credits:g}")
    _note("API key (shown only this once):")
    typer.echo(user.api_key)


@user_app.command("key")
def user_key(
    user: Annotated[str, typer.Argument(help="User name or id.")],
    label: Annotated[str, typer.Option("--label", envvar="HYPERMEDIA_KEY_LABEL")] = "",
    priority: KeyPriority = None,
    submits_per_minute: KeySubmits = None,
) -> None:
    """Issue another API key for a user; prints it (shown this once only)."""
    from hypermedia.accounts import create_api_key, find_user
    from hypermedia.db.engine import transaction

    grants = _grants(priority, submits_per_minute)
    engine = _engine(_settings())
    try:
        with transaction(engine) as conn:
            user_id = find_user(conn, user)
            key = create_api_key(conn, user_id, time.time(), name=label, grants=grants)
    finally:
        engine.dispose()
    _note(f"new API key for {user} (shown only this once):")
    typer.echo(key)


@user_app.command("grant")
def user_grant(
    key: Annotated[str, typer.Argument(help="The key (hm_<key id>_...) or its key id.")],
    priority: KeyPriority = None,
    submits_per_minute: KeySubmits = None,
) -> None:
    """Set what an existing key may do; unset options return to the defaults. A running
    server applies it within its authentication cache time (30 s)."""
    from hypermedia.accounts import grant_api_key, key_id_of
    from hypermedia.db.engine import transaction

    grants = _grants(priority, submits_per_minute)
    engine = _engine(_settings())
    try:
        with transaction(engine) as conn:
            grant_api_key(conn, key_id_of(key), grants)
    finally:
        engine.dispose()
    typer.echo(f"API key {key_id_of(key)}: {_describe_grants(grants)}")


def _describe_grants(grants: Any) -> str:
    low, high = grants.priority_min, grants.priority_max
    shown = "default priorities" if low is None else f"priority {low}-{high}"
    rate = grants.submits_per_minute
    limit = "default submit rate" if rate is None else f"{rate or 'unlimited'} submits/min"
    return f"{shown}, {limit}"


@user_app.command("revoke")
def user_revoke(
    key: Annotated[str, typer.Argument(help="The key (hm_<key id>_...) or its key id.")],
) -> None:
    """Revoke an API key. A running server may accept it for up to 30 s more (its cache)."""
    from hypermedia.accounts import revoke_api_key
    from hypermedia.db.engine import transaction
    from hypermedia.errors import NotFound

    key_id = key.split("_")[1] if key.startswith("hm_") else key
    engine = _engine(_settings())
    try:
        with transaction(engine) as conn:
            revoked = revoke_api_key(conn, key_id, time.time())
    finally:
        engine.dispose()
    if not revoked:
        raise NotFound(f"no active API key {key_id!r}", key_id=key_id)
    typer.echo(f"revoked API key {key_id}")


@credits_app.command("grant")
def credits_grant(
    user: Annotated[str, typer.Argument(help="User name or id.")],
    amount: Annotated[float, typer.Argument(help="Credits to add (negative: remove; use --).")],
    note: Annotated[str, typer.Option("--note", envvar="HYPERMEDIA_CREDITS_NOTE")] = "",
) -> None:
    """Add credits to a user's account."""
    from hypermedia.accounts import find_user, grant_credits
    from hypermedia.db.engine import transaction

    engine = _engine(_settings())
    try:
        with transaction(engine) as conn:
            user_id = find_user(conn, user)
            balance = grant_credits(conn, user_id, _millicredits(amount), time.time(), note=note)
    finally:
        engine.dispose()
    typer.echo(f"granted {amount:g} credits to {user}; balance {balance / 1000:g}")


@app.command()
def serve(
    host: Annotated[
        str | None,
        typer.Option(
            "--host", envvar="HYPERMEDIA_API_HOST", help="Bind address (default: 127.0.0.1)."
        ),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(
            "--port", envvar="HYPERMEDIA_API_PORT", min=1, max=65535, help="Port (default: 8080)."
        ),
    ] = None,
    access_log: Annotated[
        bool, typer.Option("--access-log/--no-access-log", envvar="HYPERMEDIA_ACCESS_LOG")
    ] = True,
) -> None:
    """Run the HTTP API, the reaper and the reconciler until interrupted."""
    from hypermedia.server import serve as run

    settings = _settings(api_host=host, api_port=port)
    run(settings, host=settings.api_host, port=settings.api_port, access_log=access_log)


# -- clients: submit, status, cancel, queues, credits ---------------------------------------


@app.command()
def submit(
    files: Annotated[
        list[Path],
        typer.Argument(exists=True, dir_okay=False, readable=True, help="Files to upload."),
    ],
    op: Annotated[
        list[str],
        typer.Option("--op", "-o", envvar="HYPERMEDIA_SUBMIT_OPS", help="Operation (repeatable)."),
    ],
    priority: Annotated[
        int | None,
        typer.Option(
            "--priority", envvar="HYPERMEDIA_SUBMIT_PRIORITY", min=1, max=10, help="1 first."
        ),
    ] = None,
    pool: Annotated[
        str | None,
        typer.Option(
            "--pool", envvar="HYPERMEDIA_POOL_ID", help="Pool for the uploads (default: your own)."
        ),
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", envvar="HYPERMEDIA_SUBMIT_WAIT", help="Wait for the jobs.")
    ] = False,
    wait_timeout: Annotated[
        float, typer.Option("--wait-timeout", envvar="HYPERMEDIA_WAIT_TIMEOUT", min=0)
    ] = 600.0,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    timeout: Timeout = 60.0,
) -> None:
    """Upload files and submit operations on each; prints one line per job."""
    job_ids: list[str] = []
    with _client(api_url, api_key, timeout) as client:
        for path in files:
            obj = client.upload(path, pool_id=pool)
            typer.echo(f"object {obj.object_id} {path} {obj.size_bytes} bytes")
            result = client.process(obj.object_id, op, priority=priority)
            for job in result.jobs:
                typer.echo(
                    f"job {job.job_id} {job.operation} queue={job.queue} "
                    f"priority={job.priority} estimated_credits={job.estimated_credits:g}"
                )
                job_ids.append(job.job_id)
        if not wait:
            return
        unfinished = 0
        deadline = time.monotonic() + wait_timeout
        for job_id in job_ids:
            finished = client.wait(job_id, timeout=max(0.0, deadline - time.monotonic()))
            typer.echo(_job_line(finished))
            unfinished += finished.status != "completed"
    if unfinished:
        _fail(f"{unfinished} of {len(job_ids)} jobs did not complete")


def _job_line(job: JobResponse) -> str:
    line = f"job {job.job_id} {job.status}"
    if job.error_code:
        line += f" {job.error_code}: {job.error_message or ''}"
    return line


@app.command()
def status(
    job_id: Annotated[str, typer.Argument(help="Job id.")],
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    timeout: Timeout = 30.0,
) -> None:
    """Show a job: status, attempts, credits, outputs."""
    with _client(api_url, api_key, timeout) as client:
        job = client.job(job_id)

    def at(moment: datetime | None) -> str:
        return "-" if moment is None else moment.isoformat(timespec="seconds")

    charged = "-" if job.actual_credits is None else f"{job.actual_credits:g}"
    rows = [
        ("job", job.job_id),
        ("status", job.status + (" (cancel requested)" if job.cancel_requested else "")),
        ("operation", f"{job.operation} (queue {job.queue}, priority {job.priority})"),
        ("object", job.object_id),
        ("attempts", f"{job.attempt_count} of {job.max_attempts}"),
        ("credits", f"estimated {job.estimated_credits:g}, charged {charged}"),
        ("created", at(job.created_at)),
        ("queued", at(job.queued_at)),
        ("started", at(job.started_at)),
        ("completed", at(job.completed_at)),
    ]
    if job.run_after is not None:
        rows.append(("retry at", at(job.run_after)))
    if job.error_code:
        rows.append(("error", f"{job.error_code}: {job.error_message or ''}"))
    for attempt in job.attempts:
        result = attempt.status + (f" {attempt.error_code}" if attempt.error_code else "")
        rows.append((f"attempt {attempt.attempt_number}", f"{result} on {attempt.worker_id}"))
    for output in job.outputs:
        rows.append(
            ("output", f"{output.output_type} {output.storage_key} {output.size_bytes} bytes")
        )
    for label, value in rows:
        typer.echo(f"{label:<11}{value}")


@app.command()
def cancel(
    job_id: Annotated[str, typer.Argument(help="Job id.")],
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    timeout: Timeout = 30.0,
) -> None:
    """Cancel a job (a running one is asked to stop)."""
    with _client(api_url, api_key, timeout) as client:
        result = client.cancel(job_id)
    suffix = ", cancel requested" if result.cancel_requested else ""
    typer.echo(f"job {result.job_id} {result.status}{suffix}")


@app.command()
def queues(
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    timeout: Timeout = 30.0,
) -> None:
    """Queue depths, in-flight jobs, retries and the oldest waiting job (operators)."""
    from rich.console import Console
    from rich.table import Table

    with _client(api_url, api_key, timeout) as client:
        overview = client.queues()
    table = Table("queue", "queued", "in flight", "retry wait", "oldest age", "redis r/l/d")
    for q in overview.queues:
        redis = (
            "unreachable"
            if q.redis is None
            else f"{q.redis.ready}/{q.redis.leased}/{q.redis.delayed}"
        )
        table.add_row(
            q.queue,
            str(q.queued),
            str(q.in_flight),
            str(q.retry_wait),
            _age(q.oldest_age_seconds),
            redis,
        )
    Console(width=max(100, Console().width)).print(table)


@credits_app.command("show")
def credits_show(
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    timeout: Timeout = 30.0,
) -> None:
    """Your balance, what unfinished jobs hold, and what is available."""
    with _client(api_url, api_key, timeout) as client:
        account = client.credits()
    typer.echo(
        f"balance {account.balance:g}, reserved {account.reserved:g}, "
        f"available {account.available:g}"
    )


# -- the embedded run and the local stack ---------------------------------------------------


def _progress_say(console: Any) -> Any:
    return lambda message: console.print(f"[dim]{message}[/]")


@app.command()
def run(
    paths: Annotated[list[Path], typer.Argument(help="Files or directories.", exists=True)],
    operations: Annotated[
        list[str] | None,
        typer.Option(
            "--op",
            "-o",
            envvar="HYPERMEDIA_RUN_OPS",
            help="Operation (repeatable). Default: chosen per file type.",
        ),
    ] = None,
    priority: Annotated[
        int | None,
        typer.Option("--priority", envvar="HYPERMEDIA_RUN_PRIORITY", min=1, max=10),
    ] = None,
    out: Annotated[
        Path,
        typer.Option("--out", envvar="HYPERMEDIA_RUN_OUT", help="Where outputs are written."),
    ] = Path("hypermedia-out"),
    timeout: Annotated[
        float,
        typer.Option("--timeout", envvar="HYPERMEDIA_RUN_TIMEOUT", min=1, help="Seconds."),
    ] = 1800.0,
) -> None:
    """Process files end to end on this machine, then stop everything started.

    Starts a private Redis, a SQLite record, a Ray head on free ports and the
    pipeline actors; submits through the HTTP ingest client; shows progress per
    queue; writes outputs under --out; prints what was done and what failed.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    import pipelines.registry
    from hypermedia.local import LocalStack
    from hypermedia.runner import (
        check_operations,
        local_operator,
        submit_files,
        wait_until_finished,
        walk,
        write_outputs,
    )

    console = Console(stderr=True)
    settings = _settings()
    files = list(walk(paths))
    implemented = pipelines.registry.operations()
    if operations:
        check_operations(operations, implemented)
    console.print(f"[bold]hypermedia run[/]: {len(files)} files")
    local = LocalStack(settings)
    try:
        local.start(progress=_progress_say(console))
        _stop_on_sigterm()
        console.print(f"[dim]submitting {len(files)} files[/]")
        assert local.stack is not None
        _caller, key = local_operator(local.stack)
        with Progress(
            TextColumn("[bold]{task.description:<12}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[note]}"),
            console=console,
        ) as progress:
            upload = progress.add_task("upload", total=len(files), note="")

            def advance(path: Path) -> None:
                progress.update(upload, advance=1, note=path.name[:40])

            report = submit_files(
                local.api_url, key, files, operations, implemented, priority, on_file=advance
            )
            progress.update(upload, note="")
            totals: dict[str, int] = {}
            for item in report.submitted:
                totals[item.queue] = totals.get(item.queue, 0) + 1
            bars = {
                queue: progress.add_task(queue, total=total, note="")
                for queue, total in totals.items()
            }
            by_job = {item.job_id: item.queue for item in report.submitted}

            def show(rep: Any) -> None:
                done: dict[str, int] = {}
                failed: dict[str, int] = {}
                for job_id, queue in by_job.items():
                    status = rep.statuses.get(job_id)
                    if status in ("completed", "failed", "cancelled"):
                        done[queue] = done.get(queue, 0) + 1
                    if status == "failed":
                        failed[queue] = failed.get(queue, 0) + 1
                for queue, task in bars.items():
                    note = f"[red]{failed[queue]} failed[/]" if failed.get(queue) else ""
                    progress.update(task, completed=done.get(queue, 0), note=note)

            finished = wait_until_finished(local.stack, report, show, timeout)
        write_outputs(local.stack, report, out)
        _run_summary(console, report, out, finished)
    finally:
        console.print("[dim]stopping what was started[/]")
        local.stop(progress=_progress_say(console))
    counts = report.counts()
    if not finished or counts.get("failed") or report.skipped:
        raise SystemExit(1)


def _stop_on_sigterm() -> None:
    """SIGTERM ends ``run`` like Ctrl-C does, through its ``finally`` that stops the
    stack (installed after ``ray.init``, whose own handler would exit at once)."""
    import signal

    def interrupt(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


def _run_summary(console: Any, report: Any, out: Path, finished: bool) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table("file", "operation", "status", "output / reason")
    for item in report.submitted:
        status = report.statuses.get(item.job_id, "queued")
        if status == "completed":
            outputs = report.outputs.get(item.job_id, [])
            detail = ", ".join(p.name for p in outputs) or "(no output)"
            shown = "[green]done[/]"
        else:
            detail = report.errors.get(item.job_id, "")
            shown = f"[red]{status}[/]" if status == "failed" else status
        table.add_row(escape(item.path.name), item.operation, shown, escape(detail))
    for path, reason in report.skipped:
        table.add_row(escape(path.name), "-", "[yellow]skipped[/]", escape(reason))
    console.print(table)
    counts = report.counts()
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    console.print(
        f"[bold]{len(report.submitted)} jobs[/]: {summary or 'none'}"
        f"{f'; {len(report.skipped)} files skipped' if report.skipped else ''}. "
        f"Outputs in {out}/"
    )
    if not finished:
        console.print("[red]timed out waiting for the jobs; they stay recorded and queued[/]")


@app.command()
def head() -> None:
    """Run the local stack in the foreground (what `up` starts in the background)."""
    import signal
    import threading

    from hypermedia.local import LocalStack

    settings = _settings()
    local = LocalStack(settings)
    stop = threading.Event()
    try:
        local.start(progress=lambda message: log.info("%s", message))
        # After ray.init, which installs its own SIGTERM handler that would kill us
        # before the stack is stopped.
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        _write_private(settings.data_dir / "head.url", local.api_url)
        log.info("local stack up; API at %s", local.api_url)
        stop.wait()
    finally:
        local.stop(stop_redis=True, progress=lambda message: log.info("%s", message))
        (settings.data_dir / "head.url").unlink(missing_ok=True)


@app.command()
def up(
    wait: Annotated[
        float, typer.Option("--wait", envvar="HYPERMEDIA_UP_WAIT", min=1, help="Seconds.")
    ] = 180.0,
) -> None:
    """Start the local stack in the background (Redis, Ray head, API, actors)."""
    import os
    import subprocess

    settings = _settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    pidfile = settings.data_dir / "head.pid"
    url_file = settings.data_dir / "head.url"
    if _alive(pidfile):
        typer.echo(f"already up: {url_file.read_text() if url_file.exists() else '?'}")
        return
    url_file.unlink(missing_ok=True)
    from hypermedia.embedded import private_directory

    private_directory(settings.data_dir)
    log_path = settings.data_dir / "head.log"
    log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(log_fd, "ab") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hypermedia.cli", "--log-level", "info", "head"],
            stdout=log_file,
            stderr=log_file,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=os.environ.copy(),
        )
    _write_private(pidfile, str(proc.pid))
    deadline = time.monotonic() + wait
    while not url_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            pidfile.unlink(missing_ok=True)
            raise HypermediaError(f"the local stack did not come up; see {log_path}")
        time.sleep(0.2)
    typer.echo(f"up: API at {url_file.read_text()} (log: {log_path})")


@app.command()
def down(
    wait: Annotated[
        float, typer.Option("--wait", envvar="HYPERMEDIA_DOWN_WAIT", min=1, help="Seconds.")
    ] = 90.0,
) -> None:
    """Stop the local stack that `up` started, and whatever a stack of this data dir
    that died without stopping left running (its Ray head, its Redis)."""
    import os
    import signal

    from hypermedia.local import data_dir_in_use

    settings = _settings()
    pidfile = settings.data_dir / "head.pid"
    if _alive(pidfile):
        pid = int(pidfile.read_text())
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + wait
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
        pidfile.unlink(missing_ok=True)
        _stop_leftovers(settings)
        typer.echo("down")
        return
    pidfile.unlink(missing_ok=True)
    if data_dir_in_use(settings.data_dir):
        typer.echo("not running (a `hypermedia run` uses this data dir; it stops itself)")
        return
    stopped = _stop_leftovers(settings)
    if stopped:
        typer.echo(f"down: stopped what a stack that died left running ({', '.join(stopped)})")
    else:
        typer.echo("not running")


def _stop_leftovers(settings: Settings) -> list[str]:
    """Stop the Ray head and the embedded Redis of the data dir, if they still run."""
    from hypermedia.embedded import find_running
    from hypermedia.worker.cluster import RayNode, short_temp_dir

    stopped = []
    node = RayNode(short_temp_dir(settings.data_dir / "ray", "head"), Path("-"))
    if node.is_running():
        stopped.append(f"the Ray head, {node.stop()} processes")
    redis = find_running(settings.data_dir / "redis")
    if redis is not None:
        redis.stop()
        stopped.append("redis")
    return stopped


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def _pid_alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _alive(pidfile: Path) -> bool:
    try:
        return _pid_alive(int(pidfile.read_text()))
    except (OSError, ValueError):
        return False


@app.command()
def worker(
    address: Annotated[
        str,
        typer.Option("--address", envvar="HYPERMEDIA_RAY_ADDRESS", help="Head's GCS host:port."),
    ],
    token_file: Annotated[
        Path,
        typer.Option("--token-file", envvar="HYPERMEDIA_RAY_TOKEN_FILE", help="Cluster token."),
    ],
    queues: Annotated[
        list[str],
        typer.Option("--queue", "-q", envvar="HYPERMEDIA_WORKER_QUEUES", help="name[=actors]"),
    ],
    num_cpus: Annotated[int, typer.Option("--num-cpus", envvar="HYPERMEDIA_WORKER_CPUS")] = 2,
) -> None:
    """Join this machine to an existing cluster as a worker node for some queues.

    Runs in the foreground (for systemd or a container); the head's supervisor
    places pipeline actors here through the queue resources it advertises.
    """
    import signal
    import threading

    from hypermedia.worker import cluster

    counts: dict[str, int] = {}
    for spec in queues:
        name, _, n = spec.partition("=")
        counts[name] = int(n or 1)
    settings = _settings()
    node = cluster.start_worker_node(
        settings.data_dir / "ray",
        address,
        token_file,
        name=f"worker-{os.getpid()}",
        resources=cluster.queue_resources(counts),
        num_cpus=num_cpus,
    )
    typer.echo(f"joined {address} for {counts}")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        while not stop.wait(5):
            if not node.is_running():
                raise HypermediaError("the Ray node stopped")
    finally:
        node.stop()


# -- the scheduler -------------------------------------------------------------------------------

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


def _scheduler(config_path: Path | None) -> tuple[Any, Any]:
    """(the scheduler, its stack); the caller closes the stack."""
    from autoscaler import config as scheduler_config
    from autoscaler.scheduler import open_scheduler
    from hypermedia.stack import Stack

    loaded = scheduler_config.load(config_path)
    stack = Stack.open(_settings())
    try:
        return open_scheduler(loaded, stack), stack
    except BaseException:
        stack.close()
        raise


@scheduler_app.command("run")
def scheduler_run(
    config_path: SchedulerConfigPath = None,
    once: Annotated[
        bool,
        typer.Option(
            "--once", envvar="HYPERMEDIA_SCHEDULER_ONCE", help="One evaluation, then exit."
        ),
    ] = False,
) -> None:
    """Evaluate the rules every evaluation_interval_seconds (one leader at a time)."""
    import signal
    import threading

    scheduler, stack = _scheduler(config_path)
    try:
        if once:
            evaluation = scheduler.evaluate()
            for decision in evaluation.decisions:
                typer.echo(f"{decision.action:9} {decision.reason}")
            if evaluation.term is None:
                _note(f"not the leader ({scheduler.leadership.current()} is): nothing applied")
            return
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        _note(
            f"scheduler: mode {scheduler.config.mode}, every"
            f" {scheduler.config.evaluation_interval_seconds} s"
        )
        scheduler.run(stop)
    finally:
        scheduler.stop()
        stack.close()


@scheduler_app.command("log")
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

    engine = _engine(_settings())
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
            row.mode,
            row.action,
            row.queue or "-",
            "yes" if row.applied else "no",
            row.reason,
        )
    Console().print(table)


@scheduler_app.command("explain")
def scheduler_explain(config_path: SchedulerConfigPath = None) -> None:
    """What the scheduler would do now, and why (nothing is applied)."""
    scheduler, stack = _scheduler(config_path)
    try:
        for line in scheduler.explain():
            typer.echo(line)
    finally:
        stack.close()


@scheduler_app.command("simulate")
def scheduler_simulate(
    trace: Annotated[
        Path,
        typer.Option(
            "--trace",
            envvar="HYPERMEDIA_SCHEDULER_TRACE",
            help="Arrivals: at_seconds,queue,priority,duration_seconds.",
        ),
    ],
    config_path: SchedulerConfigPath = None,
    chart: Annotated[
        Path | None,
        typer.Option(
            "--chart", envvar="HYPERMEDIA_SCHEDULER_CHART", help="Write a PNG of workers and waits."
        ),
    ] = None,
) -> None:
    """Replay a trace through the real policy and cost guard on simulated clouds: cost and
    waits per priority band, beside a static fleet sized for the peak and a KEDA-style
    rule. Exit 1 when the policy passed a cap (it must not). Traces: etc/traces/."""
    from autoscaler import simulate

    code = simulate.main(config_path, trace, chart)
    if code:
        raise SystemExit(code)


@scheduler_app.command("reset-cost-lock")
def scheduler_reset_cost_lock() -> None:
    """Lift the daily-cap lock (back to the mode scheduler.json sets). On the server only."""
    from autoscaler.scheduler import reset_cost_lock

    engine = _engine(_settings())
    try:
        lock = reset_cost_lock(engine)
    finally:
        engine.dispose()
    if lock is None:
        typer.echo("no cost lock was set")
    else:
        typer.echo(f"cost lock lifted (set for: {lock.get('reason', '?')})")


# -- entry point ------------------------------------------------------------------------------


def _known_variables() -> set[str]:
    """Every HYPERMEDIA_* variable something reads: settings fields and CLI options."""
    from hypermedia.config import Settings

    known = {f"HYPERMEDIA_{name.upper()}" for name in Settings.model_fields}
    known.add("HYPERMEDIA_CONFIG")
    stack: list[Any] = [typer.main.get_command(app)]  # click commands (typer's own click)
    while stack:
        command = stack.pop()
        for param in command.params:
            envvar = getattr(param, "envvar", None)
            if isinstance(envvar, str):
                known.add(envvar)
            elif envvar:
                known.update(envvar)
        stack.extend(getattr(command, "commands", {}).values())
    return known


def check_environment(environ: dict[str, str] | None = None) -> None:
    """Refuse a misspelt ``HYPERMEDIA_*`` variable instead of silently ignoring it."""
    import difflib
    import os

    environ = dict(os.environ) if environ is None else environ
    known = _known_variables()
    for name in sorted(environ):
        if not name.startswith("HYPERMEDIA_") or name.startswith("HYPERMEDIA_TEST_"):
            continue
        if name in known or name.startswith("HYPERMEDIA_QUEUES__"):
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise ConfigError(name, f"unknown setting{hint}")


def main() -> None:
    try:
        check_environment()
        app()
    except HypermediaError as exc:
        log.debug("command failed", exc_info=True)
        _fail(f"{exc.code}: {exc.message}")
    except TimeoutError as exc:
        _fail(f"timeout: {exc}")
    except KeyboardInterrupt:
        _fail("interrupted", code=130)
    except Exception as exc:
        log.debug("unexpected error", exc_info=True)
        _fail(f"internal: {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main()
