"""The watch feed's events: cursors, what a key may see, and the events of a read.

A read of the event logs (:mod:`app.ledger.watch`) gives rows; this module turns each row
into the public events it stands for and decides which of them a watcher receives:

* a task row is one ``task.*`` event, and a row that grants, revokes or ends the task's
  leases is also one ``lease.*`` event per lease (a gang's leases on several pools);
* a pool row is one ``pool.*`` event.

**Scope** is what the key may read elsewhere: a tenant key its tenants' ``task.*`` events; a
runtime key the ``lease.*`` events of its instances; an operator the ``pool.*`` events of
its pools and the ``lease.*`` events on them; an admin everything. One predicate
(:meth:`WatchScope.admits`) decides it for every path (the shared fan-out and a watcher's own
reads).

**Cursors** are positions (:class:`app.ledger.watch.FeedPosition`) sealed with the server
secret and the time they were made: a cursor that was altered or made up does not open (400),
and one older than the history retention is expired (410): the events after it may be gone.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from app.auth import ADMIN, OPERATOR, RUNTIME, TENANT, Principal
from app.errors import BadRequest, BerthError
from app.ledger.watch import ORIGIN, FeedPosition, FeedRead
from app.services.tokens import InvalidToken, Tokens

__all__ = [
    "EVENT_TYPES",
    "CursorExpired",
    "CursorInvalid",
    "WatchCursors",
    "WatchEvent",
    "WatchFilter",
    "WatchScope",
    "events_of",
]

EVENT_TYPES = (
    "task.admitted", "task.pending", "task.leased", "task.revoking", "task.requeued",
    "task.succeeded", "task.failed", "task.cancelled",
    "lease.granted", "lease.revoking", "lease.ended",
    "pool.updated", "pool.cordoned", "pool.draining", "pool.activated",
)
_FAMILIES = ("task", "lease", "pool")
#: Pool log kinds (the ``pools_log`` trigger) and the event each is.
_POOL_TYPES = {
    "created": "pool.updated", "updated": "pool.updated", "deleted": "pool.updated",
    "active": "pool.activated", "cordoned": "pool.cordoned", "draining": "pool.draining",
}
_FINISHED = {"SUCCEEDED": "task.succeeded", "FAILED": "task.failed",
             "CANCELLED": "task.cancelled"}
#: Task log reasons that change nothing a watcher follows (the row stays, for the trail).
_QUIET_REASONS = frozenset({"nomination_ended"})
_REVOKING = "revoking"

_CURSOR_SCOPE = "watch"
_CURSOR_VERSION = 1
_HEAD = struct.Struct(">BqQQ")


class CursorInvalid(BadRequest):
    """The cursor is not one this service made: pass back a watch event's cursor, or a
    list's watchCursor."""

    type_slug = "cursor-invalid"


class CursorExpired(BerthError):
    """The cursor is older than the retained history: list again (e.g. GET /v1/tasks) and
    watch from the list's watchCursor."""

    status = 410
    title = "Gone"
    type_slug = "cursor-expired"


def _varints(values: Iterable[int]) -> bytes:
    out = bytearray()
    for v in values:
        while v >= 0x80:
            out.append((v & 0x7F) | 0x80)
            v >>= 7
        out.append(v)
    return bytes(out)


def _unvarints(data: bytes) -> list[int]:
    values, v, shift = [], 0, 0
    for b in data:
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            values.append(v)
            v, shift = 0, 0
        elif shift > 63:
            raise ValueError("varint too long")
    if shift:
        raise ValueError("truncated varint")
    return values


