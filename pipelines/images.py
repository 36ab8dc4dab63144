"""Image steps on libvips: ``thumbnail``, ``resize``, ``compress``, ``convert``.

Every step runs the same way:

1. parameters validated (:mod:`pipelines.image_params`) before the file is opened;
2. the type sniffed from the first bytes (:mod:`pipelines.sniff`), never the name; a
   type outside :data:`SUPPORTED` is ``unsupported_format`` naming what it is, and a
   ZIP archive glued to the end of an image (a polyglot) is ``invalid_input``;
3. the header read by the decoder that will decode it (no pixels yet) and checked
   against the limits: ``max_source_pixels`` for what the header declares,
   ``max_pixels`` for what will be decoded (after JPEG shrink-on-load, times the frames
   an animated output keeps), ``max_frames``; over a limit is ``pixel_limit``;
4. decoded, shrunk, turned upright (EXIF orientation), converted to 8-bit sRGB (or
   8-bit grey) through the embedded ICC profile or a CMYK fallback, alpha flattened
   onto white for JPEG, and re-encoded with all metadata stripped (EXIF, GPS, XMP,
   comments, ICC: the pixels are sRGB).

Decoders: libvips for JPEG, PNG, GIF, WebP, TIFF and AVIF, every other libvips loader
blocked (:mod:`pipelines.image_vips`); pillow-heif for HEIC and Pillow for BMP and ICO
(:mod:`pipelines.image_decoders`), which the libvips wheel cannot decode. A decoder's
refusal is ``invalid_input`` with its message, our paths removed.

Plain (RGB, grey, or CMYK without a profile) JPEGs shrunk to a box (``thumbnail``
without a crop, ``resize``) to JPEG, WebP or PNG go through Pillow instead
(:mod:`pipelines.image_pillow`, chosen by measurement: ~2x less CPU per image on the
corpus JPEGs, libvips' fixed cost per call gone), with the same header checks and the
same output; whatever it declines (CMYK with its own profile, a file Pillow will not
decode, crops) goes to libvips. libvips is imported on first use, so a job that takes
the Pillow path with an RGB or grey JPEG never loads it.

Animated GIF/WebP stay animated when ``resize``, ``compress`` or ``convert`` writes GIF
or WebP; everything else (thumbnails, other outputs, TIFF pages, HEIF/AVIF items and
sequences) uses the first frame, page or primary image.
"""

from __future__ import annotations

import errno
import logging
import math
import os
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines import image_params, sniff
from pipelines.image_source import (
    DecodeFailed,
    Header,
    ImageInput,
    dct_shrink,
    describe_error,
)
from pipelines.registry import Output, PipelineError, register

if TYPE_CHECKING:
    import pyvips

log = logging.getLogger(__name__)

# Sniffed kind -> libvips loader nickname, or None where another library decodes it.
SUPPORTED: dict[str, str | None] = {
    "jpeg": "jpegload",
    "png": "pngload",
    "gif": "gifload",
    "webp": "webpload",
    "tiff": "tiffload",
    "avif": "heifload",
    "avifs": "heifload",
    "heic": None,
    "heif": None,
    "bmp": None,
    "ico": None,
}
SUPPORTED_LABELS = "JPEG, PNG, GIF, WebP, TIFF, AVIF, HEIC/HEIF, BMP, ICO"
# Animations are kept when the output holds them; other multi-image files (TIFF pages,
# HEIF/AVIF items) give their first image.
_ANIMATED = ("gif", "webp")
# Imported by the fork server of a worker serving the image steps before it forks
# (pipelines.registry.preload): libvips configured and its operations introspected,
# Pillow's JPEG, PNG and WebP plugins loaded, the other decoders' module defined (~25 ms
# of CPU a job would otherwise pay on the Pillow path, ~5 ms on the libvips path).
PRELOAD = ("pipelines.image_vips", "pipelines.image_pillow", "pipelines.image_decoders")
# TIFF Compression 6: "old-style" JPEG-in-TIFF, obsolete since 1992, a long line of
# libtiff CVEs, and left out of the libvips wheel's libtiff.
_TIFF_OLD_JPEG = 6


def detect(path: Path) -> sniff.Detected:
    """The sniffed type of ``path``, refused unless it is a supported image."""
    with path.open("rb") as file:
        detected = sniff.sniff(file.read(sniff.HEAD_BYTES))
        size = file.seek(0, os.SEEK_END)
        file.seek(max(0, size - sniff.ARCHIVE_TAIL_BYTES))
        tail = file.read()

        def read_at(offset: int, count: int) -> bytes:
            file.seek(offset)
            return file.read(count)

        compression = sniff.tiff_compression(read_at) if detected.kind == "tiff" else None
    if detected.kind == "empty":
        raise PipelineError("invalid_input", "the input file is empty")
    if detected.kind not in SUPPORTED:
        raise PipelineError(
            "unsupported_format",
            f"{detected.label} is not a supported image format (supported: {SUPPORTED_LABELS})",
        )
    if compression == _TIFF_OLD_JPEG:
        raise PipelineError(
            "unsupported_format",
            "TIFF with old-style JPEG compression (Compression=6) is not supported;"
            " re-save it with JPEG (7), LZW or Deflate compression",
        )
    if sniff.appended_archive(tail):
        raise PipelineError(
            "invalid_input", f"{detected.label} with a ZIP archive appended (a polyglot file)"
        )
    return detected


