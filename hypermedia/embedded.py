"""A private Redis for the embedded stack and for tests.

:class:`EmbeddedRedis` runs ``redis-server`` from a directory it owns::

    <directory>/redis.conf   its password (``requirepass``), mode 0600
    <directory>/redis.pid    written by redis-server itself
    <directory>/redis.port   the TCP port, so a later process can find the server
    <directory>/redis.log    the server's log (and anything it printed before logging)
    <directory>/redis.lock   serialises ensure_running() between processes

The directory is ``0700`` and every file in it ``0600``. The server listens on
127.0.0.1 only and wants a password, generated once per directory: any local user
can reach a loopback port, so the port alone is no protection. The password is in
the config file, never on the command line (``ps`` shows that to everyone), and in
:attr:`EmbeddedRedis.url` for the processes that connect (never shown: see
:func:`shown_url`). It keeps nothing on disk (``--save ""``, ``--appendonly no``)
and is not daemonized: the child's handle is kept, so ``stop()`` / ``kill()`` act
on the process we started. Redis is rebuildable from the job record
(:mod:`hypermedia.queue`), so an in-memory server loses no job.

:func:`ensure_running` is what the CLI's embedded default uses: it reuses the
server already running from the directory, or starts one in its own session that
outlives the calling process.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Self
from urllib.parse import unquote_plus, urlsplit, urlunsplit

from hypermedia.errors import ConfigError, QueueUnavailable

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"
CONFFILE = "redis.conf"
PIDFILE = "redis.pid"
PORTFILE = "redis.port"
LOGFILE = "redis.log"
LOCKFILE = "redis.lock"

_SERVER_ENVIRONMENT = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR")
_PORT_RETRIES = 3  # a free port picked by us can be taken before redis binds it


def redis_server_binary() -> str:
    """The path of ``redis-server``, or a ConfigError saying how to get one."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise ConfigError(
            "redis_url (HYPERMEDIA_REDIS_URL)",
            "no Redis configured and redis-server is not installed: "
            "apt-get install redis-server or set HYPERMEDIA_REDIS_URL",
        )
    return binary


