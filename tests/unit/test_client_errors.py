"""Error responses become the matching hypermedia.errors class."""

from __future__ import annotations

import httpx
import pytest

from hypermedia import errors
from hypermedia.ingest.client import HypermediaClient, error_from_response


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        ("invalid_request", errors.InvalidRequest),
        ("unknown_operation", errors.UnknownOperation),
        ("input_too_large", errors.InputTooLarge),
        ("unsupported_format", errors.UnsupportedFormat),
        ("unauthenticated", errors.AuthenticationFailed),
        ("forbidden", errors.Forbidden),
        ("not_found", errors.NotFound),
        ("conflict", errors.Conflict),
        ("illegal_transition", errors.IllegalTransition),
        ("insufficient_credits", errors.PaymentRequired),
        ("service_unavailable", errors.ServiceUnavailable),
        ("database_unavailable", errors.DatabaseUnavailable),
        ("queue_unavailable", errors.QueueUnavailable),
        ("error", errors.HypermediaError),
    ],
)
def test_codes_map_to_classes(code, cls):
    error = error_from_response(400, {"error": {"code": code, "message": "m", "details": {"a": 1}}})
    assert type(error) is cls
    assert error.message == "m"
    assert str(error) == "m"
    assert error.details == {"a": 1}
    assert error.http_status == 400  # the answer's, whatever the class's own status


def test_the_storages_codes_map_to_their_classes_in_a_client_alone():
    """The storage's error classes live in hypermedia.storage.base, which a web tier's
    process importing only the client never imported: a 507 storage_full was the root
    HypermediaError, not StorageFull (a StorageUnavailable) to catch."""
    import subprocess
    import sys

    program = (
        "from hypermedia.ingest.client import error_from_response\n"
        "for code in ('storage_full', 'storage_unavailable', 'url_expired'):\n"
        "    error = error_from_response(503, {'error': {'code': code, 'message': 'm'}})\n"
        "    print(type(error).__name__, [c.__name__ for c in type(error).__mro__][1])\n"
    )
    shown = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert shown[:3] == [
        "StorageFull StorageUnavailable",
        "StorageUnavailable ServiceUnavailable",
        "UrlExpired Forbidden",
    ]


def test_config_error_keeps_the_server_message():
    payload = {"error": {"code": "config_invalid", "message": "k: bad", "details": {"key": "k"}}}
    error = error_from_response(500, payload)
    assert isinstance(error, errors.ConfigError)
    assert error.message == "k: bad" and error.key == "k"


def test_unknown_codes_become_the_root_error():
    error = error_from_response(
        500, {"error": {"code": "internal", "message": "internal server error"}}
    )
    assert type(error) is errors.HypermediaError
    assert error.code == "internal"  # the server's (was "error")
    assert error.message == "internal server error"
    assert error.details == {"server_code": "internal", "http_status": 500}
    assert error.http_status == 500


@pytest.mark.parametrize("payload", [None, "text", {"detail": "x"}, {"error": "x"}])
def test_responses_without_an_error_body(payload):
    error = error_from_response(502, payload)
    assert type(error) is errors.HypermediaError
    assert error.message == "HTTP 502"
    assert error.http_status == 502


def test_errors_not_made_from_an_answer_have_no_http_status():
    assert errors.NotFound("m").http_status is None
    assert errors.ConfigError("k", "bad").http_status is None
    config = error_from_response(
        503, {"error": {"code": "config_invalid", "message": "k: bad", "details": {"key": "k"}}}
    )
    assert config.http_status == 503 and config.to_dict() == {
        "code": "config_invalid",
        "message": "k: bad",
        "details": {"key": "k"},
    }


def test_details_cannot_clash_with_the_message_argument():
    error = error_from_response(
        404, {"error": {"code": "not_found", "message": "m", "details": {"message": "x"}}}
    )
    assert isinstance(error, errors.NotFound) and error.message == "m"


def test_every_error_code_is_distinct():
    seen: dict[str, type] = {}
    pending: list[type[errors.HypermediaError]] = [errors.HypermediaError]
    while pending:
        cls = pending.pop()
        assert cls.code not in seen, f"{cls} and {seen.get(cls.code)} share {cls.code}"
        seen[cls.code] = cls
        pending.extend(cls.__subclasses__())


@pytest.mark.parametrize("key", ["cl\u00e9", "\U0001f511", "", " k", "k" * 201, "a\nb"])
def test_a_key_the_api_would_refuse_is_refused_unsent(key):
    # Before: a non-ASCII key raised a bare UnicodeEncodeError from httpx's header
    # encoding; an empty one was silently replaced by a random key.
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(500)

    with HypermediaClient("http://api", "hm_x", transport=httpx.MockTransport(answer)) as client:
        with pytest.raises(errors.InvalidRequest, match="printable ASCII") as upload:
            client.upload(b"abc", "a.bin", idempotency_key=key)
        with pytest.raises(errors.InvalidRequest, match="idempotency_key must be") as process:
            client.process("o1", ["thumbnail"], idempotency_key=key)
    assert sent == []
    for caught in (upload, process):
        assert caught.value.details == {"idempotency_key": key}
        assert caught.value.http_status is None
