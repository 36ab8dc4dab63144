"""``hypermedia [<command>] --help`` as an operator's terminal shows it: every command's
text wraps as whole paragraphs (a docstring's line breaks are not the terminal's)."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
import typer.main
import typer.rich_utils
from typer.testing import CliRunner

from hypermedia.cli import app, options_table

REPO = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _commands(command: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    found = [(path, command)]
    for name, sub in getattr(command, "commands", {}).items():
        found += _commands(sub, (*path, name))
    return found


COMMANDS = _commands(typer.main.get_command(app))


def _collapse(text: str) -> str:
    return " ".join(text.split())


def _paragraphs(text: str) -> list[str]:
    return [_collapse(p) for p in text.split("\n\n") if p.strip()]


def _help(path: tuple[str, ...], width: int, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    # Typer reads TERMINAL_WIDTH once, at import; None leaves the width to COLUMNS.
    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", None)
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.output
    lines = ANSI.sub("", result.output).splitlines()
    assert max(len(line) for line in lines) == width  # the width is the one asked for
    return lines


def _unbroken(lines: list[str], width: int, where: str) -> None:
    """Each line but the last is as full as word wrapping makes it: the next line's
    first word would not have fitted on it."""
    for line, following in itertools.pairwise(lines):
        word = following.split()[0]
        assert len(line.rstrip()) + 1 + len(word) > width, (
            f"{where}: a line broken early at {width} columns:\n{line.rstrip()}\n{following}"
        )


def _description(lines: list[str]) -> list[list[str]]:
    """The paragraphs of text between the usage line and the first panel."""
    start = next(i for i, line in enumerate(lines) if "Usage:" in line)
    start = next(i for i in range(start, len(lines)) if not lines[i].strip())
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("╭")), len(lines))
    paragraphs: list[list[str]] = [[]]
    for line in lines[start:end]:
        if line.strip():
            paragraphs[-1].append(line[1:])  # the help text's left padding
        elif paragraphs[-1]:
            paragraphs.append([])
    return [p for p in paragraphs if p]


NOT_COMMANDS = ("Options", "Arguments")


def _panels(lines: list[str]) -> list[tuple[str, list[str]]]:
    """The help's panels: each one's title and inner lines."""
    found: list[tuple[str, list[str]]] = []
    for i, line in enumerate(lines):
        if line.startswith("╭─ "):
            end = next(j for j in range(i, len(lines)) if lines[j].startswith("╰"))
            found.append((line[3:].rstrip("─╮").strip(), lines[i + 1 : end]))
    return found


def _command_rows(lines: list[str]) -> dict[str, tuple[list[str], int]]:
    """A group's commands, in whichever panels they are listed: each command's summary
    lines, and the width of its panel's summary column."""
    rows: dict[str, tuple[list[str], int]] = {}
    for title, inner in _panels(lines):
        if title in NOT_COMMANDS:
            continue
        first = re.match(r"│ (\S+)\s+", inner[0])
        assert first
        column = first.end()
        width = len(inner[0]) - 2 - column
        name = ""
        for line in inner:
            head = line[:column]
            if head.strip("│ "):
                name = head.strip("│ ")
                assert name not in rows, f"{name} listed twice"
                rows[name] = ([], width)
            rows[name][0].append(line[column:-2].rstrip())
    return rows


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize(
    ("path", "command"), COMMANDS, ids=[" ".join(("hypermedia", *p)) for p, _ in COMMANDS]
)
def test_a_commands_text_wraps_as_whole_paragraphs(path, command, width, monkeypatch):
    lines = _help(path, width, monkeypatch)
    where = " ".join(("hypermedia", *path, "--help"))
    shown = _description(lines)
    assert [_collapse(" ".join(p)) for p in shown] == _paragraphs(command.help or "")
    for paragraph in shown:
        _unbroken(paragraph, width - 2, where)


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize(
    ("path", "group"),
    [(p, c) for p, c in COMMANDS if hasattr(c, "commands")],  # typer's own click's groups
    ids=[" ".join(("hypermedia", *p)) for p, c in COMMANDS if hasattr(c, "commands")],
)
def test_a_groups_command_summaries_wrap_as_one_paragraph(path, group, width, monkeypatch):
    rows = _command_rows(_help(path, width, monkeypatch))
    assert sorted(rows) == sorted(group.commands)
    for name, (summary, column_width) in rows.items():
        where = " ".join(("hypermedia", *path, name))
        expected = _paragraphs(group.commands[name].help or "")
        assert _collapse(" ".join(summary)) == expected[0], where
        _unbroken(summary, column_width, where)


