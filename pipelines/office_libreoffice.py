"""LibreOffice 7.4 (headless) for the office steps (:mod:`pipelines.office`): what
the input is, and one conversion of it, watched.

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
  on load off (Writer, Calc), no auto-save, no recovery, no first-run handling;
* the last version run (``ooSetupLastVersion``) later than this LibreOffice: otherwise
  every start counts as the first after an upgrade and runs the graphics render tests
  (~0.55 CPU-s a conversion, 3x the rest of a small document's).

LibreOffice exits 0 even when it could not load the input: :func:`to_pdf` and
:func:`to_sheets` check that the output exists, is a PDF that PDFium opens with at
least one page (or that the CSV files are there), else ``invalid_input``. While it
runs, the output directory's size is watched (and each file capped with
``RLIMIT_FSIZE`` through ``prlimit``): a CSV over ``max_text_bytes``
(``poi-poc-shared-strings.xlsx``: 12,000 cells referencing one 1 MB string, ~12 GB of
CSV) is ``output_limit`` after at most that many bytes, never a full disk. A
conversion over :data:`CONVERT_TIMEOUT_SECONDS` is killed (``timeout``). The PDF
export is asked for pages ``1..max_pages + 1`` only, so a huge document costs its
layout but not its export, and one page more than the limit says ``page_limit``.

LibreOffice runs as ``soffice.bin`` itself, not through its ``soffice``/``oosplash``
launcher: ``oosplash`` refuses to start when ``/tmp`` and ``/var/tmp`` are read-only
(the sandbox) ("no valid pipe path found"), while ``soffice.bin`` takes its
single-instance pipe's directory from ``-env:OSL_SOCKET_PATH`` (here its own cwd). A
fresh profile gets the build id of the LibreOffice it is for (``user/extensions/buildid``,
from ``program/versionrc``): without it LibreOffice took the profile's extension cache
for another build's, cleaned it and exited 81 to be started again (as ``oosplash``
does), ~0.11 of a small document's ~0.33 CPU-s; where it still exits 81 (its build id
unread) it is run again.
``MAX_CONCURRENCY`` caps its thread pool (one thread a core otherwise), so the thread
count, which ``RLIMIT_NPROC`` counts, does not depend on the machine. Measured in the
sandbox: a docx needs ``max_processes`` >= 5, a pptx >= 6 (the step plus
``soffice.bin``'s threads; below that it reports "source file could not be loaded",
which the step can only call ``invalid_input``); the default 16 leaves room. Small
documents convert within an address space of 256 MB (resident ~210 MB); the
profiles' 2048 MB leaves room for large ones.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import IO

from pipelines import pdf
from pipelines.formats.inspection import inspect_file
from pipelines.registry import PipelineError

log = logging.getLogger(__name__)

# A PDF LibreOffice writes is refused beyond this (the sandbox's RLIMIT_FSIZE is 10 GB).
MAX_PDF_BYTES = 2 * 1024 * 1024 * 1024
CONVERT_TIMEOUT_SECONDS = 110.0
_POLL_SECONDS = 0.05
# soffice.bin exits 81 when it wants to be started again (a profile not marked with its
# build id: write_build_id): run it again (as its launcher, oosplash, would; oosplash
# itself refuses to start when /tmp is read-only).
_RESTART = 81
_ATTEMPTS = 3
_THREADS = 2


@dataclass(frozen=True, slots=True)
class DocumentKind:
    """What the input is: a profile ``kind``, the LibreOffice application that reads it
    (``writer``, ``calc``, ``impress``; ``pdf``, ``text``, ``html`` for the rest), the
    extension LibreOffice gets, and a label for messages."""

    kind: str
    family: str
    extension: str
    label: str


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
    # The version the profile last ran: a LibreOffice newer than it counts as just
    # upgraded and runs its graphics render tests at start (GraphicsRenderTests: two
    # 4096 x 4096 cairo surfaces zeroed and drawn on, ~0.55 of a conversion's ~0.75
    # CPU-s; a --convert-to run never stores the version, so every fresh profile ran
    # them). No LibreOffice has version 99.9 (they are numbered year.month: 24.2 ...).
    ("/org.openoffice.Setup/Product", "ooSetupLastVersion", "99.9"),
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


@cache
def build_id() -> str | None:
    """The build id of this LibreOffice (``buildid`` in ``program/versionrc`` beside
    ``soffice.bin``, what it compares a profile's ``user/extensions/buildid`` with);
    None where it cannot be read."""
    binary = _office_binary()
    if binary is None:
        return None
    try:
        lines = (Path(binary).parent / "versionrc").read_text(encoding="latin-1").splitlines()
    except OSError:
        return None
    for line in lines:
        key, equals, value = line.partition("=")
        if equals and key.strip() == "buildid" and value.strip():
            return value.strip()
    return None


def write_build_id(user: Path) -> None:
    """Mark the profile's ``user`` directory as this LibreOffice's (:func:`build_id`):
    a profile without the mark has its extension cache cleaned at start and LibreOffice
    exits 81 to be started again (a second start: ~0.11 CPU-s)."""
    found = build_id()
    if found is not None:
        (user / "extensions").mkdir(parents=True, exist_ok=True)
        (user / "extensions" / "buildid").write_text(found, encoding="latin-1")


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
    write_build_id(profile_user)
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
    try:
        with log_path.open("wb") as log_file:
            for _attempt in range(_ATTEMPTS):
                returncode = _run(command, home, env, log_file, out, max_output_bytes, deadline)
                if returncode != _RESTART:
                    break
    finally:
        for left in pipe_paths(profile):
            # Read-only in the sandbox (its pipe is not there): nothing to remove.
            with contextlib.suppress(OSError):
                left.unlink(missing_ok=True)
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


def pipe_paths(profile: Path) -> list[Path]:
    """Where a LibreOffice on ``profile`` keeps its single-instance pipe: /tmp, else
    /var/tmp, whichever it can write (OSL_SOCKET_PATH only when it can write neither, as
    in the sandbox), named for the profile's URL (the hex of its UTF-16 MD5, each byte
    unpadded). A run it ends removes it; one killed (past its time or output limit)
    left it there for good: outside the sandbox (an in-process conversion) in the
    machine's /tmp."""
    import hashlib

    digest = hashlib.md5(profile.as_uri().encode("utf-16-le"), usedforsecurity=False).digest()
    name = f"OSL_PIPE_{os.getuid()}_SingleOfficeIPC_{''.join(format(b, 'x') for b in digest)}"
    # LibreOffice's own fixed places (unlinking a name there removes no link's target).
    return [Path(directory, name) for directory in ("/tmp", "/var/tmp")]  # noqa: S108


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


def to_sheets(
    source: Path, kind: DocumentKind, workdir: Path, max_bytes: int
) -> list[tuple[str, Path]]:
    """``source`` (a spreadsheet) as one CSV file per sheet: ``(sheet name, CSV)`` pairs,
    in the order LibreOffice wrote them; ``output_limit`` past ``max_bytes`` of CSV in all."""
    result = convert(source, kind, _CSV_FILTER, workdir, max_bytes)
    sheets = [p for p in result.outputs if p.suffix == ".csv"]
    if not sheets:
        raise _not_converted(kind, result)
    prefix = f"{_STEM}-"
    return [(sheet.stem.removeprefix(prefix), sheet) for sheet in sheets]


def cleanup(workdir: Path) -> None:
    """Remove what the conversions left in ``workdir`` (their directory of their own)."""
    shutil.rmtree(workdir / "lo", ignore_errors=True)
