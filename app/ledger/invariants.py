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
            OR NOT EXISTS (SELECT 1 FROM leases l WHERE l.task_id = t.id
                AND l.state IN ('ACTIVE', 'REVOKING')))""",
    # Holds (a preemptor's, a reclaimer's, a nominee's) belong to admitted tasks.
    "reservation_of_unleased_task": """
        SELECT count(*) FROM reservations r JOIN tasks t ON t.id = r.task_id
        WHERE t.state <> 'LEASED' AND NOT (r.hold AND t.state = 'ADMITTED')""",
    "members_mismatch": """
        SELECT count(*) FROM (
            SELECT r.task_id, sum(r.members) AS placed,
                   coalesce((t.spec -> 'gang' ->> 'members')::int, 1) AS wanted
            FROM reservations r JOIN tasks t ON t.id = r.task_id
            GROUP BY r.task_id, t.id) x WHERE placed <> wanted""",
    "lease_pool_without_reservation": """
        SELECT count(*) FROM leases l WHERE l.state IN ('ACTIVE', 'REVOKING') AND NOT EXISTS (
            SELECT 1 FROM reservations r WHERE r.task_id = l.task_id AND r.pool_id = l.pool_id)""",
    # Quota usage rows (app.ledger.quotas) against the live leases they count: per managed
    # (runtime class, resource), each tenant's row equals the sum of its live reservations
    # there, and a tenant with such usage has a row.
    "quota_usage_not_sum_of_leases": """
        WITH managed AS (SELECT runtime_class, resource FROM tenant_quotas
            UNION SELECT runtime_class, resource FROM cohort_quotas),
        live AS (SELECT t.tenant_id, t.runtime_class, x.resource, sum(x.amount) AS amount
            FROM reservations r JOIN tasks t ON t.id = r.task_id
            CROSS JOIN LATERAL (VALUES ('cpuMillis', r.cpu), ('memoryMiB', r.memory),
                ('llmSlots', r.llm)) AS x(resource, amount)
            WHERE NOT r.hold GROUP BY 1, 2, 3),
        want AS (SELECT l.* FROM live l JOIN managed m USING (runtime_class, resource)
            WHERE l.amount > 0)
        SELECT count(*) FROM quota_usage q FULL JOIN want w
            ON (q.tenant_id, q.runtime_class, q.resource)
             = (w.tenant_id, w.runtime_class, w.resource)
        WHERE coalesce(q.used, 0) <> coalesce(w.amount, 0)""",
    # Every level of the tree: each cohort's row equals what its members draw on it (each
    # tenant ``max(0, used - kept)``, kept = nominal - lending limit; each child cohort
    # ``max(0, used - (cap - lend))``), so by induction the live leases it covers; its
    # parent is the tree's.
    "quota_cohort_not_sum_of_draws": """
        SELECT count(*) FROM cohort_usage c FULL JOIN (
            SELECT cohort, runtime_class, resource, sum(d) AS d FROM (
                SELECT cohort, runtime_class, resource,
                    greatest(0, used - (nominal - coalesce(lend, nominal))) AS d
                FROM quota_usage
                UNION ALL
                SELECT parent, runtime_class, resource, greatest(0, used - (cap - lend))
                FROM cohort_usage WHERE parent IS NOT NULL) x GROUP BY 1, 2, 3) s
            ON (c.cohort, c.runtime_class, c.resource) = (s.cohort, s.runtime_class, s.resource)
        WHERE coalesce(c.used, 0) <> coalesce(s.d, 0)""",
    "quota_cohort_not_its_tree": """
        SELECT count(*) FROM cohort_usage c LEFT JOIN cohorts n ON n.id = c.cohort
        WHERE c.parent IS DISTINCT FROM n.parent""",
    "quota_usage_over_cap": """
        SELECT count(*) FROM quota_usage WHERE cap IS NOT NULL AND used > cap""",
    # Each usage row carries its tenant's quota and cohort as they are now (a tenant without
    # a quota there: nominal 0, no cap, nothing lent), only managed (class, resource) have
    # rows, and every quota has its row.
    "quota_usage_not_its_quota": """
        WITH managed AS (SELECT runtime_class, resource FROM tenant_quotas
            UNION SELECT runtime_class, resource FROM cohort_quotas)
        SELECT count(*) FROM quota_usage u
            LEFT JOIN tenant_quotas q USING (tenant_id, runtime_class, resource)
            LEFT JOIN tenants n ON n.id = u.tenant_id
            LEFT JOIN managed m USING (runtime_class, resource)
        WHERE m.resource IS NULL OR u.nominal <> coalesce(q.nominal, 0)
            OR u.cap IS DISTINCT FROM q.nominal + q.borrowing_limit
            OR u.lend IS DISTINCT FROM (CASE WHEN q.tenant_id IS NULL THEN 0
                ELSE q.lending_limit END)
            OR u.cohort <> coalesce(n.cohort, 'default')""",
    "quota_without_usage_row": """
        SELECT count(*) FROM tenant_quotas q WHERE NOT EXISTS (SELECT 1 FROM quota_usage u
            WHERE (u.tenant_id, u.runtime_class, u.resource)
                = (q.tenant_id, q.runtime_class, q.resource))""",
}


async def ledger_check(conn: Connection) -> dict[str, int]:
    """Return the count of violations of each ledger invariant (all zero when sound)."""
    return {name: int(await conn.fetchval(sql)) for name, sql in _CHECKS.items()}

