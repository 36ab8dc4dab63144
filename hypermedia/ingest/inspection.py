"""Upload inspection in a child process, with a CPU, memory and wall-clock budget.

Inspection reads untrusted bytes with hand-written parsers; a crafted file can make
them slow (an 8 MB PDF of ``/Width 1`` tokens cost 7.8 s of CPU), and in the API
process that time is taken from every other request. So each inspection runs in a
child under ``RLIMIT_CPU`` and ``RLIMIT_AS``, and the thread that waits for it holds
no lock and no GIL. At most ``concurrency`` children of one runner run at once;
further uploads wait their turn.

The children are forked by a small warm server (``python -m
hypermedia.ingest.inspection``, started on first use, one per API process, gone
when the API's end of its control socket closes) that has the inspection modules
loaded: a fork costs milliseconds, and nothing of the API process (its threads,
its connections, its ``__main__``, its environment's credentials) reaches a child.
Per inspection the API hands the server one end of a fresh socket pair; the child
speaks on it, and the server adds the child's exit status when it has reaped it::

    API -> child    ("inspect", path | None, size, cpu_seconds, memory_mb)
    child -> API    ("pid", pid), then ("read", offset, length)* and one of
                    ("done", inspection) | ("memory",) | ("error", text)
    API -> child    the bytes of each read (an S3 object: the child holds no client)
    server -> API   ("exit", exit code), after the child has ended

A local file is opened by path (read only). Past a budget (``SIGXCPU``, out of
memory, or the wall clock, after which the API kills the child) the upload is refused
with :class:`~hypermedia.errors.InspectionLimit` (422 ``inspection_limit``).
"""

from __future__ import annotations

import atexit
import logging
import os
import resource
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import suppress
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from hypermedia.errors import InspectionLimit
from hypermedia.sandbox.inspect import Inspection, inspect_file, inspect_source
from hypermedia.storage.base import Storage
from hypermedia.storage.local import LocalStorage
from pipelines.formats.source import BytesSource, CallbackSource

log = logging.getLogger(__name__)

# What the server's environment keeps of the API's: enough to find Python, its
# packages and libmagic; no credentials.
_ENVIRONMENT = ("PATH", "PYTHONPATH", "VIRTUAL_ENV", "HOME", "LANG", "LC_ALL", "TMPDIR", "MAGIC")


@dataclass(frozen=True, slots=True)
class InspectionBudget:
    cpu_seconds: int = 10
    wall_seconds: float = 30.0
    memory_mb: int = 1024
    concurrency: int = 2


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
        conn = _server().open()
        pid: int | None = None
        deadline = time.monotonic() + budget.wall_seconds
        try:
            conn.send(("inspect", path, size, budget.cpu_seconds, budget.memory_mb))
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not conn.poll(remaining):
                    if pid is not None:
                        with suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                    raise self._limit(key, f"took longer than {budget.wall_seconds:g} s")
                try:
                    message = conn.recv()
                except EOFError:
                    raise RuntimeError(
                        f"the inspection server went away inspecting {key!r}"
                    ) from None
                kind = message[0]
                if kind == "pid":
                    pid = message[1]
                elif kind == "read":
                    conn.send_bytes(storage.read_range(key, message[1], message[2]))
                elif kind == "done":
                    return Inspection.from_dict(message[1])
                elif kind == "memory":
                    raise self._limit(key, f"needed more than {budget.memory_mb} MB")
                elif kind == "exit":
                    raise self._died(key, message[1])
                else:
                    raise RuntimeError(f"inspecting {key!r} failed in its child: {message[1]}")
        finally:
            conn.close()

    def _died(self, key: str, exit_code: int) -> Exception:
        if exit_code in (-signal.SIGXCPU, -signal.SIGKILL):
            return self._limit(key, f"needed more than {self.budget.cpu_seconds} s of CPU")
        return RuntimeError(f"the inspection child for {key!r} died (exit code {exit_code})")

    def _limit(self, key: str, what: str) -> InspectionLimit:
        log.warning("inspection of %s stopped: %s", key, what, extra={"action": "inspection_limit"})
        return InspectionLimit(
            f"the file could not be inspected within the limits: it {what}",
            cpu_seconds=self.budget.cpu_seconds,
            wall_seconds=self.budget.wall_seconds,
            memory_mb=self.budget.memory_mb,
        )


# -- the API's side of the server ----------------------------------------------------------


class _Server:
    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        environment = {k: v for k, v in os.environ.items() if k in _ENVIRONMENT}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "hypermedia.ingest.inspection", str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            env=environment,
            # Not in the terminal's process group: a Ctrl-C there is the API process's to
            # handle (it stops in order); the server, killed by it, broke the uploads in
            # flight and printed a KeyboardInterrupt traceback. It ends when the API
            # process's end of its control socket closes, however that process ends.
            # (A process group, not a session: a session is a CPU group of its own under
            # the kernel's autogroup scheduling.)
            process_group=0,
        )
        theirs.close()
        self.control = ours
        self._lock = threading.Lock()

    def alive(self) -> bool:
        return self.process.poll() is None

    def open(self) -> Connection:
        """A channel to a new child of the server."""
        mine, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with self._lock:
                socket.send_fds(self.control, [b"i"], [child.fileno()])
        finally:
            child.close()
        return Connection(mine.detach())

    def close(self) -> None:
        self.control.close()  # the server exits on EOF
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


_current: _Server | None = None
_current_lock = threading.Lock()


def _server() -> _Server:
    """The process's inspection server, (re)started when needed."""
    global _current
    with _current_lock:
        if _current is None or not _current.alive():
            if _current is not None:
                log.warning("the inspection server died; starting another")
                _current.close()
            _current = _Server()
            atexit.register(_current.close)
        return _current


# -- the server and its children ---------------------------------------------------------------


def serve(control_fd: int) -> None:
    """Fork one child per channel received on ``control_fd``; report each child's exit
    code on its channel; return when the control socket closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ends with its control socket only
    inspect_source(BytesSource(b"%PDF-1.4\n"))  # warm: libmagic and the readers loaded
    control = socket.socket(fileno=control_fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    children: dict[int, int] = {}  # pid -> its channel's fd
    while True:
        for key, _ in selector.select():
            if key.fileobj is control:
                message, fds, _flags, _address = socket.recv_fds(control, 16, 1)
                if not message:
                    return
                for fd in fds:
                    pid = os.fork()
                    if pid == 0:
                        selector.close()
                        control.close()
                        for other in (wake_r, wake_w, *children.values()):
                            os.close(other)
                        _child_main(fd)
                    children[pid] = fd
            else:
                with suppress(BlockingIOError):
                    os.read(wake_r, 4096)
        _reap(children)


def _reap(children: dict[int, int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = children.pop(pid, None)
        if fd is None:
            continue
        channel = Connection(fd)
        with suppress(OSError):  # the API may have stopped listening: nothing to tell
            channel.send(("exit", os.waitstatus_to_exitcode(status)))
        channel.close()


def _child_main(fd: int) -> None:
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    code = 0
    try:
        _child(Connection(fd))
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def _child(conn: Connection) -> None:
    conn.send(("pid", os.getpid()))
    _, path, size, cpu_seconds, memory_mb = conn.recv()
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


if __name__ == "__main__":
    serve(int(sys.argv[1]))
