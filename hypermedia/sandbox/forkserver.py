"""The warm fork server: a helper process that forks one fresh child per job.

:class:`~hypermedia.sandbox.executor.ChildExecutor` starts it once (a fresh
interpreter, a scrubbed environment, a session of its own). It imports the
pipeline modules once, freezes the garbage collector's view of them (so a child
doesn't copy those pages just to scan them), and then, single-threaded, keeps a
few *spares* (children forked ahead of time, waiting for a job), hands each job
to one, enforces each job's wall clock, reaps children and reports how each
ended. A spare serves exactly one job, so every job still starts from a fresh
copy of the server. The server never reads a job's request or result: the child
reads the one, the executor the other (:mod:`hypermedia.sandbox.outcome`).

Wire protocol, all ``AF_UNIX``/``SOCK_SEQPACKET``::

    control socket (one per server)
        server -> executor  {"op": "ready", "pid": int, ...}   JSON, once preloaded
                            {"op": "failed", "error": str}     preload failed; exits
        executor -> server  REQUEST header (wall clock), then the job's request for
                            the child: a marshal'ed dict (operation, input_path,
                            params, workdir, rlimits [[name, soft, hard], ...])
                            + SCM_RIGHTS: [server's end of the reply socket,
                                           child's end of the result socket]
        EOF                 the executor closed or died: kill every job, reap, exit

    channel (one per spare, server -> spare): the request and the result socket

    reply socket (one per job, server <-> executor)
        server -> executor  STARTED (pid), then EXITED (how the child ended),
                            or FAILED + text (could not fork)
        executor -> server  CANCEL: kill the job (killed_for "cancelled")
        EOF                 nobody waits any more: kill the job ("abandoned")

    result socket (one per job, child -> executor): one message, at most
    RESULT_CAP bytes, JSON, written just before the child exits
        {"outputs": [{"output_type", "path", "content_type"}, ...]}
        {"error": {"code", "message", "retryable", "detail"}}

The request is marshal, not JSON, because it only travels from the executor to a
child of the same interpreter and ``marshal.loads`` costs a fresh child half the
page faults of ``json.loads``; whatever comes back from a child is JSON. The
child cannot write on the reply socket, so it cannot forge how it ended; no
listening socket exists, so it cannot ask the server for more children.

A spare: new session (its pid is its process group), ``PDEATHSIG`` = SIGKILL, no
new privileges, stdin ``/dev/null``, every descriptor but its channel closed.
Given a job: stdout/stderr appended to ``<workdir>/.child.log``,
cwd/``HOME``/``TMPDIR`` = the workdir, rlimits applied last, then
``pipelines.registry.get(operation)(input, params, workdir)``.

Cheap children. A fork costs what the kernel spends copying and tearing down page
tables and what each side pays in copy-on-write faults for every page it writes
afterwards (CPython writes reference counts all over its heap; ~3 us a fault on a
virtual machine). So: forks happen ahead of time, in spares, when the server is
idle and in runs (each page the server writes after a fork is copied once per run
instead of once per job); a spare does not pre-touch the job's path (that moved
~140 faults off the job's clock but cost ~200 more, and CPU is what bounds a busy
worker); the server forks with libc's ``fork()`` (the GIL held; C-level
``pthread_atfork`` handlers still run), because Python's ``os.fork()`` hooks cost a
child ~170 more faults, and re-seeds ``random`` itself; it keeps no Python signal
handlers (a pidfd per child says when it exits) and its per-job work small (binary
headers, no parsing). Raw fork is sound only in a single-threaded process: if a
preloaded module started a thread, the server uses ``os.fork()``. Preloaded
modules must not rely on Python-level ``os.register_at_fork`` hooks.

What jobs leave behind. The server is a child subreaper: processes a job leaves
are re-parented to it, not to init. When a job's child exits its process group is
killed; a process that left the group (``setsid``) and lost its parent is killed by
a sweep of ``/proc`` (at most once a second, and on shutdown). Out of reach until
the sandbox hardening (PID namespace or cgroup per job): a process that leaves its
group while its parent outlives the job, and a job's group when the server itself
is killed with SIGKILL (its direct child dies of ``PDEATHSIG``).

Where the sandbox hardening goes: in :func:`_spare`, before the job arrives (off
its clock): namespaces (network: no interfaces; PID: the job's processes die with
it), a uid of the job's own (then ``Limits.rlimits(own_uid=True)`` adds
``RLIMIT_NPROC``); the seccomp filter last in :func:`_run_step`, after the rlimits.
"""

