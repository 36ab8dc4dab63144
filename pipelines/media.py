"""Media steps on FFmpeg: ``transcode_video`` (MP4, H.264 + AAC) and ``transcode_audio``.

Both steps run the same way:

1. parameters validated (:func:`video_request`, :func:`audio_request`) before the file
   is opened; unknown keys and bad values are ``invalid_params``;
2. the container sniffed from the first bytes (:func:`detect`, with the signatures of
   :mod:`pipelines.formats.signatures` that ingest used), never the name, and
   mapped to the FFmpeg demuxer that will read it. FFmpeg is never asked to guess: a
   guessing FFmpeg reads a playlist saved as ``.mp4`` as HLS and fetches what it names.
   Every FFmpeg call names the demuxer (``-f``), allows that demuxer only
   (``-format_whitelist``) and local files only (``-protocol_whitelist file``), and
   gets the input as ``file:/abs/path`` so nothing in it is read as an option or a URL.
   A MIDI file (notes, no samples) or anything not audio/video is
   ``unsupported_format``; an empty file is ``invalid_input``;
3. probed with ffprobe (JSON): a container it cannot open (an MP4 cut inside its index
   included, see below) is ``invalid_input``; a
   DRM-protected track (FairPlay ``drms``, Common Encryption ``enca``/``encv`` ...) is
   ``encrypted_document``; no video stream for ``transcode_video`` (cover art does not
   count) or no audio stream for ``transcode_audio`` is ``no_streams`` (the message
   says which operation fits instead); a stated duration over ``max_duration_seconds``
   is ``duration_limit`` and a stated duration of zero is ``invalid_input`` ("no
   samples");
4. transcoded by ffmpeg into the workdir (its ``-progress`` reported as the step's, in
   seconds of output against the input's length, :attr:`Probe.length`), metadata and
   chapters dropped, one thread per codec and filter graph (the sandbox's
   ``RLIMIT_NPROC`` counts threads). The picture keeps its frame rate: an evenly
   spaced one on the MP4 output's constant rate, a variable one (a phone's burst, a
   screen recording's idle seconds; :func:`pipelines.media_chunks.variable_rate` of
   its packets) every frame at its own time, on its own time base. An HDR picture (PQ
   or HLG, ffprobe's ``color_transfer``) is tone-mapped to SDR BT.709 with zimg (see
   :func:`_picture_args`): 5 s of 1080p PQ to 720p took 3.4 CPU-s against 1.5
   untouched, and 210 MB resident (RLIMIT_AS: 512 MB was enough, 448 MB not). The
   output is cut at ``max_duration_seconds`` + 1 s, so an input whose header did not
   state its length still cannot run for hours; an output longer than the limit is
   ``duration_limit``;
5. the output probed again: it must hold the encoded stream and last longer than
   zero, else ``invalid_input`` ("no samples": nothing could be decoded).

A video longer (:attr:`Probe.length`) than the profile's ``chunk_above_seconds`` is
transcoded in keyframe-aligned chunks that survive the loss of the worker
(:mod:`pipelines.media_chunks`), a variable frame rate's at its frames' own times too;
shorter ones in one pass.

A truncated input (an MP4/MOV whose index says more than its file holds: FFmpeg's
"partial file") is transcoded as far as it decodes (a video whose sound fails first:
its picture alone); an output shorter than the input's length (:attr:`Probe.length`)
by a second and 2 % or more, or from such an input, is marked partial: the step's units
of work say ``partial: 1`` (the attempt's record shows them). A truncated MP4 whose
index was at the end has lost it (or part of it): the file ends inside or before its
``moov`` box. Where ffprobe then fails, finds no track of the kind asked for, or the transcode
fails, that is ``invalid_input`` ("cut short: its index (moov) is incomplete or
missing"), never ``no_streams``; where what is left of the index still decodes, the
output is marked partial.

ffmpeg's own failures become ``invalid_input`` with the last lines it printed (our
paths replaced); its deaths by rlimit keep the sandbox's codes: ``cpu_limit``
(``RLIMIT_CPU``: SIGXCPU, on which ffmpeg stops and exits 255, or SIGKILL),
``output_limit`` (SIGXFSZ) and ``memory_limit`` (``RLIMIT_AS``: "Cannot allocate
memory", or too little address space to even map its libraries; 512 MB was enough
for a 4K H.264 input to 720p, 256 MB is not).

Output types carry every parameter that changes the output::

    video-h264-720p-crf23.mp4     audio-aac-128k.m4a   audio-opus-96k.ogg
    audio-mp3-192k.mp3

``height`` is the largest height: smaller inputs keep theirs (never upscaled) and
dimensions are rounded to even numbers (H.264 4:2:0 needs them). A picture wider than
libx264 encodes (16384 pixels, :data:`MAX_SIDE`; a panorama, a 17000x64 strip) is
scaled down to fit, its shape kept; one that would then be under 2 pixels high (or,
at its height, under a pixel wide) is ``invalid_input`` (:func:`check_picture`). The limits
(``max_duration_seconds``) decide whether there is an output, never what it is, so
they are not in the name. Job params are the profile's ``params`` merged with the
request's, and a request may not send ``max_*`` keys: the profile's ``[limits]``
(checked at submit from the headers) are not passed down, so the defaults here equal
them (7200 s video, 14400 s audio) and a profile may set ``max_duration_seconds`` in
its ``params`` to change what the step enforces. A video's sound is AAC at 128 kbit/s;
every output is mono or stereo. A tool that cannot even be started (fork refused by
``RLIMIT_NPROC``) is ``tool_unavailable``, retryable.
"""

from __future__ import annotations

import json
import logging
import math
import re
import resource
import shutil
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

from pipelines import media_chunks, progress
from pipelines.formats import signatures
from pipelines.formats.media import isobmff_index_cut
from pipelines.formats.source import FileSource
from pipelines.params import integer, reject_unknown
from pipelines.registry import Output, PipelineError, register, usage_output

log = logging.getLogger(__name__)

# The profiles' limits (etc/profiles.toml, [profiles.transcode_*.limits]); a profile's
# params may carry ``max_duration_seconds`` to change them.
DEFAULT_MAX_VIDEO_SECONDS = 7200.0
DEFAULT_MAX_AUDIO_SECONDS = 14400.0
LIMIT_KEY = "max_duration_seconds"
# The profile's chunking (pipelines.media_chunks): they change how, not what.
CHUNK_KEYS = (media_chunks.CHUNK_SECONDS_KEY, media_chunks.CHUNK_ABOVE_KEY)

