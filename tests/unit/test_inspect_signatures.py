"""hypermedia.sandbox.inspect, step 1: what a file is and what its headers declare.

Tables of synthetic files (a few hundred bytes each, built here) -> kind, mime and facts.
The real corpus runs through the same code in tests/integration/test_input_validation.py.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import struct
import zlib

import pytest

from hypermedia.sandbox.inspect import Inspection, inspect_source, refusal
from pipelines.formats import signatures
from pipelines.formats.source import BytesSource, CallbackSource, SourceFile, buffered


def inspect(data: bytes) -> Inspection:
    return inspect_source(BytesSource(data))


# -- builders ---------------------------------------------------------------------------------


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png(width: int, height: int, frames: int | None = None) -> bytes:
    data = b"\x89PNG\r\n\x1a\n" + png_chunk(
        b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    )
    if frames is not None:
        data += png_chunk(b"acTL", struct.pack(">II", frames, 0))
    return data + png_chunk(b"IDAT", b"\x00" * 8) + png_chunk(b"IEND", b"")


def jpeg(width: int, height: int, app_bytes: int = 100) -> bytes:
    app1 = b"\xff\xe1" + struct.pack(">H", app_bytes + 2) + b"E" * app_bytes
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    return b"\xff\xd8" + app1 + sof + b"\xff\xda\x00\x02" + b"\x00" * 16 + b"\xff\xd9"


def gif(width: int, height: int, frames: list[tuple[int, int, int, int]]) -> bytes:
    data = b"GIF89a" + struct.pack("<HHBBB", width, height, 0x80, 0, 0) + b"\x00" * 6
    for left, top, w, h in frames:
        data += b"!\xf9\x04\x00\x00\x00\x00\x00"  # graphic control extension
        data += b"," + struct.pack("<HHHHB", left, top, w, h, 0) + b"\x02\x02\x44\x01\x00"
    return data + b";"


def riff(form: bytes, chunks: list[tuple[bytes, bytes]]) -> bytes:
    body = form
    for kind, data in chunks:
        body += kind + struct.pack("<I", len(data)) + data + (b"\x00" if len(data) % 2 else b"")
    return b"RIFF" + struct.pack("<I", len(body)) + body


def box(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", 8 + len(body)) + kind + body


def ftyp(major: bytes, *compatible: bytes) -> bytes:
    return box(b"ftyp", major + b"\x00\x00\x00\x00" + b"".join(compatible))


def mp4(
    brand: bytes, handlers: list[bytes], seconds: int = 90, sample_entry: bytes = b"avc1"
) -> bytes:
    mvhd = box(b"mvhd", b"\x00" * 12 + struct.pack(">II", 1000, seconds * 1000) + b"\x00" * 80)
    traks = b""
    for handler in handlers:
        hdlr = box(b"hdlr", b"\x00" * 8 + handler + b"\x00" * 12)
        stsd = box(b"stsd", b"\x00" * 4 + struct.pack(">I", 1) + box(sample_entry, b"\x00" * 16))
        minf = box(b"minf", box(b"stbl", stsd))
        traks += box(b"trak", box(b"mdia", hdlr + minf))
    return ftyp(brand, b"isom") + box(b"moov", mvhd + traks) + box(b"mdat", b"\x00" * 32)


def heif(brand: bytes, width: int, height: int) -> bytes:
    ispe = box(b"ispe", b"\x00\x00\x00\x00" + struct.pack(">II", width, height))
    return ftyp(brand, b"mif1") + box(b"meta", b"\x00" * 4 + box(b"iprp", box(b"ipco", ispe)))


def tiff(width: int, height: int, pages: int) -> bytes:
    data = bytearray(b"II*\x00" + struct.pack("<I", 8))
    for page in range(pages):
        entries = [(256, 4, width), (257, 4, height)]
        data += struct.pack("<H", len(entries))
        for tag, kind, value in entries:
            data += struct.pack("<HHII", tag, kind, 1, value)
        following = len(data) + 4 if page < pages - 1 else 0
        data += struct.pack("<I", following)
    return bytes(data)


def ebml(doc_type: bytes, track_types: list[int], duration_ms: float) -> bytes:
    def _size(body: bytes) -> bytes:
        return (0x01 << 56 | len(body)).to_bytes(8, "big")

    def el(element_id: int, body: bytes) -> bytes:
        raw_id = element_id.to_bytes((element_id.bit_length() + 7) // 8, "big")
        return raw_id + _size(body) + body

    header = el(0x1A45DFA3, el(0x4282, doc_type))
    info = el(
        0x1549A966,
        el(0x2AD7B1, (1_000_000).to_bytes(3, "big")) + el(0x4489, struct.pack(">d", duration_ms)),
    )
    tracks = el(0x1654AE6B, b"".join(el(0xAE, el(0x83, bytes([t]))) for t in track_types))
    return header + el(0x18538067, info + tracks + el(0x1F43B675, b"\x00" * 8))


# -- signatures ---------------------------------------------------------------------------------

SVG = b'<?xml version="1.0"?>\n<!-- drawn by hand -->\n<svg xmlns="http://www.w3.org/2000/svg"/>'
CASES: list[tuple[str, bytes, str, str]] = [
    ("png", png(10, 10), "image", "image/png"),
    ("jpeg", jpeg(10, 10), "image", "image/jpeg"),
    ("gif87a", b"GIF87a" + b"\x01\x00\x01\x00\x00\x00\x00;", "image", "image/gif"),
    ("webp", riff(b"WEBP", [(b"VP8L", b"\x2f" + bytes(8))]), "image", "image/webp"),
    ("tiff le", tiff(4, 4, 1), "image", "image/tiff"),
    ("tiff be", b"MM\x00*\x00\x00\x00\x08" + bytes(16), "image", "image/tiff"),
    (
        "bmp",
        b"BM" + struct.pack("<IHHI", 70, 0, 0, 54) + struct.pack("<Iii", 40, 3, -2) + bytes(30),
        "image",
        "image/bmp",
    ),
    ("heic", heif(b"heic", 64, 64), "image", "image/heic"),
    ("heif mif1+heic", ftyp(b"mif1", b"heic") + bytes(16), "image", "image/heic"),
    ("avif", heif(b"avif", 64, 64), "image", "image/avif"),
    ("avif sequence", ftyp(b"avis", b"avif") + bytes(16), "image", "image/avif"),
    ("jxl", b"\xff\x0a" + bytes(30), "image", "image/jxl"),
    ("svg", SVG, "image", "image/svg+xml"),
    ("svgz", gzip.compress(SVG), "image", "image/svg+xml"),
    ("gzip of text", gzip.compress(b"hello"), "archive", "application/gzip"),
    ("pdf", b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n", "pdf", "application/pdf"),
    ("pdf after junk is not a pdf", b"junk\n%PDF-1.4\n", "text", "text/plain"),
    (
        "postscript",
        b"%!PS-Adobe-3.0\n%%BoundingBox: 0 0 10 10\n",
        "postscript",
        "application/postscript",
    ),
    ("eps binary", b"\xc5\xd0\xd3\xc6" + bytes(28), "postscript", "application/postscript"),
    ("rtf", b"{\\rtf1\\ansi hello}", "rtf", "text/rtf"),
    ("mp4 video", mp4(b"isom", [b"vide", b"soun"]), "video", "video/mp4"),
    ("mp4 sound only", mp4(b"isom", [b"soun"]), "audio", "audio/mp4"),
    ("m4a brand, no tracks", ftyp(b"M4A ") + box(b"mdat", b""), "audio", "audio/mp4"),
    ("quicktime brand", mp4(b"qt  ", [b"vide"]), "video", "video/quicktime"),
    ("quicktime without ftyp", box(b"moov", b"") + bytes(8), "video", "video/quicktime"),
    ("webm", ebml(b"webm", [1, 2], 1500.0), "video", "video/webm"),
    ("matroska audio only", ebml(b"matroska", [2], 1500.0), "audio", "audio/x-matroska"),
    ("avi", riff(b"AVI ", [(b"LIST", b"hdrl")]), "video", "video/x-msvideo"),
    ("wav", riff(b"WAVE", [(b"fmt ", bytes(16)), (b"data", b"")]), "audio", "audio/wav"),
    ("flac", b"fLaC" + bytes(38), "audio", "audio/flac"),
    (
        "ogg vorbis",
        b"OggS" + bytes(22) + b"\x01\x1e" + b"\x01vorbis" + bytes(22),
        "audio",
        "audio/ogg",
    ),
    (
        "ogg theora",
        b"OggS" + bytes(22) + b"\x01\x2a" + b"\x80theora" + bytes(35),
        "video",
        "video/ogg",
    ),
    ("mp3 id3", b"ID3\x04\x00\x00\x00\x00\x00\x00" + bytes(20), "audio", "audio/mpeg"),
    ("midi", b"MThd\x00\x00\x00\x06\x00\x01\x00\x02\x00\xc0", "audio", "audio/midi"),
    ("flv", b"FLV\x01\x05\x00\x00\x00\x09" + bytes(8), "video", "video/x-flv"),
    (
        "hls playlist",
        b"#EXTM3U\n#EXT-X-VERSION:3\nhttp://10.0.0.1/a.ts\n",
        "playlist",
        "application/vnd.apple.mpegurl",
    ),
    (
        "dash manifest",
        b'<?xml version="1.0"?><MPD xmlns="urn:mpeg:dash:schema:mpd:2011"/>',
        "playlist",
        "application/dash+xml",
    ),
    ("ffconcat", b"ffconcat version 1.0\nfile /etc/passwd\n", "ffconcat", "text/x-ffconcat"),
    ("html", b"<!DOCTYPE html><html><body><svg/></body></html>", "html", "text/html"),
    ("html root", b"<html><svg></svg></html>", "html", "text/html"),
    ("xml", b'<?xml version="1.0"?><note>hi</note>', "xml", "application/xml"),
    (
        "flat odt",
        b'<?xml version="1.0"?><office:document'
        b' office:mimetype="application/vnd.oasis.opendocument.text"/>',
        "odf-text",
        "application/vnd.oasis.opendocument.text-flat-xml",
    ),
    ("text", "héllo wörld\n".encode(), "text", "text/plain"),
    ("utf-16 text", "Grüße aus Köln\n".encode("utf-16"), "text", "text/plain"),
    ("mp3 frames", bytes.fromhex("fffb9064") + bytes(400), "audio", "audio/mpeg"),
    ("empty", b"", "empty", "application/x-empty"),
    ("rar", b"Rar!\x1a\x07\x00" + bytes(20), "archive", "application/vnd.rar"),
]


@pytest.mark.parametrize(("name", "data", "kind", "mime"), CASES, ids=[c[0] for c in CASES])
def test_type_by_content(name, data, kind, mime):
    found = inspect(data)
    assert (found.kind, found.mime) == (kind, mime), found


def test_the_name_plays_no_part():
    # inspect_source has no name to look at: the same bytes are the same type.
    assert inspect(png(1, 1)).mime == "image/png"


def test_a_webp_whose_bytes_look_like_svg_is_webp():
    data = riff(b"WEBP", [(b"VP8L", b"\x2f" + bytes(8)), (b"XMP ", b"<svg>" * 10)])
    assert inspect(data).mime == "image/webp"


def test_libmagic_names_what_the_signatures_do_not():
    # AC-3 has no signature of ours; libmagic knows it.
    ac3 = b"\x0b\x77" + bytes.fromhex("3d1d1c40") + bytes(1024)
    found = inspect(ac3)
    assert (found.kind, found.mime) == ("audio", "audio/vnd.dolby.dd-raw")
    assert found.details["magic"] == found.mime and "AC-3" in found.label


def test_root_element_skips_declarations_comments_and_doctype():
    text = b'<?xml version="1.0"?>\n<!-- c -->\n<!DOCTYPE x [<!ENTITY a "b">]>\n<svg/>'
    assert signatures.root_element(text) == b"svg"
    assert signatures.root_element(b"just text") is None


# -- headers: dimensions, frames, pages, duration -----------------------------------------------

GEOMETRY = [
    ("png", png(50000, 50000), {"width": 50000, "height": 50000}),
    ("apng", png(100, 80, frames=12), {"width": 100, "height": 80, "frames": 12}),
    (
        "jpeg after an APP segment",
        jpeg(64250, 64250, app_bytes=5000),
        {"width": 64250, "height": 64250},
    ),
    (
        "gif frames and canvas",
        gif(32, 32, [(0, 0, 32, 32), (0, 0, 16, 16)]),
        {"width": 32, "height": 32, "frames": 2},
    ),
    # Pillow-style canvas growth: a frame beyond the logical screen enlarges it.
    (
        "gif frame outside the screen",
        gif(32, 32, [(0, 65280, 65535, 1321)]),
        {"width": 65535, "height": 66601, "frames": 1},
    ),
    ("gif without frames", gif(1, 1, []), {"width": 1, "height": 1, "frames": 0}),
    (
        "webp vp8x animated",
        riff(
            b"WEBP",
            [
                (
                    b"VP8X",
                    b"\x02\x00\x00\x00" + (999).to_bytes(3, "little") + (499).to_bytes(3, "little"),
                ),
                (b"ANIM", bytes(6)),
                (b"ANMF", bytes(16)),
                (b"ANMF", bytes(16)),
            ],
        ),
        {"width": 1000, "height": 500, "frames": 2},
    ),
    (
        "webp vp8l",
        riff(
            b"WEBP", [(b"VP8L", b"\x2f" + ((299) | (199 << 14)).to_bytes(4, "little") + bytes(4))]
        ),
        {"width": 300, "height": 200},
    ),
    (
        "webp vp8",
        riff(
            b"WEBP",
            [(b"VP8 ", bytes(3) + b"\x9d\x01\x2a" + struct.pack("<HH", 640, 480) + bytes(4))],
        ),
        {"width": 640, "height": 480},
    ),
    ("tiff pages", tiff(2000, 1000, 3), {"width": 2000, "height": 1000, "pages": 3}),
    (
        "bmp top-down",
        b"BM"
        + struct.pack("<IHHI", 70, 0, 0, 54)
        + struct.pack("<Iii", 40, 3000000, -2000000)
        + bytes(30),
        {"width": 3000000, "height": 2000000},
    ),
    ("heif ispe", heif(b"avif", 17000, 17000), {"width": 17000, "height": 17000}),
]


@pytest.mark.parametrize(("name", "data", "expected"), GEOMETRY, ids=[g[0] for g in GEOMETRY])
def test_image_headers(name, data, expected):
    details = inspect(data).details
    assert {k: details[k] for k in expected if k in details} == expected


def test_a_zero_dimension_is_not_reported():
    details = inspect(png(0, 10)).details
    assert "width" not in details and "height" not in details


# Files that end inside their image header, before it gives a width and height: no
# decoder can make anything of them. An 8-byte PNG signature was accepted at upload and
# for a thumbnail at submit, queued, and failed in the worker.
HEADER_CUT = [
    ("png signature", b"\x89PNG\r\n\x1a\n"),
    ("png cut inside IHDR", png(10, 10)[:20]),
    ("jpeg SOI and the start of APP0", b"\xff\xd8\xff\xe0\x00\x10JFIF\x00"),
    ("jpeg cut before its frame header", jpeg(10, 10, app_bytes=100)[:60]),
    ("gif signature", b"GIF89a\x10\x00"),
    ("webp riff header", riff(b"WEBP", [(b"VP8L", b"\x2f" + bytes(8))])[:16]),
    ("tiff header", b"II*\x00\x08\x00\x00\x00"),
    ("heif brands", ftyp(b"heic", b"mif1")),
]


@pytest.mark.parametrize(("name", "data"), HEADER_CUT, ids=[c[0] for c in HEADER_CUT])
def test_an_image_that_ends_inside_its_header_is_refused_at_upload(name, data):
    found = inspect(data)
    assert found.kind == "image"
    problem = refusal(found)
    assert problem is not None and problem.code == "invalid_input", found
    assert "width and height" in problem.message and f"{len(data)} bytes" in problem.message


# A file cut after its header is the decoders' to judge (tolerate:truncated in the
# corpus): the header says what it is, and its pixels are counted against the limits.
HEADER_WHOLE = [
    ("png cut after IHDR", png(10, 10)[:33], 10),
    ("jpeg cut after its frame header", jpeg(10, 10, app_bytes=100)[: 2 + 104 + 13], 10),
    ("gif cut after its screen descriptor", gif(10, 10, [(0, 0, 10, 10)])[:13], 10),
]


@pytest.mark.parametrize(("name", "data", "width"), HEADER_WHOLE, ids=[c[0] for c in HEADER_WHOLE])
def test_an_image_cut_after_its_header_is_left_to_the_decoder(name, data, width):
    found = inspect(data)
    assert found.details["width"] == width and "corrupt" not in found.details
    assert refusal(found) is None


def test_tiff_page_loops_end():
    data = bytearray(tiff(10, 10, 1))
    data[-4:] = struct.pack("<I", 8)  # the last IFD points back at the first
    assert inspect(bytes(data)).details["pages"] == 1


MEDIA = [
    ("mp4 duration", mp4(b"isom", [b"vide"], seconds=90), 90.0),
    ("matroska duration", ebml(b"matroska", [1, 2], 1500.0), 1.5),
    (
        "wav duration",
        riff(
            b"WAVE",
            [
                (b"fmt ", struct.pack("<HHIIHH", 1, 2, 44100, 176400, 4, 16)),
                (b"data", bytes(176400 * 2)),
            ],
        ),
        2.0,
    ),
    (
        "flac duration",
        b"fLaC"
        + b"\x00\x00\x00\x22"
        + bytes(10)
        + ((44100 << 44) | (44100 * 3)).to_bytes(8, "big")
        + bytes(16),
        3.0,
    ),
    (
        "avi duration",
        riff(
            b"AVI ",
            [
                (
                    b"LIST",
                    b"hdrl"
                    + b"avih"
                    + struct.pack("<I", 56)
                    + struct.pack("<IIIII", 40000, 0, 0, 0, 250)
                    + bytes(36),
                )
            ],
        ),
        10.0,
    ),
]


@pytest.mark.parametrize(("name", "data", "seconds"), MEDIA, ids=[m[0] for m in MEDIA])
def test_media_durations(name, data, seconds):
    assert inspect(data).details["duration_seconds"] == pytest.approx(seconds)


@pytest.mark.parametrize("duration_ms", [float("nan"), float("inf"), -1500.0, 1e308])
def test_a_stated_duration_that_is_no_number_of_seconds_is_not_reported(duration_ms):
    """A Matroska Duration of NaN was reported as such and passed every duration limit;
    an infinite one made the facts no JSON (PostgreSQL refused the upload, a
    duration_limit naming it was a 500)."""
    details = inspect(ebml(b"webm", [1, 2], duration_ms)).details
    assert "duration_seconds" not in details
    json.dumps(details, allow_nan=False)


@pytest.mark.parametrize(
    ("name", "data", "kind"),
    [
        # The Tracks element's id, then the end of the file: no size.
        ("matroska", ebml(b"matroska", [2], 1500.0)[:90], "video"),
        ("flac", b"fLaC", "audio"),
    ],
    ids=["matroska", "flac"],
)
def test_a_media_header_cut_short_is_read_as_far_as_it_goes(name, data, kind, caplog):
    """A header cut off inside an element raised IndexError out of the reader: every
    such upload logged an error with its traceback ("inspecting a ... failed"), as a
    reader's bug would be."""
    with caplog.at_level(logging.ERROR):
        assert inspect(data).kind == kind
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


