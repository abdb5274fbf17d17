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

**ETA**: the stored pending reason says what blocks the task. A preemptor or reclaimer starts
by its victims' deadline; a task no pool can take until a pool changes, one that can never
fit, or one blocked past the capacity stage (affinity, a gang) gets no estimate, and the
reason why; so does a task no pass examined yet (the next pass will). For a task waiting for
capacity (or nominated), or for its tenant's quota, the pass's planner answers in a preview
worker (:mod:`app.services.eta`), after the request's connection went back to the pool:
:func:`task_queue_read` builds the document and the ask, :func:`queue_eta_fill` has it
answered.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

from app.auth import ADMIN, OPERATOR, Principal
from app.config import Settings
from app.db import Connection, Database
from app.ledger.nominations import NOMINATED
from app.ledger.preemption import PREEMPTING
from app.ledger.queue import (
    pools_largest_totals,
    pools_operated,
    queue_class_read,
    queue_pending_counts,
)
from app.ledger.reclaim import RECLAIMING
from app.ledger.tasks import TaskRow
from app.pass_config import ReconcilerConfig
from app.scheduling.explain import (
    QueueSummary,
    TaskQueue,
    duration_words,
    plural_words,
    queue_document,
    queue_summary_document,
)
from app.scheduling.positions import ClassQueue
from app.scheduling.reasons import Reason, Stage
from app.services.eta import CAPACITY, QUOTA, EtaAsk, task_eta
from app.services.offload import Offload
from app.services.tenancy import tenants_reading

__all__ = ["QueueCache", "QueueSummary", "TaskQueue", "duration_words", "queue_eta_fill",
           "queue_get", "task_queue", "task_queue_read"]

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


def _eta_ask(row: TaskRow, settings: Settings, now: datetime, blocker: str,
             pool_ids: list[str] | None = None, nominated: bool = False) -> EtaAsk:
    """Return the ask of estimating ``row``'s start with ``settings``."""
    return EtaAsk(
        row.id, row.runtime_class, ReconcilerConfig.from_settings(settings), now, blocker,
        None if pool_ids is None else tuple(pool_ids), nominated,
        window_seconds=settings.eta_window_seconds, leases_max=settings.eta_leases_max,
        tasks_max=settings.eta_tasks_max, pass_seconds=settings.tick_seconds,
    )


async def task_queue_read(
    conn: Connection,
    *,
    row: TaskRow,
    settings: Settings,
    now: datetime,
    cache: QueueCache | None = None,
) -> tuple[TaskQueue, EtaAsk | None]:
    """Return the ``queue`` document of an ADMITTED task (position, competing, and the
    estimate when its stored reason gives it) and, when the planner is to estimate its start,
    what to ask it (:func:`queue_eta_fill`); without a ``cache`` the class queue is read
    afresh."""
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
        return doc, None
    code = str(reason.get("code"))
    if code in (PREEMPTING, RECLAIMING) and reason.get("revokeBy"):
        # Its capacity is taken from leases that must stop by their deadline.
        revoke_by = str(reason["revokeBy"])
        doc["estimatedStartAt"] = datetime.fromisoformat(revoke_by.replace("Z", "+00:00"))
        leases = plural_words(int(reason.get("victims") or 0), "lease", "leases")
        doc["estimate"] = (
            f"by {revoke_by} at the latest: the {leases} it takes capacity from must stop by "
            "then (it starts as soon as they do)"
        )
        return doc, None
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
            return doc, _eta_ask(row, settings, now, QUOTA)
        if code == Reason.NEVER_FITS:
            totals = await pools_largest_totals(
                conn, tenant_id=row.tenant_id, runtime_class=row.runtime_class
            )
            doc["estimate"] = _never_fits(row.spec, totals)
            return doc, None
        doc["estimate"] = (
            "no estimate: no pool can take it until a pool is added, activated or changed "
            f"({reason.get('message', code)})"
        )
        return doc, None
    if not nominated and stage > Stage.CAPACITY:
        why = {
            Reason.AFFINITY_UNSATISFIED: "it waits for a task it requires affinity with",
            Reason.ANTI_AFFINITY_VIOLATED: "it waits for a conflicting task to end",
        }.get(Reason(code), "a gang needs room on several pools at once")
        doc["estimate"] = f"no estimate: capacity is not the only blocker ({why})"
        return doc, None
    pools = nominated or [k.removeprefix("pool:") for k in row.wake if k.startswith("pool:")]
    broad = not nominated and any(k.startswith("cap:") for k in row.wake)
    if not pools and not broad:
        totals = await pools_largest_totals(
            conn, tenant_id=row.tenant_id, runtime_class=row.runtime_class
        )
        doc["estimate"] = _never_fits(row.spec, totals)
        return doc, None
    return doc, _eta_ask(row, settings, now, CAPACITY, None if broad else pools,
                         bool(nominated))


async def queue_eta_fill(doc: TaskQueue, ask: EtaAsk | None, *, offload: Offload) -> TaskQueue:
    """Return ``doc`` with the planner's estimate of ``ask`` (computed by a preview worker:
    429 or 503 with Retry-After past its bound), or as it is without one."""
    if ask is None:
        return doc
    answer = await offload.run(task_eta, ask)
    if answer is not None:
        doc["estimatedStartAt"], doc["estimate"] = answer
    return doc


async def task_queue(
    conn: Connection,
    *,
    row: TaskRow,
    settings: Settings,
    now: datetime,
    offload: Offload,
    cache: QueueCache | None = None,
) -> TaskQueue:
    """Return the ``queue`` document of an ADMITTED task (position, competing, ETA); without
    a ``cache`` the class queue is read afresh."""
    doc, ask = await task_queue_read(conn, row=row, settings=settings, now=now, cache=cache)
    return await queue_eta_fill(doc, ask, offload=offload)


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
