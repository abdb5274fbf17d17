"""Retention of history: finished tasks, their events and their leases are pruned together.

A finished task (``SUCCEEDED``, ``FAILED``, ``CANCELLED``) whose ``finished_at`` is older than
the retention is deleted with all of its events and leases, in one statement per batch, so a
task is either whole (``GET /v1/tasks/{id}`` and its events as before) or gone (404). The
reconciler leader runs it in batches (:meth:`app.reconciler.Reconciler.sweep_once`).

What it never touches: a task that is queued or leased (whatever its age), and a finished task
that still has a reservation or a live lease (none should; if one did, deleting it would
change what the ledger sums, so it waits). Reservations are not history: they are deleted
when released. Rows another transaction holds are skipped, not waited for.
"""

from __future__ import annotations

from datetime import datetime

from app.db import Connection

__all__ = ["FINISHED", "tasks_finished_prune"]

#: Finished task states (the predicate of ``ix_tasks_finished``).
FINISHED = "state IN ('SUCCEEDED', 'FAILED', 'CANCELLED')"

# $1 before, $2 limit. The oldest first, one range of ix_tasks_finished. Events and leases
# are deleted explicitly (by pk_task_events (task_id, id) and ix_leases_task_id): the statement
# does not rely on the foreign keys' cascades.
_PRUNE = (
    f"WITH d AS (SELECT t.id FROM tasks t WHERE {FINISHED} AND t.finished_at < $1 "
    "AND NOT EXISTS (SELECT 1 FROM reservations r WHERE r.task_id = t.id) "
    "AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.task_id = t.id "
    "AND l.state IN ('ACTIVE', 'REVOKING')) "
    "ORDER BY t.finished_at LIMIT $2 FOR UPDATE OF t SKIP LOCKED), "
    "e AS (DELETE FROM task_events WHERE task_id IN (SELECT id FROM d)), "
    "l AS (DELETE FROM leases WHERE task_id IN (SELECT id FROM d) "
    "AND state NOT IN ('ACTIVE', 'REVOKING')), "
    "x AS (DELETE FROM tasks WHERE id IN (SELECT id FROM d) RETURNING 1) "
    "SELECT count(*) FROM x"
)


async def tasks_finished_prune(conn: Connection, *, before: datetime, limit: int) -> int:
    """Delete up to ``limit`` tasks that finished before ``before``, with their events and
    leases; return how many tasks."""
    return int(await conn.fetchval(_PRUNE, before, limit))
