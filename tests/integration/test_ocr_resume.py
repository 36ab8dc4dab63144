"""A long OCR job killed after some of its pages were committed resumes from them: the
retry reads only the pages not committed, and its outputs are those of an
uninterrupted run (the searchable PDF's creation date and /ID aside, which differ
between any two runs; the JSON's CPU seconds of the pages the retry read again, which
are measured). On the real ocr step with tesseract alone on tiny generated pages: a
second or so a test in process; the Ray one 20-50 s (an actor's start), as
test_transcode_resume's.

The Ray test's step is ``test.ocr_slowly`` (tests/pipelines_for_tests.py): ``ocr``
committing its pages two at a time, whose first attempt holds after the first piece
until it is killed (so the kill lands there however loaded the machine)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import ray

from hypermedia.ingest.service import SubmitRequest
from hypermedia.jobs import checkpoints as records
from pipelines import checkpoints, ocr, ocr_engines, ocr_resume, registry
from tests import support
from tests.factories import make_user, stored_object
from tests.generated import ocr_pages
from tests.integration.test_transcode_resume import REGION, _keys, _wait
from tests.ray_support import ray_stack

PAGES = 6
PARAMS = {
    "lang": "en",
    "engines": ["tesseract"],
    "layout": False,
    "min_confidence": 0.97,
    "dpi": 72,
    "max_pages": 50,
    "max_pixels": 100_000_000,
}
FIRST_PIECE = ocr_resume.piece_name(1, 2)


@pytest.fixture
def moto_s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    with support.moto_bucket(monkeypatch, "hm-ocr-resume", REGION) as settings:
        yield settings


@pytest.fixture(scope="module")
def scan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ocr-resume") / "scan.pdf"
    ocr_pages.long_scan(path, PAGES)
    return path


def _count_pages(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The widths of the pages the engines read from now on (each page once), in
    order; pieces of two pages."""
    monkeypatch.setattr(ocr_resume, "EVERY_PAGES", 2)
    read: list[int] = []
    recognise = ocr.recognise_page

    def counted(page: Any, *args: Any) -> Any:
        read.append(page.shape[1])
        return recognise(page, *args)

    monkeypatch.setattr(ocr, "recognise_page", counted)
    return read


