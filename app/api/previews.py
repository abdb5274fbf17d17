"""What the two preview routes share: their ``limit`` and ``cursor`` and the worker call.

A preview's pages are positions sealed in opaque cursors (:mod:`app.services.tokens`) under a
scope naming what was previewed, so a cursor altered, made up or given for another preview
is 400. The answer is decided and serialized by a worker (:mod:`app.services.offload`); the
route only reads, waits and sends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Query, Request, Response

from app.api.tasks import cursor_position
from app.services.previews import DEFAULT_LIMIT, MAX_LIMIT

__all__ = ["PreviewCursorQuery", "PreviewLimitQuery", "preview_answer"]

PreviewLimitQuery = Annotated[int, Query(
    ge=1, le=MAX_LIMIT,
    description=f"Entries of each list of the page (1..{MAX_LIMIT}, default {DEFAULT_LIMIT}).",
)]
PreviewCursorQuery = Annotated[str | None, Query(
    max_length=512, description="The `nextCursor` of the previous page of the same preview."
)]


async def preview_answer(
    request: Request,
    *,
    scope: str,
    cursor: str | None,
    limit: int,
    compute: Callable[..., bytes],
    args: tuple[Any, ...],
) -> Response:
    """Return the page at ``cursor`` that ``compute(*args, offset, limit, next_cursor)``
    builds in a worker, as a JSON answer."""
    tokens = await request.app.state.tokens.get()
    offset = cursor_position(tokens, cursor, scope=scope)
    next_cursor = tokens.seal(offset + limit, scope=scope)
    body = await request.app.state.offload.run(compute, *args, offset, limit, next_cursor)
    return Response(body, media_type="application/json")
