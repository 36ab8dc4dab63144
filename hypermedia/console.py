"""The ``hypermedia`` console script.

The command line (:mod:`hypermedia.cli`) needs the ``server`` extra: its settings,
Typer and Rich. A client-only install (``pip install hypermedia``, the web tier) has
the Python client and not those, so the script says in one line what to install
instead of showing the import's traceback.
"""

from __future__ import annotations

import sys

INSTALL_HINT = "pip install 'hypermedia[server]'"


def missing_dependency(exc: ModuleNotFoundError) -> str | None:
    """The line to print when ``exc`` is a third-party package the install lacks; None
    when the missing module is one of ours (a broken install or a bug: let it raise)."""
    name = exc.name or ""
    if not name or name.split(".")[0] in ("hypermedia", "pipelines", "autoscaler"):
        return None
    return (
        f"error: the hypermedia command line needs the server extra ({name} is not"
        f" installed): {INSTALL_HINT}"
    )


def main() -> None:
    try:
        from hypermedia.cli import main as cli_main
    except ModuleNotFoundError as exc:
        line = missing_dependency(exc)
        if line is None:
            raise
        print(line, file=sys.stderr)
        raise SystemExit(1) from None
    cli_main()
