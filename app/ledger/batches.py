"""Task batch SQL: up to 1,000 validated specs stored by one statement.

:func:`task_batch_insert` sends the batch as arrays and one statement unnests them, skips
the items whose idempotency key the tenant already used, applies the per-tenant cap on
queued tasks in request order, inserts the tasks (``seq`` follows the request order) and
their ``ADMITTED`` events, and notifies the reconcilers once. On an autocommit connection
that statement is its own transaction: when it returns, every task it reports is committed.

The cap reads the same per-tenant counter as a single submission (revision 0005): with
``queued`` tasks counted and a cap of ``max_queued``, the first ``max_queued - queued`` new
items of the batch are stored and the rest are refused. Like concurrent single submissions,
concurrent batches of one tenant do not see each other's inserts, so together they can pass
the cap by what they insert at the same moment.

An item whose key another transaction inserted after the statement's snapshot waits for it
(the unique index on (tenant, key)) and then inserts nothing, exactly as a single submit
does; its task is read back by key with :func:`tasks_by_key`.

A batch without idempotency keys (the usual one) takes :func:`task_batch_insert_unkeyed`: no
key to look up, no conflict to arbitrate, so the statement is a plain insert of the first
``room`` items and answers with one row of arrays instead of a row per item.

Task ids are UUIDv7 (:func:`app.ledger.tasks.uuid7_prefix`): the batch's millisecond, then
the item's position, then 62 random bits. Ids that grow with time append to ``pk_tasks``
and ``pk_task_events (task_id, id)`` (a few leaf pages per batch) instead of landing on a random
page of each, which cost a page dirtied and, after a checkpoint, a full-page image in the
WAL per task.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from app.db import Connection
from app.ledger.tasks import _COLUMNS, TaskRow, _row, uuid7_prefix
from app.ledger.wakeups import CHANNEL, WakeSource

__all__ = ["BatchInserted", "task_batch_insert", "task_batch_insert_unkeyed", "tasks_by_key"]

#: The most items one statement takes: an item's position fills the 12 bits of its id after
#: the UUIDv7 version digit.
ITEMS_MAX = 4095


def _id(prefix: str) -> str:
    """Return a UUIDv7 per item from the parameter ``prefix`` (``uuid7_prefix``:
    'tttttttt-tttt-') and the item's position: the version digit 7 and the position as three
    hex digits (0x7000 + idx), then the variant and 62 random bits of a fresh random UUID's
    text (from its 19th character: '-yxxx-xxxxxxxxxxxx')."""
    return f"({prefix}::text || to_hex(28672 + i.idx) || substr(gen_random_uuid()::text, 19))::uuid"


def _fields(spec: str) -> str:
    """Return the top-level fields a stored task reads from its ``json`` spec, in one parse of
    the text (``json_to_record``; only ``labels`` is parsed again, as ``jsonb``), rather than a
    ``jsonb`` parse of the whole spec and then a ``json`` check of it."""
    return (f'json_to_record({spec}) AS x(priority int, "runtimeClass" text, labels jsonb, '
            '"maxAttempts" int)')


#: What every inserted task holds besides its id, spec, key and hash ($1 tenant, $2 shard,
#: $3 now); priority, runtime class, labels and attempts are read from the validated spec.
_TASK_COLUMNS = """
    INSERT INTO tasks (id, tenant_id, shard, state, priority, runtime_class, spec, labels,
                       max_attempts, idempotency_key, request_hash,
                       created_at, admitted_at, updated_at)
"""
_GATE = """
    gate AS MATERIALIZED (
        SELECT CASE WHEN $4::bigint > 0
                    THEN ($4::bigint - coalesce(sum(queued), 0))::bigint
                    ELSE NULL END AS room
        FROM tenant_queue_counts WHERE tenant_id = $1
    )
"""
_EVENTS = """
    ev AS (
        INSERT INTO task_events (task_id, at, from_state, to_state, reason)
        SELECT id, $3::timestamptz, NULL, 'ADMITTED', 'submitted' FROM ins
    )
"""
_WAKE = (f"(SELECT pg_notify('{CHANNEL}', '{WakeSource.SUBMITTED.value}') "
         "FROM (SELECT 1 FROM ins LIMIT 1) AS any_inserted)")

#: The batch arrives as parallel arrays ($5..$7); an item is its position in them (from 1).
#: Keys and hashes may be empty arrays (no item has a key): ``unnest`` pads them with NULL.
#: The priority, runtime class, labels and attempts are read from the spec itself (the
#: validated JSON always has them), so the client sends each spec once; the column stores the
#: text as sent (``json``: revision 0013_spec_json), not a parsed document. ``input`` is
#: referenced twice, so PostgreSQL computes it once and every id drawn by
#: ``gen_random_uuid()`` is the one inserted and returned.
_INSERT = f"""
    WITH input AS (
        SELECT i.idx, {_id('$8')} AS id, i.spec::json AS spec, i.key, i.hash
        FROM unnest($5::text[], $6::text[], $7::text[]) WITH ORDINALITY AS i(spec, key, hash, idx)
    ), fresh AS (
        SELECT n.*, row_number() OVER (ORDER BY n.idx) AS rank
        FROM input n
        WHERE n.key IS NULL OR NOT EXISTS (
            SELECT 1 FROM tasks t WHERE t.tenant_id = $1 AND t.idempotency_key = n.key)
    ), {_GATE}, ins AS ({_TASK_COLUMNS}
        SELECT f.id, $1::text, $2::int, 'ADMITTED', x.priority, x."runtimeClass", f.spec,
               x.labels, x."maxAttempts", f.key, f.hash,
               $3::timestamptz, $3::timestamptz, $3::timestamptz
        FROM fresh f CROSS JOIN LATERAL {_fields('f.spec')}, gate
        WHERE gate.room IS NULL OR f.rank <= gate.room
        ORDER BY f.idx
        ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
        RETURNING id, seq
    ), {_EVENTS}
    SELECT f.idx, f.id::text, ins.seq,
           gate.room IS NOT NULL AND f.rank > gate.room AS refused, {_WAKE} AS woken
    FROM fresh f CROSS JOIN gate LEFT JOIN ins ON ins.id = f.id
    ORDER BY f.idx
