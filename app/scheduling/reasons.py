"""Reason codes (a closed set), their stages, the filter :class:`Status`, and the
headline rule of a "no placement" result.

Codes are ordered by **stage**: visibility and runtime class, then operator status
and health, placement constraints, capacity, affinity, gang. Filters run in that order and a
pool stops at its first rejection, so a pool's code says how far it got. The headline of a
task that fits nowhere is its **closest miss**: the code of the latest stage any pool reached,
ties by the most pools, then by enum order (:func:`headline`). Only these values may reach
metrics labels.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum, StrEnum

__all__ = ["CODE", "REASONS", "STAGE", "Reason", "Stage", "Status", "describe_counts",
           "headline"]


class Reason(StrEnum):
    """Why a pool was rejected (or why a task fits nowhere)."""

    TENANT_NOT_ALLOWED = "tenant_not_allowed"
    RUNTIME_CLASS_MISMATCH = "runtime_class_mismatch"
    #: Quota admission (before any pool is looked at): the tenant's own limit, or its
    #: cohort has not enough to lend.
    QUOTA_EXCEEDED = "quota_exceeded"
    QUOTA_BORROW_UNAVAILABLE = "quota_borrow_unavailable"
    POOL_NOT_ACTIVE = "pool_not_active"
    POOL_NOT_READY = "pool_not_ready"
    RUNTIME_UNHEALTHY = "runtime_unhealthy"
    LEDGER_MISSING = "ledger_missing"
    REGION_NOT_ALLOWED = "region_not_allowed"
    RESIDENCY_MISMATCH = "residency_mismatch"
    SELECTOR_MISMATCH = "selector_mismatch"
    #: Headline only (no filter returns it): the pools that pass every other filter are all
    #: smaller in total than one member, so released capacity can never make it fit.
    NEVER_FITS = "never_fits"
    INSUFFICIENT_CPU = "insufficient_cpu"
    INSUFFICIENT_MEMORY = "insufficient_memory"
    INSUFFICIENT_LLM_SLOTS = "insufficient_llm_slots"
    AFFINITY_UNSATISFIED = "affinity_unsatisfied"
    ANTI_AFFINITY_VIOLATED = "anti_affinity_violated"
    GANG_UNSATISFIABLE = "gang_unsatisfiable"


class Stage(IntEnum):
    """How far a pool got through the filters; a later stage is a closer miss."""

    VISIBILITY = 1
    OPERATIONS = 2
    CONSTRAINTS = 3
    CAPACITY = 4
    AFFINITY = 5
    GANG = 6


#: The stage of each reason code.
STAGE: dict[Reason, Stage] = {
    Reason.TENANT_NOT_ALLOWED: Stage.VISIBILITY,
    Reason.RUNTIME_CLASS_MISMATCH: Stage.VISIBILITY,
    Reason.QUOTA_EXCEEDED: Stage.VISIBILITY,
    Reason.QUOTA_BORROW_UNAVAILABLE: Stage.VISIBILITY,
    Reason.POOL_NOT_ACTIVE: Stage.OPERATIONS,
    Reason.POOL_NOT_READY: Stage.OPERATIONS,
    Reason.RUNTIME_UNHEALTHY: Stage.OPERATIONS,
    Reason.LEDGER_MISSING: Stage.OPERATIONS,
    Reason.REGION_NOT_ALLOWED: Stage.CONSTRAINTS,
    Reason.RESIDENCY_MISMATCH: Stage.CONSTRAINTS,
    Reason.SELECTOR_MISMATCH: Stage.CONSTRAINTS,
    Reason.NEVER_FITS: Stage.CONSTRAINTS,
    Reason.INSUFFICIENT_CPU: Stage.CAPACITY,
    Reason.INSUFFICIENT_MEMORY: Stage.CAPACITY,
    Reason.INSUFFICIENT_LLM_SLOTS: Stage.CAPACITY,
    Reason.AFFINITY_UNSATISFIED: Stage.AFFINITY,
    Reason.ANTI_AFFINITY_VIOLATED: Stage.AFFINITY,
    Reason.GANG_UNSATISFIABLE: Stage.GANG,
}

#: Reasons in stage order (the headline's last tie-break); ``CODE[reason]`` is the small int
#: used in numpy code arrays.
REASONS: tuple[Reason, ...] = tuple(Reason)
CODE: dict[Reason, int] = {r: i for i, r in enumerate(REASONS)}
#: Code array value meaning "feasible".
PASS = -1


@dataclass(frozen=True, slots=True)
class Status:
    """The verdict of a filter on one pool: feasible, or rejected with one reason code."""

    reason: Reason | None = None

    @property
    def ok(self) -> bool:
        """Return whether the pool is feasible."""
        return self.reason is None

    @classmethod
    def success(cls) -> Status:
        """Return the feasible status."""
        return _SUCCESS

    @classmethod
    def from_code(cls, code: int) -> Status:
        """Return the status of a numpy code (``PASS`` or an index into ``REASONS``)."""
        return _SUCCESS if code == PASS else cls(REASONS[code])


_SUCCESS = Status()

# (singular, plural) phrases completing "N pool(s) ..." in a pending message.
_PHRASES: dict[Reason, tuple[str, str]] = {
    Reason.TENANT_NOT_ALLOWED: ("is not open to this tenant", "are not open to this tenant"),
    Reason.POOL_NOT_ACTIVE: ("is cordoned or draining", "are cordoned or draining"),
    Reason.POOL_NOT_READY: ("is not ready", "are not ready"),
    Reason.RUNTIME_UNHEALTHY: ("has no fresh heartbeat", "have no fresh heartbeat"),
    Reason.LEDGER_MISSING: ("has no registered capacity", "have no registered capacity"),
    Reason.RUNTIME_CLASS_MISMATCH: (
        "runs another runtime class",
        "run another runtime class",
    ),
    Reason.QUOTA_EXCEEDED: ("is beyond the tenant's quota", "are beyond the tenant's quota"),
    Reason.QUOTA_BORROW_UNAVAILABLE: (
        "needs more than the cohort can lend", "need more than the cohort can lend"
    ),
    Reason.REGION_NOT_ALLOWED: ("is in a region not allowed", "are in regions not allowed"),
    Reason.RESIDENCY_MISMATCH: (
        "has another data residency",
        "have another data residency",
    ),
    Reason.SELECTOR_MISMATCH: (
        "does not match the pool selector",
        "do not match the pool selector",
    ),
    Reason.NEVER_FITS: ("is too small for one member", "are too small for one member"),
    Reason.INSUFFICIENT_CPU: ("lacks cpu", "lack cpu"),
    Reason.INSUFFICIENT_MEMORY: ("lacks memory", "lack memory"),
    Reason.INSUFFICIENT_LLM_SLOTS: ("lacks llm slots", "lack llm slots"),
    Reason.AFFINITY_UNSATISFIED: (
        "does not satisfy required affinity",
        "do not satisfy required affinity",
    ),
    Reason.ANTI_AFFINITY_VIOLATED: ("violates anti-affinity", "violate anti-affinity"),
    Reason.GANG_UNSATISFIABLE: (
        "fits some members but no spread of the gang fits",
        "fit some members but no spread of the gang fits",
    ),
}


# The capacity phrases of a task that never fits: its pools are too small, not full.
_TOO_SMALL: dict[Reason, tuple[str, str]] = {
    Reason.INSUFFICIENT_CPU: ("has less cpu in total than it requests",
                              "have less cpu in total than it requests"),
    Reason.INSUFFICIENT_MEMORY: ("has less memory in total than it requests",
                                 "have less memory in total than it requests"),
    Reason.INSUFFICIENT_LLM_SLOTS: ("has fewer llm slots in total than it requests",
                                    "have fewer llm slots in total than it requests"),
}


def _closeness(reason: Reason, n: int) -> tuple[int, int, int]:
    """Sort key, closest first: latest stage, then most pools, then enum order."""
    return (-STAGE[reason], -n, CODE[reason])


def headline(counts: Mapping[Reason, int]) -> Reason | None:
    """Return the closest miss of ``counts`` (pools per code): the code of the latest stage
    any pool reached, ties by the most pools, then by enum order; None when empty."""
    present = [(r, n) for r, n in counts.items() if n > 0]
    if not present:
        return None
    return min(present, key=lambda rn: _closeness(*rn))[0]


def describe_counts(counts: Mapping[Reason, int], *, never_fits: bool = False) -> str:
    """Render rejection counts as one sentence that names no pool: none of the pools looked
    at fits (each pool is counted once, under its code), then every count, closest miss
    first and marked ``(closest)``, e.g.
    "0/160 pools fit: 3 lack cpu (closest), 157 run another runtime class". With
    ``never_fits`` the capacity counts say the pools are too small, and the sentence starts
    with "never fits"."""
    present = sorted(((r, n) for r, n in counts.items() if n > 0),
                     key=lambda rn: _closeness(*rn))
    if not present:
        return "no pool fits"
    looked = sum(n for _, n in present)
    parts = []
    for i, (reason, n) in enumerate(present):
        one, many = (_TOO_SMALL if never_fits else _PHRASES).get(reason, _PHRASES[reason])
        parts.append(f"{n} {one if n == 1 else many}" + (" (closest)" if i == 0 else ""))
    noun = "pool fits" if looked == 1 else "pools fit"
    text = f"0/{looked} {noun}: " + ", ".join(parts)
    return f"never fits, no pool is large enough; {text}" if never_fits else text
