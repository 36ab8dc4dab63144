"""``/docs`` (:mod:`hypermedia.ingest.docs`): Swagger UI from the API's own files, read
in a headless Chromium that resolves no host but 127.0.0.1: it draws every operation of
``/openapi.json``, asks no other host for anything, and its Content-Security-Policy
refuses nothing (none of its scripts or styles is another's, none is inline).

On SQLite alone: the page, ``/openapi.json`` and the files it loads are the app's, not
the record's (no route of theirs reads the database), and the one call the page makes,
``/healthz``, is tested on both engines in test_api. Each engine's run was a Chromium
drawing the whole Swagger UI (~4 CPU-s)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import suppress
from typing import Any

import httpx
import pytest

from hypermedia import tls
from hypermedia.ingest.api import create_app
from hypermedia.stack import Stack
from tests.api_support import running_server
from tests.browser_support import chromium, record_violations, requested


@pytest.fixture
def stack(sqlite_engine, settings) -> Iterator[Stack]:
    opened = Stack.open(settings(), engine=sqlite_engine, auto_migrate=True)
    yield opened
    opened.close()


@pytest.fixture
def served(stack: Stack) -> Iterator[str]:
    with running_server(create_app(stack)) as base_url:
        yield base_url


def test_docs_draw_every_operation_from_the_apis_own_files_alone(served):
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.wait import WebDriverWait

    document = httpx.get(f"{served}/openapi.json", verify=tls.client_context()).json()
    operations = sorted(
        operation["operationId"]
        for methods in document["paths"].values()
        for operation in methods.values()
    )
    with chromium(local_only=True) as browser:
        record_violations(browser)
        browser.get(f"{served}/docs")

        def blocks(_browser: Any) -> list[Any]:
            found = browser.find_elements(By.CSS_SELECTOR, ".opblock")
            return found if len(found) >= len(operations) else []

        with suppress(TimeoutException):  # before: blank, its files asked of a CDN
            WebDriverWait(browser, 30).until(blocks)
        drawn = sorted(b.get_attribute("id").rpartition("-")[2] for b in blocks(browser))
        urls = requested(browser)
        assert drawn == operations, urls
        title = browser.find_element(By.CSS_SELECTOR, ".info .title").text
        # "Try it out" on /healthz: the page calls the API (its CSP's connect-src).
        health = browser.find_element(By.CSS_SELECTOR, ".opblock[id$='-getHealth']")
        health.find_element(By.CSS_SELECTOR, ".opblock-summary").click()
        WebDriverWait(health, 10).until(lambda h: h.find_elements(By.CSS_SELECTOR, ".try-out"))
        health.find_element(By.CSS_SELECTOR, ".try-out button").click()
        health.find_element(By.CSS_SELECTOR, ".execute").click()
        status = ".live-responses-table tbody .response-col_status"
        answered = (
            WebDriverWait(health, 10)
            .until(lambda h: h.find_elements(By.CSS_SELECTOR, status))[0]
            .text
        )
        violations = browser.execute_script("return window.violations")
        console = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
        urls += requested(browser)
    # Every operation of the document, drawn by the Swagger UI the API served itself ...
    assert len(operations) > 20
    assert title.startswith("hypermedia")
    assert answered.startswith("200"), answered
    # ... which asked for nothing but the API's files (the data: URLs are icons of its
    # stylesheet), and broke no rule of its CSP.
    others = [u for u in urls if not u.startswith((f"{served}/", "data:"))]
    assert (len(urls) > 5, others) == (True, [])
    assert (violations, console) == ([], [])


def test_the_docs_and_their_files_come_with_the_operator_pages_headers(served):
    page = httpx.get(f"{served}/docs", verify=tls.client_context())
    assert page.status_code == 200
    files = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert len(files) == 4, files  # the favicon, Swagger UI's style and script, ours
    for response in [
        page,
        *(httpx.get(f"{served}{path}", verify=tls.client_context()) for path in files),
    ]:
        assert response.status_code == 200, response.url
        csp = response.headers["content-security-policy"]
        for directive in ("default-src 'none'", "script-src 'self';", "frame-ancestors 'none'"):
            assert directive in csp, (response.url, csp)
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["referrer-policy"] == "no-referrer"
    # Only those files: not the ReDoc the package also ships, nor a path out of it.
    for name in ("redoc.standalone.js", "..%2F__init__.py", "core.py"):
        missing = httpx.get(f"{served}/docs/static/{name}", verify=tls.client_context())
        assert missing.status_code == 404, name
    assert httpx.get(f"{served}/redoc", verify=tls.client_context()).status_code == 404
