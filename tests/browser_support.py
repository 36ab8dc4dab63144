"""A headless Chromium for the page tests: Debian's ``chromium``, driven by Selenium
through the ``chromedriver`` of the same build (``chromium-driver``; scripts/setup
installs both). Nothing is downloaded: the driver's path is given, so Selenium Manager
is never asked for one. A missing browser or driver fails the test, naming the package.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

CHROMIUM = os.environ.get("HYPERMEDIA_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("HYPERMEDIA_TEST_CHROMEDRIVER", "/usr/bin/chromedriver")


@contextmanager
def chromium(width: int = 1400, height: int = 1000) -> Iterator[Any]:
    """A headless Chromium (a Selenium ``WebDriver``) with a ``width`` x ``height``
    window; its console is readable with ``get_log("browser")``."""
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
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()
