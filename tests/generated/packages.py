"""Office packages built by code: Word packages LibreOffice opens (with a linked
picture, an attached template, macros, a DTD), a spreadsheet whose shared strings
expand a thousandfold, and an OpenDocument text encrypted as ODF 1.2 says. The hostile
group (:mod:`tests.generated.hostile`) files them; tests call the makers to aim the
external references at a listener of their own.
"""

from __future__ import annotations

import base64
import hashlib
import io
import random
import zipfile
import zlib
from xml.sax.saxutils import escape, quoteattr

from tests import error_inputs

TEMPLATE_TEXT = "Document with external attached template"
PICTURE_TEXT = "Document with an external picture"
PASSWORD = "secret"
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


def shared_strings_bomb_xlsx(row_count: int = 4000) -> bytes:
    """One shared string of 1 MiB referenced by 3 cells a row (12,000 by default): a
    12 GB CSV from a workbook of a few hundred KB (each 32-letter run is random: it
    does not compress like zeros, so the package's ratio stays an ordinary one)."""
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
        for r in range(1, row_count + 1)
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
