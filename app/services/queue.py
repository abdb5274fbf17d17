"""The queue: where an admitted task stands and when it can honestly be expected to start,
and what is pending for a caller.

**Position** is counted under the active policy among the tasks that compete for the same
pools: waiting tasks of the same runtime class that released capacity could help (tasks
waiting for a pool to be added, activated or changed compete for nothing yet), of tenants
that can use at least one pool the task's tenant can use (a tenant's figures never count
the tasks of tenants it shares no pool with). It comes from
a snapshot of the class's competing queue (:class:`~app.scheduling.positions.ClassQueue`,
the oldest ``queue_count_limit`` tasks, one bounded read) that a :class:`QueueCache` keeps
for ``queue_snapshot_seconds``: a read of getTask costs binary searches, not a count over
the queue. Past the limit the counts are lower bounds and ``exact`` is false.

**ETA**: ``estimatedStartAt`` is given only when capacity is the only blocker (the pending
reason's closest miss is a capacity code) and leases on the task's candidate pools (the
pools that only capacity kept from fitting; the class's pools open to the tenant when there
are many) completed at an observed rate over the last ``eta_window_seconds``. Then
``estimatedStartAt = now + position / rate``: each completion is assumed to free room for
one waiting task, in queue order. Otherwise it is null and ``estimate`` says why.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from app.auth import ADMIN, OPERATOR, Principal
from app.config import Settings
from app.db import Connection, Database
from app.ledger.nominations import NOMINATED
from app.ledger.preemption import PREEMPTING
from app.ledger.queue import (
    pools_completions_count,
    pools_largest_totals,
    pools_operated,
    queue_class_read,
    queue_pending_counts,
)
from app.ledger.reclaim import RECLAIMING
from app.ledger.tasks import TaskRow
from app.scheduling.explain import (
    QueueSummary,
    TaskQueue,
    queue_document,
    queue_summary_document,
)
from app.scheduling.positions import ClassQueue
from app.scheduling.reasons import Reason, Stage
from app.services.tenancy import tenants_reading

__all__ = ["QueueCache", "QueueSummary", "TaskQueue", "duration_words", "queue_get",
           "task_queue"]

#: Most recent completions one ETA read counts (the rate is then taken over their span).
COMPLETIONS_COUNTED = 1000
#: Most class queues cached at once.
QUEUE_CACHE_SIZE = 1024


class QueueCache:
    """Snapshots of competing queues by runtime class, each kept ``max_age_seconds``.

    One read refreshes a class at a time: while it runs, concurrent requests get the stale
    snapshot (or, when there is none yet, wait for that one read), so an expiry under load
    costs one queue read, not one per request in flight.
    """

    def __init__(self, max_age_seconds: float = 1.0) -> None:
        self.max_age_seconds = max_age_seconds
        self._entries: dict[tuple[str, int, float], tuple[float, ClassQueue]] = {}
        self._reading: dict[tuple[str, int, float], asyncio.Future[ClassQueue]] = {}

    def _put(self, key: tuple[str, int, float], now: float, queue: ClassQueue) -> None:
        """Keep ``queue`` under ``key``; when full, forget the entry read longest ago
        (entries are kept in the order they were read)."""
        entries = self._entries
        entries.pop(key, None)
        if len(entries) >= QUEUE_CACHE_SIZE:
            del entries[next(iter(entries))]
        entries[key] = (now, queue)

    async def get(
        self, conn: Connection, *, runtime_class: str, limit: int, aging_seconds: float
    ) -> ClassQueue:
        """Return the class's queue snapshot, read again when older than the max age."""
        key = (runtime_class, limit, aging_seconds)
        now = time.monotonic()
        hit = self._entries.get(key)
        if hit is not None and now - hit[0] < self.max_age_seconds:
            return hit[1]
        reading = self._reading.get(key)
        if reading is not None:
            return hit[1] if hit is not None else await asyncio.shield(reading)
        reading = self._reading[key] = asyncio.get_running_loop().create_future()
        # A failed read is raised to this caller; waiters see it too, and nobody else must
        # log it as never retrieved.
        reading.add_done_callback(lambda f: f.cancelled() or f.exception())
        try:
            columns = await queue_class_read(conn, runtime_class=runtime_class, limit=limit)
            queue = ClassQueue(
                seqs=columns.seqs,
                tenant_ids=columns.tenant_ids,
                priorities=columns.priorities,
                admitted=columns.admitted,
                complete=len(columns.seqs) < limit,
                aging_seconds=aging_seconds,
                pool_tenants=columns.pool_tenants,
            )
            self._put(key, now, queue)
            reading.set_result(queue)
            return queue
        except asyncio.CancelledError:
            reading.cancel()
            raise
        except Exception as exc:
            reading.set_exception(exc)
            raise
        finally:
            del self._reading[key]

