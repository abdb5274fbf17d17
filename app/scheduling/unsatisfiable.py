"""The per-pass cache of specs that fit nowhere, keyed by ``CompiledSpec.fingerprint``.

Within one pass, assumed usage only grows (a removal follows a lost reservation race, whose
capacity the database already holds), so a spec that failed on capacity, constraints, health
or anti-affinity fails again for every later task with the same fingerprint. The exception is
positive required affinity: a task placed in between may carry the labels the term needs. For
such specs the entry remembers ``Assumed.version`` and is valid only while no placement was
assumed since; without an ``Assumed`` bound to the cache they are not cached at all. The
fingerprint covers tenant, runtime class, requests, hard constraints, required affinity, the
task's own labels when required terms exist (bootstrap reads them) and the gang shape;
preferred terms and artifact locality only score and are left out.
"""

from __future__ import annotations

from app.scheduling.assumed import Assumed
from app.scheduling.results import NoPlacement
from app.scheduling.spec import CompiledSpec

__all__ = ["UnsatisfiableCache"]


class UnsatisfiableCache:
    """Remember, for one pass, which spec fingerprints fit nowhere and why."""

    __slots__ = ("_assumed", "_entries", "hits")

    def __init__(self, assumed: Assumed | None = None) -> None:
        self._assumed = assumed
        self._entries: dict[tuple, tuple[NoPlacement, int | None]] = {}
        self.hits = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, spec: CompiledSpec) -> NoPlacement | None:
        """Return the cached reason for a spec with the same fingerprint, or None."""
        entry = self._entries.get(spec.fingerprint)
        if entry is None:
            return None
        reason, version = entry
        if version is not None and (self._assumed is None or self._assumed.version != version):
            del self._entries[spec.fingerprint]
            return None
        self.hits += 1
        return reason

    def put(self, spec: CompiledSpec, reason: NoPlacement) -> None:
        """Remember that ``spec`` fits nowhere in this pass, for ``reason``."""
        version = None
        if spec.depends_on_placements:
            if self._assumed is None:
                return
            version = self._assumed.version
        self._entries[spec.fingerprint] = (reason, version)

    def clear(self) -> None:
        """Forget every entry (a new pass begins)."""
        self._entries.clear()
        self.hits = 0
