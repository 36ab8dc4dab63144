"""Signed blob URLs for the local backend: pure HMAC-SHA256, no I/O.

A URL is ``{base_url}/v1/hypermedia/blobs/{key}?expires=<epoch>&sig=<hex>``, with
``&content_type=<type>`` when the uploader must send that ``Content-Type`` (a GET: the
one it answers), and ``&disposition=<value>`` when a GET answers that
``Content-Disposition``. The signature is ``HMAC-SHA256(secret,
"{METHOD}\\n{key}\\n{expires}\\n{content_type}")``, with ``"\\n{disposition}"``
after it when there is one, so a URL is bound to its method, key, expiry, content type
and disposition: changing any of them gives a signature the server refuses. A received
content type or disposition holding anything but printable ASCII is refused unchecked:
no line break, so one content type cannot pass for a content type and a disposition.
Signatures are compared in constant time, and checked before the expiry, so a forged
URL never learns whether it is also late.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from urllib.parse import quote

from hypermedia.storage.base import InvalidSignature, UrlExpired

BLOB_PATH = "/v1/hypermedia/blobs"
MIN_SECRET_LENGTH = 32
_HEX_SIGNATURE = re.compile(r"^[0-9a-f]{64}$")
_EXPIRES = re.compile(r"^[1-9][0-9]{0,11}$")
_PRINTABLE = re.compile(r"^[\x20-\x7e]*$")


def signature(
    secret: str,
    method: str,
    key: str,
    expires: int,
    content_type: str | None,
    disposition: str | None = None,
) -> str:
    message = f"{method.upper()}\n{key}\n{expires}\n{content_type or ''}"
    if disposition is not None:
        message += f"\n{disposition}"
    return hmac.new(secret.encode(), message.encode(), hashlib.sha256).hexdigest()


def signed_url(
    base_url: str,
    secret: str,
    method: str,
    key: str,
    expires: int,
    content_type: str | None = None,
    *,
    disposition: str | None = None,
) -> str:
    sig = signature(secret, method, key, expires, content_type, disposition)
    url = f"{base_url.rstrip('/')}{BLOB_PATH}/{key}?expires={expires}&sig={sig}"
    if content_type is not None:
        url += f"&content_type={quote(content_type, safe='')}"
    if disposition is not None:
        url += f"&disposition={quote(disposition, safe='')}"
    return url


def verify(
    secret: str,
    method: str,
    key: str,
    expires: str | None,
    sig: str | None,
    content_type: str | None,
    now: float,
    *,
    disposition: str | None = None,
) -> None:
    """Raise :class:`InvalidSignature` or :class:`UrlExpired`; return if the URL is good.

    ``expires``, ``sig``, ``content_type`` and ``disposition`` are the URL's query
    parameters as received (possibly missing or malformed)."""
    if (
        expires is None
        or sig is None
        or not _EXPIRES.fullmatch(expires)
        or not _HEX_SIGNATURE.fullmatch(sig)
        or not all(_PRINTABLE.fullmatch(v) for v in (content_type, disposition) if v is not None)
    ):
        raise InvalidSignature("the URL carries no valid signature")
    expected = signature(secret, method, key, int(expires), content_type, disposition)
    if not hmac.compare_digest(expected, sig):
        raise InvalidSignature("the URL's signature does not match")
    if now > int(expires):
        raise UrlExpired("the signed URL has expired", expires=int(expires))
