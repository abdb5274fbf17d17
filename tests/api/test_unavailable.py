"""A database that cannot be reached gives 503 problem+json with Retry-After, never a 500."""

from __future__ import annotations

import socket

import httpx

from app.config import Settings
from app.main import create_app
from tests.api.conftest import BASE_URL, assert_problem


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_unreachable_database_answers_503_not_500() -> None:
    url = f"postgresql://postgres@127.0.0.1:{_closed_port()}/berth"
    app = create_app(
        Settings(database_url=url, reconciler_enabled=False, db_connect_timeout_seconds=1)
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url=BASE_URL) as client:
            headers = {"Authorization": "Bearer berth_not-checked-before-the-database-answers"}
            for method, path in (("GET", "/v1/pools"), ("GET", "/v1/tasks")):
                response = await client.request(method, path, headers=headers)
                assert_problem(response, 503)
                assert response.headers["retry-after"] == "1"
            ready = await client.get("/readyz")
            assert_problem(ready, 503)
            assert "unreachable" in ready.json()["detail"]


async def test_no_primary_among_the_hosts_answers_503_and_readyz_says_why(
    database_url: str,
) -> None:
    # The test server is a primary: asking for a standby finds none, as asking for a
    # read-write host finds none while a failover has promoted nobody yet.
    from sqlalchemy.engine import make_url

    parsed = make_url(database_url)
    url = parsed.update_query_dict({"target_session_attrs": "standby"}).render_as_string(False)
    app = create_app(
        Settings(database_url=url, reconciler_enabled=False, db_connect_timeout_seconds=2)
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url=BASE_URL) as client:
            headers = {"Authorization": "Bearer berth_not-checked-before-the-database-answers"}
            response = await client.get("/v1/pools", headers=headers)
            assert_problem(response, 503)
            assert response.headers["retry-after"] == "1"
            ready = await client.get("/readyz")
            assert_problem(ready, 503)
            assert "target_session_attrs" in ready.json()["detail"]
