"""The embedded run: files in, derived files out, progress on screen.

``hypermedia run PATH...`` starts the local stack (:mod:`hypermedia.local`),
uploads every file and submits its operations through the ingest client (HTTP,
as any web tier would), shows a progress bar per queue, writes the outputs under
``./hypermedia-out/<name>/`` (:func:`named_files`: ``a/photo.jpg`` for
``in/a/photo.jpg`` of ``run in/``), prints a summary (done / failed with reasons) and
stops everything it started. Directories are walked; hidden files are skipped.

When no ``--op`` is given, operations are chosen from the file's guessed type
among those with a pipeline in this build (a convenience only: the worker checks
the real type by content before any decoder sees the file).
"""

from __future__ import annotations

import mimetypes
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import and_, or_, select

from hypermedia import accounts
from hypermedia.accounts import Caller
from hypermedia.db import tables as t
from hypermedia.db.engine import snapshot, transaction
from hypermedia.errors import ConfigError, HypermediaError, ServiceUnavailable, UnknownOperation
from hypermedia.jobs.states import JobStatus
from hypermedia.stack import Stack

LOCAL_OPERATOR = "local-operator"
LOCAL_CREDITS_MILLICREDITS = 1_000_000_000  # the embedded operator pays itself
FINISHED = ("completed", "failed", "cancelled")

DEFAULT_OPERATIONS: dict[str, list[str]] = {
    "image": ["thumbnail"],
    "application/pdf": ["pdf_preview", "extract_text"],
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": ["docx_to_pdf"],
    "application/msword": ["docx_to_pdf"],
    "application/vnd.oasis.opendocument.text": ["docx_to_pdf"],
    "video": ["transcode_video"],
    "audio": ["transcode_audio"],
}


def default_operations(path: Path, implemented: Iterable[str]) -> list[str]:
    guessed, _ = mimetypes.guess_type(path.name)
    if guessed is None:
        return []
    ops = DEFAULT_OPERATIONS.get(guessed) or DEFAULT_OPERATIONS.get(guessed.split("/")[0], [])
    available = set(implemented)
    return [op for op in ops if op in available]


def operations_for(
    path: Path, operations: Sequence[str] | None, implemented: Iterable[str]
) -> list[str]:
    """What ``run`` submits for ``path``: the operations asked for, else its defaults."""
    return list(operations) if operations else default_operations(path, implemented)


def walk(paths: Iterable[Path]) -> Iterator[Path]:
    for path in paths:
        if path.is_dir():
            for child in sorted(path.rglob("*")):
                relative = child.relative_to(path)
                if child.is_file() and not any(p.startswith(".") for p in relative.parts):
                    yield child
        elif path.is_file():
            yield path
        else:
            raise FileNotFoundError(f"no such file or directory: {path}")


def named_files(paths: Iterable[Path]) -> dict[Path, Path]:
    """Every file under ``paths`` (as :func:`walk` finds them) with the name its outputs
    are written under: its path relative to the directory argument it was found in
    (``a/photo.jpg`` for ``in/a/photo.jpg`` of ``in``), or its own name for a file
    argument. Where that names two files alike (``in/a/photo.jpg in/b/photo.jpg``),
    every file is named by its path relative to the directory all have in common: the
    outputs of one never overwrite another's."""
    named: dict[Path, Path] = {}
    for path in paths:
        for found in walk([path]):
            named[found] = found.relative_to(path) if path.is_dir() else Path(found.name)
    if len(set(named.values())) < len(named):
        absolute = {found: found.absolute() for found in named}
        common = Path(os.path.commonpath([a.parent for a in absolute.values()]))
        named = {found: absolute[found].relative_to(common) for found in named}
    return named


