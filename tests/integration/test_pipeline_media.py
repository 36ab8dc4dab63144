"""The media steps (``transcode_video``, ``transcode_audio``) on generated media and, in
the corpus tier, on the shared corpus.

Every parameter path in-process; then every generated media row, and every media row
of the corpus (``media/*`` and the hostile media rows), through a real
:class:`ChildExecutor` with the limits of its profile in ``etc/profiles.toml``
(timeout, RLIMIT_AS, RLIMIT_NPROC), so FFmpeg runs where it will run in production: no
network, read-only filesystem, a uid of its own, threads counted against
``max_processes``.

Outputs are checked with ffprobe run here (letting it guess the format: these are our
own outputs): the right codec, a duration close to the input's, and for video a
height of at most the requested one, never upscaled, with even dimensions.
"""

from __future__ import annotations

import array
import itertools
import json
import os
import struct
import subprocess
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import pipelines.media as media
from hypermedia.sandbox.executor import ChildExecutor, ChildFailed
from pipelines import progress
from pipelines.registry import Output, PipelineError
from tests import media_support as ms
from tests.corpus_support import Row, corpus, manifest_rows
from tests.generated import Generated, hostile
from tests.generated.media import bars, ffmpeg, tone_source, video_source

REPO = Path(__file__).resolve().parents[2]
PROFILES = tomllib.loads((REPO / "etc" / "profiles.toml").read_text())["profiles"]
MEDIA_EXTENSIONS = {".mp3", ".m4a", ".flac", ".wav", ".mp4", ".mov", ".avi", ".mid"}

pytestmark = pytest.mark.program("ffmpeg")

# What a refusal's reason allows (the step's stable codes).
REJECT_CODES: dict[str, set[str]] = {
    "drm": {"encrypted_document"},
    "empty": {"invalid_input"},
    # An MP4 cut inside or before its index (moov) says so: it is not trackless.
    "truncated": {"invalid_input"},
    "malformed": {"invalid_input", "no_streams"},  # a metadata-only MOV has no track
    "no-streams": {"no_streams"},
    "no-samples": {"invalid_input"},
    "unsupported-type": {"unsupported_format"},
    # MP4 video named .mp3, sent to transcode_audio as its name suggests: no sound.
    "type-mismatch": {"no_streams"},
}
STABLE_CODES = {"invalid_input", "no_streams", "encrypted_document", "unsupported_format"}
# What each step makes with no params (its output type, its file's name in the workdir).
DEFAULT_OUTPUTS = {
    "transcode_video": "video-h264-720p-crf23.mp4",
    "transcode_audio": "audio-aac-128k.m4a",
}


# -- helpers ---------------------------------------------------------------------------


def ffprobe(path: Path) -> dict[str, Any]:
    """ffprobe's JSON, packets counted (demuxed, not decoded: cheap); read once for each
    version of the file (a source is probed for its cases and for each output's check,
    an output for its check and by its test)."""
    found = ms.ffprobe(
        path, "-count_packets", "-print_format", "json", "-show_format", "-show_streams"
    )
    data: dict[str, Any] = json.loads(found)
    return data


