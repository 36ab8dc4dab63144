"""Upload inspection parses hostile files inside the job sandbox (root here): the child
has a uid of its own and no capabilities, no network, and a view in which the data
dir, the settings file and the rest of what jobs may not see are not there.

Each test holds a real inspection child while it parses and looks at it from outside
(``/proc/<pid>``) and from inside: a helper process enters the child's network and
mount namespaces, takes its uid and gid, and tries what a parser exploit would (read
the secrets, connect to 127.0.0.1). Nothing in the product is patched.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hypermedia import tls
from hypermedia.ingest import inspection
from hypermedia.ingest.api import create_app
from hypermedia.ingest.inspection import InspectionBudget, InspectionRunner
from hypermedia.sandbox.isolation import CLONE_NEWNET, CLONE_NEWNS, setns
from hypermedia.stack import Stack
from hypermedia.storage.local import LocalStorage
from tests.api_support import add_user, bearer, running_server
from tests.integration.test_api_inspection import PNG, crafted_pdf

pytestmark = pytest.mark.root("the full sandbox needs root")

REPO = Path(__file__).resolve().parents[2]
CANARY = "canary-inspection-secret-0123456789"


@pytest.fixture
def site() -> Iterator[Path]:
    """An operator's directory outside every default cover (not under /tmp, /root ...):
    only the hidden paths can keep the inspection child from what lies there."""
    directory = Path(tempfile.mkdtemp(prefix="hm-inspect-", dir="/srv"))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory)


def _canaries(site: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[str]]:
    """A data dir (storage secret, database, an object) and a settings file named by
    ``HYPERMEDIA_CONFIG``, each readable by anyone (``0644``): the data dir and the
    canary files."""
    data_dir = site / "data"
    (data_dir / "objects").mkdir(parents=True)
    data_dir.chmod(0o755)
    files = {
        data_dir / "storage.secret": CANARY,
        data_dir / "hypermedia.db": CANARY,
        data_dir / "objects" / "other-users-object": CANARY,
        site / "hm.toml": f'storage_secret = "{CANARY}"\n',
    }
    for path, text in files.items():
        path.write_text(text)
        path.chmod(0o644)
    monkeypatch.setenv("HYPERMEDIA_CONFIG", str(site / "hm.toml"))
    return data_dir, [str(path) for path in files]


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as status:
        return {k: v.strip() for k, v in (line.split(":", 1) for line in status if ":" in line)}


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as children:
        return [int(p) for p in children.read().split()]


def _inspection_child(timeout: float = 20.0) -> int:
    """The pid of the running inspection server's one child (the server may still be
    starting, replacing an earlier test's)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        server = inspection._current
        try:
            children = _children(server.process.pid) if server is not None else []
        except FileNotFoundError:  # the earlier test's, gone
            children = []
        if children:
            [pid] = children
            return pid
        time.sleep(0.01)
    raise AssertionError("no inspection child")


def _ns(pid: int | str, name: str) -> int:
    return os.stat(f"/proc/{pid}/ns/{name}").st_ino


def look_at(pid: int, files: list[str], ports: list[int]) -> dict[str, Any]:
    """The child from outside (``/proc``) and from inside: a helper in its network and
    mount namespaces, with its uid and gid, reads ``files`` and connects to ``ports``
    on 127.0.0.1."""
    status = _status(pid)
    uid, gid = int(status["Uid"].split()[0]), int(status["Gid"].split()[0])
    with open(f"/proc/{pid}/limits") as limits:
        nproc = next(line.split()[2:4] for line in limits if line.startswith("Max processes"))
    seen: dict[str, Any] = {
        "uid": [int(u) for u in status["Uid"].split()],
        "capabilities": int(status["CapEff"], 16),
        "no_new_privs": status["NoNewPrivs"],
        "seccomp": status["Seccomp"],
        "max_processes": nproc,
        "own_network_namespace": _ns(pid, "net") != _ns("self", "net"),
        "own_mount_namespace": _ns(pid, "mnt") != _ns("self", "mnt"),
    }
    net = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    mnt = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    reader, writer = os.pipe()
    helper = os.fork()
    if helper == 0:
        inside: dict[str, str] = {}
        try:
            setns(net, CLONE_NEWNET)
            setns(mnt, CLONE_NEWNS)
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            for path in files:
                try:
                    with open(path) as f:
                        inside[path] = "canary" if CANARY in f.read() else "no canary"
                except OSError as exc:
                    inside[path] = errno.errorcode.get(exc.errno or 0, str(exc))
            for port in ports:
                with socket.socket() as sock:
                    sock.settimeout(2)
                    try:
                        sock.connect(("127.0.0.1", port))
                        inside[f"port {port}"] = "connected"
                    except OSError as exc:
                        inside[f"port {port}"] = errno.errorcode.get(exc.errno or 0, str(exc))
        except BaseException as exc:
            inside["error"] = repr(exc)
        os.write(writer, json.dumps(inside).encode())
        os._exit(0)
    os.close(writer)
    os.close(net)
    os.close(mnt)
    with os.fdopen(reader, "rb") as pipe:
        seen["inside"] = json.loads(pipe.read())
    os.waitpid(helper, 0)
    return seen


