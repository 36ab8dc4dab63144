"""PDF: does it need a password, and how many pages does it say it has.

Encryption. The trailer (at the end, at ``startxref``, and for linearized files near
the start) names the encryption dictionary, ``/Encrypt N G R``; that object is never
inside an object stream, so it is found as plain ``N G obj`` text. A PDF encrypted only
with an *owner* password (permissions) opens with the empty user password, so it is not
"encrypted" for us: the standard security handler's check of the empty password is run
(ISO 32000-2 algorithms 2, 4, 5 for revisions 2-4, 2.A/2.B for revisions 5-6). Any
other security handler (certificates, vendor schemes) or a dictionary that cannot be read
counts as encrypted: we cannot open it, so neither could the pipeline.

Pages. The largest ``/Count`` of a ``/Type /Pages`` node outside object streams (the
root's is the total), or a linearization dictionary's ``/N``. When the page tree lives
in compressed object streams the count is unknown and left to the pipeline.
"""

from __future__ import annotations

import hashlib
import re
import struct
from dataclasses import dataclass
from typing import Any

from pipelines.formats.source import Source

# Whole files up to this size are scanned; larger ones at their two ends.
SCAN_BYTES = 8 * 1024 * 1024
_CHUNK = 2 * 1024 * 1024
_OVERLAP = 4096
_TAIL = 64 * 1024

_ENCRYPT_REF = re.compile(rb"/Encrypt\s*(\d+)\s+(\d+)\s+R")
_ENCRYPT_INLINE = re.compile(rb"/Encrypt\s*<<")
_STARTXREF = re.compile(rb"startxref\s+(\d+)")
_PAGES_NODE = re.compile(rb"/Type\s*/Pages(?![A-Za-z])")
_COUNT = re.compile(rb"/Count\s+(\d+)")
_LINEARIZED_PAGES = re.compile(rb"/Linearized\s.{0,200}?/N\s+(\d+)", re.S)
# An image's declared size: /Width and /Height in one dictionary (either order).
_IMAGE_SIZE = re.compile(
    rb"/Width\s+(\d{1,12})(?![\d.])[^>]{0,400}?/Height\s+(\d{1,12})(?![\d.])"
    rb"|/Height\s+(\d{1,12})(?![\d.])[^>]{0,400}?/Width\s+(\d{1,12})(?![\d.])",
    re.S,
)
# A JBIG2 stream: its first segment should be a page information segment (type 48)
# that declares the page's size, which is what a JBIG2 decoder allocates.
_JBIG2_STREAM = re.compile(rb"/JBIG2Decode[^>]{0,400}?>>\s*stream\r?\n", re.S)
_PADDING = bytes.fromhex("28bf4e5e4e758a4164004e56fffa01082e2e00b6d0683e802f0ca9fe6453697a")


@dataclass(frozen=True, slots=True)
class PdfFacts:
    encrypted: str | None  # how it is protected when it cannot be opened, or None
    pages: int | None
    # The largest image the scanned part declares (image dictionaries, JBIG2 page
    # information): (width, height), or None.
    largest_image: tuple[int, int] | None = None


def analyze(source: Source) -> PdfFacts:
    regions = _regions(source)
    return PdfFacts(_encryption(source, regions), _pages(regions), _largest_image(regions))


def _largest_image(regions: list[bytes]) -> tuple[int, int] | None:
    """The declared image of most pixels in ``regions``: what a decoder would allocate
    for it, read before any stream is decoded (compressed object streams are not
    looked into: PDFium bounds its bitmaps itself, this is for what stands in plain)."""
    sizes: list[tuple[int, int]] = []
    for region in regions:
        for match in _IMAGE_SIZE.finditer(region):
            w, h, h2, w2 = match.groups()
            sizes.append((int(w or w2), int(h or h2)))
        for match in _JBIG2_STREAM.finditer(region):
            page = _jbig2_page_size(region[match.end() : match.end() + 64])
            if page is not None:
                sizes.append(page)
    return max(sizes, key=lambda s: s[0] * s[1], default=None)


