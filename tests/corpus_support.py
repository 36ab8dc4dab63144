"""The shared corpus: where it is, its MANIFEST, and what the platform must do with each
row: the operation a file gets, and the outcomes allowed where a verdict belongs at
ingest. The generated files (:mod:`tests.generated`) write manifests in the same columns
and words, so the same rules judge them.

The corpus is not part of the project (never copied here): ``HYPERMEDIA_TEST_CORPUS``
names it, else ``shared/corpus`` beside the checkout is used where it exists. Nothing
here reads it at import: tests of the corpus tier (``@pytest.mark.corpus``) call
:func:`corpus` when they run, and :mod:`tests.tiers` deselects them, or fails them in
CI, when it is absent.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

CORPUS_ENV = "HYPERMEDIA_TEST_CORPUS"
REPO = Path(__file__).resolve().parents[1]
BESIDE_THE_CHECKOUT = REPO.parent / "shared" / "corpus"
DIRECTORIES = ("hostile", "documents", "images", "media")
ACCEPTED = "accepted"


@dataclass(frozen=True)
class Lookup:
    """Where the corpus is (``path``), or why it is not there (``problem``)."""

    path: Path | None
    problem: str


def find_corpus() -> Lookup:
    """``HYPERMEDIA_TEST_CORPUS`` when set (a wrong one is a problem, not a fallback: it
    was asked for), else ``shared/corpus`` beside the checkout."""
    configured = os.environ.get(CORPUS_ENV)
    if configured:
        root = Path(configured)
        if (root / "MANIFEST.tsv").is_file():
            return Lookup(root, "")
        return Lookup(None, f"{CORPUS_ENV}={configured} is not a corpus (no MANIFEST.tsv)")
    if (BESIDE_THE_CHECKOUT / "MANIFEST.tsv").is_file():
        return Lookup(BESIDE_THE_CHECKOUT, "")
    return Lookup(
        None,
        f"no test corpus: set {CORPUS_ENV}=/path/to/corpus"
        " or put shared/corpus beside the checkout",
    )


def corpus() -> Path:
    """The corpus root (holding MANIFEST.tsv)."""
    found = find_corpus()
    assert found.path is not None, found.problem
    return found.path


OPERATION_BY_KIND = {
    "image": "thumbnail",
    "pdf": "pdf_preview",
    "ooxml-word": "docx_to_pdf",
    "odf-text": "docx_to_pdf",
    "msword": "docx_to_pdf",
    "rtf": "docx_to_pdf",
    "ooxml-sheet": "extract_text",
    "ooxml-slides": "extract_text",
    "odf-sheet": "extract_text",
    "odf-slides": "extract_text",
    "msexcel": "extract_text",
    "mspowerpoint": "extract_text",
    "text": "extract_text",
    "html": "extract_text",
    "video": "transcode_video",
    "audio": "transcode_audio",
}
OPERATION_BY_NAME = {
    **dict.fromkeys(
        (".jpg", ".jpeg", ".png", ".gif", ".webp", ".tif", ".tiff", ".bmp", ".heic"), "thumbnail"
    ),
    **dict.fromkeys((".avif", ".svg", ".svgz", ".ico", ".jxl"), "thumbnail"),
    ".pdf": "pdf_preview",
    **dict.fromkeys((".docx", ".doc", ".odt", ".rtf", ".docm", ".fodt"), "docx_to_pdf"),
    **dict.fromkeys((".xlsx", ".xlsm", ".pptx", ".pptm", ".ods", ".odp"), "extract_text"),
    **dict.fromkeys((".mp4", ".mov", ".avi", ".mkv", ".webm"), "transcode_video"),
    **dict.fromkeys((".mp3", ".m4a", ".wav", ".flac", ".ogg", ".mid"), "transcode_audio"),
}

# Reasons whose verdict belongs at ingest, and the code that says it.
INGEST_CODES: dict[str, set[str]] = {
    "macro": {"macro_document"},
    "dde": {"macro_document"},
    "encrypted": {"encrypted_document"},
    "drm": {"encrypted_document"},
    "zip-bomb": {"zip_bomb"},
    "path-traversal": {"path_traversal"},
    "xxe": {"unsafe_xml"},
    "xml-bomb": {"unsafe_xml"},
    "pixel-flood": {"pixel_limit"},
    # The content is of another kind (mismatch) or of the right kind in a format the
    # operation does not process (an SVG named .png, for thumbnail).
    "type-mismatch": {"input_type_mismatch", "unsupported_format"},
    "unsupported-type": {"unsupported_format"},
    "empty": {"invalid_input"},
}
# Rows of reasons that are mostly the decoders' but that ingest can already tell.
INGEST_FILES = {
    "hostile/derived-polyglot-jpeg-docx.jpg": "polyglot_file",
    "hostile/tika-testWORD_truncated.docx": "invalid_input",
    "hostile/tika-droste.zip": "zip_bomb",
    "hostile/derived-zipbomb.docx": "zip_bomb",
    "hostile/pillow-decompression_bomb.gif": "pixel_limit",
    "hostile/pdfjs-bomb_giant.pdf": "pixel_limit",  # JBIG2 page of 100000x100000
    # A truncated gzip: an archive by content, which no image operation takes.
    "hostile/libvips-truncated.svgz": "input_type_mismatch",
    "hostile/derived-svg-with-script-named.png": "unsupported_format",
    "hostile/tika-testODTnotaZipFile.odt": "input_type_mismatch",
    "hostile/derived-pdf-named.jpg": "input_type_mismatch",
    "hostile/derived-png-named.pdf": "input_type_mismatch",
    "hostile/derived-docx-named.pdf": "input_type_mismatch",
    "hostile/derived-mp4-named.mp3": "input_type_mismatch",
    "documents/pdfjs-empty_protected.pdf": "accepted",  # owner password only: it opens
    # The generated files (tests/generated/hostile.py) whose verdict is one code.
    "hostile/polyglot-jpeg-zip.jpg": "polyglot_file",
    "hostile/truncated.docx": "invalid_input",
    "hostile/not-a-zip.odt": "input_type_mismatch",
    "hostile/pdf-named.jpg": "input_type_mismatch",
    "hostile/png-named.pdf": "input_type_mismatch",
    "hostile/docx-named.pdf": "input_type_mismatch",
    "hostile/mp4-named.mp3": "input_type_mismatch",
    "hostile/svg-with-script-named.png": "unsupported_format",
    "hostile/playlist-named.mp4": "unsupported_format",
    "hostile/concat-named.mp4": "unsupported_format",
    "hostile/truncated.svgz": "unsupported_format",
    "documents/owner-protected.pdf": "accepted",
}


@dataclass(frozen=True)
class Row:
    path: str
    kind: str
    expected: str


def read_manifest(path: Path, directories: Iterable[str] | None = None) -> list[Row]:
    """The rows of the MANIFEST.tsv at ``path`` (of ``directories`` only, if given)."""
    wanted = None if directories is None else set(directories)
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [
            Row(r["path"], r["kind"], r["expected"])
            for r in reader
            if wanted is None or r["path"].split("/", 1)[0] in wanted
        ]


def manifest_rows(directories: tuple[str, ...] = DIRECTORIES) -> list[Row]:
    """The corpus's rows in ``directories``."""
    return read_manifest(corpus() / "MANIFEST.tsv", directories)


