"""Recorded passes: each committed pass's inputs and decisions (compressed bytes, see
:mod:`app.scheduling.recording`), and the static pools they name by digest.

A pass writes its record in its own transaction, so a record exists exactly when its pass
committed. The static pools are written by the first pass that uses them and touched again
at most every quarter of the retention (:class:`app.reconciler.recording.Recorder`), so the
pruning below, which deletes pools unused for the whole retention and named by no record,
never deletes pools a pass is about to name.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime

from app.db import Connection

__all__ = [
    "PassRecordRow",
    "pass_record_add",
    "pass_record_pools_read",
    "pass_record_pools_touch",
    "pass_records_prune",
    "pass_records_read",
]


@dataclass(frozen=True, slots=True)
class PassRecordRow:
    """One recorded pass as stored."""

    id: int
    pass_id: str
    recorded_at: datetime
    pools_digest: str
    plan_digest: str
    inputs: bytes
    decisions: bytes


_POOLS_TOUCH = (
    "INSERT INTO pass_record_pools (digest, used_at, pools) VALUES ($1, $2, $3) "
    "ON CONFLICT (digest) DO UPDATE SET used_at = GREATEST(pass_record_pools.used_at, "
    "EXCLUDED.used_at)"
)

_ADD = (
    "INSERT INTO pass_records (pass_id, recorded_at, pools_digest, task_ids, placed, "
    "plan_digest, inputs, decisions) VALUES ($1, $2, $3, $4::uuid[], $5, $6, $7, $8)"
)


async def pass_record_pools_touch(
    conn: Connection, *, digest: str, pools: bytes, now: datetime
) -> None:
    """Store the static pools ``pools`` under ``digest`` (or mark them used at ``now``)."""
    await conn.execute(_POOLS_TOUCH, digest, now, pools)


async def pass_record_add(
    conn: Connection, *, pass_id: str, recorded_at: datetime, pools_digest: str,
    task_ids: Sequence[uuid.UUID], placed: int, plan_digest: str, inputs: bytes,
    decisions: bytes,
) -> None:
    """Record one pass: its inputs, its decisions and the tasks it decided."""
    await conn.execute(_ADD, pass_id, recorded_at, pools_digest, list(task_ids), placed,
                       plan_digest, inputs, decisions)


_COLUMNS = "id, pass_id, recorded_at, pools_digest, plan_digest, inputs, decisions"


async def pass_records_read(
    conn: Connection, *, after_id: int, limit: int, since: datetime | None = None,
    pass_ids: Collection[str] | None = None, task_id: uuid.UUID | None = None,
) -> list[PassRecordRow]:
    """Return up to ``limit`` records after ``after_id`` in id order: those recorded at or
    after ``since``, those of ``pass_ids``, or the one that decided ``task_id``."""
    if pass_ids is not None:
        rows = await conn.fetch(
            f"SELECT {_COLUMNS} FROM pass_records WHERE pass_id = ANY($1::text[]) "
            "AND id > $2 ORDER BY id LIMIT $3", sorted(pass_ids), after_id, limit)
    elif task_id is not None:
        rows = await conn.fetch(
            f"SELECT {_COLUMNS} FROM pass_records WHERE $1 = ANY(task_ids) AND id > $2 "
            "ORDER BY id DESC LIMIT 1", task_id, after_id)
    else:
        rows = await conn.fetch(
            f"SELECT {_COLUMNS} FROM pass_records WHERE recorded_at >= $1 AND id > $2 "
            "ORDER BY id LIMIT $3", since or datetime.min, after_id, limit)
    return [PassRecordRow(**dict(r)) for r in rows]


async def pass_record_pools_read(
    conn: Connection, *, digests: Collection[str]
) -> dict[str, bytes]:
    """Return the stored static pools of ``digests`` (a digest pruned is missing)."""
    rows = await conn.fetch(
        "SELECT digest, pools FROM pass_record_pools WHERE digest = ANY($1::text[])",
        sorted(digests))
    return {r["digest"]: r["pools"] for r in rows}


# $1 before, $2 limit: the oldest records first, then the pools no record names that were
# not used since $1.
_PRUNE = (
    "WITH d AS (SELECT id FROM pass_records WHERE recorded_at < $1 ORDER BY recorded_at "
    "LIMIT $2), x AS (DELETE FROM pass_records WHERE id IN (SELECT id FROM d) RETURNING 1) "
    "SELECT count(*) FROM x"
)
_PRUNE_POOLS = (
    "DELETE FROM pass_record_pools p WHERE p.used_at < $1 AND NOT EXISTS "
    "(SELECT 1 FROM pass_records r WHERE r.pools_digest = p.digest)"
)


async def pass_records_prune(conn: Connection, *, before: datetime, limit: int) -> int:
    """Delete up to ``limit`` records made before ``before`` (and the static pools no
    record names any more); return how many records."""
    n = int(await conn.fetchval(_PRUNE, before, limit))
    if n < limit:
        await conn.execute(_PRUNE_POOLS, before)
    return n
