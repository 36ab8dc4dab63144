"""Hostile files, built by code (here and in :mod:`.packages`) from the other groups'
files and from nothing.

Each says in its manifest entry what the platform must do with it, in the corpus's
words (``reject:<reason>``, ``tolerate:<reason>``, ``neutralize:<what>``,
``sanitize:filename``). The documents whose point is an external reference take the
URL they point at, so a test can aim them at a listener of its own.
"""

from __future__ import annotations

import gzip
import struct
import tempfile
from pathlib import Path

import pyvips

from tests import error_inputs
from tests.generated import documents, packages
from tests.generated.entries import Entry
from tests.generated.images import KEEP_EXIF, picture

# Where the external references of the neutralize:external-ref documents point when no
# test aims them elsewhere: a name that never resolves (RFC 2606).
NOWHERE = "http://hypermedia-canary.invalid"
PHP = b"<?php phpinfo(); ?>"
FRAME_FLOOD = 1_100  # frames: over the default max_frames (1000)
LONG_NAME = (
    "Longitudinell_jämförelse_mellan_laserkirurgi_och_strålbehandling_gällande_"
    "röstkvalitet_och_självskattad_kommunikation_upp_till_två_år_efter_tidig_"
    "stämbandscancer_i_ett_randomiserat_kontrollerat_försök.docx"
)

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
        ("macros.docm", packages.macro_docm(),
         "document:docm", "reject:macro", "word/vbaProject.bin"),
        ("xxe.docx", packages.xxe_docx(), "document:docx", "reject:xxe", "SYSTEM file:///etc/passwd"),
        ("xml-bomb.docx", packages.xml_bomb_docx(),
         "document:docx", "reject:xml-bomb", "10^9 laughs"),
        ("encrypted-entry.docx", error_inputs.docx_with_encrypted_entry(),
         "document:docx", "reject:encrypted", "an encrypted ZIP entry"),
        ("encrypted.odt", packages.encrypted_odt(documents.report_fodt()),
         "document:odt", "reject:encrypted", f"AES-256, password {packages.PASSWORD!r}"),
        ("encrypted.pdf", encrypted_pdf,
         "pdf", "reject:encrypted", f"LibreOffice, password {packages.PASSWORD!r}"),
        ("truncated.docx", report[: len(report) // 2],
         "document:docx", "reject:truncated", "the first half of report.docx"),
        ("shared-strings-bomb.xlsx", packages.shared_strings_bomb_xlsx(),
         "document:xlsx", "reject:expansion-bomb", "12,000 cells x 1 MiB of text"),
        ("external-picture.docx", packages.external_picture_docx(f"{NOWHERE}/picture.png"),
         "document:docx", "neutralize:external-ref", "a linked picture"),
        ("attached-template.docx", packages.attached_template_docx(f"{NOWHERE}/template.dotx"),
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
