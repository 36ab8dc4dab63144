"""``hypermedia bulk``: regeneration, backfill and migration runs, on the server (the
record and Redis of the settings; the head's bulk thread does the work).

``regenerate`` / ``backfill`` / ``migrate`` create a run (``--dry-run``: count it,
estimate its CPU time and, through the scheduler simulator under scheduler.json, its
cloud cost and duration; a migration's, the objects to copy and their bytes; nothing is
written); ``status`` shows one run or the latest;
``pause``, ``resume``, ``cancel`` change one.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from hypermedia.cli.common import fail, note, read_settings, require_database, say

if TYPE_CHECKING:
    from hypermedia.bulk.runs import MigrateTarget, RunView
    from hypermedia.bulk.service import BulkService, Estimate

app = typer.Typer(
    help="Bulk runs: regenerate, backfill, migrate existing objects (on the server).",
    no_args_is_help=True,
)

Pool = Annotated[
    str | None, typer.Option("--pool", envvar="HYPERMEDIA_BULK_POOL", help="Only this pool.")
]
Owner = Annotated[
    str | None,
    typer.Option("--owner", envvar="HYPERMEDIA_BULK_OWNER", help="Only this owner (user id)."),
]
DetectedKind = Annotated[
    str | None,
    typer.Option(
        "--kind",
        envvar="HYPERMEDIA_BULK_KIND",
        help="Only objects of this detected kind (image, pdf, video ...).",
    ),
]
After = Annotated[
    datetime | None,
    typer.Option(
        "--created-after",
        envvar="HYPERMEDIA_BULK_CREATED_AFTER",
        help="Only objects created at or after: YYYY-MM-DD or YYYY-MM-DDTHH:MM:SS, UTC.",
        formats=["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S"],
        metavar="<date>",  # typer shows the formats, 28 characters (the help says them)
    ),
]
Before = Annotated[
    datetime | None,
    typer.Option(
        "--created-before",
        envvar="HYPERMEDIA_BULK_CREATED_BEFORE",
        help="Only objects created before: YYYY-MM-DD or YYYY-MM-DDTHH:MM:SS, UTC.",
        formats=["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S"],
        metavar="<date>",  # typer shows the formats, 28 characters (the help says them)
    ),
]
Priority = Annotated[
    int | None,
    typer.Option(
        "--priority",
        envvar="HYPERMEDIA_BULK_PRIORITY",
        min=7,
        max=10,
        help="7-10 (default: 8 on the bulk queue, 10 on the operation's own).",
        show_default=False,
    ),
]
Queue = Annotated[
    str | None,
    typer.Option(
        "--queue",
        envvar="HYPERMEDIA_BULK_QUEUE",
        help="bulk, or the operation's own queue at a bulk priority (default: bulk when"
        " scheduler.json gives it workers, a VPS baseline or the cloud, or a live worker"
        " serves it; else the operation's own queue at priority 10, the lowest). A queue"
        " no worker serves is refused.",
        show_default=False,
    ),
]
MaxInFlight = Annotated[
    int,
    typer.Option(
        "--max-in-flight",
        envvar="HYPERMEDIA_BULK_MAX_IN_FLIGHT",
        min=1,
        help="At most this many of the run's jobs queued or running at a time.",
    ),
]
BatchSize = Annotated[
    int,
    typer.Option(
        "--batch-size", envvar="HYPERMEDIA_BULK_BATCH_SIZE", min=1, max=10000, help="Page size."
    ),
]
Account = Annotated[
    str | None,
    typer.Option(
        "--account",
        envvar="HYPERMEDIA_BULK_ACCOUNT",
        help="A user (name or id) whose credits pay; default: the platform pays.",
        show_default=False,
    ),
]
DryRun = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        envvar="HYPERMEDIA_BULK_DRY_RUN",
        help="Count and estimate (CPU, cloud cost, duration); create nothing.",
    ),
]
MigrateDryRun = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        envvar="HYPERMEDIA_BULK_DRY_RUN",
        help="Count the objects the filter matches that are not at the bucket yet, and their"
        " size; copy nothing, create no run.",
    ),
]
SchedulerConfig = Annotated[
    Path | None,
    typer.Option(
        "--scheduler-config",
        envvar="HYPERMEDIA_SCHEDULER_CONFIG",
        help="scheduler.json for --dry-run's simulation (default: the server's).",
        show_default=False,
    ),
]
Json = Annotated[bool, typer.Option("--json", envvar="HYPERMEDIA_BULK_JSON", help="JSON out.")]
IdempotencyKey = Annotated[
    str | None,
    typer.Option(
        "--idempotency-key",
        envvar="HYPERMEDIA_BULK_IDEMPOTENCY_KEY",
        help="The same command again with this key (its answer lost) shows the run it"
        " created and starts none; another command under the key is refused.",
        show_default=False,
    ),
]
RunId = Annotated[str, typer.Argument(help="The run's id.")]


def _filter(
    pool: str | None,
    owner: str | None,
    kind: str | None,
    after: datetime | None,
    before: datetime | None,
    all_versions: bool = False,
) -> dict[str, Any]:
    from datetime import UTC

    def aware(value: datetime | None) -> datetime | None:
        return None if value is None else value.replace(tzinfo=value.tzinfo or UTC)

    return {
        "pool_id": pool,
        "owner_id": owner,
        "detected_kind": kind,
        "created_after": aware(after),
        "created_before": aware(before),
        "all_versions": all_versions,
    }


def _service(scheduler: Path | bool | None = False) -> tuple[BulkService, Any]:
    """The service on the server's record and Redis. ``scheduler``: the scheduler.json
    (None: the default one) whose queues with a worker, and those a live worker serves,
    are where a run may go (the rule the head's ingest applies,
    :func:`autoscaler.head.staffed_queues`); False: no run is placed (status, pause ...)."""
    settings = read_settings()
    require_database(settings)  # else the open below would create it, empty
    from hypermedia.bulk.service import BulkService
    from hypermedia.stack import Stack

    stack = Stack.open(settings, with_storage=False)
    served = None
    if scheduler is not False:
        from autoscaler import config as scheduler_config
        from autoscaler.head import staffed_queues

        path = scheduler if isinstance(scheduler, Path) else None
        config = scheduler_config.load(path, stack.settings.queue_names)
        served = staffed_queues(config, stack.engine)
    service = BulkService(
        stack.engine, stack.queue, stack.catalog, clock=stack.clock, served_queues=served
    )
    return service, stack


# The option that sets each field of a RunSpec (what a refusal names).
OPTIONS = {
    "operation": "OPERATION",
    "filter.pool_id": "--pool",
    "filter.owner_id": "--owner",
    "filter.detected_kind": "--kind",
    "filter.created_after": "--created-after",
    "filter.created_before": "--created-before",
    "target.bucket": "--to-bucket",
    "target.endpoint_url": "--to-endpoint-url",
    "target.region": "--to-region",
    "target.prefix": "--to-prefix",
    "priority": "--priority",
    "queue": "--queue",
    "max_in_flight": "--max-in-flight",
    "batch_size": "--batch-size",
    "account": "--account",
}


def _validated(model: Any, fields: dict[str, Any]) -> Any:
    """``model`` from the options' values; a value the spec refuses (a bound typer's own
    range does not hold) is refused as typer refuses one, naming the option."""
    from pydantic import ValidationError

    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        path = ".".join(str(part) for part in first["loc"])
        raise typer.BadParameter(
            first["msg"], param_hint=f"'{OPTIONS.get(path, path or 'options')}'"
        ) from None


def _start(
    spec_fields: dict[str, Any],
    dry_run: bool,
    config: Path | None,
    as_json: bool,
    idempotency_key: str | None = None,
) -> None:
    from hypermedia.bulk.runs import BULK_QUEUE, RunSpec
    from hypermedia.ingest.fields import idempotency_key_problem

    spec = _validated(RunSpec, spec_fields)
    if idempotency_key is not None and (problem := idempotency_key_problem(idempotency_key)):
        raise typer.BadParameter(problem, param_hint="'--idempotency-key'")
    service, stack = _service(False if spec.kind == "migrate" else config)
    try:
        if dry_run:
            estimate = service.estimate(spec)
            if spec.queue is None and estimate.queue not in (None, BULK_QUEUE) and not as_json:
                note(_own_queue_note(estimate.queue, estimate.priority))
            simulated = simulate(estimate, config) if estimate.cpu_seconds is not None else None
            _print_estimate(estimate, simulated, as_json, spec.target)
            return
        import getpass

        view = service.create(spec, f"cli:{getpass.getuser()}", idempotency_key)
    finally:
        stack.close()
    if spec.queue is None and view.queue not in (None, BULK_QUEUE) and not as_json:
        note(_own_queue_note(view.queue, view.priority))
    _print_run(view, as_json)
    if not as_json:
        note("the head's bulk thread creates its jobs; follow it with `hypermedia bulk status`")


def _own_queue_note(queue: str | None, priority: int) -> str:
    return (
        f"no worker serves the bulk queue (scheduler.json gives it none, no live worker has"
        f" it): the run goes on the operation's own queue {queue!r} at priority {priority}"
    )


@app.command("regenerate")
def regenerate(
    operation: Annotated[str, typer.Argument(help="The operation whose outputs to remake.")],
    all_versions: Annotated[
        bool,
        typer.Option(
            "--all",
            envvar="HYPERMEDIA_BULK_ALL",
            help="Every output of the operation, the current version's too.",
        ),
    ] = False,
    pool: Pool = None,
    owner: Owner = None,
    kind: DetectedKind = None,
    created_after: After = None,
    created_before: Before = None,
    priority: Priority = None,
    queue: Queue = None,
    max_in_flight: MaxInFlight = 200,
    batch_size: BatchSize = 500,
    account: Account = None,
    dry_run: DryRun = False,
    scheduler_config: SchedulerConfig = None,
    as_json: Json = False,
    idempotency_key: IdempotencyKey = None,
) -> None:
    """Remake every output of OPERATION below its current profile version (or all)."""
    _start(
        {
            "kind": "regenerate",
            "operation": operation,
            "filter": _filter(pool, owner, kind, created_after, created_before, all_versions),
            "priority": priority,
            "queue": queue,
            "max_in_flight": max_in_flight,
            "batch_size": batch_size,
            "account": account,
        },
        dry_run,
        scheduler_config,
        as_json,
        idempotency_key,
    )


@app.command("backfill")
def backfill(
    operation: Annotated[str, typer.Argument(help="The operation to run.")],
    pool: Pool = None,
    owner: Owner = None,
    kind: DetectedKind = None,
    created_after: After = None,
    created_before: Before = None,
    priority: Priority = None,
    queue: Queue = None,
    max_in_flight: MaxInFlight = 200,
    batch_size: BatchSize = 500,
    account: Account = None,
    dry_run: DryRun = False,
    scheduler_config: SchedulerConfig = None,
    as_json: Json = False,
    idempotency_key: IdempotencyKey = None,
) -> None:
    """Run OPERATION on every matching upload that lacks its output at the current version."""
    _start(
        {
            "kind": "backfill",
            "operation": operation,
            "filter": _filter(pool, owner, kind, created_after, created_before),
            "priority": priority,
            "queue": queue,
            "max_in_flight": max_in_flight,
            "batch_size": batch_size,
            "account": account,
        },
        dry_run,
        scheduler_config,
        as_json,
        idempotency_key,
    )


@app.command("migrate")
def migrate(
    bucket: Annotated[
        str, typer.Option("--to-bucket", envvar="HYPERMEDIA_BULK_TO_BUCKET", help="S3 bucket.")
    ],
    endpoint_url: Annotated[
        str | None,
        typer.Option("--to-endpoint-url", envvar="HYPERMEDIA_BULK_TO_ENDPOINT_URL"),
    ] = None,
    region: Annotated[
        str | None, typer.Option("--to-region", envvar="HYPERMEDIA_BULK_TO_REGION")
    ] = None,
    prefix: Annotated[str, typer.Option("--to-prefix", envvar="HYPERMEDIA_BULK_TO_PREFIX")] = "",
    pool: Pool = None,
    owner: Owner = None,
    kind: DetectedKind = None,
    created_after: After = None,
    created_before: Before = None,
    batch_size: BatchSize = 100,
    dry_run: MigrateDryRun = False,
    as_json: Json = False,
    idempotency_key: IdempotencyKey = None,
) -> None:
    """Copy objects and outputs from this server's storage to an S3 bucket (the head's
    AWS credentials), each verified by SHA-256 before its record is switched."""
    _start(
        {
            "kind": "migrate",
            "filter": _filter(pool, owner, kind, created_after, created_before),
            "target": {
                "bucket": bucket,
                "endpoint_url": endpoint_url,
                "region": region,
                "prefix": prefix,
            },
            "batch_size": batch_size,
        },
        dry_run,
        None,
        as_json,
        idempotency_key,
    )


@app.command("status")
def status(
    run_id: Annotated[str | None, typer.Argument(help="A run (default: the latest runs).")] = None,
    limit: Annotated[
        int,
        typer.Option(
            "--limit",
            envvar="HYPERMEDIA_BULK_LIMIT",
            min=1,
            max=200,
            help="Without RUN_ID: at most this many runs, newest first.",
        ),
    ] = 20,
    cursor: Annotated[
        str | None,
        typer.Option(
            "--cursor",
            envvar="HYPERMEDIA_BULK_CURSOR",
            help="Without RUN_ID: the runs older than this one (the cursor a page ends with).",
            show_default=False,
        ),
    ] = None,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            envvar="HYPERMEDIA_BULK_FOLLOW",
            help="Follow RUN_ID until it completes, is cancelled or pauses: a progress bar"
            " (with --json: one JSON line each --interval). Exits 1 unless it completed.",
        ),
    ] = False,
    interval: Annotated[
        float,
        typer.Option(
            "--interval",
            envvar="HYPERMEDIA_BULK_INTERVAL",
            min=0.05,
            max=3600,
            help="--follow: seconds between two reads of the run.",
        ),
    ] = 2.0,
    as_json: Json = False,
) -> None:
    """A run's progress: state, total, done, failed, remaining, percent and ETA, counts,
    its jobs by status; without RUN_ID, the runs a page at a time (the next page's
    --cursor is said on stderr)."""
    from hypermedia.ingest.fields import ID_PATTERN

    if cursor is not None and not re.fullmatch(ID_PATTERN, cursor):
        raise typer.BadParameter("not a run id", param_hint="'--cursor'")
    if follow and not run_id:
        raise typer.BadParameter("follows one run: name its RUN_ID", param_hint="'--follow'")
    service, stack = _service()
    if follow:
        assert run_id is not None
        try:
            _follow(service, run_id, interval, as_json)
        finally:
            stack.close()
        return
    next_cursor = None
    try:
        if run_id:
            views = [service.get(run_id)]
        else:
            page = service.list(limit, cursor)
            views, next_cursor = page.runs, page.next_cursor
    finally:
        stack.close()
    if as_json:
        say(json.dumps([v.to_json() for v in views], indent=2))
    else:
        if not views:
            say("no bulk runs" if cursor is None else "no older bulk runs")
        for view in views:
            _print_run(view, False)
    if next_cursor is not None:
        note(f"older runs: hypermedia bulk status --cursor {next_cursor}")


def _follow(service: BulkService, run_id: str, interval: float, as_json: bool) -> None:
    """Read the run every ``interval`` seconds until it completes, is cancelled (its
    jobs stopped) or pauses; a bar of its progress, or a JSON line a read."""
    import time

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from hypermedia.bulk.runs import RunState

    bars = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>5.1f}%"),
        MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"),
        console=Console(),
        disable=as_json,
    )
    task = bars.add_task(run_id[:12], total=None, detail="")
    with bars:
        while True:
            view = service.get(run_id)
            if as_json:
                say(json.dumps(view.to_json()))
            shown = view.progress
            bars.update(
                task,
                total=shown.total,
                completed=shown.done + shown.failed,
                detail=_progress_detail(view),
            )
            ended = view.state == RunState.COMPLETED or (
                view.state == RunState.CANCELLED and not view.stopping
            )
            if ended or view.state == RunState.PAUSED:
                break
            time.sleep(interval)
    if not as_json:
        _print_run(view, False)
    if view.state != RunState.COMPLETED:
        fail(f"run {run_id} is {view.shown_state}" + (f": {view.reason}" if view.reason else ""))


def _progress_detail(view: RunView) -> str:
    """The run's state, failures, rate and ETA beside its bar (and its status line)."""
    from hypermedia.clock import age_text

    shown = view.progress
    parts = [view.shown_state]
    if shown.failed:
        parts.append(f"{shown.failed:,} failed")
    if shown.in_flight:
        parts.append(f"{shown.in_flight:,} in flight")
    if shown.jobs_per_second is not None:
        parts.append(f"{shown.jobs_per_second:.2f} jobs/s")
    if shown.eta_seconds is not None:
        parts.append(f"ETA {age_text(shown.eta_seconds)}")
    return ", ".join(parts)


