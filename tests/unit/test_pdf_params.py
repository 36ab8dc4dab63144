"""pipelines.pdf_params and the pure parts of pipelines.pdf: validation, output type
names, and the render-size arithmetic that guards PDFium's bitmap allocation."""

from __future__ import annotations

import math
from typing import Any

import pytest

from pipelines import pdf, pdf_params
from pipelines.registry import PipelineError


def test_defaults_match_the_profile() -> None:
    request = pdf_params.parse({"page": 1, "width": 1024})
    assert request == pdf_params.parse({})
    assert request.output_type == "preview-p1-w1024-q85.jpg"
    assert request.format.content_type == "image/jpeg"


@pytest.mark.parametrize(
    ("params", "output_type"),
    [
        ({"page": 3, "width": 640, "format": "png"}, "preview-p3-w640.png"),
        ({"format": "png", "quality": 50}, "preview-p1-w1024.png"),  # PNG ignores quality
        ({"format": "webp", "quality": 70}, "preview-p1-w1024-q70.webp"),
        ({"format": "JPG", "quality": 85}, "preview-p1-w1024-q85.jpg"),
        ({"width": 4096, "page": 1000}, "preview-p1000-w4096-q85.jpg"),
    ],
)
def test_output_types(params: dict[str, Any], output_type: str) -> None:
    assert pdf_params.parse(params).output_type == output_type


def test_different_requests_never_share_an_output_type() -> None:
    variants: list[dict[str, Any]] = [
        {},
        {"page": 2},
        {"width": 512},
        {"quality": 60},
        {"format": "png"},
        {"format": "webp"},
        {"format": "webp", "quality": 60},
    ]
    names = [pdf_params.parse(params).output_type for params in variants]
    assert len(set(names)) == len(names)


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"dpi": 150}, "unknown parameter(s) dpi"),
        ({"page": 0}, "page must be in 1.."),
        ({"page": "1"}, "page must be an integer"),
        ({"page": True}, "page must be an integer"),
        ({"width": 4097}, "width must be in 16..4096"),
        ({"width": 15}, "width must be in 16..4096"),
        ({"width": 100.0}, "width must be an integer"),
        ({"format": "gif"}, "format must be one of jpeg, png, webp"),
        ({"format": 1}, "format must be one of"),
        ({"quality": 0}, "quality must be in 1..100"),
    ],
)
def test_invalid_params(params: dict[str, Any], needle: str) -> None:
    with pytest.raises(PipelineError) as caught:
        pdf_params.parse(params)
    assert caught.value.code == "invalid_params"
    assert needle in caught.value.message


@pytest.mark.parametrize("page_width", [595.276, 612.0, 841.89, 0.7, 123.456, 14400.0, 3.3])
def test_the_bitmap_is_exactly_the_requested_width(page_width: float) -> None:
    # pypdfium2 sizes the bitmap as ceil(points * scale); width / points alone
    # overshoots by a pixel for ~1 width in 5 (float rounding).
    for width in range(16, 4097):
        scale = pdf.render_scale(page_width, page_width, width, 1_000_000)
        assert math.ceil(page_width * scale) == width


def test_absurd_pages_are_refused_before_rendering() -> None:
    with pytest.raises(PipelineError) as caught:
        pdf.render_scale(1, 14400, 1024, 65_500)
    assert caught.value.code == "pixel_limit"
    with pytest.raises(PipelineError) as caught:  # 4096 x 16,384: 67 M pixels
        pdf.render_scale(1000, 4000, 4096, 65_500)
    assert caught.value.code == "pixel_limit"
    assert pdf.render_scale(1000, 3800, 4096, 65_500) == pytest.approx(4.096)
    for width, height in ((0, 100), (100, -1), (math.inf, 100), (math.nan, 100)):
        with pytest.raises(PipelineError) as caught:
            pdf.render_scale(width, height, 1024, 65_500)
        assert caught.value.code == "invalid_input"
