"""What the image steps need from a decoder: a header first, pixels on request.

:class:`ImageInput` is the contract the libvips, pillow-heif and Pillow decoders share
(:mod:`pipelines.images`, :mod:`pipelines.image_decoders`): reading ``header`` decodes
no pixels, so the limits are checked before ``render`` decodes any.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import pyvips

_MAX_MESSAGE = 300


@dataclass(frozen=True, slots=True)
class Header:
    width: int
    height: int
    # Frames or pages in the file (1 for still images).
    frames: int = 1
    # Whether the decoder can decode at 1/2, 1/4, 1/8 scale (baseline JPEG).
    jpeg_shrink: bool = False
    # EXIF orientation 5-8: width and height swap when turned upright.
    transposed: bool = False

    @property
    def size(self) -> tuple[int, int]:
        return self.width, self.height


class ImageInput(Protocol):
    @property
    def header(self) -> Header: ...

    def render(self, width: int, height: int, crop: str | None, animated: bool) -> pyvips.Image:
        """A pyvips image fitting ``width`` x ``height`` (filling it and cropping when
        ``crop`` names a libvips "interesting" mode), upright, never enlarged; all
        frames stacked (libvips ``page-height``) when ``animated``, else the first."""
        ...

    def close(self) -> None:
        """Release the file (also when ``render`` was never called)."""
        ...


class DecodeFailed(Exception):
    """A decoder refused the input (turned into ``invalid_input`` by the step)."""


def describe_error(exc: BaseException, *paths: Path) -> str:
    """A decoder's message on one line, without our paths (the user sees it)."""
    lines: list[str] = []
    for raw in str(exc).splitlines():
        line = raw.strip()
        for path in paths:
            line = line.replace(str(path), "<file>")
        # pyvips prefixes "unable to call <operation>": noise for the user.
        if line and not line.startswith("unable to call") and line not in lines:
            lines.append(line)
    message = "; ".join(lines) or "the decoder rejected it"
    return message if len(message) <= _MAX_MESSAGE else message[: _MAX_MESSAGE - 3] + "..."
