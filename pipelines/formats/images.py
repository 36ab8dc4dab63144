"""Image dimensions and frame counts from headers, before any decoder runs.

:func:`geometry` reads what the header of an image declares: ``width``, ``height``,
``frames`` (animations: GIF, APNG, animated WebP) and ``pages`` (TIFF). A GIF's canvas
grows to hold frames that lie outside its logical screen, as decoders grow it (a 32x32
GIF with a 65535x1321 frame at y=65280 declares 65535x66601).

Values are what the file *claims*; a malformed header gives what could be read, or
nothing. The decoders in the worker check again and refuse what does not decode.

One verdict is taken here: a file that ends before its header gives a width and a
height (an 8-byte PNG signature, a JPEG cut before its frame header, a HEIF with no
``ispe`` in all of its bytes) is ``corrupt``, refused at upload and submit as no
decoder can make anything of it. A file whose header is whole is the decoders' to
judge, however little follows it (a PNG cut in its pixels may still thumbnail).
"""

from __future__ import annotations

import re
import struct
from typing import Any

from pipelines.formats.source import Source, buffered

# How far a frame count walks (GIF blocks, WebP chunks, TIFF pages): past this the
# count so far is a lower bound and ``frames_counted_to`` says where it stopped.
WALK_LIMIT_BYTES = 64 * 1024 * 1024
MAX_TIFF_PAGES = 10_000
MAX_CHUNKS = 1_000_000

_JPEG_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_ISPE = re.compile(rb"ispe\x00\x00\x00\x00(.{4})(.{4})", re.S)


def geometry(source: Source, image_format: str) -> dict[str, Any]:
    """``width``/``height`` (and ``frames``/``pages`` where counted) of an image, or
    ``corrupt`` when the file ends before its header gives them."""
    reader = _READERS.get(image_format)
    if reader is None:
        return {}
    watched = _Watched(source)
    try:
        found = reader(watched)
    except (struct.error, ValueError, OSError):
        found = {}
    if ("width" not in found or "height" not in found) and watched.asked_past_end:
        # A zero is a width that was read: the decoder refuses it (below).
        return {
            "corrupt": f"the file ends ({source.size:,} bytes) before its header gives"
            " a width and height"
        }
    if not found.get("width") or not found.get("height"):
        # Zero or missing: nothing to limit; the decoder refuses such files.
        return {k: v for k, v in found.items() if k not in ("width", "height")}
    return found


class _Watched:
    """A source that notes whether a reader asked for bytes past its end: a reader that
    found no dimensions and did ran out of file looking for them."""

    def __init__(self, source: Source) -> None:
        self._source = source
        self.asked_past_end = False

    @property
    def size(self) -> int:
        return self._source.size

    def read_at(self, offset: int, length: int) -> bytes:
        if length > 0 and offset + length > self._source.size:
            self.asked_past_end = True
        return self._source.read_at(offset, length)


def _png(source: Source) -> dict[str, Any]:
    head = source.read_at(0, 33)
    if head[12:16] != b"IHDR":
        return {}
    width, height = struct.unpack_from(">II", head, 16)
    found: dict[str, Any] = {"width": width, "height": height}
    # APNG: an acTL chunk before the first IDAT gives the frame count.
    offset = 8
    for _ in range(10_000):
        header = source.read_at(offset, 16)
        if len(header) < 8:
            break
        length, kind = struct.unpack_from(">I4s", header)
        if kind == b"acTL" and len(header) >= 12:
            found["frames"] = struct.unpack_from(">I", header, 8)[0]
            break
        if kind in (b"IDAT", b"IEND"):
            break
        offset += 12 + length
    return found