@dataclass(frozen=True, slots=True)
class WatchCursors:
    """Seal positions into cursors and open them again, checking their age."""

    tokens: Tokens
    #: How long the history is kept (None: forever): older cursors are expired.
    retention: timedelta | None

    def seal(self, position: FeedPosition, *, now: datetime) -> str:
        """Return the cursor of ``position``, made at ``now``."""
        xip = sorted(position.xip)
        head = _HEAD.pack(_CURSOR_VERSION, int(now.timestamp() * 1000), position.last,
                          position.xmin)
        tail = _varints([position.xmax - position.xmin, len(xip),
                         *(x - position.xmin for x in xip)])
        return self.tokens.seal_bytes(head + tail, scope=_CURSOR_SCOPE)

    def open(self, cursor: str, *, now: datetime) -> FeedPosition:
        """Return the position of ``cursor``; raise CursorInvalid or CursorExpired."""
        try:
            data = self.tokens.open_bytes(cursor, scope=_CURSOR_SCOPE)
            version, made_ms, last, xmin = _HEAD.unpack_from(data)
            span, count, *xip = _unvarints(data[_HEAD.size:])
        except (InvalidToken, struct.error, ValueError):
            raise CursorInvalid() from None
        if version != _CURSOR_VERSION or len(xip) != count:
            raise CursorInvalid()
        position = FeedPosition(last, xmin, xmin + span, tuple(xmin + x for x in xip))
        made = datetime.fromtimestamp(made_ms / 1000, UTC)
        if position != ORIGIN and self.retention is not None and made < now - self.expiry:
            raise CursorExpired()
        return position

    @property
    def expiry(self) -> timedelta:
        """Return the age past which a cursor is refused: the retention less a margin for
        the transactions that were open when the cursor was made."""
        assert self.retention is not None
        return self.retention - min(self.retention / 2, timedelta(minutes=10))


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One public event, with what scope and filters decide on."""

    type: str
    at: datetime
    #: Where a watcher that got this event resumes (the row's events after it included).
    position: FeedPosition
    task_id: uuid.UUID | None = None
    lease_id: uuid.UUID | None = None
    pool_id: str | None = None
    tenant_id: str | None = None
    state: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    runtime_class: str | None = None
    runtime_instance_id: str | None = None
    operators: tuple[str, ...] = ()
    #: The event as a stream sends it, ``(cursor, bytes)``: encoded once for every watcher
    #: that receives this event with that cursor (the hub hands them all the same object).
    encoded: list[Any] = field(init=False, default_factory=list, compare=False, repr=False)

    @property
    def family(self) -> str:
        """Return ``task``, ``lease`` or ``pool``."""
        return self.type.split(".", 1)[0]

    def document(self, cursor: str) -> dict[str, Any]:
        """Return the event as the API shows it."""
        doc: dict[str, Any] = {
            "cursor": cursor,
            "at": self.at.astimezone(UTC).isoformat().replace("+00:00", "Z"),
            "type": self.type,
        }
        if self.task_id is not None:
            doc["taskId"] = str(self.task_id)
        if self.lease_id is not None:
            doc["leaseId"] = str(self.lease_id)
        if self.pool_id is not None:
            doc["poolId"] = self.pool_id
        if self.tenant_id is not None:
            doc["tenantId"] = self.tenant_id
        if self.state is not None:
            doc["state"] = self.state
        doc["data"] = self.data
        return doc


@dataclass(frozen=True, slots=True)
class WatchScope:
    """What one key may see of the feed."""

    role: str
    subject: str
    tenant_ids: frozenset[str] = frozenset()
    runtime_instance_ids: frozenset[str] = frozenset()

    @classmethod
    def of(cls, principal: Principal, *, tenants: frozenset[str] | None = None) -> WatchScope:
        """Return the scope of ``principal`` (a tenant key narrowed to ``tenants``)."""
        return cls(principal.role, principal.subject,
                   tenants if tenants is not None else principal.tenant_ids,
                   principal.runtime_instance_ids)

    def admits(self, event: WatchEvent) -> bool:
        """Return whether the key may see ``event``."""
        family = event.family
        if self.role == ADMIN:
            return True
        if self.role == TENANT:
            return family == "task" and event.tenant_id in self.tenant_ids
        if self.role == RUNTIME:
            return family == "lease" and event.runtime_instance_id in self.runtime_instance_ids
        if self.role == OPERATOR:
            return family in ("pool", "lease") and self.subject in event.operators
        return False


@dataclass(frozen=True, slots=True)
class WatchFilter:
    """The filters a watcher asked for (None: any)."""

    types: frozenset[str] | None = None
    runtime_class: str | None = None
    task_id: uuid.UUID | None = None
    pool_id: str | None = None

    @classmethod
    def parse(cls, *, types: str | None, runtime_class: str | None, task_id: str | None,
              pool_id: str | None) -> WatchFilter:
        """Return the filter of the query parameters; raise BadRequest for unknown types
        or a task id that is not a UUID."""
        wanted: set[str] | None = None
        if types is not None:
            wanted = set()
            for name in filter(None, (t.strip() for t in types.split(","))):
                if name in _FAMILIES:
                    wanted.update(t for t in EVENT_TYPES if t.startswith(name + "."))
                elif name in EVENT_TYPES:
                    wanted.add(name)
                else:
                    raise BadRequest(
                        f"unknown event type {name!r}: use task, lease, pool or one of "
                        + ", ".join(EVENT_TYPES))
        try:
            task = uuid.UUID(task_id) if task_id is not None else None
        except ValueError:
            raise BadRequest(f"taskId {task_id!r} is not a task id") from None
        return cls(frozenset(wanted) if wanted is not None else None, runtime_class, task,
                   pool_id)

    def matches(self, event: WatchEvent) -> bool:
        """Return whether ``event`` passes every filter."""
        return (
            (self.types is None or event.type in self.types)
            and (self.runtime_class is None or event.runtime_class == self.runtime_class)
            and (self.task_id is None or event.task_id == self.task_id)
            and (self.pool_id is None or event.pool_id == self.pool_id)
        )


def _lease_kind(row: Any) -> str | None:
    """Return what a task row did to its leases: granted, revoking, ended or None."""
    before, after, reason = row[6], row[7], row[8]
    if before == "ADMITTED" and after == "LEASED":
        return "granted"
    if before == "LEASED" and after == "LEASED":
        return "revoking" if reason == _REVOKING else None
    return "ended" if before == "LEASED" else None


def lease_rows_wanted(read: FeedRead) -> list[uuid.UUID]:
    """Return the tasks whose lease rows the events of ``read`` need."""
    return [r[3] for r in read.rows if r[0] == "t" and _lease_kind(r) is not None]


def _task_type(row: Any) -> str | None:
    before, after, reason = row[6], row[7], row[8]
    if reason in _QUIET_REASONS:
        return None
    if after in _FINISHED:
        return _FINISHED[after]
    if after == "LEASED":
        return "task.leased" if before != "LEASED" else (
            "task.revoking" if reason == _REVOKING else None)
    if before is None:
        return "task.admitted"
    return "task.requeued" if before == "LEASED" else "task.pending"


def _task_events(row: Any, leases: Sequence[Any], position: FeedPosition) -> list[WatchEvent]:
    """Return the events of one task row: its ``task.*`` event and its leases' events."""
    events: list[WatchEvent] = []
    at, task_id, detail = row[2], row[3], row[9] or {}
    kind = _lease_kind(row)
    if kind is not None:
        for lease in leases:
            granted, ended = lease[6], lease[7]
            if (kind == "granted" and granted == at) or (kind == "ended" and ended == at) or (
                    kind == "revoking" and granted <= at and (ended is None or ended >= at)):
                events.append(_lease_event(kind, lease, at, row[5], position))
    typ = _task_type(row)
    if typ is not None:
        data: dict[str, Any] = {"reason": row[8], "fromState": row[6]}
        if "epoch" in detail:
            data["epoch"] = detail["epoch"]
        events.append(WatchEvent(
            typ, at, position, task_id=task_id, tenant_id=row[4], state=row[7],
            pool_id=detail.get("poolId") if typ == "task.leased" else None, data=data,
            runtime_class=row[5],
        ))
    return events


