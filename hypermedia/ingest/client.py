"""A thin synchronous client for the HTTP API (httpx).

::

    with HypermediaClient("http://127.0.0.1:8080", api_key) as client:
        obj = client.upload(Path("cat.jpg"))
        submitted = client.process(obj.object_id, ["thumbnail"])
        job = client.wait(submitted.job_ids[0], timeout=60)

An API error is raised as the :mod:`hypermedia.errors` class whose ``code`` the
server sent (``not_found`` -> :class:`NotFound`, ``insufficient_credits`` ->
:class:`PaymentRequired` ...) with the server's message and details; an unknown
code becomes a plain :class:`HypermediaError` (its details keep ``server_code``
and ``http_status``). A server that cannot be reached raises
:class:`ServiceUnavailable`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx
from pydantic import BaseModel

from hypermedia.errors import ConfigError, HypermediaError, ServiceUnavailable
from hypermedia.ingest.schemas import (
    AttemptLogResponse,
    CancelResponse,
    CreditsResponse,
    DeleteObjectResponse,
    HealthResponse,
    JobResponse,
    ObjectResponse,
    ProcessResponse,
    QueuesResponse,
)

__all__ = ["PREFIX", "HypermediaClient", "error_from_response"]

PREFIX = "/v1/hypermedia"
_Model = TypeVar("_Model", bound=BaseModel)


def _error_classes() -> dict[str, type[HypermediaError]]:
    found: dict[str, type[HypermediaError]] = {}
    pending: list[type[HypermediaError]] = [HypermediaError]
    while pending:
        cls = pending.pop()
        found.setdefault(cls.code, cls)
        pending.extend(cls.__subclasses__())
    return found


def error_from_response(status: int, payload: Any) -> HypermediaError:
    """The exception an error response stands for."""
    body = payload.get("error") if isinstance(payload, Mapping) else None
    if not isinstance(body, Mapping):
        return HypermediaError(f"HTTP {status}", http_status=status)
    code = str(body.get("code", "error"))
    message = str(body.get("message", f"HTTP {status}"))
    details = body.get("details")
    details = dict(details) if isinstance(details, Mapping) else {}
    details.pop("message", None)  # would collide with the constructor's own argument
    cls = _error_classes().get(code)
    if cls is None:
        return HypermediaError(message, **{**details, "server_code": code, "http_status": status})
    if issubclass(cls, ConfigError):
        # ConfigError's constructor builds its message from the key; keep the server's.
        error = ConfigError(str(details.get("key", "?")), message)
        error.message = message
        error.args = (message,)
        return error
    return cls(message, **details)


class HypermediaClient:
    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.base_url, headers=headers, timeout=timeout, transport=transport
        )

    # -- plumbing -------------------------------------------------------------------------

    def _request(self, method: str, path: str, model: type[_Model], **kwargs: Any) -> _Model:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ServiceUnavailable(
                f"cannot reach the API at {self.base_url}: {exc}", url=self.base_url
            ) from exc
        if response.status_code >= 400:
            raise error_from_response(response.status_code, _json_or_none(response))
        return model.model_validate_json(response.content)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- objects ----------------------------------------------------------------------------

    def upload(
        self,
        source: Path | str | bytes,
        filename: str | None = None,
        pool_id: str | None = None,
        *,
        content_type: str = "application/octet-stream",
    ) -> ObjectResponse:
        """Upload a file (streamed from disk) or bytes; ``filename`` defaults to the
        file's name."""
        if isinstance(source, bytes):
            if filename is None:
                raise ValueError("filename is required when uploading bytes")
            content: bytes | Iterable[bytes] = source
        else:
            path = Path(source)
            filename = filename or path.name
            content = _file_chunks(path)
        params = {"filename": filename}
        if pool_id is not None:
            params["pool_id"] = pool_id
        headers = {"Content-Type": content_type}
        if not isinstance(source, bytes):
            headers["Content-Length"] = str(Path(source).stat().st_size)
        return self._request(
            "PUT",
            f"{PREFIX}/objects",
            ObjectResponse,
            params=params,
            content=content,
            headers=headers,
        )

    def register(
        self,
        storage_key: str,
        filename: str,
        size_bytes: int,
        pool_id: str | None = None,
        content_type: str | None = None,
        sha256: str | None = None,
    ) -> ObjectResponse:
        body: dict[str, Any] = {
            "storage_key": storage_key,
            "filename": filename,
            "size_bytes": size_bytes,
        }
        for key, value in (
            ("pool_id", pool_id),
            ("content_type", content_type),
            ("sha256", sha256),
        ):
            if value is not None:
                body[key] = value
        return self._request("POST", f"{PREFIX}/objects/register", ObjectResponse, json=body)

    def object(self, object_id: str) -> ObjectResponse:
        return self._request("GET", f"{PREFIX}/objects/{object_id}", ObjectResponse)

    def delete(self, object_id: str) -> DeleteObjectResponse:
        """Delete an object of yours, its derived outputs and their stored bytes."""
        return self._request("DELETE", f"{PREFIX}/objects/{object_id}", DeleteObjectResponse)

    # -- jobs --------------------------------------------------------------------------------

    def process(
        self,
        object_id: str,
        operations: Iterable[str],
        priority: int | None = None,
        params: Mapping[str, Mapping[str, Any]] | None = None,
        idempotency_key: str | None = None,
        callback_url: str | None = None,
    ) -> ProcessResponse:
        """Submit ``operations`` on an object; ``callback_url``: POSTed each job, signed,
        once it has ended (a host the server allows)."""
        body: dict[str, Any] = {"object_id": object_id, "operations": list(operations)}
        if priority is not None:
            body["priority"] = priority
        if callback_url is not None:
            body["callback_url"] = callback_url
        if params:
            body["params"] = {op: dict(p) for op, p in params.items()}
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return self._request(
            "POST", f"{PREFIX}/process", ProcessResponse, json=body, headers=headers
        )

    def job(self, job_id: str) -> JobResponse:
        return self._request("GET", f"{PREFIX}/jobs/{job_id}", JobResponse)

    def attempt_log(self, job_id: str, attempt_number: int) -> str:
        """The end of what a failed attempt's child printed."""
        path = f"{PREFIX}/jobs/{job_id}/attempts/{attempt_number}/log"
        return self._request("GET", path, AttemptLogResponse).log

    def cancel(self, job_id: str) -> CancelResponse:
        return self._request("POST", f"{PREFIX}/jobs/{job_id}/cancel", CancelResponse)

    def wait(self, job_id: str, timeout: float = 300.0, poll: float = 1.0) -> JobResponse:
        """Poll until the job is completed, failed or cancelled; TimeoutError after
        ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job.finished:
                return job
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"job {job_id} is still {job.status} after {timeout:g} s")
            time.sleep(min(poll, remaining))

    # -- accounts and operators ----------------------------------------------------------------

    def credits(self) -> CreditsResponse:
        return self._request("GET", f"{PREFIX}/credits", CreditsResponse)

    def queues(self) -> QueuesResponse:
        return self._request("GET", f"{PREFIX}/queues", QueuesResponse)

    def health(self) -> HealthResponse:
        """``/healthz``; a 503 answer is returned (status ``unavailable``), not raised."""
        try:
            response = self._http.get("/healthz")
        except httpx.TransportError as exc:
            raise ServiceUnavailable(
                f"cannot reach the API at {self.base_url}: {exc}", url=self.base_url
            ) from exc
        if response.status_code not in (200, 503):
            raise error_from_response(response.status_code, _json_or_none(response))
        return HealthResponse.model_validate_json(response.content)


def _json_or_none(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _file_chunks(path: Path, chunk_size: int = 1 << 20) -> Iterable[bytes]:
    with path.open("rb") as handle:
        while chunk := handle.read(chunk_size):
            yield chunk
