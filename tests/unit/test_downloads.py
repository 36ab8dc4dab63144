"""What a browser saves an output as (hypermedia.ingest.downloads)."""

from __future__ import annotations

import re

import pytest

from hypermedia.ingest.downloads import MAX_STEM, content_disposition, download_name
from hypermedia.storage.base import check_disposition


@pytest.mark.parametrize(
    ("filename", "output_type", "expected"),
    [
        ("report.docx", "document.pdf", "report.pdf"),
        ("report.docx", "text.txt", "report.txt"),
        ("photo.JPG", "convert.png", "photo.png"),
        ("photo.jpg", "compress.jpg", "photo-compress.jpg"),  # never the original's name
        ("photo.jpg", "thumbnail-320x320.webp", "photo-thumbnail-320x320.webp"),
        ("clip.mov", "video-h264-720p-crf23.mp4", "clip-video-h264-720p-crf23.mp4"),
        ("talk.wav", "audio-opus-96k.ogg", "talk-audio-opus-96k.ogg"),
        ("scan.pdf", "ocr-en-tesseract-c50-d300.txt", "scan-ocr-en-tesseract-c50-d300.txt"),
        ("scan.pdf", "preview-p1-w512.png", "scan-preview-p1-w512.png"),
        ("archive.tar.gz", "document.pdf", "archive.tar.pdf"),
        ("README", "document.pdf", "README.pdf"),
        (".bashrc", "text.txt", "bashrc.txt"),
        ("...", "document.pdf", "download.pdf"),
        ("  .pdf", "thumbnail-64x64.webp", "pdf-thumbnail-64x64.webp"),
        ("تقرير.docx", "document.pdf", "تقرير.pdf"),
        ("x" * 300 + ".png", "convert.webp", "x" * MAX_STEM + ".webp"),
    ],
)
def test_an_output_is_named_after_the_upload(filename, output_type, expected):
    assert download_name(filename, output_type) == expected


@pytest.mark.parametrize(
    ("content_type", "kind"),
    [
        ("image/webp", "inline"),
        ("video/mp4", "inline"),
        ("audio/ogg", "inline"),
        ("application/pdf", "inline"),
        ("image/svg+xml", "attachment"),  # S3 would serve it unsandboxed
        ("text/html", "attachment"),
        ("text/plain; charset=utf-8", "attachment"),
        ("application/json", "attachment"),
        (None, "attachment"),
    ],
)
def test_what_a_browser_shows_is_inline_the_rest_an_attachment(content_type, kind):
    value = content_disposition("a.bin", content_type)
    assert value == f"{kind}; filename=\"a.bin\"; filename*=UTF-8''a.bin"


@pytest.mark.parametrize(
    ("name", "fallback", "encoded"),
    [
        ('a"b.pdf', "a_b.pdf", "a%22b.pdf"),
        ("a\\b.pdf", "a_b.pdf", "a%5Cb.pdf"),
        ("a\r\nSet-Cookie: x=1.pdf", "a_Set-Cookie_ x_1.pdf", "a%0D%0ASet-Cookie%3A%20x%3D1.pdf"),
        ("a;b=c.pdf", "a_b_c.pdf", "a%3Bb%3Dc.pdf"),
        ("50%.pdf", "50_.pdf", "50%25.pdf"),
        ("Café crème.pdf", "Cafe creme.pdf", "Caf%C3%A9%20cr%C3%A8me.pdf"),
        ("تقرير.pdf", "download.pdf", "%D8%AA%D9%82%D8%B1%D9%8A%D8%B1.pdf"),
        ("image\u202egpj.exe", "image_gpj.exe", "image%E2%80%AEgpj.exe"),
        ("a/../b.pdf", "a_.._b.pdf", "a%2F..%2Fb.pdf"),
    ],
)
def test_no_name_reaches_the_header_but_as_printable_ascii(name, fallback, encoded):
    """Quotes, backslashes, CR/LF and what is not ASCII: each name as an RFC 8187
    ``filename*`` and a quoted ASCII ``filename`` nothing can break out of."""
    value = content_disposition(name, "application/pdf")
    assert value == f"inline; filename=\"{fallback}\"; filename*=UTF-8''{encoded}"
    assert re.fullmatch(r'inline; filename="[^"\\]*"; filename\*=UTF-8\'\'[^";\s]+', value)
    assert check_disposition(value) == value
