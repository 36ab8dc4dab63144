"""The CLI's shape: a cheap import, and a ``HYPERMEDIA_*`` twin for every option."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import typer.main

from hypermedia.cli import app

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("sqlalchemy", "alembic", "fastapi", "starlette", "uvicorn", "httpx", "redis", "pydantic")


def test_importing_the_cli_loads_no_heavy_module():
    code = (
        "import json, sys, hypermedia.cli; "
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    loaded = set(json.loads(result.stdout))
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


def _options(command: Any, path: str = "hypermedia") -> list[tuple[str, Any]]:
    found = [
        (f"{path} --{param.name}", param)
        for param in command.params
        if param.param_type_name == "option" and param.name != "help"
    ]
    for name, sub in getattr(command, "commands", {}).items():
        found += _options(sub, f"{path} {name}")
    return found


def test_every_option_has_an_environment_twin():
    options = _options(typer.main.get_command(app))
    assert len(options) > 20  # the walk really found the commands' options
    missing = [name for name, param in options if not param.envvar]
    assert missing == []
    wrong = [name for name, param in options if not str(param.envvar).startswith("HYPERMEDIA_")]
    assert wrong == []
