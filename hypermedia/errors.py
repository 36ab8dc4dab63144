"""The exception tree of hypermedia.

Every error the platform raises on purpose derives from :class:`HypermediaError`
and carries a stable machine-readable ``code`` (what API clients switch on) and
the HTTP status the API answers with. Errors from redis, SQLAlchemy, boto3 ... are
translated where they enter, with ``raise ... from exc``.

::

    HypermediaError (code, status)
    ├── ConfigError              bad setting: names the key and what was expected
    ├── InvalidRequest      400  the request itself is malformed
    │   ├── UnknownOperation 422 no profile, or no pipeline step, for that operation
    │   ├── InvalidParams   422  parameters the operation's step refuses (an unknown OCR language)
    │   ├── CallbackNotAllowed 422 a callback_url whose host is not in the server's callback_hosts
    │   ├── InputTooLarge   413  object bigger than the profile allows
    │   ├── RequestTooLarge 413  a request body over its route's limit
    │   ├── UnsupportedMediaType 415 a JSON route's body sent as another type (curl -d's)
    │   ├── RangeNotSatisfiable 416 a blob download's Range past the blob's end
    │   ├── RequestTimeout  408  a JSON body not whole json_body_seconds after its head
    │   ├── UploadTooSlow   408  an upload's body stopped, or arrives under the minimum rate
    │   ├── InspectionLimit 422  inspecting the upload passed its CPU/memory/time budget
    │   ├── InspectionCrashed 422 the upload's inspector died of a signal parsing it
    │   └── InputRejected   422  the object's content is refused for the operation
    │       ├── UnsupportedFormat    a format the platform (or this operation) does not process
    │       ├── InputTypeMismatch    the operation is for another kind of file
    │       ├── InvalidInput         empty, truncated or unreadable container
    │       ├── MacroDocument        VBA/XLM macros, ODF Basic/scripts, ActiveX, DDE links
    │       ├── EncryptedDocument    needs a password (PDF, OOXML, ODF, legacy Office)
    │       ├── ZipBomb              size, ratio, entry-count, nested or overlapping entries
    │       ├── PathTraversal        an archive entry escaping its directory
    │       ├── UnsafeXml            a DTD in an Office/ODF part (XXE, entity expansion)
    │       ├── PolyglotFile         another file (a ZIP) appended to this one
    │       ├── PixelLimit           header dimensions x frames over the profile's limit
    │       ├── PageLimit            more pages than the profile allows
    │       └── DurationLimit        longer than the profile allows
    ├── AuthenticationFailed 401 missing / bad API key
    ├── Forbidden           403  authenticated but not allowed (operator-only routes)
    │   ├── PriorityNotAllowed   a priority outside the API key's granted range
    │   ├── InvalidSignature     a signed blob URL that does not verify   (storage.base)
    │   └── UrlExpired           a signed blob URL past its expiry        (storage.base)
    ├── NotFound            404  does not exist, or belongs to someone else
    ├── Conflict            409  e.g. a user name taken, a run in a state that forbids it
    │   ├── IdempotencyKeyReused  a key already used for another submit or upload
    │   └── AlreadyRegistered     a storage key registered already (another file, another user)
    ├── IllegalTransition   409  a job state change the state machine forbids
    ├── PaymentRequired     402  not enough credits: nothing was created
    ├── StorageQuotaExceeded 413 the user's stored bytes would pass (or have reached) their quota
    ├── RateLimited         429  too many submits or uploads a minute; ``Retry-After`` says when
    │   └── ConcurrencyLimited   too many of a user's uploads (event streams) at once: nothing read
    ├── ServiceUnavailable  503  a backing service is down
    │   ├── DatabaseUnavailable
    │   ├── DatabaseConflict     a transaction aborted by a deadlock, again when rerun
    │   ├── QueueUnavailable
    │   └── StorageUnavailable                                          (storage.base)
    │       └── StorageFull  507  no room left on the storage's disk
    └── TransferError            a worker's GET/PUT on a presigned URL   (storage.transfer)
        ├── TransferDenied       403 (usually expired: retryable)
        ├── TransferNotFound     404
        └── TransferUnavailable  5xx, timeouts, connection failures (retryable)

Errors of a job's child process are values, not this tree: ``ChildFailed`` (in
``sandbox.outcome``) carries a code, a message and whether a retry could help,
and ends up in the job's ``error_code`` / ``error_message``.
"""

from __future__ import annotations

from typing import Any, ClassVar


