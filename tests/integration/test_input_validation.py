"""Every generated file (tests/generated), and every file of the shared corpus (the corpus
tier), of hostile/, documents/, images/ and media/ through the HTTP API on PostgreSQL:
upload, then submit an operation, and the MANIFEST's ``expected`` holds where its
verdict belongs at ingest.

The operation is the one that fits the file's *detected* kind (thumbnail for images,
pdf_preview for PDFs, docx_to_pdf for word processing, extract_text for sheets and
slides, transcode_* for media, regenerate otherwise), except for the ``type-mismatch``
rows, which get the operation their *name* claims: that is the mistake they exist to
catch. A refused submit must leave nothing behind: no job, no queue entry, no reserved
credit. Files whose verdict belongs to the decoders (truncated, malformed, decompression
bombs inside a valid container ...) must get through ingest cleanly: accepted, or refused
with a stable code, never a 500. A table of file -> expected -> outcome is printed.

Another runs the interesting rows on S3 storage (moto's server), where inspection
reads through ranged GETs, and checks that it reads a bounded part of a large object.
"""

from __future__ import annotations

import io
import uuid
import zipfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from fastapi.testclient import TestClient
from moto.server import ThreadedMotoServer
from rich.console import Console
from rich.table import Table
from sqlalchemy import func, select

from hypermedia.accounts import Caller, balance
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.errors import InputTypeMismatch
from hypermedia.ingest.api import create_app
from hypermedia.ingest.service import SubmitRequest
from hypermedia.ingest.uploads import inspect_stored
from hypermedia.stack import Stack
from hypermedia.storage.base import original_key
from hypermedia.storage.s3 import S3Storage
from tests.api_support import add_user, bearer
from tests.corpus_support import (
    ACCEPTED,
    Row,
    allowed,
    corpus,
    manifest_rows,
    operation_for,
)
from tests.generated import Generated

P = "/v1/hypermedia"


@dataclass
class Outcome:
    row: Row
    detected: str
    content_type: str | None
    operation: str
    status: int
    code: str
    message: str
    estimate: int = 0

    @property
    def accepted(self) -> bool:
        return self.code == ACCEPTED


@pytest.fixture
def stack(pg_engine, settings) -> Iterator[Stack]:
    # One user uploads the whole corpus: no upload rate to wait for.
    opened = Stack.open(
        settings(user_uploads_per_minute=10**6), engine=pg_engine, auto_migrate=True
    )
    yield opened
    opened.close()


def run_row(api: TestClient, key: dict[str, str], root: Path, row: Row) -> Outcome:
    data = (root / row.path).read_bytes()
    # The claimed type is a lie on purpose: what is stored is what was detected.
    uploaded = api.put(
        f"{P}/objects",
        params={"filename": Path(row.path).name},
        content=data,
        headers={**key, "Content-Type": "image/png"},
    )
    assert uploaded.status_code == 201, (row.path, uploaded.text)
    obj = uploaded.json()
    detected = obj["detected_kind"]
    operation = operation_for(row, detected)
    submitted = api.post(
        f"{P}/process", json={"object_id": obj["object_id"], "operations": [operation]}, headers=key
    )
    body = submitted.json()
    if submitted.status_code == 202:
        return Outcome(
            row,
            detected,
            obj["content_type"],
            operation,
            202,
            ACCEPTED,
            "",
            round(body["estimated_credits"] * 1000),
        )
    error = body["error"]
    refusal = obj["refusal"]
    if refusal is not None and error["code"] not in ("input_type_mismatch", "unsupported_format"):
        # What the upload said every operation would get is what the submit got.
        assert refusal["code"] == error["code"], (row.path, refusal, error)
    return Outcome(
        row,
        detected,
        obj["content_type"],
        operation,
        submitted.status_code,
        error["code"],
        error["message"],
    )


def test_every_generated_file_through_upload_and_submit(stack, generated: Generated):
    through_upload_and_submit(stack, generated.root, generated.rows())


@pytest.mark.corpus
def test_every_corpus_file_through_upload_and_submit(stack):
    rows = manifest_rows()
    assert len(rows) >= 250
    through_upload_and_submit(stack, corpus(), rows)


