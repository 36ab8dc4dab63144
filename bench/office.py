"""docx_to_pdf: conversions per CPU-second and per second, side by side in one run.

    python bench/office.py                  # 3 rounds over the documents, ~2 minutes
    python bench/office.py --rounds 1 --json out.json

Every row converts the same word-processing documents (the corpus's ``*.docx`` when
the corpus is there, ``HYPERMEDIA_TEST_CORPUS`` or ``../shared/corpus``; else the
project's generated ones: tests/generated), each row in a Python process of its own,
so its CPU time (user + system of the row and every LibreOffice it started) is that
row's alone:

* ``hypermedia``: the ``docx_to_pdf`` step in the sandbox, as a worker runs it: a
  :class:`~hypermedia.sandbox.executor.ChildExecutor` (own uid, namespaces, rlimits,
  the profile's limits), one job after another;
* ``step``: the same step called in process (no sandbox): LibreOffice's own cost;
* ``step-render-tests``: the step with the profile it had before issue 18 (no
  ``ooSetupLastVersion``: every start ran LibreOffice's graphics render tests);
* ``soffice``: what a script does: ``soffice --headless --convert-to pdf`` through
  its launcher, a fresh profile each time (the default one would be shared).

Rounds interleave the rows (the order rotates); a row's rate is the median of its
rounds. The table gives each row's conversions per second and per CPU-second and the
ratio to ``step-render-tests`` (today's rate before the change). Results: a table,
and JSON in ``bench/results/`` (``--json`` to choose); ``bench/reports/office.json``
is one representative run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
ROWS = ("hypermedia", "step", "step-render-tests", "soffice")
BASELINE = "step-render-tests"

_ROW = r"""
import json, os, resource, shutil, subprocess, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
row, documents = sys.argv[2], [Path(p) for p in json.loads(sys.argv[3])]
scratch = Path(tempfile.mkdtemp(prefix="hm-bench-office-"))

def cpu():
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

if row in ("step", "step-render-tests"):
    from pipelines import office, office_libreoffice
    if row == "step-render-tests":
        office_libreoffice._PROFILE_SETTINGS = tuple(
            s for s in office_libreoffice._PROFILE_SETTINGS if s[1] != "ooSetupLastVersion"
        )
    def convert(n, path):
        workdir = scratch / f"job-{n}"
        workdir.mkdir()
        office.docx_to_pdf(path, {}, workdir)
        shutil.rmtree(workdir)
    close = lambda: None
elif row == "soffice":
    def convert(n, path):
        workdir = scratch / f"job-{n}"
        (workdir / "out").mkdir(parents=True)
        subprocess.run(
            ["soffice", "--headless", "--norestore",
             f"-env:UserInstallation={(workdir / 'profile').as_uri()}",
             "--convert-to", "pdf", "--outdir", str(workdir / "out"), str(path)],
            check=True, capture_output=True, timeout=300,
        )
        assert list((workdir / "out").glob("*.pdf")), path
        shutil.rmtree(workdir)
    close = lambda: None
else:
    import tomllib
    from hypermedia.sandbox.executor import ChildExecutor
    profile = tomllib.loads((Path(sys.argv[1]) / "etc" / "profiles.toml").read_text())
    profile = profile["profiles"]["docx_to_pdf"]
    executor = ChildExecutor(scratch / "work", ("pipelines.registry", "pipelines.office"))
    def convert(n, path):
        job = f"office-{n}"
        source = executor.prepare(job) / "input" / "source"
        shutil.copyfile(path, source)
        executor.run(job, "docx_to_pdf", source, {},
                     timeout_seconds=profile["timeout_seconds"],
                     memory_limit_mb=profile["memory_limit_mb"],
                     max_processes=profile.get("max_processes", 16))
        executor.cleanup(job)
    close = executor.close

convert(0, documents[0])  # warm: imports, the fork server, the page cache
cpu0, wall0 = cpu(), time.monotonic()
for n, path in enumerate(documents, start=1):
    convert(n, path)
wall, used = time.monotonic() - wall0, None
close()
used = cpu() - cpu0
shutil.rmtree(scratch, ignore_errors=True)
print(json.dumps({"conversions": len(documents), "seconds": wall, "cpu_seconds": used}))
"""


def default_documents() -> list[Path]:
    from tests.corpus_support import find_corpus

    lookup = find_corpus()
    if lookup.path is not None:
        found = sorted((lookup.path / "documents").glob("*.docx"))
        if found:
            return found
    from tests.generated import Generated

    root = Path(tempfile.mkdtemp(prefix="hm-bench-office-docs-"))
    return sorted(Generated(root).group("documents").glob("*.docx"))


def run_row(row: str, documents: list[Path]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", _ROW, str(REPO), row, json.dumps([str(p) for p in documents])],
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"row {row} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    documents = default_documents()
    print(f"{len(documents)} documents, {args.rounds} rounds: {', '.join(ROWS)}")
    samples: dict[str, list[dict[str, Any]]] = {row: [] for row in ROWS}
    for round_number in range(args.rounds):
        order = ROWS[round_number % len(ROWS) :] + ROWS[: round_number % len(ROWS)]
        for row in order:
            sample = run_row(row, documents)
            samples[row].append(sample)
            print(
                f"  round {round_number + 1} {row:18s} {sample['seconds']:6.1f} s"
                f" {sample['cpu_seconds']:6.1f} CPU-s"
            )

    def rates(row: str) -> tuple[float, float]:
        per_second = statistics.median(s["conversions"] / s["seconds"] for s in samples[row])
        per_cpu = statistics.median(s["conversions"] / s["cpu_seconds"] for s in samples[row])
        return per_second, per_cpu

    base_rate, base_cpu = rates(BASELINE)
    table = []
    print(f"\n{'row':18s} {'docs/s':>8s} {'docs/CPU-s':>11s} {'x speed':>8s} {'x CPU':>7s}")
    for row in ROWS:
        per_second, per_cpu = rates(row)
        entry = {
            "row": row,
            "documents_per_second": round(per_second, 3),
            "documents_per_cpu_second": round(per_cpu, 3),
            "cpu_seconds_per_document": round(1 / per_cpu, 4),
            f"speed_vs_{BASELINE}": round(per_second / base_rate, 3),
            f"cpu_speed_vs_{BASELINE}": round(per_cpu / base_cpu, 3),
            "rounds": samples[row],
        }
        table.append(entry)
        print(
            f"{row:18s} {per_second:8.2f} {per_cpu:11.2f}"
            f" {per_second / base_rate:8.2f} {per_cpu / base_cpu:7.2f}"
        )
    report = {
        "meta": {
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": platform.node(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "libreoffice": _libreoffice_version(),
            "documents": [p.name for p in documents],
            "rounds": args.rounds,
        },
        "rows": table,
    }
    out = args.json or REPO / "bench" / "results" / f"office-{int(time.time())}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {out}")
    return 0


def _libreoffice_version() -> str:
    try:
        done = subprocess.run(
            ["soffice", "--version"], capture_output=True, text=True, timeout=60, check=False
        )
    except OSError:
        return "not installed"
    return done.stdout.strip()


if __name__ == "__main__":
    raise SystemExit(main())
