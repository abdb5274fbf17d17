"""Wakeups over LISTEN/NOTIFY: events that could let a pending task fit now.

Writers call :func:`wakeup_notify` inside their transaction; PostgreSQL delivers the
notification only if that transaction commits. Reconcilers LISTEN on :data:`CHANNEL`, unpark
pending tasks on any source other than ``submitted`` and start a pass at once. A periodic
tick does the same as a safety net for a notification missed while disconnected.
"""

from __future__ import annotations

from enum import StrEnum

from app.db import Connection

CHANNEL = "berth_wakeup"


class WakeSource(StrEnum):
    """Why reconcilers are woken; the only values of the wakeups metric's label."""

    SUBMITTED = "submitted"
    CAPACITY_RELEASED = "capacity_released"
    POOL_ADDED = "pool_added"
    POOL_ACTIVATED = "pool_activated"
    POOL_HEALTHY = "pool_healthy"
    LEDGER_RAISED = "ledger_raised"
    POOL_CHANGED = "pool_changed"
    TICK = "tick"


async def wakeup_notify(conn: Connection, *, source: WakeSource) -> None:
    """Notify reconcilers of ``source`` when the current transaction commits."""
    await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, source.value)
