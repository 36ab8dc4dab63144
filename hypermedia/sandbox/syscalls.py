"""The seccomp filter of a job's child: the syscalls a step never needs, refused.

A job's child has no capabilities, so most of these fail anyway; the filter is for
the ones an unprivileged process may still use (``unshare(CLONE_NEWUSER)`` and
``clone`` with namespace flags: a user namespace is where most kernel exploits
start; ``ptrace`` and ``process_vm_readv`` of a process of the same uid;
``userfaultfd``, ``perf_event_open``, ``bpf``, ``io_uring_*``: large kernel attack
surface; the keyring) and for a kernel whose capability checks have a hole.
Refused with ``EPERM`` (:data:`DENIED`, and ``clone`` with a namespace flag);
``clone3`` with ``ENOSYS``, because its flags are behind a pointer a filter cannot
read: the C library then falls back to ``clone``, whose flags it can. A syscall
of another ABI (i386 ``int 0x80``, x32) kills the process: no rule above could be
side-stepped through one.

:func:`compile_filter` asks libseccomp (its own Python binding: Debian's
``python3-seccomp``, which ``scripts/setup`` links into the virtualenv) for the BPF
program once, in the fork server; :class:`Program` loads it into a child with one
``prctl``, after the child's namespaces, view and uid are set up and just before
its step runs (``PR_SET_NO_NEW_PRIVS`` is already set, so no capability is needed).
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable
from typing import Any, BinaryIO

# Refused with EPERM, whatever the arguments. The first line is what the hardening
# issue asked for; then the rest of the mount API, modules, and the like.
DENIED = (
    "ptrace",
    "mount",
    "umount2",
    "unshare",
    "setns",
    "pivot_root",
    "kexec_load",
    "kexec_file_load",
    "bpf",
    "keyctl",
    "add_key",
    "request_key",
    "perf_event_open",
    "userfaultfd",
    "process_vm_readv",
    "process_vm_writev",
    "open_by_handle_at",
    # The new mount API: a mount by other means.
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "open_tree",
    "move_mount",
    "mount_setattr",
    # io_uring runs operations outside the syscall path a filter sees.
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "chroot",
    "acct",
    "quotactl",
    "syslog",
)
# clone() flags that make a namespace (CLONE_NEWTIME is not among clone()'s flags).
NAMESPACE_FLAGS = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}

_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_SPEC_ALLOW = 1 << 2
_BPF_INSTRUCTION_BYTES = 8  # struct sock_filter: u16 code, u8 jt, u8 jf, u32 k


class FilterUnavailable(Exception):
    """libseccomp's binding is missing or could not build the filter."""


def compile_filter() -> bytes:
    """The filter as the BPF program the kernel loads (libseccomp builds it)."""
    program = _export(lambda rules, out: rules.export_bpf(out))
    if not program or len(program) % _BPF_INSTRUCTION_BYTES:
        raise FilterUnavailable(f"libseccomp exported {len(program)} bytes, not a BPF program")
    return program


def describe_filter() -> str:
    """The same filter in libseccomp's pseudo-filter code (PFC): the rule of every
    syscall, by number and architecture, as people (and the tests) read it."""
    return _export(lambda rules, out: rules.export_pfc(out)).decode()


def _rules() -> Any:
    try:
        import seccomp
    except ImportError as exc:
        raise FilterUnavailable(
            f"libseccomp's Python binding is not installed ({exc}; Debian: python3-seccomp, "
            "linked into the virtualenv by scripts/setup)"
        ) from None
    rules = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    rules.set_attr(seccomp.Attr.CTL_OPTIMIZE, 2)
    for name in DENIED:
        rules.add_rule(seccomp.ERRNO(errno.EPERM), name)
    for flag in NAMESPACE_FLAGS.values():
        rules.add_rule(
            seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag)
        )
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    return rules


def _export(write: Callable[[Any, BinaryIO], None]) -> bytes:
    try:
        rules = _rules()
        reader, writer = os.pipe()
        try:
            with os.fdopen(writer, "wb", closefd=True) as out:
                write(rules, out)
            chunks = []
            while chunk := os.read(reader, 65536):
                chunks.append(chunk)
        finally:
            os.close(reader)
    except (OSError, RuntimeError, ValueError) as exc:
        raise FilterUnavailable(f"libseccomp could not build the filter: {exc}") from exc
    return b"".join(chunks)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class Program:
    """A BPF program made ready in the server, so that loading it in a child is one
    syscall (no allocation, no libseccomp).

    Loaded with ``SECCOMP_FILTER_FLAG_SPEC_ALLOW``: the kernel would otherwise force
    the Speculative Store Bypass mitigation on the child, which guards a process's
    memory from code running inside that same process (a JavaScript engine's
    sandbox); here the whole process is the job, so it guards nothing and slows the
    step. Where the kernel does not know the flag (before 4.17), ``prctl``.
    """

    def __init__(self, program: bytes) -> None:
        self._buffer = ctypes.create_string_buffer(program, len(program))
        self._fprog = _SockFprog(
            len(program) // _BPF_INSTRUCTION_BYTES, ctypes.addressof(self._buffer)
        )
        libc = ctypes.CDLL(None, use_errno=True)
        self._syscall = libc.syscall
        self._syscall.restype = ctypes.c_long
        self._prctl = libc.prctl
        self._prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong]
        self._prctl.restype = ctypes.c_int
        self._number = _seccomp_syscall_number()

    def install(self) -> None:
        """Filter this process's (and its future children's) syscalls, for good."""
        fprog = ctypes.byref(self._fprog)
        if self._number is not None:
            result = self._syscall(
                ctypes.c_long(self._number),
                ctypes.c_uint(_SECCOMP_SET_MODE_FILTER),
                ctypes.c_uint(_SECCOMP_FILTER_FLAG_SPEC_ALLOW),
                fprog,
            )
            if result == 0:
                return
            code = ctypes.get_errno()
            if code not in (errno.EINVAL, errno.ENOSYS):
                raise OSError(code, f"seccomp(SECCOMP_SET_MODE_FILTER): {os.strerror(code)}")
        if self._prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, fprog, 0):
            code = ctypes.get_errno()
            raise OSError(code, f"prctl(PR_SET_SECCOMP): {os.strerror(code)}")


def _seccomp_syscall_number() -> int | None:
    try:
        import seccomp
    except ImportError:
        return None
    try:
        return int(seccomp.resolve_syscall(seccomp.Arch.NATIVE, "seccomp"))
    except (ValueError, RuntimeError):
        return None