def _jbig2_page_size(data: bytes) -> tuple[int, int] | None:
    """Width and height from a JBIG2 embedded stream's leading page information segment
    (ITU T.88 7.2: number, flags, referred-to segments, page association, length)."""
    if len(data) < 6:
        return None
    flags = data[4]
    if flags & 0x3F != 48:  # not a page information segment
        return None
    referred = data[5] >> 5
    if referred == 7:  # the long form: not in a first segment
        return None
    number = int.from_bytes(data[:4], "big")
    per_reference = 1 if number <= 256 else 2 if number <= 65536 else 4
    offset = 6 + referred * per_reference + (4 if flags & 0x40 else 1) + 4
    if len(data) < offset + 8:
        return None
    width = int.from_bytes(data[offset : offset + 4], "big")
    height = int.from_bytes(data[offset + 4 : offset + 8], "big")
    return width, height


def _regions(source: Source) -> list[bytes]:
    """What is scanned: the whole file when small, else its first and last halves of
    :data:`SCAN_BYTES` (chunks overlap so a token on a boundary is seen whole)."""
    if source.size <= SCAN_BYTES:
        spans = [(0, source.size)]
    else:
        half = SCAN_BYTES // 2
        spans = [(0, half), (source.size - half, source.size)]
    regions = []
    for start, end in spans:
        offset = start
        while offset < end:
            regions.append(source.read_at(offset, min(_CHUNK + _OVERLAP, end - offset)))
            offset += _CHUNK
    return regions


# -- encryption ---------------------------------------------------------------------------


def _encryption(source: Source, regions: list[bytes]) -> str | None:
    trailer_text = b"".join(
        [
            source.read_at(0, _TAIL),
            source.read_at(max(0, source.size - _TAIL), _TAIL),
            *_at_startxref(source),
        ]
    )
    reference = _ENCRYPT_REF.search(trailer_text)
    if reference is None:
        if _ENCRYPT_INLINE.search(trailer_text):
            inline = trailer_text[_ENCRYPT_INLINE.search(trailer_text).end() - 2 :]  # type: ignore[union-attr]
            return _check_dictionary(_parse_object(inline), _document_id(trailer_text))
        if any(_ENCRYPT_REF.search(region) for region in regions):
            return "an /Encrypt entry outside the trailers read"
        return None
    number, generation = reference.group(1), reference.group(2)
    body = _find_object(regions, number, generation)
    if body is None:
        return "encryption dictionary not found"
    return _check_dictionary(_parse_object(body), _document_id(trailer_text))


def _at_startxref(source: Source) -> list[bytes]:
    found = _STARTXREF.findall(source.read_at(max(0, source.size - 2048), 2048))
    if not found:
        return []
    offset = int(found[-1])
    return [source.read_at(offset, 8192)] if 0 <= offset < source.size else []


def _find_object(regions: list[bytes], number: bytes, generation: bytes) -> bytes | None:
    pattern = re.compile(rb"(?<![0-9])" + number + rb"\s+" + generation + rb"\s+obj\b")
    for region in reversed(regions):  # the dictionary is usually written near the end
        match = pattern.search(region)
        if match:
            return region[match.end() : match.end() + 16384]
    return None


def _document_id(trailer_text: bytes) -> bytes:
    match = re.search(rb"/ID\s*\[", trailer_text)
    if match is None:
        return b""
    parsed = _Parser(trailer_text, match.end() - 1).value()
    if isinstance(parsed, list) and parsed and isinstance(parsed[0], bytes):
        return parsed[0]
    return b""


def _check_dictionary(encrypt: Any, document_id: bytes) -> str | None:
    if not isinstance(encrypt, dict):
        return "unreadable encryption dictionary"
    if encrypt.get("Filter") != "Standard":
        return f"/{encrypt.get('Filter')} security handler"
    try:
        opens = opens_with(encrypt, document_id, b"")
    except (KeyError, TypeError, ValueError, struct.error) as exc:
        return f"malformed encryption dictionary ({exc})"
    revision = encrypt.get("R")
    return None if opens else f"user password, standard security handler revision {revision}"


def opens_with(encrypt: dict[str, Any], document_id: bytes, password: bytes) -> bool:
    """Whether ``password`` is the user password of a standard security handler's
    encryption dictionary (raises ``KeyError``/``TypeError``/``ValueError`` when the
    dictionary lacks what the check needs)."""
    revision = int(encrypt.get("R", 0))
    owner, user = encrypt["O"], encrypt["U"]
    if not isinstance(owner, bytes) or not isinstance(user, bytes):
        raise TypeError("O and U must be strings")
    if revision >= 5:
        return _password_opens_r5_r6(revision, user, password[:127])
    return _password_opens_r2_r4(
        password,
        revision,
        owner,
        user,
        int(encrypt.get("P", 0)),
        int(encrypt.get("Length", 40)),
        document_id,
        encrypt.get("EncryptMetadata", True) is not False,
    )


