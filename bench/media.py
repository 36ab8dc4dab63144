"""Chunked ``transcode_video`` against a single pass, on a generated 1080p clip.

The clip (``testsrc2`` at 1920x1080, 25 fps, a tone; H.264 with a keyframe every
``--keyint`` seconds, AAC) is made once per run in a temporary directory. Each round
runs, in this process, the step as the worker's child would (``transcode_video``:
720p, CRF 23, one thread per codec):

- ``single``: one pass (the chunking threshold above the clip's length);
- ``chunked``: ``--chunk-seconds`` chunks, the sound once, the concat copy;
- ``resume``: the chunked run again after the loss of its last chunk and its sound
  (what a kill in the last chunk leaves): the work a kill costs, at most one chunk.

Wall and CPU seconds (this process and its FFmpeg children) per row, the median of
the rounds (rows interleaved, the order rotating); the overhead is chunked against
single (target: at most 15 % in CPU). The load average is printed and stored with
the results: numbers from a busy machine say so. JSON goes to ``--json``
(``bench/reports/media.json`` by default).

    python bench/media.py                   # 1 minute of 1080p, 15 s chunks: ~3 CPU-min
    python bench/media.py --minutes 10 --chunk-seconds 60   # the issue's run: quiet machine
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipelines import checkpoints, media  # noqa: E402

PARAMS = {"codec": "h264", "height": 720, "crf": 23}
ROWS = ("single", "chunked", "resume")


def make_clip(path: Path, minutes: float, keyint: float) -> float:
    """The 1080p test clip; CPU-seconds it took."""
    seconds = minutes * 60
    gop = str(round(keyint * 25))
    before = _cpu()
    subprocess.run(
        ["ffmpeg", "-nostdin", "-hide_banner", "-v", "error", "-y",
         "-f", "lavfi", "-i", f"testsrc2=size=1920x1080:rate=25:duration={seconds}",
         "-f", "lavfi", "-i", f"sine=frequency=440:sample_rate=48000:duration={seconds}",
         "-c:v", "libx264", "-preset", "ultrafast", "-crf", "23", "-pix_fmt", "yuv420p",
         "-g", gop, "-keyint_min", gop, "-sc_threshold", "0",
         "-c:a", "aac", "-b:a", "128k", "-f", "mp4", str(path)],
        check=True,
    )  # fmt: skip
    return _cpu() - before


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run_row(row: str, clip: Path, workdir: Path, chunk_seconds: float) -> dict[str, Any]:
    """One row once: wall and CPU seconds, chunks transcoded."""
    if row == "single":
        params = {**PARAMS, "chunk_above_seconds": 10**6}
    else:
        params = {**PARAMS, "chunk_seconds": chunk_seconds, "chunk_above_seconds": 1}
    if row != "resume":
        shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True, exist_ok=True)
    source = workdir / "input.mp4"
    if not source.exists():
        os.link(clip, source)
    if row == "resume":
        # A kill in the last chunk: it and the sound (written after) are lost.
        pieces = checkpoints.finished(workdir)
        last = max(name for name in pieces if name.startswith("chunk-"))
        for name in (last, "audio.m4a"):
            pieces[name].unlink()
        for output in workdir.glob("video-*.mp4"):
            output.unlink()
    wall, cpu = time.perf_counter(), _cpu()
    outputs = media.transcode_video(source, params, workdir)
    wall, cpu = time.perf_counter() - wall, _cpu() - cpu
    usage = [o for o in outputs if o.output_type == "usage.json"]
    units = json.loads(usage[0].path.read_text()) if usage else {}
    return {"wall": wall, "cpu": cpu, **units}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=1.0, help="clip length (1)")
    parser.add_argument("--chunk-seconds", type=float, default=15.0, help="chunk length (15)")
    parser.add_argument("--keyint", type=float, default=2.0, help="clip keyframe interval (2 s)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds (1)")
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "reports" / "media.json")
    args = parser.parse_args()
    load_before = os.getloadavg()
    results: dict[str, list[dict[str, Any]]] = {row: [] for row in ROWS}
    with tempfile.TemporaryDirectory(prefix="bench-media-") as tmp:
        root = Path(tmp)
        clip = root / "clip.mp4"
        made = make_clip(clip, args.minutes, args.keyint)
        print(f"clip: {args.minutes:g} min 1080p25, keyframe every {args.keyint:g} s, "
              f"{clip.stat().st_size / 2**20:.0f} MB, made in {made:.0f} CPU-s")  # fmt: skip
        for index in range(args.rounds):
            order = ["single", "chunked"] if index % 2 == 0 else ["chunked", "single"]
            for row in [*order, "resume"]:  # resume goes on from the chunked run
                results[row].append(
                    run_row(row, clip, root / ("single" if row == "single" else "chunked"),
                            args.chunk_seconds)
                )  # fmt: skip
                print(f"  round {index + 1} {row}: {results[row][-1]}", flush=True)
    load_after = os.getloadavg()
    summary = {
        row: {
            "wall_s": statistics.median(r["wall"] for r in runs),
            "cpu_s": statistics.median(r["cpu"] for r in runs),
            "chunks": runs[-1].get("chunks"),
            "chunks_resumed": runs[-1].get("chunks_resumed"),
        }
        for row, runs in results.items()
    }
    single, chunked, resume = (summary[row] for row in ROWS)
    overhead = {
        "wall": chunked["wall_s"] / single["wall_s"] - 1,
        "cpu": chunked["cpu_s"] / single["cpu_s"] - 1,
    }
    lost = resume["cpu_s"] / chunked["cpu_s"]
    print()
    print(f"{'row':10} {'wall s':>8} {'CPU s':>8} {'chunks':>7} {'resumed':>8}")
    for row in ROWS:
        s = summary[row]
        print(f"{row:10} {s['wall_s']:8.1f} {s['cpu_s']:8.1f} {s['chunks'] or '-':>7} "
              f"{s['chunks_resumed'] if s['chunks_resumed'] is not None else '-':>8}")  # fmt: skip
    print(f"\nchunked vs single: wall {overhead['wall']:+.1%}, CPU {overhead['cpu']:+.1%} "
          f"(target: CPU at most +15%)")  # fmt: skip
    print(f"a kill in the last chunk costs {resume['cpu_s']:.1f} CPU-s to resume "
          f"({lost:.1%} of the whole chunked run; one chunk of {chunked['chunks']} is "
          f"{1 / max(1, chunked['chunks'] or 1):.1%})")  # fmt: skip
    print(f"load average: {load_before[0]:.2f} before, {load_after[0]:.2f} after "
          f"({os.cpu_count()} CPUs)")  # fmt: skip
    report = {
        "benchmark": "media",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "load_average": {"before": load_before, "after": load_after},
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "params": PARAMS,
        "rows": summary,
        "runs": results,
        "overhead": overhead,
        "resume_cpu_share": lost,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(f"written: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
