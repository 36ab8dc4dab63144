"""Pillow for plain JPEGs shrunk to a box: the ``thumbnail`` and ``resize`` steps' fast path.

Measured on the corpus JPEGs (``bench/thumbnails.py``, one thread): libvips costs
~1.5 ms of fixed work per call where Pillow costs ~0.3 ms, and its per-call overhead
shows again in each encode; on photos the two decode at the same speed (the same
libjpeg-turbo and libwebp underneath). So :func:`jpeg_input` takes a JPEG the way the
libvips path would treat it and gives the same output:

- decoded at the DCT scale :func:`~pipelines.image_source.dct_shrink` picks
  (``Image.draft``), after the step checked the header against the pixel limits;
- fitted to the box with the sizes libvips' ``thumbnail_image`` computes (Lanczos,
  never enlarged), then turned upright by its EXIF orientation;
- the pixels as decoded: the libvips path converts only non-RGB/grey images to sRGB,
  so an RGB or grey JPEG's embedded ICC profile is dropped there too, not applied;
- encoded with the libvips path's settings and no metadata at all (no EXIF, XMP, ICC,
  comment).

A CMYK (or YCCK) JPEG without an ICC profile is colour managed as libvips manages it:
from libvips' own fallback CMYK profile ("Chemical proof", ArgyllCMS, public domain;
shipped as ``profiles/cmyk.icm.gz``) to sRGB, relative colorimetric, after the resize
(mean difference from the libvips path's pixels: 0.05 and 1.1 levels on the corpus's
two). Building that transform costs ~27 ms, as much as the whole job: it is built once
per process, and a fork server builds it before it forks (:func:`prepare_fork_server`),
so a job child only applies it (~1 ms on a thumbnail).

A truncated JPEG is decoded as libvips decodes it: libjpeg is handed an end-of-image
marker where the data ends and finishes the picture from what it has (the same pixels).

Anything else is declined (``None``) and goes to libvips: a CMYK JPEG with its own
profile, a file Pillow will not open or decode in full (libvips then gives its verdict
and message), one over Pillow's own decompression-bomb limit (libvips shrinks it on load
under our limits), crops, and outputs other than JPEG, WebP and PNG. pyvips is not
imported on this path: a job child that takes one never loads libvips.
"""

from __future__ import annotations

import errno
import functools
import gzip
import io
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageCms, ImageFile, JpegImagePlugin, PngImagePlugin, WebPImagePlugin

from pipelines import image_params
from pipelines.image_source import Header, dct_shrink
from pipelines.registry import PipelineError

# Imported here so that a fork server preloading this module has them (Image.open and
# save would import every plugin on first use otherwise).
_PLUGINS = (JpegImagePlugin, PngImagePlugin, WebPImagePlugin)
Image.preinit()  # the few plugins Image.open loads on its first call (BMP, GIF, PPM)
# What the libvips path would do with the pixels is plain decoding for these modes.
_MODES = ("RGB", "L")
# ... and for this one, without an embedded profile, its fallback profile to sRGB.
_CMYK = "CMYK"
# libvips' fallback CMYK profile, as pyvips.Image.profile_load("cmyk") gives it (the tests
# compare): shipped, so that converting a CMYK JPEG loads no libvips.
CMYK_PROFILE = Path(__file__).with_name("profiles") / "cmyk.icm.gz"
OUTPUT_FORMATS = ("jpeg", "webp", "png")
OPERATIONS = ("thumbnail", "resize")
_ORIENTATION_TAG = 0x0112
# EXIF orientation -> the transpose that makes the picture upright (as exif_transpose).
_UPRIGHT = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


def takes(kind: str, request: image_params.ImageRequest) -> bool:
    """Whether a file of sniffed ``kind`` may go this way for ``request`` (the file
    itself may still be declined by :func:`jpeg_input` or :meth:`JpegInput.render`)."""
    return (
        kind == "jpeg"
        and request.operation in OPERATIONS
        and request.crop is None
        and request.format.name in OUTPUT_FORMATS
        and request.width is not None
        and request.height is not None
    )


def fitted_size(width: int, height: int, box_width: int, box_height: int) -> tuple[int, int]:
    """The size libvips' ``thumbnail_image(box_width, height=box_height, size="down")``
    gives a ``width`` x ``height`` image: the larger shrink of the two axes, never below
    1, rounded half up."""
    shrink = max(1.0, width / box_width, height / box_height)
    return (
        max(1, int(width / min(shrink, width) + 0.5)),
        max(1, int(height / min(shrink, height) + 0.5)),
    )


