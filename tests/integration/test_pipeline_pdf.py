"""pdf_preview and page_texts on generated PDFs and, in the corpus tier, on the shared
corpus: in-process and in a real ChildExecutor.

Every ``documents/*.pdf`` and ``hostile/*.pdf`` row of the generated manifest and of the
corpus's goes through the step twice: called directly, and in a sandboxed child with the
``pdf_preview`` profile's limits (timeout 60 s, 2048 MB, 16 processes). Each outcome
must match the row's ``expected``:

=============================  ==================================================
valid, sanitize:filename       an image that decodes, exactly the requested width
reject:encrypted               ``encrypted_document``
reject:malformed               ``invalid_input``
reject:type-mismatch           ``unsupported_format`` (a PNG or DOCX named .pdf)
reject:decompression-bomb      done or a limit code, within bounds (see below)
tolerate:*                     done (decodes) or ``invalid_input``
neutralize:*                   done, and nothing but the output in the workdir
=============================  ==================================================

``pdfjs-bomb_giant.pdf`` is three *content streams* compressed with JBIG2Decode
(each declaring 100000x100000): PDFium applies image filters to images only, so the
streams are never decoded and the page renders (its text) in milliseconds. The test
holds it to that bound (time, peak memory) or to a limit code, never a crash.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pypdfium2 as pdfium
import pytest
import pyvips
from rich.console import Console
from rich.table import Table

import pipelines.pdf
from hypermedia.sandbox.executor import ChildExecutor, ChildFailed
from pipelines.registry import PipelineError
from tests import corpus_support
from tests.generated import Generated, documents

PRELOAD = ("pipelines.registry", "pipelines.pdf")
# The pdf_preview profile (etc/profiles.toml).
PROFILE_PARAMS: dict[str, Any] = {"page": 1, "width": 1024}
TIMEOUT_S = 60
MEMORY_MB = 2048
MAX_PROCESSES = 16
# What a bomb may end as besides "done": the step's own guard or the sandbox's limits.
LIMIT_CODES = {"pixel_limit", "memory_limit", "cpu_limit", "timeout"}
BOMB_SECONDS = 10.0  # in-process: PDFium never decodes its streams, ~30 ms measured
BOMB_PEAK_MB = 512


@dataclass(frozen=True)
class Row:
    path: str
    expected: str
    file: Path


def pdf_rows(root: Path, rows: list[corpus_support.Row]) -> list[Row]:
    return [
        Row(row.path, row.expected, root / row.path)
        for row in rows
        if row.path.startswith(("documents/", "hostile/")) and row.path.endswith(".pdf")
    ]


def corpus_rows() -> list[Row]:
    return pdf_rows(corpus_support.corpus(), corpus_support.manifest_rows())


def generated_rows(generated: Generated) -> list[Row]:
    return pdf_rows(generated.root, generated.rows(["documents", "hostile"]))


@dataclass(frozen=True)
class Outcome:
    """A run: its output image (size, loader) or its failure code, and its cost."""

    seconds: float
    code: str | None = None
    message: str = ""
    output_type: str = ""
    width: int = 0
    height: int = 0
    loader: str = ""
    peak_mb: float = 0.0
    workdir_extra: tuple[str, ...] = ()


def _decoded(output_path: Path) -> tuple[int, int, str]:
    image = pyvips.Image.new_from_file(str(output_path), access="sequential")
    image.avg()  # decodes every pixel
    return image.width, image.height, str(image.get("vips-loader"))


def problem(row: Row, outcome: Outcome, requested_width: int) -> str | None:
    """Why ``outcome`` does not match the row's ``expected``; None if it does."""
    expected = row.expected
    done = outcome.code is None
    good_image = done and outcome.width == requested_width and outcome.height > 0
    good_image = good_image and outcome.loader.startswith("jpeg")
    if expected in ("valid", "sanitize:filename") or expected.startswith("neutralize:"):
        if not good_image:
            return f"expected an image {requested_width} px wide, got {outcome}"
        if expected.startswith("neutralize:") and outcome.workdir_extra:
            return f"the job left files besides its output: {outcome.workdir_extra}"
        return None
    if expected == "reject:encrypted":
        return None if outcome.code == "encrypted_document" else f"got {outcome}"
    if expected == "reject:malformed":
        return None if outcome.code == "invalid_input" else f"got {outcome}"
    if expected == "reject:type-mismatch":
        return None if outcome.code == "unsupported_format" else f"got {outcome}"
    if expected == "reject:decompression-bomb":
        if done and not good_image:
            return f"done but the image is wrong: {outcome}"
        if not done and outcome.code not in LIMIT_CODES:
            return f"not a limit code: {outcome}"
        if done and outcome.peak_mb > BOMB_PEAK_MB:
            return f"done but peaked at {outcome.peak_mb:.0f} MB"
        return None
    if expected.startswith("tolerate:"):
        if done:
            return None if good_image else f"done but the image is wrong: {outcome}"
        return None if outcome.code == "invalid_input" else f"unstable failure: {outcome}"
    return f"no rule for expected={expected}"


