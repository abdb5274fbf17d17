"""Retention of history: finished tasks, their events and their leases are pruned together;
the event log of a task that never finishes is bounded.

A finished task (``SUCCEEDED``, ``FAILED``, ``CANCELLED``) whose ``finished_at`` is older than
the retention is deleted with all of its events and leases, in one statement per batch (which
also deletes the pool changes older than the retention, ``pool_events``), so a
task is either whole (``GET /v1/tasks/{id}`` and its events as before) or gone (404). The
reconciler leader runs it in batches (:meth:`app.reconciler.Reconciler.sweep_once`).

What it never touches: a task that is queued or leased (whatever its age), and a finished task
that still has a reservation or a live lease (none should; if one did, deleting it would
change what the ledger sums, so it waits). Reservations are not history: they are deleted
when released. Rows another transaction holds are skipped, not waited for.

A task that never finishes (parked for good on a pool whose health keeps flapping) is never
pruned, and its pending reason may change again and again: at most once per park sweep
period it logs one event (:mod:`app.reconciler.passes`). Once it logged more than
``keep`` of them, each new one trims its log to the first event (its submission) and the
latest ``keep`` (:func:`task_events_trim`, in the pass that logged it): its history stays
bounded, and still says how it began and what happened lately.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from datetime import datetime

from app.db import Connection

__all__ = ["FINISHED", "task_events_trim", "tasks_finished_prune"]

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
    "p AS (DELETE FROM pool_events WHERE at < $1), "
    "x AS (DELETE FROM tasks WHERE id IN (SELECT id FROM d) RETURNING 1) "
    "SELECT count(*) FROM x"
)


async def tasks_finished_prune(conn: Connection, *, before: datetime, limit: int) -> int:
    """Delete up to ``limit`` tasks that finished before ``before``, with their events and
    leases, and the pool changes logged before ``before``; return how many tasks."""
    return int(await conn.fetchval(_PRUNE, before, limit))


# $1 task ids, $2 events kept besides the first. One range of pk_task_events per task for its
# first event and one (of ``keep`` entries) for the oldest event kept.
_TRIM = (
    "WITH c AS (SELECT t.id, "
    "(SELECT min(e.id) FROM task_events e WHERE e.task_id = t.id) AS first, "
    "(SELECT e.id FROM task_events e WHERE e.task_id = t.id "
    "ORDER BY e.id DESC OFFSET ($2 - 1) LIMIT 1) AS kept "
    "FROM unnest($1::uuid[]) AS t(id)), "
    "d AS (DELETE FROM task_events e USING c WHERE e.task_id = c.id "
    "AND e.id > c.first AND e.id < c.kept RETURNING 1) "
    "SELECT count(*) FROM d"
)


async def task_events_trim(
    conn: Connection, *, task_ids: Collection[uuid.UUID], keep: int
) -> int:
    """Delete the events of ``task_ids`` but each task's first and its latest ``keep``;
    return how many went."""
    if not task_ids:
        return 0
    return int(await conn.fetchval(_TRIM, sorted(task_ids), keep))
