"""hypermedia.sandbox.inspect, step 2: containers' facts and the verdicts on them.

ZIP packages are built here with :mod:`zipfile` (OOXML, ODF, plain ZIP); the verdicts
are a table of (inspection, accepts, limits) -> error code; the PDF password checks run
against the encryption dictionaries of two real files whose passwords are published.
"""

from __future__ import annotations

import io
import struct
import zipfile

import pytest

from hypermedia import errors
from hypermedia.sandbox.inspect import (
    InputLimits,
    Inspection,
    check_operation,
    inspect_source,
    refusal,
)
from pipelines.formats import pdf
from pipelines.formats.source import BytesSource

IMAGES = ["image/jpeg", "image/png", "image/gif", "image/webp"]
WORD_MAIN = "application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"
DOCM_MAIN = "application/vnd.ms-word.document.macroEnabled.main+xml"
XLSX_MAIN = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml"


def inspect(data: bytes) -> Inspection:
    return inspect_source(BytesSource(data))


def package(entries: dict[str, bytes | str], deflate: bool = True) -> bytes:
    buffer = io.BytesIO()
    method = zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED
    with zipfile.ZipFile(buffer, "w", method) as archive:
        for name, body in entries.items():
            archive.writestr(zipfile.ZipInfo(name), body, compress_type=method)
    return buffer.getvalue()


def content_types(*overrides: str) -> str:
    parts = "".join(
        f'<Override PartName="/part{i}.xml" ContentType="{t}"/>' for i, t in enumerate(overrides)
    )
    return (
        '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
        '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
        '<Default Extension="xml" ContentType="application/xml"/>' + parts + "</Types>"
    )


def docx(extra: dict[str, bytes | str] | None = None, main: str = WORD_MAIN) -> bytes:
    return package(
        {
            "[Content_Types].xml": content_types(main),
            "word/document.xml": '<?xml version="1.0"?><w:document/>',
            "docProps/app.xml": "<Properties><Pages>7</Pages></Properties>",
            **(extra or {}),
        }
    )


def odt(extra: dict[str, bytes | str] | None = None, manifest: str = "") -> bytes:
    return package(
        {
            "mimetype": "application/vnd.oasis.opendocument.text",
            "content.xml": '<?xml version="1.0"?><office:document-content/>',
            "meta.xml": '<office:document-meta meta:page-count="3"/>',
            "META-INF/manifest.xml": manifest
            or '<manifest:manifest><manifest:file-entry manifest:full-path="/"'
            ' manifest:media-type="application/vnd.oasis.opendocument.text"/></manifest:manifest>',
            **(extra or {}),
        },
        deflate=False,
    )


def code_of(data: bytes, accepts: list[str], limits: InputLimits | None = None) -> str | None:
    try:
        check_operation(inspect(data), "op", accepts, limits or InputLimits())
    except errors.InputRejected as exc:
        return exc.code
    return None


