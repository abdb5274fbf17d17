"""The one read a pass makes: pools with their ledger and runtime health, and what affinity needs.

Health is computed here with the pass's ``now``: a pool's runtime is fresh when its instance
heartbeated within the freshness window; an instance that never did is unhealthy (fail
closed). A pool whose ledger was never registered has ``capacity=None`` (``ledger_missing``).
Actual placements are loaded only for the tenants of claimed tasks that carry affinity
terms; tenant usage only for the ``fair`` policy.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import orjson

from app.db import Connection
from app.scheduling.records import Vector
from app.scheduling.snapshot import PlacedTask, PoolState, Snapshot, pool_states_made

# This is the widest read of every pass: JSON columns and arrays come as JSON text (decoded
# once per distinct value by orjson, not per row: pools share a few tenant lists and label
# sets), and the reconciler reads in autocommit (a single statement sees one consistent
# snapshot anyway).
# The row without its version (``xmin``, see ``_USAGE``) is its identity for PoolCache: a
# Record slice is a hashable tuple, so an unchanged pool costs one dict lookup. The versions
# the static part is built from come with its rows.
_POOLS = (
    "SELECT p.id, to_json(p.tenant_ids)::text, p.runtime_class, p.runtime_instance_id, "
    "p.region, p.data_residency, p.failure_domain, p.labels::text, "
    "to_json(p.artifact_regions)::text, p.cost_weight, p.status, p.ready, "
    "l.cpu_total, l.memory_total, l.llm_total, l.cpu_reserved, l.memory_reserved, "
    "l.llm_reserved, COALESCE(ri.last_heartbeat_at > $1, false), p.xmin::text::bigint "
    "FROM pools p LEFT JOIN ledgers l ON l.pool_id = p.id "
    "LEFT JOIN runtime_instances ri ON ri.id = p.runtime_instance_id "
    "ORDER BY p.id"
)

# What changes between passes, in one row: the number of pools and, per pool in id order, the
# row's version (xmin: every committed UPDATE of a row gives it a new one, whoever wrote it),
# ledger totals and reservations (cpu, memory, llm; zeros without a ledger) and flags (1: has
# a ledger, 2: its runtime is fresh), as one (pools x 8) int8 array in binary form
# (``array_send``): one bytea that becomes one numpy array, without a Python object per pool.
# Pool ids are ASCII slugs (a check constraint), so ``COLLATE "C"`` orders them as Python sorts
# them, which is the snapshot's order.
#
# The count and the versions are the key the static part of a snapshot is cached under: a
# pool added, deleted or changed since the previous read changes one of them. A row written
# after that read carries the id of a transaction that had not committed when it ran, so its
# version differs from every version the read saw (short of 2^32 transactions between them).
_USAGE = (
    "SELECT count(*), array_send(array_agg(ARRAY[p.xmin::text::bigint, "
    "COALESCE(l.cpu_total, 0), COALESCE(l.memory_total, 0), COALESCE(l.llm_total, 0), "
    "COALESCE(l.cpu_reserved, 0), COALESCE(l.memory_reserved, 0), COALESCE(l.llm_reserved, 0), "
    "(l.pool_id IS NOT NULL)::int::int8 "
    "+ 2 * COALESCE(ri.last_heartbeat_at > $1, false)::int::int8] ORDER BY p.id COLLATE \"C\")) "
    "FROM pools p LEFT JOIN ledgers l ON l.pool_id = p.id "
    "LEFT JOIN runtime_instances ri ON ri.id = p.runtime_instance_id"
)
#: Columns of a ``_USAGE`` row per pool.
_USAGE_COLUMNS = 8
#: ``array_send`` of a two-dimensional int8 array without NULLs: a header (ndim, has-null
#: flag, element type, then size and lower bound per dimension), then per element its length
#: (always 8) and its big-endian value.
_ARRAY_HEADER = np.dtype(">i4")
_ARRAY_ELEMENT = np.dtype([("length", ">i4"), ("value", ">i8")])

# What changed since an earlier read, without a row per pool. Rows are versioned by the
# transaction that wrote them (``xmin``), and ``$1`` is the snapshot the earlier read saw
# (``xmin:xmax:running``, the reader's own transaction counted as running). A row version
# that read did not see was written by a transaction that had not finished then: one from
# ``xmax`` on (one past the newest finished), one listed as running, or a subtransaction of
# either. No snapshot lists subtransactions, but a subtransaction's id is newer than its
# top-level transaction's, and its rows are visible only once that one has finished. So the
# rows written since, and visible now, are those whose ``xmin`` is one of the transactions
# then running, or no older than the oldest of them that has finished since (else than
# ``xmax``): ``age(xmin) <= s.a``, the age of that bound. A transaction that stays open
# (a pass, a long batch) thus widens no read while it runs; the read after it ends returns
# the rows written while it ran, once. A row frozen long ago keeps its xmin: past 2^31
# transactions it reads as new and is returned again, at the version the caller holds (a
# row more, nothing missed).
#
# Returned: the snapshot of this read and the reader's own transaction (if it has an id),
# ``s.a`` (the caller refuses a window it cannot trust), then per table the row count
# and the rows written since: pools (ids, and versions as an int8 array in binary form: a
# row whose version is not the one the static part was built from rebuilds it; the same
# version is a row written by a transaction that finished after the static part's read
# began), ledgers (ids, and totals and reservations as an (n x 6) int8 array in binary
# form), runtime instances (ids, and heartbeats as a timestamptz array in binary form:
# microseconds since 2000-01-01, the same layout as int8). One scan of each table, no join,
# no sort: far less server work than ``_USAGE``. No column is an array asyncpg decodes
# itself other than ``text[]``: its codecs for ``int8[]`` and the like are looked up in the
# server's catalogue (a query of some 7 ms of CPU) on each connection's first statement that
# has one.
# Each row's test is made once, in a subquery the planner keeps (``OFFSET 0``), and read
# by the aggregates that need it (in each aggregate's filter, it cost a tenth more).
_WRITTEN = "(age(xmin) <= s.a OR xmin = ANY(s.running)) AS w"
_CHANGED = (
    "SELECT c.now::text, pg_current_xact_id_if_assigned()::text, s.a, p.n, p.ids, p.vs, "
    "l.n, l.ids, array_send(l.v), r.n, r.ids, array_send(r.hb) "
    "FROM (SELECT pg_current_snapshot() AS now, $1::text::pg_snapshot AS seen) c "
    "CROSS JOIN LATERAL (SELECT age(xid(coalesce(min(x) FILTER (WHERE "
    "pg_visible_in_snapshot(x, c.now)), pg_snapshot_xmax(c.seen)))) AS a, "
    "coalesce(array_agg(xid(x)), '{}') AS running FROM pg_snapshot_xip(c.seen) x) s "
    "CROSS JOIN LATERAL (SELECT count(*) AS n, array_agg(id) FILTER (WHERE w) AS ids, "
    "array_send(array_agg(xmin::text::bigint) FILTER (WHERE w)) AS vs "
    f"FROM (SELECT id, xmin, {_WRITTEN} FROM pools OFFSET 0) t) p "
    "CROSS JOIN LATERAL (SELECT count(*) AS n, array_agg(pool_id) FILTER (WHERE w) AS ids, "
    "array_agg(ARRAY[cpu_total, memory_total, llm_total, cpu_reserved, memory_reserved, "
    "llm_reserved]) FILTER (WHERE w) AS v "
    "FROM (SELECT pool_id, cpu_total, memory_total, llm_total, cpu_reserved, "
    f"memory_reserved, llm_reserved, {_WRITTEN} FROM ledgers OFFSET 0) t) l "
    "CROSS JOIN LATERAL (SELECT count(*) AS n, array_agg(id) FILTER (WHERE w) AS ids, "
    "array_agg(last_heartbeat_at) FILTER (WHERE w) AS hb "
    f"FROM (SELECT id, last_heartbeat_at, {_WRITTEN} FROM runtime_instances OFFSET 0) t) r"
)
# The snapshot, row counts and every heartbeat, read before a full ``_USAGE`` read: what the
# next pass's ``_CHANGED`` starts from (a change after this statement is not in its
# snapshot, so it is read again then).
_HEARTBEATS = (
    "SELECT pg_current_snapshot()::text, pg_current_xact_id_if_assigned()::text, "
    "(SELECT count(*) FROM ledgers), count(*), array_agg(id), "
    "array_send(array_agg(last_heartbeat_at)) FROM runtime_instances"
)
#: Largest ``age`` of the start of the window ``_CHANGED`` trusts (far from wraparound).
_AGE_MAX = 1 << 30
#: Where PostgreSQL's timestamps count microseconds from.
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
#: A pool whose runtime instance has no row: never fresh.
_NEVER = np.iinfo(np.int64).min

# The leased tasks behind ``OFFSET 0``, as in ``_PLACED_GROUPED`` below (the same join could
# otherwise walk ``pk_tasks``).
_PLACED = (
    "SELECT t.id, t.tenant_id, t.labels::text, r.pool_id, r.members "
    "FROM (SELECT id, tenant_id, labels FROM tasks "
    "WHERE tenant_id = ANY($1::text[]) AND state = 'LEASED' OFFSET 0) t "
    "JOIN reservations r ON r.task_id = t.id "
    "WHERE $2::text IS NULL OR t.id NOT IN (SELECT task_id FROM leases "
    "WHERE pool_id = $2 AND state IN ('ACTIVE', 'REVOKING')) "
    "ORDER BY t.id, r.pool_id"
)

# The same placements grouped by (tenant, task labels): affinity only counts members per pool
# of tasks whose labels match, so tasks with equal labels need not be told apart. Each group
# lists a pool once per task, with that task's members there (no counts when every task of the
# group holds one member per pool, the common case: the core then adds one per entry).
# The leased tasks are found by ``ix_tasks_leased_tenant`` behind ``OFFSET 0``: joined
# directly, the planner could walk ``pk_tasks`` in a merge join with reservations and filter
# every task ever stored (2.6 s at 1,000,000 finished tasks with random ids, against 41 ms).
# The key is compared bytewise (``COLLATE "C"``: grouping needs equality only). Summing per
# (tenant, labels, pool) in SQL, or grouping by ``labels`` as jsonb, made PostgreSQL sort on
# wider keys and took longer (20,000 leased tasks in 1,000 groups over 5,000 pools: few
# tasks of a group share a pool, so there was little to sum).
_PLACED_GROUPED = (
    "SELECT t.tenant_id COLLATE \"C\", t.labels::text COLLATE \"C\", array_agg(r.pool_id), "
    "CASE WHEN max(r.members) > 1 THEN array_agg(r.members) END "
    "FROM (SELECT id, tenant_id, labels FROM tasks "
    "WHERE tenant_id = ANY($1::text[]) AND state = 'LEASED' OFFSET 0) t "
    "JOIN reservations r ON r.task_id = t.id GROUP BY 1, 2 ORDER BY 1, 2"
)

# Reservations are live rows only (deleted when released), so the read starts there and
# looks each task up by id: ``OFFSET 0`` keeps the lookup a per-reservation probe, where a
# join on ``tenant_id`` would read every task the tenants ever had (2.5 s per pass at
# 1,000,000 finished tasks).
_TENANT_USAGE = (
    "SELECT t.tenant_id, SUM(r.cpu), SUM(r.memory), SUM(r.llm) FROM reservations r "
    "CROSS JOIN LATERAL (SELECT tenant_id FROM tasks WHERE id = r.task_id OFFSET 0) t "
    "WHERE t.tenant_id = ANY($1::text[]) GROUP BY t.tenant_id"
)

_LEDGERS = (
    "SELECT pool_id, cpu_total, memory_total, llm_total, cpu_reserved, memory_reserved, "
    "llm_reserved FROM ledgers WHERE pool_id = ANY($1::text[])"
)


@dataclass(frozen=True, slots=True)
class LedgerRow:
    """A pool's ledger totals and reservations, as read now."""

    total: Vector
    reserved: Vector

    @property
    def free(self) -> Vector:
        """Return what is left on each dimension."""
        t, r = self.total, self.reserved
        return (t[0] - r[0], t[1] - r[1], t[2] - r[2])


