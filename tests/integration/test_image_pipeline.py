"""The image steps on the shared corpus: every image and every hostile file, in-process.

Each file goes through the four steps with the default profiles' params
(``etc/profiles.toml``). What each must do comes from ``MANIFEST.tsv``'s ``expected``:

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
A table of file -> result per step is printed at the end.
"""

from __future__ import annotations

import csv
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

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO.parent / "shared" / "corpus"
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
# Types in the corpus that the README documents as refused.
REFUSED_KINDS = {"jxl", "jp2", "svg", "gzip", "mng", "psd"}


def _manifest() -> dict[str, dict[str, str]]:
    manifest = CORPUS / "MANIFEST.tsv"
    assert manifest.is_file(), f"the test corpus is expected at {CORPUS}"
    with manifest.open(newline="", encoding="utf-8") as file:
        return {row["path"]: row for row in csv.DictReader(file, delimiter="\t")}


MANIFEST = _manifest()
IMAGES = sorted(path for path in MANIFEST if path.startswith("images/"))
HOSTILE = sorted(path for path in MANIFEST if path.startswith("hostile/"))
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


def _check_file(relative: str, tmp_path: Path, allowed: Any) -> None:
    """Run the four steps on one corpus file; ``allowed(step, code)`` says whether a
    refusal with ``code`` is acceptable (``None``: success is required)."""
    path = CORPUS / relative
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


@pytest.mark.parametrize("relative", IMAGES, ids=[Path(p).name for p in IMAGES])
def test_corpus_image(relative, tmp_path):
    assert MANIFEST[relative]["expected"] == "valid"
    path = CORPUS / relative
    if _kind(path) not in images.SUPPORTED:
        assert _kind(path) in REFUSED_KINDS, "a refused type the README does not list"
    _check_file(relative, tmp_path, _refusable_valid(path))


@pytest.mark.parametrize("relative", HOSTILE, ids=[Path(p).name for p in HOSTILE])
def test_hostile_file(relative, tmp_path):
    expected = MANIFEST[relative]["expected"]
    path = CORPUS / relative
    supported = _kind(path) in images.SUPPORTED
    if expected.startswith("reject:"):
        if expected == "reject:type-mismatch" and supported:
            # A real image under another type's name: processed as what it is.
            _check_file(relative, tmp_path, lambda step, code: False)
            return
        wanted = {"pixel_limit"} if expected == "reject:pixel-flood" else CODES
        outcomes: dict[str, Any] = {}

        def refused(step: str, code: str) -> bool:
            outcomes[step] = code
            return code in wanted

        _check_file(relative, tmp_path, refused)
        assert set(outcomes) == set(STEPS), f"{relative} was not refused by every step"
    elif expected.startswith(("tolerate:", "neutralize:")):
        _check_file(relative, tmp_path, lambda step, code: True)
    else:
        assert expected in ("valid", "sanitize:filename"), expected
        _check_file(relative, tmp_path, _refusable_valid(path))


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


def test_exif_orientation_6_comes_out_upright(tmp_path):
    upright = _convert(CORPUS / "images/pillow-hopper.jpg", tmp_path / "a")
    rotated = _convert(CORPUS / "images/pillow-hopper_orientation_6.jpg", tmp_path / "b")
    stored = pyvips.Image.new_from_file(str(CORPUS / "images/pillow-hopper_orientation_6.jpg"))
    assert (rotated.width, rotated.height) == (upright.width, upright.height)
    # JPEG noise apart, the same picture; the pixels as stored are far off.
    assert (rotated - upright).abs().avg() < 8
    assert (stored - upright).abs().avg() > 50


@pytest.mark.parametrize(
    ("name", "stored", "upright"),
    [
        ("libvips-rotation-6.jpg", (308, 231), (231, 308)),
        ("sharp-Landscape_6.jpg", (450, 600), (600, 450)),
        ("imgproxy-orientation-6.png", (200, 100), (100, 200)),
        ("imageio-rommel.jpg", (3072, 2304), (2304, 3072)),
    ],
)
def test_orientation_swaps_width_and_height(name, stored, upright, tmp_path):
    path = CORPUS / "images" / name
    raw = pyvips.Image.new_from_file(str(path))
    assert (raw.width, raw.height) == stored
    out = images.thumbnail(path, {"width": 4000, "height": 4000, "format": "png"}, tmp_path)
    image = pyvips.Image.new_from_file(str(out[0].path))
    assert (image.width, image.height) == upright