def open_input(path: Path, detected: sniff.Detected) -> ImageInput:
    """The decoder for a supported type, header read, no pixels decoded."""
    from pipelines.image_decoders import heic_input, pillow_input
    from pipelines.image_vips import vips_input

    loader = SUPPORTED[detected.kind]
    if loader is not None:
        return vips_input(path, detected.kind, loader)
    if detected.kind in ("heic", "heif"):
        return heic_input(path)
    return pillow_input(path, detected.kind)


def check_limits(header: Header, request: image_params.ImageRequest, animated: bool) -> None:
    """Refuse, before decoding, inputs over the request's pixel and frame limits."""
    declared = header.width * header.height
    if declared > request.max_source_pixels:
        raise PipelineError(
            "pixel_limit",
            f"{header.width}x{header.height} = {declared:,} pixels is over the limit"
            f" of {request.max_source_pixels:,} (max_source_pixels)",
        )
    frames = header.frames if animated else 1
    if frames > request.max_frames:
        raise PipelineError(
            "pixel_limit",
            f"{frames:,} frames is over the limit of {request.max_frames:,} (max_frames)",
        )
    shrink = jpeg_shrink(header, request) if header.jpeg_shrink else 1
    decoded = math.ceil(header.width / shrink) * math.ceil(header.height / shrink) * frames
    if decoded > request.max_pixels:
        scaled = f" at 1/{shrink} scale" if shrink > 1 else ""
        animation = f" x {frames:,} frames" if frames > 1 else ""
        raise PipelineError(
            "pixel_limit",
            f"{header.width}x{header.height}{animation} decodes to {decoded:,} pixels"
            f"{scaled}, over the limit of {request.max_pixels:,} (max_pixels)",
        )


def jpeg_shrink(header: Header, request: image_params.ImageRequest) -> int:
    """The DCT scale a JPEG is decoded at for ``request`` (1 for full-size steps)."""
    if request.width is None or request.height is None:
        return 1
    return dct_shrink(header, request.width, request.height, request.crop is not None)


def _finish(image: pyvips.Image, output_format: image_params.OutputFormat) -> pyvips.Image:
    """8-bit sRGB, or 8-bit grey where the output keeps grey; no alpha in JPEG."""
    grey = image.bands in (1, 2) and output_format.name != "avif"
    wanted = "b-w" if grey else "srgb"
    if image.format != "uchar" or image.interpretation != wanted:
        image = image.colourspace(wanted)
    if image.format != "uchar":
        image = image.cast("uchar")
    if output_format.name == "jpeg" and image.hasalpha():
        image = image.flatten(background=[255.0] * (image.bands - 1))
    return image


def save(
    image: pyvips.Image, path: Path, output_format: image_params.OutputFormat, quality: int
) -> None:
    """Encode ``image`` to ``path`` as ``output_format`` with no metadata at all.

    The sandbox's limits surface here as libvips errors: a file over
    ``RLIMIT_FSIZE`` (``max_output_bytes``) is ``output_limit``, memory or a thread
    refused is ``MemoryError`` (the sandbox's ``memory_limit``). Anything else stays a
    :class:`pyvips.Error`: libvips decodes while it encodes, so it may be the input's.
    """
    import pyvips

    import pipelines.image_vips  # noqa: F401  (libvips configured before any use)

    try:
        _save(image, path, output_format, quality)
    except pyvips.Error as exc:
        reason = " ".join(str(exc).split())
        if _FILE_TOO_LARGE in reason:
            raise PipelineError(
                "output_limit", f"the {output_format.name} output outgrew max_output_bytes"
            ) from None
        if any(marker in reason for marker in NO_MEMORY):
            raise MemoryError(f"libvips could not encode: {reason}") from None
        raise


_FILE_TOO_LARGE = os.strerror(errno.EFBIG)  # "File too large"
# What libvips says when memory (or a thread) is refused: the sandbox's memory_limit.
NO_MEMORY = (os.strerror(errno.ENOMEM), "out of memory", "unable to create thread")


