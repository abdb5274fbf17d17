"""The request body size limit: a body over ``settings.max_body_bytes`` is 413 problem+json.

A route may have its own limit (``path_limits``): a task batch carries up to 1,000 specs, so
``POST /v1/task-batches`` is bounded by ``settings.max_batch_body_bytes`` instead.

A pure ASGI middleware, so an oversized body is refused before any of it is parsed: a
declared ``Content-Length`` over the limit is refused at once, and a body without one
(chunked) is read only up to the limit.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.problems import problem_response
from app.errors import PayloadTooLarge


class BodySizeLimit:
    """ASGI middleware answering 413 for request bodies larger than ``max_body_bytes``."""

    def __init__(
        self, app: ASGIApp, *, max_body_bytes: int, path_limits: dict[str, int] | None = None
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.path_limits = path_limits or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on, or answer 413 when its body is too large."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.path_limits.get(scope["path"], self.max_body_bytes)
        headers = dict(scope.get("headers") or ())
        declared = headers.get(b"content-length")
        # A malformed Content-Length never gets here: the HTTP server refuses it first.
        if declared is not None and declared.strip().isdigit():
            if int(declared) > limit:
                await self._refuse(scope, receive, send, limit)
                return
            await self.app(scope, receive, send)
            return
        # No length declared (chunked): read up to the limit, then hand the body on.
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > limit:
                await self._refuse(scope, receive, send, limit)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(b"".join(chunks), receive), send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        response = problem_response(
            PayloadTooLarge.status,
            title=PayloadTooLarge.title,
            detail=f"the request body is larger than the limit of {limit} bytes",
            type_uri=PayloadTooLarge().type_uri,
            headers={"Connection": "close"},
        )
        await response(scope, receive, send)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
