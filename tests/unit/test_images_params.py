"""pipelines.image_params: validation and output type names; the limit arithmetic."""

from __future__ import annotations

import pytest

from pipelines import image_params
from pipelines.image_source import Header
from pipelines.images import check_limits, jpeg_shrink
from pipelines.registry import PipelineError

THUMB = {"width": 320, "height": 320, "format": "webp", "quality": 80}
RESIZE = {"width": 1600, "height": 1600, "format": "jpeg", "quality": 85}


@pytest.mark.parametrize(
    ("operation", "params", "output_type", "content_type"),
    [
        ("thumbnail", THUMB, "thumbnail-320x320-q80.webp", "image/webp"),
        ("thumbnail", {**THUMB, "quality": 81}, "thumbnail-320x320-q81.webp", "image/webp"),
        ("thumbnail", {**THUMB, "width": 640}, "thumbnail-640x320-q80.webp", "image/webp"),
        ("thumbnail", {**THUMB, "crop": True}, "thumbnail-320x320-crop-q80.webp", "image/webp"),
        ("thumbnail", {**THUMB, "crop": "center"}, "thumbnail-320x320-crop-q80.webp", "image/webp"),
        (
            "thumbnail",
            {**THUMB, "crop": "attention"},
            "thumbnail-320x320-crop-attention-q80.webp",
            "image/webp",
        ),
        (
            "thumbnail",
            {**THUMB, "crop": "Entropy"},
            "thumbnail-320x320-crop-entropy-q80.webp",
            "image/webp",
        ),
        ("thumbnail", {**THUMB, "crop": False}, "thumbnail-320x320-q80.webp", "image/webp"),
        ("thumbnail", {**THUMB, "crop": "none"}, "thumbnail-320x320-q80.webp", "image/webp"),
        # Lossless formats ignore a quality merged in from the profile.
        ("thumbnail", {**THUMB, "format": "png"}, "thumbnail-320x320.png", "image/png"),
        ("thumbnail", {**THUMB, "format": "gif"}, "thumbnail-320x320.gif", "image/gif"),
        ("thumbnail", {**THUMB, "format": "avif"}, "thumbnail-320x320-q80.avif", "image/avif"),
        ("resize", RESIZE, "resize-1600x1600-q85.jpg", "image/jpeg"),
        ("resize", {**RESIZE, "format": "jpg"}, "resize-1600x1600-q85.jpg", "image/jpeg"),
        ("resize", {**RESIZE, "format": "tif"}, "resize-1600x1600.tiff", "image/tiff"),
        ("compress", {"format": "webp", "quality": 75}, "compress-q75.webp", "image/webp"),
        ("compress", {"format": "jpeg", "quality": 60}, "compress-q60.jpg", "image/jpeg"),
        ("compress", {"format": "avif"}, "compress-q80.avif", "image/avif"),
        ("convert", {"format": "png"}, "convert.png", "image/png"),
        ("convert", {"format": "png", "quality": 50}, "convert.png", "image/png"),
        ("convert", {"format": "jpeg"}, "convert-q80.jpg", "image/jpeg"),
        ("convert", {"format": "jpeg", "quality": 90}, "convert-q90.jpg", "image/jpeg"),
        ("convert", {"format": "tiff"}, "convert.tiff", "image/tiff"),
        ("convert", {"format": "gif"}, "convert.gif", "image/gif"),
        ("convert", {"format": "webp", "max_pixels": 5}, "convert-q80.webp", "image/webp"),
    ],
)
def test_output_type_names_the_effective_params(operation, params, output_type, content_type):
    request = image_params.parse(operation, params)
    assert request.output_type == output_type
    assert request.format.content_type == content_type


def test_different_requests_never_share_an_output_type():
    variants = [
        ("thumbnail", {**THUMB, **change})
        for change in (
            {},
            {"width": 321},
            {"height": 321},
            {"quality": 79},
            {"format": "jpeg"},
            {"format": "png"},
            {"crop": True},
            {"crop": "attention"},
            {"crop": "entropy"},
        )
    ] + [
        ("resize", RESIZE),
        ("resize", {**RESIZE, "quality": 86}),
        ("compress", {"format": "jpeg", "quality": 85}),
        ("convert", {"format": "jpeg", "quality": 85}),
        ("convert", {"format": "png"}),
        ("convert", {"format": "tiff"}),
    ]
    names = [image_params.parse(op, params).output_type for op, params in variants]
    assert len(set(names)) == len(names)


