"""What a job's child may see and touch: its own namespaces, a read-only view, a uid of its own.

The fork server (:mod:`hypermedia.sandbox.forkserver`) and its children
(:mod:`hypermedia.sandbox.child`) use this module, and so does the upload
inspection server (:mod:`hypermedia.ingest.inspection`), whose children parse each
upload in the same sandbox with no workdir. Linux only; every call is a plain
syscall (``ctypes``), no helper binary, so a spare pays microseconds, not an
``exec`` (bubblewrap: ~16 ms a run).

A spare, before its job arrives (off the job's clock), in :meth:`Isolation.prepare`:

1. ``unshare(CLONE_NEWNS)``: a mount namespace of its own; and a network namespace
   with no interface up (not even ``lo``: ``connect`` to 127.0.0.1 fails with
   ``ENETUNREACH``; abstract Unix sockets are per namespace too). With job uids the
   server makes one network namespace per uid of its block, once, and a job enters
   its uid's when it arrives (:meth:`Isolation.enter`): jobs that run at the same time
   have different uids, so never share one, and nothing a job can leave in it
   outlives its processes (no interface, address, route, rule or sysctl changes
   without privileges there; sockets close with the processes, which are all gone
   before the uid serves again). Each is made on its uid's first job, so a server
   holds as many as it ran jobs at once. A namespace made and torn down per job cost
   ~1.5 ms of CPU (the teardown in a kernel worker). Without job uids, a spare makes
   its own.
2. ``mount_setattr("/", AT_RECURSIVE, RDONLY | NOSUID, MS_PRIVATE)``: every mount
   read-only and private (nothing propagates in or out), in one syscall.
3. The *covers*: an empty read-only tmpfs over each covered path
   (:data:`DEFAULT_COVERED`; the directories of ``sys.path`` that are not the
   interpreter's and the worker's working directory, which is where Ray puts the
   directory the operator started from; :data:`DEFAULT_HIDDEN`, the executor's work
   root and the caller's hidden paths such as the worker's data directory), so a job
   cannot read other jobs' files, the worker's data, Ray's session files, Unix
   sockets under ``/run`` or whatever lies beside the code it runs. What the step
   needs from under a cover is bound back read-only (:func:`code_view`: the
   interpreter's prefixes, site-packages, and each loaded package's own directory,
   not the ``sys.path`` entry it came from); the cover's directories are ``0755``,
   so a job uid can reach a re-exposed path even when the real parent is ``/root``
   (``0700``). A *hidden* path beats every expose: nothing at or under it is bound
   back, whoever needs it; at the same path any cover beats an expose.
4. ``/proc`` mounted again with ``hidepid=invisible``: a job sees only its own
   processes, not the command lines of the rest of the machine. With PID
   namespaces (the spare was forked into one of its own,
   :meth:`Isolation.fork_spare`) that ``/proc`` is the namespace's: the machine's
   other pids do not exist for the job at all.

When the job arrives, :meth:`Isolation.enter`: the job's workdir is bound
read-write at its own path (the only writable place besides device nodes like
``/dev/null``), ``chown``-ed to the job's uid, and the child drops to that uid
(``setgroups([])``, ``setresgid``, ``setresuid``; no capabilities remain, and
``PR_SET_NO_NEW_PRIVS`` was set when the spare was forked). Last, just before the
step, :meth:`Isolation.filter_syscalls` loads the seccomp filter
(:mod:`hypermedia.sandbox.syscalls`), built once in the server.

Job uids. A worker runs as root; its jobs must not. Each fork server claims a
block of :data:`UID_SLOTS` uids from ``UID_BASE`` on (an ``flock`` under
:data:`LOCK_DIR`, released when the server dies, so servers of other workers on the
machine get other blocks) and gives each running job a slot of its own. So
``RLIMIT_NPROC`` counts only that job's processes, and a job's processes are
exactly the processes with its uid: after the job the server has every process of
that uid killed (:func:`kill_uids`, in a throwaway child that takes the uid,
``kill(-1, SIGKILL)``) before the uid is given to another job or the job's outputs
are handed back. Blocks overlapping ``/etc/passwd`` or ``/etc/subuid`` are skipped.
A server killed with SIGKILL frees its lock at once, while what its jobs left may still
be dying: the next server to lock the block kills every process of its uids and takes
it only once none is left, zombies included (:func:`clear_uids`); a block whose
leftovers do not go within the wait is passed over.

Where the machine does not allow a step (not root, a container without
``CAP_SYS_ADMIN``), :func:`probe` finds out at server start by trying it, the
server leaves it out, and the executor logs a warning and reports it
(:attr:`~hypermedia.sandbox.executor.ChildExecutor.capabilities`): degraded,
never pretended. A job uid needs root and, without the mount namespace, a work
root and ``sys.path`` the job uid can reach.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import posixpath
import signal
import socket
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from hypermedia.sandbox.syscalls import FilterUnavailable, Program, compile_filter
from hypermedia.sandbox.tinyinit import TinyInits

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
SYS_MOUNT_SETATTR = 442  # one number on every architecture (added after the tables merged)
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38

# Covered for every job (paths covered, not used: hence the noqa); what a step needs
# from under them (an interpreter under /root/.pyenv) is bound back.
DEFAULT_COVERED = (
    "/tmp",  # noqa: S108
    "/var/tmp",  # noqa: S108
    "/run",
    "/dev/shm",  # noqa: S108
    "/root",
    "/home",
)
# Hidden for good: nothing at or under them is bound back.
DEFAULT_HIDDEN = ("/etc/hypermedia",)
# Where a code directory is never covered: a worker started in /usr/bin must not hide
# the tools its steps run, nor one started in /etc the machine's configuration.
SYSTEM_TREES = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/proc",
    "/sys",
    "/dev",
    "/boot",
)
_ARCHIVE_ENTRIES = (".zip", ".egg", ".whl", ".pyz")
UID_BASE = 200_000
UID_SLOTS = 64  # concurrent jobs per fork server (a worker runs at most 64 claim loops)
UID_BLOCKS = 512
LOCK_DIR = "/run/hypermedia-sandbox"
COVER_OPTIONS = b"mode=755,size=1m,nr_inodes=4096"

FEATURES = (
    "network_namespace",
    "mount_namespace",
    "own_uid",
    "private_proc",
    "syscall_filter",
    "pid_namespace",
)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.unshare.argtypes = [ctypes.c_int]
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
_libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
_libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def setns(fd: int, flags: int) -> None:
    _check(_libc.setns(fd, flags), "setns")


def mount(
    source: str | None, target: str, fstype: str | None, flags: int, data: bytes = b""
) -> None:
    _check(
        _libc.mount(
            source.encode() if source is not None else None,
            target.encode(),
            fstype.encode() if fstype is not None else None,
            flags,
            data or None,
        ),
        f"mount {target}",
    )


def mount_setattr(
    path: str, *, set_: int = 0, clear: int = 0, propagation: int = 0, recursive: bool = False
) -> None:
    attr = _MountAttr(set_, clear, propagation, 0)
    result = _libc.syscall(
        ctypes.c_long(SYS_MOUNT_SETATTR),
        ctypes.c_int(AT_FDCWD),
        ctypes.c_char_p(path.encode()),
        ctypes.c_uint(AT_RECURSIVE if recursive else 0),
        ctypes.byref(attr),
        ctypes.c_size_t(ctypes.sizeof(attr)),
    )
    _check(result, f"mount_setattr {path}")


# -- the view: pure ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Mount:
    """One step of a view: ``cover`` (an empty tmpfs) or ``expose`` (bound back)."""

    kind: str
    path: str


def _within(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _depth(path: str) -> int:
    return 0 if path == "/" else path.count("/")


def plan_view(
    covers: Iterable[str], exposes: Iterable[str], work_root: str, hidden: Iterable[str] = ()
) -> list[Mount]:
    """The mounts that hide ``covers`` and ``hidden`` but keep ``exposes`` visible,
    outermost first.

    Absolute, normalised, symlink-free paths. The work root is always covered (each
    job's workdir is bound in on its own) and, like every ``hidden`` path, nothing at
    or inside it is exposed. At the same path a cover wins over an expose. A mount
    that changes nothing (a cover inside a cover, an expose of something visible) is
    left out.
    """
    events: dict[str, str] = {}
    sealed = [work_root]
    for path in covers:
        if path == "/":
            raise ValueError("cannot hide /")
        events[path] = "cover"
    for path in hidden:
        if path == "/":
            raise ValueError("cannot hide /")
        events[path] = "cover"
        sealed.append(path)
    for path in exposes:
        if path != "/" and path not in events and not any(_within(path, s) for s in sealed):
            events[path] = "expose"
    events[work_root] = "cover"
    plan = []
    for path in sorted(events, key=lambda p: (_depth(p), p)):
        above = "expose"  # the real filesystem: visible
        best = -1
        for other, kind in events.items():
            if other != path and _within(path, other) and _depth(other) > best:
                above, best = kind, _depth(other)
        if events[path] != above:
            plan.append(Mount(events[path], path))
    return plan


def outermost(paths: Iterable[str]) -> list[str]:
    """The paths that are not inside another of them."""
    result: list[str] = []
    for path in sorted(set(paths), key=lambda p: (_depth(p), p)):
        if not any(_within(path, kept) for kept in result):
            result.append(path)
    return result


def out_of_sight(plan: Sequence[Mount], exposes: Iterable[str], path: str) -> bool:
    """Whether hiding ``path`` (absolute, normalised, symlink-free) would change nothing of
    the view ``plan`` that :func:`plan_view` made from ``exposes`` (all of them, kept or
    not): its nearest enclosing mount is a cover and no expose lies at or inside it, so
    the view with it hidden too is the same plan, with the same exposes kept."""
    if any(_within(exposed, path) for exposed in exposes):
        return False
    nearest = _nearest_mount(plan, path)
    return nearest is not None and nearest.kind == "cover"


def cover_of(plan: Sequence[Mount], path: str) -> str:
    """The cover a path lies under (its nearest enclosing mount of the plan)."""
    nearest = _nearest_mount(plan, path)
    if nearest is None or nearest.kind != "cover":
        raise ValueError(f"{path} is not under a cover")
    return nearest.path


def _nearest_mount(plan: Sequence[Mount], path: str) -> Mount | None:
    """The deepest mount of ``plan`` at or above ``path``, if any."""
    best: Mount | None = None
    for step in plan:
        if _within(path, step.path) and (best is None or _depth(step.path) > _depth(best.path)):
            best = step
    return best


# -- settings and state -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Settings:
    """What the executor asks for; the server turns it into an :class:`Isolation`."""

    enabled: bool
    work_root: str
    jobs_root: str
    hidden: tuple[str, ...]  # nothing at or under them is exposed
    exposed: tuple[str, ...]
    uid_base: int = UID_BASE
    covered: tuple[str, ...] = DEFAULT_COVERED  # what is needed under them is exposed
    pid_init: str = "tiny"  # a PID namespace's init: "tiny" (:mod:`.tinyinit`) or "copy"


def real_paths(paths: Iterable[str]) -> list[str]:
    """Existing paths, absolute and symlink-free, without duplicates (order kept)."""
    found: dict[str, None] = {}
    for path in paths:
        if path and os.path.isabs(path) and os.path.exists(path):
            found[os.path.realpath(path)] = None
    return list(found)


@dataclass(frozen=True, slots=True)
class LoadedModule:
    """What :func:`code_view` needs of a module in ``sys.modules``."""

    name: str
    file: str | None  # real path; a package's ``__init__``
    package: bool
    locations: tuple[str, ...] = ()  # a namespace package's directories


@dataclass(frozen=True, slots=True)
class CodeView:
    """What a step's code needs exposed, and the code directories to cover."""

    exposes: tuple[str, ...]
    covers: tuple[str, ...]


def module_top(module: LoadedModule) -> list[str]:
    """The directory of a module's top-level package (a top-level module: its file).

    ``a.b.c`` in ``/x/a/b/c.py`` is ``/x/a``, not ``/x`` (which is the ``sys.path``
    entry and holds whatever else lies there). A file whose directories do not spell
    its name is exposed alone.
    """
    if module.file is None:
        last = module.name.rsplit(".", 1)[-1]
        found = [d for d in module.locations if posixpath.basename(d) == last]
        return [module_top(LoadedModule(module.name, f"{d}/__init__.py", True))[0] for d in found]
    parts = module.name.split(".")
    if not module.package:
        parts = parts[:-1]
    if not parts:
        return [module.file]
    directory = posixpath.dirname(module.file)
    for part in reversed(parts):
        if posixpath.basename(directory) != part:
            return [module.file]
        top, directory = directory, posixpath.dirname(directory)
    return [top]


def code_view(
    prefixes: Iterable[str],
    search_path: Iterable[str],
    modules: Iterable[LoadedModule],
    also_cover: Iterable[str] = (),
) -> CodeView:
    """What to expose for a step's code and which code directories to cover. Pure.

    Exposed: the interpreter's ``prefixes``, ``search_path`` entries inside them or
    named ``site-packages``/``dist-packages`` (so lazy imports work), archives on
    it, and each loaded module's top-level package (:func:`module_top`). Every other
    ``search_path`` entry (the driver's working directory Ray adds, a checkout, a
    ``PYTHONPATH`` directory) and each of ``also_cover`` is covered, unless it is
    ``/``, in a :data:`SYSTEM_TREES` tree, or at or inside something exposed.
    """
    prefixes = list(prefixes)
    exposes: dict[str, None] = dict.fromkeys(prefixes)
    foreign = []
    for entry in search_path:
        if (
            any(_within(entry, prefix) for prefix in prefixes)
            or posixpath.basename(entry) in ("site-packages", "dist-packages")
            or entry.endswith(_ARCHIVE_ENTRIES)
        ):
            exposes[entry] = None
        else:
            foreign.append(entry)
    for module in modules:
        exposes.update(dict.fromkeys(module_top(module)))
    covers: dict[str, None] = {}
    for path in [*foreign, *also_cover]:
        if (
            path != "/"
            and not any(_within(path, tree) for tree in SYSTEM_TREES)
            and not any(_within(path, exposed) for exposed in exposes)
        ):
            covers[path] = None
    return CodeView(tuple(outermost(exposes)), tuple(covers))


def code_paths(modules: Iterable[Any], also_cover: Iterable[str] = ()) -> CodeView:
    """:func:`code_view` of this interpreter, its ``sys.path`` and ``modules``."""
    import sys

    prefixes = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    prefixes.append(os.path.dirname(os.path.realpath(sys.executable)))
    loaded = []
    for module in modules:
        spec = getattr(module, "__spec__", None)
        name = getattr(spec, "name", None) or getattr(module, "__name__", None)
        file = getattr(module, "__file__", None)
        path = getattr(module, "__path__", None)
        if not isinstance(name, str):
            continue
        if isinstance(file, str) and os.path.isabs(file) and os.path.exists(file):
            loaded.append(LoadedModule(name, os.path.realpath(file), path is not None))
        elif file is None and path is not None:
            try:
                locations = [p for p in path if isinstance(p, str)]
            except TypeError:
                continue
            loaded.append(LoadedModule(name, None, True, tuple(real_paths(locations))))
    return code_view(
        real_paths(prefixes),
        real_paths(p for p in sys.path if isinstance(p, str)),
        loaded,
        real_paths(also_cover),
    )


class Isolation:
    """The fork server's sandbox: what the machine allowed, and the uid block it holds.

    Built once in the server (:meth:`start`), used by every spare it forks.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.plan: list[Mount] = []
        self.reachable: list[str] = []  # what a job's uid must reach: the exposes kept
        self.jobs_cover = ""
        self.network = False
        self.mounts = False
        self.private_proc = False
        self.program: Program | None = None  # the seccomp filter, when the machine allows it
        self.pid_namespace = False
        self._own_pid_namespace: int | None = None  # the server's, to come back to
        # The inits of those namespaces, when they are not the spares (:mod:`.tinyinit`).
        self.tiny_inits: TinyInits | None = None
        # A mount namespace holding the view but the jobs cover (:meth:`_make_template`):
        # spares copy it instead of building the view each.
        self.template: int | None = None
        # Per job uid (made on its first job): the network namespace's fd; and the
        # server's own, to come back to, when jobs get their uid's.
        self._network_namespaces: dict[int, int] = {}
        self._own_network: int | None = None
        self.uids: list[int] = []  # the block, when jobs get a uid of their own
        self.missing: dict[str, str] = {}
        self._lock_fd: int | None = None

    # -- in the server

    @classmethod
    def start(cls, settings: Settings, fork: Callable[[], int]) -> Isolation:
        """Claim a uid block, kill what earlier owners left, probe what works."""
        isolation = cls(settings)
        if not settings.enabled:
            for feature in FEATURES:
                isolation.missing[feature] = "the sandbox is switched off (sandbox=False)"
            return isolation
        covers = real_paths(settings.covered)
        hidden = real_paths(settings.hidden)
        exposes = [p for p in settings.exposed if os.path.exists(p)]
        isolation.plan = plan_view(covers, exposes, settings.work_root, hidden)
        sealed = {*covers, *hidden}
        isolation.reachable = [
            p
            for p in exposes
            if p not in sealed and not any(_within(p, h) for h in [settings.work_root, *hidden])
        ]
        isolation.jobs_cover = cover_of(isolation.plan, settings.jobs_root)
        if os.geteuid() == 0:
            try:
                isolation._claim_uids(fork)
            except OSError as exc:
                isolation.missing["own_uid"] = f"no uid block: {exc}"
        else:
            isolation.missing["own_uid"] = "the worker does not run as root"
        try:
            isolation.program = Program(compile_filter())
        except FilterUnavailable as exc:
            isolation.missing["syscall_filter"] = str(exc)
        found = probe(isolation, fork)
        if found.get("syscall_filter") is not True:
            isolation.program = None
        isolation.network = found.get("network_namespace") is True
        isolation.mounts = found.get("mount_namespace") is True
        isolation.private_proc = isolation.mounts and found.get("private_proc") is True
        if found.get("pid_namespace") is True:
            isolation._own_pid_namespace = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
            isolation.pid_namespace = True
            if settings.pid_init == "tiny":
                isolation._start_tiny_inits(fork)
            else:
                isolation.missing["tiny_init"] = f"pid_init is {settings.pid_init!r}"
        if isolation.uids and found.get("own_uid") is not True:
            isolation._release_uids()
        if isolation.network and isolation.uids:
            isolation._own_network = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        if isolation.mounts:
            isolation.template = isolation._make_template(fork)
        for feature in FEATURES:
            if found.get(feature) is not True:
                isolation.missing.setdefault(feature, str(found.get(feature) or "not tried"))
        return isolation

    @property
    def own_uid(self) -> bool:
        return bool(self.uids)

    def capabilities(self) -> dict[str, Any]:
        return {
            "network_namespace": self.network,
            "mount_namespace": self.mounts,
            "own_uid": self.own_uid,
            "private_proc": self.private_proc,
            "syscall_filter": self.program is not None,
            "pid_namespace": self.pid_namespace,
            "tiny_init": self.tiny_inits is not None,
            "uid_range": [self.uids[0], self.uids[-1]] if self.uids else None,
            "missing": dict(self.missing),
        }

    def _claim_uids(self, fork: Callable[[], int]) -> None:
        """The lowest free block that nothing of an earlier owner's is left in: its
        processes killed, and gone (zombies too: they count for ``RLIMIT_NPROC``; a
        server killed with SIGKILL frees its lock at once, while what its jobs left is
        still dying or waiting to be reaped by an ancestor). A block whose leftovers do
        not go within the wait is passed over."""
        taken = _taken_uid_ranges()
        os.makedirs(LOCK_DIR, mode=0o700, exist_ok=True)
        uncleared = 0
        for block in range(UID_BLOCKS):
            first = self.settings.uid_base + block * UID_SLOTS
            last = first + UID_SLOTS - 1
            if any(start <= last and first <= end for start, end in taken):
                continue
            fd = os.open(f"{LOCK_DIR}/{first}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            uids = list(range(first, last + 1))
            if not clear_uids(uids, fork):
                os.close(fd)
                uncleared += 1
                continue
            self._lock_fd = fd
            self.uids = uids
            return
        if uncleared:
            raise OSError(
                errno.EBUSY,
                f"every uid block is taken ({uncleared} free but holding an earlier "
                "server's processes that would not end)",
            )
        raise OSError(errno.EBUSY, "every uid block is taken")

    def _release_uids(self) -> None:
        self.uids = []
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def network_namespace_of(self, uid: int) -> int | None:
        """The descriptor of the network namespace jobs of ``uid`` enter, made here in
        the server on the uid's first job (the server is put back into its own at
        once). None: spares make their own (no job uids), or it could not be made (the
        job's process then makes one of its own, :meth:`enter`)."""
        if self._own_network is None:
            return None
        found = self._network_namespaces.get(uid)
        if found is None:
            try:
                unshare(CLONE_NEWNET)
                try:
                    found = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
                finally:
                    setns(self._own_network, CLONE_NEWNET)
            except OSError:
                return None
            self._network_namespaces[uid] = found
        return found

    def _make_template(self, fork: Callable[[], int]) -> int | None:
        """The view but the jobs cover and what lies under it, built once in a mount
        namespace that a throwaway child makes; kept by its descriptor (None: it could
        not be made, and each spare builds the whole view).

        A spare then copies it (``setns``, ``unshare(CLONE_NEWNS)``) and adds its own
        jobs cover (:meth:`prepare`): one tmpfs and the ``/proc`` of its PID namespace
        instead of a tmpfs per cover and a bind per expose. The covers it shares with
        the template are read-only and empty, so nothing a job does shows in another's
        copy. Measured per spare (fork, view, exit): 3.1 -> 2.0 ms of CPU."""
        reader, writer = os.pipe()
        server = os.getpid()
        pid = fork()
        if pid == 0:
            try:
                # It pauses until the server kills it: a server killed meanwhile (at its
                # start) left it paused for ever, holding what the server held open.
                _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
                if os.getppid() != server:
                    os._exit(0)
                os.close(reader)
                unshare(CLONE_NEWNS)
                self._build(self._template_steps(), jobs_cover=False)
                os.write(writer, b"+")
                while True:  # until the server has its namespace and kills it
                    signal.pause()
            finally:
                os._exit(1)
        os.close(writer)
        template = None
        try:
            if os.read(reader, 1) == b"+":
                template = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            template = None
        finally:
            os.close(reader)
            with suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            _wait(pid)
        return template

    def _template_steps(self) -> list[Mount]:
        return [step for step in self.plan if not _within(step.path, self.jobs_cover)]

    def _spare_steps(self) -> list[Mount]:
        return [step for step in self.plan if _within(step.path, self.jobs_cover)]

    def close(self) -> None:
        if self.template is not None:
            os.close(self.template)
            self.template = None
        for fd in self._network_namespaces.values():
            os.close(fd)
        self._network_namespaces.clear()
        if self._own_network is not None:
            os.close(self._own_network)
            self._own_network = None
        self._release_uids()
        if self._own_pid_namespace is not None:
            os.close(self._own_pid_namespace)
            self._own_pid_namespace = None

    @property
    def spare_is_init(self) -> bool:
        """Whether a spare is its PID namespace's init (it then forks the job's process)."""
        return self.pid_namespace and self.tiny_inits is None

    def _start_tiny_inits(self, fork: Callable[[], int]) -> None:
        """Use :mod:`.tinyinit` if this machine has its code and a job's process forked
        into such a namespace is its pid 2; else spares are their namespaces' inits."""
        try:
            tiny = TinyInits.for_this_machine()
        except OSError as exc:
            self.missing["tiny_init"] = _reason(exc)
            return
        if tiny is None:
            self.missing["tiny_init"] = "no init code for this architecture"
            return
        self.tiny_inits = tiny
        try:
            pid, init = self.fork_spare(fork)
        except OSError as exc:
            self.tiny_inits = None
            self.missing["tiny_init"] = _reason(exc)
            return
        if pid == 0:
            os._exit(0 if os.getpid() == 2 else 1)
        code = _wait(pid)
        if init is not None:
            with suppress(OSError):
                os.kill(init, signal.SIGKILL)
            _wait(init)
        if code != 0:
            self.tiny_inits = None
            self.missing["tiny_init"] = f"a job's process is not pid 2 in the namespace ({code})"

    def fork_spare(self, fork: Callable[[], int]) -> tuple[int, int | None]:
        """Fork a spare: with PID namespaces, into a namespace of its own. The spare's
        pid (0 in the spare) and its namespace's init's (None: no namespace, or the
        spare is its init).

        With :mod:`.tinyinit`, the init is cloned first and the spare forked into its
        namespace (``setns`` on the init's pidfd): the spare is pid 2 there and this
        process's child. Else the spare is the namespace's pid 1
        (``unshare(CLONE_NEWPID)`` moves only the children forked after it). Either
        way the server is put back into its own at once, so its other children are
        not moved."""
        if self._own_pid_namespace is None:
            return fork(), None
        init = None
        if self.tiny_inits is not None:
            init = self.tiny_inits.clone()
            try:
                init_fd = os.pidfd_open(init)
                try:
                    setns(init_fd, CLONE_NEWPID)
                finally:
                    os.close(init_fd)
            except OSError:
                with suppress(OSError):
                    os.kill(init, signal.SIGKILL)
                _wait(init)
                raise
        else:
            setns(self._own_pid_namespace, CLONE_NEWPID)  # unshare() refuses a second one
            unshare(CLONE_NEWPID)
        pid = -1
        try:
            pid = fork()
        finally:
            if pid != 0:
                setns(self._own_pid_namespace, CLONE_NEWPID)
                if pid < 0 and init is not None:
                    with suppress(OSError):
                        os.kill(init, signal.SIGKILL)
                    _wait(init)
        return pid, init

    # -- in a spare

    def prepare(self) -> int | None:
        """Namespaces and the read-only view, before the job: the jobs root's fd, if any.

        With a template (:meth:`_make_template`), a copy of it and the jobs cover on top;
        else the whole view built here. The template's descriptor is closed either way."""
        own_network = self.network and self._own_network is None
        copied = False
        if self.template is not None:  # made only where mount namespaces work
            try:
                setns(self.template, CLONE_NEWNS)
                copied = True
            except OSError:
                pass  # still in the server's namespace: the whole view is built here
            finally:
                os.close(self.template)
                self.template = None
        flags = (CLONE_NEWNET if own_network else 0) | (CLONE_NEWNS if self.mounts else 0)
        if flags:
            unshare(flags)
        if not self.mounts:
            return None
        if not copied:
            return self._build_view()
        jobs = self._build(self._spare_steps(), jobs_cover=True, private=False)
        self._mount_proc()
        return jobs

    def _build_view(self) -> int:
        """The whole view, in this (new) mount namespace: the jobs root's fd."""
        jobs = self._build(self.plan, jobs_cover=True)
        self._mount_proc()
        return jobs

    def _mount_proc(self) -> None:
        if self.private_proc:
            flags = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
            mount("proc", "/proc", "proc", flags, b"hidepid=invisible")

    def _build(self, steps: Sequence[Mount], *, jobs_cover: bool, private: bool = True) -> int:
        """Mount ``steps`` of the plan (every mount made read-only and private first,
        unless ``private`` is False: a copy of a template, which is already). With
        ``jobs_cover`` the steps hold the jobs cover: the jobs root, opened before it is
        covered, is returned, its mountpoint's directories made and the cover left
        writable (made read-only once the job's workdir is bound: :meth:`enter`)."""
        os.umask(0o022)
        sources = {}
        jobs = -1
        try:
            # Opened inside the new namespace (a descriptor from the old one cannot be
            # bound) and before the covers hide them.
            for step in steps:
                if step.kind == "expose":
                    sources[step.path] = os.open(step.path, os.O_PATH | os.O_CLOEXEC)
            if jobs_cover:
                flags = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
                jobs = os.open(self.settings.jobs_root, flags)
            if private:
                mount_setattr(
                    "/",
                    set_=MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID,
                    propagation=MS_PRIVATE,
                    recursive=True,
                )
            covered = []
            for step in steps:
                if step.kind == "cover":
                    if os.path.isdir(step.path):
                        flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
                        mount("tmpfs", step.path, "tmpfs", flags, COVER_OPTIONS)
                        covered.append(step.path)
                    elif os.path.lexists(step.path):
                        # A file (a hidden secret, such as the settings file): an empty
                        # one over it (/dev/null bound there: reads are empty).
                        mount("/dev/null", step.path, None, MS_BIND)
                        covered.append(step.path)
                else:
                    source = sources[step.path]
                    if os.path.isdir(f"/proc/self/fd/{source}"):
                        os.makedirs(step.path, exist_ok=True)
                    else:
                        os.makedirs(os.path.dirname(step.path), exist_ok=True)
                        os.close(os.open(step.path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC))
                    mount(f"/proc/self/fd/{source}", step.path, None, MS_BIND | MS_REC)
            if jobs_cover:
                os.makedirs(self.settings.jobs_root, exist_ok=True)
            for path in covered:
                if path != self.jobs_cover:  # read-only once the workdir's mountpoint exists
                    mount_setattr(path, set_=MOUNT_ATTR_RDONLY)
            return jobs
        except BaseException:
            if jobs >= 0:
                os.close(jobs)
            raise
        finally:
            for fd in sources.values():
                os.close(fd)

    def enter(
        self, jobs_fd: int | None, workdir: str | None, uid: int, network: int | None = None
    ) -> None:
        """The job arrived: its uid's network namespace entered (``network``, closed),
        its workdir bound read-write (and its only), then its uid. With no ``workdir``
        (upload inspection, :mod:`hypermedia.ingest.inspection`: it only reads a file
        it was handed open) nothing is writable: the jobs cover is made read-only empty."""
        if network is not None:
            try:
                setns(network, CLONE_NEWNET)
            finally:
                os.close(network)
        elif self._own_network is not None:
            unshare(CLONE_NEWNET)  # the uid's could not be made: one of its own
        if jobs_fd is not None and workdir is None:
            os.close(jobs_fd)
            mount_setattr(self.jobs_cover, set_=MOUNT_ATTR_RDONLY)
        elif jobs_fd is not None and workdir is not None:
            parent, name = os.path.split(workdir)
            if parent != self.settings.jobs_root or name in ("", ".", ".."):
                raise ValueError(f"workdir {workdir!r} is not in the jobs root")
            flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
            source = os.open(name, flags, dir_fd=jobs_fd)
            try:
                os.mkdir(workdir, 0o755)
                mount(f"/proc/self/fd/{source}", workdir, None, MS_BIND)
            finally:
                os.close(source)
                os.close(jobs_fd)
            mount_setattr(
                workdir, set_=MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, clear=MOUNT_ATTR_RDONLY
            )
            mount_setattr(self.jobs_cover, set_=MOUNT_ATTR_RDONLY)
        if uid:
            if workdir is not None:
                _chown_tree(workdir, uid)
            drop_to(uid)

    def filter_syscalls(self) -> None:
        """The seccomp filter (:mod:`.syscalls`), last before the step: for good."""
        if self.program is not None:
            self.program.install()


def _chown_tree(path: str, uid: int) -> None:
    os.lchown(path, uid, uid)
    with os.scandir(path) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                _chown_tree(entry.path, uid)
            else:
                os.lchown(entry.path, uid, uid)


def drop_to(uid: int) -> None:
    """Become ``uid``/``uid`` with no groups and no capabilities, for good."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    # Changing uid made the process non-dumpable (its /proc files root's); it is an
    # ordinary process of its uid now. Core files stay off (RLIMIT_CORE = 0).
    _check(_libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")


def _taken_uid_ranges() -> list[tuple[int, int]]:
    """uids of ``/etc/passwd`` and the ranges of ``/etc/subuid`` (rootless containers)."""
    taken = []
    for path, kind in (("/etc/passwd", "passwd"), ("/etc/subuid", "subuid")):
        try:
            with open(path) as lines:
                for line in lines:
                    fields = line.strip().split(":")
                    try:
                        if kind == "passwd" and len(fields) > 2:
                            taken.append((int(fields[2]), int(fields[2])))
                        elif kind == "subuid" and len(fields) == 3:
                            start = int(fields[1])
                            taken.append((start, start + int(fields[2]) - 1))
                    except ValueError:
                        continue
        except OSError:
            continue
    return taken


# -- killing a uid's processes -----------------------------------------------------------


def kill_uids(uids: Sequence[int], fork: Callable[[], int]) -> int:
    """Fork a child that kills every process of each uid; its pid.

    For each uid it takes the uid as its real and effective id, keeping root as the
    saved one so that it can take the next: ``kill(-1, SIGKILL)`` then reaches
    exactly the processes whose real or saved uid it is (not root's: the killer's
    real uid is no longer 0, and changing the effective uid cleared its effective
    capabilities). Processes it kills cannot be restarted by anyone but root.
    """
    pid = fork()
    if pid:
        return pid
    status = 0
    try:
        os.closerange(3, max(os.sysconf("SC_OPEN_MAX"), 1024))
        for uid in uids:
            os.setresuid(uid, uid, 0)
            for _attempt in range(3):  # a process mid-fork is caught by the next
                try:
                    os.kill(-1, signal.SIGKILL)
                except ProcessLookupError:
                    break
            os.setresuid(0, 0, 0)
    except BaseException:
        status = 1
    os._exit(status)


def clear_uids(uids: Sequence[int], fork: Callable[[], int], timeout: float = 5.0) -> bool:
    """True once no process of ``uids`` is left, zombies included: when there are some,
    :func:`kill_uids` (a killer stopped by a process it targets is tried again), then
    a wait of up to ``timeout`` for the kernel and their reaper to remove them.

    Each look reads every process's status (~1.2 ms of CPU with 140 processes): the
    wait looks again after 10 ms, then twice as long each time up to 0.1 s, not every
    10 ms (a zombie never reaped: ~0.55 -> ~0.07 CPU-s over the 5 s)."""
    import time

    if not processes_of_uids(uids):
        return True
    if not any(_killed(uids, fork, timeout) for _attempt in range(3)):
        return False
    deadline = time.monotonic() + timeout
    pause = 0.01
    while processes_of_uids(uids):
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.1)
    return True


def _killed(uids: Sequence[int], fork: Callable[[], int], timeout: float) -> bool:
    """Whether a :func:`kill_uids` killer ran to its end within ``timeout``."""
    import time

    pid = kill_uids(uids, fork)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status) == 0
        if time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return False
        time.sleep(0.005)


def processes_of_uids(uids: Sequence[int]) -> list[int]:
    """The pids of the processes whose real, effective, saved or filesystem uid is one of
    ``uids``, zombies included (``/proc/<pid>/status``)."""
    wanted = set(uids)
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as status:
                for line in status:
                    if line.startswith(b"Uid:"):
                        if wanted.intersection(int(u) for u in line.split()[1:]):
                            found.append(int(name))
                        break
        except OSError:  # gone meanwhile
            continue
    return found


def _wait(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


# -- the probe ------------------------------------------------------------------------


def probe(isolation: Isolation, fork: Callable[[], int]) -> dict[str, Any]:
    """Try each step in a throwaway child: feature -> True, or why not (a string)."""
    import json

    reader, writer = os.pipe()
    pid = fork()
    if pid == 0:
        os.close(reader)
        found: dict[str, Any] = {}
        try:
            _try_everything(isolation, found)
        except BaseException as exc:  # reported, not raised
            found.setdefault("error", f"{type(exc).__name__}: {exc}")
        try:
            os.write(writer, json.dumps(found).encode())
        finally:
            os._exit(0)
    os.close(writer)
    chunks = []
    with os.fdopen(reader, "rb") as pipe:
        while chunk := pipe.read(65536):
            chunks.append(chunk)
    _wait(pid)
    try:
        found = json.loads(b"".join(chunks) or b"{}")
    except ValueError:
        found = {}
    return found if isinstance(found, dict) else {}


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _try_everything(isolation: Isolation, found: dict[str, Any]) -> None:
    _try_pid_namespace(found)
    try:
        unshare(CLONE_NEWNET)
        with socket.socket() as sock:
            sock.settimeout(1)
            try:
                sock.connect(("127.0.0.1", 9))
                found["network_namespace"] = "connected to 127.0.0.1 in the new namespace"
            except OSError as exc:
                if exc.errno == errno.ENETUNREACH:
                    found["network_namespace"] = True
                else:
                    found["network_namespace"] = f"unexpected {_reason(exc)}"
    except OSError as exc:
        found["network_namespace"] = _reason(exc)
    jobs_fd = None
    try:
        unshare(CLONE_NEWNS)
        isolation.mounts = True
        isolation.private_proc = False
        jobs_fd = isolation._build_view()
        found["mount_namespace"] = True
        try:
            flags = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
            mount("proc", "/proc", "proc", flags, b"hidepid=invisible")
            found["private_proc"] = True
        except OSError as exc:
            found["private_proc"] = _reason(exc)
    except OSError as exc:
        found["mount_namespace"] = _reason(exc)
        found["private_proc"] = "needs the mount namespace"
    if isolation.uids:
        _try_uid(isolation, jobs_fd, found)
    _try_filter(isolation, found)


def _try_pid_namespace(found: dict[str, Any]) -> None:
    try:
        unshare(CLONE_NEWPID)
        pid = os.fork()
        if pid == 0:
            os._exit(0 if os.getpid() == 1 else 1)
        code = _wait(pid)
        found["pid_namespace"] = True if code == 0 else f"the first child is not pid 1 ({code})"
    except OSError as exc:
        found["pid_namespace"] = _reason(exc)


def _try_uid(isolation: Isolation, jobs_fd: int | None, found: dict[str, Any]) -> None:
    settings = isolation.settings
    uid = isolation.uids[0]
    needed = outermost(isolation.reachable)  # seen as root
    try:
        if jobs_fd is not None:
            os.close(jobs_fd)
        drop_to(uid)
        # What a job must reach as its uid: its workdir's directory, the interpreter.
        os.stat(settings.jobs_root)
        for path in needed:
            if os.path.isdir(path):
                os.listdir(path)
            else:
                with open(path, "rb"):
                    pass
        found["own_uid"] = True
    except OSError as exc:
        found["own_uid"] = f"a job uid cannot reach what it needs: {_reason(exc)}"


def _try_filter(isolation: Isolation, found: dict[str, Any]) -> None:
    """Load the filter (as a job would: no new privileges, maybe a job uid) and see
    it refuse ``unshare``, which would otherwise succeed (CLONE_NEWUSER)."""
    if isolation.program is None:
        return
    try:
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
        isolation.program.install()
    except OSError as exc:
        found["syscall_filter"] = _reason(exc)
        return
    try:
        unshare(CLONE_NEWUSER)
        found["syscall_filter"] = "unshare was let through"
    except OSError as exc:
        found["syscall_filter"] = True if exc.errno == errno.EPERM else _reason(exc)
