"""The document and media operations end to end: uploaded over HTTP, run by pipeline
actors on a real Ray cluster in their sandbox, and their outputs stored and readable
with the content type the step declared (text with its charset). A transcode's
progress is watched live from another process (``hypermedia watch``, over the API's
event stream), and read again afterwards as its recent events."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import pypdfium2 as pdfium
import pyvips

from hypermedia.ingest.client import HypermediaClient
from tests.factories import make_user
from tests.generated import Generated, documents
from tests.generated.media import H264, ffmpeg, tone_source, video_source
from tests.ray_support import REPO, ray_stack

CLIP_SECONDS = 8

WORD = "documents/report.docx"
PDF = "documents/pages-4.pdf"
MP3 = "media/tone.mp3"
CASES = [
    # file, operation, output type, content type
    (WORD, "docx_to_pdf", "document.pdf", "application/pdf"),
    (WORD, "extract_text", "text.txt", "text/plain; charset=utf-8"),
    (PDF, "extract_text", "text.txt", "text/plain; charset=utf-8"),
    (PDF, "pdf_preview", "preview-p1-w1024-q85.jpg", "image/jpeg"),
    (MP3, "transcode_audio", "audio-aac-128k.m4a", "audio/mp4"),
]


def _watching(url: str, key: str, job_id: str) -> tuple[subprocess.Popen[str], list[Any]]:
    """``hypermedia watch --json JOB`` in its own process; each line it prints, with
    when it arrived here."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERMEDIA_")}
    env.update(HYPERMEDIA_API_URL=url, HYPERMEDIA_API_KEY=key, PYTHONPATH=str(REPO))
    process = subprocess.Popen(
        [sys.executable, "-m", "hypermedia.cli", "watch", "--json", job_id],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[Any] = []

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append((time.time(), json.loads(line)))

    threading.Thread(target=read, daemon=True).start()
    return process, lines


def test_document_and_media_outputs_are_stored(pg_engine, settings, tmp_path, generated: Generated):
    clip = tmp_path / "clip.mp4"
    seconds = str(CLIP_SECONDS)
    ffmpeg(*video_source(CLIP_SECONDS), *tone_source(CLIP_SECONDS), *H264, "-t", seconds, str(clip))
    pools = {"documents": 1, "media": 1}
    with ray_stack(settings, pg_engine, tmp_path, pools) as rs:
        person = make_user(rs.stack)
        assert rs.settings.api_url is not None
        with HypermediaClient(rs.settings.api_url, person.api_key, timeout=60) as client:
            video = client.upload(clip)
            video_job = client.process(video.object_id, ["transcode_video"]).job_ids[0]
            watcher, watched = _watching(rs.settings.api_url, person.api_key, video_job)
            jobs = []
            for path, operation, _type, _content_type in CASES:
                obj = client.upload(generated / path)
                jobs.append(client.process(obj.object_id, [operation]).job_ids[0])
            views = [client.wait(job_id, timeout=300) for job_id in jobs]
            transcoded = client.wait(video_job, timeout=300)
            assert watcher.wait(60) == 0, watcher.stderr.read() if watcher.stderr else ""
            late = list(client.events(video_job, timeout=30))
        _check_watched(transcoded, watched, late)
        stored = {}
        for (path, operation, output_type, content_type), view in zip(CASES, views, strict=True):
            assert view.status == "completed", (
                path,
                operation,
                view.error_code,
                view.error_message,
            )
            (output,) = view.outputs
            assert (output.output_type, output.content_type) == (output_type, content_type)
            body = b"".join(rs.stack.storage.read(output.storage_key))
            assert len(body) == output.size_bytes > 0
            stored[(path, operation)] = body

    pdf = pdfium.PdfDocument(io.BytesIO(stored[(WORD, "docx_to_pdf")]))
    assert len(pdf) >= 1 and documents.TITLE in pdf[0].get_textpage().get_text_range()
    assert documents.TITLE in stored[(WORD, "extract_text")].decode("utf-8")
    page_4 = documents.PAGE_WORDS.format(n=4)
    assert page_4 in stored[(PDF, "extract_text")].decode("utf-8")
    preview = pyvips.Image.new_from_buffer(stored[(PDF, "pdf_preview")], "")
    assert preview.width == 1024
    audio = stored[(MP3, "transcode_audio")]
    assert audio[4:8] == b"ftyp"


def _check_watched(job: Any, watched: list[Any], late: list[Any]) -> None:
    """The watcher saw the transcode's progress while it ran, in order, then its end;
    a subscriber after the end reads the same recent events."""
    assert job.status == "completed", (job.error_code, job.error_message)
    events = [event for _, event in watched]
    assert {e["job_id"] for e in events} == {job.job_id}
    run = [(at, e) for at, e in watched if e["type"] == "progress" and e["phase"] == "run"]
    # A download that showed its progress is followed by the run's start, of no measure
    # (watch --json leaves out its null total and fraction); the step's own come after.
    if run and "total" not in run[0][1]:
        assert run[0][1]["done"] == 0, run[0]
        run = run[1:]
    assert all("total" in e for _, e in run), run
    # FFmpeg reports every quarter second: a quiet machine transcodes the clip in well
    # under a second, so one report part-way and the last are what it is sure to see.
    assert len(run) >= 2, events
    fractions = [e["fraction"] for _, e in run]
    assert fractions == sorted(fractions) and fractions[0] < 1.0 and fractions[-1] == 1.0
    assert {(e["unit"], e["total"]) for _, e in run} == {("seconds", CLIP_SECONDS)}
    # Live: the first of them reached the other process well before the job ended.
    assert run[0][0] < job.completed_at.timestamp() - 0.5, (run[0][0], job.completed_at)
    statuses = [e["status"] for e in events if e["type"] == "status"]
    assert statuses[-1] == "completed" and "processing" in statuses
    assert [(e.type, e.phase, e.done) for e in late if e.type == "progress"] == [
        (e["type"], e["phase"], e["done"]) for e in events if e["type"] == "progress"
    ]
    assert late[-1].status == "completed"
