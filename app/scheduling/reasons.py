"""Reason codes (the closed set of SPEC §4) and the filter :class:`Status`.

The enum order is the tie-break order of the headline reason of a "no placement" result.
Only these values may reach metrics labels.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["CODE", "REASONS", "Reason", "Status", "describe_counts"]


class Reason(StrEnum):
    """Why a pool was rejected (or why a task fits nowhere)."""

    TENANT_NOT_ALLOWED = "tenant_not_allowed"
    POOL_NOT_ACTIVE = "pool_not_active"
    POOL_NOT_READY = "pool_not_ready"
    RUNTIME_UNHEALTHY = "runtime_unhealthy"
    LEDGER_MISSING = "ledger_missing"
    RUNTIME_CLASS_MISMATCH = "runtime_class_mismatch"
    REGION_NOT_ALLOWED = "region_not_allowed"
    RESIDENCY_MISMATCH = "residency_mismatch"
    SELECTOR_MISMATCH = "selector_mismatch"
    INSUFFICIENT_CPU = "insufficient_cpu"
    INSUFFICIENT_MEMORY = "insufficient_memory"
    INSUFFICIENT_LLM_SLOTS = "insufficient_llm_slots"
    AFFINITY_UNSATISFIED = "affinity_unsatisfied"
    ANTI_AFFINITY_VIOLATED = "anti_affinity_violated"
    GANG_UNSATISFIABLE = "gang_unsatisfiable"


#: Reasons in tie-break order; ``CODE[reason]`` is the small int used in numpy code arrays.
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
    Reason.REGION_NOT_ALLOWED: ("is in a region not allowed", "are in regions not allowed"),
    Reason.RESIDENCY_MISMATCH: (
        "has another data residency",
        "have another data residency",
    ),
    Reason.SELECTOR_MISMATCH: (
        "does not match the pool selector",
        "do not match the pool selector",
    ),
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


def describe_counts(counts: dict[Reason, int]) -> str:
    """Render rejection counts as one sentence that names no pool, most frequent first."""
    parts = []
    for reason, n in sorted(counts.items(), key=lambda kv: (-kv[1], CODE[kv[0]])):
        one, many = _PHRASES[reason]
        parts.append(f"{n} pool {one}" if n == 1 else f"{n} pools {many}")
    return "no pool fits: " + ", ".join(parts) if parts else "no pool fits"
