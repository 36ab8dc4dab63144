"""Where the shipped defaults live (``profiles.toml``, ``scheduler.json``, traces)."""

from __future__ import annotations

import sys
from pathlib import Path


def shipped_etc(candidates: tuple[Path, ...] | None = None) -> Path:
    """The checkout's ``etc/`` (an editable install), else ``<prefix>/share/hypermedia/etc``
    where a wheel installs them (pyproject's data-files)."""
    found = candidates or (
        Path(__file__).resolve().parent.parent / "etc",
        Path(sys.prefix) / "share" / "hypermedia" / "etc",
    )
    return next((path for path in found if (path / "profiles.toml").is_file()), found[0])
