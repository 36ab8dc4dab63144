"""Test inputs the project makes itself: real formats written by our code and the real
tools, so every tier but the corpus tier runs in a clone with nothing beside it.

The files sit in groups, one directory each, laid out like the shared corpus::

    images/     every supported image format, and two refused ones   pyvips, Pillow
    documents/  DOCX, ODT, DOC, RTF, XLSX, XLS, ODS, PPTX, PPT, ODP, PDF  LibreOffice
    media/      video and audio                                        FFmpeg lavfi
    ocr/        text pages with their truth (.txt), scanned and born-digital PDFs  Pillow
    hostile/    bombs, polyglots, macros, traversal, XXE, disguised files, hostile
                names (built by code from the three groups above)

Each group also writes ``<group>/MANIFEST.tsv`` in the corpus's columns, with the
corpus's ``expected`` words, so the tests that judge a file by its manifest row judge
these the same way (:mod:`tests.corpus_support`).

:class:`Generated` builds a group the first time a test asks for one of its files
(a file lock makes concurrent sessions and xdist workers build it once); the
``generated`` fixture (:mod:`tests.tiers`) is one per test session. To look at them:
``.venv/bin/python -m tests.generated <directory>`` writes every group there.
"""

from __future__ import annotations

import fcntl
import shutil
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.corpus_support import Row, read_manifest
from tests.generated import documents, hostile, images, media, ocr_pages
from tests.generated.entries import Entry, write_manifest

Builder = Callable[[Path], list[Entry]]
# group -> (builder, the groups it reads from)
GROUPS: dict[str, tuple[Builder, tuple[str, ...]]] = {
    "images": (images.build, ()),
    "documents": (documents.build, ()),
    "media": (media.build, ()),
    "hostile": (hostile.build, ("images", "documents", "media")),
    "ocr": (ocr_pages.build, ()),
}
MANIFEST = "MANIFEST.tsv"


class Generated:
    """The generated files under ``root``, each group built on first use."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def __truediv__(self, relative: str) -> Path:
        """``generated / "images/alpha.png"``: the file, its group built if need be."""
        self.group(relative.split("/", 1)[0])
        path = self.root / relative
        assert path.is_file(), f"the generator makes no {relative}"
        return path

    def read(self, relative: str) -> bytes:
        return (self / relative).read_bytes()

    def group(self, name: str) -> Path:
        """The group's directory, built (with the groups it reads from) if need be."""
        builder, needs = GROUPS[name]
        for need in needs:
            self.group(need)
        directory = self.root / name
        if (directory / MANIFEST).is_file():
            return directory
        with _locked(self.root / f".{name}.lock"):
            if not (directory / MANIFEST).is_file():
                shutil.rmtree(directory, ignore_errors=True)  # a build that failed midway
                entries = builder(self.root)
                write_manifest(directory / MANIFEST, entries)
        return directory

    def rows(self, groups: Iterable[str] = tuple(GROUPS)) -> list[Row]:
        """The manifest rows of ``groups``, paths relative to the root."""
        return [row for name in groups for row in read_manifest(self.group(name) / MANIFEST)]


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_all(directory: Path) -> list[Row]:
    """Write every group into ``directory``; their manifest rows."""
    return Generated(directory).rows()