class PoolCache:
    """Pool states of the previous read, by their full row: an unchanged pool is reused.

    Building a frozen ``PoolState`` costs more than reading its row, and between two passes
    most pools do not change at all (only the pools a pass reserved on differ).
    """

    __slots__ = ("states",)

    def __init__(self) -> None:
        self.states: dict[tuple, PoolState] = {}


class SnapshotCache:
    """The previous snapshot and the row versions of the pools it was built from: while they
    are unchanged, a pass reads only usage and health.

    Pool rows change rarely (edits, cordons, capacity changes, runtime registration), while
    ledger reservations and heartbeats change every pass. Any committed change of a pool row
    gives it a new version, and added or deleted pools change the count or the versions.

    Usage and health are read whole only when the static part is (re)built; other passes read
    the rows written since the previous read (``_CHANGED``) and apply them to the previous
    snapshot's arrays: ``seen`` is the database snapshot that read saw (``xmin:xmax:running``,
    its reader's own transaction counted as running), ``ledgers`` and ``instances`` the row
    counts it saw, ``beats`` each known runtime instance's last heartbeat (microseconds
    since 2000-01-01) at its row in ``instance_rows`` and, last, one that is never fresh,
    and ``pool_instances`` each pool's row of ``beats`` (that last one for an instance
    without a row): a pass's heartbeats apply as one array assignment and one gather.
    """

    __slots__ = ("versions", "snapshot", "pools", "rebuilds", "reuses", "seen", "ledgers",
                 "instances", "instance_rows", "beats", "pool_instances", "deltas",
                 "rows_read")

    def __init__(self) -> None:
        self.versions: np.ndarray | None = None
        self.snapshot: Snapshot | None = None
        self.pools = PoolCache()
        #: How many reads rebuilt the static part, and how many reused it.
        self.rebuilds = 0
        self.reuses = 0
        self.seen: str | None = None
        self.ledgers = 0
        self.instances = 0
        self.instance_rows: dict[str, int] = {}
        self.beats: np.ndarray = np.full(1, _NEVER, dtype=np.int64)
        self.pool_instances: np.ndarray | None = None
        #: How many reads read only the rows changed since the previous one, and how many
        #: rows all reads returned: the pools, ledgers and runtime instances written since
        #: the previous read, or every pool when read whole.
        self.deltas = 0
        self.rows_read = 0


