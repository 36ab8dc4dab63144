"""Upload inspection in a child process, with a CPU, memory and wall-clock budget.

Inspection reads untrusted bytes with hand-written parsers; a crafted file can make
them slow (an 8 MB PDF of ``/Width 1`` tokens cost 7.8 s of CPU), and in the API
process that time is taken from every other request. So each inspection runs in a
child forked from a small warm server (``multiprocessing``'s forkserver, with the
inspection modules preloaded), under ``RLIMIT_CPU`` and ``RLIMIT_AS``; the thread
that waits for it holds no lock and no GIL. At most ``concurrency`` children run at
once; further uploads wait their turn.

The child never touches storage: a local file is opened by path (read only), and an
object in S3 is read through the parent, which answers the child's ranged reads over
the pipe with its own client. Past a budget (``SIGXCPU``, out of memory, or the wall
clock, after which the parent kills it) the upload is refused with
:class:`~hypermedia.errors.InspectionLimit` (422 ``inspection_limit``).
"""

from __future__ import annotations

import logging
import multiprocessing
import resource
import signal
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from hypermedia.errors import InspectionLimit
from hypermedia.sandbox.inspect import Inspection, inspect_file, inspect_source
from hypermedia.storage.base import Storage
from hypermedia.storage.local import LocalStorage
from pipelines.formats.source import CallbackSource

log = logging.getLogger(__name__)

_PRELOAD = ["hypermedia.ingest.inspection"]
_context_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class InspectionBudget:
    cpu_seconds: int = 10
    wall_seconds: float = 30.0
    memory_mb: int = 1024
    concurrency: int = 2


def _context() -> Any:
    with _context_lock:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(_PRELOAD)
        return context


class InspectionRunner:
    """Inspects stored bytes in budgeted children (see the module docstring)."""

    def __init__(self, budget: InspectionBudget) -> None:
        self.budget = budget
        self._slots = threading.BoundedSemaphore(budget.concurrency)

    def inspect(self, storage: Storage, key: str, size: int) -> Inspection:
        with self._slots:
            return self._run(storage, key, size)

    def _run(self, storage: Storage, key: str, size: int) -> Inspection:
        budget = self.budget
        path = str(storage.path(key)) if isinstance(storage, LocalStorage) else None
        parent, child = _context().Pipe()
        process = _context().Process(
            target=_child,
            args=(child, path, size, budget.cpu_seconds, budget.memory_mb),
            name="hypermedia-inspect",
            daemon=True,
        )
        process.start()
        child.close()
        deadline = time.monotonic() + budget.wall_seconds
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not parent.poll(remaining):
                    raise self._limit(key, f"took longer than {budget.wall_seconds:g} s")
                try:
                    message = parent.recv()
                except EOFError:
                    # Dead: its exit status comes through the fork server, which may lag.
                    process.join(30)
                    raise self._died(key, process.exitcode) from None
                kind = message[0]
                if kind == "read":
                    _, offset, length = message
                    parent.send_bytes(storage.read_range(key, offset, length))
                elif kind == "done":
                    return Inspection.from_dict(message[1])
                elif kind == "memory":
                    raise self._limit(key, f"needed more than {budget.memory_mb} MB")
                else:
                    raise RuntimeError(f"inspection of {key!r} failed in its child: {message[1]}")
        finally:
            parent.close()
            if process.is_alive():
                process.kill()
            process.join(5)

    def _died(self, key: str, exitcode: int | None) -> Exception:
        if exitcode in (-signal.SIGXCPU, -signal.SIGKILL):
            return self._limit(key, f"needed more than {self.budget.cpu_seconds} s of CPU")
        return RuntimeError(f"the inspection child for {key!r} died (exit code {exitcode})")

    def _limit(self, key: str, what: str) -> InspectionLimit:
        log.warning("inspection of %s stopped: %s", key, what, extra={"action": "inspection_limit"})
        return InspectionLimit(
            f"the file could not be inspected within the limits: it {what}",
            cpu_seconds=self.budget.cpu_seconds,
            wall_seconds=self.budget.wall_seconds,
            memory_mb=self.budget.memory_mb,
        )


def _child(conn: Connection, path: str | None, size: int, cpu_seconds: int, memory_mb: int) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    memory = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    def read_at(offset: int, length: int) -> bytes:
        conn.send(("read", offset, length))
        return conn.recv_bytes()

    try:
        if path is not None:
            inspection = inspect_file(Path(path))
        else:
            inspection = inspect_source(CallbackSource(size, read_at))
    except MemoryError:
        conn.send(("memory",))
        return
    except Exception as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("done", inspection.to_dict()))
