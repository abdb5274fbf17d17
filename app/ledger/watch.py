"""The watch feed's reads: the task and pool event logs after a position, in commit order.

Event ids come from one sequence, taken when a row is written, not when its transaction
commits: a transaction holding id 7 may commit after one holding id 9. A reader that
remembered "up to 9" would never see 7 (the outbox bug). So a position is two things:

* ``last`` — an id, and
* a snapshot (``xmin:xmax:in-progress xids``) taken by the read that produced it,

and it means: *every event visible to that snapshot with an id up to ``last`` was read*.
Each row stores its writing transaction's id (``xid``). Reading after position ``A`` up to a
snapshot ``S`` returns:

* **late** events: id ≤ ``A.last``, not visible to ``A``'s snapshot, visible to ``S``: the
  events of transactions that were in progress at ``A``'s read and committed since;
* **fresh** events: ``A.last`` < id ≤ the cut, visible to ``S``, the oldest first, at most
  ``limit`` of them and at most ``window`` ids ahead (so that a far-behind reader's read is
  bounded however sparse the ids are).

The new position is (the cut, ``S``). Every event visible to ``S`` with id ≤ cut is either in
``A`` or in this read, which is the position's meaning again, so reads chain without a gap.
Late events are returned whole (there are only as many as the transactions open at the
previous read wrote). An event ``e2`` written after ``e1`` of the same task or pool (which
waited for ``e1``'s row lock, so ``e1`` committed first) is never read before ``e1``: a
snapshot that sees ``e2``'s transaction sees ``e1``'s, and ``e1``'s id is lower.

The read runs in one ``REPEATABLE READ`` transaction: its first statement takes the snapshot
(and the sequence's last value, read after the snapshot, bounds every id it can see), and the
lease rows of the events are read in that same snapshot.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.db import Connection

__all__ = [
    "ORIGIN",
    "FeedPosition",
    "FeedRead",
    "watch_leases_of",
    "watch_position_now",
    "watch_read",
]


@dataclass(frozen=True, slots=True)
class FeedPosition:
    """Every event visible to snapshot (``xmin``, ``xmax``, ``xip``) with id ≤ ``last``."""

    last: int
    xmin: int
    xmax: int
    xip: tuple[int, ...] = ()

    @classmethod
    def parse(cls, snapshot: str, last: int) -> FeedPosition:
        """Build a position from a ``pg_snapshot`` text and the last id."""
        xmin, xmax, xip = snapshot.split(":")
        return cls(last, int(xmin), int(xmax), tuple(int(x) for x in xip.split(",") if x))

    @property
    def snapshot(self) -> str:
        """Return the snapshot as ``pg_snapshot`` text."""
        return f"{self.xmin}:{self.xmax}:{','.join(map(str, self.xip))}"

    def visible(self, xid: int) -> bool:
        """Return whether transaction ``xid`` had finished when the snapshot was taken."""
        return xid < self.xmin or (xid < self.xmax and xid not in self.xip)

    def within(self, other: FeedPosition) -> bool:
        """Return whether everything this position covers is covered by ``other``."""
        if self.last > other.last or self.xmax > other.xmax:
            return False
        # A transaction other still saw in progress must be in progress here too.
        return all(x >= self.xmax or x in self.xip for x in other.xip)


#: Before every event: nothing read yet.
ORIGIN = FeedPosition(0, 1, 1)


@dataclass(frozen=True, slots=True)
class FeedRead:
    """What one read returned: event rows in id order, the new position, and whether more
    events were already there past it."""

    rows: list[Any]
    position: FeedPosition
    more: bool


# The last id handed out (none yet: the sequence's start less one).
_NOW = (
    "SELECT pg_current_snapshot()::text, (SELECT CASE WHEN is_called THEN last_value "
    "ELSE last_value - 1 END FROM task_events_id_seq)"
)

_TASK_COLUMNS = (
    "SELECT 't' AS log, e.id, e.at, e.task_id, t.tenant_id, t.runtime_class, e.from_state, "
    "e.to_state, e.reason, e.detail, NULL::text AS pool_id, NULL::text[] AS operators, "
    "NULL::bigint AS version FROM task_events e JOIN tasks t ON t.id = e.task_id"
)
_POOL_COLUMNS = (
    "SELECT 'p' AS log, e.id, e.at, NULL::uuid, NULL::text, e.runtime_class, NULL::text, "
    "e.status, e.kind, NULL::jsonb, e.pool_id, e.operators, e.version FROM pool_events e"
)
_VISIBLE = "pg_visible_in_snapshot(e.xid::text::xid8, {}::text::pg_snapshot)"
# $1 after.last, $2 cut, $3 after.xmin, $4 after's snapshot, $5 the upper snapshot, $6 limit.
_FRESH = f"WHERE e.id > $1 AND e.id <= $2 AND {_VISIBLE.format('$5')} ORDER BY e.id LIMIT $6"
_LATE = (
    f"WHERE e.id <= $1 AND e.xid >= $3 AND NOT {_VISIBLE.format('$4')} "
    f"AND {_VISIBLE.format('$5')}"
)
_READ = (
    f"({_TASK_COLUMNS} {_FRESH}) UNION ALL ({_POOL_COLUMNS} {_FRESH}) "
    f"UNION ALL ({_TASK_COLUMNS} {_LATE}) UNION ALL ({_POOL_COLUMNS} {_LATE}) ORDER BY 2"
)


async def watch_position_now(conn: Connection) -> FeedPosition:
    """Return the present position: every event committed so far is within it."""
    snapshot, top = await conn.fetchrow(_NOW)
    return FeedPosition.parse(snapshot, int(top))


async def watch_read(
    conn: Connection,
    *,
    after: FeedPosition,
    until: FeedPosition | None,
    limit: int,
    window: int,
) -> FeedRead:
    """Return the events after ``after`` up to ``until`` (None: the present), oldest first.

    ``conn`` must be in a ``REPEATABLE READ`` transaction that has run nothing yet. ``until``
    must cover ``after`` (:meth:`FeedPosition.within`).
    """
    upper = await watch_position_now(conn) if until is None else until
    cut = min(upper.last, after.last + window)
    rows = await conn.fetch(
        _READ, after.last, cut, after.xmin, after.snapshot, upper.snapshot, limit
    )
    fresh = [r for r in rows if r[1] > after.last]
    more = cut < upper.last
    if len(fresh) >= limit:
        # Both logs were cut at ``limit`` rows: keep the first ``limit`` of the two.
        cut = fresh[limit - 1][1]
        rows = [r for r in rows if r[1] <= cut]
        more = True
    return FeedRead(rows, FeedPosition(cut, upper.xmin, upper.xmax, upper.xip), more)


_LEASES = (
    "SELECT l.id, l.task_id, l.pool_id, l.runtime_instance_id, l.epoch, l.state, "
    "l.granted_at, l.ended_at, l.end_reason, l.revoke_by, p.operators "
    "FROM leases l LEFT JOIN pools p ON p.id = l.pool_id WHERE l.task_id = ANY($1::uuid[]) "
)
# Split by liveness, so that each half reads its partial index on task_id.
_LEASES_OF = (
    f"{_LEASES} AND l.state IN ('ACTIVE', 'REVOKING') UNION ALL "
    f"{_LEASES} AND NOT (l.state IN ('ACTIVE', 'REVOKING'))"
)


async def watch_leases_of(
    conn: Connection, *, task_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, list[Any]]:
    """Return the leases of ``task_ids`` (every attempt's), by task."""
    if not task_ids:
        return {}
    found: dict[uuid.UUID, list[Any]] = {}
    for r in await conn.fetch(_LEASES_OF, sorted(set(task_ids))):
        found.setdefault(r[1], []).append(r)
    return found

