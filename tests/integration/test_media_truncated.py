"""A truncated MP4 (an upload cut short) through the media steps, in-process on real
FFmpeg: with its index first, what decodes is transcoded and the output is marked
partial (the step's ``partial`` unit, on the attempt's record); with its index at the
end (lost with the tail) nothing can be read, and the refusal says so."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import pipelines.media as media
from pipelines.registry import USAGE_OUTPUT, Output, PipelineError
from tests import media_support as ms
from tests.generated.media import ffmpeg, tone_source, video_source

pytestmark = pytest.mark.program("ffmpeg")

SECONDS = 6
KEPT = 0.6  # of the bytes


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The whole clips the tests cut (or use whole), made once for the module: with
    its index first (``faststart``, as streamed uploads have it), at the end
    (``index_last``), and without sound (``silent``)."""
    root = tmp_path_factory.mktemp("truncated-clips")
    return {
        "faststart": ms.clip(root / "faststart.mp4", SECONDS, faststart=True),
        "index_last": ms.clip(root / "index-last.mp4", SECONDS),
        "silent": ms.clip(root / "silent.mp4", SECONDS, sound=False),
    }


@pytest.fixture(scope="module")
def late_matroska(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 s of picture and sound in Matroska, its times starting 5 s in (both steps cut
    the same file)."""
    whole = tmp_path_factory.mktemp("truncated-late") / "whole.mkv"
    ffmpeg(*video_source(8, "160x120", ms.RATE), *tone_source(8), "-c:v", "libx264",
           "-preset", "ultrafast", "-pix_fmt", "yuv420p", "-c:a", "aac", "-threads", "1",
           "-output_ts_offset", "5", "-f", "matroska", str(whole))  # fmt: skip
    return whole


def _truncated(tmp_path: Path, whole: Path) -> Path:
    data = whole.read_bytes()
    cut = tmp_path / "input"
    cut.write_bytes(data[: int(len(data) * KEPT)])
    return cut


def _units(outputs: list[Output]) -> dict[str, int]:
    found = [o for o in outputs if o.output_type == USAGE_OUTPUT]
    return json.loads(found[0].path.read_text()) if found else {}


@pytest.mark.parametrize(
    ("operation", "params", "units"),
    [
        ("transcode_video", {}, {"partial": 1}),
        (
            "transcode_video",
            {"chunk_seconds": 1, "chunk_above_seconds": 1},
            {"chunks": 4, "chunks_resumed": 0, "partial": 1},
        ),
        ("transcode_audio", {}, {"partial": 1}),
    ],
)
def test_what_decodes_is_transcoded_and_marked_partial(
    operation: str,
    params: dict[str, int],
    units: dict[str, int],
    tmp_path: Path,
    whole: dict[str, Path],
) -> None:
    source = _truncated(tmp_path, whole["faststart"])
    step = getattr(media, operation)
    outputs = step(source, params, tmp_path)
    assert _units(outputs) == units
    output = outputs[0].path
    assert ms.decode_errors(output) == ""
    assert 0.5 * SECONDS * KEPT < ms.duration(output) < SECONDS - 1
    if operation == "transcode_video":
        assert ms.codecs(output) == ["h264", "aac"]


def test_a_whole_file_is_not_partial(tmp_path: Path, whole: dict[str, Path]) -> None:
    source = Path(shutil.copy(whole["faststart"], tmp_path / "input"))
    assert _units(media.transcode_video(source, {}, tmp_path)) == {}


@pytest.mark.parametrize("operation", ["transcode_video", "transcode_audio"])
def test_a_truncated_matroska_whose_times_start_late_is_partial(
    operation: str, tmp_path: Path, late_matroska: Path
) -> None:
    # Its length is counted from its start (its stated duration, 13 s, is its end): a
    # file cut short is still marked partial against its 8 s.
    source = tmp_path / "input"
    source.write_bytes(late_matroska.read_bytes()[: int(late_matroska.stat().st_size * KEPT)])
    outputs = getattr(media, operation)(source, {}, tmp_path)
    assert _units(outputs) == {"partial": 1}
    assert 8 * KEPT * 0.5 < ms.duration(outputs[0].path) < 8 - 1


# Where the file ends (bytes past the start of its moov box, or a share of the whole
# file): the moov's header alone, its mvhd, a first trak half read, most of the index,
# and the index lost with the tail (the mdat cut).
@pytest.mark.parametrize("cut", [8, 100, 600, 3000, "60%"])
@pytest.mark.parametrize("operation", ["transcode_video", "transcode_audio"])
def test_an_mp4_whose_index_was_cut_off_is_refused_clearly(
    cut: int | str, operation: str, tmp_path: Path, whole: dict[str, Path]
) -> None:
    # Cut inside its moov, the file had "no video stream" (no_streams): ffprobe reads a
    # moov that ends early as one without tracks.
    data = whole["index_last"].read_bytes()
    moov = data.index(b"moov") - 4
    assert moov > len(data) // 2  # the index is at the end
    end = int(len(data) * KEPT) if cut == "60%" else moov + int(cut)
    source = tmp_path / "input"
    source.write_bytes(data[:end])
    with pytest.raises(PipelineError) as caught:
        getattr(media, operation)(source, {}, tmp_path)
    assert caught.value.code == "invalid_input", caught.value.message
    assert "cut short: its index (moov) is incomplete" in caught.value.message


def test_an_mp4_without_sound_still_has_no_audio_stream(
    tmp_path: Path, whole: dict[str, Path]
) -> None:
    source = Path(shutil.copy(whole["silent"], tmp_path / "input"))
    with pytest.raises(PipelineError) as caught:
        media.transcode_audio(source, {}, tmp_path)
    assert caught.value.code == "no_streams", caught.value.message
