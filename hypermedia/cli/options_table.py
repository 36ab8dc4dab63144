"""The options' table of ``hypermedia <command> --help``, readable on an 80-column terminal.

Typer's rich help (typer.rich_utils._print_options_panel, typer 0.29) lays each option out
in six columns: long name, short name, negative long name, negative short name, type and
help (a seventh first, the required mark, when something is required). On an 80-column
terminal Rich shared the width evenly among the wide ones: the help column got ~18
characters and an environment variable's name, a long option's name, a default path were
cut with "…" (42 cells over 9 commands).

Here the names are one column that never wraps (a short name beside its long one, a
negative on a line of its own), the type wraps at its spaces (a range under its type) and
the help has the rest. Typer still builds the table; :func:`recompose` only moves its
cells into a new one (Rich's public Panel, Table and Text). A panel of another shape (a
typer that builds it otherwise) is printed as typer built it, and
tests/unit/test_cli_help.py fails.

The commands and groups get :class:`Command` and :class:`Group`, typer's own with this
one change (:func:`use`); Rich is imported only when help is printed.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import typer
import typer.core

if TYPE_CHECKING:
    from rich.console import Console
    from rich.panel import Panel

# The columns typer's options table has, in order (after the required mark, if any).
COLUMNS = ("long", "short", "negative long", "negative short", "type", "help")
RANGE = re.compile(r" (?=\[)")  # where a type cell's range starts: "<int range> [x>=1]"


class Command(typer.core.TyperCommand):
    def format_help(self, ctx: Any, formatter: Any) -> None:  # typer's own click's Context
        with _recomposed_options():
            super().format_help(ctx, formatter)


class Group(typer.core.TyperGroup):
    def format_help(self, ctx: Any, formatter: Any) -> None:  # typer's own click's Context
        with _recomposed_options():
            super().format_help(ctx, formatter)


def use(typer_app: typer.Typer) -> None:
    """Every command and group of the app (its sub-apps too) built as :class:`Command`
    and :class:`Group`."""
    typer_app.info.cls = Group
    for command in typer_app.registered_commands:
        command.cls = Command
    for group in typer_app.registered_groups:
        assert group.typer_instance is not None
        use(group.typer_instance)


def recompose(panel: object) -> Panel | None:
    """Typer's options panel with the table described above; None if it is not the
    table typer 0.29 builds."""
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    table = getattr(panel, "renderable", None)
    if not (isinstance(panel, Panel) and isinstance(table, Table)):
        return None
    columns = [list(column.cells) for column in table.columns]
    marks = columns.pop(0) if len(columns) == len(COLUMNS) + 1 else None
    if len(columns) != len(COLUMNS):
        return None
    texts = [[cell for cell in column if isinstance(cell, Text)] for column in columns[:5]]
    if [len(column) for column in texts] != [len(column) for column in columns[:5]]:
        return None
    long, short, negative, negative_short, types = texts
    helps = columns[5]
    recomposed = Table(
        highlight=table.highlight,
        show_header=False,
        expand=True,
        box=table.box,
        show_lines=table.show_lines,
        leading=table.leading,
        border_style=table.border_style,
        row_styles=table.row_styles,
        pad_edge=table.pad_edge,
        padding=table.padding,
    )
    if marks is not None:
        recomposed.add_column()
    recomposed.add_column(no_wrap=True)
    # As wide as the widest type or range: "<int range> [1<=x<=65535]" takes two lines.
    parts = (part for cell in types for part in RANGE.split(cell.plain))
    widest = max(map(len, parts), default=0)
    recomposed.add_column(max_width=widest or None, overflow="fold")
    recomposed.add_column()
    for row, cells in enumerate(zip(long, short, negative, negative_short, strict=True)):
        positive = Text(", ").join(cell for cell in cells[:2] if cell.plain)
        negatives = Text(", ").join(cell for cell in cells[2:] if cell.plain)
        shown = Text("\n").join(line for line in (positive, negatives) if line.plain)
        mark = [] if marks is None else [marks[row]]
        recomposed.add_row(*mark, shown, types[row], helps[row])
    panel.renderable = recomposed
    return panel


@contextlib.contextmanager
def _recomposed_options() -> Iterator[None]:
    """Typer's options panels printed recomposed while the help is formatted."""
    try:
        from typer import rich_utils
    except ImportError:  # no Rich: click's plain help
        yield
        return
    original = getattr(rich_utils, "_print_options_panel", None)
    if original is None:  # a typer without it: its own panels
        yield
        return

    def print_panel(*, console: Console, **arguments: Any) -> None:
        printed = _Printed(console)
        original(console=printed, **arguments)
        for renderables, options in printed.calls:
            console.print(*(recompose(r) or r for r in renderables), **options)

    rich_utils._print_options_panel = print_panel
    try:
        yield
    finally:
        rich_utils._print_options_panel = original


class _Printed:
    """A console that keeps what is printed, for :func:`recompose` to change first."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def print(self, *renderables: Any, **options: Any) -> None:
        self.calls.append((renderables, options))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.console, name)
