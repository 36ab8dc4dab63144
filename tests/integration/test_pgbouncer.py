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
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import func, make_url, select
from typer.testing import CliRunner

from hypermedia.cli import app
from hypermedia.db import tables as t
from hypermedia.db.engine import STATEMENT_SETTING, make_engine, snapshot
from hypermedia.embedded import free_port
from hypermedia.errors import ConfigError
from tests import support
from tests.factories import make_object, make_user, open_stack

PGBOUNCER = "pgbouncer"


@contextmanager
def pgbouncer(target: str) -> Iterator[str]:
    """A PgBouncer of the test's own on a free port of 127.0.0.1 (trust auth, session
    pooling) in front of ``target``'s database: the URL that goes through it."""
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
        f"auth_type = trust\nauth_file = {base}/users.txt\npool_mode = session\n"
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
