"""Wake conditions of parked tasks: which events could let a task that fits nowhere fit.

A task that fits nowhere is parked: passes no longer claim it until an event that
could help it happens. The condition is derived from its reason, as a set of **wake keys**;
every wakeup carries keys too (:mod:`app.ledger.wakeups` resolves them), and a wakeup brings
back exactly the parked tasks whose keys it shares:

=====================  ========================================  ==========================
key                    the parked task waits for                 carried by
=====================  ========================================  ==========================
``class:<class>``      a pool of its runtime class added,        pool_added, pool_changed,
                       activated, healthy again, changed, or     pool_activated,
                       its totals raised (every task has it)     pool_healthy, ledger_raised
``pool:<id>``          capacity released on a pool that          capacity_released
                       passed every other stage (at most
                       ``WAKE_POOLS_MAX`` named)
``cap:<class>``        capacity released on any pool of its      capacity_released
                       class (more near pools than are named;
                       or anti-affinity: a conflicting task
                       ending releases its capacity; or a
                       quota reason: usage in the class drops)
``placed:<tenant>``    a task of its tenant placed (required     a pass that leased a
                       affinity has nothing to follow yet)       labelled task
=====================  ========================================  ==========================

Keys name only what the task's own tenant may see: its runtime class, its tenant, and pools
listed in its own (visible) rejections. Pure: no I/O.
"""

from __future__ import annotations

from app.scheduling.reasons import STAGE, Reason, Stage
from app.scheduling.results import NoPlacement
from app.scheduling.spec import CompiledSpec

__all__ = ["key_capacity", "key_class", "key_placed", "key_pool", "pending_stage", "wake_keys"]

#: The stage stored for pending codes outside the closed set (an unreadable spec, a
#: scheduler error): such a task waits for the safety sweep and competes for nothing.
STAGE_NONE = 0


def key_class(runtime_class: str) -> str:
    """Return the key of structural changes to pools of ``runtime_class``."""
    return f"class:{runtime_class}"


def key_pool(pool_id: str) -> str:
    """Return the key of capacity released on ``pool_id``."""
    return f"pool:{pool_id}"


def key_capacity(runtime_class: str) -> str:
    """Return the key of capacity released on any pool of ``runtime_class``."""
    return f"cap:{runtime_class}"


def key_placed(tenant_id: str) -> str:
    """Return the key of a task of ``tenant_id`` being placed."""
    return f"placed:{tenant_id}"


def pending_stage(code: str) -> int:
    """Return the stage of a pending code (``STAGE_NONE`` outside the closed set)."""
    try:
        return int(STAGE[Reason(code)])
    except ValueError:
        return STAGE_NONE


def wake_keys(spec: CompiledSpec, reason: NoPlacement) -> tuple[str, ...]:
    """Return the sorted wake keys of a task of ``spec`` that fits nowhere for ``reason``."""
    rc = spec.runtime_class
    keys = {key_class(rc)}
    codes = {Reason(code) for code, n in reason.rejections.items() if n > 0}
    near = any(STAGE[c] in (Stage.CAPACITY, Stage.GANG) for c in codes)
    if near:
        if reason.wake_pools is None:
            keys.add(key_capacity(rc))
        else:
            keys.update(key_pool(p) for p in reason.wake_pools)
    if reason.code in (Reason.QUOTA_EXCEEDED, Reason.QUOTA_BORROW_UNAVAILABLE):
        # Usage drops (in the tenant or its cohort) when leases of the class end.
        keys.add(key_capacity(rc))
    if Reason.ANTI_AFFINITY_VIOLATED in codes:
        keys.add(key_capacity(rc))
    if Reason.AFFINITY_UNSATISFIED in codes:
        keys.add(key_placed(spec.tenant_id))
    return tuple(sorted(keys))
