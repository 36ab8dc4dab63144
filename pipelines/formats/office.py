"""ZIP containers (OOXML, ODF, plain ZIP) and OLE2 compound files, read without extracting.

ZIP. The end-of-central-directory record is read first (bounded: a central directory
over :data:`MAX_CENTRAL_DIRECTORY_BYTES` is not even parsed), then :mod:`zipfile` reads
the directory only. Facts gathered for :func:`hypermedia.sandbox.inspect.check_operation`:

* ``zip``: entry count, declared uncompressed and compressed totals, the largest
  per-entry ratio among entries of at least 1 MiB (small entries compress absurdly well
  and harmlessly), overlapping entries (the "non-recursive" bomb), nested archives and
  whether one is the container itself (a quine such as ``droste.zip``);
* ``path_traversal``: an entry name with ``..``, a leading ``/``, a drive letter or a
  backslash;
* the type: ``[Content_Types].xml`` (OOXML: its main part says Word, Excel or
  PowerPoint, and whether macro-enabled) or ``mimetype`` / ``META-INF/manifest.xml``
  (ODF);
* ``macros``: ``vbaProject.bin``, VBA/XLM macro sheet/ActiveX content types,
  macro-enabled main parts, DDE links in external-link parts, ODF ``Basic/`` or
  ``Scripts/`` entries;
* ``encrypted``: ODF manifest ``encryption-data``, or encrypted ZIP entries;
* ``unsafe_xml``: a DTD in the prolog of an XML part (its first :data:`PROLOG_BYTES`
  read by expat up to the root element, :func:`prolog_danger`, so comments and
  processing instructions hide nothing): in OOXML any DTD (the packaging rules forbid
  them); in ODF an internal subset (entity declarations: expansion) or an external
  identifier other than a plain file name (a URL or a path: XXE), while the relative
  ``PUBLIC ... "Manifest.dtd"`` of older OpenOffice files is allowed; a prolog expat
  cannot read (not well-formed, an encoding it does not know) or that does not reach
  the root element within the read; an ``xl/xmlMaps.xml`` schema pulling another schema
  from a URL;
* ``pages``: ``docProps/app.xml`` ``<Pages>``/``<Slides>``, ODF ``meta:page-count``;
* ``text_bytes`` (workbooks): the bytes of text the cells that use shared strings
  expand to (each cell counts its string's length: one long string referenced by many
  cells is a "shared strings" bomb, POI's ``poc-shared-strings.xlsx``), read from the
  shared-strings and worksheet parts when they are small enough to read whole
  (:data:`MAX_SHEET_PARTS_BYTES`).

Only the first :data:`PROLOG_BYTES` of XML parts and small metadata parts are inflated,
each read capped, so a bomb inflates no further than that.

OLE2 (legacy Office, and encrypted OOXML, which is an OLE2 file holding
``EncryptionInfo`` + ``EncryptedPackage``) is read with ``olefile``: its stream names
give the type (``WordDocument``, ``Workbook``, ``PowerPoint Document``), VBA storages
(``Macros``, ``_VBA_PROJECT_CUR``, ``VBA``), and encryption (OOXML packages, the Word
FIB ``fEncrypted`` bit, an Excel ``FILEPASS`` record, PowerPoint ``EncryptedSummary``).
Excel 4 macro sheets in ``.xls`` are found from the ``BOUNDSHEET`` records.
"""

from __future__ import annotations

import itertools
import re
import struct
import zipfile
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import IO, Any
from xml.parsers import expat

from pipelines.formats.signatures import FLAT_ODF_KINDS
from pipelines.formats.source import Source, buffered

MAX_CENTRAL_DIRECTORY_BYTES = 16 * 1024 * 1024
PROLOG_BYTES = 4096
MAX_METADATA_BYTES = 4 * 1024 * 1024
BIG_ENTRY_BYTES = 1024 * 1024
# Shared strings and worksheets read whole to count what the cells expand to; a
# workbook with more is left uncounted (and is over the ZIP limits long before it
# could hold a bomb that this would miss).
MAX_SHEET_PARTS_BYTES = 32 * 1024 * 1024
# XML parts whose prolog is read; a package with more is refused (unsafe_xml) rather
# than let through half-checked.
MAX_PARTS_READ = 5_000

