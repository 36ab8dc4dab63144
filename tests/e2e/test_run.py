"""`hypermedia run` on the embedded default, as a new user runs it: no database or
Redis configured, real corpus files, progress and a summary on the terminal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy import func, select

from hypermedia.db import tables as t
from hypermedia.db.engine import make_engine
from hypermedia.embedded import find_running
from hypermedia.queue.redis_queue import RedisQueue, connect

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO.parent / "shared" / "corpus"


def test_run_records_and_queues_real_files(tmp_path):
    data = tmp_path / "data"
    files = [
        CORPUS / "images" / "pillow-hopper.jpg",
        CORPUS / "images" / "pillow-hopper.png",
        CORPUS / "documents" / "pdfjs-tracemonkey.pdf",
    ]
    assert all(f.is_file() for f in files), "the corpus is expected at ../shared/corpus"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERMEDIA_")}
    env["HYPERMEDIA_DATA_DIR"] = str(data)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "hypermedia.cli", "run", *map(str, files)],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr
        assert "3/3" in result.stderr  # the progress bar reached the end
        assert "3 files stored, 4 jobs recorded and queued, 0 skipped" in " ".join(
            result.stderr.split()
        )

        engine = make_engine(f"sqlite:///{data / 'hypermedia.db'}")
        with engine.connect() as conn:
            by_op: dict[str, int] = dict(
                conn.execute(
                    select(t.jobs.c.operation, func.count())
                    .where(t.jobs.c.status == "queued")
                    .group_by(t.jobs.c.operation)
                ).all()
            )
            stored = conn.execute(select(t.objects.c.storage_key, t.objects.c.sha256)).all()
        engine.dispose()
        assert by_op == {"thumbnail": 2, "pdf_preview": 1, "extract_text": 1}
        assert len(stored) == 3
        assert all((data / "objects" / key).is_file() for key, _ in stored)

        server = find_running(data / "redis")
        assert server is not None, "the embedded Redis should keep running for the next command"
        queue = RedisQueue(connect(server.url), "hm", ["images", "documents"])
        assert len(queue.ready_ids("images")) == 2
        assert len(queue.ready_ids("documents")) == 2
        queue.client.close()

        again = subprocess.run(
            [sys.executable, "-m", "hypermedia.cli", "run", str(tmp_path / "missing.jpg")],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert again.returncode != 0
        assert "missing.jpg" in again.stderr
        assert "Traceback" not in again.stderr
    finally:
        server = find_running(data / "redis")
        if server is not None:
            server.stop()
