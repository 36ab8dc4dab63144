"""What a browser does with an output's download URL: its ``Content-Disposition``.

Pure: no I/O. The name a browser saves an output as is the original upload's
(``filename``), its extension replaced by the output's (:func:`download_name`):

* an output type that is one plain word and another extension than the original's
  (``document.pdf``, ``text.txt``, ``convert.png``) names the file converted:
  ``report.docx`` -> ``report.pdf``;
* any other (``thumbnail-320x320.webp``, ``video-h264-720p-crf23.mp4``, OCR's
  ``ocr-en-...txt``, a ``compress.jpg`` of a JPEG) is appended to the original's stem:
  ``photo.jpg`` -> ``photo-thumbnail-320x320.webp``, never the original's own name.

The disposition (:func:`content_disposition`, RFC 6266) is ``inline`` for what a browser
shows or plays in place (images, video, audio, PDF) and ``attachment`` for the rest
(text, JSON, archives) and for the types a browser runs scripts in (SVG, HTML, XML),
which S3 serves unsandboxed. The name goes twice: ``filename*=UTF-8''...``
(RFC 8187, percent-encoded: what every current browser reads) and an ASCII
``filename="..."`` for the others, in which nothing but letters, digits and
``._-()+,`` and spaces survives: no quote, backslash, CR/LF or other control
character can reach the header from a name.
"""

from __future__ import annotations

import re
import unicodedata
from urllib.parse import quote

__all__ = ["content_disposition", "download_name"]

# Most of a name's stem kept (in characters): a browser shows the start, and an S3 URL
# carries the encoded header twice over.
MAX_STEM = 80
_PLAIN_WORD = re.compile(r"^[a-z]+$")
_ASCII_UNSAFE = re.compile(r"[^A-Za-z0-9._()+, -]+")
_INLINE_PREFIXES = ("image/", "video/", "audio/")
_INLINE_TYPES = frozenset({"application/pdf"})
_SCRIPTED_TYPES = frozenset({"image/svg+xml"})
# RFC 8187's attr-char, besides letters and digits.
_ATTR_CHARS = "!#$&+-.^_`|~"
_FALLBACK_STEM = "download"


def _split(name: str) -> tuple[str, str]:
    """``name``'s stem and extension (without its dot; "" when none: ``.bashrc``)."""
    stem, dot, extension = name.rpartition(".")
    if not dot or not stem:
        return name, ""
    return stem, extension


def download_name(filename: str, output_type: str) -> str:
    """The name an output of ``filename`` (the upload's) is saved as."""
    stem, original = _split(filename.strip())
    # No leading dot: a browser would hide the file (or refuse the name).
    stem = stem.strip().lstrip(".")[:MAX_STEM].strip() or _FALLBACK_STEM
    kind, extension = _split(output_type)
    if extension and _PLAIN_WORD.fullmatch(kind) and extension.lower() != original.lower():
        return f"{stem}.{extension}"
    return f"{stem}-{output_type}"


def _ascii_name(name: str) -> str:
    """``name`` in printable ASCII with no quote nor backslash (accents dropped, other
    characters ``_``); its stem ``download`` when nothing of it is left."""
    decomposed = unicodedata.normalize("NFKD", name)
    plain = "".join(c for c in decomposed if not unicodedata.combining(c))
    safe = _ASCII_UNSAFE.sub("_", plain.encode("ascii", "replace").decode("ascii"))
    stem, extension = _split(safe)
    if not any(c.isalnum() for c in stem):
        stem = _FALLBACK_STEM
    return f"{stem}.{extension}" if extension else stem


def content_disposition(name: str, content_type: str | None) -> str:
    """The ``Content-Disposition`` header value of a download saved as ``name``, served
    as ``content_type``: printable ASCII whatever the name."""
    media = (content_type or "").partition(";")[0].strip().lower()
    shown = media not in _SCRIPTED_TYPES and (
        media.startswith(_INLINE_PREFIXES) or media in _INLINE_TYPES
    )
    encoded = quote(name, safe=_ATTR_CHARS, errors="replace")
    return (
        f"{'inline' if shown else 'attachment'}; "
        f"filename=\"{_ascii_name(name)}\"; filename*=UTF-8''{encoded}"
    )
