"""The document and media operations end to end: uploaded over HTTP, run by pipeline
actors on a real Ray cluster in their sandbox, and their outputs stored and readable
with the content type the step declared (text with its charset)."""

from __future__ import annotations

import io

import pypdfium2 as pdfium
import pyvips

from hypermedia.ingest.client import HypermediaClient
from tests.factories import make_user
from tests.generated import Generated, documents
from tests.ray_support import ray_stack

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


def test_document_and_media_outputs_are_stored(pg_engine, settings, tmp_path, generated: Generated):
    pools = {"documents": 1, "media": 1}
    with ray_stack(settings, pg_engine, tmp_path, pools) as rs:
        person = make_user(rs.stack)
        assert rs.settings.api_url is not None
        with HypermediaClient(rs.settings.api_url, person.api_key, timeout=60) as client:
            jobs = []
            for path, operation, _type, _content_type in CASES:
                obj = client.upload(generated / path)
                jobs.append(client.process(obj.object_id, [operation]).job_ids[0])
            views = [client.wait(job_id, timeout=300) for job_id in jobs]
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