def print_table(title: str, rows: list[tuple[Row, Outcome, str | None]]) -> None:
    table = Table("file", "expected", "outcome", "s", "peak MB", title=title)
    for row, outcome, trouble in rows:
        if outcome.code is None:
            text = f"{outcome.output_type} {outcome.width}x{outcome.height}"
        else:
            text = f"{outcome.code}: {outcome.message}"
        if trouble:
            text = f"PROBLEM {trouble}"
        peak = f"{outcome.peak_mb:.0f}" if outcome.peak_mb else ""
        table.add_row(row.path, row.expected, text[:90], f"{outcome.seconds:.3f}", peak)
    Console(width=200).print(table)


@pytest.mark.corpus
def test_the_corpus_has_the_pdf_rows() -> None:
    rows = corpus_rows()
    expectations = {row.expected for row in rows}
    assert len(rows) >= 50
    assert expectations >= {
        "valid",
        "reject:encrypted",
        "reject:malformed",
        "reject:decompression-bomb",
        "neutralize:javascript",
    }


# -- in-process ------------------------------------------------------------------------


def run_in_process(row: Row, workdir: Path, params: dict[str, Any]) -> Outcome:
    started = time.perf_counter()
    try:
        (output,) = pipelines.pdf.pdf_preview(row.file, params, workdir)
    except PipelineError as exc:
        return Outcome(time.perf_counter() - started, exc.code, exc.message)
    seconds = time.perf_counter() - started
    width, height, loader = _decoded(output.path)
    extra = tuple(sorted(p.name for p in workdir.iterdir() if p != output.path))
    return Outcome(
        seconds,
        output_type=output.output_type,
        width=width,
        height=height,
        loader=loader,
        workdir_extra=extra,
    )


def test_every_generated_pdf_in_process(tmp_path: Path, generated: Generated) -> None:
    rows = generated_rows(generated)
    # Each row is judged by problem(); the count guards against an empty run.
    assert every_pdf_in_process(rows, tmp_path) >= sum(r.expected == "valid" for r in rows) > 5


@pytest.mark.corpus
def test_every_corpus_pdf_in_process(tmp_path: Path) -> None:
    assert every_pdf_in_process(corpus_rows(), tmp_path) >= 45


def every_pdf_in_process(rows: list[Row], tmp_path: Path) -> int:
    """Each row through the step in this process; how many gave an image."""
    results = []
    for index, row in enumerate(rows):
        workdir = tmp_path / str(index)
        outcome = run_in_process(row, workdir, PROFILE_PARAMS)
        trouble = problem(row, outcome, 1024)
        if row.expected == "reject:decompression-bomb" and outcome.seconds > BOMB_SECONDS:
            trouble = f"took {outcome.seconds:.1f} s"
        results.append((row, outcome, trouble))
    print_table("pdf_preview in-process", results)
    assert [f"{row.path}: {trouble}" for row, _, trouble in results if trouble] == []
    return sum(1 for _, outcome, _ in results if outcome.code is None)


