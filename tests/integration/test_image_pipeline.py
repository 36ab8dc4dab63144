"""The image steps on every generated image and hostile file (tests/generated) and, in
the corpus tier, on every image and hostile file of the shared corpus, in-process.

Each file goes through the four steps with the default profiles' params
(``etc/profiles.toml``). What each must do comes from its manifest's ``expected``:

- ``valid`` (and ``sanitize:filename``: good content, bad name): outputs that decode,
  in the requested format and size bound, 8-bit, metadata stripped; or
  ``unsupported_format`` for a type outside the documented list (README, "Supported
  image formats"), or ``pixel_limit`` for a full-size step on an image decoding to
  more than ``max_pixels``;
- ``reject:*``: a :class:`PipelineError` with a clear code, never another exception;
  ``pixel-flood`` must be ``pixel_limit``. A ``type-mismatch`` row whose content is
  a supported image is processed as what it is (dispatch on content, not name);
- ``tolerate:*``: outputs or a clear refusal; ``neutralize:*``: processed without its
  payload, or refused.

A per-file deadline turns a hang into a failure with a traceback (the process exits).
A table of file -> result per step is printed at the end. The tests after those check
what a photo needs (orientation, CMYK, 16 bits, alpha, HEIC, animation ...) and what
must be refused, on generated files.
"""

from __future__ import annotations

import faulthandler
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import pyvips

from pipelines import image_params, images, registry, sniff
from pipelines.image_source import DecodeFailed
from pipelines.image_vips import check_loader
from pipelines.registry import Output, PipelineError
from tests.corpus_support import Row, collected_rows, corpus
from tests.generated import Generated
from tests.generated import images as drawn

REPO = Path(__file__).resolve().parents[2]
PROFILES = tomllib.loads((REPO / "etc" / "profiles.toml").read_text())["profiles"]
STEPS: dict[str, dict[str, Any]] = {
    name: dict(PROFILES[name]["params"]) for name in ("thumbnail", "resize", "compress", "convert")
}
DEADLINE_SECONDS = 120
CODES = {"unsupported_format", "invalid_input", "pixel_limit"}
LOADERS = {
    "jpeg": "jpegload",
    "png": "pngload",
    "webp": "webpload",
    "avif": "heifload",
    "tiff": "tiffload",
    "gif": "gifload",
}
# Types among the valid images that the README documents as refused.
REFUSED_KINDS = {"jxl", "jp2", "svg", "gzip", "mng", "psd"}
# The corpus's rows, read at collection (none without a corpus: the tier's hooks then
# deselect these tests, or fail them in CI).
IMAGES = sorted(collected_rows(("images",)), key=lambda r: r.path)
HOSTILE = sorted(collected_rows(("hostile",)), key=lambda r: r.path)
RESULTS: dict[str, dict[str, str]] = {}


