"""``pdf_preview`` parameters: validated into a :class:`PreviewRequest`, named as an output type.

Pure (no PDFium, no file): the worker or the API may validate a request before any
file is touched. Parameters are the profile's ``params`` merged with the request:

``page``
    1-based page number, default 1 (a page beyond the document is refused by the step,
    which alone knows the page count).
``width``
    output width in pixels, 16..4096, default 1024; the height follows the page's
    aspect ratio (rotation applied).
``format``
    ``jpeg`` (default: the smallest for pages that mix text and pictures), ``png``
    (lossless, best for line art) or ``webp``.
``quality``
    1..100 for JPEG and WebP, default 85 (text edges stay clean); ignored for PNG.

Output types carry every parameter that changes the image, ``quality`` only for lossy
formats (as in :mod:`pipelines.image_params`)::

    preview-p1-w1024-q85.jpg    preview-p3-w640.png    preview-p1-w1024-q70.webp
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipelines.image_params import FORMATS as IMAGE_FORMATS
from pipelines.image_params import OutputFormat
from pipelines.params import integer, reject_unknown
from pipelines.registry import PipelineError

FORMATS: dict[str, OutputFormat] = {name: IMAGE_FORMATS[name] for name in ("jpeg", "png", "webp")}
_FORMAT_ALIASES = {"jpg": "jpeg"}

KEYS = ("page", "width", "format", "quality")
DEFAULT_PAGE = 1
DEFAULT_WIDTH = 1024
DEFAULT_FORMAT = "jpeg"
DEFAULT_QUALITY = 85
MIN_WIDTH = 16
MAX_WIDTH = 4096
MAX_PAGE = 1_000_000


@dataclass(frozen=True, slots=True)
class PreviewRequest:
    """``pdf_preview``'s effective parameters."""

    page: int
    width: int
    format: OutputFormat
    # None for PNG.
    quality: int | None

    @property
    def output_type(self) -> str:
        quality = f"-q{self.quality}" if self.quality is not None else ""
        return f"preview-p{self.page}-w{self.width}{quality}.{self.format.extension}"


def parse(params: Mapping[str, Any]) -> PreviewRequest:
    """Validate ``params`` into a :class:`PreviewRequest` (``invalid_params`` naming the key)."""
    reject_unknown("pdf_preview", params, KEYS)
    output_format = _format(params.get("format"))
    quality = integer(params, "quality", 1, 100, DEFAULT_QUALITY)
    return PreviewRequest(
        page=integer(params, "page", 1, MAX_PAGE, DEFAULT_PAGE),
        width=integer(params, "width", MIN_WIDTH, MAX_WIDTH, DEFAULT_WIDTH),
        format=output_format,
        quality=quality if output_format.lossy else None,
    )


def _format(value: object) -> OutputFormat:
    if value is None:
        return FORMATS[DEFAULT_FORMAT]
    name = _FORMAT_ALIASES.get(value.lower(), value.lower()) if isinstance(value, str) else None
    if name not in FORMATS:
        raise PipelineError(
            "invalid_params",
            f"pdf_preview: format must be one of {', '.join(FORMATS)}, got {value!r}",
        )
    return FORMATS[name]
