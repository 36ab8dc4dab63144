"""``transcode_video`` in chunks: a long input survives the loss of its worker.

An input whose stated duration is over the profile's ``chunk_above_seconds`` is cut
at its own keyframes into chunks of about ``chunk_seconds`` (:func:`plan`, from the
video stream's packets as ffprobe lists them: no decoding). Each chunk is transcoded
on its own (``-ss`` at its first keyframe's time, exactly its frame count), so it is an
independent H.264 file starting with an IDR frame; the sound is transcoded once, for
the whole input. Every finished piece is a checkpoint (:mod:`pipelines.checkpoints`:
``chunk-00000.mp4`` ..., ``audio.m4a``) that the worker stores as it appears and
puts back before a retry: a retry transcodes only the pieces missing. A piece put back
is used only once it decodes without an error (and, for a chunk, holds its frame
count): one damaged in storage (truncated, bytes changed) is transcoded again, never
joined into the output nor taken for a fault of the input. A piece is tied to the
FFmpeg build that made it (:func:`pipelines.media.ffmpeg_build`): a retry on a node
with another build transcodes every chunk again. The output is
the chunks concatenated without re-encoding (FFmpeg's concat demuxer, stream copy,
each chunk after the length its MP4 states in ``_CHUNK_TIMESCALE`` ticks a second)
with the sound muxed beside them, each keeping its own times (a sound that starts
after the picture keeps its delay): the same codecs, frame count and duration (within
a frame) as a single pass. A variable frame rate (:func:`variable_rate`) is chunked
with its frames' own times (the caller's ``video_args`` say so) and each chunk's
length given to the join (:func:`_listing`): the single pass's frames at its times.

The step reports how many chunks it transcoded and how many it found done, as its
units of work (``chunks``, ``chunks_resumed``), so an attempt's record says how much
a retry saved. Progress is the media time done against the input's duration, the
resumed chunks counted as done, with a share of it left to the sound's pass, which
comes last (:func:`sound_share`): the chunks end below the total and the sound's
pass moves it on, rather than the progress waiting at its end while the sound is
made (at 160x120, as long as every chunk together).
"""

from __future__ import annotations

import decimal
import itertools
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

from pipelines import checkpoints, progress
from pipelines.registry import PipelineError

log = logging.getLogger(__name__)

CHUNK_SECONDS_KEY = "chunk_seconds"
CHUNK_ABOVE_KEY = "chunk_above_seconds"
DEFAULT_CHUNK_SECONDS = 60
# The seed: transcodes longer than 30 minutes checkpoint their progress.
DEFAULT_CHUNK_ABOVE_SECONDS = 1800
AUDIO_PIECE = "audio.m4a"
# CPU seconds per second of media, one thread (measured on testsrc2 with FFmpeg 5.1):
# libx264 veryfast crf 23 costs ~0.004 plus ~9e-9 a pixel (160x120 at 10 frames a
# second 0.0065, 640x360 at 25 0.062, 1280x720 at 25 0.21); AAC at 128 kbit/s 0.007.
_PICTURE_BASE_CPU = 0.004
_PICTURE_PIXEL_CPU = 9e-9
_SOUND_CPU = 0.007
# Times closer than this (seconds) are the same (ffprobe prints microseconds).
_SAME_TIME = 1e-3
# A variable rate's chunk 0 starts where the single pass's picture does within this
# (seconds): the time bases' ticks as ffprobe prints them, in microseconds.
_PLACED = 1e-5
# A chunk's MP4 states its length in this many ticks a second (the MP4 muxer's default
# is 1000), which the join (the concat demuxer) starts the next chunk after: every
# frame of 23.976, 24, 25, 29.97, 30, 50, 59.94, 60 ... fps lasts whole ticks. In
# milliseconds 40 frames at 29.97 fps (1.334667 s) said 1.335: each later frame
# that much late, more at every such join.
_CHUNK_TIMESCALE = 120_000
# Frame steps this close (seconds) are one constant rate's, rounded to the time base: a
# 29.97 fps Matroska on its 1 ms time base steps 33 and 34 ms.
_EVEN_STEPS = 2e-3


