"""docx_to_pdf and extract_text with the real LibreOffice, on generated documents
(tests/generated) and, in the corpus tier, on a few of each kind from the shared corpus.

Most runs go through a real :class:`ChildExecutor` (own uid, network namespace,
read-only filesystem, rlimits) with the limits of the ``docx_to_pdf`` /
``extract_text`` profiles read from ``etc/profiles.toml`` (timeout 120 s, 2048 MB,
``max_processes`` 16 unless the profile says otherwise); a few call the step in
process (parameters, detection, the linked-image guard with its control run).

Documents: one of each kind (docx, odt, fodt, doc, rtf, xlsx, xls, ods, pptx, ppt, odp,
pdf), every PDF/text check against the words the generator wrote into them. Hostile
files and what each must give:

=============================================  ======================================
attached-template.docx                         a PDF (the http:// template is not
                                               fetched: no network in the sandbox)
external-picture.docx                          a PDF without any image
linked-external.fodt                           a PDF without any image (and copies
                                               linking a file that exists: none)
shared-strings-bomb.xlsx (~12 GB of CSV)       ``output_limit``, within the profile's
                                               time, the disk never past the cap
Longitudinell_...försök.docx (long name)       a PDF and its text (the name is never
                                               used: the input is ``input/source``)
encrypted-entry.docx, encrypted.odt,           ``encrypted_document`` (before
encrypted.pdf                                  LibreOffice runs)
truncated.docx                                 ``invalid_input``
=============================================  ======================================
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
import pytest

import pipelines.office as office
import pipelines.office_libreoffice as libreoffice
from hypermedia.sandbox.executor import ChildExecutor, ChildFailed
from pipelines.office_libreoffice import convert, detect, pipe_paths
from pipelines.registry import Output, PipelineError
from tests.corpus_support import corpus
from tests.generated import Generated, hostile, packages
from tests.generated import documents as text

REPO = Path(__file__).resolve().parents[2]
PRELOAD = ("pipelines.registry", "pipelines.office")
LONG_NAME = f"hostile/{hostile.LONG_NAME}"
LINKED_FODT = "hostile/linked-external.fodt"

pytestmark = pytest.mark.program("soffice")


@dataclass(frozen=True)
class Limits:
    timeout_seconds: float
    memory_limit_mb: int
    max_processes: int
    max_pages: int


def profile_limits(operation: str) -> Limits:
    with (REPO / "etc" / "profiles.toml").open("rb") as file:
        profile = tomllib.load(file)["profiles"][operation]
    return Limits(
        timeout_seconds=profile["timeout_seconds"],
        memory_limit_mb=profile["memory_limit_mb"],
        max_processes=profile.get("max_processes", 16),
        max_pages=profile.get("limits", {}).get("max_pages", office.DEFAULT_MAX_PAGES),
    )


@pytest.fixture(scope="module")
def executor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChildExecutor]:
    with ChildExecutor(tmp_path_factory.mktemp("office"), preload=PRELOAD) as ex:
        yield ex


_ids = iter(range(1_000_000))


@dataclass
class Run:
    outputs: list[Output]
    seconds: float
    workdir: Path
    peak_mb: float


def sandboxed(
    ex: ChildExecutor,
    operation: str,
    data: bytes,
    params: dict[str, Any] | None = None,
    *,
    max_processes: int | None = None,
) -> Run:
    """``operation`` on ``data`` in a sandboxed child with the profile's limits
    (``max_processes`` instead of the profile's, if given)."""
    limits = profile_limits(operation)
    job_id = f"office-{os.getpid()}-{next(_ids)}"
    workdir = ex.prepare(job_id)
    source = workdir / "input" / "source"
    source.write_bytes(data)
    started = time.monotonic()
    try:
        result = ex.run(
            job_id,
            operation,
            source,
            {"max_pages": limits.max_pages, **(params or {})},
            timeout_seconds=limits.timeout_seconds,
            memory_limit_mb=limits.memory_limit_mb,
            max_processes=max_processes or limits.max_processes,
        )
    except ChildFailed as exc:
        exc.add_note(str(workdir))
        raise
    seconds = time.monotonic() - started
    print(f"{operation}: {seconds:.2f} s, peak {result.peak_memory_mb:.0f} MB")
    return Run(result.outputs, seconds, workdir, result.peak_memory_mb)


@dataclass
class Failure:
    code: str
    message: str
    seconds: float
    workdir: Path


def sandbox_failure(
    ex: ChildExecutor, operation: str, data: bytes, params: dict[str, Any] | None = None
) -> Failure:
    started = time.monotonic()
    with pytest.raises(ChildFailed) as caught:
        sandboxed(ex, operation, data, params)
    failed = caught.value
    workdir = Path(failed.__notes__[-1])
    return Failure(failed.code, failed.message, time.monotonic() - started, workdir)


def in_process(
    operation: str, data: bytes, tmp_path: Path, params: dict[str, Any] | None = None
) -> Output:
    (tmp_path / "input").mkdir(parents=True, exist_ok=True)
    source = tmp_path / "input" / "source"
    source.write_bytes(data)
    step = office.docx_to_pdf if operation == "docx_to_pdf" else office.extract_text
    [output] = step(source, params or {}, tmp_path)
    return output


@dataclass(frozen=True)
class Pdf:
    pages: int
    text: str
    images: int


def read_pdf(path: Path) -> Pdf:
    document = pdfium.PdfDocument(path)
    try:
        texts, images = [], 0
        for page in document:
            text_page = page.get_textpage()
            texts.append(text_page.get_text_range())
            images += sum(
                1
                for obj in page.get_objects(max_depth=8)
                if obj.type == pdfium_c.FPDF_PAGEOBJ_IMAGE
            )
        return Pdf(len(document), "\n".join(texts), images)
    finally:
        document.close()


def squashed(text: str) -> str:
    return " ".join(text.split())


def leftovers(workdir: Path, *outputs: str) -> set[str]:
    """What the job left in its workdir besides its input, outputs and log."""
    return {p.name for p in workdir.iterdir()} - {"input", ".child.log", *outputs}


# -- docx_to_pdf in the sandbox ------------------------------------------------------------

PDF_CASES = [
    ("documents/report.docx", None, [text.TITLE, text.HEADING, text.BODY]),
    ("documents/report.odt", None, [text.TITLE, text.UMLAUTS]),
    ("documents/report.fodt", None, [text.TITLE]),
    ("documents/report.doc", None, [text.TITLE]),
    ("documents/report.rtf", None, [text.TITLE, text.UMLAUTS]),
    ("documents/pages-12.docx", 12, ["Page 1 of", "Page 12 of"]),
    ("hostile/attached-template.docx", None, [packages.TEMPLATE_TEXT]),
    (LONG_NAME, None, [text.TITLE]),
]
CORPUS_PDF_CASES = [
    ("documents/pydocx-test.docx", None, ["python-docx was here"]),
    ("documents/tika-testWORD.docx", None, ["Sample Word Document", "Main Heading"]),
    ("documents/mammoth-strict-format.docx", None, []),
    ("documents/gotenberg-pages_12.docx", 12, ["Page 1", "Page 12"]),
    ("documents/sf-source.odt", None, ["Lorem ipsum dolor sit amet"]),
    ("documents/tika-testOpenOffice2.odt", None, ["written in NeoOffice 2.2.1"]),
    ("documents/tika-test.doc", None, ["test"]),
    ("documents/tika-testRTF.rtf", None, ["Test d\u2019indexation Word"]),
    ("hostile/tika-testAttachedTemplate.docx", None, ["Document with external attached template"]),
]


@pytest.mark.parametrize(("path", "pages", "words"), PDF_CASES, ids=[c[0] for c in PDF_CASES])
def test_docx_to_pdf_in_the_sandbox(executor, generated: Generated, path, pages, words):
    check_docx_to_pdf(executor, generated.read(path), pages, words)


@pytest.mark.corpus
@pytest.mark.parametrize(
    ("path", "pages", "words"), CORPUS_PDF_CASES, ids=[c[0] for c in CORPUS_PDF_CASES]
)
def test_corpus_docx_to_pdf_in_the_sandbox(executor, path, pages, words):
    check_docx_to_pdf(executor, (corpus() / path).read_bytes(), pages, words)


def check_docx_to_pdf(executor, data: bytes, pages: int | None, words: list[str]) -> None:
    run = sandboxed(executor, "docx_to_pdf", data)
    [output] = run.outputs
    assert (output.output_type, output.content_type) == ("document.pdf", "application/pdf")
    assert output.path == run.workdir / "document.pdf"
    pdf = read_pdf(output.path)
    assert pdf.pages == pages if pages is not None else pdf.pages >= 1
    for word in words:
        assert word in squashed(pdf.text)
    assert not leftovers(run.workdir, "document.pdf")


def test_an_external_picture_is_not_embedded(executor, generated: Generated):
    run = sandboxed(executor, "docx_to_pdf", generated.read("hostile/external-picture.docx"))
    pdf = read_pdf(run.outputs[0].path)
    assert pdf.pages == 1
    assert pdf.images == 0
    assert packages.PICTURE_TEXT in squashed(pdf.text)


def test_the_linked_fodt_gives_text_and_no_image(executor, generated: Generated):
    run = sandboxed(executor, "docx_to_pdf", generated.read(LINKED_FODT))
    pdf = read_pdf(run.outputs[0].path)
    assert text.LINKED_TEXT in squashed(pdf.text)
    assert pdf.images == 0


def unguarded_conversion(document: Path, tmp_path: Path) -> Path:
    """The control: LibreOffice with a default profile (no BlockUntrustedRefererLinks;
    only the version that skips the start's render tests, as the generator's has)."""
    out = tmp_path / "control"
    subprocess.run(
        [
            shutil.which("soffice") or "soffice",
            "--headless",
            "--norestore",
            text.user_installation(tmp_path / "control-profile"),
            "--convert-to",
            "pdf",
            "--outdir",
            str(out),
            str(document),
        ],
        check=True,
        capture_output=True,
        timeout=120,
        env={**os.environ, "TMPDIR": str(tmp_path)},  # its temporary files here
    )
    return out / f"{document.stem}.pdf"


@pytest.mark.parametrize("container", ["fodt", "docx"])
def test_a_link_to_a_local_file_is_not_embedded(
    executor, generated: Generated, tmp_path, container
):
    """A link to a file that exists on this machine: LibreOffice's default profile
    embeds it (the control), the step's profile does not, in and out of the sandbox."""
    picture = (generated / "images/drawing.png").as_uri()
    if container == "fodt":
        data = text.linked_fodt(picture).encode()
    else:
        data = packages.external_picture_docx(picture)
    document = tmp_path / f"linked.{container}"
    document.write_bytes(data)
    assert read_pdf(unguarded_conversion(document, tmp_path)).images == 1

    sandbox_pdf = read_pdf(sandboxed(executor, "docx_to_pdf", data).outputs[0].path)
    local_pdf = read_pdf(in_process("docx_to_pdf", data, tmp_path / "step").path)
    assert (sandbox_pdf.pages, sandbox_pdf.images) == (1, 0)
    assert (local_pdf.pages, local_pdf.images) == (1, 0)


def test_pages_over_max_pages_are_page_limit(executor, generated: Generated):
    data = generated.read("documents/pages-12.docx")
    failed = sandbox_failure(executor, "docx_to_pdf", data, {"max_pages": 11})
    assert failed.code == "page_limit"
    run = sandboxed(executor, "docx_to_pdf", data, {"max_pages": 12})
    assert read_pdf(run.outputs[0].path).pages == 12


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("hostile/encrypted-entry.docx", "encrypted_document"),
        ("hostile/encrypted.odt", "encrypted_document"),
        ("hostile/truncated.docx", "invalid_input"),
        ("hostile/not-a-zip.odt", "unsupported_format"),
        ("documents/budget.xlsx", "unsupported_format"),
        ("documents/pages-4.pdf", "unsupported_format"),
    ],
)
def test_docx_to_pdf_refusals(executor, generated: Generated, path, code):
    failed = sandbox_failure(executor, "docx_to_pdf", generated.read(path))
    assert failed.code == code, failed.message
    assert not leftovers(failed.workdir)


