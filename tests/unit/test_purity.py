"""The pure modules import nothing that does I/O (STYLE habit 1): enforced here.

Each check runs in a fresh interpreter so modules imported by other tests don't count.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PURE_MODULES = [
    "hypermedia.jobs.states",
    "hypermedia.jobs.priority",
    # The metric catalogue and the recorders' protocol (no prometheus-client, no Ray).
    "hypermedia.metrics",
    "hypermedia.clock",
    # Input validation: the rules and the format readers (libmagic, olefile and the
    # AES of PDF 2.0 load on first use, not on import).
    "hypermedia.sandbox.inspect",
    # What a request's strings and JSON values may hold (checked at the API's edge).
    "hypermedia.ingest.fields",
    # The secret files the environment names, for the sandboxes to hide.
    "hypermedia.secret_files",
    # The scheduler's policy and cost guard: snapshots in, decisions out.
    "autoscaler.policy",
    "autoscaler.cost",
    # The values between them, and the rule that counts long transcodes.
    "autoscaler.snapshot",
    # The admission rule the policy and the node provider both apply.
    "autoscaler.admission",
    # The VPS's share of each queue's baseline, by mode.
    "autoscaler.placement",
    # The alert rules: an observation in, notifications out.
    "autoscaler.alerts",
    # Billing reconciliation: ledger rows and a bill in, findings out.
    "autoscaler.billing",
    # The operator page's chart columns: samples and the ledger in, columns out.
    "autoscaler.page.charts",
    # OCR: its parameters (checked at submit) and its reading order and page judgement.
    "pipelines.ocr_params",
    "pipelines.ocr_layout",
]

# Top-level packages that open sockets, files of their own or talk to services.
IO_PACKAGES = [
    "sqlalchemy",
    "alembic",
    "redis",
    "httpx",
    "fastapi",
    "starlette",
    "uvicorn",
    "psycopg",
    "ray",
    "boto3",
    "botocore",
    "google",
    "ionoscloud",
    "requests",
    "urllib3",
    "socket",
    "ssl",
    "asyncio",
    "subprocess",
    "http",
]


def imported_modules(module: str) -> set[str]:
    code = f"import json, sys; import {module}; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return set(json.loads(result.stdout))


@pytest.mark.parametrize("module", PURE_MODULES)
def test_pure_module_imports_no_io(module):
    loaded = imported_modules(module)
    assert module in loaded
    offenders = sorted(name for name in loaded if name.split(".")[0] in IO_PACKAGES)
    assert offenders == [], f"{module} pulls in I/O modules: {offenders}"


def test_the_check_would_notice_an_io_import():
    loaded = imported_modules("hypermedia.db.engine")
    assert "sqlalchemy" in loaded


def test_importing_the_package_is_cheap():
    loaded = imported_modules("hypermedia")
    assert not [name for name in loaded if name.split(".")[0] in IO_PACKAGES]


@pytest.mark.parametrize(
    "module",
    [
        "pipelines.registry",
        "pipelines.images",
        "pipelines.pdf",
        "pipelines.office",
        "pipelines.office_libreoffice",
        "pipelines.office_text",
        "pipelines.media",
        "pipelines.ocr",
        "pipelines.ocr_engines",
        "pipelines.ocr_pdf",
    ],
)
def test_pipelines_import_neither_the_core_nor_the_autoscaler(module):
    """DESIGN: arrows run autoscaler -> hypermedia -> pipelines, never back."""
    loaded = imported_modules(module)
    assert module in loaded
    assert sorted(n for n in loaded if n.split(".")[0] in ("hypermedia", "autoscaler")) == []


# -- layers: hypermedia.queue is the bottom, hypermedia.jobs sits on it ---------------------

# What the queue package may import from the project: itself and the bottom modules.
QUEUE_MAY_IMPORT = ("hypermedia.queue", "hypermedia.errors", "hypermedia.clock", "hypermedia.ids")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module ``source`` imports, wherever the statement sits (functions,
    ``TYPE_CHECKING`` blocks), relative imports resolved against ``module``."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                stem = ".".join([*base, node.module] if node.module else base)
            else:
                stem = node.module or ""
            found.add(stem)
            # ``from hypermedia import jobs`` imports the module hypermedia.jobs.
            found.update(f"{stem}.{alias.name}" for alias in node.names)
    return found


def package_imports(package: str) -> dict[str, set[str]]:
    """Each module of ``package`` (a directory under the repository) and what it imports
    from the project."""
    graph: dict[str, set[str]] = {}
    for path in sorted((REPO / package.replace(".", "/")).rglob("*.py")):
        name = module_name(path)
        found = imports_of(path.read_text(), name, path.name == "__init__.py")
        graph[name] = {m for m in found if m.split(".")[0] in ("hypermedia", "autoscaler")}
    return graph


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_queue_package_imports_nothing_above_it():
    graph = package_imports("hypermedia.queue")
    assert "hypermedia.queue.redis_queue" in graph
    offenders = sorted(
        f"{module} imports {imported}"
        for module, imported_names in graph.items()
        for imported in imported_names
        if not any(within(imported, allowed) for allowed in QUEUE_MAY_IMPORT)
        and imported != "hypermedia"  # ``from hypermedia import errors`` names the root
    )
    assert offenders == []


def test_no_import_cycle_between_queue_and_jobs():
    """jobs may use queue; queue never reaches back into jobs, directly or through
    another package of the project."""
    graph: dict[str, set[str]] = {}
    for path in sorted((REPO / "hypermedia").rglob("*.py")):
        name = module_name(path)
        graph[name] = imports_of(path.read_text(), name, path.name == "__init__.py")
    reached: set[str] = set()
    todo = [m for m in graph if within(m, "hypermedia.queue")]
    while todo:
        module = todo.pop()
        for imported in graph.get(module, ()):
            if imported in graph and imported not in reached:
                reached.add(imported)
                todo.append(imported)
    assert sorted(m for m in reached if within(m, "hypermedia.jobs")) == []


def test_the_import_reader_sees_every_form():
    source = (
        "import hypermedia.jobs.states\n"
        "from hypermedia.jobs import repository\n"
        "from ..jobs.dispatcher import mirror_row\n"
        "from . import keys\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from hypermedia.ingest.service import IngestService\n"
        "def later():\n"
        "    import hypermedia.stack\n"
    )
    found = imports_of(source, "hypermedia.queue.redis_queue")
    assert {
        "hypermedia.jobs.states",
        "hypermedia.jobs.repository",
        "hypermedia.jobs.dispatcher",
        "hypermedia.queue.keys",
        "hypermedia.ingest.service",
        "hypermedia.stack",
    } <= found


def test_importing_the_queue_loads_no_job_module():
    loaded = imported_modules("hypermedia.queue.redis_queue")
    assert "hypermedia.queue.redis_queue" in loaded
    assert sorted(n for n in loaded if within(n, "hypermedia.jobs")) == []


def test_the_queue_knows_the_terminal_statuses_the_jobs_define():
    """hypermedia.queue.events ends a job's stream on a terminal status without
    importing hypermedia.jobs: its copy of the set is the jobs' own."""
    from hypermedia.jobs.states import TERMINAL
    from hypermedia.queue.events import ENDED_STATUSES

    assert {status.value for status in TERMINAL} == ENDED_STATUSES
