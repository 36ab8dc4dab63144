"""Checkpoints: finished pieces of a long step, kept across attempts.

A step that works in pieces (``transcode_video`` over its chunking threshold) writes
each finished piece into :func:`directory` of its workdir under a name of its own
(``[a-z0-9][a-z0-9._-]*``, the same name for the same piece on every attempt), first
as a hidden partial file and then renamed (:func:`commit`): a name there is always a
whole piece, whatever killed the step in between.

A piece is tied to the build that made it (:func:`build_tag`: a digest of what the
step's output depends on besides its input and parameters, such as FFmpeg's version
or the OCR engines' and their models'): a step passes its build to :func:`partial`,
:func:`commit` and :func:`finished`, which keep the piece under a name of its build
(``b<12 hex digits>-<name>``) and find only the pieces of that build. A retry on a
node with another build makes the pieces again under names of their own, and never
joins its results with another build's.

Whoever runs the step keeps those pieces: the worker stores each one as it appears
and puts the stored ones back into the same directory before a retry runs, on any
node; the step then skips what it finds. A piece is only ever read by the job that
made it, with the same input and parameters. Imports nothing from ``hypermedia``
(see :mod:`pipelines.registry`).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

__all__ = [
    "DIRECTORY",
    "build_tag",
    "commit",
    "directory",
    "finished",
    "partial",
    "stored_name",
    "valid_name",
]

DIRECTORY = "checkpoints"
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_PARTIAL_PREFIX = ".partial-"


def valid_name(name: str) -> bool:
    """A piece's name as it may be stored (no path, no hidden file)."""
    return bool(_NAME.fullmatch(name)) and ".." not in name


def build_tag(build: str) -> str:
    """What a piece's name carries of the build that made it (``build``: the step's
    words for it, such as ``ffmpeg -version``'s text)."""
    return "b" + hashlib.sha256(build.encode()).hexdigest()[:12] + "-"


def stored_name(name: str, build: str = "") -> str:
    """The file name of the piece ``name`` made by ``build`` ('': the name itself)."""
    stored = (build_tag(build) if build else "") + name
    if not valid_name(stored):
        raise ValueError(f"{stored!r} is not a checkpoint name")
    return stored


def directory(workdir: Path) -> Path:
    """Where the job's finished pieces are (not created)."""
    return workdir / DIRECTORY


def partial(workdir: Path, name: str, build: str = "") -> Path:
    """Where the piece ``name`` of ``build`` is written before it is whole."""
    path = directory(workdir) / f"{_PARTIAL_PREFIX}{stored_name(name, build)}"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def commit(workdir: Path, name: str, build: str = "") -> Path:
    """The partial piece ``name`` of ``build`` is whole: rename it to its name (atomic)."""
    final = directory(workdir) / stored_name(name, build)
    os.replace(partial(workdir, name, build), final)
    return final


def finished(workdir: Path, build: str = "") -> dict[str, Path]:
    """The whole pieces in the workdir, by name: with ``build``, only that build's (by
    the names the step gave them); without, every piece by its file name."""
    found = directory(workdir)
    if not found.is_dir():
        return {}
    tag = build_tag(build) if build else ""
    return {
        entry.name.removeprefix(tag): Path(entry.path)
        for entry in os.scandir(found)
        if valid_name(entry.name)
        and entry.name.startswith(tag)
        and entry.is_file(follow_symlinks=False)
    }