def check_out_dir(out: Path) -> None:
    """``run --out``: a directory (made if missing) this process can write in, checked
    before anything starts: a file there was found only after all the work."""
    key = "--out (HYPERMEDIA_RUN_OUT)"
    if out.exists() and not out.is_dir():
        raise ConfigError(key, f"{out} is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(key, f"cannot make the directory {out}: {exc.strerror or exc}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise ConfigError(key, f"cannot write in {out}")


def check_disk(data_dir: Path, min_free_mb: int) -> None:
    """Enough free disk for the workers to claim: below ``worker_min_free_disk_mb`` on
    the disk of their workdirs (in ``data_dir``) they claim nothing, and a run waited
    with its bars at 0 until its timeout (30 min) without a word."""
    probe = data_dir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent  # the data dir is made when the stack starts
    free_mb = shutil.disk_usage(probe).free / 2**20
    if free_mb < min_free_mb:
        raise ServiceUnavailable(
            f"the disk of {data_dir} has {free_mb:.0f} MB free, below"
            f" worker_min_free_disk_mb ({min_free_mb}): the workers would claim no job; free"
            " some space, or lower HYPERMEDIA_WORKER_MIN_FREE_DISK_MB",
            free_mb=round(free_mb),
        )


@dataclass(frozen=True, slots=True)
class ClaimPause:
    """A live worker that claims nothing now, and why: ``disk`` (its disk guard:
    ``workers.claims_paused_reason``) or ``outage`` (the record, Redis or the storage
    down: ``workers.outage_paused_reason``, while the pause lasts)."""

    worker_id: str
    cause: str
    reason: str

    @property
    def notice(self) -> str:
        """As ``hypermedia run`` says it while its jobs wait (plain text)."""
        if self.cause == "disk":
            return (
                f"{self.worker_id} claims no job: {self.reason}"
                " (worker_min_free_disk_mb, HYPERMEDIA_WORKER_MIN_FREE_DISK_MB)"
            )
        return f"{self.worker_id} claims no job: paused by an outage: {self.reason}"


def paused_workers(stack: Stack) -> list[ClaimPause]:
    """The live workers that claim nothing, and why (a low disk, an outage), by worker."""
    from hypermedia.worker.worker import ENDED_STATUSES as ENDED_WORKERS

    w = t.workers.c
    outage = and_(w.outage_paused_since.is_not(None), w.outage_paused_seconds.is_(None))
    with snapshot(stack.engine) as conn:
        rows = conn.execute(
            select(w.worker_id, w.claims_paused_reason, w.outage_paused_reason, outage)
            .where(
                or_(w.claims_paused_reason.is_not(None), outage),
                w.status.not_in(ENDED_WORKERS),
            )
            .order_by(w.worker_id)
        ).all()
    pauses = []
    for worker_id, disk, outage_reason, in_outage in rows:
        if disk is not None:
            pauses.append(ClaimPause(worker_id, "disk", disk))
        if in_outage:
            pauses.append(ClaimPause(worker_id, "outage", outage_reason or "a service is down"))
    return pauses


def check_operations(operations: Iterable[str], implemented: Iterable[str]) -> None:
    available = sorted(implemented)
    for op in operations:
        if op not in available:
            raise UnknownOperation(
                f"no pipeline implements {op!r} in this build; available: {', '.join(available)}",
                operation=op,
            )


def local_operator(stack: Stack) -> tuple[Caller, str]:
    """The embedded operator account (created on first use) and a fresh API key."""
    now = stack.clock.now()
    with transaction(stack.engine) as conn:
        row = conn.execute(
            select(t.users.c.user_id, t.users.c.is_operator).where(t.users.c.name == LOCAL_OPERATOR)
        ).first()
        if row is None:
            user = accounts.create_user(
                conn,
                LOCAL_OPERATOR,
                now,
                credits_millicredits=LOCAL_CREDITS_MILLICREDITS,
                is_operator=True,
                grants=accounts.UNLIMITED,
            )
            return Caller(user.user_id, True, grants=accounts.UNLIMITED), user.api_key
        key = accounts.create_api_key(
            conn, row.user_id, now, name="hypermedia run", grants=accounts.UNLIMITED
        )
        return Caller(row.user_id, bool(row.is_operator), grants=accounts.UNLIMITED), key


@dataclass
class Submitted:
    path: Path
    operation: str
    queue: str
    job_id: str


@dataclass
class RunReport:
    submitted: list[Submitted] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    statuses: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, list[Path]] = field(default_factory=dict)
    objects: list[str] = field(default_factory=list)  # what it uploaded, in the data dir

    def counts(self) -> Counter[str]:
        return Counter(self.statuses.get(s.job_id, "queued") for s in self.submitted)


def submit_files(
    api_url: str,
    api_key: str,
    files: Iterable[Path],
    operations: list[str] | None,
    implemented: list[str],
    priority: int | None = None,
    on_file: Callable[[Path], None] | None = None,
    report: RunReport | None = None,
) -> RunReport:
    """Upload and submit through the HTTP ingest client, as a web tier would. ``report``
    (a new one if None) holds every job as soon as it is submitted: a run interrupted
    half-way knows the jobs it has to account for."""
    from hypermedia.ingest.client import HypermediaClient

    report = report if report is not None else RunReport()
    with HypermediaClient(api_url, api_key, timeout=120) as client:
        for path in files:
            if on_file is not None:
                on_file(path)
            ops = operations_for(path, operations, implemented)
            if not ops:
                report.skipped.append((path, "no pipeline for this file type; pass --op"))
                continue
            try:
                obj = client.upload(path)
                report.objects.append(obj.object_id)
                result = client.process(obj.object_id, ops, priority=priority)
            except HypermediaError as exc:
                report.skipped.append((path, f"{exc.code}: {exc.message}"))
                continue
            except OSError as exc:  # the file, not the API: httpx's errors are translated
                # Removed since the walk, or unreadable: the other files go on.
                report.skipped.append((path, f"cannot read the file: {exc.strerror or exc}"))
                continue
            for job in result.jobs:
                report.submitted.append(Submitted(path, job.operation, job.queue, job.job_id))
    return report


