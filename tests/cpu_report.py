"""Where the suite's CPU goes, test by test (a pytest plugin, registered by
tests/conftest.py; off unless ``HYPERMEDIA_TEST_CPU_REPORT`` names a directory).

Wall times (``--durations``) say little on 2 cores shared by six xdist workers: a test
waits for the CPU the others take. So each worker moves itself into a cpuacct cgroup
of its own (cgroup v1's ``cpuacct`` hierarchy, else a writable cgroup v2 tree), where
everything it starts is counted too (CLI commands, API servers, stacks, Ray heads), and
records each test's CPU-s beside its wall time. The session's shared Ray head, where
every worker's pipeline actors run, goes into a group of its own when it starts
(:func:`adopt`: Ray starts actors from the raylet, so they land there too), so that one
worker's tests do not carry every worker's jobs; each test's row also has the head's
CPU-s meanwhile (the test's own actors and jobs when the run has one worker, ``-n 0``).

    HYPERMEDIA_TEST_CPU_REPORT=/tmp/cpu ./scripts/test
    python -m tests.cpu_report /tmp/cpu          # the table: tests, files, groups

Each worker writes ``<dir>/<worker>.json`` at its session's end; the shared head's group is read
by the controller before the head stops (``shared-head.json``). Needs root (making
cgroups); without a cgroup tree it can write to, it says so and measures nothing.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

REPORT_ENV = "HYPERMEDIA_TEST_CPU_REPORT"
# The session's first process (xdist's controller, or the only one): in every group's
# name, so that its end removes its groups and no other run's.
SESSION_ENV = "HYPERMEDIA_TEST_CPU_SESSION"
PREFIX = "hypermedia-tests"
SHARED_HEAD = "shared-head"  # the group of the session's shared Ray head
_V1 = Path("/sys/fs/cgroup/cpuacct")
_V2 = Path("/sys/fs/cgroup")


def _root() -> Path | None:
    if (_V1 / "cpuacct.usage").is_file() and os.access(_V1, os.W_OK):
        return _V1
    if (_V2 / "cgroup.controllers").is_file() and os.access(_V2, os.W_OK):
        return _V2
    return None


def usage_seconds(group: Path) -> float:
    """CPU-s of everything that ran in ``group`` since it was made."""
    if (group / "cpuacct.usage").is_file():
        return int((group / "cpuacct.usage").read_text()) / 1e9
    for line in (group / "cpu.stat").read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec":
            return int(value) / 1e6
    raise OSError(f"no CPU usage in {group}")


def _group_path(name: str) -> Path | None:
    """This session's group ``name`` (made or not); None without a cgroup tree."""
    root = _root()
    if root is None:
        return None
    return root / f"{PREFIX}-{os.environ.get(SESSION_ENV, os.getpid())}-{name}"


def _group(name: str) -> Path | None:
    group = _group_path(name)
    if group is not None:
        group.mkdir(exist_ok=True)
    return group


def adopt(pids: Iterable[int], name: str) -> None:
    """Move running processes (and so what they start later) into a group ``name``:
    the shared Ray head's. Nothing when the report is off."""
    if not os.environ.get(REPORT_ENV):
        return
    group = _group(name)
    if group is None:
        return
    for pid in pids:
        try:
            (group / "cgroup.procs").write_text(str(pid))
        except OSError:
            continue  # exited meanwhile