_DIMENSIONS = (("cpuMillis", "cpu"), ("memoryMiB", "memory"), ("llmSlots", "llm slots"))


def duration_words(seconds: float) -> str:
    """Return a rounded duration in words ("40 seconds", "3 minutes", "2.5 hours")."""
    if seconds < 90:
        return f"{max(1, round(seconds))} seconds"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} minutes"
    return f"{seconds / 3600:.1f} hours"


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _never_fits(spec: dict[str, Any], totals: tuple[int, int, int] | None) -> str:
    """Return why no pool can ever hold one member of ``spec``."""
    if totals is None:
        return "no estimate: no pool of its runtime class has registered capacity"
    requests = spec.get("requests") or {}
    for (field, name), total in zip(_DIMENSIONS, totals, strict=True):
        want = int(requests.get(field) or 0)
        if want > total:
            return f"no pool can ever fit: largest {name} total is {total}, request is {want}"
    return "no estimate: no pool's totals can hold it"


async def task_queue(
    conn: Connection,
    *,
    row: TaskRow,
    settings: Settings,
    now: datetime,
    cache: QueueCache | None = None,
) -> TaskQueue:
    """Return the ``queue`` document of an ADMITTED task (position, competing, ETA); without
    a ``cache`` the class queue is read afresh."""
    assert row.admitted_at is not None
    queue = await (cache or QueueCache(0.0)).get(
        conn, runtime_class=row.runtime_class, limit=settings.queue_count_limit,
        aging_seconds=settings.priority_aging_seconds,
    )
    pos = queue.position(
        seq=row.seq, tenant_id=row.tenant_id, priority=row.priority,
        admitted_at=row.admitted_at, policy=str(settings.policy),
    )
    doc = queue_document(position=pos.ahead + 1, competing=pos.competing, exact=pos.exact,
                         policy=str(settings.policy))
    reason = row.pending_reason
    stage = row.pending_stage or 0
    if reason is None:
        doc["estimate"] = "no estimate: not examined yet; a reconciler pass looks at it next"
        return doc
    code = str(reason.get("code"))
    if code in (PREEMPTING, RECLAIMING) and reason.get("revokeBy"):
        # Its capacity is taken from leases that must stop by their deadline.
        revoke_by = str(reason["revokeBy"])
        doc["estimatedStartAt"] = datetime.fromisoformat(revoke_by.replace("Z", "+00:00"))
        leases = _plural(int(reason.get("victims") or 0), "lease", "leases")
        doc["estimate"] = (
            f"by {revoke_by} at the latest: the {leases} it takes capacity from must stop by "
            "then (it starts as soon as they do)"
        )
        return doc
    # A nominee waits for leases on its nominated pools to end: their capacity is held for it.
    nominated = [str(p) for p in reason.get("poolIds") or []] if code == NOMINATED else []
    if not nominated and stage < Stage.CAPACITY:
        # Released capacity cannot help it: it is behind no one and no one is behind it.
        doc["position"] = None
        if code in (Reason.QUOTA_EXCEEDED, Reason.QUOTA_BORROW_UNAVAILABLE):
            doc["estimate"] = (
                "no estimate: the tenant's quota is the blocker; it waits for the tenant's "
                f"usage (or its cohort's) to drop ({reason.get('message', code)})"
            )
            return doc
        if code == Reason.NEVER_FITS:
            totals = await pools_largest_totals(
                conn, tenant_id=row.tenant_id, runtime_class=row.runtime_class
            )
            doc["estimate"] = _never_fits(row.spec, totals)
            return doc
        doc["estimate"] = (
            "no estimate: no pool can take it until a pool is added, activated or changed "
            f"({reason.get('message', code)})"
        )
        return doc
    if not nominated and stage > Stage.CAPACITY:
        why = {
            Reason.AFFINITY_UNSATISFIED: "it waits for a task it requires affinity with",
            Reason.ANTI_AFFINITY_VIOLATED: "it waits for a conflicting task to end",
        }.get(Reason(code), "a gang needs room on several pools at once")
        doc["estimate"] = f"no estimate: capacity is not the only blocker ({why})"
        return doc
    pools = nominated or [k.removeprefix("pool:") for k in row.wake if k.startswith("pool:")]
    broad = not nominated and any(k.startswith("cap:") for k in row.wake)
    if not pools and not broad:
        totals = await pools_largest_totals(
            conn, tenant_id=row.tenant_id, runtime_class=row.runtime_class
        )
        doc["estimate"] = _never_fits(row.spec, totals)
        return doc
    window = settings.eta_window_seconds
    candidates, completed, oldest = await pools_completions_count(
        conn, tenant_id=row.tenant_id, runtime_class=row.runtime_class,
        pool_ids=None if broad else pools, since=now - timedelta(seconds=window),
        limit=COMPLETIONS_COUNTED,
    )
    if completed >= COMPLETIONS_COUNTED and oldest is not None:
        # A busy class: the rate over the span of the most recent completions (bounded read).
        window = max((now - oldest).total_seconds(), 1.0)
    over = f"over the last {duration_words(window)}"
    on = (f"on its {_plural(candidates, 'nominated pool', 'nominated pools')} (their freed "
          "capacity is held for it)") if nominated else \
        f"on its {_plural(candidates, 'candidate pool', 'candidate pools')}"
    if completed == 0:
        doc["estimate"] = (
            f"no estimate: capacity is the only blocker, but no lease {on} completed {over}"
        )
        return doc
    rate = completed / window
    wait = (pos.ahead + 1) / rate
    doc["estimatedStartAt"] = now + timedelta(seconds=wait)
    ahead = _plural(pos.ahead, "task", "tasks") + ("" if pos.exact else " or more")
    doc["estimate"] = (
        f"about {duration_words(wait)}: {ahead} ahead; leases {on} completed at "
        f"{rate * 60:.1f} per minute {over} (each completion is assumed to free room for "
        "one waiting task)"
    )
    return doc


async def queue_get(
    db: Database, *, principal: Principal, tenant: str | None, now: datetime | None = None
) -> QueueSummary:
    """Return what is pending for the caller: a tenant its own tasks, an operator the demand
    its pools could serve, an admin everything; by runtime class and pending code."""
    at = now or datetime.now(UTC)
    async with db.connection() as conn:
        if principal.role == ADMIN:
            tenant_ids, pool_ids = None, None
        elif principal.role == OPERATOR:
            tenant_ids, pool_ids = None, await pools_operated(conn, subject=principal.subject)
        else:
            tenant_ids, pool_ids = tenants_reading(principal, tenant), None
        rows = [] if pool_ids == [] else await queue_pending_counts(
            conn, tenant_ids=tenant_ids, pool_ids=pool_ids
        )
    return queue_summary_document(rows, at=at)
