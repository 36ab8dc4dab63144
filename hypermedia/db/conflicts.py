"""Transactions PostgreSQL aborted in a conflict with others, and running them again.

PostgreSQL aborts a transaction caught in a deadlock (SQLSTATE ``40P01``: the one whose
wait found the cycle) or one that a serializable or repeatable-read snapshot cannot
order with others (``40001``). Its documentation ("Serialization Failure Handling")
prescribes retrying the whole transaction: nothing of it was kept, and the next run
meets the others done or gone. :func:`rerun_on_conflict` does that a bounded number of
times, then raises :class:`~hypermedia.errors.DatabaseConflict` (503 with
``Retry-After``: the request may be sent again), and the API answers any other such
abort (a path not rerun) the same way (:func:`conflict_error`), never 500 ``internal``.

Only work that has had no effect outside the database before its last commit may be
rerun: a submit's transaction, not the Redis push after it.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.exc import DBAPIError

from hypermedia.errors import DatabaseConflict

log = logging.getLogger(__name__)

T = TypeVar("T")

# The SQLSTATEs after which the transaction is to be run again, and what they mean.
CONFLICT_SQLSTATES = {"40P01": "deadlock detected", "40001": "serialization failure"}
# Runs of a transaction in all, the first included.
CONFLICT_ATTEMPTS = 3
# The pause before a run again: about this, doubled each time, jittered (two
# transactions aborted together must not meet again at once).
CONFLICT_PAUSE_SECONDS = 0.05
# What a caller is told after the last run (a 503's Retry-After).
CONFLICT_RETRY_AFTER_SECONDS = 1


def conflict_sqlstate(exc: BaseException) -> str | None:
    """``40P01`` or ``40001`` when ``exc`` (or an error it was raised from) is PostgreSQL
    aborting a transaction in a conflict with others; None otherwise."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DBAPIError):
            state = getattr(current.orig, "sqlstate", None)
            if state in CONFLICT_SQLSTATES:
                return str(state)
        current = current.__cause__ or current.__context__
    return None


def conflict_error(exc: BaseException) -> DatabaseConflict | None:
    """The :class:`DatabaseConflict` an aborted transaction's error answers as, if it
    is one (:func:`conflict_sqlstate`)."""
    state = conflict_sqlstate(exc)
    if state is None:
        return None
    return DatabaseConflict(
        "the database aborted this request's transaction in a conflict with concurrent"
        f" ones ({CONFLICT_SQLSTATES[state]}); it was rolled back: try again",
        sqlstate=state,
        retry_after_seconds=CONFLICT_RETRY_AFTER_SECONDS,
    )


def rerun_on_conflict(
    work: Callable[[], T],
    *,
    what: str,
    attempts: int = CONFLICT_ATTEMPTS,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``work()``, run again whole when PostgreSQL aborted its transaction in a conflict
    (:data:`CONFLICT_SQLSTATES`), up to ``attempts`` runs; after the last,
    :class:`DatabaseConflict` from its error. ``work`` opens and commits its own
    transaction(s) and does nothing outside the database. ``what``: for the log."""
    if attempts < 1:
        raise ValueError(f"attempts must be 1 or more, not {attempts}")
    for attempt in range(1, attempts + 1):
        try:
            return work()
        except DBAPIError as exc:
            conflict = conflict_error(exc)
            if conflict is None:
                raise
            if attempt == attempts:
                raise conflict from exc
            pause = CONFLICT_PAUSE_SECONDS * 2 ** (attempt - 1) * random.uniform(0.5, 1.5)
            log.info(
                "%s: %s (run %d of %d); running it again in %.2fs",
                what,
                CONFLICT_SQLSTATES[conflict.details["sqlstate"]],
                attempt,
                attempts,
                pause,
                extra={"action": "db_conflict_rerun"},
            )
            sleep(pause)
    raise AssertionError("unreachable")  # attempts < 1
