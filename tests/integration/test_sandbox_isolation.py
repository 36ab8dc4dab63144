"""The job's sandbox on this machine (root): no network, a read-only view with one
writable directory, a uid of its own, and the limits that come with it.

Every test runs real jobs through a real fork server (the misbehaving steps of
``tests/pipelines_for_tests.py``); nothing is mocked. The sandbox must be complete
here: the machine runs the tests as root, and a missing piece is a failure, not a
skip (see ``test_this_machine_gives_the_full_sandbox``).
"""

from __future__ import annotations

import contextlib
import json
import os
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

import pytest

import pipelines.registry
from hypermedia.sandbox import isolation, syscalls
from hypermedia.sandbox.executor import PID_INIT_ENV, ChildExecutor, ChildFailed
from tests import sandbox_faults
from tests.integration.test_sandbox_executor import (
    alive,
    children_of,
    processes_of,
    wait_until,
)
from tests.pipelines_for_tests import PRELOAD

REPO = Path(__file__).resolve().parents[2]
MB = 1024 * 1024

pytestmark = pytest.mark.root("the full sandbox needs root")


@pytest.fixture(scope="module")
def executor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChildExecutor]:
    with ChildExecutor(tmp_path_factory.mktemp("isolation"), preload=PRELOAD) as ex:
        yield ex


_ids = iter(range(1_000_000))


@pytest.fixture
def job_id() -> str:
    return f"iso-{os.getpid()}-{next(_ids)}"


def run_job(
    ex: ChildExecutor, job_id: str, operation: str, params: dict[str, Any] | None = None, **kw: Any
) -> Any:
    """Run a job whose step writes one JSON output; that JSON."""
    kw.setdefault("timeout_seconds", 10)
    kw.setdefault("memory_limit_mb", 1024)
    source = ex.prepare(job_id) / "input" / "source"
    source.write_bytes(b"input bytes")
    source.chmod(0o600)  # as the worker's download leaves it: the job still reads it
    result = ex.run(job_id, operation, source, params or {}, **kw)
    [output] = result.outputs
    return json.loads(output.path.read_text())


def failure(
    ex: ChildExecutor, job_id: str, operation: str, params: dict[str, Any] | None = None, **kw: Any
) -> ChildFailed:
    kw.setdefault("timeout_seconds", 10)
    kw.setdefault("memory_limit_mb", 1024)
    source = ex.prepare(job_id) / "input" / "source"
    source.write_bytes(b"input bytes")
    with pytest.raises(ChildFailed) as caught:
        ex.run(job_id, operation, source, params or {}, **kw)
    return caught.value


def uid_range(ex: ChildExecutor) -> range:
    first, last = ex.capabilities["uid_range"]
    return range(first, last + 1)


# -- what the machine gives ------------------------------------------------------------


def test_this_machine_gives_the_full_sandbox(executor):
    caps = executor.capabilities
    assert caps["missing"] == {}
    assert caps["network_namespace"] is True
    assert caps["mount_namespace"] is True
    assert caps["own_uid"] is True
    assert caps["private_proc"] is True
    assert caps["syscall_filter"] is True
    assert caps["pid_namespace"] is True
    first, last = caps["uid_range"]
    assert first >= isolation.UID_BASE
    assert last - first + 1 == isolation.UID_SLOTS


# -- no network ------------------------------------------------------------------------


def test_a_job_cannot_reach_a_listener_on_localhost(executor, job_id):
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(3)
    port = listener.getsockname()[1]
    got: list[bytes] = []

    def accept() -> None:
        while True:  # every connection until 3 s pass without one
            try:
                conn, _address = listener.accept()
            except TimeoutError:
                return
            with conn:
                conn.settimeout(3)
                try:
                    got.append(conn.recv(100))
                except TimeoutError:
                    got.append(b"")

    watcher = threading.Thread(target=accept)
    watcher.start()
    try:
        seen = run_job(
            executor, job_id, "test.connect", {"targets": [["127.0.0.1", port], ["::1", port]]}
        )
    finally:
        watcher.join()
        listener.close()
    assert seen["targets"][f"127.0.0.1:{port}"] == "ENETUNREACH"
    assert seen["targets"][f"::1:{port}"] in {"ENETUNREACH", "EADDRNOTAVAIL"}
    assert seen["interfaces"] == ["lo"]  # and lo is down: nothing reaches anything
    # The job sends this once connected. The listener's port is any free one: in a
    # CI run another test's Redis client, retrying the port of a private Redis gone
    # since, reached it (HELLO 3 AUTH ...); a connection from elsewhere is not the job's.
    assert b"hello from a job" not in got, got


def identities(
    executor: ChildExecutor, name: str, during: int, after: int, hold: float
) -> dict[str, Any]:
    """``test.identity`` of one job that holds its uid ``hold`` seconds, of ``during``
    jobs run one after another while it does, then of ``after`` more once it is done;
    by job id, in that order."""
    ids = [f"{name}-{os.getpid()}-{i}" for i in range(1 + during + after)]
    seen: dict[str, Any] = {}

    def one(job: str, seconds: float) -> None:
        seen[job] = run_job(executor, job, "test.identity", {"hold": seconds})

    holding = threading.Thread(target=one, args=(ids[0], hold))
    holding.start()
    time.sleep(0.5)
    for job in ids[1 : 1 + during]:
        one(job, 0)
    holding.join()
    for job in ids[1 + during :]:
        one(job, 0)
    for job in ids:
        executor.cleanup(job)
    return {job: seen[job] for job in ids}


