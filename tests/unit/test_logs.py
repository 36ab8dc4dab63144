"""The log formats: every ``extra=`` field reaches the line, in JSON and in text."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from hypermedia import logs
from hypermedia.errors import ConfigError


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def root() -> Iterator[logging.Logger]:
    """The root logger, given back as it was (pytest's capture handlers included)."""
    logger = logging.getLogger()
    handlers, level = logger.handlers[:], logger.level
    yield logger
    logger.handlers[:] = handlers
    logger.setLevel(level)


def _record(exc_info: bool = False, **extra: object) -> logging.LogRecord:
    record = logging.getLogger("hypermedia.worker.worker").makeRecord(
        "hypermedia.worker.worker",
        logging.WARNING,
        __file__,
        1,
        "job %s failed: %s",
        ("j1", "boom"),
        None,
        extra=extra,
    )
    if exc_info:
        try:
            raise ValueError("bad pixels")
        except ValueError:
            import sys

            record.exc_info = sys.exc_info()
    return record


def test_json_carries_the_standard_fields_and_every_extra():
    extra = {"job_id": "j1", "queue": "images", "worker_id": "images-abc", "action": "fail"}
    line = logs.JsonFormatter().format(
        _record(job_id="j1", queue="images", worker_id="images-abc", action="fail")
    )
    data = json.loads(line)
    assert list(data)[:4] == ["timestamp", "level", "logger", "message"]
    assert data["level"] == "WARNING"
    assert data["logger"] == "hypermedia.worker.worker"
    assert data["message"] == "job j1 failed: boom"
    assert datetime.fromisoformat(data["timestamp"]).utcoffset() is not None
    assert {k: data[k] for k in extra} == extra
    assert "exception" not in data
    assert not {"args", "msg", "levelno", "pathname", "exc_info"} & set(data)


def test_json_holds_the_traceback_in_one_line():
    line = logs.JsonFormatter().format(_record(exc_info=True, job_id="j1"))
    assert "\n" not in line
    data = json.loads(line)
    assert data["exception"].startswith("Traceback (most recent call last):")
    assert "ValueError: bad pixels" in data["exception"]
    assert data["job_id"] == "j1"


def test_json_renders_what_json_cannot_hold():
    class Opaque:
        def __str__(self) -> str:
            return "opaque-7"

    line = logs.JsonFormatter().format(
        _record(path=Path("/srv/a b"), opaque=Opaque(), raw=b"\x00\xff", ids={"b", "a"})
    )
    data = json.loads(line)
    assert data["path"] == "/srv/a b"
    assert data["opaque"] == "opaque-7"
    assert isinstance(data["raw"], str)
    assert isinstance(data["ids"], str)


def test_text_shows_the_extras_as_key_value_and_quotes_what_needs_it():
    text = logs.TextFormatter().format(
        _record(exc_info=True, job_id="j1", queue="images", reason="too many pixels", n=3)
    )
    first, *rest = text.splitlines()
    assert first.endswith(
        " WARNING hypermedia.worker.worker: job j1 failed: boom"
        ' job_id=j1 queue=images reason="too many pixels" n=3'
    )
    assert rest[0] == "Traceback (most recent call last):"
    assert rest[-1] == "ValueError: bad pixels"


def test_private_attributes_are_not_extras():
    # Ray's record factory adds _ray_timestamp_ns to every record once ray is
    # initialised (as in a process that started a Ray driver): not the call site's.
    record = _record(job_id="j1")
    record._ray_timestamp_ns = 1796207052358099399
    text = logs.TextFormatter().format(record)
    assert text.endswith("job j1 failed: boom job_id=j1")
    line = json.loads(logs.JsonFormatter().format(record))
    assert line["job_id"] == "j1"
    assert not [k for k in line if k.startswith("_")]


def test_the_default_is_text_on_a_terminal_and_json_elsewhere():
    assert logs.resolve_format(None, _Terminal()) == "text"
    assert logs.resolve_format(None, io.StringIO()) == "json"
    assert logs.resolve_format("", io.StringIO()) == "json"
    assert logs.resolve_format("TEXT", io.StringIO()) == "text"
    assert logs.resolve_format("json", _Terminal()) == "json"


@pytest.mark.parametrize(
    ("environ", "key"),
    [
        ({"HYPERMEDIA_LOG_FORMAT": "yaml"}, "log_format (HYPERMEDIA_LOG_FORMAT)"),
        ({"HYPERMEDIA_LOG_LEVEL": "loud"}, "log_level (HYPERMEDIA_LOG_LEVEL)"),
    ],
)
def test_a_bad_value_names_the_key(root: logging.Logger, environ: dict[str, str], key: str):
    with pytest.raises(ConfigError) as caught:
        logs.configure_from_environment(environ=environ)
    assert caught.value.key == key


def test_configure_writes_json_lines_with_extras(root: logging.Logger):
    stream = io.StringIO()
    assert logs.configure("info", None, stream) == "json"
    logging.getLogger("hypermedia.test").debug("hidden")
    logging.getLogger("hypermedia.test").info("claimed %s", "j1", extra={"job_id": "j1"})
    logging.getLogger("httpx").info("a request")  # quiet above debug
    (line,) = stream.getvalue().splitlines()
    assert json.loads(line)["job_id"] == "j1"


def test_only_rays_autoscaler_process_has_our_package_taken_over(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    name = "hm_logs_test_package"
    logger = logging.getLogger(name)
    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setattr(logger, "propagate", True)
    monkeypatch.setattr(logger, "level", logging.NOTSET)

    def state() -> tuple[int, bool]:
        return len(logger.handlers), logger.propagate

    assert not logs.configure_package(name, ["/usr/bin/hypermedia"])
    assert state() == (0, True)
    monitor = ["/venv/lib/python3.11/site-packages/ray/autoscaler/_private/monitor.py", "-x"]
    assert logs.configure_package(name, monitor)
    assert logs.configure_package(name, monitor)  # once
    assert state() == (1, False)
    logging.getLogger(f"{name}.drivers").info(
        "launched %s", "n-1", extra={"action": "launch", "queue": "media"}
    )
    line = json.loads(capsys.readouterr().err.strip())
    assert (line["message"], line["action"], line["queue"]) == ("launched n-1", "launch", "media")
    assert line["logger"] == f"{name}.drivers"


SIGNED = (
    "http://127.0.0.1:8080/v1/hypermedia/blobs/originals/u/o?expires=1796493397"
    "&sig=a423843f78fae092bb4064ed14b6a607649b225839cc2b81017e599e552866d8"
)
PRESIGNED = (
    "https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256"
    "&X-Amz-Credential=AKIAEXAMPLE%2F20261205%2Fus-east-1%2Fs3%2Faws4_request"
    "&X-Amz-Expires=900&X-Amz-Security-Token=FwoGZXIvYXdzEXAMPLETOKEN"
    "&X-Amz-Signature=0acdc2976faacda8a35131ca67886d78fdba06e29e451704ffdba0e359de626e"
)


@pytest.mark.parametrize("log_format", logs.FORMATS)
def test_no_line_carries_a_signed_urls_signature(root: logging.Logger, log_format: str):
    """A pipeline actor at HYPERMEDIA_LOG_LEVEL=debug wrote httpx's own line for each
    transfer, 'HTTP Request: GET <url> "HTTP/1.1 200 OK"', with the whole presigned URL of
    the job's input and outputs in its worker-*.err (measured: 'hypermedia head
    --log-level debug', a thumbnail job): a read of the user's file, or a write over
    its output, for anyone who reads Ray's logs in the 15 minutes the URL lives. Every
    line our handlers write now has those parameters' values redacted, a traceback's too."""
    import httpx

    stream = io.StringIO()
    logs.configure("debug", log_format, stream)

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(403 if "X-Amz" in str(request.url) else 200)

    with httpx.Client(transport=httpx.MockTransport(answer)) as client:
        client.get(SIGNED)
        try:
            client.put(PRESIGNED, content=b"x").raise_for_status()
        except httpx.HTTPStatusError:
            logging.getLogger("hypermedia.storage.transfer").exception("upload failed")
    written = stream.getvalue()
    assert "HTTP Request: GET" in written  # httpx's line is there, the URLs without secrets
    assert "/v1/hypermedia/blobs/originals/u/o?expires=1796493397&sig=[redacted]" in written
    assert "X-Amz-Expires=900" in written
    for secret in ("a423843f78fae092", "AKIAEXAMPLE", "FwoGZXIvYXdz", "0acdc2976faacda8"):
        assert secret not in written


@pytest.mark.parametrize("log_format", logs.FORMATS)
def test_debug_shows_no_request_signature_of_the_aws_sdk(root: logging.Logger, log_format: str):
    """At HYPERMEDIA_LOG_LEVEL=debug botocore.auth wrote each presigned URL's signature
    ('Signature:\\n<hex>') beside its canonical request (bucket, key, date, expiry: all
    the rest of the URL), and botocore.endpoint every request's Authorization header
    (measured: 'hypermedia head --log-level debug' on S3, the download URL's
    X-Amz-Signature in head.log). The AWS SDK's loggers stay at INFO."""
    import boto3

    stream = io.StringIO()
    logs.configure("debug", log_format, stream)
    s3 = boto3.client(
        "s3",
        region_name="us-east-1",
        aws_access_key_id="AKIAEXAMPLE",
        aws_secret_access_key="canary-secret-key",
        aws_session_token="canary-session-token",
    )
    url = s3.generate_presigned_url("get_object", {"Bucket": "b", "Key": "k"}, ExpiresIn=900)
    signature = url.rpartition("X-Amz-Signature=")[2]
    logging.getLogger("hypermedia.test").debug("debug is on")
    written = stream.getvalue()
    assert "debug is on" in written
    assert signature not in written
    assert "canary-session-token" not in written
