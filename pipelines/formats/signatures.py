"""What a file is, from its first bytes: explicit signatures, never the name.

:func:`detect` answers a :class:`Signature`: a coarse ``kind`` (what profiles accept:
``image``, ``pdf``, ``video`` ...), a ``mime`` type, a ``label`` for people and a
fine-grained ``format`` that tells :mod:`hypermedia.sandbox.inspect` which reader looks
further (a ZIP may turn out to be a DOCX, an ISO media file an M4A or a HEIC).

Images are recognised by :mod:`pipelines.sniff`, the sniffer the image pipeline itself
uses, so that ingest and the worker can never disagree about what an image is. Text
formats are told apart by their first element, not by a substring anywhere in the head
(an HTML page with an inline ``<svg>`` is HTML).
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

from pipelines import sniff

HEAD_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Signature:
    kind: str
    mime: str
    label: str
    format: str


EMPTY = Signature("empty", "application/x-empty", "empty file", "empty")
UNKNOWN = Signature("unknown", "application/octet-stream", "unrecognised content", "unknown")

# pipelines.sniff kind -> (mime, label). Every image format the sniffer names, supported
# by a pipeline or not: a profile accepts the mime types it can process.
IMAGE_MIMES: dict[str, str] = {
    "jpeg": "image/jpeg",
    "png": "image/png",
    "gif": "image/gif",
    "webp": "image/webp",
    "tiff": "image/tiff",
    "avif": "image/avif",
    "avifs": "image/avif",
    "heic": "image/heic",
    "heif": "image/heif",
    "bmp": "image/bmp",
    "ico": "image/vnd.microsoft.icon",
    "jxl": "image/jxl",
    "jp2": "image/jp2",
    "psd": "image/vnd.adobe.photoshop",
    "mng": "image/x-mng",
    "jng": "image/x-jng",
    "pnm": "image/x-portable-anymap",
    "exr": "image/x-exr",
    "radiance": "image/vnd.radiance",
    "fits": "image/fits",
    "vips": "image/x-vips",
    "dds": "image/vnd-ms.dds",
    "qoi": "image/x-qoi",
    "sgi": "image/x-sgi",
    "xcf": "image/x-xcf",
    "cur": "image/x-win-bitmap",
    "wmf": "image/wmf",
    "emf": "image/emf",
    "camera-raw": "image/x-canon-raw",
}

_ASF = bytes.fromhex("3026b2758e66cf11a6d900aa0062ce6c")
_QUICKTIME_BOXES = {b"moov", b"mdat", b"wide", b"free", b"skip", b"pnot"}


def detect(head: bytes) -> Signature:
    """The type of a file whose first :data:`HEAD_BYTES` (or all) bytes are ``head``."""
    if not head:
        return EMPTY
    found = _binary(head)
    if found is not None:
        return found
    return _text(head)


def _binary(head: bytes) -> Signature | None:
    # PDF readers accept junk before the header (within the first KiB); we do not: a
    # "PDF" that starts as something else is refused as that something else.
    if head.startswith(b"%PDF-"):
        return Signature("pdf", "application/pdf", "PDF document", "pdf")
    if head.startswith(b"%!") or head.startswith(b"\xc5\xd0\xd3\xc6"):
        label = "EPS document" if b"EPSF" in head[:64] or head[0] == 0xC5 else "PostScript"
        return Signature("postscript", "application/postscript", label, "postscript")
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06", b"PK\x07\x08")):
        return Signature("zip", "application/zip", "ZIP archive", "zip")
    if head.startswith(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"):
        return Signature("ole", "application/x-ole-storage", "OLE2 compound file", "ole")
    if head.startswith(b"{\\rtf"):
        return Signature("rtf", "text/rtf", "RTF document", "rtf")
    media = _media(head)
    if media is not None:
        return media
    sniffed = sniff.sniff(head)
    if sniffed.kind in IMAGE_MIMES:
        return Signature("image", IMAGE_MIMES[sniffed.kind], sniffed.label, sniffed.kind)
    if head.startswith(b"\x1f\x8b"):
        return _gzip(head)
    archives = {
        b"Rar!\x1a\x07": ("application/vnd.rar", "RAR archive"),
        b"7z\xbc\xaf\x27\x1c": ("application/x-7z-compressed", "7-Zip archive"),
        b"BZh": ("application/x-bzip2", "bzip2 data"),
        b"\xfd7zXZ\x00": ("application/x-xz", "xz data"),
        b"\x28\xb5\x2f\xfd": ("application/zstd", "zstd data"),
    }
    for magic, (mime, label) in archives.items():
        if head.startswith(magic):
            return Signature("archive", mime, label, "archive")
    if head[257:262] == b"ustar":
        return Signature("archive", "application/x-tar", "tar archive", "archive")
    return _weak_media(head)


def _media(head: bytes) -> Signature | None:
    """Audio/video containers; which of the two is settled by :mod:`.media`."""
    if head[4:8] == b"ftyp":
        sniffed = sniff.sniff(head)
        if sniffed.kind in IMAGE_MIMES:  # AVIF, HEIC, JPEG XL in ISO media boxes
            return Signature("image", IMAGE_MIMES[sniffed.kind], sniffed.label, sniffed.kind)
        return Signature("video", "video/mp4", "MP4/QuickTime media", "isobmff")
    if head[4:8] in _QUICKTIME_BOXES and len(head) >= 8:
        return Signature("video", "video/quicktime", "QuickTime movie", "isobmff")
    if head.startswith(b"\x1a\x45\xdf\xa3"):
        return Signature("video", "video/x-matroska", "Matroska/WebM media", "ebml")
    if head.startswith(b"RIFF") and head[8:12] == b"AVI ":
        return Signature("video", "video/x-msvideo", "AVI video", "avi")
    if head.startswith((b"RIFF", b"RF64")) and head[8:12] == b"WAVE":
        return Signature("audio", "audio/wav", "WAV audio", "wav")
    if head.startswith(b"FORM") and head[8:12] in (b"AIFF", b"AIFC"):
        return Signature("audio", "audio/aiff", "AIFF audio", "aiff")
    if head.startswith(b"fLaC"):
        return Signature("audio", "audio/flac", "FLAC audio", "flac")
    if head.startswith(b"OggS"):
        return Signature("audio", "audio/ogg", "Ogg media", "ogg")
    if head.startswith(b"ID3"):
        return _after_id3(head)
    if head.startswith(b"MThd"):
        return Signature("audio", "audio/midi", "MIDI file (notes, no audio samples)", "midi")
    if head.startswith(b"FLV\x01"):
        return Signature("video", "video/x-flv", "Flash video", "flv")
    if head.startswith(_ASF):
        return Signature("video", "video/x-ms-asf", "Windows Media (ASF)", "asf")
    if head.startswith(b".snd"):
        return Signature("audio", "audio/basic", "Sun/NeXT audio", "au")
    if head.startswith(b"wvpk"):
        return Signature("audio", "audio/x-wavpack", "WavPack audio", "wavpack")
    if head.startswith(b"\x00\x00\x01\xba"):
        return Signature("video", "video/mpeg", "MPEG program stream", "mpeg-ps")
    if len(head) > 376 and head[0] == head[188] == head[376] == 0x47:
        return Signature("video", "video/mp2t", "MPEG transport stream", "mpeg-ts")
    return None


_MP3 = Signature("audio", "audio/mpeg", "MP3 audio", "mp3")
_AAC = Signature("audio", "audio/aac", "AAC audio (ADTS)", "aac")


def _after_id3(head: bytes) -> Signature:
    """An ID3v2 tag is MP3's, but FLAC and raw AAC are sometimes tagged too."""
    if len(head) >= 10:
        size = 0
        for byte in head[6:10]:
            size = (size << 7) | (byte & 0x7F)
        rest = head[10 + size :]
        if rest.startswith(b"fLaC"):
            return Signature("audio", "audio/flac", "FLAC audio", "flac")
        if _audio_frames(rest) is _AAC:
            return _AAC
    return _MP3


