"""Decoders for the formats the libvips wheel cannot decode, handing pixels to libvips.

- HEIC/HEIF: pillow-heif (libheif + libde265). libheif applies the HEIF transforms
  (``irot``/``imir``) while decoding, and the HEIF spec makes those, not EXIF, the
  orientation: the pixels come out upright and no EXIF is attached.
- BMP and ICO: Pillow, restricted to that one format's plugin (``formats=[...]``), so a
  file sniffed as BMP is never handed to another Pillow decoder. ICO gives its largest
  icon.

Both read the header (size) when opened and decode pixels only in ``render``. Their
errors become :class:`~pipelines.image_source.DecodeFailed`; a ``MemoryError`` is left
alone (the sandbox's memory limit at work, not a property of the file).

Both libraries are imported on first use: together they add ~7 MB of RSS to every
worker child, and most images are JPEG, PNG or WebP.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pyvips

from pipelines.image_source import DecodeFailed, Header, ImageInput
from pipelines.image_vips import fit
from pipelines.registry import PipelineError

if TYPE_CHECKING:
    from PIL import Image


@functools.cache
def _pillow_heif() -> ModuleType:
    import pillow_heif

    # Process-wide, like the libvips settings: one decode thread per worker child, and
    # none of the auxiliary images (depth maps, thumbnails) parsed.
    pillow_heif.options.DECODE_THREADS = 1
    pillow_heif.options.THUMBNAILS = False
    pillow_heif.options.DEPTH_IMAGES = False
    pillow_heif.options.AUX_IMAGES = False
    return pillow_heif


_PILLOW_FORMATS = {"bmp": "BMP", "ico": "ICO"}
_BANDS = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4}


def _from_memory(data: bytes, width: int, height: int, mode: str, stride: int) -> pyvips.Image:
    bands = _BANDS.get(mode)
    if bands is None:
        raise DecodeFailed(f"unexpected pixel layout {mode}")
    row = width * bands
    if stride != row:
        data = b"".join(data[y * stride : y * stride + row] for y in range(height))
    image = pyvips.Image.new_from_memory(data, width, height, bands, "uchar")
    return image.copy(interpretation="b-w" if bands <= 2 else "srgb")


@dataclass(frozen=True, slots=True)
class _HeicInput:
    heif: Any  # pillow_heif.HeifFile: pixels decoded on first access to .data
    header: Header

    def render(self, width: int, height: int, crop: str | None, animated: bool) -> pyvips.Image:
        heif = self.heif
        try:
            data = heif.data
            image = _from_memory(bytes(data), heif.size[0], heif.size[1], heif.mode, heif.stride)
        except (MemoryError, DecodeFailed):
            raise
        except Exception as exc:  # libheif errors arrive as several Python types
            raise DecodeFailed(str(exc)) from exc
        if heif.has_alpha and heif.premultiplied_alpha:
            image = image.unpremultiply().cast("uchar")
        icc = heif.info.get("icc_profile")
        if icc:
            image = image.copy()
            # The stubs leave out bytes, which blob_type takes.
            image.set_type(pyvips.GValue.blob_type, "icc-profile-data", bytes(icc))  # type: ignore[arg-type]
        return fit(image, width, height, crop)

    def close(self) -> None:
        pass


def heic_input(path: Path) -> ImageInput:
    try:
        heif = _pillow_heif().open_heif(path, convert_hdr_to_8bit=True)
        if len(heif) == 0:
            raise DecodeFailed("no decodable image in the HEIF file")
        width, height = heif.size
    except (MemoryError, DecodeFailed):
        raise
    except Exception as exc:
        # pillow-heif raises ValueError, RuntimeError, IndexError (no image) ...
        raise DecodeFailed(str(exc) or type(exc).__name__) from exc
    return _HeicInput(heif=heif, header=Header(width=width, height=height))


@dataclass(frozen=True, slots=True)
class _PillowInput:
    image: Image.Image
    header: Header

    def render(self, width: int, height: int, crop: str | None, animated: bool) -> pyvips.Image:
        try:
            self.image.load()
            picture = self.image
            if picture.mode not in _BANDS:
                keep_alpha = "A" in picture.getbands() or "transparency" in picture.info
                picture = picture.convert("RGBA" if keep_alpha else "RGB")
            data = picture.tobytes()
        except MemoryError:
            raise
        except Exception as exc:
            raise DecodeFailed(str(exc) or type(exc).__name__) from exc
        finally:
            self.image.close()
        columns, rows = picture.size
        stride = columns * _BANDS[picture.mode]
        return fit(_from_memory(data, columns, rows, picture.mode, stride), width, height, crop)

    def close(self) -> None:
        self.image.close()


def pillow_input(path: Path, kind: str) -> ImageInput:
    from PIL import Image

    name = _PILLOW_FORMATS[kind]
    try:
        image = Image.open(path, formats=[name])
    except Image.DecompressionBombError as exc:
        # Pillow's own bomb guard (2 x Image.MAX_IMAGE_PIXELS), before our limits.
        raise PipelineError(
            "pixel_limit", f"{name} header declares too many pixels: {exc}"
        ) from exc
    except MemoryError:
        raise
    except Exception as exc:
        raise DecodeFailed(str(exc) or type(exc).__name__) from exc
    width, height = image.size
    return _PillowInput(image=image, header=Header(width=width, height=height))
