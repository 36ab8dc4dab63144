"""The order tests are handed to xdist workers in (a pytest plugin, registered by
tests/conftest.py).

A few dozen tests (a ``ray up`` cluster, the hostile files through the workers, the
stacks started and killed) take most of the suite's time. Handed out in file order,
two of them can queue behind each other on one worker while the others finish early.
So under xdist the tests known to be long (``tests/durations.json``: seconds per test
id, measured by :func:`main` from a JUnit XML report) go first, longest first, each
followed by a short one: ``scripts/test`` runs with ``--maxschedchunk 1``, so every
worker starts with one long test and takes the next long one when it is free (the
longest-first rule). A run without xdist keeps the file order, which keeps
module-scoped fixtures built once.

Under xdist a module-scoped fixture is built by every worker that runs one of its
tests, and again each time that worker comes back to the module after another's test.
The modules in :data:`ONE_WORKER`, whose fixture costs seconds (a stack with workers
that runs every error case, a wheel built, OCR models loaded, encoded media, a moto
server, a fork server, a Chromium), go to one worker whole: the scheduler
(:class:`ModulesTogether`, xdist's load-scope scheduling with every other test its own
unit) keeps them together and the rest in the order above.
(xdist's own ``--dist loadgroup`` does nothing on pytest 9: it renames items through an
attribute pytest no longer reads.)

``python -m tests.scheduling report.xml`` rewrites the durations from a report
(``pytest --junitxml report.xml``).
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

DURATIONS = Path(__file__).resolve().parent / "durations.json"
LONG_SECONDS = 3.0
ONE_WORKER = frozenset(
    {
        "tests/integration/test_error_codes.py",
        "tests/integration/test_packaging.py",
        "tests/integration/test_ocr_engines.py",
        "tests/integration/test_media_chunks.py",
        # Its sources made once (``made``: 16 clips for 2-6 cases each), the SDR bars'
        # transcode, a fork server with pipelines.media: -n 4, spread 37.7 / 37.0 CPU-s,
        # here 35.4 / 34.8.
        "tests/integration/test_pipeline_media.py",
        # Their CPU-s with -n 6 (tests/cpu_report.py), spread against here: 32 / 21
        # (moto), 86 / 73 (LibreOffice's executor), 12.4 / 9.7.
        "tests/integration/test_driver_aws.py",
        "tests/integration/test_pipeline_office.py",
        "tests/integration/test_sandbox_executor.py",
        # moto's EC2 costs ~1.6 CPU-s at its first use in a process (its import, the
        # regions' catalogue): its tests took 12.2 CPU-s on three workers, 7.0 on one.
        "tests/integration/test_provider_ledger.py",
        # Its three page tests share one Chromium (~0.8 CPU-s a start), module-scoped:
        # long tests each (tests/durations.json), they went out first, one a worker.
        "tests/integration/test_operator_page.py",
        # Their cases share a database and a stack (and server) per engine, module-scoped
        # (tests/conftest.py's module_* fixtures): spread, each case would build them anew.
        "tests/integration/test_guards.py",
        "tests/integration/test_api.py",
        "tests/integration/test_api_inputs.py",
        "tests/integration/test_api_inspection.py",
        # Its uninterrupted OCR run (``whole``), which every case compares with or takes
        # its pieces from, made once: 8 runs of ~0.45 CPU-s before.
        "tests/integration/test_ocr_resume.py",
    }
)


def known_durations() -> dict[str, float]:
    try:
        loaded = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in loaded.items()}


def longest_first(nodeids: list[str], durations: dict[str, float]) -> list[str]:
    """``nodeids`` with the long ones first (longest first), each followed by a short
    one, and the short ones after in their order."""
    long = sorted(
        (n for n in nodeids if durations.get(n, 0.0) >= LONG_SECONDS),
        key=lambda n: -durations[n],
    )
    chosen = set(long)
    short = [n for n in nodeids if n not in chosen]
    ordered: list[str] = []
    for index, nodeid in enumerate(long):
        ordered.append(nodeid)
        if index < len(short):
            ordered.append(short[index])
    ordered.extend(short[len(long) :])
    return ordered


@pytest.hookimpl(trylast=True)  # after deselection
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):
        return  # not an xdist worker: file order
    by_id = {item.nodeid: item for item in items}
    items[:] = [by_id[n] for n in longest_first(list(by_id), known_durations())]


class ModulesTogether(LoadScopeScheduling):  # type: ignore[misc]
    """Load scheduling, one test a unit, but a module of :data:`ONE_WORKER` is one unit
    (its tests on one worker, in order); units go out in the collection's order."""

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        return module if module in ONE_WORKER else nodeid


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> ModulesTogether | None:
    if config.getoption("dist") != "load":
        return None  # a distribution asked for by name
    config.option.loadscopereorder = False  # longest first (above), not largest unit first
    return ModulesTogether(config, log)


def main(report: str) -> None:
    """Write tests/durations.json from a JUnit XML report: the tests over a second. A
    test the report does not hold (a tier that did not run: the corpus, the slow ones)
    keeps its old duration while its function is still in its module."""
    root = Path(__file__).resolve().parents[1]
    durations = {
        nodeid: seconds
        for nodeid, seconds in json.loads(DURATIONS.read_text()).items()
        if _still_there(root, nodeid)
    }
    reported: set[str] = set()
    for case in ET.parse(report).iter("testcase"):
        parts = (case.get("classname") or "").split(".")
        # "tests.integration.test_x" or "tests.integration.test_x.TestClass"
        for cut in range(len(parts), 0, -1):
            module = Path(root, *parts[:cut]).with_suffix(".py")
            if module.is_file():
                nodeid = "::".join(
                    [module.relative_to(root).as_posix(), *parts[cut:], case.get("name", "")]
                )
                seconds = float(case.get("time") or 0)
                reported.add(nodeid)
                durations.pop(nodeid, None)
                if seconds >= 1.0:
                    durations[nodeid] = round(seconds, 1)
                break
    DURATIONS.write_text(json.dumps(dict(sorted(durations.items())), indent=1) + "\n")
    kept = len(set(durations) - reported)
    print(f"{len(durations)} tests over a second ({kept} not in the report) written to {DURATIONS}")


def _still_there(root: Path, nodeid: str) -> bool:
    """Whether ``nodeid``'s module still defines its test function."""
    path, _, rest = nodeid.partition("::")
    name = rest.rpartition("::")[2].partition("[")[0]
    module = root / path
    return module.is_file() and f"def {name}(" in module.read_text(encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1])