def forget_objects(api_url: str, api_key: str, report: RunReport) -> int:
    """Delete what the run uploaded, with its outputs, once they are written out: each
    run kept a copy of every file and output in the data dir (72 MB after three runs of
    15 MB), which nothing ever removed. An object a job still runs on (the run timed out
    or was interrupted) stays. Answers how many stayed."""
    from hypermedia.ingest.client import HypermediaClient

    kept = 0
    with HypermediaClient(api_url, api_key, timeout=60) as client:
        for object_id in report.objects:
            try:
                client.delete(object_id)
            except HypermediaError:  # a job on it has not ended: the next run's to cancel
                kept += 1
    return kept


def unfinished_jobs(stack: Stack, caller: Caller) -> list[str]:
    """The jobs of ``caller`` (the embedded operator) that have not ended: at the start
    of a run, those an earlier one left when it was killed (``kill -9``, a power cut)."""
    with snapshot(stack.engine) as conn:
        return list(
            conn.execute(
                select(t.jobs.c.job_id).where(
                    t.jobs.c.user_id == caller.user_id, t.jobs.c.status.not_in(FINISHED)
                )
            ).scalars()
        )


def cancel_jobs(stack: Stack, caller: Caller, job_ids: Iterable[str]) -> tuple[int, int]:
    """Cancel those of ``job_ids`` that have not ended; answers how many are cancelled
    and how many were in flight, asked to stop (a live worker kills a cancelled job's
    step within seconds; one a dead stack left is cancelled once its lease runs out and
    it is claimed again). A job that ended meanwhile stays as it ended."""
    cancelled = stopping = 0
    for job_id in job_ids:
        try:
            status = stack.ingest.cancel(caller, job_id)
        except HypermediaError:  # ended since (already completed, failed or cancelled)
            continue
        if status is JobStatus.CANCELLED:
            cancelled += 1
        else:
            stopping += 1
    return cancelled, stopping


def poll_statuses(stack: Stack, report: RunReport) -> None:
    """The statuses (and errors) of the submitted jobs not yet seen finished: a job that
    ended stays as it ended, so a run of n jobs reads each ended one once, not on every
    poll until the last ends."""
    ids = [s.job_id for s in report.submitted if report.statuses.get(s.job_id) not in FINISHED]
    with snapshot(stack.engine) as conn:
        for start in range(0, len(ids), 500):
            rows = conn.execute(
                select(
                    t.jobs.c.job_id, t.jobs.c.status, t.jobs.c.error_code, t.jobs.c.error_message
                ).where(t.jobs.c.job_id.in_(ids[start : start + 500]))
            ).all()
            for row in rows:
                report.statuses[row.job_id] = row.status
                if row.error_code:
                    report.errors[row.job_id] = f"{row.error_code}: {row.error_message or ''}"


def wait_until_finished(
    stack: Stack,
    report: RunReport,
    on_poll: Callable[[RunReport], None],
    timeout: float,
    poll_seconds: float = 0.25,
) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        poll_statuses(stack, report)
        on_poll(report)
        if all(report.statuses.get(s.job_id) in FINISHED for s in report.submitted):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_seconds)


def write_outputs(
    stack: Stack, report: RunReport, out_dir: Path, names: Mapping[Path, Path] | None = None
) -> list[str]:
    """Copy every completed job's outputs to ``out_dir/<name>/<output type>`` (``names``:
    each file's, from :func:`named_files`; else the file's name). Answers the outputs
    that could not be written (``path: reason``): the others are written all the same."""
    names = names or {}
    failures: list[str] = []
    by_job = {s.job_id: s for s in report.submitted}
    with snapshot(stack.engine) as conn:
        rows = conn.execute(
            select(t.outputs.c.job_id, t.outputs.c.output_type, t.outputs.c.storage_key).where(
                t.outputs.c.job_id.in_(list(by_job))
            )
        ).all()
    for row in rows:
        submitted = by_job[row.job_id]
        target = out_dir / names.get(submitted.path, Path(submitted.path.name)) / row.output_type
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("wb") as handle:
                for chunk in stack.storage.read(row.storage_key):
                    handle.write(chunk)
        except OSError as exc:
            failures.append(f"{target}: {exc.strerror or exc}")
            continue
        report.outputs.setdefault(row.job_id, []).append(target)
    return failures
