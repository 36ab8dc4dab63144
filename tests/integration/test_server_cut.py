"""What a request still running when the API's stop is cut (uvicorn's
``timeout_graceful_shutdown``) answers: :class:`hypermedia.server.CutCleanly`."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import httpx
import pytest
import uvicorn

from hypermedia import tls
from hypermedia.embedded import listening_socket
from hypermedia.server import CutCleanly


async def _forever(scope, receive, send) -> None:
    if scope["type"] == "http":
        await asyncio.sleep(3600)


def test_a_request_cut_by_the_stop_answers_503_and_logs_no_traceback(caplog):
    """uvicorn cancelled it: a 500, and the cancellation's traceback logged at ERROR."""
    cut = CutCleanly(_forever)
    sock = listening_socket()
    server = uvicorn.Server(
        uvicorn.Config(
            cut, log_config=None, access_log=False, lifespan="off", timeout_graceful_shutdown=1
        )
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    answers: list[httpx.Response] = []
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1/hypermedia/credits"
    asking = threading.Thread(
        target=lambda: answers.append(httpx.get(url, timeout=30, verify=tls.client_context()))
    )
    with caplog.at_level(logging.INFO):
        thread.start()
        asking.start()
        deadline = time.monotonic() + 10
        while not server.server_state.tasks:
            assert time.monotonic() < deadline, "the request never arrived"
            time.sleep(0.02)
        cut.stopping = True  # what ApiServer.shutdown sets
        server.should_exit = True
        asking.join(15)
        thread.join(15)
    sock.close()
    assert not thread.is_alive()
    [answer] = answers
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "service_unavailable"
    assert "retry-after" in answer.headers
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]
    assert any("was cut short (answered 503)" in r.getMessage() for r in caplog.records)


def test_a_cancellation_before_the_stop_is_not_the_stops():
    async def cancelled() -> None:
        async def nothing(*_: object) -> Any:
            raise AssertionError("not called")

        task = asyncio.ensure_future(CutCleanly(_forever)({"type": "http"}, nothing, nothing))
        await asyncio.sleep(0.01)
        task.cancel()
        await task

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(cancelled())
