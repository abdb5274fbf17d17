"""Fast paths for the API's two hot operations: submit a task, read a task.

FastAPI's generic machinery (nested routers, dependency resolution for the key, the role, the
headers and the body, per-request exit stacks) costs several times the work these two
operations do. So :class:`FastRoute` entries, placed ahead of the API's routes and hidden from
the OpenAPI document, answer the plain case directly — a cached tenant key, valid headers, a
JSON body the core's ``TaskSpec`` accepts, a well-formed task id — and hand *every* other
request, unchanged and with its body replayed, to the regular FastAPI route (which owns the
documented contract and every error answer). So the fast path only ever answers what the
regular route would answer, with the same status, headers and body.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from fastapi import FastAPI
from pydantic import ValidationError
from starlette._utils import get_route_path
from starlette.routing import BaseRoute, Match, NoMatchFound
from starlette.types import Message, Receive, Scope, Send

from app.api.tasks import (
    TENANT_HEADER,
    task_get_answer,
    task_submit_answer,
    tenant_acting,
    tenants_reading,
)
from app.auth import TENANT, KeyCache, Principal
from app.errors import BerthError
from app.ledger.keys import key_hash
from app.scheduling.spec import TaskSpec

__all__ = ["FastRoute", "fast_routes_install"]

#: Set in the scope of a request the fast path hands on, so that its route no longer matches.
_HANDED_ON = "berth.fast_handed_on"

_AUTHORIZATION = b"authorization"
_CONTENT_TYPE = b"content-type"
_TENANT = TENANT_HEADER.lower().encode()
_IDEMPOTENCY_KEY = b"idempotency-key"

Handler = Callable[[Scope, Receive, Send], Awaitable[bool]]


class FastRoute(BaseRoute):
    """A route answering one method and path itself, or handing the request to the app's routes.

    ``handler`` returns False (having sent nothing) when the request is not its plain case;
    the request is then routed as if this route did not exist.
    """

    def __init__(self, method: str, path: str, handler: Handler) -> None:
        self.method = method
        self.path = path
        self.name = f"fast:{method} {path}"
        self.include_in_schema = False
        self._regex = re.compile(re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", path))
        self._handler = handler

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        """Match only this method and path, and never a request already handed on."""
        if scope["type"] != "http" or scope["method"] != self.method or _HANDED_ON in scope:
            return Match.NONE, {}
        found = self._regex.fullmatch(get_route_path(scope))
        if found is None:
            return Match.NONE, {}
        return Match.FULL, {"path_params": found.groupdict()}

    def url_path_for(self, name: str, /, **path_params: Any) -> Any:
        """Name no URL: the regular route of the same path does."""
        raise NoMatchFound(name, path_params)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer the request, or route it on to the regular route with its body replayed."""
        received: list[Message] = []

        async def recording_receive() -> Message:
            message = await receive()
            received.append(message)
            return message

        if await self._handler(scope, recording_receive, send):
            return
        scope[_HANDED_ON] = True
        await scope["router"].app(scope, _replay(received, receive), send)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay


def _headers(scope: Scope) -> dict[bytes, bytes]:
    """Return the request headers by lower-case name, the first of repeated ones (as Starlette)."""
    headers: dict[bytes, bytes] = {}
    for name, value in scope["headers"]:
        headers.setdefault(name, value)
    return headers


def _tenant_principal(app: Any, authorization: bytes | None) -> Principal | None:
    """Return the cached, still fresh principal of a tenant key, or None for any other case."""
    if authorization is None:
        return None
    scheme, _, key = authorization.decode("latin-1").partition(" ")
    key = key.strip()
    if not key or scheme.lower() != "bearer":
        return None
    cache: KeyCache = app.state.key_cache
    principal = cache.get(key_hash(key), time.monotonic())
    if principal is None or principal.role != TENANT:
        return None
    return principal


def _tenant_header(headers: dict[bytes, bytes]) -> tuple[bool, str | None]:
    """Return (plain, value) of ``X-Berth-Tenant``: not plain when over its length limit."""
    raw = headers.get(_TENANT)
    if raw is None:
        return True, None
    value = raw.decode("latin-1")
    return len(value) <= 128, value


def _is_json(content_type: bytes | None) -> bool:
    if content_type is None:
        return False
    content_type = content_type.lower()
    return content_type == b"application/json" or content_type.startswith(b"application/json;")


async def _read_body(receive: Receive) -> bytes | None:
    """Return the whole request body, or None when the client went away."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def submit_fast(scope: Scope, receive: Receive, send: Send) -> bool:
    """Answer ``POST /v1/tasks`` for a cached tenant key and a valid spec; else return False."""
    app = scope["app"]
    headers = _headers(scope)
    principal = _tenant_principal(app, headers.get(_AUTHORIZATION))
    if principal is None or not _is_json(headers.get(_CONTENT_TYPE)):
        return False
    plain, tenant = _tenant_header(headers)
    if not plain:
        return False
    try:
        tenant_id = tenant_acting(principal, tenant)
    except BerthError:
        return False  # the regular route says why
    idempotency_key: str | None = None
    raw_key = headers.get(_IDEMPOTENCY_KEY)
    if raw_key is not None:
        idempotency_key = raw_key.decode("latin-1")
        if not 1 <= len(idempotency_key) <= 255:
            return False
    body = await _read_body(receive)
    if not body:
        return False
    try:
        spec = TaskSpec.model_validate(orjson.loads(body))
    except (orjson.JSONDecodeError, ValidationError):
        return False
    async with app.state.statements.connection() as conn:
        response = await task_submit_answer(
            conn, tenant_id=tenant_id, spec=spec, idempotency_key=idempotency_key
        )
    await response(scope, receive, send)
    return True


async def get_fast(scope: Scope, receive: Receive, send: Send) -> bool:
    """Answer ``GET /v1/tasks/{taskId}`` for a cached tenant key and a UUID; else return False."""
    app = scope["app"]
    headers = _headers(scope)
    principal = _tenant_principal(app, headers.get(_AUTHORIZATION))
    if principal is None:
        return False
    plain, tenant = _tenant_header(headers)
    if not plain:
        return False
    try:
        tenants = tenants_reading(principal, tenant)
    except BerthError:
        return False
    raw_id = scope["path_params"]["taskId"]
    if len(raw_id) > 64:
        return False
    try:
        task_id = uuid.UUID(raw_id)
    except ValueError:
        return False
    async with app.state.statements.connection() as conn:
        response = await task_get_answer(conn, task_id=task_id, tenant_ids=tenants)
    await response(scope, receive, send)
    return True


def fast_routes_install(app: FastAPI) -> None:
    """Put the fast paths of task submit and task read ahead of the app's routes."""
    app.router.routes[0:0] = [
        FastRoute("POST", "/v1/tasks", submit_fast),
        FastRoute("GET", "/v1/tasks/{taskId}", get_fast),
    ]