@pytest.fixture
def read_pages(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """:func:`_count_pages` for the test."""
    return _count_pages(monkeypatch)


@dataclass(frozen=True)
class Whole:
    """The uninterrupted run of :func:`scan` (read only: a retry copies its pieces)."""

    workdir: Path
    outputs: dict[str, bytes]
    read: list[int]  # the widths of the pages it read


@pytest.fixture(scope="module")
def whole(scan: Path, tmp_path_factory: pytest.TempPathFactory) -> Whole:
    """The uninterrupted run, once for the module: every case compared with one, or
    took its pieces from one (each made the same pieces and outputs)."""
    workdir = tmp_path_factory.mktemp("whole")
    with pytest.MonkeyPatch.context() as patch:
        read = _count_pages(patch)
        outputs = _run(scan, workdir)
    return Whole(workdir, outputs, read)


def _run(scan: Path, workdir: Path, params: dict[str, Any] = PARAMS) -> dict[str, bytes]:
    outputs = ocr.ocr(scan, params, workdir)
    return {o.path.suffix: o.path.read_bytes() for o in outputs if o.path.name != "usage.json"}


def _pdf(data: bytes) -> bytes:
    data = re.sub(rb"/CreationDate \(D:\d+Z?\)", b"/CreationDate ()", data)
    return re.sub(rb"/ID \[<[0-9A-F]+><[0-9A-F]+>\]", b"/ID []", data)


def _json(data: bytes, read_from: int) -> Any:
    """The JSON, the measured CPU seconds of pages from ``read_from`` on left out."""
    document = json.loads(data)
    for page in document["pages"]:
        if page["page"] >= read_from:
            for attempt in page["attempts"]:
                attempt.pop("cpu_seconds", None)
    return document


def _assert_same(resumed: dict[str, bytes], whole: dict[str, bytes], read_from: int) -> None:
    assert resumed[".txt"] == whole[".txt"]
    assert _pdf(resumed[".pdf"]) == _pdf(whole[".pdf"])
    # The pages taken from the piece are there to the byte, CPU seconds too.
    assert _json(resumed[".json"], read_from) == _json(whole[".json"], read_from)
    if read_from > PAGES:
        assert resumed[".json"] == whole[".json"]


def _finished(workdir: Path) -> dict[str, Path]:
    """The pieces this node's OCR build wrote, by name."""
    return checkpoints.finished(workdir, ocr_engines.engines_build())


def _restore(source: Path, workdir: Path, *names: str) -> None:
    checkpoints.directory(workdir).mkdir(parents=True)
    for name in names:
        piece = _finished(source)[name]
        shutil.copy(piece, checkpoints.directory(workdir) / piece.name)


def test_the_worker_keeps_the_ocr_steps_checkpoints():
    assert registry.checkpointing("ocr")


def test_a_retry_reads_only_the_pages_not_committed(scan, whole, tmp_path, read_pages):
    assert len(whole.read) == PAGES
    # The last page's piece is never written: the outputs come next.
    assert sorted(_finished(whole.workdir)) == [
        FIRST_PIECE,
        ocr_resume.piece_name(3, 4),
    ]
    assert json.loads(whole.outputs[".json"])["pages"][0]["attempts"][0]["cpu_seconds"] > 0
    _restore(whole.workdir, tmp_path / "retry", FIRST_PIECE)
    resumed = _run(scan, tmp_path / "retry")
    assert len(read_pages) == PAGES - 2  # the pages read again: their CPU seconds are new
    _assert_same(resumed, whole.outputs, read_from=3)
    assert sorted(_finished(tmp_path / "retry")) == [
        FIRST_PIECE,
        ocr_resume.piece_name(3, 4),
    ]


def test_every_committed_page_is_taken_and_the_outputs_are_the_same_bytes(
    scan, whole, tmp_path, read_pages
):
    pieces = sorted(_finished(whole.workdir))
    _restore(whole.workdir, tmp_path / "retry", *pieces)
    resumed = _run(scan, tmp_path / "retry")
    assert len(read_pages) == 2  # pages 5 and 6
    _assert_same(resumed, whole.outputs, read_from=5)


@pytest.mark.parametrize("damage", ["truncated", "other_params", "other_document"])
def test_a_piece_not_for_this_reading_is_left_out(scan, whole, tmp_path, read_pages, damage):
    _restore(whole.workdir, tmp_path / "retry", FIRST_PIECE)
    piece = _finished(tmp_path / "retry")[FIRST_PIECE]
    params = PARAMS
    if damage == "truncated":
        piece.write_bytes(piece.read_bytes()[:-200])
    elif damage == "other_params":
        params = {**PARAMS, "min_confidence": 0.5}
    else:
        ocr_pages.long_scan(tmp_path / "longer.pdf", PAGES + 1)
        scan = tmp_path / "longer.pdf"
    _run(scan, tmp_path / "retry", params)
    assert len(read_pages) == (PAGES + 1 if damage == "other_document" else PAGES)


def test_a_piece_of_another_ocr_build_is_left_out(scan, whole, tmp_path, read_pages, monkeypatch):
    _restore(whole.workdir, tmp_path / "retry", FIRST_PIECE)
    # The retry lands on a node with another tesseract: the piece put back is not its own.
    other = ocr_engines.engines_build().replace("tesseract ", "tesseract 9.9.9-", 1)
    monkeypatch.setattr(ocr_engines, "engines_build", lambda: other)
    resumed = _run(scan, tmp_path / "retry")
    assert len(read_pages) == PAGES
    assert sorted(checkpoints.finished(tmp_path / "retry", other)) == [
        FIRST_PIECE,
        ocr_resume.piece_name(3, 4),
    ]
    _assert_same(resumed, whole.outputs, read_from=1)


def test_the_usage_counts_the_pages_taken(scan, whole, tmp_path, read_pages):
    _restore(whole.workdir, tmp_path / "retry", FIRST_PIECE)
    ocr.ocr(scan, PARAMS, tmp_path / "retry")
    usage = json.loads((tmp_path / "retry" / "usage.json").read_text())
    assert usage == {
        "page": PAGES,
        "ocr_page": PAGES,
        "engine_pass": PAGES,
        "escalation": 0,
        "pages_resumed": 2,
    }


# -- on Ray: the child's kill -9 -----------------------------------------------------------


def test_kill_9_of_the_child_resumes_from_the_committed_pages(
    pg_engine, settings, tmp_path, moto_s3, scan, whole
):
    with ray_stack(
        settings, pg_engine, tmp_path, {"ocr": 1}, backoff_base_seconds=0.2, **moto_s3
    ) as rs:
        person = make_user(rs.stack)
        object_id = stored_object(rs.stack, person, scan.read_bytes())
        hold = {"hold_after": FIRST_PIECE, "hold_seconds": 600}
        job_id = rs.stack.ingest.submit(
            person.caller,
            SubmitRequest(
                object_id=object_id,
                operations=["test.ocr_slowly"],
                params={"test.ocr_slowly": hold},
            ),
        ).job_ids[0]
        (member,) = rs.supervisor.actors("ocr")
        rs.wait_for(
            lambda: records.count(rs.stack.engine, job_id) >= 1, timeout=120, what="a piece"
        )
        (key,) = _keys(rs.stack, job_id)
        assert key.startswith(f"checkpoints/{job_id}/1/") and key.endswith(f"-{FIRST_PIECE}")
        os.kill(ray.get(member.actor.child_pids.remote())[job_id], signal.SIGKILL)
        rs.wait_for(
            lambda: rs.stack.ingest.get_job(person.caller, job_id).status == "completed",
            timeout=120,
            what="the retry",
        )
        view = rs.stack.ingest.get_job(person.caller, job_id)
        assert [(a.status, a.error_code) for a in view.attempts] == [
            ("failed", "child_killed"),
            ("completed", None),
        ]
        # The retry took pages 1 and 2 and read the four others.
        assert view.attempts[-1].units == {
            "page": PAGES,
            "ocr_page": PAGES,
            "engine_pass": PAGES,
            "escalation": 0,
            "pages_resumed": 2,
        }
        received = {
            Path(o.output_type).suffix: b"".join(rs.stack.storage.read(o.storage_key))
            for o in view.outputs
        }
        # Every page's CPU seconds were measured apart from the run in process.
        _assert_same(received, whole.outputs, read_from=1)
        _wait(lambda: not _keys(rs.stack, job_id), "checkpoints swept", timeout=30)
        assert not rs.stack.storage.exists(key)
