"""Thumbnails: the image pipeline beside Pillow and a bare pyvips call.

Every contender makes the same thumbnail (the ``thumbnail`` profile: fit in 320x320,
WebP quality 80, metadata stripped, written to a file) from the same inputs, each
(contender, input set) in a fresh subprocess, so peak RSS is that contender's alone:

- ``hypermedia``: ``pipelines.images.thumbnail`` as the worker child runs it: sniffing,
  header and limit checks, Pillow for plain (RGB, grey) JPEGs, libvips with its worker
  settings (one thread, no cache) for the rest (CMYK, truncated), imported on first use.
- ``pyvips``: a bare ``pyvips.Image.thumbnail(path, 320, height=320)`` and ``webpsave``,
  libvips' defaults (a thread per core, operation cache on).
- ``pyvips-1t``: the same bare call with the pipeline's settings (one thread, no
  cache): the pipeline's own overhead, apart from the settings.
- ``pillow``: ``Image.open``, ``draft("RGB", (320, 320))``, ``thumbnail((320, 320))``,
  ``exif_transpose``, convert to RGB(A), WebP save (Pillow's own JPEG decoder).

Input sets: the corpus JPEGs (all but the 280 MP one, which Pillow refuses as a
decompression bomb) and one 24 MP JPEG made at run time from a corpus photo (kept in
a temporary directory). Rounds interleave the contenders (the order rotates), and a
row's images/s is the median of its rounds. Then, as a worker runs a job (one file in
a fresh child), each corpus JPEG once in a fresh process per contender: the peak RSS
of such a "job", the largest and the median over the files (``job_peak_rss_mb``).
Results: a table, and JSON in ``bench/results/`` (``--json`` to choose);
``bench/reports/thumbnails.json`` is one representative run.

    python bench/thumbnails.py            # 3 rounds, about a minute on 2 cores
    python bench/thumbnails.py --quick    # 1 round, fewer repeats
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "corpus"
CONTENDERS = ("hypermedia", "pyvips", "pyvips-1t", "pillow")
SIZE = 320
QUALITY = 80
PARAMS = {"width": SIZE, "height": SIZE, "format": "webp", "quality": QUALITY}
# Pillow refuses more than 2 x Image.MAX_IMAGE_PIXELS (179 MP) as a bomb.
PILLOW_LIMIT = 178_956_970


# -- one contender in its own process ---------------------------------------------------


def _peak_rss_mb() -> float:
    """This process's peak RSS. Not ``ru_maxrss``: Linux carries it over ``exec`` from
    the parent; ``VmHWM`` starts again with the new program."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _thumbnailer(contender: str, out: Path) -> Any:
    """A function ``path -> None`` making one thumbnail (imports happen here)."""
    if contender == "hypermedia":
        from pipelines import images

        def run(path: Path) -> None:
            images.thumbnail(path, PARAMS, out)

        return run
    if contender in ("pyvips", "pyvips-1t"):
        import pyvips

        if contender == "pyvips-1t":
            pyvips.cache_set_max(0)
            pyvips.cache_set_max_mem(0)
            pyvips.cache_set_max_files(0)
            pyvips.concurrency_set(1)  # type: ignore[attr-defined]

        def run(path: Path) -> None:
            image = pyvips.Image.thumbnail(str(path), SIZE, height=SIZE, size="down")
            image.webpsave(str(out / "thumb.webp"), Q=QUALITY, keep=pyvips.enums.ForeignKeep.NONE)

        return run
    if contender == "pillow":
        from PIL import Image, ImageFile, ImageOps

        # libvips reads what a truncated JPEG holds (the corpus Ultra HDR one is); so may Pillow.
        ImageFile.LOAD_TRUNCATED_IMAGES = True

        def run(path: Path) -> None:
            with Image.open(path) as image:
                image.draft("RGB", (SIZE, SIZE))
                image.thumbnail((SIZE, SIZE))
                upright = ImageOps.exif_transpose(image)
                if upright.mode not in ("RGB", "RGBA"):
                    upright = upright.convert("RGB")
                upright.save(out / "thumb.webp", "WEBP", quality=QUALITY)

        return run
    raise SystemExit(f"unknown contender {contender!r}")


def job_peak(contender: str, path: Path) -> dict[str, Any]:
    """One thumbnail in this fresh process, imports included: a job's peak RSS."""
    with tempfile.TemporaryDirectory(prefix="hm-bench-thumb-") as scratch:
        _thumbnailer(contender, Path(scratch))(path)
    return {"peak_rss_mb": round(_peak_rss_mb(), 1), "pyvips": "pyvips" in sys.modules}