def test_jobs_at_the_same_time_are_in_different_network_namespaces(executor):
    """Each job uid has a network namespace of its own, made once by the server: jobs
    that overlap (other uids) never share one, the uid's next job enters it again,
    and none is the machine's."""
    # The second runs while the first holds its uid; the third after both: the lowest
    # free uid again, the second's.
    found = identities(executor, "iso-netns", during=1, after=1, hold=2.0)
    first, second, third = found.values()
    assert first["uid"][0] != second["uid"][0]
    assert first["network_namespace"] != second["network_namespace"]
    assert third["uid"][0] in (first["uid"][0], second["uid"][0])
    again = first if third["uid"][0] == first["uid"][0] else second
    assert third["network_namespace"] == again["network_namespace"]
    machine = os.stat("/proc/self/ns/net").st_ino
    assert machine not in {job["network_namespace"] for job in (first, second, third)}


def test_a_job_sees_no_other_jobs_workdir_now_or_before(executor):
    """Spares copy one template view (isolation.Isolation._make_template) but each has
    a jobs cover of its own: overlapping jobs, and the jobs after them, see only
    their own workdir in the jobs root, not another's nor a mountpoint left by one."""
    # Seven while the first one runs: more jobs than spares.
    seen = identities(executor, "iso-jobs", during=7, after=0, hold=1.5)
    assert {job: found["jobs_root"] for job, found in seen.items()} == {job: [job] for job in seen}


def test_the_network_is_reachable_from_the_caller(executor):
    """The control experiment: the same listener is reachable outside the sandbox."""
    with (
        socket.create_server(("127.0.0.1", 0)) as listener,
        socket.create_connection(listener.getsockname(), timeout=2),
    ):
        conn, _address = listener.accept()
        conn.close()


# -- the filesystem --------------------------------------------------------------------


def test_a_job_writes_only_in_its_workdir(executor, job_id):
    workdir = executor.workdir(job_id)
    # A directory everybody may write to that jobs see (in the interpreter's prefix,
    # which is bound back): only the read-only mount stops the job there, not
    # permissions.
    open_dir = Path(tempfile.mkdtemp(prefix="sandbox-open-", dir=sys.prefix))
    open_dir.chmod(0o777)
    try:
        targets = {
            "workdir": str(workdir / "fine.txt"),
            "tmp": "/tmp/from-a-job",
            "dev_shm": "/dev/shm/from-a-job",
            "repo": str(REPO / "from-a-job"),
            "parent": str(workdir.parent / "from-a-job"),
            "work_root": str(executor.work_root / "from-a-job"),
            "world_writable": str(open_dir / "from-a-job"),
            "etc": "/etc/from-a-job",
            "site_packages": str(Path(pipelines.registry.__file__).parent / "from-a-job"),
        }
        seen = run_job(executor, job_id, "test.try_paths", {"write": list(targets.values())})
        results = {name: seen["write"][path] for name, path in targets.items()}
        assert results == {
            "workdir": "ok",
            "tmp": "EROFS",
            "dev_shm": "EROFS",
            "repo": "EROFS",
            "parent": "EROFS",
            "work_root": "EROFS",
            "world_writable": "EROFS",
            "etc": "EROFS",
            "site_packages": "EROFS",
        }
        assert list(open_dir.iterdir()) == []
        assert not Path(targets["repo"]).exists()
        assert (workdir / "fine.txt").read_text() == "x"
    finally:
        open_dir.rmdir()


def test_a_job_reads_what_it_needs_and_nothing_hidden(executor, job_id, tmp_path):
    import pyvips

    other = executor.prepare(job_id + "-other")  # another job's workdir, with a secret
    (other / "secret.txt").write_text("another job's file")
    mine = tmp_path / "caller-secret.txt"  # the caller's own temporary files
    mine.write_text("the worker's file")
    # Modules no preloaded module imported: the child imports them from the interpreter
    # under /root/.pyenv (/root is 0700 and hidden; the interpreter is bound back).
    fresh = [name for name in ("wave", "colorsys", "tomllib", "mailbox") if name not in sys.modules]
    assert fresh
    libvips = sorted(Path(pyvips.__file__).parent.parent.glob("pyvips_binary*/**/*.so*"))
    paths = {
        "stdlib": os.path.dirname(os.__file__),
        "pipelines": os.path.dirname(pipelines.registry.__file__),
        "pyvips": pyvips.__file__,
        "libvips": str(libvips[0]) if libvips else pyvips.__file__,
        "usr_lib": "/usr/lib",
        # The checkout is on sys.path (pytest put it there): its packages are bound
        # back, not what lies beside them.
        "repo_file": str(REPO / "pyproject.toml"),
        "own_input": str(executor.workdir(job_id) / "input" / "source"),
        "other_job": str(other / "secret.txt"),
        "caller_tmp": str(mine),
        "root_home": "/root",
        "run": "/run",
        "shadow": "/etc/shadow",
    }
    try:
        seen = run_job(
            executor, job_id, "test.try_paths", {"read": list(paths.values()), "imports": fresh}
        )
    finally:
        executor.cleanup(job_id + "-other")
    results = {name: seen["read"][path] for name, path in paths.items()}
    assert results == {
        "stdlib": "ok",
        "pipelines": "ok",
        "pyvips": "ok",
        "libvips": "ok",
        "usr_lib": "ok",
        "repo_file": "ENOENT",
        "own_input": "ok",
        "other_job": "ENOENT",  # the jobs root is an empty cover but for this job
        "caller_tmp": "ENOENT",  # /tmp is an empty cover
        "root_home": "ok",  # the cover: only the bound-back interpreter inside
        "run": "ok",  # likewise, empty
        "shadow": "EACCES",  # visible, but not to the job's uid
    }
    assert seen["imports"] == dict.fromkeys(fresh, "ok")


