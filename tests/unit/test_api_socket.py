"""The local stack's API socket: listening from the moment its port is chosen (so Ray's
head, started next, cannot take it), on ``api_url``'s port when one is set, and a clear
error when that port is taken or missing."""

from __future__ import annotations

import asyncio
import socket

import pytest

from hypermedia.config import load_settings
from hypermedia.embedded import listening_socket
from hypermedia.errors import ConfigError, ServiceUnavailable
from hypermedia.local import api_socket


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
