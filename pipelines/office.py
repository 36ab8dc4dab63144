"""Office steps on LibreOffice 7.4 (headless): ``docx_to_pdf`` and ``extract_text``.

``docx_to_pdf`` turns a word-processing document (OOXML ``docx``, ODF ``odt`` or flat
``fodt``, legacy Word ``doc``, RTF) into ``document.pdf``. ``extract_text`` writes
``text.txt`` (UTF-8, ``\\n`` line ends) from any kind its profile accepts:

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

The kind is found from the content (:func:`detect`) by the inspection ingest ran at
submit (:mod:`pipelines.formats.inspection`: signatures, the ZIP's
``[Content_Types].xml`` or ``mimetype``, the OLE2 directory, a flat ODF's root
element); an encrypted or unreadable document is refused before LibreOffice runs. Never the
file's name: the input sits at ``.../input/source`` and LibreOffice gets a copy named
``document.<extension for the detected kind>`` (it picks its import filter partly from
the extension), in a directory of its own inside the workdir.

Each conversion runs ``soffice.bin --headless --convert-to ...`` as a child process with a
fresh user profile (one per process: two processes sharing one, the second silently
exits 1), written before start with (``registrymodifications.xcu``):

* ``BlockUntrustedRefererLinks`` — without it a ``file://`` image linked from a
  document (``gotenberg-libreoffice-linked-external.fodt``) or an external image
  relationship in a ``docx`` is read from the local disk and embedded in the PDF;
  the job's sandbox has no network, so remote templates and images fail anyway;
* macros off (``MacroSecurityLevel`` 3, ``DisableMacrosExecution``), link updates
  on load off (Writer, Calc), no auto-save, no recovery, no first-run handling.

LibreOffice exits 0 even when it could not load the input: the step checks that the
output exists, is a PDF that PDFium opens with at least one page (or that the CSV
files are there), else ``invalid_input``. While it runs, the output directory's size
is watched (and each file capped with ``RLIMIT_FSIZE`` through ``prlimit``): a CSV
over ``max_text_bytes`` (``poi-poc-shared-strings.xlsx``: 12,000 cells referencing
one 1 MB string, ~12 GB of CSV) is ``output_limit`` after at most that many bytes,
never a full disk. A conversion over :data:`CONVERT_TIMEOUT_SECONDS` is killed
(``timeout``). The PDF export is asked for pages ``1..max_pages + 1`` only, so a huge
document costs its layout but not its export, and one page more than the limit says
``page_limit``.

Parameters (the profile's ``params``; limits cannot come from a request):
``max_pages`` (default :data:`DEFAULT_MAX_PAGES`) for both steps, ``max_text_bytes``
(default :data:`DEFAULT_MAX_TEXT_BYTES`) for ``extract_text``; anything else is
``invalid_params``. The limits decide whether there is an output, never what it is,
so they are not in the output type.

LibreOffice runs as ``soffice.bin`` itself, not through its ``soffice``/``oosplash``
launcher: ``oosplash`` refuses to start when ``/tmp`` and ``/var/tmp`` are read-only
(the sandbox) ("no valid pipe path found"), while ``soffice.bin`` takes its
single-instance pipe's directory from ``-env:OSL_SOCKET_PATH`` (here its own cwd); it
exits 81 once after creating a fresh profile and is run again, as ``oosplash`` would.
``MAX_CONCURRENCY`` caps its thread pool (one thread a core otherwise), so the thread
count, which ``RLIMIT_NPROC`` counts, does not depend on the machine. Measured in the
sandbox: a docx needs ``max_processes`` >= 5, a pptx >= 6 (the step plus
``soffice.bin``'s threads; below that it reports "source file could not be loaded",
which the step can only call ``invalid_input``); the default 16 leaves room. Small
documents convert within an address space of 256 MB (resident ~210 MB); the
profiles' 2048 MB leaves room for large ones.
"""

from __future__ import annotations

import codecs
import html.parser
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import IO, Any

from pipelines import pdf
from pipelines.formats.inspection import inspect_file
from pipelines.params import integer, reject_unknown
from pipelines.registry import Output, PipelineError, register

log = logging.getLogger(__name__)

