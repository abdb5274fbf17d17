"""Score: prefer pools close to the spec's artifacts.

A pool is local when its region equals ``artifactRegion`` or its ``artifactRegions`` contain
it: 100 for local pools, 0 otherwise.
"""

from __future__ import annotations

import numpy as np

from app.scheduling.cycle import Cycle
from app.scheduling.plugins import names
from app.scheduling.plugins.base import PLACEMENT_CLASS, ScorePlugin

NAME = names.ARTIFACT_LOCALITY


class ArtifactLocality(ScorePlugin):
    """Prefer pools where the task's artifacts already are."""

    NAME = NAME
    SCOPE = PLACEMENT_CLASS

    def applies(self, cycle: Cycle) -> bool:
        """Return whether the spec names an artifact region."""
        return cycle.spec.artifact_region is not None

    def score_many(self, cycle: Cycle, idx: np.ndarray) -> np.ndarray:
        """Return 100 for local pools and 0 for the others."""
        region = cycle.spec.artifact_region or ""
        return cycle.snapshot.artifact_mask(region)[idx] * 100.0

    def describe(self, cycle: Cycle, pool: int, value: float) -> str:
        """Return whether the artifacts are local to the pool."""
        return self.reason(cycle.spec.artifact_region, value)

    def reason(self, region: str | None, value: float) -> str:
        """Return the reason of a pool scored ``value`` for artifacts in ``region``."""
        where = "local" if value > 0 else "remote"
        return f"artifacts in {region} are {where}"
