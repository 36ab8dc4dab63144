"""The command line: ``hypermedia <command>``.

Operator commands work on the database named by the settings (``db upgrade``,
``user add``, ``credits grant``, ``serve``); client commands (``submit``,
``status``, ``watch``, ``cancel``, ``queues``, ``credits show``) talk HTTP to
``--api-url`` / ``HYPERMEDIA_API_URL`` with ``--api-key`` / ``HYPERMEDIA_API_KEY``.
Every option has a ``HYPERMEDIA_*`` environment twin (shown in ``--help``).

An error prints one red line, ``error: <code>: <message>``, and exits 1; a bad
setting names its key. ``--log-level debug`` shows tracebacks in the log.
This is the only module that configures logging handlers. Importing it is
cheap: everything heavy is imported inside the command that needs it.

One module per command group, this one builds the app from them:

- :mod:`~hypermedia.cli.jobs`: ``submit``, ``status JOB_ID``, ``watch``, ``cancel``,
  ``queues`` (HTTP)
- :mod:`~hypermedia.cli.status`: ``status``, the platform on one screen (the record)
- :mod:`~hypermedia.cli.database`: ``db upgrade``
- :mod:`~hypermedia.cli.users`: ``user add``, ``key``, ``grant``, ``revoke``
- :mod:`~hypermedia.cli.credits`: ``credits grant`` (the record), ``credits show`` (HTTP)
- :mod:`~hypermedia.cli.services`: ``serve`` (the API), ``worker`` (a node)
- :mod:`~hypermedia.cli.run`: ``run``, files end to end on this machine
- :mod:`~hypermedia.cli.local`: ``head``, ``up``, ``down``, the local stack
- :mod:`~hypermedia.cli.scheduler`: ``scheduler run``, ``log``, ``explain``,
  ``simulate``, ``reset-cost-lock``
- :mod:`~hypermedia.cli.bulk`: ``bulk regenerate``, ``backfill``, ``migrate``, ``status``,
  ``pause``, ``resume``, ``cancel`` (the record, on the server)
- :mod:`~hypermedia.cli.common`: settings, the record, the API client and options,
  notes and the error line
- :mod:`~hypermedia.cli.options_table`: the options' table of ``--help``, laid out for an
  80-column terminal
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import sys
from typing import Annotated, Any

import typer

from hypermedia.cli import (
    bulk,
    credits,
    database,
    jobs,
    local,
    options_table,
    run,
    scheduler,
    services,
    status,
    users,
)
from hypermedia.cli.common import fail
from hypermedia.errors import ConfigError, HypermediaError

log = logging.getLogger(__name__)

app = typer.Typer(
    name="hypermedia",
    help="Processing platform for user files.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Registered in the order `hypermedia --help` lists them, in three panels.
JOBS, MACHINE, OPERATE = "Jobs", "This machine and its cluster", "Operators"
app.command(rich_help_panel=JOBS)(jobs.submit)
app.command(rich_help_panel=JOBS)(jobs.watch)
app.command(rich_help_panel=JOBS)(status.status)
app.command(rich_help_panel=JOBS)(jobs.cancel)
app.command(rich_help_panel=MACHINE)(run.run)
app.command(rich_help_panel=MACHINE)(local.up)
app.command(rich_help_panel=MACHINE)(local.down)
app.command(rich_help_panel=MACHINE)(local.head)
app.command(rich_help_panel=MACHINE)(services.serve)
app.command(rich_help_panel=MACHINE)(services.worker)
app.command(rich_help_panel=OPERATE)(jobs.queues)
app.add_typer(scheduler.app, name="scheduler", rich_help_panel=OPERATE)
app.add_typer(bulk.app, name="bulk", rich_help_panel=OPERATE)
app.add_typer(users.app, name="user", rich_help_panel=OPERATE)
app.add_typer(credits.app, name="credits", rich_help_panel=OPERATE)
app.add_typer(database.app, name="db", rich_help_panel=OPERATE)


def _reflow(text: str) -> str:
    """A docstring as help: each paragraph one line, for the terminal to wrap. Typer's
    rich mode keeps a docstring's single line breaks in the commands' summaries and in
    the paragraphs after the first (at 80 columns a summary broke mid-sentence).
    Paragraphs (a blank line) stay; so does a paragraph click marks verbatim (``\\b``),
    and what follows ``\\f`` (not shown)."""
    shown, cut, rest = inspect.cleandoc(text).partition("\f")
    paragraphs = [p if p.startswith("\b") else " ".join(p.split()) for p in shown.split("\n\n")]
    return "\n\n".join(p for p in paragraphs if p) + cut + rest


def _reflow_help(typer_app: typer.Typer) -> None:
    """Every command's help (its docstring unless given) and every group's, reflowed."""
    for command in typer_app.registered_commands:
        text = command.help if command.help is not None else inspect.getdoc(command.callback)
        if text:
            command.help = _reflow(text)
    for group in typer_app.registered_groups:
        assert group.typer_instance is not None
        info = group.typer_instance.info
        if isinstance(info.help, str):
            info.help = _reflow(info.help)
        _reflow_help(group.typer_instance)


_reflow_help(app)
options_table.use(app)


@app.callback()
def _root(
    ctx: typer.Context,
    log_level: Annotated[
        str | None,
        typer.Option(
            "--log-level",
            envvar="HYPERMEDIA_LOG_LEVEL",
            help="debug, info, warning or error (default: info for serve, else warning).",
            show_default=False,
        ),
    ] = None,
    log_format: Annotated[
        str | None,
        typer.Option(
            "--log-format",
            envvar="HYPERMEDIA_LOG_FORMAT",
            help="json or text (default: text on a terminal, else json).",
            show_default=False,
        ),
    ] = None,
) -> None:
    from hypermedia import logs

    default = "info" if ctx.invoked_subcommand == "serve" else "warning"
    logs.configure(log_level or default, log_format)
    # What this command starts (the head's services, the watchdog, Ray's nodes and so
    # the actors) logs the same way when told to; else each decides by its own stderr
    # (a file there, not this terminal).
    if log_format:
        os.environ[logs.FORMAT_VARIABLE] = log_format
    if log_level:
        os.environ[logs.LEVEL_VARIABLE] = log_level


# -- entry point ------------------------------------------------------------------------------


# Read by the repository's scripts, not by this package (docker/build, docker/smoke,
# .ci/run): one exported for them in a shell that also runs `hypermedia` (the head, where
# the worker image is built) is no misspelling. So are the tests' and the benchmarks'.
SCRIPT_VARIABLES = (
    "HYPERMEDIA_BASE_MAX_AGE_DAYS",
    "HYPERMEDIA_BUILD_CA",
    "HYPERMEDIA_CI_IMAGE",
    "HYPERMEDIA_DEBIAN_MIRROR",
    "HYPERMEDIA_IMAGE_CACHE",
    "HYPERMEDIA_OFFICIAL_BASE",
    "HYPERMEDIA_SMOKE_RUNNER",
)
SCRIPT_PREFIXES = ("HYPERMEDIA_TEST_", "HYPERMEDIA_BENCH_")


def _known_variables() -> set[str]:
    """Every HYPERMEDIA_* variable something reads: settings fields and CLI options."""
    return _settings_variables() | _option_variables()


def _settings_variables() -> set[str]:
    """The HYPERMEDIA_* variables read outside the CLI's options: settings fields, and
    those named below."""
    from hypermedia.config import Settings
    from hypermedia.secret_files import SANDBOX_HIDDEN_VARIABLE

    known = {f"HYPERMEDIA_{name.upper()}" for name in Settings.model_fields}
    # Read outside the settings: by the sandbox's fork servers (which import no pydantic),
    # and by Grafana's provisioning (etc/grafana/: the README's grafana-server line).
    known.update(
        ("HYPERMEDIA_CONFIG", SANDBOX_HIDDEN_VARIABLE, PID_INIT_VARIABLE, "HYPERMEDIA_GRAFANA")
    )
    known.update(SCRIPT_VARIABLES)
    return known


@functools.cache
def _option_variables() -> frozenset[str]:
    """The environment twins of the CLI's options. Read from the click commands typer
    builds from the app (a tenth of a CPU-s: only for a variable no setting names, and
    once a process)."""
    known: set[str] = set()
    stack: list[Any] = [typer.main.get_command(app)]  # click commands (typer's own click)
    while stack:
        command = stack.pop()
        for param in command.params:
            envvar = getattr(param, "envvar", None)
            if isinstance(envvar, str):
                known.add(envvar)
            elif envvar:
                known.update(envvar)
        stack.extend(getattr(command, "commands", {}).values())
    return frozenset(known)


def check_environment(environ: dict[str, str] | None = None) -> None:
    """Refuse a misspelt ``HYPERMEDIA_*`` variable instead of silently ignoring it."""
    import os

    from hypermedia.config_errors import close_key

    environ = dict(os.environ) if environ is None else environ
    known = _settings_variables()
    options: frozenset[str] | None = None  # the options' twins: built for a name no setting reads
    queues: list[str] | None = None
    for name in sorted(environ):
        if not name.startswith("HYPERMEDIA_") or name.startswith(SCRIPT_PREFIXES):
            continue
        if name.startswith(QUEUE_VARIABLE):
            if queues is None:  # read once: the profiles file and the config file
                from hypermedia.config import declared_queue_names

                queues = sorted(declared_queue_names(environ))
            _check_queue_variable(name, queues)
            continue
        if name == PID_INIT_VARIABLE:
            _check_pid_init(environ[name])
        if name not in known and options is None:
            options = _option_variables()
            known |= options
        if name in known:
            continue
        close = close_key(name, known)
        hint = f"; did you mean {close}?" if close else ""
        raise ConfigError(name, f"unknown setting{hint}")


QUEUE_VARIABLE = "HYPERMEDIA_QUEUES__"
# hypermedia.sandbox.executor.PID_INIT_ENV, named here so that checking the environment
# imports no sandbox.
PID_INIT_VARIABLE = "HYPERMEDIA_SANDBOX_PID_INIT"


def _check_pid_init(value: str) -> None:
    """Its value now, naming the variable: else each actor's fork server would refuse it
    once the stack had started."""
    from hypermedia.sandbox.executor import PID_INITS

    if value not in PID_INITS:
        raise ConfigError(PID_INIT_VARIABLE, f"{value!r}: expected 'tiny' or 'copy'")


def _check_queue_variable(name: str, queues: list[str]) -> None:
    """``HYPERMEDIA_QUEUES__<NAME>[__<FIELD>]``: a queue something names (a misspelt one
    silently added a queue) and a field queues have."""
    from hypermedia.config import QueueSettings
    from hypermedia.config_errors import close_key

    queue, _, field = name.removeprefix(QUEUE_VARIABLE).partition("__")
    if queue.lower() not in queues:
        close = close_key(queue.lower(), queues)
        rest = f"__{field}" if field else ""
        hint = f"; did you mean {QUEUE_VARIABLE}{close.upper()}{rest}?" if close else ""
        raise ConfigError(
            name,
            f"no queue {queue.lower()!r} (the queues: {', '.join(queues)}; a new one is "
            f"defined in HYPERMEDIA_QUEUES or the config file's [queues.<name>]){hint}",
        )
    fields = sorted(QueueSettings.model_fields)
    if field and field.lower() not in fields:
        close = close_key(field.lower(), fields)
        hint = f"; did you mean {QUEUE_VARIABLE}{queue}__{close.upper()}?" if close else ""
        raise ConfigError(
            name, f"unknown setting of queue {queue.lower()!r} ({', '.join(fields)}){hint}"
        )


# Modules that libraries the commands use import whenever they are installed, for what
# no command does: httpcore imports trio (to run under trio; only the tests' selenium
# installs it, a deployment has none), httpx its own command line (httpx._main: click,
# Pygments, Rich's syntax and progress), ~0.15 CPU-s of each command that talks HTTP;
# redis the OpenTelemetry SDK (for metrics of its own, which nothing here turns on; Ray
# imports it only in its agents, other processes), ~0.04 CPU-s of each that reads Redis.
# Marked absent for the command's process (their importers take absence as optional).
UNUSED_MODULES = ("trio", "httpx._main", "opentelemetry.sdk")


def main() -> None:
    from hypermedia.exits import freeze_at_exit

    freeze_at_exit()  # the interpreter's last collection, skipped (hypermedia.exits)
    for name in UNUSED_MODULES:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]
    try:
        check_environment()
        app()
    except HypermediaError as exc:
        log.debug("command failed", exc_info=True)
        # A HypermediaError raised as such has no code of its own: "error: <message>".
        fail(exc.message if exc.code == HypermediaError.code else f"{exc.code}: {exc.message}")
    except TimeoutError as exc:
        fail(f"timeout: {exc}")
    except KeyboardInterrupt:
        fail("interrupted", code=130)
    except Exception as exc:
        log.debug("unexpected error", exc_info=True)
        fail(f"internal: {type(exc).__name__}: {exc}")
