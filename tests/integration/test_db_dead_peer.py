"""A PostgreSQL server that goes silent, neither answering nor closing (a NAT's or a
firewall's table that dropped the connection, a partition, a host powered off), is
given up within ``database_dead_peer_seconds`` (TCP keepalives and TCP_USER_TIMEOUT on
every connection: :data:`hypermedia.db.engine.DEAD_PEER_SECONDS`), its statement failed
``DatabaseUnavailable`` as when the server is down. The kernel's defaults left a
statement sent to it waiting ~15 min and one awaiting its answer for ever. So is a
connection a server took and never answered (``connect_timeout``).

The silence is real: another process, in a network namespace of its own (the machine
runs the tests as root, as the sandbox's tests need), runs a private PostgreSQL on its
loopback and takes the loopback down: every packet between client and server is lost
and neither is told. A proxy in user space cannot stage it: its kernel would answer the
client's keepalives and acknowledge what it sends.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Any, cast

import psycopg
from sqlalchemy import Connection, text

from hypermedia.db.engine import make_engine, transaction
from hypermedia.errors import DatabaseUnavailable
from tests.api_support import REPO

DEAD_PEER_SECONDS = 3
WAIT_SECONDS = 12  # longer than the dead-peer time and its slack: old code still waits

_SCENE = """
import fcntl, json, socket, struct, sys, tempfile, threading, time
from hypermedia.sandbox.isolation import CLONE_NEWNET, unshare

unshare(CLONE_NEWNET)  # a loopback of this process's own, down


def loopback(up):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # SIOCGIFFLAGS, SIOCSIFFLAGS
        flags = struct.unpack("16sh22x", fcntl.ioctl(s, 0x8913, struct.pack("16sh22x", b"lo", 0)))
        flags = flags[1] | 1 if up else flags[1] & ~1  # IFF_UP
        fcntl.ioctl(s, 0x8914, struct.pack("16sh22x", b"lo", flags))


loopback(True)
from sqlalchemy import text
from hypermedia.cli.common import open_engine
from hypermedia.config import load_settings
from hypermedia.db.engine import transaction
from tests.support import PrivatePostgres

wait = float(sys.argv[1])
said = {}


def ask(name, query, silence_after=None):
    began = time.monotonic()
    silent_since = []

    def run():
        try:
            with transaction(engine) as conn:
                conn.execute(text(query))
            answer = "answered"
        except Exception as exc:
            answer = f"{type(exc).__name__}: {exc}"[:300]
        said[name] = [answer, round(time.monotonic() - silent_since[0], 1)]

    if silence_after is None:
        loopback(False)
        silent_since.append(time.monotonic())
    asking = threading.Thread(target=run, daemon=True)
    asking.start()
    if silence_after is not None:
        time.sleep(silence_after)
        loopback(False)
        silent_since.append(time.monotonic())
    asking.join(wait)
    said.setdefault(name, ["still waiting", round(time.monotonic() - silent_since[0], 1)])
    loopback(True)


server = PrivatePostgres()
try:
    server.start()
    settings = load_settings(database_url=server.create_migrated(), data_dir=tempfile.mkdtemp())
    engine = open_engine(settings)
    with transaction(engine) as conn:
        conn.execute(text("SELECT 1"))
    ask("sent", "SELECT 1")  # on the connection just used: sent into the silence
    ask("awaited", "SELECT pg_sleep(4)", silence_after=1.0)  # its answer never comes
    with transaction(engine) as conn:
        conn.execute(text("SELECT 1"))
    said["then"] = "answered"
finally:
    server.close()
print(json.dumps(said))
"""


def test_a_silent_server_fails_the_statement_within_the_dead_peer_time():
    environment = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HYPERMEDIA_DATABASE_DEAD_PEER_SECONDS": str(DEAD_PEER_SECONDS),
    }
    scene = subprocess.run(
        [sys.executable, "-c", _SCENE, str(WAIT_SECONDS)],
        capture_output=True,
        text=True,
        timeout=300,
        env=environment,
        check=False,
    )
    assert scene.returncode == 0, scene.stderr[-3000:]
    said = json.loads(scene.stdout.splitlines()[-1])
    # Old: ['still waiting', 12.0] for both (the kernel's ~15 min, and for ever).
    for name in ("sent", "awaited"):
        answer, after = said[name]
        assert answer.startswith("DatabaseUnavailable: database unreachable"), said
        assert after < DEAD_PEER_SECONDS + 3, said
    assert said["then"] == "answered", said  # the pool made new connections


def test_a_connection_the_server_never_answers_gives_up_within_the_dead_peer_time():
    """A server that took the connection and says nothing (its postmaster stopped or
    hung, a proxy whose server is gone): here a socket that listens and is never
    accepted from, whose kernel acknowledges the startup packet and answers the
    keepalives as a stopped postmaster's does. The connect gave up never (old: still
    waiting after 12 s; on a SIGSTOPped PostgreSQL after 40 s, whatever the dead-peer
    time); now it fails DatabaseUnavailable after the dead-peer time."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        engine = make_engine(
            f"postgresql+psycopg://postgres@127.0.0.1:{port}/none",
            dead_peer_seconds=DEAD_PEER_SECONDS,
        )
        said: list[Any] = []

        def connect() -> None:
            began = time.monotonic()
            try:
                with transaction(engine) as conn:
                    conn.execute(text("SELECT 1"))
                said.append("answered")
            except DatabaseUnavailable as exc:
                said.append(str(exc))
            said.append(round(time.monotonic() - began, 1))

        connecting = threading.Thread(target=connect, daemon=True)
        connecting.start()
        connecting.join(WAIT_SECONDS)
        engine.dispose()
    assert said, f"still waiting after {WAIT_SECONDS} s"
    answer, after = said
    assert "connection timeout expired" in answer, said
    assert DEAD_PEER_SECONDS - 0.5 < after < DEAD_PEER_SECONDS + 2, said


def test_every_connection_has_the_dead_peer_time_and_the_url_wins(pg_database_url):
    """What libpq was given, on a real connection: the default, and a value the
    database URL names left as named."""
    for url, expected in (
        (
            pg_database_url,
            {"keepalives_idle": "15", "tcp_user_timeout": "30000", "connect_timeout": "30"},
        ),
        (
            f"{pg_database_url}?keepalives_idle=60&connect_timeout=7",
            {"keepalives_idle": "60", "connect_timeout": "7"},
        ),
    ):
        engine = make_engine(url)
        try:
            with engine.connect() as conn:
                given = {
                    option.keyword.decode(): (option.val or b"").decode()
                    for option in _libpq_options(conn)
                }
        finally:
            engine.dispose()
        assert given["keepalives"] == "1"
        assert given["keepalives_interval"] == "5"
        assert given["keepalives_count"] == "3"
        assert expected.items() <= given.items(), given
    engine = make_engine(pg_database_url, dead_peer_seconds=0)  # off: libpq's defaults
    try:
        with engine.connect() as conn:
            options = _libpq_options(conn)
            unset = (b"tcp_user_timeout", b"connect_timeout")
            assert all(o.val is None for o in options if o.keyword in unset)
    finally:
        engine.dispose()


def _libpq_options(conn: Connection) -> list[Any]:
    dbapi = cast("psycopg.Connection[Any]", conn.connection.dbapi_connection)
    return list(dbapi.pgconn.info)
