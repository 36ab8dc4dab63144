"""The Pillow path of the image steps (:mod:`pipelines.image_pillow`) beside the libvips one.

Plain JPEGs shrunk to a box go through Pillow; these tests run both paths on the same
files (``images.pillow_step`` and ``images.vips_step``, the two halves of
``run_step``) and check that Pillow's output is what libvips would have written: the
same format and size, upright, no metadata, pixels within resampling noise; that what
it declines (CMYK with its own profile, damaged files, Pillow's bomb limit) still gets
libvips' result; and,
in a fresh interpreter, that a job taking it never loads libvips.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import pyvips

from pipelines import image_params, image_pillow, images
from pipelines.registry import Output, PipelineError
from tests.generated import Generated
from tests.generated import images as drawn

REPO = Path(__file__).resolve().parents[2]
THUMBNAIL = {"width": 320, "height": 320, "format": "webp", "quality": 80}
BOXES: list[tuple[str, dict[str, Any]]] = [
    ("thumbnail", THUMBNAIL),
    ("thumbnail", {"width": 100, "height": 60, "format": "png"}),
    ("thumbnail", {"width": 4000, "height": 4000, "format": "png"}),
    ("resize", {"width": 150, "height": 150, "format": "jpeg", "quality": 92}),
    ("resize", {"width": 33, "height": 500, "format": "jpeg"}),
]
PLAIN = ["photo.jpg", "photo-upright.jpg", "photo-orientation-6.jpg", "gps.jpg", "giant.jpg"]


def _both(
    operation: str, params: dict[str, Any], path: Path, workdir: Path
) -> tuple[list[Output] | None, list[Output]]:
    request = image_params.parse(operation, params)
    detected = images.detect(path)
    taken = images.pillow_step(request, detected, path, workdir / "pillow")
    return taken, images.vips_step(request, detected, path, workdir / "vips")


def _opened(output: Output) -> pyvips.Image:
    image = pyvips.Image.new_from_file(str(output.path))
    assert image.format == "uchar"
    fields = set(image.get_fields())
    assert not fields & {"exif-data", "xmp-data", "iptc-data", "icc-profile-data"}, fields
    return image


def _same_output(taken: list[Output] | None, reference: list[Output], noise: float) -> None:
    """The Pillow output is libvips' in kind: type, size, bands, pixels within ``noise``."""
    assert taken is not None, "the Pillow path declined a plain JPEG"
    (mine,), (theirs,) = taken, reference
    assert (mine.output_type, mine.content_type) == (theirs.output_type, theirs.content_type)
    ours, vips = _opened(mine), _opened(theirs)
    assert str(ours.get("vips-loader")) == str(vips.get("vips-loader"))
    assert (ours.width, ours.height, ours.bands) == (vips.width, vips.height, vips.bands)
    assert (ours - vips).abs().avg() < noise


@pytest.mark.parametrize("name", PLAIN)
@pytest.mark.parametrize(("operation", "params"), BOXES)
def test_a_plain_jpeg_gives_what_libvips_gives(name, operation, params, generated, tmp_path):
    taken, reference = _both(operation, params, generated / f"images/{name}", tmp_path)
    _same_output(taken, reference, noise=4)


def _progressive(path: Path, size: tuple[int, int], orientation: int) -> Path:
    picture = drawn.picture(*size).copy()
    picture.set_type(pyvips.GValue.gint_type, "orientation", orientation)
    picture.jpegsave(str(path), Q=85, interlace=True, keep=drawn.KEEP_EXIF)
    return path


@pytest.mark.parametrize(("operation", "params"), BOXES)
def test_a_progressive_jpeg_at_a_dct_scale_is_cut_as_libvips_cuts_it(
    operation: str, params: dict[str, Any], tmp_path: Path
) -> None:
    # 308x231 at 1/4 is 77x58 for libjpeg, 77x57 for libvips' loader: one row less.
    path = _progressive(tmp_path / "progressive.jpg", (308, 231), 6)
    taken, reference = _both(operation, params, path, tmp_path)
    _same_output(taken, reference, noise=4)


def test_exif_orientation_6_comes_out_upright(generated: Generated, tmp_path: Path) -> None:
    params = {"width": 4000, "height": 4000, "format": "png"}
    request = image_params.parse("thumbnail", params)
    outputs = {}
    for name in ("photo-orientation-6.jpg", "photo-upright.jpg"):
        path = generated / f"images/{name}"
        taken = images.pillow_step(request, images.detect(path), path, tmp_path / name)
        assert taken is not None
        outputs[name] = _opened(taken[0])
    rotated, upright = outputs["photo-orientation-6.jpg"], outputs["photo-upright.jpg"]
    width, height = drawn.STORED
    assert (rotated.width, rotated.height) == (upright.width, upright.height) == (height, width)
    assert (rotated - upright).abs().avg() < 8
    assert (rotated.rot("d180") - upright).abs().avg() > 50


