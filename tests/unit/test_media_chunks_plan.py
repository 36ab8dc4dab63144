"""pipelines.media_chunks.plan: keyframe-aligned chunks from a stream's packets."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines import checkpoints, media
from pipelines.media_chunks import (
    Chunk,
    _listing,
    chunking,
    constant_rate,
    lead_copies,
    plan,
    variable_rate,
)
from pipelines.registry import PipelineError


def packets(count: int, rate: int = 25, gop: int = 25) -> list[tuple[float, str, bool]]:
    return [(i / rate, f"{i / rate:.6f}", i % gop == 0) for i in range(count)]


def test_chunks_start_at_keyframes_and_count_every_frame_once() -> None:
    chunks = plan(packets(150), 1.0)
    assert [c.start for c in chunks] == [f"{s:.6f}" for s in range(6)]
    assert [c.frames for c in chunks] == [25, 25, 25, 25, 25, None]
    assert [c.name for c in chunks][:2] == ["chunk-00000.mp4", "chunk-00001.mp4"]


def test_a_chunk_lasts_at_least_chunk_seconds_up_to_the_next_keyframe() -> None:
    chunks = plan(packets(250, gop=30), 2.0)  # keyframes every 1.2 s; 9.6 s joins 7.2 s
    assert [c.start for c in chunks] == ["0.000000", "2.400000", "4.800000", "7.200000"]
    assert [c.frames for c in chunks] == [60, 60, 60, None]
    assert sum(c.frames or 0 for c in chunks) + (250 - 180) == 250


def test_decode_order_is_sorted_and_leading_frames_without_a_keyframe_are_dropped() -> None:
    found = [(0.08, "0.080000", False), (0.0, "0.000000", False), (0.04, "0.040000", True)]
    found += [(0.12, "0.120000", False), (1.04, "1.040000", True), (1.08, "1.080000", False)]
    found += [(1.64, "1.640000", False)]
    first, second = plan(found, 1.0)
    assert (first.index, first.start, first.frames) == (0, "0.040000", 3)
    assert (second.index, second.start, second.frames) == (1, "1.040000", None)
    assert first.seconds == pytest.approx(1.0) and second.seconds == pytest.approx(0.6)


def test_a_tail_under_half_a_chunk_joins_the_chunk_before() -> None:
    chunks = plan(packets(110), 1.0)  # 4.4 s: keyframes at 0 .. 4
    assert [c.frames for c in chunks] == [25, 25, 25, None]
    assert plan(packets(115), 1.0)[-1].start == "4.000000"  # 4.6 s: the tail stands


def test_no_keyframe_no_chunks() -> None:
    assert plan([(0.0, "0.000000", False)], 1.0) == []
    assert plan([], 1.0) == []


@pytest.mark.parametrize("value", [0, -1, "60", True, float("inf"), None])
def test_chunking_params_are_positive_numbers(value: object) -> None:
    with pytest.raises(PipelineError) as caught:
        chunking({"chunk_seconds": value})
    assert caught.value.code == "invalid_params"


def test_checkpoint_names_are_plain_file_names() -> None:
    assert checkpoints.valid_name("chunk-00001.mp4")
    for bad in ("../x", ".hidden", "a/b", "", "A.mp4", "x" * 65, "a..b"):
        assert not checkpoints.valid_name(bad), bad


def test_only_evenly_spaced_frames_are_cut() -> None:
    assert constant_rate(packets(100))
    ntsc = [(i * 1001 / 30000, "", i % 30 == 0) for i in range(90)]  # 29.97 fps
    assert constant_rate(list(reversed(ntsc)))  # decode order
    gappy = [p for i, p in enumerate(packets(100)) if i % 7 < 5]  # frames dropped
    assert not constant_rate(gappy)
    assert not constant_rate(packets(1))


def timed(*times: float) -> list[tuple[float, str, bool]]:
    return [(t, f"{t:.6f}", i == 0) for i, t in enumerate(times)]


def test_a_variable_frame_rate_is_told_from_a_constant_one_on_a_coarse_time_base() -> None:
    # On its 1 ms time base 29.97 fps steps 33 and 34 ms, 23.976 41 and 42: constant.
    for rate in (30000 / 1001, 24000 / 1001):
        rounded = timed(*(round(i / rate, 3) for i in range(90)))
        assert not variable_rate(list(reversed(rounded)))
    assert not variable_rate(packets(100))
    assert not variable_rate(timed(*(i * 1001 / 30000 for i in range(90))))
    # A phone's 60 fps burst in a 30 fps clip, a screen recording's idle seconds,
    # frames dropped here and there.
    burst = [i / 30 for i in range(30)] + [1 + i / 60 for i in range(30)]
    assert variable_rate(timed(*burst, *(1.5 + i / 30 for i in range(30))))
    assert variable_rate(timed(0, 0.2, 0.6, 1.2, 2.0, 3.0))
    assert variable_rate([p for i, p in enumerate(packets(100)) if i % 7 < 5])
    # Two frames at one time: the constant rate drops the copy, as it did.
    assert not variable_rate(timed(0, 0.04, 0.04, 0.2, 0.24))
    assert not variable_rate(timed(0.5)) and not variable_rate([])


def test_a_variable_rates_join_is_told_each_chunks_length_in_whole_microseconds() -> None:
    # Keyframes at 1/3 s steps (printed rounded): each length the difference of the
    # printed starts, so the lengths add up to each start exactly.
    chunks = [
        Chunk(i, start, 0.0, 10)
        for i, start in enumerate(["0.000000", "0.333333", "0.666667", "12.000000"])
    ]
    listing = _listing(chunks, Path("/pieces"), "", exact_times=True).splitlines()
    assert listing == [
        "file '/pieces/chunk-00000.mp4'", "duration 0.333333",
        "file '/pieces/chunk-00001.mp4'", "duration 0.333334",
        "file '/pieces/chunk-00002.mp4'", "duration 11.333333",
        "file '/pieces/chunk-00003.mp4'",
    ]  # fmt: skip
    # An evenly spaced video's join takes each file's own length, as before.
    assert _listing(chunks, Path("/pieces"), "", exact_times=False).count("duration") == 0


def test_a_late_variable_rate_pictures_first_chunk_keeps_its_delay_in_the_join() -> None:
    # The picture 23 ms after the input's start (its sound first): chunk 0 lasts from
    # the input's start to the next keyframe, and keeps its own times (inpoint 0).
    chunks = [Chunk(0, "1.423000", 1.0, 25), Chunk(1, "2.423000", 1.0, None)]
    listing = _listing(chunks, Path("/pieces"), "", exact_times=True, start="1.400000")
    assert listing.splitlines() == [
        "file '/pieces/chunk-00000.mp4'", "inpoint 0", "duration 1.023000",
        "file '/pieces/chunk-00001.mp4'",
    ]  # fmt: skip


def test_a_late_constant_rate_picture_is_led_by_the_copies_ffmpeg_makes() -> None:
    # FFmpeg 5.1's constant rate outputs a first frame ``delta`` frames after zero
    # round(delta + 1) times (once up to 1.1), nudged up 2^-17 of a frame off midpoints.
    def lead(first: float, start: float = 0.0, rate: int = 25) -> int:
        found = [(first + i / rate, f"{first + i / rate:.6f}", i % rate == 0) for i in range(50)]
        return lead_copies(found, f"{first:.6f}", f"{start:.6f}")

    assert lead(0.0) == 0
    assert lead(0.543) == 14  # 13.575 frames: FFmpeg's AAC priming in a Matroska
    assert lead(1.943222, start=1.4) == 14  # the same picture in an MPEG-TS
    assert (lead(0.0199), lead(0.02), lead(0.0201)) == (0, 1, 1)  # 0.5 frames: up
    assert (lead(0.06), lead(0.1)) == (2, 3)  # 1.5 and 2.5 frames: up, not to even
    assert lead(0.004) == 0  # 0.1 frames: the frame is moved to zero, not copied
    assert lead(1.0) == 25
    assert lead(0.5, rate=30) == 15


def test_an_mpeg_ts_or_ps_output_starts_at_the_earliest_stream_read() -> None:
    # FFmpeg counts an output's times from the container's start, but a TS's or PS's
    # from the earliest start of the streams it reads, where that is later: a data
    # stream or a sound not kept that starts first does not count.
    def stream(index: int, kind: str, start: float | None) -> media.Stream:
        return media.Stream(index, kind, "h264", "", 0, 0, 0, False, start=start)

    video, sound = stream(0, "video", 1.92), stream(1, "audio", 1.876778)
    found = media.Probe([video, sound, stream(2, "data", 1.4)], 4.0, start=1.4)
    for demuxer in ("mpegts", "mpeg"):
        assert found.times_start(demuxer, [video, sound]) == 1.876778
        assert found.times_start(demuxer, [video, None]) == 1.92
        assert found.times_start(demuxer, [stream(0, "video", None)]) == 1.4
    for demuxer in ("matroska", "mov", "ogg"):
        assert found.times_start(demuxer, [video, sound]) == 1.4
    early = media.Probe([video, sound], 4.0, start=1.9)  # never before the container's
    assert early.times_start("mpegts", [video, sound]) == 1.9
