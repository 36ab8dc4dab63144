"""libvips for the image steps: process settings, and the decoder for what it loads.

:func:`configure_libvips` runs when this module is imported (libvips settings are
per process; a worker child imports the pipelines once and runs one job):

- ``block_untrusted_set(True)``: loaders libvips flags as unsafe for untrusted input
  (SVG, CSV, matrix-like text, raw, vips native, ImageMagick, ...) are blocked. It
  exists since libvips 8.13 and is a silent no-op before, so older libvips is refused.
- every ``VipsForeignLoad`` class blocked, then only the six the steps use unblocked
  (JPEG, PNG, GIF, WebP, TIFF, HEIF/AVIF): an allowlist, so a loader added by a newer
  libvips stays blocked; the risky ones are also named (:data:`RISKY_LOADERS`).
- no operation cache (one file per child), one worker thread unless
  ``VIPS_CONCURRENCY`` is set (the worker runs several children side by side).

:func:`vips_input` reads the header with the loader libvips picks among the allowed
ones and checks it is the one the sniffed type calls for; ``render`` then goes through
``thumbnail_source``, which shrinks on load (WebP scaling, HEIF embedded thumbnails)
and turns the image upright; JPEGs to be shrunk are loaded at the DCT scale
:func:`~pipelines.image_source.dct_shrink` picks, then ``thumbnail_image``. Sources,
never file names: libvips reads ``name.jpg[options]`` out of a file name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pyvips

from pipelines.image_source import DecodeFailed, Header, ImageInput, dct_shrink

# Loader classes the steps use; every other loader is blocked.
ALLOWED_LOADERS = (
    "VipsForeignLoadJpeg",
    "VipsForeignLoadPng",
    "VipsForeignLoadNsgif",
    "VipsForeignLoadWebp",
    "VipsForeignLoadTiff",
    "VipsForeignLoadHeif",
)
# Blocked by the base-class block already; named so the intent survives a libvips with
# a different class tree, and because libvips flags only some of them untrusted.
RISKY_LOADERS = (
    "VipsForeignLoadSvg",  # librsvg: XML, external references
    "VipsForeignLoadPdf",  # poppler / pdfium
    "VipsForeignLoadMagick",  # ImageMagick: every format it knows, and delegates
    "VipsForeignLoadMagick7",
    "VipsForeignLoadOpenexr",
    "VipsForeignLoadMatrix",  # text: almost anything parses as something
    "VipsForeignLoadCsv",
    "VipsForeignLoadVips",  # native format: trusts its own header
    "VipsForeignLoadFits",
    "VipsForeignLoadNifti",
    "VipsForeignLoadOpenslide",
    "VipsForeignLoadAnalyze",
    "VipsForeignLoadRaw",
    "VipsForeignLoadPpm",
    "VipsForeignLoadRad",
    "VipsForeignLoadMat",
    "VipsForeignLoadJxl",
    "VipsForeignLoadJp2k",
    "VipsForeignLoadUhdr",  # Ultra HDR gain maps: the SDR JPEG underneath is enough
    "VipsForeignLoadDcRaw",
)


def configure_libvips() -> None:
    """Apply the process-wide settings above (idempotent)."""
    if not pyvips.at_least_libvips(8, 13):
        raise RuntimeError(
            f"libvips {pyvips.version(0)}.{pyvips.version(1)} cannot block untrusted"
            " loaders (needs >= 8.13)"
        )
    pyvips.block_untrusted_set(True)
    pyvips.operation_block_set("VipsForeignLoad", True)
    for name in ALLOWED_LOADERS:
        pyvips.operation_block_set(name, False)
    for name in RISKY_LOADERS:
        pyvips.operation_block_set(name, True)
    pyvips.cache_set_max(0)
    pyvips.cache_set_max_mem(0)
    pyvips.cache_set_max_files(0)
    if not os.environ.get("VIPS_CONCURRENCY"):
        pyvips.concurrency_set(1)  # type: ignore[attr-defined]  # in pyvips, not its stubs


configure_libvips()

# What the image steps, pdf_preview and ocr call through pyvips. pyvips introspects an
# operation (its arguments, their types and flags: some 40 GObject calls) the first time
# a process calls it and keeps that; a job child is a fresh copy of its fork server, so
# each one would introspect again what it calls (~1.5 ms a job). The loaders appear
# under their class names (``new_from_source``) and their nicknames (``vips-loader``).
STEP_OPERATIONS = (
    *(f"{name}Source" for name in ALLOWED_LOADERS),
    *(f"{nick}load_source" for nick in ("jpeg", "png", "gif", "webp", "tiff", "heif")),
    "thumbnail_source",
    "thumbnail_image",
    "flatten",
    "colourspace",
    "cast",
    "copy",
    "unpremultiply",
    "profile_load",
    *(f"{nick}save_target" for nick in ("jpeg", "png", "webp", "gif", "heif", "tiff")),
    "crop",  # pdf_preview's
    "extract_band",
    "bandjoin",  # ocr's
    "rot90",
)


def prepare_fork_server() -> None:
    """Called by a fork server that preloads this module, before it forks: pyvips'
    introspection of :data:`STEP_OPERATIONS`, done once there, is every job child's.
    Introspection builds no image and runs nothing: no libvips thread starts, so the
    server stays single-threaded. An operation this libvips lacks is skipped."""
    from pyvips.voperation import Introspect

    for name in STEP_OPERATIONS:
        try:
            Introspect.get(name)
        except pyvips.Error:
            continue


def clear_errors() -> None:
    """Empty libvips' per-process error log: warnings from an earlier file (a truncated
    JPEG that still decoded) would otherwise prefix the next file's errors."""
    pyvips.vips_lib.vips_error_clear()


