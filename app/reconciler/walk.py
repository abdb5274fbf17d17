"""The walk after a lost race: re-fit a pass's decisions on fresh ledgers, or move them on.

When :func:`~app.ledger.plans.plan_apply` reports pools that refused their amounts (another
reconciler or an operator got there first), the pass re-reads those pools' ledgers and calls
:func:`decisions_walk`. In policy order, each decision keeps its pool while it still fits
(counting the fresh ledgers for the re-read pools and the pass's snapshot for the others,
minus what earlier decisions of the walk took). One that no longer fits walks to its next
ranked candidate, at most ``walk_limit`` times over the whole pass (the per-task
``reservation_walk_limit``). A gang never walks (all-or-nothing): it is released whole, as is
a task past its limit or out of candidates; the pass hands released tasks back to the queue
unparked. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from app.ledger.claims import ClaimedTask
from app.ledger.snapshot import LedgerRow
from app.scheduling.explain import placement_stored, ranked_stored
from app.scheduling.results import Ranked, Result
from app.scheduling.snapshot import Snapshot
from app.scheduling.spec import CompiledSpec


@dataclass(slots=True)
class Decision:
    """A task the core placed in this pass, and where it stands while the pass commits."""

    task: ClaimedTask
    spec: CompiledSpec
    #: The core's decision: a single-member placement's plain values, or a result.
    result: Result | Ranked
    members: tuple[tuple[str, int], ...]
    #: Index into ``result.candidates`` of the pool walked to (0: the core's choice).
    cursor: int = 0
    #: Next-ranked candidates tried so far after lost races.
    walks: int = 0

    def placement_text(self) -> str:
        """Return the placement to store (:mod:`app.scheduling.explain`'s format): the core's
        choice, or the candidate walked to."""
        result = self.result
        if self.walks == 0:
            if isinstance(result, Ranked):
                return ranked_stored(result)
            placement = result.placement
            assert placement is not None
            return placement_stored(
                placement, members=placement.members, alternatives=placement.alternatives
            )
        candidates = result.candidates
        return placement_stored(
            candidates[self.cursor],
            members=self.members,
            alternatives=candidates[self.cursor + 1:],
            walked_from=[c.pool_id for c in candidates[: self.cursor]],
        )


def _fits(free: list[int], need: Sequence[int]) -> bool:
    return free[0] >= need[0] and free[1] >= need[1] and free[2] >= need[2]


class _Room:
    """Free capacity per pool during one walk: fresh ledgers first, else the snapshot."""

    def __init__(self, fresh: Mapping[str, LedgerRow], snapshot: Snapshot) -> None:
        self._fresh = fresh
        self._snapshot = snapshot
        self._free: dict[str, list[int]] = {}

    def of(self, pool_id: str) -> list[int]:
        room = self._free.get(pool_id)
        if room is None:
            if pool_id in self._fresh:
                room = list(self._fresh[pool_id].free)
            else:
                s = self._snapshot
                i = s.pos[pool_id]
                room = [int(s.cap[i, d] - s.reserved[i, d]) for d in range(3)]
            self._free[pool_id] = room
        return room

    def take(self, members: Sequence[tuple[str, int]], req: tuple[int, int, int]) -> bool:
        """Take ``members`` x ``req`` if every pool has room; return whether it did."""
        needs = [(p, [c * r for r in req]) for p, c in members]
        if not all(_fits(self.of(p), n) for p, n in needs):
            return False
        for p, n in needs:
            room = self.of(p)
            for d in range(3):
                room[d] -= n[d]
        return True


def decisions_walk(
    decisions: Sequence[Decision],
    *,
    fresh: Mapping[str, LedgerRow],
    snapshot: Snapshot,
    walk_limit: int,
) -> tuple[list[Decision], list[Decision]]:
    """Re-fit ``decisions`` (in policy order) after lost races; return (kept, released).

    A kept decision that walked has its ``cursor``, ``walks`` and ``members`` moved to the
    candidate it now takes.
    """
    room = _Room(fresh, snapshot)
    kept: list[Decision] = []
    released: list[Decision] = []
    for d in decisions:
        req = d.spec.requests
        if room.take(d.members, req):
            kept.append(d)
            continue
        if d.spec.is_gang:
            released.append(d)
            continue
        moved = False
        while d.walks < walk_limit and d.cursor + 1 < len(d.result.candidates):
            d.cursor += 1
            d.walks += 1
            pool_id = d.result.candidates[d.cursor].pool_id
            if room.take(((pool_id, 1),), req):
                d.members = ((pool_id, 1),)
                moved = True
                break
        (kept if moved else released).append(d)
    return kept, released
