"""HTTP API: the watch feed (``GET /v1/watch``): Server-Sent Events or a long poll.

With ``Accept: text/event-stream`` the answer is a stream: one ``id:``/``event:``/``data:``
record per event (``id`` is the event's cursor), a heartbeat comment when there is nothing to
say, ``event: bookmark`` when the cursor moved on without a visible event, and
``event: reconnect`` as the last record when the server ends the stream (database lost,
server stopping): its ``id`` is where to resume. Otherwise it is a long poll answering
``{"items", "cursor"}`` as soon as there is at least one event, or after ``wait`` seconds.

A watch does not take one of the in-flight request slots (:class:`app.api.shedding.
InFlightLimit`): it has its own limits per process and per key (:class:`app.services.
watch_hub.WatchHub`), past which it is answered 429.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from app.api.bodies import StrictRoute
from app.api.common import CamelModel, problems
from app.api.task_schemas import FastJSONResponse
from app.api.tasks import TenantHeader
from app.api.watch_cursors import cursor_of, watch_cursors
from app.auth import ADMIN, OPERATOR, RUNTIME, TENANT, Principal, require_roles
from app.errors import BerthError
from app.ledger.watch import ORIGIN, FeedPosition
from app.services.tenancy import tenants_reading
from app.services.watch import WatchCursors, WatchEvent, WatchFilter, WatchScope
from app.services.watch_hub import (
    HubLimits,
    WatchHub,
    WatchStep,
    feed_position,
    watch_session,
)

router = APIRouter(prefix="/v1", tags=["watch"], route_class=StrictRoute)

PATH = "/v1/watch"
WatcherDep = require_roles(ADMIN, OPERATOR, TENANT, RUNTIME)
#: How long an SSE client waits before reconnecting after the stream ends.
RETRY_MILLISECONDS = 1000


class WatchUnavailable(BerthError):
    """The database is unavailable; retry shortly from the same cursor."""

    status = 503
    title = "Service Unavailable"
    type_slug = "unavailable"


class WatchEventModel(CamelModel):
    """One change: its cursor, time, type and what it concerns."""

    cursor: str
    at: datetime
    type: str
    task_id: str | None = None
    lease_id: str | None = None
    pool_id: str | None = None
    tenant_id: str | None = None
    state: str | None = None
    data: dict[str, Any]


class WatchPage(CamelModel):
    """A long poll's answer: the events after the cursor, and the cursor to pass next."""

    items: list[WatchEventModel]
    cursor: str


def watch_hub(request: Request) -> WatchHub:
    """Return the process's hub, made on first use."""
    state = request.app.state
    hub = getattr(state, "watch_hub", None)
    if hub is None:
        s = state.settings
        hub = state.watch_hub = WatchHub(state.db, HubLimits(
            s.watch_max_watchers, s.watch_max_watchers_per_key, s.watch_buffer_batches))
    return hub


@router.get(
    "/watch",
    operation_id="watch",
    summary="Follow the changes the key may see",
    response_model=WatchPage,
    responses={
        **problems(400, 401, 403, 410, 422),
        200: {"content": {"text/event-stream": {}}},
    },
)
async def watch(
    request: Request,
    principal: Principal = WatcherDep,
    after: Annotated[str | None, Query(
        max_length=4096, description="A cursor (an event's, a bookmark's or a list's "
        "`watchCursor`), or `now`. Unset: from the oldest event kept.")] = None,
    wait: Annotated[float, Query(ge=0, le=60, description="Long poll: the most seconds to "
                                 "wait for an event.")] = 30,
    types: Annotated[str | None, Query(max_length=512, description="Comma-separated "
                                       "families (`task`, `lease`, `pool`) or types.")] = None,
    runtime_class: Annotated[str | None, Query(alias="runtimeClass", max_length=64)] = None,
    task_id: Annotated[str | None, Query(alias="taskId", max_length=64)] = None,
    pool_id: Annotated[str | None, Query(alias="poolId", max_length=64)] = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=4096)] = None,
    tenant: TenantHeader = None,
) -> Response:
    """Follow the changes the key may see after a cursor: Server-Sent Events when asked
    for `text/event-stream`, else a long poll.

    Scope: a tenant key its tasks, a runtime key the leases of its instances, an operator
    its pools and the leases on them, an admin everything. A cursor older than the history
    retention is 410 (`cursor-expired`): list again and watch from the list's `watchCursor`.
    """
    filt = WatchFilter.parse(types=types, runtime_class=runtime_class, task_id=task_id,
                             pool_id=pool_id)
    scope = WatchScope.of(principal, tenants=tenants_reading(principal, tenant)
                          if principal.role == TENANT else None)
    cursors = await watch_cursors(request)
    hub = watch_hub(request)
    start = await _start(request, hub, cursors, last_event_id or after)
    sub = hub.subscribe(scope, key=principal.key_id or principal.subject)
    heartbeat = request.app.state.settings.watch_heartbeat_seconds
    try:
        if "text/event-stream" in request.headers.get("accept", ""):
            session = watch_session(hub, sub, start=start, filt=filt, idle_seconds=heartbeat)
            return StreamingResponse(
                _stream(session, cursors, start, heartbeat),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                background=BackgroundTask(hub.unsubscribe, sub),
            )
        # Idle steps often enough to answer within a tenth of ``wait`` of its end.
        idle = max(0.05, min(heartbeat, wait / 10))
        session = watch_session(hub, sub, start=start, filt=filt, idle_seconds=idle)
        return await _long_poll(session, cursors, start, wait)
    except BaseException:
        hub.unsubscribe(sub)
        raise


