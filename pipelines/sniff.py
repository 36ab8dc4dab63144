"""What a file is, from its first bytes: never from its name.

Pure functions of bytes (no I/O, no decoders) so the worker's input checks and the
pipelines can share them. :func:`sniff` names many formats the platform does *not*
process, so that a refusal can say what the file is ("SVG image", "PDF document")
rather than "unknown".

:func:`appended_archive` spots a ZIP archive glued to the end of a file (a JPEG/ZIP
polyglot); :func:`tiff_compression` reads the compression tag of a TIFF's first image.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

# How many leading bytes :func:`sniff` wants (text formats are looked for in all of it).
HEAD_BYTES = 4096


@dataclass(frozen=True, slots=True)
class Detected:
    """A sniffed type: a stable ``kind`` for code, a ``label`` for people."""

    kind: str
    label: str


EMPTY = Detected("empty", "empty file")
UNKNOWN = Detected("unknown", "unrecognised content")

# Fixed signatures at offset 0, longest first where one is a prefix of another.
_SIGNATURES: list[tuple[bytes, Detected]] = [
    (b"\x89PNG\r\n\x1a\n", Detected("png", "PNG image")),
    (b"\x8aMNG\r\n\x1a\n", Detected("mng", "MNG animation")),
    (b"\x8bJNG\r\n\x1a\n", Detected("jng", "JNG image")),
    (b"\xff\xd8\xff", Detected("jpeg", "JPEG image")),
    (b"GIF87a", Detected("gif", "GIF image")),
    (b"GIF89a", Detected("gif", "GIF image")),
    (b"\x00\x00\x00\x0cJXL \r\n\x87\n", Detected("jxl", "JPEG XL image")),
    (b"\xff\x0a", Detected("jxl", "JPEG XL image")),
    (b"\x00\x00\x00\x0cjP  \r\n\x87\n", Detected("jp2", "JPEG 2000 image")),
    (b"\xff\x4f\xff\x51", Detected("jp2", "JPEG 2000 codestream")),
    (b"8BPS", Detected("psd", "Photoshop PSD image")),
    (b"%PDF-", Detected("pdf", "PDF document")),
    (b"%!PS", Detected("postscript", "PostScript/EPS document")),
    (b"\xc5\xd0\xd3\xc6", Detected("postscript", "EPS document (binary header)")),
    (b"\x1f\x8b", Detected("gzip", "gzip-compressed data (SVGZ or other)")),
    (b"v/1\x01", Detected("exr", "OpenEXR image")),
    (b"#?RADIANCE", Detected("radiance", "Radiance HDR image")),
    (b"#?RGBE", Detected("radiance", "Radiance HDR image")),
    (b"SIMPLE  =", Detected("fits", "FITS image")),
    (b"\x08\xf2\xa6\xb6", Detected("vips", "libvips native image (.v)")),
    (b"\xb6\xa6\xf2\x08", Detected("vips", "libvips native image (.v)")),
    (b"DDS ", Detected("dds", "DirectDraw Surface (DDS) texture")),
    (b"qoif", Detected("qoi", "QOI image")),
    (b"\x01\xda", Detected("sgi", "SGI image")),
    (b"gimp xcf", Detected("xcf", "GIMP XCF image")),
    (b"\x00\x00\x02\x00", Detected("cur", "Windows cursor (CUR)")),
    (b"\xd7\xcd\xc6\x9a", Detected("wmf", "Windows metafile (WMF)")),
    (b"PK\x03\x04", Detected("zip", "ZIP archive (or Office/OpenDocument file)")),
    (b"PK\x05\x06", Detected("zip", "ZIP archive (empty)")),
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", Detected("ole", "OLE compound file (legacy Office)")),
    (b"Rar!\x1a\x07", Detected("rar", "RAR archive")),
    (b"7z\xbc\xaf\x27\x1c", Detected("7z", "7-Zip archive")),
    (b"MATLAB 5.0", Detected("matlab", "MATLAB data file")),
    (b"ID3", Detected("audio", "MP3 audio")),
    (b"fLaC", Detected("audio", "FLAC audio")),
    (b"OggS", Detected("audio", "Ogg media")),
    (b"MThd", Detected("audio", "MIDI file")),
    (b"\x1a\x45\xdf\xa3", Detected("video", "Matroska/WebM media")),
]

_TIFF = Detected("tiff", "TIFF image")
_TIFF_MAGIC = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")

# ISO base media (``ftyp``) brands.
_AVIF_BRANDS = {b"avif"}
_AVIF_SEQUENCE_BRANDS = {b"avis"}
_HEIC_BRANDS = {b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis", b"hevm", b"hevs"}
_HEIF_GENERIC_BRANDS = {b"mif1", b"msf1", b"mif2", b"miaf"}
_MEDIA_BRANDS = {
    b"isom", b"iso2", b"iso4", b"iso5", b"iso6", b"mp41", b"mp42", b"avc1", b"M4V ",
    b"M4A ", b"M4B ", b"M4P ", b"qt  ", b"3gp4", b"3gp5", b"3gp6", b"3g2a", b"dash",
    b"f4v ", b"MSNV", b"XAVC", b"mmp4",
}  # fmt: skip

_BMP_HEADER_SIZES = {12, 16, 40, 52, 56, 64, 108, 124}


def sniff(head: bytes) -> Detected:
    """The type of a file whose first :data:`HEAD_BYTES` (or all) bytes are ``head``."""
    if not head:
        return EMPTY
    for signature, detected in _SIGNATURES:
        if head.startswith(signature):
            return detected
    if head[:4] in _TIFF_MAGIC:
        if head[8:10] == b"CR":
            return Detected("camera-raw", "Canon CR2 camera raw")
        return _TIFF
    if head[:4] == b"RIFF" and len(head) >= 12:
        return _riff(head[8:12])
    if head[4:8] == b"ftyp":
        return _isobmff(head)
    bmp_header = struct.unpack_from("<I", head, 14)[0] if len(head) >= 18 else 0
    if head[:2] == b"BM" and bmp_header in _BMP_HEADER_SIZES:
        return Detected("bmp", "BMP image")
    if head[:4] == b"\x00\x00\x01\x00" and len(head) >= 6:
        count = struct.unpack_from("<H", head, 4)[0]
        if count >= 1 and len(head) >= 22 and head[9] == 0:
            return Detected("ico", "Windows icon (ICO)")
    if len(head) >= 44 and head[:4] == b"\x01\x00\x00\x00" and head[40:44] == b" EMF":
        return Detected("emf", "Windows enhanced metafile (EMF)")
    if len(head) >= 3 and head[0:1] == b"P" and head[1:2] in b"1234567" and head[2:3].isspace():
        return Detected("pnm", "Netpbm image (PBM/PGM/PPM/PAM)")
    return _text(head)


def _riff(fourcc: bytes) -> Detected:
    if fourcc == b"WEBP":
        return Detected("webp", "WebP image")
    if fourcc == b"AVI ":
        return Detected("video", "AVI video")
    if fourcc == b"WAVE":
        return Detected("audio", "WAV audio")
    return Detected("riff", f"RIFF container ({_printable(fourcc)})")


def _isobmff(head: bytes) -> Detected:
    box_size = struct.unpack_from(">I", head, 0)[0]
    end = min(box_size, len(head)) if box_size >= 16 else min(len(head), 16)
    major = head[8:12]
    compatible = {head[i : i + 4] for i in range(16, end - 3, 4)}
    brands = {major} | compatible
    if major in _AVIF_SEQUENCE_BRANDS:
        return Detected("avifs", "AVIF image sequence")
    if major in _AVIF_BRANDS:
        return Detected("avif", "AVIF image")
    if major in _HEIC_BRANDS:
        return Detected("heic", "HEIC image")
    if major == b"jxl ":
        return Detected("jxl", "JPEG XL image")
    if major == b"crx ":
        return Detected("camera-raw", "Canon CR3 camera raw")
    if major in _HEIF_GENERIC_BRANDS:
        if brands & _AVIF_BRANDS:
            return Detected("avif", "AVIF image")
        if brands & _AVIF_SEQUENCE_BRANDS:
            return Detected("avifs", "AVIF image sequence")
        if brands & _HEIC_BRANDS:
            return Detected("heic", "HEIC image")
        return Detected("heif", "HEIF image (unknown codec)")
    if major in _MEDIA_BRANDS or major.startswith(b"3g"):
        return Detected("video", "MP4/QuickTime media")
    return Detected("isobmff", f"ISO media file (brand {_printable(major)})")


def _text(head: bytes) -> Detected:
    text = head.removeprefix(b"\xef\xbb\xbf").lstrip().lower()
    if b"<svg" in text:
        return Detected("svg", "SVG image")
    if text.startswith(b"<?xml") or text.startswith(b"<!doctype") or text.startswith(b"<"):
        if b"<html" in text or text.startswith(b"<!doctype html"):
            return Detected("html", "HTML document")
        return Detected("xml", "XML document")
    try:
        decoded = head.decode("utf-8")
    except UnicodeDecodeError:
        return UNKNOWN
    if all(ch.isprintable() or ch in "\t\r\n\f" for ch in decoded):
        return Detected("text", "plain text")
    return UNKNOWN


def _printable(raw: bytes) -> str:
    return "".join(chr(b) if 32 <= b < 127 else "?" for b in raw).strip()


def appended_archive(tail: bytes) -> bool:
    """Whether ``tail`` (the last 64 KiB + 22 bytes of a file, or all of it) ends in a
    ZIP archive's end-of-central-directory record: a ZIP glued to an image.

    The record must end exactly where the file ends (its comment length says where),
    so a chance ``PK\\x05\\x06`` inside compressed image data does not count.
    """
    search_from = len(tail)
    while True:
        at = tail.rfind(b"PK\x05\x06", 0, search_from)
        if at < 0 or len(tail) - at < 22:
            return False
        comment_length = struct.unpack_from("<H", tail, at + 20)[0]
        if at + 22 + comment_length == len(tail):
            return True
        search_from = at


# ``read_at(offset, size)`` -> up to ``size`` bytes from ``offset`` (see tiff_compression).
ReadAt = Callable[[int, int], bytes]

# The largest tail :func:`appended_archive` needs: the record plus a maximal comment.
ARCHIVE_TAIL_BYTES = 22 + 0xFFFF


def tiff_compression(read_at: ReadAt) -> int | None:
    """The Compression tag (259) of the first image of a TIFF, ``None`` if absent or the
    structure is unreadable. ``read_at(offset, size)`` returns up to ``size`` bytes."""
    head = read_at(0, 16)
    if len(head) < 8:
        return None
    order = "<" if head[:2] == b"II" else ">"
    big = head[2:4] in (b"+\x00", b"\x00+")
    try:
        if big:
            ifd = struct.unpack_from(order + "Q", head, 8)[0]
            count_raw = read_at(ifd, 8)
            count = struct.unpack(order + "Q", count_raw)[0]
            entry_size, first = 20, ifd + 8
        else:
            ifd = struct.unpack_from(order + "I", head, 4)[0]
            count = struct.unpack(order + "H", read_at(ifd, 2))[0]
            entry_size, first = 12, ifd + 2
        entries = read_at(first, min(count, 4096) * entry_size)
        for i in range(len(entries) // entry_size):
            tag, field_type = struct.unpack_from(order + "HH", entries, i * entry_size)
            if tag != 259:
                continue
            value_at = i * entry_size + (12 if big else 8)
            if field_type == 3:  # SHORT, left-justified in the value field
                return int(struct.unpack_from(order + "H", entries, value_at)[0])
            if field_type == 4:  # LONG
                return int(struct.unpack_from(order + "I", entries, value_at)[0])
            return None
    except struct.error:
        return None
    return None