@dataclass(slots=True)
class JpegInput:
    image: ImageFile.ImageFile
    header: Header
    orientation: int

    def render(self, width: int, height: int) -> Image.Image | None:
        """The picture fitted inside ``width`` x ``height`` and upright, or None when
        Pillow cannot decode it (the libvips path then decides)."""
        image = self.image
        shrink = dct_shrink(self.header, width, height, False)
        if shrink > 1:
            columns, rows = image.size
            wanted = (max(1, columns // shrink), max(1, rows // shrink))
            if image.draft(image.mode, wanted) is None:
                return None
        # A truncated file decodes as libvips decodes it (:func:`_reads_to_eoi`); one
        # that still wants data, or a broken one, is left to libvips' verdict.
        image.load_read = _reads_to_eoi(image)  # type: ignore[attr-defined]
        try:
            image.load()
        except MemoryError:
            raise
        except Exception:
            return None
        if image.mode not in (*_MODES, _CMYK):
            return None
        # libjpeg rounds a scaled size up, libvips' loader down (308 px at 1/4: 77 and
        # 57 rows from 231): its last partial row and column are left out here too.
        columns = self.header.width // shrink if shrink > 1 else image.width
        rows = self.header.height // shrink if shrink > 1 else image.height
        box = (height, width) if self.header.transposed else (width, height)
        size = fitted_size(columns, rows, *box)
        if size != image.size:
            picture = image.resize(
                size, Image.Resampling.LANCZOS, box=(0, 0, columns, rows), reducing_gap=2.0
            )
        else:
            picture = image
        if picture.mode == _CMYK:
            converted = ImageCms.applyTransform(picture, cmyk_to_srgb())
            if converted is None:  # only with inPlace=True
                raise AssertionError("ImageCms.applyTransform gave no image")
            picture = converted
        method = _UPRIGHT.get(self.orientation)
        if method is not None:
            picture = picture.transpose(method)
        picture.info = {}
        return picture

    def close(self) -> None:
        self.image.close()


def _reads_to_eoi(image: ImageFile.ImageFile) -> Callable[[int], bytes]:
    """The JPEG's data, then, where it ends, one end-of-image marker: what libvips'
    reader gives libjpeg at a premature end, so libjpeg finishes the picture from what
    it has, as in libvips. Past the marker the data stays empty: if libjpeg still wants
    more, Pillow says the file is truncated (LOAD_TRUNCATED_IMAGES stays off)."""
    assert image.fp is not None, "an open image"
    read = image.fp.read
    ended = False

    def load_read(size: int) -> bytes:
        nonlocal ended
        data: bytes = read(size)
        if not data and not ended:
            ended = True
            return b"\xff\xd9"
        return data

    return load_read


@functools.cache
def cmyk_to_srgb() -> ImageCms.ImageCmsTransform:
    """libvips' fallback CMYK profile to sRGB, as its thumbnail converts a CMYK image
    without a profile (relative colorimetric, no black point compensation)."""
    with gzip.open(CMYK_PROFILE) as packed:
        cmyk = ImageCms.ImageCmsProfile(io.BytesIO(packed.read()))
    return ImageCms.buildTransform(
        cmyk,
        ImageCms.createProfile("sRGB"),
        "CMYK",
        "RGB",
        renderingIntent=ImageCms.Intent.RELATIVE_COLORIMETRIC,
    )


def prepare_fork_server() -> None:
    """Called by a fork server that preloads this module, before it forks: the CMYK
    transform, built once there, is every job child's."""
    cmyk_to_srgb()


def jpeg_input(path: Path) -> JpegInput | None:
    """The header of a plain (RGB, grey, or CMYK without a profile) JPEG, no pixels
    decoded; None for anything this path leaves to libvips."""
    with warnings.catch_warnings():
        # Our own limits apply (the step checks the header); over Pillow's hard limit
        # (2 x MAX_IMAGE_PIXELS) it raises, and libvips takes the file. Pillow's other
        # warnings (corrupt EXIF, a malformed MPO) say nothing the job can act on.
        warnings.simplefilter("ignore")
        return _open(path)


def _open(path: Path) -> JpegInput | None:
    try:
        image = Image.open(path, formats=["JPEG"])
    except MemoryError:
        raise
    except Exception:
        return None
    try:
        own_profile = image.mode == _CMYK and image.info.get("icc_profile")
        if image.mode not in (*_MODES, _CMYK) or own_profile or len(image.tile) != 1:
            image.close()
            return None
        value = image.getexif().get(_ORIENTATION_TAG, 1)
    except MemoryError:
        image.close()
        raise
    except Exception:
        image.close()
        return None
    # libvips takes anything but 1-8 as 1 (vips_image_get_orientation).
    orientation = value if isinstance(value, int) and 1 <= value <= 8 else 1
    progressive = bool(image.info.get("progressive") or image.info.get("progression"))
    width, height = image.size
    header = Header(
        width=width,
        height=height,
        jpeg_shrink=not progressive,
        transposed=orientation in (5, 6, 7, 8),
    )
    return JpegInput(image=image, header=header, orientation=orientation)


def save(
    picture: Image.Image, path: Path, output_format: image_params.OutputFormat, quality: int
) -> None:
    """Encode as the libvips path does (:func:`pipelines.images.save`): the same
    quality, effort and subsampling, no metadata; a file over ``RLIMIT_FSIZE`` is
    ``output_limit``."""
    name = output_format.name
    try:
        if name == "jpeg":
            # libvips' jpegsave subsamples chroma (4:2:0) below Q 90, not from 90 up.
            subsampling = "4:4:4" if quality >= 90 else "4:2:0"
            picture.save(path, "JPEG", quality=quality, optimize=True, subsampling=subsampling)
        elif name == "webp":
            picture.save(path, "WEBP", quality=quality, method=4)
        elif name == "png":
            picture.save(path, "PNG", compress_level=6)
        else:  # pragma: no cover - takes() lets only OUTPUT_FORMATS through
            raise AssertionError(name)
    except OSError as exc:
        if exc.errno == errno.EFBIG:
            raise PipelineError(
                "output_limit", f"the {name} output outgrew max_output_bytes"
            ) from None
        if exc.errno == errno.ENOMEM:
            raise MemoryError(f"Pillow could not encode: {exc}") from None
        raise