def test_a_cmyk_jpeg_with_its_own_profile_goes_to_libvips_and_comes_out_srgb(generated, tmp_path):
    path = generated / "images/cmyk.jpg"
    assert image_pillow.jpeg_input(path) is None
    request = image_params.parse("thumbnail", THUMBNAIL)
    assert images.pillow_step(request, images.detect(path), path, tmp_path / "p") is None
    assert not (tmp_path / "p").exists()
    _comes_out_srgb_in_the_drawings_colours(images.thumbnail(path, THUMBNAIL, tmp_path / "t"))


@pytest.mark.parametrize(("operation", "params"), BOXES)
def test_a_cmyk_jpeg_without_a_profile_gives_what_libvips_gives(
    operation, params, generated, tmp_path
):
    """Through libvips' own fallback CMYK profile, as libvips converts it."""
    path = generated / "images/cmyk-no-profile.jpg"
    taken, reference = _both(operation, params, path, tmp_path)
    _same_output(taken, reference, noise=2)
    if params == THUMBNAIL:
        assert taken is not None
        _comes_out_srgb_in_the_drawings_colours(taken)


def test_the_shipped_cmyk_profile_is_libvips_fallback() -> None:
    """The Pillow path converts a profile-less CMYK JPEG through the profile libvips
    would use: the file shipped beside it holds exactly libvips' bytes."""
    with gzip.open(image_pillow.CMYK_PROFILE) as packed:
        assert packed.read() == pyvips.Image.profile_load("cmyk")


def test_the_fork_server_builds_the_cmyk_transform_before_it_forks() -> None:
    """prepare_fork_server() leaves it built (a child only applies it) and starts no
    thread: the server still forks without hooks."""
    code = (
        "import os; from pipelines import image_pillow as p; p.prepare_fork_server();"
        " print(p.cmyk_to_srgb.cache_info().currsize, len(os.listdir('/proc/self/task')))"
    )
    ran = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert ran.stdout.split() == ["1", "1"], ran.stdout + ran.stderr


def _comes_out_srgb_in_the_drawings_colours(out: list[Output]) -> None:
    image = _opened(out[0])
    assert (image.bands, image.interpretation) == (3, "srgb")
    # Converted through a CMYK profile: the drawing's colours, not their negative.
    expected = drawn.picture(160, 120)  # never enlarged
    assert (image.width, image.height) == (expected.width, expected.height)
    assert (image - expected).abs().avg() < 25


def test_an_icc_tagged_jpeg_gives_what_libvips_gives(tmp_path: Path) -> None:
    """libvips converts only non-RGB images to sRGB: an RGB JPEG's profile is dropped
    and its pixels kept, on both paths; neither output carries a profile."""
    path = tmp_path / "p3.jpg"
    drawn.picture(400, 300).icc_transform("p3").jpegsave(str(path), Q=90)
    assert "icc-profile-data" in pyvips.Image.new_from_file(str(path)).get_fields()
    for operation, params in BOXES:
        taken, reference = _both(operation, params, path, tmp_path / f"{operation}-{params}")
        _same_output(taken, reference, noise=4)


def test_metadata_is_stripped(generated: Generated, tmp_path: Path) -> None:
    for name in ("images/gps.jpg", "hostile/php-in-metadata.jpg"):
        path = generated / name
        for operation, params in BOXES:
            request = image_params.parse(operation, params)
            workdir = tmp_path / f"{Path(name).stem}-{request.output_type}"
            taken = images.pillow_step(request, images.detect(path), path, workdir)
            assert taken is not None
            _opened(taken[0])
            content = taken[0].path.read_bytes()
            assert b"php" not in content.lower()
            assert b"Exif" not in content and b"hypermedia-tests" not in content


@pytest.mark.parametrize(
    ("limit", "message"),
    [({"max_pixels": 50_000}, "max_pixels"), ({"max_source_pixels": 300_000}, "max_source_pixels")],
)
def test_a_jpeg_over_the_pixel_limits_is_refused_as_libvips_refuses_it(
    limit: dict[str, int], message: str, generated: Generated, tmp_path: Path
) -> None:
    path = generated / "images/photo.jpg"  # 640x480; 320x240 at the 1/2 scale a thumbnail takes
    request = image_params.parse("thumbnail", {**THUMBNAIL, **limit})
    detected = images.detect(path)
    with pytest.raises(PipelineError) as pillow:
        images.pillow_step(request, detected, path, tmp_path / "p")
    with pytest.raises(PipelineError) as vips:
        images.vips_step(request, detected, path, tmp_path / "v")
    assert pillow.value.code == vips.value.code == "pixel_limit"
    assert pillow.value.message == vips.value.message
    assert message in pillow.value.message
    assert not (tmp_path / "p" / request.output_type).exists()


def test_a_jpeg_over_pillows_bomb_limit_is_left_to_libvips_and_our_limits(
    generated: Generated, tmp_path: Path
) -> None:
    path = generated / "hostile/jpeg-64250x64250-header.jpg"
    assert image_pillow.jpeg_input(path) is None
    with pytest.raises(PipelineError) as caught:
        images.thumbnail(path, THUMBNAIL, tmp_path)
    assert caught.value.code == "pixel_limit"
    assert "max_source_pixels" in caught.value.message


