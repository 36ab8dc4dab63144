"""Generated inputs that each earn one error code (tests/integration/test_error_codes.py).

Every file is built here from nothing but the standard library, pyvips and FFmpeg, so
the error-code tests need no corpus. Each maker says what the file is and why it
earns its code.
"""

from __future__ import annotations

import io
import struct
import subprocess
import zipfile
import zlib
from pathlib import Path

import pyvips

WORD_MAIN = "application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"


# -- images ---------------------------------------------------------------------------


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png(width: int = 8, height: int = 8) -> bytes:
    """A valid grey PNG."""
    rows = b"".join(b"\x00" + bytes(range(width)) for _ in range(height))
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
        + _png_chunk(b"IDAT", zlib.compress(rows))
        + _png_chunk(b"IEND", b"")
    )


def noise_png(width: int, height: int) -> bytes:
    """RGB noise: it does not compress, so its re-encoding is about 3 bytes a pixel."""
    bands: list[pyvips.Image | int | float] = [
        pyvips.Image.gaussnoise(width, height, mean=128, sigma=60) for _ in range(2)
    ]
    first = pyvips.Image.gaussnoise(width, height, mean=128, sigma=60)
    image = first.bandjoin(bands).cast("uchar").copy(interpretation="srgb")
    return bytes(image.pngsave_buffer(compression=1))


def png_declaring(width: int, height: int) -> bytes:
    """A PNG whose header declares ``width`` x ``height`` (a pixel flood): one tiny IDAT."""
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
        + _png_chunk(b"IDAT", zlib.compress(b"\x00" * 64))
        + _png_chunk(b"IEND", b"")
    )


def jpeg_with_broken_table() -> bytes:
    """A 64x64 JPEG whose first Huffman table segment claims a length of 1: the header
    (SOF) reads fine, the decoder gives up ("Bogus marker length")."""
    data = bytearray(pyvips.Image.black(64, 64).jpegsave_buffer())
    at = 2
    while data[at + 1] != 0xC4:  # walk the marker segments up to the first DHT
        at += 2 + int.from_bytes(data[at + 2 : at + 4], "big")
    data[at + 2 : at + 4] = (1).to_bytes(2, "big")
    return bytes(data)


def png_with_zip() -> bytes:
    """A PNG with a ZIP archive glued to its end (a polyglot)."""
    return png() + package({"payload.txt": "hello"})


def svg() -> bytes:
    return b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg" width="9" height="9"/>'


def tiff_old_jpeg() -> bytes:
    """A little-endian TIFF whose one strip claims old-style JPEG compression (6): a
    TIFF, as ingest sees it, that the image steps do not decode."""
    width = height = 8
    strip = bytes(64)
    entries = [
        (256, 3, 1, width),  # ImageWidth
        (257, 3, 1, height),  # ImageLength
        (258, 3, 1, 8),  # BitsPerSample
        (259, 3, 1, 6),  # Compression: old-style JPEG
        (262, 3, 1, 1),  # PhotometricInterpretation: BlackIsZero
        (273, 4, 1, 0),  # StripOffsets (patched below)
        (277, 3, 1, 1),  # SamplesPerPixel
        (278, 3, 1, height),  # RowsPerStrip
        (279, 4, 1, len(strip)),  # StripByteCounts
    ]
    ifd_offset = 8
    ifd_size = 2 + 12 * len(entries) + 4
    strip_offset = ifd_offset + ifd_size
    out = bytearray(b"II*\x00" + struct.pack("<I", ifd_offset))
    out += struct.pack("<H", len(entries))
    for tag, kind, count, value in entries:
        if tag == 273:
            value = strip_offset
        packed = struct.pack("<H", value) + b"\x00\x00" if kind == 3 else struct.pack("<I", value)
        out += struct.pack("<HHI", tag, kind, count) + packed
    out += struct.pack("<I", 0)
    return bytes(out + strip)


# -- Office packages ------------------------------------------------------------------