DEFAULT_HEIGHT = 720
MIN_HEIGHT, MAX_HEIGHT = 16, 4320
# The widest and highest picture libx264 encodes ("invalid width x height (17000x64)"
# past it); its levels' limits (6.2: 139,264 macroblocks, 16384x4096 is 262,144) it
# only warns about. MAX_HEIGHT is under it: only the width needs bounding.
MAX_SIDE = 16384
DEFAULT_CRF = 23
DEFAULT_BITRATE_KBPS = 128
MIN_BITRATE_KBPS, MAX_BITRATE_KBPS = 32, 320
# How much past the limit an output may be cut (see step 4 of the module docstring).
_LIMIT_SLACK_SECONDS = 1.0
# Seconds between ffmpeg's progress blocks (-progress, -stats_period).
_PROGRESS_PERIOD = 0.25
# The last lines of ffmpeg's messages kept for the user, at most this long.
_MAX_MESSAGE = 400
# What FFmpeg and its libraries print when RLIMIT_AS bites (lower case).
_OUT_OF_MEMORY = (
    "cannot allocate memory",
    "failed to map segment",
    "malloc of size",
    "out of memory",
)
# What FFmpeg's MOV demuxer says of a file that ends before its index (lower case).
_PARTIAL_FILE = "partial file"
# An output this much shorter than the input's stated duration (or more) is partial.
_PARTIAL_SECONDS, _PARTIAL_SHARE = 1.0, 0.02
# ffprobe's name of a layout it cannot name (FFmpeg 6 and later; 5 says "unknown").
_UNNAMED_LAYOUT = re.compile(r"[0-9]+ channels")
# Up to this many channels of no named layout, FFmpeg takes its default layout of that
# many (6: 5.1) to mix them to stereo; past it, which (if any) depends on its version.
_GUESSED_CHANNELS = 8
_CONTEXT = re.compile(r"\[([\w,]+) @ 0x[0-9a-f]+\]")

# Transfers of HDR pictures (ffprobe's names, which zscale's ``tin`` takes): PQ, HLG.
_HDR_TRANSFERS = frozenset({"smpte2084", "arib-std-b67"})
# The primaries and matrices an HDR picture may state that zscale reads by the same
# name; anything else is read as HDR10's (bt2020, bt2020nc).
_HDR_PRIMARIES = frozenset({"bt2020", "bt709", "smpte432", "smpte431"})
_HDR_MATRICES = frozenset({"bt2020nc", "bt2020c", "bt709"})
# What a tone-mapped output is: SDR BT.709, limited range.
_SDR_TAGS = ["-color_primaries", "bt709", "-color_trc", "bt709", "-colorspace", "bt709"]
_SDR_TAGS += ["-color_range", "tv"]

# Demuxers whose duration (ffprobe's format and stream durations) is where the file's
# times end, counted from zero, as FFmpeg's muxers write it: a Matroska or WebM (the
# segment's Duration: the latest block's end) or ASF of 8 s starting 5 s in (a
# recording cut from a stream keeps its clock) says 13 s. FFmpeg reads the others' as
# a length (an MPEG-TS's, an Ogg's from their first and last times; an FLV's metadata),
# and an MP4's movie header is checked against its tracks (Probe.span).
_DURATION_ENDS = frozenset({"matroska", "asf"})

# Demuxers whose times may jump (FFmpeg's AVFMT_TS_DISCONT, on 33-bit clocks), of which
# FFmpeg 5.1 starts an output's times at the earliest start of the streams it reads
# where that is after the container's (process_input's "Correcting start time": the
# container's start counts every stream, a data stream's too). Measured: a TS and a
# PS read without their first stream start at the others'; an Ogg (the flag, but times
# of 64 bits) at the container's.
_STARTS_AT_STREAMS_READ = frozenset({"mpegts", "mpeg"})

# Sample entries of protected tracks, as ffprobe reports them in codec_tag_string.
_PROTECTED_TAGS = {"drms", "drmi", "drma", "drmv", "enca", "encv", "enct", "encs", "p608"}


# -- what the input is ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Container:
    """A sniffed media container: the FFmpeg demuxer that reads it, a label for people."""

    demuxer: str
    label: str


# Signature format (pipelines.formats.signatures, what ingest detected) ->
# the FFmpeg demuxer that reads it.
_DEMUXERS = {
    "isobmff": "mov",
    "ebml": "matroska",
    "avi": "avi",
    "wav": "wav",
    "aiff": "aiff",
    "flac": "flac",
    "ogg": "ogg",
    "mp3": "mp3",
    "aac": "aac",
    "flv": "flv",
    "asf": "asf",
    "au": "au",
    "wavpack": "wv",
    "mpeg-ps": "mpeg",
    "mpeg-ts": "mpegts",
    "flic": "flic",
}


def detect(path: Path) -> Container:
    """The container of ``path`` by content (the signatures ingest used), refused unless
    it is media FFmpeg may read."""
    with path.open("rb") as file:
        head = file.read(signatures.HEAD_BYTES)
    found = signatures.detect(head)
    if found.kind == "empty":
        raise PipelineError("invalid_input", "the input file is empty")
    if found.format == "midi":
        raise PipelineError(
            "unsupported_format",
            "a MIDI file holds notes, not audio samples: there is nothing to transcode",
        )
    if found.format == "unknown" and head.startswith(b"\x0b\x77"):
        return Container("ac3", "AC-3 audio")  # ingest knows it from libmagic
    demuxer = _DEMUXERS.get(found.format) if found.kind in ("audio", "video") else None
    if demuxer is None:
        raise PipelineError("unsupported_format", f"{found.label} is not an audio or video file")
    return Container(demuxer, found.label)


# -- parameters -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VideoRequest:
    height: int
    crf: int
    max_seconds: float

    @property
    def output_type(self) -> str:
        return f"video-h264-{self.height}p-crf{self.crf}.mp4"


@dataclass(frozen=True, slots=True)
class AudioCodec:
    name: str
    encoder: str
    muxer: str
    extension: str
    content_type: str


AUDIO_CODECS: dict[str, AudioCodec] = {
    "aac": AudioCodec("aac", "aac", "ipod", "m4a", "audio/mp4"),
    "opus": AudioCodec("opus", "libopus", "ogg", "ogg", "audio/ogg"),
    "mp3": AudioCodec("mp3", "libmp3lame", "mp3", "mp3", "audio/mpeg"),
}