def _canaries(directory: Path) -> dict[str, str]:
    """A record, a secret and a directory of objects, as a data dir holds them; readable
    by anyone, so that only the view can keep a job from them."""
    (directory / "objects").mkdir(parents=True, exist_ok=True)
    (directory / "hypermedia.db").write_text("the job record")
    (directory / "storage-secret").write_text("canary-secret")
    (directory / "objects" / "blob").write_text("another user's object")
    for path in (directory, directory / "objects"):
        path.chmod(0o755)
    for path in (directory / "hypermedia.db", directory / "storage-secret"):
        path.chmod(0o644)
    (directory / "objects" / "blob").chmod(0o644)
    return {
        "dir": str(directory),
        "record": str(directory / "hypermedia.db"),
        "secret": str(directory / "storage-secret"),
        "objects": str(directory / "objects" / "blob"),
    }


def test_the_working_directory_on_sys_path_is_not_visible_to_jobs(tmp_path, monkeypatch):
    """Outside every default cover (under the checkout, which jobs see only the
    packages of) and under one (/tmp): either way the job sees none of it."""
    (REPO / ".pytest_cache").mkdir(exist_ok=True)
    outside = Path(tempfile.mkdtemp(prefix="sandbox-cwd-", dir=REPO / ".pytest_cache"))
    try:
        for cwd in (outside, tmp_path / "operator"):
            canaries = _canaries(cwd)
            paths = list(canaries.values())
            monkeypatch.chdir(cwd)
            monkeypatch.syspath_prepend(str(cwd))
            with ChildExecutor(tmp_path / f"work-{cwd.name}", preload=PRELOAD, spares=0) as ex:
                assert ex.capabilities["missing"] == {}
                seen = run_job(ex, "cwd-job", "test.try_paths", {"read": paths})
            assert seen["read"] == dict.fromkeys(paths, "ENOENT"), cwd
            monkeypatch.undo()
    finally:
        import shutil

        shutil.rmtree(outside)


def test_the_data_dir_as_working_directory_is_hidden_from_jobs(tmp_path, monkeypatch):
    """``hypermedia up`` run from inside its data dir: the record, the storage secret
    and the objects stay hidden though the directory is on every worker's sys.path;
    the job still reads its own input, in the work root inside that data dir."""
    data_dir = tmp_path / "data"
    canaries = _canaries(data_dir)
    monkeypatch.chdir(data_dir)
    monkeypatch.syspath_prepend(str(data_dir))
    work_root = data_dir / "work" / "w1"
    with ChildExecutor(work_root, preload=PRELOAD, spares=0, hidden_paths=(data_dir,)) as ex:
        assert ex.capabilities["missing"] == {}
        own = str(ex.workdir("data-job") / "input" / "source")
        del canaries["dir"]  # there, as the way to the job's workdir, but empty
        paths = [*canaries.values(), own]
        seen = run_job(ex, "data-job", "test.try_paths", {"read": paths})
    assert seen["read"] == {**dict.fromkeys(canaries.values(), "ENOENT"), own: "ok"}


# -- the syscall filter -----------------------------------------------------------------

CLONE_NEWUSER = 0x10000000
CLONE_FS = 0x00000200


def test_a_job_gets_eperm_for_every_denied_syscall(executor, job_id):
    """Each denied syscall, called with arguments that without the filter would succeed
    or fail otherwise (unshare(CLONE_NEWUSER) succeeds for anyone; a zero fd or pointer
    is EBADF, EFAULT or EINVAL), answers EPERM; clone with a namespace flag too
    (CLONE_NEWUSER with CLONE_FS would be EINVAL), clone3 ENOSYS (so the C library
    falls back to clone); what a step needs still works."""
    denied = [[name, [0] * 6] for name in syscalls.DENIED]
    denied[[name for name, _args in denied].index("unshare")][1] = [CLONE_NEWUSER]
    calls = [
        *denied,
        ["clone", [CLONE_NEWUSER | CLONE_FS, 0, 0, 0, 0]],
        ["clone3", [0, 0]],
        ["getpid", []],
        ["getuid", []],
    ]
    seen = run_job(executor, job_id, "test.syscalls", {"calls": calls})
    assert seen["seccomp"] == "2"  # a filter is loaded
    assert seen["calls"] == {
        **dict.fromkeys(syscalls.DENIED, "EPERM"),
        "clone": "EPERM",
        "clone3": "ENOSYS",
        "getpid": "ok",
        "getuid": "ok",
    }