def _save(
    image: pyvips.Image, path: Path, output_format: image_params.OutputFormat, quality: int
) -> None:
    import pyvips

    target = pyvips.Target.new_to_file(str(path))
    strip = pyvips.enums.ForeignKeep.NONE
    name = output_format.name
    if name == "jpeg":
        image.jpegsave_target(target, Q=quality, optimize_coding=True, keep=strip)
    elif name == "webp":
        image.webpsave_target(target, Q=quality, effort=4, keep=strip)
    elif name == "avif":
        # effort 2: a 7 MP photo in ~0.9 s on this machine; the default 4 takes ~1.5x.
        image.heifsave_target(target, Q=quality, compression="av1", effort=2, keep=strip)
    elif name == "png":
        image.pngsave_target(target, compression=6, keep=strip)
    elif name == "tiff":
        image.tiffsave_target(target, compression="deflate", predictor="horizontal", keep=strip)
    elif name == "gif":
        # The default (effort 7, full dithering) took 8.7 s on a 7 MP photo.
        image.gifsave_target(target, effort=4, dither=0.5, keep=strip)
    else:  # pragma: no cover - image_params.FORMATS lists exactly these
        raise AssertionError(name)


def run_step(
    operation: str, input_path: Path, params: Mapping[str, Any], workdir: Path
) -> list[Output]:
    """The common body of the four steps (see the module docstring)."""
    request = image_params.parse(operation, params)
    detected = detect(input_path)
    outputs = pillow_step(request, detected, input_path, workdir)
    if outputs is None:
        outputs = vips_step(request, detected, input_path, workdir)
    return outputs


def pillow_step(
    request: image_params.ImageRequest, detected: sniff.Detected, input_path: Path, workdir: Path
) -> list[Output] | None:
    """The step through Pillow (:mod:`pipelines.image_pillow`), or None where it
    declines the request or the file (nothing written then)."""
    from pipelines import image_pillow

    if not image_pillow.takes(detected.kind, request):
        return None
    assert request.width is not None and request.height is not None
    path = workdir / request.output_type
    source = image_pillow.jpeg_input(input_path)
    if source is None:
        return None
    try:
        header = source.header
        check_limits(header, request, False)
        picture = source.render(request.width, request.height)
        if picture is None:
            return None
        workdir.mkdir(parents=True, exist_ok=True)
        quality = request.quality or image_params.DEFAULT_QUALITY
        image_pillow.save(picture, path, request.format, quality)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    finally:
        source.close()
    _log_done(request, detected, header, "pillow")
    return [Output(request.output_type, path, request.format.content_type)]


def vips_step(
    request: image_params.ImageRequest, detected: sniff.Detected, input_path: Path, workdir: Path
) -> list[Output]:
    """The step through libvips (or the decoders that hand it pixels)."""
    import pyvips

    from pipelines.image_vips import clear_errors

    path = workdir / request.output_type
    clear_errors()
    try:
        source = open_input(input_path, detected)
        try:
            header = source.header
            animated = request.keeps_animation and detected.kind in _ANIMATED
            animated = animated and header.frames > 1
            check_limits(header, request, animated)
            if request.width is not None and request.height is not None:
                width, height = request.width, request.height
            else:
                width = height = max(header.width, header.height)
            image = _finish(source.render(width, height, request.crop, animated), request.format)
            workdir.mkdir(parents=True, exist_ok=True)
            save(image, path, request.format, request.quality or image_params.DEFAULT_QUALITY)
        finally:
            source.close()
    except (pyvips.Error, DecodeFailed) as exc:
        path.unlink(missing_ok=True)
        raise PipelineError(
            "invalid_input",
            f"cannot decode {detected.label}: {describe_error(exc, input_path, workdir)}",
        ) from exc
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    _log_done(request, detected, header, "libvips")
    return [Output(request.output_type, path, request.format.content_type)]


def _log_done(
    request: image_params.ImageRequest, detected: sniff.Detected, header: Header, library: str
) -> None:
    log.debug(
        "image %s: %s %dx%d -> %s (%s)",
        request.operation,
        detected.kind,
        header.width,
        header.height,
        request.output_type,
        library,
    )


@register("thumbnail", check=partial(image_params.parse, "thumbnail"), preload=PRELOAD)
def thumbnail(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """Fit inside ``width`` x ``height`` (or fill and ``crop``), first frame, never enlarged."""
    return run_step("thumbnail", input_path, params, workdir)


@register("resize", check=partial(image_params.parse, "resize"), preload=PRELOAD)
def resize(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """Fit inside ``width`` x ``height``, never enlarged."""
    return run_step("resize", input_path, params, workdir)


@register("compress", check=partial(image_params.parse, "compress"), preload=PRELOAD)
def compress(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """Re-encode at full size as JPEG, WebP or AVIF at ``quality``."""
    return run_step("compress", input_path, params, workdir)


@register("convert", check=partial(image_params.parse, "convert"), preload=PRELOAD)
def convert(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """Re-encode at full size as ``format`` (jpeg, png, webp, avif, tiff, gif)."""
    return run_step("convert", input_path, params, workdir)