@dataclass(frozen=True, slots=True)
class AudioRequest:
    codec: AudioCodec
    bitrate_kbps: int
    max_seconds: float

    @property
    def output_type(self) -> str:
        return f"audio-{self.codec.name}-{self.bitrate_kbps}k.{self.codec.extension}"


def video_request(params: Mapping[str, Any]) -> VideoRequest:
    """``codec`` (h264), ``height`` (largest output height), ``crf`` (0-51)."""
    reject_unknown("transcode_video", params, ("codec", "height", "crf", LIMIT_KEY, *CHUNK_KEYS))
    media_chunks.chunking(params)
    codec = params.get("codec", "h264")
    if codec != "h264":
        raise PipelineError("invalid_params", f"transcode_video: codec must be h264, got {codec!r}")
    return VideoRequest(
        height=integer(params, "height", MIN_HEIGHT, MAX_HEIGHT, DEFAULT_HEIGHT),
        crf=integer(params, "crf", 0, 51, DEFAULT_CRF),
        max_seconds=_seconds(params, DEFAULT_MAX_VIDEO_SECONDS),
    )


def audio_request(
    params: Mapping[str, Any], encoders: Callable[[], frozenset[str]] | None = None
) -> AudioRequest:
    """``codec`` (aac, opus, mp3 where FFmpeg has LAME), ``bitrate`` ("128k").
    ``encoders``: which FFmpeg encoders there are (default: this machine's FFmpeg's)."""
    reject_unknown("transcode_audio", params, ("codec", "bitrate", LIMIT_KEY))
    name = params.get("codec", "aac")
    choices = list(AUDIO_CODECS)
    if name != "aac":  # FFmpeg's own AAC encoder is always there; the others are libraries
        have = (encoders or ffmpeg_encoders)()
        choices = ["aac", *(c for c in choices[1:] if AUDIO_CODECS[c].encoder in have)]
    if not isinstance(name, str) or name not in choices:
        raise PipelineError(
            "invalid_params",
            f"transcode_audio: codec must be one of {', '.join(choices)}, got {name!r}",
        )
    return AudioRequest(
        codec=AUDIO_CODECS[name],
        bitrate_kbps=_bitrate(params.get("bitrate", f"{DEFAULT_BITRATE_KBPS}k")),
        max_seconds=_seconds(params, DEFAULT_MAX_AUDIO_SECONDS),
    )


