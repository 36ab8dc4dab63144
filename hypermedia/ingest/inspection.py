"""Upload inspection in a child process, with a CPU, memory and wall-clock budget.

Inspection reads untrusted bytes with hand-written parsers; a crafted file can make
them slow (an 8 MB PDF of ``/Width 1`` tokens cost 7.8 s of CPU), and in the API
process that time is taken from every other request. So each inspection runs in a
child under ``RLIMIT_CPU`` and ``RLIMIT_AS``, and the thread that waits for it holds
no lock and no GIL. At most ``concurrency`` children of one runner run at once;
further uploads wait their turn.

The children are forked by a small warm server (``python -m
hypermedia.ingest.inspection``, started on first use, one per API process, gone
when the API's end of its control socket closes, however the API ended: it kills
and reaps its children then, and a server killed itself takes them along, their
``PDEATHSIG``) that has the inspection modules loaded: a fork costs milliseconds,
and nothing of the API process (its threads, its connections, its ``__main__``, its
environment's credentials) reaches a child.
Per inspection the API hands the server one end of each of two fresh socket pairs:
the child speaks on the first (its channel), the server alone on the second (the
status: the child never holds it, so it cannot forge its pid or how it ended). Every
message is a JSON array in a length-prefixed frame (``Connection.send_bytes``), never
a pickle: what a parser exploit in the child writes is read as data, checked, and
refused when it is no message of this protocol::

    server -> API   {"capabilities": ..., "view": ...} (a JSON line on the control socket,
                    at start; its view: the sandbox's plan and the code it exposes)
    API -> child    ["inspect", path | null, size, cpu_seconds, memory_mb]
    child -> API    ["read", offset, length]* then one of
                    ["done", inspection] | ["memory"] | ["error", text]
    API -> child    the bytes of each read (raw; an S3 object: the child holds no client),
                    at most READ_CAP bytes and never past the object's end
    server -> API   ["pid", pid] once forked, ["exit", exit code] once reaped (status)

A local file is opened by path (read only), before the sandbox is built. Past a
budget (``SIGXCPU``, out of memory, or the wall clock, after which the API kills the
child, by the pid the server gave) the upload is refused with
:class:`~hypermedia.errors.InspectionLimit` (422 ``inspection_limit``); a child that
dies of another signal (a parser's segfault or abort on a crafted file), or sends what
is no message, with :class:`~hypermedia.errors.InspectionCrashed` (422
``inspection_crashed``). Either way nothing of the upload is kept, and the server forks
the next child as before.

The server's work root (``$TMPDIR/hm-inspection-<pid>-*``, which the sandbox needs for
its jobs cover) is removed as the server ends. A server SIGKILLed (the OOM killer,
systemd's last kill of a stopping unit's processes) cannot: the next server to start
sweeps the roots of servers that are gone (:func:`sweep_work_roots`): its user's, named
for a pid no process has, and whose ``owner.lock`` (held by its server for as long as it
runs, released by the kernel however it ends) is free. A live server's root is never
touched, even one in another PID namespace sharing the directory (its lock is held).

The sandbox. A parser exploit in an upload must reach no more than a job's step does,
so each child parses inside the job sandbox (:mod:`hypermedia.sandbox.isolation`,
built once in the server by :meth:`~hypermedia.sandbox.isolation.Isolation.start`, as
the jobs' fork server does): the child opens its file, then enters a network
namespace with no interface up (no PostgreSQL, Redis or anything else on 127.0.0.1),
a mount namespace with the read-only view and its covers (``/tmp``, ``/run``,
``/root``, ``/home``, the API's working directory, and hidden for good
``/etc/hypermedia``, the secret files the API's environment names, such as the
settings file of ``HYPERMEDIA_CONFIG``, and the runner's ``hidden_paths``: the data
directory with its storage secret, database and objects), ``/proc`` with
``hidepid=invisible``, a uid of its own with no capabilities and ``RLIMIT_NPROC`` =
1 (it can start no process or thread, so none outlives it and its uid is free again
once it is reaped), and last the seccomp filter (:mod:`hypermedia.sandbox.syscalls`).
No workdir: nothing is writable. What the machine does not allow (not root, no
``CAP_SYS_ADMIN``) is left out and logged as a warning when the server starts,
exactly as for jobs; ``sandbox=False`` leaves rlimits only.
"""

