"""The local stack's API socket: listening from the moment its port is chosen (so Ray's
head, started next, cannot take it), on ``api_url``'s port when one is set, and a clear
error when that port is taken or missing. ``up``'s stack listens on ``api_port`` (8080
unless set), as ``serve`` does and where the CLI's client looks: the same port after a
``down`` and another ``up``."""

from __future__ import annotations

import asyncio
import socket

import pytest

from hypermedia.config import load_settings
from hypermedia.embedded import listening_socket
from hypermedia.errors import ConfigError, ServiceUnavailable
from hypermedia.local import ApiPorts, api_ports, api_socket, listen_api, moved_api_note


def _connects(port: int) -> bool:
    with socket.socket() as client:
        client.settimeout(2)
        return client.connect_ex(("127.0.0.1", port)) == 0


def test_a_socket_listens_on_the_kernels_port_until_closed(tmp_path):
    sock = api_socket(load_settings(data_dir=tmp_path))
    port = sock.getsockname()[1]
    try:
        assert port > 0
        assert _connects(port)
        with pytest.raises(OSError, match="Address already in use"), socket.socket() as other:
            other.bind(("127.0.0.1", port))
    finally:
        sock.close()
    assert not _connects(port)


def test_api_urls_port_is_the_one_listened_on(tmp_path):
    with listening_socket() as probe:
        port = probe.getsockname()[1]
    sock = api_socket(load_settings(data_dir=tmp_path, api_url=f"http://127.0.0.1:{port}"))
    with sock:
        assert sock.getsockname()[:2] == ("127.0.0.1", port)


def test_a_taken_port_is_refused_with_the_address(tmp_path):
    with listening_socket() as taken:
        port = taken.getsockname()[1]
        settings = load_settings(data_dir=tmp_path, api_url=f"http://127.0.0.1:{port}")
        with pytest.raises(ServiceUnavailable, match=f"cannot listen on 127.0.0.1:{port}"):
            api_socket(settings)


def test_an_api_url_without_a_port_names_the_setting(tmp_path):
    settings = load_settings(data_dir=tmp_path, api_url="https://media.example.com/api")
    with pytest.raises(ConfigError, match="api_url") as raised:
        api_socket(settings)
    assert "names no port" in str(raised.value)


@pytest.mark.parametrize(
    ("given", "fixed", "ports", "setting"),
    [
        # `up`: api_port, the default (8080) passed over for the kernel's pick if taken.
        ({}, True, (8080, 0), None),
        # As set: never passed over (a web tier was told it).
        ({"api_port": 9000}, True, (9000,), "api_port (HYPERMEDIA_API_PORT)"),
        ({"api_url": "http://127.0.0.1:9100"}, True, (9100,), "api_url (HYPERMEDIA_API_URL)"),
        ({"api_url": "http://127.0.0.1:9100", "api_port": 9000}, True, (9100,), "api_url"),
        # `run` and the tests' stacks: their API is their own, on the kernel's pick.
        ({}, False, (0,), None),
        ({"api_port": 9000}, False, (0,), None),
        ({"api_url": "http://127.0.0.1:9100"}, False, (9100,), "api_url (HYPERMEDIA_API_URL)"),
    ],
)
def test_the_port_up_listens_on_is_the_settings(tmp_path, given, fixed, ports, setting):
    """`up` listened on a port the kernel picked, another after each `down` and `up`
    unless HYPERMEDIA_API_URL was set: a web tier set up after the first `up` lost the
    API, and the CLI's client (http://api_host:api_port) never found it."""
    chosen = api_ports(load_settings(data_dir=tmp_path, **given), fixed=fixed)
    assert chosen.ports == ports
    assert (chosen.setting or "").startswith(setting or "")
    assert (chosen.setting is None) == (setting is None)


def test_up_listens_on_api_port_again_after_it_stopped(tmp_path):
    with listening_socket() as probe:
        port = probe.getsockname()[1]
    settings = load_settings(data_dir=tmp_path, api_port=port)
    for _ in range(2):  # up, down, up: the same port (SO_REUSEADDR: no TIME_WAIT wait)
        with api_socket(settings, fixed=True) as sock:
            assert sock.getsockname()[:2] == ("127.0.0.1", port)
            with socket.create_connection(("127.0.0.1", port), timeout=2):
                pass


def test_a_taken_default_port_is_passed_over_saying_so_and_a_set_one_is_refused(tmp_path, caplog):
    with listening_socket() as taken:
        port = taken.getsockname()[1]
        with listen_api("127.0.0.1", ApiPorts((port, 0))) as sock:
            other = sock.getsockname()[1]
            assert other not in (0, port)
        assert f"127.0.0.1:{port} is taken" in caplog.text
        settings = load_settings(data_dir=tmp_path, api_port=port)
        with pytest.raises(ServiceUnavailable) as refused:
            api_socket(settings, fixed=True)
        assert f"cannot listen on 127.0.0.1:{port}" in str(refused.value)
        assert "api_port (HYPERMEDIA_API_PORT)" in str(refused.value)


def test_up_says_when_its_api_is_not_on_the_default_port(tmp_path):
    settings = load_settings(data_dir=tmp_path)
    assert moved_api_note(settings, "http://127.0.0.1:8080") is None
    note = moved_api_note(settings, "http://127.0.0.1:41234")
    assert note is not None and "8080" in note and "HYPERMEDIA_API_PORT" in note
    # The CLI's client commands (submit, watch, status JOB_ID) go to api_port, 8080:
    # the note says how they reach the API where it is.
    assert "HYPERMEDIA_API_URL=http://127.0.0.1:41234" in note
    fixed = load_settings(data_dir=tmp_path, api_url="http://127.0.0.1:41234")
    assert moved_api_note(fixed, "http://127.0.0.1:41234") is None


def test_connections_it_accepts_send_small_writes_at_once():
    """asyncio (uvicorn's loop) turns Nagle's algorithm off only on sockets whose proto
    is IPPROTO_TCP: with it on, each response's body waited ~40 ms for the client's
    delayed ACK of its headers."""
    accepted: list[int] = []

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            sock = transport.get_extra_info("socket")
            accepted.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    async def serve_one() -> None:
        sock = listening_socket()
        server = await asyncio.get_running_loop().create_server(Probe, sock=sock)
        async with server:
            _reader, writer = await asyncio.open_connection(*sock.getsockname()[:2])
            for _ in range(100):
                if accepted:
                    break
                await asyncio.sleep(0.01)
            writer.close()

    asyncio.run(serve_one())
    assert accepted and accepted[0] != 0
