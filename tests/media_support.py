"""Generated clips for chunked transcodes, and the checks that a chunked output is a
single pass's equal: frame timestamps, duration, codecs, a clean strict decode, and
each frame close to the single pass's same frame (a shifted, doubled or lost frame
of ``testsrc2``, whose picture moves every frame, would not be)."""

from __future__ import annotations

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


def probe(path: Path) -> dict[str, Any]:
    done = subprocess.run(
        ["ffprobe", "-v", "error", "-print_format", "json", "-show_format", "-show_streams",
         f"file:{path}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def codecs(path: Path) -> list[str]:
    return [s["codec_name"] for s in probe(path)["streams"]]


def duration(path: Path) -> float:
    return float(probe(path)["format"]["duration"])


def frame_times(path: Path) -> list[float]:
    """The video frames' presentation times, decoded."""
    done = subprocess.run(
        ["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries",
         "frame=pts_time", "-print_format", "csv=p=0", f"file:{path}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return [float(line.strip().strip(",")) for line in done.stdout.split()]


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
    first = f"[0:v]trim=start_frame={max(0, -shift)},setpts=PTS-STARTPTS[x]"
    second = f"[1:v]trim=start_frame={max(0, shift)},setpts=PTS-STARTPTS[y]"
    done = subprocess.run(
        ["ffmpeg", "-nostdin", "-v", "error", "-i", f"file:{a}", "-i", f"file:{b}",
         "-lavfi", f"{first};{second};[x][y]psnr=stats_file=-", "-f", "null", "-"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    values = re.findall(r"psnr_avg:(\S+)", done.stdout)
    return [math.inf if v == "inf" else float(v) for v in values]


def assert_same_as_single_pass(
    chunked: Path, single: Path, seconds: int, *, frames: int | None = None
) -> None:
    """The issue's item 3: the same codecs, the duration within a frame, a clean strict
    decode, the same frames at the same times (none doubled or lost at a boundary):
    ``seconds`` of :data:`RATE` frames, or ``frames``."""
    import pytest

    assert codecs(chunked) == codecs(single)
    assert abs(duration(chunked) - duration(single)) <= FRAME
    assert decode_errors(chunked) == ""
    times, expected = frame_times(chunked), frame_times(single)
    assert len(times) == len(expected) == (seconds * RATE if frames is None else frames)
    assert times == pytest.approx(expected, abs=1e-3)
    assert min(frame_psnr(chunked, single)) >= SAME_FRAME_PSNR