from __future__ import annotations

import atexit
import fcntl
import heapq
import json
import logging
import os
import resource
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from hypermedia.errors import InspectionCrashed, InspectionLimit, ServiceUnavailable
from hypermedia.sandbox import isolation
from hypermedia.sandbox.child import PR_SET_NO_NEW_PRIVS, PR_SET_PDEATHSIG, SIGKILL, prctl
from hypermedia.sandbox.inspect import Inspection, inspect_source
from hypermedia.secret_files import secret_files
from hypermedia.storage.base import Storage
from hypermedia.storage.local import LocalStorage
from pipelines.formats.source import BytesSource, CallbackSource, FileSource, Source

log = logging.getLogger(__name__)

# What the server's environment keeps of the API's: enough to find Python, its
# packages and libmagic; no credentials.
_ENVIRONMENT = ("PATH", "PYTHONPATH", "VIRTUAL_ENV", "HOME", "LANG", "LC_ALL", "TMPDIR", "MAGIC")
WORK_ROOT_PREFIX = "hm-inspection-"  # then the server's pid, "-", mkdtemp's letters
OWNER_LOCK = "owner.lock"  # in a work root: locked by its server while it runs
STARTUP_TIMEOUT = 60.0  # the server's "ready": imports, then the sandbox probed
MESSAGE_CAP = 16 * 1024 * 1024  # a child's message (an inspection: a few KB)
READ_CAP = 16 * 1024 * 1024  # bytes one read asks for (the readers ask for 8 MiB at most)
# How soon an inspection running as the API stops ends (InspectionRunner.stop).
STOP_POLL_SECONDS = 0.25
# The parts of the job sandbox an inspection child gets (no PID namespace: it starts
# no process, RLIMIT_NPROC), and what is lost without each.
SANDBOX_FEATURES = {
    "network_namespace": "inspected files are parsed with the network and this host's services",
    "mount_namespace": "inspected files are parsed where the data dir and the secrets are readable",
    "own_uid": "inspected files are parsed as the API's user",
    "private_proc": "inspected files are parsed where every process's command line is visible",
    "syscall_filter": "inspected files are parsed without the seccomp filter",
}


@dataclass(frozen=True, slots=True)
class InspectionBudget:
    cpu_seconds: int = 10
    wall_seconds: float = 30.0
    memory_mb: int = 1024
    concurrency: int = 2


