"""Image step parameters: validated into a :class:`ImageRequest`, named as an output type.

Pure (no decoders): the worker or the API may validate a request with it before any
file is touched. Parameters arrive as the profile's ``params`` merged with the request;
unknown keys and bad values raise ``PipelineError("invalid_params", ...)`` naming the key.

Output types carry every parameter that changes the output, so two requests that
differ never share one and the same request always gets the same one::

    thumbnail-320x320-q80.webp     thumbnail-320x320-crop-q80.webp   (crop = "centre")
    resize-1600x1600-q85.jpg       compress-q75.webp      convert.png      convert-q90.jpg

``quality`` is part of the name only for the lossy encoders (JPEG, WebP, AVIF): PNG,
GIF and TIFF outputs ignore it, so a profile's quality merged into a PNG request
neither fails nor splits the output. The limits (``max_pixels`` ...) decide whether
there is an output, never what it is, so they are not in the name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipelines.params import integer, reject_unknown
from pipelines.registry import PipelineError, UnsetParameters


@dataclass(frozen=True, slots=True)
class OutputFormat:
    name: str
    extension: str
    content_type: str
    lossy: bool


FORMATS: dict[str, OutputFormat] = {
    "jpeg": OutputFormat("jpeg", "jpg", "image/jpeg", lossy=True),
    "png": OutputFormat("png", "png", "image/png", lossy=False),
    "webp": OutputFormat("webp", "webp", "image/webp", lossy=True),
    "avif": OutputFormat("avif", "avif", "image/avif", lossy=True),
    "tiff": OutputFormat("tiff", "tiff", "image/tiff", lossy=False),
    "gif": OutputFormat("gif", "gif", "image/gif", lossy=False),
}
_FORMAT_ALIASES = {"jpg": "jpeg", "tif": "tiff"}
# compress is about bytes: only the encoders with a quality knob.
COMPRESS_FORMATS = ("jpeg", "webp", "avif")

# crop value -> libvips "interesting" (None: fit inside the box, no crop).
_CROPS: dict[object, str | None] = {
    False: None,
    "none": None,
    True: "centre",
    "centre": "centre",
    "center": "centre",
    "attention": "attention",
    "entropy": "entropy",
}
_CROP_SUFFIX = {"centre": "-crop", "attention": "-crop-attention", "entropy": "-crop-entropy"}

MAX_DIMENSION = 16384
DEFAULT_QUALITY = 80
# Decoded pixels (after shrink-on-load), for all frames that are decoded.
DEFAULT_MAX_PIXELS = 100_000_000
# Pixels declared in the header, whatever shrink-on-load would save.
DEFAULT_MAX_SOURCE_PIXELS = 400_000_000
# Frames of an animation kept in an animated output.
DEFAULT_MAX_FRAMES = 1000

_LIMIT_KEYS = ("max_pixels", "max_source_pixels", "max_frames")
_KEYS: dict[str, tuple[str, ...]] = {
    "thumbnail": ("width", "height", "format", "quality", "crop", *_LIMIT_KEYS),
    "resize": ("width", "height", "format", "quality", *_LIMIT_KEYS),
    "compress": ("format", "quality", *_LIMIT_KEYS),
    "convert": ("format", "quality", *_LIMIT_KEYS),
}
_REQUIRED: dict[str, tuple[str, ...]] = {
    "thumbnail": ("width", "height", "format"),
    "resize": ("width", "height", "format"),
    "compress": ("format",),
    "convert": ("format",),
}

OPERATIONS = tuple(_KEYS)


@dataclass(frozen=True, slots=True)
class ImageRequest:
    """One image step's effective parameters."""

    operation: str
    format: OutputFormat
    # The box the output must fit in (thumbnail, resize); None keeps the size.
    width: int | None = None
    height: int | None = None
    # libvips "interesting" mode for thumbnail crops; None fits inside the box.
    crop: str | None = None
    # None for lossless formats.
    quality: int | None = None
    max_pixels: int = DEFAULT_MAX_PIXELS
    max_source_pixels: int = DEFAULT_MAX_SOURCE_PIXELS
    max_frames: int = DEFAULT_MAX_FRAMES

    @property
    def output_type(self) -> str:
        parts = [self.operation]
        if self.width is not None and self.height is not None:
            parts.append(f"-{self.width}x{self.height}")
        if self.crop is not None:
            parts.append(_CROP_SUFFIX[self.crop])
        if self.quality is not None:
            parts.append(f"-q{self.quality}")
        return "".join(parts) + "." + self.format.extension

    @property
    def keeps_animation(self) -> bool:
        """Whether an animated input stays animated (GIF/WebP out, not a thumbnail)."""
        return self.operation != "thumbnail" and self.format.name in ("gif", "webp")


def parse(operation: str, params: Mapping[str, Any]) -> ImageRequest:
    """Validate ``params`` for ``operation`` (``thumbnail``, ``resize``, ``compress``,
    ``convert``) into an :class:`ImageRequest`."""
    if operation not in _KEYS:
        raise PipelineError("invalid_params", f"no image operation {operation!r}")
    allowed = _KEYS[operation]
    reject_unknown(operation, params, allowed)
    missing = [key for key in _REQUIRED[operation] if params.get(key) is None]
    if missing:
        raise UnsetParameters(f"{operation}: missing parameter(s) {', '.join(missing)}")

    output_format = _format(operation, params["format"])
    quality = integer(params, "quality", 1, 100, DEFAULT_QUALITY)
    width = height = None
    if "width" in allowed:
        width = integer(params, "width", 1, MAX_DIMENSION, None)
        height = integer(params, "height", 1, MAX_DIMENSION, None)
    return ImageRequest(
        operation=operation,
        format=output_format,
        width=width,
        height=height,
        crop=_crop(params.get("crop", False)) if "crop" in allowed else None,
        quality=quality if output_format.lossy else None,
        max_pixels=integer(params, "max_pixels", 1, 10**12, DEFAULT_MAX_PIXELS),
        max_source_pixels=integer(
            params, "max_source_pixels", 1, 10**12, DEFAULT_MAX_SOURCE_PIXELS
        ),
        max_frames=integer(params, "max_frames", 1, 100_000, DEFAULT_MAX_FRAMES),
    )


def _format(operation: str, value: object) -> OutputFormat:
    choices = COMPRESS_FORMATS if operation == "compress" else tuple(FORMATS)
    name = _FORMAT_ALIASES.get(value, value) if isinstance(value, str) else value
    if not isinstance(name, str) or name not in choices:
        raise PipelineError(
            "invalid_params",
            f"{operation}: format must be one of {', '.join(choices)}, got {value!r}",
        )
    return FORMATS[name]


def _crop(value: object) -> str | None:
    key = value.lower() if isinstance(value, str) else value
    if isinstance(key, bool | str) and key in _CROPS:
        return _CROPS[key]
    raise PipelineError(
        "invalid_params",
        f"crop must be true/false or one of none, centre, attention, entropy; got {value!r}",
    )