# -- in the sandbox --------------------------------------------------------------------


@pytest.fixture(scope="module")
def executor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChildExecutor]:
    with ChildExecutor(tmp_path_factory.mktemp("pdf-sandbox"), preload=PRELOAD) as ex:
        yield ex


def run_in_sandbox(ex: ChildExecutor, job_id: str, row: Row) -> Outcome:
    workdir = ex.prepare(job_id)
    source = workdir / "input" / "source"
    source.write_bytes(row.file.read_bytes())
    started = time.perf_counter()
    try:
        result = ex.run(
            job_id,
            "pdf_preview",
            source,
            PROFILE_PARAMS,
            timeout_seconds=TIMEOUT_S,
            memory_limit_mb=MEMORY_MB,
            max_processes=MAX_PROCESSES,
        )
    except ChildFailed as exc:
        return Outcome(time.perf_counter() - started, exc.code, exc.message)
    seconds = time.perf_counter() - started
    (output,) = result.outputs
    width, height, loader = _decoded(output.path)
    expected_files = {output.path, source, workdir / ".child.log"}
    extra = [p for p in workdir.rglob("*") if p.is_file() and p not in expected_files]
    log = workdir / ".child.log"
    if log.exists() and log.stat().st_size:
        extra.append(log)
    return Outcome(
        seconds,
        output_type=output.output_type,
        width=width,
        height=height,
        loader=loader,
        peak_mb=result.peak_memory_mb,
        workdir_extra=tuple(str(p.relative_to(workdir)) for p in extra),
    )


def test_every_generated_pdf_in_the_sandbox(executor: ChildExecutor, generated: Generated):
    every_pdf_in_the_sandbox(executor, generated_rows(generated))


@pytest.mark.corpus
def test_every_corpus_pdf_in_the_sandbox(executor: ChildExecutor) -> None:
    every_pdf_in_the_sandbox(executor, corpus_rows())


def every_pdf_in_the_sandbox(executor: ChildExecutor, rows: list[Row]) -> None:
    results = []
    for index, row in enumerate(rows):
        outcome = run_in_sandbox(executor, f"pdf-{os.getpid()}-{index}", row)
        trouble = problem(row, outcome, 1024)
        if outcome.code in ("pipeline_crashed", "child_killed", "sandbox_unavailable"):
            trouble = f"the child did not end cleanly: {outcome}"
        # The wall clock (timeout x 1.5) is the last resort: nothing may outlive it.
        if outcome.seconds > TIMEOUT_S * 1.5 + 15:
            trouble = f"took {outcome.seconds:.1f} s"
        results.append((row, outcome, trouble))
    print_table("pdf_preview in a ChildExecutor (60 s, 2048 MB, 16 processes)", results)
    assert [f"{row.path}: {trouble}" for row, _, trouble in results if trouble] == []
    assert executor.job_processes() == []


def test_out_of_memory_in_the_sandbox_fails_cleanly(
    executor: ChildExecutor, generated: Generated
) -> None:
    """Far below the profile's memory (150 MB for a 4096 px PNG of an A4 page) the job
    fails at once and leaves nothing running. PDFium's allocator dies of SIGTRAP when
    RLIMIT_AS refuses it (the executor reports ``child_killed`` for that signal until
    hypermedia/sandbox/outcome.py counts it as a crash); libvips' refusals become
    ``memory_limit``."""
    job_id = f"pdf-{os.getpid()}-oom"
    workdir = executor.prepare(job_id)
    source = workdir / "input" / "source"
    source.write_bytes(generated.read("documents/pages-4.pdf"))
    started = time.perf_counter()
    with pytest.raises(ChildFailed) as caught:
        executor.run(
            job_id,
            "pdf_preview",
            source,
            {"width": 4096, "format": "png"},
            timeout_seconds=TIMEOUT_S,
            memory_limit_mb=150,
            max_processes=MAX_PROCESSES,
        )
    print(f"\nat 150 MB: {caught.value.code}: {caught.value.message}")
    assert caught.value.code in ("memory_limit", "pipeline_crashed", "child_killed")
    assert time.perf_counter() - started < 10
    assert not (workdir / "preview-p1-w4096.png").exists()
    assert executor.job_processes() == []