def _act(run_id: str, action: str, as_json: bool) -> None:
    service, stack = _service()
    try:
        view = service.act(run_id, action)
    finally:
        stack.close()
    _print_run(view, as_json)


@app.command("pause")
def pause(run_id: RunId, as_json: Json = False) -> None:
    """Stop creating jobs (those in flight finish)."""
    _act(run_id, "pause", as_json)


@app.command("resume")
def resume(run_id: RunId, as_json: Json = False) -> None:
    """Go on from the run's cursor."""
    _act(run_id, "resume", as_json)


@app.command("cancel")
def cancel(run_id: RunId, as_json: Json = False) -> None:
    """Stop for good: its queued jobs are cancelled, its running ones asked to stop."""
    _act(run_id, "cancel", as_json)


@app.command("throttle")
def throttle(run_id: RunId, max_in_flight: MaxInFlight, as_json: Json = False) -> None:
    """Change a running (or paused) run's --max-in-flight: a lower one creates no job
    until fewer are live; those live finish."""
    from hypermedia.bulk.runs import RunChange

    _validated(RunChange, {"max_in_flight": max_in_flight})
    service, stack = _service()
    try:
        view = service.throttle(run_id, max_in_flight)
    finally:
        stack.close()
    _print_run(view, as_json)


# -- output ----------------------------------------------------------------------------