def package(entries: dict[str, bytes | str], *, encrypted: tuple[str, ...] = ()) -> bytes:
    """A ZIP of ``entries``; the names in ``encrypted`` carry the encryption flag (bit 0
    of the general purpose flags, in the local header and the central directory)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, body in entries.items():
            archive.writestr(zipfile.ZipInfo(name), body, compress_type=zipfile.ZIP_DEFLATED)
    data = bytearray(buffer.getvalue())
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as archive:
        infos = {info.filename: info for info in archive.infolist()}
    for name in encrypted:  # zipfile writes the flags itself: set the bit afterwards
        data[infos[name].header_offset + 6] |= 0x1
    record = data.rindex(b"PK\x05\x06")  # end of central directory -> its first record
    record = struct.unpack_from("<I", data, record + 16)[0]
    while data[record : record + 4] == b"PK\x01\x02":
        name_length, extra_length, comment_length = struct.unpack_from("<HHH", data, record + 28)
        if data[record + 46 : record + 46 + name_length].decode() in encrypted:
            data[record + 8] |= 0x1
        record += 46 + name_length + extra_length + comment_length
    return bytes(data)


def docx(
    extra: dict[str, bytes | str] | None = None,
    *,
    pages: int = 1,
    body: str = "",
    encrypted: tuple[str, ...] = (),
) -> bytes:
    """A minimal Word package: content types, the main part, app.xml with ``pages``."""
    document = body or (
        '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
        '<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main">'
        "<w:body><w:p><w:r><w:t>hello</w:t></w:r></w:p></w:body></w:document>"
    )
    types = (
        '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
        '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
        '<Default Extension="xml" ContentType="application/xml"/>'
        f'<Override PartName="/word/document.xml" ContentType="{WORD_MAIN}"/></Types>'
    )
    return package(
        {
            "[Content_Types].xml": types,
            "word/document.xml": document,
            "docProps/app.xml": f"<Properties><Pages>{pages}</Pages></Properties>",
            **(extra or {}),
        },
        encrypted=encrypted,
    )


def docx_with_macros() -> bytes:
    return docx({"word/vbaProject.bin": b"\xd0\xcf\x11\xe0" + bytes(508)})


def docx_with_encrypted_entry() -> bytes:
    return docx({"word/secret.xml": "<secret/>"}, encrypted=("word/secret.xml",))


def docx_bomb() -> bytes:
    """An entry of 32 MiB of zeros: about 1000:1, over the 200:1 limit."""
    return docx({"word/media/zeros.bin": bytes(32 * 2**20)})


def docx_with_traversal() -> bytes:
    return docx({"../../outside.xml": "<x/>"})


def docx_with_dtd() -> bytes:
    body = (
        '<?xml version="1.0"?><!DOCTYPE w:document [<!ENTITY e "expanded">]>'
        '<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main">'
        "<w:body><w:p><w:r><w:t>&e;</w:t></w:r></w:p></w:body></w:document>"
    )
    return docx(body=body)


# -- PDF ------------------------------------------------------------------------------


def pdf(objects: list[bytes]) -> bytes:
    """A PDF of ``objects`` (object 1 is the catalog) with a correct xref table."""
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for offset in offsets:
        out += b"%010d 00000 n \n" % offset
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


def _stream(dictionary: bytes, data: bytes) -> bytes:
    return b"<< %s /Length %d >>\nstream\n" % (dictionary, len(data)) + data + b"\nendstream"


def one_page_pdf(media_box: bytes = b"0 0 612 792", contents: bytes = b"") -> bytes:
    return pdf(
        [
            b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [%s] /Contents 4 0 R >>" % media_box,
            _stream(b"", contents),
        ]
    )


def pdf_with_hidden_page_tree(pages: int) -> bytes:
    """A PDF 1.5 of ``pages`` blank pages whose page tree node sits in a compressed
    object stream (found through an xref stream): no ``/Count`` is readable without
    inflating it, so only the worker's PDFium counts the pages."""
    first_page = 4  # 1 catalog, 2 the page tree (in object stream 3), 4.. the pages
    kids = b" ".join(b"%d 0 R" % (first_page + i) for i in range(pages))
    tree = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, pages)
    index = b"2 0 "
    packed = zlib.compress(index + tree)
    out = bytearray(b"%PDF-1.5\n")
    offsets: dict[int, int] = {}

    def put(number: int, body: bytes) -> None:
        offsets[number] = len(out)
        out.extend(b"%d 0 obj\n" % number + body + b"\nendobj\n")

    put(1, b"<< /Type /Catalog /Pages 2 0 R >>")
    put(
        3,
        _stream(b"/Type /ObjStm /N 1 /First %d /Filter /FlateDecode" % len(index), packed),
    )
    for number in range(first_page, first_page + pages):
        put(number, b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 10 10] >>")
    xref_number = first_page + pages
    size = xref_number + 1
    rows = bytearray()
    for number in range(size):
        if number == 0:
            rows += struct.pack(">BIH", 0, 0, 65535)
        elif number == 2:
            rows += struct.pack(">BIH", 2, 3, 0)  # in object stream 3, at index 0
        elif number == xref_number:
            rows += struct.pack(">BIH", 1, len(out), 0)
        else:
            rows += struct.pack(">BIH", 1, offsets[number], 0)
    start = len(out)
    out.extend(
        b"%d 0 obj\n" % xref_number
        + _stream(b"/Type /XRef /Size %d /W [1 4 2] /Root 1 0 R" % size, bytes(rows))
        + b"\nendobj\n"
    )
    out.extend(b"startxref\n%d\n%%%%EOF\n" % start)
    return bytes(out)


