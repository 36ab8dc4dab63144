"""Hostile files, built by code from the other groups' files and from nothing.

Each says in its manifest entry what the platform must do with it, in the corpus's
words (``reject:<reason>``, ``tolerate:<reason>``, ``neutralize:<what>``,
``sanitize:filename``). The documents whose point is an external reference take the
URL they point at, so a test can aim them at a listener of its own.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import random
import struct
import tempfile
import zipfile
import zlib
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

import pyvips

from tests import error_inputs
from tests.generated import documents
from tests.generated.entries import Entry
from tests.generated.images import KEEP_EXIF, picture

# Where the external references of the neutralize:external-ref documents point when no
# test aims them elsewhere: a name that never resolves (RFC 2606).
NOWHERE = "http://hypermedia-canary.invalid"
TEMPLATE_TEXT = "Document with external attached template"
PICTURE_TEXT = "Document with an external picture"
PHP = b"<?php phpinfo(); ?>"
PASSWORD = "secret"
FRAME_FLOOD = 1_100  # frames: over the default max_frames (1000)
LONG_NAME = (
    "Longitudinell_jämförelse_mellan_laserkirurgi_och_strålbehandling_gällande_"
    "röstkvalitet_och_självskattad_kommunikation_upp_till_två_år_efter_tidig_"
    "stämbandscancer_i_ett_randomiserat_kontrollerat_försök.docx"
)

W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
R = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
PACKAGE_RELS = "http://schemas.openxmlformats.org/package/2006/relationships"
WORD_MAIN = error_inputs.WORD_MAIN
WORD_MACRO_MAIN = "application/vnd.ms-word.document.macroEnabled.main+xml"


# -- Word packages -------------------------------------------------------------------------


def _relationships(rels: list[tuple[str, str, str, bool]]) -> str:
    """(id, type suffix, target, external) -> a .rels part."""
    items = "".join(
        f'<Relationship Id="{rid}" Type="{R}/{kind}" Target={quoteattr(target)}'
        + (' TargetMode="External"' if external else "")
        + "/>"
        for rid, kind, target, external in rels
    )
    head = '<?xml version="1.0" encoding="UTF-8"?>'
    return f'{head}<Relationships xmlns="{PACKAGE_RELS}">{items}</Relationships>'


def word_package(
    body: str,
    *,
    rels: list[tuple[str, str, str, bool]] | None = None,
    parts: dict[str, bytes | str] | None = None,
    main_type: str = WORD_MAIN,
    overrides: dict[str, str] | None = None,
) -> bytes:
    """A Word package LibreOffice opens: content types, package and document
    relationships, ``body`` (paragraph XML) in word/document.xml, and ``parts``."""
    extra = "".join(
        f'<Override PartName="{name}" ContentType="{kind}"/>'
        for name, kind in (overrides or {}).items()
    )
    types = (
        '<?xml version="1.0" encoding="UTF-8"?>'
        '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
        '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.'
        'relationships+xml"/><Default Extension="xml" ContentType="application/xml"/>'
        f'<Override PartName="/word/document.xml" ContentType="{main_type}"/>{extra}</Types>'
    )
    document = (
        f'<?xml version="1.0" encoding="UTF-8"?><w:document xmlns:w="{W}" xmlns:r="{R}"'
        ' xmlns:wp="http://schemas.openxmlformats.org/drawingml/2006/wordprocessingDrawing"'
        ' xmlns:a="http://schemas.openxmlformats.org/drawingml/2006/main"'
        ' xmlns:pic="http://schemas.openxmlformats.org/drawingml/2006/picture">'
        f"<w:body>{body}</w:body></w:document>"
    )
    return error_inputs.package(
        {
            "[Content_Types].xml": types,
            "_rels/.rels": _relationships([("rId1", "officeDocument", "word/document.xml", False)]),
            "word/document.xml": document,
            "word/_rels/document.xml.rels": _relationships(rels or []),
            **(parts or {}),
        }
    )


def paragraph(text: str) -> str:
    return f"<w:p><w:r><w:t>{escape(text)}</w:t></w:r></w:p>"


def external_picture_docx(url: str) -> bytes:
    """A picture linked (``r:link``) to ``url``, not embedded: showing it fetches it."""
    graphic = (
        '<w:p><w:r><w:drawing><wp:inline><wp:extent cx="914400" cy="914400"/>'
        '<wp:docPr id="1" name="linked"/><a:graphic><a:graphicData uri="http://schemas.'
        'openxmlformats.org/drawingml/2006/picture"><pic:pic><pic:nvPicPr><pic:cNvPr id="1"'
        ' name="linked"/><pic:cNvPicPr/></pic:nvPicPr><pic:blipFill><a:blip r:link="rIdPic"/>'
        '<a:stretch><a:fillRect/></a:stretch></pic:blipFill><pic:spPr><a:xfrm><a:off x="0"'
        ' y="0"/><a:ext cx="914400" cy="914400"/></a:xfrm><a:prstGeom prst="rect"/></pic:spPr>'
        "</pic:pic></a:graphicData></a:graphic></wp:inline></w:drawing></w:r></w:p>"
    )
    return word_package(paragraph(PICTURE_TEXT) + graphic, rels=[("rIdPic", "image", url, True)])


def attached_template_docx(url: str) -> bytes:
    """A document whose settings attach the template at ``url`` (fetched when opened)."""
    settings = (
        f'<?xml version="1.0" encoding="UTF-8"?><w:settings xmlns:w="{W}" xmlns:r="{R}">'
        '<w:attachedTemplate r:id="rIdTemplate"/></w:settings>'
    )
    template = [("rIdTemplate", "attachedTemplate", url, True)]
    return word_package(
        paragraph(TEMPLATE_TEXT),
        rels=[("rIdSettings", "settings", "settings.xml", False)],
        parts={
            "word/settings.xml": settings,
            "word/_rels/settings.xml.rels": _relationships(template),
        },
        overrides={
            "/word/settings.xml": "application/vnd.openxmlformats-officedocument."
            "wordprocessingml.settings+xml"
        },
    )


def macro_docm() -> bytes:
    """A macro-enabled Word document with its VBA project part (an OLE2 stream)."""
    return word_package(
        paragraph("This document carries macros."),
        rels=[("rIdVba", "vbaProject", "vbaProject.bin", False)],
        parts={"word/vbaProject.bin": b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(504)},
        main_type=WORD_MACRO_MAIN,
        overrides={"/word/vbaProject.bin": "application/vnd.ms-office.vbaProject"},
    )


def _doctype_docx(doctype: str, text: str) -> bytes:
    body = (
        f'<?xml version="1.0"?><!DOCTYPE w:document [{doctype}]><w:document xmlns:w="{W}">'
        f"<w:body><w:p><w:r><w:t>{text}</w:t></w:r></w:p></w:body></w:document>"
    )
    return error_inputs.docx(body=body)


def xxe_docx() -> bytes:
    return _doctype_docx('<!ENTITY xxe SYSTEM "file:///etc/passwd">', "&xxe;")


def xml_bomb_docx() -> bytes:
    """Billion laughs: ten levels of ten references."""
    entities = '<!ENTITY lol0 "lol">' + "".join(
        f'<!ENTITY lol{n} "{("&lol" + str(n - 1) + ";") * 10}">' for n in range(1, 10)
    )
    return _doctype_docx(entities, "&lol9;")


def shared_strings_bomb_xlsx() -> bytes:
    """One shared string of 1 MiB referenced by 12,000 cells: a 12 GB CSV from a
    workbook of a few hundred KB (each 32-letter run is random: it does not compress
    like zeros, so the package's ratio stays an ordinary one)."""
    rng = random.Random(12)
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    text = "".join(rng.choice(letters) * 32 for _ in range(2**20 // 32))
    main = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
    strings = (
        f'<?xml version="1.0"?><sst xmlns="{main}" count="1" uniqueCount="1">'
        f"<si><t>{text}</t></si></sst>"
    )
    rows = "".join(
        f'<row r="{r}">'
        + "".join(f'<c r="{col}{r}" t="s"><v>0</v></c>' for col in "ABC")
        + "</row>"
        for r in range(1, 4001)
    )
    sheet = (
        f'<?xml version="1.0"?><worksheet xmlns="{main}"><sheetData>{rows}</sheetData></worksheet>'
    )
    workbook = (
        f'<?xml version="1.0"?><workbook xmlns="{main}" xmlns:r="{R}"><sheets>'
        '<sheet name="Bomb" sheetId="1" r:id="rId1"/></sheets></workbook>'
    )
    sml = "application/vnd.openxmlformats-officedocument.spreadsheetml"
    types = (
        '<?xml version="1.0"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/'
        'content-types"><Default Extension="rels" ContentType="application/vnd.openxmlformats-'
        'package.relationships+xml"/><Default Extension="xml" ContentType="application/xml"/>'
        f'<Override PartName="/xl/workbook.xml" ContentType="{sml}.sheet.main+xml"/>'
        f'<Override PartName="/xl/worksheets/sheet1.xml" ContentType="{sml}.worksheet+xml"/>'
        f'<Override PartName="/xl/sharedStrings.xml" ContentType="{sml}.sharedStrings+xml"/>'
        "</Types>"
    )
    return error_inputs.package(
        {
            "[Content_Types].xml": types,
            "_rels/.rels": _relationships([("rId1", "officeDocument", "xl/workbook.xml", False)]),
            "xl/workbook.xml": workbook,
            "xl/_rels/workbook.xml.rels": _relationships(
                [
                    ("rId1", "worksheet", "worksheets/sheet1.xml", False),
                    ("rId2", "sharedStrings", "sharedStrings.xml", False),
                ]
            ),
            "xl/worksheets/sheet1.xml": sheet,
            "xl/sharedStrings.xml": strings,
        }
    )


# -- ODF --------------------------------------------------------------------------------


def encrypted_odt(flat: str, password: str = PASSWORD) -> bytes:
    """An ODT whose content.xml is encrypted as ODF 1.2 says (AES-256-CBC, key by
    PBKDF2-HMAC-SHA1 over SHA-256 of the password); salt and IV fixed, so the bytes are
    too. LibreOffice asks for the password before it shows anything."""
    from cryptography.hazmat.primitives import hashes, padding
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
    from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC

    content = flat.replace("<office:document ", "<office:document-content ", 1)
    content = content.replace("</office:document>", "</office:document-content>")
    data = content.encode()
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    compressed = compressor.compress(data) + compressor.flush()
    salt, iv = hashlib.sha256(b"salt").digest()[:16], hashlib.sha256(b"iv").digest()[:16]
    kdf = PBKDF2HMAC(hashes.SHA1(), length=32, salt=salt, iterations=100_000)
    key = kdf.derive(hashlib.sha256(password.encode()).digest())
    padder = padding.PKCS7(128).padder()
    padded = padder.update(compressed) + padder.finalize()
    encryptor = Cipher(algorithms.AES(key), modes.CBC(iv)).encryptor()
    encrypted = encryptor.update(padded) + encryptor.finalize()
    checksum = hashlib.sha256(compressed[:1024]).digest()

    def b64(value: bytes) -> str:
        return base64.b64encode(value).decode()

    ns = "urn:oasis:names:tc:opendocument:xmlns:manifest:1.0"
    manifest = (
        f'<?xml version="1.0" encoding="UTF-8"?><manifest:manifest xmlns:manifest="{ns}"'
        ' manifest:version="1.2"><manifest:file-entry manifest:full-path="/"'
        ' manifest:media-type="application/vnd.oasis.opendocument.text"/>'
        '<manifest:file-entry manifest:full-path="content.xml" manifest:media-type="text/xml"'
        f' manifest:size="{len(data)}"><manifest:encryption-data'
        f' manifest:checksum-type="{ns}#sha256-1k" manifest:checksum="{b64(checksum)}">'
        '<manifest:algorithm manifest:algorithm-name="http://www.w3.org/2001/04/xmlenc#'
        f'aes256-cbc" manifest:initialisation-vector="{b64(iv)}"/>'
        "<manifest:start-key-generation manifest:start-key-generation-name="
        '"http://www.w3.org/2000/09/xmldsig#sha256" manifest:key-size="32"/>'
        '<manifest:key-derivation manifest:key-derivation-name="PBKDF2" manifest:key-size="32"'
        f' manifest:iteration-count="100000" manifest:salt="{b64(salt)}"/>'
        "</manifest:encryption-data></manifest:file-entry></manifest:manifest>"
    )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        stamp = (1980, 1, 1, 0, 0, 0)
        archive.writestr(
            zipfile.ZipInfo("mimetype", stamp), "application/vnd.oasis.opendocument.text"
        )
        archive.writestr(zipfile.ZipInfo("content.xml", stamp), encrypted)
        archive.writestr(
            zipfile.ZipInfo("META-INF/manifest.xml", stamp),
            manifest,
            compress_type=zipfile.ZIP_DEFLATED,
        )
    return buffer.getvalue()


# -- images -------------------------------------------------------------------------------


def jpeg_declaring(width: int, height: int) -> bytes:
    """A small JPEG whose frame header (SOF0) says ``width`` x ``height``."""
    data = bytearray(picture(16, 16).jpegsave_buffer(Q=80))
    at = 2
    while data[at + 1] not in (0xC0, 0xC1, 0xC2):  # walk the segments up to the SOF
        at += 2 + int.from_bytes(data[at + 2 : at + 4], "big")
    struct.pack_into(">HH", data, at + 5, height, width)
    return bytes(data)


def php_in_metadata_jpeg() -> bytes:
    """A good JPEG carrying PHP in a comment and in its EXIF description."""
    image = picture(160, 120).copy()
    image.set_type(pyvips.GValue.gstr_type, "exif-ifd0-ImageDescription", PHP.decode())
    data = bytes(image.jpegsave_buffer(Q=85, keep=KEEP_EXIF))
    comment = b"\xff\xfe" + struct.pack(">H", len(PHP) + 2) + PHP
    return data[:2] + comment + data[2:]


def frame_flood_gif(frames: int = FRAME_FLOOD) -> bytes:
    """``frames`` frames of 1x1: a first-frame thumbnail is cheap, the animation is not."""
    # Frames alternate black and white: a saver may merge identical ones.
    strip = (pyvips.Image.xyz(1, frames)[1] % 2 * 255).cast("uchar").copy(interpretation="b-w")
    strip.set_type(pyvips.GValue.gint_type, "page-height", 1)
    strip.set_type(pyvips.GValue.array_int_type, "delay", [10] * frames)
    return bytes(strip.gifsave_buffer())


def _midi() -> bytes:
    """One note on and off: a MIDI file holds no samples."""
    track = bytes([0x00, 0x90, 0x3C, 0x40, 0x60, 0x80, 0x3C, 0x40, 0x00, 0xFF, 0x2F, 0x00])
    header = b"MThd" + struct.pack(">IHHH", 6, 0, 1, 96)
    return header + b"MTrk" + struct.pack(">I", len(track)) + track


def _wav_without_samples() -> bytes:
    fmt = struct.pack("<HHIIHH", 1, 1, 8000, 16000, 2, 16)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", 0)
    return b"RIFF" + struct.pack("<I", len(body)) + body


# ISO BMFF's JPEG XL signature box (ISO/IEC 18181-2): nothing here writes JPEG XL.
JXL_SIGNATURE = b"\x00\x00\x00\x0cJXL \r\n\x87\n"
PLAYLIST = b"#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:10,\nhttp://169.254.169.254/latest\n"
CONCAT = b"ffconcat version 1.0\nfile /etc/passwd\n"
SVG_SCRIPT = (
    b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10">'
    b"<script>alert(document.cookie)</script></svg>"
)
FILENAMES = (
    "$(id).png",
    "-rf.pdf",
    "..%2F..%2F..%2Fetc%2Fpasswd.png",
    "..\\..\\..\\windows\\win.ini.jpg",
    "CON.png",
    "shell.php%00.jpg",
    "image\u202egpj.exe",
    "a;b|c&d`e'f.jpg",
    LONG_NAME,
)


# -- the group -----------------------------------------------------------------------------


def build(directory: Path) -> list[Entry]:
    """Needs the images, documents and media groups built into ``directory`` first."""
    out = directory / "hostile"
    out.mkdir(parents=True, exist_ok=True)
    images, docs, clips = directory / "images", directory / "documents", directory / "media"
    drawing = (images / "drawing.png").read_bytes()
    report = (docs / "report.docx").read_bytes()
    clip = (clips / "clip.mp4").read_bytes()
    with tempfile.TemporaryDirectory(prefix="hm-hostile-") as name:
        scratch = Path(name)
        no_sound = error_inputs.m4a_without_sound(scratch)
        (scratch / "report.fodt").write_text(documents.report_fodt(), encoding="utf-8")
        documents.soffice_convert([scratch / "report.fodt"], documents.ENCRYPTED_PDF, scratch)
        encrypted_pdf = (scratch / "report.pdf").read_bytes()
    # name, content, kind, expected, note
    files: list[tuple[str, bytes, str, str, str]] = [
        ("png-50000x50000-header.png", error_inputs.png_declaring(50_000, 50_000),
         "image:png", "reject:pixel-flood", "IHDR declares 2.5 Gpx, one tiny IDAT"),
        ("jpeg-64250x64250-header.jpg", jpeg_declaring(64_250, 64_250),
         "image:jpeg", "reject:pixel-flood", "SOF0 declares 64250x64250"),
        ("corrupt-header.jpg", error_inputs.jpeg_with_broken_table(),
         "image:jpeg", "reject:malformed", "a Huffman table segment of length 1"),
        ("truncated.png", drawing[: len(drawing) // 2],
         "image:png", "tolerate:truncated", "the first half of drawing.png"),
        ("truncated.webp", (images / "banner.webp").read_bytes()[:26],
         "image:webp", "reject:malformed", "the first 26 bytes of a WebP"),
        ("truncated.avif", (images / "photo.avif").read_bytes()[:185],
         "image:avif", "reject:malformed", "the first 185 bytes of an AVIF: no meta box"),
        ("truncated.heic", (images / "phone.heic").read_bytes()[:600],
         "image:heic", "reject:malformed", "the first 600 bytes of a HEIC"),
        ("truncated.svgz", gzip.compress(error_inputs.svg() * 8, mtime=0)[:40],
         "image:svgz", "reject:truncated", "40 bytes of a gzip-compressed SVG"),
        ("jxl-signature.jxl", JXL_SIGNATURE, "image:jxl", "reject:unsupported-type",
         "the JPEG XL signature box and nothing more"),
        ("frame-flood.gif", frame_flood_gif(),
         "image:gif", "tolerate:frame-flood", f"{FRAME_FLOOD} frames of 1x1"),
        ("php-in-metadata.jpg", php_in_metadata_jpeg(),
         "image:jpeg", "neutralize:metadata", "PHP in a COM segment and in EXIF"),
        ("polyglot-jpeg-zip.jpg", (images / "photo.jpg").read_bytes() + error_inputs.docx(),
         "polyglot:jpeg+zip", "reject:polyglot", "a Word package glued to a JPEG"),
        ("pdf-named.jpg", (docs / "hello.pdf").read_bytes(),
         "type-mismatch:pdf", "reject:type-mismatch", ""),
        ("png-named.pdf", drawing, "type-mismatch:png", "reject:type-mismatch", ""),
        ("docx-named.pdf", report, "type-mismatch:docx", "reject:type-mismatch", ""),
        ("svg-with-script-named.png", SVG_SCRIPT,
         "type-mismatch:svg", "reject:type-mismatch", "an SVG with a script"),
        ("playlist-named.mp4", PLAYLIST, "type-mismatch:m3u8", "reject:type-mismatch",
         "HLS playlist naming the cloud metadata address"),
        ("concat-named.mp4", CONCAT, "type-mismatch:ffconcat", "reject:type-mismatch",
         "FFmpeg concat script naming /etc/passwd"),
        ("not-a-zip.odt", b"This is plain text, not an OpenDocument package.\n",
         "document:odt", "reject:type-mismatch", "text named .odt"),
        ("zipbomb.docx", error_inputs.docx_bomb(),
         "document:docx", "reject:zip-bomb", "32 MiB of zeros in one entry"),
        ("zipslip.docx", error_inputs.docx_with_traversal(),
         "document:docx", "reject:path-traversal", "an entry named ../../outside.xml"),
        ("macros.docm", macro_docm(), "document:docm", "reject:macro", "word/vbaProject.bin"),
        ("xxe.docx", xxe_docx(), "document:docx", "reject:xxe", "SYSTEM file:///etc/passwd"),
        ("xml-bomb.docx", xml_bomb_docx(), "document:docx", "reject:xml-bomb", "10^9 laughs"),
        ("encrypted-entry.docx", error_inputs.docx_with_encrypted_entry(),
         "document:docx", "reject:encrypted", "an encrypted ZIP entry"),
        ("encrypted.odt", encrypted_odt(documents.report_fodt()),
         "document:odt", "reject:encrypted", f"AES-256, password {PASSWORD!r}"),
        ("encrypted.pdf", encrypted_pdf,
         "pdf", "reject:encrypted", f"LibreOffice, password {PASSWORD!r}"),
        ("truncated.docx", report[: len(report) // 2],
         "document:docx", "reject:truncated", "the first half of report.docx"),
        ("shared-strings-bomb.xlsx", shared_strings_bomb_xlsx(),
         "document:xlsx", "reject:expansion-bomb", "12,000 cells x 1 MiB of text"),
        ("external-picture.docx", external_picture_docx(f"{NOWHERE}/picture.png"),
         "document:docx", "neutralize:external-ref", "a linked picture"),
        ("attached-template.docx", attached_template_docx(f"{NOWHERE}/template.dotx"),
         "document:docx", "neutralize:external-ref", "an attached template"),
        ("linked-external.fodt", documents.linked_fodt(f"{NOWHERE}/giraffe.png").encode(),
         "document:fodt", "neutralize:external-ref", "an image by link"),
        ("javascript.pdf", documents.javascript_pdf(),
         "pdf", "neutralize:javascript", "JavaScript as open and page actions"),
        ("garbage.pdf", b"%PDF-1.7\n garbage", "pdf", "reject:malformed", ""),
        ("damaged-page-tree.pdf",
         documents.text_pdf([["first page"], ["third page"]], missing_kids=1),
         "pdf", "tolerate:malformed", "a page reference to an object that is not there"),
        ("empty.mp3", b"", "media:mp3", "reject:empty", "zero bytes"),
        ("truncated.mp4", clip[:2048], "media:mp4", "reject:truncated", "the first 2 KiB"),
        ("no-samples.wav", _wav_without_samples(), "media:wav", "reject:no-samples", ""),
        ("no-sound.m4a", no_sound, "media:m4a", "reject:no-streams", "one subtitle track"),
        ("notes.mid", _midi(), "media:midi", "reject:unsupported-type", "notes, no samples"),
        ("mp4-named.mp3", (clips / "silent.mov").read_bytes(),
         "type-mismatch:mp4", "reject:type-mismatch", "video without sound"),
    ]  # fmt: skip
    for filename in FILENAMES:
        suffix = Path(filename).suffix
        source = {".png": images / "drawing.png", ".pdf": docs / "hello.pdf"}.get(suffix)
        if filename == LONG_NAME:
            source = docs / "report.docx"
        source = source or images / "photo.jpg"
        files.append(
            (filename, source.read_bytes(), f"filename:{source.suffix[1:]}",
             "sanitize:filename", "")
        )  # fmt: skip
    entries = []
    for filename, data, kind, expected, note in files:
        (out / filename).write_bytes(data)
        entries.append(Entry(f"hostile/{filename}", f"hostile:{kind}", expected, note))
    return entries