def test_a_word_package_libreoffice_cannot_load_is_invalid_input(executor, tmp_path):
    """LibreOffice exits 0 without a PDF: the step says ``invalid_input``."""
    damaged = tmp_path / "damaged.docx"
    content_types = (
        '<?xml version="1.0"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/'
        'content-types"><Override PartName="/word/document.xml" ContentType="application/'
        'vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/></Types>'
    )
    with zipfile.ZipFile(damaged, "w") as package:
        package.writestr("[Content_Types].xml", content_types)
        package.writestr("word/document.xml", b"\x00\x01 not XML" * 100)
    failed = sandbox_failure(executor, "docx_to_pdf", damaged.read_bytes())
    assert failed.code == "invalid_input"
    assert "could not open" in failed.message


# -- extract_text in the sandbox -----------------------------------------------------------

TEXT_CASES = [
    ("documents/pages-4.pdf", [text.PAGE_WORDS.format(n=1), text.PAGE_WORDS.format(n=4)]),
    # Body, header, footer, footnote and text box: Writer's txt export drops the last four.
    ("documents/report.docx", [text.LIST_INTRO, text.HEADER, text.FOOTER, text.FOOTNOTE,
                               text.TEXT_BOX]),
    ("documents/report.odt", [text.BODY, text.HEADER, text.FOOTNOTE, text.TEXT_BOX]),
    ("documents/report.doc", [text.TITLE, text.FOOTER]),
    ("documents/report.rtf", [text.UMLAUTS]),
    ("documents/budget.xlsx", ["Sheet: Income", text.SHEET_TITLE, "10,100"]),
    ("documents/budget.xls", ["Sheet: Income", "Number,Square"]),
    ("documents/budget.ods", ["Sheet: Expenses", "Rent,1200", text.UMLAUTS]),
    ("documents/slides.pptx", [text.SLIDE_TITLES[0], text.SLIDE_BODY]),
    ("documents/slides.ppt", [text.SLIDE_TITLES[1]]),
    ("documents/slides.odp", [text.SLIDE_TITLES[0], text.SLIDE_BODY]),
    ("hostile/attached-template.docx", [packages.TEMPLATE_TEXT]),
    (LINKED_FODT, [text.LINKED_TEXT]),
    (LONG_NAME, [text.TITLE]),
]  # fmt: skip
CORPUS_TEXT_CASES = [
    ("documents/sf-minimal-document.pdf", ["Lorem ipsum dolor sit amet"]),
    (
        "documents/tika-testWORD_various.docx",
        [
            "Here is a numbered list",
            "This is the header text.",
            "This is the footer text.",
            "This is a footnote.",
            "Here is a text box",
        ],
    ),
    ("documents/tika-testOpenOffice2.odt", ["written in NeoOffice 2.2.1 for the Mac"]),
    ("documents/tika-testRTF.rtf", ["Test d\u2019indexation Word"]),
    (
        "documents/tika-testEXCEL.xlsx",
        ["Sheet: Feuil1", "Sample Excel Worksheet - Numbers and their Squares", "15,225"],
    ),
    ("documents/tika-testEXCEL.xls", ["Sheet: Feuil1", "Number,Square"]),
    # Cells as shown: the currency format is kept.
    ("documents/poi-simple-monthly-budget.xlsx", ['Income 1,"$2,500.00"']),
    ("documents/tika-test-columnar.ods", ["Sheet: testing", "This is row 0 of 10"]),
    ("documents/poi-SampleShow.pptx", ["Title of the first slide"]),
    ("documents/tika-testPPT.ppt", ["Sample Powerpoint Slide"]),
    ("documents/tika-testMasterFooter.odp", ["Master footer is here"]),
]


