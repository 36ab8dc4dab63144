"""``transcode_video`` on variable frame rates (phone clips, screen recordings): every
frame kept at its own time, the sound still in step with the picture; an evenly spaced
video (a 29.97 fps Matroska on its 1 ms time base included) still made on the
constant rate, as before.

Clips are 160x120, under 3 s, their frames timed by ``setpts`` on a 1/90000 time base.
"""

from __future__ import annotations

import array
import itertools
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

import pipelines.media as media
from pipelines.registry import Output
from tests import media_support as ms
from tests.generated.media import ffmpeg

pytestmark = pytest.mark.program("ffmpeg")

PARAMS = {"height": 120, "crf": 23}
TICK = 1 / 90000
# A phone's 30 fps clip: 1 s at 30, a 0.5 s burst at 60, 1 s at 30 with 4 ms of jitter
# (90 frames); the white one is frame 70, at 1.8333 s.
PHONE = "if(lt(N,30),N/30,if(lt(N,60),1+(N-30)/60,1.5+(N-60)/30+0.004*(mod(N,3)-1)))"
FLASH = 70
# A screen recording: 6 frames in 3 s, further apart each time.
SCREEN = "N*N*0.1+N*0.1"
RATE = 44100


def timed(
    path: Path,
    times: str,
    *,
    frames: int,
    rate: int,
    flash_at: float | None,
    flash: int = FLASH,
    keyframes: str = "",
    seconds: float = 2.5,
) -> Path:
    """An H.264 MP4 of ``frames`` frames (black, frame ``flash`` white) at ``times``
    (seconds, an expression of N), kept as they are; with ``flash_at``, a sound silent
    until a 1 kHz tone starts then (the white frame's time), ``seconds`` long.
    ``keyframes``: the times (``-force_key_frames``) of its only keyframes;
    ``testsrc2`` moving under the white frame, so that each frame differs from the next."""
    picture = f"color=c=black:s=160x120:r={rate},trim=end_frame={frames}"
    if keyframes:
        picture = f"testsrc2=s=160x120:r={rate},trim=end_frame={frames}"
    picture += f",drawbox=c=white:t=fill:enable='eq(n\\,{flash})'"
    picture += f",settb=1/90000,setpts='({times.replace(',', chr(92) + ',')})/TB'"
    sources = ["-f", "lavfi", "-i", picture]
    codecs = ["-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p"]
    codecs += ["-fps_mode", "passthrough", "-enc_time_base", "1:90000"]
    codecs += ["-video_track_timescale", "90000"]
    if keyframes:
        codecs += ["-g", "100000", "-sc_threshold", "0", "-force_key_frames", keyframes]
    if flash_at is not None:
        tone = f"aevalsrc='if(gte(t\\,{flash_at})\\,0.5*sin(2*PI*1000*t)\\,0)'"
        sources += ["-f", "lavfi", "-i", f"{tone}:s={RATE}:d={seconds}"]
        codecs += ["-c:a", "aac"]
    ffmpeg(*sources, *codecs, "-threads", "1", "-f", "mp4", str(path))
    return path


def packet_times(path: Path) -> list[float]:
    found = ms.ffprobe(
        path,
        "-select_streams",
        "v:0",
        "-show_entries",
        "packet=pts_time",
        "-print_format",
        "csv=p=0",
    )
    return sorted(float(line.strip().strip(",")) for line in found.split())


