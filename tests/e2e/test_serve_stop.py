"""How ``hypermedia serve`` ends, and what it leaves: killed with 9, its upload
inspection server and the server's children end with it, and the work root a server
killed beside it could not remove is swept by the next server to start."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx
import psutil
import pytest

from hypermedia.embedded import EmbeddedRedis
from hypermedia.ingest.inspection import WORK_ROOT_PREFIX
from tests.api_support import REPO, serve_on_a_free_port
from tests.integration.test_api_inspection import PNG, crafted_pdf
from tests.support import within

P = "/v1/hypermedia"


class Serve:
    """``hypermedia serve`` processes on one data dir, with their own TMPDIR (where
    their inspection servers make their work roots)."""

    def __init__(self, tmp_path: Path, redis: EmbeddedRedis, record: tuple[Path, str]) -> None:
        self.tmp = tmp_path / "tmp"
        self.tmp.mkdir()
        self.log = tmp_path / "serve.log"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERMEDIA_")}
        self.env.update(
            HYPERMEDIA_DATA_DIR=str(tmp_path / "data"),
            HYPERMEDIA_REDIS_URL=redis.url,
            # A crafted PDF's inspection runs for seconds: long enough to be caught in it.
            HYPERMEDIA_INSPECTION_CPU_SECONDS="120",
            HYPERMEDIA_INSPECTION_WALL_SECONDS="240",
            PYTHONPATH=str(REPO),
            TMPDIR=str(self.tmp),
        )
        data, self.key = record  # migrated, alice in it: a copy for each test
        shutil.copytree(data, self.env["HYPERMEDIA_DATA_DIR"])
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self) -> tuple[subprocess.Popen[bytes], str]:
        process, url = serve_on_a_free_port(
            lambda port: [sys.executable, "-m", "hypermedia.cli", "serve", "--port", str(port)],
            self.env,
            self.log,
        )
        self.started.append(process)
        return process, url

    def upload(self, url: str, data: bytes, name: str = "a.png") -> httpx.Response:
        return httpx.put(
            f"{url}{P}/objects",
            params={"filename": name},
            content=data,
            headers={"Authorization": f"Bearer {self.key}"},
            timeout=300,
        )

    def roots(self) -> list[str]:
        return sorted(p.name for p in self.tmp.iterdir() if p.name.startswith(WORK_ROOT_PREFIX))

    def stop_all(self) -> None:
        for process in self.started:
            with suppress(ProcessLookupError):
                process.kill()
            process.wait()


def _cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "hypermedia.cli", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A data dir whose record is migrated and has alice (5 credits), and her key: made
    once (two commands, ~2 CPU-s), copied for each test's servers."""
    data = tmp_path_factory.mktemp("serve-record") / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERMEDIA_")}
    env.update(HYPERMEDIA_DATA_DIR=str(data), PYTHONPATH=str(REPO))
    _cli(env, "db", "upgrade")
    return data, _cli(env, "user", "add", "alice", "--credits", "5").strip()


@pytest.fixture
def serve(
    tmp_path: Path, private_redis: EmbeddedRedis, record: tuple[Path, str]
) -> Iterator[Serve]:
    servers = Serve(tmp_path, private_redis, record)
    try:
        yield servers
    finally:
        servers.stop_all()


def _inspection_server(api: int, timeout: float = 30.0) -> psutil.Process:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in psutil.Process(api).children():
            with suppress(psutil.Error):
                if "hypermedia.ingest.inspection" in child.cmdline():
                    return child
        time.sleep(0.05)
    raise AssertionError("no inspection server")