def fit(image: pyvips.Image, width: int, height: int, crop: str | None) -> pyvips.Image:
    """``thumbnail_image`` for decoded pixels: fit (or fill and crop), never enlarge."""
    return image.thumbnail_image(width, height=height, size="down", crop=crop or "none")


@dataclass(frozen=True, slots=True)
class _VipsInput:
    path: Path
    loader: str
    header: Header
    # AVIF sequences (major brand ``avis``) are not auto-detected: load explicitly.
    explicit_heif: bool

    def render(self, width: int, height: int, crop: str | None, animated: bool) -> pyvips.Image:
        if self.explicit_heif:
            loaded = pyvips.Image.heifload_source(_source(self.path), access="sequential")
            return fit(loaded, width, height, crop)
        shrink = dct_shrink(self.header, width, height, crop is not None)
        if self.loader == "jpegload" and shrink > 1:
            loaded = pyvips.Image.jpegload_source(
                _source(self.path), shrink=shrink, access="sequential"
            )
            check_loader(loaded, self.loader)
            return fit(loaded, width, height, crop)
        image = pyvips.Image.thumbnail_source(
            _source(self.path),
            width,
            option_string="n=-1" if animated else "",
            height=height,
            size="down",
            crop=crop or "none",
        )
        check_loader(image, self.loader)
        return image

    def close(self) -> None:
        pass


def _source(path: Path) -> pyvips.Source:
    return pyvips.Source.new_from_file(str(path))


def _meta_int(image: pyvips.Image, name: str, default: int) -> int:
    value = image.get(name) if image.get_typeof(name) else default
    return value if isinstance(value, int) else default


def check_loader(image: pyvips.Image, expected: str) -> None:
    """Refuse pixels from any loader but ``expected`` (a nickname such as ``jpegload``)."""
    used = image.get("vips-loader") if image.get_typeof("vips-loader") else ""
    if not str(used).startswith(expected):
        raise DecodeFailed(f"decoded by {used or 'an unknown loader'}, expected {expected}")


def vips_input(path: Path, kind: str, loader: str) -> ImageInput:
    """The header of a file of sniffed ``kind`` that libvips' ``loader`` decodes."""
    explicit_heif = kind == "avifs"
    if explicit_heif:
        image = pyvips.Image.heifload_source(_source(path), access="sequential")
    else:
        image = pyvips.Image.new_from_source(_source(path), "", access="sequential")
        check_loader(image, loader)
    return _VipsInput(
        path=path,
        loader=loader,
        header=Header(
            width=image.width,
            height=image.height,
            frames=_meta_int(image, "n-pages", 1),
            # libjpeg decodes a baseline JPEG at 1/2, 1/4 or 1/8 scale; a progressive
            # one keeps every coefficient at full size whatever the scale.
            jpeg_shrink=kind == "jpeg" and not _meta_int(image, "interlaced", 0),
            transposed=_meta_int(image, "orientation", 1) in (5, 6, 7, 8),
        ),
        explicit_heif=explicit_heif,
    )