@pytest.mark.parametrize(("path", "words"), TEXT_CASES, ids=[c[0] for c in TEXT_CASES])
def test_extract_text_in_the_sandbox(executor, generated: Generated, path, words):
    check_extract_text(executor, generated.read(path), words)


@pytest.mark.corpus
@pytest.mark.parametrize(
    ("path", "words"), CORPUS_TEXT_CASES, ids=[c[0] for c in CORPUS_TEXT_CASES]
)
def test_corpus_extract_text_in_the_sandbox(executor, path, words):
    check_extract_text(executor, (corpus() / path).read_bytes(), words)


def check_extract_text(executor, data: bytes, words: list[str]) -> None:
    run = sandboxed(executor, "extract_text", data)
    [output] = run.outputs
    assert output.output_type == "text.txt"
    assert output.content_type == "text/plain; charset=utf-8"
    extracted = output.path.read_bytes().decode("utf-8")
    assert "\r" not in extracted
    for word in words:
        assert squashed(word) in squashed(extracted)
    assert not leftovers(run.workdir, "text.txt")


def test_sheets_are_in_order_and_separated(executor, generated: Generated):
    run = sandboxed(executor, "extract_text", generated.read("documents/budget.xlsx"))
    sheets = run.outputs[0].path.read_text(encoding="utf-8").split("\f")
    assert [s.splitlines()[0] for s in sheets] == [f"Sheet: {name}" for name in text.SHEETS]


