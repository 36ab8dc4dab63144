"""The record behind PgBouncer: a real one (session pooling, its default settings) in
front of the tests' PostgreSQL.

hypermedia sends its statement limits (HYPERMEDIA_DATABASE_STATEMENT_SECONDS) in libpq's
startup parameter ``options``, which PgBouncer refuses: every connection failed, and
every command, `db upgrade` first, said "database_unavailable: database unreachable",
which no retry cures. The refusal is now a configuration error naming the setting and
the fix; with the setting at 0 (the limits given to the role instead) the record works
through the pooler.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, make_url, select
from typer.testing import CliRunner

from hypermedia.cli import app
from hypermedia.db import tables as t
from hypermedia.db.engine import POOLING_SETTING, STATEMENT_SETTING, make_engine, snapshot
from hypermedia.embedded import free_port
from hypermedia.errors import ConfigError
from tests import support
from tests.factories import make_object, make_user, open_stack, submit

PGBOUNCER = "pgbouncer"


@contextmanager
def pgbouncer(target: str, mode: str = "session", servers: int = 20) -> Iterator[str]:
    """A PgBouncer of the test's own on a free port of 127.0.0.1 (trust auth, ``mode``
    pooling, ``servers`` server connections at most) in front of ``target``'s database:
    the URL that goes through it."""
    binary = shutil.which(PGBOUNCER) or f"/usr/sbin/{PGBOUNCER}"
    assert Path(binary).is_file(), "pgbouncer is not installed (scripts/setup installs it)"
    url = make_url(target)
    base = Path(tempfile.mkdtemp(prefix="hmtest-pgbouncer-"))
    port = free_port()
    (base / "users.txt").write_text(f'"{url.username}" ""\n')
    (base / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"{url.database} = host={url.host} port={url.port or 5432} dbname={url.database}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {base}/users.txt\npool_mode = {mode}\n"
        f"default_pool_size = {servers}\n"
        f"logfile = {base}/pgbouncer.log\n"
    )
    user = "postgres" if os.geteuid() == 0 else None  # it refuses to run as root
    if user is not None:
        entry = pwd.getpwnam(user)
        for path in (base, *base.iterdir()):
            os.chown(path, entry.pw_uid, entry.pw_gid)
    process = subprocess.Popen(
        [binary, str(base / "pgbouncer.ini")],
        user=user,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            assert process.poll() is None, (base / "pgbouncer.log").read_text(errors="replace")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "pgbouncer did not listen within 20 s"
                time.sleep(0.05)
        yield url.set(host="127.0.0.1", port=port).render_as_string(hide_password=False)
    finally:
        process.terminate()
        process.wait(10)
        shutil.rmtree(base, ignore_errors=True)


def test_behind_pgbouncer_the_limits_refused_name_their_setting_and_at_0_the_record_works(
    pg_engine, settings, manual_clock, tmp_path
):
    runner = CliRunner()
    with pgbouncer(support.url_string(pg_engine)) as through:
        env = {"HYPERMEDIA_DATABASE_URL": through, "HYPERMEDIA_DATA_DIR": str(tmp_path)}
        engine = make_engine(through)
        try:
            # Old: DatabaseUnavailable("database unreachable: ... FATAL: unsupported
            # startup parameter: options"), the API's 503 for ever.
            with pytest.raises(ConfigError) as refused, snapshot(engine) as conn:
                conn.exec_driver_sql("SELECT 1")
        finally:
            engine.dispose()
        assert refused.value.key == STATEMENT_SETTING
        assert "HYPERMEDIA_DATABASE_STATEMENT_SECONDS=0" in str(refused.value)
        assert "ALTER ROLE" in str(refused.value)
        said = runner.invoke(app, ["db", "upgrade"], env=env)
        assert said.exit_code != 0, said.output
        assert isinstance(said.exception, ConfigError), repr(said.exception)
        assert said.exception.key == STATEMENT_SETTING

        said = runner.invoke(
            app, ["db", "upgrade"], env={**env, "HYPERMEDIA_DATABASE_STATEMENT_SECONDS": "0"}
        )
        assert said.exit_code == 0, f"{said.output}{said.exception!r}"
        assert "at revision" in said.output, said.output
        engine = make_engine(through, statement_seconds=0)
        stack = open_stack(settings, engine, manual_clock)
        try:
            person = make_user(stack)
            made = [make_object(stack, person) for _ in range(3)]
            with snapshot(engine) as conn:
                kept = conn.execute(
                    select(func.count())
                    .select_from(t.objects)
                    .where(t.objects.c.object_id.in_(made))
                ).scalar_one()
        finally:
            stack.close()
            engine.dispose()
    assert kept == 3


def test_behind_a_transaction_pooler_nothing_is_prepared_and_migrations_refuse(
    pg_engine, pg_server, settings, manual_clock, tmp_path
):
    """Through PgBouncer's transaction pooling each transaction gets whichever server
    connection is free, and psycopg prepares a statement on the server once a connection
    has run it 5 times, under a name of the connection's (_pg3_0, ...): the next
    transaction's server connection lacked it or had another client's under that name
    (DuplicatePreparedStatement, InvalidSqlStatementName), and `db upgrade` would take
    its session lock on a server connection lent on to others. With database_pooling
    "transaction" nothing is prepared or SET for a session, and a record that needs
    migrating is refused at once, naming the setting and the way round the pooler."""
    runner = CliRunner()
    empty = support.unique_name("pooled")
    empty_url = pg_server.create_database(empty)
    try:
        with pgbouncer(empty_url, "transaction") as through:
            said = runner.invoke(
                app,
                ["db", "upgrade"],
                env={
                    "HYPERMEDIA_DATABASE_URL": through,
                    "HYPERMEDIA_DATA_DIR": str(tmp_path),
                    "HYPERMEDIA_DATABASE_STATEMENT_SECONDS": "0",
                    "HYPERMEDIA_DATABASE_POOLING": "transaction",
                },
            )
        assert said.exit_code != 0, said.output
        assert isinstance(said.exception, ConfigError), repr(said.exception)
        assert said.exception.key == POOLING_SETTING
        assert "past the pooler" in str(said.exception), str(said.exception)
        direct = make_engine(empty_url)
        try:
            with snapshot(direct) as conn:
                tables = conn.exec_driver_sql(
                    "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
                ).scalar_one()
        finally:
            direct.dispose()
        assert tables == 0  # nothing was migrated through it
    finally:
        pg_server.drop_database(empty)

    # Two server connections for up to 10 of the engine's: each transaction lands on
    # either, whichever connection of the pool runs it.
    with pgbouncer(support.url_string(pg_engine), "transaction", servers=2) as through:
        engine = make_engine(through, statement_seconds=0, pooling="transaction", custom_plans=True)
        stack = open_stack(
            settings,
            engine,
            manual_clock,
            database_pooling="transaction",
            database_statement_seconds=0,
        )
        try:
            people = [make_user(stack) for _ in range(3)]

            def submit_some(person: Any) -> list[str]:
                return [job for _ in range(8) for job in submit(stack, person, ["thumbnail"])]

            with ThreadPoolExecutor(6) as pool:
                submitted = [job for jobs in pool.map(submit_some, people * 2) for job in jobs]
            done = 0
            while claimed := stack.dispatcher.claim_and_start("images", "w", count=4):
                done += sum(
                    stack.dispatcher.complete(job, "w", actual_millicredits=1) for job in claimed
                )
            with snapshot(engine) as conn:
                statuses: dict[str, int] = dict(
                    conn.execute(
                        select(t.jobs.c.status, func.count()).group_by(t.jobs.c.status)
                    ).all()
                )
        finally:
            stack.close()
            engine.dispose()
    assert len(submitted) == 48 and done == 48
    assert statuses == {"completed": 48}
