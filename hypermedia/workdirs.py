"""Where jobs' workdirs live on a node, and removing those a dead worker left.

A worker's executor keeps each running job's files (a copy of the user's input,
whatever the step wrote, owned by the job's uid) in
``<data_dir>/work/<worker_id>/jobs/<job_id>/`` and removes them when the job ends.
A worker that dies (kill -9, its node lost) cannot: whoever learns of the death
removes them where it runs, on the same node as the dead worker's data dir: the
supervisor for the actor deaths Ray reports (the whole worker directory), the
reaper for the jobs whose lease ran out (that job's directory). On another node
there is nothing to find, and nothing happens; so a worker starting on a node (a
burst node, where neither runs) also sweeps the roots there of workers the record
says have ended (:func:`sweep`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

WORK = "work"
JOBS = "jobs"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def worker_root(data_dir: Path, worker_id: str) -> Path:
    """``<data_dir>/work/<worker_id>``: one worker's work root."""
    return Path(data_dir) / WORK / _checked(worker_id)


def job_workdir(data_dir: Path, worker_id: str, job_id: str) -> Path:
    return worker_root(data_dir, worker_id) / JOBS / _checked(job_id)


def remove_worker(data_dir: Path, worker_id: str) -> bool:
    """Remove a dead worker's work root, every job's files in it. True if there was one."""
    return _remove(worker_root(data_dir, worker_id))


def sweep(data_dir: Path, ended: Callable[[list[str]], set[str]]) -> list[str]:
    """Remove the work roots on this node of the workers that ``ended`` (given the
    worker ids found here) says have ended; the ids removed. Roots of workers not
    known to have ended stay: one may be starting right now."""
    root = Path(data_dir) / WORK
    try:
        found = sorted(p.name for p in root.iterdir() if _NAME.fullmatch(p.name))
    except OSError:
        return []
    if not found:
        return []
    gone = ended(found)
    return [
        worker_id for worker_id in found if worker_id in gone and remove_worker(data_dir, worker_id)
    ]


def remove_job(data_dir: Path, worker_id: str, job_id: str) -> bool:
    """Remove one job's workdir under a worker's root. True if there was one."""
    return _remove(job_workdir(data_dir, worker_id, job_id))


def _checked(name: str) -> str:
    # Names come from the record (claimed_by): never let one climb out of the data dir.
    if not _NAME.fullmatch(name) or name in (".", ".."):
        raise ValueError(f"{name!r} is not a safe directory name")
    return name


def _remove(path: Path) -> bool:
    if not path.is_dir() or path.is_symlink():
        return False
    try:
        shutil.rmtree(path, onerror=_make_writable_and_retry)
    except OSError as exc:
        log.warning("could not remove %s: %s", path, exc, extra={"action": "workdir_cleanup"})
        return False
    log.info("removed %s", path, extra={"action": "workdir_cleanup"})
    return True


def _make_writable_and_retry(function: Callable[..., Any], path: str, exc_info: Any) -> None:
    """A job may leave directories without write permission (it ran as its own uid)."""
    parent = os.path.dirname(path)
    with contextlib.suppress(OSError):
        os.chmod(parent, stat.S_IRWXU)
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, stat.S_IRWXU)
    function(path)