def _seen(snapshot: str, own: str | None) -> str:
    """Return ``snapshot`` (``pg_snapshot`` text) with the reader's own transaction ``own``
    (if it has an id) counted as running: what it writes after the read is not in it."""
    xmin, xmax, running = snapshot.split(":")
    if own is None or int(own) >= int(xmax):  # from xmax on, every id counts as running
        return snapshot
    ids = sorted({int(x) for x in running.split(",") if x} | {int(own)})
    return f"{min(int(xmin), int(own))}:{xmax}:{','.join(map(str, ids))}"


def _array_1d(data: bytes | None, n: int) -> np.ndarray:
    """Return the int64 values of ``array_send`` of a one-dimensional array of ``n`` 8-byte
    elements without NULLs (int8, or timestamptz as microseconds since 2000-01-01)."""
    if not n:
        return np.zeros(0, dtype=np.int64)
    assert data is not None
    ndim, has_null, _, rows, _ = np.frombuffer(data, _ARRAY_HEADER, 5).tolist()
    if (ndim, has_null, rows) != (1, 0, n):
        raise ValueError(f"unexpected array ({ndim}, {has_null}, {rows})")
    return np.frombuffer(data, _ARRAY_ELEMENT, offset=5 * 4)["value"].astype(np.int64)


def _array_2d(data: bytes | None, n: int, columns: int) -> np.ndarray:
    """Return the (n, columns) int64 values of ``array_send`` of a two-dimensional int8
    array without NULLs (a ``_USAGE`` row's, or ``_CHANGED``'s ledger values)."""
    if not n:
        return np.zeros((0, columns), dtype=np.int64)
    assert data is not None
    ndim, has_null, _, rows, _, width, _ = np.frombuffer(data, _ARRAY_HEADER, 7).tolist()
    if (ndim, has_null, rows, width) != (2, 0, n, columns):
        raise ValueError(f"unexpected array ({ndim}, {has_null}, {rows}, {width})")
    values = np.frombuffer(data, _ARRAY_ELEMENT, offset=7 * 4)["value"]
    return values.astype(np.int64).reshape(n, columns)