def _audio_frames(head: bytes) -> Signature | None:
    """Raw MPEG audio (MP3 frames) or ADTS AAC, by the frame sync of the first frame."""
    if len(head) < 4 or head[0] != 0xFF or head[1] & 0xE0 != 0xE0:
        return None
    layer = (head[1] >> 1) & 0x3
    if layer == 0:
        return _AAC if head[1] & 0xF6 == 0xF0 else None
    bitrate_index, rate_index = head[2] >> 4, (head[2] >> 2) & 0x3
    if (head[1] >> 3) & 0x3 == 1 or bitrate_index == 0xF or rate_index == 0x3:
        return None  # reserved MPEG version, bad bitrate or bad sample rate
    return _MP3


def _weak_media(head: bytes) -> Signature | None:
    """Media with short signatures, tried after every other binary format: FLIC, and
    MP3/AAC without a tag (a frame sync). AC-3 (two bytes) is left to libmagic."""
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return None  # a UTF-16 byte order mark (FF FE would pass for an MPEG frame sync)
    if len(head) >= 6 and head[4:6] in (b"\x11\xaf", b"\x12\xaf"):
        return Signature("video", "video/x-flic", "Autodesk FLIC animation", "flic")
    return _audio_frames(head)


def _gzip(head: bytes) -> Signature:
    """gzip: an SVGZ image when what it inflates to (a bounded prefix) is SVG."""
    try:
        inflated = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, 16 * 1024)
    except zlib.error:
        inflated = b""
    if inflated and _text(inflated).format == "svg":
        return Signature("image", "image/svg+xml", "SVGZ image (gzip-compressed SVG)", "svgz")
    return Signature("archive", "application/gzip", "gzip data", "archive")


