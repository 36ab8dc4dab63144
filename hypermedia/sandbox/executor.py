"""Run pipeline steps in child processes: :class:`ChildExecutor`.

One executor per worker (actor) process. It starts a warm fork server
(:mod:`hypermedia.sandbox.forkserver`) that has already imported the pipeline
modules and forks a fresh child per job, so a hostile file cannot poison the next
job and a crashing, hanging or greedy one cannot hurt the worker. The server keeps
``spares`` children forked ahead of time (each serves one job), so the fork is not
on the job's clock.

A job's files live in its workdir, ``<work_root>/jobs/<job_id>/``::

    ex = ChildExecutor(work_root)
    workdir = ex.prepare(job_id)                  # creates it, and workdir/input/
    download(..., workdir / "input" / name)       # the caller places the input
    try:
        result = ex.run(job_id, operation, workdir / "input" / name, params,
                        timeout_seconds=60, memory_limit_mb=1024)
        upload(result.outputs)                    # paths inside workdir
    except ChildFailed as exc:
        ...                                       # exc.code, exc.retryable
    finally:
        ex.cleanup(job_id)                        # after success or failure

``run(..., on_progress=callback)`` passes on the step's progress reports
(:mod:`pipelines.progress`), which the child sends on its result socket while it runs.

The input must be inside the workdir, and the caller names it (the worker uses
``input/source``): a user's file name never reaches a path or a command line. The
step's workdir is the job's workdir; the child's stdout/stderr go to
``<workdir>/.child.log``, whose last 64 KB (whole lines, the workdir's path shown as
``<workdir>``) a :class:`ChildFailed` carries as ``log``.

The sandbox (:mod:`hypermedia.sandbox.isolation`): each job has its own network
namespace (no interface up: nothing to connect to, not even 127.0.0.1) and mount
namespace, in which everything is read-only, the usual places of other people's
files are empty (``/tmp``, ``/run``, ``/root``, ``/home``, the work root, this
process's working directory and the ``sys.path`` directories that are not the
interpreter's, with only the interpreter and the loaded packages bound back), the
``hidden_paths`` (pass the worker's data directory) are empty whatever lies under
them, and the job's workdir is the
one writable directory; it runs under a uid of its own (never root), which owns
its workdir while it runs, with no capabilities. What the machine does not allow
is logged as a warning when the server starts and reported in :attr:`capabilities`
(:func:`sandbox_capabilities` asks without an executor); ``sandbox=False``
switches it all off (benchmarks).

Limits (:mod:`hypermedia.sandbox.limits`): ``RLIMIT_AS`` = the memory limit,
``RLIMIT_CPU`` = the timeout, ``RLIMIT_FSIZE`` = ``max_output_bytes`` (10 GB
unless the caller says), ``RLIMIT_NOFILE``, ``RLIMIT_NPROC`` = ``max_processes``
(with a job uid: it counts that job's processes and threads only), no core files;
wall clock = timeout * 1.5, after which the job's whole process group is killed,
and every process of its uid before the job is reported. Failures raise
:class:`ChildFailed` (codes in :mod:`hypermedia.sandbox.outcome`).

Thread safety: ``run``, ``cancel``, ``child_pid``, ``prepare`` and ``cleanup`` may
be called from any number of threads at once (the actor's claim loops); each
``run`` has its own socket to the server. ``close`` kills what is running (those
``run`` calls raise ``child_killed``, retryable) and stops the server.

If the server dies, running jobs fail with ``sandbox_unavailable`` (retryable) and
the next ``run`` starts a new server.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import marshal
import math
import os
import re
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypermedia.sandbox import isolation, wire
from hypermedia.sandbox.limits import DEFAULT_MAX_OUTPUT_BYTES, DEFAULT_MAX_PROCESSES, Limits
from hypermedia.sandbox.outcome import ChildFailed, ExitReport, interpret, validate_outputs
from hypermedia.sandbox.wire import MESSAGE_CAP, RESULT_CAP
from hypermedia.secret_files import secret_files
from pipelines.registry import Output

__all__ = [
    "INPUT_DIR",
    "ChildExecutor",
    "ChildFailed",
    "ChildResult",
    "StepProgress",
    "sandbox_capabilities",
]

log = logging.getLogger(__name__)

INPUT_DIR = "input"
STARTUP_TIMEOUT = 120.0  # importing the pipeline modules (pyvips, OCR models) on a cold node
REPLY_GRACE = 15.0  # past the wall clock, how long to wait for a server that should have killed
FAILURE_LOG_BYTES = 64 * 1024  # the end of a failed child's stdout/stderr, kept (ChildFailed.log)
PROGRESS_FORWARD_INTERVAL = 0.2  # seconds between the progress reports passed on, at least

# The fork server and every child get this environment, not the worker's (which may
# hold credentials): the variables below when set, nothing else.
INHERITED_ENV = ("PATH", "LANG", "LANGUAGE", "TZ", "SOURCE_DATE_EPOCH")
INHERITED_ENV_PREFIXES = ("LC_", "VIPS_", "OMP_", "MALLOC_")
# Each job's share of the node's CPUs (ChildExecutor's job_cpus), for the steps.
JOB_CPUS_ENV = "HYPERMEDIA_JOB_CPUS"

_CONSEQUENCES = {
    "network_namespace": "jobs can reach the network and this host's services",
    "mount_namespace": "jobs can write wherever their uid may and read the worker's files",
    "own_uid": "jobs run as the worker's user; no process limit (RLIMIT_NPROC)",
    "private_proc": "jobs can list every process on the machine and its command line",
    "syscall_filter": "jobs can call ptrace, unshare, bpf, userfaultfd and the like (no seccomp)",
    "pid_namespace": "jobs see the machine's pids (hidepid still hides other users' processes)",
}

_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")

_BOOTSTRAP = (
    "import json, sys; config = json.loads(sys.argv[1]); sys.path[:] = config['sys_path']; "
    "from hypermedia.sandbox.forkserver import main; main(config)"
)


@dataclass(frozen=True, slots=True)
class ChildResult:
    outputs: list[Output]  # paths inside the job's workdir
    duration_ms: int  # the child's life, fork to exit
    peak_memory_mb: float  # the child's peak RSS, pages shared with the server included


@dataclass(frozen=True, slots=True)
class StepProgress:
    """What a step reported of how far it is (:mod:`pipelines.progress`), checked."""

    done: float
    total: float | None
    unit: str

    @property
    def fraction(self) -> float | None:
        if not self.total:
            return None
        return max(0.0, min(1.0, self.done / self.total))


ProgressCallback = Callable[[StepProgress], None]
_UNIT = re.compile(r"[a-z][a-z_]{0,15}")


def _progress(data: bytes) -> StepProgress | None:
    """A PROGRESS message as the child sent it (anything: the job wrote it), or None."""
    try:
        body = json.loads(data)["progress"]
        done, total, unit = body["done"], body["total"], body["unit"]
    except (ValueError, KeyError, TypeError):
        return None
    numbers = (done,) if total is None else (done, total)
    if not all(isinstance(n, int | float) and math.isfinite(n) and n >= 0 for n in numbers):
        return None
    if not isinstance(unit, str) or not _UNIT.fullmatch(unit):
        return None
    return StepProgress(float(done), None if total is None else float(total), unit)


class _Results:
    """Our end of a job's result socket: the child's progress passed on (at most one
    per :data:`PROGRESS_FORWARD_INTERVAL`; one that comes sooner waits for the next
    turn, or the end, and is dropped if another comes first: a flood costs a receive
    each, no parsing), the last other message kept as its result."""

    __slots__ = ("forwarded", "on_progress", "pending", "result", "sock")

    def __init__(self, sock: socket.socket, on_progress: ProgressCallback | None) -> None:
        self.sock = sock
        self.on_progress = on_progress
        self.result = b""
        self.pending: bytes | None = None
        self.forwarded = 0.0

    def read(self, *, everything: bool = False) -> bool:
        """Read what is waiting (a bounded number of messages, unless ``everything``:
        the child is gone, so what is waiting is all there is, and the last progress
        is passed on). False at the end (the child's end closed)."""
        more = True
        for _ in itertools.count() if everything else range(64):
            try:
                data = self.sock.recv(RESULT_CAP + 1, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            except OSError:
                more = False
                break
            if not data:
                more = False
                break
            if data.startswith(b'{"progress"'):
                self.pending = data
            else:
                self.result = data
        if self.pending is not None and (
            everything or time.monotonic() - self.forwarded >= PROGRESS_FORWARD_INTERVAL
        ):
            self._pass_on()
        return more

    def _pass_on(self) -> None:
        data, self.pending = self.pending, None
        if self.on_progress is None or data is None:
            return
        progress = _progress(data)
        if progress is None:
            return
        self.forwarded = time.monotonic()
        try:
            self.on_progress(progress)
        except Exception:
            log.exception("a progress callback failed", extra={"action": "progress"})


class _Running:
    """A job between ``run`` entering and returning: our ends of its two sockets."""

    __slots__ = ("child_result", "pid", "reply", "result", "server_reply")

    def __init__(self) -> None:
        pair = socket.socketpair
        self.reply, self.server_reply = pair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.result, self.child_result = pair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.pid: int | None = None

    def close_theirs(self) -> None:
        self.server_reply.close()
        self.child_result.close()

    def close(self) -> None:
        for sock in (self.reply, self.result, self.server_reply, self.child_result):
            sock.close()


class _Server:
    """The fork server process and our end of its control socket."""

    def __init__(
        self,
        work_root: Path,
        preload: Sequence[str],
        spares: int,
        sandbox: Mapping[str, Any],
        job_cpus: int | None = None,
    ) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        config = {
            "sys_path": [os.path.abspath(p) for p in sys.path],
            "preload": list(preload),
            "control_fd": theirs.fileno(),
            "spares": spares,
            "sandbox": dict(sandbox),
        }
        env = {
            name: value
            for name, value in os.environ.items()
            if name in INHERITED_ENV or name.startswith(INHERITED_ENV_PREFIXES)
        }
        if job_cpus is not None:
            env[JOB_CPUS_ENV] = str(job_cpus)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-c", _BOOTSTRAP, json.dumps(config)],
                cwd=work_root,
                env=env,
                stdin=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,  # Ctrl-C at a terminal is not for the server
            )
        finally:
            theirs.close()
        self.control = ours
        try:
            ours.settimeout(STARTUP_TIMEOUT)
            data = ours.recv(MESSAGE_CAP)
            message = json.loads(data) if data else {"op": "failed", "error": "exited"}
        except (OSError, ValueError) as exc:
            message = {"op": "failed", "error": f"no answer ({exc})"}
        if message.get("op") != "ready":
            self.stop(timeout=1)
            raise ChildFailed(
                "sandbox_unavailable",
                f"the fork server did not start: {message.get('error')}",
                retryable=True,
            )
        ours.settimeout(None)
        self.pid = int(message["pid"])
        capabilities = message.get("capabilities")
        self.capabilities: dict[str, Any] = capabilities if isinstance(capabilities, dict) else {}

    def alive(self) -> bool:
        return self.process.poll() is None

    def exited(self, timeout: float) -> bool:
        """Whether the server process ends within ``timeout`` seconds (reaping it)."""
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def submit(self, message: bytes, running: _Running) -> None:
        fds = [running.server_reply.fileno(), running.child_result.fileno()]
        socket.send_fds(self.control, [message], fds)

    def stop(self, timeout: float) -> None:
        """Close the control socket (the server kills its jobs and exits); then wait."""
        self.control.close()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()  # the children die of PDEATHSIG
            self.process.wait()
        # A PID namespace's tiny init cloned just before the server was killed may have
        # missed its PDEATHSIG (:mod:`.tinyinit`): they never leave the server's group.
        with contextlib.suppress(OSError):
            os.killpg(self.process.pid, signal.SIGKILL)


class ChildExecutor:
    """Runs each job in a fresh child of a warm fork server (see the module docstring).

    ``preload``: modules the server imports before forking, besides
    ``pipelines.registry`` and every pipeline module it lists (always loaded).
    Tests add a module registering test operations. ``spares``: children forked
    ahead of time (0: fork on each request); about 1.5 MB of memory each.
    ``sandbox``: False runs jobs with rlimits only (a warning says so).
    ``hidden_paths``: more paths jobs must not see (the worker's data directory).
    ``uid_base``: the first uid of the job uid blocks (see :mod:`.isolation`).
    ``job_cpus``: each job's share of the node's CPUs, told to the steps as
    ``HYPERMEDIA_JOB_CPUS`` (the ocr step runs its inference on that many threads).
    """

    def __init__(
        self,
        work_root: Path,
        preload: Sequence[str] = ("pipelines.registry",),
        *,
        spares: int = wire.DEFAULT_SPARES,
        sandbox: bool = True,
        hidden_paths: Sequence[str | Path] = (),
        uid_base: int = isolation.UID_BASE,
        job_cpus: int | None = None,
    ) -> None:
        self._work_root = Path(work_root).resolve()
        self._job_cpus = job_cpus
        self._jobs_root = self._work_root / "jobs"
        self._jobs_root.mkdir(parents=True, exist_ok=True, mode=0o711)
        # Reachable (not listable) by job uids where no mount namespace re-exposes it.
        self._jobs_root.chmod(0o711)
        self._preload = tuple(preload)
        self._spares = spares
        self._sandbox = {
            "enabled": sandbox,
            "work_root": str(self._work_root),
            "jobs_root": str(self._jobs_root),
            # The files this process's environment names as holding secrets (the
            # settings file, the Ray token: anywhere, not only under a cover).
            "hidden": [
                *isolation.DEFAULT_HIDDEN,
                *secret_files(os.environ),
                *map(str, hidden_paths),
            ],
            "covered": list(isolation.DEFAULT_COVERED),
            # Where the worker was started (Ray: where the operator ran ``up``), and so
            # whatever lies there, is not for jobs, on sys.path or not.
            "also_cover": _working_directory(),
            "uid_base": uid_base,
            "pid_init": _pid_init(),
        }
        self._lock = threading.Lock()
        self._running: dict[str, _Running] = {}
        self._closed = False
        self._server: _Server | None = self._start_server()

    # -- workdirs

    @property
    def work_root(self) -> Path:
        return self._work_root

    def workdir(self, job_id: str) -> Path:
        """``<work_root>/jobs/<job_id>`` (not created)."""
        if not _JOB_ID.fullmatch(job_id):
            raise ValueError(f"job id {job_id!r} is not a safe directory name")
        return self._jobs_root / job_id

    def prepare(self, job_id: str) -> Path:
        """Create the job's workdir and its ``input/`` directory; the workdir."""
        workdir = self.workdir(job_id)
        (workdir / INPUT_DIR).mkdir(parents=True, exist_ok=True, mode=0o700)
        return workdir

    def cleanup(self, job_id: str) -> None:
        """Remove the job's workdir, whatever the job left in it."""
        workdir = self.workdir(job_id)
        if workdir.exists():
            shutil.rmtree(workdir, onerror=_make_writable_and_retry)

    # -- jobs

    def run(
        self,
        job_id: str,
        operation: str,
        input_path: Path,
        params: Mapping[str, Any],
        *,
        timeout_seconds: float,
        memory_limit_mb: int,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        max_processes: int = DEFAULT_MAX_PROCESSES,
        on_progress: ProgressCallback | None = None,
    ) -> ChildResult:
        """Run ``operation`` on ``input_path`` (inside the job's workdir) in a child.

        ``on_progress`` is called, on this thread, with the step's progress reports
        (:class:`StepProgress`; at most one per :data:`PROGRESS_FORWARD_INTERVAL`, and
        the last); whatever it raises is logged, never the job's failure.
        Raises :class:`ChildFailed`; ``ValueError`` for a bad call (unsafe job id,
        input outside the workdir, params that are not JSON, the job already running).
        """
        limits = Limits(
            timeout_seconds=timeout_seconds,
            memory_limit_mb=memory_limit_mb,
            max_output_bytes=max_output_bytes,
            max_processes=max_processes,
        )
        workdir = self.workdir(job_id)
        # The job may write max_output_bytes in one file (RLIMIT_FSIZE) and in all of
        # them, beside its input (the fork server measures the workdir).
        try:
            disk_budget = limits.max_output_bytes + Path(input_path).stat().st_size
        except OSError:
            disk_budget = limits.max_output_bytes
        if not workdir.is_dir():
            raise ValueError(f"no workdir for job {job_id!r}: call prepare() first")
        absolute_input = Path(os.path.normpath(Path(input_path).absolute()))
        if not absolute_input.is_relative_to(workdir):
            raise ValueError(f"input {input_path} is not inside the job's workdir {workdir}")
        request: dict[str, Any] = {
            "operation": operation,
            "input_path": str(absolute_input),
            "params": dict(params),
            "workdir": str(workdir),
            "rlimits": [],  # below, once the server (and whether jobs get a uid) is known
        }
        try:
            json.dumps(request["params"])  # the step contract: params are JSON
        except (TypeError, ValueError) as exc:
            raise ValueError(f"params are not JSON: {exc}") from None
        if len(marshal.dumps(request)) > MESSAGE_CAP // 2:
            raise ValueError("params too large")

        failure_log: str | None = None
        try:
            report, result = self._run_child(job_id, request, limits, disk_budget, on_progress)
            if report.signal is not None:
                failure_log = _log_tail(workdir)
            raw = interpret(
                report,
                result,
                cpu_seconds=limits.cpu_seconds,
                wall_clock_seconds=limits.wall_clock_seconds,
                memory_limit_mb=limits.memory_limit_mb,
                log_tail=failure_log or "",
            )
            outputs = validate_outputs(raw, workdir, max_output_bytes)
        except ChildFailed as exc:
            if failure_log is None:
                failure_log = _log_tail(workdir)
            exc.log = _shown(failure_log, workdir)
            raise
        return ChildResult(
            outputs=outputs,
            duration_ms=report.duration_ms,
            peak_memory_mb=round(report.maxrss_kb / 1024, 1),
        )

    def _run_child(
        self,
        job_id: str,
        request: dict[str, Any],
        limits: Limits,
        disk_budget: int,
        on_progress: ProgressCallback | None,
    ) -> tuple[ExitReport, bytes]:
        """Hand the request to the server and wait for the child's end: how it ended and
        the result it wrote (empty: none)."""
        for attempt in (1, 2):
            running = _Running()
            try:
                with self._lock:
                    if job_id in self._running:
                        raise ValueError(f"job {job_id!r} is already running")
                    server = self._live_server()
                    self._running[job_id] = running
                try:
                    own_uid = bool(server.capabilities.get("own_uid"))
                    request["rlimits"] = limits.rlimits(own_uid=own_uid)
                    body = marshal.dumps(request)
                    header = wire.REQUEST.pack(limits.wall_clock_seconds, disk_budget)
                    message = header + body
                    try:
                        server.submit(message, running)
                    except OSError as exc:
                        # The server died (its sockets close before it can be reaped):
                        # nothing started, so once more on a new one.
                        if attempt == 1 and server.exited(timeout=2):
                            continue
                        raise self._server_lost(server, f"submit failed: {exc}") from None
                    finally:
                        running.close_theirs()
                    reader = _Results(running.result, on_progress)
                    report = self._await(server, running, limits.wall_clock_seconds, reader)
                    reader.read(everything=True)  # the child is gone: what it left
                    return report, reader.result  # b"": none, it crashed or was killed
                finally:
                    with self._lock:  # cancel() sends on these sockets under the lock
                        del self._running[job_id]
                        running.close()
            finally:
                running.close()
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _await(
        self, server: _Server, running: _Running, wall_clock_seconds: float, reader: _Results
    ) -> ExitReport:
        """Read the server's messages on the job's reply socket until the child exited,
        and meanwhile the child's on the result socket (its progress: a child never
        blocks on a full socket)."""
        deadline = time.monotonic() + wall_clock_seconds + REPLY_GRACE
        reply, result = running.reply.fileno(), running.result.fileno()
        poller = select.poll()
        poller.register(reply, select.POLLIN)
        poller.register(result, select.POLLIN)
        while True:
            remaining = deadline - time.monotonic()
            events = poller.poll(max(0.0, remaining) * 1000) if remaining > 0 else []
            if not events and time.monotonic() >= deadline:
                # The server kills at the wall clock and then reports: it is stuck.
                raise self._server_lost(server, "no report past the wall clock", kill=True)
            if any(fd == result for fd, _ in events) and not reader.read():
                poller.unregister(result)  # the child's end is closed
            if not any(fd == reply for fd, _ in events):
                continue
            data = running.reply.recv(MESSAGE_CAP)
            kind = data[:1]
            if kind == b"S":
                _, running.pid = wire.STARTED.unpack(data)
            elif kind == b"X":
                _, pid, exit_code, signum, killed_for, duration_ms, maxrss_kb, cpu = (
                    wire.EXITED.unpack(data)
                )
                return ExitReport(
                    pid=pid,
                    exit_code=exit_code if exit_code >= 0 else None,
                    signal=signum or None,
                    killed_for=wire.KILLED_FOR_NAMES[killed_for],
                    duration_ms=duration_ms,
                    maxrss_kb=maxrss_kb,
                    cpu_seconds=cpu,
                )
            elif kind == wire.FAILED:
                error = data[1:].decode(errors="replace")
                raise ChildFailed("sandbox_unavailable", error, retryable=True)
            else:  # b"": EOF
                raise self._server_lost(server, "the fork server went away")

    def cancel(self, job_id: str) -> bool:
        """Kill the job's child now; its ``run`` raises ``cancelled``.

        False when the job is not running here (then there is nothing to kill).
        """
        with self._lock:
            running = self._running.get(job_id)
            if running is None:
                return False
            with contextlib.suppress(OSError):  # then the server sees EOF instead
                running.reply.send(wire.CANCEL, socket.MSG_DONTWAIT)
            return True

    def child_pid(self, job_id: str) -> int | None:
        """The pid of the job's running child (also its process group), if it has one."""
        with self._lock:
            running = self._running.get(job_id)
            return running.pid if running is not None else None

    def running(self) -> list[str]:
        with self._lock:
            return sorted(self._running)

    def job_processes(self) -> list[int]:
        """Live processes (not zombies) running under one of the jobs' uids, anywhere on
        the machine. Between jobs there are none: an operator's and the tests' leak check.
        Empty when jobs get no uid of their own (then the process group is the bound)."""
        uid_range = self.capabilities.get("uid_range")
        if not uid_range:
            return []
        first, last = uid_range
        found = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/status", encoding="ascii", errors="replace") as f:
                    status = dict(line.split(":", 1) for line in f if ":" in line)
            except OSError:
                continue  # gone meanwhile
            state = status.get("State", "X").split()[0]
            uid = int(status.get("Uid", "0").split()[0])
            if state not in ("Z", "X") and first <= uid <= last:
                found.append(int(entry.name))
        return sorted(found)

    def workdirs(self) -> list[str]:
        """Job workdirs that exist now (``prepare``d and not yet ``cleanup``ed)."""
        jobs = self._jobs_root
        return sorted(e.name for e in os.scandir(jobs)) if jobs.is_dir() else []

    @property
    def server_pid(self) -> int | None:
        server = self._server
        return server.pid if server is not None else None

    # -- the server

    def _live_server(self) -> _Server:
        """The server, started again if it died (call with the lock held)."""
        if self._closed:
            raise RuntimeError("the executor is closed")
        if self._server is None or not self._server.alive():
            if self._server is not None:
                log.warning(
                    "fork server %s exited (%s); starting another",
                    self._server.pid,
                    self._server.process.returncode,
                    extra={"action": "sandbox_restart"},
                )
                self._server.stop(timeout=1)
            self._server = None
            self._server = self._start_server()
        return self._server

    def _start_server(self) -> _Server:
        server = _Server(
            self._work_root, self._preload, self._spares, self._sandbox, self._job_cpus
        )
        if not self._sandbox["enabled"]:
            log.warning(
                "sandbox: switched off: jobs run with rlimits only",
                extra={"action": "sandbox_degraded", "feature": "all"},
            )
            return server
        missing = server.capabilities.get("missing") or {}
        for feature, reason in missing.items():
            log.warning(
                "sandbox: no %s for jobs (%s): %s",
                feature.replace("_", " "),
                reason,
                _CONSEQUENCES.get(feature, ""),
                extra={"action": "sandbox_degraded", "feature": feature},
            )
        return server

    @property
    def capabilities(self) -> dict[str, Any]:
        """What the sandbox of the running fork server has (see :mod:`.isolation`):
        ``network_namespace``, ``mount_namespace``, ``own_uid``, ``private_proc``,
        ``syscall_filter``, ``pid_namespace``, ``tiny_init`` (booleans: the last, whether
        the PID namespaces' inits are :mod:`.tinyinit`'s), ``uid_range``, and ``missing``:
        feature -> why not."""
        server = self._server
        return dict(server.capabilities) if server is not None else {}

    def _server_lost(self, server: _Server, why: str, *, kill: bool = False) -> ChildFailed:
        if kill:
            log.error("fork server %s stuck (%s): killing it", server.pid, why)
            server.process.kill()
        return ChildFailed("sandbox_unavailable", why, retryable=True)

    def close(self, timeout: float = 10.0) -> None:
        """Kill running jobs, stop the server, reap it. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            server, self._server = self._server, None
        if server is not None:
            server.stop(timeout)

    def __enter__(self) -> ChildExecutor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


PID_INIT_ENV = "HYPERMEDIA_SANDBOX_PID_INIT"
PID_INITS = ("tiny", "copy")


def _pid_init() -> str:
    """What inits the jobs' PID namespaces: ``tiny`` (the default,
    :mod:`.tinyinit`) or ``copy`` (each spare is its namespace's init, as on machines
    without the tiny init's code), from ``HYPERMEDIA_SANDBOX_PID_INIT`` (the CLI refuses
    another value before anything starts)."""
    value = os.environ.get(PID_INIT_ENV, "tiny")
    if value not in PID_INITS:
        raise ValueError(f"{PID_INIT_ENV}={value!r}: expected 'tiny' or 'copy'")
    return value


def _working_directory() -> list[str]:
    try:
        return [os.getcwd()]
    except OSError:  # removed meanwhile: nothing there to hide
        return []


def _log_tail(workdir: Path, size: int = FAILURE_LOG_BYTES) -> str:
    """The end of what a child printed (``.child.log``), whole lines: for telling how it
    died, and kept on its failed attempt. The job could have put anything there: a
    symlink or a FIFO is not read."""
    try:
        fd = os.open(workdir / wire.CHILD_LOG, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return ""
        start = max(0, info.st_size - size)
        data = os.pread(fd, size, start)
    except OSError:
        return ""
    finally:
        os.close(fd)
    if start and b"\n" in data:
        data = data.split(b"\n", 1)[1]  # the first line, cut
    return data.decode(errors="replace")


def _shown(tail: str, workdir: Path) -> str:
    """A failed child's log as its job's owner sees it: the workdir's path as
    ``<workdir>`` (the child sees none of the machine's other paths but the code it
    runs, and no secret), no NUL (PostgreSQL's text refuses it)."""
    return tail.replace(str(workdir), "<workdir>").replace("\x00", "")


def _make_writable_and_retry(function: Callable[..., Any], path: str, exc_info: Any) -> None:
    """rmtree's onerror: a job may leave directories without write permission."""
    parent = os.path.dirname(path)
    with contextlib.suppress(OSError):
        os.chmod(parent, stat.S_IRWXU)
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, stat.S_IRWXU)
    function(path)


def sandbox_capabilities(preload: Sequence[str] = ("pipelines.registry",)) -> dict[str, Any]:
    """What the sandbox can do on this machine, as this process's user: a fork server
    started in a temporary work root, probed, stopped (see :attr:`ChildExecutor.capabilities`)."""
    import tempfile

    with (
        tempfile.TemporaryDirectory(prefix="hm-sandbox-probe-") as work_root,
        ChildExecutor(Path(work_root), preload, spares=0) as executor,
    ):
        return executor.capabilities