_ARCHIVE_SUFFIXES = (".zip", ".jar", ".7z", ".rar", ".gz", ".tgz", ".tar", ".bz2", ".xz", ".zst")
_MACRO_CONTENT_TYPES = (
    "application/vnd.ms-office.vbaproject",
    "application/vnd.ms-word.vbadata+xml",
    "application/vnd.ms-excel.macrosheet+xml",
    "application/vnd.ms-excel.intlmacrosheet+xml",
    "application/vnd.ms-office.activex",
    "macroenabled",
)
_OOXML_MAIN = {
    "wordprocessingml.document.main+xml": "ooxml-word",
    "wordprocessingml.template.main+xml": "ooxml-word",
    "ms-word.document.macroenabled.main+xml": "ooxml-word",
    "ms-word.template.macroenabledtemplate.main+xml": "ooxml-word",
    "spreadsheetml.sheet.main+xml": "ooxml-sheet",
    "spreadsheetml.template.main+xml": "ooxml-sheet",
    "ms-excel.sheet.macroenabled.main+xml": "ooxml-sheet",
    "ms-excel.sheet.binary.macroenabled.main": "ooxml-sheet",
    "ms-excel.template.macroenabled.main+xml": "ooxml-sheet",
    "ms-excel.addin.macroenabled.main+xml": "ooxml-sheet",
    "presentationml.presentation.main+xml": "ooxml-slides",
    "presentationml.slideshow.main+xml": "ooxml-slides",
    "presentationml.template.main+xml": "ooxml-slides",
    "ms-powerpoint.presentation.macroenabled.main+xml": "ooxml-slides",
    "ms-powerpoint.slideshow.macroenabled.main+xml": "ooxml-slides",
    "ms-powerpoint.template.macroenabled.main+xml": "ooxml-slides",
}
OOXML_MIMES = {
    (
        "ooxml-word",
        False,
    ): "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    ("ooxml-word", True): "application/vnd.ms-word.document.macroEnabled.12",
    ("ooxml-sheet", False): "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    ("ooxml-sheet", True): "application/vnd.ms-excel.sheet.macroEnabled.12",
    (
        "ooxml-slides",
        False,
    ): "application/vnd.openxmlformats-officedocument.presentationml.presentation",
    ("ooxml-slides", True): "application/vnd.ms-powerpoint.presentation.macroEnabled.12",
    ("ooxml", False): "application/vnd.openxmlformats-package",
    ("ooxml", True): "application/vnd.openxmlformats-package",
}
_OOXML_LABELS = {
    "ooxml-word": "Word document (OOXML)",
    "ooxml-sheet": "Excel workbook (OOXML)",
    "ooxml-slides": "PowerPoint presentation (OOXML)",
    "ooxml": "Office Open XML package",
}
# A package's mimetype subtype -> kind: the flat (single-XML) ones plus the web template
# that only exists packaged.
ODF_KINDS = {**FLAT_ODF_KINDS, "text-web": "odf-text"}
_CONTENT_TYPE = re.compile(rb'ContentType\s*=\s*"([^"]*)"', re.I)
_APP_PAGES = re.compile(rb"<(?:\w+:)?(?:Pages|Slides)>\s*(\d+)\s*<")
_ODF_PAGES = re.compile(rb'meta:page-count\s*=\s*"(\d+)"')
_MANIFEST_ROOT = re.compile(
    rb'manifest:full-path\s*=\s*"/"[^>]*?manifest:media-type\s*=\s*"([^"]+)"'
    rb'|manifest:media-type\s*=\s*"([^"]+)"[^>]*?manifest:full-path\s*=\s*"/"'
)
_REMOTE_SCHEMA = re.compile(rb"schemaLocation\s*=\s*[\"'][A-Za-z][A-Za-z0-9+.-]*:", re.I)
_SHARED_STRING = re.compile(rb"<(?:\w+:)?si\b[^>]*>(.*?)</(?:\w+:)?si>", re.S)
_TAG = re.compile(rb"<[^>]*>")
# A cell of type "s" (its value is an index into the shared strings).
_SHARED_CELL = re.compile(rb'<(?:\w+:)?c\b[^>]*?\bt\s*=\s*"s"[^>]*>\s*<(?:\w+:)?v>\s*(\d+)\s*<')
# The DTD an ODF part may name: a file name beside it, as old OpenOffice files do.
_PLAIN_DTD_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\.dtd")


