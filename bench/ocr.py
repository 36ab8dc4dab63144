"""OCR engines side by side: pages per CPU-second, peak RSS and CER, one run.

    python bench/ocr.py                          # the corpus's ocr pairs, else generated pages
    python bench/ocr.py --pages DIR --json out.json

Each row runs the ``ocr`` step (in-process, as the sandboxed child runs it) over
every page with its truth (``<name>.<image>`` beside ``<name>.txt``), in a fresh
Python process of its own, so its CPU time (user + system, model loading included)
and peak RSS are that row's alone:

* ``ppocr``, ``ppocr-cls``, ``tesseract``: one engine, no escalation;
* ``chain``: the profile's default chain (ppocr -> ppocr-cls -> tesseract, escalating
  pages whose mean line confidence is under 0.97).

Engines run on one thread (``HYPERMEDIA_JOB_CPUS=1``). CER: whitespace runs collapsed,
all edits over all truth characters (the UNLV pages compared as word multisets, see
tests/ocr_support.py). The issue's target: the chain's CER at most the best single
engine's, at no more than 1.5x ppocr's CPU. Languages as tests/ocr_support.py names
them. Results go to ``bench/results/ocr-<timestamp>.json``
unless ``--json`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
CONFIGS: dict[str, dict[str, Any]] = {
    "ppocr": {"engines": ["ppocr"]},
    "ppocr-cls": {"engines": ["ppocr-cls"]},
    "tesseract": {"engines": ["tesseract"]},
    "chain": {},
}

_ROW = r"""
import json, resource, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from pipelines import registry
from pipelines.registry import PipelineError
from tests.ocr_support import LANGUAGES, corpus_score, total
params = json.loads(sys.argv[2])
pages = [Path(p) for p in json.loads(sys.argv[3])]
step = registry.get("ocr")
scores, rows, escalated = [], [], 0
for image in pages:
    truth = image.with_suffix(".txt").read_text(encoding="utf-8")
    request = {**params, "lang": LANGUAGES.get(image.stem, "en")}
    with tempfile.TemporaryDirectory() as work:
        try:
            outputs = step(image, request, Path(work))
        except PipelineError as exc:
            rows.append({"page": image.name, "skipped": exc.code})
            continue
        text = outputs[0].path.read_text(encoding="utf-8")
        pages_json = json.loads(outputs[1].path.read_text(encoding="utf-8"))["pages"]
    score = corpus_score(image.stem, text, truth)
    escalated += sum(len([a for a in p["attempts"] if "skipped" not in a]) > 1 for p in pages_json)
    scores.append(score)
    rows.append({
        "page": image.name, "cer": round(score.cer, 4), "edits": score.edits,
        "chars": score.length, "engine": pages_json[0]["engine"],
    })
usage = resource.getrusage(resource.RUSAGE_SELF)
overall = total(scores)
print(json.dumps({
    "cpu_seconds": usage.ru_utime + usage.ru_stime,
    "peak_rss_mb": usage.ru_maxrss / 1024,
    "pages": len(scores),
    "edits": overall.edits,
    "truth_chars": overall.length,
    "escalated_pages": escalated,
    "per_page": rows,
}))
"""


def pairs(directory: Path) -> list[Path]:
    found = []
    for truth in sorted(directory.glob("*.txt")):
        images = [p for p in directory.glob(f"{truth.stem}.*") if p.suffix != ".txt"]
        if len(images) == 1:
            found.append(images[0])
    return found


def default_pages() -> Path:
    from tests.corpus_support import find_corpus

    lookup = find_corpus()
    if lookup.path is not None and (lookup.path / "ocr").is_dir():
        return lookup.path / "ocr"
    from tests.generated import Generated

    root = Path(tempfile.mkdtemp(prefix="hm-bench-ocr-"))
    return Generated(root).group("ocr")


def run_row(params: dict[str, Any], pages: list[Path]) -> dict[str, Any]:
    env = {**os.environ, "HYPERMEDIA_JOB_CPUS": "1", "OMP_THREAD_LIMIT": "1"}
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _ROW,
            str(REPO),
            json.dumps(params),
            json.dumps(list(map(str, pages))),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the row {params} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["wall_seconds"] = round(time.monotonic() - started, 2)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=Path, help="a directory of <name>.<image> + <name>.txt")
    parser.add_argument("--json", type=Path, help="where to write the results")
    args = parser.parse_args(argv)
    directory = args.pages or default_pages()
    pages = pairs(directory)
    rows = {name: run_row(params, pages) for name, params in CONFIGS.items()}
    # CER over the pages every row read (PP-OCR has no model for Arabic or Hindi).
    read = [{p["page"] for p in row["per_page"] if "cer" in p} for row in rows.values()]
    common = set.intersection(*read)
    for row in rows.values():
        scored = [p for p in row["per_page"] if p["page"] in common]
        chars = sum(p["chars"] for p in scored)
        row["cer_common"] = round(sum(p["edits"] for p in scored) / chars, 4) if chars else 0.0
    base_cpu = rows["ppocr"]["cpu_seconds"]
    print(f"{len(pages)} pages from {directory}; one thread per engine")
    print(f"CER: over the pages each row read; 'common': the {len(common)} every row read\n")
    header = f"{'engine':<10} {'pages':>5} {'pages/CPU-s':>11} {'CPU s':>8} {'x ppocr':>8}"
    print(f"{header} {'peak RSS MB':>11} {'CER':>7} {'common':>7} {'escalated':>9}")
    for name, row in rows.items():
        cer = row["edits"] / row["truth_chars"] if row["truth_chars"] else 0.0
        row["cer"] = round(cer, 4)
        row["pages_per_cpu_second"] = round(row["pages"] / row["cpu_seconds"], 3)
        print(
            f"{name:<10} {row['pages']:>5} {row['pages_per_cpu_second']:>11.3f}"
            f" {row['cpu_seconds']:>8.1f} {row['cpu_seconds'] / base_cpu:>8.2f}"
            f" {row['peak_rss_mb']:>11.0f} {cer:>7.4f} {row['cer_common']:>7.4f}"
            f" {row['escalated_pages']:>9}"
        )
    single = min(rows[name]["cer_common"] for name in ("ppocr", "ppocr-cls", "tesseract"))
    chain = rows["chain"]
    met = chain["cer_common"] <= single and chain["cpu_seconds"] <= 1.5 * base_cpu
    print(
        f"\nchain CER {chain['cer_common']:.4f} vs best single {single:.4f} (common pages);"
        f" CPU {chain['cpu_seconds'] / base_cpu:.2f}x ppocr: target {'met' if met else 'missed'}"
    )
    report = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "pages_from": str(directory.name),
        "rows": rows,
        "target_met": met,
    }
    out = args.json or REPO / "bench" / "results" / f"ocr-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
