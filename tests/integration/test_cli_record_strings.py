"""What the commands print of the record is text: the error message, worker and child log
of ``hypermedia status JOB_ID``, a run's reason in ``bulk status`` (and its error line),
the file names and errors of ``run``'s summary and its "output not written" lines. Each
holds what others wrote (an exception's text, a child's output, a file's name), and the
terminal obeyed an ESC in it (a colour, a window title, a cleared screen). As on the
status screen (tests/unit/test_status_screen.py): each control character but the line
feed is shown as its escape (``\\x1b``), on a terminal and off one, nothing is read as
Rich markup, and a value's own lines cannot pass for lines of the command's."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console
from sqlalchemy import update
from typer.testing import CliRunner

from hypermedia.bulk.runs import RunSpec
from hypermedia.bulk.service import BulkService
from hypermedia.cli import app
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.ingest.api import create_app
from hypermedia.ingest.client import HypermediaClient
from hypermedia.jobs.catalog import ProfileCatalog
from hypermedia.runner import RunReport, Submitted
from hypermedia.stack import Stack
from tests import support
from tests.api_support import add_user, running_server
from tests.factories import make_object, make_user, open_stack

# A colour, a window title (OSC 0, ended by a bell), a clear screen, a carriage return
# (the line written again), a C1 CSI, a right-to-left override (a name that shows as
# "invoiceexe.pdf") and an isolate; and markup Rich would choke on.
HOSTILE = (
    "\x1b[31mred\x1b[0m \x1b]0;retitled\x07 \x1b[2J \r\x9b31m invoice\u202efdp.exe\u2067 [/bold]"
)
SHOWN = (
    "\\x1b[31mred\\x1b[0m \\x1b]0;retitled\\x07 \\x1b[2J \\x0d\\x9b31m"
    " invoice\\u202efdp.exe\\u2067 [/bold]"
)
RAW = ("\x1b[31mred", "\x1b]", "\x1b[2J", "\x07", "\r", "\x9b", "\u202e", "\u2067")
IMAGE = b"\xff\xd8\xff\xe0" + bytes(range(256)) * 40
# On a terminal: click keeps what it strips off one, and Rich writes colours.
TERMINAL = {False: {}, True: {"FORCE_COLOR": "1"}}


def raw_in(text: str) -> list[str]:
    return [sequence for sequence in RAW if sequence in text]


@pytest.fixture
def stack(pg_engine, settings) -> Iterator[Stack]:
    opened = Stack.open(settings(), engine=pg_engine, auto_migrate=True)
    yield opened
    opened.close()


def test_a_jobs_status_shows_its_error_worker_and_log_as_text(stack):
    alice = add_user(stack, "alice")
    worker = f"w-{HOSTILE}"
    with running_server(create_app(stack)) as base_url:
        with HypermediaClient(base_url, alice.api_key) as client:
            upload = client.upload(IMAGE, "a.jpg")
            job_id = client.process(upload.object_id, ["thumbnail"]).job_ids[0]
        [claimed] = stack.dispatcher.claim_and_start("images", worker)
        stack.dispatcher.fail(
            claimed,
            worker,
            "pipeline_crashed",
            f"died: {HOSTILE}\nstatus     completed",  # a second line, as a row would be
            retryable=False,
            log_tail=f"decoder: {HOSTILE}\n",
        )
        env = {"HYPERMEDIA_API_URL": base_url, "HYPERMEDIA_API_KEY": alice.api_key}
        for terminal, extra in TERMINAL.items():
            shown = CliRunner().invoke(app, ["status", job_id], env=env | extra, color=terminal)
            assert shown.exit_code == 0, shown.output
            out = shown.stdout
            assert raw_in(out) == [], (terminal, out)
            # The error, the attempt's worker and the child's line, each as written (the
            # log's lines as it has them: a CR of a child's progress ends one) ...
            assert out.count(SHOWN) == 2, (terminal, out)
            assert f"error      pipeline_crashed: died: {SHOWN}\n" in out
            assert f"attempt 1  failed pipeline_crashed on w-{SHOWN}\n" in out
            before, _, after = SHOWN.partition("\\x0d")
            assert f"  decoder: {before}\n  {after}\n" in out
            # ... and the message's second line in its column, not a row of its own.
            assert "\nstatus     failed\n" in out
            assert "\nstatus     completed" not in out
            assert f"\n{' ' * 11}status     completed\n" in out


def test_bulk_status_shows_a_runs_reason_as_text(
    engine, settings, manual_clock, tmp_path, redis_url, redis_prefix
):
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    make_object(stack, person)
    service = BulkService(
        stack.engine, stack.queue, ProfileCatalog.load(stack.engine), clock=stack.clock
    )
    run = service.create(RunSpec(kind="backfill", operation="thumbnail", max_in_flight=10), "t")
    reason = f"target unreachable: {HOSTILE}\n  scanned 999"  # its second line, as ours
    with transaction(stack.engine) as conn:
        conn.execute(
            update(t.bulk_runs)
            .where(t.bulk_runs.c.run_id == run.run_id)
            .values(state="paused", reason=reason)
        )
    stack.close()
    env = {
        "HYPERMEDIA_DATABASE_URL": support.url_string(engine),
        "HYPERMEDIA_REDIS_URL": redis_url,
        "HYPERMEDIA_REDIS_PREFIX": redis_prefix,
        "HYPERMEDIA_DATA_DIR": str(tmp_path),
    }
    for terminal, extra in TERMINAL.items():
        runner = CliRunner()
        shown = runner.invoke(app, ["bulk", "status", run.run_id], env=env | extra, color=terminal)
        assert shown.exit_code == 0, (shown.output, shown.exception)
        assert raw_in(shown.stdout) == [], (terminal, shown.stdout)
        assert f"paused (target unreachable: {SHOWN}\n" in shown.stdout
        assert "\n  scanned 999" not in shown.stdout  # deeper than the command's own lines
        # --follow stops at the pause and says why, on its error line.
        args = ["bulk", "status", run.run_id, "--follow", "--interval", "0.05"]
        followed = runner.invoke(app, args, env=env | extra, color=terminal)
        assert followed.exit_code == 1, (followed.output, followed.exception)
        assert raw_in(followed.stderr) == [], (terminal, followed.stderr)
        assert f"is paused: target unreachable: {SHOWN}" in followed.stderr


# Files as named on the user's disk (a name holds any character but the slash: the one
# of HOSTILE's [/bold] makes these a folder's, shown as the run names them, relative).
NAMED = [Path(f"a{HOSTILE}.jpg"), Path("b.jpg"), Path(f"c{HOSTILE}.bin")]


def hostile_report() -> RunReport:
    return RunReport(
        submitted=[
            Submitted(NAMED[0], "thumbnail", "images", "j-1"),
            Submitted(NAMED[1], "thumbnail", "images", "j-2"),
        ],
        skipped=[(NAMED[2], f"unknown type {HOSTILE}")],
        statuses={"j-1": "failed", "j-2": "failed"},
        errors={"j-1": "decode_error: ...", "j-2": f"decode_error: {HOSTILE}"},
    )


def rendered(shown: object, terminal: bool) -> str:
    out = io.StringIO()
    console = Console(file=out, force_terminal=terminal, width=3000, color_system="standard")
    console.print(shown)
    return out.getvalue()


def test_runs_summary_shows_file_names_and_errors_as_text():
    from hypermedia.cli.run import _run_summary

    for terminal in (True, False):
        out = io.StringIO()
        console = Console(file=out, force_terminal=terminal, width=3000, color_system="standard")
        _run_summary(console, hostile_report(), {p: p for p in NAMED}, Path("out"), True, 1.0)
        shown = out.getvalue()
        assert raw_in(shown) == [], (terminal, shown)
        assert shown.count(SHOWN) == 4, (terminal, shown)  # 2 names, an error, a reason


def test_runs_output_not_written_line_shows_the_failure_as_text():
    from hypermedia.cli.run import not_written

    for terminal in (True, False):
        shown = rendered(not_written(f"out/a{HOSTILE}.jpg: Permission denied"), terminal)
        assert raw_in(shown) == [], (terminal, shown)
        assert "output not written" in shown
        assert f": out/a{SHOWN}.jpg: Permission denied\n" in shown, (terminal, shown)


def test_the_commands_print_through_say_or_rich_text():
    """Every line a command prints goes through :func:`hypermedia.cli.common.say` (or
    Rich as plain text): no typer.echo of its own, which sent a string raw."""
    import hypermedia.cli

    package = Path(hypermedia.cli.__file__).parent
    echoing = [
        f"{path.name}:{number}"
        for path in sorted(package.glob("*.py"))
        if path.name != "common.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "typer.echo(" in line or "typer.secho(" in line or "click.echo(" in line
    ]
    assert echoing == []