DEFAULT_MAX_PAGES = 1000
DEFAULT_MAX_TEXT_BYTES = 50 * 1024 * 1024
MAX_PAGES_LIMIT = 100_000
MAX_TEXT_BYTES_LIMIT = 1024 * 1024 * 1024
# A PDF LibreOffice writes is refused beyond this (the sandbox's RLIMIT_FSIZE is 10 GB).
MAX_PDF_BYTES = 2 * 1024 * 1024 * 1024
CONVERT_TIMEOUT_SECONDS = 110.0
_POLL_SECONDS = 0.05
# soffice.bin exits 81 after setting up a fresh profile: run it again (as its launcher,
# oosplash, would; oosplash itself refuses to start when /tmp is read-only).
_RESTART = 81
_ATTEMPTS = 3
_THREADS = 2
# How much of a text or HTML input is read to find its encoding (BOM, <meta charset>).
_DETECT_BYTES = 64 * 1024
_STREAM_CHUNK = 1024 * 1024

PDF_TYPE = "document.pdf"
TEXT_TYPE = "text.txt"
TEXT_CONTENT_TYPE = "text/plain; charset=utf-8"


@dataclass(frozen=True, slots=True)
class DocumentKind:
    """What the input is: a profile ``kind``, the LibreOffice application that reads it
    (``writer``, ``calc``, ``impress``; ``pdf``, ``text``, ``html`` for the rest), the
    extension LibreOffice gets, and a label for messages."""

    kind: str
    family: str
    extension: str
    label: str


# -- parameters --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OfficeRequest:
    max_pages: int
    max_text_bytes: int


_KEYS = {
    "docx_to_pdf": ("max_pages",),
    "extract_text": ("max_pages", "max_text_bytes"),
}


def parse_params(operation: str, params: Mapping[str, Any]) -> OfficeRequest:
    """Validate ``params`` for ``operation``; unknown keys are ``invalid_params``."""
    reject_unknown(operation, params, _KEYS[operation])
    return OfficeRequest(
        max_pages=integer(params, "max_pages", 1, MAX_PAGES_LIMIT, DEFAULT_MAX_PAGES),
        max_text_bytes=integer(
            params, "max_text_bytes", 1, MAX_TEXT_BYTES_LIMIT, DEFAULT_MAX_TEXT_BYTES
        ),
    )


# -- what the input is -------------------------------------------------------------------

# Profile kind -> the LibreOffice application that reads it (``pdf``, ``text``, ``html``:
# read here) and the extension LibreOffice gets (it picks its import filter by it).
_FAMILIES = {
    "pdf": ("pdf", "pdf"),
    "text": ("text", "txt"),
    "html": ("html", "html"),
    "rtf": ("writer", "rtf"),
    "ooxml-word": ("writer", "docx"),
    "odf-text": ("writer", "odt"),
    "msword": ("writer", "doc"),
    "ooxml-sheet": ("calc", "xlsx"),
    "odf-sheet": ("calc", "ods"),
    "msexcel": ("calc", "xls"),
    "ooxml-slides": ("impress", "pptx"),
    "odf-slides": ("impress", "odp"),
    "mspowerpoint": ("impress", "ppt"),
}
_FLAT_ODF_EXTENSIONS = {"odf-text": "fodt", "odf-sheet": "fods", "odf-slides": "fodp"}


def detect(path: Path) -> DocumentKind:
    """The kind of document at ``path``, from its content: the inspection ingest ran at
    submit (:mod:`pipelines.formats.inspection`). What ingest refuses for every
    operation (macros, ZIP bombs, unsafe XML ...) never reaches a step; what makes
    LibreOffice fail is said here: empty, unreadable, encrypted."""
    inspection = inspect_file(path)
    details = inspection.details
    if inspection.kind == "empty":
        raise PipelineError("invalid_input", "the input file is empty")
    if details.get("corrupt"):
        raise PipelineError("invalid_input", f"{inspection.label}: {details['corrupt']}")
    if details.get("encrypted"):
        raise PipelineError(
            "encrypted_document",
            f"{inspection.label} cannot be opened without a password ({details['encrypted']})",
        )
    found = _FAMILIES.get(inspection.kind)
    if found is None:
        raise PipelineError("unsupported_format", f"{inspection.label} is not a supported document")
    family, extension = found
    if inspection.mime.endswith("-flat-xml"):
        extension = _FLAT_ODF_EXTENSIONS[inspection.kind]
    return DocumentKind(inspection.kind, family, extension, inspection.label)