class HypermediaError(Exception):
    """Root of every error hypermedia raises on purpose.

    ``code`` is the class's, except on an error made from an HTTP answer whose code no
    class carries (``internal``, ``method_not_allowed``: a plain HypermediaError whose
    ``code`` is the server's, so ``to_dict()`` passes it on unchanged).
    ``status`` is the HTTP status this server answers the class with; ``http_status``
    is the one an HTTP answer actually carried, set on an error made from an answer
    (:func:`hypermedia.ingest.client.error_from_response`; a transfer's store), None
    otherwise. They may differ: a server answers 422 ``invalid_request`` for a body its
    schema refuses, while :class:`InvalidRequest`'s ``status`` is 400."""

    code: str = "error"  # the class's; an error made from an answer, the server's
    status: ClassVar[int] = 500
    http_status: int | None = None

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from its state, not by calling __init__ with ``args`` (a subclass's own
        # __init__, ConfigError's, takes other arguments): an error crossing a process
        # (a Ray actor's constructor or method) arrives whole, class and details kept.
        return (_rebuilt, (type(self), self.message, self.__dict__))

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details:
            body["details"] = self.details
        return body


def _rebuilt(cls: type[HypermediaError], message: str, state: dict[str, Any]) -> HypermediaError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error


class ConfigError(HypermediaError):
    """A setting is missing or invalid; the message names the key."""

    code = "config_invalid"
    status = 500

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}", key=key)
        self.key = key


class InvalidRequest(HypermediaError):
    code = "invalid_request"
    status = 400


class UnknownOperation(InvalidRequest):
    code = "unknown_operation"
    status = 422


class InvalidParams(InvalidRequest):
    """The operation's parameters (the profile's merged with the request's) are refused
    by its step's own check, before any job exists."""

    code = "invalid_params"
    status = 422


class CallbackNotAllowed(InvalidRequest):
    """A submit's ``callback_url`` names a host the operator did not allow
    (``callback_hosts``): the head would POST wherever it is told, inside its network too."""

    code = "callback_not_allowed"
    status = 422


class InputTooLarge(InvalidRequest):
    code = "input_too_large"
    status = 413


class RequestTooLarge(InvalidRequest):
    """A request body over its route's limit (refused before it is read)."""

    code = "request_too_large"
    status = 413


class UnsupportedMediaType(InvalidRequest):
    """A route that takes JSON was sent its body under another ``Content-Type`` (none,
    or ``curl -d``'s ``application/x-www-form-urlencoded``): not read as JSON at all."""

    code = "unsupported_media_type"
    status = 415


class RangeNotSatisfiable(InvalidRequest):
    """A blob download's ``Range`` starts past the blob's end."""

    code = "range_not_satisfiable"
    status = 416


class RequestTimeout(InvalidRequest):
    """A request's (JSON) body did not arrive whole in time: the connection it held is
    closed. uvicorn waits for a body as long as its client keeps the connection."""

    code = "request_timeout"
    status = 408


class UploadTooSlow(InvalidRequest):
    """An upload's body stopped arriving, or arrives slower than the API's minimum rate:
    the upload slot (a worker thread) it held goes to others, and nothing is kept."""

    code = "upload_too_slow"
    status = 408


class InputRejected(InvalidRequest):
    """The object's content (as inspected at upload, never its name or claimed type)
    is refused for the requested operation: 422, nothing created, nothing reserved.
    Raised by :func:`hypermedia.sandbox.inspect.check_operation`."""

    code = "input_rejected"
    status = 422


class UnsupportedFormat(InputRejected):
    code = "unsupported_format"


class InputTypeMismatch(InputRejected):
    code = "input_type_mismatch"


class InvalidInput(InputRejected):
    code = "invalid_input"


class MacroDocument(InputRejected):
    code = "macro_document"


class EncryptedDocument(InputRejected):
    code = "encrypted_document"


class ZipBomb(InputRejected):
    code = "zip_bomb"


class PathTraversal(InputRejected):
    code = "path_traversal"


class UnsafeXml(InputRejected):
    code = "unsafe_xml"


class PolyglotFile(InputRejected):
    code = "polyglot_file"


class PixelLimit(InputRejected):
    code = "pixel_limit"


class PageLimit(InputRejected):
    code = "page_limit"


class DurationLimit(InputRejected):
    code = "duration_limit"


class InspectionLimit(InvalidRequest):
    """Inspecting the upload needed more CPU, memory or time than its budget: refused
    at upload, before any operation is judged (so not an InputRejected verdict)."""

    code = "inspection_limit"
    status = 422


