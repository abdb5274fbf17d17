"""An in-process Berth app with settings of a test's choosing, for limits and timeouts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

from app.main import create_app
from tests.api.conftest import BASE_URL, settings_for_tests


@asynccontextmanager
async def serving(database_url: str, **settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    """Yield an httpx client of a Berth app built with ``settings``, its lifespan running."""
    app = create_app(settings_for_tests(database_url, **settings))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url=BASE_URL) as client:
            yield client
