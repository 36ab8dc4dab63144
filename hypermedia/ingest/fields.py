"""What a request's strings and values may hold, checked where they enter (pure).

The record refuses what JSON and Python accept: PostgreSQL stores no NUL character in
text nor in ``jsonb``, no lone UTF-16 surrogate (``"\\ud800"``) anywhere, and no NaN or
Infinity in ``jsonb``; SQLite would keep NaN as a number no JSON parser reads back. A
request holding one is refused here with 422 naming its field, never handed to the
database (a 500) nor stored.

* :data:`ID_PATTERN`: the ids the platform makes (:mod:`hypermedia.ids`): jobs,
  submissions, bulk runs;
* :data:`Text`: any other string a request names (object and pool ids, file names,
  idempotency keys ...): no NUL, no lone surrogate;
* :data:`IdempotencyKey`: a submit's or an upload's idempotency key, which travels in
  an ``Idempotency-Key`` header (a header's bytes are read as Latin-1, so a UTF-8 key
  would come back as another string): 1-200 printable ASCII characters (U+0020 to
  U+007E), not beginning nor ending with a space (HTTP strips those from a header);
* :data:`FileName`: a file name, which the web tier shows and puts in its downloads'
  ``Content-Disposition``: :data:`Text` without control characters (C0, DEL, C1: a
  CR/LF ends a header or a log line, an ESC drives a terminal). A name never becomes a
  key nor a path, so ``..``, ``/`` and ``CON`` are only names, and bidi marks stay
  (Arabic and Hebrew names need them; U+202E in ``image\u202egpj.exe`` is the
  corpus's ``sanitize:filename``: kept, and in no path nor key);
* :func:`undecodable_query`: a query parameter whose percent-encoded bytes are not
  UTF-8 (``filename=%FF.png``), which Starlette would decode to U+FFFD and the record
  keep as a name nobody gave;
* :func:`json_problem`: where a JSON value (a submit's ``params``) holds what the record
  cannot store.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Annotated, Any
from urllib.parse import unquote_to_bytes

from pydantic import AfterValidator, BeforeValidator

ID_PATTERN = r"^[0-9a-f]{32}$"
# A Redis stream entry id, ``<ms>-<seq>``: each part at most 2**64 - 1 (Redis refuses more).
ENTRY_ID_PATTERN = r"^[0-9]{1,20}-[0-9]{1,20}$"
MAX_ENTRY_PART = 2**64 - 1


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored as text (None: it can)."""
    if "\x00" in value:
        return "must not contain NUL characters"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "must not contain lone UTF-16 surrogates"
    return None


def _refusing(problem: Callable[[str], str | None]) -> AfterValidator:
    """A validator that refuses a value ``problem`` finds one in, saying what it is."""

    def check(value: str) -> str:
        found = problem(value)
        if found is not None:
            raise ValueError(found)
        return value

    return AfterValidator(check)


Text = Annotated[str, _refusing(text_problem)]


MAX_IDEMPOTENCY_KEY = 200
IDEMPOTENCY_KEY_RULE = (
    f"1-{MAX_IDEMPOTENCY_KEY} printable ASCII characters (U+0020 to U+007E), "
    "not beginning nor ending with a space: it travels in an Idempotency-Key header"
)


def idempotency_key_problem(value: str) -> str | None:
    """Why ``value`` is no idempotency key (None: it is one)."""
    if not 1 <= len(value) <= MAX_IDEMPOTENCY_KEY:
        return f"must be {IDEMPOTENCY_KEY_RULE}; it has {len(value)} characters"
    for index, char in enumerate(value):
        if not " " <= char <= "~":
            return f"must be {IDEMPOTENCY_KEY_RULE}; U+{ord(char):04X} at {index} is not"
    if value[0] == " " or value[-1] == " ":
        return f"must be {IDEMPOTENCY_KEY_RULE}; it has a space at an end"
    return None


