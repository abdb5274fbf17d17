"""History for ``berth bench e2e --finished N``: N finished tasks, as their lifecycle left them.

Claims and snapshots must not slow down with the finished tasks a ledger keeps. To show it,
the bench preloads N finished tasks before the run, generated server-side with ``INSERT …
SELECT … FROM generate_series`` (a million load in about 100 s on a 2-vCPU machine), in the
tenants and runtime classes of the dataset:

* 80% ``SUCCEEDED`` and 10% ``FAILED`` (reported by the runtime): events ``submitted``,
  ``leased``, ``lease_succeeded``/``lease_failed`` (the lifecycle since claims are row
  locks), and one ``COMPLETED`` lease with ``ended_at`` and ``end_reason``; the
  reservation is gone (released on completion, reservations are deleted when released);
* 10% ``CANCELLED`` while queued: events ``submitted`` and ``cancelled_by_tenant``, no lease.

They finished over the ``spread`` before the run (default 7 days), oldest first, and sit in
the table *before* the dataset's tasks (lower ``seq``), as history precedes a queue. The load
runs with ``session_replication_role = replica``: foreign keys and the queue-count triggers
are not checked row by row (the rows are consistent by construction, and finished tasks are
not queued); then the tables are vacuumed and analyzed, as autovacuum would have done long
ago to old rows, and a ``CHECKPOINT`` writes them out (needs a superuser or
``pg_checkpoint``), so the load's I/O is not measured as the run's.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from app.shards import shard_of
from bench.database import bench_connect
from bench.dataset import Dataset

__all__ = ["history_load"]

#: Finished tasks per INSERT … SELECT (bounded statements, visible progress).
CHUNK = 250_000

# $1 first index, $2 last index, $3 tenants, $4 their shards, $5 runtime classes,
# $6 pools (for leases), $7 newest finish time, $8 seconds between two finishes.
# g is the task's index (0 = newest); its state: 0..7 succeeded, 8 failed, 9 cancelled.
_TASKS = """
    INSERT INTO tasks (id, tenant_id, shard, state, priority, runtime_class, spec, labels,
                       attempts, max_attempts, failure_reason, placement, created_at,
                       admitted_at, updated_at, leased_at, finished_at)
    SELECT gen_random_uuid(), ($3::text[])[1 + g % array_length($3::text[], 1)],
           ($4::int[])[1 + g % array_length($3::text[], 1)],
           CASE g % 10 WHEN 8 THEN 'FAILED' WHEN 9 THEN 'CANCELLED' ELSE 'SUCCEEDED' END,
           0, rc,
           jsonb_build_object('runtimeClass', rc, 'requests',
                              jsonb_build_object('cpuMillis', 250, 'memoryMiB', 512,
                                                 'llmSlots', 0),
                              'constraints', '{}'::jsonb, 'affinity',
                              '{"required": [], "preferred": []}'::jsonb, 'gang', NULL,
                              'priority', 0, 'labels', lbl, 'maxAttempts', 3,
                              'preemption', 'never'),
           lbl, CASE WHEN g % 10 = 9 THEN 0 ELSE 1 END, 3,
           CASE WHEN g % 10 = 8 THEN 'runtime_reported_failure' END,
           CASE WHEN g % 10 <> 9 THEN json_build_array(
               2, json_build_array(pool), json_build_array(0.0), '[]'::json,
               json_build_array(json_build_array(pool, 1)), '[]'::json)::text END,
           fin - interval '2 minutes', fin - interval '2 minutes', fin,
           CASE WHEN g % 10 <> 9 THEN fin - interval '1 minute' END, fin
    FROM generate_series($2::int, $1::int, -1) AS g,
         LATERAL (SELECT ($5::text[])[1 + g % array_length($5::text[], 1)] AS rc,
                         ($6::text[])[1 + g % array_length($6::text[], 1)] AS pool,
                         $7::timestamptz - make_interval(secs => g * $8::float8) AS fin,
                         jsonb_build_object('app', 'app-' || (g % 400) || '-' || (g % 4))
                             AS lbl) x
    RETURNING id, state, placement::json -> 1 ->> 0 AS pool, leased_at, finished_at"""


async def history_load(
    url: str, ds: Dataset, *, finished: int, now: datetime,
    spread: timedelta = timedelta(days=7),
) -> float:
    """Insert ``finished`` finished tasks with their events and ended leases; return the
    seconds it took."""
    if finished <= 0:
        return 0.0
    tenants = sorted({row[2] for row in ds.tasks}) or ["tenant-000"]
    shards = [shard_of(t) for t in tenants]
    classes = sorted({row[5] for row in ds.tasks}) or ["python-3.11"]
    pools = [row[0] for row in ds.pools]
    step = spread.total_seconds() / finished
    conn = await bench_connect(url)
    try:
        started = await conn.fetchval("SELECT extract(epoch FROM clock_timestamp())")
        for hi in range(finished - 1, -1, -CHUNK):
            lo = max(0, hi - CHUNK + 1)
            async with conn.transaction():
                await conn.execute("SET LOCAL session_replication_role = replica")
                await conn.execute(
                    f"""WITH t AS ({_TASKS}),
                        l AS (INSERT INTO leases (id, task_id, pool_id, runtime_instance_id,
                                                  epoch, state, granted_at, expires_at,
                                                  ended_at, end_reason)
                              SELECT gen_random_uuid(), id, pool, 'rt-' || pool, 1,
                                     'COMPLETED', leased_at, finished_at + interval '1 minute',
                                     finished_at,
                                     CASE state WHEN 'FAILED' THEN 'failed'
                                                ELSE 'succeeded' END
                              FROM t WHERE state <> 'CANCELLED')
                        INSERT INTO task_events (task_id, at, from_state, to_state, reason,
                                                 detail)
                        SELECT e.* FROM t CROSS JOIN LATERAL (VALUES
                            (t.id, t.leased_at - interval '1 minute', NULL, 'ADMITTED',
                             'submitted', NULL::jsonb),
                            (t.id, t.leased_at, 'ADMITTED', 'LEASED', 'leased',
                             jsonb_build_object('poolId', t.pool, 'epoch', 1)),
                            (t.id, t.finished_at, 'LEASED', t.state,
                             CASE t.state WHEN 'FAILED' THEN 'lease_failed'
                                          ELSE 'lease_succeeded' END, NULL)
                        ) AS e(task_id, at, from_state, to_state, reason, detail)
                        WHERE t.state <> 'CANCELLED'
                        UNION ALL
                        SELECT e.* FROM t CROSS JOIN LATERAL (VALUES
                            (t.id, t.finished_at - interval '2 minutes', NULL, 'ADMITTED',
                             'submitted', NULL::jsonb),
                            (t.id, t.finished_at, 'ADMITTED', 'CANCELLED',
                             'cancelled_by_tenant', NULL)
                        ) AS e(task_id, at, from_state, to_state, reason, detail)
                        WHERE t.state = 'CANCELLED'""",
                    lo, hi, tenants, shards, classes, pools, now, step,
                )
        for table in ("tasks", "task_events", "leases"):
            await conn.execute(f"VACUUM (ANALYZE) {table}")
        # Old history is on disk, not in dirty buffers: without this, the checkpoint that
        # flushes the load lands in the run and its I/O and full-page writes count there.
        await conn.execute("CHECKPOINT")
        ended = await conn.fetchval("SELECT extract(epoch FROM clock_timestamp())")
        return float(ended - started)
    finally:
        await conn.close()
