"""The worker logs ``hypermedia run`` keeps of a run that went wrong
(:mod:`hypermedia.runlogs`): private, redacted, bounded per file and per run, the
oldest runs removed."""

from __future__ import annotations

import stat
from pathlib import Path

from hypermedia import runlogs

MARKERS = ":job_id:01000000\n:actor_name:PipelineService\n"


def _session(tmp_path: Path) -> Path:
    logs = tmp_path / "session_latest" / "logs"
    logs.mkdir(parents=True)
    return logs


def test_the_workers_logs_are_kept_private_and_redacted(tmp_path):
    source = _session(tmp_path)
    said = MARKERS + (
        "job 1 attempt 1 failed: internal\nTraceback (most recent call last):\n"
        "  url https://s3.example/b/k?X-Amz-Signature=0123abcd&x=1 sig=plain\n"
    )
    (source / "worker-a-01-11.err").write_text(said)
    (source / "worker-a-01-11.out").write_text(MARKERS)  # Ray's lines alone: not kept
    (source / "worker-b-01-12.err").write_text("")  # empty: not kept
    (source / "raylet.out").write_text("not a worker's")
    (source / "python-core-worker-a.log").write_text("Ray's own")
    dest = runlogs.run_logs_dir(tmp_path / "data", now=0)
    assert dest == tmp_path / "data" / "logs" / "run-19700101-000000"

    kept = runlogs.keep(source, dest)

    assert kept == [dest / "worker-a-01-11.err"]
    text = kept[0].read_text()
    assert "Traceback" in text and "0123abcd" not in text
    assert "X-Amz-Signature=[redacted]&x=1" in text
    for path in (dest.parent, dest):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert stat.S_IMODE(kept[0].stat().st_mode) == 0o600


def test_nothing_said_keeps_nothing(tmp_path):
    source = _session(tmp_path)
    (source / "worker-a-01-11.out").write_text(MARKERS)
    dest = tmp_path / "data" / "logs" / "run-1"
    assert runlogs.keep(source, dest) == []
    assert not dest.parent.exists()


def test_each_file_keeps_its_last_whole_lines_within_its_share_of_the_run(tmp_path):
    source = _session(tmp_path)
    long = "".join(f"line {n} https://h/p?sig=secret{n}&a=b\n" for n in range(1000))
    (source / "worker-long-1.err").write_text(long)
    (source / "worker-small-1.err").write_text("a small one\n")
    (source / "worker-mid-1.err").write_text("m" * 300 + "\n")
    dest = tmp_path / "logs" / "run-1"

    kept = runlogs.keep(source, dest, max_file_bytes=500, max_run_bytes=900)

    # Three files: 300 bytes each at most (the run's 900), their last whole lines: the
    # middle one's one line is longer, none of it is kept.
    assert [p.name for p in kept] == ["worker-long-1.err", "worker-small-1.err"]
    tail = (dest / "worker-long-1.err").read_text()
    assert tail.endswith("line 999 https://h/p?sig=[redacted]&a=b\n")
    assert tail.startswith("line ") and len(tail) <= 300  # from a whole line on
    assert "secret" not in tail
    assert (dest / "worker-small-1.err").read_text() == "a small one\n"


def test_only_the_newest_runs_are_kept(tmp_path):
    source = _session(tmp_path)
    (source / "worker-a-1.err").write_text("said\n")
    root = tmp_path / "logs"
    for n in range(7):
        runlogs.keep(source, root / f"run-2026120{n}-000000", keep_runs=3)
    assert sorted(p.name for p in root.iterdir()) == [
        "run-20261204-000000",
        "run-20261205-000000",
        "run-20261206-000000",
    ]