def assert_sandboxed(seen: dict[str, Any], files: list[str]) -> None:
    uid = seen["uid"][0]
    assert seen["uid"] == [uid] * 4 and uid != 0
    assert seen["capabilities"] == 0
    assert seen["no_new_privs"] == "1"
    assert seen["seccomp"] == "2"  # the filter
    assert seen["max_processes"] == ["1", "1"]  # it can start no process: none outlives it
    assert seen["own_network_namespace"] and seen["own_mount_namespace"]
    inside = seen["inside"]
    assert "error" not in inside, inside
    # The data dir is an empty cover, the settings file an empty file (/dev/null bound).
    assert {path: inside[path] for path in files} == {
        **{path: "ENOENT" for path in files if "/data/" in path},
        **{path: "no canary" for path in files if path.endswith("hm.toml")},
    }
    ports = {k: v for k, v in inside.items() if k.startswith("port ")}
    assert ports and set(ports.values()) == {"ENETUNREACH"}, ports


class HeldStorage:
    """An object store (not local: the child reads through the runner) whose first read
    waits until ``look`` has looked at the child."""

    def __init__(self, data: bytes, look: Any) -> None:
        self.data = data
        self.look = look
        self.seen: dict[str, Any] | None = None

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        if self.seen is None:
            self.seen = self.look(_inspection_child())
        return self.data[offset : offset + length]


def test_the_inspection_child_is_sandboxed_like_a_job(site, monkeypatch):
    data_dir, files = _canaries(site, monkeypatch)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        ports = [listener.getsockname()[1], 5432, 6379]  # PostgreSQL and Redis run here
        # The control experiment: from here, all of it is there.
        for path in files:
            assert CANARY in Path(path).read_text()
        socket.create_connection(("127.0.0.1", ports[0]), timeout=2).close()

        runner = InspectionRunner(InspectionBudget(cpu_seconds=5), hidden_paths=(data_dir,))
        storage = HeldStorage(PNG, lambda pid: look_at(pid, files, ports))
        found = runner.inspect(storage, "originals/p/cat", len(PNG))  # type: ignore[arg-type]
    assert (found.kind, found.details["width"], found.details["height"]) == ("image", 48, 32)
    assert storage.seen is not None
    assert_sandboxed(storage.seen, files)
    capabilities = runner.capabilities
    assert capabilities["missing"] == {}
    first, last = capabilities["uid_range"]
    assert first <= storage.seen["uid"][0] <= last


def test_a_local_file_in_the_hidden_data_dir_is_still_inspected(site, monkeypatch):
    """The child opens its file before its view hides the data dir."""
    data_dir, _files = _canaries(site, monkeypatch)
    storage = LocalStorage(data_dir / "objects")
    storage.put("originals/p/cat", [PNG])
    runner = InspectionRunner(InspectionBudget(cpu_seconds=5), hidden_paths=(data_dir,))
    found = runner.inspect(storage, "originals/p/cat", len(PNG))
    assert (found.kind, found.details["width"], found.details["height"]) == ("image", 48, 32)
    with pytest.raises(RuntimeError, match="FileNotFoundError"):
        runner.inspect(storage, "originals/p/missing", 10)