@dataclass(frozen=True, slots=True)
class Chunk:
    """One independent piece of the video: from the keyframe at ``start`` (seconds, as
    ffprobe printed it), ``frames`` frames (None: to the end)."""

    index: int
    start: str
    seconds: float
    frames: int | None

    @property
    def name(self) -> str:
        return f"chunk-{self.index:05d}.mp4"


def plan(packets: Sequence[tuple[float, str, bool]], chunk_seconds: float) -> list[Chunk]:
    """Cut the video stream's packets ``(pts seconds, pts as printed, keyframe)`` into
    chunks of at least ``chunk_seconds`` each starting at a keyframe (the last one takes
    what is left, and a tail under half a chunk goes with the one before). The first
    chunk starts at the first keyframe; packets before it (no keyframe to decode them
    from) and packets without a time are not counted."""
    timed = sorted(packets, key=lambda p: p[0])
    keys = [p for p in timed if p[2]]
    if not keys:
        return []
    starts = [keys[0]]
    for key in keys[1:]:
        if key[0] - starts[-1][0] >= chunk_seconds - 1e-6:
            starts.append(key)
    end = timed[-1][0]
    if len(starts) > 1 and end - starts[-1][0] < chunk_seconds / 2:
        starts.pop()  # a short tail goes with the chunk before it
    chunks = []
    for index, start in enumerate(starts):
        following = starts[index + 1] if index + 1 < len(starts) else None
        if following is None:
            frames = None
            seconds = max(0.0, end - start[0])
        else:
            frames = sum(1 for p in timed if start[0] <= p[0] < following[0])
            seconds = following[0] - start[0]
        chunks.append(Chunk(index, start[1], seconds, frames))
    return chunks


def constant_rate(packets: Sequence[tuple[float, str, bool]], tolerance: float = 1e-3) -> bool:
    """Whether the frames are evenly spaced (within ``tolerance`` seconds). A variable
    frame rate is made constant by the MP4 output (frames doubled or dropped on the
    output's grid), and a chunk's grid starts at its own keyframe, not on the whole
    video's: only an evenly spaced video is cut exactly. Compared in microseconds: a
    23.976 fps Matroska (millisecond times: steps of 41 and 42 ms) is even within the
    millisecond, though 0.042 - 0.041 is 0.0010000000000000009 in floats."""
    times = sorted(p[0] for p in packets)
    steps = [b - a for a, b in itertools.pairwise(times)]
    return bool(steps) and round(max(steps) - min(steps), 6) <= tolerance


def variable_rate(packets: Sequence[tuple[float, str, bool]]) -> bool:
    """Whether the frames' times are too uneven for a constant rate (steps more than
    ``_EVEN_STEPS`` apart: a phone's burst, a screen recording's idle seconds): the
    MP4 output's grid would double or drop frames and move the rest, so such a video
    keeps its own times (:func:`pipelines.media.video_args`' ``exact_times``). Two
    frames at one time are not (the grid drops the copy; the video's own time base
    cannot hold both)."""
    times = sorted(p[0] for p in packets)
    steps = [b - a for a, b in itertools.pairwise(times)]
    return bool(steps) and min(steps) > 0 and max(steps) - min(steps) > _EVEN_STEPS


def _frames(path: Path, workdir: Path, label: str) -> int:
    """How many video frames a chunk holds (its packets: demuxed, not decoded)."""
    from pipelines import media

    args = [
        media._tool("ffprobe"), "-v", "error", "-hide_banner", "-count_packets",
        "-select_streams", "v:0", "-show_entries", "stream=nb_read_packets",
        "-print_format", "csv=p=0", *media._input_args(path, "mov"),
    ]  # fmt: skip
    ran = media._run(args, workdir, ".ffprobe.log")
    if ran.returncode != 0:
        raise media._failure(ran, f"cannot read a chunk of {label}", path, workdir)
    try:
        return int(ran.text.strip().strip(","))
    except ValueError:
        return -1


