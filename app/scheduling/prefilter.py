"""PreFilter state: what every task of one placement class shares on a snapshot.

A spec's placement class (runtime class, allowed regions, data residency, pool selector,
artifact region; :attr:`CompiledSpec.placement_class`) and its tenant's audience (the tenants
that see the same pools) decide the verdicts of every filter whose scope is
:data:`~app.scheduling.plugins.base.AUDIENCE` or
:data:`~app.scheduling.plugins.base.PLACEMENT_CLASS`, and the values of every score of scope
``PLACEMENT_CLASS``. :func:`class_state` computes them once per class and snapshot (a memo
entry of kind ``"class"``, which carries over to the next pass's snapshot while health and
ledger presence hold) and the pipeline starts each task from it:

    visible pools --filters of scope AUDIENCE, in order (memo "static", per runtime class)-->
                  --filters of scope PLACEMENT_CLASS, in order, up to the first TASK one-->
    ClassState: the pools left, their rejection counts and codes, the capacity rows of the
                pools left, the class-scope scores' values over them, and the filters and
                scores the pipeline runs per task.

Filters keep the profile's order: only the leading filters whose scope is not ``TASK`` are
memoized, so every pool still stops at its first rejection.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.scheduling.cycle import Cycle
from app.scheduling.plugins.base import AUDIENCE, TASK, FilterPlugin, ScorePlugin
from app.scheduling.plugins.registry import Profile
from app.scheduling.reasons import PASS, Reason
from app.scheduling.snapshot import Snapshot
from app.scheduling.spec import CompiledSpec
from app.scheduling.stages import N_REASONS, counts_map

__all__ = ["ClassState", "class_state"]


@dataclass(slots=True, eq=False)
class ClassState:
    """The pools of one placement class on a snapshot past its class-wide filters."""

    #: The tenant's visible pools (snapshot indexes, ascending).
    visible: np.ndarray
    #: Per visible pool: PASS or the code of the class-wide filter that rejected it.
    codes: np.ndarray
    #: The pools past every class-wide filter (snapshot indexes, ascending).
    pools: np.ndarray
    #: Rejections per reason code by the class-wide filters.
    counts: np.ndarray
    #: ``counts`` by reason (nonzero only); one shared map for the tasks that add none.
    rejections: dict[Reason, int]
    #: The filters the pipeline runs per task, in profile order.
    task_filters: tuple[FilterPlugin, ...]
    #: The score plugins with their weights, in profile order: the class-scope ones that
    #: apply, with their normalized values over ``pools``, and every task-scope one, with
    #: None. Then whether the plugin must be asked per task whether it applies, and whether
    #: its raw scores are normalized (each False when the plugin keeps the base class's
    #: method: it always applies, its raw scores are its values).
    scores: tuple[tuple[ScorePlugin, int, np.ndarray | None, bool, bool], ...]
    #: The capacity rows of ``pools``, and the snapshot array they were read from.
    capacity: np.ndarray
    capacity_of: np.ndarray
    #: What score plugins derive from ``pools`` and ``capacity`` (PreScore state, emptied
    #: when the capacities are read again; see :meth:`Cycle.class_memo`).
    prescore: dict

    def capacity_rows(self, snapshot: Snapshot) -> np.ndarray:
        """Return the capacity rows of the class's pools on ``snapshot`` (re-read when its
        ledger totals are another array than the last one read)."""
        if self.capacity_of is not snapshot.cap:
            capacity = snapshot.cap.take(self.pools, axis=0)
            if not np.array_equal(capacity, self.capacity):
                self.capacity = capacity
                self.prescore = {}
            self.capacity_of = snapshot.cap
        return self.capacity


def class_state(prof: Profile, spec: CompiledSpec, snapshot: Snapshot) -> ClassState:
    """Return the state of ``spec``'s placement class on ``snapshot``, built on first use;
    the tenant must see at least one pool."""
    key = ("class", prof.name, snapshot.audience[spec.tenant_id], spec.placement_class)
    return snapshot.memoized(key, _build, prof, spec, snapshot)


def _audience_filters(prof: Profile, cycle: Cycle, visible: np.ndarray) -> tuple:
    """Return (passing pools, counts, codes of the visible pools) of the profile's leading
    filters of scope AUDIENCE, memoized per audience and runtime class."""
    snapshot = cycle.snapshot
    key = ("static", prof.name, snapshot.audience[cycle.spec.tenant_id],
           cycle.spec.runtime_class)
    return snapshot.memoized(key, _audience_build, prof, cycle, visible)


def _audience_build(prof: Profile, cycle: Cycle, visible: np.ndarray) -> tuple:
    codes = np.full(len(visible), PASS, dtype=np.int16)
    alive = np.ones(len(visible), dtype=bool)
    for f in prof.filters:
        if f.SCOPE != AUDIENCE:
            break
        pos = np.flatnonzero(alive)
        out = f.filter_many(cycle, visible[pos])
        if out is None:
            continue
        bad = out != PASS
        codes[pos[bad]] = out[bad]
        alive[pos[bad]] = False
    counts = np.bincount(codes[~alive], minlength=N_REASONS).astype(np.int64)
    return visible[alive], counts, codes


def _build(prof: Profile, spec: CompiledSpec, snapshot: Snapshot) -> ClassState:
    cycle = Cycle(spec, snapshot, None)
    visible = snapshot.visible(spec.tenant_id)
    pools, counts, codes = _audience_filters(prof, cycle, visible)
    counts = counts.copy()
    codes = codes.copy()
    filters = prof.filters
    at = 0
    while at < len(filters) and filters[at].SCOPE == AUDIENCE:
        at += 1
    while at < len(filters) and filters[at].SCOPE != TASK:
        f = filters[at]
        at += 1
        if len(pools) == 0:
            continue
        out = f.filter_many(cycle, pools)
        if out is None:
            continue
        bad = out != PASS
        counts += np.bincount(out[bad], minlength=N_REASONS)
        codes[np.searchsorted(visible, pools[bad])] = out[bad]
        pools = pools[~bad]
    scores: list[tuple[ScorePlugin, int, np.ndarray | None, bool, bool]] = []
    for plugin, weight in prof.scores:
        kind = type(plugin)
        asks = kind.applies is not ScorePlugin.applies
        normalizes = kind.normalize is not ScorePlugin.normalize
        if plugin.SCOPE == TASK:
            scores.append((plugin, weight, None, asks, normalizes))
        elif plugin.applies(cycle):
            values = plugin.normalize(cycle, plugin.score_many(cycle, pools))
            values.flags.writeable = False
            scores.append((plugin, weight, values, asks, normalizes))
    return ClassState(
        visible=visible,
        codes=codes,
        pools=pools,
        counts=counts,
        rejections=counts_map(counts),
        task_filters=filters[at:],
        scores=tuple(scores),
        capacity=snapshot.cap.take(pools, axis=0),
        capacity_of=snapshot.cap,
        prescore={},
    )