@dataclass
class Container:
    """What a ZIP or OLE2 file turned out to be, and the facts found in it."""

    kind: str
    mime: str
    label: str
    details: dict[str, Any] = field(default_factory=dict)


# -- ZIP -------------------------------------------------------------------------------------


def inspect_zip(source: Source) -> Container:
    found = Container("zip", "application/zip", "ZIP archive")
    directory = _end_of_central_directory(source)
    if directory is None:
        found.details["corrupt"] = "no ZIP central directory (truncated or not a ZIP)"
        return found
    entries, cd_size = directory
    if cd_size > MAX_CENTRAL_DIRECTORY_BYTES:
        found.details["zip"] = {"entries": entries, "central_directory_bytes": cd_size}
        return found
    file = buffered(source)
    try:
        archive = zipfile.ZipFile(file)
        infos = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as exc:
        found.details["corrupt"] = f"unreadable ZIP directory: {exc}"
        return found
    found.details["zip"] = _zip_stats(infos, source.size)
    traversal = next((i.filename for i in infos if _escapes(i.filename)), None)
    if traversal is not None:
        found.details["path_traversal"] = traversal
    if any(i.flag_bits & 0x1 for i in infos):
        found.details["encrypted"] = "encrypted ZIP entries"
    names = {i.filename: i for i in infos}
    if "[Content_Types].xml" in names:
        _ooxml(archive, names, found)
    elif "mimetype" in names or "META-INF/manifest.xml" in names:
        _odf(archive, names, found)
    return found


def _end_of_central_directory(source: Source) -> tuple[int, int] | None:
    """``(entries, central directory bytes)`` from the EOCD record (ZIP64 aware)."""
    tail_length = min(source.size, 22 + 0xFFFF + 20)
    tail = source.read_at(source.size - tail_length, tail_length)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) - at < 22:
        return None
    entries, cd_size = struct.unpack_from("<HI", tail, at + 10)
    locator = tail.rfind(b"PK\x06\x07", 0, at)
    if (entries == 0xFFFF or cd_size == 0xFFFFFFFF) and locator >= 0:
        record_at = struct.unpack_from("<Q", tail, locator + 8)[0]
        record = source.read_at(record_at, 56)
        if record[:4] == b"PK\x06\x06" and len(record) >= 56:
            entries, cd_size = struct.unpack_from("<QQ", record, 32)
    return int(entries), int(cd_size)


def _zip_stats(infos: list[zipfile.ZipInfo], container_size: int) -> dict[str, Any]:
    unzipped = sum(i.file_size for i in infos)
    compressed = sum(i.compress_size for i in infos)
    big = [i for i in infos if i.file_size >= BIG_ENTRY_BYTES]
    max_ratio = max((i.file_size / max(i.compress_size, 1) for i in big), default=0.0)
    nested = [
        i.filename
        for i in infos
        if i.filename.lower().endswith(_ARCHIVE_SUFFIXES) and not i.is_dir()
    ]
    recursive = [
        i.filename for i in infos if i.filename in nested and i.file_size == container_size
    ]
    stats: dict[str, Any] = {
        "entries": len(infos),
        "unzipped_bytes": unzipped,
        "compressed_bytes": compressed,
        "max_ratio": round(max_ratio, 1),
    }
    if nested:
        stats["nested_archives"] = nested[:20]
    if recursive:
        stats["recursive"] = recursive[:5]
    overlapping = _overlapping(infos)
    if overlapping:
        stats["overlapping"] = overlapping
    return stats


def _overlapping(infos: list[zipfile.ZipInfo]) -> str | None:
    """An entry whose data starts inside another's: several names, one deflate stream."""
    spans = sorted(
        (
            (i.header_offset, i.header_offset + 30 + len(i.filename.encode()) + i.compress_size, i)
            for i in infos
            if not i.is_dir()
        ),
        key=lambda span: (span[0], span[1]),
    )
    for (_start, end, entry), (next_start, _end, following) in itertools.pairwise(spans):
        if next_start < end:
            return f"{following.filename} overlaps {entry.filename}"
    return None


def _escapes(name: str) -> bool:
    if "\\" in name or name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        return True
    return ".." in PurePosixPath(name).parts


def _read_capped(archive: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int) -> bytes:
    with archive.open(info) as handle:
        return handle.read(limit)


