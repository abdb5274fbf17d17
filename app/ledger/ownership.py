"""Advisory locks of shard ownership and lease-recovery leadership (SQL only; the policy is in
:mod:`app.reconciler.ownership`).

Every Berth advisory lock uses the two-int form ``(NAMESPACE, key)``. These are *session*
locks: they are taken on a dedicated connection (``Database.connect``) and vanish with its
session, even when the process is killed. ``pg_locks`` shows every session's granted locks,
so the member locks list the live reconciler replicas.
"""

from __future__ import annotations

from app.db import Connection

#: First key of every Berth advisory lock (the two-int form): "BRTH".
NAMESPACE = 0x42525448

_TRY = "SELECT pg_try_advisory_lock($1::int, $2::int)"
_UNLOCK = "SELECT pg_advisory_unlock($1::int, $2::int)"
_UNLOCK_ALL = "SELECT pg_advisory_unlock_all()"
# objsubid = 2 marks the two-int form; classid holds the first key, objid the second.
_HELD = (
    "SELECT objid FROM pg_locks WHERE locktype = 'advisory' AND granted "
    "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "AND classid = $1::int::oid AND objsubid = 2 AND objid >= $2::int::oid "
    "AND objid < $3::int::oid ORDER BY objid"
)


async def ownership_lock_try(conn: Connection, *, key: int) -> bool:
    """Take the session lock ``(NAMESPACE, key)`` if free; return whether our session holds it."""
    return bool(await conn.fetchval(_TRY, NAMESPACE, key))


async def ownership_lock_release(conn: Connection, *, key: int) -> bool:
    """Release the session lock ``(NAMESPACE, key)``; return whether it was held."""
    return bool(await conn.fetchval(_UNLOCK, NAMESPACE, key))


async def ownership_locks_release_all(conn: Connection) -> None:
    """Release every session advisory lock this connection holds."""
    await conn.fetchval(_UNLOCK_ALL)


async def ownership_keys_held(conn: Connection, *, lo: int, hi: int) -> list[int]:
    """Return the keys in ``[lo, hi)`` of the ``NAMESPACE`` locks any session holds now."""
    return [int(r[0]) for r in await conn.fetch(_HELD, NAMESPACE, lo, hi)]
