"""A wheel carries the shipped defaults (etc/), and an install from it finds them.

The checkout reads etc/ itself; a non-editable install (a VPS head, the worker image)
finds them under <prefix>/share/hypermedia/etc (pyproject's data-files)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from hypermedia.etc import shipped_etc

REPO = Path(__file__).resolve().parents[2]


def test_the_checkout_then_the_prefix(tmp_path):
    checkout, prefix = tmp_path / "checkout" / "etc", tmp_path / "prefix" / "etc"
    prefix.mkdir(parents=True)
    (prefix / "profiles.toml").write_text("")
    assert shipped_etc((checkout, prefix)) == prefix  # no checkout etc/: the installed one
    checkout.mkdir(parents=True)
    (checkout / "profiles.toml").write_text("")
    assert shipped_etc((checkout, prefix)) == checkout
    assert shipped_etc() == REPO / "etc"


def test_the_wheel_carries_the_defaults(tmp_path):
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(REPO)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = tmp_path.glob("hypermedia-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    data = "hypermedia-0.1.0.data/data/share/hypermedia/etc"
    for shipped in ("profiles.toml", "scheduler.json", "traces/daily_cycle.csv"):
        assert f"{data}/{shipped}" in names, sorted(n for n in names if ".data/" in n)
    assert "autoscaler/provider.py" in names and "pipelines/registry.py" in names
    assert any(n.startswith("hypermedia/queue/scripts/") and n.endswith(".lua") for n in names)
