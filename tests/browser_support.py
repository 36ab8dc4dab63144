"""A headless Chromium for the page tests: Debian's ``chromium``, driven by Selenium
through the ``chromedriver`` of the same build (``chromium-driver``; scripts/setup
installs both). Nothing is downloaded: the driver's path is given, so Selenium Manager
is never asked for one. A missing browser or driver fails the test, naming the package.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

CHROMIUM = os.environ.get("HYPERMEDIA_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("HYPERMEDIA_TEST_CHROMEDRIVER", "/usr/bin/chromedriver")


@contextmanager
def chromium(width: int = 1400, height: int = 1000, *, local_only: bool = False) -> Iterator[Any]:
    """A headless Chromium (a Selenium ``WebDriver``) with a ``width`` x ``height``
    window; its console is readable with ``get_log("browser")``. ``local_only``: no host
    name but 127.0.0.1 resolves (a page's request to another host fails, as offline),
    and what the browser asked for is in ``get_log("performance")`` (see
    :func:`requested`)."""
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if shutil.which(path) is None:
            pytest.fail(f"{path} not found: install Debian's {package} (scripts/setup)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # as root (CI's containers) Chromium refuses its sandbox
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--force-device-scale-factor=1",
        "--lang=en-US",
        f"--window-size={width},{height}",
    ):
        options.add_argument(argument)
    logs = {"browser": "ALL"}
    if local_only:
        options.add_argument("--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1")
        logs["performance"] = "ALL"
    options.set_capability("goog:loggingPrefs", logs)
    # Its temporary files (the driver's profile, and the SingletonSocket directory that
    # Chromium makes in TMPDIR and leaves when the driver ends it: ~2 a test file in
    # /tmp) in a directory removed after it.
    with tempfile.TemporaryDirectory(prefix="hm-chromium-") as home:
        service = Service(CHROMEDRIVER, env={**os.environ, "TMPDIR": home})
        driver = webdriver.Chrome(options=options, service=service)
        try:
            yield driver
        finally:
            driver.quit()


def requested(driver: Any) -> list[str]:
    """The URLs the browser asked for since the last call (of a ``local_only`` one)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


# Kept by the page's document from its first script on (the page's own CSP does not
# apply to a script the driver adds): what its Content-Security-Policy refused.
VIOLATIONS = """
window.violations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.violations.push(`${e.effectiveDirective} ${e.blockedURI} ${e.sourceFile}:${e.lineNumber}`);
});
"""


def record_violations(driver: Any) -> None:
    """From the next page on, its CSP's violations are ``window.violations``."""
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": VIOLATIONS})
