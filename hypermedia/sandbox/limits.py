"""What one job's child may use, as values: the profile's limits turned into rlimits.

Pure: no I/O, nothing imported that does any. The fork server applies the list
:meth:`Limits.rlimits` returns, by name, in the child just before the step runs.

=================  =======================================  ===========================
rlimit             value                                    what hitting it looks like
=================  =======================================  ===========================
``RLIMIT_AS``      ``memory_limit_mb`` (soft = hard)        ``MemoryError`` / ``ENOMEM``
``RLIMIT_CPU``     ``ceil(timeout_seconds)``, hard + 1 s    ``SIGXCPU``, then ``SIGKILL``
``RLIMIT_FSIZE``   ``max_output_bytes`` (per file)          ``EFBIG`` (``SIGXFSZ`` in
                                                            programs that don't ignore it)
``RLIMIT_CORE``    0                                        no core files
``RLIMIT_NOFILE``  ``open_files``                           ``EMFILE``
``RLIMIT_NPROC``   ``max_processes``, only with ``own_uid``  ``EAGAIN`` from fork, "can't
                                                            start new thread"
=================  =======================================  ===========================

``RLIMIT_AS`` covers the child's whole address space, including what it shares
with the warm server (about 15 MB for the interpreter, 40 MB with pyvips loaded).

``RLIMIT_NPROC`` counts every process *and thread* of the child's *real uid*
(zombies too), and root ignores it. Run as the worker's own user it would count
the worker, Ray and every other job too, so it is applied only when the child has
a uid of its own (:mod:`hypermedia.sandbox.isolation`: one per running job). A
thread-hungry library (onnxruntime starts one per core) needs ``max_processes``
above its thread count. Without a job uid the process count is bounded by the
wall clock, which kills the job's whole process group.

The wall clock (``timeout_seconds`` * 1.5) is enforced by the fork server, not by
an rlimit: it also catches a job that sleeps or waits, which ``RLIMIT_CPU`` does not.
So is the disk budget: ``RLIMIT_FSIZE`` bounds each file, and the fork server kills
a job whose workdir holds more than ``max_output_bytes`` beside its input, or more
than 20,000 files (measured every 0.25 s, less often for a workdir of many files:
``output_limit``), so that many files under the limit each cannot fill the disk.

``RLIMIT_AS`` bounds each process, not the job: a job of ``max_processes`` processes
may hold up to that many times ``memory_limit_mb``. Each job child sets its
``oom_score_adj`` to 1000, so should the node run out of memory the kernel kills a
job, not the worker, Ray or the head's services (a memory cgroup per job uid, which
would bound the job as a whole, is not built yet).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MIB = 1024 * 1024
# The seed's per-job limits ("Resource Limits (Per Job)"): the one copy of each, for
# the profiles' defaults, the record's columns and the executor.
WALL_CLOCK_FACTOR = 1.5
DEFAULT_MAX_OUTPUT_BYTES = 10 * 1024 * MIB
DEFAULT_MAX_PROCESSES = 16
DEFAULT_OPEN_FILES = 1024


def wall_clock_seconds(timeout_seconds: float) -> float:
    """How long a job may take by the clock: ``timeout_seconds`` x 1.5 (the seed's
    worker-side timer; a job's lease is this plus a grace period)."""
    return timeout_seconds * WALL_CLOCK_FACTOR


RLimit = tuple[str, int, int]  # (name in the resource module, soft, hard)


@dataclass(frozen=True, slots=True)
class Limits:
    """One job's limits, as the profile states them."""

    timeout_seconds: float
    memory_limit_mb: int
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    max_processes: int = DEFAULT_MAX_PROCESSES
    open_files: int = DEFAULT_OPEN_FILES

    def __post_init__(self) -> None:
        if not (self.timeout_seconds > 0 and math.isfinite(self.timeout_seconds)):
            raise ValueError(f"timeout_seconds must be > 0, got {self.timeout_seconds!r}")
        for name in ("memory_limit_mb", "max_output_bytes", "max_processes", "open_files"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    @property
    def wall_clock_seconds(self) -> float:
        return wall_clock_seconds(self.timeout_seconds)

    @property
    def cpu_seconds(self) -> int:
        """The ``RLIMIT_CPU`` soft limit: whole seconds, at least one."""
        return max(1, math.ceil(self.timeout_seconds))

    def rlimits(self, *, own_uid: bool = False) -> list[RLimit]:
        """The rlimits for the child, in the order they are set.

        ``own_uid``: the child runs under a uid no other process uses, so
        ``RLIMIT_NPROC`` counts only this job's processes (see the module docstring).
        """
        limits: list[RLimit] = [
            ("RLIMIT_CORE", 0, 0),
            ("RLIMIT_NOFILE", self.open_files, self.open_files),
            ("RLIMIT_FSIZE", self.max_output_bytes, self.max_output_bytes),
            ("RLIMIT_CPU", self.cpu_seconds, self.cpu_seconds + 1),
        ]
        if own_uid:
            limits.append(("RLIMIT_NPROC", self.max_processes, self.max_processes))
        # Last: everything before it may still allocate freely.
        memory = self.memory_limit_mb * MIB
        limits.append(("RLIMIT_AS", memory, memory))
        return limits
