"""EmbeddedRedis: a real redis-server started, killed, restarted and reused."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import redis

from hypermedia.embedded import (
    EmbeddedRedis,
    ensure_running,
    find_running,
    free_port,
    ping,
    server_pid,
)
from hypermedia.errors import ConfigError, QueueUnavailable

REPO = Path(__file__).resolve().parents[2]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still "exists"; only count it as alive if it is not one.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_dead(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture
def server_dir(tmp_path):
    """A directory for a server; whatever still runs from it is stopped afterwards."""
    directory = tmp_path / "redis"
    yield directory
    running = find_running(directory)
    if running is not None:
        running.stop()
    # Belt and braces: a redis-server still running from this directory is killed.
    for pid in redis_servers_in(directory):
        os.kill(pid, signal.SIGKILL)


def redis_servers_in(directory: Path) -> list[int]:
    """Pids of redis-server processes whose working directory is ``directory``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if proc.joinpath("comm").read_text().strip() != "redis-server":
                continue
            if proc.joinpath("cwd").resolve() == directory.resolve():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_start_ping_stop(server_dir):
    server = EmbeddedRedis(server_dir)
    server.start()
    try:
        assert server.port is not None
        assert server.url == f"redis://:{server.password}@127.0.0.1:{server.port}/0"
        assert server.is_running()
        assert ping(server.port, server.password)
        assert server.pid is not None
        assert server_pid(server.port, server.password) == server.pid
        assert int(server.pidfile.read_text()) == server.pid
        assert int(server.portfile.read_text()) == server.port
        client = redis.Redis.from_url(server.url, decode_responses=True)
        assert client.ping()
        assert client.config_get("save") == {"save": ""}
        assert client.config_get("appendonly") == {"appendonly": "no"}
        assert client.config_get("bind") == {"bind": "127.0.0.1"}
        client.close()
    finally:
        pid = server.pid
        server.stop()
    assert pid is not None
    assert wait_dead(pid)
    assert not ping(server.port)
    assert not server.pidfile.exists()
    assert not server.is_running()


def test_context_manager(server_dir):
    with EmbeddedRedis(server_dir) as server:
        pid = server.pid
        assert server.is_running()
    assert pid is not None
    assert wait_dead(pid)


def test_start_twice_is_a_no_op(server_dir):
    with EmbeddedRedis(server_dir) as server:
        pid = server.pid
        server.start()
        assert server.pid == pid


def test_stop_before_start_and_twice(server_dir):
    server = EmbeddedRedis(server_dir)
    server.stop()
    server.kill()
    server.start()
    server.stop()
    server.stop()


def test_url_before_start_is_an_error(server_dir):
    with pytest.raises(RuntimeError, match="start"):
        _ = EmbeddedRedis(server_dir).url


def test_kill_restart_on_the_same_port_loses_everything(server_dir):
    with EmbeddedRedis(server_dir) as server:
        port, pid = server.port, server.pid
        client = redis.Redis.from_url(server.url)
        client.set("job", "1")
        server.kill()
        assert pid is not None
        assert wait_dead(pid)
        assert not server.is_running()
        assert not ping(port)  # type: ignore[arg-type]
        with pytest.raises(redis.ConnectionError):
            client.get("job")
        server.restart()
        assert server.port == port
        assert server.pid != pid
        assert server.is_running()
        assert client.get("job") is None  # nothing persisted: no RDB, no AOF
        client.close()
    assert not list(server_dir.glob("*.rdb"))
    assert not list(server_dir.glob("appendonly*"))


def test_restart_a_running_server(server_dir):
    with EmbeddedRedis(server_dir) as server:
        port, pid = server.port, server.pid
        server.restart()
        assert server.port == port
        assert server.pid != pid
        assert pid is not None
        assert wait_dead(pid)
        assert server.is_running()


def test_explicit_port(server_dir):
    port = free_port()
    with EmbeddedRedis(server_dir, port=port) as server:
        assert server.url == f"redis://:{server.password}@127.0.0.1:{port}/0"
        assert ping(port, server.password)


def test_explicit_port_already_taken_names_the_log(tmp_path, server_dir):
    with EmbeddedRedis(tmp_path / "first") as first:
        second = EmbeddedRedis(server_dir, port=first.port)
        with pytest.raises(QueueUnavailable) as info:
            second.start()
        assert str(second.logfile) in info.value.message
        assert info.value.details["log_file"] == str(second.logfile)
        assert "Address already in use" in info.value.message
        assert first.is_running()  # the other server is untouched


