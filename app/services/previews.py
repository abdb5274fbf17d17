"""Preview answers sized for people: a page of the decision, counts and summaries of the rest.

A placement preview over thousands of pools decides every one of them, and a drain preview
every lease of the pool; an answer listing them all would be megabytes nobody reads. The
answers here hold the headline (the placement, or the destinations of a drain), counts of
everything, and one page of the detail, best first; ``nextCursor`` gives the next page, which
is computed again on the ledger as it is then (a preview is a prediction, not a snapshot kept
for the caller).

The functions ending in ``_page`` are pure: the API runs them in a worker process
(:mod:`app.services.offload`), so they decide and build the answer's JSON bytes there, and
the event loop only sends them. A drain preview never names a destination pool the caller
cannot see: :func:`pools_visible_read` reads which pools those are, and a move to any other
pool is counted, not named.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from typing import Any

import orjson

from app.auth import Principal
from app.db import Database
from app.ledger.pools import pools_visible_ids
from app.scheduling.explain import (
    candidate_document,
    no_placement_document,
    placement_document,
    placement_stored,
    preemption_document,
    rejection_document,
)
from app.scheduling.preemption import Preemption
from app.scheduling.results import Result, rejections_by_code
from app.scheduling.spec import TaskSpec
from app.services.drains import DrainAsk, DrainMove, drain_decide, drain_inputs_read
from app.services.offload import worker_read
from app.services.placements import PlacementAsk, placement_decide, placement_inputs_read
from app.services.pools import pool_viewer

__all__ = [
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "POOL_IDS_PER_REASON",
    "drain_page",
    "drain_preview_page",
    "drain_scope",
    "placement_page",
    "placement_preview_page",
    "placement_scope",
    "pools_visible_read",
]

#: Entries of a preview page unless ``?limit=`` says otherwise, and the most it may ask for.
DEFAULT_LIMIT = 20
MAX_LIMIT = 1000
#: Pool ids named under each reason code of ``rejectedByReason`` (the rest are counted).
POOL_IDS_PER_REASON = 20


def placement_scope(spec: TaskSpec, *, tenant_id: str) -> str:
    """Return the cursor scope of a placement preview: its tenant and spec (as canonical
    JSON, the same in every process), so a cursor given for one spec does not page
    another's preview."""
    canonical = orjson.dumps(
        [tenant_id, spec.model_dump(mode="json", by_alias=True)], option=orjson.OPT_SORT_KEYS
    )
    return f"placement-preview:{hashlib.sha256(canonical).hexdigest()[:32]}"


def drain_scope(pool_id: str, principal: Principal) -> str:
    """Return the cursor scope of a drain preview of ``pool_id`` read by ``principal``."""
    return f"drain-preview:{pool_id}:{principal.role}:{principal.subject}"


def _by_reason(result: Result) -> list[dict[str, Any]]:
    """Return ``[{"code", "count", "poolIds"}]`` of the rejected pools, most common first."""
    return [{"code": code, "count": n, "poolIds": ids}
            for code, n, ids in rejections_by_code(result.rejected, POOL_IDS_PER_REASON)]


def placement_page(
    result: Result,
    preemption: Preemption | None,
    *,
    offset: int,
    limit: int,
    next_cursor: str,
) -> dict[str, Any]:
    """Build the placement preview of one page: the placement, candidates and rejected pools
    ``offset`` to ``offset + limit``, their counts and the rejections by reason code;
    ``next_cursor`` is the cursor of the page after (named only when there is one)."""
    placement = result.placement
    end = offset + limit
    more = end < max(len(result.candidates), len(result.rejected))
    document = preemption_document(preemption) if preemption is not None else None
    if document is not None:
        document["candidates"] = document["candidates"][:limit]
    return {
        "placement": None if placement is None else placement_document(placement_stored(
            placement, members=placement.members, alternatives=placement.alternatives
        )),
        "candidates": [candidate_document(c) for c in result.candidates[offset:end]],
        "rejected": [rejection_document(r) for r in result.rejected[offset:end]],
        "reason": None if result.reason is None else no_placement_document(result.reason),
        "candidateCount": len(result.candidates),
        "rejectedCount": len(result.rejected),
        "rejectedByReason": _by_reason(result),
        "preemption": document,
        "nextCursor": next_cursor if more else None,
    }


