"""Pipeline steps that misbehave on purpose, for the sandbox tests and bench/executor.py.

Preload this module in a :class:`~hypermedia.sandbox.executor.ChildExecutor`
(``preload=("pipelines.registry", "tests.pipelines_for_tests")``); it registers
operations named ``test.*`` so they can never be mistaken for real ones. Only the
fork server and its children import it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
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
    written to ``pids.txt``); ``escape``: one of them leaves the process group; ``say``:
    printed on stderr first; ``until``: a path: the sleep ends early once it exists."""
    if "say" in params:
        print(params["say"], file=sys.stderr, flush=True)
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
    seconds = float(params.get("seconds", 3600))
    if "until" not in params:
        time.sleep(seconds)
        return []
    deadline = time.monotonic() + seconds
    while not Path(params["until"]).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return []


@register("test.spin")
def spin(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """Burn CPU forever; ``threads`` > 1: in that many threads hashing without the GIL,
    so CPU time outruns the wall clock and RLIMIT_CPU, not the wall clock, stops it.
    ``cpu_seconds``: first lower the soft RLIMIT_CPU to that (a process may always
    lower it), so the kernel's SIGXCPU comes long before the wall clock even when a
    busy machine gives the job a small share of a core."""
    if "cpu_seconds" in params:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
        wanted = int(params["cpu_seconds"])
        resource.setrlimit(resource.RLIMIT_CPU, (min(wanted, soft), hard))
    threads = int(params.get("threads", 1))
    if threads <= 1:
        while True:
            pass
    import hashlib
    import threading

    block = b"x" * (1 << 20)

    def burn() -> None:
        while True:
            hashlib.sha256(block).digest()

    for _ in range(threads - 1):
        threading.Thread(target=burn, daemon=True).start()
    burn()
    return []


@register("test.allocate_on_images")
@register("test.allocate")
def allocate(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """Hold ``mb`` megabytes, touched, in 8 MB pieces."""
    held = []
    for _ in range(int(params["mb"]) // 8):
        held.append(bytearray(8 * 1024 * 1024))
    return []


@register("test.allocate_in_opencv")
def allocate_in_opencv(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """Ask OpenCV for an ``mb`` megabyte image (it raises ``cv2.error``, not
    MemoryError, when it cannot have it). Preload ``cv2`` with this module."""
    import cv2
    import numpy as np

    side = int((int(params["mb"]) * 1024 * 1024) ** 0.5)
    cv2.resize(np.zeros((8, 8), np.uint8), (side, side))
    return []


@register("test.flood")
def flood(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """Write one file without end (1 MB at a time) until the limit stops it."""
    chunk = b"\0" * (1024 * 1024)
    with open(workdir / "flood.bin", "wb") as out:
        while True:
            out.write(chunk)
            out.flush()


@register("test.flood_files")
def flood_files(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """Write 1 MB files without end, each far below any file size limit."""
    chunk = b"\1" * (1024 * 1024)
    for index in range(1_000_000):
        with open(workdir / f"part-{index}.bin", "wb") as out:
            out.write(chunk)
    return []


@register("test.progress")
def progress_steps(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """Report ``steps`` steps of ``unit``, ``seconds`` apart; ``flood``: first write that
    many progress messages straight to the result socket, as fast as it takes them."""
    from pipelines import progress

    flood = int(params.get("flood", 0))
    message = b'{"progress": {"done": 1, "total": 1000, "unit": "frames"}}'
    for _ in range(flood):
        with contextlib.suppress(BlockingIOError):
            os.write(3, message)
    steps = int(params.get("steps", 4))
    for step in range(1, steps + 1):
        time.sleep(float(params.get("seconds", 0.3)))
        progress.report(step, steps, params.get("unit", "pages"))
    return []


@register("test.fail")
def fail(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    raise PipelineError(params["code"], params["message"], retryable=params["retryable"])


@register("test.crash")
def crash(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """``how``: ``raise`` (ValueError), ``exit`` (os._exit(3)), ``segv``, ``sys_exit``;
    first ``lines`` lines naming the workdir printed on stderr."""
    for index in range(int(params.get("lines", 0))):
        print(f"line {index} of {workdir}", file=sys.stderr)
    sys.stderr.flush()
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
        "oom_score_adj": Path("/proc/self/oom_score_adj").read_text().strip(),
    }
    out = workdir / "seen.json"
    out.write_text(json.dumps(seen))
    print("hello from the child")
    return [Output("seen", out, "application/json")]


def _errno_name(exc: OSError) -> str:
    import errno

    return errno.errorcode.get(exc.errno or 0, str(exc.errno))


def _json_output(workdir: Path, name: str, value: Any) -> list[Output]:
    import json

    out = workdir / name
    out.write_text(json.dumps(value))
    return [Output(name, out, "application/json")]


@register("test.identity")
def identity(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """Who the child is: ids, capabilities, what it owns, which processes it sees, its
    network namespace, what it sees beside its workdir; ``hold``: seconds to wait first
    (so that jobs overlap)."""
    time.sleep(float(params.get("hold", 0)))
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    (workdir / "mine.txt").write_text("written by the job")
    stat = workdir.stat()
    return _json_output(
        workdir,
        "identity.json",
        {
            "uid": os.getresuid(),
            "gid": os.getresgid(),
            "groups": os.getgroups(),
            "cap_eff": status["CapEff"].strip(),
            "cap_prm": status["CapPrm"].strip(),
            "no_new_privs": status["NoNewPrivs"].strip(),
            "workdir_owner": [stat.st_uid, stat.st_gid],
            "input_owner": os.stat(input_path).st_uid,
            "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
            "pid": os.getpid(),
            "network_namespace": os.stat("/proc/self/ns/net").st_ino,
            "jobs_root": sorted(os.listdir(workdir.parent)),
        },
    )


@register("test.try_paths")
def try_paths(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """``write``: paths to create a file at; ``read``: paths to read (files) or list
    (directories); ``imports``: modules to import. Each: "ok" or the errno's name."""
    import importlib

    seen: dict[str, dict[str, str]] = {"write": {}, "read": {}, "imports": {}}
    for path in params.get("write", []):
        try:
            with open(path, "x") as out:
                out.write("x")
            seen["write"][path] = "ok"
        except OSError as exc:
            seen["write"][path] = _errno_name(exc)
    for path in params.get("read", []):
        try:
            if os.path.isdir(path):
                os.listdir(path)
            else:
                with open(path, "rb") as source:
                    source.read(1)
            seen["read"][path] = "ok"
        except OSError as exc:
            seen["read"][path] = _errno_name(exc)
    for name in params.get("imports", []):
        try:
            importlib.import_module(name)
            seen["imports"][name] = "ok"
        except Exception as exc:
            seen["imports"][name] = f"{type(exc).__name__}: {exc}"
    return _json_output(workdir, "paths.json", seen)


@register("test.read_bytes")
def read_bytes(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """``read``: paths to read; each: what it holds (up to 4 KB, as text) or the errno's
    name."""
    seen: dict[str, str] = {}
    for path in params.get("read", []):
        try:
            with open(path, "rb") as source:
                seen[path] = source.read(4096).decode(errors="replace")
        except OSError as exc:
            seen[path] = _errno_name(exc)
    return _json_output(workdir, "bytes.json", seen)


@register("test.connect")
def connect(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """Try to reach each ``[host, port]`` of ``targets`` over TCP; "connected" or the errno."""
    import socket

    seen = {}
    for host, port in params["targets"]:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.settimeout(2)
                sock.connect((host, port))
                sock.sendall(b"hello from a job")
                seen[f"{host}:{port}"] = "connected"
        except OSError as exc:
            seen[f"{host}:{port}"] = _errno_name(exc)
    interfaces = [name for _index, name in socket.if_nameindex()]
    return _json_output(workdir, "connect.json", {"targets": seen, "interfaces": interfaces})


@register("test.fork_bomb")
def fork_bomb(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """Every process forks for ever (each pid appended to ``pids.txt``); a process whose
    fork fails sleeps, except the first, which lets the error end the job once every
    child's pid is written (all but itself under ``RLIMIT_NPROC``; at most 20 s), and
    writes how many it counted then to ``at_limit.txt``. That count is the limit's:
    no process of the job exits before the first, whereas once the first has gone, a
    child that had not yet tried may fork one more before the sandbox kills them all."""
    import resource

    first = os.getpid()
    path = workdir / "pids.txt"
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    while True:
        try:
            pid = os.fork()
        except OSError:
            if os.getpid() == first:
                limit, _ = resource.getrlimit(resource.RLIMIT_NPROC)
                deadline = time.monotonic() + 20
                # A loaded machine may not have run the last children's writes yet.
                while time.monotonic() < deadline:
                    written = len(path.read_text().split())
                    if limit == resource.RLIM_INFINITY or written >= limit - 1:
                        break
                    time.sleep(0.05)
                (workdir / "at_limit.txt").write_text(f"{written}\n")
                raise
            time.sleep(3600)
            os._exit(0)
        if pid == 0:
            os.write(log, f"{os.getpid()}\n".encode())


@register("test.escape")
def escape(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """Leave two processes behind outside the job's process group: a child that calls
    setsid() and stays the parent of a grandchild (both pids in ``pids.txt``), then
    return at once. Only the job's uid ties them to the job."""
    reader, writer = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(3600)
            os._exit(0)
        os.write(writer, f"{os.getpid()}\n".encode())
        time.sleep(3600)
        os._exit(0)
    os.close(writer)
    with os.fdopen(reader) as pipe:
        escaped = pipe.readline().strip()
    grandchildren = [
        int(p) for p in os.listdir("/proc") if p.isdigit() and p not in (escaped, str(os.getpid()))
    ]
    (workdir / "pids.txt").write_text("\n".join([escaped, *map(str, grandchildren)]))
    return []


@register("test.syscalls")
def syscalls(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """Call each of ``calls`` (``[name, [args]]``) with ``syscall()``: "ok" or the
    errno's name; and the Seccomp line of /proc/self/status."""
    import ctypes
    import errno

    import seccomp  # the fork server loaded it: only its number table is used

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    seen: dict[str, str] = {}
    for name, args in params["calls"]:
        number = seccomp.resolve_syscall(seccomp.Arch.NATIVE, name)
        result = libc.syscall(ctypes.c_long(number), *(ctypes.c_long(a) for a in args))
        code = ctypes.get_errno()
        seen[name] = "ok" if result >= 0 else errno.errorcode.get(code, str(code))
    status = Path("/proc/self/status").read_text()
    mode = next(
        line.split(":")[1].strip() for line in status.splitlines() if line.startswith("Seccomp:")
    )
    return _json_output(workdir, "syscalls.json", {"calls": seen, "seccomp": mode})


@register("test.signal")
def signal_others(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """Send ``signal`` to each of ``pids``, and try to ptrace-attach to it: "ok" or the
    errno's name each; and the pids /proc shows."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    seen: dict[str, dict[str, str]] = {"kill": {}, "ptrace": {}}
    for pid in params["pids"]:
        try:
            os.kill(pid, int(params["signal"]))
            seen["kill"][str(pid)] = "ok"
        except OSError as exc:
            seen["kill"][str(pid)] = _errno_name(exc)
        ptrace_attach = 16
        result = libc.ptrace(ctypes.c_long(ptrace_attach), ctypes.c_long(pid), None, None)
        code = ctypes.get_errno()
        seen["ptrace"][str(pid)] = "ok" if result == 0 else _errno_name(OSError(code, ""))
    visible = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    return _json_output(workdir, "signal.json", {**seen, "visible": visible})


@register("test.tree")
def tree(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """Fork ``children`` that sleep, then report the pid, the parent's pid and the pids
    /proc shows; return with the children still running."""
    for _ in range(int(params["children"])):
        if os.fork() == 0:
            time.sleep(3600)
            os._exit(0)
    visible = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    return _json_output(
        workdir, "tree.json", {"pid": os.getpid(), "parent": os.getppid(), "visible": visible}
    )


@register("test.transcode_slowly", checkpoints=True)
def transcode_slowly(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """``transcode_video`` that waits ``pause_seconds`` after each checkpoint it finishes
    (a kill then lands between two chunks), or ``hold_seconds`` after the piece named
    ``hold_after`` (a kill then lands there on any machine; a retry that resumes that
    piece does not commit it again, so it does not wait); it counts the chunks it
    transcoded in its units of work, as ``transcode_video`` does."""
    from pipelines import checkpoints, media

    pause = float(params.get("pause_seconds", 0))
    hold_after, hold = params.get("hold_after"), float(params.get("hold_seconds", 0))
    commit = checkpoints.commit

    def slow_commit(workdir: Path, name: str, build: str = "") -> Path:
        path = commit(workdir, name, build)
        time.sleep(hold if name == hold_after else pause)
        return path

    checkpoints.commit = slow_commit  # this child's copy of the module only
    ours = ("pause_seconds", "hold_after", "hold_seconds")
    rest = {k: v for k, v in params.items() if k not in ours}
    return media.transcode_video_step(input_path, rest, workdir)


@register("test.ocr_slowly", checkpoints=True)
def ocr_slowly(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """``ocr`` committing its pages every ``every_pages`` pages, that waits
    ``hold_seconds`` after committing the piece named ``hold_after`` (a kill then lands
    there on any machine; a retry takes those pages and never commits that piece
    again); it counts the pages it read and took in its units of work, as ``ocr``
    does."""
    from pipelines import checkpoints, ocr, ocr_resume

    hold_after, hold = params.get("hold_after"), float(params.get("hold_seconds", 0))
    commit = checkpoints.commit

    def slow_commit(workdir: Path, name: str, build: str = "") -> Path:
        path = commit(workdir, name, build)
        if name == hold_after:
            time.sleep(hold)
        return path

    checkpoints.commit = slow_commit  # this child's copy of the module only
    ocr_resume.EVERY_PAGES = int(params.get("every_pages", ocr_resume.EVERY_PAGES))
    ours = ("hold_after", "hold_seconds", "every_pages")
    return ocr.ocr(input_path, {k: v for k, v in params.items() if k not in ours}, workdir)