def test_the_same_request_always_gets_the_same_name():
    first = image_params.parse("thumbnail", dict(THUMB))
    again = image_params.parse("thumbnail", dict(reversed(list(THUMB.items()))))
    assert first == again
    assert first.output_type == again.output_type


def test_limits_are_parsed_with_defaults():
    request = image_params.parse("convert", {"format": "png"})
    assert request.max_pixels == image_params.DEFAULT_MAX_PIXELS == 100_000_000
    assert request.max_source_pixels == image_params.DEFAULT_MAX_SOURCE_PIXELS
    assert request.max_frames == image_params.DEFAULT_MAX_FRAMES
    custom = image_params.parse(
        "convert", {"format": "png", "max_pixels": 10, "max_source_pixels": 20, "max_frames": 3}
    )
    assert (custom.max_pixels, custom.max_source_pixels, custom.max_frames) == (10, 20, 3)


@pytest.mark.parametrize(
    ("operation", "params", "message"),
    [
        ("thumbnail", {**THUMB, "colour": "red"}, "unknown parameter(s) colour"),
        ("thumbnail", {**THUMB, "Width": 10}, "unknown parameter(s) Width"),
        ("resize", {**RESIZE, "crop": True}, "unknown parameter(s) crop"),
        ("compress", {"format": "webp", "width": 10}, "unknown parameter(s) width"),
        ("convert", {"format": "png", "height": 10}, "unknown parameter(s) height"),
        ("thumbnail", {"height": 10, "format": "webp"}, "missing parameter(s) width"),
        ("thumbnail", {"width": 10, "height": 10}, "missing parameter(s) format"),
        ("thumbnail", {**THUMB, "width": None}, "missing parameter(s) width"),
        ("convert", {}, "missing parameter(s) format"),
        ("thumbnail", {**THUMB, "width": 0}, "width must be in 1..16384"),
        ("thumbnail", {**THUMB, "height": 16385}, "height must be in 1..16384"),
        ("thumbnail", {**THUMB, "width": -5}, "width must be in"),
        ("thumbnail", {**THUMB, "width": "320"}, "width must be an integer"),
        ("thumbnail", {**THUMB, "width": 320.0}, "width must be an integer"),
        ("thumbnail", {**THUMB, "width": True}, "width must be an integer"),
        ("thumbnail", {**THUMB, "quality": 0}, "quality must be in 1..100"),
        ("thumbnail", {**THUMB, "quality": 101}, "quality must be in 1..100"),
        ("thumbnail", {**THUMB, "quality": "high"}, "quality must be an integer"),
        ("thumbnail", {**THUMB, "format": "bmp"}, "format must be one of"),
        ("thumbnail", {**THUMB, "format": "WEBP"}, "format must be one of"),
        ("thumbnail", {**THUMB, "format": "svg"}, "format must be one of"),
        ("thumbnail", {**THUMB, "format": 3}, "format must be one of"),
        ("compress", {"format": "png"}, "format must be one of jpeg, webp, avif"),
        ("compress", {"format": "gif"}, "format must be one of jpeg, webp, avif"),
        ("thumbnail", {**THUMB, "crop": "smart"}, "crop must be"),
        ("thumbnail", {**THUMB, "crop": 1}, "crop must be"),
        ("convert", {"format": "png", "max_pixels": 0}, "max_pixels must be in"),
        ("convert", {"format": "png", "max_frames": "10"}, "max_frames must be an integer"),
        ("sharpen", {"format": "png"}, "no image operation 'sharpen'"),
    ],
)
def test_bad_params_are_invalid_params(operation, params, message):
    with pytest.raises(PipelineError) as caught:
        image_params.parse(operation, params)
    assert caught.value.code == "invalid_params"
    assert message in caught.value.message
    assert not caught.value.retryable


def test_animation_is_kept_only_where_the_output_holds_it():
    box: dict[str, object] = {"width": 9, "height": 9}
    keeps = {
        (op, fmt): image_params.parse(
            op, {"format": fmt, **(box if op in ("thumbnail", "resize") else {})}
        ).keeps_animation
        for op in ("thumbnail", "resize", "convert")
        for fmt in ("gif", "webp", "png", "jpeg", "avif")
    }
    assert {key for key, kept in keeps.items() if kept} == {
        ("resize", "gif"),
        ("resize", "webp"),
        ("convert", "gif"),
        ("convert", "webp"),
    }


