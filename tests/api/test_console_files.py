"""The console's files: served from the package with their media types, a strict
Content-Security-Policy and nosniff, no inline script, nothing from another origin."""

from __future__ import annotations

import re
from importlib import resources

import httpx
import pytest

from app.console import CONTENT_SECURITY_POLICY

STATIC = resources.files("app.console").joinpath("static")


@pytest.mark.parametrize(
    ("path", "media"),
    [
        pytest.param("/console/", "text/html; charset=utf-8", id="index"),
        pytest.param("/console/console.js", "text/javascript; charset=utf-8", id="script"),
        pytest.param("/console/console.css", "text/css; charset=utf-8", id="stylesheet"),
        pytest.param("/console/favicon.svg", "image/svg+xml", id="icon"),
    ],
)
async def test_each_file_has_its_type_and_the_security_headers(
    client: httpx.AsyncClient, path: str, media: str
) -> None:
    response = await client.get(path)

    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == media
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert response.headers["referrer-policy"] == "no-referrer"
    assert response.content == STATIC.joinpath(path.removeprefix("/console/") or "index.html"
                                               ).read_bytes()


def test_the_policy_allows_no_inline_code_and_no_other_origin() -> None:
    directives = dict(
        d.strip().split(" ", 1) for d in CONTENT_SECURITY_POLICY.split(";") if d.strip()
    )
    assert directives["default-src"] == "'none'"
    assert directives["script-src"] == "'self'"
    assert directives["style-src"] == "'self'"
    assert directives["connect-src"] == "'self'"
    assert directives["frame-ancestors"] == "'none'"
    assert "unsafe" not in CONTENT_SECURITY_POLICY


def test_the_page_has_no_inline_script_style_or_remote_url() -> None:
    html = STATIC.joinpath("index.html").read_text()
    scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", html, re.DOTALL)
    assert scripts and all('src="' in attrs and not body.strip() for attrs, body in scripts)
    assert "<style" not in html and not re.search(r"\s(style|on[a-z]+)\s*=", html)
    for name in ("index.html", "console.js", "console.css"):
        text = STATIC.joinpath(name).read_text()
        assert not re.search(r"(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", text), name
    assert "innerHTML" not in STATIC.joinpath("console.js").read_text()


async def test_the_bare_path_redirects_and_unknown_files_are_404(
    client: httpx.AsyncClient,
) -> None:
    bare = await client.get("/console")
    missing = await client.get("/console/../app/config.py")
    unknown = await client.get("/console/secrets.txt")

    assert bare.status_code == 308 and bare.headers["location"] == "/console/"
    assert missing.status_code == 404
    assert unknown.status_code == 404
    assert unknown.headers["x-content-type-options"] == "nosniff"


async def test_the_console_is_not_part_of_the_api_document(client: httpx.AsyncClient) -> None:
    document = (await client.get("/openapi.json")).json()
    assert not [p for p in document["paths"] if p.startswith("/console")]