@pytest.mark.parametrize(
    "name", ["pillow-pil_sample_cmyk.jpg", "sharp-Channel_digital_image_CMYK_color_no_profile.jpg"]
)
def test_cmyk_comes_out_srgb(name, tmp_path):
    image = _convert(CORPUS / "images" / name, tmp_path, format="jpeg")
    assert (image.bands, image.interpretation) == (3, "srgb")
    # Not inverted (a naive CMYK -> RGB read gives a negative): compare with Pillow.
    from PIL import Image

    with Image.open(CORPUS / "images" / name) as reference:
        expected = pyvips.Image.new_from_memory(
            reference.convert("RGB").tobytes(), image.width, image.height, 3, "uchar"
        )
    assert (image - expected).abs().avg() < 40


@pytest.mark.parametrize(
    "name", ["pillow-pil_sample_cmyk.jpg", "sharp-Channel_digital_image_CMYK_color_no_profile.jpg"]
)
def test_cmyk_thumbnail_decoded_at_a_dct_scale_comes_out_srgb(name, tmp_path):
    path = CORPUS / "images" / name
    # 1/8 scale still covers a 12-pixel box from 100 px, so the JPEG loader shrinks.
    out = images.thumbnail(path, {"width": 12, "height": 12, "format": "png"}, tmp_path)
    image = pyvips.Image.new_from_file(str(out[0].path))
    assert (image.bands, image.interpretation) == (3, "srgb")
    full = _convert(path, tmp_path / "full").thumbnail_image(12, height=12)
    assert (image.width, image.height) == (full.width, full.height)
    assert (image - full).abs().avg() < 12


@pytest.mark.parametrize(
    "name", ["pngsuite-basn6a16.png", "sharp-16-bit-grey-alpha.png", "pillow-tiff_16bit_RGBa.tiff"]
)
def test_16_bit_comes_out_8_bit_with_alpha(name, tmp_path):
    image = _convert(CORPUS / "images" / name, tmp_path)
    assert image.format == "uchar"
    assert image.hasalpha()


def test_alpha_is_kept_where_the_format_has_it_and_flattened_on_white_in_jpeg(tmp_path):
    path = CORPUS / "images/pillow-transparent.png"
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


@pytest.mark.parametrize(
    ("name", "mean"),
    [("tika-testHEIF.heic", None), ("pillow-hopper.heif", None), ("small-heif.heif", 255)],
)
def test_heic_is_decoded(name, mean, tmp_path):
    out = images.thumbnail(CORPUS / "images" / name, STEPS["thumbnail"], tmp_path)
    image = pyvips.Image.new_from_file(str(out[0].path))
    if mean is None:
        assert image.deviate() > 1  # a picture, not a flat fill
    else:  # the smallest HEIF is plain white
        assert image.avg() == pytest.approx(mean, abs=1)


def test_heic_thumbnail_keeps_the_aspect_ratio(tmp_path):
    out = images.thumbnail(CORPUS / "images/tika-testHEIF.heic", STEPS["thumbnail"], tmp_path)
    image = pyvips.Image.new_from_file(str(out[0].path))
    assert (image.width, image.height) == (320, 218)  # from 800x544


def test_bmp_and_ico_are_decoded(tmp_path):
    for name, size in [
        ("pillow-hopper.bmp", (128, 128)),
        ("tika-testBMP.bmp", (100, 75)),
        ("libvips-favicon.ico", (48, 48)),
    ]:
        image = _convert(CORPUS / "images" / name, tmp_path / name)
        assert (image.width, image.height) == size
        assert image.deviate() > 1


def test_animated_gif_thumbnail_is_the_first_frame_and_convert_keeps_the_frames(tmp_path):
    path = CORPUS / "images/pillow-iss634.gif"
    thumb = images.thumbnail(path, STEPS["thumbnail"], tmp_path / "t")
    first = pyvips.Image.new_from_file(str(thumb[0].path), n=-1)
    assert first.get("n-pages") == 1 if first.get_typeof("n-pages") else True
    assert first.height == first.width == 245
    for fmt in ("webp", "gif"):
        out = images.convert(path, {"format": fmt}, tmp_path / fmt)
        animation = pyvips.Image.new_from_file(str(out[0].path), n=-1)
        assert animation.get("n-pages") == 42
        assert animation.get("page-height") == 245
    resized = images.resize(path, {"width": 100, "height": 100, "format": "webp"}, tmp_path / "r")
    animation = pyvips.Image.new_from_file(str(resized[0].path), n=-1)
    assert (animation.get("n-pages"), animation.width, animation.get("page-height")) == (
        42,
        100,
        100,
    )


def test_thumbnail_crop_fills_the_box(tmp_path):
    params = {**STEPS["thumbnail"], "crop": "attention"}
    out = images.thumbnail(CORPUS / "images/imageio-rommel.jpg", params, tmp_path)
    image = pyvips.Image.new_from_file(str(out[0].path))
    assert (image.width, image.height) == (320, 320)
    assert out[0].output_type == "thumbnail-320x320-crop-attention-q80.webp"