def test_the_api_hides_its_data_dir_from_inspection(site, monkeypatch, sqlite_engine, settings):
    """Through the API: an upload being inspected (a slow PDF) cannot read the data dir
    the API serves from, its settings file, nor connect to anything."""
    data_dir, files = _canaries(site, monkeypatch)
    # The settings refuse a file with a secret that others may read: read it private,
    # then made readable by anyone (what the inspection must be hidden from regardless).
    (site / "hm.toml").chmod(0o600)
    loaded = settings(data_dir=data_dir, inspection_cpu_seconds=30, inspection_wall_seconds=60)
    (site / "hm.toml").chmod(0o644)
    stack = Stack.open(
        loaded,
        engine=sqlite_engine,
        auto_migrate=True,
    )
    try:
        with running_server(create_app(stack, auth_cache_seconds=0)) as url:
            user = add_user(stack, "alice")
            answer: list[httpx.Response] = []

            def upload() -> None:
                with httpx.Client(base_url=url, timeout=120, verify=tls.client_context()) as client:
                    answer.append(
                        client.put(
                            "/v1/hypermedia/objects",
                            params={"filename": "slow.pdf"},
                            content=crafted_pdf(),
                            headers=bearer(user),
                        )
                    )

            uploading = threading.Thread(target=upload)
            uploading.start()
            child = None
            try:
                child = _inspection_child(timeout=60)
                # Parsing: past its sandbox's last step (it opens its file before it).
                deadline = time.monotonic() + 3
                while _status(child)["Seccomp"] != "2" and time.monotonic() < deadline:
                    time.sleep(0.01)
                seen = look_at(child, files, [5432, 6379])
            finally:
                if child is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(child, signal.SIGKILL)  # a 422 now, not 7 s of CPU later
                uploading.join()
            assert_sandboxed(seen, files)
            assert inspection._current is not None
            capabilities = inspection._current.capabilities
    finally:
        stack.close()
    assert answer[0].status_code == 422, answer[0].text
    assert capabilities["missing"] == {}
    first, last = capabilities["uid_range"]
    assert first <= seen["uid"][0] <= last


_DEGRADED = """
import json, logging, sys
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
from hypermedia.ingest.inspection import InspectionBudget, InspectionRunner
from tests.integration.test_api_inspection import PNG

class Store:
    def read_range(self, key, offset, length):
        return PNG[offset:offset + length]

runner = InspectionRunner(InspectionBudget(cpu_seconds=5))
found = runner.inspect(Store(), "originals/p/cat", len(PNG))
print(json.dumps({"capabilities": runner.capabilities, "kind": found.kind}))
"""


def test_without_cap_sys_admin_inspection_degrades_loudly():
    """Root without CAP_SYS_ADMIN (a container's default): no namespaces and no uid of
    its own, as for jobs; the upload is still inspected, and each missing piece is a
    warning and in the report."""
    command = ["setpriv", "--bounding-set=-sys_admin", sys.executable, "-c", _DEGRADED]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["kind"] == "image"
    caps = report["capabilities"]
    assert not any(caps[f] for f in ("network_namespace", "mount_namespace", "own_uid"))
    assert {"network_namespace", "mount_namespace", "own_uid"} <= set(caps["missing"])
    for feature in ("network namespace", "mount namespace", "own uid"):
        assert f"WARNING upload inspection: no {feature}" in done.stderr


def test_a_server_that_ends_as_it_starts_is_an_outage_not_an_internal_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The inspection server killed while it started (the API stopping beside an upload,
    the OOM killer) was a RuntimeError: a 500 ``internal`` with its traceback in the log
    (a CI-like run of `hypermedia run` interrupted mid-upload). It is ServiceUnavailable,
    a 503 with Retry-After, nothing stored."""
    from hypermedia.errors import ServiceUnavailable
    from hypermedia.ingest.http_errors import error_response
    from tests.integration.test_api_inspection import PNG

    class Store:
        def read_range(self, key: str, offset: int, length: int) -> bytes:
            return PNG[offset : offset + length]

    runner = InspectionRunner(InspectionBudget(cpu_seconds=5))
    # A config its server cannot start from: it ends before it says it is ready.
    runner._config = {**runner._config, "hidden": 5}
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where the server makes its work root
    with pytest.raises(ServiceUnavailable, match="its server ended as it started") as ended:
        runner.inspect(Store(), "originals/p/cat", len(PNG))  # type: ignore[arg-type]
    answer = error_response(ended.value)
    assert (answer.status_code, answer.headers["Retry-After"]) == (503, "5")
    # Nor did it leave its work root (each such start left an empty one in /tmp).
    assert list(tmp_path.iterdir()) == []