# -- parameters, pages, formats --------------------------------------------------------


def preview(path: Path, params: dict[str, Any], workdir: Path) -> tuple[str, int, int, str]:
    (output,) = pipelines.pdf.pdf_preview(path, params, workdir)
    assert output.path.parent == workdir
    width, height, loader = _decoded(output.path)
    return output.output_type, width, height, loader


def test_formats_widths_and_pages(tmp_path: Path, generated: Generated) -> None:
    path = generated / "documents/pages-4.pdf"  # A4
    assert preview(path, {}, tmp_path) == ("preview-p1-w1024-q85.jpg", 1024, 1449, "jpegload")
    out = preview(path, {"page": 4, "width": 300, "format": "png"}, tmp_path)
    assert out == ("preview-p4-w300.png", 300, 425, "pngload")
    out = preview(path, {"page": 2, "width": 4096, "format": "webp", "quality": 60}, tmp_path)
    assert out == ("preview-p2-w4096-q60.webp", 4096, 5793, "webpload")


def test_rotated_pages_render_as_displayed(tmp_path: Path, generated: Generated) -> None:
    # Both 612 x 792 points; the second says /Rotate 90.
    _, width, height, _ = preview(generated / "documents/portrait.pdf", {"width": 400}, tmp_path)
    assert (width, height) == (400, 518)
    _, width, height, _ = preview(generated / "documents/rotated.pdf", {"width": 400}, tmp_path)
    assert (width, height) == (400, 310)


def test_a_page_beyond_the_document_names_the_page_count(
    tmp_path: Path, generated: Generated
) -> None:
    with pytest.raises(PipelineError) as caught:
        pipelines.pdf.pdf_preview(generated / "documents/pages-4.pdf", {"page": 5}, tmp_path)
    assert caught.value.code == "invalid_params"
    assert "4 pages" in caught.value.message
    assert list(tmp_path.iterdir()) == []


def test_bad_params_fail_before_the_file_is_read(tmp_path: Path) -> None:
    missing = tmp_path / "does-not-exist"
    for params in ({"width": 5000}, {"format": "gif"}, {"page": 0}, {"dpi": 150}):
        with pytest.raises(PipelineError) as caught:
            pipelines.pdf.pdf_preview(missing, params, tmp_path)
        assert caught.value.code == "invalid_params"


def minimal_pdf(pages: list[tuple[float, float]]) -> bytes:
    """A PDF of blank pages with the given MediaBox sizes (points), xref offsets right."""
    kids = " ".join(f"{3 + i} 0 R" for i in range(len(pages)))
    objects = [
        "<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {len(pages)} >>",
    ]
    objects += [f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 {w} {h}] >>" for w, h in pages]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode()
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{offset:010d} 00000 n \n" for offset in offsets).encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\n".encode()
    out += f"startxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


def failure(data: bytes, params: dict[str, Any], tmp_path: Path) -> PipelineError:
    source = tmp_path / "source"
    source.write_bytes(data)
    with pytest.raises(PipelineError) as caught:
        pipelines.pdf.pdf_preview(source, params, tmp_path / "out")
    return caught.value


def test_an_absurd_page_shape_is_refused_before_pdfium_allocates(tmp_path: Path) -> None:
    # 1 x 14400 points at 1024 px wide: a 1024 x 14,745,600 bitmap (60 GB).
    error = failure(minimal_pdf([(1, 14400)]), {}, tmp_path)
    assert error.code == "pixel_limit"
    assert "1,024 x 14,745,600" in error.message
    # A long receipt-like page (200 x 5000 points) renders; WebP cannot hold it.
    source = tmp_path / "source"
    source.write_bytes(minimal_pdf([(200, 5000)]))
    (output,) = pipelines.pdf.pdf_preview(source, {}, tmp_path / "long")
    assert _decoded(output.path)[:2] == (1024, 25600)
    error = failure(minimal_pdf([(200, 5000)]), {"format": "webp"}, tmp_path)
    assert error.code == "pixel_limit"
    assert "16,383 pixels a side" in error.message


