"""`hypermedia up` leaves a local stack running for other commands; `down` stops it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil

from hypermedia.embedded import find_running
from hypermedia.worker.cluster import short_temp_dir

REPO = Path(__file__).resolve().parents[2]


def _cli(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hypermedia.cli", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _ray_processes(data: Path) -> list[int]:
    marker = str(short_temp_dir(data / "ray", "head"))
    return [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if marker in " ".join(p.info["cmdline"] or [])
    ]


def test_up_submit_down(tmp_path):
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYPERMEDIA_", "RAY_"))}
    env["HYPERMEDIA_DATA_DIR"] = str(data)
    try:
        up = _cli(env, "up")
        assert up.returncode == 0, up.stderr + (data / "head.log").read_text()[-3000:]
        api_url = (data / "head.url").read_text()
        assert api_url in up.stdout
        assert _ray_processes(data)
        again = _cli(env, "up")
        assert again.returncode == 0
        assert "already up" in again.stdout

        key = _cli(env, "user", "add", "alice", "--credits", "100").stdout.strip()
        assert key.startswith("hm_")
        client_env = {**env, "HYPERMEDIA_API_URL": api_url, "HYPERMEDIA_API_KEY": key}
        submitted = _cli(
            client_env,
            "submit",
            str(REPO / "examples" / "banner.webp"),
            "--op",
            "thumbnail",
            "--wait",
            "--wait-timeout",
            "120",
        )
        assert submitted.returncode == 0, submitted.stderr
        assert "completed" in submitted.stdout
    finally:
        down = _cli(env, "down")
    assert down.returncode == 0, down.stderr
    assert "down" in down.stdout
    assert _ray_processes(data) == []
    assert find_running(data / "redis") is None
    assert _cli(env, "down").stdout.strip() == "not running"
