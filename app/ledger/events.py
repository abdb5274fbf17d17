"""The append-only task event log: one row per state transition, with a bounded reason."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from app.ledger.tables import task_events


async def task_events_add(
    conn: AsyncConnection,
    *,
    rows: Iterable[Mapping[str, Any]],
    now: datetime,
) -> None:
    """Append transitions; each row has task_id, from_state, to_state, reason, detail?."""
    values = [
        {
            "task_id": r["task_id"]
            if isinstance(r["task_id"], uuid.UUID)
            else uuid.UUID(str(r["task_id"])),
            "from_state": r.get("from_state"),
            "to_state": r["to_state"],
            "reason": r["reason"],
            "detail": r.get("detail"),
            "at": now,
        }
        for r in rows
    ]
    if values:
        await conn.execute(insert(task_events), values)
