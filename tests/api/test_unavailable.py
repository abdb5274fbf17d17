"""A database that cannot be reached gives 503 problem+json with Retry-After, never a 500."""

from __future__ import annotations

import socket
from collections.abc import Callable

import httpx
import pytest

from app.config import Settings
from app.main import create_app
from tests.api.conftest import BASE_URL, assert_problem


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _unreachable(database_url: str) -> str:
    return f"postgresql://postgres@127.0.0.1:{_closed_port()}/berth"


def _no_primary(database_url: str) -> str:
    # The test server is a primary: asking for a standby finds none, as asking for a
    # read-write host finds none while a failover has promoted nobody yet.
    from sqlalchemy.engine import make_url

    parsed = make_url(database_url)
    return parsed.update_query_dict({"target_session_attrs": "standby"}).render_as_string(False)


@pytest.mark.parametrize(
    ("url_of", "paths", "reason"),
    [
        pytest.param(_unreachable, ("/v1/pools", "/v1/tasks"), "unreachable", id="unreachable"),
        pytest.param(_no_primary, ("/v1/pools",), "target_session_attrs", id="no-primary"),
    ],
)
async def test_a_database_berth_cannot_use_answers_503_not_500(
    url_of: Callable[[str], str], paths: tuple[str, ...], reason: str, database_url: str
) -> None:
    app = create_app(Settings(database_url=url_of(database_url), reconciler_enabled=False,
                              db_connect_timeout_seconds=2))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url=BASE_URL) as client:
            headers = {"Authorization": "Bearer berth_not-checked-before-the-database-answers"}
            for path in paths:
                response = await client.get(path, headers=headers)
                assert_problem(response, 503)
                assert response.headers["retry-after"] == "1"
            ready = await client.get("/readyz")
            assert_problem(ready, 503)
            assert reason in ready.json()["detail"]
