"""Shard ownership (static or by advisory locks) and lease-recovery leadership.

Static ownership is fixed by ``--shard INDEX/COUNT``. Dynamic ownership uses PostgreSQL
session advisory locks (their SQL is in :mod:`app.ledger.ownership`) on one dedicated
connection per replica (``Database.connect``, outside the pool):

* a **member** lock ``(NAMESPACE, MEMBER_BASE + i)`` on the lowest free index ``i`` says the
  replica is alive; ``pg_locks`` lists the live members to every replica, and a replica
  that dies (even SIGKILL) loses its locks the moment its session ends;
* each replica's fair share is the slots ``s`` with ``s % members == rank`` (its position
  among live member indexes); it releases slot locks ``(NAMESPACE, s)`` outside its share
  and tries to take those inside; a slot still held by a replica that has not rebalanced
  yet is retried at the next rebalance, so a dead replica's slots are owned again within
  about two rebalance periods;
* the **leader** lock ``(NAMESPACE, LEADER_KEY)`` elects the one replica that recovers
  expired leases and overdue drains; its recovery transactions run on this same connection,
  so they can only commit while the session — and so the leadership term — is alive.

Ownership is for spreading work, not for correctness: claims use ``SKIP LOCKED`` and commit
only tasks still claimed by their pass, so a slot briefly owned twice during a handover is
harmless.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from app.config import SHARD_SLOTS
from app.db import Connection, Database
from app.ledger.ownership import (
    NAMESPACE,
    ownership_keys_held,
    ownership_lock_release,
    ownership_lock_try,
    ownership_locks_release_all,
)
from app.metrics import SHARDS_OWNED
from app.reconciler.retry import transient_kind

log = logging.getLogger("berth.reconciler")

T = TypeVar("T")

__all__ = [
    "LEADER_KEY",
    "MEMBER_BASE",
    "NAMESPACE",
    "DynamicOwnership",
    "StaticOwnership",
    "slots_share",
]

#: Second key of the leadership lock (the first is :data:`NAMESPACE`).
LEADER_KEY = 1_000_000
#: Member locks use MEMBER_BASE + index.
MEMBER_BASE = 2_000_000
MEMBERS_MAX = SHARD_SLOTS * 4
#: ``application_name`` of the ownership session, as ``pg_stat_activity`` shows it.
APPLICATION_NAME = "berth-ownership"


def slots_share(rank: int, members: int, slots: int = SHARD_SLOTS) -> frozenset[int]:
    """Return the slots of the replica at ``rank`` among ``members`` live replicas."""
    if members < 1 or not 0 <= rank < members:
        return frozenset()
    return frozenset(s for s in range(slots) if s % members == rank)


class StaticOwnership:
    """Fixed slots; never the lease-recovery leader unless told so."""

    def __init__(
        self,
        slots: frozenset[int],
        *,
        db: Database,
        owner_id: str = "static",
        lead: bool = True,
    ) -> None:
        self.slots = frozenset(slots)
        self._dynamic = DynamicOwnership(db, owner_id=owner_id) if lead else None

    async def start(self) -> None:
        """Publish the owned slots."""
        SHARDS_OWNED.set(len(self.slots))
        log.info("owning static shard slots", extra={"slots": sorted(self.slots)})

    async def refresh(self) -> frozenset[int]:
        """Return the owned slots (they never change)."""
        if self._dynamic is not None:
            await self._dynamic.connection_ensure()
        return self.slots

    async def leader(self) -> bool:
        """Return whether this replica holds the lease-recovery leadership now."""
        return self._dynamic is not None and await self._dynamic.leader()

    async def as_leader(self, operation: Callable[[Connection], Awaitable[T]]) -> T | None:
        """Run ``operation`` in a transaction tied to the leadership term, if leader."""
        if self._dynamic is None:
            return None
        return await self._dynamic.as_leader(operation)

    async def stop(self) -> None:
        """Give up leadership."""
        SHARDS_OWNED.set(0)
        if self._dynamic is not None:
            await self._dynamic.stop()


class DynamicOwnership:
    """Slots split among live replicas through advisory locks on one session connection."""

    def __init__(
        self, db: Database, *, owner_id: str, slots_total: int = SHARD_SLOTS
    ) -> None:
        self._db = db
        self.owner_id = owner_id
        self.slots_total = slots_total
        self.slots: frozenset[int] = frozenset()
        self.member: int | None = None
        self.members = 0
        self._conn: Connection | None = None
        self._is_leader = False
        self._mutex = asyncio.Lock()

    async def connection_ensure(self) -> Connection:
        """Open the dedicated session connection if it is not open (or no longer is)."""
        if self._conn is not None and not self._conn.is_closed():
            return self._conn
        if self._conn is not None:
            self._forget().terminate()  # its session (and every lock of it) is gone
        self._conn = await self._db.connect(application_name=APPLICATION_NAME)
        self.slots = frozenset()
        self._is_leader = False
        self.member = None
        return self._conn

    async def _member_take(self) -> None:
        assert self._conn is not None
        for i in range(MEMBERS_MAX):
            if await ownership_lock_try(self._conn, key=MEMBER_BASE + i):
                self.member = i
                return
        raise RuntimeError(f"more than {MEMBERS_MAX} reconciler replicas on one database")

    def _forget(self):  # type: ignore[no-untyped-def]
        """Drop every slot, leadership and membership; return the session to close, if any."""
        conn, self._conn = self._conn, None
        self.slots = frozenset()
        self._is_leader = False
        self.member = None
        SHARDS_OWNED.set(0)
        return conn

    async def _lost(self, exc: BaseException) -> None:
        log.warning(
            "ownership connection lost; giving up every slot",
            extra={"owner": self.owner_id, "error": type(exc).__name__},
        )
        conn = self._forget()
        if conn is not None:
            conn.terminate()  # the connection is broken: drop it without a goodbye

    async def start(self) -> None:
        """Join the replicas and take a first share of slots."""
        await self.refresh()

    async def refresh(self) -> frozenset[int]:
        """Re-read the live replicas, release slots outside this share, take those inside."""
        async with self._mutex:
            try:
                conn = await self.connection_ensure()
                if self.member is None:
                    await self._member_take()
                held = await ownership_keys_held(
                    conn, lo=MEMBER_BASE, hi=MEMBER_BASE + MEMBERS_MAX
                )
                live = [k - MEMBER_BASE for k in held]
                member = self.member
                assert member is not None
                if member not in live:  # pragma: no cover - our own lock is always listed
                    live = sorted([*live, member])
                self.members = len(live)
                share = slots_share(live.index(member), len(live), self.slots_total)
                owned = set(self.slots)
                for s in sorted(owned - share):
                    await ownership_lock_release(conn, key=s)
                    owned.discard(s)
                for s in sorted(share - owned):
                    if await ownership_lock_try(conn, key=s):
                        owned.add(s)
                changed = frozenset(owned) != self.slots
                self.slots = frozenset(owned)
                SHARDS_OWNED.set(len(self.slots))
                if changed:
                    log.info(
                        "shard slots rebalanced",
                        extra={"owner": self.owner_id, "member": self.member,
                               "replicas": self.members, "slots_owned": len(self.slots),
                               "slots": sorted(self.slots)},
                    )
            except Exception as exc:
                await self._lost(exc)
            return self.slots

    async def leader(self) -> bool:
        """Try to hold the leadership lock; return whether this replica is the leader."""
        async with self._mutex:
            if self._is_leader and self._conn is not None and not self._conn.is_closed():
                return True
            try:
                conn = await self.connection_ensure()
                self._is_leader = await ownership_lock_try(conn, key=LEADER_KEY)
                if self._is_leader:
                    log.info("became lease-recovery leader", extra={"owner": self.owner_id})
            except Exception as exc:
                await self._lost(exc)
            return self._is_leader

    async def as_leader(self, operation: Callable[[Connection], Awaitable[T]]) -> T | None:
        """Run ``operation`` in a transaction on the leadership session, if still leader."""
        if not await self.leader():
            return None
        async with self._mutex:
            conn = self._conn
            assert conn is not None
            try:
                async with conn.transaction():
                    return await operation(conn)
            except Exception as exc:
                if transient_kind(exc) == "connection":
                    await self._lost(exc)
                    return None
                raise

    async def stop(self) -> None:
        """Release every lock by closing the session."""
        async with self._mutex:
            conn = self._forget()
            if conn is not None:
                try:
                    await ownership_locks_release_all(conn)
                    await conn.close(timeout=5)
                except Exception:  # the session ends anyway, and its locks with it
                    conn.terminate()
