"""Browser fixtures: a real Berth server, Debian's Chromium driven by Playwright, a reconciler.

The browser is the system's ``/usr/bin/chromium`` (Playwright cannot download its own here);
``.ci/run`` installs it. Without it, or without Playwright, these tests skip — except under
CI (``CI=true``), where they are required and fail instead.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from app.config import SHARD_SLOTS
from app.db import Database
from app.pass_config import ReconcilerConfig
from app.reconciler.loop import Reconciler
from tests.api.conftest import (  # noqa: F401 (app, client, keys, pool_make: fixtures)
    app,
    client,
    keys,
    pool_make,
    settings_for_tests,
)
from tests.api.live import live_server

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]
#: Where the README's screenshots are (docs/img/console-<name>.png). The tests take their
#: screenshots into a temporary directory; ``BERTH_UPDATE_SCREENSHOTS=1`` saves them here.
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "img"
_scratch: list[Path] = []
#: Generous: the machine may be loaded; every wait is on a condition, never a fixed sleep.
WAIT_MS = 30_000
#: A runtime's heartbeat stays fresh for the whole test, however slow the machine is.
SETTINGS = {"heartbeat_freshness_seconds": 3600.0}


def _missing() -> str | None:
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "Playwright for Python is not installed (pip install -e '.[dev]')"
    if shutil.which(CHROMIUM) is None:
        return f"{CHROMIUM} is missing (apt-get install -y chromium)"
    return None


@pytest.fixture(scope="session")
def browser_needed() -> None:
    """Skip when the browser cannot run here, unless under CI, where that is a failure."""
    why = _missing()
    if why is None:
        return
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(f"CI is set but {why}: .ci/run installs it, and under CI the console's "
                    "browser tests never skip")
    pytest.skip(why)


@pytest_asyncio.fixture(scope="session")
async def browser(browser_needed: None) -> AsyncIterator[Any]:
    """Yield one headless Chromium for the session."""
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        launched = await pw.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
        )
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
def server(app: Any, keys: Any, database_url: str) -> Any:  # noqa: F811
    """Yield the base URL of a real Berth server on the clean test database (keys made)."""
    with live_server(database_url, **SETTINGS) as base_url:
        yield base_url


@pytest_asyncio.fixture
async def page(browser: Any) -> AsyncIterator[Any]:
    """Yield a fresh page (its own context: its own session storage) at 1280 x 900."""
    from playwright.async_api import expect

    expect.set_options(timeout=WAIT_MS)
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(WAIT_MS)
    opened = await context.new_page()
    try:
        yield opened
    finally:
        await context.close()


@pytest.fixture
def reconcile(db: Database) -> Callable[[], Any]:
    """Return a function running one reconciler pass over every shard slot."""
    reconciler = Reconciler(
        db,
        ReconcilerConfig.from_settings(settings_for_tests("postgresql://unused", **SETTINGS)),
        owner_id="console-test",
        slots=frozenset(range(SHARD_SLOTS)),
    )

    async def run() -> Any:
        return await reconciler.run_once(now=datetime.now(UTC))

    return run


@pytest.fixture(scope="session", autouse=True)
def screenshot_scratch(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Give the session's screenshots a temporary directory (unless they update the README's)."""
    _scratch[:] = [tmp_path_factory.mktemp("screenshots")]


def screenshot_path(name: str) -> Path:
    """Return where the screenshot ``name`` goes: docs/img/console-<name>.png under
    ``BERTH_UPDATE_SCREENSHOTS=1``, else the session's temporary directory (a test run leaves
    the working tree as it was)."""
    if os.environ.get("BERTH_UPDATE_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        return SCREENSHOTS / f"console-{name}.png"
    return _scratch[-1] / f"console-{name}.png"