async def snapshot_read(
    conn: Connection,
    *,
    now: datetime,
    freshness_seconds: float,
    strategy: str,
    placed: Callable[[], Awaitable[Iterable[PlacedTask]]],
    cache: SnapshotCache,
) -> Snapshot:
    """Return the pass's snapshot at ``now``, reusing the cached static part when no pool row
    changed since it was built; ``placed`` reads the placements affinity needs."""
    cutoff = now - timedelta(seconds=freshness_seconds)
    previous = cache.snapshot
    if previous is not None and previous.strategy == strategy and cache.seen is not None:
        snapshot = await _changed_read(conn, cutoff=cutoff, placed=placed, cache=cache)
        if snapshot is not None:
            return snapshot
    hb = await conn.fetchrow(_HEARTBEATS)
    reused = None
    if previous is not None and previous.strategy == strategy:
        reused = await _usage_read(conn, cutoff=cutoff, placed=placed, cache=cache)
    if reused is not None:
        snapshot, versions = reused
    else:
        full = await conn.fetch(_POOLS, cutoff)
        states = _pool_states(full, cache.pools)
        tasks = await placed()
        cache.rebuilds += 1
        snapshot = Snapshot.build(states, tasks, strategy=strategy)
        # The versions of the rows the static part was built from, in its order.
        version_of = {r[0]: r[19] for r in full}
        versions = np.fromiter(map(version_of.__getitem__, snapshot.ids), dtype=np.int64,
                               count=snapshot.n)
    n = len(versions)
    cache.rows_read += n
    cache.versions = versions
    cache.snapshot = snapshot
    seen, own, ledgers, instances, ids, beats = hb
    cache.seen = _seen(seen, own)
    cache.ledgers = ledgers
    cache.instances = instances
    rows = cache.instance_rows = {i: row for row, i in enumerate(ids or ())}
    cache.beats = np.append(_array_1d(beats, instances), np.int64(_NEVER))
    if snapshot.n == n and len(rows) == instances:
        of = snapshot.instance_of
        cache.pool_instances = np.fromiter(
            (rows.get(of[pid], instances) for pid in snapshot.ids), dtype=np.intp, count=n)
    else:
        cache.seen = None
    return snapshot