def _rc4(key: bytes, data: bytes) -> bytes:
    state = list(range(256))
    j = 0
    for i in range(256):
        j = (j + state[i] + key[i % len(key)]) & 0xFF
        state[i], state[j] = state[j], state[i]
    out = bytearray()
    i = j = 0
    for byte in data:
        i = (i + 1) & 0xFF
        j = (j + state[i]) & 0xFF
        state[i], state[j] = state[j], state[i]
        out.append(byte ^ state[(state[i] + state[j]) & 0xFF])
    return bytes(out)


def _password_opens_r2_r4(
    password: bytes,
    revision: int,
    owner: bytes,
    user: bytes,
    permissions: int,
    length_bits: int,
    document_id: bytes,
    encrypt_metadata: bool,
) -> bool:
    """Algorithms 2, 4 and 5 of ISO 32000 (RC4/MD5, revisions 2-4)."""
    key_length = 5 if revision == 2 else max(5, min(16, length_bits // 8))
    digest = hashlib.md5(usedforsecurity=False)
    digest.update((password + _PADDING)[:32])
    digest.update(owner[:32])
    digest.update(struct.pack("<i", permissions))
    digest.update(document_id)
    if revision >= 4 and not encrypt_metadata:
        digest.update(b"\xff\xff\xff\xff")
    key = digest.digest()
    if revision >= 3:
        for _ in range(50):
            key = hashlib.md5(key[:key_length], usedforsecurity=False).digest()
    key = key[:key_length]
    if revision == 2:
        return _rc4(key, _PADDING) == user[:32]
    check = _rc4(key, hashlib.md5(_PADDING + document_id, usedforsecurity=False).digest())
    for i in range(1, 20):
        check = _rc4(bytes(b ^ i for b in key), check)
    return check == user[:16]


def _password_opens_r5_r6(revision: int, user: bytes, password: bytes) -> bool:
    """Algorithm 2.A: the hash of the password with the user validation salt equals
    the first 32 bytes of /U (revision 5: one SHA-256; 6: algorithm 2.B)."""
    if len(user) < 48:
        raise ValueError("/U shorter than 48 bytes")
    salt = user[32:40]
    if revision == 5:
        return hashlib.sha256(password + salt).digest() == user[:32]
    return _hash_r6(password, salt, b"") == user[:32]


def _hash_r6(password: bytes, salt: bytes, udata: bytes) -> bytes:
    """Algorithm 2.B (ISO 32000-2): iterated SHA-2 with AES-128-CBC rounds."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    k = hashlib.sha256(password + salt + udata).digest()
    round_number = 0
    while True:
        k1 = (password + k + udata) * 64
        encryptor = Cipher(algorithms.AES(k[:16]), modes.CBC(k[16:32])).encryptor()
        e = encryptor.update(k1) + encryptor.finalize()
        k = (hashlib.sha256, hashlib.sha384, hashlib.sha512)[sum(e[:16]) % 3](e).digest()
        round_number += 1
        if round_number >= 64 and e[-1] <= round_number - 32:
            return k[:32]


# -- pages ----------------------------------------------------------------------------------


def _pages(regions: list[bytes]) -> int | None:
    counts = []
    for region in regions:
        linearized = _LINEARIZED_PAGES.search(region[:4096])
        if linearized:
            counts.append(int(linearized.group(1)))
        for node in _PAGES_NODE.finditer(region):
            start = region.rfind(b"obj", 0, node.start())
            end = region.find(b"endobj", node.end())
            body = region[max(start, 0) : end if end >= 0 else node.end() + 4096]
            count = _COUNT.search(body)
            if count:
                counts.append(int(count.group(1)))
    return max(counts) if counts else None


# -- a small reader of PDF objects (dictionaries, arrays, strings, numbers, names) ----------

_WHITESPACE = b" \t\r\n\f\x00"
_DELIMITERS = b"()<>[]{}/%"


def _parse_object(text: bytes) -> Any:
    try:
        return _Parser(text, 0).value()
    except (IndexError, ValueError):
        return None


class _Parser:
    def __init__(self, text: bytes, position: int) -> None:
        self.text = text
        self.at = position
        self.depth = 0

    def skip(self) -> None:
        while self.at < len(self.text):
            char = self.text[self.at]
            if char in _WHITESPACE:
                self.at += 1
            elif char == 0x25:  # % comment
                end = self.text.find(b"\n", self.at)
                self.at = len(self.text) if end < 0 else end + 1
            else:
                return

    def value(self) -> Any:
        self.skip()
        text, at = self.text, self.at
        if text.startswith(b"<<", at):
            return self.dictionary()
        char = text[at : at + 1]
        if char == b"[":
            return self.array()
        if char == b"(":
            return self.literal()
        if char == b"<":
            return self.hexadecimal()
        if char == b"/":
            return self.name()
        return self.token()

    def dictionary(self) -> dict[str, Any]:
        self.depth += 1
        if self.depth > 32:
            raise ValueError("nested too deep")
        self.at += 2
        result: dict[str, Any] = {}
        while True:
            self.skip()
            if self.text.startswith(b">>", self.at):
                self.at += 2
                self.depth -= 1
                return result
            key = self.value()
            if not isinstance(key, str) or not key:
                raise ValueError("dictionary key is not a name")
            result[key] = self.value()

    def array(self) -> list[Any]:
        self.at += 1
        items: list[Any] = []
        while True:
            self.skip()
            if self.text[self.at : self.at + 1] == b"]":
                self.at += 1
                return items
            if len(items) > 4096:
                raise ValueError("array too long")
            items.append(self.value())

    def name(self) -> str:
        start = self.at + 1
        end = start
        while end < len(self.text) and self.text[end] not in _WHITESPACE + _DELIMITERS:
            end += 1
        self.at = end
        raw = re.sub(
            rb"#([0-9A-Fa-f]{2})", lambda m: bytes([int(m.group(1), 16)]), self.text[start:end]
        )
        return raw.decode("latin-1")

    def token(self) -> Any:
        start = self.at
        end = start
        while end < len(self.text) and self.text[end] not in _WHITESPACE + _DELIMITERS:
            end += 1
        if end == start:
            raise ValueError(f"unexpected {self.text[start : start + 1]!r}")
        self.at = end
        word = self.text[start:end]
        if word == b"true":
            return True
        if word == b"false":
            return False
        if word == b"null":
            return None
        number = float(word) if b"." in word else int(word)
        # "N G R": an indirect reference, kept as a tuple.
        saved = self.at
        self.skip()
        follow = re.match(rb"(\d+)\s+R(?![A-Za-z])", self.text[self.at : self.at + 24])
        if isinstance(number, int) and follow:
            self.at += follow.end()
            return ("ref", number, int(follow.group(1)))
        self.at = saved
        return number

    def hexadecimal(self) -> bytes:
        end = self.text.index(b">", self.at)
        digits = re.sub(rb"[^0-9A-Fa-f]", b"", self.text[self.at + 1 : end])
        self.at = end + 1
        if len(digits) % 2:
            digits += b"0"
        return bytes.fromhex(digits.decode())

    def literal(self) -> bytes:
        out = bytearray()
        depth = 0
        at = self.at + 1
        text = self.text
        while True:
            char = text[at]
            if char == 0x5C:  # backslash escape
                at += 1
                escaped = text[at]
                simple = {0x6E: 10, 0x72: 13, 0x74: 9, 0x62: 8, 0x66: 12}
                if escaped in simple:
                    out.append(simple[escaped])
                elif 0x30 <= escaped <= 0x37:
                    digits = re.match(rb"[0-7]{1,3}", text[at : at + 3])
                    assert digits is not None
                    out.append(int(digits.group(0), 8) & 0xFF)
                    at += len(digits.group(0)) - 1
                elif escaped == 0x0D:  # line continuation
                    if text[at + 1 : at + 2] == b"\n":
                        at += 1
                elif escaped != 0x0A:
                    out.append(escaped)
            elif char == 0x28:
                depth += 1
                out.append(char)
            elif char == 0x29:
                if depth == 0:
                    self.at = at + 1
                    return bytes(out)
                depth -= 1
                out.append(char)
            else:
                out.append(char)
            at += 1