# -- LibreOffice -------------------------------------------------------------------------

_PROFILE_SETTINGS = (
    ("/org.openoffice.Office.Common/Security/Scripting", "BlockUntrustedRefererLinks", "true"),
    ("/org.openoffice.Office.Common/Security/Scripting", "MacroSecurityLevel", "3"),
    ("/org.openoffice.Office.Common/Security/Scripting", "DisableMacrosExecution", "true"),
    ("/org.openoffice.Office.Writer/Content/Update", "Link", "2"),  # never
    ("/org.openoffice.Office.Calc/Content/Update", "Link", "1"),  # never
    ("/org.openoffice.Office.Common/Save/Document", "AutoSave", "false"),
    ("/org.openoffice.Office.Recovery/AutoSave", "Enabled", "false"),
    ("/org.openoffice.Office.Recovery/RecoveryInfo", "Enabled", "false"),
    ("/org.openoffice.Office.Common/Misc", "FirstRun", "false"),
    ("/org.openoffice.Office.Common/Misc", "ShowTipOfTheDay", "false"),
)

_PDF_FILTERS = {
    "writer": "writer_pdf_Export",
    "impress": "impress_pdf_Export",
    "calc": "calc_pdf_Export",
}
# Field separator ",", text delimiter '"', UTF-8, from line 1, no cell formats,
# language 0, quote only where needed, detect special numbers, cell contents as shown
# (dates as dates), no formulas, keep spaces, every sheet (-1: one file per sheet).
_CSV_FILTER = "csv:Text - txt - csv (StarCalc):44,34,76,1,,0,false,true,true,false,false,-1"
_STEM = "document"


@cache
def _tool(name: str) -> str | None:
    return shutil.which(name, path="/usr/bin:/bin:/usr/local/bin")


@cache
def _office_binary() -> str | None:
    """``soffice.bin`` next to the ``soffice`` launcher script."""
    launcher = _tool("soffice")
    if launcher is None:
        return None
    binary = Path(launcher).resolve().parent / "soffice.bin"
    return str(binary) if os.access(binary, os.X_OK) else None


def _soffice() -> str:
    found = _office_binary()
    if found is None:
        raise PipelineError(
            "converter_unavailable", "LibreOffice (soffice.bin) is not installed", retryable=True
        )
    return found


def _profile_xcu() -> str:
    items = "\n".join(
        f'<item oor:path="{path}"><prop oor:name="{name}" oor:op="fuse">'
        f"<value>{value}</value></prop></item>"
        for path, name, value in _PROFILE_SETTINGS
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<oor:items xmlns:oor="http://openoffice.org/2001/registry"'
        ' xmlns:xs="http://www.w3.org/2001/XMLSchema"'
        ' xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">\n'
        f"{items}\n</oor:items>\n"
    )


@dataclass(frozen=True, slots=True)
class Conversion:
    outputs: list[Path]
    seconds: float
    log_tail: str


def _prepare(source: Path, kind: DocumentKind, workdir: Path) -> tuple[Path, Path, Path]:
    """A fresh directory for one LibreOffice run: ``(input copy, profile, out dir)``."""
    base = workdir / "lo"
    if base.exists():
        shutil.rmtree(base)
    profile_user = base / "profile" / "user"
    profile_user.mkdir(parents=True)
    (profile_user / "registrymodifications.xcu").write_text(_profile_xcu(), encoding="utf-8")
    (base / "in").mkdir()
    (base / "out").mkdir()
    (base / "tmp").mkdir()
    document = base / "in" / f"{_STEM}.{kind.extension}"
    try:
        os.link(source, document)
    except OSError:
        shutil.copyfile(source, document)
    return document, base / "profile", base / "out"


