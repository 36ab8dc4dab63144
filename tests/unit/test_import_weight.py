"""What a process pays in imports before it does anything: every actor imports the stack,
every command the CLI. Libraries only some of them use are imported where they are used."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _modules(statement: str) -> set[str]:
    """The modules a fresh interpreter has imported after ``statement`` (not one marked
    absent: None in sys.modules, as the CLI marks what it never uses)."""
    loaded = "sorted(n for n, m in sys.modules.items() if m is not None)"
    code = f"import json, sys\n{statement}\nprint(json.dumps({loaded}))\n"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    return set(json.loads(result.stdout.splitlines()[-1]))


def _loaded(statement: str) -> set[str]:
    """The top-level packages a fresh interpreter has imported after ``statement``."""
    return {m.split(".")[0] for m in _modules(statement)}


def test_the_stack_imports_no_rate_limit_library_until_something_is_counted():
    # The actors and the CLI's commands open a stack and count nothing; the API does.
    assert "limits" not in _loaded("import hypermedia.stack")


def _orm(modules: set[str]) -> set[str]:
    return {m for m in modules if m.split(".")[:2] == ["sqlalchemy", "orm"]}


def test_the_record_is_used_without_the_orm(tmp_path):
    # The tables are Core tables: importing them, or opening a stack (a migrated SQLite
    # record; Redis is not asked anything), maps no class. sqlalchemy.orm and the mapping
    # cost ~0.2 CPU-s in every actor, command and test process that opens one.
    assert not _orm(_modules("import hypermedia.db.tables"))
    statement = (
        "from hypermedia.config import load_settings\n"
        "from hypermedia.stack import Stack\n"
        f"settings = load_settings(data_dir={str(tmp_path)!r},"
        f" database_url={f'sqlite:///{tmp_path}/record.db'!r},"
        " redis_url='redis://127.0.0.1:9/0')\n"
        "Stack.open(settings, auto_migrate=True).close()"
    )
    assert not _orm(_modules(statement))


HEAVY = {"sqlalchemy", "redis", "ray", "boto3", "pyvips", "fastapi", "limits", "opentelemetry"}


def test_the_cli_help_imports_no_server_library():
    # --help builds every command (their short help); none imports a server library.
    for args in (["--help"], ["user", "--help"], ["bulk", "--help"]):
        statement = (
            f"sys.argv = ['hypermedia', *{args!r}]\n"
            "import contextlib, io\n"
            "from hypermedia.cli import main\n"
            "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
            "    main()"
        )
        assert not _loaded(statement) & HEAVY, args