def _lease_event(kind: str, lease: Any, at: datetime, runtime_class: str,
                 position: FeedPosition) -> WatchEvent:
    data: dict[str, Any] = {"epoch": int(lease[4]), "runtimeInstanceId": lease[3]}
    state = {"granted": "ACTIVE", "revoking": "REVOKING"}.get(kind, lease[5])
    if kind == "revoking" and lease[9] is not None:
        data["revokeBy"] = lease[9].astimezone(UTC).isoformat().replace("+00:00", "Z")
    if kind == "ended":
        data["endReason"] = lease[8]
    return WatchEvent(
        f"lease.{kind}", at, position, task_id=lease[1], lease_id=lease[0], pool_id=lease[2],
        state=state, data=data, runtime_class=runtime_class, runtime_instance_id=lease[3],
        operators=tuple(lease[10] or ()),
    )


def _pool_event(row: Any, position: FeedPosition) -> WatchEvent:
    kind = row[8]
    data: dict[str, Any] = {"version": int(row[12])}
    if kind in ("created", "deleted"):
        data["change"] = kind
    return WatchEvent(
        _POOL_TYPES[kind], row[2], position, pool_id=row[10],
        state="DELETED" if kind == "deleted" else row[7], data=data, runtime_class=row[5],
        operators=tuple(row[11] or ()),
    )


def events_of(
    read: FeedRead, *, after: FeedPosition, leases: dict[uuid.UUID, list[Any]]
) -> list[WatchEvent]:
    """Return the public events of ``read`` (which began at ``after``), in order.

    Each event's position is where a watcher that received it resumes: past its row only
    with the row's last event (the row's other events come again), and past a late row only
    once every late row is in (their ids are below ones already read).
    """
    upper = read.position
    late = sum(1 for r in read.rows if r[1] <= after.last)
    events: list[WatchEvent] = []
    before = after
    for k, row in enumerate(read.rows):
        if k < late - 1:
            done = after
        elif k == late - 1:
            done = FeedPosition(after.last, upper.xmin, upper.xmax, upper.xip)
        else:
            done = FeedPosition(row[1], upper.xmin, upper.xmax, upper.xip)
        if row[0] == "p":
            row_events = [_pool_event(row, done)]
        else:
            row_events = _task_events(row, leases.get(row[3], ()), done)
        for i, event in enumerate(row_events):
            if i < len(row_events) - 1:
                event = _moved(event, before)
            events.append(event)
        before = done
    return events


def _moved(event: WatchEvent, position: FeedPosition) -> WatchEvent:
    from dataclasses import replace

    return replace(event, position=position)