from __future__ import annotations

import ctypes
import errno
import gc
import heapq
import importlib
import json
import marshal
import os
import resource
import select
import socket
import struct
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any, NoReturn

RESULT_CAP = 64 * 1024  # a child's result: ~400 outputs
MESSAGE_CAP = 256 * 1024  # any message on the control socket
CHILD_LOG = ".child.log"
SWEEP_INTERVAL = 1.0
RESULT_FD = 3
DEFAULT_SPARES = 4

# Binary messages: a kind byte, then fixed fields.
REQUEST = struct.Struct("<d")  # wall clock seconds; the marshal'ed request follows
STARTED = struct.Struct("<ci")  # b"S", pid
EXITED = struct.Struct("<ciiicIqd")  # b"X", pid, exit code, signal, killed_for,
#                                      duration ms, max RSS kB, CPU seconds
CANCEL = b"C"
FAILED = b"F"  # followed by the error text
KILLED_FOR = {None: b"-", "timeout": b"t", "cancelled": b"c", "shutdown": b"s", "abandoned": b"a"}
KILLED_FOR_NAMES = {code: name for name, code in KILLED_FOR.items()}

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NO_NEW_PRIVS = 38
_SIGKILL = 9

_libc = ctypes.CDLL(None, use_errno=True)
_prctl_function = _libc.prctl
_prctl_function.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
_prctl_function.restype = ctypes.c_int
_raw_fork = ctypes.PyDLL(None, use_errno=True).fork  # PyDLL: the GIL stays held
_raw_fork.argtypes = []
_raw_fork.restype = ctypes.c_int