@pytest.fixture(scope="module", autouse=True)
def _print_results(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or not RESULTS:
        return
    width = min(60, max(len(name) for name in RESULTS))
    reporter.write_line("")
    reporter.write_line(f"{'file':<{width}}  " + "  ".join(f"{s:<18}" for s in STEPS))
    for name, row in sorted(RESULTS.items()):
        cells = "  ".join(f"{row.get(step, '-')[:18]:<18}" for step in STEPS)
        reporter.write_line(f"{name[:width]:<{width}}  {cells}")


@contextmanager
def _deadline(seconds: int = DEADLINE_SECONDS) -> Iterator[None]:
    """A hang in C code cannot be interrupted: dump every thread and exit instead."""
    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def _run(step: str, path: Path, params: dict[str, Any], workdir: Path) -> list[Output] | str:
    """The step's outputs, or its PipelineError code; anything else fails the test."""
    with _deadline():
        try:
            return registry.get(step)(path, params, workdir)
        except PipelineError as exc:
            error = exc
    assert error.code in CODES, error
    assert error.message
    return error.code


def _decoded(output: Output, request: image_params.ImageRequest, workdir: Path) -> pyvips.Image:
    """Check one output: where it is, what it is, and that every pixel decodes."""
    assert output.path.parent == workdir
    assert output.path.name == output.output_type == request.output_type
    assert output.content_type == request.format.content_type
    image = pyvips.Image.new_from_file(str(output.path))
    assert str(image.get("vips-loader")).startswith(LOADERS[request.format.name])
    assert image.format == "uchar"
    assert image.interpretation in ("srgb", "b-w")
    page_height = image.get("page-height") if image.get_typeof("page-height") else image.height
    assert isinstance(page_height, int)
    if request.width is not None and request.height is not None:
        assert image.width <= request.width
        assert page_height <= request.height
    fields = set(image.get_fields())
    assert not fields & {"exif-data", "xmp-data", "iptc-data"}, fields
    image.avg()  # decodes every pixel
    return image


def _result(outputs: list[Output] | str, image: pyvips.Image | None) -> str:
    if isinstance(outputs, str):
        return outputs
    assert image is not None
    pages = image.get("n-pages") if image.get_typeof("n-pages") else 1
    frames = f"x{pages}" if isinstance(pages, int) and pages > 1 else ""
    return f"ok {image.width}x{image.height}{frames}"


def _header_pixels(path: Path) -> int:
    detected = images.detect(path)
    source = images.open_input(path, detected)
    try:
        return source.header.width * source.header.height
    finally:
        source.close()


def _check_file(path: Path, tmp_path: Path, allowed: Any) -> None:
    """Run the four steps on one file; ``allowed(step, code)`` says whether a refusal
    with ``code`` is acceptable."""
    relative = f"{path.parent.name}/{path.name}"
    row = RESULTS.setdefault(relative, {})
    for step, params in STEPS.items():
        workdir = tmp_path / step
        outputs = _run(step, path, params, workdir)
        image = None
        if isinstance(outputs, str):
            assert allowed(step, outputs), f"{relative}: {step} refused with {outputs}"
        else:
            request = image_params.parse(step, params)
            assert len(outputs) == 1
            image = _decoded(outputs[0], request, workdir)
        row[step] = _result(outputs, image)


def _kind(path: Path) -> str:
    return sniff.sniff(path.read_bytes()[: sniff.HEAD_BYTES]).kind


def _refusable_valid(path: Path):
    """For a valid file: which refusals are documented."""
    kind = _kind(path)
    supported = kind in images.SUPPORTED
    old_jpeg_tiff = kind == "tiff" and _is_old_jpeg_tiff(path)

    def allowed(step: str, code: str) -> bool:
        if code == "unsupported_format":
            return not supported or old_jpeg_tiff
        if code == "pixel_limit" and step in ("compress", "convert"):
            return _header_pixels(path) > image_params.DEFAULT_MAX_PIXELS
        return False

    return allowed


def _is_old_jpeg_tiff(path: Path) -> bool:
    data = path.read_bytes()
    return sniff.tiff_compression(lambda offset, size: data[offset : offset + size]) == 6


def check_image(path: Path, tmp_path: Path) -> None:
    """A valid image: processed, or refused as the README documents."""
    if _kind(path) not in images.SUPPORTED:
        assert _kind(path) in REFUSED_KINDS, "a refused type the README does not list"
    _check_file(path, tmp_path, _refusable_valid(path))


def check_hostile(path: Path, expected: str, tmp_path: Path) -> None:
    supported = _kind(path) in images.SUPPORTED
    if expected.startswith("reject:"):
        if expected == "reject:type-mismatch" and supported:
            # A real image under another type's name: processed as what it is.
            _check_file(path, tmp_path, lambda step, code: False)
            return
        wanted = {"pixel_limit"} if expected == "reject:pixel-flood" else CODES
        outcomes: dict[str, Any] = {}

        def refused(step: str, code: str) -> bool:
            outcomes[step] = code
            return code in wanted

        _check_file(path, tmp_path, refused)
        assert set(outcomes) == set(STEPS), f"{path.name} was not refused by every step"
    elif expected.startswith(("tolerate:", "neutralize:")):
        _check_file(path, tmp_path, lambda step, code: True)
    else:
        assert expected in ("valid", "sanitize:filename"), expected
        _check_file(path, tmp_path, _refusable_valid(path))


def test_every_generated_image(generated: Generated, tmp_path: Path) -> None:
    for row in generated.rows(["images"]):
        assert row.expected == "valid"
        check_image(generated / row.path, tmp_path / Path(row.path).name)


def test_every_generated_hostile_file(generated: Generated, tmp_path: Path) -> None:
    for row in generated.rows(["hostile"]):
        check_hostile(generated / row.path, row.expected, tmp_path / Path(row.path).name)


@pytest.mark.corpus
@pytest.mark.parametrize("row", IMAGES, ids=[Path(r.path).name for r in IMAGES])
def test_corpus_image(row: Row, tmp_path: Path) -> None:
    assert row.expected == "valid"
    check_image(corpus() / row.path, tmp_path)


@pytest.mark.corpus
@pytest.mark.parametrize("row", HOSTILE, ids=[Path(r.path).name for r in HOSTILE])
def test_hostile_file(row: Row, tmp_path: Path) -> None:
    check_hostile(corpus() / row.path, row.expected, tmp_path)


def test_the_supported_list_is_what_the_readme_documents():
    assert set(images.SUPPORTED) == {
        "jpeg", "png", "gif", "webp", "tiff", "avif", "avifs", "heic", "heif", "bmp", "ico"
    }  # fmt: skip
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Supported image formats", 1)[1].split("\n## ", 1)[0]
    for label in ("JPEG", "PNG", "GIF", "WebP", "TIFF", "AVIF", "HEIC", "BMP", "ICO"):
        assert label in section
    for refused in ("SVG", "JPEG XL", "JPEG 2000", "PSD", "MNG", "PDF", "EPS", "EXR"):
        assert refused in section


# --- what a photo needs ----------------------------------------------------------------


def _convert(path: Path, workdir: Path, **params: Any) -> pyvips.Image:
    outputs = images.convert(path, {"format": "png", **params}, workdir)
    return pyvips.Image.new_from_file(str(outputs[0].path))


def test_exif_orientation_6_comes_out_upright(generated: Generated, tmp_path: Path) -> None:
    upright = _convert(generated / "images/photo-upright.jpg", tmp_path / "a")
    rotated = _convert(generated / "images/photo-orientation-6.jpg", tmp_path / "b")
    stored = pyvips.Image.new_from_file(str(generated / "images/photo-orientation-6.jpg"))
    assert (stored.width, stored.height) == drawn.STORED
    assert (rotated.width, rotated.height) == (upright.width, upright.height)
    # JPEG noise apart, the same picture; turned the other way, far off.
    assert (rotated - upright).abs().avg() < 8
    assert (stored.rot("d270") - upright).abs().avg() > 50


@pytest.mark.parametrize(
    ("name", "stored", "upright"),
    [
        ("photo-orientation-6.jpg", (400, 300), (300, 400)),
        ("orientation-6.png", (200, 100), (100, 200)),
    ],
)
def test_orientation_swaps_width_and_height(name, stored, upright, generated, tmp_path):
    path = generated / f"images/{name}"
    raw = pyvips.Image.new_from_file(str(path))
    assert (raw.width, raw.height) == stored
    out = images.thumbnail(path, {"width": 4000, "height": 4000, "format": "png"}, tmp_path)
    image = pyvips.Image.new_from_file(str(out[0].path))
    assert (image.width, image.height) == upright


CMYK = ["cmyk.jpg", "cmyk-no-profile.jpg"]


@pytest.mark.parametrize("name", CMYK)
def test_cmyk_comes_out_srgb(name, generated, tmp_path):
    path = generated / f"images/{name}"
    assert pyvips.Image.new_from_file(str(path)).interpretation == "cmyk"
    image = _convert(path, tmp_path, format="jpeg")
    assert (image.bands, image.interpretation) == (3, "srgb")
    # Not inverted (a naive CMYK -> RGB read gives a negative): compare with Pillow.
    from PIL import Image

    with Image.open(path) as reference:
        expected = pyvips.Image.new_from_memory(
            reference.convert("RGB").tobytes(), image.width, image.height, 3, "uchar"
        )
    assert (image - expected).abs().avg() < 40


@pytest.mark.parametrize("name", CMYK)
def test_cmyk_thumbnail_decoded_at_a_dct_scale_comes_out_srgb(name, generated, tmp_path):
    path = generated / f"images/{name}"
    # 1/8 scale still covers a 12-pixel box from 120 px, so the JPEG loader shrinks.
    out = images.thumbnail(path, {"width": 12, "height": 12, "format": "png"}, tmp_path)
    image = pyvips.Image.new_from_file(str(out[0].path))
    assert (image.bands, image.interpretation) == (3, "srgb")
    full = _convert(path, tmp_path / "full").thumbnail_image(12, height=12)
    assert (image.width, image.height) == (full.width, full.height)
    assert (image - full).abs().avg() < 12


@pytest.mark.parametrize("name", ["rgba-16bit.png", "grey-alpha-16bit.png", "rgba-16bit.tiff"])
def test_16_bit_comes_out_8_bit_with_alpha(name, generated, tmp_path):
    source = pyvips.Image.new_from_file(str(generated / f"images/{name}"))
    assert source.format == "ushort"
    image = _convert(generated / f"images/{name}", tmp_path)
    assert image.format == "uchar"
    assert image.hasalpha()


def test_alpha_is_kept_where_the_format_has_it_and_flattened_on_white_in_jpeg(
    generated: Generated, tmp_path: Path
) -> None:
    path = generated / "images/alpha.png"
    source = pyvips.Image.new_from_file(str(path))
    # A fully transparent pixel of the source.
    alpha = source[3]
    x, y = next(
        (x, y) for y in range(source.height) for x in range(source.width) if alpha(x, y)[0] == 0
    )
    for fmt in ("png", "webp", "avif", "tiff", "gif"):
        out = _convert(path, tmp_path / fmt, format=fmt)
        assert out.hasalpha(), fmt
        assert out(x, y)[-1] == 0, fmt
    jpeg = _convert(path, tmp_path / "jpeg", format="jpeg")
    assert jpeg.bands == 3
    assert min(jpeg(x, y)) > 240


def test_heic_is_decoded_and_keeps_the_aspect_ratio(generated: Generated, tmp_path: Path) -> None:
    out = images.thumbnail(generated / "images/phone.heic", STEPS["thumbnail"], tmp_path)
    image = pyvips.Image.new_from_file(str(out[0].path))
    assert image.deviate() > 1  # a picture, not a flat fill
    assert (image.width, image.height) == (320, 218)  # from 400x272


def test_bmp_and_ico_are_decoded(generated: Generated, tmp_path: Path) -> None:
    for name, size in [("drawing.bmp", (200, 150)), ("favicon.ico", (48, 48))]:
        image = _convert(generated / f"images/{name}", tmp_path / name)
        assert (image.width, image.height) == size
        assert image.deviate() > 1


def test_animated_gif_thumbnail_is_the_first_frame_and_convert_keeps_the_frames(
    generated: Generated, tmp_path: Path
) -> None:
    path = generated / "images/animated.gif"
    size, frames = drawn.FRAME_SIZE, drawn.FRAMES
    thumb = images.thumbnail(path, STEPS["thumbnail"], tmp_path / "t")
    first = pyvips.Image.new_from_file(str(thumb[0].path), n=-1)
    assert first.get("n-pages") == 1 if first.get_typeof("n-pages") else True
    assert first.height == first.width == size
    for fmt in ("webp", "gif"):
        out = images.convert(path, {"format": fmt}, tmp_path / fmt)
        animation = pyvips.Image.new_from_file(str(out[0].path), n=-1)
        assert animation.get("n-pages") == frames
        assert animation.get("page-height") == size
    resized = images.resize(path, {"width": 100, "height": 100, "format": "webp"}, tmp_path / "r")
    animation = pyvips.Image.new_from_file(str(resized[0].path), n=-1)
    assert (animation.get("n-pages"), animation.width, animation.get("page-height")) == (
        frames,
        100,
        100,
    )


def test_thumbnail_crop_fills_the_box(generated: Generated, tmp_path: Path) -> None:
    params = {**STEPS["thumbnail"], "crop": "attention"}
    out = images.thumbnail(generated / "images/photo.jpg", params, tmp_path)
    image = pyvips.Image.new_from_file(str(out[0].path))
    assert (image.width, image.height) == (320, 320)
    assert out[0].output_type == "thumbnail-320x320-crop-attention-q80.webp"


def test_the_giant_jpeg_thumbnails_by_shrinking_on_load(
    generated: Generated, tmp_path: Path
) -> None:
    path = generated / "images/giant.jpg"
    width, height = drawn.GIANT
    assert width * height > image_params.DEFAULT_MAX_PIXELS
    out = images.thumbnail(path, STEPS["thumbnail"], tmp_path)
    image = pyvips.Image.new_from_file(str(out[0].path))
    assert (image.width, image.height) == (320, 224)


def test_metadata_is_stripped(generated: Generated, tmp_path: Path) -> None:
    gps = generated / "images/gps.jpg"
    assert "exif-ifd3-GPSLatitude" in pyvips.Image.new_from_file(str(gps)).get_fields()
    for step, params in STEPS.items():
        out = registry.get(step)(gps, params, tmp_path / step)
        assert "exif-data" not in pyvips.Image.new_from_file(str(out[0].path)).get_fields()
    php = generated / "hostile/php-in-metadata.jpg"
    assert b"php" in php.read_bytes()
    for step, params in STEPS.items():
        out = registry.get(step)(php, params, tmp_path / f"php-{step}")
        assert b"php" not in out[0].path.read_bytes().lower()


def test_a_rerun_writes_the_same_file(generated: Generated, tmp_path: Path) -> None:
    path = generated / "images/photo.jpg"
    first = images.thumbnail(path, STEPS["thumbnail"], tmp_path)
    content = first[0].path.read_bytes()
    again = images.thumbnail(path, STEPS["thumbnail"], tmp_path)
    assert again == first
    assert again[0].path.read_bytes() == content


# --- what must be refused ------------------------------------------------------------


def _refusal(path: Path, workdir: Path, step: str = "thumbnail") -> PipelineError:
    with pytest.raises(PipelineError) as caught:
        registry.get(step)(path, STEPS[step], workdir)
    return caught.value


def test_untrusted_content_under_an_image_name_is_refused(generated: Generated, tmp_path: Path):
    svg = tmp_path / "logo.png"
    svg.write_bytes(generated.read("images/logo.svg"))
    error = _refusal(svg, tmp_path / "out")
    assert error.code == "unsupported_format"
    assert "SVG image" in error.message
    native = tmp_path / "photo.png"
    (pyvips.Image.black(4, 4) + 1).vipssave(str(tmp_path / "native.v"))
    native.write_bytes((tmp_path / "native.v").read_bytes())
    error = _refusal(native, tmp_path / "out")
    assert error.code == "unsupported_format"
    assert "libvips native image" in error.message
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_libvips_itself_refuses_the_untrusted_loaders(generated: Generated, tmp_path: Path):
    """Even past the sniffer (a bug, another caller), libvips will not decode them."""
    (pyvips.Image.black(4, 4) + 1).vipssave(str(tmp_path / "native.v"))
    (pyvips.Image.black(4, 4) + 1).matrixsave(str(tmp_path / "m.mat"))
    (pyvips.Image.black(4, 4) + 1).csvsave(str(tmp_path / "c.csv"))
    svg = str(generated / "images/logo.svg")
    for path in (svg, tmp_path / "native.v", tmp_path / "m.mat", tmp_path / "c.csv"):
        with pytest.raises(pyvips.Error, match="not a known file format"):
            pyvips.Image.new_from_file(str(path))
    with pytest.raises(pyvips.Error, match="operation is blocked"):
        pyvips.Image.svgload(svg)
    with pytest.raises(pyvips.Error, match="operation is blocked"):
        pyvips.Image.vipsload(str(tmp_path / "native.v"))
    with pytest.raises(pyvips.Error, match="operation is blocked"):
        pyvips.Image.matrixload(str(tmp_path / "m.mat"))
    with pytest.raises(pyvips.Error, match="operation is blocked"):
        pyvips.Image.csvload(str(tmp_path / "c.csv"))
    with pytest.raises(pyvips.Error, match="operation is blocked"):
        pyvips.Image.svgload_buffer(b'<svg width="4" height="4"/>')


def test_pixels_come_only_from_the_loader_the_type_calls_for(generated: Generated) -> None:
    png = pyvips.Image.new_from_file(str(generated / "images/drawing.png"))
    check_loader(png, "pngload")
    with pytest.raises(DecodeFailed, match="expected jpegload"):
        check_loader(png, "jpegload")


@pytest.mark.parametrize(
    ("name", "code", "message"),
    [
        ("hostile/png-50000x50000-header.png", "pixel_limit", "max_source_pixels"),
        ("hostile/jpeg-64250x64250-header.jpg", "pixel_limit", "max_source_pixels"),
        ("hostile/polyglot-jpeg-zip.jpg", "invalid_input", "ZIP archive appended"),
        ("hostile/pdf-named.jpg", "unsupported_format", "PDF document"),
        ("hostile/empty.mp3", "invalid_input", "empty"),
        ("images/ojpeg-strip.tif", "unsupported_format", "old-style JPEG"),
        ("hostile/jxl-signature.jxl", "unsupported_format", "JPEG XL image"),
        ("hostile/truncated.svgz", "unsupported_format", "gzip"),
        ("hostile/corrupt-header.jpg", "invalid_input", "cannot decode JPEG image"),
        ("hostile/truncated.heic", "invalid_input", "cannot decode HEIC image"),
    ],
)
def test_refusals_say_why(name, code, message, generated, tmp_path):
    error = _refusal(generated / name, tmp_path)
    assert error.code == code
    assert message in error.message
    assert not error.retryable


def test_an_image_over_max_pixels_is_refused_at_full_size(generated: Generated, tmp_path: Path):
    """The giant JPEG thumbnails by shrinking on load; at full size it is too big."""
    error = _refusal(generated / "images/giant.jpg", tmp_path, "convert")
    assert error.code == "pixel_limit"
    assert "max_pixels" in error.message


def test_animation_over_the_frame_limit_is_refused_but_its_thumbnail_is_fine(
    generated: Generated, tmp_path: Path
) -> None:
    path = generated / "hostile/frame-flood.gif"  # 1,100 frames
    error = _refusal(path, tmp_path, "compress")
    assert error.code == "pixel_limit"
    assert "max_frames" in error.message
    images.thumbnail(path, STEPS["thumbnail"], tmp_path / "thumb")


def test_errors_do_not_reveal_paths(generated: Generated, tmp_path: Path) -> None:
    workdir = tmp_path / "secret-workdir"
    for name in ("hostile/truncated.avif", "hostile/truncated.webp"):
        for step in ("thumbnail", "convert"):
            with pytest.raises(PipelineError) as caught:
                registry.get(step)(generated / name, STEPS[step], workdir)
            assert str(generated.root) not in caught.value.message
            assert "secret-workdir" not in caught.value.message
            assert not (workdir / image_params.parse(step, STEPS[step]).output_type).exists()
