"""What runs in a child of the fork server (:mod:`hypermedia.sandbox.forkserver`):
a spare waiting for its job, then the job, which runs the step and writes its
result (the messages: :mod:`hypermedia.sandbox.wire`).

A spare: new session (its pid is its process group), ``PDEATHSIG`` = SIGKILL, no
new privileges, stdin ``/dev/null``, every descriptor but its channel closed, then
its sandbox built (:mod:`hypermedia.sandbox.isolation`: the mount namespace and the
read-only view, and a network namespace unless its uid's comes with the job), all
before the job arrives, off its clock. Given a job (the request and, from the
server, the job's uid and that uid's network namespace): the namespace entered, the
workdir bound in read-write and ``chown``-ed, the uid taken (``PDEATHSIG`` set again: a uid change
clears it), stdout/stderr appended to ``<workdir>/.child.log``,
cwd/``HOME``/``TMPDIR`` = the workdir, the seccomp filter loaded
(:mod:`hypermedia.sandbox.syscalls`: after the mounts and the uid change, which it
would refuse), rlimits applied last (``RLIMIT_NPROC`` among them when the job has a
uid), then
``pipelines.registry.get(operation)(input, params, workdir)``, its progress reports
(:mod:`pipelines.progress`) sent on the result socket before its result. A spare that cannot
build its sandbox exits with :data:`~hypermedia.sandbox.outcome.SANDBOX_FAILED`
(a job given to it fails ``sandbox_unavailable``, retryable): a job never runs
with less than the server found possible at start.

A PID namespace per job. Where the server has a tiny init
(:mod:`hypermedia.sandbox.tinyinit`), the spare is forked into the namespace of one,
as its pid 2: it builds its sandbox and runs the job itself, and the server reaps it
directly. Otherwise the server forks each spare into a PID namespace of its
own (:meth:`~hypermedia.sandbox.isolation.Isolation.fork_spare`: ``unshare`` moves
only the children forked after it, and the server is put back at once), so the
spare is that namespace's pid 1, its *init*. The step must not be an init: the
kernel drops the signals an init sends itself and ``SIGXCPU`` unless it handles them
(measured: as pid 1 a step's ``kill(getpid(), SIGSEGV)`` does nothing,
``RLIMIT_CPU``'s soft limit does nothing, so only the hard limit's ``SIGKILL`` ends
it, and ``abort()`` ends in ``SIGSEGV``). So the init, before the job arrives,
builds the namespaces and the view and forks the process that becomes the job (pid
2; one more fork per job, off the job's clock while spares last), which shares them:
its exit tears none of them down. The init reaps what is orphaned in the namespace;
when the job's process ends it kills and reaps everything else in the namespace,
escaped processes included, sends the server the job's wait status, peak RSS and
CPU time on the spare's channel (RELAYED) and exits: the server reports the job on
the relay, so the init's exit and the namespaces' teardown are off the job's clock.
A killed server's jobs die with their inits (``PDEATHSIG``). A job sees no other pid
at all, and can signal none: the pids of the machine do not exist in its namespace.
"""

from __future__ import annotations

import ctypes
import errno
import json
import marshal
import os
import resource
import select
import socket
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from contextlib import suppress
from pathlib import Path
from typing import Any, NoReturn

from hypermedia.sandbox.isolation import Isolation
from hypermedia.sandbox.outcome import SANDBOX_FAILED
from hypermedia.sandbox.wire import (
    CHILD_LOG,
    MESSAGE_CAP,
    PROGRESS_INTERVAL,
    RELAYED,
    RESULT_CAP,
    UID,
)

RESULT_FD = 3

PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
SIGKILL = 9
OOM_SCORE_ADJ = 1000  # the most: the OOM killer takes a job child before all else

_libc = ctypes.CDLL(None, use_errno=True)
_prctl_function = _libc.prctl
_prctl_function.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
_prctl_function.restype = ctypes.c_int
_send = _libc.send
_send.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int]
_send.restype = ctypes.c_ssize_t
MSG_DONTWAIT = socket.MSG_DONTWAIT


