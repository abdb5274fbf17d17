"""Database URLs, the async engine and the request session dependency."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Depends, Request
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from app.errors import ConfigurationError


def async_url(url: str) -> str:
    """Return ``url`` rewritten for the asyncpg driver, or raise ConfigurationError."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigurationError(
            f"BERTH_DATABASE_URL is not a database URL ({url!r}); "
            "use postgresql://user:password@host:5432/dbname"
        ) from None
    if parsed.get_backend_name() not in ("postgresql", "postgres"):
        raise ConfigurationError(
            f"BERTH_DATABASE_URL must point at PostgreSQL, not {parsed.get_backend_name()!r}; "
            "use postgresql://user:password@host:5432/dbname"
        )
    return parsed.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False)


def describe_url(url: str) -> str:
    """Return ``url`` with its password hidden, for logs and start-up lines."""
    return make_url(url).render_as_string(hide_password=True)


def make_engine(
    url: str,
    *,
    pool_size: int = 10,
    max_overflow: int = 10,
    connect_timeout_seconds: float = 5.0,
    application_name: str = "berth",
    **kwargs: Any,
) -> AsyncEngine:
    """Create the async engine Berth uses for ``url``."""
    return create_async_engine(
        async_url(url),
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_pre_ping=True,
        connect_args={
            "timeout": connect_timeout_seconds,
            "server_settings": {"application_name": application_name},
        },
        **kwargs,
    )



async def _request_connection(request: Request) -> AsyncIterator[AsyncConnection]:
    async with request.app.state.engine.begin() as conn:
        yield conn


#: A connection in a transaction for one request: committed when the endpoint returns,
#: rolled back when it raises.
ConnDep = Annotated[AsyncConnection, Depends(_request_connection)]
