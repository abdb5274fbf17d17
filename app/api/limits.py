"""The request body size limit: a body over ``settings.max_body_bytes`` is 413 problem+json.

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

    def __init__(self, app: ASGIApp, *, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on, or answer 413 when its body is too large."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        declared = headers.get(b"content-length")
        # A malformed Content-Length never gets here: the HTTP server refuses it first.
        if declared is not None and declared.strip().isdigit():
            if int(declared) > self.max_body_bytes:
                await self._refuse(scope, receive, send)
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
            if size > self.max_body_bytes:
                await self._refuse(scope, receive, send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(b"".join(chunks), receive), send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = problem_response(
            PayloadTooLarge.status,
            title=PayloadTooLarge.title,
            detail=f"the request body is larger than the limit of {self.max_body_bytes} bytes",
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
