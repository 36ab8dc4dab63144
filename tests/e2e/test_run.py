"""`hypermedia run examples/` as the README's first command runs it: a subprocess
on the embedded default that starts everything, processes the shipped sample
files end to end, writes outputs, and stops everything it started."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pyvips

from hypermedia.embedded import find_running
from hypermedia.worker.cluster import short_temp_dir

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hypermedia.cli", "run", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_run_examples_end_to_end(tmp_path):
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYPERMEDIA_", "RAY_"))}
    env["HYPERMEDIA_DATA_DIR"] = str(data)
    samples = sorted(p for p in EXAMPLES.iterdir() if not p.name.startswith("."))
    assert len(samples) >= 8
    result = _run([str(EXAMPLES)], tmp_path, env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    text = " ".join(result.stderr.split())
    assert f"{len(samples)} jobs: {len(samples)} completed" in text
    for sample in samples:
        (output,) = (tmp_path / "hypermedia-out" / sample.name).iterdir()
        image = pyvips.Image.new_from_file(str(output))
        assert max(image.width, image.height) <= 320
        assert output.suffix == ".webp"
    # The rotated phone photo came out upright (EXIF orientation applied): portrait.
    (upright,) = (tmp_path / "hypermedia-out" / "phone-photo-rotated.jpg").iterdir()
    image = pyvips.Image.new_from_file(str(upright))
    assert image.height > image.width
    # Everything it started is gone: no Redis from its data dir, no Ray processes.
    assert find_running(data / "redis") is None
    marker = str(short_temp_dir(data / "ray", "head"))
    leftovers = [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if marker in " ".join(p.info["cmdline"] or [])
    ]
    assert leftovers == []


def test_run_refuses_an_operation_without_a_pipeline(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYPERMEDIA_", "RAY_"))}
    env["HYPERMEDIA_DATA_DIR"] = str(tmp_path / "data")
    result = _run([str(EXAMPLES / "banner.webp"), "--op", "no_such_op"], tmp_path, env)
    assert result.returncode == 1
    assert "unknown_operation" in result.stderr
    assert "Traceback" not in result.stderr
    missing = _run([str(tmp_path / "missing.jpg")], tmp_path, env)
    assert missing.returncode != 0
    assert "missing.jpg" in missing.stderr
