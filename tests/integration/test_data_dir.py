"""The embedded default's data dir is its owner's alone (issue 11, item 3)."""

from __future__ import annotations

import os
import stat

import pytest
import redis

from hypermedia.config import load_settings
from hypermedia.db.upgrade import migrate
from hypermedia.embedded import find_running
from hypermedia.stack import Stack


def _mode(path: os.PathLike[str]) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_record_and_the_queue_are_private(tmp_path):
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    settings = load_settings(data_dir=data)
    stack = Stack.open(settings, auto_migrate=True)
    try:
        stack.redis.set(f"{settings.redis_prefix}:probe", "1")
        port = int((data / "redis" / "redis.port").read_text())
        anonymous = redis.Redis(host="127.0.0.1", port=port)
        with pytest.raises(redis.AuthenticationError):
            anonymous.get(f"{settings.redis_prefix}:probe")
        anonymous.close()
        assert "requirepass " in (data / "redis" / "redis.conf").read_text()
    finally:
        stack.close()
        running = find_running(data / "redis")
        if running is not None:
            running.stop()
    assert _mode(data) == 0o700
    assert _mode(data / "redis") == 0o700
    files = [p for p in data.rglob("*") if p.is_file()]
    assert data / "hypermedia.db" in files
    assert data / "storage.secret" in files
    assert data / "redis" / "redis.conf" in files
    loose = {str(p.relative_to(data)): oct(_mode(p)) for p in files if _mode(p) != 0o600}
    assert loose == {}


def test_a_record_made_before_is_made_private(tmp_path):
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    (data / "hypermedia.db").touch(mode=0o644)
    settings = load_settings(data_dir=data)
    stack = Stack.open(settings, auto_migrate=True)
    stack.close()
    running = find_running(data / "redis")
    if running is not None:
        running.stop()
    assert _mode(data) == 0o700
    assert _mode(data / "hypermedia.db") == 0o600


def test_a_sqlite_record_named_by_the_url_is_private(tmp_path):
    """HYPERMEDIA_DATABASE_URL=sqlite:///elsewhere/hm.db is the same record (users, key
    hashes, objects, callback URLs, the credit ledger) outside the data dir: SQLite made
    it with the umask's mode, 0644 under the usual 022, readable by every user of the
    machine (measured: `hypermedia db upgrade` then `user add`, -rw-r--r--)."""
    elsewhere = tmp_path / "elsewhere"
    settings = load_settings(
        data_dir=tmp_path / "data", database_url=f"sqlite:///{elsewhere / 'hm.db'}"
    )
    old = os.umask(0o022)
    try:
        migrate(settings)
    finally:
        os.umask(old)
    files = [p for p in elsewhere.iterdir() if p.name.startswith("hm.db")]
    assert elsewhere / "hm.db" in files
    loose = {p.name: oct(_mode(p)) for p in files if _mode(p) & 0o077}
    assert loose == {}


def test_a_sqlite_record_named_by_the_url_that_others_may_read_is_said_so(tmp_path, caplog):
    """One made before keeps the mode its operator gave it (it may be shared on
    purpose), but a record others may read was kept without a word."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    record = elsewhere / "hm.db"
    record.touch(mode=0o644)
    os.chmod(record, 0o644)
    settings = load_settings(data_dir=tmp_path / "data", database_url=f"sqlite:///{record}")
    with caplog.at_level("WARNING", logger="hypermedia.db.upgrade"):
        migrate(settings)
    assert _mode(record) == 0o644
    said = [r.getMessage() for r in caplog.records if r.name == "hypermedia.db.upgrade"]
    assert said == [
        f"the SQLite record {record} may be read by others (mode 0644): chmod 600 {record}"
    ]
    caplog.clear()
    os.chmod(record, 0o600)
    with caplog.at_level("WARNING", logger="hypermedia.db.upgrade"):
        migrate(settings)
    assert [r for r in caplog.records if r.name == "hypermedia.db.upgrade"] == []