async def _usage_read(
    conn: Connection,
    *,
    cutoff: datetime,
    placed: Callable[[], Awaitable[Iterable[PlacedTask]]],
    cache: SnapshotCache,
) -> tuple[Snapshot, np.ndarray] | None:
    """Return the cached snapshot with every pool's ledger and health read now, and the
    pool row versions, or None when a pool row changed since its static part was built."""
    previous = cache.snapshot
    assert previous is not None
    n, data = await conn.fetchrow(_USAGE, cutoff)
    usage = _array_2d(data, n, _USAGE_COLUMNS)
    versions = usage[:, 0]
    if previous.n != n or cache.versions is None or not np.array_equal(cache.versions,
                                                                       versions):
        return None
    flags = usage[:, 7]
    tasks = await placed()
    cache.reuses += 1
    snapshot = previous.with_arrays(
        cap=np.ascontiguousarray(usage[:, 1:4]),
        has_ledger=(flags & 1).astype(bool),
        reserved=np.ascontiguousarray(usage[:, 4:7]),
        fresh=(flags & 2).astype(bool),
        placed=tasks,
    )
    return snapshot, versions


async def _changed_read(
    conn: Connection,
    *,
    cutoff: datetime,
    placed: Callable[[], Awaitable[Iterable[PlacedTask]]],
    cache: SnapshotCache,
) -> Snapshot | None:
    """Return the cached snapshot with the ledger and heartbeat rows written since the
    previous read applied, or None when a full read is needed: a pool row written, a ledger
    or runtime instance added or deleted (the counts, or a row not known before), or a
    window too old to trust. The result equals a full read's: only rows written since the
    previous read can differ from it, and freshness is recomputed for every pool at
    ``cutoff`` from the heartbeats."""
    previous = cache.snapshot
    assert previous is not None
    (seen, own, age, pools, pool_ids, pool_versions, ledgers, ledger_ids, values, instances,
     instance_ids, beats) = await conn.fetchrow(_CHANGED, cache.seen)
    if (age is None or not 0 <= age <= _AGE_MAX or pools != previous.n
            or ledgers != cache.ledgers or instances != cache.instances
            or cache.pool_instances is None or cache.versions is None):
        return None
    cache.rows_read += len(pool_ids or ()) + len(ledger_ids or ()) + len(instance_ids or ())
    if pool_ids and not _pools_unchanged(cache, pool_ids, pool_versions):
        return None
    usage = _ledgers_applied(previous, ledger_ids, values)
    if usage is None:
        return None
    known = _heartbeats_applied(cache, instance_ids, beats)
    if known is None:
        return None
    limit = (cutoff - _PG_EPOCH) // timedelta(microseconds=1)
    tasks = await placed()
    cache.reuses += 1
    cache.deltas += 1
    snapshot = previous.with_arrays(
        cap=usage[0], has_ledger=previous.has_ledger, reserved=usage[1],
        fresh=known[cache.pool_instances] > limit, placed=tasks,
    )
    cache.seen = _seen(seen, own)
    cache.beats = known
    cache.snapshot = snapshot
    return snapshot