# -- text ---------------------------------------------------------------------------------

_PROLOG_NOISE = re.compile(rb"\s+|<\?.*?\?>|<!--.*?-->|<!DOCTYPE[^>\[]*(\[.*?\])?\s*>", re.S | re.I)
_FIRST_ELEMENT = re.compile(rb"<([A-Za-z_][\w:.-]*)")
_ODF_FLAT_MIME = re.compile(
    rb'office:mimetype\s*=\s*"application/vnd\.oasis\.opendocument\.([a-z-]+)"'
)
FLAT_ODF_KINDS = {
    "text": "odf-text",
    "text-template": "odf-text",
    "text-master": "odf-text",
    "spreadsheet": "odf-sheet",
    "spreadsheet-template": "odf-sheet",
    "presentation": "odf-slides",
    "presentation-template": "odf-slides",
    "graphics": "odf-drawing",
    "graphics-template": "odf-drawing",
}


def root_element(text: bytes) -> bytes | None:
    """The name of the first element of an XML-ish text (after declarations, comments
    and a DOCTYPE), ``None`` if there is none in ``text``."""
    position = 0
    while True:
        noise = _PROLOG_NOISE.match(text, position)
        if noise is None or noise.end() == position:
            break
        position = noise.end()
    element = _FIRST_ELEMENT.match(text, position)
    return element.group(1) if element else None


def _text(head: bytes) -> Signature:
    body = head.removeprefix(b"\xef\xbb\xbf")
    for bom, codec in ((b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be")):
        if body.startswith(bom):
            body = body[2:].decode(codec, "ignore").encode()
    stripped = body.lstrip()
    if stripped.startswith(b"#EXTM3U"):
        return Signature(
            "playlist", "application/vnd.apple.mpegurl", "HLS playlist (M3U8)", "playlist"
        )
    if stripped.startswith(b"ffconcat version"):
        return Signature("ffconcat", "text/x-ffconcat", "FFmpeg concat script", "ffconcat")
    if stripped.startswith(b"<"):
        root = root_element(stripped)
        if root is not None:
            name = root.lower()
            if name == b"svg" or name.endswith(b":svg"):
                return Signature("image", "image/svg+xml", "SVG image", "svg")
            if name == b"html":
                return Signature("html", "text/html", "HTML document", "html")
            if name == b"mpd":
                return Signature("playlist", "application/dash+xml", "DASH manifest", "playlist")
            if name == b"office:document":
                flat = _ODF_FLAT_MIME.search(stripped)
                kind = FLAT_ODF_KINDS.get(flat.group(1).decode(), "odf") if flat else "odf"
                subtype = flat.group(1).decode() if flat else "text"
                return Signature(
                    kind,
                    f"application/vnd.oasis.opendocument.{subtype}-flat-xml",
                    "flat OpenDocument (XML)",
                    "flat-odf",
                )
            return Signature("xml", "application/xml", "XML document", "xml")
        if stripped[:15].lower().startswith(b"<!doctype html"):
            return Signature("html", "text/html", "HTML document", "html")
    if _is_text(head):
        return Signature("text", "text/plain", "plain text", "text")
    return UNKNOWN


def _is_text(head: bytes) -> bool:
    try:
        decoded = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A multi-byte character cut by the end of the head is still text.
        if exc.start < len(head) - 4:
            return False
        decoded = head[: exc.start].decode("utf-8")
    return all(ch.isprintable() or ch in "\t\r\n\f" for ch in decoded)