def test_pages_are_separated_by_form_feeds(executor, generated: Generated):
    run = sandboxed(executor, "extract_text", generated.read("documents/pages-12.docx"))
    pages = run.outputs[0].path.read_text(encoding="utf-8").split("\f")
    assert [squashed(p) for p in pages] == [text.PAGE_WORDS.format(n=n) for n in range(1, 13)]


def test_shared_strings_bomb_is_output_limit(executor):
    """~120 MB of CSV from a workbook of ~100 KB (the generated set's bomb makes 12 GB
    the same way; LibreOffice's time grows with the cells, the check's does not):
    stopped at ``max_text_bytes`` (1 MiB here; 50 MB by default: the same check), within
    the profile's CPU time, the workdir left with only its input. (Uploaded, the bomb is
    refused at submit: its cells' text is counted, tests/unit/test_inspect_verdicts.py;
    this is the step's own defence.)"""
    limits = profile_limits("extract_text")
    cap = 1024 * 1024
    failed = sandbox_failure(
        executor,
        "extract_text",
        packages.shared_strings_bomb_xlsx(row_count=40),
        {"max_text_bytes": cap},
    )
    assert failed.code == "output_limit", failed.message
    assert f"{cap:,}" in failed.message
    assert failed.seconds < limits.timeout_seconds
    assert not leftovers(failed.workdir)
    print(f"shared-strings bomb: output_limit after {failed.seconds:.1f} s")


