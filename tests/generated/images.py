"""Images of every supported format (and two the README refuses), drawn here.

libvips writes what it can (JPEG, PNG, GIF, WebP, TIFF, AVIF); Pillow and pillow-heif
write BMP, ICO and HEIC, which the libvips wheel does not save. Every picture is the
same asymmetric gradient with a disc on it, so a rotation or a colour inversion shows.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pyvips

from tests import error_inputs
from tests.generated.entries import Entry

# libvips' ForeignKeep flags: what metadata a saver keeps.
KEEP_NONE = int(pyvips.enums.ForeignKeep.NONE)
KEEP_EXIF = int(pyvips.enums.ForeignKeep.EXIF)
# The orientation pair: stored 400x300 with EXIF Orientation 6, and the same picture
# stored upright (300x400) to compare the step's rotation with.
STORED = (400, 300)
# Over the default max_pixels (100 Mpx): only shrink-on-load decodes it in bounds.
GIANT = (12_000, 8_400)
FRAMES = 6
FRAME_SIZE = 128


def picture(width: int, height: int) -> pyvips.Image:
    """An sRGB picture: red grows left to right, green top to bottom, a dark disc in the
    upper left third. Its mirror images and rotations all differ from it."""
    xy = pyvips.Image.xyz(width, height)
    red = xy[0] * (255 / width)
    green = xy[1] * (255 / height)
    blue = (xy[0] + xy[1]) * (128 / (width + height)) + 64
    bands: list[pyvips.Image | int | float] = [green, blue]
    image = red.bandjoin(bands)
    radius = min(width, height) / 5
    dx, dy = xy[0] - width / 3, xy[1] - height / 3
    inside = (dx * dx + dy * dy) < radius * radius
    dark: list[float] = [20.0, 20.0, 90.0]
    return inside.ifthenelse(dark, image).cast("uchar").copy(interpretation="srgb")


def _with(image: pyvips.Image, name: str, value: int) -> pyvips.Image:
    copy = image.copy()
    copy.set_type(pyvips.GValue.gint_type, name, value)
    return copy


def _alpha(width: int, height: int) -> pyvips.Image:
    """Opaque inside a centred circle, fully transparent outside it (the corners)."""
    xy = pyvips.Image.xyz(width, height)
    dx, dy = xy[0] - width / 2, xy[1] - height / 2
    radius = min(width, height) * 0.4
    return ((dx * dx + dy * dy) < radius * radius).ifthenelse(255, 0).cast("uchar")


def _sixteen(image: pyvips.Image) -> pyvips.Image:
    """8-bit bands spread over 16 bits (255 -> 65535)."""
    return (image.cast("ushort") * 257).cast("ushort")


def _pillow(image: pyvips.Image, path: Path, **options: Any) -> None:
    from PIL import Image

    with Image.open(io.BytesIO(image.pngsave_buffer())) as opened:
        opened.convert("RGB").save(path, **options)


def _heic(image: pyvips.Image, path: Path) -> None:
    import pillow_heif
    from PIL import Image

    pillow_heif.register_heif_opener()
    with Image.open(io.BytesIO(image.pngsave_buffer())) as opened:
        opened.convert("RGB").save(path, format="HEIF", quality=60)


def _animation(frames: list[pyvips.Image], delay_ms: int) -> pyvips.Image:
    strip = pyvips.Image.arrayjoin(frames, across=1).copy()
    strip.set_type(pyvips.GValue.gint_type, "page-height", frames[0].height)
    strip.set_type(pyvips.GValue.array_int_type, "delay", [delay_ms] * len(frames))
    strip.set_type(pyvips.GValue.gint_type, "loop", 0)
    return strip


def _gps_jpeg(path: Path) -> None:
    """A JPEG whose EXIF has a GPS IFD (where the photo was taken): Pillow writes it."""
    from PIL import Image

    exif = Image.Exif()
    exif[0x010F] = "hypermedia-tests"  # Make
    gps = exif.get_ifd(0x8825)
    gps.update({1: "N", 2: (52.0, 31.0, 12.0), 3: "E", 4: (13.0, 24.0, 36.0)})
    with Image.open(io.BytesIO(picture(64, 48).pngsave_buffer())) as opened:
        opened.convert("RGB").save(path, exif=exif, quality=85)


def build(directory: Path) -> list[Entry]:
    """Write the images into ``directory``/images; their manifest entries."""
    out = directory / "images"
    out.mkdir(parents=True, exist_ok=True)
    width, height = STORED
    photo = picture(width, height)
    upright = picture(width, height).rot("d90")
    _with(photo, "orientation", 6).jpegsave(str(out / "photo-orientation-6.jpg"), Q=90)
    upright.jpegsave(str(out / "photo-upright.jpg"), Q=90)
    _with(picture(200, 100), "orientation", 6).pngsave(
        str(out / "orientation-6.png"), keep=KEEP_EXIF
    )
    cmyk = picture(160, 120).icc_transform("cmyk")
    cmyk.jpegsave(str(out / "cmyk.jpg"), Q=90)
    cmyk.jpegsave(str(out / "cmyk-no-profile.jpg"), Q=90, keep=KEEP_NONE)
    picture(200, 150).bandjoin(_alpha(200, 150)).pngsave(str(out / "alpha.png"))
    rgba_16 = _sixteen(picture(64, 48).bandjoin(_alpha(64, 48))).copy(interpretation="rgb16")
    rgba_16.pngsave(str(out / "rgba-16bit.png"))
    grey = picture(60, 40).colourspace("b-w")[0].bandjoin(_alpha(60, 40))
    _sixteen(grey).copy(interpretation="grey16").pngsave(str(out / "grey-alpha-16bit.png"))
    rgba_16 = _sixteen(picture(50, 40).bandjoin(_alpha(50, 40))).copy(interpretation="rgb16")
    rgba_16.tiffsave(str(out / "rgba-16bit.tiff"), compression="deflate")
    frames = [picture(FRAME_SIZE, FRAME_SIZE).rot(a) for a in ("d0", "d90", "d180", "d270")]
    frames += [frames[0].flip("horizontal"), frames[0].flip("vertical")]
    assert len(frames) == FRAMES
    _animation(frames, 100).gifsave(str(out / "animated.gif"))
    picture(320, 200).webpsave(str(out / "banner.webp"), Q=75)
    picture(240, 180).tiffsave(str(out / "document.tiff"), compression="deflate")
    picture(200, 150).heifsave(str(out / "photo.avif"), compression="av1", Q=50)
    picture(160, 120).gifsave(str(out / "still.gif"))
    picture(320, 240).pngsave(str(out / "drawing.png"))
    picture(640, 480).jpegsave(str(out / "photo.jpg"), Q=85)
    _pillow(picture(200, 150), out / "drawing.bmp")
    _pillow(picture(48, 48), out / "favicon.ico", sizes=[(48, 48)])
    _heic(picture(400, 272), out / "phone.heic")
    _gps_jpeg(out / "gps.jpg")
    giant = pyvips.Image.xyz(*GIANT)
    ((giant[0] + giant[1]) * (255 / sum(GIANT))).cast("uchar").copy(interpretation="b-w").jpegsave(
        str(out / "giant.jpg"), Q=70
    )
    (out / "ojpeg-strip.tif").write_bytes(error_inputs.tiff_old_jpeg())
    (out / "logo.svg").write_bytes(error_inputs.svg())

    def image(name: str, kind: str, note: str) -> Entry:
        return Entry(f"images/{name}", f"image:{kind}", "valid", note)

    return [
        image("photo-orientation-6.jpg", "jpeg", f"{width}x{height}, EXIF Orientation=6"),
        image("photo-upright.jpg", "jpeg", "the same picture stored upright"),
        image("orientation-6.png", "png", "200x100 PNG, eXIf Orientation=6"),
        image("cmyk.jpg", "jpeg", "CMYK JPEG with an ICC profile"),
        image("cmyk-no-profile.jpg", "jpeg", "CMYK JPEG without a profile"),
        image("alpha.png", "png", "RGBA, transparent corners"),
        image("rgba-16bit.png", "png", "16-bit RGBA"),
        image("grey-alpha-16bit.png", "png", "16-bit grey + alpha"),
        image("rgba-16bit.tiff", "tiff", "16-bit RGBA TIFF"),
        image("animated.gif", "gif", f"{FRAMES} frames of {FRAME_SIZE}x{FRAME_SIZE}"),
        image("banner.webp", "webp", "lossy WebP"),
        image("document.tiff", "tiff", "deflate TIFF"),
        image("photo.avif", "avif", "AV1 in HEIF"),
        image("still.gif", "gif", "one frame"),
        image("drawing.png", "png", "RGB PNG"),
        image("photo.jpg", "jpeg", "baseline JPEG, 640x480"),
        image("drawing.bmp", "bmp", "24-bit BMP (Pillow)"),
        image("favicon.ico", "ico", "48x48 ICO (Pillow)"),
        image("phone.heic", "heic", "HEVC in HEIF (pillow-heif)"),
        image("gps.jpg", "jpeg", "EXIF with a GPS IFD"),
        image("giant.jpg", "jpeg", f"{GIANT[0]}x{GIANT[1]} grey: needs shrink-on-load"),
        image("ojpeg-strip.tif", "tiff", "old-style JPEG compression: unsupported_format"),
        image("logo.svg", "svg", "SVG: a type the README refuses"),
    ]
