"""How every process we start logs: one line per record, JSON or text, with the extras.

Call sites log with ``getLogger(__name__)``, lazy ``%`` arguments and structured
extras (``extra={"job_id": ..., "queue": ..., "worker_id": ..., "action": ...}``);
:func:`configure` makes the root logger write them to stderr:

- ``json``: one object per line, ``timestamp`` (UTC, ISO 8601), ``level``,
  ``logger``, ``message``, ``exception`` (the traceback, when there is one), then
  every extra field. A value JSON cannot hold is written as its ``str()``.
- ``text``: ``<time> <LEVEL> <logger>: <message> key=value ...``, the traceback on
  the lines below.

The format is ``HYPERMEDIA_LOG_FORMAT`` (``--log-format``): ``json``, ``text``, or
unset for text on a terminal and JSON otherwise (a file, a pipe, journald, Ray's
``worker-*.err``: what a machine reads). The level is ``HYPERMEDIA_LOG_LEVEL``.
A bad value is a :class:`~hypermedia.errors.ConfigError` naming the key.

Who calls it: the CLI (every ``hypermedia`` command), ``autoscaler.head``, the
watchdog, the node provider inside Ray's autoscaler process (:func:`configure_package`:
that process's logging is Ray's, so only our package's records are taken over), and
the Ray actors in their ``__init__`` (:func:`configure_actor`), from
the node's environment (``ray start`` passes both variables on; see
:data:`hypermedia.worker.cluster.INHERITED`). Not Ray's ``LoggingConfig``: its
filter overwrites ``job_id`` and ``worker_id`` on every record with Ray's own ids,
and its JSON formatter raises on an extra that is not JSON.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import IO, Any

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter as _JsonFormatter

from hypermedia.errors import ConfigError

FORMATS = ("json", "text")
LEVELS = ("debug", "info", "warning", "error")
FORMAT_VARIABLE = "HYPERMEDIA_LOG_FORMAT"
LEVEL_VARIABLE = "HYPERMEDIA_LOG_LEVEL"
# Both log routine steps at INFO (every request; plugin set-up): noise above DEBUG.
NOISY = ("httpx", "alembic")
# Their DEBUG lines hold credentials: the AWS SDK's every request's Authorization header,
# each presigned URL's signature beside its canonical request (the rest of the URL), a
# session token. They log at INFO at most, whatever the level.
NEVER_DEBUG = ("botocore", "boto3", "s3transfer")

# Query parameters that are credentials: a signed blob URL's ``sig`` (with its expiry
# it lets anyone read or write that object), an S3 presigned URL's parts.
SECRET_PARAMETERS = frozenset(
    {"sig", "x-amz-signature", "x-amz-credential", "x-amz-security-token", "signature"}
)
REDACTED = "[redacted]"
# A value ends where a URL's query part or the line around it does: at the next
# parameter, a blank, a quote (JSON's escaped one too), a bracket or a fragment.
_SECRET_VALUE = re.compile(
    r"([?&;](?:" + "|".join(sorted(SECRET_PARAMETERS)) + r")=)[^&;\s\"'<>#\\]+",
    re.IGNORECASE,
)


def redact_urls(text: str) -> str:
    """``text`` with the value of every :data:`SECRET_PARAMETERS` query parameter of
    the URLs in it replaced by ``[redacted]`` (the rest of each URL stays)."""
    return _SECRET_VALUE.sub(lambda found: found[1] + REDACTED, text)


# What a LogRecord carries of its own; everything else on it came from ``extra=``.
# uvicorn's ``color_message`` is its message again with terminal colour codes.
_RECORD_ATTRS = frozenset(RESERVED_ATTRS) | {"taskName", "color_message"}


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a call site passed with ``extra=``, in the order it gave them. Private
    ones (a leading ``_``: Ray's record factory adds ``_ray_timestamp_ns`` to every
    record once ``ray`` is initialised) are not the call site's."""
    return {k: v for k, v in record.__dict__.items() if k not in _RECORD_ATTRS and k[:1] != "_"}


class JsonFormatter(_JsonFormatter):
    """One JSON object per record: timestamp, level, logger, message, exception, extras."""

    def __init__(self) -> None:
        super().__init__(
            "%(levelname)s %(name)s %(message)s",
            rename_fields={"levelname": "level", "name": "logger", "exc_info": "exception"},
            reserved_attrs=sorted(_RECORD_ATTRS),
        )

    def format(self, record: logging.LogRecord) -> str:
        return redact_urls(super().format(record))

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        log_data["timestamp"] = datetime.fromtimestamp(record.created, tz=UTC)
        super().add_fields(log_data, record, message_dict)
        for private in [k for k in log_data if k[:1] == "_"]:
            del log_data[private]  # see extra_fields


