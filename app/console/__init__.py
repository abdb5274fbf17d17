"""The web console: static files served at ``/console``, talking to the public API only.

The console is plain HTML, CSS and JavaScript shipped inside the package (no build step, no
CDN): ``/console/`` serves ``index.html`` and ``/console/<file>`` the few files beside it.
It signs in with an API key kept in the tab's ``sessionStorage`` and sent as the bearer
header of each API call, so the key never travels in a URL or a cookie. Every answer carries
a strict Content-Security-Policy (scripts and styles from this origin only, no inline code,
no framing), ``X-Content-Type-Options: nosniff`` and no referrer.
"""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

__all__ = ["CONTENT_SECURITY_POLICY", "PATH", "console_routes"]

PATH = "/console"

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

#: The files the console is made of, by name, with their media types.
_FILES = {
    "index.html": "text/html; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}

_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}


def _read(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


def console_routes() -> list[BaseRoute]:
    """Return the routes that serve the console (read once, at app creation)."""
    files = {name: (_read(name), media) for name, media in _FILES.items()}

    async def index(request: Request) -> Response:
        body, media = files["index.html"]
        return Response(body, media_type=media, headers=_HEADERS)

    async def asset(request: Request) -> Response:
        found = files.get(request.path_params["name"])
        if found is None:
            return Response(
                "not found", status_code=404, media_type="text/plain; charset=utf-8",
                headers=_HEADERS,
            )
        body, media = found
        return Response(body, media_type=media, headers=_HEADERS)

    async def bare(request: Request) -> Response:
        return RedirectResponse(f"{request.scope.get('root_path', '')}{PATH}/", status_code=308)

    return [
        Route(PATH, bare, methods=["GET", "HEAD"], include_in_schema=False),
        Route(f"{PATH}/", index, methods=["GET", "HEAD"], include_in_schema=False),
        Route(f"{PATH}/{{name}}", asset, methods=["GET", "HEAD"], include_in_schema=False),
    ]