class _Recorder:
    def __init__(self, group: Path, out: Path, worker: str) -> None:
        self.group = group
        self.out = out
        self.worker = worker
        self.tests: dict[str, list[float]] = {}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(
        self, item: pytest.Item, nextitem: pytest.Item | None
    ) -> Iterator[None]:
        head = self.shared_head()
        cpu, wall = usage_seconds(self.group), time.monotonic()
        yield
        self.tests[item.nodeid] = [
            round(usage_seconds(self.group) - cpu, 2),
            round(time.monotonic() - wall, 2),
        ]
        after = self.shared_head()
        if after is not None:
            # The shared head's CPU meanwhile: this test's actors and jobs alone only
            # when the run has one worker (with more it includes the others' too).
            self.tests[item.nodeid].append(round(after - (head or 0.0), 2))

    @staticmethod
    def shared_head() -> float | None:
        group = _group_path(SHARED_HEAD)
        return usage_seconds(group) if group is not None and group.is_dir() else None

    @pytest.hookimpl(trylast=True)  # after the session's fixtures are torn down
    def pytest_sessionfinish(self) -> None:
        # Here, not at unconfigure: an xdist worker may be ended once it has told the
        # controller it finished (which its wrapper of this hook does after it).
        body = {"tests": self.tests, "total": round(usage_seconds(self.group), 2)}
        (self.out / f"{self.worker}.json").write_text(json.dumps(body))


def pytest_configure(config: pytest.Config) -> None:
    out = os.environ.get(REPORT_ENV)
    if not out:
        return
    Path(out).mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    if worker == "main":
        os.environ[SESSION_ENV] = str(os.getpid())
        if getattr(config.option, "numprocesses", None):
            return  # the xdist controller runs no test: its workers measure
    group = _group(worker)
    if group is None:
        print(f"{REPORT_ENV}: no cgroup tree this user can write: nothing measured")
        return
    (group / "cgroup.procs").write_text(str(os.getpid()))
    config.pluginmanager.register(_Recorder(group, Path(out), worker), "cpu-report")


def read_shared_head() -> None:
    """The session's first process, before it stops the shared head: its group's CPU-s."""
    out = os.environ.get(REPORT_ENV)
    group = _group_path(SHARED_HEAD) if out else None
    if out and group is not None and group.is_dir():
        seconds = usage_seconds(group)
        (Path(out) / f"{SHARED_HEAD}.json").write_text(json.dumps({"total": round(seconds, 2)}))


def remove_groups() -> None:
    """The session's end: its groups, and those of runs that ended before theirs could
    go (a process still in them then), that nothing runs in any more go."""
    root, session = _root(), os.environ.get(SESSION_ENV)
    if not os.environ.get(REPORT_ENV) or root is None or session is None:
        return
    if session == str(os.getpid()):  # the only process: out of its group first
        (root / "cgroup.procs").write_text(str(os.getpid()))
    for group in root.glob(f"{PREFIX}-*-*"):
        owner = group.name.removeprefix(f"{PREFIX}-").split("-", 1)[0]
        if owner != session and _alive(owner):
            continue  # another run's, still going
        try:
            group.rmdir()
        except OSError:
            continue  # a process still in it (a leftover daemon): the kernel keeps it


def _alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def main(out: str, top: int = 40) -> None:
    tests: dict[str, list[float]] = {}
    groups: dict[str, float] = {}
    for path in sorted(Path(out).glob("*.json")):
        body = json.loads(path.read_text())
        groups[path.stem] = body["total"]
        tests.update(body.get("tests", {}))
    print(f"CPU-s by group (total {sum(groups.values()):.0f}):")
    for name, seconds in groups.items():
        print(f"{seconds:9.1f}  {name}")
    print(
        f"\nthe {top} tests that took the most CPU (CPU-s, wall s, the shared head's CPU-s"
        " meanwhile: the test's own only in a run of one worker):"
    )
    for nodeid, (cpu, wall, *head) in sorted(tests.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{cpu:9.1f} {wall:7.1f} {_cell(head)}  {nodeid}")
    files: dict[str, list[float]] = {}  # CPU-s a file: its worker's, the shared head's
    for nodeid, (cpu, _wall, *head) in tests.items():
        row = files.setdefault(nodeid.split("::")[0], [0.0, 0.0])
        row[0] += cpu
        row[1] += head[0] if head else 0.0
    print("\nby file (CPU-s, the shared head's meanwhile):")
    for name, (seconds, head_seconds) in sorted(files.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{seconds:9.1f} {head_seconds:7.1f}  {name}")


def _cell(head: list[float]) -> str:
    return f"{head[0]:7.1f}" if head else "      -"


if __name__ == "__main__":
    main(sys.argv[1])