def _starts_at(path: Path, workdir: Path, seconds: float) -> bool:
    """Whether a chunk's picture starts ``seconds`` in (within ``_PLACED`` seconds)."""
    from pipelines import media

    args = [
        media._tool("ffprobe"), "-v", "error", "-hide_banner", "-select_streams", "v:0",
        "-show_entries", "stream=start_time", "-print_format", "csv=p=0",
        *media._input_args(path, "mov"),
    ]  # fmt: skip
    ran = media._run(args, workdir, ".ffprobe.log")
    try:
        return ran.returncode == 0 and abs(float(ran.text.strip().strip(",")) - seconds) <= _PLACED
    except ValueError:
        return False


def _intact(path: Path, workdir: Path, stream: str, frames: int | None) -> bool:
    """Whether a piece found in the checkpoint directory (put back from storage) is
    whole: ``stream`` (``v`` or ``a``) decodes without an error and, for a chunk that
    names it, holds ``frames`` frames, as the decode counted them (its last ``-progress``
    block's ``frame=``: no ffprobe a chunk). Decoding costs a fraction of the encode it
    saves."""
    from pipelines import media

    counted: list[int] = []

    def progress_line(line: str) -> None:
        key, _, value = line.partition("=")
        if key == "frame" and value.isdigit():
            counted.append(int(value))

    watch = [] if frames is None else ["-progress", "pipe:1", "-stats_period", "3600"]
    args = [
        media._tool("ffmpeg"), *watch, *media._COMMON, "-xerror",
        *media._input_args(path, "mov"), "-map", f"0:{stream}:0", "-f", "null", "-",
    ]  # fmt: skip
    ran = media._run(args, workdir, ".ffmpeg-check.log", None if frames is None else progress_line)
    if ran.returncode != 0 or ran.tail.strip():
        return False
    return frames is None or (bool(counted) and counted[-1] == frames)


def _usable(done: dict[str, Path], name: str, workdir: Path, label: str, **check: Any) -> bool:
    """Whether the piece ``name`` was found done and is intact; a damaged one is removed
    (the caller makes it again)."""
    path = done.get(name)
    if path is None:
        return False
    if _intact(path, workdir, **check):
        return True
    log.warning("%s: checkpoint %s is damaged: made again", label, name)
    path.unlink(missing_ok=True)
    return False


def sound_share(pixels_per_second: float) -> float:
    """The part of a chunked transcode's progress that is its sound's pass, from what
    the pictures and the sound cost a second of media (about 3 % beside 720p at 25
    frames a second, half beside 160x120 at 10)."""
    picture = _PICTURE_BASE_CPU + _PICTURE_PIXEL_CPU * max(0.0, pixels_per_second)
    return _SOUND_CPU / (_SOUND_CPU + picture)


def chunking(params: Mapping[str, Any]) -> tuple[float, float]:
    """``(chunk_seconds, chunk_above_seconds)`` from the step's params."""
    return (
        _positive(params, CHUNK_SECONDS_KEY, DEFAULT_CHUNK_SECONDS),
        _positive(params, CHUNK_ABOVE_KEY, DEFAULT_CHUNK_ABOVE_SECONDS),
    )


def _positive(params: Mapping[str, Any], key: str, default: float) -> float:
    value = params.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e7:
        raise PipelineError("invalid_params", f"{key} must be a positive number, got {value!r}")
    return float(value)


def packets(
    run: Any, source: Path, input_args: list[str], stream_index: int, workdir: Path, label: str
) -> list[tuple[float, str, bool]] | None:
    """The video stream's packets: ``(pts seconds, pts as printed, keyframe)``; None
    when some have no presentation time (then frames cannot be counted per chunk)."""
    from pipelines import media

    args = [
        media._tool("ffprobe"), "-v", "error", "-hide_banner",
        "-select_streams", str(stream_index),
        "-show_entries", "packet=pts_time,flags", "-print_format", "csv=p=0",
        *input_args,
    ]  # fmt: skip
    ran = run(args, workdir, ".ffprobe.log")
    if ran.returncode != 0:
        raise media._failure(ran, f"cannot read {label}", source, workdir)
    found = []
    for line in ran.text.splitlines():
        if not line.strip():
            continue  # a packet's side data (an MPEG-TS's stream id), none of its fields
        pts, _, flags = line.strip().partition(",")
        try:
            seconds = float(pts)
        except ValueError:
            return None  # N/A: a packet without a time (AVI's B-frames): no plan
        found.append((seconds, pts, "K" in flags))
    return found


