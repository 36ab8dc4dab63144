"""The worker logs a ``hypermedia run`` keeps: its Ray node's session (the actors'
``worker-*.out`` and ``worker-*.err``, where a job's worker-side traceback lands) goes
when the run stops its head, so a run that ended with failed jobs (or timed out) keeps
a copy of them first, under ``<data_dir>/logs/run-<UTC time>/``, and its summary says
where.

Bounded: each file's last whole lines (a traceback is at the end), at most
:data:`MAX_FILE_BYTES` and its share of :data:`MAX_RUN_BYTES` a run; the
:data:`KEEP_RUNS` newest runs kept (older ones removed). Private: the directories
``0700``, the files ``0600``. Redacted again on the way
(:func:`hypermedia.logs.redact_urls`): our handlers redact every record, but Ray writes
to the same files what no handler saw (a task's exception, a print).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from hypermedia.logs import redact_urls

LOGS_DIR = "logs"
RUN_PREFIX = "run-"
KEEP_RUNS = 5
MAX_FILE_BYTES = 2 * 2**20
MAX_RUN_BYTES = 20 * 2**20
PATTERNS = ("worker-*.err", "worker-*.out")
# What Ray writes at the top of each worker's files (":actor_name:PipelineService").
RAY_MARKERS = (":job_id:", ":actor_name:", ":task_name:")


def run_logs_dir(data_dir: Path, now: float | None = None) -> Path:
    """Where a run's logs go: ``<data_dir>/logs/run-20261205-204103``."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    return data_dir / LOGS_DIR / f"{RUN_PREFIX}{stamp}"


def session_logs(temp_dir: Path) -> Path:
    """The logs of the Ray session of a node started with ``--temp-dir temp_dir``."""
    return temp_dir / "session_latest" / "logs"


def keep(
    source: Path,
    dest: Path,
    *,
    keep_runs: int = KEEP_RUNS,
    max_file_bytes: int = MAX_FILE_BYTES,
    max_run_bytes: int = MAX_RUN_BYTES,
) -> list[Path]:
    """Copy the worker logs of ``source`` (a session's ``logs``) to ``dest``, bounded
    and redacted, then remove the oldest runs' beyond ``keep_runs``; answers the files
    written (none: ``dest`` is not made)."""
    found = sorted(
        p for pattern in PATTERNS for p in source.glob(pattern) if p.is_file() and p.stat().st_size
    )
    # Every worker's last lines, each file its share of the run's bound at most.
    share = min(max_file_bytes, max_run_bytes // max(1, len(found)))
    chosen = [(min(p.stat().st_size, share), p) for p in found]
    written: list[Path] = []
    for size, path in chosen:
        with path.open("rb") as file:
            start = max(0, path.stat().st_size - size)
            file.seek(start)
            data = file.read(size)
        if start:  # from the first whole line: a cut URL would escape the redaction
            data = data[data.find(b"\n") + 1 :]
        text = data.decode("utf-8", "replace")
        if not any(line and not line.startswith(RAY_MARKERS) for line in text.splitlines()):
            continue  # Ray's lines naming the worker alone: it said nothing
        if not written:
            _private_dir(dest.parent)
            _private_dir(dest)
        target = dest / path.name
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(redact_urls(text))
        written.append(target)
    if written:
        prune(dest.parent, keep_runs)
    return written


def prune(root: Path, keep_runs: int) -> list[Path]:
    """Remove the oldest ``run-*`` directories of ``root`` beyond ``keep_runs``."""
    runs = sorted(p for p in root.glob(f"{RUN_PREFIX}*") if p.is_dir() and not p.is_symlink())
    gone = runs[: max(0, len(runs) - keep_runs)]
    for path in gone:
        shutil.rmtree(path, ignore_errors=True)
    return gone


def _private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
