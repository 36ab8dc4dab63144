"""The pure modules import nothing that does I/O (STYLE habit 1): enforced here.

Each check runs in a fresh interpreter so modules imported by other tests don't count.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PURE_MODULES = [
    "hypermedia.jobs.states",
    "hypermedia.clock",
    # Input validation: the rules and the format readers (libmagic, olefile and the
    # AES of PDF 2.0 load on first use, not on import).
    "hypermedia.sandbox.inspect",
    # The scheduler's policy and cost guard: snapshots in, decisions out.
    "autoscaler.policy",
    "autoscaler.cost",
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
        "pipelines.media",
    ],
)
def test_pipelines_import_neither_the_core_nor_the_autoscaler(module):
    """DESIGN: arrows run autoscaler -> hypermedia -> pipelines, never back."""
    loaded = imported_modules(module)
    assert module in loaded
    assert sorted(n for n in loaded if n.split(".")[0] in ("hypermedia", "autoscaler")) == []
