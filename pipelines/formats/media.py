"""Audio or video, and how long, from container headers.

:func:`analyze` refines what :mod:`.signatures` found from the first bytes: an MP4 with
only sound tracks is audio (``audio/mp4``), an Ogg stream carrying Theora is video, a
Matroska file with no video track is audio, an ASF file without a video stream is WMA.
``duration_seconds`` is read where a header states it cheaply: MP4/QuickTime (``mvhd``),
Matroska/WebM (``Info/Duration``), WAV (data size / byte rate), FLAC (STREAMINFO),
AVI (``avih``). Elsewhere (MP3, Ogg ...) it is left unknown, and the media pipeline
enforces its own limits; so is a stated duration that is no number of seconds (a
Matroska float that is NaN, infinite or negative). DRM-protected MP4 tracks (FairPlay,
Common Encryption sample entries) are reported as ``encrypted``: no key, no transcode.
"""

from __future__ import annotations

import contextlib
import math
import struct
from dataclasses import dataclass, field
from typing import Any

from pipelines.formats.signatures import Signature
from pipelines.formats.source import Source

MAX_BOXES = 10_000
_CONTAINER_BOXES = {b"moov", b"trak", b"mdia", b"minf", b"stbl"}
# Sample entries of protected tracks: FairPlay (drms, drmi, drma) and Common Encryption.
_PROTECTED_ENTRIES = {b"drms", b"drmi", b"drma", b"enca", b"encv", b"enct", b"encs"}
_AUDIO_BRANDS = {b"M4A ", b"M4B ", b"M4P ", b"F4A ", b"F4B "}
# ASF stream type GUIDs (little-endian layout as stored).
_ASF_VIDEO = bytes.fromhex("c0ef19bc4d5bcf11a8fd00805f5c442b")

# EBML element ids (Matroska/WebM).
_SEGMENT, _INFO, _TRACKS, _TRACK_ENTRY, _TRACK_TYPE = 0x18538067, 0x1549A966, 0x1654AE6B, 0xAE, 0x83
_TIMECODE_SCALE, _DURATION, _CLUSTER = 0x2AD7B1, 0x4489, 0x1F43B675


@dataclass
class Media:
    kind: str
    mime: str
    label: str
    details: dict[str, Any] = field(default_factory=dict)


def analyze(source: Source, found: Signature) -> Media:
    media = Media(found.kind, found.mime, found.label)
    reader = _READERS.get(found.format)
    if reader is not None:
        # What could be read stays; the demuxer decides about the rest. (IndexError:
        # a header cut short, read byte by byte.)
        with contextlib.suppress(struct.error, ValueError, IndexError, OSError, OverflowError):
            reader(source, media)
    return media


def _stated(media: Media, seconds: float) -> None:
    """Record a header's duration, if it is one: a NaN passed every duration limit (each
    comparison is false), and a NaN or an infinity is no JSON (PostgreSQL refused the
    upload; an error naming it could not be answered)."""
    if math.isfinite(seconds) and seconds >= 0:
        media.details["duration_seconds"] = round(seconds, 3)


# -- ISO base media (MP4, MOV, M4A, 3GP) ------------------------------------------------------


def _isobmff(source: Source, media: Media) -> None:
    head = source.read_at(0, 64)
    brand = head[8:12] if head[4:8] == b"ftyp" else b""
    if brand == b"qt  " or not brand:
        media.mime, media.label = "video/quicktime", "QuickTime movie"
    handlers: set[bytes] = set()
    _walk_boxes(source, 0, source.size, handlers, media, depth=0)
    media.details["tracks"] = sorted(h.decode("latin-1") for h in handlers)
    if b"vide" in handlers:
        media.kind = "video"
    elif b"soun" in handlers or brand in _AUDIO_BRANDS:
        media.kind, media.mime, media.label = "audio", "audio/mp4", "MP4 audio"


def isobmff_index_cut(source: Source) -> bool:
    """True when an MP4/QuickTime file ends before its index: no whole ``moov`` box, and
    its last top-level box (the ``moov`` itself, or the ``mdat`` before it) runs past
    the end of the file. An upload cut short whose index was at the end: ffprobe finds
    no track in it (or fails on its header), though the file is damaged, not trackless."""
    offset = 0
    for _ in range(MAX_BOXES):
        header = source.read_at(offset, 16)
        if len(header) < 8:
            return False
        size, box = struct.unpack_from(">I4s", header)
        if size == 1:
            if len(header) < 16:
                return False
            size = struct.unpack_from(">Q", header, 8)[0]
        elif size == 0:  # to the end of the file
            return False
        if size < 8:
            return False
        if offset + size > source.size:
            return True
        if box == b"moov":
            return False
        offset += size
    return False