def _ooxml(archive: zipfile.ZipFile, names: dict[str, zipfile.ZipInfo], found: Container) -> None:
    content_types = names["[Content_Types].xml"]
    if content_types.file_size > MAX_METADATA_BYTES:
        found.details["corrupt"] = "[Content_Types].xml is implausibly large"
        return
    try:
        types_xml = _read_capped(archive, content_types, MAX_METADATA_BYTES)
    except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, RuntimeError) as exc:
        found.details["corrupt"] = f"unreadable [Content_Types].xml: {exc}"
        return
    declared = [t.decode("latin-1").lower() for t in _CONTENT_TYPE.findall(types_xml)]
    kind = "ooxml"
    for content_type in declared:
        for suffix, main_kind in _OOXML_MAIN.items():
            if content_type.endswith(suffix):
                kind = main_kind
    macros = [t for t in declared if any(m in t for m in _MACRO_CONTENT_TYPES)]
    vba = [n for n in names if PurePosixPath(n).name.lower() in ("vbaproject.bin", "vbadata.xml")]
    macro_sheets = [n for n in names if "/macrosheets/" in n.lower()]
    if vba or macros or macro_sheets:
        found.details["macros"] = (vba + macro_sheets + macros)[0]
    found.kind = kind
    found.mime = OOXML_MIMES[(kind, bool(vba or macros or macro_sheets))]
    found.label = _OOXML_LABELS[kind]
    _xml_parts(archive, names, found, any_dtd=True)
    xml_maps = names.get("xl/xmlMaps.xml")
    if xml_maps is not None and _REMOTE_SCHEMA.search(_safe_read(archive, xml_maps, 256 * 1024)):
        found.details.setdefault("unsafe_xml", "xl/xmlMaps.xml imports a schema from a URL")
    for name, info in names.items():
        lower = name.lower()
        if (
            "externallinks/" in lower
            and lower.endswith(".xml")
            and b"ddeLink" in _safe_read(archive, info, 256 * 1024)
        ):
            found.details.setdefault("macros", f"DDE link in {name}")
    app = names.get("docProps/app.xml")
    if app is not None:
        pages = _APP_PAGES.search(_safe_read(archive, app, 256 * 1024))
        if pages:
            found.details["pages"] = int(pages.group(1))
    if kind == "ooxml-sheet":
        text_bytes = _shared_text_bytes(archive, names)
        if text_bytes is not None:
            found.details["text_bytes"] = text_bytes


def _shared_text_bytes(archive: zipfile.ZipFile, names: dict[str, zipfile.ZipInfo]) -> int | None:
    """The bytes of text a workbook's shared-string cells expand to (markup left out),
    or None when it has none or its parts are too large to read whole."""
    strings = names.get("xl/sharedStrings.xml")
    sheets = [
        info
        for name, info in names.items()
        if name.startswith("xl/worksheets/") and name.endswith(".xml") and not info.is_dir()
    ]
    if strings is None or not sheets:
        return None
    if strings.file_size + sum(i.file_size for i in sheets) > MAX_SHEET_PARTS_BYTES:
        return None
    lengths = [
        len(_TAG.sub(b"", text))
        for text in _SHARED_STRING.findall(_safe_read(archive, strings, MAX_SHEET_PARTS_BYTES))
    ]
    total = 0
    for info in sheets:
        for index in _SHARED_CELL.findall(_safe_read(archive, info, MAX_SHEET_PARTS_BYTES)):
            at = int(index)
            if at < len(lengths):
                total += lengths[at]
    return total


def _odf(archive: zipfile.ZipFile, names: dict[str, zipfile.ZipInfo], found: Container) -> None:
    subtype = ""
    if "mimetype" in names:
        declared = _safe_read(archive, names["mimetype"], 256).strip()
        if declared.startswith(b"application/vnd.oasis.opendocument."):
            subtype = declared.decode("latin-1").rsplit(".", 1)[-1]
    manifest = names.get("META-INF/manifest.xml")
    manifest_xml = _safe_read(archive, manifest, MAX_METADATA_BYTES) if manifest else b""
    if not subtype:
        root = _MANIFEST_ROOT.search(manifest_xml)
        media_type = (root.group(1) or root.group(2)) if root else b""
        if media_type.startswith(b"application/vnd.oasis.opendocument."):
            subtype = media_type.decode("latin-1").rsplit(".", 1)[-1]
    if not subtype:
        return  # a ZIP with a file called "mimetype" is still just a ZIP
    found.kind = ODF_KINDS.get(subtype, "odf")
    found.mime = f"application/vnd.oasis.opendocument.{subtype}"
    found.label = f"OpenDocument {subtype}"
    scripts = [
        n
        for n, info in names.items()
        if n.split("/", 1)[0] in ("Basic", "Scripts") and not info.is_dir()
    ]
    if scripts:
        found.details["macros"] = scripts[0]
    if b"encryption-data" in manifest_xml:
        found.details["encrypted"] = "manifest encryption-data"
    _xml_parts(archive, names, found, any_dtd=False)
    meta = names.get("meta.xml")
    if meta is not None and "encrypted" not in found.details:
        pages = _ODF_PAGES.search(_safe_read(archive, meta, 256 * 1024))
        if pages:
            found.details["pages"] = int(pages.group(1))