def test_a_job_has_a_pid_namespace_of_its_own(executor, job_id):
    """The job's process is pid 2 (pid 1 is the namespace's init, which the job cannot
    see); the processes it forks are all it sees besides itself, and they are dead
    when the job is reported."""
    seen = run_job(executor, job_id, "test.tree", {"children": 3})
    assert seen["pid"] == 2
    assert seen["visible"] == [2, 3, 4, 5]
    # Its parent: the fork server, outside the namespace (0), or a spare that is the
    # namespace's init where there is no tiny init.
    assert seen["parent"] == (0 if executor.capabilities["tiny_init"] else 1)
    assert executor.capabilities["pid_namespace"] is True
    assert processes_of(uid_range(executor)) == []


def test_without_a_tiny_init_the_spare_is_the_namespaces_init(tmp_path, monkeypatch, job_id):
    """Where the tiny init cannot run (other architectures; here by the setting), each
    spare is its namespace's pid 1 and forks the job's process: the same pids for the
    job, and what it leaves is dead when it is reported."""
    monkeypatch.setenv(PID_INIT_ENV, "copy")
    with ChildExecutor(tmp_path, preload=PRELOAD, spares=1) as ex:
        assert ex.capabilities["pid_namespace"] is True
        assert ex.capabilities["tiny_init"] is False
        assert "pid_init is 'copy'" in ex.capabilities["missing"]["tiny_init"]
        seen = run_job(ex, job_id, "test.tree", {"children": 3})
        assert (seen["pid"], seen["visible"], seen["parent"]) == (2, [2, 3, 4, 5], 1)
        assert processes_of(uid_range(ex)) == []
    monkeypatch.setenv(PID_INIT_ENV, "bogus")
    with pytest.raises(ValueError, match=PID_INIT_ENV):
        ChildExecutor(tmp_path, preload=PRELOAD)


def test_a_job_can_neither_see_nor_signal_nor_trace_other_processes(executor, job_id):
    """Another job running meanwhile, the caller and the fork server: not in the job's
    PID namespace (no such process to signal), PTRACE_ATTACH refused by the filter
    before the kernel even looks; the other job lives on."""
    other = job_id + "-other"
    source = executor.prepare(other) / "input" / "source"
    source.write_bytes(b"x")
    box: dict[str, Any] = {}

    def sleeper() -> None:
        try:
            executor.run(
                other,
                "test.sleep",
                source,
                {"seconds": 30},
                timeout_seconds=40,
                memory_limit_mb=512,
            )
        except ChildFailed as exc:
            box["failed"] = exc

    thread = threading.Thread(target=sleeper)
    thread.start()
    try:
        assert wait_until(lambda: executor.child_pid(other) is not None, 10)
        victim = executor.child_pid(other)
        assert victim is not None
        pids = [victim, os.getpid(), executor.server_pid]
        seen = run_job(
            executor, job_id, "test.signal", {"pids": pids, "signal": int(signal.SIGKILL)}
        )
        assert alive(victim)
        assert executor.running() == sorted([other])
    finally:
        executor.cancel(other)
        thread.join()
        executor.cleanup(other)
    assert seen["kill"] == dict.fromkeys(map(str, pids), "ESRCH")
    assert seen["ptrace"] == dict.fromkeys(map(str, pids), "EPERM")
    assert seen["visible"] == [2]  # itself, after its namespace's init
    assert box["failed"].code == "cancelled"


def test_without_the_filter_the_same_calls_get_through(tmp_path, job_id):
    """The control experiment: sandbox off, no filter; unshare(CLONE_NEWUSER) works."""
    with ChildExecutor(tmp_path, preload=PRELOAD, sandbox=False, spares=0) as ex:
        seen = run_job(ex, job_id, "test.syscalls", {"calls": [["unshare", [CLONE_NEWUSER]]]})
    assert seen == {"calls": {"unshare": "ok"}, "seccomp": "0"}


# -- the job's uid ---------------------------------------------------------------------


def test_a_job_runs_as_an_unprivileged_uid_that_owns_its_workdir(executor, job_id):
    seen = run_job(executor, job_id, "test.identity")
    uids = uid_range(executor)
    uid = seen["uid"][0]
    assert uid in uids
    assert seen["uid"] == [uid, uid, uid]  # real, effective, saved
    assert seen["gid"] == [uid, uid, uid]
    assert seen["groups"] == []
    assert int(seen["cap_eff"], 16) == 0
    assert int(seen["cap_prm"], 16) == 0
    assert seen["no_new_privs"] == "1"
    assert seen["workdir_owner"] == [uid, uid]
    assert seen["input_owner"] == uid
    assert seen["pids"] == [seen["pid"]]  # /proc shows it nothing but itself
    workdir = executor.workdir(job_id)
    assert (workdir / "mine.txt").stat().st_uid == uid
    executor.cleanup(job_id)
    assert not workdir.exists()
    assert processes_of(uids) == []


