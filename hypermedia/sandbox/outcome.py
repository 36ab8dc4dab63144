"""What a finished child means: its outputs, or the :class:`ChildFailed` it amounts to.

The fork server reports how a child ended (:class:`ExitReport`) and passes on the
raw result the child wrote; :func:`interpret` decides, first match wins:

=================================  =======================  =========
how the child ended                code                     retryable
=================================  =======================  =========
killed by us: ``cancel()``         ``cancelled``            no
killed by us: wall clock           ``timeout``              yes
killed by us: the workdir outgrew  ``output_limit``         no
its disk budget
killed by us: executor closing     ``child_killed``         yes
SIGXCPU, or SIGKILL at the hard    ``cpu_limit``            no
``RLIMIT_CPU`` limit
SIGXFSZ                            ``output_limit``         no
SIGABRT or SIGTRAP near the        ``memory_limit``         no
memory limit (see below)
SIGSEGV, SIGBUS, SIGABRT, SIGILL,  ``pipeline_crashed``     no
SIGFPE, SIGSYS, SIGTRAP
any other signal (``kill -9``      ``child_killed``         yes
from outside, the OOM killer)
exit 0 with a result               the step's outputs, or its error as the child
                                   reported it (``PipelineError`` codes with their
                                   own flag; ``memory_limit``, ``output_limit``,
                                   ``process_limit``, ``pipeline_crashed``: no)
exit 72: could not enter its        ``sandbox_unavailable``  yes
sandbox (namespaces, uid)
any other exit                     ``pipeline_crashed``     no
=================================  =======================  =========

A C++ library that cannot allocate does not raise ``MemoryError``: it aborts
(``std::bad_alloc`` uncaught, PDFium's allocator on a failed allocation, SIGTRAP
for a fatal check). So an abort is the memory limit when the child's log says so
(``std::bad_alloc``, "out of memory", ``MemoryError``), or when its peak RSS had
reached :data:`NEAR_THE_CAP` of ``memory_limit_mb``: the allocation that fails is
typically a buffer doubling, so the child dies at half the cap or more (measured:
a PDF's content stream growing a path died of SIGABRT at 85 %, 61 % and 70 % of
512, 1024 and 2048 MB caps, with nothing on stderr).

A retry is worth it when the cause was outside the job (load, a node going away,
an operator); the same input under the same limits fails the same way otherwise.
The worker's attempt limit bounds both.

:func:`validate_outputs` then checks what the step claims to have written: regular
files inside the workdir, reached without symlinks, not hard links (a link to a
file outside would pass every other test), within ``max_output_bytes`` in total.
It runs in the worker after the job's processes are dead, so nothing can swap a
file between the check and the upload.
"""

from __future__ import annotations

import json
import os
import signal
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.registry import Output

SANDBOX_FAILED = 72  # a child's exit status: it could not enter its sandbox (EX_OSFILE)
NEAR_THE_CAP = 0.5  # of memory_limit_mb: an abort with a peak RSS this high ran out of memory
_OUT_OF_MEMORY_SIGNS = ("std::bad_alloc", "out of memory", "MemoryError", "Cannot allocate memory")
_ALLOCATION_CRASHES = frozenset({signal.SIGABRT, signal.SIGTRAP})

# SIGTRAP: a library's deliberate crash on a fatal check (PDFium's, when an allocation
# fails under RLIMIT_AS): the same input under the same limits does it again.
_CRASH_SIGNALS = frozenset(
    {
        signal.SIGSEGV,
        signal.SIGBUS,
        signal.SIGABRT,
        signal.SIGILL,
        signal.SIGFPE,
        signal.SIGSYS,
        signal.SIGTRAP,
    }
)