class InspectionRunner:
    """Inspects stored bytes in budgeted, sandboxed children (see the module docstring).

    ``hidden_paths``: more paths the children must not see (pass the data dir).
    ``sandbox``: False runs them with rlimits only (a warning says so).
    """

    def __init__(
        self,
        budget: InspectionBudget,
        *,
        hidden_paths: Sequence[str | Path] = (),
        sandbox: bool = True,
    ) -> None:
        self.budget = budget
        self._slots = threading.BoundedSemaphore(budget.concurrency)
        self._config = _sandbox_config(hidden_paths, enabled=sandbox)
        self._stopped = threading.Event()

    def stop(self) -> None:
        """The API is stopping: the inspections running end (their children killed)
        within :data:`STOP_POLL_SECONDS`, and those that start after are refused, with
        :class:`~hypermedia.errors.ServiceUnavailable` (their uploads answer 503 and
        delete their blobs). An inspection may take ``wall_seconds`` (30 s): the API's
        stop would wait that long, then be cut by uvicorn (a 500, and the blob left
        without its object row when the process ended under the inspection)."""
        self._stopped.set()

    def _refuse_if_stopped(self) -> None:
        if self._stopped.is_set():
            raise ServiceUnavailable("the API is stopping: upload again later")

    @property
    def capabilities(self) -> dict[str, Any]:
        """What the sandbox of the inspection children has (starting the server)."""
        server = _acquire(self._config)
        try:
            return dict(server.capabilities)
        finally:
            _release(server)

    def inspect(self, storage: Storage, key: str, size: int) -> Inspection:
        self._refuse_if_stopped()
        with self._slots:
            self._refuse_if_stopped()
            server = _acquire(self._config)
            try:
                return self._run(server, storage, key, size)
            finally:
                _release(server)

    def _run(self, server: _Server, storage: Storage, key: str, size: int) -> Inspection:
        budget = self.budget
        path = str(storage.path(key)) if isinstance(storage, LocalStorage) else None
        channel, status = server.open()
        watched = [channel, status]
        pid: int | None = None
        deadline = time.monotonic() + budget.wall_seconds
        try:
            if not _tell(
                channel, _encode(["inspect", path, size, budget.cpu_seconds, budget.memory_mb])
            ):
                watched.remove(channel)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stopped.is_set():
                    if pid is not None:
                        with suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                    self._refuse_if_stopped()
                    raise self._limit(key, f"took longer than {budget.wall_seconds:g} s")
                ready = wait(watched, min(remaining, STOP_POLL_SECONDS))
                if not ready:
                    continue
                if channel in ready:  # first: a child's answer comes before its exit
                    try:
                        message = _from_child(channel)
                    except EOFError:  # it has ended: its exit status follows
                        watched.remove(channel)
                        continue
                    except _NoMessage as exc:
                        if pid is not None:
                            with suppress(ProcessLookupError):
                                os.kill(pid, signal.SIGKILL)
                        raise self._garbled(key, str(exc)) from None
                    kind = message[0]
                    if kind == "read":
                        offset = message[1]
                        length = min(message[2], READ_CAP, max(size - offset, 0))
                        data = storage.read_range(key, offset, length) if length else b""
                        if not _tell(channel, data):
                            watched.remove(channel)
                    elif kind == "done":
                        return Inspection.from_dict(message[1])
                    elif kind == "memory":
                        raise self._limit(key, f"needed more than {budget.memory_mb} MB")
                    else:
                        raise RuntimeError(f"inspecting {key!r} failed in its child: {message[1]}")
                    continue
                try:
                    kind, value = json.loads(status.recv_bytes())
                except EOFError:
                    raise ServiceUnavailable(
                        f"upload inspection is unavailable: its server went away inspecting {key!r}"
                    ) from None
                if kind == "pid":
                    pid = value
                else:
                    raise self._died(key, value)
        finally:
            channel.close()
            status.close()

    def _died(self, key: str, exit_code: int) -> Exception:
        if exit_code in (-signal.SIGXCPU, -signal.SIGKILL):
            return self._limit(key, f"needed more than {self.budget.cpu_seconds} s of CPU")
        if exit_code < 0:  # killed by a signal while it parsed: the file crashed it
            name = _signal_name(-exit_code)
            log.warning(
                "inspection of %s crashed: %s", key, name, extra={"action": "inspection_crashed"}
            )
            return InspectionCrashed(
                f"the file could not be inspected: it crashed the inspector ({name})",
                signal=name,
            )
        return RuntimeError(f"the inspection child for {key!r} died (exit code {exit_code})")

    def _garbled(self, key: str, what: str) -> InspectionCrashed:
        log.warning(
            "inspection of %s stopped: its child sent %s",
            key,
            what,
            extra={"action": "inspection_crashed"},
        )
        return InspectionCrashed(
            "the file could not be inspected: its inspector sent no message of the protocol"
        )

    def _limit(self, key: str, what: str) -> InspectionLimit:
        log.warning("inspection of %s stopped: %s", key, what, extra={"action": "inspection_limit"})
        return InspectionLimit(
            f"the file could not be inspected within the limits: it {what}",
            cpu_seconds=self.budget.cpu_seconds,
            wall_seconds=self.budget.wall_seconds,
            memory_mb=self.budget.memory_mb,
        )


class _NoMessage(Exception):
    """What a child sent is no message of the protocol (a parser exploit writing)."""


def _tell(channel: Connection, data: bytes) -> bool:
    """Send ``data`` to the child; False if it has ended (killed, a crash: its exit
    status follows on the status socket)."""
    try:
        channel.send_bytes(data)
    except ConnectionError:  # a broken pipe, a reset
        return False
    return True