def _print_run(view: RunView, as_json: bool) -> None:
    if as_json:
        say(json.dumps(view.to_json(), indent=2))
        return
    what = view.operation or (view.target or {}).get("bucket", "")
    live = sum(view.jobs.get(s, 0) for s in ("queued", "claimed", "processing", "retry_wait"))
    # The reason's own lines go deeper than the lines below: none passes for one of them.
    reason = f" ({view.reason})".replace("\n", "\n    ") if view.reason else ""
    say(f"{view.run_id}  {view.kind} {what}  {view.shown_state}{reason}")
    shown = view.progress
    if shown.total is None:
        say(
            f"  progress: {shown.done:,} done, {shown.failed:,} failed (no total until its"
            " scan ends: the run is from before totals were counted, or its selection was"
            " too big to count at its create)"
        )
    else:
        say(
            f"  progress {shown.percent:.1f}%: {shown.done + shown.failed:,} of"
            f" {shown.total:,} objects ({shown.done:,} done, {shown.failed:,} failed,"
            f" {shown.remaining:,} remaining)"
            + (
                ""
                if shown.jobs_per_second is None and shown.eta_seconds is None
                else "; " + _rate_text(shown.jobs_per_second, shown.eta_seconds)
            )
        )
    say(
        f"  scanned {view.scanned}, jobs created {view.created_jobs}, skipped {view.skipped},"
        f" unfit {view.unfit}, migrated {view.migrated}, failed {view.failed}"
    )
    if view.kind != "migrate":
        jobs = ", ".join(f"{k} {v}" for k, v in sorted(view.jobs.items())) or "none"
        say(
            f"  queue {view.queue} priority {view.priority}, in flight {live}/"
            f"{view.max_in_flight}; jobs: {jobs}; cursor {view.cursor or '-'}"
        )