def convert(
    source: Path,
    kind: DocumentKind,
    convert_to: str,
    workdir: Path,
    max_output_bytes: int,
    *,
    timeout: float = CONVERT_TIMEOUT_SECONDS,
) -> Conversion:
    """Run LibreOffice on a copy of ``source`` (read as ``kind``) with ``--convert-to
    convert_to``; the files it wrote. ``output_limit`` past ``max_output_bytes``
    written, ``timeout`` past ``timeout`` seconds."""
    document, profile, out = _prepare(source, kind, workdir)
    home = profile.parent
    command = [
        _soffice(),
        "--headless",
        "--invisible",
        "--norestore",
        "--nologo",
        "--nolockcheck",
        "--nodefault",
        f"-env:UserInstallation={profile.as_uri()}",
        # Its single-instance pipe, relative to its cwd (a socket path has 108 bytes
        # at most; /tmp is read-only in the sandbox).
        "-env:OSL_SOCKET_PATH=.",
        "--convert-to",
        convert_to,
        "--outdir",
        str(out),
        str(document),  # absolute: cannot be read as an option
    ]
    prlimit = _tool("prlimit")
    if prlimit is not None:
        command = [prlimit, f"--fsize={max_output_bytes + 1}", "--", *command]
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "TMPDIR": str(home / "tmp"),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "SAL_USE_VCLPLUGIN": "svp",
        # Its thread pool is one thread a core otherwise: the same thread count
        # (RLIMIT_NPROC) on every machine.
        "MAX_CONCURRENCY": str(_THREADS),
    }
    log_path = home / "soffice.log"
    started = time.monotonic()
    deadline = started + timeout
    returncode = None
    with log_path.open("wb") as log_file:
        for _attempt in range(_ATTEMPTS):
            returncode = _run(command, home, env, log_file, out, max_output_bytes, deadline)
            if returncode != _RESTART:
                break
    seconds = time.monotonic() - started
    tail = _tail(log_path)
    outputs = sorted(
        (p for p in out.iterdir() if p.is_file()), key=lambda p: (p.stat().st_mtime_ns, p.name)
    )
    log.info(
        "soffice %s: %s -> %d file(s) in %.2f s (exit %s)",
        convert_to.split(":", 1)[0],
        kind.kind,
        len(outputs),
        seconds,
        returncode,
    )
    if sum(p.stat().st_size for p in outputs) > max_output_bytes:
        raise _output_limit(max_output_bytes)
    return Conversion(outputs, seconds, tail)


def _run(
    command: list[str],
    cwd: Path,
    env: dict[str, str],
    log_file: IO[bytes],
    out: Path,
    max_output_bytes: int,
    deadline: float,
) -> int:
    """One ``soffice.bin`` run, watched; its exit status."""
    try:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            close_fds=True,
        )
    except OSError as exc:
        raise PipelineError(
            "converter_unavailable", f"LibreOffice could not be started: {exc}", retryable=True
        ) from None
    try:
        _watch(process, out, max_output_bytes, deadline)
    finally:
        _kill_tree(process.pid)
        process.wait()
    return process.returncode


def _watch(process: subprocess.Popen[bytes], out: Path, max_bytes: int, deadline: float) -> None:
    """Wait for ``process``; kill it (raising) when ``out`` outgrows ``max_bytes`` or
    the deadline passes."""
    while process.poll() is None:
        if _dir_bytes(out) > max_bytes:
            raise _output_limit(max_bytes)
        if time.monotonic() > deadline:
            raise PipelineError(
                "timeout",
                f"LibreOffice did not finish within {CONVERT_TIMEOUT_SECONDS:.0f} s",
            )
        time.sleep(_POLL_SECONDS)


def _output_limit(max_bytes: int) -> PipelineError:
    return PipelineError(
        "output_limit", f"the converted document is larger than the limit of {max_bytes:,} bytes"
    )


def _dir_bytes(directory: Path) -> int:
    total = 0
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                try:
                    total += entry.stat(follow_symlinks=False).st_size
                except OSError:
                    continue
    except OSError:
        return 0
    return total


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    pending = [pid]
    while pending:
        parent = pending.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children") as children:
                    kids = [int(child) for child in children.read().split()]
            except (OSError, ValueError):
                continue
            found.extend(kids)
            pending.extend(kids)
    return found