def worker(contender: str, files: list[Path], repeat: int) -> dict[str, Any]:
    """Time ``repeat`` passes over ``files`` after one untimed pass."""
    with tempfile.TemporaryDirectory(prefix="hm-bench-thumb-") as scratch:
        out = Path(scratch)
        run = _thumbnailer(contender, out)
        rss_after_import = _peak_rss_mb()
        for path in files:  # warm-up: libraries loaded, caches as in steady state
            run(path)
        cpu_start, start = _cpu_seconds(), time.perf_counter()
        for _ in range(repeat):
            for path in files:
                run(path)
        seconds = time.perf_counter() - start
        cpu = _cpu_seconds() - cpu_start
    count = repeat * len(files)
    return {
        "images": count,
        "seconds": round(seconds, 4),
        "images_per_second": round(count / seconds, 2),
        "cpu_seconds_per_image": round(cpu / count, 5),
        "peak_rss_mb": round(_peak_rss_mb(), 1),
        "rss_after_import_mb": round(rss_after_import, 1),
    }


# -- the run ----------------------------------------------------------------------------


def corpus_jpegs() -> list[Path]:
    from pipelines import sniff

    found = []
    for path in sorted((CORPUS / "images").iterdir()):
        head = path.read_bytes()[: sniff.HEAD_BYTES]
        if sniff.sniff(head).kind == "jpeg":
            found.append(path)
    return found


def _pixels(path: Path) -> int:
    import pyvips

    image = pyvips.Image.new_from_file(str(path))
    return image.width * image.height


def make_24mp(directory: Path) -> Path:
    """A 6000x4000 photo-like JPEG: a corpus photo enlarged, with grain for texture."""
    import pyvips

    photo = pyvips.Image.new_from_file(str(CORPUS / "images/sharp-2569067123_aca715a2ee_o.jpg"))
    big = photo.resize(6000 / photo.width, vscale=4000 / photo.height)
    grain = pyvips.Image.gaussnoise(big.width, big.height, sigma=6, mean=0)
    textured = (big + grain).cast("uchar")
    path = directory / "generated-24mp.jpg"
    textured.jpegsave(str(path), Q=90)
    return path


def run_contender(
    contender: str, files: list[Path], repeat: int, mode: str = "--worker"
) -> dict[str, Any]:
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        mode,
        contender,
        "--repeat",
        str(repeat),
        *map(str, files),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("VIPS_CONCURRENCY", None)
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{contender} failed:\n{result.stderr}")
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def _packages() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("pyvips", "pyvips-binary", "pillow", "pillow-heif"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "missing"
    return found


def _git() -> str:
    result = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    )
    return result.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 round, fewer repeats")
    parser.add_argument("--json", type=Path, help="where to write results")
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    parser.add_argument("--repeat", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("files", nargs="*", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        print(json.dumps(worker(args.worker, args.files, args.repeat)))
        return 0
    if args.job:
        print(json.dumps(job_peak(args.job, args.files[0])))
        return 0

    contenders = [c for c in args.contenders.split(",") if c]
    rounds = 1 if args.quick else args.rounds
    started = time.perf_counter()
    loadavg_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="hm-bench-24mp-") as scratch:
        jpegs = [p for p in corpus_jpegs() if _pixels(p) <= PILLOW_LIMIT]
        sets = {
            "corpus JPEGs": (jpegs, 2 if args.quick else 5),
            "24 MP JPEG": ([make_24mp(Path(scratch))], 5 if args.quick else 15),
        }
        samples: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for round_number in range(rounds):
            shift = round_number % len(contenders)
            order = contenders[shift:] + contenders[:shift]
            for set_name, (files, repeat) in sets.items():
                for contender in order:
                    sample = run_contender(contender, files, repeat)
                    samples.setdefault((set_name, contender), []).append(sample)
                    print(
                        f"round {round_number + 1}: {set_name:<13} {contender:<10}"
                        f" {sample['images_per_second']:8.1f} img/s"
                        f" {sample['peak_rss_mb']:6.1f} MB",
                        file=sys.stderr,
                    )
        jobs = {
            contender: {path.name: run_contender(contender, [path], 0, "--job") for path in jpegs}
            for contender in contenders
        }

    rows = []
    for (set_name, contender), runs in samples.items():
        rates = [run["images_per_second"] for run in runs]
        rows.append(
            {
                "set": set_name,
                "contender": contender,
                "files": len(sets[set_name][0]),
                "images_per_round": runs[0]["images"],
                "images_per_second": statistics.median(rates),
                "rounds_images_per_second": rates,
                "cpu_seconds_per_image": statistics.median(
                    run["cpu_seconds_per_image"] for run in runs
                ),
                "images_per_cpu_second": round(
                    1 / statistics.median(run["cpu_seconds_per_image"] for run in runs), 2
                ),
                "peak_rss_mb": max(run["peak_rss_mb"] for run in runs),
                "rss_after_import_mb": max(run["rss_after_import_mb"] for run in runs),
            }
        )
    for row in rows:
        if row["set"] == "corpus JPEGs":
            peaks = [job["peak_rss_mb"] for job in jobs[row["contender"]].values()]
            row["job_peak_rss_mb"] = {"max": max(peaks), "median": statistics.median(peaks)}
            row["job_pyvips_loaded"] = sorted(
                name for name, job in jobs[row["contender"]].items() if job["pyvips"]
            )
    _add_ratios(rows)
    report = {
        "meta": {
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "git": _git(),
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cores": os.cpu_count(),
            "packages": _packages(),
            "loadavg_start": list(loadavg_start),
            "loadavg_end": list(os.getloadavg()),
            "wall_seconds": round(time.perf_counter() - started, 1),
        },
        "settings": {
            "rounds": rounds,
            "thumbnail": PARAMS,
            "sets": {name: [p.name for p in files] for name, (files, _) in sets.items()},
            "repeats": {name: repeat for name, (_, repeat) in sets.items()},
        },
        "rows": rows,
    }
    print_table(rows)
    target = args.json or REPO / "bench" / "results" / f"thumbnails-{int(time.time())}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nresults: {target}")
    return 0