def through_upload_and_submit(stack: Stack, root: Path, rows: list[Row]) -> None:
    user = add_user(stack, "validator", credits=1_000_000)
    key = bearer(user)
    with TestClient(create_app(stack, auth_cache_seconds=60)) as api:
        outcomes = [run_row(api, key, root, row) for row in rows]

    table = Table("file", "expected", "detected", "operation", "outcome", "where")
    problems = []
    for o in outcomes:
        want = allowed(o.row)
        where = "ingest" if not o.accepted else ("worker" if o.row.expected != "valid" else "-")
        if o.status >= 500 or (not o.accepted and o.status != 422 and o.code != "input_too_large"):
            problems.append(f"{o.row.path}: HTTP {o.status} {o.code}: {o.message}")
        elif want is not None and o.code not in want:
            problems.append(f"{o.row.path}: {o.code} ({o.message}), expected one of {sorted(want)}")
        outcome = o.code if o.accepted else f"{o.code}: {o.message}"
        table.add_row(
            o.row.path,
            o.row.expected,
            f"{o.detected} {o.content_type}",
            o.operation,
            outcome[:80],
            where,
        )
    Console(width=250).print(table)
    print(Counter(o.code for o in outcomes))
    assert problems == []

    # The stored type is the detected one, whatever the Content-Type claimed.
    pdfs = [o for o in outcomes if o.detected == "pdf"]
    assert pdfs and all(o.content_type == "application/pdf" for o in pdfs)

    # Refused submits left nothing: jobs, queue entries and reservations are the accepted ones.
    accepted = [o for o in outcomes if o.accepted]
    with transaction(stack.engine) as conn:
        jobs = conn.execute(select(func.count()).select_from(t.jobs)).scalar_one()
        submissions = conn.execute(select(func.count()).select_from(t.submissions)).scalar_one()
        reserved = balance(conn, user.user_id).reserved_millicredits
    assert jobs == submissions == len(accepted)
    assert reserved == sum(o.estimate for o in accepted)
    queued = sum(stack.queue.counts(q).ready for q in stack.queue.queues)
    assert queued == len(accepted)
    refused = {o.code for o in outcomes if not o.accepted}
    assert {"macro_document", "encrypted_document", "zip_bomb", "path_traversal"} <= refused
    assert {"pixel_limit", "input_type_mismatch", "unsupported_format", "unsafe_xml"} <= refused


def test_registration_is_inspected_and_one_refusal_creates_nothing(stack, generated: Generated):
    user = add_user(stack, "web-tier", credits=100)
    key = bearer(user)
    stored = original_key(user.pool_id, "web-tier-macro")
    data = generated.read("hostile/macros.docm")
    stack.storage.put(stored, [data])
    body = {
        "storage_key": stored,
        "filename": "report.pdf",
        "size_bytes": len(data),
        "content_type": "application/pdf",  # claimed; ignored
    }
    with TestClient(create_app(stack, auth_cache_seconds=60)) as api:
        registered = api.post(f"{P}/objects/register", json=body, headers=key)
        assert registered.status_code == 201, registered.text
        obj = registered.json()
        assert obj["content_type"] == "application/vnd.ms-word.document.macroEnabled.12"
        assert obj["detected_kind"] == "ooxml-word"
        assert obj["refusal"]["code"] == "macro_document"
        assert api.get(f"{P}/objects/{obj['object_id']}", headers=key).json() == obj

        refused = api.post(
            f"{P}/process",
            json={"object_id": obj["object_id"], "operations": ["docx_to_pdf"]},
            headers=key,
        )
        assert refused.status_code == 422
        error = refused.json()["error"]
        assert error["code"] == "macro_document" and "vbaProject.bin" in error["message"]
        assert error["details"]["object_id"] == obj["object_id"]

        image = api.put(
            f"{P}/objects",
            params={"filename": "a.png"},
            content=generated.read("images/drawing.png"),
            headers=key,
        ).json()
        assert image["content_type"] == "image/png" and image["refusal"] is None
        # One operation that does not fit refuses the whole submit.
        mixed = api.post(
            f"{P}/process",
            json={"object_id": image["object_id"], "operations": ["thumbnail", "pdf_preview"]},
            headers=key,
        )
        assert mixed.status_code == 422
        assert mixed.json()["error"]["code"] == "input_type_mismatch"

    # ... and so does one request of a batch (the library's submit_many).
    caller = Caller(user.user_id)
    with pytest.raises(InputTypeMismatch):
        stack.ingest.submit_many(
            caller,
            [
                SubmitRequest(object_id=image["object_id"], operations=["thumbnail"]),
                SubmitRequest(object_id=image["object_id"], operations=["transcode_video"]),
            ],
        )
    with transaction(stack.engine) as conn:
        assert conn.execute(select(func.count()).select_from(t.jobs)).scalar_one() == 0
        assert balance(conn, user.user_id).reserved_millicredits == 0
    assert all(stack.queue.counts(q).ready == 0 for q in stack.queue.queues)


# -- S3: the same verdicts through ranged reads, and bounded ones ------------------------------