def _pools_unchanged(cache: SnapshotCache, pool_ids: list[str], data: bytes | None) -> bool:
    """Return whether every pool row of a ``_CHANGED`` read is the version the static part
    was built from (a transaction that finished after that read began wrote it before)."""
    assert cache.snapshot is not None and cache.versions is not None
    pos, versions = cache.snapshot.pos, cache.versions
    written = _array_1d(data, len(pool_ids)).tolist()
    for pid, version in zip(pool_ids, written, strict=True):
        row_of = pos.get(pid)
        if row_of is None or versions[row_of] != version:
            return False
    return True


def _ledgers_applied(
    previous: Snapshot, ledger_ids: list[str] | None, data: bytes | None
) -> tuple[np.ndarray, np.ndarray] | None:
    """Return the snapshot's totals and reservations with the ledger rows of a ``_CHANGED``
    read applied (copies, when there are any), or None for a ledger the snapshot lacks."""
    if not ledger_ids:
        return previous.cap, previous.reserved
    pos = previous.pos
    rows = np.fromiter((pos.get(pid, -1) for pid in ledger_ids), dtype=np.intp,
                       count=len(ledger_ids))
    if (rows < 0).any() or not previous.has_ledger[rows].all():
        return None
    v = _array_2d(data, len(ledger_ids), 6)
    cap = previous.cap.copy()
    reserved = previous.reserved.copy()
    cap[rows] = v[:, 0:3]
    reserved[rows] = v[:, 3:6]
    return cap, reserved


def _heartbeats_applied(
    cache: SnapshotCache, instance_ids: list[str] | None, data: bytes | None
) -> np.ndarray | None:
    """Return the known heartbeats (``cache.beats``) with the runtime instance rows of a
    ``_CHANGED`` read applied (a copy, when there are any), or None for an instance not
    known before."""
    if not instance_ids:
        return cache.beats
    rows_of = cache.instance_rows
    if not all(map(rows_of.__contains__, instance_ids)):
        return None
    n = len(instance_ids)
    rows = np.fromiter(map(rows_of.__getitem__, instance_ids), dtype=np.intp, count=n)
    beats = cache.beats.copy()
    beats[rows] = _array_1d(data, n)
    return beats


async def pools_read(
    conn: Connection,
    *,
    now: datetime,
    freshness_seconds: float,
    cache: PoolCache | None = None,
) -> list[PoolState]:
    """Return every pool as the core sees it, with health computed at ``now``."""
    rows = await conn.fetch(_POOLS, now - timedelta(seconds=freshness_seconds))
    return _pool_states(rows, cache)