def _add_ratios(rows: list[dict[str, Any]]) -> None:
    by_key = {(row["set"], row["contender"]): row for row in rows}
    for row in rows:
        for peer in ("pillow", "pyvips", "pyvips-1t"):
            other = by_key.get((row["set"], peer))
            if other is None or other is row:
                continue
            row[f"speed_vs_{peer}"] = round(
                row["images_per_second"] / other["images_per_second"], 3
            )
            row[f"cpu_speed_vs_{peer}"] = round(
                row["images_per_cpu_second"] / other["images_per_cpu_second"], 3
            )
            row[f"rss_vs_{peer}"] = round(row["peak_rss_mb"] / other["peak_rss_mb"], 3)
            if "job_peak_rss_mb" in row:
                row[f"job_rss_vs_{peer}"] = {
                    key: round(value / other["job_peak_rss_mb"][key], 3)
                    for key, value in row["job_peak_rss_mb"].items()
                }


def print_table(rows: list[dict[str, Any]]) -> None:
    header = (
        f"{'set':<13} {'contender':<10} {'img/s':>7} {'img/CPU-s':>9} {'peak MB':>7}"
        f" {'import MB':>9} {'work MB':>7} | {'vs Pillow: wall':>15} {'CPU':>5} {'RSS':>5}"
        f" | {'vs pyvips: wall':>15} {'CPU':>5} | {'vs pyvips-1t: CPU':>17}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        work = row["peak_rss_mb"] - row["rss_after_import_mb"]
        print(
            f"{row['set']:<13} {row['contender']:<10} {row['images_per_second']:7.1f}"
            f" {row['images_per_cpu_second']:9.1f} {row['peak_rss_mb']:7.1f}"
            f" {row['rss_after_import_mb']:9.1f} {work:7.1f} |"
            f" {_ratio(row, 'speed_vs_pillow'):>15} {_ratio(row, 'cpu_speed_vs_pillow'):>5}"
            f" {_ratio(row, 'rss_vs_pillow'):>5} |"
            f" {_ratio(row, 'speed_vs_pyvips'):>15} {_ratio(row, 'cpu_speed_vs_pyvips'):>5} |"
            f" {_ratio(row, 'cpu_speed_vs_pyvips-1t'):>17}"
        )
    print(
        "img/s: wall clock, median of rounds; img/CPU-s: per CPU-second (all threads);"
        " work MB: peak RSS - RSS after imports.\nRatios: this row / the other contender"
        " (speed > 1 is faster, RSS < 1 is smaller)."
    )
    print("\nOne corpus JPEG per fresh process (a job): peak RSS, MB")
    for row in rows:
        if "job_peak_rss_mb" in row:
            peak = row["job_peak_rss_mb"]
            versus = row.get("job_rss_vs_pillow")
            ratio = f"  vs Pillow {versus['median']:.2f} / {versus['max']:.2f}" if versus else ""
            print(
                f"{row['contender']:<10} median {peak['median']:5.1f}  max {peak['max']:5.1f}"
                f"{ratio}  (pyvips loaded for {len(row['job_pyvips_loaded'])} files)"
            )


def _ratio(row: dict[str, Any], key: str) -> str:
    return f"{row[key]:.2f}" if key in row else ""


if __name__ == "__main__":
    raise SystemExit(main())