def test_text_and_html_are_read_without_libreoffice(executor):
    html = (
        "<!DOCTYPE html><html><head><title>skip me</title><style>p{color:red}</style>"
        "<script>var hidden = 1;</script></head><body><h1>Caf&eacute; menu</h1>"
        "<p>Espresso &amp; tea</p><table><tr><td>a</td><td>b</td></tr></table></body></html>"
    )
    # One process: the child cannot start LibreOffice (nor a thread); it would fail
    # process_limit if it tried.
    run = sandboxed(executor, "extract_text", html.encode(), max_processes=1)
    text = run.outputs[0].path.read_text(encoding="utf-8")
    assert text.splitlines() == ["Café menu", "Espresso & tea", "a b"]

    text_file = "Grüße\r\naus Köln\n".encode("utf-16")
    run = sandboxed(executor, "extract_text", text_file, max_processes=1)
    assert run.outputs[0].path.read_text(encoding="utf-8") == "Grüße\naus Köln\n"


def test_text_over_the_cap_is_output_limit(executor):
    failed = sandbox_failure(
        executor, "extract_text", b"word " * 100_000, {"max_text_bytes": 100_000}
    )
    assert failed.code == "output_limit"


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("hostile/encrypted.odt", "encrypted_document"),
        ("hostile/truncated.docx", "invalid_input"),
        ("hostile/encrypted.pdf", "encrypted_document"),
        ("images/drawing.png", "unsupported_format"),
    ],
)
def test_extract_text_refusals(executor, generated: Generated, path, code):
    failed = sandbox_failure(executor, "extract_text", generated.read(path))
    assert failed.code == code, failed.message