def _jpeg(source: Source) -> dict[str, Any]:
    offset = 2
    for _ in range(10_000):
        header = source.read_at(offset, 9)
        if len(header) < 4 or header[0] != 0xFF:
            return {}
        marker = header[1]
        if marker == 0xFF:  # fill byte
            offset += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):
            offset += 2
            continue
        if marker in _JPEG_SOF and len(header) >= 9:
            height, width = struct.unpack_from(">HH", header, 5)
            return {"width": width, "height": height}
        if marker in (0xD9, 0xDA):  # end of image, start of scan: no frame header seen
            return {}
        offset += 2 + struct.unpack_from(">H", header, 2)[0]
    return {}


def _gif(source: Source) -> dict[str, Any]:
    file = buffered(source, 1024 * 1024)
    head = file.read(13)
    if len(head) < 13:
        return {}
    width, height, packed = struct.unpack_from("<HHB", head, 6)
    if packed & 0x80:
        file.seek(3 << ((packed & 7) + 1), 1)
    frames = 0
    complete = False
    while file.tell() < WALK_LIMIT_BYTES:
        block = file.read(1)
        if not block or block == b";":
            complete = block == b";"
            break
        if block == b"!":
            file.read(1)  # extension label
        elif block == b",":
            descriptor = file.read(9)
            if len(descriptor) < 9:
                break
            left, top, w, h, flags = struct.unpack("<HHHHB", descriptor)
            width, height = max(width, left + w), max(height, top + h)
            frames += 1
            if flags & 0x80:
                file.seek(3 << ((flags & 7) + 1), 1)
            file.read(1)  # LZW minimum code size
        else:
            break  # not a GIF block: the decoder will say what it thinks
        if not _skip_sub_blocks(file):
            break
    found: dict[str, Any] = {"width": width, "height": height, "frames": frames}
    if not complete and file.tell() >= WALK_LIMIT_BYTES:
        found["frames_counted_to"] = file.tell()
    return found


def _skip_sub_blocks(file: Any) -> bool:
    while True:
        size = file.read(1)
        if not size:
            return False
        if size == b"\x00":
            return True
        file.seek(size[0], 1)


def _webp(source: Source) -> dict[str, Any]:
    found: dict[str, Any] = {}
    frames = 0
    offset = 12
    end = 8 + struct.unpack("<I", source.read_at(4, 4))[0]  # as the RIFF header declares
    for _ in range(MAX_CHUNKS):
        if offset + 8 > end or offset > WALK_LIMIT_BYTES:
            break
        header = source.read_at(offset, 18)
        if len(header) < 8:
            break  # the file ends before the chunks its RIFF header declares
        kind, length = header[:4], struct.unpack_from("<I", header, 4)[0]
        data = header[8:]
        if kind == b"VP8X" and len(data) >= 10:
            found["width"] = 1 + int.from_bytes(data[4:7], "little")
            found["height"] = 1 + int.from_bytes(data[7:10], "little")
        elif kind == b"VP8 " and len(data) >= 10 and "width" not in found:
            if data[3:6] == b"\x9d\x01\x2a":
                w, h = struct.unpack_from("<HH", data, 6)
                found["width"], found["height"] = w & 0x3FFF, h & 0x3FFF
        elif kind == b"VP8L" and len(data) >= 5 and "width" not in found:
            bits = int.from_bytes(data[1:5], "little")
            found["width"], found["height"] = 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
        elif kind == b"ANMF":
            frames += 1
        offset += 8 + length + (length & 1)
    if frames:
        found["frames"] = frames
    return found