def _encode(message: list[Any]) -> bytes:
    return json.dumps(message).encode()


def _from_child(channel: Connection) -> list[Any]:
    """The child's next message, checked: a list of the protocol's shapes, or
    :class:`_NoMessage` (EOFError: the channel was closed)."""
    try:
        message = json.loads(channel.recv_bytes(MESSAGE_CAP))
    except ConnectionError:  # it died with bytes of ours unread (a reset): it has ended
        raise EOFError from None
    except OSError as exc:  # over the cap: the rest of the stream is no frame either
        raise _NoMessage(f"a frame over {MESSAGE_CAP:,} bytes") from exc
    except (ValueError, RecursionError) as exc:
        raise _NoMessage(f"no JSON ({type(exc).__name__})") from exc
    if isinstance(message, list) and message:
        kind, values = message[0], message[1:]
        if kind == "read" and len(values) == 2 and all(_count(v) for v in values):
            return message
        if kind == "done" and len(values) == 1 and _inspection(values[0]):
            return message
        if kind == "memory" and not values:
            return message
        if kind == "error" and len(values) == 1 and isinstance(values[0], str):
            return message
    raise _NoMessage(f"an unknown message ({str(message)[:100]!r})")


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _inspection(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("kind"), str)
        and isinstance(value.get("mime"), str)
        and isinstance(value.get("details", {}), dict)
    )


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _sandbox_config(hidden_paths: Sequence[str | Path], *, enabled: bool) -> dict[str, Any]:
    """What the server builds its sandbox from: the API's secret files (the server's
    environment names none), the caller's hidden paths, the API's working directory."""
    try:
        also_cover = [os.getcwd()]
    except OSError:  # removed meanwhile: nothing there to hide
        also_cover = []
    hidden = [*isolation.DEFAULT_HIDDEN, *secret_files(os.environ), *map(str, hidden_paths)]
    return {"enabled": enabled, "hidden": hidden, "also_cover": also_cover}


# -- the API's side of the server ----------------------------------------------------------


class _Server:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.users = 0  # inspections running on it
        self.retired = False  # another runner's config replaced it: closed when unused
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        environment = {k: v for k, v in os.environ.items() if k in _ENVIRONMENT}
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hypermedia.ingest.inspection",
                str(theirs.fileno()),
                json.dumps(config),
            ],
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
        self.view: dict[str, Any] = {}  # the sandbox's plan and exposes (_ready)
        self.capabilities = self._ready()

    def _ready(self) -> dict[str, Any]:
        """The server's capabilities, once it is ready; its sandbox's gaps logged."""
        data = b""
        self.control.settimeout(STARTUP_TIMEOUT)
        try:
            while not data.endswith(b"\n"):
                chunk = self.control.recv(65536)
                if not chunk:
                    break
                data += chunk
        except OSError as exc:
            self.close()
            raise ServiceUnavailable(
                f"upload inspection is unavailable: its server did not start: {exc}"
            ) from None
        self.control.settimeout(None)
        try:
            ready = json.loads(data)
            capabilities, self.view = ready["capabilities"], ready["view"]
        except (ValueError, KeyError, TypeError):
            self.close()
            # It ended before it said it was ready (killed: the API stopping, the OOM
            # killer): the upload is refused as the other outages are (503, not 500).
            raise ServiceUnavailable(
                "upload inspection is unavailable: its server ended as it started"
            ) from None
        if not self.config["enabled"]:
            log.warning(
                "upload inspection: the sandbox is switched off: files are parsed with"
                " rlimits only",
                extra={"action": "sandbox_degraded", "feature": "all"},
            )
            return dict(capabilities)
        for feature, reason in (capabilities.get("missing") or {}).items():
            if feature in SANDBOX_FEATURES:
                log.warning(
                    "upload inspection: no %s (%s): %s",
                    feature.replace("_", " "),
                    reason,
                    SANDBOX_FEATURES[feature],
                    extra={"action": "sandbox_degraded", "feature": feature},
                )
        return dict(capabilities)

    def alive(self) -> bool:
        return self.process.poll() is None

    def serves(self, config: dict[str, Any]) -> bool:
        """Whether this server's children parse as a server started for ``config`` would:
        the same config but for hidden paths that hiding or not changes nothing of its
        view (inside a cover, no code exposed in them: a data dir under /tmp). An API
        process whose runners differ only so (a test's data dir each) starts one server,
        not one a runner (~0.14 CPU-s and 0.4 s each, measured)."""
        if config == self.config:
            return True
        if {**config, "hidden": None} != {**self.config, "hidden": None}:
            return False
        if not all(isinstance(c["hidden"], list) for c in (config, self.config)):
            return False  # no config of _sandbox_config's
        ours = {os.path.realpath(p) for p in self.config["hidden"]}
        theirs = {os.path.realpath(p) for p in config["hidden"]}
        plan = [isolation.Mount(kind, path) for kind, path in self.view.get("plan", [])]
        exposes = self.view.get("exposes", [])
        return all(isolation.out_of_sight(plan, exposes, path) for path in ours ^ theirs)

    def open(self) -> tuple[Connection, Connection]:
        """A channel to a new child of the server, and the server's status of it."""
        mine, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        status, server = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with self._lock:
                socket.send_fds(self.control, [b"i"], [child.fileno(), server.fileno()])
        finally:
            child.close()
            server.close()
        return Connection(mine.detach()), Connection(status.detach())

    def close(self) -> None:
        self.control.close()  # the server exits on EOF
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


