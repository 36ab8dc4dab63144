"""pipelines.media.output_size: the size the video step's scaler makes, within what
libx264 encodes (at most 16384 pixels a side)."""

from __future__ import annotations

import random

import pytest

from pipelines.media import MAX_HEIGHT, MAX_SIDE, Stream, output_size


def before(width: int, height: int, max_height: int) -> tuple[int, int]:
    """The scaler's size before the width was bounded: max(2, even(min(ih, height)))
    high, as wide as that keeps the aspect, rounded to even (FFmpeg's av_rescale)."""
    high = max(2, min(height, max_height) // 2 * 2)
    return (high * width + height) // (2 * height) * 2, high


@pytest.mark.parametrize(
    ("size", "max_height", "made"),
    [
        ((17000, 64), 720, (15938, 60)),  # libx264 refused 17000x64
        ((16384, 64), 720, (16384, 64)),
        ((32769, 4), 720, (16384, 2)),
        ((17000, 4), 720, (8500, 2)),
        ((1920, 1080), 720, (1280, 720)),
        ((1080, 1920), 720, (406, 720)),
        ((320, 1), 720, (640, 2)),  # as before: 2 high at least
        ((40000, 2), 720, (40000, 2)),  # no height keeps its shape under 16384 wide
        ((2, 17000), 720, (0, 720)),  # under a pixel wide
    ],
)
def test_output_size(size: tuple[int, int], max_height: int, made: tuple[int, int]) -> None:
    assert output_size(*size, max_height) == made


def test_every_size_that_fitted_is_made_as_before() -> None:
    # Bounding the width changed nothing libx264 took: normal outputs are unchanged.
    rng = random.Random(7)
    sizes = [(rng.randint(1, 70000), rng.randint(1, 5000)) for _ in range(20000)]
    sizes += [(w, h) for w in range(16300, 16500) for h in (1, 2, 3, 4, 63, 64, 65)]
    for width, height in sizes:
        for max_height in (16, 145, 720, MAX_HEIGHT):
            old = before(width, height, max_height)
            new = output_size(width, height, max_height)
            if 0 < old[0] <= MAX_SIDE:
                assert new == old, (width, height, max_height)
            elif 0 < new[0] <= MAX_SIDE:  # refused before, made now: smaller, same shape
                assert new[1] <= old[1]
                assert new[0] / new[1] == pytest.approx(width / height, rel=2 / new[1])


def test_a_quarter_turn_swaps_the_shown_size() -> None:
    stream = Stream(0, "video", "h264", "avc1", 64, 17000, 0, False)
    assert stream.shown == (64, 17000)
    for rotation, shown in [(90, (17000, 64)), (-90, (17000, 64)), (180, (64, 17000))]:
        turned = Stream(0, "video", "h264", "avc1", 64, 17000, 0, False, rotation=rotation)
        assert turned.shown == shown
