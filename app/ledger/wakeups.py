"""Wakeups over LISTEN/NOTIFY: events that could let a parked task fit now.

Writers call :func:`wakeup_notify` inside their transaction; PostgreSQL delivers the
notification only if that transaction commits. The payload is JSON naming the source and
the pools (or runtime instances) concerned: ``{"source": "capacity_released", "pools":
["a"]}``. A bare source name (``submitted``), or a payload too long to name its pools, is a
*broad* wakeup. Reconcilers LISTEN on :data:`CHANNEL` and turn what they received into wake
keys (:func:`wakeup_keys`, see :mod:`app.scheduling.parking`): only the parked tasks whose
keys overlap come back. ``submitted`` unparks nothing; it only starts a pass.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from enum import StrEnum

import orjson

from app.db import Connection

CHANNEL = "berth_wakeup"
#: Longest payload sent with its pools named (PostgreSQL's limit is 8000 bytes); a longer
#: one is sent broad.
PAYLOAD_MAX = 7000


class WakeSource(StrEnum):
    """Why reconcilers are woken; the only values of the wakeups metric's label."""

    SUBMITTED = "submitted"
    CAPACITY_RELEASED = "capacity_released"
    POOL_ADDED = "pool_added"
    POOL_ACTIVATED = "pool_activated"
    POOL_HEALTHY = "pool_healthy"
    LEDGER_RAISED = "ledger_raised"
    POOL_CHANGED = "pool_changed"
    #: A pass leased a labelled task: parked tasks of its tenant waiting for an affinity
    #: match are unparked in the same commit.
    TASK_PLACED = "task_placed"
    #: An admin changed a tenant's quotas or cohort: the change unparked the tasks it could
    #: help in its own transaction (app.ledger.tenants); the wakeup names nothing and only
    #: starts a pass.
    QUOTA_CHANGED = "quota_changed"
    #: The periodic pass (claims nothing parked; re-takes expired claims).
    TICK = "tick"
    #: The slow, jittered safety sweep: every parked task of the owned slots.
    SWEEP = "sweep"


@dataclass(frozen=True, slots=True)
class Wakeup:
    """One notification: its source and the pools or runtime instances it concerns
    (both None: broad, every parked task of the owned slots)."""

    source: WakeSource
    pools: tuple[str, ...] | None = None
    instances: tuple[str, ...] | None = None

    @property
    def broad(self) -> bool:
        """Return whether the wakeup names nothing (and so concerns every parked task)."""
        return self.pools is None and self.instances is None

    def payload(self) -> str:
        """Return the NOTIFY payload (broad when naming the pools would be too long)."""
        if self.broad:
            return self.source.value
        body: dict[str, object] = {"source": self.source.value}
        if self.pools is not None:
            body["pools"] = list(self.pools)
        if self.instances is not None:
            body["instances"] = list(self.instances)
        text = orjson.dumps(body).decode()
        return text if len(text.encode()) <= PAYLOAD_MAX else self.source.value

    @classmethod
    def parse(cls, payload: str) -> Wakeup:
        """Return the wakeup of a payload; anything unreadable is a broad tick."""
        try:
            return cls(WakeSource(payload))
        except ValueError:
            pass
        try:
            body = orjson.loads(payload)
            source = WakeSource(body["source"])
            pools = body.get("pools")
            instances = body.get("instances")
            return cls(
                source,
                None if pools is None else tuple(str(p) for p in pools),
                None if instances is None else tuple(str(i) for i in instances),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            return cls(WakeSource.TICK)


async def wakeup_notify(
    conn: Connection,
    *,
    source: WakeSource,
    pools: Collection[str] | None = None,
    instances: Collection[str] | None = None,
) -> None:
    """Notify reconcilers of ``source`` (on ``pools`` or ``instances``) at commit."""
    wakeup = Wakeup(
        source,
        None if pools is None else tuple(sorted(pools)),
        None if instances is None else tuple(sorted(instances)),
    )
    await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, wakeup.payload())


# $1 pools whose capacity was released, $2 pools changed, $3 runtime instances healthy again.
_KEYS = (
    "SELECT array(SELECT DISTINCT k FROM ("
    "SELECT 'pool:' || p FROM unnest($1::text[]) p "
    "UNION ALL SELECT 'cap:' || runtime_class FROM pools WHERE id = ANY($1::text[]) "
    "UNION ALL SELECT 'class:' || runtime_class FROM pools "
    "WHERE id = ANY($2::text[]) OR runtime_instance_id = ANY($3::text[])"
    ") x(k) ORDER BY k)"
)


async def wakeup_keys(
    conn: Connection,
    *,
    released_pools: Collection[str] = (),
    changed_pools: Collection[str] = (),
    healthy_instances: Collection[str] = (),
) -> list[str]:
    """Return the wake keys of capacity released on ``released_pools`` (``pool:``, ``cap:``)
    and of structural changes to ``changed_pools`` and the pools of ``healthy_instances``
    (``class:``), reading each pool's runtime class as it is now."""
    if not (released_pools or changed_pools or healthy_instances):
        return []
    return list(await conn.fetchval(
        _KEYS, sorted(released_pools), sorted(changed_pools), sorted(healthy_instances)
    ))
