"""Text extraction for ``extract_text`` (:mod:`pipelines.office`): UTF-8, ``\\n`` line
ends, from any kind its profile accepts:

==========================  ==========================================================
kind (by content)           how
==========================  ==========================================================
PDF                         :func:`pipelines.pdf.page_texts` (PDFium's text layer)
word processing, slides     LibreOffice -> PDF (pages capped), then ``page_texts``
spreadsheets                LibreOffice -> CSV, every sheet (filter option ``-1``)
plain text, HTML            read as a stream (HTML through :mod:`html.parser`)
==========================  ==========================================================

Pages are separated by a form feed (``\\f``), as ``pdftotext`` does; each sheet starts
with a ``Sheet: <name>`` line and sheets are separated by ``\\f`` too.

Why PDF and not Writer's ``txt:Text`` export for word processing: the text export
drops headers, footers, footnote bodies and text boxes (measured on
``tika-testWORD_various.docx``: all four were missing), and it cannot count pages, so
``max_pages`` could not hold. The PDF route has all of them and the page cap, at the
price of layout artefacts (a line per layout line, table cells of a row on one line)
and of characters no installed font can show (they have no glyph, so no text).
"""

from __future__ import annotations

import codecs
import html.parser
import re
from collections.abc import Iterator
from pathlib import Path

from pipelines import pdf
from pipelines.office_libreoffice import DocumentKind, to_pdf, to_sheets
from pipelines.registry import PipelineError

# How much of a text or HTML input is read to find its encoding (BOM, <meta charset>).
_DETECT_BYTES = 64 * 1024
_STREAM_CHUNK = 1024 * 1024


class _TextSink:
    """UTF-8 text collected up to a byte cap (``output_limit`` past it)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.parts: list[str] = []
        self.size = 0

    def add(self, text: str) -> None:
        if not text:
            return
        self.size += len(text.encode("utf-8", "replace"))
        if self.size > self.max_bytes:
            raise PipelineError(
                "output_limit",
                f"the extracted text is larger than the limit of {self.max_bytes:,} bytes",
            )
        self.parts.append(text)

    def text(self) -> str:
        return "".join(self.parts)


def _normalise(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _pdf_text(path: Path, max_pages: int, sink: _TextSink) -> None:
    for number, page in enumerate(pdf.page_texts(path, max_pages)):
        sink.add(("\f" if number else "") + _normalise(page))


def _sheets_text(kind: DocumentKind, source: Path, workdir: Path, sink: _TextSink) -> None:
    for number, (name, sheet) in enumerate(to_sheets(source, kind, workdir, sink.max_bytes)):
        sink.add(("\f" if number else "") + f"Sheet: {name}\n")
        for chunk in _decoded_chunks(sheet, "utf-8"):
            sink.add(_normalise(chunk))


def _decoded_chunks(path: Path, encoding: str) -> Iterator[str]:
    decoder = codecs.getincrementaldecoder(encoding)("replace")
    with path.open("rb") as file:
        while chunk := file.read(_STREAM_CHUNK):
            yield decoder.decode(chunk)
        yield decoder.decode(b"", final=True)


def _text_encoding(head: bytes) -> str:
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "utf-16"
    if head.startswith(b"\xef\xbb\xbf"):
        return "utf-8-sig"
    return "utf-8"


_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.I)


def _html_encoding(head: bytes) -> str:
    if head.startswith((b"\xff\xfe", b"\xfe\xff", b"\xef\xbb\xbf")):
        return _text_encoding(head)
    declared = _META_CHARSET.search(head)
    if declared:
        try:
            return codecs.lookup(declared.group(1).decode("ascii")).name
        except (LookupError, UnicodeDecodeError):
            pass
    return "utf-8"


class _HtmlText(html.parser.HTMLParser):
    """The visible text of an HTML document: script/style/template content dropped,
    a line break at block elements, whitespace collapsed within lines."""

    _SKIP = frozenset({"script", "style", "template", "noscript", "title"})
    _BLOCK = frozenset(
        {
            "p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "table",
            "section", "article", "header", "footer", "blockquote", "pre", "ul", "ol",
            "dt", "dd", "hr", "form", "nav", "aside", "main", "figure", "figcaption",
        }
    )  # fmt: skip

    def __init__(self, sink: _TextSink) -> None:
        super().__init__(convert_charrefs=True)
        self.sink = sink
        self.skipping = 0
        self.line: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self._SKIP:
            self.skipping += 1
        elif tag in self._BLOCK:
            self._end_line()
        elif tag in ("td", "th"):
            self.line.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag in self._SKIP:
            self.skipping = max(0, self.skipping - 1)
        elif tag in self._BLOCK:
            self._end_line()

    def handle_data(self, data: str) -> None:
        if not self.skipping:
            self.line.append(data)

    def _end_line(self) -> None:
        line = " ".join("".join(self.line).split())
        self.line = []
        if line:
            self.sink.add(line + "\n")

    def close(self) -> None:
        super().close()
        self._end_line()


def _plain_text(path: Path, sink: _TextSink, *, markup: bool) -> None:
    with path.open("rb") as file:
        head = file.read(_DETECT_BYTES)
    encoding = _html_encoding(head) if markup else _text_encoding(head)
    if markup:
        parser = _HtmlText(sink)
        for chunk in _decoded_chunks(path, encoding):
            parser.feed(chunk)
        parser.close()
    else:
        for chunk in _decoded_chunks(path, encoding):
            sink.add(_normalise(chunk))


def extract(
    source: Path, kind: DocumentKind, workdir: Path, *, max_pages: int, max_text_bytes: int
) -> str:
    """The text of ``source`` (of ``kind``), capped at ``max_text_bytes``."""
    sink = _TextSink(max_text_bytes)
    if kind.family == "pdf":
        _pdf_text(source, max_pages, sink)
    elif kind.family in ("writer", "impress"):
        path, _pages = to_pdf(source, kind, workdir, max_pages)
        _pdf_text(path, max_pages, sink)
    elif kind.family == "calc":
        _sheets_text(kind, source, workdir, sink)
    else:
        _plain_text(source, sink, markup=kind.family == "html")
    return sink.text()
