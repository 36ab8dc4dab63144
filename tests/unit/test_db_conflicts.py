"""Transactions PostgreSQL aborted in a conflict (deadlock detected, a serialization
failure): run again a bounded number of times, then 503 ``database_conflict``; any
other error is neither rerun nor translated."""

from __future__ import annotations

import psycopg.errors
import pytest
from sqlalchemy.exc import OperationalError

from hypermedia.db.conflicts import CONFLICT_ATTEMPTS, conflict_sqlstate, rerun_on_conflict
from hypermedia.errors import DatabaseConflict


def _aborted(orig: Exception) -> OperationalError:
    return OperationalError("UPDATE objects ...", {}, orig)


DEADLOCK = psycopg.errors.DeadlockDetected("deadlock detected")
SERIALIZATION = psycopg.errors.SerializationFailure("could not serialize access")
LOST = psycopg.OperationalError("server closed the connection unexpectedly")


@pytest.mark.parametrize(
    ("error", "sqlstate"),
    [
        (_aborted(DEADLOCK), "40P01"),
        (_aborted(SERIALIZATION), "40001"),
        (_aborted(LOST), None),
        (psycopg.errors.LockNotAvailable("lock timeout"), None),
        (RuntimeError("not the database's"), None),
    ],
)
def test_a_conflict_is_told_by_its_sqlstate(error, sqlstate):
    assert conflict_sqlstate(error) == sqlstate
    # An error raised from one (a translation at another edge) is one too.
    with pytest.raises(RuntimeError) as wrapped:
        raise RuntimeError("wrapped") from error
    assert conflict_sqlstate(wrapped.value) == sqlstate


def _work(errors: list[Exception]):
    runs: list[int] = []

    def work() -> str:
        runs.append(1)
        if errors:
            raise errors.pop(0)
        return "done"

    return work, runs


def test_a_conflict_is_run_again_and_the_last_one_is_database_conflict():
    pauses: list[float] = []
    work, runs = _work([_aborted(DEADLOCK), _aborted(SERIALIZATION)])
    assert rerun_on_conflict(work, what="t", sleep=pauses.append) == "done"
    assert len(runs) == 3 and len(pauses) == 2 and 0 < pauses[0] < pauses[1] * 2

    work, runs = _work([_aborted(DEADLOCK)] * (CONFLICT_ATTEMPTS + 1))
    with pytest.raises(DatabaseConflict) as spent:
        rerun_on_conflict(work, what="t", sleep=lambda _: None)
    assert len(runs) == CONFLICT_ATTEMPTS
    assert spent.value.status == 503 and spent.value.code == "database_conflict"
    assert spent.value.details == {"sqlstate": "40P01", "retry_after_seconds": 1}

    work, runs = _work([_aborted(LOST), _aborted(DEADLOCK)])
    with pytest.raises(OperationalError):
        rerun_on_conflict(work, what="t", sleep=lambda _: None)
    assert len(runs) == 1  # anything else: not run again


def test_an_api_request_whose_transaction_was_aborted_in_a_conflict_is_503_not_500():
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from hypermedia.ingest.http_errors import install_error_handlers

    app = FastAPI()

    @app.post("/deadlocked")
    def deadlocked() -> None:
        raise _aborted(DEADLOCK)

    @app.post("/lost")
    def lost() -> None:
        raise _aborted(LOST)

    install_error_handlers(app)
    with TestClient(app, raise_server_exceptions=False) as client:
        conflict, other = client.post("/deadlocked"), client.post("/lost")
    assert conflict.status_code == 503, conflict.text
    assert conflict.headers["Retry-After"] == "1"
    error = conflict.json()["error"]
    assert (error["code"], error["details"]["sqlstate"]) == ("database_conflict", "40P01")
    assert "deadlock detected" in error["message"]
    assert other.status_code == 500 and other.json()["error"]["code"] == "internal"
