"""A PID namespace's init that is not a copy of the fork server.

Each job runs in a PID namespace of its own (:mod:`hypermedia.sandbox.forkserver`),
and a namespace needs an init: its pid 1, the reaper of its orphans, whose death
kills everything else in it. If the init is a fork of the server (a Python process
with every pipeline loaded), a job costs two big forks and two big exits: the
server's page tables copied and torn down twice, the top of a profile of busy
workers. Here the init is a process that shares the server's memory
(``clone(CLONE_VM | CLONE_NEWPID)``: no page table is copied, none torn down at its
exit) and runs a few instructions of machine code, never Python:

1. ``close_range``: none of the server's descriptors (the clone copied the table: its
   sockets must reach end of file when the server closes them) but one, a pidfd of
   the server's own (:class:`TinyInits` opens it once);
2. ``SIGCHLD`` ignored: the kernel reaps the orphans it inherits, no zombie waits;
3. every signal blocked (no handler of the server's could run on the shared memory);
4. ``prctl(PR_SET_PDEATHSIG, SIGKILL)``: it dies with the server;
5. ``poll`` on the server's pidfd until the server has exited, then ``exit_group``:
   a ``SIGKILL`` from the server ends it sooner, and either way every process left
   in its namespace ends with it.

Step 5 is why no init outlives its server. ``PDEATHSIG`` comes only to a child that
had set it when its parent died, and a namespace's pid 1 cannot tell by ``getppid``
(its parent is outside: 0 either way): a server killed between the clone and step 4
(Ray kills an actor's children as it kills the actor, at whatever they are doing; a
new init may not have run an instruction yet on a busy machine) left the init
paused for ever, holding the server's memory (two were left so, 52 MB together). The
pidfd is readable once the server is gone, whenever the init comes to look.

The server then forks the job's process into the namespace (``setns`` on the init's
pidfd, then ``fork``): pid 2 there, the server's own child, so its wait status comes
straight to the server. Measured standalone (pipelines loaded; namespace made, job
process forked into it and exited, all reaped): 1.94-3.45 ms a cycle against
3.38-5.32 ms with a copy of the server as init.

The executor also kills the server's process group (the inits never leave it) when
it reaps a server. The code is per architecture; where there is none
(:data:`TRAMPOLINES`) the spare is its namespace's init as before.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import platform

CLONE_VM = 0x00000100
CLONE_NEWPID = 0x20000000
SIGCHLD = 17

# Assembled from this (GNU as, Intel syntax), data after the code; ``server``, the
# number of the server's pidfd, is written in by :class:`TinyInits` (at least 3):
#     mov r12d, [rip+server]
#     xor edi, edi; lea esi, [r12-1]; xor edx, edx; mov eax, 436; syscall   close_range
#     lea edi, [r12+1]; mov esi, -1; xor edx, edx; mov eax, 436; syscall    close_range
#     mov edi, 17; lea rsi, [rip+act]; xor edx, edx; mov r10d, 8
#     mov eax, 13; syscall                                                  rt_sigaction
#     xor edi, edi; lea rsi, [rip+all]; xor edx, edx; mov r10d, 8
#     mov eax, 14; syscall                                                  rt_sigprocmask
#     mov edi, 1; mov esi, 9; xor edx, edx; xor r10d, r10d; xor r8d, r8d
#     mov eax, 157; syscall                                                 prctl
#     mov [rsp-16], r12d; mov dword ptr [rsp-12], 1     (struct pollfd: the pidfd, POLLIN)
#  1: lea rdi, [rsp-16]; mov esi, 1; mov edx, -1; mov eax, 7; syscall       poll
#     test eax, eax; jle 1b
#     xor edi, edi; mov eax, 231; syscall                                   exit_group
#     .balign 8
#     act: .quad 1, 0, 0, 0        (SIG_IGN, no flags, no restorer, empty mask)
#     all: .quad -1
#     server: .long 0
# The pollfd is below the stack's top words, which libc's clone writes for each new
# init (every init writes the same pollfd there).
TRAMPOLINES = {
    "x86_64": bytes.fromhex(
        "448b25c9000000"
        "31ff418d7424ff31d2b8b40100000f05"
        "418d7c2401beffffffff31d2b8b40100000f05"
        "bf11000000488d357200000031d241ba08000000b80d0000000f05"
        "31ff488d357a00000031d241ba08000000b80e0000000f05"
        "bf01000000be0900000031d24531d24531c0b89d0000000f05"
        "44896424f0c74424f401000000"
        "488d7c24f0be01000000baffffffffb8070000000f0585c07ee6"
        "31ffb8e70000000f05"
        "6690"
        "0100000000000000" + "00" * 24 + "ffffffffffffffff" + "00000000"
    ),
}
_SERVER_FD_SIZE = 4  # the code's last bytes: the server's pidfd

_PRIVATE = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
_READ_WRITE = mmap.PROT_READ | mmap.PROT_WRITE

_libc = ctypes.CDLL(None, use_errno=True)
_clone = _libc.clone
_clone.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
_clone.restype = ctypes.c_int
_mprotect = _libc.mprotect
_mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_mprotect.restype = ctypes.c_int


class TinyInits:
    """The machine code in an executable page of the server's, and the few bytes of
    stack that libc's ``clone`` needs to call it (shared by every init: they write the
    same two words there and never return). Kept for the server's life."""

    def __init__(self, code: bytes) -> None:
        # This process's pidfd, which every init keeps and polls (a number the code
        # cannot mistake for "below 0": at least 3), kept open for the server's life.
        own = os.pidfd_open(os.getpid())
        try:
            self._server_fd = fcntl.fcntl(own, fcntl.F_DUPFD_CLOEXEC, 3)
        finally:
            os.close(own)
        self._code = mmap.mmap(-1, mmap.PAGESIZE, _PRIVATE, _READ_WRITE)
        self._code.write(code[:-_SERVER_FD_SIZE] + self._server_fd.to_bytes(4, "little"))
        self._code_address = ctypes.addressof(ctypes.c_char.from_buffer(self._code))
        if _mprotect(self._code_address, mmap.PAGESIZE, mmap.PROT_READ | mmap.PROT_EXEC):
            error = ctypes.get_errno()
            raise OSError(error, f"mprotect: {os.strerror(error)}")
        self._stack = mmap.mmap(-1, mmap.PAGESIZE, _PRIVATE, _READ_WRITE)
        stack_address = ctypes.addressof(ctypes.c_char.from_buffer(self._stack))
        self._stack_top = stack_address + mmap.PAGESIZE - 64

    @classmethod
    def for_this_machine(cls) -> TinyInits | None:
        """None where no code is written for this architecture."""
        code = TRAMPOLINES.get(platform.machine())
        return cls(code) if code is not None else None

    def clone(self) -> int:
        """A new PID namespace and its init, a child of this process: the init's pid."""
        flags = CLONE_VM | CLONE_NEWPID | SIGCHLD
        pid: int = _clone(self._code_address, self._stack_top, flags, None)
        if pid < 0:
            error = ctypes.get_errno()
            raise OSError(error, f"clone: {os.strerror(error)}")
        return pid