def _walk_boxes(
    source: Source, start: int, end: int, handlers: set[bytes], media: Media, depth: int
) -> None:
    offset = start
    for _ in range(MAX_BOXES):
        if offset + 8 > end or depth > 8:
            return
        header = source.read_at(offset, 16)
        if len(header) < 8:
            return
        size, box = struct.unpack_from(">I4s", header)
        header_length = 8
        if size == 1:
            size, header_length = struct.unpack_from(">Q", header, 8)[0], 16
        elif size == 0:
            size = end - offset
        if size < header_length:
            return
        if box in _CONTAINER_BOXES:
            _walk_boxes(source, offset + header_length, offset + size, handlers, media, depth + 1)
        elif box == b"mvhd":
            _mvhd(source.read_at(offset + header_length, 32), media)
        elif box == b"hdlr":
            handler = source.read_at(offset + header_length + 8, 4)
            if len(handler) == 4:
                handlers.add(handler)
        elif box == b"stsd":
            _stsd(source.read_at(offset + header_length, min(size - header_length, 4096)), media)
        offset += size


def _stsd(body: bytes, media: Media) -> None:
    """Sample descriptions: a protected entry means the track is encrypted (DRM)."""
    count = struct.unpack_from(">I", body, 4)[0] if len(body) >= 8 else 0
    at = 8
    for _ in range(min(count, 64)):
        if at + 8 > len(body):
            return
        size, entry = struct.unpack_from(">I4s", body, at)
        if entry in _PROTECTED_ENTRIES:
            media.details["encrypted"] = f"DRM-protected track ({entry.decode('latin-1')})"
            return
        if size < 8:
            return
        at += size


def _mvhd(body: bytes, media: Media) -> None:
    if body[:1] == b"\x01":
        timescale, duration = struct.unpack_from(">IQ", body, 20)
    else:
        timescale, duration = struct.unpack_from(">II", body, 12)
    if timescale:
        _stated(media, duration / timescale)


# -- Matroska / WebM ----------------------------------------------------------------------------


def _ebml_number(data: bytes, at: int, keep_marker: bool) -> tuple[int, int]:
    """A variable-length EBML integer at ``at``: ``(value, length)``."""
    first = data[at]
    length = 1
    while length <= 8 and not first & (0x80 >> (length - 1)):
        length += 1
    if length > 8 or at + length > len(data):
        raise ValueError("bad EBML number")
    value = first if keep_marker else first & (0xFF >> length)
    for byte in data[at + 1 : at + length]:
        value = (value << 8) | byte
    return value, length


def _ebml(source: Source, media: Media) -> None:
    head = source.read_at(0, 64)
    if b"webm" in head:
        media.mime, media.label = "video/webm", "WebM media"
    data = source.read_at(0, 1024 * 1024)
    at = 0
    elements = _ebml_children(data, 0, len(data))
    for element_id, body_start, body_end in elements:
        if element_id == _SEGMENT:
            at = body_start
            _ebml_segment(data, at, min(body_end, len(data)), media)
            break


def _ebml_children(data: bytes, start: int, end: int) -> list[tuple[int, int, int]]:
    children: list[tuple[int, int, int]] = []
    at = start
    while at < end and len(children) < MAX_BOXES:
        element_id, id_length = _ebml_number(data, at, keep_marker=True)
        size, size_length = _ebml_number(data, at + id_length, keep_marker=False)
        body = at + id_length + size_length
        unknown = size == (1 << (7 * size_length)) - 1  # "unknown size": runs to the end
        body_end = end if unknown else body + size
        children.append((element_id, body, body_end))
        if element_id == _CLUSTER or unknown:
            break  # media data from here on: the headers are behind us
        at = body_end
    return children