def lead_copies(found: Sequence[tuple[float, str, bool]], first: str, start: str) -> int:
    """How many copies of its first frame beyond the one a constant rate output of
    evenly spaced ``found`` packets (:func:`packets`) holds when that frame is at
    ``first`` and the input starts at ``start`` (both as ffprobe printed them): what
    FFmpeg's frame rate conversion (5.1, ``do_video_out``) fills the time before the
    picture with. The first frame lands ``delta`` frames of the output's rate (the
    packets' own) after zero, nudged up by 2^-17 of a frame (FFmpeg's guard against
    midpoints), and is output ``round(delta + 1)`` times where that is over 1.1, else
    once: ``floor(delta + 1/2)`` copies more. The frames after it each take the next
    place (the fraction is a rounding of their times). 0.543 s at 25 fps: 14."""
    times = sorted(_micros(p[1]) for p in found)
    if len(times) < 2 or times[-1] <= times[0]:
        return 0
    rate = Fraction(len(times) - 1) * 1_000_000 / (times[-1] - times[0])
    delta = Fraction(_micros(first) - _micros(start), 1_000_000) * rate + Fraction(1, 1 << 17)
    return max(0, math.floor(delta + Fraction(1, 2)))


def _as_the_single_pass(args: list[str], audio_args: list[str] | None) -> list[str]:
    """Chunk 0's ``args`` reading its input as the single pass does: with its sound
    (one packet of it copied to FFmpeg's null output), since the streams read decide
    where FFmpeg starts the times of an MPEG-TS (of formats whose times may jump: it
    starts them at the earliest stream it reads, so the picture read alone starts at
    zero, no copies before it, where the single pass's starts after its sound)."""
    if audio_args is None or "-map" not in audio_args:
        return args
    sound = audio_args[audio_args.index("-map") + 1]
    after_input = args.index("-i") + 2
    keep = ["-map", sound, "-c:a", "copy", "-frames:a", "1", "-f", "null", "-"]
    return [*args[:after_input], *keep, *args[after_input:]]


def _listing(
    chunks: Sequence[Chunk], pieces: Path, build: str, exact_times: bool, start: str = "0"
) -> str:
    """The concat demuxer's listing of the chunks. With ``exact_times`` each chunk but
    the last says how long it lasts: from its keyframe to the next one's, so the next
    chunk starts at its own time (the first: from the input's ``start``, as ffprobe
    printed it, to the second's keyframe). Without it the demuxer takes each file's
    duration, whose last frame lasts what its encoder guessed (a variable rate's last
    step, not the gap to the next chunk). In whole microseconds (the demuxer's unit),
    each the difference of printed times: their sum is the last start's, never a
    rounding per chunk more. A variable rate's first chunk whose picture starts after
    the input does keeps that delay (``inpoint 0``: the demuxer would start it at zero)."""
    lines = []
    for chunk, following in zip(chunks, [*chunks[1:], None], strict=True):
        lines.append(f"file '{pieces / checkpoints.stored_name(chunk.name, build)}'\n")
        if not exact_times:
            continue
        begins = start if chunk.index == 0 else chunk.start
        if chunk.index == 0 and _micros(chunk.start) != _micros(start):
            lines.append("inpoint 0\n")
        if following is not None:
            micros = _micros(following.start) - _micros(begins)
            lines.append(f"duration {micros // 1_000_000}.{micros % 1_000_000:06d}\n")
    return "".join(lines)


def _micros(printed: str) -> int:
    """A time ffprobe printed (seconds, six decimals) in whole microseconds."""
    return int((decimal.Decimal(printed) * 1_000_000).to_integral_value())


