"""The SQLite record's WAL file once a long read has ended.

A read transaction holds SQLite's checkpoints back to its snapshot, so the WAL grows
while it lasts (an operator's backup or ``sqlite3`` shell beside a busy stack: 5 MB to
124 MB in 30 s). Once it ends and a checkpoint has copied the WAL back, the file is cut
to :data:`~hypermedia.db.engine.SQLITE_WAL_KEEP_BYTES`, not kept at its largest for
good. The reader is another OS process reading through the project's engine.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import text

from hypermedia.db.engine import SQLITE_WAL_KEEP_BYTES, make_engine, transaction

MiB = 1024 * 1024

_READER = """
import sys
from sqlalchemy import text
from hypermedia.db.engine import make_engine, snapshot
with snapshot(make_engine(sys.argv[1])) as conn:
    conn.execute(text("select count(*) from t")).scalar_one()
    print("reading", flush=True)
    sys.stdin.readline()
"""


def test_the_wal_is_cut_back_once_a_long_read_has_ended(tmp_path: Path) -> None:
    record = tmp_path / "record.db"
    wal = Path(f"{record}-wal")
    url = f"sqlite:///{record}"
    engine = make_engine(url)
    try:
        with transaction(engine) as conn:
            conn.execute(text("create table t (n integer primary key, b blob)"))
        reader = subprocess.Popen(
            [sys.executable, "-c", _READER, url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert reader.stdout is not None and reader.stdout.readline() == "reading\n"
            for _ in range(SQLITE_WAL_KEEP_BYTES // MiB + 8):
                with transaction(engine) as conn:
                    conn.execute(text("insert into t (b) values (randomblob(1048576))"))
            grown = wal.stat().st_size
            assert grown > SQLITE_WAL_KEEP_BYTES  # held back by the reader
        finally:
            assert reader.stdin is not None
            reader.stdin.close()
            assert reader.wait(20) == 0
        deadline = time.monotonic() + 10
        n = 0
        while wal.stat().st_size > SQLITE_WAL_KEEP_BYTES:
            assert time.monotonic() < deadline, (grown, wal.stat().st_size)
            n += 1
            with transaction(engine) as conn:  # a commit checkpoints; the next one cuts
                conn.execute(text("delete from t where n = :n"), {"n": n})
        assert n <= 3
    finally:
        engine.dispose()
