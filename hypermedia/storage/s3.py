"""Storage in an S3 bucket (AWS, or any S3-compatible store via ``endpoint_url``).

boto3 is imported only when a client is built, so importing this module (and
the core) stays cheap. botocore errors are translated here: a missing key is
:class:`~hypermedia.errors.NotFound`; connection failures and anything S3
refuses are :class:`~hypermedia.storage.base.StorageUnavailable`; missing AWS
credentials are a :class:`~hypermedia.errors.ConfigError`. The credentials are looked
up when the client is built, so a head with none to be had (none configured, or an
instance role / container endpoint that does not answer) refuses to start, naming
them, instead of answering every storage request with an error; credentials that
cannot be refreshed later make requests :class:`StorageUnavailable` (503).

``put`` buffers one part (``part_size``, 8 MiB by default) at a time: an object
smaller than a part is one ``PutObject``, a larger one a multipart upload that is
completed only once every byte arrived (S3 makes both visible atomically) and
aborted on any failure, including the ``max_bytes`` refusal, so nothing is left
behind. ``set_content_type`` copies the object onto itself with the new type (one
``CopyObject`` up to ``copy_part_size``, 5 GiB, S3's largest; a multipart copy of
parts that size above). Presigned URLs are SigV4 (``generate_presigned_url``), path-style when
an ``endpoint_url`` is given.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from hypermedia import aws_sdk
from hypermedia.errors import ConfigError, HypermediaError, NotFound
from hypermedia.storage.base import (
    DEFAULT_CONTENT_TYPE,
    StorageUnavailable,
    StoredBlob,
    check_content_type,
    check_disposition,
    check_key,
    check_range,
    check_ttl,
    too_large,
)

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef

MIN_PART_SIZE = 5 * 1024 * 1024  # S3's minimum for every part but the last
MAX_COPY_BYTES = 5 * 1024**3  # S3's largest CopyObject, and largest part
_MISSING = frozenset({"NoSuchKey", "404", "NotFound"})
_CREDENTIALS = "AWS credentials"
_NONE_FOUND = (
    "the S3 backend found none (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, "
    "a profile or an instance role)"
)


def make_client(endpoint_url: str | None = None, region: str | None = None) -> S3Client:
    """An S3 client with credentials from the usual AWS chain (environment, profile,
    instance role); ConfigError when that chain has none, or cannot fetch them."""
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError

    options: dict[str, Any] = {
        "signature_version": "s3v4",
        "retries": {"mode": "standard", "max_attempts": 3},
        "connect_timeout": 10,
        "read_timeout": 60,
    }
    if endpoint_url:
        # S3-compatible stores want path-style addressing and often refuse the
        # default CRC checksums newer botocore adds to every upload.
        options["s3"] = {"addressing_style": "path"}
        options["request_checksum_calculation"] = "when_required"
        options["response_checksum_validation"] = "when_required"
    session = aws_sdk.session()
    try:
        # Fetched (and kept by the session for its client) now: botocore would
        # otherwise raise this from the client's constructor untranslated, or, finding
        # none, build a client that fails every request.
        found = session.get_credentials()
    except BotoCoreError as exc:
        raise ConfigError(_CREDENTIALS, f"the S3 backend could not fetch them: {exc}") from exc
    if found is None:
        raise ConfigError(_CREDENTIALS, _NONE_FOUND)
    return session.client(
        "s3", endpoint_url=endpoint_url, region_name=region, config=Config(**options)
    )


class S3Storage:
    def __init__(
        self,
        bucket: str,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        prefix: str = "",
        client: S3Client | None = None,
        part_size: int = 8 * 1024 * 1024,
        copy_part_size: int = MAX_COPY_BYTES,
    ) -> None:
        if part_size < MIN_PART_SIZE:
            raise ValueError(f"part_size must be at least {MIN_PART_SIZE} bytes")
        if not MIN_PART_SIZE <= copy_part_size <= MAX_COPY_BYTES:
            raise ValueError(f"copy_part_size must be {MIN_PART_SIZE} to {MAX_COPY_BYTES} bytes")
        self.bucket = bucket
        self.prefix = f"{check_key(prefix.strip('/'))}/" if prefix.strip("/") else ""
        self.part_size = part_size
        self.copy_part_size = copy_part_size
        self.client: S3Client = client or make_client(endpoint_url, region)

    def name(self, key: str) -> str:
        """The S3 object name of ``key`` (the prefix and the key)."""
        return self.prefix + check_key(key)

    def put(
        self,
        key: str,
        chunks: Iterable[bytes],
        max_bytes: int | None = None,
        content_type: str | None = None,
    ) -> StoredBlob:
        name = self.name(key)
        # Stored with the object for whoever reads the bucket itself (a web tier, a
        # CDN): S3's own default, binary/octet-stream, is no type anything else says.
        stored_type = check_content_type(content_type) or DEFAULT_CONTENT_TYPE
        digest = hashlib.sha256()
        size = 0
        buffer = bytearray()
        upload_id: str | None = None
        parts: list[CompletedPartTypeDef] = []
        try:
            for chunk in chunks:
                size += len(chunk)
                if max_bytes is not None and size > max_bytes:
                    raise too_large(max_bytes)
                digest.update(chunk)
                buffer += chunk
                while len(buffer) >= self.part_size:
                    if upload_id is None:
                        upload_id = self._start_multipart(key, name, stored_type)
                    parts.append(self._upload_part(key, name, upload_id, len(parts) + 1, buffer))
            if upload_id is None:
                with self._translated(key):
                    self.client.put_object(
                        Bucket=self.bucket, Key=name, Body=bytes(buffer), ContentType=stored_type
                    )
            else:
                if buffer:
                    parts.append(self._upload_part(key, name, upload_id, len(parts) + 1, buffer))
                self._complete_multipart(key, name, upload_id, parts)
        except BaseException:
            if upload_id is not None:
                self._abort_multipart(name, upload_id)
            raise
        return StoredBlob(key=key, size_bytes=size, sha256=digest.hexdigest())

    def set_content_type(self, key: str, content_type: str | None) -> None:
        name = self.name(key)
        stored_type = check_content_type(content_type) or DEFAULT_CONTENT_TYPE
        with self._translated(key):
            head = self.client.head_object(Bucket=self.bucket, Key=name)
        if head.get("ContentType") == stored_type:
            return
        size = head["ContentLength"]
        if size > self.copy_part_size:
            self._copy_in_parts(key, name, size, stored_type)
            return
        with self._translated(key):
            self.client.copy_object(
                Bucket=self.bucket,
                Key=name,
                CopySource={"Bucket": self.bucket, "Key": name},
                ContentType=stored_type,
                MetadataDirective="REPLACE",
            )

    def _copy_in_parts(self, key: str, name: str, size: int, content_type: str) -> None:
        """``name`` onto itself as ``content_type`` by a multipart copy: visible only
        once complete (the old object's bytes are the same), aborted on any failure."""
        upload_id = self._start_multipart(key, name, content_type)
        parts: list[CompletedPartTypeDef] = []
        try:
            for number, start in enumerate(range(0, size, self.copy_part_size), start=1):
                end = min(start + self.copy_part_size, size) - 1
                with self._translated(key):
                    answer = self.client.upload_part_copy(
                        Bucket=self.bucket,
                        Key=name,
                        UploadId=upload_id,
                        PartNumber=number,
                        CopySource={"Bucket": self.bucket, "Key": name},
                        CopySourceRange=f"bytes={start}-{end}",
                    )
                parts.append({"ETag": answer["CopyPartResult"]["ETag"], "PartNumber": number})
            self._complete_multipart(key, name, upload_id, parts)
        except BaseException:
            self._abort_multipart(name, upload_id)
            raise

    def _complete_multipart(
        self, key: str, name: str, upload_id: str, parts: list[CompletedPartTypeDef]
    ) -> None:
        with self._translated(key):
            self.client.complete_multipart_upload(
                Bucket=self.bucket,
                Key=name,
                UploadId=upload_id,
                MultipartUpload={"Parts": parts},
            )

    def _abort_multipart(self, name: str, upload_id: str) -> None:
        with contextlib.suppress(Exception):
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=name, UploadId=upload_id)

    def _start_multipart(self, key: str, name: str, content_type: str) -> str:
        with self._translated(key):
            started = self.client.create_multipart_upload(
                Bucket=self.bucket, Key=name, ContentType=content_type
            )
            return started["UploadId"]

    def _upload_part(
        self, key: str, name: str, upload_id: str, number: int, buffer: bytearray
    ) -> CompletedPartTypeDef:
        """Upload (and drop from ``buffer``) the next part: a full part, or the rest."""
        body = bytes(buffer[: self.part_size])
        del buffer[: self.part_size]
        with self._translated(key):
            answer = self.client.upload_part(
                Bucket=self.bucket, Key=name, UploadId=upload_id, PartNumber=number, Body=body
            )
        return {"ETag": answer["ETag"], "PartNumber": number}

    def read(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        name = self.name(key)
        with self._translated(key):
            body = self.client.get_object(Bucket=self.bucket, Key=name)["Body"]
        try:
            chunks = body.iter_chunks(chunk_size)
            while True:
                with self._translated(key):
                    chunk = next(chunks, None)
                if chunk is None:
                    return
                yield chunk
        finally:
            body.close()

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        check_range(offset, length)
        if length == 0:
            self.size(key)  # NotFound for a missing key, as every backend
            return b""
        name = self.name(key)
        with self._translated(key):
            try:
                answer = self.client.get_object(
                    Bucket=self.bucket, Key=name, Range=f"bytes={offset}-{offset + length - 1}"
                )
            except Exception as exc:
                # A range starting past the end is 416 InvalidRange: no bytes there.
                if getattr(exc, "response", {}).get("Error", {}).get("Code") == "InvalidRange":
                    return b""
                raise
            body = answer["Body"]
            try:
                return bytes(body.read())
            finally:
                body.close()

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
        except NotFound:
            return False
        return True

    def size(self, key: str) -> int:
        name = self.name(key)
        with self._translated(key):
            return self.client.head_object(Bucket=self.bucket, Key=name)["ContentLength"]

    def delete(self, key: str) -> None:
        name = self.name(key)
        with self._translated(key):
            self.client.delete_object(Bucket=self.bucket, Key=name)

    def presign_get(
        self,
        key: str,
        ttl_seconds: int,
        content_type: str | None = None,
        disposition: str | None = None,
    ) -> str:
        name = self.name(key)
        check_ttl(ttl_seconds)
        params: dict[str, str] = {"Bucket": self.bucket, "Key": name}
        if disposition is not None:
            params["ResponseContentDisposition"] = check_disposition(disposition) or ""
        if content_type is not None:
            check_content_type(content_type)
            # response-content-type: S3 answers it in place of the type stored with the
            # object (without one: the put's, application/octet-stream unless it said).
            params["ResponseContentType"] = content_type
        with self._translated(key):
            return self.client.generate_presigned_url(
                "get_object", Params=params, ExpiresIn=ttl_seconds, HttpMethod="GET"
            )

    def presign_put(self, key: str, ttl_seconds: int, content_type: str | None = None) -> str:
        name = self.name(key)
        check_ttl(ttl_seconds)
        params: dict[str, str] = {"Bucket": self.bucket, "Key": name}
        check_content_type(content_type)
        if content_type is not None:
            params["ContentType"] = content_type  # signed: the uploader must send it
        with self._translated(key):
            return self.client.generate_presigned_url(
                "put_object", Params=params, ExpiresIn=ttl_seconds, HttpMethod="PUT"
            )

    def check(self) -> None:
        try:
            with self._translated(self.bucket):
                self.client.head_bucket(Bucket=self.bucket)
        except NotFound:  # HeadBucket's 404 has no NoSuchBucket code to tell it
            raise StorageUnavailable(
                f"S3 bucket {self.bucket!r} does not exist", bucket=self.bucket
            ) from None

    @contextlib.contextmanager
    def _translated(self, key: str) -> Iterator[None]:
        try:
            yield
        except HypermediaError:
            raise
        except Exception as exc:
            error = self._translate(exc, key)
            if error is None:
                raise
            raise error from exc

    def _translate(self, exc: Exception, key: str) -> HypermediaError | None:
        from botocore import exceptions as boto

        if isinstance(exc, boto.ClientError):
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in _MISSING:
                return NotFound(f"no stored object at {key!r}", key=key)
            if code == "NoSuchBucket":
                return StorageUnavailable(
                    f"S3 bucket {self.bucket!r} does not exist", bucket=self.bucket
                )
            return StorageUnavailable(
                f"S3 refused the request for {key!r}: {code} ({status})",
                key=key,
                s3_code=code,
                http_status=status,
            )
        if isinstance(exc, boto.NoCredentialsError | boto.PartialCredentialsError):
            return ConfigError(_CREDENTIALS, _NONE_FOUND)
        if isinstance(exc, boto.BotoCoreError):
            return StorageUnavailable(f"S3 unreachable: {exc}", bucket=self.bucket)
        return None