class TextFormatter(logging.Formatter):
    """``<time> <LEVEL> <logger>: <message> key=value ...`` for people at a terminal."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        return redact_urls(super().format(record))

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        pairs = " ".join(f"{k}={_text_value(v)}" for k, v in extra_fields(record).items())
        return f"{line} {pairs}" if pairs else line


def _text_value(value: Any) -> str:
    text = str(value)
    if text and not any(c.isspace() or c in "\"'=" for c in text):
        return text
    return json.dumps(text, ensure_ascii=False)


def resolve_format(value: str | None, stream: IO[str]) -> str:
    """``json`` or ``text``: the value given, or by whether ``stream`` is a terminal."""
    if not value:
        isatty = getattr(stream, "isatty", None)
        return "text" if isatty is not None and isatty() else "json"
    if value.lower() not in FORMATS:
        raise ConfigError(
            f"log_format ({FORMAT_VARIABLE})", f"expected one of {', '.join(FORMATS)}"
        )
    return value.lower()


def _level(value: str) -> int:
    if value.lower() not in LEVELS:
        raise ConfigError(f"log_level ({LEVEL_VARIABLE})", f"expected one of {', '.join(LEVELS)}")
    level: int = getattr(logging, value.upper())
    return level


def configure(level: str, log_format: str | None = None, stream: IO[str] | None = None) -> str:
    """Make the root logger write to ``stream`` (stderr) at ``level`` in ``log_format``
    (see :func:`resolve_format`), replacing its handlers; the format used."""
    stream = sys.stderr if stream is None else stream
    number = _level(level)
    chosen = resolve_format(log_format, stream)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if chosen == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(number)
    for noisy in NOISY:
        logging.getLogger(noisy).setLevel(logging.WARNING if number > logging.DEBUG else number)
    for secretive in NEVER_DEBUG:
        logging.getLogger(secretive).setLevel(max(number, logging.INFO))
    return chosen


def configure_from_environment(
    default_level: str = "info", environ: Mapping[str, str] | None = None
) -> str:
    """:func:`configure` from ``HYPERMEDIA_LOG_LEVEL`` and ``HYPERMEDIA_LOG_FORMAT``
    (for the processes that have no command line of ours: the head's services, the
    watchdog, the actors)."""
    environ = os.environ if environ is None else environ
    return configure(
        environ.get(LEVEL_VARIABLE) or default_level, environ.get(FORMAT_VARIABLE) or None
    )


def configure_actor() -> None:
    """In a Ray actor's ``__init__``: its records, with their extras, go to the
    actor's stderr (``worker-*.err`` in the session's logs dir), JSON unless the
    node says ``HYPERMEDIA_LOG_FORMAT=text``. A bad value there is not worth killing
    the actor for: it logs JSON and says so."""
    try:
        configure_from_environment()
    except ConfigError as exc:
        configure("info", "json")
        logging.getLogger(__name__).warning("%s: logging JSON at info", exc)


RAY_MONITOR = "monitor.py"  # the script of Ray's autoscaler process (v1 and v2)


def configure_package(name: str, argv: list[str] | None = None) -> bool:
    """In Ray's autoscaler process (``argv[0]`` is its ``monitor.py``), whose logging
    is Ray's (its format drops extras): the records of the package ``name`` go to
    stderr (``monitor.err``) through our formatter, with their extras, and not on to
    Ray's handlers. Anywhere else (our own processes, tests) nothing changes. Whether
    it took them over."""
    argv = sys.argv if argv is None else argv
    if not argv or os.path.basename(argv[0]) != RAY_MONITOR:
        return False
    logger = logging.getLogger(name)
    if any(getattr(h, "hypermedia", False) for h in logger.handlers):
        return True
    try:
        chosen = resolve_format(os.environ.get(FORMAT_VARIABLE) or "json", sys.stderr)
        level = _level(os.environ.get(LEVEL_VARIABLE) or "info")
    except ConfigError:
        chosen, level = "json", logging.INFO
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if chosen == "json" else TextFormatter())
    handler.hypermedia = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    return True


class Outage:
    """A loop's failures of one kind (a database or Redis that is down fails every pass
    alike), told once when they start or their kind changes, again every
    ``repeat_seconds`` while they last, and once when a pass succeeds again: a loop
    that runs every second logged a line (or a traceback) a pass.

    ``failed(exc)`` after a failed pass, ``succeeded()`` after a good one; ``what``
    begins each line ("callbacks wait", "reap failed")."""

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        *,
        repeat_seconds: float = 300.0,
        extra: Mapping[str, Any] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.what = what
        self.repeat_seconds = repeat_seconds
        self.extra = dict(extra or {})
        self._monotonic = monotonic
        self._kind: type[BaseException] | None = None
        self._failed = 0
        self._said_at = 0.0

    @property
    def failing(self) -> bool:
        return self._kind is not None

    def failed(self, exc: BaseException) -> None:
        self._failed += 1
        now = self._monotonic()
        if type(exc) is not self._kind or now - self._said_at >= self.repeat_seconds:
            self.logger.warning(
                "%s: %s (%d passes failed so far; told again every %.0f s while it lasts)",
                self.what,
                exc,
                self._failed,
                self.repeat_seconds,
                extra=self.extra,
            )
            self._kind, self._said_at = type(exc), now

    def succeeded(self) -> None:
        if self._kind is not None:
            self.logger.info(
                "%s: over after %d failed passes", self.what, self._failed, extra=self.extra
            )
        self._kind, self._failed = None, 0
