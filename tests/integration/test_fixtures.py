"""The fixtures themselves: fresh databases per test, Redis keys cleaned up, settings wired."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest
import redis
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import NullPool

from hypermedia import tls
from hypermedia.db import migrate
from hypermedia.embedded import free_port
from hypermedia.worker import cluster
from tests import conftest, metrics_support, sandbox_leaks, support
from tests.integration.test_sandbox_executor import alive, wait_until

REPO = Path(__file__).resolve().parents[2]


def _insert_pool(engine, pool_id: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO pools (pool_id, name, created_at) VALUES (:id, 'n', CURRENT_TIMESTAMP)"
            ),
            {"id": pool_id},
        )


def _count_pools(engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM pools")).scalar_one())


# The two tests below run in file order: the second sees nothing of the first's row.
def test_engine_is_migrated_and_writable(engine):
    assert migrate.current_revision(engine) == migrate.head_revision()
    assert "job_outputs" in inspect(engine).get_table_names()
    _insert_pool(engine, "p1")
    assert _count_pools(engine) == 1


def test_engine_is_fresh_for_every_test(engine):
    assert _count_pools(engine) == 0


def test_pg_template_is_closed_to_connections(pg_url):
    probe = create_engine(pg_url, poolclass=NullPool)
    try:
        with pytest.raises(OperationalError, match="not currently accepting connections"):
            probe.connect()
    finally:
        probe.dispose()


def test_pg_database_is_dropped_after_the_test(pg_server, pg_url):
    name = support.unique_name()
    pg_server.create_database(name, template=support.database_name(pg_url))
    assert pg_server.database_exists(name)
    pg_server.drop_database(name)
    assert not pg_server.database_exists(name)


def test_a_clone_is_reset_for_the_next_test_only_if_it_changed_no_more_than_rows(pg_server, pg_url):
    """pg_database_url empties a test's clone for the next test of the process: rows
    gone, sequences restarted, as cloned. A clone whose schema a test changed, or that
    a connection still holds, is refused (and dropped)."""
    template = support.database_name(pg_url)
    names = [support.unique_name() for _ in range(3)]
    engines = []
    try:
        for name in names:
            pg_server.create_database(name, template=template)
            engines.append(create_engine(pg_server.database_url(name), poolclass=NullPool))
        first, changed, held = engines
        fingerprint = pg_server.fingerprint(names[0])
        with first.connect() as conn:
            sequence = conn.execute(text("SELECT sequencename FROM pg_sequences")).scalars().first()
        assert sequence is not None
        for engine in engines:
            _insert_pool(engine, "p1")
            with engine.begin() as conn:
                for _ in range(3):
                    conn.execute(text(f"SELECT nextval('{sequence}')"))
        with changed.begin() as conn:
            conn.execute(text("ALTER TABLE pools ADD COLUMN extra integer"))

        assert pg_server.reset(names[0], fingerprint)
        assert _count_pools(first) == 0
        with first.begin() as conn:
            assert conn.execute(text(f"SELECT nextval('{sequence}')")).scalar_one() == 1
        assert migrate.current_revision(first) == migrate.head_revision()
        assert pg_server.fingerprint(names[0]) == fingerprint

        assert not pg_server.reset(names[1], fingerprint)  # its schema changed
        assert _count_pools(changed) == 1  # left as it was, to be dropped
        with held.connect() as open_conn:  # a connection a test left open
            assert not pg_server.reset(names[2], fingerprint)
            open_conn.execute(text("SELECT 1"))
        assert _count_pools(held) == 1
    finally:
        for engine in engines:
            engine.dispose()
        for name in names:
            pg_server.drop_database(name)


def test_delete_keys_touches_only_the_prefix(redis_client, redis_prefix):
    neighbour = support.unique_redis_prefix()
    try:
        for i in range(1200):  # more than one SCAN page and one UNLINK batch
            redis_client.set(f"{redis_prefix}:k:{i}", i)
        redis_client.set(f"{neighbour}:k", 1)
        assert support.delete_keys(redis_client, redis_prefix) == 1200
        assert list(redis_client.scan_iter(match=f"{redis_prefix}*")) == []
        assert redis_client.get(f"{neighbour}:k") == "1"
    finally:
        support.delete_keys(redis_client, neighbour)


@pytest.mark.parametrize("prefix", ["", "*", "hm?", "a[b]"])
def test_delete_keys_refuses_wildcard_prefixes(redis_client, prefix):
    with pytest.raises(ValueError, match="refusing"):
        support.delete_keys(redis_client, prefix)


def test_settings_point_at_the_test_services(engine, settings, redis_url, redis_prefix, tmp_path):
    built = settings()
    assert built.database_url == support.url_string(engine)
    assert built.redis_url == redis_url
    assert built.redis_prefix == redis_prefix
    assert built.data_dir == tmp_path


def test_settings_default_to_a_fresh_sqlite_file(settings, tmp_path):
    built = settings()
    assert built.database_url == f"sqlite:///{tmp_path / 'hypermedia.db'}"
    assert built.database_url == built.effective_database_url


def test_settings_overrides_win(settings, private_redis):
    built = settings(redis_url=private_redis.url, api_port=9999)
    assert built.redis_url == private_redis.url
    assert built.api_port == 9999


def test_private_redis_is_separate_from_the_shared_one(private_redis, redis_client, redis_prefix):
    redis_client.set(f"{redis_prefix}:shared", 1)
    own = redis.Redis.from_url(private_redis.url)
    try:
        own.set("k", 1)
        own.flushall()
        assert own.dbsize() == 0
    finally:
        own.close()
    assert redis_client.get(f"{redis_prefix}:shared") == "1"


def test_environment_is_isolated():
    assert not [
        name
        for name in os.environ
        if name.startswith("HYPERMEDIA_") and not name.startswith("HYPERMEDIA_TEST_")
    ]


def test_tier_marker_is_added(request):
    assert request.node.get_closest_marker("integration") is not None


def test_a_private_postgres_whose_port_was_taken_starts_on_another():
    """Its first start moves on when another process took its port pick meanwhile (a
    parallel run's race between free_port() and the server's bind)."""
    server = support.PrivatePostgres()
    taken = socket.socket()
    try:
        taken.bind(("127.0.0.1", server.port))
        taken.listen()
        first = server.port
        server.start()
        assert server.port != first
        assert "could not bind" in (server.base / "server.log").read_text()
        assert server.create_migrated().endswith(f":{server.port}/hypermedia")
    finally:
        taken.close()
        server.close()


def test_a_private_postgres_is_a_migrated_copy_of_its_own(
    private_postgres, private_postgres_template
):
    """``private_postgres`` copies a data directory made once a process: its database
    is at the migrations' head, what a test writes stays in its copy (a second copy
    has none of it), and it survives an immediate stop (recovery from the copy's WAL)."""
    from hypermedia.db.engine import make_engine, transaction

    engine = make_engine(private_postgres.url)
    try:
        assert migrate.schema_problem(engine) is None
        assert migrate.current_revision(engine) == migrate.head_revision()
        with transaction(engine) as conn:
            conn.execute(text("CREATE TABLE written_here (n int)"))
            conn.execute(text("INSERT INTO written_here VALUES (1)"))
    finally:
        engine.dispose()
    private_postgres.stop()  # immediate: as a crash would
    private_postgres.start()
    engine = make_engine(private_postgres.url)
    try:
        with transaction(engine) as conn:
            assert conn.execute(text("SELECT n FROM written_here")).scalar_one() == 1
    finally:
        engine.dispose()
    other = support.PrivatePostgres(template=private_postgres_template)
    try:
        other.start()
        engine = make_engine(other.create_migrated())
        try:
            assert "written_here" not in inspect(engine).get_table_names()
            assert migrate.current_revision(engine) == migrate.head_revision()
        finally:
            engine.dispose()
    finally:
        other.close()


def test_a_prometheus_whose_port_was_taken_starts_on_another(tmp_path, monkeypatch):
    """The helper's Prometheus starts again on another port when its pick was taken
    before it bound it."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    picks = iter([taken.getsockname()[1]])
    monkeypatch.setattr(metrics_support, "free_port", lambda: next(picks, None) or free_port())
    config = tmp_path / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 15s\n")
    try:
        with metrics_support.prometheus(config) as url:
            assert not url.endswith(f":{taken.getsockname()[1]}")
            assert (
                httpx.get(f"{url}/-/ready", timeout=10, verify=tls.client_context()).status_code
                == 200
            )
    finally:
        taken.close()


def test_databases_a_killed_run_left_are_dropped(pg_server):
    """A test database whose process is gone (a run killed before its teardown) is
    dropped when the next session starts; one of a live process is kept."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    left = f"{support.NAME_PREFIX}_db_{gone.pid}_{uuid.uuid4().hex[:8]}"
    live = support.unique_name()
    pg_server.create_database(left)
    pg_server.create_database(live)
    try:
        dropped = pg_server.drop_leftovers()
        assert left in dropped and live not in dropped
        with pg_server._admin.connect() as conn:
            names = set(conn.execute(text("SELECT datname FROM pg_database")).scalars())
        assert left not in names and live in names
    finally:
        pg_server.drop_database(left)
        pg_server.drop_database(live)


def _stand_in_head(directory) -> subprocess.Popen[bytes]:
    """A process that names the head's temp dir of ``directory`` on its command line,
    as a shared head's GCS and raylet do (what RayNode finds them by)."""
    marker = str(cluster.short_temp_dir(directory, "head"))
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", marker])


def test_ray_heads_a_killed_run_left_are_stopped(tmp_path):
    """The shared Ray head of a session whose first process is gone (a run killed
    before its end) is stopped and its directory removed when the next session starts;
    a live session's head, and a directory naming no owner, are left alone."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    left, live, unowned = (tmp_path / f"{conftest.SHARED_RAY_DIR_PREFIX}{n}" for n in "abc")
    for directory, owner in ((left, gone.pid), (live, os.getpid()), (unowned, None)):
        directory.mkdir()
        if owner is not None:
            (directory / conftest.SHARED_RAY_OWNER).write_text(str(owner))
    heads = {d: _stand_in_head(d) for d in (left, live, unowned)}
    sessions = {d: cluster.short_temp_dir(d, "head") / "session_latest" for d in heads}
    for session in sessions.values():
        session.mkdir(parents=True)
    try:
        assert conftest.stop_leftover_heads(tmp_path) == [left]
        assert heads[left].wait(timeout=30) is not None
        assert not left.exists() and not sessions[left].parent.exists()
        assert sessions[live].is_dir() and sessions[unowned].is_dir()
        assert heads[live].poll() is None and heads[unowned].poll() is None
        assert live.is_dir() and unowned.is_dir()
    finally:
        for head in heads.values():
            head.kill()
            head.wait()
        for session in sessions.values():
            shutil.rmtree(session.parent.parent, ignore_errors=True)


_STOPPED_INIT_SERVER = """
import os, signal, sys
from hypermedia.sandbox.tinyinit import TinyInits

tiny = TinyInits.for_this_machine()
# Stopped before it runs (it waits behind this process on one CPU): alive, with no
# PDEATHSIG to end it.
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
init = tiny.clone()
os.kill(init, signal.SIGSTOP)
print(init, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _left_tiny_init(root) -> int:
    """A tiny init whose server was killed, kept stopped (so alive, as one that missed
    its server's death would be): its command line is its server's, a fork server's
    of a work root under ``root``."""
    config = json.dumps({"work_root": f"{root}/work"})
    said = root / "said"
    with said.open("w") as out:  # a file, not a pipe: the stopped init holds it open
        subprocess.run(
            [sys.executable, "-c", _STOPPED_INIT_SERVER, "hypermedia.sandbox.forkserver", config],
            stdout=out,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            timeout=60,
            check=False,
        )
    return int(said.read_text().split()[0])


def test_the_session_end_names_and_kills_only_its_own_leaked_sandbox_processes(tmp_path):
    """The session's end check (tests/sandbox_leaks.py): a tiny init whose server died
    under this session's base directory is named and killed; a sandbox server of
    another session's (a directory whose name only begins like this one's) is left."""
    mine = _left_tiny_init(tmp_path)
    other_root = tmp_path.parent / f"{tmp_path.name}-other"
    config = json.dumps({"work_root": f"{other_root}/work"})
    theirs = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; time.sleep(60)",
            "hypermedia.ingest.inspection",
            config,
        ]
    )
    try:
        assert wait_until(lambda: _cmdline(theirs.pid).endswith(config.encode()), 10)
        leaked = sandbox_leaks.leaked_sandbox_processes(tmp_path, grace=0.5)
        assert [(found.pid, found.what) for found in leaked] == [(mine, "a PID namespace's init")]
        assert wait_until(lambda: not alive(mine), 5)
        assert theirs.poll() is None
        assert sandbox_leaks.leaked_sandbox_processes(tmp_path, grace=0) == []
    finally:
        with contextlib.suppress(OSError):
            os.kill(mine, signal.SIGKILL)
        theirs.kill()
        theirs.wait()


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().rstrip(b"\0")
    except OSError:
        return b""