def _rate_text(rate: float | None, eta: float | None) -> str:
    from hypermedia.clock import age_text

    parts = [] if rate is None else [f"{rate:.2f} jobs/s"]
    if eta is not None:
        parts.append(f"ETA {age_text(eta)}")
    return ", ".join(parts)


def simulate(estimate: Estimate, config_path: Path | None) -> dict[str, Any] | None:
    """The run's jobs arriving at once on its queue, through the scheduler simulator
    under scheduler.json: cloud cost, duration, jobs left unfinished."""
    from autoscaler import config as scheduler_config
    from autoscaler.sim_world import Arrival
    from autoscaler.simulate import simulate as run_simulation

    if estimate.mean_job_seconds is None or estimate.queue is None or not estimate.objects:
        return None
    config = scheduler_config.load(config_path)
    if estimate.queue not in config.queues:
        return {"note": f"scheduler.json has no {estimate.queue!r} queue"}
    arrivals = [
        Arrival(
            0.0,
            estimate.queue,
            estimate.priority,
            max(0.001, estimate.mean_job_seconds),
            estimate.objects,
        )
    ]
    report = run_simulation(config, arrivals, tail_seconds=7 * 24 * 3600.0)
    return {
        "mode": config.mode,
        "cloud_cost_cents": round(report.cloud_cost_cents, 2),
        "duration_seconds": round(report.duration_seconds, 1),
        "unfinished": report.unfinished,
        "launches": report.launches,
        "peak_cloud_workers": report.peak_cloud(),
    }