def free_port(host: str = HOST) -> int:
    """A TCP port nothing listens on right now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def listening_socket(host: str = HOST, port: int = 0) -> socket.socket:
    """A TCP socket listening on ``host``:``port`` (0: the kernel's pick; ``getsockname``
    tells which). Hand it to the server (uvicorn's ``run(sockets=[...])``) instead of a
    port from :func:`free_port`: another process cannot take the port between its choice
    and the server's start. OSError (EADDRINUSE) if ``port`` is taken.

    Made with ``IPPROTO_TCP`` named: the connections it accepts carry that proto, which
    asyncio checks before it turns off Nagle's algorithm on them. Without it each
    response's body waited for the client's delayed ACK of its headers (~40 ms)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except BaseException:
        sock.close()
        raise
    return sock


def _port_is_free(port: int, host: str = HOST) -> bool:
    """True if redis-server could listen on ``port``: like redis, bind with
    SO_REUSEADDR, so connections in TIME_WAIT (left by a killed server) don't count."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def _port_reusable(port: int, timeout: float = 2.0) -> bool:
    """True if ``port`` is, or within ``timeout`` becomes, free. A server killed a
    moment ago can hold its listening socket a little while after its pid is gone."""
    if ping(port):
        return False  # someone serves it
    deadline = time.monotonic() + timeout
    while not _port_is_free(port):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _command(
    port: int, command: bytes, timeout: float, password: str | None = None
) -> bytes | None:
    """Send one inline command (after ``AUTH`` if there is a password); the raw reply,
    or None if nothing answered."""
    try:
        with socket.create_connection((HOST, port), timeout=timeout) as sock:
            if password is not None:
                sock.sendall(b"AUTH " + password.encode() + b"\r\n")
                if _reply(sock) != b"+OK\r\n":
                    return None
            sock.sendall(command + b"\r\n")
            return _reply(sock)
    except OSError:
        return None


def _reply(sock: socket.socket) -> bytes | None:
    reply = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        reply += chunk
        if _reply_complete(reply):
            return reply
    return reply or None


def _reply_complete(reply: bytes) -> bool:
    if not reply.endswith(b"\r\n"):
        return False
    if reply[:1] != b"$":  # simple string or error: one line
        return True
    header, _, body = reply.partition(b"\r\n")
    try:
        length = int(header[1:])
    except ValueError:
        return True
    return length < 0 or len(body) >= length + 2


def ping(port: int, password: str | None = None, timeout: float = 0.5) -> bool:
    """True if a Redis server on 127.0.0.1:``port`` answers PING (with ``password``)."""
    reply = _command(port, b"PING", timeout, password)
    return reply is not None and reply.startswith(b"+PONG")


def server_pid(port: int, password: str | None = None, timeout: float = 0.5) -> int | None:
    """The ``process_id`` the Redis server on ``port`` reports, or None."""
    reply = _command(port, b"INFO server", timeout, password)
    if not reply:
        return None
    for line in reply.decode("utf-8", "replace").splitlines():
        if line.startswith("process_id:"):
            with contextlib.suppress(ValueError):
                return int(line.partition(":")[2])
    return None


def _pid_alive(pid: int) -> bool:
    """True if ``pid`` runs. A zombie does not: an orphaned server's zombie can
    linger until init gets round to reaping it, and it serves nothing."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return not Path("/proc/self/stat").exists()  # gone meanwhile, or no procfs
    except OSError:
        return True
    fields = stat.rpartition(")")[2].split()
    return not fields or fields[0] not in ("Z", "X")


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


# Query parameters that hold a password: libpq's (psycopg) and redis-py's ``password``,
# libpq's ``sslpassword`` (of the client key).
_PASSWORD_PARAMETERS = frozenset({"password", "sslpassword"})


def shown_url(url: str) -> str:
    """``url`` as it may be shown (console, logs, error messages): without its password,
    in its user info or its query. Works on a URL too malformed to connect with (a bad
    port), which an error shows."""
    parts = shown = urlsplit(url)
    userinfo, at, hostport = parts.netloc.rpartition("@")
    if at and ":" in userinfo:
        user = userinfo.partition(":")[0]
        shown = shown._replace(netloc=f"{user}:***@{hostport}")
    masked = []
    for part in parts.query.split("&"):
        name, eq, _value = part.partition("=")
        if eq and unquote_plus(name).lower() in _PASSWORD_PARAMETERS:
            part = f"{name}=***"
        masked.append(part)
    shown = shown._replace(query="&".join(masked))
    # Unchanged, the URL as given (urlunsplit drops a slash of sqlite:////path).
    return url if shown == parts else urlunsplit(shown)


def private_directory(path: Path) -> Path:
    """``path`` made (or made again) ``0700``: its files are no one else's business."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if stat.S_IMODE(path.stat().st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


def write_private(path: Path, text: str) -> None:
    """``text`` into ``path``, mode 0600 whatever the umask, replaced atomically: a
    reader sees the old file or the whole new one, never an empty one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def read_password(directory: Path) -> str | None:
    """The ``requirepass`` of the server of ``directory``, if it has a config file."""
    try:
        text = (directory / CONFFILE).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == "requirepass" and value.strip():
            return value.strip()
    return None


class EmbeddedRedis:
    """One ``redis-server`` on 127.0.0.1, owned by this object.

    ``port=None`` picks a free port at the first ``start()``; ``restart()`` keeps
    it. ``detached=True`` starts the server in its own session so it survives
    the Python process (see :func:`ensure_running`).
    """

    def __init__(
        self,
        directory: Path,
        port: int | None = None,
        *,
        detached: bool = False,
        start_timeout: float = 10.0,
        stop_timeout: float = 10.0,
    ) -> None:
        self.directory = Path(directory)
        self.port = port
        self.detached = detached
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._password: str | None = read_password(self.directory)

    # -- paths and addresses ------------------------------------------------------

    @property
    def conffile(self) -> Path:
        return self.directory / CONFFILE

    @property
    def password(self) -> str:
        """The server's password: the directory's, made at the first start."""
        if self._password is None:
            raise RuntimeError("EmbeddedRedis has no password yet: call start() first")
        return self._password

    @property
    def pidfile(self) -> Path:
        return self.directory / PIDFILE

    @property
    def portfile(self) -> Path:
        return self.directory / PORTFILE

    @property
    def logfile(self) -> Path:
        return self.directory / LOGFILE

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("EmbeddedRedis has no port yet: call start() first")
        return f"redis://:{self.password}@{HOST}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """The server's pid: our child's, or the pidfile's."""
        if self._process is not None:
            return self._process.pid
        return _read_int(self.pidfile)

    # -- lifecycle ----------------------------------------------------------------

    def is_running(self) -> bool:
        """True if our server process is alive and answers PING."""
        if self.port is None:
            return False
        if self._process is not None and self._process.poll() is not None:
            return False
        return ping(self.port, self._password)

    def start(self) -> Self:
        """Start the server and wait until it answers PING. A no-op if it already runs."""
        if self._process is not None and self._process.poll() is None:
            return self
        binary = redis_server_binary()
        private_directory(self.directory)
        self._write_config()
        chosen = self.port is None
        if self.port is not None:
            _port_reusable(self.port)  # after kill(): let the old socket go first
        for attempt in range(1, _PORT_RETRIES + 1):
            if chosen:
                self.port = free_port()
            try:
                self._spawn(binary)
                self._wait_until_ready()
                return self
            except QueueUnavailable:
                self._reap()
                if not chosen or attempt == _PORT_RETRIES or not self._port_was_taken():
                    raise
                logger.info("port %s was taken before redis-server bound it; retrying", self.port)
        raise AssertionError("unreachable")  # pragma: no cover

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if the server has not exited within ``stop_timeout``."""
        pid = self.pid
        if pid is None:
            return
        if self._process is not None:
            if self._process.poll() is None:
                self._process.terminate()
                try:
                    self._process.wait(self.stop_timeout)
                except subprocess.TimeoutExpired:
                    logger.warning("redis-server %s ignored SIGTERM; killing it", pid)
                    self._process.kill()
                    self._process.wait()
            self._process = None
        elif self._owns_pid(pid):
            self._signal_and_wait(pid)
        self.pidfile.unlink(missing_ok=True)

    def kill(self) -> None:
        """SIGKILL the server, no shutdown: for fault-injection tests."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None
        else:
            pid = _read_int(self.pidfile)
            if pid is not None and self._owns_pid(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                self._wait_gone(pid, self.stop_timeout)
        # redis-server removes its pidfile only on a clean shutdown
        self.pidfile.unlink(missing_ok=True)

    def restart(self) -> Self:
        """Stop (if running) and start again on the same port, empty."""
        self.stop()
        return self.start()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"EmbeddedRedis(directory={str(self.directory)!r}, port={self.port!r})"

    # -- internals ----------------------------------------------------------------

    def _write_config(self) -> None:
        """The password in the config file (``0600``); the rest goes on the command
        line, where nothing secret is."""
        if self._password is None:
            self._password = secrets.token_hex(32)
        write_private(self.conffile, f"requirepass {self._password}\n")

    def _arguments(self, binary: str) -> list[str]:
        return [
            binary,
            str(self.conffile),
            "--bind",
            HOST,
            "--port",
            str(self.port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--dir",
            str(self.directory),
            "--pidfile",
            str(self.pidfile),
            "--logfile",
            str(self.logfile),
        ]

    def _spawn(self, binary: str) -> None:
        self.pidfile.unlink(missing_ok=True)
        write_private(self.portfile, f"{self.port}\n")
        fd = os.open(self.logfile, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "ab") as log:
            # Errors before redis opens its logfile (bad arguments) go to stdout.
            self._process = subprocess.Popen(
                self._arguments(binary),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=self.directory,
                start_new_session=self.detached,
                close_fds=True,
                umask=0o077,  # its pidfile (and anything else it writes): 0600
                # It needs nothing of ours: the caller's credentials stay with the caller.
                env={k: v for k, v in os.environ.items() if k in _SERVER_ENVIRONMENT},
            )
        logger.debug("started redis-server pid %s on port %s", self._process.pid, self.port)

    def _wait_until_ready(self) -> None:
        assert self._process is not None
        assert self.port is not None
        deadline = time.monotonic() + self.start_timeout
        delay = 0.01
        while True:
            code = self._process.poll()
            if code is not None:
                raise QueueUnavailable(
                    f"redis-server exited with status {code} while starting on port "
                    f"{self.port}; see {self.logfile}{self._log_tail()}",
                    log_file=str(self.logfile),
                )
            # Our child must be the one answering: another server may hold the port.
            if server_pid(self.port, self._password) == self._process.pid:
                return
            if time.monotonic() >= deadline:
                raise QueueUnavailable(
                    f"redis-server did not answer PING on port {self.port} within "
                    f"{self.start_timeout:g}s; see {self.logfile}{self._log_tail()}",
                    log_file=str(self.logfile),
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.2)

    def _reap(self) -> None:
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.kill()
        self._process.wait()
        self._process = None

    def _port_was_taken(self) -> bool:
        try:
            text = self.logfile.read_text(errors="replace")
        except OSError:
            return False
        return "Address already in use" in text.rsplit("Redis is starting", 1)[-1]

    def _log_tail(self, lines: int = 5) -> str:
        try:
            text = self.logfile.read_text(errors="replace")
        except OSError:
            return ""
        tail = text.strip().splitlines()[-lines:]
        return (":\n  " + "\n  ".join(tail)) if tail else ""

    def _owns_pid(self, pid: int) -> bool:
        """True if ``pid`` is the redis-server on our port (guards against pid reuse)."""
        return (
            self.port is not None
            and _pid_alive(pid)
            and (server_pid(self.port, self._password) == pid or _runs_from(pid, self.directory))
        )

    def _signal_and_wait(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if not self._wait_gone(pid, self.stop_timeout):
            logger.warning("redis-server %s ignored SIGTERM; killing it", pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self._wait_gone(pid, self.stop_timeout)

    @staticmethod
    def _wait_gone(pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while _pid_alive(pid):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def detach(self) -> None:
        """Let the server outlive this object without leaving a zombie behind.

        A daemon thread waits on the child: it reaps the server if it dies while
        we live, and dies quietly with the interpreter otherwise (the server,
        in its own session, keeps running).
        """
        process, self._process = self._process, None
        if process is not None:
            threading.Thread(
                target=process.wait, name=f"redis-server-{process.pid}", daemon=True
            ).start()


def find_running(directory: Path) -> EmbeddedRedis | None:
    """The server started from ``directory`` if it is still running, else None.

    Running means: the port file names a port whose Redis answers and reports
    the pid in the pidfile (so neither a stale pidfile nor someone else's Redis
    on a reused port counts).
    """
    directory = Path(directory)
    port = _read_int(directory / PORTFILE)
    pid = _read_int(directory / PIDFILE)
    if port is None or pid is None or not _pid_alive(pid):
        return None
    if server_pid(port, read_password(directory)) != pid and not _runs_from(pid, directory):
        return None
    return EmbeddedRedis(directory, port)


def _runs_from(pid: int, directory: Path) -> bool:
    """Whether ``pid`` is a redis-server started from ``directory`` (its working
    directory): ours even when it does not take the directory's password now (its
    redis.conf replaced under it), so that it can still be stopped."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return False
    return comm.startswith("redis-server") and cwd == Path(directory).resolve()


def ensure_running(directory: Path, *, start_timeout: float = 10.0) -> str:
    """The URL of the Redis running from ``directory``, starting one if needed.

    A server started here runs in its own session and keeps running after this
    process exits; stop it with ``EmbeddedRedis(directory).stop()`` (through
    :func:`find_running`). It prefers the port it had last time, so URLs handed
    out earlier stay valid.
    """
    directory = private_directory(Path(directory))
    fd = os.open(directory / LOCKFILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            running = find_running(directory)
            if running is not None:
                if running.is_running():
                    return running.url
                # Its redis.conf was replaced under it: it answers no URL of ours.
                logger.warning(
                    "the embedded Redis of %s does not take its directory's password: "
                    "starting it again",
                    directory,
                )
                running.stop()
            previous = _read_int(directory / PORTFILE)
            port = previous if previous is not None and _port_reusable(previous) else None
            server = EmbeddedRedis(directory, port, detached=True, start_timeout=start_timeout)
            server.start()
            server.detach()
            logger.info(
                "started embedded Redis",
                extra={"action": "redis_start", "url": shown_url(server.url)},
            )
            return server.url
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
