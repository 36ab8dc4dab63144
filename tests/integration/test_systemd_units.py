"""The systemd units in etc/systemd (written for an operator's VPS, not run here): each
is what `systemd-analyze verify` accepts without a warning once its ExecStart names a
program that exists, runs a `hypermedia` command that exists, and keeps the limits
that make it the seed's VPS worker (memory, CPU, restart always) without letting the
kernel's OOM kill of one job stop the whole service."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hypermedia.cli import app

ROOT = Path(__file__).resolve().parents[2]
UNITS = sorted((ROOT / "etc" / "systemd").glob("*.service"))


def test_there_are_units_for_the_head_and_a_worker():
    assert [u.name for u in UNITS] == ["hypermedia-head.service", "hypermedia-worker.service"]


def service(unit: Path) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(unit.read_text())
    return parser["Service"]


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
def test_systemd_accepts_the_unit_without_a_warning(unit: Path, tmp_path: Path):
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing (apt-get install systemd)"
    # The program it names lives on the operator's machine: here, this interpreter.
    text = unit.read_text().replace("/opt/hypermedia/bin/hypermedia", sys.executable)
    (tmp_path / unit.name).write_text(text)
    done = subprocess.run(
        [analyze, "verify", unit.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # The EnvironmentFile is the operator's (missing here: systemd reads it at start).
    said = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 0 and said == [], done.stderr


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
def test_the_unit_runs_a_command_that_exists_within_the_limits(unit: Path):
    section = service(unit)
    program, command = section["ExecStart"].split()
    assert program == "/opt/hypermedia/bin/hypermedia"
    shown = CliRunner().invoke(app, [command, "--help"])
    assert shown.exit_code == 0, shown.output
    assert section["Restart"] == "always"
    assert section["OOMPolicy"] == "continue"  # a job's OOM kill is the job's failure
    assert section["MemoryMax"].endswith("G") and section["CPUQuota"].endswith("%")
    assert section["EnvironmentFile"] == "/etc/hypermedia/hypermedia.env"
