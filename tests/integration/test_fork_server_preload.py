"""What a step's fork server loads before it forks, so that its job children do not.

A job child is a fresh copy of its fork server and runs one job: whatever the step
imports or initialises lazily on its first call, every child does again (fpdf2 alone
was ~0.3 CPU-s of each OCR job; pyvips' introspection and a decoder module ~5 ms of
each image job). Each test starts a fresh interpreter that loads what a worker's fork
server loads for the steps (``pipelines.registry.preload`` and each module's
``prepare_fork_server()``), then runs the steps on generated files in-process and
reports the modules imported and the libvips operations introspected after that: each
one is work a child would redo. The server must still be single-threaded where it was
(it forks with libc's ``fork()`` then).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.generated import Generated, ocr_pages

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_SECONDS = 600

_PLAY_THE_SERVER = """
import ctypes, importlib, json, os, resource, shutil, sys, tomllib
from pathlib import Path
from pipelines import registry
from pyvips.voperation import Introspect

plan = json.loads(sys.argv[1])
registry.load_all()
for name in registry.preload(plan["operations"]):
    module = importlib.import_module(name)
    getattr(module, "prepare_fork_server", lambda: None)()
threads = len(os.listdir("/proc/self/task"))
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
freed_faults = []
for _ in range(3):  # a 64 MB block made, written and freed, as a step's arrays are
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc(64 << 20)
    ctypes.memset(block, 1, 64 << 20)
    libc.free(block)
    freed_faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
modules, introspected = set(sys.modules), set(Introspect._introspect_cache)
profiles = tomllib.loads(Path("etc/profiles.toml").read_text())["profiles"]
ran = 0
for n, (path, operation, params) in enumerate(plan["runs"]):
    workdir = Path(plan["scratch"]) / str(n)
    workdir.mkdir()
    try:
        registry.get(operation)(Path(path), {**profiles[operation]["params"], **params}, workdir)
        ran += 1
    except registry.PipelineError:
        pass
    shutil.rmtree(workdir)
print(json.dumps({
    "threads": threads,
    "freed_faults": freed_faults,
    "ran": ran,
    "modules": sorted(set(sys.modules) - modules),
    "introspected": sorted(set(Introspect._introspect_cache) - introspected),
}))
"""


def _played(
    operations: list[str], runs: list[tuple[Path, str, dict[str, Any]]], scratch: Path
) -> dict[str, Any]:
    plan = {
        "operations": operations,
        "runs": [(str(path), op, params) for path, op, params in runs],
        "scratch": str(scratch),
    }
    done = subprocess.run(
        [sys.executable, "-c", _PLAY_THE_SERVER, json.dumps(plan)],
        cwd=REPO, capture_output=True, text=True, check=True, timeout=TIMEOUT_SECONDS,
    )  # fmt: skip
    found: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return found


def test_the_image_steps_children_import_and_introspect_nothing(
    generated: Generated, tmp_path: Path
) -> None:
    """Every generated image through the four steps (thumbnail also cropped by
    attention, convert to each output format) after the image steps' preload."""
    steps = ["thumbnail", "resize", "compress", "convert"]
    runs: list[tuple[Path, str, dict[str, Any]]] = []
    for row in generated.rows(["images"]):
        path = generated / row.path
        runs += [(path, step, {}) for step in steps]
        runs.append((path, "thumbnail", {"crop": "attention"}))
        runs += [(path, "convert", {"format": f}) for f in ("png", "webp", "gif", "avif", "tiff")]
    found = _played(steps, runs, tmp_path)
    assert found["threads"] == 1, found
    assert found["ran"] > 100, found  # outputs were made, not only refusals
    # HEIC (pillow-heif: ~7 MB more in every child) and ICO are loaded on first use,
    # deliberately (pipelines.image_decoders): rare formats.
    rare = ("pillow_heif", "_pillow_heif", "PIL.IcoImagePlugin", "PIL.ImageOps", "PIL.Tiff")
    assert [m for m in found["modules"] if not m.startswith(rare)] == [], found
    assert found["introspected"] == [], f"add to image_vips.STEP_OPERATIONS: {found}"


def test_pdf_preview_children_import_and_introspect_nothing(
    generated: Generated, tmp_path: Path
) -> None:
    pdfs = [generated / r.path for r in generated.rows(["documents"]) if r.path.endswith(".pdf")]
    runs = [(path, "pdf_preview", {"format": f}) for path in pdfs for f in ("jpeg", "png", "webp")]
    found = _played(["pdf_preview"], runs, tmp_path)
    assert found["threads"] == 1, found
    assert found["ran"] >= 3, found
    assert found["modules"] == [], found
    assert found["introspected"] == [], found


def test_ocr_children_import_only_what_a_rare_path_needs(tmp_path: Path) -> None:
    """A page and a scanned PDF through the ocr step: what is left to import is the
    searchable PDF's font tables (fontTools loads those it subsets), codecs, and
    tesseract (the chain's last engine, loaded only for a page it must read).

    The page is one short line at 300 dpi, the PDF a scan of it: the same steps as a
    full page (turned upright and level, detected, recognised, a searchable PDF made)
    at ~0.9 CPU-s less a job than the generated five-line clean page and its scan.

    And the server's malloc (pipelines.ocr_engines.prepare_fork_server, its children's)
    keeps a freed 64 MB block for the next, whose pages are not faulted in again: by
    default glibc unmaps a block over 32 MB when it is freed, and the next one faults
    16,384 pages in (a 300-dpi page's job faulted ~1 M pages, a third of its CPU)."""
    page = ocr_pages.script_page(("Invoice 2024-117",), size=42)
    page.save(tmp_path / "page.png")
    page.convert("RGB").save(tmp_path / "scan.pdf", format="PDF", resolution=300)
    runs: list[tuple[Path, str, dict[str, Any]]] = [
        (tmp_path / name, "ocr", {}) for name in ("page.png", "scan.pdf")
    ]
    found = _played(["ocr"], runs, tmp_path)
    faults = found["freed_faults"]
    assert faults[0] > 10_000 and max(faults[1:]) < 1_000, faults
    assert found["ran"] == 2, found
    lazy = ("fontTools.ttLib.tables.", "encodings.", "tesserocr")
    assert [m for m in found["modules"] if not m.startswith(lazy)] == [], found
    assert found["introspected"] == [], found