def prctl(option: int, value: int) -> None:
    if _prctl_function(option, value, 0, 0, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _error(code: str, message: str, *, retryable: bool = False, detail: str = "") -> bytes:
    body = {"code": code, "message": message, "retryable": retryable, "detail": detail}
    return json.dumps({"error": body}).encode()


# Built once, in the server (it imports this module): reporting a MemoryError must
# not need memory.
_OUT_OF_MEMORY = _error("memory_limit", "the job ran out of memory (RLIMIT_AS)")
_TOO_LARGE = _error("output_limit", "an output file outgrew the limit (RLIMIT_FSIZE)")
_TOO_MANY = _error("process_limit", "the job could not start a process or thread (RLIMIT_NPROC)")


# OpenCV raises its own ``cv2.error`` when an allocation fails (code -4, StsNoMem:
# "Insufficient memory"), not MemoryError; read by its module and code, so the server
# never needs to import OpenCV to recognise it.
_OPENCV_NO_MEMORY = ("cv2", -4)


def _errno_in_chain(exc: BaseException | None, code: int) -> bool:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno == code:
            return True
        if code == errno.ENOMEM and (
            isinstance(exc, MemoryError)
            or (type(exc).__module__, getattr(exc, "code", None)) == _OPENCV_NO_MEMORY
        ):
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


class _ProgressSender:
    """The step's progress reports (:mod:`pipelines.progress`) as PROGRESS messages on
    the result socket: at most one per :data:`PROGRESS_INTERVAL` (and the last, ``done``
    = ``total``), never one the same as the last sent (FFmpeg's last ``out_time`` and
    its ``progress=end`` both report the total, as do a chunked transcode's last chunk
    and its concat: the job's events held the end twice), never blocking: one the
    socket cannot take at once is dropped. Sent with libc's ``send`` on the result
    descriptor itself: no other descriptor is open in the job."""

    __slots__ = ("clock", "last", "sent")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.last = 0.0
        self.sent: tuple[Any, Any, str] | None = None

    def __call__(self, progress: Any) -> None:
        now = self.clock()
        final = progress.total is not None and progress.done >= progress.total
        if now - self.last < PROGRESS_INTERVAL and not final:
            return
        report = (progress.done, progress.total, str(progress.unit))
        if report == self.sent:
            return
        self.last = now
        body = {"done": report[0], "total": report[1], "unit": report[2]}
        with suppress(ValueError, TypeError):
            data = json.dumps({"progress": body}).encode()
            if _send(RESULT_FD, data, len(data), MSG_DONTWAIT) >= 0:  # -1 (EAGAIN): dropped
                self.sent = report


def _first_for_the_oom_killer() -> None:
    """The kernel's OOM killer takes this job (and what it starts: inherited) before
    anything else of the node. ``RLIMIT_AS`` bounds each process, not the job: a job of
    many processes may hold more than its memory limit in all, and should the node run
    out, the job must die, not the worker, Ray or another job. Raising one's own score
    needs no privilege; set in the spare, before its view makes /proc read-only."""
    with suppress(OSError), open("/proc/self/oom_score_adj", "w") as score:
        score.write(str(OOM_SCORE_ADJ))


def _run_step(request: Mapping[str, Any]) -> bytes:
    """Apply the rlimits, run the step; the result as bytes, whatever happens."""
    from pipelines import progress, registry

    try:
        progress.reporting_to(_ProgressSender())
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


def run_spare(
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
        prctl(PR_SET_PDEATHSIG, SIGKILL)
        _first_for_the_oom_killer()  # while /proc is the host's, writable
        # The server died before PDEATHSIG was set? (A namespace's pid 1 has no parent
        # it can see: its channel then tells.)
        if (os.getppid() != server_pid) if not sandbox.pid_namespace else _hung_up(channel_fd):
            os._exit(0)
        prctl(PR_SET_NO_NEW_PRIVS, 1)
        os.dup2(devnull, 0)
        # Every descriptor but the channel and the template view (closed by prepare).
        kept = {channel_fd} if sandbox.template is None else {channel_fd, sandbox.template}
        low = RESULT_FD
        for keep in sorted(kept):
            os.closerange(low, keep)
            low = keep + 1
        os.closerange(low, max(os.sysconf("SC_OPEN_MAX"), 1024))
    except BaseException:
        os._exit(71)  # EX_OSERR: reported as a crash without a result
    parent = server_pid
    jobs_fd = _prepare(sandbox)
    if sandbox.spare_is_init:
        _be_init(channel_fd, fork)
        parent = 1
    elif sandbox.pid_namespace:  # pid 2 of a tiny init's namespace: the server is not in it
        parent = 0
    try:
        channel = socket.socket(fileno=channel_fd)
        body, fds, _flags, _address = socket.recv_fds(channel, MESSAGE_CAP, 2)
        channel.close()
        if len(body) <= UID.size or len(fds) not in (1, 2):  # the server is done with us
            os._exit(0)
        (uid,) = UID.unpack_from(body)
        request = marshal.loads(body[UID.size :])  # noqa: S302 - from the executor, never a job
    except BaseException:
        os._exit(71)
    try:
        sandbox.enter(jobs_fd, request["workdir"], uid, fds[1] if len(fds) == 2 else None)
        if uid:  # a change of uid cleared PDEATHSIG
            prctl(PR_SET_PDEATHSIG, SIGKILL)
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


def _prepare(sandbox: Isolation) -> int | None:
    try:
        return sandbox.prepare()
    except BaseException as exc:
        _complain(f"a spare could not build its sandbox: {exc}")
        os._exit(SANDBOX_FAILED)


def _be_init(channel_fd: int, fork: Callable[[], int]) -> None:
    """Pid 1 of the job's PID namespace, its network and mount namespaces built: fork
    the process that becomes the job (it shares them, so its exit tears none of them
    down), reap whatever is orphaned in the namespace until that process ends, then
    kill and reap everything left in the namespace, send the server how the job ended
    and what it used (RELAYED, on the channel: the server reports the job then,
    without waiting for this process's exit and the namespaces' teardown), exit.
    Returns only in the job's process.

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
    max_rss = 0
    cpu = 0.0
    while True:
        try:
            done, raw, usage = os.wait4(-1, 0)
        except ChildProcessError:
            break  # nothing left in the namespace but this process
        max_rss = max(max_rss, usage.ru_maxrss)
        cpu += usage.ru_utime + usage.ru_stime
        if done == pid:
            status = raw
            with suppress(OSError):  # every other process of the namespace
                os.kill(-1, SIGKILL)
    if status is not None:
        with suppress(BaseException):
            os.write(channel_fd, RELAYED.pack(b"R", status, max_rss, cpu))
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