def placement_preview_page(
    ask: PlacementAsk, offset: int, limit: int, next_cursor: str
) -> bytes:
    """Read and decide ``ask`` (in a preview worker, with the snapshot it keeps) and return
    the JSON of the preview page at ``offset``."""
    inputs = worker_read(lambda conn, state: placement_inputs_read(
        conn, ask, cache=state.snapshot_cache(ask.strategy), components=offset + limit))
    result, preemption = placement_decide(inputs)
    return orjson.dumps(
        placement_page(result, preemption, offset=offset, limit=limit, next_cursor=next_cursor)
    )


async def pools_visible_read(db: Database, *, principal: Principal) -> frozenset[str] | None:
    """Return the ids of the pools ``principal`` may see (None: an admin, every pool)."""
    viewer = pool_viewer(principal)
    if viewer.role == "admin":
        return None
    async with db.connection() as conn:
        return frozenset(await pools_visible_ids(conn, viewer=viewer))


def _item(move: DrainMove, visible: frozenset[str] | None) -> dict[str, Any]:
    """Return the drain preview item of ``move``, naming only the pools in ``visible``."""
    shown = [(p, c) for p, c in move.members if visible is None or p in visible]
    return {
        "taskId": str(move.task_id),
        "leaseId": str(move.lease_id),
        "tenantId": move.tenant_id,
        "poolId": shown[0][0] if shown else None,
        "members": [{"poolId": p, "count": c} for p, c in shown],
        "membersElsewhere": sum(c for p, c in move.members) - sum(c for _, c in shown),
        "reason": move.reason,
    }


def _summary(moves: Sequence[DrainMove], visible: frozenset[str] | None) -> dict[str, Any]:
    """Return where the moving leases would go: per visible pool, to pools the caller
    cannot see, and how many would wait, by reason code."""
    to: Counter[str] = Counter()
    waiting: Counter[str] = Counter()
    elsewhere = 0
    for move in moves:
        if not move.members:
            waiting[str((move.reason or {}).get("code"))] += 1
            continue
        pools = {p for p, _ in move.members if visible is None or p in visible}
        to.update(pools)
        if len(pools) < len({p for p, _ in move.members}):
            elsewhere += 1
    return {
        "leases": len(moves),
        "placed": len(moves) - sum(waiting.values()),
        "waiting": sum(waiting.values()),
        "destinations": [{"poolId": p, "leases": n}
                         for p, n in sorted(to.items(), key=lambda item: (-item[1], item[0]))],
        "toPoolsNotShown": elsewhere,
        "waitingByReason": [{"code": c, "leases": n}
                            for c, n in sorted(waiting.items(), key=lambda i: (-i[1], i[0]))],
    }


def drain_page(
    moves: Sequence[DrainMove],
    visible: frozenset[str] | None,
    *,
    offset: int,
    limit: int,
    next_cursor: str,
) -> dict[str, Any]:
    """Build the drain preview of one page: the summary of every move, the items ``offset``
    to ``offset + limit`` and the cursor of the page after (when there is one)."""
    end = offset + limit
    return {
        "summary": _summary(moves, visible),
        "items": [_item(m, visible) for m in moves[offset:end]],
        "nextCursor": next_cursor if end < len(moves) else None,
    }


def drain_preview_page(
    ask: DrainAsk,
    visible: frozenset[str] | None,
    offset: int,
    limit: int,
    next_cursor: str,
) -> bytes:
    """Read and decide ``ask`` (in a preview worker, with the snapshot it keeps) and return
    the JSON of the drain preview page at ``offset``."""
    inputs = worker_read(lambda conn, state: drain_inputs_read(
        conn, ask, cache=state.snapshot_cache(ask.config.strategy)))
    return orjson.dumps(drain_page(
        drain_decide(inputs), visible, offset=offset, limit=limit, next_cursor=next_cursor
    ))