@pytest.mark.parametrize("entry", [b"drms", b"encv", b"enca"])
def test_drm_protected_mp4_is_encrypted(entry):
    details = inspect(mp4(b"M4A ", [b"soun"], sample_entry=entry)).details
    assert "DRM" in details["encrypted"]


def test_a_zip_appended_to_an_image_is_a_polyglot():
    archive = io.BytesIO()
    import zipfile

    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("word/document.xml", "<w/>")
    assert inspect(jpeg(10, 10) + archive.getvalue()).details["appended_archive"] is True
    assert "appended_archive" not in inspect(jpeg(10, 10)).details


# -- sources ---------------------------------------------------------------------------------------


def test_sources_read_the_same_bytes():
    data = bytes(range(256)) * 10
    calls: list[tuple[int, int]] = []

    def ranged(offset: int, length: int) -> bytes:
        calls.append((offset, length))
        return data[offset : offset + length]

    remote = CallbackSource(len(data), ranged)
    assert remote.read_at(2550, 100) == data[2550:] and calls[-1] == (2550, 10)
    assert remote.read_at(5000, 10) == b"" and remote.read_at(-1, 10) == b""
    file = SourceFile(BytesSource(data))
    file.seek(-10, io.SEEK_END)
    assert file.read() == data[-10:] and file.bytes_read == 10
    reader = buffered(remote, buffer_size=1024)
    reader.seek(100)
    assert reader.read(5) == data[100:105]


def test_inspection_round_trips_as_json():
    import json

    found = inspect(png(3, 4))
    again = Inspection.from_dict(json.loads(json.dumps(found.to_dict())))
    assert again == found and again.label == "PNG image"