# -- what ZIP packages are ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "kind", "mime"),
    [
        (
            docx(),
            "ooxml-word",
            "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        ),
        (docx(main=DOCM_MAIN), "ooxml-word", "application/vnd.ms-word.document.macroEnabled.12"),
        (
            docx(main=XLSX_MAIN),
            "ooxml-sheet",
            "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        ),
        (odt(), "odf-text", "application/vnd.oasis.opendocument.text"),
        (package({"a.txt": "hello"}), "zip", "application/zip"),
        (package({"mimetype": "text/plain"}), "zip", "application/zip"),
    ],
    ids=["docx", "docm", "xlsx", "odt", "zip", "zip with a mimetype file"],
)
def test_zip_packages_by_their_directory(data, kind, mime):
    found = inspect(data)
    assert (found.kind, found.mime) == (kind, mime)


def test_office_page_counts():
    assert inspect(docx()).details["pages"] == 7
    assert inspect(odt()).details["pages"] == 3


# -- verdicts on ZIP packages ----------------------------------------------------------------------

WORD = ["ooxml-word", "odf-text", "msword", "rtf"]
VERDICTS = [
    ("docx", docx(), WORD, None),
    ("vbaProject.bin", docx({"word/vbaProject.bin": b"\x00" * 64}), WORD, "macro_document"),
    ("macro-enabled main part", docx(main=DOCM_MAIN), WORD, "macro_document"),
    (
        "XLM macro sheet content type",
        docx(
            main=XLSX_MAIN,
            extra={
                "[Content_Types].xml": content_types(
                    XLSX_MAIN, "application/vnd.ms-excel.macrosheet+xml"
                )
            },
        ),
        ["ooxml-sheet"],
        "macro_document",
    ),
    (
        "DDE link",
        docx(
            main=XLSX_MAIN,
            extra={
                "xl/externalLinks/externalLink1.xml": (
                    '<externalLink><ddeLink ddeService="cmd"/></externalLink>'
                )
            },
        ),
        ["ooxml-sheet"],
        "macro_document",
    ),
    (
        "ActiveX",
        docx(
            extra={
                "[Content_Types].xml": content_types(
                    WORD_MAIN, "application/vnd.ms-office.activeX+xml"
                )
            }
        ),
        WORD,
        "macro_document",
    ),
    ("ODF Basic", odt({"Basic/Standard/Module1.xml": "<script:module/>"}), WORD, "macro_document"),
    ("ODF scripts", odt({"Scripts/python/evil.py": "import os"}), WORD, "macro_document"),
    (
        "ODF encrypted",
        odt(
            manifest=(
                '<manifest:manifest><manifest:file-entry manifest:full-path="/"'
                ' manifest:media-type="application/vnd.oasis.opendocument.text"/>'
                "<manifest:encryption-data/></manifest:manifest>"
            )
        ),
        WORD,
        "encrypted_document",
    ),
    ("../ entry", docx({"../../../tmp/x": "x"}), WORD, "path_traversal"),
    ("absolute entry", docx({"/etc/cron.d/x": "x"}), WORD, "path_traversal"),
    ("backslash entry", docx({"..\\..\\x": "x"}), WORD, "path_traversal"),
    ("drive entry", docx({"C:/Windows/x": "x"}), WORD, "path_traversal"),
    ("dotted but inside", docx({"word/..media/x": "x"}), WORD, None),
    (
        "DTD in OOXML",
        docx(
            {
                "word/document.xml": (
                    '<?xml version="1.0"?><!DOCTYPE w [<!ENTITY a "b">]><w:document/>'
                )
            }
        ),
        WORD,
        "unsafe_xml",
    ),
    (
        "any DTD in OOXML",
        docx({"word/styles.xml": '<!DOCTYPE w SYSTEM "styles.dtd"><w:styles/>'}),
        WORD,
        "unsafe_xml",
    ),
    (
        "ODF entities",
        odt(
            {
                "content.xml": (
                    '<?xml version="1.0"?><!DOCTYPE d [<!ENTITY lol "lol">'
                    '<!ENTITY lol2 "&lol;&lol;">]><office:document-content/>'
                )
            }
        ),
        WORD,
        "unsafe_xml",
    ),
    (
        "ODF remote DTD",
        odt({"styles.xml": '<!DOCTYPE s SYSTEM "http://10.0.0.1/x.dtd"><s/>'}),
        WORD,
        "unsafe_xml",
    ),
    (
        "ODF relative public DTD (old OpenOffice)",
        odt(
            {
                "settings.xml": (
                    "<!DOCTYPE office:settings PUBLIC"
                    ' "-//OpenOffice.org//DTD OfficeDocument 1.0//EN" "office.dtd">'
                    "<office:settings/>"
                )
            }
        ),
        WORD,
        None,
    ),
    (
        "prolog hiding a DTD past the read",
        docx({"word/styles.xml": "<!--" + "x" * 5000 + "-->" + "<w/>"}),
        WORD,
        "unsafe_xml",
    ),
    # A DTD behind a comment or a processing instruction that holds what looks like the
    # root element: only a parser sees the prolog as the decoder will.
    (
        "OOXML DTD after a comment holding <a",
        docx(
            {
                "word/document.xml": (
                    '<?xml version="1.0"?><!-- <a --><!DOCTYPE w [<!ENTITY xxe SYSTEM'
                    ' "file:///etc/passwd">]><w:document>&xxe;</w:document>'
                )
            }
        ),
        WORD,
        "unsafe_xml",
    ),
    (
        "OOXML DTD after a processing instruction holding <a",
        docx({"word/styles.xml": '<?pi <a b="c"?><!DOCTYPE w SYSTEM "styles.dtd"><w:styles/>'}),
        WORD,
        "unsafe_xml",
    ),
    (
        "ODF external DTD after a comment holding <a",
        odt(
            {
                "content.xml": (
                    '<?xml version="1.0"?><!-- <a --><!DOCTYPE d SYSTEM'
                    ' "http://10.0.0.1/x.dtd"><office:document-content/>'
                )
            }
        ),
        WORD,
        "unsafe_xml",
    ),
    (
        "ODF DTD that is a path",
        odt({"styles.xml": '<!DOCTYPE s SYSTEM "../../../etc/x.dtd"><s/>'}),
        WORD,
        "unsafe_xml",
    ),
    (
        "OOXML DTD in a UTF-16 part",
        docx(
            {
                "word/document.xml": "\ufeff"
                '<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE w [<!ENTITY a "b">]>'
                "<w:document/>".encode("utf-16-le")
            }
        ),
        WORD,
        "unsafe_xml",
    ),
    (
        "OOXML part in an encoding the check cannot read",
        docx({"word/document.xml": '<?xml version="1.0" encoding="UTF-7"?><w:document/>'}),
        WORD,
        "unsafe_xml",
    ),
    (
        "OOXML DOCTYPE only in a comment",
        docx({"word/document.xml": '<?xml version="1.0"?><!-- <!DOCTYPE w> --><w:document/>'}),
        WORD,
        None,
    ),
    (
        "OOXML root start tag longer than the read",
        docx(
            {
                "word/document.xml": '<?xml version="1.0"?><w:document '
                + " ".join(f'xmlns:n{i}="urn:example:{i}"' for i in range(300))
                + "/>"
            }
        ),
        WORD,
        None,
    ),
    (
        "flat ODT DTD after a comment holding <office:document",
        b'<?xml version="1.0"?><!-- <office:document --><!DOCTYPE office:document'
        b' [<!ENTITY xxe SYSTEM "file:///etc/passwd">]><office:document'
        b' office:mimetype="application/vnd.oasis.opendocument.text">&xxe;</office:document>',
        WORD,
        "unsafe_xml",
    ),
    (
        "flat ODT",
        b'<?xml version="1.0"?><!-- a comment --><office:document'
        b' office:mimetype="application/vnd.oasis.opendocument.text"/>',
        WORD,
        None,
    ),
    (
        "remote schema in xmlMaps",
        docx(
            main=XLSX_MAIN,
            extra={
                "xl/xmlMaps.xml": '<x:MapInfo><xsd:redefine schemaLocation="http://localhost/s.xsd"/></x:MapInfo>'
            },
        ),
        ["ooxml-sheet"],
        "unsafe_xml",
    ),
    (
        "nested archive in a zip",
        package({"inner.zip": b"PK\x05\x06" + bytes(18)}),
        ["any"],
        "zip_bomb",
    ),
    (
        "embedded workbook in a docx",
        docx({"word/embeddings/sheet.xlsx": b"PK\x05\x06" + bytes(18)}),
        WORD,
        None,
    ),
    ("ratio", docx({"word/document.xml": b"<w/>" + b" " * (4 * 1024 * 1024)}), WORD, "zip_bomb"),
    ("truncated", docx()[:-30], WORD, "invalid_input"),
    ("no central directory", docx()[:200], WORD, "invalid_input"),
]


@pytest.mark.parametrize(
    ("name", "data", "accepts", "code"), VERDICTS, ids=[v[0] for v in VERDICTS]
)
def test_verdicts_on_zip_packages(name, data, accepts, code):
    assert code_of(data, accepts) == code


def test_zip_size_and_entry_limits_are_the_profiles():
    data = package({f"f{i}.txt": "x" * 1000 for i in range(20)})
    assert code_of(data, ["any"]) is None
    assert code_of(data, ["any"], InputLimits(max_zip_entries=10)) == "zip_bomb"
    assert code_of(data, ["any"], InputLimits(max_unzipped_bytes=10_000)) == "zip_bomb"


def workbook(strings: list[str], cells: list[int], *, prefix: str = "") -> bytes:
    """An .xlsx whose one sheet's cells are shared-string references ``cells``."""
    main = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
    p = f"{prefix}:" if prefix else ""
    ns = f'xmlns{":" + prefix if prefix else ""}="{main}"'
    shared = "".join(f"<{p}si><{p}t>{text}</{p}t></{p}si>" for text in strings)
    rows = "".join(
        f'<{p}row r="{n + 1}"><{p}c r="A{n + 1}" s="1" t="s"><{p}v>{index}</{p}v></{p}c></{p}row>'
        for n, index in enumerate(cells)
    )
    return package(
        {
            "[Content_Types].xml": content_types(XLSX_MAIN),
            "xl/sharedStrings.xml": f"<{p}sst {ns}>{shared}</{p}sst>",
            "xl/worksheets/sheet1.xml": (
                f"<{p}worksheet {ns}><{p}sheetData>{rows}</{p}sheetData></{p}worksheet>"
            ),
        }
    )


def test_cells_repeating_a_long_shared_string_are_a_bomb():
    # POI's poc-shared-strings.xlsx in small: one string of 64 KiB, 400 cells = 26 MB
    # of text from a package of a few KB; the same cells with a short string are fine.
    long = "ab" * 32 * 1024
    bomb = workbook(["short", long], [1] * 400 + [0] * 10)
    found = inspect(bomb)
    assert found.details["text_bytes"] == 400 * len(long) + 10 * len("short")
    limits = InputLimits(max_unzipped_bytes=16 * 1024 * 1024)
    refused = refusal(found, limits)
    assert refused is not None and refused.code == "zip_bomb"
    assert f"expand to {400 * len(long) + 50:,} bytes of text" in refused.message
    assert code_of(bomb, ["any"], limits) == "zip_bomb"
    assert code_of(bomb, ["any"]) is None  # 26 MB is under the default 256 MB
    ordinary = workbook(["short", "a longer cell of text"], [1] * 400 + [0] * 10)
    assert inspect(ordinary).details["text_bytes"] == 400 * 21 + 50
    assert code_of(ordinary, ["any"], limits) is None
    # Markup inside a string (rich text runs) is not text; prefixed elements count too.
    prefixed = workbook(["<x:r><x:t>abc</x:t></x:r>"], [0] * 3, prefix="x")
    assert inspect(prefixed).details["text_bytes"] == 9


def test_a_zip_that_contains_itself():
    # As droste.zip (the corpus' quine, checked in the integration test): an archive entry
    # exactly as large as the container.
    facts = {"zip": {"entries": 2, "nested_archives": ["droste.zip"], "recursive": ["droste.zip"]}}
    refused = refusal(Inspection("zip", "application/zip", facts))
    assert refused is not None and refused.code == "zip_bomb"
    assert "contains itself" in refused.message


def test_overlapping_entries_are_a_bomb():
    data = bytearray(package({"a.xml": "<a/>" * 100, "b.xml": "<b/>" * 100}))
    # Point the second central-directory entry at the first entry's data.
    directory = data.rfind(b"PK\x01\x02")
    struct.pack_into("<I", data, directory + 42, 0)
    found = inspect(bytes(data))
    assert "overlaps" in found.details["zip"]["overlapping"]
    assert code_of(bytes(data), ["any"]) == "zip_bomb"


def test_a_huge_central_directory_is_not_parsed():
    data = bytearray(package({"a": "b"}))
    eocd = data.rfind(b"PK\x05\x06")
    struct.pack_into("<I", data, eocd + 12, 64 * 1024 * 1024)
    found = inspect(bytes(data))
    assert found.details["zip"]["central_directory_bytes"] == 64 * 1024 * 1024
    assert code_of(bytes(data), ["any"]) == "zip_bomb"


def test_encrypted_zip_entries():
    data = bytearray(package({"a.txt": "secret"}, deflate=False))
    for signature, flag_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        at = data.find(signature)
        flags = struct.unpack_from("<H", data, at + flag_at)[0]
        struct.pack_into("<H", data, at + flag_at, flags | 1)
    assert code_of(bytes(data), ["any"]) == "encrypted_document"


# -- the rules ---------------------------------------------------------------------------------


def image(mime: str = "image/png", **facts: object) -> Inspection:
    return Inspection("image", mime, {"label": "an image", **facts})


THUMBNAIL = InputLimits(
    max_pixels=100_000_000, max_source_pixels=400_000_000, jpeg_shrink_on_load=True
)
RULES = [
    ("png for thumbnail", image(), IMAGES, THUMBNAIL, None),
    ("svg for thumbnail", image("image/svg+xml"), IMAGES, THUMBNAIL, "unsupported_format"),
    (
        "pdf for thumbnail",
        Inspection("pdf", "application/pdf"),
        IMAGES,
        THUMBNAIL,
        "input_type_mismatch",
    ),
    ("png for pdf_preview", image(), ["pdf"], InputLimits(), "input_type_mismatch"),
    ("png for docx_to_pdf", image(), WORD, InputLimits(), "input_type_mismatch"),
    (
        "video for transcode_audio",
        Inspection("video", "video/mp4"),
        ["audio"],
        InputLimits(),
        "input_type_mismatch",
    ),
    ("anything for any", Inspection("text", "text/plain"), ["any"], InputLimits(), None),
    (
        "postscript even for any",
        Inspection("postscript", "application/postscript"),
        ["any"],
        InputLimits(),
        "unsupported_format",
    ),
    (
        "hls playlist",
        Inspection("playlist", "application/vnd.apple.mpegurl"),
        ["video"],
        InputLimits(),
        "unsupported_format",
    ),
    (
        "ffconcat",
        Inspection("ffconcat", "text/x-ffconcat"),
        ["video"],
        InputLimits(),
        "unsupported_format",
    ),
    ("midi", Inspection("audio", "audio/midi"), ["audio"], InputLimits(), "unsupported_format"),
    ("empty", Inspection("empty", "application/x-empty"), ["any"], InputLimits(), "invalid_input"),
    ("polyglot", image("image/jpeg", appended_archive=True), IMAGES, THUMBNAIL, "polyglot_file"),
    (
        "kind by mime entry",
        Inspection("pdf", "application/pdf"),
        ["application/pdf"],
        InputLimits(),
        None,
    ),
    # Pixels: width x height x frames as declared; a JPEG at 1/8 scale with shrink-on-load.
    ("10k x 10k png", image(width=10_000, height=10_000), IMAGES, THUMBNAIL, None),
    ("12k x 10k png", image(width=12_000, height=10_000), IMAGES, THUMBNAIL, "pixel_limit"),
    (
        "20k x 14k jpeg, shrink on load",
        image("image/jpeg", width=20_000, height=14_000),
        IMAGES,
        THUMBNAIL,
        None,
    ),
    (
        "20k x 14k jpeg, full size",
        image("image/jpeg", width=20_000, height=14_000),
        IMAGES,
        InputLimits(max_pixels=100_000_000),
        "pixel_limit",
    ),
    (
        "64k x 64k jpeg, over the declared limit",
        image("image/jpeg", width=64_250, height=64_250),
        IMAGES,
        THUMBNAIL,
        "pixel_limit",
    ),
    (
        "animation: frames count",
        image("image/gif", width=1000, height=1000, frames=200),
        IMAGES,
        THUMBNAIL,
        "pixel_limit",
    ),
    (
        "animation under the limit",
        image("image/gif", width=245, height=245, frames=42),
        IMAGES,
        THUMBNAIL,
        None,
    ),
    ("unknown size", image(), IMAGES, InputLimits(max_pixels=1), None),
    (
        "pages",
        Inspection("pdf", "application/pdf", {"pages": 101}),
        ["pdf"],
        InputLimits(max_pages=100),
        "page_limit",
    ),
    (
        "pages at the limit",
        Inspection("pdf", "application/pdf", {"pages": 100}),
        ["pdf"],
        InputLimits(max_pages=100),
        None,
    ),
    (
        "tiff pages for ocr",
        image("image/tiff", width=10, height=10, pages=500),
        ["image/tiff"],
        InputLimits(max_pages=100),
        "page_limit",
    ),
    (
        "duration",
        Inspection("video", "video/mp4", {"duration_seconds": 7201.0}),
        ["video"],
        InputLimits(max_duration_seconds=7200),
        "duration_limit",
    ),
    (
        "unknown duration",
        Inspection("video", "video/mp4"),
        ["video"],
        InputLimits(max_duration_seconds=1),
        None,
    ),
    (
        "infinite duration, stored before inspection refused it: unknown",
        Inspection("video", "video/webm", {"duration_seconds": float("inf")}),
        ["video"],
        InputLimits(max_duration_seconds=1),
        None,
    ),
    (
        "duration that is no number: unknown",
        Inspection("video", "video/webm", {"duration_seconds": float("nan")}),
        ["video"],
        InputLimits(max_duration_seconds=1),
        None,
    ),
    (
        "encrypted beats the type",
        Inspection("pdf", "application/pdf", {"encrypted": "user password"}),
        IMAGES,
        THUMBNAIL,
        "encrypted_document",
    ),
    (
        "corrupt container",
        Inspection("zip", "application/zip", {"corrupt": "no central directory"}),
        ["any"],
        InputLimits(),
        "invalid_input",
    ),
]


@pytest.mark.parametrize(
    ("name", "inspection", "accepts", "limits", "code"), RULES, ids=[r[0] for r in RULES]
)
def test_rules(name, inspection, accepts, limits, code):
    if code is None:
        check_operation(inspection, "op", accepts, limits)
        return
    with pytest.raises(errors.InputRejected) as refused:
        check_operation(inspection, "op", accepts, limits)
    assert refused.value.code == code, refused.value.message
    assert refused.value.status == 422
    assert refused.value.message and refused.value.details["operation"] == "op"
    assert refused.value.details["kind"] == inspection.kind


def test_refusal_is_what_no_operation_escapes():
    assert refusal(image()) is None
    refused = refusal(Inspection("zip", "application/zip", {"path_traversal": "../x"}))
    assert refused is not None and refused.code == "path_traversal"


def test_every_code_is_a_class_of_the_error_tree():
    codes = {cls.code for cls in errors.InputRejected.__subclasses__()}
    assert codes == {
        "unsupported_format",
        "input_type_mismatch",
        "invalid_input",
        "macro_document",
        "encrypted_document",
        "zip_bomb",
        "path_traversal",
        "unsafe_xml",
        "polyglot_file",
        "pixel_limit",
        "page_limit",
        "duration_limit",
    }
    assert all(
        issubclass(cls, errors.InvalidRequest) for cls in errors.InputRejected.__subclasses__()
    )


# -- PDF encryption ------------------------------------------------------------------------------

# py-pdf/sample-files 005-libreoffice-writer-password.pdf: RC4-128, revision 3, user
# password "openpassword".
R3_O = bytes.fromhex("27ee85c8447a38715eae7d6003dc487619ca05a05b68b65eccaa26394df7169c")
R3_U = bytes.fromhex("8fc5f6b7b6105307bb68b58098b6884800000000000000000000000000000000")
R3: dict[str, object] = {
    "Filter": "Standard",
    "V": 2,
    "R": 3,
    "Length": 128,
    "P": -1028,
    "O": R3_O,
    "U": R3_U,
}
R3_ID = bytes.fromhex("401d00642aa19414cca931828bf769b3")
# pdfminer.six aes-256-r6.pdf: AES-256, revision 6, user password "usersecret".
R6 = {
    "Filter": "Standard",
    "V": 5,
    "R": 6,
    "O": bytes.fromhex(
        "047761f7f568bfacb096382f2fc7cc94ffd87f33dc472ca4a3a3a78c739c77df26a794a7819aff59b3b85780c0fafe9f"
    ),
    "U": bytes.fromhex(
        "446ea469061c56060b56fa0296bfd32cc54fa9175e92ef5c0b945f4c810e309a03af4a2ff103bbd4db065e036f78ac4c"
    ),
}


def test_the_revision_3_password_check():
    assert pdf.opens_with(R3, R3_ID, b"openpassword")
    assert not pdf.opens_with(R3, R3_ID, b"")
    assert not pdf.opens_with(R3, b"another id", b"openpassword")


def test_the_revision_6_password_check():
    assert pdf.opens_with(R6, b"", b"usersecret")
    assert not pdf.opens_with(R6, b"", b"")


def _encrypted_pdf(encrypt: str, trailer_id: str = "") -> bytes:
    return (
        b"%PDF-1.7\n1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj\n"
        b"2 0 obj << /Type /Pages /Kids [] /Count 3 >> endobj\n"
        + f"5 0 obj\n{encrypt}\nendobj\n".encode("latin-1")
        + f"trailer << /Root 1 0 R /Encrypt 5 0 R {trailer_id} >>\nstartxref\n0\n%%EOF\n".encode()
    )


def test_pdf_verdicts():
    r3 = (
        f"<< /Filter /Standard /V 2 /R 3 /Length 128 /P -1028 /O <{R3_O.hex()}>"
        f" /U <{R3_U.hex()}> >>"
    )
    locked = inspect(_encrypted_pdf(r3, f"/ID [<{R3_ID.hex()}> <{R3_ID.hex()}>]"))
    assert "revision 3" in locked.details["encrypted"]
    assert locked.details["pages"] == 3
    other = inspect(_encrypted_pdf("<< /Filter /Adobe.PubSec /V 4 >>"))
    assert other.details["encrypted"] == "/Adobe.PubSec security handler"
    garbled = inspect(_encrypted_pdf("<< /Filter /Standard /R 3 >>"))
    assert "malformed" in garbled.details["encrypted"]
    plain = inspect(b"%PDF-1.4\n1 0 obj << /Type /Pages /Count 12 >> endobj\n%%EOF\n")
    assert "encrypted" not in plain.details and plain.details["pages"] == 12


def test_pdf_literal_strings_unescape():
    parsed = pdf._parse_object(rb"<< /O (a\)b\\c\101\n(nested)) /N 1 0 R /B true >>")
    assert parsed == {"O": b"a)b\\cA\n(nested)", "N": ("ref", 1, 0), "B": True}


def _pdf_with(stream_dict: bytes, stream: bytes) -> bytes:
    return (
        b"%PDF-1.4\n1 0 obj << /Type /Pages /Count 1 >> endobj\n"
        b"2 0 obj " + stream_dict + b"\nstream\n" + stream + b"\nendstream\nendobj\n%%EOF\n"
    )


def _jbig2_page(width: int, height: int, number: int = 0, long_page: bool = False) -> bytes:
    flags = 48 | (0x40 if long_page else 0)
    page = (1).to_bytes(4 if long_page else 1, "big")
    data = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes(11)
    return (
        number.to_bytes(4, "big") + bytes([flags, 0]) + page + len(data).to_bytes(4, "big") + data
    )


@pytest.mark.parametrize(
    ("stream_dict", "stream", "largest"),
    [
        (b"<< /Length 40 /Filter /JBIG2Decode >>", _jbig2_page(100_000, 100_000), [100_000] * 2),
        (
            b"<< /Filter /JBIG2Decode /Length 40 >>",
            _jbig2_page(640, 480, long_page=True),
            [640, 480],
        ),
        # Not a page information segment first (type 0: symbol dictionary): no size.
        (b"<< /Filter /JBIG2Decode >>", bytes([0, 0, 0, 0, 0, 0, 1]) + bytes(30), None),
        (b"<< /Type /XObject /Subtype /Image /Width 30000 /Height 20000 >>", b"", [30000, 20000]),
        (b"<< /Subtype /Image /Height 7 /BitsPerComponent 8 /Width 9 >>", b"", [9, 7]),
    ],
)
def test_pdf_declared_images(stream_dict, stream, largest):
    found = inspect(_pdf_with(stream_dict, stream)).details.get("largest_image")
    assert found == largest


def test_a_pdf_declaring_a_giant_image_is_over_max_source_pixels():
    bomb = inspect(_pdf_with(b"<< /Filter /JBIG2Decode >>", _jbig2_page(100_000, 100_000)))
    limits = InputLimits(max_source_pixels=1_000_000_000)
    with pytest.raises(errors.PixelLimit, match="100000x100000 image"):
        check_operation(bomb, "pdf_preview", ["pdf"], limits)
    fine = inspect(_pdf_with(b"<< /Subtype /Image /Width 2480 /Height 3507 >>", b""))
    check_operation(fine, "pdf_preview", ["pdf"], limits)