class _PrologRead(Exception):
    """Raised from expat's handlers: the prolog has been read far enough."""


def prolog_danger(head: bytes, *, any_dtd: bool, whole: bool = False) -> str | None:
    """Why the XML prolog at the start of ``head`` is refused (``unsafe_xml``; a phrase
    after the part's name), or None.

    expat reads ``head`` (the start of a document, maybe cut anywhere) and is stopped
    at the DOCTYPE or at the root element, whichever comes first: comments,
    processing instructions and character references are read as a decoder would,
    so none hides a DTD, and nothing after the root's name is looked at. expat is
    given no handler for external entities, so it loads nothing, and the internal
    subset is never parsed (it stops where the subset would start). ``any_dtd``:
    every DTD counts (OOXML), else only an internal subset or an external
    identifier other than a plain file name (ODF). ``whole``: ``head`` is the whole
    document (so a DOCTYPE at its very end still counts).
    """
    parser = expat.ParserCreate()
    found: dict[str, Any] = {}

    def doctype(name: str, system_id: str | None, public_id: str | None, subset: int) -> None:
        found["doctype"] = (system_id, bool(subset))
        raise _PrologRead

    def root(name: str, attributes: Any) -> None:
        found["root"] = True
        raise _PrologRead

    parser.StartDoctypeDeclHandler = doctype
    parser.StartElementHandler = root
    try:
        parser.Parse(head, False)
        if whole and head.strip():
            parser.Parse(b"", True)
    except _PrologRead:
        pass
    except (expat.ExpatError, ValueError, LookupError) as exc:  # ValueError: an encoding
        return f"has a prolog that is not readable XML ({exc})"
    if "doctype" in found:
        system_id, subset = found["doctype"]
        if any_dtd:
            return "declares a DTD"
        if subset:
            return "declares a DTD with an internal subset"
        if system_id is not None and not _PLAIN_DTD_NAME.fullmatch(system_id):
            return f"declares a DTD at {system_id[:200]!r}"
        return None
    if found.get("root") or _in_root_tag(head, parser.CurrentByteIndex):
        return None
    return None if whole else f"has a prolog longer than {len(head):,} B"


def _in_root_tag(head: bytes, unread: int) -> bool:
    """Whether what expat left unread (a token cut off by the end of ``head``) is the
    root element's start tag: then the prolog is over and no DTD can follow."""
    rest = head[max(unread, 0) : max(unread, 0) + 16]
    codec = "latin-1"
    if head[:2] in (b"\xff\xfe", b"<\x00"):
        codec = "utf-16-le"
    elif head[:2] in (b"\xfe\xff", b"\x00<"):
        codec = "utf-16-be"
    text = rest.decode(codec, "ignore").lstrip()
    return len(text) >= 2 and text[0] == "<" and (text[1].isalpha() or text[1] in "_:")


def _safe_read(archive: zipfile.ZipFile, info: zipfile.ZipInfo | None, limit: int) -> bytes:
    if info is None:
        return b""
    try:
        return _read_capped(archive, info, limit)
    except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, RuntimeError):
        return b""


