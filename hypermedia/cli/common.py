"""What the command groups share: the settings, the job record, the API client, the
API options, and how a command speaks (a note on stderr, one red error line)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from hypermedia.errors import AuthenticationFailed, ConfigError

if TYPE_CHECKING:
    from rich.text import Text
    from sqlalchemy import Engine

    from hypermedia.config import Settings
    from hypermedia.ingest.client import HypermediaClient

ApiUrl = Annotated[
    str | None,
    typer.Option(
        "--api-url",
        envvar="HYPERMEDIA_API_URL",
        help="Base URL of the API (default: http://<api_host>:<api_port>).",
        show_default=False,
    ),
]
ApiKey = Annotated[
    str | None,
    typer.Option("--api-key", envvar="HYPERMEDIA_API_KEY", help="hm_... key.", show_default=False),
]
Timeout = Annotated[
    float,
    typer.Option("--timeout", envvar="HYPERMEDIA_API_TIMEOUT", min=0.1, help="HTTP timeout, s."),
]


def read_settings(**overrides: Any) -> Settings:
    """The settings, with the options given on the command line (not None) over them."""
    from hypermedia.config import load_settings

    return load_settings(**{k: v for k, v in overrides.items() if v is not None})


def require_database(settings: Settings) -> None:
    """ConfigError if the database is a SQLite file that is not there (opening it would
    create it empty): a data dir nothing has run with."""
    from sqlalchemy import make_url

    url = make_url(settings.effective_database_url)
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        path = Path(url.database or "")
        if not path.exists():
            raise ConfigError(
                settings.database_setting,
                f"no database at {path}: nothing has run with this data dir (the services'"
                " one? a new deployment starts with `hypermedia db upgrade`)",
            )


def open_engine(settings: Settings, *, connect_timeout: int | None = None) -> Engine:
    """An engine on an existing database whose schema is up to date. A SQLite file that
    is not there is not created: a data dir nothing has run with is an error.
    ``connect_timeout``: seconds a PostgreSQL connection may take (None: the settings'
    ``database_dead_peer_seconds``, or one the database URL names: see
    :func:`~hypermedia.db.engine.make_engine`)."""
    from sqlalchemy import make_url

    from hypermedia.db.engine import settings_engine
    from hypermedia.db.migrate import schema_problem

    url = make_url(settings.effective_database_url)
    require_database(settings)
    options: dict[str, Any] = {}
    if connect_timeout is not None and url.get_backend_name() != "sqlite":
        options["connect_args"] = {"connect_timeout": connect_timeout}
    engine = settings_engine(settings, **options)
    try:
        problem = schema_problem(engine)
    except BaseException:
        engine.dispose()
        raise
    if problem is not None:
        engine.dispose()
        raise ConfigError(settings.database_setting, problem)
    return engine


def open_client(api_url: str | None, api_key: str | None, timeout: float) -> HypermediaClient:
    from hypermedia.ingest.client import HypermediaClient

    settings = read_settings(api_url=api_url, api_key=api_key)
    url = settings.api_url or f"http://{settings.api_host}:{settings.api_port}"
    if not settings.api_key:
        raise AuthenticationFailed(
            "no API key: pass --api-key or set HYPERMEDIA_API_KEY (an operator creates one"
            " on the server: `hypermedia user add NAME`)"
        )
    try:
        return HypermediaClient(url, settings.api_key, timeout=timeout)
    except ConfigError as exc:  # named as the user set it
        problem = exc.message.removeprefix(f"{exc.key}: ")
        raise ConfigError(_CLIENT_SETTINGS.get(exc.key, exc.key), problem) from None


_CLIENT_SETTINGS = {
    "base_url": "api_url (--api-url, HYPERMEDIA_API_URL)",
    "api_key": "api_key (--api-key, HYPERMEDIA_API_KEY)",
}


# A control character (C0 but the line feed, DEL, C1) as a command shows it: its escape,
# never the character (an ESC starts a sequence the terminal obeys: a colour, a window
# title, a cleared screen; a CR rewrites the line). So are Unicode's bidirectional
# controls (ALM, LRM, RLM, the embeddings, overrides and isolates): a right-to-left
# override shows a file named "invoice\u202efdp.exe" as "invoiceexe.pdf".
_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(found: re.Match[str]) -> str:
    code = ord(found.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` as a command prints it: each control character but the line feed, and
    each bidirectional control, as its escape (``\\x1b``, ``\\u202e``). The record's
    strings (an error message, a child's log, a reason, a host name, a file's name) hold
    what others wrote, and none of it is for the terminal to obey."""
    return _CONTROL.sub(_escape, text)


def plain(value: str | None, style: str = "") -> Text:
    """A value of the record or the config (a reason, a summary, a host name ...) as a
    Rich screen or table shows it: its characters as they are, never read as Rich markup
    (a ``[/x]`` in it ended the command with a MarkupError, a ``[link=...]`` drew a
    link) nor sent to the terminal as a control sequence (:func:`printable`)."""
    from rich.text import Text

    return Text(printable("" if value is None else value), style=style)


def say(message: str, err: bool = False) -> None:
    """A line of a command's output (stderr with ``err``), through :func:`printable`:
    every line the commands print goes through here or through Rich as
    :func:`hypermedia.cli.status.plain` text."""
    typer.echo(printable(message), err=err)


def note(message: str) -> None:
    """Human commentary, on stderr, so stdout stays what scripts parse."""
    say(message, err=True)


def fail(message: str, code: int = 1) -> NoReturn:
    from rich.console import Console
    from rich.markup import escape

    Console(stderr=True, highlight=False, soft_wrap=True).print(
        f"[red]error: {escape(printable(message))}[/]"
    )
    raise SystemExit(code)


def millicredits(amount: float) -> int:
    return round(amount * 1000)