def _prctl(option: int, value: int) -> None:
    if _prctl_function(option, value, 0, 0, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _fork_without_hooks() -> int:
    pid: int = _raw_fork()
    if pid < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return pid


# -- the child ------------------------------------------------------------------------


def _error(code: str, message: str, *, retryable: bool = False, detail: str = "") -> bytes:
    body = {"code": code, "message": message, "retryable": retryable, "detail": detail}
    return json.dumps({"error": body}).encode()


# Built once in the server: reporting a MemoryError must not need memory.
_OUT_OF_MEMORY = _error("memory_limit", "the job ran out of memory (RLIMIT_AS)")
_TOO_LARGE = _error("output_limit", "an output file outgrew the limit (RLIMIT_FSIZE)")
_TOO_MANY = _error("process_limit", "the job could not start a process or thread (RLIMIT_NPROC)")


def _errno_in_chain(exc: BaseException | None, code: int) -> bool:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno == code:
            return True
        if isinstance(exc, MemoryError) and code == errno.ENOMEM:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _no_new_thread(exc: BaseException) -> bool:
    """``threading`` reports a failed ``pthread_create`` (EAGAIN) without its errno."""
    return isinstance(exc, RuntimeError) and str(exc) == "can't start new thread"


def _outputs_payload(outputs: object) -> bytes:
    if not isinstance(outputs, list):
        raise TypeError(f"step returned {type(outputs).__name__}, not a list of Output")
    items = []
    for output in outputs:
        output_type = getattr(output, "output_type", None)
        content_type = getattr(output, "content_type", None)
        path = getattr(output, "path", None)
        if not (
            isinstance(output_type, str)
            and isinstance(content_type, str)
            and isinstance(path, str | os.PathLike)
        ):
            raise TypeError(f"step returned {output!r}, not an Output")
        items.append(
            {"output_type": output_type, "path": os.fspath(path), "content_type": content_type}
        )
    payload = json.dumps({"outputs": items}).encode()
    if len(payload) > RESULT_CAP:
        raise ValueError(f"{len(items)} outputs: more than the {RESULT_CAP} byte result allows")
    return payload


def _run_step(request: Mapping[str, Any]) -> bytes:
    """Apply the rlimits, run the step; the result as bytes, whatever happens."""
    from pipelines import registry

    try:
        for name, soft, hard in request["rlimits"]:
            resource.setrlimit(getattr(resource, name), (soft, hard))
        step = registry.get(request["operation"])
        workdir = Path(request["workdir"])
        outputs = step(Path(request["input_path"]), request["params"], workdir)
        return _outputs_payload(outputs)
    except MemoryError:
        return _OUT_OF_MEMORY
    except registry.PipelineError as exc:
        try:
            return _error(exc.code, str(exc.message)[:1000], retryable=bool(exc.retryable))
        except MemoryError:
            return _OUT_OF_MEMORY
    except BaseException as exc:
        try:
            if _errno_in_chain(exc, errno.ENOMEM):
                return _OUT_OF_MEMORY
            if _errno_in_chain(exc, errno.EFBIG):
                return _TOO_LARGE
            if _errno_in_chain(exc, errno.EAGAIN) or _no_new_thread(exc):
                return _TOO_MANY
            detail = "".join(traceback.format_exception(exc))
            try:
                sys.stderr.write(detail)
                sys.stderr.flush()
            except Exception:  # noqa: S110 - the log may be at RLIMIT_FSIZE already
                pass
            message = f"{type(exc).__qualname__}: {exc}"
            return _error("pipeline_crashed", message[:1000], detail=detail[-4000:])
        except MemoryError:
            return _OUT_OF_MEMORY


def _spare(channel_fd: int, devnull: int, server_pid: int) -> NoReturn:
    """A forked child waiting for its job: becomes it, runs the step, reports, exits.

    Before the job: own session, PDEATHSIG, no new privileges, stdin ``/dev/null``,
    every descriptor but its channel to the server closed.
    """
    try:
        os.setsid()
        _prctl(_PR_SET_PDEATHSIG, _SIGKILL)
        if os.getppid() != server_pid:  # the server died before PDEATHSIG was set
            os._exit(0)
        _prctl(_PR_SET_NO_NEW_PRIVS, 1)
        os.dup2(devnull, 0)
        os.closerange(RESULT_FD, channel_fd)
        os.closerange(channel_fd + 1, max(os.sysconf("SC_OPEN_MAX"), 1024))
        channel = socket.socket(fileno=channel_fd)
        body, fds, _flags, _address = socket.recv_fds(channel, MESSAGE_CAP, 1)
        channel.close()
        if not body or len(fds) != 1:  # the server is done with us
            os._exit(0)
        request = marshal.loads(body)  # noqa: S302 - written by the executor, never a job
        _become_job(request["workdir"], fds[0])
    except BaseException:
        os._exit(71)  # EX_OSERR: reported as a crash without a result
    payload = _run_step(request)
    status = 0
    try:
        os.write(RESULT_FD, payload)
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        status = 1
    os._exit(status)


def _become_job(workdir: str, result_fd: int) -> None:
    if result_fd != RESULT_FD:
        os.dup2(result_fd, RESULT_FD, inheritable=False)
        os.close(result_fd)
    else:
        os.set_inheritable(RESULT_FD, False)  # descriptors from SCM_RIGHTS are inheritable
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    child_log = os.open(os.path.join(workdir, CHILD_LOG), flags, 0o600)
    os.dup2(child_log, 1)
    os.dup2(child_log, 2)
    os.close(child_log)
    os.chdir(workdir)
    os.environ["HOME"] = workdir
    os.environ["TMPDIR"] = workdir
    if "tempfile" in sys.modules:
        # Found again from TMPDIR on first use.
        sys.modules["tempfile"].tempdir = None  # type: ignore[attr-defined]
    if "random" in sys.modules:
        sys.modules["random"].seed()  # what os.fork()'s hook would have done


# -- the server -----------------------------------------------------------------------


class _Spare:
    __slots__ = ("channel", "pid", "pidfd")

    def __init__(self, pid: int, pidfd: int, channel: socket.socket) -> None:
        self.pid = pid
        self.pidfd = pidfd
        self.channel = channel


class _Job:
    __slots__ = ("deadline", "killed_for", "pid", "pidfd", "reply", "started")

    def __init__(self, pid: int, pidfd: int, reply: socket.socket, deadline: float) -> None:
        self.pid = pid
        self.pidfd = pidfd
        self.reply = reply
        self.started = time.monotonic()
        self.deadline = deadline
        self.killed_for: str | None = None


class _Server:
    def __init__(self, control: socket.socket, fork: Callable[[], int], spares: int) -> None:
        self.pid = os.getpid()
        self.control = control
        self.fork = fork
        self.spare_target = spares
        self.devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self.poll = select.epoll()
        self.control_fd = control.fileno()
        self.poll.register(self.control_fd, select.EPOLLIN)
        self.jobs: dict[int, _Job] = {}  # by pid
        self.by_fd: dict[int, _Job] = {}  # by pidfd and by reply socket fd
        self.spares: dict[int, _Spare] = {}  # by pid, in the order they were forked
        self.spare_fds: dict[int, _Spare] = {}  # by pidfd
        self.deadlines: list[tuple[float, int, _Job]] = []
        self.sequence = 0
        self.stopping = False
        self.last_sweep = 0.0
        self.sweep_due = False
        self.refilling = spares > 0

    def serve(self) -> None:
        while not (self.stopping and not self.jobs):
            refill = self._wants_spare()
            events = self.poll.poll(0 if refill else self._timeout())
            control = False
            for fd, _events in events:
                if fd == self.control_fd:
                    control = True  # after the exits: a spare that died is no candidate
                    continue
                job = self.by_fd.get(fd)
                if job is not None:
                    if fd == job.pidfd:
                        self._reap()
                    else:
                        self._on_reply(job)
                elif fd in self.spare_fds:
                    self._reap()
            if control:
                self._on_control()
            now = time.monotonic()
            while self.deadlines and self.deadlines[0][0] <= now:
                job = heapq.heappop(self.deadlines)[2]
                if self.jobs.get(job.pid) is job:  # not finished (its pid may be reused)
                    self._kill(job, "timeout")
            if self.sweep_due and now - self.last_sweep >= SWEEP_INTERVAL:
                self._sweep(now)
            if refill and not events:
                self._add_spare_quietly()
        self._sweep(time.monotonic(), everything=True)
        self._reap_remaining(deadline=time.monotonic() + 5)

    def _timeout(self) -> float:
        now = time.monotonic()
        waits = []
        if self.deadlines:
            waits.append(self.deadlines[0][0] - now)
        if self.sweep_due:
            waits.append(self.last_sweep + SWEEP_INTERVAL - now)
        return max(0.0, min(waits)) if waits else -1

    def _stop(self) -> None:
        if not self.stopping:
            self.stopping = True
            self.poll.unregister(self.control_fd)
            for spare in list(self.spares.values()):
                self._drop_spare(spare)
            for job in list(self.jobs.values()):
                self._kill(job, "shutdown")

    # -- spares

    def _wants_spare(self) -> bool:
        """Refill from half the target up to the target, one spare per idle turn.

        Idle: forks never delay a request, a job's exit or a cancel. Every page the
        server writes after a fork is copied (the spares still share it), once per
        fork before it: refilling in a run of forks with no job work between them
        makes the server pay that once per run instead of once per job.
        """
        if self.stopping or not self.spare_target:
            return False
        if len(self.spares) <= self.spare_target // 2:
            self.refilling = True
        elif len(self.spares) >= self.spare_target:
            self.refilling = False
        return self.refilling

    def _add_spare_quietly(self) -> None:
        try:
            self._add_spare()
        except OSError as exc:
            self.refilling = False  # again when the next job takes one
            print(f"fork server: cannot fork a spare: {exc}", file=sys.stderr, flush=True)

    def _add_spare(self) -> _Spare:
        channel, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            pid = self.fork()
        except OSError:
            channel.close()
            theirs.close()
            raise
        if pid == 0:
            _spare(theirs.fileno(), self.devnull, self.pid)
        theirs.close()
        spare = _Spare(pid, os.pidfd_open(pid), channel)
        self.spares[pid] = spare
        self.spare_fds[spare.pidfd] = spare
        self.poll.register(spare.pidfd, select.EPOLLIN)
        return spare

    def _drop_spare(self, spare: _Spare) -> None:
        """Forget a spare (it died, or we are stopping: closing its channel ends it)."""
        self.spares.pop(spare.pid, None)
        self.spare_fds.pop(spare.pidfd, None)
        with suppress(OSError):
            self.poll.unregister(spare.pidfd)
        os.close(spare.pidfd)
        spare.channel.close()

    def _take_spare(self) -> _Spare:
        if self.spares:
            spare = self.spares.pop(next(iter(self.spares)))
        else:
            spare = self._add_spare()
            del self.spares[spare.pid]
        del self.spare_fds[spare.pidfd]
        return spare

    # -- requests

    def _on_control(self) -> None:
        try:
            data, fds, _flags, _address = socket.recv_fds(self.control, MESSAGE_CAP, 2)
        except OSError:
            data, fds = b"", []
        if not data:
            for fd in fds:
                os.close(fd)
            self._stop()
            return
        if len(fds) != 2 or len(data) <= REQUEST.size:
            for fd in fds:
                os.close(fd)
            print("fork server: malformed control message", file=sys.stderr, flush=True)
            return
        reply = socket.socket(fileno=fds[0])
        result_fd = fds[1]
        (wall_clock,) = REQUEST.unpack_from(data)
        body = data[REQUEST.size :]
        spare = None
        error = ""
        for _attempt in range(2):  # a spare may have died without our noticing yet
            try:
                spare = self._take_spare()
            except OSError as exc:
                error = f"fork: {exc}"
                break
            try:
                socket.send_fds(spare.channel, [body], [result_fd])
                break
            except OSError as exc:
                error = f"spare {spare.pid}: {exc}"
                with suppress(OSError):
                    os.kill(spare.pid, _SIGKILL)
                self._drop_spare(spare)  # reaped later like any stray child
                spare = None
        os.close(result_fd)
        if spare is None:
            with suppress(OSError):
                reply.send(FAILED + error.encode(), socket.MSG_DONTWAIT)
            reply.close()
            return
        spare.channel.close()
        job = _Job(spare.pid, spare.pidfd, reply, time.monotonic() + wall_clock)
        self.jobs[job.pid] = job
        self.by_fd[job.pidfd] = job
        self.by_fd[reply.fileno()] = job
        self.poll.register(reply.fileno(), select.EPOLLIN)
        self.sequence += 1
        heapq.heappush(self.deadlines, (job.deadline, self.sequence, job))
        try:
            reply.send(STARTED.pack(b"S", job.pid), socket.MSG_DONTWAIT)
        except OSError:
            self._kill(job, "abandoned")

    def _on_reply(self, job: _Job) -> None:
        try:
            data = job.reply.recv(16, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            with suppress(OSError):  # EOF stays readable: don't spin on it
                self.poll.unregister(job.reply.fileno())
            self._kill(job, "abandoned")
        elif data == CANCEL:
            self._kill(job, "cancelled")

    # -- ending jobs

    def _kill(self, job: _Job, reason: str) -> None:
        if job.killed_for is None:
            job.killed_for = reason
        # The pid first: the child may not have called setsid() yet.
        with suppress(OSError):
            os.kill(job.pid, _SIGKILL)
        with suppress(OSError):
            os.killpg(job.pid, _SIGKILL)

    def _reap(self) -> None:
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            job = self.jobs.pop(pid, None)
            if job is not None:
                self._finish(job, status, usage)
            elif pid in self.spares:
                self._drop_spare(self.spares[pid])

    def _finish(self, job: _Job, status: int, usage: resource.struct_rusage) -> None:
        duration_ms = round((time.monotonic() - job.started) * 1000)
        with suppress(OSError):  # whatever the job left running in its group
            os.killpg(job.pid, _SIGKILL)
        report = EXITED.pack(
            b"X",
            job.pid,
            os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1,
            os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0,
            KILLED_FOR[job.killed_for],
            duration_ms,
            usage.ru_maxrss,
            usage.ru_utime + usage.ru_stime,
        )
        with suppress(OSError):
            job.reply.send(report, socket.MSG_DONTWAIT)
        # Unregister explicitly: a child forked meanwhile may hold copies of both
        # descriptors until it closes them, and closing ours would not remove them.
        for fd in (job.pidfd, job.reply.fileno()):
            del self.by_fd[fd]
            with suppress(OSError):
                self.poll.unregister(fd)
        os.close(job.pidfd)
        job.reply.close()
        self.sweep_due = True
        if len(self.deadlines) > 2 * len(self.jobs) + 64:
            # Finished jobs stay in the heap until their deadline; long timeouts at a
            # high rate would pile them up.
            live = self.jobs
            self.deadlines = [
                entry for entry in self.deadlines if live.get(entry[2].pid) is entry[2]
            ]
            heapq.heapify(self.deadlines)

    # -- what jobs leave behind

    def _sweep(self, now: float, *, everything: bool = False) -> None:
        """Kill re-parented processes that no running job's group holds."""
        self.last_sweep = now
        self.sweep_due = False
        keep = self.jobs.keys() | self.spares.keys()
        for pid, pgid in _children_of(self.pid):
            if everything or (pid not in keep and pgid not in keep):
                with suppress(OSError):
                    os.kill(pid, _SIGKILL)
        self._reap()

    def _reap_remaining(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            try:
                pid, _status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                time.sleep(0.01)


def _children_of(parent: int) -> list[tuple[int, int]]:
    """(pid, pgid) of every process whose parent is ``parent``, from ``/proc``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # After "(comm)": state ppid pgrp ...
        if int(fields[1]) == parent:
            found.append((int(name), int(fields[2])))
    return found


def main(config: Mapping[str, Any]) -> None:
    """Entry point of the server process (see the executor's bootstrap)."""
    control = socket.socket(fileno=int(config["control_fd"]))
    preload: Sequence[str] = config["preload"]
    try:
        for module in preload:
            importlib.import_module(module)
        from pipelines import registry

        registry.load_all()
    except BaseException as exc:
        error = f"preload: {type(exc).__name__}: {exc}"
        control.send(json.dumps({"op": "failed", "error": error}).encode())
        raise SystemExit(1) from None
    fork: Callable[[], int] = _fork_without_hooks
    if len(os.listdir("/proc/self/task")) > 1 or config.get("python_fork"):
        fork = os.fork
    gc.collect()
    gc.freeze()
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    server = _Server(control, fork, int(config.get("spares", DEFAULT_SPARES)))
    ready = {"op": "ready", "pid": os.getpid(), "fork": getattr(fork, "__name__", "")}
    control.send(json.dumps(ready).encode())
    server.serve()