def _print_estimate(
    estimate: Estimate,
    simulated: dict[str, Any] | None,
    as_json: bool,
    target: MigrateTarget | None = None,
) -> None:
    from dataclasses import asdict

    if as_json:
        say(json.dumps({**asdict(estimate), "simulation": simulated}, indent=2))
        return
    if target is not None:  # a migration: no job, so no CPU time, simulation or unfit
        say(
            f"migrate to {target.name}: {estimate.objects} objects to copy"
            f" ({estimate.bytes / 1e6:.1f} MB); those already there are not counted"
        )
        return
    say(
        f"{estimate.kind} {estimate.operation}: {estimate.objects} jobs to create"
        f" ({estimate.bytes / 1e6:.1f} MB), {estimate.skipped} skipped (done),"
        f" {estimate.unfit} unfit"
    )
    if estimate.cpu_seconds is None:
        say("estimated CPU time: unknown (no completed attempt of the operation yet)")
        return
    say(
        f"estimated CPU time: {estimate.cpu_seconds / 3600:.2f} h"
        f" ({estimate.mean_job_seconds:.3f} s a job over {estimate.history_attempts} attempts)"
    )
    if simulated is None:
        return
    if "note" in simulated:
        say(f"simulation: {simulated['note']}")
        return
    say(
        f"simulated under scheduler.json ({simulated['mode']}): cloud cost"
        f" ${simulated['cloud_cost_cents'] / 100:.2f}, duration"
        f" {simulated['duration_seconds'] / 3600:.2f} h, peak cloud workers"
        f" {simulated['peak_cloud_workers']}, unfinished {simulated['unfinished']}"
    )
    if simulated["unfinished"]:
        say(
            f"  warning: {simulated['unfinished']} jobs never ran in the simulation: the"
            f" {estimate.queue!r} queue has no worker in this mode (--queue the operation's"
            " own queue runs them on the VPS at the bulk priority)"
        )
