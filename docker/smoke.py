"""The worker image's smoke test, run inside the built image by docker/smoke.

    /opt/hypermedia/bin/python /smoke/docker/smoke.py [--examples DIR] [--require-sandbox]

The checkout's tests/ is mounted read-only under /smoke (its fixture generators make
every input here, with the image's own LibreOffice, FFmpeg, libvips and Pillow); the code
under test is the image's: the installed wheel, never the checkout's.

1. ``hypermedia --help``: the CLI and its imports.
2. The sandbox's capabilities in this container, as it is run (the fork server the
   pipelines below run in): each missing feature and why is printed as DEGRADED
   (``--require-sandbox`` fails on any).
3. Each pipeline on one generated file, through the fork server into a sandboxed child,
   with the shipped profile's params and limits, as a worker runs it: thumbnail (PNG),
   pdf_preview (PDF), docx_to_pdf (DOCX), extract_text (the DOCX), transcode_video (MP4),
   ocr (a text page, read back within a word error bound).
4. ``hypermedia run`` on the examples directory: a private Redis, a SQLite record, a Ray
   head, the actors, every file processed end to end, the outputs written.

Exit status 0 when every check passed; the last line says which failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import hypermedia

SMOKE_ROOT = Path(__file__).resolve().parent.parent
# After the image's site-packages: `tests` comes from the checkout, the rest from the image.
sys.path.append(str(SMOKE_ROOT))

failures: list[str] = []
degraded: list[str] = []


def say(message: str) -> None:
    print(message, flush=True)


def check(name: str, body: Callable[[], str]) -> None:
    started = time.monotonic()
    try:
        detail = body()
    except Exception as exc:  # every failure is reported, and the rest still runs
        failures.append(name)
        say(f"FAIL  {name}: {type(exc).__name__}: {exc}")
        return
    say(f"ok    {name} ({time.monotonic() - started:.1f} s): {detail}")


def cli() -> str:
    done = subprocess.run(
        ["hypermedia", "--help"], capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode != 0 or "run" not in done.stdout:
        raise RuntimeError(f"exit {done.returncode}: {done.stderr[-2000:]}")
    return f"hypermedia {hypermedia.__version__} from {Path(hypermedia.__file__).parent}"


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


class Pipelines:
    """Each operation once, through one fork server (a worker's ChildExecutor)."""

    def __init__(self, work: Path) -> None:
        from hypermedia.config import load_settings
        from hypermedia.profiles import load_profiles
        from hypermedia.sandbox.executor import ChildExecutor

        settings = load_settings()
        self.profiles = load_profiles(settings.profiles_path, settings.queue_names)
        self.inputs = work / "inputs"
        self.inputs.mkdir()
        self.executor = ChildExecutor(work / "executor", job_cpus=1)
        self.jobs = 0

    def run(self, operation: str, source: Path) -> dict[str, Path]:
        profile = self.profiles[operation]
        self.jobs += 1
        job = f"smoke-{operation.replace('_', '-')}-{self.jobs}"
        workdir = self.executor.prepare(job)
        staged = workdir / "input" / source.name
        staged.write_bytes(source.read_bytes())
        result = self.executor.run(
            job,
            operation,
            staged,
            profile.params,
            timeout_seconds=profile.timeout_seconds,
            memory_limit_mb=profile.memory_limit_mb,
            max_output_bytes=profile.max_output_bytes,
            max_processes=profile.max_processes,
        )
        outputs = {o.output_type: o.path for o in result.outputs}
        for kind, path in outputs.items():
            if not path.is_file() or path.stat().st_size == 0:
                raise RuntimeError(f"{operation}: output {kind} is empty or missing")
        return outputs

    def close(self) -> None:
        self.executor.close()


def sandbox(runner: Pipelines, require: bool) -> Callable[[], str]:
    """The capabilities of the fork server the pipelines run in."""

    def probe() -> str:
        capabilities = runner.executor.capabilities
        missing = capabilities.get("missing", {})
        for feature, why in sorted(missing.items()):
            degraded.append(feature)
            say(f"DEGRADED sandbox: {feature}: {why}")
        if require and missing:
            raise RuntimeError(f"missing {', '.join(sorted(missing))}")
        shown = {k: v for k, v in capabilities.items() if k != "missing"}
        return json.dumps(shown, sort_keys=True)

    return probe


def described(outputs: dict[str, Path]) -> str:
    return ", ".join(f"{kind} {path.stat().st_size} B" for kind, path in sorted(outputs.items()))


def fixtures(directory: Path) -> dict[str, Path]:
    """One generated input per pipeline, made here by the project's generators."""
    from tests.generated import documents, images, media, ocr_pages

    made = {
        "png": directory / "picture.png",
        "pdf": directory / "text.pdf",
        "docx": directory / "report.docx",
        "mp4": directory / "clip.mp4",
        "page": directory / "page.png",
    }
    images.picture(640, 480).pngsave(str(made["png"]))
    made["pdf"].write_bytes(documents.text_pdf([[documents.TITLE, documents.BODY]]))
    source = directory / "report.fodt"
    source.write_text(documents.report_fodt(), encoding="utf-8")
    documents.soffice_convert([source], "docx", directory)
    media.ffmpeg(
        *media.video_source(2.0),
        *media.tone_source(2.0),
        *media.H264,
        "-c:a",
        "aac",
        "-shortest",
        str(made["mp4"]),
    )
    ocr_pages.clean_page().save(made["page"])
    return made


def pipeline_checks(work: Path, require_sandbox: bool) -> None:
    made: dict[str, Path] = {}
    try:
        runner = Pipelines(work)
    except Exception as exc:
        failures.append("executor")
        say(f"FAIL  executor: {type(exc).__name__}: {exc}")
        return
    check("sandbox", sandbox(runner, require_sandbox))

    def generate() -> str:
        directory = work / "fixtures"
        directory.mkdir()
        made.update(fixtures(directory))
        return ", ".join(f"{p.name} {p.stat().st_size} B" for p in made.values())

    check("fixtures generated", generate)
    if len(made) < 5:
        runner.close()
        return

    def thumbnail() -> str:
        return described(runner.run("thumbnail", made["png"]))

    def pdf_preview() -> str:
        return described(runner.run("pdf_preview", made["pdf"]))

    def docx_to_pdf() -> str:
        outputs = runner.run("docx_to_pdf", made["docx"])
        pdfs = [p for p in outputs.values() if p.read_bytes()[:5] == b"%PDF-"]
        if not pdfs:
            raise RuntimeError(f"no PDF among {described(outputs)}")
        return described(outputs)

    def extract_text() -> str:
        from tests.generated import documents

        outputs = runner.run("extract_text", made["docx"])
        text = " ".join(
            p.read_text(encoding="utf-8", errors="replace")
            for kind, p in outputs.items()
            if kind.endswith((".txt", ".json"))
        )
        if " ".join(words(documents.BODY)) not in " ".join(words(text)):
            raise RuntimeError(f"the body text is not in the outputs: {text[:300]!r}")
        return described(outputs)

    def transcode_video() -> str:
        return described(runner.run("transcode_video", made["mp4"]))

    def ocr() -> str:
        from tests.generated import ocr_pages

        outputs = runner.run("ocr", made["page"])
        text = " ".join(
            p.read_text(encoding="utf-8") for kind, p in outputs.items() if kind.endswith(".txt")
        )
        truth = words(" ".join(ocr_pages.PARAGRAPHS))
        read = set(words(text))
        found = sum(word in read for word in truth) / len(truth)
        if found < 0.9:
            raise RuntimeError(f"{found:.0%} of the page's words read: {text[:300]!r}")
        return f"{found:.0%} of the words read; {described(outputs)}"

    try:
        for name, body in [
            ("pipeline thumbnail", thumbnail),
            ("pipeline pdf_preview", pdf_preview),
            ("pipeline docx_to_pdf", docx_to_pdf),
            ("pipeline extract_text", extract_text),
            ("pipeline transcode_video", transcode_video),
            ("pipeline ocr", ocr),
        ]:
            check(name, body)
    finally:
        runner.close()


def run_examples(examples: Path, work: Path) -> Callable[[], str]:
    def body() -> str:
        out = work / "run-out"
        env = {**os.environ, "HYPERMEDIA_DATA_DIR": str(work / "run-data")}
        done = subprocess.run(
            ["hypermedia", "run", str(examples), "--out", str(out), "--timeout", "900"],
            capture_output=True,
            text=True,
            timeout=1200,
            check=False,
            env=env,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )
        inputs = [p for p in examples.iterdir() if p.is_file()]
        written = [p for p in out.rglob("*") if p.is_file()]
        if len(written) < len(inputs):
            raise RuntimeError(f"{len(written)} outputs for {len(inputs)} files:\n{done.stdout}")
        summary = (done.stdout + done.stderr).rstrip().splitlines()[-20:]
        say("\n".join(summary))
        return f"{len(inputs)} files, {len(written)} outputs under {out.name}/"

    return body


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=Path, default=SMOKE_ROOT / "examples")
    parser.add_argument("--require-sandbox", action="store_true")
    parser.add_argument(
        "--work-parent",
        type=Path,
        default=None,
        help="where the scratch directory (the executor's work root) is made",
    )
    args = parser.parse_args()
    say(f"python {sys.version.split()[0]} as uid {os.getuid()}, {sys.executable}")
    if Path(hypermedia.__file__).resolve().is_relative_to(SMOKE_ROOT):
        say(f"FAIL  hypermedia is imported from the checkout ({hypermedia.__file__})")
        return 1
    check("cli", cli)
    if args.work_parent is not None:
        args.work_parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hm-smoke-", dir=args.work_parent) as scratch:
        work = Path(scratch)
        # As a worker's data directory: job uids pass through to their own workdirs.
        work.chmod(0o711)
        pipeline_checks(work, args.require_sandbox)
        check("hypermedia run examples", run_examples(args.examples, work))
    if degraded:
        say(f"smoke: sandbox degraded here: {', '.join(sorted(set(degraded)))}")
    if failures:
        say(f"smoke: FAILED: {', '.join(failures)}")
        return 1
    say("smoke: all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