def flash_time(path: Path) -> float:
    """When the white frame is shown (decoded: its mean luma)."""
    done = subprocess.run(
        ["ffprobe", "-v", "error", "-f", "lavfi", "-i", f"movie={path},signalstats",
         "-show_entries", "frame=pts_time:frame_tags=lavfi.signalstats.YAVG",
         "-print_format", "csv=p=0"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    rows = [line.split(",") for line in done.stdout.split()]
    return min(float(t) for t, luma in rows if float(luma) > 128)


def tone_onset(path: Path) -> float:
    """When the sound starts (decoded: its first sample over a quarter of full scale)."""
    done = subprocess.run(
        ["ffmpeg", "-nostdin", "-v", "error", "-i", f"file:{path}", "-map", "0:a:0",
         "-ac", "1", "-ar", str(RATE), "-f", "s16le", "-"],
        capture_output=True, check=True,
    )  # fmt: skip
    samples = array.array("h", done.stdout)
    first = next(i for i, s in enumerate(samples) if abs(s) > 8192)
    (sound,) = [s for s in ms.probe(path)["streams"] if s["codec_type"] == "audio"]
    start = float(sound["start_time"])
    return start + first / RATE


def decode_errors(path: Path) -> str:
    """What a strict full decode says: empty when clean. Its frames are passed on the
    file's own time base (:func:`tests.media_support.decode_errors`' null output
    rounds a burst's times onto its rate and complains of equal ones, the source's too)."""
    done = subprocess.run(
        ["ffmpeg", "-nostdin", "-v", "error", "-xerror", "-i", f"file:{path}",
         "-enc_time_base", "-1", "-f", "null", "-"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return done.stderr.strip() if done.returncode == 0 else f"exit {done.returncode}: {done.stderr}"


def transcode(source: Path, workdir: Path) -> Output:
    workdir.mkdir()
    (video, *rest) = media.transcode_video(source, PARAMS, workdir)
    assert rest == []  # not partial
    assert decode_errors(video.path) == ""
    return video


def test_a_phone_clips_burst_keeps_every_frame_at_its_time_and_the_sound_in_step(
    tmp_path: Path,
) -> None:
    # On the constant rate the frames after the burst were moved on the output's grid
    # (up to 0.17 s late: the white frame no longer met the tone's start).
    source = timed(tmp_path / "phone.mp4", PHONE, frames=90, rate=30, flash_at=1.5 + 10 / 30)
    video = transcode(source, tmp_path / "out")
    times, expected = packet_times(video.path), packet_times(source)
    assert len(times) == len(expected) == 90
    assert times == pytest.approx(expected, abs=TICK)
    assert flash_time(video.path) == pytest.approx(flash_time(source), abs=TICK)
    # The sound's start within a few AAC samples of the source's, and of the white frame.
    assert tone_onset(video.path) == pytest.approx(tone_onset(source), abs=2e-3)
    assert tone_onset(video.path) == pytest.approx(flash_time(video.path), abs=3e-3)
    assert abs(ms.duration(video.path) - ms.duration(source)) <= 1 / 30


def test_a_screen_recordings_few_frames_stay_few(tmp_path: Path) -> None:
    # On the constant rate its 6 frames were copied onto a 5 fps grid: 18.
    source = timed(tmp_path / "screen.mp4", SCREEN, frames=6, rate=60, flash_at=None)
    video = transcode(source, tmp_path / "out")
    assert packet_times(source) == pytest.approx([0, 0.2, 0.6, 1.2, 2.0, 3.0], abs=TICK)
    assert packet_times(video.path) == pytest.approx(packet_times(source), abs=TICK)


def test_a_variable_frame_rate_in_mpeg_ts_keeps_its_frames_times(tmp_path: Path) -> None:
    # ffprobe lists each TS packet's side data (its stream id) on a line of its own, an
    # empty one, which was read as a packet without a time: the frames were taken for
    # evenly spaced, the 6 copied onto a 5 fps grid (18), and a long TS never chunked.
    recorded = timed(tmp_path / "screen.mp4", SCREEN, frames=6, rate=60, flash_at=None)
    source = tmp_path / "screen.ts"
    ffmpeg("-i", str(recorded), "-c", "copy", "-f", "mpegts", str(source))
    video = transcode(source, tmp_path / "out")
    start = packet_times(source)[0]
    assert start > 1  # the muxer's delay
    kept = [t - start for t in packet_times(source)]
    assert kept == pytest.approx([0, 0.2, 0.6, 1.2, 2.0, 3.0], abs=TICK)
    assert packet_times(video.path) == pytest.approx(kept, abs=TICK)


def test_an_evenly_spaced_video_is_made_on_the_constant_rate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 29.97 fps in Matroska: its 1 ms time base steps 33 and 34 ms, a constant rate.
    source = tmp_path / "ntsc.mkv"
    ffmpeg("-f", "lavfi", "-i", "testsrc2=size=160x120:rate=30000/1001:duration=1",
           "-c:v", "libx264", "-preset", "ultrafast", "-threads", "1", str(source))  # fmt: skip
    ran: list[list[str]] = []
    real = media.transcode

    def watched(args: list[str], *rest: Any, **named: Any) -> bool:
        ran.append(args)
        return real(args, *rest, **named)

    monkeypatch.setattr(media, "transcode", watched)
    phone = timed(tmp_path / "phone.mp4", PHONE, frames=90, rate=30, flash_at=None)
    transcode(source, tmp_path / "ntsc")
    transcode(phone, tmp_path / "phone")
    assert ["-fps_mode" in args for args in ran] == [False, True]
    steps = {round(b - a, 3) for a, b in itertools.pairwise(packet_times(source))}
    assert steps == {0.033, 0.034}


# A long phone clip, cut in 1 s chunks at its keyframes (one a second): 60 frames at
# ~30 fps with 4 ms of jitter, a 60 fps burst (2-3 s), three slow frames 0.3 s apart,
# 24 at 60 fps, then 30 fps to 6 s; white frame 177 (5.2 s), where the tone starts.
# Chunk 2 ends in the burst and chunk 3 starts slow: its first decode times (the
# encoder's B-frame delay, in its own first steps) fall before chunk 2's last.
CUT = (
    "if(lt(N,60),N/30+0.004*mod(N,3),if(lt(N,120),2+(N-60)/60,"
    "if(lt(N,123),3+(N-120)*0.3,if(lt(N,147),3.8+(N-123)/60,4.2+(N-147)/30))))"
)
CUT_FRAMES, CUT_FLASH = 201, 177
CHUNKED = {**PARAMS, "chunk_seconds": 1, "chunk_above_seconds": 1}


def audio_packets(path: Path) -> list[str]:
    return ms.ffprobe(
        path, "-select_streams", "a:0", "-show_entries", "packet=pts,dts,duration,size",
        "-print_format", "csv=p=0",
    ).split()  # fmt: skip


def test_a_long_variable_frame_rate_video_is_chunked_keeping_its_frames_times(
    tmp_path: Path,
) -> None:
    # Never chunked before: no checkpoint, a killed job started again from nothing.
    source = timed(
        tmp_path / "long-phone.mp4", CUT, frames=CUT_FRAMES, rate=60, flash_at=5.2,
        flash=CUT_FLASH, keyframes="0,1,2,3,4,5", seconds=6,
    )  # fmt: skip
    single = transcode(source, tmp_path / "single")
    workdir = tmp_path / "chunked"
    workdir.mkdir()
    (chunked, usage) = media.transcode_video(source, CHUNKED, workdir)
    assert json.loads(usage.path.read_text()) == {"chunks": 6, "chunks_resumed": 0}
    assert decode_errors(chunked.path) == ""
    times, expected = packet_times(chunked.path), packet_times(single.path)
    assert len(times) == len(expected) == CUT_FRAMES
    assert times == pytest.approx(expected, abs=TICK)
    assert times == pytest.approx(packet_times(source), abs=TICK)
    assert min(ms.frame_psnr(chunked.path, single.path)) >= ms.SAME_FRAME_PSNR
    # The sound is the single pass's, packet for packet, and starts with the white frame.
    assert audio_packets(chunked.path) == audio_packets(single.path)
    assert flash_time(chunked.path) == pytest.approx(flash_time(source), abs=TICK)
    assert tone_onset(chunked.path) == pytest.approx(flash_time(chunked.path), abs=3e-3)
    # FFmpeg guesses the last frame's length (from a rate) either way: within a frame.
    assert abs(ms.duration(chunked.path) - ms.duration(single.path)) <= 1 / 30


# Matroska and MPEG-TS with sound, and Matroska silent: the same sources as
# test_media_chunks' variable rate cases, which check these outputs too.
@pytest.mark.parametrize(
    ("container", "sound"),
    [
        pytest.param("flv", True, id="flv-sound"),
        pytest.param("mp4", True, id="mp4-sound"),
        pytest.param("flv", False, id="flv-silent"),
        pytest.param("mp4", False, id="mp4-silent"),
        pytest.param("mpegts", False, id="mpegts-silent"),
    ],
)
def test_a_variable_frame_rates_sound_is_timed_as_its_samples_are(
    container: str, sound: bool, tmp_path: Path
) -> None:
    # The single pass encoded the sound on the input's time base too (-enc_time_base -1
    # for every stream): a Matroska's (an FLV's) 1 ms, so its AAC packets were said to
    # last 1014, 1015 or 1058 samples, where a chunked output (the sound alone, on its
    # encoder's 1/44100) had the sound transcode_audio makes: the two differed.
    source = tmp_path / f"vfr.{container}"
    tone = ["-f", "lavfi", "-i", f"sine=frequency=440:sample_rate={RATE}:duration=4"]
    ffmpeg("-f", "lavfi", "-i", "testsrc2=size=160x120:rate=25:duration=4",
           *(tone if sound else []), "-vf", "select='lt(mod(n\\,7)\\,5)'", "-fps_mode", "vfr",
           "-c:v", "libx264", "-preset", "ultrafast", "-g", "20", "-c:a", "aac",
           "-threads", "1", "-f", container, str(source))  # fmt: skip
    outputs = {}
    for name, params in [("single", PARAMS), ("chunked", CHUNKED)]:
        workdir = tmp_path / name
        workdir.mkdir()
        (outputs[name], *usage) = (o.path for o in media.transcode_video(source, params, workdir))
        assert decode_errors(outputs[name]) == ""
        assert len(usage) == (name == "chunked")
    single, chunked = outputs["single"], outputs["chunked"]
    # The picture as before: the source's frames at their times (from its start), in both.
    start = float(ms.probe(source)["format"]["start_time"])
    kept = [t - start for t in packet_times(source)]
    assert len(kept) == 72
    assert packet_times(single) == pytest.approx(kept, abs=1e-3)
    assert ms.frame_times(chunked) == ms.frame_times(single)
    if not sound:
        assert [s["codec_type"] for s in ms.probe(single)["streams"]] == ["video"]
        return
    # The sound packet for packet as transcode_audio makes it (the same encoder and
    # options), in a single pass and in chunks; from an MP4 (its sound on 1/44100)
    # every packet 1024 samples but the last.
    (workdir := tmp_path / "audio").mkdir()
    (alone,) = media.transcode_audio(source, {}, workdir)
    assert audio_packets(single) == audio_packets(alone.path)
    assert audio_packets(chunked) == audio_packets(single)
    if container == "mp4":
        durations = [int(p.split(",")[2]) for p in audio_packets(single)]
        assert set(durations[:-1]) == {1024}