class ChildFailed(Exception):
    """A job's child did not produce outputs.

    Shaped like :class:`pipelines.registry.PipelineError` (whose codes pass through
    unchanged): a stable ``code``, a one-line ``message``, whether a retry could help.
    ``detail`` holds the traceback of a ``pipeline_crashed``, for the worker's log;
    ``log`` the end of what the child printed (the executor fills it in: the failed
    attempt keeps it for the job's owner).
    """

    def __init__(
        self, code: str, message: str, *, retryable: bool, detail: str = "", log: str = ""
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.retryable = retryable
        self.detail = detail
        self.log = log


@dataclass(frozen=True, slots=True)
class ExitReport:
    """How the fork server saw a child end."""

    pid: int
    exit_code: int | None
    signal: int | None
    killed_for: str | None  # "timeout" | "disk" | "cancelled" | "shutdown" | "abandoned" | None
    duration_ms: int
    maxrss_kb: int
    cpu_seconds: float


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def interpret(
    report: ExitReport,
    result: bytes,
    *,
    cpu_seconds: int,
    wall_clock_seconds: float,
    memory_limit_mb: int | None = None,
    log_tail: str = "",
) -> list[dict[str, Any]]:
    """The raw outputs the child reported, or raise the :class:`ChildFailed` it amounts to.

    ``cpu_seconds`` is the ``RLIMIT_CPU`` soft limit the child ran under,
    ``memory_limit_mb`` its ``RLIMIT_AS``; ``log_tail`` the end of what it printed.
    """
    signum = report.signal
    if signum == signal.SIGKILL and report.killed_for is not None:
        if report.killed_for == "cancelled":
            raise ChildFailed("cancelled", "the job was cancelled", retryable=False)
        if report.killed_for == "disk":
            raise ChildFailed(
                "output_limit",
                "the job's files outgrew its disk budget (max_output_bytes)",
                retryable=False,
            )
        if report.killed_for == "timeout":
            raise ChildFailed(
                "timeout",
                f"still running after the wall clock limit of {wall_clock_seconds:g} s",
                retryable=True,
            )
        raise ChildFailed(
            "child_killed", f"killed: {report.killed_for} (executor closing)", retryable=True
        )
    if signum is not None:
        if signum == signal.SIGXCPU or (
            signum == signal.SIGKILL and report.cpu_seconds >= cpu_seconds
        ):
            raise ChildFailed(
                "cpu_limit",
                f"used {report.cpu_seconds:.1f} s of CPU, the limit is {cpu_seconds} s",
                retryable=False,
            )
        if signum == signal.SIGXFSZ:
            raise ChildFailed("output_limit", "a file outgrew the limit (SIGXFSZ)", retryable=False)
        if signum in _ALLOCATION_CRASHES and _out_of_memory(report, memory_limit_mb, log_tail):
            peak = report.maxrss_kb / 1024
            raise ChildFailed(
                "memory_limit",
                f"the job ran out of memory: it died of {_signal_name(signum)} at a peak of"
                f" {peak:.0f} MB, the limit is {memory_limit_mb} MB",
                retryable=False,
            )
        if signum in _CRASH_SIGNALS:
            raise ChildFailed(
                "pipeline_crashed", f"the child died of {_signal_name(signum)}", retryable=False
            )
        raise ChildFailed(
            "child_killed", f"the child was killed by {_signal_name(signum)}", retryable=True
        )
    if report.exit_code == SANDBOX_FAILED:
        raise ChildFailed(
            "sandbox_unavailable",
            "the child could not enter its sandbox (see the worker's log)",
            retryable=True,
        )
    if report.exit_code != 0:
        raise ChildFailed(
            "pipeline_crashed",
            f"the child exited with status {report.exit_code} without a result",
            retryable=False,
        )
    return _parse_result(result)


def _out_of_memory(report: ExitReport, memory_limit_mb: int | None, log_tail: str) -> bool:
    if any(sign in log_tail for sign in _OUT_OF_MEMORY_SIGNS):
        return True
    if memory_limit_mb is None:
        return False
    return report.maxrss_kb >= NEAR_THE_CAP * memory_limit_mb * 1024


# Codes that only the executor gives, from how the child ended (the table above): a
# result that names one is the child's (a hostile file's) word, not the executor's. A
# forged "cancelled" left a job nobody cancelled neither failed nor cancelled. (A step
# may say "timeout" or "cpu_limit" itself: of a subprocess it ran, LibreOffice's or
# FFmpeg's.)
EXECUTOR_CODES = frozenset({"cancelled", "child_killed", "sandbox_unavailable"})


def _parse_result(result: bytes) -> list[dict[str, Any]]:
    try:
        body = json.loads(result)
        if not isinstance(body, dict):
            raise ValueError("not an object")
        error = body.get("error")
        if error is not None:
            code = str(error["code"])
            if code in EXECUTOR_CODES:  # only how the child ended says these
                raise ChildFailed(
                    "pipeline_crashed",
                    f"the child reported the executor's own code {code!r}:"
                    f" {str(error['message'])[:500]}",
                    retryable=False,
                )
            raise ChildFailed(
                code,
                str(error["message"]),
                retryable=bool(error.get("retryable", False)),
                detail=str(error.get("detail", "")),
            )
        outputs = body["outputs"]
        if not isinstance(outputs, list) or not all(isinstance(o, dict) for o in outputs):
            raise ValueError("outputs is not a list of objects")
        return outputs
    except ChildFailed:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise ChildFailed(
            "pipeline_crashed", f"the child's result is malformed ({exc})", retryable=False
        ) from None


def _invalid(message: str) -> ChildFailed:
    return ChildFailed("invalid_output", message, retryable=False)


def validate_outputs(
    raw: list[dict[str, Any]], workdir: Path, max_output_bytes: int
) -> list[Output]:
    """Check each reported output (see the module docstring); ``workdir`` must be resolved."""
    outputs: list[Output] = []
    total = 0
    for item in raw:
        output_type, content_type, reported = (
            item.get("output_type"),
            item.get("content_type"),
            item.get("path"),
        )
        if not (
            isinstance(output_type, str)
            and output_type
            and isinstance(content_type, str)
            and isinstance(reported, str)
        ):
            raise _invalid(f"malformed output {item!r}")
        path = Path(os.path.normpath(workdir / reported))
        if not path.is_relative_to(workdir) or path == workdir:
            raise _invalid(f"output {output_type!r} is outside the workdir: {reported!r}")
        try:
            if os.path.realpath(path) != str(path):
                raise _invalid(f"output {output_type!r} is reached through a symlink")
            info = path.lstat()
        except FileNotFoundError:
            raise _invalid(f"output {output_type!r} does not exist: {reported!r}") from None
        if not stat.S_ISREG(info.st_mode):
            raise _invalid(f"output {output_type!r} is not a regular file")
        if info.st_nlink != 1:
            raise _invalid(f"output {output_type!r} is a hard link")
        total += info.st_size
        if total > max_output_bytes:
            raise ChildFailed(
                "output_limit",
                f"outputs exceed {max_output_bytes} bytes",
                retryable=False,
            )
        outputs.append(Output(output_type, path, content_type))
    return outputs
