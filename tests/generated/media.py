"""Audio and video from FFmpeg's lavfi sources (``testsrc2`` pictures, ``sine`` tones).

Every call asks for bit-exact output without metadata and one thread, so the same FFmpeg
writes the same bytes each time.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.generated.entries import Entry

SECONDS = 2.0
SIZE = "320x240"
# The rlimit cases: H.264 at 720p from this, looped to 10 s, costs a few CPU-seconds
# (tests/integration/test_pipeline_media.py); 2 s for the sandbox cases' whole transcode.
BUSY_SECONDS = 2
BUSY_SIZE = "1280x720"
_EXACT = ["-fflags", "+bitexact", "-flags:v", "+bitexact", "-flags:a", "+bitexact"]
_EXACT += ["-map_metadata", "-1", "-threads", "1"]


def ffmpeg(*args: str) -> None:
    tool = shutil.which("ffmpeg")
    assert tool is not None, "FFmpeg is needed to generate media"
    subprocess.run(
        [tool, "-nostdin", "-hide_banner", "-loglevel", "error", "-y", *args],
        check=True,
        capture_output=True,
        timeout=300,
    )


def video_source(seconds: float = SECONDS, size: str = SIZE, rate: int = 25) -> list[str]:
    return ["-f", "lavfi", "-i", f"testsrc2=size={size}:rate={rate}:duration={seconds}"]


def tone_source(seconds: float = SECONDS, frequency: int = 440) -> list[str]:
    return ["-f", "lavfi", "-i", f"sine=frequency={frequency}:sample_rate=44100:duration={seconds}"]


# Three bars, left to right: dark grey, mid grey, white (8-bit RGB levels).
BAR_LEVELS = (0x20, 0x80, 0xFF)


def bars(path: Path, transfer: str = "", seconds: float = 1.0) -> Path:
    """A 336x240 clip of :data:`BAR_LEVELS` bars in H.264. ``transfer`` "smpte2084"
    (PQ) or "arib-std-b67" (HLG): the same picture as HDR does it, 10-bit BT.2020 with
    SDR white at 100 nits (zimg's conversion), tagged so; "": SDR, untagged."""
    colours = ";".join(
        f"color=c=0x{level:02x}{level:02x}{level:02x}:s=112x240:r=25:d={seconds}[b{i}]"
        for i, level in enumerate(BAR_LEVELS)
    )
    graph = f"{colours};[b0][b1][b2]hstack=3"
    if not transfer:
        ffmpeg("-filter_complex", graph, *_EXACT, *H264, str(path))
        return path
    graph += (
        ",zscale=tin=bt709:pin=bt709:min=bt709:rin=tv"
        f":t={transfer}:p=bt2020:m=bt2020nc:r=tv:npl=100,format=yuv420p10le"
    )
    ffmpeg("-filter_complex", graph, *_EXACT, "-c:v", "libx264", "-pix_fmt", "yuv420p10le",
           "-color_primaries", "bt2020", "-color_trc", transfer, "-colorspace", "bt2020nc",
           "-color_range", "tv", str(path))  # fmt: skip
    return path


H264 = ["-c:v", "libx264", "-pix_fmt", "yuv420p"]
# name -> (sources, codecs and container options)
_BOTH = (*video_source(), *tone_source())
FILES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "clip.mp4": (_BOTH, (*H264, "-c:a", "aac", "-movflags", "+faststart")),
    "clip.mkv": (_BOTH, (*H264, "-c:a", "libopus")),
    "clip.webm": (_BOTH, ("-c:v", "libvpx", "-b:v", "200k", "-c:a", "libvorbis")),
    "clip.avi": (_BOTH, ("-c:v", "mpeg4", "-c:a", "pcm_s16le")),
    "silent.mov": (tuple(video_source()), tuple(H264)),
    # Matroska written as a live stream: no Duration element, so nothing states how
    # long it is until it has been decoded.
    "live.mkv": (tuple(video_source(3)), (*H264, "-live", "1")),
    "busy-720p.mp4": (tuple(video_source(BUSY_SECONDS, BUSY_SIZE)), ("-c:v", "mpeg4", "-q:v", "8")),
    "tone.mp3": (
        tuple(tone_source(3)),
        ("-c:a", "libmp3lame", "-b:a", "128k", "-id3v2_version", "4"),
    ),
    "tone.m4a": (tuple(tone_source()), ("-c:a", "aac")),
    "tone.wav": (tuple(tone_source()), ("-c:a", "pcm_s16le")),
    "tone.flac": (tuple(tone_source()), ("-c:a", "flac")),
    "tone.ogg": (tuple(tone_source()), ("-c:a", "libvorbis")),
    "tone.aiff": (tuple(tone_source()), ("-c:a", "pcm_s16be")),
}


def build(directory: Path) -> list[Entry]:
    out = directory / "media"
    out.mkdir(parents=True, exist_ok=True)
    for name, (sources, options) in FILES.items():
        ffmpeg(*sources, *_EXACT, *options, str(out / name))

    def media(name: str, kind: str, note: str) -> Entry:
        return Entry(f"media/{name}", f"media:{kind}", "valid", note)

    return [
        media("clip.mp4", "mp4", f"H.264 {SIZE} + AAC, {SECONDS:g} s"),
        media("clip.mkv", "mkv", "H.264 + Opus in Matroska"),
        media("clip.webm", "webm", "VP8 + Vorbis"),
        media("clip.avi", "avi", "MPEG-4 part 2 + PCM"),
        media("silent.mov", "mov", "H.264, no sound"),
        media("live.mkv", "mkv", "3 s, no stated duration (live Matroska)"),
        media("busy-720p.mp4", "mp4", f"{BUSY_SIZE}, {BUSY_SECONDS} s, MPEG-4 part 2"),
        media("tone.mp3", "mp3", "3 s, ID3v2.4"),
        media("tone.m4a", "m4a", "AAC"),
        media("tone.wav", "wav", "PCM"),
        media("tone.flac", "flac", "FLAC"),
        media("tone.ogg", "ogg", "Vorbis"),
        media("tone.aiff", "aiff", "PCM big-endian"),
    ]