S3_ROWS = [
    "hostile/zipbomb.docx",
    "hostile/zipslip.docx",
    "hostile/macros.docm",
    "hostile/encrypted-entry.docx",
    "hostile/encrypted.odt",
    "hostile/encrypted.pdf",
    "hostile/png-50000x50000-header.png",
    "hostile/polyglot-jpeg-zip.jpg",
    "hostile/pdf-named.jpg",
    "documents/owner-protected.pdf",
    "documents/budget.xls",
    "images/animated.gif",
    "media/clip.mkv",
]
CORPUS_S3_ROWS = [
    "hostile/derived-zipbomb.docx",
    "hostile/derived-zipslip.docx",
    "hostile/tika-testWORD_macros.docm",
    "hostile/tika-testWORD_macros.doc",
    "hostile/tika-testWORD_protected_passtika.docx",
    "hostile/tika-testODTEncrypted.odt",
    "hostile/pdfminer-aes-256-r6.pdf",
    "hostile/derived-png-50000x50000-header.png",
    "hostile/derived-polyglot-jpeg-docx.jpg",
    "hostile/derived-pdf-named.jpg",
    "documents/pdfjs-empty_protected.pdf",
    "documents/tika-testEXCEL.xls",
    "images/pillow-iss634.gif",
    "media/tika-testMKV.mkv",
]
REGION = "us-east-1"


@pytest.fixture
def s3_storage(monkeypatch) -> Iterator[tuple[S3Storage, dict[str, Any]]]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "hypermedia-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hypermedia-test-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    bucket = f"hm-inspect-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=endpoint, region_name=REGION).create_bucket(Bucket=bucket)
    options = {
        "storage_backend": "s3",
        "s3_bucket": bucket,
        "s3_endpoint_url": endpoint,
        "s3_region": REGION,
    }
    yield S3Storage(bucket, endpoint_url=endpoint, region=REGION), options
    server.stop()


def test_on_s3_the_verdicts_are_the_same_and_reads_are_bounded(
    pg_engine, settings, s3_storage, generated: Generated
):
    rows = {r.path: r for r in generated.rows()}
    same_verdicts_on_s3(pg_engine, settings, s3_storage, generated.root, [rows[p] for p in S3_ROWS])
    # A 40 MB object: inspection reads its header, directory or ends, not the whole.
    storage, _options = s3_storage
    padding = b"\x00" * (40 * 1024 * 1024)
    cases = {
        "originals/p/big.png": generated.read("images/drawing.png") + padding,
        "originals/p/big.pdf": generated.read("documents/pages-4.pdf") + padding,
        "originals/p/big.docx": _docx_with_a_big_stored_part(
            generated / "documents/report.docx", padding
        ),
    }
    for key, data in cases.items():
        storage.put(key, [data])
        counted = _CountingStorage(storage)
        inspection = inspect_stored(counted, key, len(data))  # type: ignore[arg-type]
        assert inspection.kind in ("image", "pdf", "ooxml-word"), (key, inspection)
        assert counted.bytes_read <= 10 * 1024 * 1024, (key, counted.bytes_read)
        assert counted.calls < 200, (key, counted.calls)


@pytest.mark.corpus
def test_on_s3_the_corpus_verdicts_are_the_same(pg_engine, settings, s3_storage):
    rows = {r.path: r for r in manifest_rows()}
    same_verdicts_on_s3(
        pg_engine, settings, s3_storage, corpus(), [rows[p] for p in CORPUS_S3_ROWS]
    )


def same_verdicts_on_s3(pg_engine, settings, s3_storage, root: Path, rows: list[Row]) -> None:
    """``rows`` uploaded to a stack on S3 and submitted: their verdicts are the allowed ones."""
    _storage, options = s3_storage
    opened = Stack.open(
        settings(**options, user_uploads_per_minute=10**6), engine=pg_engine, auto_migrate=True
    )
    try:
        user = add_user(opened, "s3-validator", credits=1_000)
        with TestClient(create_app(opened)) as api:
            on_s3 = {row.path: (row, run_row(api, bearer(user), root, row)) for row in rows}
    finally:
        opened.close()
    for path, (row, outcome) in on_s3.items():
        want = allowed(row)
        assert want is None or outcome.code in want, (path, outcome.code, outcome.message)


def _docx_with_a_big_stored_part(docx: Path, blob: bytes) -> bytes:
    source = zipfile.ZipFile(docx)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for info in source.infolist():
            archive.writestr(info, source.read(info))
        archive.writestr("word/media/big.bin", blob, compress_type=zipfile.ZIP_STORED)
    return buffer.getvalue()


class _CountingStorage:
    def __init__(self, storage: S3Storage) -> None:
        self.storage = storage
        self.bytes_read = 0
        self.calls = 0

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        data = self.storage.read_range(key, offset, length)
        self.calls += 1
        self.bytes_read += len(data)
        return data
