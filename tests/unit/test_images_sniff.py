"""pipelines.sniff: type by content, a table of leading bytes -> kind."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from pipelines.sniff import (
    ARCHIVE_TAIL_BYTES,
    appended_archive,
    sniff,
    tiff_compression,
)

REPO = Path(__file__).resolve().parents[2]


def _png_ihdr(width: int, height: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return (
        b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + chunk + struct.pack(">I", zlib.crc32(chunk))
    )


def _ftyp(major: bytes, *compatible: bytes) -> bytes:
    body = major + b"\x00\x00\x00\x00" + b"".join(compatible)
    return struct.pack(">I", 8 + len(body)) + b"ftyp" + body + b"\x00\x00\x00\x08meta"


def _bmp(dib_size: int) -> bytes:
    return b"BM" + struct.pack("<IHHI", 1000, 0, 0, 54) + struct.pack("<I", dib_size) + bytes(40)


def _ico(count: int) -> bytes:
    entry = bytes([16, 16, 0, 0]) + struct.pack("<HHII", 1, 32, 100, 22)
    return b"\x00\x00\x01\x00" + struct.pack("<H", count) + entry


CASES = [
    # (description, leading bytes, kind)
    ("png", _png_ihdr(10, 10), "png"),
    ("jpeg jfif", b"\xff\xd8\xff\xe0\x00\x10JFIF\x00", "jpeg"),
    ("jpeg exif", b"\xff\xd8\xff\xe1\x12\x34Exif\x00\x00", "jpeg"),
    ("gif87a", b"GIF87a\x01\x00\x01\x00", "gif"),
    ("gif89a", b"GIF89a\x01\x00\x01\x00", "gif"),
    ("webp", b"RIFF\x24\x00\x00\x00WEBPVP8 ", "webp"),
    ("avi is video", b"RIFF\x24\x00\x00\x00AVI LIST", "video"),
    ("wav is audio", b"RIFF\x24\x00\x00\x00WAVEfmt ", "audio"),
    ("tiff little-endian", b"II*\x00\x08\x00\x00\x00", "tiff"),
    ("tiff big-endian", b"MM\x00*\x00\x00\x00\x08", "tiff"),
    ("bigtiff", b"II+\x00\x08\x00\x00\x00\x10\x00\x00\x00\x00\x00\x00\x00", "tiff"),
    ("canon cr2 is raw", b"II*\x00\x10\x00\x00\x00CR\x02\x00", "camera-raw"),
    ("bmp v3", _bmp(40), "bmp"),
    ("bmp v5", _bmp(124), "bmp"),
    ("BM without a DIB header", b"BM" + bytes(20), "unknown"),
    ("ico", _ico(1), "ico"),
    ("ico with no images", _ico(0)[:6] + bytes(16), "unknown"),
    ("cur", b"\x00\x00\x02\x00\x01\x00" + bytes(16), "cur"),
    ("avif", _ftyp(b"avif", b"mif1", b"miaf"), "avif"),
    ("avif sequence", _ftyp(b"avis", b"mif1", b"avif", b"msf1"), "avifs"),
    ("mif1 with avif brand", _ftyp(b"mif1", b"avif"), "avif"),
    ("heic", _ftyp(b"heic", b"mif1", b"heic"), "heic"),
    ("heix", _ftyp(b"heix", b"mif1"), "heic"),
    ("mif1 with heic brand", _ftyp(b"mif1", b"heic"), "heic"),
    ("mif1 alone", _ftyp(b"mif1", b"mif1"), "heif"),
    ("jxl in isobmff (ftyp)", _ftyp(b"jxl ", b"jxl "), "jxl"),
    ("mp4", _ftyp(b"isom", b"isom", b"mp41"), "video"),
    ("quicktime", _ftyp(b"qt  ", b"qt  "), "video"),
    ("3gp", _ftyp(b"3gp4", b"3gp4"), "video"),
    ("canon cr3", _ftyp(b"crx ", b"crx "), "camera-raw"),
    ("jxl codestream", b"\xff\x0a\xfa\x7f", "jxl"),
    ("jxl container", b"\x00\x00\x00\x0cJXL \r\n\x87\n", "jxl"),
    ("jp2", b"\x00\x00\x00\x0cjP  \r\n\x87\n", "jp2"),
    ("j2k codestream", b"\xff\x4f\xff\x51\x00\x2f", "jp2"),
    ("psd", b"8BPS\x00\x01", "psd"),
    ("pdf", b"%PDF-1.7\n", "pdf"),
    ("postscript", b"%!PS-Adobe-3.0 EPSF-3.0\n", "postscript"),
    ("eps binary", b"\xc5\xd0\xd3\xc6\x20\x00", "postscript"),
    ("gzip (svgz)", b"\x1f\x8b\x08\x00", "gzip"),
    ("openexr", b"v/1\x01\x02\x00\x00\x00", "exr"),
    ("radiance", b"#?RADIANCE\n", "radiance"),
    ("fits", b"SIMPLE  =                    T", "fits"),
    ("vips native, little-endian", b"\x08\xf2\xa6\xb6" + bytes(60), "vips"),
    ("vips native, big-endian", b"\xb6\xa6\xf2\x08" + bytes(60), "vips"),
    ("dds", b"DDS \x7c\x00\x00\x00", "dds"),
    ("qoi", b"qoif\x00\x00\x00\x01", "qoi"),
    ("sgi", b"\x01\xda\x01\x01", "sgi"),
    ("mng", b"\x8aMNG\r\n\x1a\n", "mng"),
    ("xcf", b"gimp xcf v011", "xcf"),
    ("pbm", b"P4\n10 10\n", "pnm"),
    ("ppm", b"P6 10 10 255\n", "pnm"),
    ("zip / docx", b"PK\x03\x04\x14\x00", "zip"),
    ("ole (doc, encrypted docx)", b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "ole"),
    ("flac", b"fLaC\x00\x00\x00\x22", "audio"),
    ("mp3 with id3", b"ID3\x04\x00", "audio"),
    ("matroska", b"\x1a\x45\xdf\xa3\x01", "video"),
    ("svg", b'<svg xmlns="http://www.w3.org/2000/svg"/>', "svg"),
    ("svg after xml prolog", b'<?xml version="1.0"?>\n<!DOCTYPE svg>\n<svg>', "svg"),
    ("svg with bom and blanks", b"\xef\xbb\xbf  \n<svg>", "svg"),
    ("html", b"<!DOCTYPE html><html>", "html"),
    ("other xml", b'<?xml version="1.0"?><office:document>', "xml"),
    ("csv (libvips csvload food)", b"1,2,3\n4,5,6\n", "text"),
    ("matrix text", b"2 2\n1 0\n0 1\n", "text"),
    ("random binary", bytes(range(7, 64)), "unknown"),
    ("empty", b"", "empty"),
]


@pytest.mark.parametrize(("head", "kind"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_sniff_names_the_type_from_content(head, kind):
    assert sniff(head).kind == kind


def test_every_detected_type_has_a_label():
    for _, head, _ in CASES:
        assert sniff(head).label


def test_webp_that_looks_like_svg_is_webp():
    # libvips regression: a WebP whose bytes also contain "<svg".
    head = b"RIFF\x24\x00\x00\x00WEBPVP8L" + b"<svg " * 10
    assert sniff(head).kind == "webp"


# --- appended archives ---------------------------------------------------------------


def _eocd(comment: bytes = b"") -> bytes:
    return b"PK\x05\x06" + bytes(16) + struct.pack("<H", len(comment)) + comment


@pytest.mark.parametrize(
    ("tail", "appended"),
    [
        (b"\xff\xd9", False),
        (b"\xff\xd9" + b"PK\x03\x04...." + _eocd(), True),
        (b"\xff\xd9" + _eocd(b"a comment"), True),
        # The signature by chance inside image data: the record does not end the file.
        (b"PK\x05\x06" + bytes(40), False),
        (b"PK\x05\x06" + bytes(10), False),
        (_eocd(b"x" * 5)[:-1], False),
        (b"", False),
    ],
    ids=["plain", "zip", "zip with comment", "chance signature", "too short", "cut", "empty"],
)
def test_appended_archive(tail, appended):
    assert appended_archive(tail) is appended


def test_archive_tail_covers_the_longest_comment():
    assert ARCHIVE_TAIL_BYTES == 22 + 65535


# --- TIFF compression ------------------------------------------------------------------


def _tiff(order: str, compression: int | None, *, big: bool = False) -> bytes:
    tags = [(256, 3, 1, 10), (257, 3, 1, 10)]
    if compression is not None:
        tags.append((259, 3, 1, compression))
    if big:
        magic = (b"II+\x00" if order == "<" else b"MM\x00+") + struct.pack(order + "HHQ", 8, 0, 16)
        entries = b"".join(
            struct.pack(order + "HHQ", tag, kind, count)
            + struct.pack(order + "H", value)
            + bytes(6)
            for tag, kind, count, value in tags
        )
        return magic + struct.pack(order + "Q", len(tags)) + entries
    magic = (b"II*\x00" if order == "<" else b"MM\x00*") + struct.pack(order + "I", 8)
    entries = b"".join(
        struct.pack(order + "HHI", tag, kind, count) + struct.pack(order + "H", value) + bytes(2)
        for tag, kind, count, value in tags
    )
    return magic + struct.pack(order + "H", len(tags)) + entries


@pytest.mark.parametrize(
    ("data", "compression"),
    [
        (_tiff("<", 1), 1),
        (_tiff(">", 6), 6),
        (_tiff("<", 7), 7),
        (_tiff(">", 5, big=True), 5),
        (_tiff("<", 6, big=True), 6),
        (_tiff("<", None), None),
        (b"II*\x00\xff\xff\xff\x7f", None),  # IFD offset past the end
        (b"II*\x00", None),
    ],
    ids=[
        "le none",
        "be ojpeg",
        "le jpeg",
        "bigtiff be lzw",
        "bigtiff le ojpeg",
        "no tag",
        "bad",
        "short",
    ],
)
def test_tiff_compression(data, compression):
    assert tiff_compression(lambda offset, size: data[offset : offset + size]) == compression


def test_sniff_and_params_import_no_decoder():
    """The type and parameter checks are pure: the worker may run them before any
    decoder is loaded (STYLE habit 1)."""
    code = (
        "import json, sys; import pipelines.sniff, pipelines.image_params;"
        " print(json.dumps(sorted(sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    loaded = {name.split(".")[0] for name in json.loads(result.stdout)}
    assert not loaded & {"pyvips", "PIL", "pillow_heif", "cffi", "hypermedia"}


def test_the_image_pipeline_imports_nothing_from_the_platform():
    """Pipelines stand alone: no ``hypermedia`` or ``autoscaler`` (DESIGN, arrows)."""
    code = "import json, sys; import pipelines.images; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    loaded = {name.split(".")[0] for name in json.loads(result.stdout)}
    assert "pipelines" in loaded
    # The decoders load on first use (a plain JPEG thumbnail never loads libvips).
    assert not loaded & {"hypermedia", "autoscaler", "PIL", "pillow_heif", "pyvips"}
