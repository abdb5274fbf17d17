"""The ledger's invariants, checked by counting the rows that break each one.

PostgreSQL enforces most of them as it writes (conditional updates, CHECK constraints); this
check reads them back whole, for drills, benchmarks and operators who want to verify a
database after an incident. Every count is zero on a sound ledger.
"""

from __future__ import annotations

from app.db import Connection

_CHECKS = {
    "ledger_over_total": """
        SELECT count(*) FROM ledgers WHERE cpu_reserved > cpu_total
            OR memory_reserved > memory_total OR llm_reserved > llm_total""",
    "reserved_not_sum_of_reservations": """
        SELECT count(*) FROM ledgers l LEFT JOIN (
            SELECT pool_id, sum(cpu) cpu, sum(memory) memory, sum(llm) llm
            FROM reservations GROUP BY pool_id) r ON r.pool_id = l.pool_id
        WHERE l.cpu_reserved <> coalesce(r.cpu, 0) OR l.memory_reserved <> coalesce(r.memory, 0)
            OR l.llm_reserved <> coalesce(r.llm, 0)""",
    "leased_without_reservation_or_lease": """
        SELECT count(*) FROM tasks t WHERE t.state = 'LEASED' AND (
            NOT EXISTS (SELECT 1 FROM reservations r WHERE r.task_id = t.id)
            OR NOT EXISTS (
                SELECT 1 FROM leases l WHERE l.task_id = t.id AND l.state = 'ACTIVE'))""",
    "reservation_of_unleased_task": """
        SELECT count(*) FROM reservations r JOIN tasks t ON t.id = r.task_id
        WHERE t.state <> 'LEASED'""",
    "members_mismatch": """
        SELECT count(*) FROM (
            SELECT r.task_id, sum(r.members) AS placed,
                   coalesce((t.spec -> 'gang' ->> 'members')::int, 1) AS wanted
            FROM reservations r JOIN tasks t ON t.id = r.task_id
            GROUP BY r.task_id, t.id) x WHERE placed <> wanted""",
    "lease_pool_without_reservation": """
        SELECT count(*) FROM leases l WHERE l.state = 'ACTIVE' AND NOT EXISTS (
            SELECT 1 FROM reservations r WHERE r.task_id = l.task_id AND r.pool_id = l.pool_id)""",
}


async def ledger_check(conn: Connection) -> dict[str, int]:
    """Return the count of violations of each ledger invariant (all zero when sound)."""
    return {name: int(await conn.fetchval(sql)) for name, sql in _CHECKS.items()}