def test_two_servers_side_by_side(tmp_path):
    with EmbeddedRedis(tmp_path / "a") as a, EmbeddedRedis(tmp_path / "b") as b:
        assert a.port != b.port
        ra, rb = redis.Redis.from_url(a.url), redis.Redis.from_url(b.url)
        ra.set("k", "a")
        assert rb.get("k") is None
        rb.flushall()
        assert ra.get("k") == b"a"
        ra.close()
        rb.close()


def test_private_redis_fixture(private_redis):
    client = redis.Redis.from_url(private_redis.url)
    client.set("k", "v")
    client.flushall()
    assert client.dbsize() == 0
    client.close()


# -- failures, with fake redis-server binaries ----------------------------------------


def fake_redis_server(bin_dir: Path, script: str) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / "redis-server"
    path.write_text("#!/bin/sh\n" + textwrap.dedent(script))
    path.chmod(0o755)


def test_missing_redis_server_is_a_config_error(monkeypatch, tmp_path, server_dir):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(ConfigError) as info:
        EmbeddedRedis(server_dir).start()
    assert info.value.key == "redis_url (HYPERMEDIA_REDIS_URL)"
    assert info.value.message == (
        "redis_url (HYPERMEDIA_REDIS_URL): no Redis configured and redis-server is not "
        "installed: apt-get install redis-server or set HYPERMEDIA_REDIS_URL"
    )
    with pytest.raises(ConfigError):
        ensure_running(server_dir)