def test_the_root_help_on_an_80_column_terminal():
    """The real program, as typed: no summary line of `hypermedia --help` ends early."""
    env = {k: v for k, v in os.environ.items() if k != "TERMINAL_WIDTH"}
    env.update(COLUMNS="80", PYTHONPATH=str(REPO))
    result = subprocess.run(
        [sys.executable, "-m", "hypermedia.cli", "--help"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    lines = ANSI.sub("", result.stdout).splitlines()
    rows = _command_rows(lines)
    assert "serve" in rows and "down" in rows
    for name, (summary, column_width) in rows.items():
        _unbroken(summary, column_width, f"hypermedia --help: {name}")
    # The commands in panels by who runs them: a user's jobs, this machine, operators.
    panels = {title: inner for title, inner in _panels(lines) if title not in NOT_COMMANDS}
    listed = {
        title: [line[2:].split()[0] for line in inner if line[2:3].strip()]
        for title, inner in panels.items()
    }
    assert listed == {
        "Jobs": ["submit", "watch", "status", "cancel"],
        "This machine and its cluster": ["run", "up", "down", "head", "serve", "worker"],
        "Operators": ["queues", "scheduler", "bulk", "user", "credits", "db"],
    }


# Written for Sphinx or Markdown, shown as typed by the terminal; or (Rich's markup: the
# help is rendered in Typer's rich mode) a [word] taken as a style and dropped.
MARKUP = {
    "reStructuredText literal (``x``)": re.compile(r"``"),
    "reStructuredText role (:func:`x`)": re.compile(r":[a-z]+:`"),
    "reStructuredText directive (.. x::)": re.compile(r"(^|\n)\s*\.\. \w+::|::\s*($|\n)"),
    "bold (**x**)": re.compile(r"\*\*"),
    "a Markdown link ([x](url))": re.compile(r"\]\("),
    "Rich markup ([x], not shown)": re.compile(r"(?<!\\)\[[a-z#/@][^\[]*?\]"),
}


def _help_texts() -> list[tuple[str, str]]:
    texts = []
    for path, command in COMMANDS:
        name = " ".join(("hypermedia", *path))
        texts.append((name, command.help or ""))
        texts += [(f"{name} {param.name}", param.help or "") for param in command.params]
    return texts


def test_no_help_text_shows_markup_the_terminal_does_not_render():
    texts = _help_texts()
    assert len(texts) > 100  # the walk found the commands and their options
    found = [
        f"{where}: {kind}: {text!r}"
        for where, text in texts
        for kind, pattern in MARKUP.items()
        if pattern.search(text)
    ]
    assert found == []


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("reads ``scheduler.json``", "reStructuredText literal (``x``)"),
        ("see :func:`main`", "reStructuredText role (:func:`x`)"),
        ("For example::\n  x", "reStructuredText directive (.. x::)"),
        ("a **must**", "bold (**x**)"),
        ("[See](https://example.org)", "a Markdown link ([x](url))"),
        ("exits [red]1[/]", "Rich markup ([x], not shown)"),
    ],
)
def test_the_markup_scan_finds_what_it_names(text, kind):
    assert [k for k, pattern in MARKUP.items() if pattern.search(text)] == [kind]


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize(
    ("path", "command"), COMMANDS, ids=[" ".join(("hypermedia", *p)) for p, _ in COMMANDS]
)
def test_no_option_is_cut(path, command, width, monkeypatch):
    """Every option's names and environment variable shown whole: typer's six columns
    left an 80-column terminal's help column ~18 characters, and Rich cut what did not fit
    with "…" (42 cells over 9 commands: HYPERMEDIA_API_H…, --scheduler-conf…,
    /etc/hypermedia/…)."""
    lines = _help(path, width, monkeypatch)
    text = "\n".join(lines)
    assert "…" not in text, text
    words = set(text.replace("[", " ").replace("]", " ").replace(",", " ").split())
    for param in command.params:
        names = [*param.opts, *param.secondary_opts] if param.param_type_name == "option" else []
        for name in names:
            assert name in words, f"{name} not shown whole:\n{text}"
        if param.envvar:
            assert param.envvar in words, f"{param.envvar} not shown whole:\n{text}"


@pytest.mark.parametrize("width", [80, 120])
def test_an_options_names_then_its_type_then_its_help(width, monkeypatch):
    """One column for the names (a negative under its option), one for the type (a range
    under it), the rest for the help."""
    lines = _help(("serve",), width, monkeypatch)
    options = dict(_panels(lines))["Options"]
    access = next(i for i, line in enumerate(options) if "--access-log" in line)
    assert options[access + 1].startswith("│ --no-access-log  ")
    port = next(i for i, line in enumerate(options) if "--port" in line)
    names, kind, text = re.split(r"\s{2,}", options[port].strip("│ "))[:3]
    assert (names, kind) == ("--port", "<int range>")
    assert text.startswith("Port (default: 8080).")
    assert options[port + 1][options[port].index("<int") :].startswith("[1<=x<=65535]  ")
    submit = dict(_panels(_help(("submit",), width, monkeypatch)))["Options"]
    assert submit[0].startswith("│ *  --op, -o  ")


class _Console:
    """Keeps what typer prints."""

    def __init__(self) -> None:
        self.printed: list[Any] = []

    def print(self, *renderables: Any, **options: Any) -> None:
        self.printed += renderables


@pytest.mark.parametrize("path", [("serve",), ("submit",)])
def test_typers_options_panel_is_the_one_recomposed(path):
    """hypermedia.cli.options_table moves the cells of the table typer 0.29's
    typer.rich_utils._print_options_panel builds (its private function): a typer that
    renames it, calls it otherwise or builds another table fails here, by name. serve has
    a negative option; submit a short one and required ones (typer's column of marks)."""
    command = dict(COMMANDS)[path]
    ctx = typer.Context(command)
    for kind in ("argument", "option"):
        params = [p for p in command.get_params(ctx) if p.param_type_name == kind]
        if not params:
            continue
        console = _Console()
        typer.rich_utils._print_options_panel(
            name=kind, params=params, ctx=ctx, markup_mode="rich", console=cast(Any, console)
        )
        [panel] = console.printed
        assert options_table.recompose(panel) is not None, f"{kind}s: {panel.renderable!r}"