def _seconds(params: Mapping[str, Any], default: float) -> float:
    value = params.get(LIMIT_KEY, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise PipelineError(
            "invalid_params", f"{LIMIT_KEY} must be a positive number, got {value!r}"
        )
    if not math.isfinite(value):
        raise PipelineError("invalid_params", f"{LIMIT_KEY} must be finite, got {value!r}")
    return float(value)


def _bitrate(value: object) -> int:
    """``"128k"`` or 128000 (bits per second) -> 128 (kbit/s)."""
    kbps: int | None = None
    if isinstance(value, str) and re.fullmatch(r"[0-9]{1,4}k", value.strip().lower()):
        kbps = int(value.strip()[:-1])
    elif isinstance(value, int) and not isinstance(value, bool) and value % 1000 == 0:
        kbps = value // 1000
    if kbps is None or not MIN_BITRATE_KBPS <= kbps <= MAX_BITRATE_KBPS:
        raise PipelineError(
            "invalid_params",
            f'bitrate must be {MIN_BITRATE_KBPS}k..{MAX_BITRATE_KBPS}k (e.g. "128k"),'
            f" got {value!r}",
        )
    return kbps


# -- the tools ------------------------------------------------------------------------


@cache
def _tool(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/local/bin:/usr/bin:/bin")
    if path is None:
        raise PipelineError("tool_unavailable", f"{name} is not installed", retryable=True)
    return path


def _ffmpeg_listing(what: str) -> list[list[str]]:
    """The lines of ``ffmpeg -<what>`` (``encoders``, ``filters``), split in fields."""
    listing = subprocess.run(
        [_tool("ffmpeg"), "-hide_banner", "-nostdin", f"-{what}"],
        capture_output=True,
        text=True,
        check=False,
        stdin=subprocess.DEVNULL,
    ).stdout
    return [line.split() for line in listing.splitlines()]


@cache
def ffmpeg_encoders() -> frozenset[str]:
    """The encoders this FFmpeg build has (``ffmpeg -encoders``)."""
    return frozenset(
        fields[1]
        for fields in _ffmpeg_listing("encoders")
        if len(fields) >= 2 and len(fields[0]) == 6 and fields[0][0] in "VAS"
    )


@cache
def ffmpeg_build() -> str:
    """This FFmpeg build as ``ffmpeg -version`` prints it (its version, configuration
    and libraries' versions): what a transcode's bytes depend on besides its input and
    arguments."""
    return "\n".join(" ".join(fields) for fields in _ffmpeg_listing("version"))


@cache
def ffmpeg_filters() -> frozenset[str]:
    """The filters this FFmpeg build has (``ffmpeg -filters``)."""
    return frozenset(
        fields[1] for fields in _ffmpeg_listing("filters") if len(fields) >= 3 and "->" in fields[2]
    )


def _input_args(path: Path, demuxer: str) -> list[str]:
    """How every call names its input: demuxer fixed, local files only, no guessing."""
    return [
        "-f", demuxer,
        "-format_whitelist", demuxer,
        "-protocol_whitelist", "file",
        "-i", f"file:{path.resolve()}",
    ]  # fmt: skip


@dataclass(frozen=True, slots=True)
class _Ran:
    returncode: int
    text: str  # stdout when it succeeded, else the last of stderr
    cpu_seconds: float
    tail: str = ""  # the last of stderr, whatever the outcome


def _run(
    args: list[str],
    workdir: Path,
    log_name: str,
    on_line: Callable[[str], None] | None = None,
) -> _Ran:
    """Run a tool, stderr to a file in the workdir (bounded by RLIMIT_FSIZE, not our
    memory): how it exited, what it said, the CPU time it used. ``on_line``: stdout is
    read line by line as the tool writes it (its progress), and not kept."""
    stderr_path = workdir / log_name
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        with stderr_path.open("wb") as stderr:
            if on_line is None:
                completed = subprocess.run(
                    args,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=stderr,
                    check=False,
                    cwd=workdir,
                )
                returncode, stdout = completed.returncode, completed.stdout
            else:
                with subprocess.Popen(
                    args,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=stderr,
                    cwd=workdir,
                ) as process:
                    assert process.stdout is not None
                    for line in process.stdout:
                        on_line(line.decode("ascii", "replace").strip())
                    returncode, stdout = process.wait(), b""
        with stderr_path.open("rb") as stderr:
            size = stderr.seek(0, 2)
            stderr.seek(max(0, size - 8192))
            tail = stderr.read().decode("utf-8", "replace")
    except OSError as exc:  # fork refused (RLIMIT_NPROC, ENOMEM) or the workdir is gone
        raise PipelineError(
            "tool_unavailable", f"cannot start {Path(args[0]).name}: {exc.strerror}", retryable=True
        ) from exc
    finally:
        stderr_path.unlink(missing_ok=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    if returncode == 0:
        return _Ran(0, stdout.decode("utf-8", "replace"), cpu, tail)
    return _Ran(returncode, tail, cpu, tail)


class _Progress:
    """FFmpeg's ``-progress`` lines (``key=value``, a block every ``-stats_period``) as
    the step's progress, in seconds of the output against the input's duration."""

    def __init__(
        self, total: float | None, offset: float = 0.0, *, whole: bool = True, scale: float = 1.0
    ) -> None:
        self.total = total
        self.offset = offset  # progress done before this run (earlier chunks)
        self.whole = whole  # this run is the whole job: its end is the total
        self.scale = scale  # progress per second of this run's output (its share)
        # The frames FFmpeg encoded (its first video output's: ``frame``) and its frame
        # rate conversion doubled and dropped, as last told (the last block comes after
        # the encoders' flush: every frame of the output).
        self.counts: dict[str, int] = {}

    def __call__(self, line: str) -> None:
        key, _, value = line.partition("=")
        if key in ("frame", "dup_frames", "drop_frames") and value.isdigit():
            self.counts[key] = int(value)
        elif key == "out_time_us" and value.isdigit():
            done = self.offset + self.scale * int(value) / 1e6
            progress.report(
                done if self.total is None else min(done, self.total), self.total, "seconds"
            )
        elif key == "progress" and value == "end" and self.total is not None and self.whole:
            progress.report(self.total, self.total, "seconds")


def _failure(ran: _Ran, what: str, *paths: Path) -> PipelineError:
    """The error for a tool that failed (see the module docstring)."""
    returncode, tail = ran.returncode, ran.text
    cpu_limit = resource.getrlimit(resource.RLIMIT_CPU)[0]
    # RLIMIT_CPU: SIGXCPU at the soft limit (ffmpeg catches it, stops and exits 255),
    # SIGKILL at the hard one; the sandbox sets soft = the job's timeout.
    out_of_cpu = cpu_limit != resource.RLIM_INFINITY and ran.cpu_seconds >= cpu_limit - 1
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL) or out_of_cpu:
        return PipelineError(
            "cpu_limit", f"{what}: FFmpeg was stopped by the CPU time limit ({cpu_limit} s)"
        )
    if returncode == -signal.SIGXFSZ:
        return PipelineError("output_limit", f"{what}: the output outgrew the file size limit")
    if any(sign in tail.lower() for sign in _OUT_OF_MEMORY):
        return PipelineError("memory_limit", f"{what}: FFmpeg ran out of memory (RLIMIT_AS)")
    if returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else ""
        return PipelineError("invalid_input", f"{what}: FFmpeg died of {name or -returncode}")
    return PipelineError("invalid_input", f"{what}: {_describe(tail, *paths)}")


def _describe(tail: str, *paths: Path) -> str:
    """ffmpeg's last lines on one line, without our paths (the user sees it)."""
    lines: list[str] = []
    for raw in tail.splitlines()[-6:]:
        line = raw.strip()
        for path in paths:
            line = line.replace(f"file:{path.resolve()}", "input").replace(str(path), "<file>")
        line = _CONTEXT.sub(r"\1:", line)  # "[aac @ 0x55d0...]" -> "aac:"
        if line and line not in lines:
            lines.append(line)
    message = "; ".join(lines) or "FFmpeg could not read it"
    return message if len(message) <= _MAX_MESSAGE else "..." + message[-(_MAX_MESSAGE - 3) :]


# -- probing --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Stream:
    index: int
    kind: str  # "video", "audio", ...
    codec: str | None
    tag: str
    width: int
    height: int
    channels: int
    cover_art: bool
    # Its channel layout as ffprobe names it ("5.1(side)"); "" where it names none.
    layout: str = ""
    # Degrees its display matrix turns it (a phone's portrait video: 90 or -90; FFmpeg
    # turns the picture upright before the filters see it); 0 where none.
    rotation: float = 0.0
    default: bool = False  # its disposition: what a player picks among its kind
    # Its colour as ffprobe names it (color_transfer, color_primaries, color_space,
    # color_range); "" where it says nothing.
    transfer: str = ""
    primaries: str = ""
    matrix: str = ""
    color_range: str = ""
    # When its times start (ffprobe's start_time, seconds); None where it states none.
    start: float | None = None

    @property
    def hdr(self) -> bool:
        """A PQ (HDR10, Dolby Vision's base) or HLG picture: made for a brighter screen
        than an SDR output is shown on."""
        return self.transfer in _HDR_TRANSFERS

    @property
    def shown(self) -> tuple[int, int]:
        """Its width and height as shown (and as FFmpeg's filters get it): stored, or
        swapped by a quarter turn."""
        turn = round(self.rotation) % 180
        return (self.height, self.width) if 89 <= turn <= 91 else (self.width, self.height)


@dataclass(frozen=True, slots=True)
class Probe:
    streams: list[Stream]
    duration: float | None  # seconds, None where nothing states it
    # The container's start time (seconds): its earliest stream's; ffmpeg counts the
    # output's time from there.
    start: float = 0.0
    # An MP4/MOV that ends inside its index (or before it): a missing stream is the
    # damage, not the file's content.
    index_cut: bool = False
    # Seconds from the earliest start of its pictures and sounds to the latest end, as
    # the streams state them (an MP4's sample tables); None where none states both.
    span: float | None = None
    # Its ``duration`` is where its times end, counted from zero, not how long they
    # last from ``start`` (:data:`_DURATION_ENDS`).
    duration_ends: bool = False

    @property
    def length(self) -> float | None:
        """How long the output will be, uncut: the streams' :attr:`span` where it is
        shorter than the container's ``duration``, else that. An MP4's movie header
        counts a leading empty edit (tracks starting 5 s in: 7 s for 2 s of frames;
        FFmpeg's output starts at the first frame) and may say anything; the sample
        tables list what there is. A Matroska's (ASF's) duration as FFmpeg writes it is
        its end: 8 s starting 5 s in say 13 s; what is after ``start`` is its length.
        The limits stay on ``duration``, what ingest read."""
        stated = self.duration
        if stated is not None and self.duration_ends:
            stated = max(0.0, stated - max(0.0, self.start))
        if self.span is None or stated is None:
            return stated if self.span is None else self.span
        return min(stated, self.span)

    def times_start(self, demuxer: str, read: Sequence[Stream | None]) -> float:
        """Where FFmpeg counts an output's times from when it reads the streams ``read``
        (None: none) of this input with ``demuxer``, without a seek: the container's
        ``start``, but for an MPEG-TS or MPEG-PS (:data:`_STARTS_AT_STREAMS_READ`) the
        earliest start of the streams read where that is later: a data or subtitle
        stream that starts first (a broadcast's, a DVD's) does not count."""
        if demuxer not in _STARTS_AT_STREAMS_READ:
            return self.start
        starts = [s.start for s in read if s is not None and s.start is not None]
        return max(self.start, min(starts)) if starts else self.start

    def first(self, kind: str) -> Stream | None:
        """The decodable stream of ``kind`` a player would play: the first flagged
        default, else the first (cover art is not video). A Matroska file with a
        German track first and the English one flagged default plays English."""
        found = [s for s in self.streams if s.kind == kind and s.codec and not s.cover_art]
        return next((s for s in found if s.default), found[0] if found else None)


def probe(path: Path, demuxer: str, workdir: Path, label: str) -> Probe:
    """ffprobe's view of ``path``, read with ``demuxer``."""
    args = [
        _tool("ffprobe"), "-v", "error", "-hide_banner",
        "-print_format", "json", "-show_format", "-show_streams",
        *_input_args(path, demuxer),
    ]  # fmt: skip
    ran = _run(args, workdir, ".ffprobe.log")
    if ran.returncode != 0:
        raise _failure(ran, f"cannot read {label}", path, workdir)
    try:
        found = _parse_probe(json.loads(ran.text))
    except (ValueError, TypeError, AttributeError) as exc:
        raise PipelineError("invalid_input", f"cannot read {label}: unexpected probe") from exc
    return replace(found, duration_ends=demuxer in _DURATION_ENDS)


def probe_input(path: Path, container: Container, workdir: Path) -> Probe:
    """:func:`probe` of the step's input; an MP4/MOV cut short inside (or before) its
    index is ``invalid_input`` saying so where ffprobe fails on it."""
    index_cut = False
    if container.demuxer == "mov":
        source = FileSource(path)
        try:
            index_cut = isobmff_index_cut(source)
        finally:
            source.close()
    try:
        found = probe(path, container.demuxer, workdir, container.label)
    except PipelineError as exc:
        if index_cut and exc.code == "invalid_input":
            raise _index_cut(container.label) from exc
        raise
    return replace(found, index_cut=index_cut)


def _index_cut(label: str) -> PipelineError:
    return PipelineError(
        "invalid_input",
        f"{label} is cut short: its index (moov) is incomplete or missing",
    )


def _parse_probe(data: dict[str, Any]) -> Probe:
    streams = []
    durations = []
    extents: list[tuple[float, float]] = []  # (start, end) of each picture and sound
    for raw in data.get("streams", []):
        streams.append(
            Stream(
                index=int(raw["index"]),
                kind=str(raw.get("codec_type") or "unknown"),
                codec=raw.get("codec_name"),
                tag=str(raw.get("codec_tag_string", "")),
                width=int(raw.get("width") or 0),
                height=int(raw.get("height") or 0),
                channels=int(raw.get("channels") or 0),
                layout=_layout(raw.get("channel_layout")),
                rotation=_rotation(raw),
                cover_art=bool(raw.get("disposition", {}).get("attached_pic")),
                default=bool(raw.get("disposition", {}).get("default")),
                transfer=_color(raw.get("color_transfer")),
                primaries=_color(raw.get("color_primaries")),
                matrix=_color(raw.get("color_space")),
                color_range=_color(raw.get("color_range")),
                start=_time(raw.get("start_time")),
            )
        )
        durations.append(_float(raw.get("duration")))
        begins, lasts = _time(raw.get("start_time")), _float(raw.get("duration"))
        kept = streams[-1].kind in ("video", "audio") and not streams[-1].cover_art
        if kept and begins is not None and lasts is not None:
            extents.append((begins, begins + lasts))
    duration = _float(data.get("format", {}).get("duration"))
    if duration is None:
        known = [d for d in durations if d is not None]
        duration = max(known) if known else None
    try:
        start = float(data.get("format", {}).get("start_time"))
    except (TypeError, ValueError):
        start = 0.0
    span = None
    if extents:
        span = max(end for _, end in extents) - min(begin for begin, _ in extents)
    return Probe(streams, duration, start if math.isfinite(start) else 0.0, span=span)


def _color(value: object) -> str:
    """One of ffprobe's colour names, "" where it states none (or "unknown")."""
    return value if isinstance(value, str) and value != "unknown" else ""


def _layout(value: object) -> str:
    """ffprobe's channel layout, "" where it names none ("unknown"; "10 channels" in
    FFmpeg 6 and later)."""
    if not isinstance(value, str) or value == "unknown" or _UNNAMED_LAYOUT.fullmatch(value):
        return ""
    return value


def _rotation(raw: dict[str, Any]) -> float:
    """The turn of a stream's display matrix (ffprobe's side data), else of its
    ``rotate`` tag (older FFmpeg); 0 where it states none."""
    for side in raw.get("side_data_list") or []:
        if isinstance(side, dict) and "rotation" in side:
            return _time(side["rotation"]) or 0.0
    return _time((raw.get("tags") or {}).get("rotate")) or 0.0


def _time(value: object) -> float | None:
    """A time ffprobe printed (it may be negative), None where it is none."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _float(value: object) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number >= 0 else None


def check_input(found: Probe, kind: str, label: str, max_seconds: float) -> Stream:
    """The stream to transcode, or the refusal (see step 3 of the module docstring)."""
    protected = [s.tag for s in found.streams if s.tag.lower() in _PROTECTED_TAGS]
    if protected:
        raise PipelineError(
            "encrypted_document",
            f"{label} has a DRM-protected track ({protected[0]}): it cannot be decoded",
        )
    stream = found.first(kind)
    if stream is None and found.index_cut:
        raise _index_cut(label)
    if stream is None:
        other = "transcode_audio" if kind == "video" else "transcode_video"
        has_other = found.first("audio" if kind == "video" else "video") is not None
        hint = f" (it has {'audio' if kind == 'video' else 'video'}: use {other})"
        raise PipelineError(
            "no_streams", f"{label} has no {kind} stream{hint if has_other else ''}"
        )
    if found.duration is not None and found.duration > max_seconds:
        raise _too_long(label, found.duration, max_seconds)
    if found.duration == 0:
        raise PipelineError("invalid_input", f"{label}: no samples (its duration is zero)")
    return stream


def _too_long(label: str, seconds: float, limit: float) -> PipelineError:
    return PipelineError(
        "duration_limit", f"{label} lasts {seconds:,.0f} s; the limit is {limit:,.0f} s"
    )


# -- transcoding ----------------------------------------------------------------------

_COMMON = ["-hide_banner", "-nostdin", "-y", "-v", "error", "-threads", "1"]
_CLEAN = ["-map_metadata", "-1", "-map_chapters", "-1", "-sn", "-dn"]
# Frames passed through as they come (the MP4 muxer's default is a constant rate, which
# doubled a ~1 fps screen recording's frames to its nominal 60 and dropped a phone's
# 60 fps burst in a 30 fps clip), encoded on the input's own time base: on the
# encoder's default 1/rate one, times were rounded onto the grid (7 of a burst's 30
# frames dropped with ``vfr``; ``passthrough``'s equal times rewritten by the muxer).
# Only for an uneven input: an evenly spaced one's output would change for nothing (a
# byte of an MP4's, more of a Matroska's on its 1 ms time base). -fps_mode: FFmpeg 5.1.
# The picture's time base only: the sound on a Matroska's or FLV's 1 ms one had AAC
# packets of 1014, 1015 or 1058 samples (1024 each), not timed on its samples as a
# chunked output's sound (transcoded alone) and transcode_audio's are.
_EXACT_TIMES = ["-fps_mode", "passthrough", "-enc_time_base:v", "-1"]


def video_args(
    source: Path,
    container: Container,
    request: VideoRequest,
    video: Stream,
    audio: Stream | None,
    *,
    exact_times: bool = False,
) -> list[str]:
    """ffmpeg's arguments for ``transcode_video`` (output path last). ``exact_times``:
    every frame kept at its own time (a variable frame rate, see
    :func:`pipelines.media_chunks.variable_rate`), else put on the MP4 output's
    constant-rate grid."""
    return [
        *_video_only_args(source, container, request, video),
        *(_EXACT_TIMES if exact_times else []),
        *([] if audio is None else _sound_args(audio)),
        "-t", f"{request.max_seconds + _LIMIT_SLACK_SECONDS:.3f}",
        *_CLEAN, "-movflags", "+faststart", "-f", "mp4",
    ]  # fmt: skip


def _video_only_args(
    source: Path, container: Container, request: VideoRequest, video: Stream
) -> list[str]:
    """ffmpeg, its input and the video's encoding: what a single pass and each chunk
    share (an input option such as ``-ss`` may go right after ``ffmpeg``)."""
    return [
        _tool("ffmpeg"), *_COMMON, *_input_args(source, container.demuxer),
        "-filter_threads", "1",
        "-map", f"0:{video.index}",
        *_picture_args(request, video, ffmpeg_filters),
        "-c:v", "libx264", "-preset", "veryfast", "-crf", str(request.crf),
        "-threads", "1", "-x264-params", "threads=1:lookahead-threads=1",
    ]  # fmt: skip


def _picture_args(
    request: VideoRequest, video: Stream, filters: Callable[[], frozenset[str]]
) -> list[str]:
    """The picture's filter graph and colour tags. Never upscaled, even dimensions,
    4:2:0 8-bit (what every H.264 player decodes). An HDR picture is tone-mapped to
    SDR BT.709 and tagged so: cut to 8 bits as it was, a PQ picture showed its
    100-nit white at half of SDR's white and lifted its shadows (washed out) on the
    SDR screens an H.264 output is for. ``filters``: the FFmpeg filters there are;
    without zimg's ``zscale`` (or ``tonemap``) an HDR picture keeps its own colour and
    says so in its tags."""
    # The largest even height up to the input's and the request's, and under 16385
    # ih/iw, so that the width the scaler makes of it (h iw/ih, rounded to even: see
    # output_size) is at most MAX_SIDE; an input that fitted before is made as before.
    bound = f"ceil({MAX_SIDE + 1}*ih/iw)-1"
    height = f"max(2,trunc(min(min(ih,{request.height}),{bound})/2)*2)"
    scaled = f"scale=w=-2:h='{height}'"
    if not video.hdr:
        return ["-vf", f"{scaled},format=yuv420p"]
    # What the file says it is, an unstated (or unusual) part read as HDR10 has it.
    primaries = video.primaries if video.primaries in _HDR_PRIMARIES else "bt2020"
    matrix = video.matrix if video.matrix in _HDR_MATRICES else "bt2020nc"
    color_range = video.color_range if video.color_range in ("tv", "pc") else "tv"
    if not {"zscale", "tonemap"} <= filters():
        log.warning("FFmpeg has no zscale/tonemap: HDR (%s) is not tone-mapped", video.transfer)
        return [
            "-vf", f"{scaled},format=yuv420p",
            "-color_primaries", primaries, "-color_trc", video.transfer,
            "-colorspace", matrix, "-color_range", color_range,
        ]  # fmt: skip
    # Resized first, in the input's own bits (at 1080p -> 720p, the float steps after
    # it have less than half the pixels), then to linear light with SDR white at
    # 100 nits, to BT.709's primaries, tone-mapped, to BT.709. Mobius leaves what is
    # under its knee as it was and bends only the highlights; hable darkened mid-grey
    # by a third and a 100-nit white to 60 %. desat=0: the default desaturation of
    # highlights cost a third more CPU (2.7 against 1.75 CPU-s for 5 s at 720p).
    read = f"zscale=tin={video.transfer}:pin={primaries}:min={matrix}:rin={color_range}"
    return [
        "-vf",
        f"{scaled},{read}:t=linear:npl=100,format=gbrpf32le,zscale=p=bt709,"
        "tonemap=tonemap=mobius:desat=0,zscale=t=bt709:m=bt709:r=tv,format=yuv420p",
        *_SDR_TAGS,
    ]


def output_size(width: int, height: int, max_height: int) -> tuple[int, int]:
    """The size :func:`_picture_args`' scaler makes of a ``width`` x ``height`` picture
    (as shown), FFmpeg's arithmetic: the height by its expression, the width (``-2``)
    the height x width / height rounded to the nearest even number (half away from
    zero: av_rescale). Under 2 wide (0) or over MAX_SIDE: no H.264 can be made of it."""
    if width <= 0 or height <= 0:
        return 0, 0
    bound = -(-(MAX_SIDE + 1) * height // width) - 1  # ceil(16385 ih/iw) - 1
    high = max(2, min(height, max_height, bound) // 2 * 2)
    return (high * width + height) // (2 * height) * 2, high


def check_picture(video: Stream, request: VideoRequest, label: str) -> None:
    """Refuse a picture (as shown) no H.264 output can keep the shape of: so wide that
    at MAX_SIDE wide it is under 2 pixels high, or so narrow that at the height it is
    made it is under a pixel wide. FFmpeg's own failures said neither (libx264's "invalid width x
    height (40000x2)"; a width of 0, "Cannot allocate memory": memory_limit)."""
    width, height = video.shown
    made = output_size(width, height, request.height)
    if made[0] and made[0] <= MAX_SIDE:
        return
    if width <= 0 or height <= 0:
        return  # nothing stated: FFmpeg decides
    if made[0] > MAX_SIDE:
        high = height * MAX_SIDE / width
        problem = f"too wide: {MAX_SIDE} pixels wide (libx264's most), it would be"
        problem += f" {high:.5g} high, less than 2"
    else:
        problem = f"too narrow: {made[1]} pixels high, it would be"
        problem += f" {width * made[1] / height:.2g} wide, less than 1"
    raise PipelineError("invalid_input", f"{label}: its {width}x{height} picture is {problem}")


def _sound_args(audio: Stream) -> list[str]:
    """A video's sound: AAC at 128 kbit/s, mono or stereo."""
    return ["-map", f"0:{audio.index}", "-c:a", "aac", "-b:a", "128k", *_channels(audio)]


def _sound_only_args(source: Path, container: Container, audio: Stream) -> list[str]:
    """A video's sound alone (chunked transcodes encode it once, apart)."""
    return [
        _tool("ffmpeg"), *_COMMON, *_input_args(source, container.demuxer),
        "-filter_threads", "1", *_sound_args(audio), "-vn", *_CLEAN,
    ]  # fmt: skip


def audio_args(
    source: Path, container: Container, request: AudioRequest, audio: Stream
) -> list[str]:
    """ffmpeg's arguments for ``transcode_audio`` (output path last)."""
    args = [
        _tool("ffmpeg"), *_COMMON, *_input_args(source, container.demuxer),
        "-filter_threads", "1",
        "-map", f"0:{audio.index}", "-vn",
        "-c:a", request.codec.encoder, "-b:a", f"{request.bitrate_kbps}k", *_channels(audio),
        "-threads", "1",
        "-t", f"{request.max_seconds + _LIMIT_SLACK_SECONDS:.3f}",
        *_CLEAN, "-f", request.codec.muxer,
    ]  # fmt: skip
    if request.codec.name == "mp3":
        args += ["-id3v2_version", "0", "-write_id3v1", "0"]
    return args


def _channels(audio: Stream) -> list[str]:
    """Mono or stereo: every encoder and player takes them, surround layouts vary, and
    an unnamed layout ("2 channels") is refused by the AAC encoder until named. A
    downmix is scaled to fit full scale: the resampler scales it for integer samples
    (MP3, Opus) but not for float ones (AAC), where 5.1 at half scale peaked at 1.23
    (7.1: 1.65), clipped by every player and 8-10 dB louder than the same input in MP3.
    Past eight channels with no layout (a multitrack recorder's microphones, a WAV
    without a channel mask) nothing says where a channel goes, and FFmpeg 5 knows no
    layout of 9-15 channels to guess, so it failed ("Rematrix is needed between 10
    channels and stereo ..."): they are mixed to mono, each at an equal share (fits
    full scale)."""
    if not audio.layout and audio.channels > _GUESSED_CHANNELS:
        mix = "+".join(f"c{channel}" for channel in range(audio.channels))
        return ["-af", f"pan=mono|c0<{mix}", "-ac", "1"]
    return ["-ac", "1" if audio.channels == 1 else "2", "-rematrix_maxval", "1.0"]


def transcode(
    args: list[str],
    source: Path,
    workdir: Path,
    output: Path,
    label: str,
    seconds: float | None = None,
    *,
    offset: float = 0.0,
    scale: float = 1.0,
    part: bool = False,
    counts: dict[str, int] | None = None,
) -> bool:
    """Run ffmpeg; its progress reported against ``seconds`` (the input's duration, if
    stated), ``offset`` seconds of it done before, each second of output counted as
    ``scale`` (a pass with a share of the job); ``part``: one piece of the job (its
    end is not the job's; without ``seconds``, it reports nothing). True when the input
    ended before its index said (FFmpeg's "partial file": a truncated MP4/MOV); a
    failure on such an input is :class:`Truncated`. ``counts``: filled with the frames
    FFmpeg encoded (``frame``) and those its frame rate conversion doubled and dropped
    (``dup_frames``, ``drop_frames``), as its progress last told them (none for a
    ``part`` without ``seconds``: its progress is not read)."""
    watched = [args[0], "-progress", "pipe:1", "-stats_period", str(_PROGRESS_PERIOD), *args[1:]]
    report = (
        None
        if part and seconds is None
        else _Progress(seconds, offset, whole=not part, scale=scale)
    )
    if report is None:
        watched = args
    ran = _run([*watched, str(output)], workdir, ".ffmpeg.log", report)
    if counts is not None and report is not None:
        counts.update(report.counts)
    truncated = _PARTIAL_FILE in ran.tail.lower()
    if ran.returncode != 0:
        error = _failure(ran, f"cannot transcode {label}", source, workdir)
        if truncated and error.code == "invalid_input":
            raise Truncated(error.code, error.message)
        raise error
    return truncated


class Truncated(PipelineError):
    """FFmpeg failed on an input that ends before its index says: another try on less
    of it (the video without its sound) may still give what decodes."""


def _expected(found: Probe, max_seconds: float) -> float | None:
    """How long the output will be: the input's length, cut at the limit."""
    if not found.length:
        return None
    return min(found.length, max_seconds + _LIMIT_SLACK_SECONDS)


def check_output(
    output: Path, muxer: str, kind: str, codec: str, workdir: Path, label: str, limit: float
) -> float:
    """The output's duration, after checking it holds ``codec`` and lasts (step 5)."""
    if not output.exists() or output.stat().st_size == 0:
        raise PipelineError("invalid_input", f"{label}: no samples could be decoded")
    demuxer = "mov" if muxer in ("mp4", "ipod") else muxer
    found = probe(output, demuxer, workdir, "the output")
    stream = found.first(kind)
    if stream is None or stream.codec != codec:
        raise PipelineError("invalid_input", f"{label}: no samples could be decoded")
    if not found.duration:
        raise PipelineError("invalid_input", f"{label}: no samples (the output is empty)")
    if found.duration > limit:
        raise _too_long(label, found.duration, limit)
    return found.duration


def transcode_video_step(
    input_path: Path, params: Mapping[str, Any], workdir: Path
) -> list[Output]:
    request = video_request(params)
    container = detect(input_path)
    workdir.mkdir(parents=True, exist_ok=True)
    found = probe_input(input_path, container, workdir)
    video = check_input(found, "video", container.label, request.max_seconds)
    check_picture(video, request, container.label)
    audio = found.first("audio")
    output = workdir / request.output_type
    chunk_seconds, chunk_above = media_chunks.chunking(params)
    units: dict[str, int] | None = None
    truncated = False
    try:
        long = found.length is not None and found.length > chunk_above
        listed = _packets(input_path, container, video, workdir, strict=long)
        # A variable frame rate keeps its frames' times, in a single pass and in chunks.
        exact = listed is not None and media_chunks.variable_rate(listed)
        if found.length is not None and long:
            units = media_chunks.transcode_chunked(
                input_path, workdir, output, container.label,
                video_args=[
                    *_video_only_args(input_path, container, request, video),
                    *(_EXACT_TIMES if exact else []),
                ],
                audio_args=(
                    None if audio is None else _sound_only_args(input_path, container, audio)
                ),
                found=listed,
                chunk_seconds=chunk_seconds,
                total=found.length,
                start=found.times_start(container.demuxer, [video, audio]),
                exact_times=exact,
                frame_pixels=math.prod(output_size(*video.shown, request.height)),
            )  # fmt: skip
        if units is None:
            expected = _expected(found, request.max_seconds)
            try:
                truncated = transcode(
                    video_args(input_path, container, request, video, audio, exact_times=exact),
                    input_path, workdir, output, container.label, expected,
                )  # fmt: skip
            except Truncated:
                if audio is None:
                    raise
                # A truncated file whose sound (or picture) ends where nothing decodes:
                # the picture alone, as far as it goes.
                truncated = transcode(
                    video_args(input_path, container, request, video, None, exact_times=exact),
                    input_path, workdir, output, container.label, expected,
                )  # fmt: skip
        seconds = check_output(
            output, "mp4", "video", "h264", workdir, container.label, request.max_seconds
        )
    except PipelineError as exc:
        output.unlink(missing_ok=True)
        if found.index_cut and exc.code == "invalid_input":
            raise _index_cut(container.label) from exc
        raise
    except BaseException:
        output.unlink(missing_ok=True)
        raise
    log.debug("video %s %.1fs -> %s", container.demuxer, seconds, request.output_type)
    units = units or {}
    if truncated or found.index_cut or _short(seconds, found.length):
        units["partial"] = 1
    outputs = [Output(request.output_type, output, "video/mp4")]
    return outputs + ([usage_output(workdir, units)] if units else [])


def _packets(
    source: Path, container: Container, video: Stream, workdir: Path, *, strict: bool
) -> list[tuple[float, str, bool]] | None:
    """The video stream's packets (:func:`pipelines.media_chunks.packets`): what a
    chunked transcode is cut by and a variable frame rate is seen in. Where ffprobe
    cannot list them, a video to chunk (``strict``) fails as it did; any other is
    transcoded on the constant rate, as it was."""
    try:
        return media_chunks.packets(
            _run, source, _input_args(source, container.demuxer), video.index, workdir,
            container.label,
        )  # fmt: skip
    except PipelineError:
        if strict:
            raise
        log.warning("%s: its packets could not be listed: constant rate", container.label)
        return None


def _short(seconds: float, stated: float | None) -> bool:
    """An output shorter than the input said it was: what decoded of a damaged input."""
    if stated is None:
        return False
    return stated - seconds >= max(_PARTIAL_SECONDS, _PARTIAL_SHARE * stated)


def transcode_audio_step(
    input_path: Path, params: Mapping[str, Any], workdir: Path
) -> list[Output]:
    request = audio_request(params)
    container = detect(input_path)
    workdir.mkdir(parents=True, exist_ok=True)
    found = probe_input(input_path, container, workdir)
    audio = check_input(found, "audio", container.label, request.max_seconds)
    output = workdir / request.output_type
    codec = request.codec
    try:
        truncated = transcode(
            audio_args(input_path, container, request, audio),
            input_path, workdir, output, container.label, _expected(found, request.max_seconds),
        )  # fmt: skip
        seconds = check_output(
            output, codec.muxer, "audio", codec.name, workdir, container.label, request.max_seconds
        )
    except PipelineError as exc:
        output.unlink(missing_ok=True)
        if found.index_cut and exc.code == "invalid_input":
            raise _index_cut(container.label) from exc
        raise
    except BaseException:
        output.unlink(missing_ok=True)
        raise
    log.debug("audio %s %.1fs -> %s", container.demuxer, seconds, request.output_type)
    outputs = [Output(request.output_type, output, codec.content_type)]
    if truncated or found.index_cut or _short(seconds, found.length):
        outputs.append(usage_output(workdir, {"partial": 1}))
    return outputs


def _check_audio(params: Mapping[str, Any]) -> None:
    """Refuse at submit what :func:`transcode_audio` would refuse of its parameters.
    Where this machine has no FFmpeg to ask (a head whose media workers are elsewhere),
    every codec the step knows passes: the worker's FFmpeg decides on it."""
    try:
        audio_request(params)
    except PipelineError as exc:
        if exc.code != "tool_unavailable":
            raise
        audio_request(params, lambda: frozenset(c.encoder for c in AUDIO_CODECS.values()))


@register("transcode_video", check=video_request, profile_only=CHUNK_KEYS, checkpoints=True)
def transcode_video(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """MP4: H.264 (``crf``, at most ``height`` high) + AAC when the input has sound."""
    return transcode_video_step(input_path, params, workdir)


@register("transcode_audio", check=_check_audio)
def transcode_audio(input_path: Path, params: Mapping[str, Any], workdir: Path) -> list[Output]:
    """The audio track a player would play (the one flagged default, else the first) as
    ``codec`` (aac -> M4A, opus -> Ogg, mp3) at ``bitrate``."""
    return transcode_audio_step(input_path, params, workdir)