@contextmanager
def _inspecting(serve: Serve, url: str, api: int) -> Iterator[tuple[psutil.Process, int]]:
    """An upload of a crafted PDF (seconds of parsing) in flight: the API's inspection
    server and the pid of the child parsing it. A first upload has the server started
    and ready (as it starts, it runs short-lived children of other kinds)."""
    first = serve.upload(url, PNG)
    assert first.status_code == 201, first.text

    def upload() -> None:
        with suppress(httpx.HTTPError):  # the API is killed under it
            serve.upload(url, crafted_pdf(), "c.pdf")

    uploading = threading.Thread(target=upload, daemon=True)
    uploading.start()
    server = _inspection_server(api)
    deadline = time.monotonic() + 60
    while not (children := server.children()):
        assert time.monotonic() < deadline, "no inspection began"
        time.sleep(0.02)
    [child] = children
    try:
        yield server, child.pid
    finally:
        uploading.join(30)


def _gone(pid: int) -> bool:
    """Ended (a zombie that no one reaped yet runs nothing)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_serve_killed_with_9_leaves_no_inspection_process_nor_work_root(serve):
    # The API alone SIGKILLed mid-inspection: its server sees its control socket close,
    # kills and reaps its child, removes its work root and exits.
    api, url = serve.start()
    with _inspecting(serve, url, api.pid) as (server, child):
        [root] = serve.roots()
        assert re.fullmatch(rf"{WORK_ROOT_PREFIX}{server.pid}-\w+", root), root
        api.kill()
        api.wait()
        assert within(5, lambda: _gone(server.pid) and _gone(child))
    assert within(5, lambda: serve.roots() == [])

    # The API and its server SIGKILLed together (systemd's last kill of a unit, the OOM
    # killer's of a cgroup): the child dies with its server (PDEATHSIG); the server's
    # work root stays behind, for the next server to sweep.
    api, url = serve.start()
    with _inspecting(serve, url, api.pid) as (server, child):
        [left] = serve.roots()
        os.kill(server.pid, signal.SIGKILL)
        api.kill()
        api.wait()
        assert within(5, lambda: _gone(server.pid) and _gone(child))
    assert serve.roots() == [left]

    api, url = serve.start()
    answer = serve.upload(url, PNG)
    assert answer.status_code == 201, answer.text
    server = _inspection_server(api.pid)
    assert serve.roots() == [root for root in serve.roots() if f"-{server.pid}-" in root]
    assert left not in serve.roots()


class SlowUpload:
    """An upload whose body arrives at ``rate`` bytes/s (above the API's minimum), in a
    thread, until told to finish it or the API answers."""

    def __init__(self, url: str, key: str, declared: int, rate: int = 4096) -> None:
        self.declared = declared
        self.sent = 0
        self.finish = threading.Event()
        self.answer = b""
        port = int(url.rsplit(":", 1)[1])
        self.conn = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.conn.sendall(
            (
                f"PUT {P}/objects?filename=slow.bin HTTP/1.1\r\nHost: test\r\n"
                f"Authorization: Bearer {key}\r\nContent-Length: {declared}\r\n\r\n"
            ).encode()
        )
        self.rate = rate
        self.thread = threading.Thread(target=self._send, daemon=True)
        self.thread.start()

    def _send(self) -> None:
        self.conn.settimeout(0.25)
        try:
            while self.sent < self.declared:
                part = self.declared - self.sent if self.finish.is_set() else self.rate // 4
                self.conn.sendall(b"x" * part)
                self.sent += part
                with suppress(TimeoutError):
                    if chunk := self.conn.recv(65536):
                        self.answer += chunk
                        break
        except OSError:
            pass
        self.conn.settimeout(30)
        with suppress(OSError):
            while chunk := self.conn.recv(65536):
                self.answer += chunk

    def status(self) -> int:
        self.thread.join(30)
        self.conn.close()
        return int(self.answer.split(b" ", 2)[1]) if self.answer else 0


def test_serve_stopped_with_sigterm_during_slow_uploads_stops_in_bounded_time(serve):
    """A client streaming an upload slowly (above the minimum rate) held `serve`'s
    SIGTERM for as long as its body took (uvicorn waits for every request; a 100 MB body
    at 4 KB/s: seven hours). Now the requests in flight get api_shutdown_seconds: an
    upload that ends within it is stored, one still arriving then is refused (503,
    Retry-After) with nothing of it kept."""
    serve.env["HYPERMEDIA_API_SHUTDOWN_SECONDS"] = "3"
    api, url = serve.start()
    objects = Path(serve.env["HYPERMEDIA_DATA_DIR"]) / "objects"
    finishing = SlowUpload(url, serve.key, declared=20_000)
    trickling = SlowUpload(url, serve.key, declared=100_000_000)
    assert within(10, lambda: len(list(objects.rglob(".upload-*"))) == 2)
    stopping = time.monotonic()
    api.send_signal(signal.SIGTERM)
    time.sleep(1)
    finishing.finish.set()  # its body's rest, within the shutdown time
    # The trickling body alone would hold it for hours: stopping within the 30 s says
    # the shutdown time ended it. How long past its 3 s a loaded machine takes is no
    # assertion (one run beside other work took 8.6 s).
    try:
        code = api.wait(30)
    except subprocess.TimeoutExpired:
        raise AssertionError("serve did not stop within 30 s of SIGTERM") from None
    took = time.monotonic() - stopping
    assert code == 0, (code, took)
    assert finishing.status() == 201, finishing.answer
    assert trickling.status() == 503, trickling.answer
    assert b"retry-after" in trickling.answer.lower()
    assert b'"code":"service_unavailable"' in trickling.answer
    # The stored upload is its object's one file; nothing of the refused one is left.
    assert [p.stat().st_size for p in objects.rglob("*") if p.is_file()] == [20_000]
    assert "Traceback" not in serve.log.read_text()


# On the inspection server's path as sitecustomize: the crafted PDF's inspection (not
# the server's warm-up PDF's) takes 60 s.
_SLOW_PDF = """
import time
import pipelines.formats.inspection as readers

real = readers.inspect_source

def slow(source):
    if source.read_at(0, 32).startswith(b"%PDF-1.4\\n/Width 1 "):
        time.sleep(60)
    return real(source)

readers.inspect_source = slow
"""


def test_serve_stopped_with_sigterm_mid_inspection_answers_503_and_keeps_no_blob(serve, tmp_path):
    """An upload whose body arrived in time but whose inspection still ran when the
    stop's time was up was cancelled by uvicorn: a 500 with a traceback at ERROR, and
    the process exiting under the inspection left the stored blob with no object row.
    Now it answers 503 service_unavailable, logs no traceback, and its blob is removed."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_SLOW_PDF)
    serve.env["PYTHONPATH"] = f"{hook}:{serve.env['PYTHONPATH']}"
    serve.env["HYPERMEDIA_API_SHUTDOWN_SECONDS"] = "1"
    api, url = serve.start()
    objects = Path(serve.env["HYPERMEDIA_DATA_DIR"]) / "objects"
    first = serve.upload(url, PNG)
    assert first.status_code == 201, first.text
    answers: list[httpx.Response] = []
    uploading = threading.Thread(
        target=lambda: answers.append(serve.upload(url, crafted_pdf(1 << 20), "c.pdf")),
        daemon=True,
    )
    uploading.start()
    server = _inspection_server(api.pid)
    assert within(60, lambda: bool(server.children())), "no inspection began"
    stopping = time.monotonic()
    api.send_signal(signal.SIGTERM)
    try:
        code = api.wait(30)
    except subprocess.TimeoutExpired:
        raise AssertionError("serve did not stop within 30 s of SIGTERM") from None
    took = time.monotonic() - stopping
    uploading.join(30)
    log = serve.log.read_text()
    # The inspection alone takes 60 s: stopping within the 30 s above says the shutdown
    # cut it (how long past its 6 s a loaded machine takes is no assertion).
    assert code == 0, (code, took, log[-3000:])
    [answer] = answers
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "service_unavailable"
    assert "retry-after" in answer.headers
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-3000:]
    # The PNG's blob, nothing of the PDF's.
    assert [p.stat().st_size for p in objects.rglob("*") if p.is_file()] == [len(PNG)]