def test_broken_inputs(tmp_path: Path, generated: Generated) -> None:
    assert failure(b"", {}, tmp_path).code == "invalid_input"
    assert failure(minimal_pdf([]), {}, tmp_path).code == "invalid_input"
    assert failure(generated.read("hostile/garbage.pdf"), {}, tmp_path).code == "invalid_input"
    png = generated.read("images/drawing.png")
    error = failure(png, {}, tmp_path)
    assert (error.code, error.message) == ("unsupported_format", "PNG image is not a PDF document")


def test_javascript_documents_get_no_form_environment(tmp_path: Path, generated: Generated) -> None:
    # PDFium runs JavaScript only through a form-fill environment: the step never
    # makes one, so open/page actions stay inert (see the sandbox run for side effects).
    path = generated / "hostile/javascript.pdf"
    assert b"/OpenAction << /S /JavaScript" in path.read_bytes()
    with pipelines.pdf.open_pdf(path) as document:
        assert document.formenv is None
    assert preview(path, {"width": 200}, tmp_path)[1] == 200


# -- page_texts ------------------------------------------------------------------------


def test_page_texts_of_a_document(generated: Generated) -> None:
    texts = pipelines.pdf.page_texts(generated / "documents/pages-4.pdf", 100)
    assert [text.strip() for text in texts] == [
        documents.PAGE_WORDS.format(n=n) for n in range(1, 5)
    ]


def test_page_texts_of_other_scripts_and_empty_pages(generated: Generated) -> None:
    texts = pipelines.pdf.page_texts(generated / "documents/hello.pdf", 10)
    assert texts[0].count(documents.HELLO) >= 2
    (arabic,) = pipelines.pdf.page_texts(generated / "documents/arabic.pdf", 10)
    assert "العربية" in arabic
    (scan,) = pipelines.pdf.page_texts(generated / "documents/scan.pdf", 10)
    assert scan.strip() == ""


def test_page_texts_limits_and_refusals(generated: Generated) -> None:
    with pytest.raises(PipelineError) as caught:
        pipelines.pdf.page_texts(generated / "documents/pages-4.pdf", 3)
    assert caught.value.code == "page_limit"
    assert "4 pages" in caught.value.message
    with pytest.raises(PipelineError) as caught:
        pipelines.pdf.page_texts(generated / "hostile/encrypted.pdf", 10)
    assert caught.value.code == "encrypted_document"
    with pytest.raises(PipelineError) as caught:
        pipelines.pdf.page_texts(generated / "hostile/garbage.pdf", 10)
    assert caught.value.code == "invalid_input"
    # A damaged page gives "" rather than losing the others.
    texts = pipelines.pdf.page_texts(generated / "hostile/damaged-page-tree.pdf", 10)
    assert len(texts) >= 2
    assert "first page" in texts[0] and "third page" in texts[-1]


# -- timing (printed, not asserted) ----------------------------------------------------


def test_measure_first_page_at_150_dpi(tmp_path: Path, generated: Generated) -> None:
    name = "documents/pages-4.pdf"
    with pipelines.pdf.open_pdf(generated / name) as document:
        width_points = document[0].get_width()
    width = round(width_points * 150 / 72)
    times = []
    for run in range(10):
        started = time.perf_counter()
        pipelines.pdf.pdf_preview(generated / name, {"width": width}, tmp_path / str(run))
        times.append(time.perf_counter() - started)
    print(
        f"\n{name} page 1 -> {width} px (150 dpi) JPEG: median"
        f" {statistics.median(times) * 1000:.1f} ms, min {min(times) * 1000:.1f} ms"
        f" (pypdfium2 {pdfium.PYPDFIUM_INFO}, PDFium {pdfium.PDFIUM_INFO})"
    )