async def _start(
    request: Request, hub: WatchHub, cursors: WatchCursors, after: str | None
) -> FeedPosition:
    if after is None:
        return ORIGIN
    if after == "now":
        # The hub's position is at most a read old: starting there replays the events of
        # that moment at worst, and spares the hub's watchers a read of their own each.
        return hub.present or await feed_position(request.app.state.db)
    return cursors.open(after, now=datetime.now(UTC))


async def _long_poll(
    session: AsyncIterator[WatchStep], cursors: WatchCursors, start: FeedPosition, wait: float
) -> Response:
    items: list[dict[str, Any]] = []
    position = start
    deadline = asyncio.get_running_loop().time() + wait
    try:
        async for step in session:
            if step.end is not None:
                if items:
                    break
                raise WatchUnavailable(extra={"headers": {"Retry-After": "1"}})
            items += [e.document(cursor_of(cursors, e.position)) for e in step.events]
            position = step.position
            if items or asyncio.get_running_loop().time() >= deadline:
                break
    finally:
        await session.aclose()  # type: ignore[attr-defined]
    page = {"items": items, "cursor": cursor_of(cursors, position)}
    return FastJSONResponse(page)


def _record(event: str, cursor: str, data: Any) -> bytes:
    return b"id: %s\nevent: %s\ndata: %s\n\n" % (
        cursor.encode(), event.encode(), orjson.dumps(data))


def _event_record(cursors: WatchCursors, event: WatchEvent) -> bytes:
    """Return the SSE record of ``event``, encoded once for all the watchers given it."""
    cursor = cursor_of(cursors, event.position)
    if event.encoded and event.encoded[0] == cursor:
        return bytes(event.encoded[1])
    record = _record(event.type, cursor, event.document(cursor))
    event.encoded[:] = (cursor, record)
    return record


async def _stream(
    session: AsyncIterator[WatchStep], cursors: WatchCursors, start: FeedPosition,
    heartbeat: float,
) -> AsyncIterator[bytes]:
    """Yield the SSE records of a session: its events, a bookmark or a heartbeat when it
    had nothing to send for ``heartbeat`` seconds, and the final ``reconnect``."""
    loop = asyncio.get_running_loop()
    sent, quiet_since = start, loop.time()
    try:
        yield b"retry: %d\n\n" % RETRY_MILLISECONDS
        async for step in session:
            if step.end is not None:
                cursor = cursor_of(cursors, step.position)
                yield _record("reconnect", cursor, {"cursor": cursor, "reason": step.end})
                return
            if step.events:
                yield b"".join([_event_record(cursors, e) for e in step.events])
                sent, quiet_since = step.events[-1].position, loop.time()
            elif loop.time() - quiet_since >= heartbeat * 0.9:
                # A position that read no new id is the same place for the client.
                if step.position.last != sent.last:
                    cursor = cursor_of(cursors, step.position)
                    yield _record("bookmark", cursor, {"cursor": cursor})
                    sent = step.position
                else:
                    yield b": heartbeat\n\n"
                quiet_since = loop.time()
    finally:
        await session.aclose()  # type: ignore[attr-defined]
