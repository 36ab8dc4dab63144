"""Generated clips for chunked transcodes, and the checks that a chunked output is a
single pass's equal: frame timestamps, duration, codecs, a clean strict decode, and
each frame close to the single pass's same frame (a shifted, doubled or lost frame
of ``testsrc2``, whose picture moves every frame, would not be)."""

from __future__ import annotations

import functools
import json
import math
import re
import subprocess
from pathlib import Path
from typing import Any

from tests.generated.media import ffmpeg, tone_source, video_source

RATE = 25
FRAME = 1 / RATE
# Frames of the same source encoded twice at the same CRF: well above this; a frame
# compared with its neighbour: well below (checked by the tests' own control).
SAME_FRAME_PSNR = 30.0


def clip(
    path: Path,
    seconds: float,
    *,
    keyframe_seconds: float = 1.0,
    sound: bool = True,
    faststart: bool = False,
    bframes: bool = False,
) -> Path:
    """A small H.264 (+ AAC) MP4 with a keyframe every ``keyframe_seconds`` (its index
    first with ``faststart``, as streamed uploads have it; else last)."""
    sources = [*video_source(seconds, "160x120", RATE)]
    if sound:
        sources += tone_source(seconds)
    gop = str(round(keyframe_seconds * RATE))
    # ultrafast has no B-frames; medium's reorder them (pts after dts, an edit list).
    preset = "medium" if bframes else "ultrafast"
    codecs = ["-c:v", "libx264", "-preset", preset, "-pix_fmt", "yuv420p", "-g", gop]
    codecs += ["-keyint_min", gop, "-sc_threshold", "0"]
    if sound:
        codecs += ["-c:a", "aac"]
    if faststart:
        codecs += ["-movflags", "+faststart"]
    ffmpeg(*sources, *codecs, "-threads", "1", "-f", "mp4", str(path))
    return path


def _version(path: Path) -> tuple[str, int, int, int, int]:
    """What names ``path``'s bytes as they are now: a file written again (same path,
    even the same size) is another version."""
    st = path.stat()
    return (str(path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=512)
def _ffprobe(version: tuple[str, int, int, int, int], *args: str) -> str:
    """ffprobe's output for one version of a file (ffprobe starts in ~0.1 CPU-s, most of
    it loading FFmpeg's libraries: a file compared several times is read once)."""
    done = subprocess.run(
        ["ffprobe", "-v", "error", *args, f"file:{version[0]}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout


def ffprobe(path: Path, *args: str) -> str:
    """What ``ffprobe -v error <args> file:<path>`` prints, read once for each version
    of the file."""
    return _ffprobe(_version(path), *args)


def probe(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        ffprobe(path, "-print_format", "json", "-show_format", "-show_streams")
    )
    return data


def codecs(path: Path) -> list[str]:
    return [s["codec_name"] for s in probe(path)["streams"]]


def duration(path: Path) -> float:
    return float(probe(path)["format"]["duration"])


def frame_times(path: Path) -> list[float]:
    """The video frames' presentation times, decoded."""
    found = ffprobe(
        path,
        "-select_streams",
        "v:0",
        "-show_entries",
        "frame=pts_time",
        "-print_format",
        "csv=p=0",
    )
    return [float(line.strip().strip(",")) for line in found.split()]


def summary(path: Path) -> tuple[list[str], float, list[float]]:
    """:func:`codecs`, :func:`duration` and :func:`frame_times` of ``path`` from one
    ffprobe (its streams, its format and every stream's frames, decoded)."""
    entries = "format:stream:frame=media_type,stream_index,pts_time"
    data = json.loads(ffprobe(path, "-print_format", "json", "-show_entries", entries))
    streams = data["streams"]
    video = next(s["index"] for s in streams if s["codec_type"] == "video")  # v:0
    times = [
        float(f["pts_time"])
        for f in data.get("frames", [])
        if f.get("media_type") == "video" and f.get("stream_index") == video
    ]
    return [s["codec_name"] for s in streams], float(data["format"]["duration"]), times


def decode_errors(path: Path) -> str:
    """What a strict full decode (``-xerror``) says: empty when clean."""
    done = subprocess.run(
        ["ffmpeg", "-nostdin", "-v", "error", "-xerror", "-i", f"file:{path}", "-f", "null", "-"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return done.stderr.strip() if done.returncode == 0 else f"exit {done.returncode}: {done.stderr}"


def frame_psnr(a: Path, b: Path, *, shift: int = 0) -> list[float]:
    """Per-frame PSNR of ``a``'s frames against ``b``'s (``shift``: ``a``'s frame i
    against ``b``'s i + shift)."""
    done = subprocess.run(
        ["ffmpeg", "-nostdin", "-v", "error", *_psnr_args(a, b, shift), "-f", "null", "-"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return _psnr_values(done.stdout)


def _psnr_args(a: Path, b: Path, shift: int = 0) -> list[str]:
    """``a`` and ``b`` in, their pictures' PSNR (to stdout) out as ``[psnr]``."""
    first = f"[0:v]trim=start_frame={max(0, -shift)},setpts=PTS-STARTPTS[x]"
    second = f"[1:v]trim=start_frame={max(0, shift)},setpts=PTS-STARTPTS[y]"
    graph = f"{first};{second};[x][y]psnr=stats_file=-[psnr]"
    return ["-i", f"file:{a}", "-i", f"file:{b}", "-lavfi", graph, "-map", "[psnr]"]


def _psnr_values(stats: str) -> list[float]:
    values = re.findall(r"psnr_avg:(\S+)", stats)
    return [math.inf if v == "inf" else float(v) for v in values]


def decode_errors_and_psnr(a: Path, b: Path) -> tuple[str, list[float]]:
    """:func:`decode_errors` of ``a`` (its picture and its sound, if any) and
    :func:`frame_psnr` of ``a`` against ``b``, from one FFmpeg (a strict decode of both)."""
    done = subprocess.run(
        ["ffmpeg", "-nostdin", "-v", "error", "-xerror", *_psnr_args(a, b), "-map", "0:a:0?",
         "-f", "null", "-"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        return f"exit {done.returncode}: {done.stderr}", []
    return done.stderr.strip(), _psnr_values(done.stdout)


def assert_same_as_single_pass(
    chunked: Path, single: Path, seconds: int, *, frames: int | None = None
) -> None:
    """The issue's item 3: the same codecs, the duration within a frame, a clean strict
    decode, the same frames at the same times (none doubled or lost at a boundary):
    ``seconds`` of :data:`RATE` frames, or ``frames``."""
    import pytest

    (found, length, times), (wanted, single_length, expected) = map(summary, (chunked, single))
    assert found == wanted
    assert abs(length - single_length) <= FRAME
    errors, psnr = decode_errors_and_psnr(chunked, single)
    assert errors == ""
    assert len(times) == len(expected) == (seconds * RATE if frames is None else frames)
    assert times == pytest.approx(expected, abs=1e-3)
    assert min(psnr) >= SAME_FRAME_PSNR