"""

def _insert_unkeyed(wake: bool) -> str:
    """Return the statement of a batch without keys: ($5 specs, one per line; $6 id prefix).
    The first ``room`` items are inserted, in request order; one row answers: every item's id
    in request order and the seq of each inserted one (the first ones). With ``wake`` the
    statement notifies the reconcilers itself. (One text instead of an array of 1,000: less
    to encode and to decode.)"""
    return f"""
    WITH input AS MATERIALIZED (
        SELECT i.idx, {_id('$6')} AS id, i.spec::json AS spec
        FROM string_to_table($5::text, E'\\n') WITH ORDINALITY AS i(spec, idx)
    ), {_GATE}, ins AS ({_TASK_COLUMNS}
        SELECT n.id, $1::text, $2::int, 'ADMITTED', x.priority, x."runtimeClass", n.spec,
               x.labels, x."maxAttempts", NULL, NULL,
               $3::timestamptz, $3::timestamptz, $3::timestamptz
        FROM input n CROSS JOIN LATERAL {_fields('n.spec')}, gate
        WHERE gate.room IS NULL OR n.idx <= gate.room
        ORDER BY n.idx
        RETURNING id, seq
    ), {_EVENTS}
    SELECT (SELECT array_agg(id::text ORDER BY idx) FROM input),
           (SELECT coalesce(array_agg(ins.seq ORDER BY n.idx), '{{}}')
              FROM ins JOIN input n ON n.id = ins.id){", " + _WAKE if wake else ""}
"""


_INSERT_UNKEYED = {wake: _insert_unkeyed(wake) for wake in (True, False)}

_BY_KEYS = f"""
    SELECT {_COLUMNS}, t.request_hash, t.idempotency_key FROM tasks t
    WHERE t.tenant_id = $1 AND t.idempotency_key = ANY($2::text[])
"""


@dataclass(frozen=True, slots=True)
class BatchInserted:
    """What the statement did with one item it considered (an item with an unused key or
    none): stored it (``seq``), refused it for the cap, or neither (its key was taken
    concurrently; read it back by key)."""

    #: The item's position in the arrays given to :func:`task_batch_insert` (from 0).
    position: int
    id: str
    seq: int | None
    refused: bool


async def task_batch_insert(
    conn: Connection,
    *,
    tenant_id: str,
    shard: int,
    specs: Sequence[str],
    keys: Sequence[str | None],
    hashes: Sequence[str | None],
    now: datetime,
    max_queued: int = 0,
) -> list[BatchInserted]:
    """Store validated specs (camelCase JSON) as ADMITTED tasks in their order, in one
    statement, and notify reconcilers; return one entry per item whose key was unused.

    ``keys`` and ``hashes`` are parallel to ``specs``, or both empty when no item has a key.
    Items whose key the tenant already used are left out of the answer (read them with
    :func:`tasks_by_key`). With ``max_queued`` (0: no cap), new items past the tenant's room
    are ``refused``. The caller sends each key at most once.
    """
    assert len(specs) <= ITEMS_MAX
    rows = await conn.fetch(
        _INSERT, tenant_id, shard, now, max_queued, list(specs), list(keys), list(hashes),
        uuid7_prefix(now),
    )
    return [BatchInserted(r[0] - 1, r[1], r[2], r[3]) for r in rows]


async def task_batch_insert_unkeyed(
    conn: Connection,
    *,
    tenant_id: str,
    shard: int,
    specs: str,
    now: datetime,
    max_queued: int = 0,
    wake: bool = True,
) -> tuple[list[str], list[int]]:
    """Store validated specs (camelCase JSON, compact: one per line of ``specs``, at most
    :data:`ITEMS_MAX`) without idempotency keys as ADMITTED tasks in their order, in one
    statement, and notify reconcilers (unless not ``wake``: the caller wakes them after the
    commit).

    Return every item's task id in order and the seqs of those stored: the first ones; with
    ``max_queued`` (0: no cap), those past the tenant's room are refused (not stored).
    """
    row = await conn.fetchrow(
        _INSERT_UNKEYED[wake], tenant_id, shard, now, max_queued, specs, uuid7_prefix(now),
    )
    return row[0], row[1]


async def tasks_by_key(
    conn: Connection, *, tenant_id: str, keys: Sequence[str]
) -> dict[str, tuple[TaskRow, str | None]]:
    """Return the tenant's tasks stored under ``keys``, with their request hashes, by key."""
    rows = await conn.fetch(_BY_KEYS, tenant_id, list(keys))
    return {r[-1]: (_row(r), r[-2]) for r in rows}
