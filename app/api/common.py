"""Pieces every resource module of the API shares: camelCase models, pagination, problems."""

from __future__ import annotations

from typing import Annotated, Any, Generic, TypeVar

from fastapi import Query
from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from app.errors import BadRequest
from app.services.tokens import InvalidToken, Tokens

T = TypeVar("T")


#: Tenant and cohort ids: lowercase letters, digits, '.', '_' and '-', starting with a letter
#: or a digit, at most 63 characters.
ID_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"
ID_RULE = (
    "1 to 63 characters: lowercase letters, digits, '.', '_' or '-', the first a letter or "
    "a digit"
)


class CamelModel(BaseModel):
    """A response model whose JSON names are camelCase (built in Python by field name)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class RequestModel(BaseModel):
    """A request body, read strictly: camelCase names only, no unknown fields and
    no coercion — the document says integer, so `"500"`, `500.0` and `true` are 422."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_alias=True,
        validate_by_name=False,
        extra="forbid",
        strict=True,
    )


class Page(CamelModel, Generic[T]):
    """One page of a list: its items and the cursor of the next page (null on the last)."""

    items: list[T]
    next_cursor: str | None = None


def cursor_encode(tokens: Tokens, position: Any, *, scope: str) -> str:
    """Return an opaque cursor for ``position`` (any JSON value) in the list ``scope``:
    sealed, so that a cursor Berth did not make for this list does not open."""
    return tokens.seal_json(position, scope=scope)


def cursor_decode(tokens: Tokens, cursor: str, *, scope: str) -> Any:
    """Return the position inside ``cursor``, or raise 400 for a cursor Berth did not make
    for the list ``scope``."""
    try:
        return tokens.open_json(cursor, scope=scope)
    except InvalidToken:
        raise BadRequest("the cursor is not valid; pass back the nextCursor of a list") from None


def cursor_after_id(tokens: Tokens, cursor: str | None, *, scope: str) -> str | None:
    """Return the id a list ordered by id resumes after (None: from the start), or raise 400
    for a cursor Berth did not make for the list ``scope``."""
    if cursor is None:
        return None
    after = cursor_decode(tokens, cursor, scope=scope)
    if not isinstance(after, str):
        raise BadRequest("the cursor is not valid; pass back the nextCursor of a list")
    return after


LimitQuery = Annotated[int, Query(ge=1, le=500, description="Items per page (1..500).")]
CursorQuery = Annotated[
    str | None,
    Query(max_length=512, description="The `nextCursor` of the previous page."),
]

#: Problem responses to declare on routes, for generated clients.
PROBLEM = {
    "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
}


#: Answers the HTTP layer can give to any operation, before or around its route:
#: read timeouts (408), a key's rate limit (429), an oversized request head (431), and the
#: in-flight bound or an unreachable database (503). Every operation declares them.
HTTP_LAYER_STATUSES = (408, 429, 431, 503)

#: Answers any operation that takes a body can give: not JSON (400), too large (413), not
#: ``application/json`` (415), against the schema (422).
BODY_STATUSES = (400, 413, 415, 422)

_RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds to wait before retrying.",
        "required": True,
        "schema": {"type": "integer", "minimum": 1},
    }
}

_DESCRIPTIONS = {
    400: "Bad request: the body is not JSON (a syntax error, not UTF-8, a repeated key, "
    "nesting too deep), or a cursor or header value Berth cannot use",
    401: "Missing or invalid API key",
    403: "The key's role may not do this",
    404: "Not found (or not visible to this caller)",
    408: "The request was not received in full in time; the connection is closed",
    409: "Conflict with the current state",
    410: "The cursor is older than the retained history (`cursor-expired`): list again and "
    "resume from the list's `watchCursor`",
    412: "If-Match does not match the current ETag",
    413: "Request body too large",
    415: "The body is not of a media type the operation accepts (`application/json`)",
    422: "Invalid content: the body or a parameter breaks the schema (types are strict)",
    429: "Too many requests (from this API key, or previews computed at once by this "
    "process); retry after `Retry-After` seconds",
    431: "The request line and headers are too large; the connection is closed",
    503: "Overloaded, or the database is unreachable; retry after `Retry-After` seconds",
}


def problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """Return the ``responses=`` declaration of problem+json answers for ``statuses``."""
    declared: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        declared[status] = {"description": _DESCRIPTIONS[status], **PROBLEM}
        if status in (429, 503):
            declared[status]["headers"] = _RETRY_AFTER
    return declared
