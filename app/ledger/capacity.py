"""Capacity totals across pools: what the pool utilization gauges show.

One read sums every registered ledger by pool status; it names no pool, so the gauges built
from it carry only fixed labels (resource and status).
"""

from __future__ import annotations

from app.db import Connection
from app.scheduling.records import Vector

_TOTALS = (
    "SELECT p.status, SUM(l.cpu_total), SUM(l.memory_total), SUM(l.llm_total), "
    "SUM(l.cpu_reserved), SUM(l.memory_reserved), SUM(l.llm_reserved) "
    "FROM pools p JOIN ledgers l ON l.pool_id = p.id GROUP BY p.status"
)


async def capacity_totals_read(conn: Connection) -> dict[str, tuple[Vector, Vector]]:
    """Return, per pool status, the summed ledger totals and reservations (cpu, memory, llm)."""
    return {
        r[0]: ((int(r[1]), int(r[2]), int(r[3])), (int(r[4]), int(r[5]), int(r[6])))
        for r in await conn.fetch(_TOTALS)
    }