def test_concurrent_jobs_get_different_uids(executor):
    ids = [f"iso-concurrent-{os.getpid()}-{i}" for i in range(6)]
    done: dict[str, int] = {}

    def one(job: str) -> None:
        # A job that lasts a little, so that they overlap.
        seen = run_job(executor, job, "test.identity", timeout_seconds=10)
        done[job] = seen["uid"][0]

    threads = [threading.Thread(target=one, args=(job,)) for job in ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for job in ids:
        executor.cleanup(job)
    assert len(done) == len(ids)
    assert set(done.values()) <= set(uid_range(executor))


def test_escaped_processes_are_dead_before_the_job_is_reported(executor, job_id):
    """A child that left the job's group (setsid) and keeps a grandchild of its own:
    no group or parent ties them to the job any more, only its uid; both are gone by
    the time ``run`` returns, so nothing can touch the outputs being uploaded."""
    source = executor.prepare(job_id) / "input" / "source"
    source.write_bytes(b"x")
    result = executor.run(
        job_id, "test.escape", source, {}, timeout_seconds=10, memory_limit_mb=512
    )
    assert result.outputs == []
    pids = [int(p) for p in (executor.workdir(job_id) / "pids.txt").read_text().split()]
    assert len(pids) == 2  # (its namespace's pids, not ours: the uid tells)
    assert processes_of(uid_range(executor)) == []  # at once: no waiting


# -- limits ----------------------------------------------------------------------------


def test_a_fork_bomb_stops_at_the_process_limit(executor, job_id):
    # The bomb's first process waits up to 20 s for its children's pids to be written
    # (a loaded machine once took over 10 s): the job's timeout must not come first.
    exc = failure(executor, job_id, "test.fork_bomb", max_processes=16, timeout_seconds=60)
    assert (exc.code, exc.retryable) == ("process_limit", False)
    # The job's first process and 15 more when the limit stopped it (see the bomb).
    assert (executor.workdir(job_id) / "at_limit.txt").read_text() == "15\n"
    assert processes_of(uid_range(executor)) == []


def test_the_process_limit_counts_only_the_jobs_own_processes(executor, job_id):
    """Jobs running at the same time do not eat into each other's process limit."""
    sleepers = [f"{job_id}-sleeper-{i}" for i in range(3)]
    boxes: list[dict[str, Any]] = []
    threads = []
    for sleeper in sleepers:
        box: dict[str, Any] = {}
        source = executor.prepare(sleeper) / "input" / "source"
        source.write_bytes(b"x")

        def target(
            sleeper: str = sleeper, source: Path = source, box: dict[str, Any] = box
        ) -> None:
            try:
                box["result"] = executor.run(
                    sleeper,
                    "test.sleep",
                    source,
                    {"seconds": 3, "children": 10},
                    timeout_seconds=20,
                    memory_limit_mb=512,
                    max_processes=16,
                )
            except ChildFailed as exc:
                box["failed"] = exc

        thread = threading.Thread(target=target)
        thread.start()
        threads.append(thread)
        boxes.append(box)
    try:
        # 3 x 11 processes of other jobs are running; this job may still fork 15.
        assert wait_until(
            lambda: all((executor.workdir(s) / "pids.txt").exists() for s in sleepers), 10
        ), (boxes, [os.listdir(executor.workdir(s)) for s in sleepers])
        seen = run_job(executor, job_id, "test.identity", timeout_seconds=10, max_processes=16)
        assert seen["uid"][0] in uid_range(executor)
        exc = failure(executor, job_id + "-bomb", "test.fork_bomb", max_processes=16)
        assert exc.code == "process_limit"
        assert (executor.workdir(job_id + "-bomb") / "at_limit.txt").read_text() == "15\n"
    finally:
        for thread in threads:
            thread.join()
    assert all("result" in box for box in boxes), boxes


def test_a_memory_bomb_stops_at_the_address_space_limit(executor, job_id):
    exc = failure(executor, job_id, "test.allocate", {"mb": 8192}, memory_limit_mb=256)
    assert (exc.code, exc.retryable) == ("memory_limit", False)


def boost_when_running(ex: ChildExecutor, job_id: str) -> threading.Thread:
    """Give the job's session the scheduler's highest weight once its child runs.

    A spin must reach RLIMIT_CPU (timeout seconds of CPU) before the wall clock (1.5
    times the timeout): it needs two thirds of a core. On a machine shared with other
    test suites, where every session is a scheduling group of its own, a job may not
    get that; boosted, it does, and the test shows the limit, not the machine's load.
    """

    def boost() -> None:
        if not wait_until(lambda: ex.child_pid(job_id) is not None, 10):
            return
        with contextlib.suppress(OSError):
            Path(f"/proc/{ex.child_pid(job_id)}/autogroup").write_text("-20")

    thread = threading.Thread(target=boost)
    thread.start()
    return thread


def test_a_disk_flood_stops_at_the_file_size_limit(executor, job_id):
    exc = failure(executor, job_id, "test.flood", max_output_bytes=8 * MB)
    assert (exc.code, exc.retryable) == ("output_limit", False)
    assert (executor.workdir(job_id) / "flood.bin").stat().st_size == 8 * MB


def test_a_disk_flood_across_many_files_stops_at_the_disk_budget(executor, job_id):
    """Each file far below RLIMIT_FSIZE, together over max_output_bytes: the fork
    server measures the workdir and kills the job soon after it passes the budget."""
    exc = failure(executor, job_id, "test.flood_files", max_output_bytes=32 * MB)
    assert (exc.code, exc.retryable) == ("output_limit", False)
    assert "disk budget" in exc.message
    written = sum(p.stat().st_size for p in executor.workdir(job_id).glob("part-*.bin"))
    # Over the budget, by at most what a job writes in one measuring interval.
    assert 32 * MB <= written < 32 * MB + 2048 * MB


# -- afterwards ------------------------------------------------------------------------


def _fds() -> list[str]:
    return sorted(os.listdir("/proc/self/fd"))


def attack_everything(work_root: Path) -> dict[str, Any]:
    """Every kind of attack through a fresh executor, then closed; what was seen. Run by
    the test below in an interpreter of its own, so that no other test's threads open
    or close descriptors in the process meanwhile."""
    before_fds = _fds()
    before_children = sorted(pid for pid, _state in children_of(os.getpid()))
    ex = ChildExecutor(work_root, preload=PRELOAD)
    uids = uid_range(ex)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    # What each ends as: None (it ran), else [its code, whether it is retryable].
    attacks: list[tuple[str, dict[str, Any], dict[str, Any], list[Any] | None]] = [
        ("test.fork_bomb", {}, {"max_processes": 16}, ["process_limit", False]),
        ("test.allocate", {"mb": 8192}, {"memory_limit_mb": 256}, ["memory_limit", False]),
        # Two threads spinning: the executor's RLIMIT_CPU (the timeout's 2 s of CPU), not
        # the 3 s wall clock, stops it (as the child's own clock saw it, not counting its
        # start as a timed window would). This module's one spin (~2 CPU-s): the test
        # of the CPU limit.
        ("test.spin", {"threads": 2}, {"timeout_seconds": 2}, ["cpu_limit", False]),
        ("test.flood", {}, {"max_output_bytes": 4 * MB}, ["output_limit", False]),
        ("test.flood_files", {}, {"max_output_bytes": 4 * MB}, ["output_limit", False]),
        (
            "test.sleep",
            {"seconds": 60, "children": 3},
            {"timeout_seconds": 0.5},
            ["timeout", True],
        ),
        ("test.escape", {}, {}, None),
        ("test.connect", {"targets": [["127.0.0.1", port]]}, {}, None),
        ("test.try_paths", {"write": ["/tmp/x", str(work_root / "x")]}, {}, None),
        ("test.crash", {"how": "segv"}, {}, ["pipeline_crashed", False]),
        ("test.noop", {}, {}, None),
    ]
    seen: list[dict[str, Any]] = []
    try:
        for index, (operation, params, limits, code) in enumerate(attacks):
            job = f"attack-{index}"
            limits = {"timeout_seconds": 10, "memory_limit_mb": 1024, **limits}
            source = ex.prepare(job) / "input" / "source"
            source.write_bytes(b"x")
            booster = boost_when_running(ex, job) if operation == "test.spin" else None
            got: list[Any] | None
            try:
                ex.run(job, operation, source, params, **limits)
                got = None
            except ChildFailed as exc:
                got = [exc.code, exc.retryable]
            finally:
                ex.cleanup(job)
                if booster is not None:
                    booster.join()
            seen.append(
                {"operation": operation, "expected": code, "got": got, "left": processes_of(uids)}
            )
    finally:
        ex.close()
        listener.close()
    shared = {
        directory: [
            e.name for e in os.scandir(directory) if e.stat(follow_symlinks=False).st_uid in uids
        ]
        for directory in (tempfile.gettempdir(), "/dev/shm", "/var/tmp")
    }
    return {
        "attacks": seen,
        "left": processes_of(uids),
        "workdirs": sorted(p.name for p in (work_root / "jobs").iterdir()),
        "children": [before_children, sorted(pid for pid, _state in children_of(os.getpid()))],
        "fds": [before_fds, _fds()],
        "shared": shared,
    }


def test_after_every_attack_nothing_is_left(tmp_path):
    """A fresh executor through every kind of attack, each ending as it should (the
    spin's is the test of the CPU limit: cpu_limit, not retryable), then closed: the
    caller has the same descriptors and children as before, no job uid has a process,
    no workdir is left, nothing in the shared temporary directories belongs to a job
    uid."""
    code = (
        "import json, sys; from pathlib import Path; "
        "from tests.integration.test_sandbox_isolation import attack_everything; "
        "print(json.dumps(attack_everything(Path(sys.argv[1]))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "work")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    for attack in seen["attacks"]:
        assert attack["got"] == attack["expected"], attack["operation"]
        assert attack["left"] == [], attack["operation"]
    assert seen["left"] == []
    assert seen["workdirs"] == []
    before_children, after_children = seen["children"]
    assert after_children == before_children  # no zombie
    before_fds, after_fds = seen["fds"]
    assert after_fds == before_fds
    # Other test suites share /tmp: what matters is that nothing there is the jobs'.
    for directory, owned in seen["shared"].items():
        assert owned == [], directory


# -- where the machine does not allow it -----------------------------------------------


_DEGRADED = """
import json, logging, sys
from pathlib import Path
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
from hypermedia.sandbox.executor import ChildExecutor
with ChildExecutor(Path(sys.argv[1]), preload=("pipelines.registry", "tests.pipelines_for_tests"),
                   spares=0) as ex:
    source = ex.prepare("j1") / "input" / "source"
    source.write_bytes(b"x")
    result = ex.run("j1", "test.identity", source, {}, timeout_seconds=10, memory_limit_mb=512)
    seen = json.loads(result.outputs[0].path.read_text())
    print(json.dumps({"capabilities": ex.capabilities, "uid": seen["uid"]}))
"""


def test_without_cap_sys_admin_the_sandbox_degrades_loudly(tmp_path):
    """Root without CAP_SYS_ADMIN (a container's default): no namespaces, and so no job
    uid either (nothing would re-expose the interpreter under /root to it). The job
    still runs, with rlimits; each missing piece is a warning and in the report."""
    command = [
        "setpriv",
        "--bounding-set=-sys_admin",
        sys.executable,
        "-c",
        _DEGRADED,
        str(tmp_path / "work"),
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    caps = report["capabilities"]
    assert caps["network_namespace"] is False
    assert caps["mount_namespace"] is False
    assert caps["own_uid"] is False
    assert (
        "EPERM" in caps["missing"]["network_namespace"]
        or "Operation not permitted" in (caps["missing"]["network_namespace"])
    )
    assert "a job uid cannot reach" in caps["missing"]["own_uid"]
    assert report["uid"] == [0, 0, 0]
    for feature in ("network namespace", "mount namespace", "own uid"):
        assert f"WARNING sandbox: no {feature} for jobs" in done.stderr


def test_switched_off_the_sandbox_says_so(tmp_path, job_id):
    with ChildExecutor(tmp_path, preload=PRELOAD, sandbox=False, spares=0) as ex:
        caps = ex.capabilities
        source = ex.prepare(job_id) / "input" / "source"
        source.write_bytes(b"x")
        result = ex.run(job_id, "test.identity", source, {}, timeout_seconds=5, memory_limit_mb=512)
        seen = json.loads(result.outputs[0].path.read_text())
    assert not any(caps[f] for f in ("network_namespace", "mount_namespace", "own_uid"))
    assert set(caps["missing"]) == set(isolation.FEATURES)
    assert seen["uid"] == [os.getuid()] * 3


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat.rsplit(b")", 1)[1].split()[0] != b"Z"


def test_a_killed_server_takes_its_jobs_processes_with_it(tmp_path, job_id):
    """The server dies by SIGKILL while a job runs with a process that left its group:
    the job's init dies of PDEATHSIG and its PID namespace with it, so nothing of the
    job outlives the server; the next server claims a uid block again."""
    with ChildExecutor(tmp_path, preload=PRELOAD, spares=0) as ex:
        uids = uid_range(ex)
        source = ex.prepare(job_id) / "input" / "source"
        source.write_bytes(b"x")
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                ex.run(
                    job_id,
                    "test.sleep",
                    source,
                    {"seconds": 60, "children": 2, "escape": True},
                    timeout_seconds=30,
                    memory_limit_mb=512,
                )
            except ChildFailed as exc:
                box["failed"] = exc

        thread = threading.Thread(target=target)
        thread.start()
        assert wait_until((ex.workdir(job_id) / "pids.txt").exists, 10)
        job_processes = processes_of(uids)
        assert len(job_processes) == 3  # the step and its two children
        server = ex.server_pid
        assert server is not None
        # The job's process and, where the namespace's init is a tiny one (sharing the
        # server's memory), that init too.
        family = Path(f"/proc/{server}/task/{server}/children").read_text().split()
        assert len(family) == (2 if ex.capabilities["tiny_init"] else 1)
        os.kill(server, signal.SIGKILL)
        thread.join(10)
        assert box["failed"].code == "sandbox_unavailable"
        # By their pids, not their uids: once the lock is free another worker's server
        # (the tests run side by side) may claim the block and run its jobs in it.
        ended = [*job_processes, *map(int, family)]
        assert wait_until(lambda: not any(_running(pid) for pid in ended), 5), ended
        # The next server claims a block again: the lowest free one, which another
        # worker's server may have freed meanwhile.
        assert run_job(ex, job_id + "-next", "test.identity")["uid"][0] in uid_range(ex)
    assert not any(_running(pid) for pid in ended)


def _private_uid_base() -> int:
    """A uid base no other test's servers use (their locks are per block's first uid)."""
    return 3_000_000 + (os.getpid() % 4096) * 4 * isolation.UID_SLOTS


def _leave_process(uid: int, *, zombie: bool) -> int:
    """A process running as ``uid``, as a killed server's job leaves one: a sleeper whose
    parent is gone (reaped by whoever adopts it), or, ``zombie``, one that has exited and
    waits for this test to reap it. Its pid."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(reader)
            if not zombie and os.fork() != 0:
                os._exit(0)  # the sleeper is orphaned
            os.setresuid(uid, uid, uid)
            os.write(writer, str(os.getpid()).encode())
            if not zombie:
                time.sleep(120)
        finally:
            os._exit(0)
    os.close(writer)
    left = int(os.read(reader, 32))
    os.close(reader)
    if not zombie:
        os.waitpid(pid, 0)
    return left


def test_a_freed_block_is_claimed_once_what_its_last_server_left_is_gone(tmp_path):
    """A server killed with SIGKILL frees its block's lock at once, while what its jobs
    left may still run: the next server kills that and waits until it is gone (so it
    counts for no job's RLIMIT_NPROC) before it takes the block."""
    base = _private_uid_base()
    left = _leave_process(base + 3, zombie=False)
    assert isolation.processes_of_uids([base + 3]) == [left]
    with ChildExecutor(tmp_path, preload=PRELOAD, spares=0, uid_base=base) as ex:
        assert uid_range(ex)[0] == base  # the block it was left in
        assert not _running(left)
        assert isolation.processes_of_uids(list(uid_range(ex))) == []
        assert run_job(ex, "claimed-0", "test.identity")["uid"][0] in uid_range(ex)


def test_a_block_whose_leftovers_will_not_go_is_passed_over(tmp_path):
    """A zombie no one reaps keeps its uid's RLIMIT_NPROC count: its block is not
    taken; the next one is."""
    base = _private_uid_base()
    zombie = _leave_process(base + 5, zombie=True)
    sleeper = _leave_process(base + 6, zombie=False)
    try:
        assert set(isolation.processes_of_uids(range(base, base + 64))) == {zombie, sleeper}
        with ChildExecutor(tmp_path, preload=PRELOAD, spares=0, uid_base=base) as ex:
            assert uid_range(ex)[0] == base + isolation.UID_SLOTS
            assert ex.capabilities["own_uid"] is True
            assert not _running(sleeper)  # killed all the same
    finally:
        os.waitpid(zombie, 0)
    assert isolation.processes_of_uids(range(base, base + isolation.UID_SLOTS)) == []


_TEMPLATE_SERVER = """
import os, signal, sys, time
from hypermedia.sandbox import isolation

work = sys.argv[1]
sandbox = isolation.Isolation(isolation.Settings(True, work, work + "/jobs", (), ()))
sandbox.plan = isolation.plan_view([], [], work)
sandbox.jobs_cover = isolation.cover_of(sandbox.plan, work + "/jobs")

def fork():
    pid = os.fork()
    if pid:  # the server is killed once its template child has built the view
        print(pid, flush=True)
        while "pause" not in open(f"/proc/{pid}/wchan").read():
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGKILL)
    return pid

sandbox._make_template(fork)
"""


def test_a_server_killed_while_it_makes_its_template_takes_the_template_child_along(tmp_path):
    """The child that builds the template view pauses until its server kills it; a
    server killed meanwhile (SIGKILL at its start, the OOM killer) left it paused for
    ever, holding what the server held open."""
    said = tmp_path / "said"
    with said.open("w") as out:  # a file, not a pipe: a child left alive holds it open
        server = subprocess.run(
            [sys.executable, "-c", _TEMPLATE_SERVER, str(tmp_path)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            timeout=60,
            check=False,
        )
    assert server.returncode == -signal.SIGKILL, said.read_text()
    child = int(said.read_text().split()[0])

    def running() -> bool:
        try:
            state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return False
        return state != "Z"

    deadline = time.monotonic() + 10
    while running() and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = running()
    if alive:
        os.kill(child, signal.SIGKILL)
    assert not alive, f"the template child {child} outlived its server"


def test_a_server_killed_before_its_tiny_init_could_die_with_it_takes_the_init_along(tmp_path):
    """The server dies by SIGKILL between a tiny init's clone and the init's
    ``PDEATHSIG`` (Ray kills an actor's fork server with the actor, at any moment; a
    new init may not have run yet on a busy machine): the init, once it runs, ends
    too. It paused for ever, with PPid 1, holding the server's memory."""
    preload = (*PRELOAD, "tests.sandbox_faults")
    with ChildExecutor(tmp_path, preload=preload, spares=1) as ex:
        assert ex.capabilities["tiny_init"] is True
        server = ex.server_pid
        assert server is not None
        said = tmp_path / sandbox_faults.STOPPED
        assert wait_until(said.exists, 30)
        init, blocked = said.read_text().split()
        init_pid = int(init)
        try:
            assert blocked == "0"  # stopped before its first steps: no PDEATHSIG yet
            assert wait_until(lambda: not alive(server), 10)
            assert alive(init_pid)  # stopped, outliving its server
            os.kill(init_pid, signal.SIGCONT)
            gone = wait_until(lambda: not alive(init_pid), 5)
        finally:
            if alive(init_pid):
                os.kill(init_pid, signal.SIGKILL)
        assert gone, f"the tiny init {init_pid} outlived its server {server}"
