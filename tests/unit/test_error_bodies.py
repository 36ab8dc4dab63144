"""An API error body always encodes, whatever the request held (a message may echo it)."""

from __future__ import annotations

import json

from hypermedia.errors import UnknownOperation
from hypermedia.ingest.http_errors import error_response


def test_an_error_echoing_a_lone_surrogate_still_encodes():
    response = error_response(UnknownOperation("'\ud800' is not accepted", operation="\ud800"))
    assert response.status_code == 422
    body = bytes(response.body)
    assert body.isascii() and b"\\ud800" in body
    assert json.loads(body)["error"]["details"] == {"operation": "\ud800"}
    plain = error_response(UnknownOperation("'é' is not accepted"))
    assert "'é'" in bytes(plain.body).decode("utf-8")  # only escaped when it must be


def test_a_value_the_database_refused_is_400_not_500():
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from sqlalchemy.exc import DataError

    from hypermedia.ingest.http_errors import install_error_handlers

    app = FastAPI()

    @app.get("/refused")
    def refused() -> None:
        raise DataError("INSERT ...", {}, ValueError("text fields cannot contain NUL"))

    install_error_handlers(app)
    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.get("/refused")
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request" and "cannot be stored" in error["message"]
    assert "NUL" not in error["message"]  # the database's words go to the log


def test_a_service_outage_is_503_with_retry_after():
    """A database or Redis that is down answered 503 with no Retry-After (seen under
    hypermedia up with PostgreSQL stopped: 60 submits, none told when to come back);
    the client's backoff and any other client's read it. One the error names wins."""
    from hypermedia.errors import DatabaseUnavailable, QueueUnavailable, ServiceUnavailable
    from hypermedia.ingest.http_errors import OUTAGE_RETRY_AFTER_SECONDS

    driver = 'connection to server at "10.0.0.7", port 5432 failed: database "hm_prod"'
    for error in (
        DatabaseUnavailable(f"database unreachable: {driver}"),
        QueueUnavailable("redis unreachable: Error 111 connecting to 10.0.0.7:6380"),
    ):
        response = error_response(error)
        assert response.status_code == 503
        assert response.headers["Retry-After"] == str(OUTAGE_RETRY_AFTER_SECONDS)
        body = json.loads(bytes(response.body))["error"]
        assert body["code"] == error.code
        # The driver's words name the operator's hosts, ports and database: not the
        # caller's to read (they were the message); the log has them.
        assert "10.0.0.7" not in body["message"] and body["message"].endswith("; try again shortly")
    named = ServiceUnavailable("busy", retry_after_seconds=42)
    assert error_response(named).headers["Retry-After"] == "42"


def test_a_storage_outage_is_told_in_its_own_words_with_retry_after():
    """The storage's words name the operator's bucket, endpoint or directory: the log's.
    A full disk is 507, told to come back later than an outage."""
    from hypermedia.ingest.http_errors import (
        OUTAGE_RETRY_AFTER_SECONDS,
        STORAGE_FULL_RETRY_AFTER_SECONDS,
    )
    from hypermedia.storage.base import StorageFull, StorageUnavailable

    for error, status, retry_after in (
        (
            StorageUnavailable(
                "S3 unreachable: Could not connect to the endpoint URL: "
                '"http://10.0.0.7:9000/hm-prod/originals/p/o"',
                bucket="hm-prod",
            ),
            503,
            OUTAGE_RETRY_AFTER_SECONDS,
        ),
        (
            StorageFull("local storage at /srv/hm/objects cannot store 'o': full", key="o"),
            507,
            STORAGE_FULL_RETRY_AFTER_SECONDS,
        ),
    ):
        response = error_response(error)
        assert response.status_code == status
        assert response.headers["Retry-After"] == str(retry_after)
        body = json.loads(bytes(response.body))["error"]
        assert body["code"] == error.code and "nothing was stored" in body["message"]
        assert "details" not in body
        assert "hm-prod" not in str(body) and "/srv/hm" not in str(body)
