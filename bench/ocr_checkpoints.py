"""What the ocr step's checkpoints cost it (pipelines/ocr_resume.py).

    python bench/ocr_checkpoints.py                 # 10 pages, tesseract, 3 rounds
    python bench/ocr_checkpoints.py --pages 20 --engines ppocr,tesseract

An image-only PDF of ``--pages`` generated pages (tests/generated/ocr_pages.py's clean
page, 1966 x 635 px at 300 dpi, each page's image its own PNG) is read by the ocr step
in this process, in turns: with its checkpoints as shipped, and with none (a piece
every 10**9 pages and seconds). Per row: the step's wall and CPU seconds (median of the
rounds); the time writing pieces took (``PageCheckpoints.commit`` timed); the pieces'
sizes; and what a retry that finds them all spends taking them (reading the pieces
back, the page images written out) beside what reading those pages cost. Tesseract
alone is the cheapest engine: the overhead's largest share of a page.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from pipelines import checkpoints, ocr, ocr_resume


def _scan(path: Path, pages: int) -> None:
    from tests.generated import ocr_pages

    page = ocr_pages.clean_page().convert("RGB")
    stamp = time.gmtime(946_684_800)
    page.save(
        path,
        format="PDF",
        resolution=300,
        save_all=True,
        append_images=[page] * (pages - 1),
        creationDate=stamp,
        modDate=stamp,
    )


def _run(scan: Path, params: dict[str, Any], workdir: Path) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds, seconds writing pieces."""
    spent = [0.0]
    commit = ocr_resume.PageCheckpoints.commit

    def timed(self: ocr_resume.PageCheckpoints) -> None:
        started = time.perf_counter()
        commit(self)
        spent[0] += time.perf_counter() - started

    ocr_resume.PageCheckpoints.commit = timed  # type: ignore[method-assign]
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        ocr.ocr(scan, params, workdir)
        return time.perf_counter() - wall, time.process_time() - cpu, spent[0]
    finally:
        ocr_resume.PageCheckpoints.commit = commit  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pages", type=int, default=10)
    parser.add_argument("--engines", default="tesseract")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    params = {"lang": "en", "engines": args.engines.split(","), "layout": False}
    shipped = (ocr_resume.EVERY_PAGES, ocr_resume.EVERY_SECONDS)
    with tempfile.TemporaryDirectory(prefix="hm-bench-ocr-checkpoints-") as scratch:
        root = Path(scratch)
        scan = root / "scan.pdf"
        _scan(scan, args.pages + 1)  # the last page is never committed
        rows: dict[str, list[tuple[float, float, float]]] = {"checkpoints": [], "none": []}
        last = root / "none"
        for number in range(args.rounds):
            for row in rows:
                if row == "none":
                    ocr_resume.EVERY_PAGES, ocr_resume.EVERY_SECONDS = 10**9, 1e9
                else:
                    ocr_resume.EVERY_PAGES, ocr_resume.EVERY_SECONDS = shipped
                workdir = root / f"{row}-{number}"
                rows[row].append(_run(scan, params, workdir))
                if row == "checkpoints":
                    last = workdir
        ocr_resume.EVERY_PAGES, ocr_resume.EVERY_SECONDS = shipped
        pieces = checkpoints.finished(last)
        sizes = sorted(p.stat().st_size for p in pieces.values())
        retry = root / "retry"
        checkpoints.directory(retry).mkdir(parents=True)
        for name, path in pieces.items():
            (checkpoints.directory(retry) / name).write_bytes(path.read_bytes())
        (retry / "ocr-pages").mkdir()
        started = time.perf_counter()
        found = ocr_resume.PageCheckpoints(retry, retry / "ocr-pages", args.pages + 1, params)
        for number in range(1, args.pages + 1):
            found.page(number)
        taking = time.perf_counter() - started
    print(f"{args.pages + 1} pages ({args.engines}), median of {args.rounds} rounds")
    for row, runs in rows.items():
        wall, cpu, writing = (statistics.median(r[i] for r in runs) for i in range(3))
        print(f"  {row:12s} wall {wall:7.2f} s  cpu {cpu:7.2f} s  writing pieces {writing:.4f} s")
    print(f"  pieces: {len(sizes)}, {', '.join(f'{s / 1024:.0f} KiB' for s in sizes)}")
    print(f"  a retry taking {args.pages} pages back: {taking:.4f} s")


if __name__ == "__main__":
    main()