_current: _Server | None = None
_current_lock = threading.Lock()


def _acquire(config: dict[str, Any]) -> _Server:
    """The process's inspection server for ``config`` (:meth:`_Server.serves`), (re)started
    when needed; one for another config (a data dir it does not hide already) is closed
    once nothing runs on it."""
    global _current
    with _current_lock:
        if _current is None or not _current.alive() or not _current.serves(config):
            old = _current
            if old is not None and not old.alive():
                log.warning("the inspection server died; starting another")
            _current = _Server(config)
            atexit.register(_current.close)
            if old is not None:
                old.retired = True
                if old.users == 0:
                    old.close()
        _current.users += 1
        return _current


def close_server() -> None:
    """Closes this process's inspection server now, as its exit would (a test session
    that looks for sandbox processes left running, at its end, while its process
    still runs)."""
    global _current
    with _current_lock:
        server, _current = _current, None
    if server is not None:
        server.close()


def _release(server: _Server) -> None:
    with _current_lock:
        server.users -= 1
        if server.retired and server.users == 0:
            server.close()


# -- the server and its children ---------------------------------------------------------------


def sweep_work_roots(directory: str | None = None) -> list[str]:
    """Remove from ``directory`` (default: the temporary directory) the work roots that
    servers gone without removing theirs left (see the module docstring); the removed.
    Only this user's, each named for a pid no process has and with its ``owner.lock``
    free: a root without a lock (its server killed as it made it, or an older server's,
    named for no pid) is left."""
    removed = []
    for entry in os.scandir(directory or tempfile.gettempdir()):
        owner = _owner_pid(entry.name)
        if owner is None or _alive(owner):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            if entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            lock = os.open(
                os.path.join(entry.path, OWNER_LOCK), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
            )
        except OSError:  # gone meanwhile, no lock in it, not ours to open
            continue
        try:
            # Held: its server runs (a pid of another PID namespace's, or one reused).
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(lock)
            continue
        try:
            shutil.rmtree(entry.path, ignore_errors=True)
        finally:
            os.close(lock)
        removed.append(entry.path)
    return removed


def _owner_pid(name: str) -> int | None:
    pid, dash, _letters = name.removeprefix(WORK_ROOT_PREFIX).partition("-")
    if name.startswith(WORK_ROOT_PREFIX) and dash and pid.isdigit() and pid.isascii():
        return int(pid)
    return None


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs: a zombie does not (a server killed with its API waits to be
    reaped by init, which may take seconds: ~2 s measured)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rpartition(b")")[2].split()[:1]
    except OSError:  # gone meanwhile, or /proc hides it: its lock still tells
        return True
    return state not in ([b"Z"], [b"X"])


