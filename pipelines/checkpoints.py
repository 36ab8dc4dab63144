"""Checkpoints: finished pieces of a long step, kept across attempts.

A step that works in pieces (``transcode_video`` over its chunking threshold) writes
each finished piece into :func:`directory` of its workdir under a name of its own
(``[a-z0-9][a-z0-9._-]*``, the same name for the same piece on every attempt), first
as a hidden partial file and then renamed (:func:`commit`): a name there is always a
whole piece, whatever killed the step in between.

Whoever runs the step keeps those pieces: the worker stores each one as it appears
and puts the stored ones back into the same directory before a retry runs, on any
node; the step then skips what it finds. A piece is only ever read by the job that
made it, with the same input and parameters. Imports nothing from ``hypermedia``
(see :mod:`pipelines.registry`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["DIRECTORY", "commit", "directory", "finished", "partial", "valid_name"]

DIRECTORY = "checkpoints"
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_PARTIAL_PREFIX = ".partial-"


def valid_name(name: str) -> bool:
    """A piece's name as it may be stored (no path, no hidden file)."""
    return bool(_NAME.fullmatch(name)) and ".." not in name


def directory(workdir: Path) -> Path:
    """Where the job's finished pieces are (not created)."""
    return workdir / DIRECTORY


def partial(workdir: Path, name: str) -> Path:
    """Where the piece ``name`` is written before it is whole."""
    if not valid_name(name):
        raise ValueError(f"{name!r} is not a checkpoint name")
    path = directory(workdir) / f"{_PARTIAL_PREFIX}{name}"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def commit(workdir: Path, name: str) -> Path:
    """The partial piece ``name`` is whole: rename it to its name (atomic)."""
    final = directory(workdir) / name
    os.replace(partial(workdir, name), final)
    return final


def finished(workdir: Path) -> dict[str, Path]:
    """The whole pieces in the workdir, by name."""
    found = directory(workdir)
    if not found.is_dir():
        return {}
    return {
        entry.name: Path(entry.path)
        for entry in os.scandir(found)
        if valid_name(entry.name) and entry.is_file(follow_symlinks=False)
    }