def test_a_damaged_jpeg_gets_libvips_verdict(generated: Generated, tmp_path: Path) -> None:
    request = image_params.parse("thumbnail", THUMBNAIL)
    broken = generated / "hostile/corrupt-header.jpg"
    assert images.pillow_step(request, images.detect(broken), broken, tmp_path / "b") is None
    with pytest.raises(PipelineError) as caught:
        images.thumbnail(broken, THUMBNAIL, tmp_path / "b")
    assert caught.value.code == "invalid_input"
    assert "cannot decode JPEG image" in caught.value.message


@pytest.mark.parametrize("interlace", [False, True], ids=["baseline", "progressive"])
def test_a_truncated_jpeg_gives_what_libvips_gives(interlace: bool, tmp_path: Path) -> None:
    """Both read what a truncated JPEG holds (libjpeg is handed an end-of-image marker
    where the data ends): the same pixels; where Pillow cannot finish, it declines and
    libvips decides. Cut at a tenth of the file, two tenths, ... nine tenths."""
    whole = tmp_path / "whole.jpg"
    drawn.picture(640, 480).jpegsave(str(whole), Q=85, interlace=interlace)
    data = whole.read_bytes()
    (complete,) = images.vips_step(
        image_params.parse("thumbnail", THUMBNAIL), images.detect(whole), whole, tmp_path / "w"
    )
    taken_by_pillow = 0
    for tenths in range(1, 10):
        cut = tmp_path / f"cut-{tenths}.jpg"
        cut.write_bytes(data[: len(data) * tenths // 10])
        taken, reference = _both("thumbnail", THUMBNAIL, cut, tmp_path / f"{tenths}")
        if taken is not None:
            taken_by_pillow += 1
            _same_output(taken, reference, noise=1)
        if tenths == 1:  # a tenth of the data: far from the whole picture, on both paths
            assert (_opened(reference[0]) - _opened(complete)).abs().avg() > 10
    # Measured: all nine cuts of both kinds; the first cuts into the scan data already.
    assert taken_by_pillow == 9, taken_by_pillow


def test_crops_and_full_size_steps_stay_with_libvips(generated: Generated) -> None:
    kind = images.detect(generated / "images/photo.jpg").kind
    declined: list[tuple[str, dict[str, Any]]] = [
        ("thumbnail", {**THUMBNAIL, "crop": "centre"}),
        ("thumbnail", {**THUMBNAIL, "format": "avif"}),
        ("convert", {"format": "webp"}),
        ("compress", {"format": "jpeg"}),
    ]
    for operation, params in declined:
        assert not image_pillow.takes(kind, image_params.parse(operation, params))
    assert not image_pillow.takes("png", image_params.parse("thumbnail", THUMBNAIL))
    assert image_pillow.takes(kind, image_params.parse("thumbnail", THUMBNAIL))


def test_fitted_size_is_libvips_thumbnail_size() -> None:
    sizes = [(1, 1), (7, 3000), (3000, 7), (640, 480), (308, 231), (77, 57), (1001, 999)]
    boxes = [(1, 1), (60, 100), (100, 60), (320, 320), (5000, 5000), (33, 500)]
    for width, height in sizes:
        for box in boxes:
            thumb = pyvips.Image.black(width, height).thumbnail_image(
                box[0], height=box[1], size="down"
            )
            expected = (thumb.width, thumb.height)
            assert image_pillow.fitted_size(width, height, *box) == expected, (width, height, box)


_CHILD = """
import json, sys
from pathlib import Path
from pipelines import images
out = images.thumbnail(Path(sys.argv[1]), json.loads(sys.argv[2]), Path(sys.argv[3]))
print(json.dumps([out[0].output_type, "pyvips" in sys.modules]))
"""


def _in_a_fresh_interpreter(path: Path, workdir: Path) -> tuple[str, bool]:
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), json.dumps(THUMBNAIL), str(workdir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    output_type, loaded = json.loads(result.stdout.strip().splitlines()[-1])
    return str(output_type), bool(loaded)


def test_a_plain_jpeg_thumbnail_never_loads_libvips(generated: Generated, tmp_path: Path):
    for name in ("photo.jpg", "photo-orientation-6.jpg"):
        output_type, loaded = _in_a_fresh_interpreter(generated / f"images/{name}", tmp_path)
        assert output_type == "thumbnail-320x320-q80.webp"
        assert not loaded, f"{name}: pyvips was imported on the Pillow path"
    _, loaded = _in_a_fresh_interpreter(generated / "images/cmyk-no-profile.jpg", tmp_path / "k")
    assert not loaded, "a CMYK JPEG without a profile loaded libvips"
    _, loaded = _in_a_fresh_interpreter(generated / "images/cmyk.jpg", tmp_path / "cmyk")
    assert loaded, "a CMYK JPEG with its own profile goes to libvips"