def streams(data: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [
        s
        for s in data.get("streams", [])
        if s.get("codec_type") == kind and not s.get("disposition", {}).get("attached_pic")
    ]


def duration(data: dict[str, Any]) -> float | None:
    try:
        return float(data["format"]["duration"])
    except (KeyError, ValueError):
        return None


def shown_height(stream: dict[str, Any]) -> int:
    """A video stream's height as shown: its stored width where its display matrix
    turns it a quarter (a phone's portrait video: FFmpeg's output is upright)."""
    turns = [side.get("rotation", 0) for side in stream.get("side_data_list", [])]
    quarter = round(float(turns[0] if turns else 0)) % 180 == 90
    return int(stream["width"] if quarter else stream["height"])


def check_output(source: Path, operation: str, output: Output, params: dict[str, Any]) -> str:
    """Assert the output is right for ``source``; a short description of it."""
    before, after = ffprobe(source), ffprobe(output.path)
    seconds, expected = duration(after), duration(before)
    assert seconds is not None and seconds > 0, f"{output.path.name}: empty output"
    pictures = [int(s.get("nb_read_packets", 0)) for s in streams(before, "video")]
    if operation == "transcode_video" and pictures[0] == 1:
        # A single picture (the 185-byte WebM, whose header says 1 s): one frame out.
        assert [s["nb_read_packets"] for s in streams(after, "video")] == ["1"]
    elif expected is not None:
        assert abs(seconds - expected) <= 0.25 + 0.05 * expected, (seconds, expected)
    if operation == "transcode_video":
        assert output.content_type == "video/mp4"
        assert after["format"]["format_name"].startswith("mov,mp4")
        (video,) = streams(after, "video")
        source_video = streams(before, "video")[0]
        assert video["codec_name"] == "h264"
        assert video["pix_fmt"] == "yuv420p"
        assert video["width"] % 2 == 0 and video["height"] % 2 == 0
        assert video["height"] <= min(params.get("height", 720), shown_height(source_video) + 1)
        sound = [s["codec_name"] for s in streams(after, "audio")]
        assert sound == (["aac"] if streams(before, "audio") else [])
        return f"h264 {video['width']}x{video['height']} {seconds:.2f}s" + (
            " +aac" if sound else ""
        )
    (audio,) = streams(after, "audio")
    assert not streams(after, "video")
    codec = params.get("codec", "aac")
    assert audio["codec_name"] == codec
    assert output.content_type == media.AUDIO_CODECS[codec].content_type
    return f"{codec} {audio['channels']}ch {seconds:.2f}s"


def run_step(operation: str, source: Path, params: dict[str, Any], workdir: Path) -> list[Output]:
    workdir.mkdir(parents=True, exist_ok=True)
    step = media.transcode_video if operation == "transcode_video" else media.transcode_audio
    return step(source, params, workdir)


def failure(operation: str, source: Path, params: dict[str, Any], workdir: Path) -> PipelineError:
    with pytest.raises(PipelineError) as caught:
        run_step(operation, source, params, workdir)
    return caught.value


# -- in-process --------------------------------------------------------------------------

Made = Callable[[str, Callable[[Path], object]], Path]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Made:
    """``made(name, build)``: the source ``build(path)`` writes, made once for the module
    (several cases read the same source: both steps, or the codecs of one step); ``name``
    says all it depends on. The steps only read it."""
    root = tmp_path_factory.mktemp("media-sources")

    def make(name: str, build: Callable[[Path], object]) -> Path:
        path = root / name
        if not path.exists():
            build(path)
        return path

    return make


@pytest.mark.parametrize(
    ("codec", "bitrate", "output_type"),
    [
        ("opus", "96k", "audio-opus-96k.ogg"),
        ("mp3", 192000, "audio-mp3-192k.mp3"),
        ("aac", "64k", "audio-aac-64k.m4a"),
    ],
)
def test_audio_codecs(
    codec: str, bitrate: object, output_type: str, tmp_path: Path, generated: Generated
) -> None:
    if media.AUDIO_CODECS[codec].encoder not in media.ffmpeg_encoders():
        pytest.skip(f"this FFmpeg has no {media.AUDIO_CODECS[codec].encoder}")
    source = generated / "media/tone.mp3"
    params = {"codec": codec, "bitrate": bitrate}
    (output,) = run_step("transcode_audio", source, params, tmp_path)
    assert output.output_type == output_type
    check_output(source, "transcode_audio", output, params)
    bit_rate = int(ffprobe(output.path)["format"]["bit_rate"])
    assert bit_rate < int(output_type.split("-")[2].split("k")[0]) * 1000 * 1.6


def peak(path: Path) -> float:
    """The largest sample of ``path``'s sound, decoded as floats (full scale: 1.0; a
    player clips what is over it)."""
    decoded = subprocess.run(
        ["ffmpeg", "-nostdin", "-v", "error", "-i", f"file:{path}", "-vn", "-f", "f32le", "-"],
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    samples = array.array("f")
    samples.frombytes(decoded)
    return max(abs(sample) for sample in samples)


@pytest.mark.parametrize("channels", ["5.1", "7.1"])
@pytest.mark.parametrize(
    ("operation", "params"),
    [("transcode_audio", {}), ("transcode_audio", {"codec": "mp3"}), ("transcode_video", {})],
)
def test_surround_is_mixed_down_without_clipping(
    channels: str, operation: str, params: dict[str, Any], tmp_path: Path, made: Made
) -> None:
    # Every channel a tone at half of full scale. AAC (float samples) took the downmix
    # unscaled: peaks of 1.23-1.28 (8,161 samples over full scale in 3 s of 5.1) and
    # 8-10 dB louder than the same input in MP3 (16-bit samples, scaled to fit).
    if params.get("codec") == "mp3" and "libmp3lame" not in media.ffmpeg_encoders():
        pytest.skip("this FFmpeg has no libmp3lame")
    count = 6 if channels == "5.1" else 8
    layout = "|".join(f"c{i}=c0" for i in range(count))
    video = operation == "transcode_video"
    source = made(
        f"surround-{channels}{'-video' if video else ''}.mkv",
        lambda path: ffmpeg(
            *(video_source(3, "160x120") if video else []),
            "-f", "lavfi", "-i", "aevalsrc=0.5*sin(2*PI*440*t):s=48000:d=3",
            *(["-c:v", "libx264", "-preset", "ultrafast"] if video else []),
            "-af", f"pan={channels}|{layout}", "-c:a", "pcm_s16le", str(path),
        ),
    )  # fmt: skip
    (output, *_) = run_step(operation, source, params, tmp_path / "out")
    assert 0.4 < peak(output.path) <= 1.0


@pytest.mark.parametrize("count", [10, 12])
@pytest.mark.parametrize(
    ("operation", "params"),
    [("transcode_audio", {}), ("transcode_audio", {"codec": "opus"}), ("transcode_video", {})],
)
def test_unnamed_channels_past_eight_are_mixed_to_mono(
    count: int, operation: str, params: dict[str, Any], tmp_path: Path, made: Made
) -> None:
    # A multitrack recorder's WAV (10 or 12 microphones, no channel mask): FFmpeg has
    # no layout of that many channels to guess, so it could not mix them to stereo
    # and both steps failed, invalid_input ("Rematrix is needed between 10 channels
    # and stereo but there is not enough information to do it").
    if params.get("codec") == "opus" and "libopus" not in media.ffmpeg_encoders():
        pytest.skip("this FFmpeg has no libopus")
    tones = "|".join(["0.5*sin(2*PI*440*t)"] * count)
    video = operation == "transcode_video"
    source = made(
        f"multitrack-{count}{'-video' if video else ''}.mov",
        lambda path: ffmpeg(
            *(video_source(1, "160x120") if video else []),
            "-f", "lavfi", "-i", f"aevalsrc={tones}:s=48000:d=1",
            *(["-c:v", "libx264", "-preset", "ultrafast"] if video else []),
            "-c:a", "pcm_s16le", str(path),
        ),
    )  # fmt: skip
    (sound,) = streams(ffprobe(source), "audio")
    assert sound["channels"] == count and sound.get("channel_layout", "unknown") == "unknown"
    (output, *_) = run_step(operation, source, params, tmp_path / "out")
    check_output(source, operation, output, params)
    (mixed,) = streams(ffprobe(output.path), "audio")
    assert mixed["channels"] == 1
    assert 0.4 < peak(output.path) <= 1.0  # each microphone at its share: no clipping


def movie_header_says(path: Path, seconds: float) -> None:
    """Rewrite ``path``'s MP4 movie header (``mvhd``, version 0) to say ``seconds``."""
    data = bytearray(path.read_bytes())
    at = data.index(b"mvhd") + 4 + 4 + 8  # version and flags, creation and change times
    (timescale,) = struct.unpack_from(">I", data, at)
    struct.pack_into(">I", data, at + 4, round(seconds * timescale))
    path.write_bytes(data)


@pytest.mark.parametrize("operation", ["transcode_video", "transcode_audio"])
@pytest.mark.parametrize("header", ["empty edit", "lies"])
def test_an_mp4_whose_header_counts_more_than_its_tracks_is_whole(
    header: str, operation: str, tmp_path: Path, made: Made
) -> None:
    # 2 s of picture and sound whose movie header says 7 s (a 5 s empty edit first:
    # the tracks start at 5 s; FFmpeg's output starts at the first frame) or 3600 s
    # (its tracks' sample tables say 2 s). Both steps marked the complete output
    # partial, and reported their progress against 7 or 3600 s: 2 of 3600 until the
    # end (the chunk planner read all the packets first, 3600 s being over 30 min).
    offset = ["-output_ts_offset", "5"] if header == "empty edit" else []

    def build(path: Path) -> None:
        ffmpeg(*video_source(2, "160x120"), *tone_source(2),
               "-c:v", "libx264", "-preset", "ultrafast", "-c:a", "aac", *offset,
               str(path))  # fmt: skip
        if header == "lies":
            movie_header_says(path, 3600)

    source = made(f"header-{header.replace(' ', '-')}.mp4", build)
    assert duration(ffprobe(source)) == pytest.approx(7 if offset else 3600)
    seen: list[progress.Progress] = []
    progress.reporting_to(seen.append)
    try:
        outputs = run_step(operation, source, {}, tmp_path / "out")
    finally:
        progress.reporting_to(None)
    (output,) = outputs  # no usage output: nothing marked partial
    assert duration(ffprobe(output.path)) == pytest.approx(2, abs=0.1)
    assert seen and all(report.total == pytest.approx(2, abs=0.1) for report in seen)
    assert seen[-1].done == seen[-1].total


# Codecs of 8 s of 160x120 and a tone, starting 5 s in, by container.
LATE_START = {
    "matroska": ("-c:v", "libx264", "-preset", "ultrafast", "-c:a", "aac"),
    "webm": ("-c:v", "libvpx", "-deadline", "realtime", "-c:a", "libopus"),
    "asf": ("-c:v", "wmv2", "-c:a", "wmav2"),
}


@pytest.mark.parametrize("operation", ["transcode_video", "transcode_audio"])
@pytest.mark.parametrize("container", sorted(LATE_START))
def test_a_file_whose_times_start_late_is_whole(
    container: str, operation: str, tmp_path: Path, made: Made
) -> None:
    # 8 s whose times start 5 s in (a recording cut from a stream keeps its clock): as
    # FFmpeg writes a Matroska, WebM or ASF, its duration is where it ends, 13 s, which
    # both steps took for its length: the complete output was marked partial (units
    # partial: 1), its progress reported against 13 s (8 of 13 at its end).
    source = made(
        f"late-{container}.{container}",
        lambda path: ffmpeg(
            *video_source(8, "160x120"), *tone_source(8), *LATE_START[container],
            "-threads", "1", "-output_ts_offset", "5", "-f", container, str(path),
        ),
    )  # fmt: skip
    stated = ffprobe(source)["format"]
    assert float(stated["start_time"]) == pytest.approx(5, abs=0.05)
    assert float(stated["duration"]) == pytest.approx(13, abs=0.05)
    seen: list[progress.Progress] = []
    progress.reporting_to(seen.append)
    try:
        outputs = run_step(operation, source, {}, tmp_path / "out")
    finally:
        progress.reporting_to(None)
    (output,) = outputs  # no usage output: nothing marked partial
    assert duration(ffprobe(output.path)) == pytest.approx(8, abs=0.1)
    assert seen and all(report.total == pytest.approx(8, abs=0.1) for report in seen)
    assert seen[-1].done == seen[-1].total


def test_video_height_and_crf(tmp_path: Path, generated: Generated) -> None:
    source = generated / "media/clip.mp4"
    params = {"codec": "h264", "height": 145, "crf": 30}
    (small,) = run_step("transcode_video", source, params, tmp_path / "small")
    assert small.output_type == "video-h264-145p-crf30.mp4"
    check_output(source, "transcode_video", small, params)
    (video,) = streams(ffprobe(small.path), "video")
    assert video["height"] == 144  # even, below the requested 145
    # Asking for more than the source has: the source's height, never upscaled.
    source_height = streams(ffprobe(source), "video")[0]["height"]
    (large,) = run_step("transcode_video", source, {"height": 2160}, tmp_path / "large")
    assert large.output_type == "video-h264-2160p-crf23.mp4"
    (video,) = streams(ffprobe(large.path), "video")
    assert video["height"] == source_height - source_height % 2


def picture(path: Path, size: str, rotation: int = 0) -> Path:
    """A 1 s clip of ``size`` (5 frames, PNG in MOV: no H.264 limit on its size),
    its display matrix turned by ``rotation`` degrees."""
    plain = path.with_name(f"plain-{path.name}")
    ffmpeg("-f", "lavfi", "-i", f"color=c=teal:s={size}:r=5:d=1,format=rgb24",
           "-c:v", "png", str(plain))  # fmt: skip
    return turned(plain, path, rotation)


def turned(source: Path, path: Path, rotation: int) -> Path:
    """``source`` copied to ``path`` (MP4/MOV) with a display matrix of ``rotation``
    degrees (FFmpeg 5.1's mov muxer writes the rotate tag only for a stream copy)."""
    ffmpeg("-i", str(source), "-c", "copy", "-metadata:s:v:0", f"rotate={rotation}", str(path))
    return path


@pytest.mark.parametrize(
    ("size", "rotation", "made"),
    [("17000x64", 0, (15938, 60)), ("4x30000", 90, (15000, 2))],
)
def test_a_picture_wider_than_h264_allows_is_scaled_to_fit(
    size: str, rotation: int, made: tuple[int, int], tmp_path: Path
) -> None:
    # libx264 encodes at most 16384 pixels a side: 17000x64 failed ("libx264:
    # invalid width x height (17000x64)"). Scaled to fit, its shape kept; a portrait
    # phone video stored 4x30000 is shown 30000x4 (its width bounded, not its height).
    source = picture(tmp_path / "wide.mov", size, rotation)
    (output,) = run_step("transcode_video", source, {}, tmp_path / "out")
    check_output(source, "transcode_video", output, {})
    (video,) = streams(ffprobe(output.path), "video")
    assert (video["width"], video["height"]) == made


@pytest.mark.parametrize(
    ("size", "message"),
    [
        ("40000x2", "is too wide: 16384 pixels wide (libx264's most), it would be 0.8192 high"),
        ("2x17000", "is too narrow: 720 pixels high, it would be 0.085 wide"),
    ],
)
def test_a_picture_no_h264_keeps_the_shape_of_is_refused(
    size: str, message: str, tmp_path: Path
) -> None:
    # 40000x2 under 16384 wide is under 2 pixels high: libx264's "invalid width x
    # height (40000x2)"; 2x17000 at 720 high is under a pixel wide: a width of 0,
    # "Cannot allocate memory" (memory_limit).
    error = failure("transcode_video", picture(tmp_path / "in.mov", size), {}, tmp_path / "a")
    assert error.code == "invalid_input" and message in error.message, error.message


def test_a_turned_video_is_made_upright(tmp_path: Path) -> None:
    # A phone's portrait video: 320x240 stored, a display matrix turning it 90
    # degrees, shown 240x320. The output is upright, 240x320 with no turn; the tests'
    # check compared its 320 with the stored 240 and called it upscaled.
    plain = tmp_path / "plain.mp4"
    ffmpeg(*video_source(1, "320x240"), "-c:v", "libx264", "-preset", "ultrafast", str(plain))
    source = turned(plain, tmp_path / "portrait.mp4", 90)
    (stored,) = streams(ffprobe(source), "video")
    assert (stored["width"], stored["height"], shown_height(stored)) == (320, 240, 320)
    (output,) = run_step("transcode_video", source, {}, tmp_path / "out")
    check_output(source, "transcode_video", output, {})
    (video,) = streams(ffprobe(output.path), "video")
    assert (video["width"], video["height"], shown_height(video)) == (240, 320, 320)


def bar_luma(path: Path) -> list[float]:
    """The mean luma (8-bit code values, as coded) of each of :func:`bars`' three bars
    in the middle frame of a 336x240 yuv420p video, their edges left out."""
    frame = subprocess.run(
        ["ffmpeg", "-v", "error", "-ss", "0.5", "-i", f"file:{path}", "-frames:v", "1",
         "-f", "rawvideo", "-pix_fmt", "yuv420p", "-"],
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    width, height = 336, 240
    assert len(frame) == width * height * 3 // 2
    means = []
    for bar in range(3):
        left, right = bar * width // 3 + 10, (bar + 1) * width // 3 - 10
        values = [frame[y * width + x] for y in range(20, height - 20) for x in range(left, right)]
        means.append(sum(values) / len(values))
    return means


def colour_tags(path: Path) -> tuple[str, ...]:
    (video,) = streams(ffprobe(path), "video")
    keys = ("pix_fmt", "color_primaries", "color_transfer", "color_space", "color_range")
    return tuple(video.get(key, "") for key in keys)


@pytest.fixture(scope="module")
def sdr(made: Made, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Output]:
    """The SDR bars and their transcode (what the HDR cases are compared with, and the
    SDR case's own), made once for the module."""
    source = made("bars-sdr.mp4", bars)
    (output,) = run_step("transcode_video", source, {}, tmp_path_factory.mktemp("sdr"))
    return source, output


@pytest.mark.parametrize("transfer", ["smpte2084", "arib-std-b67"])
def test_hdr_is_tone_mapped_to_sdr(
    transfer: str, tmp_path: Path, made: Made, sdr: tuple[Path, Output]
) -> None:
    # H.264 8-bit is shown as SDR BT.709. PQ cut to 8 bits as it was: the bars (SDR
    # luma 43/126/235) came out 45/93/127 tagged bt2020/smpte2084, a washed-out grey
    # picture; HLG 34/89/154. Tone-mapped: 43/126/201, the dark and mid bars as SDR
    # has them, the 100-nit white bent a little under SDR's white, tagged BT.709.
    source = made(f"bars-{transfer}.mp4", lambda path: bars(path, transfer))
    (hdr,) = run_step("transcode_video", source, {}, tmp_path / "hdr")
    assert colour_tags(hdr.path) == ("yuv420p", "bt709", "bt709", "bt709", "tv")
    (dark, grey, white), expected = bar_luma(hdr.path), bar_luma(sdr[1].path)
    assert abs(dark - expected[0]) <= 3 and abs(grey - expected[1]) <= 3, (dark, grey, expected)
    assert expected[2] - 40 <= white <= expected[2], (white, expected)
    check_output(source, "transcode_video", hdr, {})


def test_sdr_keeps_its_picture_and_tags(sdr: tuple[Path, Output]) -> None:
    # The SDR path is the one it was: no tone-mapping, no tags added.
    source, output = sdr
    assert colour_tags(output.path) == ("yuv420p", "", "", "", "")
    assert [round(v) for v in bar_luma(output.path)] == [round(v) for v in bar_luma(source)]


def test_hdr_without_zscale_keeps_its_own_tags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, made: Made
) -> None:
    # An FFmpeg without zimg cannot tone-map: the picture is HDR's, and says so.
    monkeypatch.setattr(media, "ffmpeg_filters", lambda: frozenset({"scale", "format"}))
    source = made("bars-smpte2084.mp4", lambda path: bars(path, "smpte2084"))
    (hdr,) = run_step("transcode_video", source, {}, tmp_path / "hdr")
    assert colour_tags(hdr.path) == ("yuv420p", "bt2020", "smpte2084", "bt2020nc", "tv")


def test_duration_limit(tmp_path: Path, generated: Generated) -> None:
    # Stated in the header (MP4 mvhd, 2 s): refused before anything is decoded.
    source = generated / "media/clip.mp4"
    error = failure("transcode_video", source, {"max_duration_seconds": 0.5}, tmp_path / "a")
    assert error.code == "duration_limit"
    assert "limit" in error.message
    # Live Matroska states no duration: the output is cut at the limit + 1 s, then refused.
    live = generated / "media/live.mkv"
    assert duration(ffprobe(live)) is None
    error = failure("transcode_video", live, {"max_duration_seconds": 0.2}, tmp_path / "b")
    assert error.code == "duration_limit"
    assert list((tmp_path / "b").iterdir()) == []
    # Audio too (3 s).
    mp3 = generated / "media/tone.mp3"
    error = failure("transcode_audio", mp3, {"max_duration_seconds": 1}, tmp_path / "c")
    assert error.code == "duration_limit"


@pytest.mark.parametrize(
    ("operation", "params"),
    [
        ("transcode_video", {"codec": "vp9"}),
        ("transcode_video", {"height": 0}),
        ("transcode_video", {"height": "720"}),
        ("transcode_video", {"crf": 52}),
        ("transcode_video", {"crf": True}),
        ("transcode_video", {"width": 640}),
        ("transcode_video", {"max_duration_seconds": -1}),
        ("transcode_audio", {"codec": "flac"}),
        ("transcode_audio", {"bitrate": "128"}),
        ("transcode_audio", {"bitrate": "9000k"}),
        ("transcode_audio", {"bitrate": 128}),
        ("transcode_audio", {"format": "m4a"}),
    ],
)
def test_invalid_params(
    operation: str, params: dict[str, Any], tmp_path: Path, generated: Generated
) -> None:
    source = generated / "media/clip.mp4"
    error = failure(operation, source, params, tmp_path)
    assert error.code == "invalid_params", error.message


@pytest.mark.parametrize(
    "content",
    [
        hostile.PLAYLIST,
        hostile.CONCAT,
        b"%PDF-1.4\n" + b"\x00" * 100,
        b"\x00\x01\x02\x03 random bytes",
    ],
)
def test_not_media_is_refused_before_ffmpeg(content: bytes, tmp_path: Path) -> None:
    source = tmp_path / "input.mp4"
    source.write_bytes(content)
    for operation in ("transcode_video", "transcode_audio"):
        error = failure(operation, source, {}, tmp_path / operation)
        assert error.code == "unsupported_format", error.message


def test_input_path_is_never_an_option(tmp_path: Path, generated: Generated) -> None:
    source = tmp_path / "-y"
    source.write_bytes(generated.read("media/clip.mp4"))
    (output,) = run_step("transcode_video", source, {}, tmp_path / "out")
    check_output(source, "transcode_video", output, {})


# -- every media row, generated and of the corpus, in the sandbox -------------------------


@dataclass
class Case:
    row: Row
    operation: str
    source: Path


def media_cases(root: Path, rows: list[Row]) -> list[Case]:
    cases: list[Case] = []
    for row in rows:
        path = root / row.path
        if row.path.startswith("media/"):
            probed = ffprobe(path)
            # Every operation the content allows: video if it has a picture, audio if sound.
            if streams(probed, "video"):
                cases.append(Case(row, "transcode_video", path))
            if streams(probed, "audio"):
                cases.append(Case(row, "transcode_audio", path))
        elif path.suffix.lower() in MEDIA_EXTENSIONS and (
            row.kind.startswith("hostile:media") or row.kind.endswith(":mp4")
        ):
            by_name = ".mp4", ".mov", ".avi"
            video = path.suffix.lower() in by_name
            cases.append(Case(row, "transcode_video" if video else "transcode_audio", path))
    return cases


@pytest.fixture(scope="module")
def executor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChildExecutor]:
    root = tmp_path_factory.mktemp("media-sandbox")
    with ChildExecutor(root, preload=("pipelines.registry", "pipelines.media")) as ex:
        yield ex


def limits_of(operation: str) -> dict[str, Any]:
    profile = PROFILES[operation]
    return {
        "timeout_seconds": profile["timeout_seconds"],
        "memory_limit_mb": profile["memory_limit_mb"],
        "max_processes": profile.get("max_processes", 16),
    }


def test_generated_media_in_sandbox(executor: ChildExecutor, generated: Generated) -> None:
    cases = media_cases(generated.root, generated.rows(["media", "hostile"]))
    assert {c.row.expected.partition(":")[0] for c in cases} == {"valid", "reject"}
    in_sandbox(executor, cases)


@pytest.mark.corpus
def test_corpus_media_in_sandbox(executor: ChildExecutor) -> None:
    cases = media_cases(corpus(), manifest_rows(("media", "hostile")))
    assert len(cases) >= 45
    in_sandbox(executor, cases)


def in_sandbox(executor: ChildExecutor, cases: list[Case]) -> None:
    """Each case in the sandbox with its profile's limits; every outcome as its row says,
    every output checked (:func:`check_output`), named as the step names it with no
    params, and alone in its workdir with the input and the child's log."""
    problems: list[str] = []
    table: list[tuple[str, str, str, str, str]] = []
    for number, case in enumerate(cases):
        job_id = f"media-{os.getpid()}-{number}"
        workdir = executor.prepare(job_id)
        input_path = workdir / "input" / "source"
        input_path.write_bytes(case.source.read_bytes())
        started = time.monotonic()
        try:
            result = executor.run(
                job_id, case.operation, input_path, {}, **limits_of(case.operation)
            )
            outcome, code, detail = "done", "", ""
            try:
                (output,) = result.outputs
                expected = DEFAULT_OUTPUTS[case.operation]
                assert output.output_type == expected
                assert output.path == workdir / expected
                # Nothing else left behind (ffmpeg's logs are removed): its input, the
                # child's log and the output.
                assert sorted(p.name for p in workdir.iterdir()) == sorted(
                    [".child.log", "input", expected]
                )
                detail = check_output(case.source, case.operation, output, {})
            except AssertionError as exc:
                problems.append(f"{case.row.path} {case.operation}: bad output {exc}")
                detail = f"BAD {exc}"
        except ChildFailed as exc:
            outcome, code, detail = "failed", exc.code, exc.message
        finally:
            executor.cleanup(job_id)
        elapsed = f"{time.monotonic() - started:.2f}s"
        op = case.operation.removeprefix("transcode_")
        table.append(
            (case.row.path, op, case.row.expected, f"{outcome} {code}", elapsed + " " + detail)
        )
        problem = judge(case, outcome, code, detail)
        if problem:
            problems.append(f"{case.row.path} {case.operation}: {problem}")

    width = max(len(r[0]) for r in table)
    for path, op, expected, outcome, detail in table:
        print(f"{path:<{width}}  {op:<5}  {expected:<24}  {outcome:<30}  {detail[:110]}")
    assert problems == []


def run_in_sandbox(ex: ChildExecutor, source: Path, operation: str, **limits: Any) -> ChildFailed:
    job_id = f"media-limits-{os.getpid()}-{limits['memory_limit_mb']}-{limits['timeout_seconds']}"
    input_path = ex.prepare(job_id) / "input" / "source"
    input_path.write_bytes(source.read_bytes())
    try:
        with pytest.raises(ChildFailed) as caught:
            ex.run(job_id, operation, input_path, {}, **limits)
        return caught.value
    finally:
        ex.cleanup(job_id)


def frequency(path: Path, track: int = 0) -> float:
    """The pitch of ``path``'s audio ``track`` (a pure tone), in Hz: its zero crossings,
    halved."""
    decoded = subprocess.run(
        ["ffmpeg", "-nostdin", "-v", "error", "-i", f"file:{path}", "-map", f"0:a:{track}",
         "-ac", "1",
         "-ar", "48000", "-f", "f32le", "-"],
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    samples = array.array("f")
    samples.frombytes(decoded)
    crossings = sum(1 for a, b in itertools.pairwise(samples) if (a < 0) != (b < 0))
    return crossings / 2 / (len(samples) / 48000)


@pytest.mark.parametrize("operation", ["transcode_video", "transcode_audio"])
def test_the_default_audio_track_is_the_one_kept(
    operation: str, executor: ChildExecutor, tmp_path: Path
) -> None:
    # Track 1 German at 300 Hz, track 2 English at 900 Hz and flagged default: players
    # play track 2. Both steps kept track 1 (300 Hz measured in each output).
    source = tmp_path / "two-languages.mkv"
    ffmpeg(*(video_source(2, "160x120") if operation == "transcode_video" else []),
           "-f", "lavfi", "-i", "sine=frequency=300:sample_rate=48000:duration=2",
           "-f", "lavfi", "-i", "sine=frequency=900:sample_rate=48000:duration=2",
           *(["-map", "0", "-map", "1", "-map", "2", "-c:v", "libx264", "-preset", "ultrafast"]
             if operation == "transcode_video" else ["-map", "0", "-map", "1"]),
           "-c:a", "libopus", "-metadata:s:a:0", "language=deu", "-metadata:s:a:1",
           "language=eng", "-disposition:a:0", "0", "-disposition:a:1", "default",
           str(source))  # fmt: skip
    assert frequency(source, 0) == pytest.approx(300, rel=0.05)
    assert frequency(source, 1) == pytest.approx(900, rel=0.05)
    job_id = f"media-default-track-{os.getpid()}-{operation}"
    input_path = executor.prepare(job_id) / "input" / "source"
    input_path.write_bytes(source.read_bytes())
    try:
        result = executor.run(job_id, operation, input_path, {}, **limits_of(operation))
        (output,) = result.outputs
        check_output(source, operation, output, {})
        assert frequency(output.path) == pytest.approx(900, rel=0.05)
    finally:
        executor.cleanup(job_id)


def test_rlimits_become_their_codes(
    executor: ChildExecutor, generated: Generated, tmp_path: Path
) -> None:
    """FFmpeg under the job's rlimits: RLIMIT_AS and RLIMIT_CPU keep the sandbox's codes."""
    # 10 s of 1280x720, a few CPU-seconds: busy-720p.mp4 (2 s, transcoded whole by the
    # sandbox cases) five times over, its packets copied.
    source = tmp_path / "busy-10s.mp4"
    ffmpeg("-stream_loop", "4", "-i", str(generated / "media/busy-720p.mp4"), "-c", "copy",
           "-f", "mp4", str(source))  # fmt: skip
    assert duration(ffprobe(source)) == pytest.approx(10)
    # 256 MB of address space: ffprobe cannot even map its libraries.
    error = run_in_sandbox(
        executor, source, "transcode_video", timeout_seconds=60, memory_limit_mb=256
    )
    assert error.code == "memory_limit", error.message
    # 1 s of CPU (wall clock 1.5 s): ffmpeg is stopped by SIGXCPU, or the wall clock
    # wins (with 2 s, a quiet machine finished the transcode in time: no error at all).
    error = run_in_sandbox(
        executor, source, "transcode_video", timeout_seconds=1, memory_limit_mb=1024
    )
    assert error.code in ("cpu_limit", "timeout"), error.message


def judge(case: Case, outcome: str, code: str, message: str) -> str | None:
    """What is wrong with ``outcome`` for the row's expectation, None if it is right."""
    verdict, _, reason = case.row.expected.partition(":")
    if verdict == "valid":
        return None if outcome == "done" else f"valid file failed: {code} {message}"
    if verdict == "reject":
        allowed = REJECT_CODES.get(reason, STABLE_CODES)
        if outcome == "done":
            return "should have been refused"
        if code not in allowed:
            return f"{code} is not one of {sorted(allowed)}: {message}"
        if reason == "no-samples" and "no samples" not in message:
            return f"message should say 'no samples': {message}"
        return None
    if verdict == "tolerate":
        return None if outcome == "done" or code in STABLE_CODES else f"unstable {code}"
    return f"unexpected expectation {case.row.expected}"
