"""What a process pays in imports before it does anything: every actor imports the stack,
every command the CLI. Libraries only some of them use are imported where they are used."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _loaded(statement: str) -> set[str]:
    """The top-level packages a fresh interpreter has imported after ``statement``."""
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))\n"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    return {m.split(".")[0] for m in json.loads(result.stdout)}


def test_the_stack_imports_no_rate_limit_library_until_something_is_counted():
    # The actors and the CLI's commands open a stack and count nothing; the API does.
    assert "limits" not in _loaded("import hypermedia.stack")


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