def collected_rows(directories: tuple[str, ...] = DIRECTORIES) -> list[Row]:
    """For parametrizing at collection: the corpus's rows, or none when it is absent
    (the tier's hooks then deselect or fail the tests)."""
    return manifest_rows(directories) if find_corpus().path is not None else []


def operation_for(row: Row, detected: str) -> str:
    by_name = OPERATION_BY_NAME.get(Path(row.path).suffix.lower())
    if row.expected == "reject:type-mismatch" and by_name:
        return by_name
    # What no operation takes (archives, unknown bytes) is judged by the refusals that
    # hold for every operation; extract_text has a pipeline step, so ingest accepts it.
    return OPERATION_BY_KIND.get(detected) or by_name or "extract_text"


def allowed(row: Row) -> set[str] | None:
    """The outcomes allowed at ingest; None: accepted or any stable refusal."""
    if row.path in INGEST_FILES:
        return {INGEST_FILES[row.path]}
    verdict, _, reason = row.expected.partition(":")
    if verdict == "reject" and reason in INGEST_CODES:
        return INGEST_CODES[reason]
    if verdict == "valid" or row.expected.startswith("neutralize:"):
        # Processed, or a clear refusal of a format the platform does not process.
        return {ACCEPTED, "unsupported_format"}
    if verdict == "sanitize":
        return {ACCEPTED}
    return None  # tolerate:*, and reject:* reasons the decoders judge
