"""Browser tests: Playwright driving Debian's Chromium, headless, against pytest-django's live server.

The browser is the system's ``/usr/bin/chromium`` (``apt-get install chromium``; ``.ci/run``
installs it when missing), never one downloaded by ``playwright install``. Without it these
tests fail, on purpose: a skipped browser test would pass CI without proving anything.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections
from playwright.sync_api import Browser, Page, sync_playwright

from tests.factories import OPERATOR_PERMS, UserFactory
from tests.helpers import PROJECT_DIR

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
SCREENSHOTS = PROJECT_DIR / "var" / "screenshots"


@pytest.fixture
def browser(monkeypatch: pytest.MonkeyPatch) -> Iterator[Browser]:
    if not (CHROMIUM.is_file() and CHROMIUM.stat().st_mode & 0o111):
        pytest.fail(
            f"{CHROMIUM} is missing: the browser tests drive Debian's Chromium. "
            "Install it with `apt-get update && apt-get install -y chromium` (.ci/run does this); "
            "do not use `playwright install`.",
            pytrace=False,
        )
    # Playwright's sync API runs an asyncio loop in this thread, and Django then refuses ORM
    # calls from it ("SynchronousOnlyOperation"). The test's own ORM calls are plain sync code
    # between browser steps, so allow them for the browser tests only.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    # One Playwright per test, stopped at its end, so that no loop outlives the browser tests.
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()
            # While Playwright's loop runs, Django keeps the test's database connections apart
            # from the usual ones (connections are context-local): close them here, or on
            # PostgreSQL they keep the test database open past its teardown.
            connections.close_all()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900}, locale="en-US", timezone_id="UTC")
    context.set_default_timeout(15_000)
    page = context.new_page()
    yield page
    context.close()


class Shots:
    """Numbered full-page screenshots in var/screenshots/<test name>/, for review."""

    def __init__(self, page: Page, folder: Path) -> None:
        self.page = page
        self.folder = folder
        self.count = 0
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("*.png"):
            old.unlink()

    def __call__(self, name: str) -> Path:
        self.count += 1
        path = self.folder / f"{self.count:02d}-{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture
def shot(page: Page, request: pytest.FixtureRequest) -> Shots:
    return Shots(page, SCREENSHOTS / re.sub(r"[^\w.-]+", "_", request.node.name))


@pytest.fixture
def browser_operator() -> Any:
    """A staff account with the community permissions, and signals to look at."""
    return UserFactory(username="operator", is_staff=True, perms=OPERATOR_PERMS)


@pytest.fixture
def no_broker(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """Signals ingested here are processed by the test itself: nothing is sent to a broker."""
    from signals_app.tasks import process_signal_batch

    sent: list[list[int]] = []
    monkeypatch.setattr(process_signal_batch, "apply_async", lambda args, **_: sent.append(list(args[0])))
    return sent