class InspectionCrashed(InvalidRequest):
    """The child inspecting the upload died of a signal (a segfault, an abort, the
    seccomp filter's kill) parsing it: the file is refused at upload, as past a budget,
    and nothing of it is kept (a parser the file crashes is not handed it again)."""

    code = "inspection_crashed"
    status = 422


class AuthenticationFailed(HypermediaError):
    code = "unauthenticated"
    status = 401


class Forbidden(HypermediaError):
    code = "forbidden"
    status = 403


class PriorityNotAllowed(Forbidden):
    """A priority outside the range the operator granted the API key."""

    code = "priority_not_allowed"


class NotFound(HypermediaError):
    code = "not_found"
    status = 404


class Conflict(HypermediaError):
    code = "conflict"
    status = 409


class IdempotencyKeyReused(Conflict):
    """An ``Idempotency-Key`` already used for something else: a submit's key for
    another request (other operations, object, params, priority or callback), or an
    upload's key that already made an object of other content (another sha256, size,
    file name or pool), or one since deleted. Nothing is created; send it under a new
    key."""

    code = "idempotency_key_reused"


class AlreadyRegistered(Conflict):
    """A registration (``POST /objects/register``) names a storage key an object already
    has, and is not a retry of the registration that made it (its owner, the same file
    name, size and sha256): nothing is registered. Its owner is told the object's id;
    anyone else is not."""

    code = "already_registered"


class IllegalTransition(HypermediaError):
    """The state machine forbids this change (or a guarded UPDATE matched nothing)."""

    code = "illegal_transition"
    status = 409


class PaymentRequired(HypermediaError):
    code = "insufficient_credits"
    status = 402


class StorageQuotaExceeded(HypermediaError):
    """The upload would take the user's stored bytes past ``user_storage_quota_bytes``,
    or a submit comes from a user whose outputs already took them there."""

    code = "storage_quota_exceeded"
    status = 413


class RateLimited(HypermediaError):
    """Too many requests of a kind in the window; ``retry_after_seconds`` says when."""

    code = "rate_limited"
    status = 429


class ConcurrencyLimited(RateLimited):
    """Too many of one user's uploads (or event streams) at once: the request was refused
    before anything of it was read, counted or done, so sending it again once one of
    them has ended (``Retry-After``, a second for an upload) is safe. A client tells it
    from a rate (``rate_limited``: a minute's worth used up) by its code."""

    code = "concurrency_limited"


class ServiceUnavailable(HypermediaError):
    code = "service_unavailable"
    status = 503


class DatabaseUnavailable(ServiceUnavailable):
    code = "database_unavailable"


class DatabaseConflict(ServiceUnavailable):
    """PostgreSQL aborted the request's transaction in a conflict with concurrent ones
    (deadlock detected, a serialization failure), again when it was run again
    (:mod:`hypermedia.db.conflicts`): nothing of it was kept, and the request may be
    sent again (``retry_after_seconds``)."""

    code = "database_conflict"


class QueueUnavailable(ServiceUnavailable):
    code = "queue_unavailable"


def error_classes() -> dict[str, type[HypermediaError]]:
    """Every error class by its code, the first (the most general) for a code two share:
    an error that crossed a process (an HTTP answer, a Ray actor's) raised again as
    itself (the storage's classes too: a web tier's client catches StorageUnavailable)."""
    found: dict[str, type[HypermediaError]] = {}
    for cls in _every_class():
        found.setdefault(cls.code, cls)
    return found


def _every_class() -> list[type[HypermediaError]]:
    """HypermediaError and every subclass, each before its own subclasses."""
    import hypermedia.storage.base  # noqa: F401  (its classes: InvalidSignature, StorageFull ...)

    every: list[type[HypermediaError]] = []
    pending: list[type[HypermediaError]] = [HypermediaError]
    while pending:
        cls = pending.pop()
        every.append(cls)
        pending.extend(cls.__subclasses__())
    return every


def from_traceback(text: str) -> HypermediaError | None:
    """The error a traceback's last line names (``hypermedia.errors.ConfigError:
    database_url: ...``), as itself, when it is one of ours (Ray gives an actor's
    constructor's error only as its traceback's text); None otherwise."""
    lines = text.strip().splitlines()
    name, found, message = (lines[-1] if lines else "").partition(": ")
    module, _, class_name = name.rpartition(".")
    if not found or not module.startswith("hypermedia."):
        return None
    cls = next((c for c in _every_class() if c.__name__ == class_name), None)
    return None if cls is None else _rebuilt(cls, message, {"message": message, "details": {}})
