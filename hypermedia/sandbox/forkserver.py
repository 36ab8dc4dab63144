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

What a spare and its job do, from the fork to the result, is
:mod:`hypermedia.sandbox.child`; the messages between the executor, the server and
a child are :mod:`hypermedia.sandbox.wire`.

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
modules must not rely on Python-level ``os.register_at_fork`` hooks. A preloaded
module's ``prepare_fork_server()``, if it has one, runs once in the server before any
fork: work every child would otherwise do again (the image step's CMYK transform).

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
that claims the uid block kills the block's processes, and waits until they are gone
(zombies too), before its first job.

A PID namespace per job. The server clones a tiny init for each spare
(:mod:`hypermedia.sandbox.tinyinit`: a process sharing the server's memory that runs
a few instructions, no Python) and forks the spare into its namespace
(:meth:`~hypermedia.sandbox.isolation.Isolation.fork_spare`): the job's process is
pid 2 there and the server's own child. When the server reaps it, what it left (the
init's children now: orphans go to their namespace's init) decides: nothing, and
the job is reported at once while the init is killed; something, and the init is
killed and the job reported when the init is reaped (the kernel kills and reaps the
rest of a namespace before its init's exit ends). Where there is no tiny init the
spare is its namespace's init itself: it forks the job's process, and when that ends
it kills and reaps the rest of its namespace and sends the server the job's wait
status, peak RSS and CPU time on the spare's channel (RELAYED): the server reports
the job then, and reaps the init when it has exited (see
:mod:`hypermedia.sandbox.child`).
"""

from __future__ import annotations

import ctypes
import gc
import heapq
import importlib
import json
import marshal
import os
import resource
import select
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from typing import Any

from hypermedia.sandbox.child import SIGKILL, prctl, run_spare
from hypermedia.sandbox.isolation import Isolation, Settings, code_paths, kill_uids
from hypermedia.sandbox.outcome import SANDBOX_FAILED
from hypermedia.sandbox.wire import (
    CANCEL,
    DEFAULT_SPARES,
    EXITED,
    FAILED,
    KILLED_FOR,
    MESSAGE_CAP,
    RELAYED,
    REQUEST,
    STARTED,
    UID,
)

SWEEP_INTERVAL = 1.0
DISK_INTERVAL = 0.25  # between measurements of running jobs' workdirs, at least
# ... and at least this many times what the last measurement took: a workdir of many
# files (a job's own doing) waits longer between its checks instead of taking the
# server's CPU, which no limit of the job counts (a 99,000-file workdir scanned every
# 0.25 s held 84 % of a core).
DISK_SCAN_SHARE = 10
DISK_MAX_ENTRIES = 20_000  # a workdir with more files than this is over its budget
KILLER_TIMEOUT = 2.0  # a killer not done by then was stopped by its targets: another one
KILLER_INTERVAL = 0.02  # between killers for one uid whose processes are still dying

_PR_SET_CHILD_SUBREAPER = 36

_raw_fork = ctypes.PyDLL(None, use_errno=True).fork  # PyDLL: the GIL stays held
_raw_fork.argtypes = []
_raw_fork.restype = ctypes.c_int


def _fork_without_hooks() -> int:
    pid: int = _raw_fork()
    if pid < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return pid


class _Spare:
    __slots__ = ("channel", "init", "pid", "pidfd")

    def __init__(self, pid: int, pidfd: int, channel: socket.socket, init: int | None) -> None:
        self.pid = pid
        self.pidfd = pidfd
        self.channel = channel
        self.init = init  # its PID namespace's tiny init (None: the spare is its own)


class _Job:
    __slots__ = (
        "channel",
        "cpu",
        "deadline",
        "disk_budget",
        "ended",
        "init",
        "killed_for",
        "max_rss",
        "pid",
        "pidfd",
        "reply",
        "started",
        "status",
        "uid",
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
        init: int | None = None,
    ) -> None:
        self.pid = pid
        self.init = init
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
        self.max_rss = 0  # kB
        self.cpu = 0.0  # seconds


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
        # Inits whose job has been reported, exiting (their namespaces torn down): pidfds.
        self.ending: dict[int, int] = {}  # pidfd by pid
        self.ending_fds: set[int] = set()
        # Tiny inits (:mod:`.tinyinit`) of spares and running jobs, and those killed
        # while their namespace still held what a job left: that job, reported when
        # the init is reaped (the kernel kills the rest of the namespace first).
        self.inits: set[int] = set()
        self.draining: dict[int, _Job] = {}  # by init pid
        self.next_killer: dict[int, float] = {}  # by uid: not before

    def serve(self) -> None:
        while not (self.stopping and not self.jobs and not self.settling and not self.draining):
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
                    elif job.channel is not None and fd == job.channel.fileno():
                        self._on_relay(job)
                    else:
                        self._on_reply(job)
                elif fd in self.spare_fds or fd in self.killer_fds or fd in self.ending_fds:
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
                spent = time.monotonic() - now
                self.next_disk_check = now + max(DISK_INTERVAL, DISK_SCAN_SHARE * spent)
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
            pid, init = self.sandbox.fork_spare(self.fork)
        except OSError:
            channel.close()
            theirs.close()
            raise
        if pid == 0:
            run_spare(theirs.fileno(), self.devnull, self.pid, self.sandbox, self.fork)
        theirs.close()
        if init is not None:
            self.inits.add(init)
        spare = _Spare(pid, os.pidfd_open(pid), channel, init)
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
        if spare.init is not None:
            self._end_init(spare.init)

    def _end_init(self, init: int, job: _Job | None = None) -> None:
        """Kill a tiny init (and so whatever is left in its namespace); reaped when it
        is gone, and then ``job`` reported, if given."""
        with suppress(OSError):
            os.kill(init, SIGKILL)
        try:
            pidfd = os.pidfd_open(init)
        except OSError:  # reaped already? (never without us): the sweep finds it
            self.inits.discard(init)
            if job is not None:
                self._finish(job, job.status, job.max_rss, job.cpu)
            return
        self.ending[init] = pidfd
        self.ending_fds.add(pidfd)
        self.poll.register(pidfd, select.EPOLLIN)
        if job is not None:
            self.draining[init] = job

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
        handed = [result_fd]  # the job's result socket, and its uid's network namespace
        network = self.sandbox.network_namespace_of(uid)
        if network is not None:
            handed.append(network)
        spare = None
        error = ""
        for _attempt in range(2):  # a spare may have died without our noticing yet
            try:
                spare = self._take_spare()
            except OSError as exc:
                error = f"fork: {exc}"
                break
            try:
                socket.send_fds(spare.channel, [body], handed)
                break
            except OSError as exc:
                error = f"spare {spare.pid}: {exc}"
                with suppress(OSError):
                    os.kill(spare.pid, SIGKILL)
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
        job = _Job(spare.pid, spare.pidfd, reply, deadline, uid, workdir, disk_budget, spare.init)
        if self.sandbox.spare_is_init:
            job.channel = spare.channel  # the init relays how the job ended on it
            self.by_fd[spare.channel.fileno()] = job
            self.poll.register(spare.channel.fileno(), select.EPOLLIN)
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
        limit each would fill the disk otherwise). Measured every ``DISK_INTERVAL``, or
        ``DISK_SCAN_SHARE`` times what the last measurement took if longer, so a job may
        pass its budget by what it writes in that time.
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
            os.kill(job.pid, SIGKILL)
        with suppress(OSError):
            os.killpg(job.pid, SIGKILL)
        if job.init is not None:  # and everything in its PID namespace
            with suppress(OSError):
                os.kill(job.init, SIGKILL)

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
            elif pid in self.ending:
                pidfd = self.ending.pop(pid)
                self.ending_fds.discard(pidfd)
                with suppress(OSError):
                    self.poll.unregister(pidfd)
                os.close(pidfd)
                self.inits.discard(pid)
                drained = self.draining.pop(pid, None)
                if drained is not None:  # its namespace is empty now
                    self._finish(drained, drained.status, drained.max_rss, drained.cpu)
            elif pid in self.killers:
                killer = self.killers.pop(pid)
                del self.killer_fds[killer.pidfd]
                with suppress(OSError):
                    self.poll.unregister(killer.pidfd)
                os.close(killer.pidfd)

    def _on_relay(self, job: _Job) -> None:
        """The init says how the job ended: nothing of it runs any more (the init
        killed and reaped the rest of its namespace), so it is reported now, while the
        init exits and the kernel tears its namespaces down."""
        relayed = self._relayed(job)
        if relayed is None:
            return  # the init died without a word: its exit tells (_exited)
        del self.jobs[job.pid]
        del self.by_fd[job.pidfd]
        self.ending[job.pid] = job.pidfd  # reaped when it is gone
        self.ending_fds.add(job.pidfd)
        self._finish(job, *relayed)

    def _relayed(self, job: _Job) -> tuple[int, int, float] | None:
        """What the job's init sent on its channel (None: nothing, it was killed); the
        channel is done with either way."""
        channel = job.channel
        if channel is None:
            return None
        job.channel = None
        del self.by_fd[channel.fileno()]
        with suppress(OSError):
            self.poll.unregister(channel.fileno())
        try:
            relayed = channel.recv(RELAYED.size + 1, socket.MSG_DONTWAIT)
        except OSError:
            relayed = b""
        channel.close()
        if len(relayed) != RELAYED.size or relayed[:1] != b"R":
            return None
        _kind, status, max_rss, cpu = RELAYED.unpack(relayed)
        return status, max_rss, cpu

    def _exited(self, job: _Job, status: int, usage: resource.struct_rusage) -> None:
        """The job's child is gone (reaped): with a PID namespace, an init that died
        before its relay was read (or killed: then the job with it)."""
        relayed = self._relayed(job)
        del self.by_fd[job.pidfd]
        with suppress(OSError):
            self.poll.unregister(job.pidfd)
        os.close(job.pidfd)
        if relayed is None:
            relayed = (status, usage.ru_maxrss, usage.ru_utime + usage.ru_stime)
        init = job.init
        if init is None:
            self._finish(job, *relayed)
            return
        # A tiny init: what the job's process left is now the init's (orphans go to
        # their namespace's init). None: reported now, the init killed on the way.
        # Some: the init killed, and the job reported once it is reaped (the kernel
        # kills and reaps the rest of a namespace before its init's exit ends).
        job.init = None
        job.status, job.max_rss, job.cpu = relayed
        if _children(init):
            self._end_init(init, job)
        else:
            self._end_init(init)
            self._finish(job, *relayed)

    def _finish(self, job: _Job, status: int, max_rss: int, cpu: float) -> None:
        """Its group next, then (with a job uid) every process of its uid, before
        anyone hears about it."""
        job.ended = time.monotonic()
        job.status = status
        job.max_rss = max_rss
        job.cpu = cpu
        with suppress(OSError):  # whatever the job left running in its group
            os.killpg(job.pid, SIGKILL)
        # Unregister explicitly: a child forked meanwhile may hold a copy of the
        # descriptor until it closes it, and closing ours would not remove it.
        del self.by_fd[job.reply.fileno()]
        with suppress(OSError):
            self.poll.unregister(job.reply.fileno())
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
        status = job.status
        report = EXITED.pack(
            b"X",
            job.pid,
            os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1,
            os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0,
            KILLED_FOR[job.killed_for],
            round((job.ended - job.started) * 1000),
            job.max_rss,
            job.cpu,
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
                    os.kill(killer.pid, SIGKILL)
                killer.deadline = now + KILLER_TIMEOUT  # reaped like any other killer

    def _leftovers(self) -> dict[int, _Left]:
        """Processes that are nobody's job, spare or killer, by uid.

        Every process a job leaves is the server's child once its parent is gone (the
        server is a subreaper), and a job's processes cannot change their uid: so a
        uid has processes left if and only if one of them is a child of the server.
        """
        known = self.jobs.keys() | self.spares.keys() | self.killers.keys() | self.ending.keys()
        known |= self.inits
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
                            os.kill(pid, SIGKILL)
            self._reap()
            return
        keep = self.jobs.keys() | self.spares.keys() | self.killers.keys() | self.ending.keys()
        keep |= self.inits
        for pid, pgid in _children_of(self.pid):
            if everything or (pid not in keep and pgid not in keep):
                with suppress(OSError):
                    os.kill(pid, SIGKILL)
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
            prepare = getattr(importlib.import_module(module), "prepare_fork_server", None)
            if prepare is not None:
                prepare()  # what every child would otherwise build for itself
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
        pid_init=str(sandbox_config.get("pid_init", "tiny")),
    )
    prctl(_PR_SET_CHILD_SUBREAPER, 1)
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