def _pool_states(rows: Sequence[Any], cache: PoolCache | None) -> list[PoolState]:
    """Return the pool states of ``_POOLS`` rows, reusing the cached unchanged ones."""
    previous = cache.states if cache is not None else {}
    keys = [r[0:19] for r in rows]
    found = list(map(previous.get, keys))
    labels_of: dict[str, dict[str, str]] = {}
    # Tenant lists and artifact regions as JSON texts (None: NULL), each parsed once.
    sets_of: dict[str | None, frozenset[str]] = {None: frozenset()}
    new: list[tuple] = []
    for r, state in zip(rows, found, strict=True):
        if state is None:
            labels = labels_of.get(r[7])
            if labels is None:
                labels = labels_of[r[7]] = orjson.loads(r[7])
            tenants = sets_of.get(r[1])
            if tenants is None:
                tenants = sets_of[r[1]] = frozenset(orjson.loads(r[1]))
            regions = sets_of.get(r[8])
            if regions is None:
                regions = sets_of[r[8]] = frozenset(orjson.loads(r[8]))
            # The fields in order: id, tenants, runtime class and instance, region,
            # residency, failure domain, labels, artifact regions, cost weight, status, ready,
            # heartbeat fresh, capacity, reserved.
            new.append((
                r[0], tenants, r[2], r[3], r[4], r[5] or None, r[6] or "", labels, regions,
                float(r[9]), r[10], r[11], r[18],
                None if r[12] is None else (r[12], r[13], r[14]),
                (0, 0, 0) if r[15] is None else (r[15], r[16], r[17]),
            ))
    made = iter(pool_states_made(new))
    out = [state if state is not None else next(made) for state in found]
    if cache is not None:
        cache.states = dict(zip(keys, out, strict=True))
    return out


async def placements_read(
    conn: Connection, *, tenant_ids: Collection[str], leaving: str | None = None
) -> list[PlacedTask]:
    """Return the leased placements of ``tenant_ids`` (a pool repeated once per member),
    without the tasks that have a live lease on pool ``leaving`` (if given)."""
    if not tenant_ids:
        return []
    rows = await conn.fetch(_PLACED, sorted(tenant_ids), leaving)
    labels_of: dict[str, dict[str, str]] = {}
    by_task: dict[object, tuple[str, dict, list[str]]] = {}
    for task_id, tenant_id, labels_json, pool_id, members in rows:
        entry = by_task.get(task_id)
        if entry is None:
            labels = labels_of.get(labels_json)
            if labels is None:
                labels = labels_of[labels_json] = orjson.loads(labels_json)
            entry = by_task[task_id] = (tenant_id, labels, [])
        entry[2].extend([pool_id] * members)
    return [
        PlacedTask(str(task_id), tenant, labels, tuple(pools))
        for task_id, (tenant, labels, pools) in by_task.items()
    ]


async def placements_grouped_read(
    conn: Connection, *, tenant_ids: Collection[str]
) -> list[PlacedTask]:
    """Return the leased placements of ``tenant_ids`` merged per (tenant, task labels): one
    ``PlacedTask`` per group, listing each task's pools with its members there.

    Affinity and spreading count members per pool of the tasks whose labels match, so this
    gives the core the same counts as :func:`placements_read` with far fewer rows and
    objects; ``task_id`` names the group (``labels:<json>``), not a task.
    """
    if not tenant_ids:
        return []
    rows = await conn.fetch(_PLACED_GROUPED, sorted(tenant_ids))
    return [
        PlacedTask(f"labels:{labels_json}", tenant_id, orjson.loads(labels_json),
                   tuple(pools), tuple(members) if members else ())
        for tenant_id, labels_json, pools, members in rows
    ]


async def tenant_usage_read(
    conn: Connection, *, tenant_ids: Collection[str]
) -> dict[str, Vector]:
    """Return the capacity each tenant holds reserved now."""
    if not tenant_ids:
        return {}
    rows = await conn.fetch(_TENANT_USAGE, sorted(tenant_ids))
    return {r[0]: (int(r[1]), int(r[2]), int(r[3])) for r in rows}


async def ledgers_read(conn: Connection, *, pool_ids: Collection[str]) -> dict[str, LedgerRow]:
    """Return the current ledger rows of ``pool_ids`` (no locks: a fresh look after a lost race)."""
    if not pool_ids:
        return {}
    rows = await conn.fetch(_LEDGERS, sorted(pool_ids))
    return {
        r[0]: LedgerRow((int(r[1]), int(r[2]), int(r[3])), (int(r[4]), int(r[5]), int(r[6])))
        for r in rows
    }