# -- in process ----------------------------------------------------------------------------


def test_in_process_conversion_is_the_same(tmp_path, generated: Generated):
    started = time.monotonic()
    output = in_process("docx_to_pdf", generated.read("documents/report.docx"), tmp_path)
    seconds = time.monotonic() - started
    print(f"docx_to_pdf in process (cold start, fresh profile): {seconds:.2f} s")
    pdf = read_pdf(output.path)
    assert pdf.pages >= 1
    assert text.TITLE in squashed(pdf.text)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["document.pdf", "input"]


@pytest.mark.parametrize(
    ("operation", "params", "fragment"),
    [
        ("docx_to_pdf", {"width": 10}, "unknown parameter(s) width"),
        ("docx_to_pdf", {"max_pages": 0}, "max_pages must be in 1.."),
        ("docx_to_pdf", {"max_pages": "5"}, "max_pages must be an integer"),
        ("extract_text", {"max_text_bytes": True}, "max_text_bytes must be an integer"),
    ],
)
def test_bad_params_are_invalid_params(tmp_path, generated: Generated, operation, params, fragment):
    with pytest.raises(PipelineError) as caught:
        in_process(operation, generated.read("documents/report.docx"), tmp_path, params)
    assert caught.value.code == "invalid_params"
    assert fragment in caught.value.message


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (b"{\\rtf1\\ansi hello}", "rtf"),
        (b"%PDF-1.4\n", "pdf"),
        (b"<html><body>x</body></html>", "html"),
        ("caf\u00e9".encode("utf-16"), "text"),
        (b"plain words\n", "text"),
    ],
)
def test_detect_by_content(tmp_path, data, kind):
    path = tmp_path / "source"
    path.write_bytes(data)
    assert detect(path).kind == kind


@pytest.mark.parametrize(
    ("path", "kind", "extension"),
    [
        ("documents/report.docx", "ooxml-word", "docx"),
        ("documents/report.odt", "odf-text", "odt"),
        ("documents/report.fodt", "odf-text", "fodt"),
        ("documents/report.doc", "msword", "doc"),
        ("documents/report.rtf", "rtf", "rtf"),
        ("documents/budget.xlsx", "ooxml-sheet", "xlsx"),
        ("documents/budget.xls", "msexcel", "xls"),
        ("documents/budget.ods", "odf-sheet", "ods"),
        ("documents/slides.pptx", "ooxml-slides", "pptx"),
        ("documents/slides.ppt", "mspowerpoint", "ppt"),
        ("documents/slides.odp", "odf-slides", "odp"),
    ],
)
def test_detect_kinds(generated: Generated, path, kind, extension):
    detected = detect(generated / path)
    assert (detected.kind, detected.extension) == (kind, extension)


def test_empty_input_is_invalid_input(tmp_path):
    with pytest.raises(PipelineError) as caught:
        in_process("extract_text", b"", tmp_path)
    assert caught.value.code == "invalid_input"


