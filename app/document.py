"""``berth openapi``: the OpenAPI document of the Berth API, built without a database.

The app is built but never started, so no connection is made. The committed
docs/openapi.json is this command's output (tests/api/test_openapi.py checks it is current).
"""

from __future__ import annotations

from pathlib import Path

from app.api.openapi import openapi_build, openapi_render
from app.config import Settings
from app.main import create_app


def openapi_document() -> dict:
    """Return the OpenAPI document of the Berth app."""
    settings = Settings(database_url="postgresql://berth@localhost/berth")
    return openapi_build(create_app(settings))


def openapi_write(output: str | Path | None = None) -> int:
    """Print the document, or write it to ``output``; return 0."""
    text = openapi_render(openapi_document())
    if output is None:
        print(text, end="")
    else:
        Path(output).write_text(text)
    return 0