def _tiff(source: Source) -> dict[str, Any]:
    head = source.read_at(0, 16)
    order = "<" if head[:2] == b"II" else ">"
    big = head[2:4] in (b"+\x00", b"\x00+")
    if big:
        ifd = struct.unpack_from(order + "Q", head, 8)[0]
    else:
        ifd = struct.unpack_from(order + "I", head, 4)[0]
    found: dict[str, Any] = {}
    seen: set[int] = set()
    pages = 0
    while ifd and ifd not in seen and pages < MAX_TIFF_PAGES and ifd < source.size:
        seen.add(ifd)
        if big:
            count = struct.unpack(order + "Q", source.read_at(ifd, 8))[0]
            entry_size, first = 20, ifd + 8
        else:
            count = struct.unpack(order + "H", source.read_at(ifd, 2))[0]
            entry_size, first = 12, ifd + 2
        count = min(count, 4096)
        entries = source.read_at(first, count * entry_size)
        if pages == 0:
            found.update(_tiff_size(entries, order, big))
        pages += 1
        link = source.read_at(first + count * entry_size, 8 if big else 4)
        if len(link) < (8 if big else 4):
            break
        ifd = struct.unpack(order + ("Q" if big else "I"), link)[0]
    found["pages"] = pages
    return found


def _tiff_size(entries: bytes, order: str, big: bool) -> dict[str, int]:
    size: dict[str, int] = {}
    entry_size = 20 if big else 12
    for i in range(len(entries) // entry_size):
        tag, field_type = struct.unpack_from(order + "HH", entries, i * entry_size)
        if tag not in (256, 257):
            continue
        at = i * entry_size + (12 if big else 8)
        formats = {3: "H", 4: "I", 16: "Q"}
        if field_type not in formats:
            continue
        value = int(struct.unpack_from(order + formats[field_type], entries, at)[0])
        size["width" if tag == 256 else "height"] = value
    return size


def _bmp(source: Source) -> dict[str, Any]:
    head = source.read_at(0, 26)
    header_size = struct.unpack_from("<I", head, 14)[0]
    if header_size == 12:
        width, height = struct.unpack_from("<HH", head, 18)
    else:
        width, height = struct.unpack_from("<ii", head, 18)
    return {"width": abs(width), "height": abs(height)}


def _ico(source: Source) -> dict[str, Any]:
    count = min(struct.unpack("<H", source.read_at(4, 2))[0], 256)
    entries = source.read_at(6, 16 * count)
    if len(entries) < 16:
        return {}  # no directory entry: no size to read
    best = (0, 0)
    for i in range(len(entries) // 16):
        w, h = entries[16 * i] or 256, entries[16 * i + 1] or 256
        if w * h > best[0] * best[1]:
            best = (w, h)
    return {"width": best[0], "height": best[1]}


def _heif(source: Source) -> dict[str, Any]:
    """HEIF/AVIF: the largest ``ispe`` (image spatial extents) property; a grid's own
    extents are among them, so this is the full declared size."""
    best = (0, 0)
    for match in _ISPE.finditer(source.read_at(0, 1024 * 1024)):
        w, h = struct.unpack(">I", match.group(1))[0], struct.unpack(">I", match.group(2))[0]
        if w * h > best[0] * best[1]:
            best = (w, h)
    return {"width": best[0], "height": best[1]} if best[0] else {}


def _psd(source: Source) -> dict[str, Any]:
    height, width = struct.unpack(">II", source.read_at(14, 8))
    return {"width": width, "height": height}


def _jp2(source: Source) -> dict[str, Any]:
    head = source.read_at(0, 64 * 1024)
    if head.startswith(b"\xff\x4f\xff\x51"):  # raw codestream: the SIZ marker
        xsiz, ysiz, xo, yo = struct.unpack_from(">IIII", head, 8)
        return {"width": xsiz - xo, "height": ysiz - yo}
    at = head.find(b"ihdr")
    if at < 0:
        return {}
    height, width = struct.unpack_from(">II", head, at + 4)
    return {"width": width, "height": height}


_READERS = {
    "png": _png,
    "jpeg": _jpeg,
    "gif": _gif,
    "webp": _webp,
    "tiff": _tiff,
    "bmp": _bmp,
    "ico": _ico,
    "avif": _heif,
    "avifs": _heif,
    "heic": _heif,
    "heif": _heif,
    "psd": _psd,
    "jp2": _jp2,
}
