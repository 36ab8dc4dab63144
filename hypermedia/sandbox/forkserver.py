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
        executor -> server  REQUEST header (wall clock, disk budget), then the job's request for
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
new privileges, stdin ``/dev/null``, every descriptor but its channel closed, then
its sandbox built (:mod:`hypermedia.sandbox.isolation`: network and mount
namespaces, the read-only view), all before the job arrives, off its clock. Given
a job (the request and, from the server, the job's uid): the workdir bound in
read-write and ``chown``-ed, the uid taken (``PDEATHSIG`` set again: a uid change
clears it), stdout/stderr appended to ``<workdir>/.child.log``,
cwd/``HOME``/``TMPDIR`` = the workdir, the seccomp filter loaded
(:mod:`hypermedia.sandbox.syscalls`: after the mounts and the uid change, which it
would refuse), rlimits applied last (``RLIMIT_NPROC`` among them when the job has a
uid), then
``pipelines.registry.get(operation)(input, params, workdir)``. A spare that cannot
build its sandbox exits with :data:`~hypermedia.sandbox.outcome.SANDBOX_FAILED`
(a job given to it fails ``sandbox_unavailable``, retryable): a job never runs
with less than the server found possible at start.

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
killed. With job uids, every process the job left is the server's child or a
descendant of one, and has the job's uid (it cannot change it): the server reads
its own children (``/proc/<pid>/task/<pid>/children``) and, while any of them has
the job's uid, has the uid's processes killed (a killer child that takes the uid and
calls ``kill(-1, SIGKILL)``: :func:`~hypermedia.sandbox.isolation.kill_uids`) and
reaps them, zombies included (they count for ``RLIMIT_NPROC``). Only then is the
job reported and its uid free again: nothing of a job runs while its outputs are
checked and uploaded, nor when its uid serves the next one. A process that left
the group of a job still running is that job's until it ends. Without job uids,
a process that left the group and lost its parent is killed by a sweep (at most
once a second, and on shutdown). When the server itself is killed with SIGKILL its
direct children die of ``PDEATHSIG``; what they left runs until the next server
that claims the uid block kills the block's processes before its first job.

A PID namespace per job. The server forks each spare into a PID namespace of its
own (:meth:`~hypermedia.sandbox.isolation.Isolation.fork_spare`: ``unshare`` moves
only the children forked after it, and the server is put back at once), so the
spare is that namespace's pid 1, its *init*. The step must not be an init: the
kernel drops the signals an init sends itself and ``SIGXCPU`` unless it handles them
(measured: as pid 1 a step's ``kill(getpid(), SIGSEGV)`` does nothing,
``RLIMIT_CPU``'s soft limit does nothing, so only the hard limit's ``SIGKILL`` ends
it, and ``abort()`` ends in ``SIGSEGV``). So the init, first thing, before the job
arrives, forks the process that becomes the job and builds its sandbox (pid 2; one
more fork per job, off the job's clock while spares last; the init copies few pages
that way), reaps what is orphaned in the namespace, and when the job's process ends
sends the server its
wait status on the spare's channel and exits; the kernel then kills whatever is
left in the namespace, escaped processes included, and a killed server's jobs die
with their inits (``PDEATHSIG``). A job sees no other pid at all, and can signal
none: the pids of the machine do not exist in its namespace.
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

from hypermedia.sandbox.isolation import Isolation, Settings, code_paths, kill_uids
from hypermedia.sandbox.outcome import SANDBOX_FAILED

RESULT_CAP = 64 * 1024  # a child's result: ~400 outputs
MESSAGE_CAP = 256 * 1024  # any message on the control socket
CHILD_LOG = ".child.log"
SWEEP_INTERVAL = 1.0
DISK_INTERVAL = 0.25  # between measurements of running jobs' workdirs
DISK_MAX_ENTRIES = 100_000  # a workdir with more files than this is over its budget
KILLER_TIMEOUT = 2.0  # a killer not done by then was stopped by its targets: another one
KILLER_INTERVAL = 0.02  # between killers for one uid whose processes are still dying
RESULT_FD = 3
DEFAULT_SPARES = 4

# Binary messages: a kind byte, then fixed fields.
REQUEST = struct.Struct("<dq")  # wall clock seconds, disk budget bytes (0: none); the
#                                 marshal'ed request follows
UID = struct.Struct("<I")  # server -> spare: the job's uid (0: none); the request follows
STARTED = struct.Struct("<ci")  # b"S", pid
EXITED = struct.Struct("<ciiicIqd")  # b"X", pid, exit code, signal, killed_for,
#                                      duration ms, max RSS kB, CPU seconds
RELAYED = struct.Struct("<ci")  # init -> server, on the channel: b"R", the job's wait status
CANCEL = b"C"
FAILED = b"F"  # followed by the error text
KILLED_FOR = {
    None: b"-",
    "timeout": b"t",
    "disk": b"d",
    "cancelled": b"c",
    "shutdown": b"s",
    "abandoned": b"a",
}
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


def _spare(
    channel_fd: int, devnull: int, server_pid: int, sandbox: Isolation, fork: Callable[[], int]
) -> NoReturn:
    """A forked child waiting for its job: becomes it, runs the step, reports, exits.

    Before the job: own session, PDEATHSIG, no new privileges, stdin ``/dev/null``,
    every descriptor but its channel to the server closed, its namespaces and
    read-only view built (:meth:`Isolation.prepare`). When the job arrives: its
    workdir bound in, its uid taken (:meth:`Isolation.enter`), then the step. With
    PID namespaces the spare is its namespace's pid 1 and the job is the process it
    forks, once its namespaces are built (:func:`_be_init`).
    """
    try:
        os.setsid()
        _prctl(_PR_SET_PDEATHSIG, _SIGKILL)
        # The server died before PDEATHSIG was set? (A namespace's pid 1 has no parent
        # it can see: its channel then tells.)
        if (os.getppid() != server_pid) if not sandbox.pid_namespace else _hung_up(channel_fd):
            os._exit(0)
        _prctl(_PR_SET_NO_NEW_PRIVS, 1)
        os.dup2(devnull, 0)
        os.closerange(RESULT_FD, channel_fd)
        os.closerange(channel_fd + 1, max(os.sysconf("SC_OPEN_MAX"), 1024))
    except BaseException:
        os._exit(71)  # EX_OSERR: reported as a crash without a result
    parent = server_pid
    if sandbox.pid_namespace:
        # At once: the init writes (and so copies) as few of the server's pages as it
        # can; everything else happens in the process that becomes the job.
        _be_init(channel_fd, fork)
        parent = 1
    try:
        jobs_fd = sandbox.prepare()
    except BaseException as exc:
        _complain(f"a spare could not build its sandbox: {exc}")
        os._exit(SANDBOX_FAILED)
    try:
        channel = socket.socket(fileno=channel_fd)
        body, fds, _flags, _address = socket.recv_fds(channel, MESSAGE_CAP, 1)
        channel.close()
        if len(body) <= UID.size or len(fds) != 1:  # the server is done with us
            os._exit(0)
        (uid,) = UID.unpack_from(body)
        request = marshal.loads(body[UID.size :])  # noqa: S302 - from the executor, never a job
    except BaseException:
        os._exit(71)
    try:
        sandbox.enter(jobs_fd, request["workdir"], uid)
        if uid:  # a change of uid cleared PDEATHSIG
            _prctl(_PR_SET_PDEATHSIG, _SIGKILL)
            if os.getppid() != parent:
                os._exit(0)
    except BaseException as exc:
        _complain(f"a child could not enter its sandbox: {exc}")
        os._exit(SANDBOX_FAILED)
    try:
        _become_job(request["workdir"], fds[0])
    except BaseException:
        os._exit(71)
    try:
        sandbox.filter_syscalls()
    except BaseException as exc:
        _complain(f"a child could not load its syscall filter: {exc}")
        os._exit(SANDBOX_FAILED)
    me = os.getpid()
    payload = _run_step(request)
    if os.getpid() != me:  # a process the step forked came back here: it has no say
        os._exit(0)
    status = 0
    try:
        os.write(RESULT_FD, payload)
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        status = 1
    os._exit(status)


def _hung_up(channel_fd: int) -> bool:
    poll = select.poll()
    poll.register(channel_fd, select.POLLIN)
    return any(events & select.POLLHUP for _fd, events in poll.poll(0))


def _be_init(channel_fd: int, fork: Callable[[], int]) -> None:
    """Pid 1 of the job's PID namespace, before anything else: fork the process that
    becomes the job (and builds the sandbox), reap
    whatever is orphaned in the namespace until that process ends, send the server
    how it ended (RELAYED, on the channel), exit. The kernel then kills what is left
    in the namespace, and the server reports the relayed status (its own wait4 gives
    the resources, the job's included). Returns only in the job's process.

    The step must not be the init itself: the kernel drops an init's own signals and
    ``SIGXCPU`` unless it handles them (see the module docstring).
    """
    try:
        pid = fork()
    except BaseException:
        os._exit(71)
    if pid == 0:
        return
    status = None
    while status is None:
        try:
            done, raw = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if done == pid:
            status = raw
    if status is not None:
        with suppress(BaseException):
            os.write(channel_fd, RELAYED.pack(b"R", status))
    # Its exit code too, for a spare that never got a job (SANDBOX_FAILED counts).
    os._exit(os.WEXITSTATUS(status) if status is not None and os.WIFEXITED(status) else 0)


def _complain(message: str) -> None:
    with suppress(BaseException):
        os.write(2, f"fork server: {message}\n".encode(errors="replace"))


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
    __slots__ = (
        "channel",
        "deadline",
        "disk_budget",
        "ended",
        "killed_for",
        "pid",
        "pidfd",
        "reply",
        "started",
        "status",
        "uid",
        "usage",
        "workdir",
    )

    def __init__(
        self,
        pid: int,
        pidfd: int,
        reply: socket.socket,
        deadline: float,
        uid: int,
        workdir: str = "",
        disk_budget: int = 0,
    ) -> None:
        self.pid = pid
        self.pidfd = pidfd
        self.reply = reply
        self.started = time.monotonic()
        self.deadline = deadline
        self.uid = uid
        self.workdir = workdir
        self.disk_budget = disk_budget
        self.killed_for: str | None = None
        self.channel: socket.socket | None = None
        self.ended = 0.0
        self.status = 0
        self.usage: resource.struct_rusage | None = None


class _Killer:
    __slots__ = ("deadline", "pid", "pidfd", "uids")

    def __init__(self, pid: int, pidfd: int, uids: list[int]) -> None:
        self.pid = pid
        self.pidfd = pidfd
        self.uids = uids
        self.deadline = time.monotonic() + KILLER_TIMEOUT


class _Left:
    __slots__ = ("live", "zombies")

    def __init__(self) -> None:
        self.live: list[int] = []
        self.zombies: list[int] = []


class _Server:
    def __init__(
        self, control: socket.socket, fork: Callable[[], int], spares: int, sandbox: Isolation
    ) -> None:
        self.pid = os.getpid()
        self.control = control
        self.fork = fork
        self.sandbox = sandbox
        self.spare_target = spares
        self.devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self.poll = select.epoll()
        self.control_fd = control.fileno()
        self.poll.register(self.control_fd, select.EPOLLIN)
        self.jobs: dict[int, _Job] = {}  # running, by pid
        self.by_fd: dict[int, _Job] = {}  # by pidfd and by reply socket fd
        self.spares: dict[int, _Spare] = {}  # by pid, in the order they were forked
        self.spare_fds: dict[int, _Spare] = {}  # by pidfd
        self.deadlines: list[tuple[float, int, _Job]] = []
        self.sequence = 0
        self.stopping = False
        self.last_sweep = 0.0
        self.next_disk_check = 0.0
        self.sweep_due = False
        self.refilling = spares > 0
        self.spare_failures = 0
        # Job uids (when the sandbox has them): free ones, and those whose job has
        # exited but whose processes are not all gone yet (no report until they are).
        self.free_uids = list(sandbox.uids)
        heapq.heapify(self.free_uids)
        self.settling: dict[int, _Job] = {}  # by uid
        self.killers: dict[int, _Killer] = {}  # by pid
        self.killer_fds: dict[int, _Killer] = {}  # by pidfd
        self.next_killer: dict[int, float] = {}  # by uid: not before

    def serve(self) -> None:
        while not (self.stopping and not self.jobs and not self.settling):
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
                elif fd in self.spare_fds or fd in self.killer_fds:
                    self._reap()
            if control:
                self._on_control()
            now = time.monotonic()
            while self.deadlines and self.deadlines[0][0] <= now:
                job = heapq.heappop(self.deadlines)[2]
                if self.jobs.get(job.pid) is job:  # not finished (its pid may be reused)
                    self._kill(job, "timeout")
            if self.killers:
                self._check_killers(now)
            if now >= self.next_disk_check and self._budgeted():
                self._check_disks()
                self.next_disk_check = now + DISK_INTERVAL
            if self.settling:
                self._settle(now)
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
        if self.settling:
            waits.append(KILLER_INTERVAL)
        if self.killers:
            waits.append(min(killer.deadline for killer in self.killers.values()) - now)
        if self._budgeted():
            waits.append(self.next_disk_check - now)
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
            pid = self.sandbox.fork_spare(self.fork)
        except OSError:
            channel.close()
            theirs.close()
            raise
        if pid == 0:
            _spare(theirs.fileno(), self.devnull, self.pid, self.sandbox, self.fork)
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
        wall_clock, disk_budget = REQUEST.unpack_from(data)
        workdir = ""
        if disk_budget > 0:
            request = marshal.loads(data[REQUEST.size :])  # noqa: S302 - from the executor
            workdir = str(request["workdir"])
        uid = 0
        if self.sandbox.own_uid:
            if not self.free_uids:
                os.close(result_fd)
                error = f"no free job uid ({len(self.sandbox.uids)} jobs at once at most)"
                with suppress(OSError):
                    reply.send(FAILED + error.encode(), socket.MSG_DONTWAIT)
                reply.close()
                return
            uid = heapq.heappop(self.free_uids)
        body = UID.pack(uid) + data[REQUEST.size :]
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
            if uid:
                heapq.heappush(self.free_uids, uid)  # no process ever had it
            with suppress(OSError):
                reply.send(FAILED + error.encode(), socket.MSG_DONTWAIT)
            reply.close()
            return
        deadline = time.monotonic() + wall_clock
        job = _Job(spare.pid, spare.pidfd, reply, deadline, uid, workdir, disk_budget)
        if self.sandbox.pid_namespace:
            job.channel = spare.channel  # the init relays how the job ended on it
        else:
            spare.channel.close()
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

    # -- disk budgets

    def _budgeted(self) -> bool:
        return any(job.disk_budget > 0 and job.killed_for is None for job in self.jobs.values())

    def _check_disks(self) -> None:
        """Kill every running job whose workdir holds more than its disk budget.

        ``RLIMIT_FSIZE`` bounds one file; this bounds them all (many files under the
        limit each would fill the disk otherwise). Measured every ``DISK_INTERVAL``,
        so a job may pass its budget by what it writes in that time.
        """
        for job in list(self.jobs.values()):
            if (
                job.disk_budget > 0
                and job.killed_for is None
                and disk_usage(job.workdir, DISK_MAX_ENTRIES) > job.disk_budget
            ):
                self._kill(job, "disk")

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
                self._exited(job, status, usage)
            elif pid in self.spares:
                if os.WIFEXITED(status) and os.WEXITSTATUS(status) == SANDBOX_FAILED:
                    self.spare_failures += 1
                    self.refilling = False  # not in a loop: again when a job takes one
                self._drop_spare(self.spares[pid])
            elif pid in self.killers:
                killer = self.killers.pop(pid)
                del self.killer_fds[killer.pidfd]
                with suppress(OSError):
                    self.poll.unregister(killer.pidfd)
                os.close(killer.pidfd)

    def _exited(self, job: _Job, status: int, usage: resource.struct_rusage) -> None:
        """The job's child is gone: its group next, then (with a job uid) every process
        of its uid, before anyone hears about it."""
        job.ended = time.monotonic()
        if job.channel is not None:
            try:
                relayed = job.channel.recv(RELAYED.size + 1, socket.MSG_DONTWAIT)
            except OSError:
                relayed = b""  # the init was killed, and the job with it: its status
            if len(relayed) == RELAYED.size and relayed[:1] == b"R":
                status = RELAYED.unpack(relayed)[1]
            job.channel.close()
            job.channel = None
        job.status = status
        job.usage = usage
        with suppress(OSError):  # whatever the job left running in its group
            os.killpg(job.pid, _SIGKILL)
        # Unregister explicitly: a child forked meanwhile may hold copies of both
        # descriptors until it closes them, and closing ours would not remove them.
        for fd in (job.pidfd, job.reply.fileno()):
            del self.by_fd[fd]
            with suppress(OSError):
                self.poll.unregister(fd)
        os.close(job.pidfd)
        self.sweep_due = True
        if len(self.deadlines) > 2 * len(self.jobs) + 64:
            # Finished jobs stay in the heap until their deadline; long timeouts at a
            # high rate would pile them up.
            live = self.jobs
            self.deadlines = [
                entry for entry in self.deadlines if live.get(entry[2].pid) is entry[2]
            ]
            heapq.heapify(self.deadlines)
        if job.uid:
            self.settling[job.uid] = job  # reported by _settle, in this turn of the loop
        else:
            self._report(job)

    def _settle(self, now: float) -> None:
        """Report each exited job whose uid has no process left, not even a zombie
        (zombies count for RLIMIT_NPROC); have the live ones killed."""
        self._reap()
        leftovers = self._leftovers()
        for uid, job in list(self.settling.items()):
            left = leftovers.get(uid)
            if left is None:
                del self.settling[uid]
                self.next_killer.pop(uid, None)
                heapq.heappush(self.free_uids, uid)
                self._report(job)
            elif (
                left.live
                and now >= self.next_killer.get(uid, 0.0)
                and not any(uid in killer.uids for killer in self.killers.values())
            ):
                self._start_killer([uid])
                self.next_killer[uid] = now + KILLER_INTERVAL
            # else: zombies only (reaped in the next turn), or a killer at work

    def _report(self, job: _Job) -> None:
        status, usage = job.status, job.usage
        assert usage is not None
        report = EXITED.pack(
            b"X",
            job.pid,
            os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1,
            os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0,
            KILLED_FOR[job.killed_for],
            round((job.ended - job.started) * 1000),
            usage.ru_maxrss,
            usage.ru_utime + usage.ru_stime,
        )
        with suppress(OSError):
            job.reply.send(report, socket.MSG_DONTWAIT)
        job.reply.close()

    # -- what jobs leave behind

    def _start_killer(self, uids: list[int]) -> None:
        try:
            pid = kill_uids(uids, self.fork)
        except OSError as exc:
            print(f"fork server: cannot fork a killer: {exc}", file=sys.stderr, flush=True)
            return
        killer = _Killer(pid, os.pidfd_open(pid), uids)
        self.killers[pid] = killer
        self.killer_fds[killer.pidfd] = killer
        self.poll.register(killer.pidfd, select.EPOLLIN)

    def _check_killers(self, now: float) -> None:
        for killer in list(self.killers.values()):
            if now >= killer.deadline:  # stopped by a process it was to kill
                with suppress(OSError):
                    os.kill(killer.pid, _SIGKILL)
                killer.deadline = now + KILLER_TIMEOUT  # reaped like any other killer

    def _leftovers(self) -> dict[int, _Left]:
        """Processes that are nobody's job, spare or killer, by uid.

        Every process a job leaves is the server's child once its parent is gone (the
        server is a subreaper), and a job's processes cannot change their uid: so a
        uid has processes left if and only if one of them is a child of the server.
        """
        known = self.jobs.keys() | self.spares.keys() | self.killers.keys()
        found: dict[int, _Left] = {}
        for pid in _children(self.pid):
            if pid in known:
                continue
            uid, zombie = _uid_of(pid)
            if uid is not None:
                left = found.setdefault(uid, _Left())
                (left.zombies if zombie else left.live).append(pid)
        return found

    def _sweep(self, now: float, *, everything: bool = False) -> None:
        """Kill leftovers no running job holds: by uid with job uids, else by group."""
        self.last_sweep = now
        self.sweep_due = False
        if self.sandbox.own_uid and not everything:
            running = {job.uid for job in self.jobs.values()} | self.settling.keys()
            for uid, left in self._leftovers().items():
                if uid in running or not left.live:
                    continue  # the job's own, being killed for it already, or zombies
                if uid in self.sandbox.uids:
                    self._start_killer([uid])
                else:
                    for pid in left.live:
                        with suppress(OSError):
                            os.kill(pid, _SIGKILL)
            self._reap()
            return
        keep = self.jobs.keys() | self.spares.keys() | self.killers.keys()
        for pid, pgid in _children_of(self.pid):
            if everything or (pid not in keep and pgid not in keep):
                with suppress(OSError):
                    os.kill(pid, _SIGKILL)
        self._reap()

    def _reap_remaining(self, deadline: float) -> None:
        if self.sandbox.own_uid:  # whatever the job uids still have, wherever it is
            with suppress(OSError):
                self._start_killer(list(self.sandbox.uids))
        while time.monotonic() < deadline:
            try:
                pid, _status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                time.sleep(0.01)


def disk_usage(root: str, max_entries: int) -> int:
    """Bytes of disk the files under ``root`` take (allocated blocks: a sparse file
    costs what it holds), symlinks not followed. More than ``max_entries`` entries:
    a number larger than any budget."""
    total = 0
    entries = 0
    pending = [root]
    while pending:
        try:
            scan = os.scandir(pending.pop())
        except OSError:
            continue  # gone, or not a directory any more
        with scan:
            for entry in scan:
                entries += 1
                if entries > max_entries:
                    return 1 << 62
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += info.st_blocks * 512
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
    return total


def _children(parent: int) -> list[int]:
    """The pids of ``parent``'s children (a single-threaded parent)."""
    try:
        with open(f"/proc/{parent}/task/{parent}/children", "rb") as children:
            return [int(pid) for pid in children.read().split()]
    except FileNotFoundError:  # a kernel without CONFIG_PROC_CHILDREN
        return [pid for pid, _pgid in _children_of(parent)]


def _uid_of(pid: int) -> tuple[int | None, bool]:
    """A process's real uid (None: it is gone) and whether it is a zombie."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            text = status.read()
    except OSError:
        return None, False
    state = uid = None
    for line in text.splitlines():
        if line.startswith(b"State:"):
            state = line.split()[1]
        elif line.startswith(b"Uid:"):
            uid = int(line.split()[1])
            break
    return uid, state in (b"Z", b"X")


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
    sandbox_config = config["sandbox"]
    code = code_paths(list(sys.modules.values()), also_cover=sandbox_config["also_cover"])
    settings = Settings(
        enabled=bool(sandbox_config["enabled"]),
        work_root=sandbox_config["work_root"],
        jobs_root=sandbox_config["jobs_root"],
        hidden=tuple(sandbox_config["hidden"]),
        exposed=code.exposes,
        uid_base=int(sandbox_config["uid_base"]),
        covered=(*sandbox_config["covered"], *code.covers),
    )
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    sandbox = Isolation.start(settings, fork)
    gc.collect()
    gc.freeze()
    server = _Server(control, fork, int(config.get("spares", DEFAULT_SPARES)), sandbox)
    ready = {
        "op": "ready",
        "pid": os.getpid(),
        "fork": getattr(fork, "__name__", ""),
        "capabilities": sandbox.capabilities(),
    }
    control.send(json.dumps(ready).encode())
    server.serve()
