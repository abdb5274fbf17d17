"""The share of a node of the quota tree: its dominant borrowed resource over its weight (the
one formula fair sharing, the quota tree's nodes and the documents use). Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["share_of"]


def share_of(borrowed: Sequence[float], lendable: Sequence[float], weight: float) -> float:
    """Return the share of a node that borrows ``borrowed`` of what its parent can lend,
    ``lendable`` (per resource), with ``weight``: its dominant borrowed resource ÷ weight
    (infinite when it borrows what its parent cannot lend at all)."""
    dominant = 0.0
    for b, cap in zip(borrowed, lendable, strict=True):
        if b <= 0:
            continue
        if cap <= 0:
            return math.inf
        dominant = max(dominant, b / cap)
    return dominant / weight
