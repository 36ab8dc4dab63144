"""The API's client commands: ``submit``, ``status JOB_ID`` (:func:`show_job`, called by
:mod:`hypermedia.cli.status`), ``watch``, ``cancel`` and ``queues``, over
HTTP with ``--api-url`` / ``HYPERMEDIA_API_URL`` and ``--api-key`` /
``HYPERMEDIA_API_KEY``. Registered on the root app by :mod:`hypermedia.cli`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from hypermedia.cli.common import (
    ApiKey,
    ApiUrl,
    Timeout,
    fail,
    open_client,
    plain,
    printable,
    say,
)
from hypermedia.clock import age_text
from hypermedia.errors import (
    AuthenticationFailed,
    CallbackNotAllowed,
    Forbidden,
    HypermediaError,
    InvalidParams,
    ServiceUnavailable,
    UnknownOperation,
)

if TYPE_CHECKING:
    from datetime import datetime

    from hypermedia.ingest.schemas import JobEvent, JobResponse


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
    """Upload files and submit operations on each; prints one line per job as it is
    submitted. A file refused (its upload or its submit) is named on stderr with the
    error's code and message and the others are still tried; exits 1 at the end if any
    was. A refusal of the key or the request (a priority the key may not use, an unknown
    operation ...) holds for every file: the files after it are not uploaded."""
    job_ids: list[str] = []
    refused = 0
    every_file: HypermediaError | None = None  # a refusal no other file escapes
    with open_client(api_url, api_key, timeout) as client:
        for path in files:
            if every_file is not None:
                say(f"not submitted {path}: {_error_text(every_file)} (not uploaded)", err=True)
                refused += 1
                continue
            try:
                obj = client.upload(path, pool_id=pool)
                say(f"object {obj.object_id} {path} {obj.size_bytes} bytes")
                result = client.process(obj.object_id, op, priority=priority)
            except HypermediaError as exc:
                say(f"not submitted {path}: {_error_text(exc)}", err=True)
                refused += 1
                if isinstance(exc, _EVERY_FILE):
                    every_file = exc
                continue
            for job in result.jobs:
                line = (
                    f"job {job.job_id} {job.operation} queue={job.queue} "
                    f"priority={job.priority} estimated_credits={job.estimated_credits:g}"
                )
                reserved = job.reserved_credits
                if reserved is not None and reserved != job.estimated_credits:
                    # Held until it ends: the most its units of work may add (ocr).
                    line += f" reserved_credits={reserved:g}"
                say(line)
                job_ids.append(job.job_id)
        unfinished = 0
        if wait:
            deadline = time.monotonic() + wait_timeout
            for job_id in job_ids:
                finished = client.wait(job_id, timeout=max(0.0, deadline - time.monotonic()))
                say(_job_line(finished))
                unfinished += finished.status != "completed"
    problems = []
    if refused:
        problems.append(f"{refused} of {len(files)} files not submitted")
    if unfinished:
        problems.append(f"{unfinished} of {len(job_ids)} jobs did not complete")
    if problems:
        fail("; ".join(problems))


def _error_text(exc: HypermediaError) -> str:
    """``code: message``, the message's own lines indented; with the idempotency key a
    submit whose answer was lost carries (submit again with it to learn what became of
    it)."""
    text = f"{exc.code}: " + exc.message.replace("\n", "\n  ")
    key = exc.details.get("idempotency_key")
    return text if key is None else f"{text} (idempotency key {key})"


# Refusals no file escapes: the key's (its priority range, a pool it may not use), the
# request's (its operations, their params), or the API out of reach after the client's
# own retries.
_EVERY_FILE = (
    AuthenticationFailed,
    Forbidden,
    UnknownOperation,
    InvalidParams,
    CallbackNotAllowed,
    ServiceUnavailable,
)


def _job_line(job: JobResponse) -> str:
    line = f"job {job.job_id} {job.status}"
    if job.error_code:
        # Its message's own lines indented: none passes for another job's line.
        message = (job.error_message or "").replace("\n", "\n  ")
        line += f" {job.error_code}: {message}"
    return line


LOG_LINES = 20  # of a failed attempt's child log, shown by `status JOB_ID`


def show_job(job_id: str, api_url: str | None, api_key: str | None, timeout: float) -> None:
    """Show a job: status, attempts, credits, outputs (``hypermedia status JOB_ID``), and
    the last lines its child printed on its last failed attempt."""
    with open_client(api_url, api_key, timeout) as client:
        job = client.job(job_id)
        logged = [a for a in job.attempts if a.has_log]
        last_log = client.attempt_log(job_id, logged[-1].attempt_number) if logged else None

    def at(moment: datetime | None) -> str:
        return "-" if moment is None else moment.isoformat(timespec="seconds")

    charged = "-" if job.actual_credits is None else f"{job.actual_credits:g}"
    reserved = job.reserved_credits
    held = "" if reserved in (None, job.estimated_credits) else f", reserved {reserved:g}"
    rows = [
        ("job", job.job_id),
        ("status", job.status + (" (cancel requested)" if job.cancel_requested else "")),
        ("operation", f"{job.operation} (queue {job.queue}, priority {job.priority})"),
        ("object", job.object_id),
        ("attempts", f"{job.attempt_count} of {job.max_attempts}"),
        ("time limit", "-" if job.timeout_seconds is None else f"{job.timeout_seconds:,} s"),
        ("credits", f"estimated {job.estimated_credits:g}{held}, charged {charged}"),
        ("created", at(job.created_at)),
        ("queued", at(job.queued_at)),
        ("started", at(job.started_at)),
        # The API's completed_at is when the job ended, however it did.
        (job.status if job.finished else "ended", at(job.completed_at)),
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
    if job.callback is not None:
        sent = job.callback
        last = sent.response_code or sent.last_error  # None once the outbox pruned it
        answer = "" if last is None else f", last answer {last}"
        tries = "1 attempt" if sent.attempts == 1 else f"{sent.attempts} attempts"
        rows.append(("callback", f"{sent.status} after {tries}{answer}"))
    for label, value in rows:
        # A value's own lines (an error message may have several) stay in its column:
        # none of them passes for a row of its own.
        say(f"{label:<11}" + value.replace("\n", "\n" + " " * 11))
    if logged and last_log is not None:
        lines = last_log.rstrip("\n").splitlines()
        shown = lines[-LOG_LINES:]
        more = f", the last {len(shown)} of {len(lines)} lines" if len(lines) > len(shown) else ""
        say(f"attempt {logged[-1].attempt_number}'s child printed{more}:")
        for line in shown:
            say(f"  {line}")


def cancel(
    job_id: Annotated[str, typer.Argument(help="Job id.")],
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    timeout: Timeout = 30.0,
) -> None:
    """Cancel a job (a running one is asked to stop)."""
    with open_client(api_url, api_key, timeout) as client:
        result = client.cancel(job_id)
    suffix = ", cancel requested" if result.cancel_requested else ""
    say(f"job {result.job_id} {result.status}{suffix}")


def queues(
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    timeout: Timeout = 30.0,
) -> None:
    """Queue depths, in-flight jobs, retries and the oldest waiting job."""
    from rich.console import Console
    from rich.table import Table

    with open_client(api_url, api_key, timeout) as client:
        overview = client.queues()
    table = Table("queue", "queued", "in flight", "retry wait", "oldest age", "redis r/l/d")
    for q in overview.queues:
        redis = (
            "unreachable"
            if q.redis is None
            else f"{q.redis.ready}/{q.redis.leased}/{q.redis.delayed}"
        )
        table.add_row(
            plain(q.queue),
            str(q.queued),
            str(q.in_flight),
            str(q.retry_wait),
            age_text(q.oldest_age_seconds),
            redis,
        )
    Console(width=max(100, Console().width)).print(table)


def watch(
    job_ids: Annotated[list[str], typer.Argument(help="Job ids.")],
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", envvar="HYPERMEDIA_WATCH_JSON", help="One JSON line per event, no bars."
        ),
    ] = False,
    wait_timeout: Annotated[
        float | None,
        typer.Option(
            "--wait-timeout",
            envvar="HYPERMEDIA_WAIT_TIMEOUT",
            min=0,
            help="Give up after this many seconds (default: never).",
            show_default=False,
        ),
    ] = None,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    timeout: Timeout = 30.0,
) -> None:
    """Follow jobs live (their event streams): a progress bar each, with its phase
    (download, run, upload) and status, until every one has ended. Exits 1 unless all
    completed."""
    import json
    import threading

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn

    finals: dict[str, str] = {}
    errors: list[str] = []
    lock = threading.Lock()
    console = Console(stderr=False)
    bars = Progress(
        TextColumn("{task.fields[job]}", markup=False),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.description}", markup=False),
        console=console,
        disable=as_json,
    )
    tasks = {
        job_id: bars.add_task("waiting", total=1.0, job=printable(job_id[:12]))
        for job_id in job_ids
    }

    def shown(job_id: str, event: JobEvent) -> None:
        if as_json:
            line = json.dumps({"job_id": job_id, **event.model_dump(exclude_none=True)})
            with lock:
                say(line)
            return
        task = tasks[job_id]
        if event.type == "progress":
            detail = f"{event.phase} {_amount(event)}".rstrip()
            bars.update(task, completed=event.fraction or 0.0, description=printable(detail))
        elif event.status is not None:
            done = 1.0 if event.status == "completed" else None
            bars.update(task, description=event.status, completed=done)

    def follow(job_id: str) -> None:
        try:
            with open_client(api_url, api_key, timeout) as client:
                for event in client.events(job_id, timeout=wait_timeout):
                    shown(job_id, event)
                    if event.status is not None:
                        finals[job_id] = event.status
        except Exception as exc:  # shown with the others, below
            code = getattr(exc, "code", type(exc).__name__)
            with lock:
                errors.append(f"job {job_id}: {code}: {getattr(exc, 'message', exc)}")

    threads = [threading.Thread(target=follow, args=(j,), daemon=True) for j in job_ids]
    with bars:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    for message in errors:
        say(message, err=True)
    unfinished = [j for j in job_ids if finals.get(j) != "completed"]
    if unfinished:
        fail(f"{len(unfinished)} of {len(job_ids)} jobs did not complete")


def _amount(event: JobEvent) -> str:
    def size(value: float) -> str:
        if event.unit == "bytes":
            for unit in ("B", "KB", "MB", "GB"):
                if value < 1024 or unit == "GB":
                    return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
                value /= 1024
        return f"{value:g}"

    if event.total is None and not event.done:  # a phase begins, its measure unknown
        return ""
    done = size(event.done or 0.0)
    if event.total is None:
        return f"{done} {event.unit or ''}".strip()
    unit = "" if event.unit == "bytes" else f" {event.unit}"
    return f"{done} of {size(event.total)}{unit}"