def test_server_that_exits_at_once_names_the_log(monkeypatch, tmp_path, server_dir):
    fake_redis_server(tmp_path / "bin", "echo 'FATAL CONFIG FILE ERROR: nonsense' >&2\nexit 1\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    server = EmbeddedRedis(server_dir, port=free_port())
    with pytest.raises(QueueUnavailable) as info:
        server.start()
    message = info.value.message
    assert "exited with status 1" in message
    assert str(server.logfile) in message
    assert "FATAL CONFIG FILE ERROR" in message


def test_server_that_never_answers_times_out_naming_the_log(monkeypatch, tmp_path, server_dir):
    fake_redis_server(tmp_path / "bin", "echo started; exec sleep 30\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    server = EmbeddedRedis(server_dir, port=free_port(), start_timeout=0.5)
    started = time.monotonic()
    with pytest.raises(QueueUnavailable) as info:
        server.start()
    assert time.monotonic() - started < 5
    assert "did not answer PING" in info.value.message
    assert "within 0.5s" in info.value.message
    assert str(server.logfile) in info.value.message
    assert server.pid is None or not alive(server.pid)  # the hung child was reaped


def test_arguments_are_a_list_not_a_shell_string(tmp_path):
    # A directory name full of shell syntax must reach redis-server verbatim.
    odd = tmp_path / "dir with spaces; $(touch pwned) 'quotes'"
    with EmbeddedRedis(odd) as server:
        assert server.is_running()
        client = redis.Redis.from_url(server.url, decode_responses=True)
        assert client.config_get("dir") == {"dir": str(odd)}
        client.close()
    assert not (Path.cwd() / "pwned").exists()
    assert not (tmp_path / "pwned").exists()


# -- ensure_running -------------------------------------------------------------------


def test_ensure_running_starts_then_reuses(server_dir):
    url = ensure_running(server_dir)
    running = find_running(server_dir)
    assert running is not None
    assert running.url == url
    pid = running.pid
    assert pid is not None
    assert ping(running.port, running.password)  # type: ignore[arg-type]
    # its own session: a Ctrl-C in the terminal that started it does not reach it
    assert os.getsid(pid) == pid != os.getsid(0)
    assert ensure_running(server_dir) == url
    again = find_running(server_dir)
    assert again is not None
    assert again.pid == pid


def test_a_server_whose_redis_conf_was_replaced_is_still_stopped_and_started_anew(server_dir):
    """Its redis.conf replaced under it (restored from a backup, made again), the
    server took no password of the directory's: `down` (find_running, stop) left it
    running, and the next start began a second server beside it."""
    ensure_running(server_dir)
    first = find_running(server_dir)
    assert first is not None and first.pid is not None
    old_pid = first.pid
    conf = server_dir / "redis.conf"
    conf.write_text(conf.read_text().replace("requirepass ", "requirepass other-"))
    url = ensure_running(server_dir)  # the stray one stopped, one server taking it
    assert wait_dead(old_pid)
    client = redis.Redis.from_url(url)
    assert client.ping()
    client.close()
    assert len(redis_servers_in(server_dir)) == 1
    conf.write_text(conf.read_text().replace("requirepass ", "requirepass again-"))
    running = find_running(server_dir)  # what `down` does
    assert running is not None
    pid = running.pid
    assert pid is not None
    running.stop()
    assert wait_dead(pid)
    assert redis_servers_in(server_dir) == []


def test_ensure_running_outlives_the_process_that_started_it(server_dir):
    code = (
        "import sys; from pathlib import Path; from hypermedia.embedded import ensure_running; "
        "print(ensure_running(Path(sys.argv[1])))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(server_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    url = result.stdout.strip()
    assert url.startswith("redis://:")
    client = redis.Redis.from_url(url)
    assert client.ping()
    client.close()
    assert ensure_running(server_dir) == url


def test_ensure_running_from_many_processes_starts_one_server(server_dir):
    code = (
        "import sys; from pathlib import Path; from hypermedia.embedded import ensure_running; "
        "print(ensure_running(Path(sys.argv[1])))"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(server_dir)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    urls = {proc.communicate(timeout=60)[0].strip() for proc in procs}
    assert all(proc.returncode == 0 for proc in procs)
    assert len(urls) == 1
    assert len(redis_servers_in(server_dir)) == 1


def test_ensure_running_after_a_crash_starts_again_on_the_same_port(server_dir):
    url = ensure_running(server_dir)
    first = find_running(server_dir)
    assert first is not None
    first_pid = first.pid
    first.kill()
    assert first_pid is not None
    assert wait_dead(first_pid)
    assert find_running(server_dir) is None
    assert ensure_running(server_dir) == url  # same port: URLs handed out stay valid
    second = find_running(server_dir)
    assert second is not None
    assert second.pid != first_pid


def test_ensure_running_ignores_a_stale_pidfile(server_dir):
    server_dir.mkdir(parents=True)
    (server_dir / "redis.pid").write_text("999999\n")
    (server_dir / "redis.port").write_text(f"{free_port()}\n")
    url = ensure_running(server_dir)
    running = find_running(server_dir)
    assert running is not None
    assert running.url == url
    assert running.pid != 999999


def test_ensure_running_does_not_adopt_someone_elses_redis(tmp_path, server_dir):
    # The port file names a port where another Redis (another pid) answers.
    with EmbeddedRedis(tmp_path / "other") as other:
        server_dir.mkdir(parents=True)
        (server_dir / "redis.port").write_text(f"{other.port}\n")
        (server_dir / "redis.pid").write_text(f"{os.getpid()}\n")
        url = ensure_running(server_dir)
        assert url != other.url
        assert other.is_running()


def test_stop_a_server_found_by_find_running(server_dir):
    ensure_running(server_dir)
    running = find_running(server_dir)
    assert running is not None
    pid = running.pid
    running.stop()
    assert pid is not None
    assert wait_dead(pid)
    assert find_running(server_dir) is None


# -- a private server -------------------------------------------------------------------


def test_the_server_wants_its_password_and_keeps_it_private(server_dir):
    """Any local user can reach a loopback port: without the password nothing is
    answered. The password is in a 0600 file, not on the command line."""
    with EmbeddedRedis(server_dir) as server:
        assert server.port is not None
        anonymous = redis.Redis(host="127.0.0.1", port=server.port)
        with pytest.raises(redis.AuthenticationError):
            anonymous.ping()
        with pytest.raises(redis.AuthenticationError):
            anonymous.keys("*")
        anonymous.close()
        wrong = redis.Redis(host="127.0.0.1", port=server.port, password="guess")
        with pytest.raises(redis.AuthenticationError):
            wrong.ping()
        wrong.close()
        assert not ping(server.port)
        client = redis.Redis.from_url(server.url)
        assert client.ping()
        client.close()
        assert len(server.password) >= 32
        assert server.pid is not None
        cmdline = Path(f"/proc/{server.pid}/cmdline").read_bytes()
        assert server.password.encode() not in cmdline
        assert stat.S_IMODE(server_dir.stat().st_mode) == 0o700
        files = sorted(p for p in server_dir.iterdir() if p.is_file())
        assert {p.name for p in files} >= {"redis.conf", "redis.pid", "redis.port", "redis.log"}
        for path in files:
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        first = server.password
    # The same password after a restart: URLs handed out stay valid.
    with EmbeddedRedis(server_dir) as again:
        assert again.password == first
