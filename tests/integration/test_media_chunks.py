"""``transcode_video`` in chunks (pipelines.media_chunks), in-process on real FFmpeg:
the output equals a single pass's, and a second run goes on from the checkpoints the
first left (only the missing chunks are transcoded, counted in the step's units).

Clips are a few seconds of 160x120 with a keyframe every second, cut into 1 s chunks:
the whole module costs a few CPU-seconds."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import pipelines.media as media
from pipelines import checkpoints, media_chunks, progress, registry
from pipelines.registry import USAGE_OUTPUT, Output
from tests import media_support as ms
from tests.generated.media import ffmpeg, tone_source, video_source
from tests.integration import test_media_frame_rate as frame_rate

pytestmark = pytest.mark.program("ffmpeg")

CHUNKED = {"height": 120, "crf": 23, "chunk_seconds": 1, "chunk_above_seconds": 1}
SINGLE = {"height": 120, "crf": 23}
SECONDS = 4


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("chunk-clips")
    return {
        "sound": ms.clip(root / "sound.mp4", SECONDS),
        "silent": ms.clip(root / "silent.mp4", SECONDS, sound=False),
        "bframes": ms.clip(root / "bframes.mp4", SECONDS, bframes=True),
    }


@pytest.fixture(scope="module")
def single(clips: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A single pass of each clip, to compare with."""
    found = {}
    for name, clip in clips.items():
        (output,) = run(clip, SINGLE, tmp_path_factory.mktemp(f"single-{name}"))
        found[name] = output.path
    return found


@dataclass(frozen=True)
class Chunked:
    """A clip's chunked transcode, as a first attempt leaves it (read only: a test
    that changes it works on a :meth:`copy`)."""

    workdir: Path
    outputs: list[Output]
    tools: list[str]  # the tools it ran (ffmpeg, ffprobe), in order
    # Its progress reports, each with whether the sound's pass was under way (its
    # partial piece there).
    reports: list[tuple[progress.Progress, bool]]

    def copy(self, workdir: Path) -> None:
        """Its workdir into ``workdir`` (as a retry has the pieces put back)."""
        shutil.copytree(self.workdir, workdir, dirs_exist_ok=True)


@pytest.fixture(scope="module")
def chunked(
    clips: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], Chunked]:
    """``chunked(name)``: the clip ``name`` chunked once for the module (the first run
    of several cases; each made the same pieces and output)."""
    made: dict[str, Chunked] = {}

    def first(name: str) -> Chunked:
        if name not in made:
            workdir = tmp_path_factory.mktemp(f"chunked-{name}")
            sound = checkpoints.partial(workdir, media_chunks.AUDIO_PIECE, media.ffmpeg_build())
            reports: list[tuple[progress.Progress, bool]] = []
            progress.reporting_to(lambda r: reports.append((r, sound.exists())))
            try:
                with pytest.MonkeyPatch.context() as patch:
                    tools = watch_tools(patch)
                    outputs = run(clips[name], CHUNKED, workdir)
            finally:
                progress.reporting_to(None)
            made[name] = Chunked(workdir, outputs, tools, reports)
        return made[name]

    return first


class Shared:
    """Sources several cases read, and their single passes, made once for the module
    (the cases only read them)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def source(self, name: str, build: Callable[[Path], object]) -> Path:
        """What ``build(path)`` writes; ``name`` says all it depends on."""
        path = self.root / name
        if not path.exists():
            build(path)
        return path

    def single(self, source: Path) -> Path:
        """The single pass of :meth:`source`'s ``source``."""
        workdir = self.root / f"single-{source.name}"
        if not workdir.exists():
            run(source, SINGLE, workdir)
        return workdir / "video-h264-120p-crf23.mp4"


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Shared:
    return Shared(tmp_path_factory.mktemp("shared"))


def run(clip: Path, params: dict[str, Any], workdir: Path) -> list[Output]:
    workdir.mkdir(parents=True, exist_ok=True)
    source = workdir / "input"
    if not source.exists():
        shutil.copy(clip, source)
    return media.transcode_video(source, params, workdir)


def piece(workdir: Path, name: str) -> Path:
    """Where the piece ``name`` this node's FFmpeg made is."""
    return checkpoints.directory(workdir) / checkpoints.stored_name(name, media.ffmpeg_build())


def units(outputs: list[Output]) -> dict[str, int]:
    (usage,) = [o for o in outputs if o.output_type == USAGE_OUTPUT]
    found: dict[str, int] = json.loads(usage.path.read_text())
    return found


