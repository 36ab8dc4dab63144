"""The root command group, whose commands are imported when one is asked for.

Every process the platform starts through the CLI (an operator's command, ``up``'s
head, the tests' hundreds) used to import every command module first: their options,
their helpers and what those import. :class:`LazyGroup` imports only the module of
the command run; ``hypermedia --help`` (every command's short help), the environment
check's walk over the options and shell completion still see them all.

A command is built the way an eager app builds it, on a throwaway Typer with the
root's settings: what ``--help`` and the command show is the same either way.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, MutableMapping
from typing import TYPE_CHECKING, Any

import typer
import typer.core
import typer.main

if TYPE_CHECKING:
    from typer._click import Command


class LazyCommands(MutableMapping[str, "Command"]):
    """A group's commands by name, in ``--help`` order: those of ``lazy`` are built by
    its function at their first use."""

    def __init__(
        self, built: MutableMapping[str, Command], lazy: dict[str, Callable[[], Command]]
    ) -> None:
        self._built = dict(built)
        self._lazy = lazy

    def __getitem__(self, name: str) -> Command:
        if name not in self._built:
            if name not in self._lazy:
                raise KeyError(name)
            self._built[name] = self._lazy[name]()
        return self._built[name]

    def __setitem__(self, name: str, command: Command) -> None:
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        self._built.pop(name, None)
        self._lazy.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        yield from self._lazy
        yield from (name for name in self._built if name not in self._lazy)

    def __len__(self) -> int:
        return sum(1 for _ in self)


# name: (module under hypermedia.cli, its Typer app or command function), in the order
# `hypermedia --help` lists them (commands, then groups, as typer orders an eager app).
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("services", "serve"),
    "submit": ("jobs", "submit"),
    "status": ("status", "status"),
    "watch": ("jobs", "watch"),
    "cancel": ("jobs", "cancel"),
    "queues": ("jobs", "queues"),
    "run": ("run", "run"),
    "head": ("local", "head"),
    "up": ("local", "up"),
    "down": ("local", "down"),
    "worker": ("services", "worker"),
    "db": ("database", "app"),
    "user": ("users", "app"),
    "credits": ("credits", "app"),
    "scheduler": ("scheduler", "app"),
    "bulk": ("bulk", "app"),
}

# The root app's settings, which its commands are built with.
SETTINGS: dict[str, Any] = {"add_completion": False, "pretty_exceptions_enable": False}


def build(name: str) -> Command:
    """The click command ``hypermedia <name>``, as the eager app had it."""
    module_name, attribute = COMMANDS[name]
    target = getattr(importlib.import_module(f"hypermedia.cli.{module_name}"), attribute)
    app = typer.Typer(**SETTINGS)
    if isinstance(target, typer.Typer):
        app.add_typer(target, name=name)
    else:
        app.command(name=name)(target)
    return typer.main.get_group(app).commands[name]


class LazyGroup(typer.core.TyperGroup):
    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        lazy = {name: _builder(name) for name in COMMANDS}
        self.commands = LazyCommands(self.commands, lazy)


def _builder(name: str) -> Callable[[], Command]:
    return lambda: build(name)
