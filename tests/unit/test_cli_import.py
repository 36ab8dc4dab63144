"""The CLI's shape: a cheap import, and a ``HYPERMEDIA_*`` twin for every option."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import typer.main

from hypermedia.cli import app
from hypermedia.cli.lazy import COMMANDS

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


def _loaded_after(*args: str, heads: tuple[str, ...] = ("hypermedia",)) -> tuple[str, set[str]]:
    """What ``hypermedia ARGS`` printed, and the modules under ``heads`` it had imported."""
    code = (
        "import json, sys\n"
        f"sys.argv = ['hypermedia', *{list(args)!r}]\n"
        "from hypermedia.cli import main\n"
        "try:\n"
        "    main()\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "120"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    output, _, modules = result.stdout.rstrip("\n").rpartition("\n")
    return output, {m for m in json.loads(modules) if m.split(".")[0] in heads}


def test_a_command_imports_its_own_module_only():
    output, loaded = _loaded_after("db", "--help")
    assert "upgrade" in output
    commands = {m for m in loaded if m.startswith("hypermedia.cli.")}
    assert commands == {"hypermedia.cli.database", "hypermedia.cli.common", "hypermedia.cli.lazy"}


def test_the_help_still_lists_every_command():
    output, _ = _loaded_after("--help")
    for name in COMMANDS:
        assert f"│ {name} " in output, name


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
