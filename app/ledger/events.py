"""The append-only task event log: one row per state transition, with a bounded reason."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from app.db import Connection

_EVENTS_ADD = """
    INSERT INTO task_events (task_id, from_state, to_state, reason, detail, at)
    SELECT t.task_id, t.from_state, t.to_state, t.reason, t.detail, $6
    FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::jsonb[])
        AS t(task_id, from_state, to_state, reason, detail)
"""


async def task_events_add(
    conn: Connection,
    *,
    rows: Iterable[Mapping[str, Any]],
    now: datetime,
) -> None:
    """Append transitions; each row has task_id, from_state, to_state, reason, detail?."""
    ids: list[uuid.UUID] = []
    froms: list[str | None] = []
    tos: list[str] = []
    reasons: list[str] = []
    details: list[Any] = []
    for r in rows:
        task_id = r["task_id"]
        ids.append(task_id if isinstance(task_id, uuid.UUID) else uuid.UUID(str(task_id)))
        froms.append(r.get("from_state"))
        tos.append(r["to_state"])
        reasons.append(r["reason"])
        details.append(r.get("detail"))
    if ids:
        await conn.execute(_EVENTS_ADD, ids, froms, tos, reasons, details, now)
