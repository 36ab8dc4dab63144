"""A generated file's manifest entry, in the corpus's ``MANIFEST.tsv`` columns."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

COLUMNS = ("path", "kind", "bytes", "sha256", "source", "license", "expected", "notes")


@dataclass(frozen=True)
class Entry:
    """``path`` under the generated root; ``expected`` as the corpus's MANIFEST says it
    (``valid``, ``reject:<reason>``, ``tolerate:<reason>``, ``neutralize:<what>``,
    ``sanitize:filename``)."""

    path: str
    kind: str
    expected: str
    note: str = ""


def write_manifest(path: Path, entries: list[Entry]) -> None:
    """A MANIFEST.tsv at ``path`` for ``entries`` (files the project made: no source, no
    licence of another's; sizes and hashes are left out, as they vary with the tools'
    versions)."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, delimiter="\t", quoting=csv.QUOTE_NONE, lineterminator="\n")
        writer.writerow(COLUMNS)
        for entry in sorted(entries, key=lambda e: e.path):
            writer.writerow(
                [entry.path, entry.kind, "", "", "generated", "", entry.expected, entry.note]
            )