def soffice_processes_under(path: Path) -> list[int]:
    """Processes whose command line mentions ``path`` (a conversion's files)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if str(path).encode() in cmdline:
            found.append(int(pid))
    return found


def test_a_conversion_over_its_time_is_killed(tmp_path, generated: Generated):
    source = tmp_path / "source"
    source.write_bytes(generated.read("documents/report.docx"))
    kind = detect(source)
    started = time.monotonic()
    with pytest.raises(PipelineError) as caught:
        # soffice.bin's start alone takes ~0.25 CPU-s: it is killed while it runs. (With
        # 0.3 s a quiet machine's one start converted it in time, once soffice.bin no
        # longer started twice.)
        convert(source, kind, "pdf", tmp_path, 10**9, timeout=0.05)
    assert caught.value.code == "timeout"
    assert time.monotonic() - started < 5
    assert soffice_processes_under(tmp_path) == []


def test_a_killed_conversion_leaves_no_pipe_in_the_machines_tmp(tmp_path, generated: Generated):
    """LibreOffice keeps its single-instance pipe in /tmp whenever it can write there
    (OSL_SOCKET_PATH only otherwise: in the sandbox) and removes it when it ends; one
    killed left it for good, in the machine's /tmp outside the sandbox (each full test
    run left one: this kill). Here soffice is killed once its pipe, found by the name
    pipe_paths gives, is there; the conversion's end removes it."""
    import threading

    source = tmp_path / "source"
    source.write_bytes(generated.read("documents/report.docx"))
    [pipe, _] = pipe_paths(tmp_path / "lo" / "profile")
    seen: list[bool] = []

    def kill_once_the_pipe_is_there() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if pipe.exists() and (pids := soffice_processes_under(tmp_path)):
                seen.append(True)
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                return
            time.sleep(0.01)

    killer = threading.Thread(target=kill_once_the_pipe_is_there)
    killer.start()
    try:
        with contextlib.suppress(PipelineError):
            convert(source, detect(source), "pdf", tmp_path, 10**9)
    finally:
        killer.join()
    assert seen == [True], "its pipe never appeared where pipe_paths says"
    assert not pipe.exists()  # old: left there


def test_libreoffice_starts_once_without_its_graphics_render_tests(
    tmp_path, generated: Generated, monkeypatch: pytest.MonkeyPatch
):
    """A profile that never stored its version made every start run LibreOffice's
    graphics render tests (~0.55 CPU-s of a ~0.75 CPU-s conversion); they write
    GraphicsRenderTests.log into the profile when they run. A profile without its
    build id had its extension cache cleaned and soffice.bin exited 81 to be started
    again: two starts a conversion (~0.11 of its ~0.33 CPU-s), one now."""
    exits: list[int] = []
    soffice_run = libreoffice._run

    def run(*args: Any, **kwargs: Any) -> int:
        exits.append(soffice_run(*args, **kwargs))
        return exits[-1]

    monkeypatch.setattr(libreoffice, "_run", run)
    source = tmp_path / "source"
    source.write_bytes(generated.read("documents/report.docx"))
    conversion = convert(source, detect(source), "pdf", tmp_path, 10**9)
    assert [p.suffix for p in conversion.outputs] == [".pdf"]
    assert exits == [0]  # old: [81, 0]
    user = tmp_path / "lo" / "profile" / "user"
    assert (user / "registrymodifications.xcu").is_file()
    assert not (user / "GraphicsRenderTests.log").exists()


def test_html_without_a_closing_head_keeps_its_body(tmp_path):
    html = b"<html><head><title>t</title><meta charset='iso-8859-1'><body><p>Gr\xfc\xdfe</p>"
    output = in_process("extract_text", html, tmp_path)
    assert output.path.read_text(encoding="utf-8") == "Gr\u00fc\u00dfe\n"