def _kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it (``oosplash`` -> ``soffice.bin``)."""
    for target in [pid, *_descendants(pid)]:
        try:
            os.kill(target, signal.SIGKILL)
        except OSError:
            continue


def _tail(path: Path, size: int = 2000) -> str:
    try:
        with path.open("rb") as file:
            file.seek(max(0, file.seek(0, os.SEEK_END) - size))
            return file.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


def to_pdf(source: Path, kind: DocumentKind, workdir: Path, max_pages: int) -> tuple[Path, int]:
    """``source`` as a PDF (pages ``1..max_pages + 1`` exported); the PDF and its page
    count, ``page_limit`` beyond ``max_pages``."""
    page_range = f'{{"PageRange":{{"type":"string","value":"1-{max_pages + 1}"}}}}'
    result = convert(
        source, kind, f"pdf:{_PDF_FILTERS[kind.family]}:{page_range}", workdir, MAX_PDF_BYTES
    )
    produced = [p for p in result.outputs if p.name == f"{_STEM}.pdf"]
    if not produced or produced[0].stat().st_size == 0:
        raise _not_converted(kind, result)
    path = produced[0]
    with path.open("rb") as file:
        if not file.read(5).startswith(b"%PDF-"):
            raise _not_converted(kind, result)
    try:
        with pdf.open_pdf(path) as document:
            pages = len(document)
    except PipelineError:
        raise _not_converted(kind, result) from None
    if pages < 1:
        raise _not_converted(kind, result)
    if pages > max_pages:
        raise PipelineError(
            "page_limit", f"the document has more than {max_pages:,} pages (the limit)"
        )
    return path, pages


def _not_converted(kind: DocumentKind, result: Conversion) -> PipelineError:
    log.warning("soffice produced no usable output; its log ends: %s", result.log_tail[-500:])
    return PipelineError(
        "invalid_input",
        f"LibreOffice could not open the document: it is damaged or not a valid {kind.label}",
    )


# -- text --------------------------------------------------------------------------------


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
    result = convert(source, kind, _CSV_FILTER, workdir, sink.max_bytes)
    sheets = [p for p in result.outputs if p.suffix == ".csv"]
    if not sheets:
        raise _not_converted(kind, result)
    prefix = f"{_STEM}-"
    for number, sheet in enumerate(sheets):
        name = sheet.stem.removeprefix(prefix)
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


def extract(source: Path, kind: DocumentKind, workdir: Path, request: OfficeRequest) -> str:
    """The text of ``source`` (of ``kind``), capped at ``request.max_text_bytes``."""
    sink = _TextSink(request.max_text_bytes)
    if kind.family == "pdf":
        _pdf_text(source, request.max_pages, sink)
    elif kind.family in ("writer", "impress"):
        path, _pages = to_pdf(source, kind, workdir, request.max_pages)
        _pdf_text(path, request.max_pages, sink)
    elif kind.family == "calc":
        _sheets_text(kind, source, workdir, sink)
    else:
        _plain_text(source, sink, markup=kind.family == "html")
    return sink.text()


# -- steps -------------------------------------------------------------------------------

DOCX_TO_PDF_KINDS = ("ooxml-word", "odf-text", "msword", "rtf")
EXTRACT_TEXT_KINDS = (
    "pdf", "ooxml-word", "ooxml-sheet", "ooxml-slides", "odf-text", "odf-sheet",
    "odf-slides", "msword", "msexcel", "mspowerpoint", "rtf", "text", "html",
)  # fmt: skip


def _accepted(path: Path, kinds: tuple[str, ...], operation: str) -> DocumentKind:
    kind = detect(path)
    if kind.kind not in kinds:
        raise PipelineError(
            "unsupported_format", f"{operation} does not accept the input ({kind.label})"
        )
    return kind


def _cleanup(workdir: Path) -> None:
    shutil.rmtree(workdir / "lo", ignore_errors=True)


@register("docx_to_pdf")
def docx_to_pdf(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """A word-processing document as ``document.pdf``."""
    request = parse_params("docx_to_pdf", params)
    kind = _accepted(input_path, DOCX_TO_PDF_KINDS, "docx_to_pdf")
    try:
        produced, pages = to_pdf(input_path, kind, workdir, request.max_pages)
        path = workdir / PDF_TYPE
        produced.replace(path)
    finally:
        _cleanup(workdir)
    log.debug("docx_to_pdf: %s -> %d page(s)", kind.kind, pages)
    return [Output(PDF_TYPE, path, "application/pdf")]


@register("extract_text")
def extract_text(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """The text of a document as ``text.txt`` (UTF-8)."""
    request = parse_params("extract_text", params)
    kind = _accepted(input_path, EXTRACT_TEXT_KINDS, "extract_text")
    try:
        text = extract(input_path, kind, workdir, request)
    finally:
        _cleanup(workdir)
    path = workdir / TEXT_TYPE
    path.write_text(text, encoding="utf-8", errors="replace", newline="")
    return [Output(TEXT_TYPE, path, TEXT_CONTENT_TYPE)]