def pdf_path_bomb(megabytes: int) -> bytes:
    """One page whose content stream (``megabytes`` MiB once inflated, about 2 KB a MiB
    compressed) draws one path of millions of segments: PDFium keeps every point, and
    its allocator aborts when RLIMIT_AS refuses more."""
    unit = b"0 0 m 1 1 l "
    block = unit * ((1 << 20) // len(unit))
    compressor = zlib.compressobj(9)
    data = b"".join(compressor.compress(block) for _ in range(megabytes))
    data += compressor.compress(b" S") + compressor.flush()
    return pdf(
        [
            b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R >>",
            _stream(b"/Filter /FlateDecode", data),
        ]
    )


# -- audio ----------------------------------------------------------------------------


def _extended(value: float) -> bytes:
    """An 80-bit IEEE 754 extended float (AIFF's sample rate)."""
    exponent = 16383 + int(value).bit_length() - 1
    mantissa = int(value) << (64 - int(value).bit_length())
    return struct.pack(">HQ", exponent, mantissa)


def aiff_declaring(frames: int, rate: int = 8000) -> bytes:
    """An AIFF whose COMM chunk declares ``frames`` mono 16-bit sample frames (the
    header ingest does not read: the worker's probe finds the duration)."""
    comm = struct.pack(">hIh", 1, frames, 16) + _extended(rate)
    ssnd = struct.pack(">II", 0, 0) + bytes(64)
    body = (
        b"AIFF"
        + b"COMM"
        + struct.pack(">I", len(comm))
        + comm
        + b"SSND"
        + struct.pack(">I", len(ssnd))
        + ssnd
    )
    return b"FORM" + struct.pack(">I", len(body)) + body


def flac_declaring(seconds: int, rate: int = 8000) -> bytes:
    """A FLAC stream whose STREAMINFO declares ``seconds`` of mono 16-bit sound (and no
    frames at all)."""
    total = seconds * rate
    packed = (rate << 44) | (0 << 41) | (15 << 36) | total
    info = struct.pack(">HH", 4096, 4096) + bytes(6) + packed.to_bytes(8, "big") + bytes(16)
    return b"fLaC" + bytes([0x80]) + len(info).to_bytes(3, "big") + info


def m4a_without_sound(directory: Path) -> bytes:
    """An MP4 with the audio brand ``M4A `` whose only track is subtitles: audio, as
    ingest reads the brand, with no stream ``transcode_audio`` could use."""
    subtitles = directory / "subtitles.srt"
    subtitles.write_text("1\n00:00:00,000 --> 00:00:01,000\nhello\n")
    path = directory / "no-sound.m4a"
    subprocess.run(
        [
            "ffmpeg",
            "-nostdin",
            "-loglevel",
            "error",
            "-y",
            "-i",
            str(subtitles),
            "-c:s",
            "mov_text",
            "-brand",
            "M4A ",
            "-f",
            "mp4",
            str(path),
        ],
        check=True,
        timeout=60,
    )
    return path.read_bytes()
