"""/docs and /redoc work offline: every asset they load is served by Berth itself."""

from __future__ import annotations

import re

import httpx
import pytest

#: src=, href= and the JavaScript that names the document (Swagger UI's `url: '...'`).
ASSET = re.compile(r"""(?:src|href|spec-url)="([^"]+)"|url: '([^']+)'""")


def assets_of(page: str) -> list[str]:
    """Return every URL a docs page loads."""
    return [a or b for a, b in ASSET.findall(page)]


@pytest.mark.parametrize(("page", "script"), [
    pytest.param("/docs", "SwaggerUIBundle", id="swagger-ui"),
    pytest.param("/redoc", "Redoc", id="redoc"),
])
async def test_docs_page_loads_every_asset_from_berth_itself(
    client: httpx.AsyncClient, page: str, script: str
) -> None:
    html = await client.get(page)
    assert html.status_code == 200
    assert html.headers["content-type"].startswith("text/html")

    urls = assets_of(html.text)

    assert "http://" not in html.text and "https://" not in html.text, html.text
    assert len(urls) >= 3, urls  # a script, the favicon and the OpenAPI document at least
    loaded = {}
    for url in urls:
        assert url.startswith("/") and not url.startswith("//"), url
        asset = await client.get(url)
        assert asset.status_code == 200, (url, asset.status_code)
        assert asset.content, url
        loaded[url] = asset
    scripts = [asset.text for url, asset in loaded.items() if url.endswith(".js")]
    assert any(script in text[:200_000] for text in scripts), urls  # the real bundle
    assert "/openapi.json" in urls


async def test_swagger_ui_oauth2_redirect_page_is_served(client: httpx.AsyncClient) -> None:
    page = await client.get("/docs/oauth2-redirect")
    assert page.status_code == 200
    assert "https://" not in page.text and "http://" not in page.text
