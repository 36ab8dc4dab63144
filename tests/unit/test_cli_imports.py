"""What a CLI command loads: each is a process of its own (a script's loop, a test's
dozens), and its imports are most of its CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Run the command as `python -m hypermedia.cli` does, then list what it loaded (a name
# marked absent, None in sys.modules, was not).
_COMMAND = """
import atexit, json, sys
loaded = lambda: sorted(name for name, module in sys.modules.items() if module is not None)
atexit.register(lambda: print(json.dumps(loaded()), file=sys.__stdout__))
sys.argv = ["hypermedia", *sys.argv[1:]]
from hypermedia.cli import main
main()
"""


def _loaded(tmp_path: Path, *args: str, **env: str) -> tuple[set[str], str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HYPERMEDIA_")}
    result = subprocess.run(
        [sys.executable, "-c", _COMMAND, *args],
        cwd=REPO,
        env={**clean, "HYPERMEDIA_DATA_DIR": str(tmp_path / "data"), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return set(json.loads(result.stdout.splitlines()[-1])), result.stderr


def test_a_client_command_loads_no_database_library_nor_async_one(tmp_path):
    """``status JOB_ID`` (as ``submit``, ``queues``, ``cancel``) talks HTTP: the settings'
    check of ``database_statement_seconds`` imported SQLAlchemy for it (a fifth of the
    command's CPU). (One command process for both facts: this and the async library's,
    once a test of its own.)"""
    loaded, said = _loaded(
        tmp_path,
        "status",
        "x",
        HYPERMEDIA_API_KEY="hm_x_y",
        HYPERMEDIA_API_URL="http://127.0.0.1:9",
    )
    assert "cannot reach the API" in said, said
    assert not {"sqlalchemy", "redis"} & {name.split(".")[0] for name in loaded}
    # Nor an async library, nor httpx's command line: httpcore imported trio (installed
    # beside the tests' selenium) and httpx its command line (click, Pygments, Rich's
    # syntax and progress) for nothing, ~0.15 CPU-s of each such command.
    assert {"httpx", "httpcore"} <= loaded  # it did talk HTTP
    assert not {"trio", "httpx._main", "click", "pygments", "rich.syntax"} & loaded


def test_a_command_that_reads_redis_loads_no_opentelemetry_sdk(tmp_path):
    """redis imported the OpenTelemetry SDK (for metrics of its own, never turned on
    here) in every command that reads Redis: ~0.04 CPU-s of each. (A record file there,
    empty: without one the command refuses before it loads the client.)"""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "hypermedia.db").touch()
    loaded, said = _loaded(
        tmp_path, "scheduler", "explain", HYPERMEDIA_REDIS_URL="redis://127.0.0.1:9/0"
    )
    assert "Traceback" not in said, said
    assert "redis" in loaded  # it did load the client
    assert not {name for name in loaded if name.startswith("opentelemetry.sdk")}


def test_serve_refuses_its_scheduler_json_before_it_loads_the_server(tmp_path):
    """``serve`` read scheduler.json after importing the server, the operator page and
    the stack (FastAPI, SQLAlchemy, Redis): ~1 CPU-s to refuse a file, 0.3 now."""
    bad = tmp_path / "scheduler.json"
    bad.write_text("{")
    loaded, said = _loaded(tmp_path, "serve", "--scheduler-config", str(bad))
    assert f"{bad}: not JSON" in said, said
    assert "Traceback" not in said, said
    assert not {"fastapi", "sqlalchemy", "redis"} & {name.split(".")[0] for name in loaded}
    assert not {"hypermedia.stack", "hypermedia.server", "autoscaler.page.routes"} & loaded


def test_db_upgrade_loads_no_redis_client_nor_the_stack(tmp_path):
    """``db upgrade`` took its ``migrate`` from :mod:`hypermedia.stack`, and with it the
    Redis client (and the OpenTelemetry SDK it loads), ingest and storage."""
    loaded, said = _loaded(tmp_path, "db", "upgrade")
    assert "Traceback" not in said, said
    assert "hypermedia.db.upgrade" in loaded
    assert not {"redis", "hypermedia.stack", "hypermedia.ingest.service"} & loaded