def watch_tools(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the tools the steps run from now on (ffmpeg, ffprobe), in order."""
    tools: list[str] = []
    real = media._run

    def watched(args: list[str], *rest: Any, **named: Any) -> Any:
        tools.append(Path(args[0]).name)
        return real(args, *rest, **named)

    monkeypatch.setattr(media, "_run", watched)
    return tools


@pytest.mark.parametrize("name", ["sound", "silent", "bframes"])
def test_chunked_output_equals_a_single_pass(
    name: str, single: dict[str, Path], chunked: Callable[[str], Chunked]
) -> None:
    done = chunked(name)
    outputs = done.outputs
    # A chunk's frames are counted by the FFmpeg that made it, not by an ffprobe a chunk
    # (which cost 7 ffprobes for 4 chunks): the input's probe and packets, the output's.
    assert done.tools.count("ffprobe") == 3
    assert [o.output_type for o in outputs] == ["video-h264-120p-crf23.mp4", USAGE_OUTPUT]
    assert units(outputs) == {"chunks": SECONDS, "chunks_resumed": 0}
    pieces = sorted(checkpoints.finished(done.workdir, media.ffmpeg_build()))
    sound = [] if name == "silent" else ["audio.m4a"]
    assert pieces == [*sound, *(f"chunk-{i:05d}.mp4" for i in range(SECONDS))]
    ms.assert_same_as_single_pass(outputs[0].path, single[name], SECONDS)
    # Each chunk is an independent H.264 file of its second's frames.
    chunk = piece(done.workdir, "chunk-00001.mp4")
    found, _, times = ms.summary(chunk)
    assert found == ["h264"]
    assert len(times) == ms.RATE


def test_the_frame_check_sees_a_frame_shifted_by_one(
    clips: dict[str, Path], single: dict[str, Path]
) -> None:
    # The control for assert_same_as_single_pass: testsrc2 moves every frame, so one
    # frame off is far below the threshold.
    assert min(ms.frame_psnr(single["sound"], single["sound"], shift=1)) < ms.SAME_FRAME_PSNR


def test_a_second_run_transcodes_only_the_missing_chunks(
    clips: dict[str, Path],
    single: dict[str, Path],
    chunked: Callable[[str], Chunked],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    chunked("sound").copy(tmp_path)
    kept = {name: piece(tmp_path, name).stat() for name in ("chunk-00000.mp4", "chunk-00001.mp4")}
    # As a kill leaves it: chunks 2 and 3 and the sound not finished, one of them half
    # written, no output.
    for name in ("chunk-00002.mp4", "chunk-00003.mp4", "audio.m4a"):
        piece(tmp_path, name).unlink()
    checkpoints.partial(tmp_path, "chunk-00002.mp4", media.ffmpeg_build()).write_bytes(b"\0" * 1000)
    (tmp_path / "video-h264-120p-crf23.mp4").unlink()
    tools = watch_tools(monkeypatch)
    second = run(clips["sound"], CHUNKED, tmp_path)
    assert units(second) == {"chunks": SECONDS - 2, "chunks_resumed": 2}
    # A chunk put back is checked by one FFmpeg (its decode counts its frames), not
    # also by an ffprobe a chunk: the input's probe and packets, the output's.
    assert tools.count("ffprobe") == 3
    for name, before in kept.items():
        after = piece(tmp_path, name).stat()
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    ms.assert_same_as_single_pass(second[0].path, single["sound"], SECONDS)


def test_a_chunk_put_back_short_of_its_frames_is_made_again(
    clips: dict[str, Path],
    single: dict[str, Path],
    chunked: Callable[[str], Chunked],
    tmp_path: Path,
) -> None:
    # A chunk put back that decodes cleanly but holds 20 of its 25 frames (its first
    # 20, copied): the check's decode counts them, and the chunk is made again, not
    # joined into the output.
    chunked("sound").copy(tmp_path)
    chunk = piece(tmp_path, "chunk-00001.mp4")
    short = tmp_path / "short.mp4"
    ffmpeg("-i", str(chunk), "-c", "copy", "-frames:v", "20", "-f", "mp4", str(short))
    assert len(ms.summary(short)[2]) == 20 and ms.decode_errors(short) == ""
    short.replace(chunk)
    (tmp_path / "video-h264-120p-crf23.mp4").unlink()
    second = run(clips["sound"], CHUNKED, tmp_path)
    assert units(second) == {"chunks": 1, "chunks_resumed": SECONDS - 1}
    ms.assert_same_as_single_pass(second[0].path, single["sound"], SECONDS)


def test_a_retry_under_another_ffmpeg_build_makes_every_piece_again(
    clips: dict[str, Path],
    single: dict[str, Path],
    chunked: Callable[[str], Chunked],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    chunked("sound").copy(tmp_path)
    (tmp_path / "video-h264-120p-crf23.mp4").unlink()
    # The retry lands on a node whose FFmpeg is another build: the pieces put back
    # (every one) are not its own, and none is joined into its output.
    other = media.ffmpeg_build().replace("ffmpeg version", "ffmpeg version 99.0", 1)
    monkeypatch.setattr(media, "ffmpeg_build", lambda: other)
    second = run(clips["sound"], CHUNKED, tmp_path)
    assert units(second) == {"chunks": SECONDS, "chunks_resumed": 0}
    assert sorted(checkpoints.finished(tmp_path, other)) == [
        "audio.m4a",
        *(f"chunk-{i:05d}.mp4" for i in range(SECONDS)),
    ]
    assert len(checkpoints.finished(tmp_path)) == 2 * (SECONDS + 1)  # both builds', stored
    ms.assert_same_as_single_pass(second[0].path, single["sound"], SECONDS)


def test_under_the_threshold_one_pass_and_no_checkpoints(
    clips: dict[str, Path], tmp_path: Path
) -> None:
    outputs = run(clips["sound"], {**CHUNKED, "chunk_above_seconds": SECONDS + 1}, tmp_path)
    assert [o.output_type for o in outputs] == ["video-h264-120p-crf23.mp4"]
    assert checkpoints.finished(tmp_path) == {}


def test_only_the_profile_sets_the_chunking() -> None:
    assert {"chunk_seconds", "chunk_above_seconds"} <= registry.profile_only("transcode_video")
    assert registry.checkpointing("transcode_video")
    assert not registry.checkpointing("transcode_audio")


def test_chunk_progress_is_the_jobs_progress_resumed_chunks_counted_done(
    clips: dict[str, Path], chunked: Callable[[str], Chunked], tmp_path: Path
) -> None:
    first = [report for report, _ in chunked("sound").reports]
    chunked("sound").copy(tmp_path)
    for name in ("chunk-00003.mp4", "audio.m4a"):
        piece(tmp_path, name).unlink()
    (tmp_path / "video-h264-120p-crf23.mp4").unlink()
    second: list[progress.Progress] = []
    progress.reporting_to(second.append)
    try:
        run(clips["sound"], CHUNKED, tmp_path)
    finally:
        progress.reporting_to(None)
    for reports in (first, second):
        assert {r.unit for r in reports} == {"seconds"}
        assert all(r.total == pytest.approx(SECONDS, abs=0.1) for r in reports)
        done = [r.done for r in reports]
        assert done == sorted(done), "progress went back"
        assert done[-1] == pytest.approx(reports[-1].total)
    # Every chunk reported its end in the first run (the chunks' part of the progress:
    # the sound's pass has the rest); the second began where the three resumed chunks
    # end.
    pictures = 1 - media_chunks.sound_share(160 * 120 * ms.RATE)
    for end in (1, 2, 3):
        assert any(r.done == pytest.approx(end * pictures, abs=0.02) for r in first), end
    assert second[0].done >= 3.0 * pictures - 0.02


def test_the_sound_pass_moves_the_progress_the_chunks_leave_it_room(
    chunked: Callable[[str], Chunked],
) -> None:
    # The sound is transcoded once, after every chunk: 32 minutes of 160x120 took 17 s
    # for the chunks, then 74 s for the sound with the progress at 99.98 %. Its pass
    # has a share of the progress, so the chunks end below the total and it moves on.
    seen = [(report.done, in_sound) for report, in_sound in chunked("sound").reports]
    during = [done for done, in_sound in seen if in_sound]
    assert during, "the sound pass reported nothing"
    chunks = [done for done, _ in seen[: [s for _, s in seen].index(True)]]
    assert max(chunks) < SECONDS - 0.1
    assert max(chunks) <= min(during) and max(during) > max(chunks)
    done = [done for done, _ in seen]
    assert done == sorted(done) and done[-1] == pytest.approx(SECONDS, abs=0.1)


def test_the_sound_share_follows_the_pictures_cost() -> None:
    # CPU per second of media, measured (libx264 veryfast, one thread; AAC 128k): the
    # sound costs about as much as 160x120 at 10 frames a second, 3 % beside 720p25.
    assert 0.4 < media_chunks.sound_share(160 * 120 * 10) < 0.7
    assert 0.02 < media_chunks.sound_share(1280 * 720 * 25) < 0.05
    assert media_chunks.sound_share(1280 * 720 * 25) < media_chunks.sound_share(640 * 360 * 25)


def test_a_video_whose_packets_have_no_times_is_done_in_one_pass(tmp_path: Path) -> None:
    # MPEG-4 Part 2 with B-frames in AVI: its packets carry no presentation times, so
    # frames cannot be counted per chunk; one pass, no checkpoints.
    source = tmp_path / "input"
    ffmpeg(*video_source(SECONDS, "160x120", ms.RATE), "-c:v", "mpeg4", "-bf", "2",
              "-g", str(ms.RATE), "-f", "avi", str(source))  # fmt: skip
    outputs = media.transcode_video(source, CHUNKED, tmp_path)
    assert [o.output_type for o in outputs] == ["video-h264-120p-crf23.mp4"]
    assert checkpoints.finished(tmp_path) == {}
    assert len(ms.frame_times(outputs[0].path)) == SECONDS * ms.RATE


def test_a_variable_frame_rate_matroska_is_chunked_at_its_frames_times(tmp_path: Path) -> None:
    # Frames dropped here and there, on Matroska's 1 ms time base: the output keeps the
    # others at their times, chunked as in a single pass (it was one pass, no checkpoint).
    # (test_media_frame_rate's silent Matroska, whose checks are here.)
    source = tmp_path / "vfr.mkv"
    ffmpeg(*video_source(SECONDS, "160x120", ms.RATE), "-vf", "select='lt(mod(n\\,7)\\,5)'",
           "-fps_mode", "vfr", "-c:v", "libx264", "-preset", "ultrafast", "-g", "20",
           "-threads", "1", "-f", "matroska", str(source))  # fmt: skip
    outputs = run(source, CHUNKED, tmp_path / "chunked")
    (single,) = run(source, SINGLE, tmp_path / "single")
    assert units(outputs) == {"chunks": 4, "chunks_resumed": 0}  # keyframes 1.12 s apart
    kept = ms.frame_times(source)
    assert len(kept) == sum(1 for n in range(SECONDS * ms.RATE) if n % 7 < 5)
    assert ms.frame_times(single.path) == pytest.approx(kept, abs=1e-3)
    assert frame_rate.decode_errors(single.path) == ""
    assert [s["codec_type"] for s in ms.probe(single.path)["streams"]] == ["video"]
    assert ms.frame_times(outputs[0].path) == ms.frame_times(single.path)
    errors, psnr = ms.decode_errors_and_psnr(outputs[0].path, single.path)
    assert errors == ""
    assert min(psnr) >= ms.SAME_FRAME_PSNR


def late(
    path: Path, *, sound: float = 0.0, picture: float = 0.0, container: str = "matroska"
) -> Path:
    """A clip (keyframe each second, AAC sound) whose sound or picture starts ``sound``
    or ``picture`` seconds after the container does, as recordings and remuxes have it."""
    gop = str(ms.RATE)
    ffmpeg("-itsoffset", str(picture), *video_source(SECONDS, "160x120", ms.RATE),
           "-itsoffset", str(sound), *tone_source(SECONDS),
           "-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p", "-g", gop,
           "-keyint_min", gop, "-sc_threshold", "0", "-c:a", "aac", "-threads", "1",
           "-f", container, str(path))  # fmt: skip
    return path


def starts(path: Path) -> dict[str, float]:
    return {s["codec_type"]: float(s["start_time"]) for s in ms.probe(path)["streams"]}


def sound_start(path: Path) -> float:
    (sound,) = [s for s in ms.probe(path)["streams"] if s["codec_type"] == "audio"]
    return float(sound["start_time"])


def test_a_sound_that_starts_late_keeps_its_delay(tmp_path: Path) -> None:
    # Joined, each input started at zero: the sound came 0.46 s early, all the way.
    source = late(tmp_path / "late-sound.mkv", sound=0.5)
    (single,) = run(source, SINGLE, tmp_path / "single")
    outputs = run(source, CHUNKED, tmp_path / "chunked")
    assert units(outputs) == {"chunks": SECONDS, "chunks_resumed": 0}
    assert sound_start(single.path) > 0.4
    assert sound_start(outputs[0].path) == pytest.approx(sound_start(single.path), abs=1e-3)
    ms.assert_same_as_single_pass(outputs[0].path, single.path, SECONDS)


def assert_led_like_a_single_pass(
    source: Path, workdir: Path, frames: int, single: Path | None = None
) -> Path:
    """``source`` chunked (its picture late on a constant rate) as its ``single`` pass
    (made here if not given) makes it: ``frames`` frames at its times, the first ones
    copies of the picture's first."""
    if single is None:
        (made,) = run(source, SINGLE, workdir / "single")
        single = made.path
    outputs = run(source, CHUNKED, workdir / "chunked")
    assert units(outputs) == {"chunks": SECONDS, "chunks_resumed": 0}
    assert len(ms.frame_times(single)) == frames
    assert ms.frame_times(single)[0] == 0  # the copies, from zero
    ms.assert_same_as_single_pass(outputs[0].path, single, SECONDS, frames=frames)
    assert sound_start(outputs[0].path) == sound_start(single) == 0
    return piece(workdir / "chunked", "chunk-00000.mp4")


def test_a_picture_that_starts_late_is_chunked_after_the_copies_the_single_pass_makes(
    tmp_path: Path,
) -> None:
    # The constant rate fills the first 0.543 s (0.5 and AAC's priming) with 14 copies
    # of the first frame, in chunk 0 only: a long one was done in one pass, no
    # checkpoint kept. Chunk 0 makes them, its 25 frames after them.
    source = late(tmp_path / "late-picture.mkv", picture=0.5)
    assert starts(source)["video"] == pytest.approx(0.543)
    chunk = assert_led_like_a_single_pass(source, tmp_path, 114)
    assert len(ms.frame_times(chunk)) == ms.RATE + 14


def late_picture_ts(shared: Shared) -> Path:
    return shared.source(
        "late-picture.ts", lambda path: late(path, picture=0.5, container="mpegts")
    )


def test_an_mpeg_ts_whose_picture_starts_after_its_sound_is_chunked(
    shared: Shared, tmp_path: Path
) -> None:
    # A camcorder's or an HLS recording's: its sound first. One pass before; and chunk 0
    # reading the picture alone starts it at zero (FFmpeg starts an MPEG-TS's times at
    # its first stream read), no copies before it: it reads the sound too.
    source = late_picture_ts(shared)
    assert starts(source)["video"] - starts(source)["audio"] == pytest.approx(0.543, abs=1e-3)
    single = shared.single(source)
    assert_led_like_a_single_pass(source, tmp_path, 114, single)
    # A retry puts chunk 0 back, its copies with it.
    (output,) = [p for p in (tmp_path / "chunked").iterdir() if p.suffix == ".mp4"]
    output.unlink()
    for name in ("chunk-00002.mp4", "chunk-00003.mp4"):
        piece(tmp_path / "chunked", name).unlink()
    again = run(source, CHUNKED, tmp_path / "chunked")
    assert units(again) == {"chunks": 2, "chunks_resumed": 2}
    ms.assert_same_as_single_pass(again[0].path, single, SECONDS, frames=114)


def test_an_mp4_whose_edit_list_starts_its_picture_late_is_chunked(
    clips: dict[str, Path], tmp_path: Path
) -> None:
    # Its picture's edit list begins with 0.4 s of nothing: 10 copies.
    plain = clips["sound"]
    source = tmp_path / "edited.mp4"
    ffmpeg("-itsoffset", "0.4", "-i", str(plain), "-i", str(plain), "-map", "0:v",
           "-map", "1:a", "-c", "copy", "-f", "mp4", str(source))  # fmt: skip
    assert starts(source)["video"] == pytest.approx(0.4)
    assert_led_like_a_single_pass(source, tmp_path, 110)


def test_a_late_picture_ffmpeg_leads_otherwise_than_reckoned_is_done_in_one_pass(
    shared: Shared, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Chunk 0 is checked to hold as many copies as it was planned with (FFmpeg's own
    # count): one more planned, and the video goes in one pass.
    real = media_chunks.lead_copies
    monkeypatch.setattr(media_chunks, "lead_copies", lambda *args: real(*args) + 1)
    source = late_picture_ts(shared)
    single = shared.single(source)
    outputs = run(source, CHUNKED, tmp_path / "chunked")
    assert [o.output_type for o in outputs] == ["video-h264-120p-crf23.mp4"]
    assert not piece(tmp_path / "chunked", "chunk-00000.mp4").exists()
    assert ms.frame_times(outputs[0].path) == ms.frame_times(single)


def test_a_chunk_that_comes_out_short_means_one_pass(
    clips: dict[str, Path], single: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As with frames a decoder will not give from a keyframe on: the last chunk is
    # planned with more frames than the video has left.
    real = media_chunks.plan

    def overcounted(packets, chunk_seconds):
        chunks = real(packets, chunk_seconds)
        last = chunks[-1]
        return [*chunks[:-1], media_chunks.Chunk(last.index, last.start, last.seconds, 10**4)]

    monkeypatch.setattr(media_chunks, "plan", overcounted)
    outputs = run(clips["sound"], CHUNKED, tmp_path)
    assert [o.output_type for o in outputs] == ["video-h264-120p-crf23.mp4"]
    assert not piece(tmp_path, f"chunk-{SECONDS - 1:05d}.mp4").exists()
    ms.assert_same_as_single_pass(outputs[0].path, single["sound"], SECONDS)


def test_a_23_976_fps_matroska_on_a_millisecond_time_base_is_chunked(tmp_path: Path) -> None:
    """Matroska keeps times in milliseconds, so 23.976 fps steps 41 and 42 ms: evenly
    spaced within the 1 ms the chunks allow, but 0.042 - 0.041 is 0.0010000000000000009
    in floats, and such a video (most films) was done in one pass, no checkpoint kept.
    Now it is chunked, and its chunks make the single pass's frames at its times."""
    source = tmp_path / "film.mkv"
    ffmpeg(
        "-f", "lavfi", "-i", f"testsrc2=size=160x120:rate=24000/1001:duration={SECONDS}",
        "-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p",
        "-g", "24", "-keyint_min", "24", "-sc_threshold", "0", "-threads", "1",
        "-f", "matroska", str(source),
    )  # fmt: skip
    chunked = run(source, CHUNKED, tmp_path / "chunked")
    (single, *_) = run(source, SINGLE, tmp_path / "single")
    assert units(chunked)["chunks"] >= SECONDS - 1, units(chunked)
    errors, psnr = ms.decode_errors_and_psnr(chunked[0].path, single.path)
    assert errors == ""
    times, expected = ms.frame_times(chunked[0].path), ms.frame_times(single.path)
    assert len(times) == len(expected) == round(SECONDS * 24000 / 1001)
    assert times == pytest.approx(expected, abs=1e-3)
    assert min(psnr) >= ms.SAME_FRAME_PSNR


def test_a_29_97_fps_video_is_joined_at_its_chunks_exact_lengths(tmp_path: Path) -> None:
    # Keyframes every 20 frames, so 1 s chunks of 40 (1.334667 s): the join started each
    # chunk after the length its MP4 stated in milliseconds (1.335 s), and every frame
    # after the first join was that much later than the single pass's, 1.3 ms by the
    # fourth. Now in 1/120000 s: the single pass's times.
    source = tmp_path / "ntsc.mp4"
    ffmpeg("-f", "lavfi", "-i", "testsrc2=size=160x120:rate=30000/1001:duration=6",
           *tone_source(6), "-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p",
           "-g", "20", "-keyint_min", "20", "-sc_threshold", "0", "-c:a", "aac",
           "-threads", "1", "-f", "mp4", str(source))  # fmt: skip
    (single,) = run(source, SINGLE, tmp_path / "single")
    outputs = run(source, CHUNKED, tmp_path / "chunked")
    assert units(outputs) == {"chunks": 5, "chunks_resumed": 0}
    times = ms.frame_times(single.path)
    assert len(times) == 180
    assert ms.frame_times(outputs[0].path) == times
    errors, psnr = ms.decode_errors_and_psnr(outputs[0].path, single.path)
    assert errors == ""
    assert min(psnr) >= ms.SAME_FRAME_PSNR


def test_a_video_whose_times_start_late_is_cut_at_its_own_keyframes(tmp_path: Path) -> None:
    # Picture and sound both 0.5 s in (a recording cut from a stream keeps its clock).
    # FFmpeg adds the file's start to an input -ss, so each chunk's seek to its
    # keyframe's time went 0.5 s past it: chunks 1-3 began half a second late, the
    # last held 13 frames, not 25 (88 frames, not 100; from frame 25 on, PSNR 15 dB).
    # A lossless sound, which starts with the picture (AAC's priming would start it
    # 23 ms before). (The Matroska case: the next test's, 5 s in.)
    source = tmp_path / "offset.mp4"
    ffmpeg(*video_source(SECONDS, "160x120", ms.RATE), *tone_source(SECONDS),
           "-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p", "-g", str(ms.RATE),
           "-keyint_min", str(ms.RATE), "-sc_threshold", "0", "-c:a", "alac", "-threads", "1",
           "-output_ts_offset", "0.5", "-f", "mp4", str(source))  # fmt: skip
    assert float(ms.probe(source)["format"]["start_time"]) == pytest.approx(0.5)
    (single,) = run(source, SINGLE, tmp_path / "single")
    outputs = run(source, CHUNKED, tmp_path / "chunked")
    assert units(outputs) == {"chunks": SECONDS, "chunks_resumed": 0}
    ms.assert_same_as_single_pass(outputs[0].path, single.path, SECONDS)


def test_a_matroska_whose_times_start_late_is_chunked_against_its_length(
    tmp_path: Path,
) -> None:
    # 4 s starting 5 s in: FFmpeg writes a Matroska's duration as its end, 9 s, which
    # was taken for its length: the chunks' progress ran against 9 s (4 of 9 when done)
    # and the complete output was marked partial. And the previous test's, in Matroska
    # (its sound lossless too): each chunk's seek went 5 s past its keyframe.
    source = tmp_path / "offset.mkv"
    ffmpeg(*video_source(SECONDS, "160x120", ms.RATE), *tone_source(SECONDS),
           "-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p", "-g", str(ms.RATE),
           "-keyint_min", str(ms.RATE), "-sc_threshold", "0", "-c:a", "pcm_s16le",
           "-threads", "1", "-output_ts_offset", "5", "-f", "matroska", str(source))  # fmt: skip
    found = ms.probe(source)["format"]
    assert float(found["start_time"]) == pytest.approx(5)
    assert float(found["duration"]) == pytest.approx(SECONDS + 5)
    (single,) = run(source, SINGLE, tmp_path / "single")
    seen: list[progress.Progress] = []
    progress.reporting_to(seen.append)
    try:
        outputs = run(source, CHUNKED, tmp_path / "chunked")
    finally:
        progress.reporting_to(None)
    assert units(outputs) == {"chunks": SECONDS, "chunks_resumed": 0}
    assert all(r.total == pytest.approx(SECONDS, abs=0.1) for r in seen)
    pictures = 1 - media_chunks.sound_share(160 * 120 * ms.RATE)
    for end in (1, 2, 3):  # each chunk's end, the sound's pass after them
        assert any(r.done == pytest.approx(end * pictures, abs=0.02) for r in seen), end
    assert seen[-1].done == seen[-1].total
    ms.assert_same_as_single_pass(outputs[0].path, single.path, SECONDS)


def vfr_after_sound(shared: Shared, container: str) -> Path:
    """4 s of frames dropped here and there, its AAC sound 23 ms before the picture (the
    encoder's priming)."""
    return shared.source(
        f"vfr-sound.{container}",
        lambda path: ffmpeg(
            *video_source(SECONDS, "160x120", ms.RATE), *tone_source(SECONDS),
            "-vf", "select='lt(mod(n\\,7)\\,5)'", "-fps_mode", "vfr", "-c:v", "libx264",
            "-preset", "ultrafast", "-g", "20", "-c:a", "aac", "-threads", "1",
            "-f", container, str(path),
        ),
    )  # fmt: skip


@pytest.mark.parametrize("container", ["matroska", "mpegts"])
def test_a_variable_frame_rate_picture_after_its_sound_is_chunked_keeping_its_delay(
    container: str, shared: Shared, tmp_path: Path
) -> None:
    # FFmpeg's AAC priming starts the sound 23 ms before the picture: the join started
    # chunk 0 at zero, so such a video (most of those FFmpeg wrote) went in one pass,
    # no checkpoint. Chunk 0 keeps its delay: the single pass's frames at its times.
    # An MPEG-TS's chunk 0 reads its sound too, as the single pass does: its picture
    # read alone started at zero (FFmpeg starts a TS's times at the first stream it
    # reads), and it went in one pass.
    source = vfr_after_sound(shared, container)
    single = shared.single(source)
    outputs = run(source, CHUNKED, tmp_path / "chunked")
    assert units(outputs) == {"chunks": 4, "chunks_resumed": 0}
    times = ms.frame_times(single)
    assert times[0] == pytest.approx(0.023, abs=1e-3)
    assert ms.frame_times(outputs[0].path) == times
    errors, psnr = ms.decode_errors_and_psnr(outputs[0].path, single)
    assert errors == ""
    assert min(psnr) >= ms.SAME_FRAME_PSNR
    assert sound_start(outputs[0].path) == sound_start(single) == 0
    # test_media_frame_rate's Matroska and MPEG-TS with sound (this source): the
    # source's frames at their times (from its start) and a clean decode in the single
    # pass; the sound packet for packet as transcode_audio makes it, in both (the single
    # pass encoded it on the input's time base, a Matroska's 1 ms: its AAC packets
    # said to last 1014, 1015 or 1058 samples).
    start = float(ms.probe(source)["format"]["start_time"])
    kept = [t - start for t in frame_rate.packet_times(source)]
    assert len(kept) == 72
    assert frame_rate.packet_times(single) == pytest.approx(kept, abs=1e-3)
    assert frame_rate.decode_errors(single) == ""
    (alone,) = media.transcode_audio(source, {}, tmp_path / "audio")
    assert frame_rate.audio_packets(single) == frame_rate.audio_packets(alone.path)
    assert frame_rate.audio_packets(outputs[0].path) == frame_rate.audio_packets(single)


def test_a_late_picture_chunk_0_cannot_place_is_done_in_one_pass(
    shared: Shared, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An MPEG-TS's picture read alone starts at zero (FFmpeg starts its times at the
    # first stream read), not 23 ms after its sound, as its single pass has it: chunk 0
    # is checked, and such a chunk 0 means one pass.
    monkeypatch.setattr(media_chunks, "_as_the_single_pass", lambda args, audio_args: args)
    source = vfr_after_sound(shared, "mpegts")
    single = shared.single(source)
    outputs = run(source, CHUNKED, tmp_path / "chunked")
    assert [o.output_type for o in outputs] == ["video-h264-120p-crf23.mp4"]
    assert ms.frame_times(outputs[0].path) == ms.frame_times(single)
    assert ms.frame_times(single)[0] == pytest.approx(0.023, abs=1e-3)


def test_a_constant_rate_picture_a_few_ticks_after_its_sound_is_chunked(tmp_path: Path) -> None:
    # An MPEG-TS's picture and sound seldom start on the same 90 kHz tick: here 0.1 ms
    # apart, within the millisecond a constant rate's chunks allow. Chunk 0 was checked
    # as a variable rate's is (to start that far in: a TS's picture read alone starts at
    # zero) and the video went in one pass after its first chunk, no checkpoint kept.
    # (And the first TS chunked: ffprobe lists each TS packet's side data, its stream
    # id, on a line of its own, an empty one, which was read as a packet without a
    # time: no TS was chunked, one pass, no checkpoint. Its times start where its muxer
    # put them, 1.4 s: the chunks seek by them.)
    plain = tmp_path / "plain.mp4"
    ffmpeg(*video_source(SECONDS, "160x120", ms.RATE), *tone_source(SECONDS),
           "-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p", "-g", str(ms.RATE),
           "-keyint_min", str(ms.RATE), "-sc_threshold", "0", "-c:a", "mp2", "-threads", "1",
           "-f", "mp4", str(plain))  # fmt: skip
    source = tmp_path / "recording.ts"

    def picture_after_sound(offset: float) -> float:
        ffmpeg("-itsoffset", f"{offset:.6f}", "-i", str(plain), "-i", str(plain),
               "-map", "0:v", "-map", "1:a", "-c", "copy", "-f", "mpegts", str(source))  # fmt: skip
        starts = {s["codec_type"]: float(s["start_time"]) for s in ms.probe(source)["streams"]}
        return starts["video"] - starts["audio"]

    gap = picture_after_sound(0.0)  # the muxer's own
    assert 0 < picture_after_sound(0.0001 - gap) < 1e-3
    assert float(ms.probe(source)["format"]["start_time"]) == pytest.approx(1.4)
    (single,) = run(source, SINGLE, tmp_path / "single")
    outputs = run(source, CHUNKED, tmp_path / "chunked")
    assert units(outputs) == {"chunks": SECONDS, "chunks_resumed": 0}
    ms.assert_same_as_single_pass(outputs[0].path, single.path, SECONDS)


@pytest.mark.parametrize("kind", ["late picture", "silent", "variable rate"])
def test_an_mpeg_ts_whose_data_stream_starts_first_is_chunked(kind: str, tmp_path: Path) -> None:
    # A broadcast's data stream (or a DVD's subtitles, a second sound not kept) starts
    # 0.5 s before the picture and sound: the container's start is its, but FFmpeg
    # starts a TS's times at the earliest stream it reads, and the single pass reads
    # no data. The lead counted from the container's start (13 copies of the first
    # frame, 0.5 s) was not what chunk 0 made (6, 1 or 0), and the video went in one
    # pass; a variable rate's chunk 0 was not 0.520 s in. Now counted from the streams
    # read: chunked, the single pass's frames at its times.
    picture, sound = ("0.7", "0.5") if kind == "late picture" else ("0.5", "0.5")
    sources = ["-itsoffset", picture, *video_source(SECONDS, "160x120", ms.RATE)]
    maps = ["-map", "0:v"]
    if kind != "silent":
        sources += ["-itsoffset", sound, *tone_source(SECONDS)]
        maps += ["-map", "1:a", "-c:a", "aac"]
    data = tmp_path / "data.bin"
    data.write_bytes(bytes(range(256)) * 80)
    sources += ["-f", "data", "-i", str(data)]
    maps += ["-map", f"{2 if kind != 'silent' else 1}:d", "-c:d", "copy"]
    if kind == "variable rate":
        codec = ["-vf", "select='lt(mod(n\\,7)\\,5)'", "-fps_mode", "vfr", "-c:v", "libx264",
                 "-preset", "ultrafast", "-g", "20"]  # fmt: skip
    else:
        codec = ["-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p",
                 "-g", str(ms.RATE), "-keyint_min", str(ms.RATE), "-sc_threshold", "0"]  # fmt: skip
    source = tmp_path / "broadcast.ts"
    ffmpeg(*sources, *maps, *codec, "-threads", "1", "-f", "mpegts", str(source))
    found = starts(source)
    assert found["data"] == pytest.approx(float(ms.probe(source)["format"]["start_time"]))
    assert min(v for k, v in found.items() if k != "data") - found["data"] > 0.45
    (single,) = run(source, SINGLE, tmp_path / "single")
    outputs = run(source, CHUNKED, tmp_path / "chunked")
    assert units(outputs) == {"chunks": 4, "chunks_resumed": 0}
    times = ms.frame_times(single.path)
    assert len(times) == {"late picture": 106, "silent": 100, "variable rate": 72}[kind]
    assert ms.frame_times(outputs[0].path) == times
    errors, psnr = ms.decode_errors_and_psnr(outputs[0].path, single.path)
    assert errors == ""
    assert min(psnr) >= ms.SAME_FRAME_PSNR
    assert abs(ms.duration(outputs[0].path) - ms.duration(single.path)) <= ms.FRAME


def test_a_video_whose_rate_ffmpeg_guesses_at_half_its_frames_is_done_in_one_pass(
    tmp_path: Path,
) -> None:
    # Interlaced H.264 at 25 frames a second whose timing (the SPS's VUI) says 12.5, as
    # an encoder that counts fields as frames writes it: FFmpeg's rate conversion puts
    # an MPEG-TS's on 12.5 fps (every other frame dropped, 52 frames). Each chunk of 25
    # frames was 25 output frames, so it read 2 s of the input, and the join held 90
    # frames over 7.2 s (PSNR 15 dB against the single pass's). FFmpeg's own count of
    # frames dropped tells: one pass.
    source = tmp_path / "interlaced.ts"
    ffmpeg(*video_source(SECONDS, "160x120", ms.RATE), "-c:v", "libx264", "-preset",
           "ultrafast", "-pix_fmt", "yuv420p", "-g", str(ms.RATE), "-keyint_min", str(ms.RATE),
           "-sc_threshold", "0", "-flags", "+ilme+ildct", "-x264opts", "tff=1",
           "-bsf:v", "h264_metadata=tick_rate=25", "-threads", "1", "-f", "mpegts",
           str(source))  # fmt: skip
    (stream,) = ms.probe(source)["streams"]
    assert (stream["field_order"], stream["r_frame_rate"], stream["avg_frame_rate"]) == (
        "tt", "25/1", "25/2",
    )  # fmt: skip
    (single,) = run(source, SINGLE, tmp_path / "single")
    outputs = run(source, CHUNKED, tmp_path / "chunked")
    assert [o.output_type for o in outputs] == ["video-h264-120p-crf23.mp4"]
    assert not piece(tmp_path / "chunked", "chunk-00000.mp4").exists()
    assert len(ms.frame_times(single.path)) == 52
    assert ms.frame_times(outputs[0].path) == ms.frame_times(single.path)


@pytest.mark.parametrize("container", ["mpegts", "mp4"])
def test_an_interlaced_video_is_chunked_as_its_single_pass(container: str, tmp_path: Path) -> None:
    # x264's interlaced coding (MBAFF, top field first): FFmpeg guesses its rate from
    # its frames (25, not the field rate), and its chunks are the single pass's frames.
    source = tmp_path / "interlaced"
    ffmpeg(*video_source(SECONDS, "160x120", ms.RATE), "-c:v", "libx264", "-preset",
           "ultrafast", "-pix_fmt", "yuv420p", "-g", str(ms.RATE), "-keyint_min", str(ms.RATE),
           "-sc_threshold", "0", "-flags", "+ilme+ildct", "-x264opts", "tff=1", "-threads", "1",
           "-f", container, str(source))  # fmt: skip
    assert ms.probe(source)["streams"][0]["field_order"] == "tt"
    (single,) = run(source, SINGLE, tmp_path / "single")
    outputs = run(source, CHUNKED, tmp_path / "chunked")
    assert units(outputs) == {"chunks": SECONDS, "chunks_resumed": 0}
    ms.assert_same_as_single_pass(outputs[0].path, single.path, SECONDS)
