"""A real Chromium driven by Playwright, one per test session, and brokers serving the
dashboard: one without authentication and one with it (and a bootstrap admin key), each per
module and always stopped.

Chromium comes from the Debian package (``/usr/bin/chromium``; ``scripts/test`` installs it).
Without it the browser tests are skipped, except in CI (``CI`` set), where they fail.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tidewire.embedded import EmbeddedBroker
from tidewire.security.config import SecurityConfig

CHROMIUM = os.environ.get("TIDEWIRE_CHROMIUM", "/usr/bin/chromium")
#: Generous for a loaded 2-core CI machine (milliseconds).
TIMEOUT_MS = 20_000


def _chromium() -> str:
    path = CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"Chromium is missing ({CHROMIUM}): CI must run the browser tests")
        pytest.skip(f"Chromium is missing ({CHROMIUM}); apt-get install chromium")
    return path


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    """One Chromium for the dashboard's tests, closed when they end: Playwright's sync API
    runs an event loop in the main thread while it is open, and the tests after these call
    asyncio.run, which refuses to start inside a running loop."""
    path = _chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=path, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


@dataclass
class Page:
    """A browser page of one test, with the console errors and page errors it met."""

    page: Any
    base: str
    errors: list[str] = field(default_factory=list)

    def go(self, route: str) -> Any:
        self.page.goto(f"{self.base}/dashboard#/{route}")
        return self.page

    def assert_clean(self) -> None:
        assert not self.errors, f"console errors: {self.errors}"


def open_page(browser: Any, base: str) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 800}, accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    p = Page(page, base)
    page.on("console", lambda m: p.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: p.errors.append(f"page error: {e}"))
    try:
        yield p
    finally:
        context.close()


@pytest.fixture(scope="module")
def open_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """A broker without authentication (2 partitions per new topic)."""
    eb = EmbeddedBroker(
        str(tmp_path_factory.mktemp("dash") / "data"), http_port=0, default_partitions=2
    )
    with eb.running() as running:
        yield running


@pytest.fixture(scope="module")
def auth_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EmbeddedBroker, str]]:
    """A broker with authentication on, and its bootstrap admin key."""
    eb = EmbeddedBroker(
        str(tmp_path_factory.mktemp("dash-auth") / "data"),
        http_port=0,
        security=SecurityConfig(authentication=True, superusers="admin"),
    )
    with eb.running() as running:
        assert running.broker.bootstrap_key_file is not None
        yield running, running.broker.bootstrap_key_file.read_text().strip()


@pytest.fixture
def page(browser: Any, open_broker: EmbeddedBroker) -> Iterator[Page]:
    """A fresh page (its own cookies) on the broker without authentication."""
    yield from open_page(browser, open_broker.http_url)


__all__ = ["TIMEOUT_MS", "Page", "Path", "open_page"]
