"""Fixtures: real servers (``dashboard/live.py``), the events endpoint's clock, and
headless Chromium driven by selenium."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from dashboard.live import Clock, LiveServer

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


@pytest.fixture
def live_server(tmp_path: Path, events_clock: Clock) -> Iterator[Callable[..., LiveServer]]:
    """Start servers (``start(**settings)``), each stamping events by ``events_clock``;
    each is stopped at the end."""
    started: list[LiveServer] = []

    def start(**settings: Any) -> LiveServer:
        server = LiveServer(tmp_path / f"data-{len(started)}", events_clock, **settings)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def events_clock() -> Clock:
    return Clock()


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """Headless Chromium through chromedriver, with the browser console and the
    network log kept; one per test process (each test opens its own server, another
    origin, and drops the logs earlier tests left)."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        why = (
            f"{' and '.join(missing)} not installed (Debian: apt-get install chromium "
            "chromium-driver; .ci/run installs them)"
        )
        if os.environ.get("CI"):
            pytest.fail(f"the browser tests must run under CI: {why}")
        pytest.skip(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
        "--lang=en-US",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",  # no update checks or field trials
        "--disable-component-update",
        "--disable-sync",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()
