"""A real browser for the console's tests (issue 28): Debian's ``chromium``
headless, driven by ``selenium`` through Debian's ``chromium-driver``
(both installed by :func:`tests.support.system.require` when missing).

:func:`open_browser` yields a :class:`Page`: the selenium driver plus the
waits the tests need (every wait is bounded and says what it waited for).
A fresh profile per browser (a temporary directory), no network but the
page's own origin (no proxy, background networking off)."""
from __future__ import annotations

import contextlib
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from tests.support.system import require

T = TypeVar("T")


class Page:
    """One browser tab on the console."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver

    def open(self, url: str) -> None:
        self.driver.get(url)

    def wait(self, pred: Callable[[], T], what: str, timeout: float = 60) -> T:
        """Poll ``pred`` (exceptions count as not yet) until it returns a
        true value; ``AssertionError`` naming ``what`` after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        last: BaseException | None = None
        while time.monotonic() < deadline:
            try:
                got = pred()
                if got:
                    return got
            except Exception as e:  # noqa: BLE001 -- a stale element is "not yet"
                last = e
            time.sleep(0.1)
        raise AssertionError(f"browser: no {what} within {timeout:.0f}s (last error: {last!r}); "
                             f"page text:\n{self.text()[:3000]}")

    def css(self, selector: str) -> list[Any]:
        from selenium.webdriver.common.by import By
        return self.driver.find_elements(By.CSS_SELECTOR, selector)

    def one(self, selector: str, what: str | None = None, timeout: float = 60) -> Any:
        return self.wait(lambda: (self.css(selector) or [None])[0], what or selector, timeout)

    def text(self) -> str:
        try:
            return self.driver.find_element("tag name", "body").text
        except Exception:  # noqa: BLE001 -- diagnostics only
            return ""

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def card(self, ask_id: str, timeout: float = 60) -> Any:
        """The inbox card of the ``attention.requested`` ``ask_id``."""
        return self.one(f'[data-ask="{ask_id}"]', f"inbox card for {ask_id}", timeout)

    def answerable(self, ask_id: str, timeout: float = 60) -> Any:
        """The inbox card of ``ask_id`` once its controls are enabled (the
        page disables them while its socket is not live: typed text or a
        click before that does nothing, as for a person)."""
        def ready() -> Any:
            card = self.css(f'[data-ask="{ask_id}"]')
            controls = card[0].find_elements("css selector", "button, textarea, input") \
                if card else []
            return card[0] if controls and all(c.is_enabled() for c in controls) else None
        return self.wait(ready, f"the answerable card of {ask_id}", timeout)

    def status(self, ask_id: str) -> str:
        cards = self.css(f'[data-ask="{ask_id}"] .status')
        return cards[0].text if cards else ""

    def requested_urls(self) -> list[str]:
        """Every URL the page asked for since the last call (HTTP requests
        and WebSocket handshakes, from Chrome's DevTools performance log)."""
        import json
        urls = []
        for entry in self.driver.get_log("performance"):
            msg = json.loads(entry["message"])["message"]
            if msg.get("method") in ("Network.requestWillBeSent", "Network.webSocketCreated"):
                p = msg["params"]
                urls.append(p["request"]["url"] if "request" in p else p["url"])
        return urls

    def console_errors(self) -> list[str]:
        """Severe browser-log lines (CSP violations, script errors)."""
        return [e["message"] for e in self.driver.get_log("browser") if e.get("level") == "SEVERE"]


@contextlib.contextmanager
def open_browser(width: int = 1400, height: int = 1000) -> Iterator[Page]:
    """A headless Chromium tab (``width`` x ``height``); quit on exit."""
    chromium = require("chromium")
    driver_path = require("chromedriver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    with tempfile.TemporaryDirectory(prefix="aep-console-browser-") as profile:
        opts = webdriver.ChromeOptions()
        opts.binary_location = chromium
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                    f"--window-size={width},{height}", f"--user-data-dir={Path(profile)}",
                    "--no-proxy-server", "--disable-background-networking",
                    "--disable-component-update", "--no-first-run"):
            opts.add_argument(arg)
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
        driver = webdriver.Chrome(service=Service(driver_path), options=opts)
        try:
            driver.set_page_load_timeout(30)
            yield Page(driver)
        finally:
            driver.quit()
