"""``hypermedia run``: files processed end to end on this machine by a local stack
started for them and stopped after, with progress per queue and a summary table."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from hypermedia.cli.common import fail, plain, read_settings

if TYPE_CHECKING:
    from rich.text import Text


def _progress_say(console: Any) -> Any:
    return lambda message: console.print(f"[dim]{message}[/]")


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
    queue; writes outputs under --out; prints what was done and what failed. A run
    with failed jobs keeps its workers' logs under the data dir's logs/ and says where.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    import pipelines.registry
    from hypermedia.accounts import Caller
    from hypermedia.errors import HypermediaError
    from hypermedia.local import LocalStack, implemented_queues
    from hypermedia.runlogs import run_logs_dir
    from hypermedia.runner import (
        RunReport,
        cancel_jobs,
        check_disk,
        check_operations,
        check_out_dir,
        forget_objects,
        local_operator,
        named_files,
        operations_for,
        paused_workers,
        submit_files,
        unfinished_jobs,
        wait_until_finished,
        write_outputs,
    )

    console = Console(stderr=True)
    settings = read_settings()
    names = named_files(paths)
    files = list(names)
    implemented = pipelines.registry.operations()
    if operations:
        check_operations(operations, implemented)
    check_out_dir(out)
    check_disk(settings.data_dir, settings.worker_min_free_disk_mb)
    console.print(f"[bold]hypermedia run[/]: {len(files)} files")
    # Actors for the queues these files need only (each one is a fork server with
    # every pipeline loaded): thumbnails alone start one, not one per queue.
    needed = sorted({op for path in files for op in operations_for(path, operations, implemented)})
    pools = implemented_queues(settings, needed) or None
    local = LocalStack(settings)
    interrupted = False
    report = RunReport()
    caller: Caller | None = None
    began = time.monotonic()
    unwritten: list[str] = []
    # Where the workers' logs are kept when the run went wrong (its Ray session, with
    # the jobs' worker-side tracebacks, goes with the stack); None: not kept.
    keep_logs: Path | None = None
    try:
        operator: list[tuple[Caller, str]] = []

        def cancel_leftovers(stack: Any) -> None:
            # Jobs an earlier run submitted and never saw end (it was killed: nothing
            # cancelled them) would run here, for outputs nobody writes out. Cancelled
            # before any actor could claim one.
            operator.append(local_operator(stack))
            left, stopping = cancel_jobs(
                stack, operator[0][0], unfinished_jobs(stack, operator[0][0])
            )
            if left or stopping:
                running = (
                    f"; {stopping} it left running end cancelled once their lease runs out"
                    if stopping
                    else ""
                )
                console.print(
                    "[yellow]an earlier run was killed or timed out before its jobs ended:"
                    f" cancelled {left} of them{running}[/]"
                )

        # A batch that ends when it is done: nobody opens a dashboard for it, asks `ray
        # status` or scrapes its Ray metrics (it links no ray.json for Prometheus).
        local.start(
            pools=pools,
            progress=_progress_say(console),
            dashboard=False,
            status=False,
            metrics=False,
            before_workers=cancel_leftovers,
        )
        _stop_on_sigterm()
        assert local.stack is not None
        caller, key = operator[0]
        console.print(f"[dim]submitting {len(files)} files[/]")
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

            began = time.monotonic()
            submit_files(
                local.api_url,
                key,
                files,
                operations,
                implemented,
                priority,
                on_file=advance,
                report=report,
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
            # A worker that claims nothing (its disk ran low meanwhile, an outage) is
            # said once, and again if that changes: the bars would only stop.
            paused: dict[str, Any] = {"said": [], "at": 0.0}

            def say_paused() -> None:
                if time.monotonic() - paused["at"] < 2.0:
                    return
                paused["at"] = time.monotonic()
                assert local.stack is not None
                now = paused_workers(local.stack)
                if now != paused["said"]:
                    for pause in now:
                        progress.console.print(plain(pause.notice, style="yellow"))
                    if paused["said"] and not now:
                        progress.console.print("[green]the workers claim jobs again[/]")
                    paused["said"] = now

            def show(rep: Any) -> None:
                say_paused()
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
            took = time.monotonic() - began
        unwritten = write_outputs(local.stack, report, out, names)
        forget_objects(local.api_url, key, report)  # written out: the data dir keeps none
        if report.counts().get("failed") or not finished:
            keep_logs = run_logs_dir(settings.data_dir)
        _run_summary(console, report, names, out, finished, took, keep_logs)
    except KeyboardInterrupt:
        interrupted = True  # said once the stack has stopped (typer would exit silently)
        if caller is not None and local.stack is not None:
            # A second Ctrl-C (or SIGTERM) skips this and stops at once.
            with contextlib.suppress(KeyboardInterrupt):
                if report.counts().get("failed"):
                    keep_logs = run_logs_dir(settings.data_dir)
                unwritten = _wind_down(
                    console, local.stack, caller, report, names, out, len(files), began, keep_logs
                )
                forget_objects(local.api_url, key, report)
    except Exception:
        keep_logs = run_logs_dir(settings.data_dir)  # what the workers said of it, kept
        console.print(f"[red]the run failed; the workers' logs are kept in {keep_logs}/[/]")
        raise
    finally:
        console.print("[dim]stopping what was started[/]")
        local.stop(progress=_progress_say(console), keep_logs=keep_logs)
    if interrupted:
        fail("interrupted", code=130)
    if unwritten:
        more = f" and {len(unwritten) - 1} more" if len(unwritten) > 1 else ""
        raise HypermediaError(f"outputs not written under {out}: {unwritten[0]}{more}")
    counts = report.counts()
    if not finished or counts.get("failed") or report.skipped:
        raise SystemExit(1)


# How long an interrupted run waits for the jobs it cancelled while they ran: a worker
# kills a cancelled job's step within seconds (it polls every 2 s).
WIND_DOWN_SECONDS = 30.0


def _wind_down(
    console: Any,
    stack: Any,
    caller: Any,
    report: Any,
    names: dict[Path, Path],
    out: Path,
    file_count: int,
    began: float,
    logs: Path | None = None,
) -> list[str]:
    """An interrupted run: its jobs that have not ended are cancelled (else they would
    run in the next stack of the data dir, for nobody), the outputs of those that did are
    written, the summary says which is which. Answers the outputs not written."""
    from hypermedia.runner import (
        cancel_jobs,
        unfinished_jobs,
        wait_until_finished,
        write_outputs,
    )

    console.print("[yellow]interrupted: cancelling the jobs that have not ended[/]")
    # Every unfinished job of the embedded operator is this run's (one stack per data
    # dir, and it cancelled an earlier run's as it started): also one whose submit the
    # interrupt cut off after the API had created it.
    cancel_jobs(stack, caller, unfinished_jobs(stack, caller))
    finished = wait_until_finished(stack, report, lambda _report: None, WIND_DOWN_SECONDS)
    unwritten = write_outputs(stack, report, out, names)
    _run_summary(console, report, names, out, finished, time.monotonic() - began, logs)
    submitted = {s.path for s in report.submitted} | {path for path, _ in report.skipped}
    counts = report.counts()
    console.print(
        f"[yellow]interrupted[/]: {counts['completed']} jobs done (outputs in {out}/),"
        f" {counts['cancelled']} cancelled, {file_count - len(submitted)} of {file_count}"
        " files not submitted; a new run processes every file it is given again"
    )
    for failure in unwritten:
        console.print(not_written(failure))
    return unwritten


def not_written(failure: str) -> Text:
    """The line of an output ``write_outputs`` could not write: ``failure`` names its
    file (a name as the user's disk has it) and why, shown as plain text."""
    from rich.text import Text

    return Text.assemble(("output not written", "red"), ": ", plain(failure))


def _stop_on_sigterm() -> None:
    """SIGTERM ends ``run`` like Ctrl-C does, through its ``finally`` that stops the
    stack (installed after ``ray.init``, whose own handler would exit at once)."""
    import signal

    def interrupt(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


def _run_summary(
    console: Any,
    report: Any,
    names: dict[Path, Path],
    out: Path,
    finished: bool,
    took: float,
    logs: Path | None = None,
) -> None:
    """``logs``: where the workers' logs of a run with failures are kept (said with the
    counts). The files' names and the jobs' errors are plain text (:func:`plain`)."""
    from rich.table import Table

    from hypermedia.runner import FINISHED

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
        name = str(names.get(item.path, item.path.name))
        table.add_row(plain(name), plain(item.operation), shown, plain(detail))
    for path, reason in report.skipped:
        name = str(names.get(path, path.name))
        table.add_row(plain(name), "-", "[yellow]skipped[/]", plain(reason))
    console.print(table)
    counts = report.counts()
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    skipped = f"; {_counted(len(report.skipped), 'file')} skipped" if report.skipped else ""
    kept = f"; the workers' logs of this run are in {logs}/" if logs is not None else ""
    console.print(
        f"[bold]{_counted(len(report.submitted), 'job')}[/]: {summary or 'none'}{skipped}. "
        f"Outputs in {out}/{kept}"
    )
    if report.submitted:
        ended = sum(counts[status] for status in FINISHED)
        console.print(
            f"{_counted(ended, 'job')} ended {took:.1f} s after the first upload "
            f"({ended / max(took, 1e-3):.1f} jobs/s, uploads included)"
        )
    if not finished:
        console.print(
            "[red]timed out waiting for the jobs; they stay recorded and queued until the"
            " next run of this data dir cancels them[/]"
        )


def _counted(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
