"""The registry: one registration record per plugin, and the profiles built from them.

A :class:`Registration` says what a plugin is: its name, its class, its weight (a score's
positive integer weight; a filter has none), the strategies that run it, and its scope (what
its verdict reads, declared by the class: a property test holds every class-scope plugin to
it). Filters run in registry order, which is stage order (``reasons.STAGE``): a pool stops at
its first rejection, so its one code says how far it got (the closest-miss headline relies
on it). A :class:`Profile` is the instantiated plugins of one strategy; ``decide`` takes it
as data. A new score plugin is one module and one line of :data:`REGISTRY`.
"""

from __future__ import annotations

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

__all__ = ["FILTERS", "REGISTRY", "STRATEGIES", "Profile", "Registration", "profile",
           "profile_build", "reason_plugins"]

#: The strategies: which load score runs (least loaded spreads, most loaded packs).
STRATEGIES = ("spread", "binpack")


@dataclass(frozen=True, slots=True)
class Registration:
    """One plugin: name, class, weight (scores only), strategies that run it."""

    name: str
    plugin: type[FilterPlugin] | type[ScorePlugin]
    weight: int = 0
    strategies: tuple[str, ...] = STRATEGIES

    @property
    def scope(self) -> str:
        """Return what the plugin's verdict reads (its class declares it)."""
        return self.plugin.SCOPE

    @property
    def is_filter(self) -> bool:
        """Return whether the plugin filters (else it scores)."""
        return issubclass(self.plugin, FilterPlugin)


#: Every plugin Berth ships: filters in pipeline order, then scores.
REGISTRY: tuple[Registration, ...] = (
    Registration(names.TENANT_ACCESS, TenantAccess),
    Registration(names.RUNTIME_CLASS, RuntimeClass),
    Registration(names.POOL_STATUS, PoolStatus),
    Registration(names.HEALTH, Health),
    Registration(names.REGION, Region),
    Registration(names.DATA_RESIDENCY, DataResidency),
    Registration(names.POOL_SELECTOR, PoolSelector),
    Registration(names.CAPACITY, Capacity),
    Registration(names.REQUIRED_AFFINITY, RequiredAffinity),
    Registration(names.LEAST_LOADED, LeastLoaded, 1, ("spread",)),
    Registration(names.MOST_LOADED, MostLoaded, 1, ("binpack",)),
    Registration(names.COST, Cost, 1),
    Registration(names.PREFERRED_AFFINITY, PreferredAffinity, 2),
    Registration(names.FAILURE_DOMAIN_SPREAD, FailureDomainSpread, 1),
    Registration(names.ARTIFACT_LOCALITY, ArtifactLocality, 1),
)

#: The shipped filters by name, in pipeline order.
FILTERS: dict[str, type[FilterPlugin]] = {
    r.name: r.plugin for r in REGISTRY if issubclass(r.plugin, FilterPlugin)}


@dataclass(frozen=True, slots=True)
class Profile:
    """The instantiated plugins of one strategy: filters in order, scores with weights.

    ``name`` tells profiles apart where a snapshot memoizes per profile."""

    name: str
    filters: tuple[FilterPlugin, ...]
    scores: tuple[tuple[ScorePlugin, int], ...]


def profile_build(
    strategy: str, registry: tuple[Registration, ...] = REGISTRY, *, name: str | None = None
) -> Profile:
    """Return the profile of ``strategy`` over ``registry`` (named ``name``, else the
    strategy)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}")
    filters: list[FilterPlugin] = []
    scores: list[tuple[ScorePlugin, int]] = []
    for r in registry:
        if issubclass(r.plugin, FilterPlugin):
            filters.append(r.plugin())
        elif strategy in r.strategies:
            if r.weight <= 0:
                raise ValueError(f"score {r.name} needs a positive weight")
            scores.append((r.plugin(), r.weight))
    return Profile(name or strategy, tuple(filters), tuple(scores))


_PROFILES = {strategy: profile_build(strategy) for strategy in STRATEGIES}


def profile(strategy: str) -> Profile:
    """Return the shipped profile of ``strategy``."""
    hit = _PROFILES.get(strategy)
    if hit is None:
        raise ValueError(f"unknown strategy {strategy!r}")
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