def _xml_parts(
    archive: zipfile.ZipFile,
    names: dict[str, zipfile.ZipInfo],
    found: Container,
    *,
    any_dtd: bool,
) -> None:
    """A DTD in an XML part's prolog: XXE and entity expansion are refused, not parsed.
    ``any_dtd``: every DTD counts (OOXML), else only dangerous ones (ODF)."""
    if "encrypted" in found.details:
        return  # encrypted ODF parts are ciphertext
    parts = [
        info
        for name, info in names.items()
        if name.lower().endswith((".xml", ".rels", ".vml")) and not info.is_dir()
    ]
    if len(parts) > MAX_PARTS_READ:
        found.details["unsafe_xml"] = f"{len(parts):,} XML parts, more than are checked"
        return
    for info in sorted(parts, key=lambda i: i.header_offset):
        try:
            prolog = _read_capped(archive, info, PROLOG_BYTES)
        except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, RuntimeError) as exc:
            found.details.setdefault("corrupt", f"unreadable part {info.filename}: {exc}")
            return
        danger = prolog_danger(prolog, any_dtd=any_dtd, whole=len(prolog) < PROLOG_BYTES)
        if danger is not None:
            found.details["unsafe_xml"] = f"{info.filename} {danger}"
            return


# -- OLE2 -------------------------------------------------------------------------------------

_OLE_KINDS = {
    "worddocument": ("msword", "application/msword", "Word 97-2003 document"),
    "workbook": ("msexcel", "application/vnd.ms-excel", "Excel 97-2003 workbook"),
    "book": ("msexcel", "application/vnd.ms-excel", "Excel 5 workbook"),
    "powerpoint document": (
        "mspowerpoint",
        "application/vnd.ms-powerpoint",
        "PowerPoint 97-2003 presentation",
    ),
}
_VBA_STORAGES = {"macros", "_vba_project_cur", "vba", "_vba_project"}


def inspect_ole(source: Source) -> Container:
    import olefile

    found = Container("ole", "application/x-ole-storage", "OLE2 compound file")
    try:
        ole = olefile.OleFileIO(buffered(source))
    except Exception as exc:  # olefile raises many types on malformed input
        found.details["corrupt"] = f"unreadable OLE2 file: {exc}"
        return found
    try:
        entries = [
            [part.lower() for part in path] for path in ole.listdir(streams=True, storages=True)
        ]
        roots = {path[0] for path in entries}
        if "encryptedpackage" in roots and "encryptioninfo" in roots:
            found.kind, found.mime = "ole", "application/encrypted"
            found.label = "Office document (encrypted OOXML package)"
            found.details["encrypted"] = "EncryptionInfo + EncryptedPackage"
            return found
        for stream, (kind, mime, label) in _OLE_KINDS.items():
            if stream in roots:
                found.kind, found.mime, found.label = kind, mime, label
                break
        vba = next(("/".join(p) for p in entries if set(p) & _VBA_STORAGES), None)
        if vba:
            found.details["macros"] = vba
        if found.kind == "msword":
            _word_encryption(_stream_head(ole, "WordDocument", 16), found)
        elif found.kind == "msexcel":
            name = "Workbook" if "workbook" in roots else "Book"
            _excel_globals(_stream_head(ole, name, 256 * 1024), found)
        elif found.kind == "mspowerpoint" and "encryptedsummary" in roots:
            found.details["encrypted"] = "EncryptedSummary stream"
    except Exception as exc:  # a malformed directory or FAT can raise anywhere in olefile
        found.details["corrupt"] = f"unreadable OLE2 file: {exc}"
    finally:
        ole.close()
    return found


def _stream_head(ole: Any, name: str, length: int) -> bytes:
    stream: IO[bytes] = ole.openstream(name)
    return stream.read(length)


def _word_encryption(fib: bytes, found: Container) -> None:
    if len(fib) >= 12 and struct.unpack_from("<H", fib, 10)[0] & 0x0100:
        found.details["encrypted"] = "FIB fEncrypted flag"


def _excel_globals(workbook: bytes, found: Container) -> None:
    """Walk the globals substream's records: FILEPASS (encrypted), BOUNDSHEET of an
    Excel 4 macro sheet (type 1)."""
    offset = 0
    while offset + 4 <= len(workbook):
        record, length = struct.unpack_from("<HH", workbook, offset)
        body = workbook[offset + 4 : offset + 4 + length]
        if record == 0x002F:
            found.details["encrypted"] = "FILEPASS record"
        elif record == 0x0085 and len(body) >= 6 and body[5] == 0x01:
            found.details.setdefault("macros", "an Excel 4 (XLM) macro sheet")
        elif record == 0x000A:  # EOF of the globals substream
            return
        offset += 4 + length