def transcode_chunked(
    source: Path,
    workdir: Path,
    output: Path,
    label: str,
    *,
    video_args: list[str],
    audio_args: list[str] | None,
    found: list[tuple[float, str, bool]] | None,
    chunk_seconds: float,
    total: float,
    frame_pixels: int,
    start: float = 0.0,
    exact_times: bool = False,
) -> dict[str, int] | None:
    """Transcode ``source`` in chunks into ``output`` (see the module docstring); the
    units of work (chunks transcoded, chunks resumed). None, having done nothing, for a
    video that cannot be cut exactly (packets without times, frames not evenly spaced
    without ``exact_times``, no keyframe, one chunk, a chunk whose frames are not all
    there): the caller transcodes it in one pass. ``exact_times``: a variable frame
    rate, whose frames keep their own times (``video_args`` carry the options); the
    join is told each chunk's length. ``start``: where a single pass's times count
    from (:meth:`pipelines.media.Probe.times_start`: the input's start, an MPEG-TS's
    earliest stream read).

    A picture that starts after the input does (the sound first: AAC's priming puts
    an FFmpeg-written sound 23 ms ahead; an MPEG-TS's sound, a recording begun
    mid-GOP): on the constant rate the output fills that time with copies of the first
    frame (:func:`lead_copies`), in chunk 0 only, which holds them beside its own
    frames; it reads the input as the single pass does (:func:`_as_the_single_pass`)
    and is checked to hold just those copies, else one pass. A variable rate's frames
    keep their times, chunk 0's its delay in the join (:func:`_listing`): it reads the
    input as the single pass does too, and is checked to start where its picture does
    (an MPEG-TS's picture read alone starts at zero), else one pass.
    ``video_args``: ffmpeg's arguments up to the output, without input and sound;
    ``audio_args``: the same for the sound (None: no sound); ``found``: the video
    stream's :func:`packets`; ``frame_pixels``: an output picture's (what the sound's
    share of the progress is weighed against)."""
    from pipelines import media

    cuttable = exact_times or (found is not None and constant_rate(found))
    chunks = plan(found, chunk_seconds) if found is not None and cuttable else []
    late = float(chunks[0].start) - start if chunks else 0.0
    if len(chunks) < 2:
        log.info("%s: not cut in chunks (%d planned): one pass", label, len(chunks))
        return None
    # A constant rate's picture that starts after the input: chunk 0 makes the copies
    # of its first frame the single pass fills that time with.
    lead = None
    first = chunks[0].frames  # counted: it is not the last
    if not exact_times and late > _SAME_TIME and found is not None and first is not None:
        lead = lead_copies(found, chunks[0].start, f"{start:.6f}")
        chunks[0] = replace(chunks[0], seconds=chunks[0].seconds + late, frames=first + lead)
    # Chunk 0 starts after the input as the single pass's picture does: led by copies
    # on a constant rate, placed by its own times on a variable one.
    after_start = lead is not None or (exact_times and late > 0)
    build = media.ffmpeg_build()
    done = checkpoints.finished(workdir, build)
    transcoded = resumed = 0
    offset = 0.0
    rate = len(found or []) / total if total > 0 else 0.0
    share = 0.0 if audio_args is None else sound_share(frame_pixels * rate)
    pictures = 1.0 - share  # the chunks' part of the progress
    for chunk in chunks:
        if _usable(done, chunk.name, workdir, label, stream="v", frames=chunk.frames):
            resumed += 1
        else:
            partial = checkpoints.partial(workdir, chunk.name, build)
            # Seeking to the keyframe's own time: FFmpeg adds the file's start to an
            # input -ss (-seek_timestamp 0), which sent each chunk past its keyframe
            # by that much in a video whose times do not start at zero.
            seek = ["-seek_timestamp", "1", "-ss", chunk.start] if chunk.index else []
            count = [] if chunk.frames is None else ["-frames:v", str(chunk.frames)]
            args = [video_args[0], *seek, *video_args[1:], *count, "-an"]
            args += ["-movie_timescale", str(_CHUNK_TIMESCALE), "-f", "mp4"]
            if after_start and not chunk.index:
                args = _as_the_single_pass(args, audio_args)
            counts: dict[str, int] = {}
            media.transcode(
                args, source, workdir, partial, label, total,
                offset=offset * pictures, scale=pictures, part=True, counts=counts,
            )  # fmt: skip
            # The frames it holds as FFmpeg counted them encoding it (the packets an
            # ffprobe of the chunk counts, without a second process a chunk).
            made = counts["frame"] if "frame" in counts else _frames(partial, workdir, label)
            if chunk.frames is not None and made != chunk.frames:
                # Frames the decoder would not give from this keyframe on (an open GOP's
                # leading pictures ...): this video cannot be cut exactly.
                log.warning("%s: chunk %d has %d frames, not %d: one pass instead",
                            label, chunk.index, made, chunk.frames)  # fmt: skip
                partial.unlink(missing_ok=True)
                return None
            copies = (counts.get("dup_frames"), counts.get("drop_frames"))
            reckoned = lead if lead is not None and not chunk.index else 0
            if copies != (reckoned, 0):
                # FFmpeg's rate conversion did not copy the frames as reckoned: chunk 0's
                # lead otherwise (frames before the first keyframe decoded ...), or a
                # frame rate it guesses otherwise than the frames' steps (an H.264 whose
                # timing says half its rate: every other frame dropped), whose chunk of
                # this many frames is not the single pass's frames (its count is
                # output frames: the chunk read on past its end).
                log.warning("%s: chunk %d has %s copies and %s frames dropped, not %d and 0:"
                            " one pass instead", label, chunk.index, *copies, reckoned)  # fmt: skip
                partial.unlink(missing_ok=True)
                return None
            placed = not exact_times or chunk.index or late <= 0
            if not placed and not _starts_at(partial, workdir, late):
                # FFmpeg put the picture elsewhere than the single pass does (an
                # MPEG-TS's picture read alone starts at zero). A variable rate's only:
                # a constant rate's join does not place chunk 0 (a picture up to
                # _SAME_TIME late: an MPEG-TS's streams a few ticks apart).
                log.warning("%s: chunk 0 does not start %.3f s in: one pass", label, late)
                partial.unlink(missing_ok=True)
                return None
            checkpoints.commit(workdir, chunk.name, build)
            transcoded += 1
            progress.report(min(offset + chunk.seconds, total) * pictures, total, "seconds")
        offset += chunk.seconds
    pieces = checkpoints.directory(workdir)
    if audio_args is not None and not _usable(
        done, AUDIO_PIECE, workdir, label, stream="a", frames=None
    ):
        partial = checkpoints.partial(workdir, AUDIO_PIECE, build)
        media.transcode(
            [*audio_args, "-f", "ipod"], source, workdir, partial, label, total,
            offset=total * pictures, scale=share, part=True,
        )  # fmt: skip
        checkpoints.commit(workdir, AUDIO_PIECE, build)
    listing = workdir / "chunks.txt"
    listing.write_text(_listing(chunks, pieces, build, exact_times, f"{start:.6f}"))
    # -copyts: each piece keeps its own times, the sound its delay after the picture
    # (ffmpeg would start every input at zero).
    concat = [
        media._tool("ffmpeg"), *media._COMMON, "-copyts",
        "-f", "concat", "-safe", "0", "-format_whitelist", "concat,mov",
        "-protocol_whitelist", "file", "-i", f"file:{listing}",
    ]  # fmt: skip
    if audio_args is not None:
        concat += media._input_args(pieces / checkpoints.stored_name(AUDIO_PIECE, build), "mov")
    concat += ["-map", "0:v", *(["-map", "1:a"] if audio_args is not None else [])]
    concat += ["-c", "copy", *media._CLEAN, "-movflags", "+faststart", "-f", "mp4"]
    ran = media._run([*concat, str(output)], workdir, ".ffmpeg.log")
    listing.unlink(missing_ok=True)
    if ran.returncode != 0:
        raise media._failure(ran, f"cannot join the chunks of {label}", source, workdir)
    progress.report(total, total, "seconds")
    log.debug("%s: %d chunks transcoded, %d resumed", label, transcoded, resumed)
    return {"chunks": transcoded, "chunks_resumed": resumed}