def _make_work_root() -> tuple[str, int]:
    """A new work root named for this server's pid, and its ``owner.lock``, locked for as
    long as the descriptor returned stays open (the server's life: the children close
    it as they start)."""
    work_root = tempfile.mkdtemp(prefix=f"{WORK_ROOT_PREFIX}{os.getpid()}-")
    try:
        lock = os.open(
            os.path.join(work_root, OWNER_LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
        )
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: no one holds it
    except BaseException:
        shutil.rmtree(work_root, ignore_errors=True)
        raise
    return work_root, lock


def _start_sandbox(config: dict[str, Any]) -> tuple[isolation.Isolation, str]:
    """The jobs' sandbox for this server's children, and the (empty but for its lock)
    work root it needs for its jobs cover (removed when the server ends; the roots of
    servers killed before they could remove theirs are swept first)."""
    sweep_work_roots()
    work_root, _lock = _make_work_root()  # held until the server's process ends
    try:
        # As a worker's work root: a job uid can pass through (not list) it without a view.
        os.chmod(work_root, 0o711)  # noqa: S103
        jobs_root = os.path.join(work_root, "jobs")
        os.mkdir(jobs_root, 0o711)
        code = isolation.code_paths(list(sys.modules.values()), also_cover=config["also_cover"])
        settings = isolation.Settings(
            enabled=bool(config["enabled"]),
            work_root=work_root,
            jobs_root=jobs_root,
            hidden=tuple(config["hidden"]),
            exposed=code.exposes,
            covered=(*isolation.DEFAULT_COVERED, *code.covers),
            pid_init="copy",  # no PID namespaces here: no tiny inits to start
        )
        return isolation.Isolation.start(settings, os.fork), work_root
    except BaseException:  # a server that cannot start leaves no work root behind
        shutil.rmtree(work_root, ignore_errors=True)
        raise


def serve(control_fd: int, config: dict[str, Any]) -> None:
    """Fork one child per channel received on ``control_fd`` (each with a uid of the
    sandbox's block: a channel waits while none is free); report each child's pid and
    exit code on its status socket; return when the control socket closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ends with its control socket only
    inspect_source(BytesSource(b"%PDF-1.4\n"))  # warm: libmagic and the readers loaded
    control = socket.socket(fileno=control_fd)
    sandbox, work_root = _start_sandbox(config)
    children: dict[int, tuple[Connection, int]] = {}  # pid -> (its status, its uid)
    try:
        capabilities = sandbox.capabilities()
        ready = {f: capabilities[f] for f in (*SANDBOX_FEATURES, "uid_range")}
        ready["missing"] = {f: r for f, r in sandbox.missing.items() if f in SANDBOX_FEATURES}
        # Its view (what hiding one more path would change: see _Server.serves).
        view = {
            "plan": [[step.kind, step.path] for step in sandbox.plan],
            "exposes": list(sandbox.settings.exposed),
        }
        control.sendall(json.dumps({"capabilities": ready, "view": view}).encode() + b"\n")
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        selector = selectors.DefaultSelector()
        selector.register(control, selectors.EVENT_READ)
        selector.register(wake_r, selectors.EVENT_READ)
        waiting: list[tuple[int, int]] = []  # (a channel's fd, its status's fd)
        free_uids = list(sandbox.uids)
        server = os.getpid()
        while True:
            for key, _ in selector.select():
                if key.fileobj is control:
                    message, fds, _flags, _address = socket.recv_fds(control, 16, 2)
                    if not message:
                        return
                    waiting.extend(zip(fds[::2], fds[1::2], strict=True))
                else:
                    with suppress(BlockingIOError):
                        os.read(wake_r, 4096)
            _reap(children, free_uids)
            while waiting and (free_uids or not sandbox.own_uid):
                fd, status_fd = waiting.pop(0)
                uid = heapq.heappop(free_uids) if sandbox.own_uid else 0
                network = sandbox.network_namespace_of(uid) if uid else None
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    control.close()
                    _child_main(fd, sandbox, uid, network, server)
                os.close(fd)  # the child's and the API's alone from here
                status = Connection(status_fd)
                with suppress(OSError):  # the API may have stopped listening
                    status.send_bytes(_encode(["pid", pid]))
                children[pid] = (status, uid)
    finally:
        # The API has gone (or this server fails): an inspection no one waits for
        # ends now, not when its parse does (up to its CPU budget), re-parented to init.
        _end_children(children)
        sandbox.close()
        shutil.rmtree(work_root, ignore_errors=True)


def _end_children(children: dict[int, tuple[Connection, int]]) -> None:
    """Kill the children still running and reap them."""
    for pid in children:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid, (status, _uid) in children.items():
        with suppress(ChildProcessError):
            os.waitpid(pid, 0)
        status.close()
    children.clear()


def _reap(children: dict[int, tuple[Connection, int]], free_uids: list[int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid not in children:
            continue
        channel, uid = children.pop(pid)
        if uid:  # RLIMIT_NPROC = 1: it started no process, none of its uid is left
            heapq.heappush(free_uids, uid)
        with suppress(OSError):  # the API may have stopped listening: nothing to tell
            channel.send_bytes(_encode(["exit", os.waitstatus_to_exitcode(status)]))
        channel.close()


def _child_main(
    fd: int, sandbox: isolation.Isolation, uid: int, network: int | None, server: int
) -> None:
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    code = 0
    try:
        _die_with(server)  # a server SIGKILLed (the OOM killer) has no finally
        # Every descriptor but stdio, the channel and what the sandbox needs (the
        # template view, the uid's network namespace): none of the server's others.
        low = 3
        for keep in sorted({k for k in (fd, network, sandbox.template) if k is not None}):
            os.closerange(low, keep)
            low = keep + 1
        os.closerange(low, max(os.sysconf("SC_OPEN_MAX"), 1024))
        _child(Connection(fd), sandbox, uid, network, server)
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def _die_with(server: int) -> None:
    """SIGKILL when the server dies (PDEATHSIG); gone already if it died first."""
    prctl(PR_SET_PDEATHSIG, SIGKILL)
    if os.getppid() != server:
        os._exit(0)


def _child(
    conn: Connection, sandbox: isolation.Isolation, uid: int, network: int | None, server: int
) -> None:
    _, path, size, cpu_seconds, memory_mb = json.loads(conn.recv_bytes())

    def send(*message: Any) -> None:
        conn.send_bytes(_encode(list(message)))

    def read_at(offset: int, length: int) -> bytes:
        send("read", offset, length)
        return conn.recv_bytes()

    source: Source
    try:
        # Opened before the view hides it (it lies in the data dir).
        source = FileSource(Path(path)) if path is not None else CallbackSource(size, read_at)
    except Exception as exc:
        send("error", f"{type(exc).__name__}: {exc}")
        return
    try:
        _isolate(sandbox, uid, network, cpu_seconds, server)
    except BaseException as exc:
        send("error", f"the inspection sandbox could not be built: {exc}")
        return
    memory = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    try:
        inspection = inspect_source(source)
    except MemoryError:
        send("memory")
        return
    except Exception as exc:
        send("error", f"{type(exc).__name__}: {exc}")
        return
    send("done", inspection.to_dict())


def _isolate(
    sandbox: isolation.Isolation, uid: int, network: int | None, cpu: int, server: int
) -> None:
    """The job sandbox, as a spare and its job build it (:mod:`hypermedia.sandbox.child`),
    with no workdir: namespaces and the view, the uid, the limits (but memory's: the
    parse's alone), then the syscall filter, last (what is watched for: a test saw the
    filter on before RLIMIT_NPROC)."""
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    jobs_fd = sandbox.prepare()
    sandbox.enter(jobs_fd, None, uid, network)
    if uid:  # a change of uid cleared PDEATHSIG
        _die_with(server)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    if uid:  # counts this uid's processes and threads: this one only
        resource.setrlimit(resource.RLIMIT_NPROC, (1, 1))
    sandbox.filter_syscalls()


if __name__ == "__main__":
    serve(int(sys.argv[1]), json.loads(sys.argv[2]))
