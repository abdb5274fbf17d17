"""Pieces every resource module of the API shares: camelCase models, pagination, problems."""

from __future__ import annotations

import base64
from typing import Annotated, Any, Generic, TypeVar

import orjson
from fastapi import Query
from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from app.errors import BadRequest

T = TypeVar("T")


class CamelModel(BaseModel):
    """A response/request model whose JSON names are camelCase."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class Page(CamelModel, Generic[T]):
    """One page of a list: its items and the cursor of the next page (null on the last)."""

    items: list[T]
    next_cursor: str | None = None


def cursor_encode(position: Any) -> str:
    """Return an opaque cursor for ``position`` (any JSON value)."""
    return base64.urlsafe_b64encode(orjson.dumps(position)).decode().rstrip("=")


def cursor_decode(cursor: str) -> Any:
    """Return the position inside ``cursor``, or raise 400 for a cursor Berth did not make."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        return orjson.loads(base64.urlsafe_b64decode(padded.encode()))
    except (ValueError, TypeError):
        raise BadRequest("the cursor is not valid; pass back the nextCursor of a list") from None


LimitQuery = Annotated[int, Query(ge=1, le=500, description="Items per page (1..500).")]
CursorQuery = Annotated[
    str | None,
    Query(max_length=512, description="The `nextCursor` of the previous page."),
]

#: Problem responses to declare on routes, for generated clients.
PROBLEM = {
    "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
}


def problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """Return the ``responses=`` declaration of problem+json answers for ``statuses``."""
    descriptions = {
        400: "Bad request",
        401: "Missing or invalid API key",
        403: "The key's role may not do this",
        404: "Not found (or not visible to this caller)",
        409: "Conflict with the current state",
        412: "If-Match does not match the current ETag",
        413: "Request body too large",
        422: "Invalid content",
        429: "Too many requests",
        503: "Not ready",
    }
    return {s: {"description": descriptions[s], **PROBLEM} for s in statuses}