def _ebml_segment(data: bytes, start: int, end: int, media: Media) -> None:
    scale, duration, track_types = 1_000_000, None, set()
    for element_id, body, body_end in _ebml_children(data, start, end):
        body_end = min(body_end, len(data))
        if element_id == _INFO:
            for child, cbody, cend in _ebml_children(data, body, body_end):
                value = data[cbody:cend]
                if child == _TIMECODE_SCALE and value:
                    scale = int.from_bytes(value, "big")
                elif child == _DURATION and len(value) in (4, 8):
                    duration = struct.unpack(">f" if len(value) == 4 else ">d", value)[0]
        elif element_id == _TRACKS:
            for child, cbody, cend in _ebml_children(data, body, body_end):
                if child != _TRACK_ENTRY:
                    continue
                for field_id, fbody, fend in _ebml_children(data, cbody, min(cend, len(data))):
                    if field_id == _TRACK_TYPE:
                        track_types.add(int.from_bytes(data[fbody:fend], "big"))
    if duration is not None:
        _stated(media, duration * scale / 1e9)
    if track_types:
        media.details["tracks"] = sorted(track_types)
        if 1 not in track_types and 2 in track_types:
            audio_mime = "audio/webm" if media.mime == "video/webm" else "audio/x-matroska"
            media.kind, media.mime, media.label = "audio", audio_mime, "Matroska/WebM audio"


# -- RIFF (WAV, AVI), FLAC, Ogg, ASF, FLV -------------------------------------------------------


def _riff_chunks(source: Source, start: int, end: int) -> list[tuple[bytes, int, int]]:
    chunks: list[tuple[bytes, int, int]] = []
    offset = start
    while offset + 8 <= end and len(chunks) < MAX_BOXES:
        header = source.read_at(offset, 12)
        kind, size = header[:4], struct.unpack_from("<I", header, 4)[0]
        chunks.append((kind, offset + 8, size))
        if kind == b"LIST" and header[8:12] == b"hdrl":
            chunks.extend(_riff_chunks(source, offset + 12, offset + 8 + size))
        offset += 8 + size + (size & 1)
    return chunks


def _wav(source: Source, media: Media) -> None:
    byte_rate, data_size = 0, None
    for kind, body, size in _riff_chunks(source, 12, source.size):
        if kind == b"fmt ":
            byte_rate = struct.unpack("<I", source.read_at(body + 8, 4))[0]
        elif kind == b"data":
            data_size = min(size, source.size - body)
            break
    if byte_rate and data_size is not None:
        _stated(media, data_size / byte_rate)


def _avi(source: Source, media: Media) -> None:
    for kind, body, _size in _riff_chunks(source, 12, min(source.size, 1024 * 1024)):
        if kind == b"avih":
            micro_per_frame, *_rest = struct.unpack("<I", source.read_at(body, 4))
            total_frames = struct.unpack("<I", source.read_at(body + 16, 4))[0]
            _stated(media, micro_per_frame * total_frames / 1e6)
            return


def _flac(source: Source, media: Media) -> None:
    block = source.read_at(4, 4 + 34)
    if block[0] & 0x7F != 0:  # STREAMINFO comes first
        return
    info = block[4:]
    packed = int.from_bytes(info[10:18], "big")
    sample_rate = packed >> 44
    total_samples = packed & ((1 << 36) - 1)
    if sample_rate:
        _stated(media, total_samples / sample_rate)


def _ogg(source: Source, media: Media) -> None:
    page = source.read_at(0, 512)
    segments = page[26] if len(page) > 26 else 0
    packet = page[27 + segments : 27 + segments + 16]
    if packet.startswith(b"\x80theora"):
        media.kind, media.mime, media.label = "video", "video/ogg", "Ogg video (Theora)"
    elif packet.startswith(b"OpusHead"):
        media.label = "Ogg Opus audio"
    elif packet.startswith(b"\x01vorbis"):
        media.label = "Ogg Vorbis audio"


def _asf(source: Source, media: Media) -> None:
    header = source.read_at(0, 256 * 1024)
    if _ASF_VIDEO not in header:
        media.kind, media.mime, media.label = "audio", "audio/x-ms-wma", "Windows Media audio"


def _flv(source: Source, media: Media) -> None:
    flags = source.read_at(4, 1)
    if flags and not flags[0] & 0x01 and flags[0] & 0x04:
        media.kind, media.mime, media.label = "audio", "audio/x-flv", "Flash audio"


_READERS = {
    "isobmff": _isobmff,
    "ebml": _ebml,
    "wav": _wav,
    "avi": _avi,
    "flac": _flac,
    "ogg": _ogg,
    "asf": _asf,
    "flv": _flv,
}
