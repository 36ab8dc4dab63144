"""The files a starting stack hands over (head.url, head.pid, Redis's config): a
reader that sees the file sees all of it, and no one else can read it."""

from __future__ import annotations

import stat
import threading
import time

from hypermedia.embedded import write_private


def test_a_reader_never_sees_the_file_empty_or_half_written(tmp_path):
    path = tmp_path / "head.url"
    text = "http://127.0.0.1:40353" * 200  # more than one write() of a small buffer
    seen: list[str] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            if path.exists():
                try:
                    seen.append(path.read_text())
                except FileNotFoundError:
                    continue

    reader = threading.Thread(target=read)
    reader.start()
    try:
        deadline = time.monotonic() + 20
        while len(seen) < 200 and time.monotonic() < deadline:
            path.unlink(missing_ok=True)
            write_private(path, text)
    finally:
        stop.set()
        reader.join()
    assert len(seen) >= 200 and set(seen) == {text}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["head.url"]  # no temp file left
