"""Pipeline steps that misbehave on purpose, for the sandbox tests and bench/executor.py.

Preload this module in a :class:`~hypermedia.sandbox.executor.ChildExecutor`
(``preload=("pipelines.registry", "tests.pipelines_for_tests")``); it registers
operations named ``test.*`` so they can never be mistaken for real ones. Only the
fork server and its children import it.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipelines.registry import Output, PipelineError, register

PRELOAD = ("pipelines.registry", "tests.pipelines_for_tests")


@register("test.noop")
def noop(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    return []


@register("test.write_files")
def write_files(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """``params["files"]``: ``{name: size in bytes}``, written and returned as outputs."""
    outputs = []
    for name, size in params["files"].items():
        path = workdir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * size)
        outputs.append(Output(f"file-{name}", path, "application/octet-stream"))
    return outputs


@register("test.copy_input")
def copy_input(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    out = workdir / "copy.bin"
    out.write_bytes(input_path.read_bytes())
    return [Output("copy", out, "application/octet-stream")]


@register("test.bad_output")
def bad_output(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """An output the executor must refuse: ``params["kind"]`` says which."""
    kind = params["kind"]
    if kind == "outside":
        return [Output("passwd", Path("/etc/passwd"), "text/plain")]
    if kind == "dotdot":
        return [Output("passwd", workdir / ".." / ".." / "x", "text/plain")]
    if kind == "symlink":
        (workdir / "link").symlink_to("/etc/passwd")
        return [Output("passwd", workdir / "link", "text/plain")]
    if kind == "symlinked_dir":
        (workdir / "etc").symlink_to("/etc")
        return [Output("passwd", workdir / "etc" / "passwd", "text/plain")]
    if kind == "hardlink":
        os.link(input_path, workdir / "hard")
        return [Output("hard", workdir / "hard", "text/plain")]
    if kind == "directory":
        (workdir / "d").mkdir()
        return [Output("d", workdir / "d", "text/plain")]
    if kind == "missing":
        return [Output("gone", workdir / "gone", "text/plain")]
    if kind == "not_a_list":
        return "nope"  # type: ignore[return-value]
    raise ValueError(kind)


@register("test.sleep")
def sleep(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """Sleep ``seconds``; first fork ``children`` grandchildren that sleep too (pids
    written to ``pids.txt``); ``escape``: one of them leaves the process group."""
    pids = []
    for index in range(int(params.get("children", 0))):
        pid = os.fork()
        if pid == 0:
            if params.get("escape") and index == 0:
                os.setsid()
            time.sleep(3600)
            os._exit(0)
        pids.append(pid)
    (workdir / "pids.txt").write_text("\n".join(map(str, pids)))
    time.sleep(float(params.get("seconds", 3600)))
    return []


@register("test.spin")
def spin(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    while True:
        pass


@register("test.allocate")
def allocate(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """Hold ``mb`` megabytes, touched, in 8 MB pieces."""
    held = []
    for _ in range(int(params["mb"]) // 8):
        held.append(bytearray(8 * 1024 * 1024))
    return []


@register("test.flood")
def flood(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """Write one file without end (1 MB at a time) until the limit stops it."""
    chunk = b"\0" * (1024 * 1024)
    with open(workdir / "flood.bin", "wb") as out:
        while True:
            out.write(chunk)
            out.flush()


@register("test.fail")
def fail(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    raise PipelineError(params["code"], params["message"], retryable=params["retryable"])


@register("test.crash")
def crash(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """``how``: ``raise`` (ValueError), ``exit`` (os._exit(3)), ``segv``, ``sys_exit``."""
    how = params.get("how", "raise")
    if how == "exit":
        os._exit(3)
    if how == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if how == "sys_exit":
        raise SystemExit(4)
    raise ValueError("boom: the step hit a bug")


@register("test.environment")
def environment(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """What the child sees: environment, cwd, open descriptors, process group, rlimits."""
    import json
    import resource
    import tempfile

    names = ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_CORE", "RLIMIT_NOFILE")
    seen = {
        "rlimits": {name: resource.getrlimit(getattr(resource, name)) for name in names},
        "environ": dict(os.environ),
        "cwd": os.getcwd(),
        "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
        "pid": os.getpid(),
        "pgid": os.getpgid(0),
        "sid": os.getsid(0),
        "tempdir": tempfile.gettempdir(),
    }
    out = workdir / "seen.json"
    out.write_text(json.dumps(seen))
    print("hello from the child")
    return [Output("seen", out, "application/json")]
