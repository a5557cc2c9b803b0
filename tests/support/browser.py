"""Headless Chromium on a page (the dashboard tests drive one through selenium): load
it, wait for what it shows, read its ``data-state``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from selenium.webdriver.support.wait import WebDriverWait


def state(driver: Any) -> str:
    value: str = driver.execute_script("return document.body.dataset.state")
    return value


def open_page(driver: Any, url: str, want: str = "ready") -> None:
    driver.get_log("browser")  # drop what earlier tests left
    driver.get_log("performance")
    driver.get(url)
    wait_for(driver, lambda: state(driver) == want, f"the page never reached {want!r}")


def wait_for(driver: Any, condition: Callable[[], bool], message: str) -> None:
    try:
        WebDriverWait(driver, 15, poll_frequency=0.05).until(lambda _: condition())
    except Exception as exc:
        page = driver.execute_script("return document.body.innerText")[:2000]
        raise AssertionError(f"{message}; state {state(driver)!r}; page:\n{page}") from exc