def test_the_giant_jpeg_thumbnails_by_shrinking_on_load(tmp_path):
    out = images.thumbnail(CORPUS / "images/sharp-giant-image.jpg", STEPS["thumbnail"], tmp_path)
    image = pyvips.Image.new_from_file(str(out[0].path))
    assert (image.width, image.height) == (320, 224)


def test_metadata_is_stripped(tmp_path):
    gps = CORPUS / "images/pillow-exif_gps.jpg"
    assert "exif-data" in pyvips.Image.new_from_file(str(gps)).get_fields()
    for step, params in STEPS.items():
        out = registry.get(step)(gps, params, tmp_path / step)
        assert "exif-data" not in pyvips.Image.new_from_file(str(out[0].path)).get_fields()
    php = CORPUS / "hostile/fuzzdb-POC_phpinfo-metadata.jpg"
    assert b"php" in php.read_bytes()
    for step, params in STEPS.items():
        out = registry.get(step)(php, params, tmp_path / f"php-{step}")
        assert b"php" not in out[0].path.read_bytes().lower()


def test_a_rerun_writes_the_same_file(tmp_path):
    path = CORPUS / "images/libvips-sample.jpg"
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


def test_untrusted_content_under_an_image_name_is_refused(tmp_path):
    svg = tmp_path / "logo.png"
    svg.write_bytes((CORPUS / "images/libvips-logo.svg").read_bytes())
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


def test_libvips_itself_refuses_the_untrusted_loaders(tmp_path):
    """Even past the sniffer (a bug, another caller), libvips will not decode them."""
    (pyvips.Image.black(4, 4) + 1).vipssave(str(tmp_path / "native.v"))
    (pyvips.Image.black(4, 4) + 1).matrixsave(str(tmp_path / "m.mat"))
    (pyvips.Image.black(4, 4) + 1).csvsave(str(tmp_path / "c.csv"))
    svg = str(CORPUS / "images/libvips-logo.svg")
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


def test_pixels_come_only_from_the_loader_the_type_calls_for():
    png = pyvips.Image.new_from_file(str(CORPUS / "images/pillow-hopper.png"))
    check_loader(png, "pngload")
    with pytest.raises(DecodeFailed, match="expected jpegload"):
        check_loader(png, "jpegload")


@pytest.mark.parametrize(
    ("name", "code", "message"),
    [
        ("hostile/sharp-65536-uint32-limit.png", "pixel_limit", "max_source_pixels"),
        ("hostile/fuzzdb-lottapixel.jpg", "pixel_limit", "max_source_pixels"),
        ("hostile/libvips-17000x17000.avif", "pixel_limit", "max_pixels"),
        ("hostile/derived-polyglot-jpeg-docx.jpg", "invalid_input", "ZIP archive appended"),
        ("hostile/derived-pdf-named.jpg", "unsupported_format", "PDF document"),
        ("hostile/mutagen-emptyfile.mp3", "invalid_input", "empty"),
        ("images/libvips-ojpeg-strip.tif", "unsupported_format", "old-style JPEG"),
        ("images/imageio-chelsea.jxl", "unsupported_format", "JPEG XL image"),
        ("hostile/libvips-truncated.svgz", "unsupported_format", "gzip"),
        ("hostile/sharp-corrupt-header.jpg", "invalid_input", "cannot decode JPEG image"),
        ("hostile/tika-testHEIC_livePhoto.heic", "invalid_input", "cannot decode HEIC image"),
    ],
)
def test_refusals_say_why(name, code, message, tmp_path):
    error = _refusal(CORPUS / name, tmp_path)
    assert error.code == code
    assert message in error.message
    assert not error.retryable


def test_animation_over_the_frame_limit_is_refused_but_its_thumbnail_is_fine(tmp_path):
    path = CORPUS / "hostile/fuzzdb-uber.gif"  # 40,000 frames
    error = _refusal(path, tmp_path, "compress")
    assert error.code == "pixel_limit"
    assert "max_frames" in error.message
    images.thumbnail(path, STEPS["thumbnail"], tmp_path / "thumb")


def test_errors_do_not_reveal_paths(tmp_path):
    workdir = tmp_path / "secret-workdir"
    for name in ("hostile/tika-testAVIF.avif", "hostile/small-webp-26B.webp"):
        for step in ("thumbnail", "convert"):
            with pytest.raises(PipelineError) as caught:
                registry.get(step)(CORPUS / name, STEPS[step], workdir)
            assert str(CORPUS) not in caught.value.message
            assert "secret-workdir" not in caught.value.message
            assert not (workdir / image_params.parse(step, STEPS[step]).output_type).exists()