def file_name_problem(value: str) -> str | None:
    """Why ``value`` is no file name to store and show (None: it is one)."""
    problem = text_problem(value)
    if problem is not None:
        return problem
    for index, char in enumerate(value):
        if unicodedata.category(char) == "Cc":
            return f"must not contain control characters (U+{ord(char):04X} at {index})"
    return None


FileName = Annotated[str, _refusing(file_name_problem)]
IdempotencyKey = Annotated[str, _refusing(idempotency_key_problem)]


def json_problem(value: Any, path: str) -> str | None:
    """The first place in ``value`` (a parsed JSON value, at ``path``) that the record
    cannot store, and why: a NaN or infinite number, a key or string with a NUL or a
    lone surrogate. None: all of it can be stored. Iterative: however deep the value."""
    pending: list[tuple[str, Any]] = [(path, value)]
    while pending:
        where, item = pending.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return f"{where}: {item} is not a JSON number"
        if isinstance(item, str):
            problem = text_problem(item)
            if problem is not None:
                return f"{where}: {problem}"
        elif isinstance(item, Mapping):
            for key in item:
                problem = text_problem(str(key))
                if problem is not None:
                    return f"{where}: a key {problem}"
            pending.extend((f"{where}.{key}", inner) for key, inner in reversed(list(item.items())))
        elif isinstance(item, Sequence):
            pending.extend((f"{where}[{i}]", inner) for i, inner in reversed(list(enumerate(item))))
    return None


def undecodable_query(query_string: bytes) -> tuple[str, str] | None:
    """The first parameter of ``query_string`` (a URL's raw query, as the server got it)
    whose name or value is not UTF-8 once percent-decoded: its name (undecodable bytes
    replaced) and why; None: every one is."""
    if b"%" not in query_string:
        return None  # only ASCII reaches here (h11 refuses other bytes in a target)
    for pair in query_string.split(b"&"):
        raw_name, _, raw_value = pair.partition(b"=")
        name = unquote_to_bytes(raw_name.replace(b"+", b" "))
        for part in (name, unquote_to_bytes(raw_value.replace(b"+", b" "))):
            try:
                part.decode("utf-8")
            except UnicodeDecodeError as exc:
                bad = part[exc.start : exc.end].hex(" ").upper()
                return (
                    name.decode("utf-8", "replace"),
                    f"is not UTF-8 once percent-decoded (bytes {bad} at {exc.start}): "
                    "percent-encode the text's UTF-8 bytes",
                )
    return None


def entry_id(value: str | None) -> str | None:
    """A Redis stream entry id (``Last-Event-ID``) whose parts Redis accepts."""
    if value is not None and any(int(part) > MAX_ENTRY_PART for part in value.split("-")):
        raise ValueError(f"each part must be at most {MAX_ENTRY_PART}")
    return value


# pydantic reads a number (``-1``, ``1e12``) as Unix time, seconds or milliseconds:
# ``created_before=-1`` was 1969 and an empty list. A time given to the API is written
# out: its date first.
_ISO_DATE_FIRST = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


def _written_time(value: Any) -> Any:
    if isinstance(value, int | float) or (
        isinstance(value, str) and not _ISO_DATE_FIRST.match(value)
    ):
        shown = value[:40] if isinstance(value, str) else value
        raise ValueError(
            f"{shown!r} is not an ISO 8601 time (e.g. 2026-01-31T12:00:00Z): "
            "a number is not read as a Unix time"
        )
    return value


WrittenTime = BeforeValidator(_written_time)


def repeated_query(pairs: Sequence[tuple[str, str]], repeatable: Collection[str]) -> str | None:
    """The first query parameter, not one of ``repeatable``, given twice with different
    values (frameworks disagree on which wins: Starlette the last, Flask the first, so
    a proxy and the API could read different ones); None: none is."""
    seen: dict[str, str] = {}
    for name, value in pairs:
        if name in repeatable:
            continue
        if seen.setdefault(name, value) != value:
            return name
    return None