# --- limits, checked on the header before decoding ---------------------------------


def _request(operation="thumbnail", **params):
    bases: dict[str, dict[str, object]] = {
        "thumbnail": THUMB,
        "resize": RESIZE,
        "convert": {"format": "png"},
    }
    base = bases[operation]
    return image_params.parse(operation, {**base, **params})


@pytest.mark.parametrize(
    ("header", "operation", "shrink"),
    [
        (Header(20000, 14000, jpeg_shrink=True), "thumbnail", 8),  # 62.5x
        (Header(20000, 14000, jpeg_shrink=True), "resize", 8),  # 12.5x
        (Header(6400, 4000, jpeg_shrink=True), "resize", 4),  # 4x: fit by the width
        (Header(6000, 4000, jpeg_shrink=True), "resize", 2),  # 3.75x
        (Header(3000, 2000, jpeg_shrink=True), "resize", 1),  # 1.9x
        (Header(3200, 2000, jpeg_shrink=True), "resize", 2),  # 2x exactly
        (Header(5120, 640, jpeg_shrink=True), "thumbnail", 8),  # fit: 16x by the width
        (Header(640, 5120, transposed=True, jpeg_shrink=True), "thumbnail", 8),
        (Header(640, 5120, jpeg_shrink=True), "thumbnail", 8),
        (Header(4000, 3000, jpeg_shrink=True), "convert", 1),
    ],
)
def test_jpeg_decodes_at_the_smallest_scale_that_still_covers_the_box(header, operation, shrink):
    request = _request(operation)
    assert jpeg_shrink(header, request) == shrink
    if request.width is not None and request.height is not None:
        columns, rows = (header.height, header.width) if header.transposed else header.size
        scale = max(columns / request.width, rows / request.height)
        # Decoded at 1/shrink, the image still covers the output (1/scale) ...
        assert shrink <= scale
        # ... and the next scale down would not.
        assert shrink == 8 or shrink * 2 > scale


def test_jpeg_shrink_when_cropping_uses_the_short_side():
    # Filling 320x320 from 5120x640 needs the full 320 rows: 2x at most.
    assert jpeg_shrink(Header(5120, 640, jpeg_shrink=True), _request(crop=True)) == 2


@pytest.mark.parametrize(
    ("header", "operation", "animated", "params", "refused"),
    [
        # The corpus' 280 MP grey JPEG: fine for thumbnails (1/8 scale), not at full size.
        (Header(20000, 14000, jpeg_shrink=True), "thumbnail", False, {}, None),
        (Header(20000, 14000, jpeg_shrink=True), "resize", False, {}, None),
        (Header(20000, 14000, jpeg_shrink=True), "convert", False, {}, "max_pixels"),
        # The same size as a progressive JPEG or a PNG: every pixel is decoded.
        (Header(20000, 14000), "thumbnail", False, {}, "max_pixels"),
        # Headers declaring gigapixels are refused whatever would be decoded.
        (Header(64250, 64250, jpeg_shrink=True), "thumbnail", False, {}, "max_source_pixels"),
        (Header(65536, 65536), "thumbnail", False, {}, "max_source_pixels"),
        (Header(17000, 17000), "thumbnail", False, {}, "max_pixels"),
        (Header(10000, 10000), "convert", False, {}, None),  # exactly 100 MP
        (Header(10000, 10001), "convert", False, {}, "max_pixels"),
        (Header(100, 100), "convert", False, {"max_pixels": 9999}, "max_pixels"),
        (Header(100, 100), "convert", False, {"max_source_pixels": 9999}, "max_source_pixels"),
        # Animations: frames x pixels, and a frame count.
        (Header(1000, 1000, frames=200), "convert", True, {}, "max_pixels"),
        (Header(1000, 1000, frames=200), "convert", False, {}, None),  # first frame only
        (Header(1, 1, frames=40000), "convert", True, {}, "max_frames"),
        (Header(1, 1, frames=40000), "thumbnail", False, {}, None),
        (Header(10, 10, frames=5), "convert", True, {"max_frames": 4}, "max_frames"),
    ],
)
def test_limits(header, operation, animated, params, refused):
    request = _request(operation, **params)
    if refused is None:
        check_limits(header, request, animated)
        return
    with pytest.raises(PipelineError) as caught:
        check_limits(header, request, animated)
    assert caught.value.code == "pixel_limit"
    assert f"({refused})" in caught.value.message
