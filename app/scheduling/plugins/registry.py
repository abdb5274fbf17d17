"""The registry: every plugin name mapped to its constructor, filters in pipeline order and
scores with their positive integer weights, per strategy, and which filter each reason code
comes from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from app.scheduling.plugins import names
from app.scheduling.plugins.artifact_locality import ArtifactLocality
from app.scheduling.plugins.base import FilterPlugin, ScorePlugin
from app.scheduling.plugins.capacity import Capacity
from app.scheduling.plugins.cost import Cost
from app.scheduling.plugins.data_residency import DataResidency
from app.scheduling.plugins.failure_domain_spread import FailureDomainSpread
from app.scheduling.plugins.health import Health
from app.scheduling.plugins.least_loaded import LeastLoaded, MostLoaded
from app.scheduling.plugins.pool_selector import PoolSelector
from app.scheduling.plugins.pool_status import PoolStatus
from app.scheduling.plugins.preferred_affinity import PreferredAffinity
from app.scheduling.plugins.region import Region
from app.scheduling.plugins.required_affinity import RequiredAffinity
from app.scheduling.plugins.runtime_class import RuntimeClass
from app.scheduling.plugins.tenant_access import TenantAccess
from app.scheduling.reasons import Reason

__all__ = ["FILTERS", "SCORES", "Profile", "profile", "reason_plugins"]

#: Filters in pipeline order, which is stage order (``reasons.STAGE``); a pool stops at its
#: first rejection, so its one code says how far it got (the closest-miss headline relies on
#: it: a cordoned pool of another runtime class counts as a runtime class mismatch).
FILTERS: dict[str, type[FilterPlugin]] = {
    names.TENANT_ACCESS: TenantAccess,
    names.RUNTIME_CLASS: RuntimeClass,
    names.POOL_STATUS: PoolStatus,
    names.HEALTH: Health,
    names.REGION: Region,
    names.DATA_RESIDENCY: DataResidency,
    names.POOL_SELECTOR: PoolSelector,
    names.CAPACITY: Capacity,
    names.REQUIRED_AFFINITY: RequiredAffinity,
}

#: Score constructors and weights.
SCORES: dict[str, tuple[Callable[[], ScorePlugin], int]] = {
    names.LEAST_LOADED: (LeastLoaded, 1),
    names.MOST_LOADED: (MostLoaded, 1),
    names.COST: (Cost, 1),
    names.PREFERRED_AFFINITY: (PreferredAffinity, 2),
    names.FAILURE_DOMAIN_SPREAD: (FailureDomainSpread, 1),
    names.ARTIFACT_LOCALITY: (ArtifactLocality, 1),
}

#: Which scores each strategy runs (the load scorer is the one that differs).
STRATEGIES: dict[str, tuple[str, ...]] = {
    "spread": (
        names.LEAST_LOADED,
        names.COST,
        names.PREFERRED_AFFINITY,
        names.FAILURE_DOMAIN_SPREAD,
        names.ARTIFACT_LOCALITY,
    ),
    "binpack": (
        names.MOST_LOADED,
        names.COST,
        names.PREFERRED_AFFINITY,
        names.FAILURE_DOMAIN_SPREAD,
        names.ARTIFACT_LOCALITY,
    ),
}


@dataclass(frozen=True, slots=True)
class Profile:
    """The instantiated plugins of one strategy: filters in order, scores with weights."""

    filters: tuple[FilterPlugin, ...]
    scores: tuple[tuple[ScorePlugin, int], ...]


_PROFILES: dict[str, Profile] = {}


def profile(strategy: str) -> Profile:
    """Return the (cached) plugin profile of ``strategy``."""
    hit = _PROFILES.get(strategy)
    if hit is None:
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}")
        scores = []
        for name in STRATEGIES[strategy]:
            ctor, weight = SCORES[name]
            if weight <= 0:
                raise ValueError(f"score {name} needs a positive weight")
            scores.append((ctor(), weight))
        filters = tuple(ctor() for ctor in FILTERS.values())
        hit = _PROFILES[strategy] = Profile(filters, tuple(scores))
    return hit


def reason_plugins() -> dict[str, str]:
    """Map each reason code to the name of the filter that declares it (``gang`` for
    ``gang_unsatisfiable``; ``capacity`` for ``never_fits``, the headline of capacity misses
    on pools too small; ``quota`` for the quota admission stage), for metric labels."""
    out = {str(r): name for name, cls in FILTERS.items() for r in cls.REASONS}
    out.setdefault(str(Reason.GANG_UNSATISFIABLE), names.GANG)
    out.setdefault(str(Reason.NEVER_FITS), names.CAPACITY)
    out.setdefault(str(Reason.QUOTA_EXCEEDED), names.QUOTA)
    out.setdefault(str(Reason.QUOTA_BORROW_UNAVAILABLE), names.QUOTA)
    return out
