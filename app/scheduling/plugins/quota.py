"""Admission by quota: the filter stage before the pool filters.

Quotas form a tree: tenants are its leaves, cohorts its inner nodes (a cohort nobody
configured is a root with no quota of its own). Per managed (runtime class, resource) each
node has a **cap**, the capacity it holds itself (its nominal, plus for a cohort what its
members lend up to it), lends ``lend`` of it (the lending limit, at most the cap; a tenant
without one lends its whole nominal) and keeps the rest, ``cap - lend``, as its own. Its
**usage** is the sum of its live leases for a tenant and, for a cohort, what its members
draw on it: each node draws ``max(0, usage - (cap - lend))`` on its parent. Usage above
the cap is **borrowed**; a non-root node may use at most ``cap + borrowingLimit`` (``lim``;
None: no limit of its own), a root at most its cap.

A task fits when, for every managed resource, its tenant's usage plus the task's whole
request (every member) stays within the tenant's limit (else ``quota_exceeded``) and, if it
goes above the tenant's nominal, every level it borrows from has room: walking up the path,
a node that receives a borrowed draw must stay within its ``lim`` (else
``quota_borrow_unavailable``, naming the level), and the draw stops borrowing at the first
node that stays within its cap (the capacity lent by that node's subtree covers it). A draw
that is not borrowed (a node taking back what it lent) is never refused: the guarantee
holds, and reclaim frees the capacity. The verdict does not depend on the pool, so it is
made once per task, before any pool is.

:class:`QuotaBook` holds the rows a pass read (``app.ledger.quotas``) and, like
:class:`~app.scheduling.assumed.Assumed`, the pass's own decisions on top of them
(:meth:`QuotaBook.add`), so that later tasks of the pass see them. The database makes the
same walk again when the pass commits. :meth:`QuotaBook.tenant_node` and
:meth:`QuotaBook.cohort_node` describe a node for fair sharing (:class:`QuotaNode`). Pure:
no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from app.scheduling.plugins import names
from app.scheduling.reasons import Reason
from app.scheduling.results import NoPlacement
from app.scheduling.shares import share_of

NAME = names.QUOTA
REASONS = (Reason.QUOTA_EXCEEDED, Reason.QUOTA_BORROW_UNAVAILABLE)
RESOURCES = ("cpuMillis", "memoryMiB", "llmSlots")
DEFAULT_COHORT = "default"
_UNITS = {"cpuMillis": ("m", " cpu"), "memoryMiB": (" MiB", " memory"),
          "llmSlots": ("", " llm slots")}

__all__ = ["DEFAULT_COHORT", "NAME", "REASONS", "CohortRow", "QuotaBook", "QuotaNode",
           "QuotaRow", "cohort_rows_drawn", "tenant_kept"]


@dataclass(frozen=True, slots=True)
class QuotaRow:
    """A tenant's row of one managed (runtime class, resource), as the ledger holds it:
    the quota copied in (``cap`` = nominal + borrowing limit, ``lend`` = lending limit;
    None: no limit) and what its live leases use."""

    tenant_id: str
    runtime_class: str
    resource: str
    cohort: str
    nominal: int
    cap: int | None
    lend: int | None
    used: int


@dataclass(frozen=True, slots=True)
class CohortRow:
    """A cohort's row of one managed (runtime class, resource), as the ledger holds it:
    its parent (None: a root), its own nominal, ``cap`` (nominal + what its members lend
    up), ``lend`` (what of the cap it lends to its parent), ``lim`` (the most it may use:
    cap + borrowing limit, the cap for a root; None: no limit of its own), ``used`` (what
    its members draw on it) and its fair weight."""

    cohort: str
    runtime_class: str
    resource: str
    parent: str | None
    nominal: int
    cap: int
    lend: int
    lim: int | None
    used: int
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class QuotaNode:
    """A node of the quota tree in one runtime class, as fair sharing sees it: ``path``
    is the cohort ids from its parent to the root, ``borrowed`` what it uses above its cap
    and ``parent_lendable`` what its parent can make available to its members at most (what
    of its cap it keeps, plus what its own parent can make available, within its limit; a
    root's cap), per resource in ``RESOURCES`` order (0 where unmanaged)."""

    kind: str  # "tenant" or "cohort"
    id: str
    runtime_class: str
    path: tuple[str, ...]
    weight: float
    borrowed: tuple[int, int, int]
    parent_lendable: tuple[int, int, int]

    @property
    def share(self) -> float:
        """The dominant borrowed resource (borrowed / what the parent lends, largest over
        resources) divided by the weight; 0 when it borrows nothing."""
        return share_of(self.borrowed, self.parent_lendable, self.weight)


def tenant_kept(nominal: int, lend: int | None) -> int:
    """Return what of its nominal a tenant keeps (never lent): nominal - lending limit."""
    return 0 if lend is None else max(0, nominal - lend)


def cohort_rows_drawn(
    tree: Iterable[CohortRow], before: Iterable[QuotaRow], after: Iterable[QuotaRow]
) -> list[CohortRow]:
    """Return the cohort rows ``tree`` with what the tenants' rows moving from ``before``
    to ``after`` (same rows, other usage) draw up their paths counted."""
    cells = {(c.cohort, c.runtime_class, c.resource): c for c in tree}
    was = {(r.tenant_id, r.runtime_class, r.resource): r.used for r in before}
    for r in after:
        used = was.get((r.tenant_id, r.runtime_class, r.resource), r.used)
        d = _draw(used, r.used, tenant_kept(r.nominal, r.lend))
        cohort: str | None = r.cohort
        while cohort is not None and d != 0:
            c = cells.get((cohort, r.runtime_class, r.resource))
            if c is None:
                break
            cells[(cohort, r.runtime_class, r.resource)] = replace(c, used=c.used + d)
            d = _draw(c.used, c.used + d, c.cap - c.lend)
            cohort = c.parent
    return list(cells.values())


def _amount(resource: str, n: int) -> str:
    unit, _ = _UNITS[resource]
    return f"{n}{unit}"


def _needs(tenant_id: str, resource: str, want: int, nominal: int, used: int) -> str:
    """Return the head of a refusal's message: what the task needs, what the tenant uses."""
    _, word = _UNITS[resource]
    return (f"needs {_amount(resource, want)}{word}; {tenant_id} uses "
            f"{_amount(resource, used)} of {_amount(resource, nominal)} nominal")


def _draw(before: int, after: int, kept: int) -> int:
    """Return how much more a node moving from ``before`` to ``after`` draws on its parent:
    ``max(0, after - kept) - max(0, before - kept)``, without calls (a placement asks it once
    per resource and level of the tree)."""
    return (after - kept if after > kept else 0) - (before - kept if before > kept else 0)


# A cohort's cell in one (runtime class, resource), shared by the slots of its subtree:
# [used, cap, kept (cap - lend), lim, parent cell or None, cohort id].
_USED, _CAP, _KEPT, _LIM, _UP, _ID = range(6)


class QuotaBook:
    """The quota rows of a pass and its decisions on top; says whether a task fits.

    Each (tenant, managed class) has one slot per managed resource of the class,
    ``[resource index, nominal, lim, kept, used, cohort cell]``, made on first use (a
    tenant without a row there has nominal 0 and lends nothing); the cohort cells
    (``_USED``...``_ID``) link to their parents', so that a check or a placement walks the
    path to the root and looks nothing else up.
    """

    __slots__ = ("_cells", "_cohort", "_managed", "_parent", "_rows", "_slots", "_weight")

    def __init__(
        self, rows: Iterable[QuotaRow], cohorts: Mapping[str, str],
        cohort_rows: Iterable[CohortRow] = (), weights: Mapping[str, float] = {},
    ) -> None:
        self._rows: dict[tuple[str, str, str], QuotaRow] = {}
        self._cohort: dict[str, str] = dict(cohorts)
        self._managed: dict[str, set[str]] = {}
        self._weight: dict[tuple[str, str], float] = {
            ("tenant", t): w for t, w in weights.items()}
        self._parent: dict[str, str | None] = {}
        self._cells: dict[tuple[str, str, str], list] = {}
        self._slots: dict[tuple[str, str], list[list]] = {}
        for r in rows:
            self._rows[(r.tenant_id, r.runtime_class, r.resource)] = r
            self._cohort.setdefault(r.tenant_id, r.cohort)
            self._managed.setdefault(r.runtime_class, set()).add(r.resource)
        cohort_rows = list(cohort_rows)
        for c in cohort_rows:
            self._managed.setdefault(c.runtime_class, set()).add(c.resource)
            self._parent[c.cohort] = c.parent
            self._weight[("cohort", c.cohort)] = c.weight
            self._cells[(c.cohort, c.runtime_class, c.resource)] = [
                c.used, c.cap, c.cap - c.lend, c.lim, None, c.cohort]
        # A cohort the rows name without a row of its own (rows read without the tree): a
        # root pooling what its tenants lend.
        flat: dict[tuple[str, str, str], list] = {}
        for r in self._rows.values():
            key = (r.cohort, r.runtime_class, r.resource)
            if key in self._cells:
                continue
            lend = r.nominal - tenant_kept(r.nominal, r.lend)
            acc = flat.setdefault(key, [0, 0])
            acc[0] += _draw(0, r.used, r.nominal - lend)
            acc[1] += lend
        for (cohort, rc, resource), (used, cap) in flat.items():
            self._cells[(cohort, rc, resource)] = [used, cap, cap, cap, None, cohort]
        for c in cohort_rows:
            if c.parent is not None:
                self._cells[(c.cohort, c.runtime_class, c.resource)][_UP] = self._cell(
                    c.parent, c.runtime_class, c.resource)

    def managed(self, runtime_class: str) -> bool:
        """Return whether some quota names a resource of ``runtime_class``."""
        return runtime_class in self._managed

    def path(self, tenant_id: str) -> tuple[str, ...]:
        """Return the cohort ids from the tenant's cohort to the root."""
        return self._path_from(self._cohort.get(tenant_id, DEFAULT_COHORT))

    def _path_from(self, cohort: str | None) -> tuple[str, ...]:
        out: list[str] = []
        while cohort is not None and cohort not in out and len(out) < 16:
            out.append(cohort)
            cohort = self._parent.get(cohort)
        return tuple(out)

    def _cell(self, cohort: str, runtime_class: str, resource: str) -> list:
        """Return the cohort's cell; a cohort without a row is a root that holds nothing."""
        cell = self._cells.get((cohort, runtime_class, resource))
        if cell is None:
            cell = self._cells[(cohort, runtime_class, resource)] = [0, 0, 0, 0, None, cohort]
        return cell

    def _slots_of(self, tenant_id: str, runtime_class: str) -> list[list] | None:
        """Return the slots of ``tenant_id`` in ``runtime_class`` (None: not managed)."""
        slots = self._slots.get((tenant_id, runtime_class))
        if slots is not None:
            return slots
        resources = self._managed.get(runtime_class)
        if not resources:
            return None
        cohort = self._cohort.get(tenant_id, DEFAULT_COHORT)
        slots = []
        for i, resource in enumerate(RESOURCES):
            if resource not in resources:
                continue
            r = self._rows.get((tenant_id, runtime_class, resource))
            cell = self._cell(cohort, runtime_class, resource)
            if r is None:
                slots.append([i, 0, None, 0, 0, cell])
            else:
                slots.append([i, r.nominal, r.cap, tenant_kept(r.nominal, r.lend), r.used,
                              cell])
        self._slots[(tenant_id, runtime_class)] = slots
        return slots

    def refuse(
        self, tenant_id: str, runtime_class: str, need: tuple[int, int, int]
    ) -> NoPlacement | None:
        """Return why a task of ``tenant_id`` needing ``need`` (all members) in
        ``runtime_class`` does not fit its quota now, or None when it does."""
        slots = self._slots_of(tenant_id, runtime_class)
        if slots is None:
            return None
        for i, nominal, lim, kept, used, cell in slots:
            want = need[i]
            after = used + want
            # Within its nominal (and its own limit) a task borrows nothing: no level of the
            # path is asked.
            if want <= 0 or after <= nominal and (lim is None or after <= lim):
                continue
            refused = _refusal(tenant_id, RESOURCES[i], want, nominal, lim, kept, used, cell)
            if refused is not None:
                return refused
        return None

    def add(self, tenant_id: str, runtime_class: str, need: tuple[int, int, int]) -> None:
        """Count a placement of the pass (``need`` for all its members) in the book."""
        slots = self._slots_of(tenant_id, runtime_class)
        if slots is None:
            return
        for slot in slots:
            want = need[slot[0]]
            if want == 0:
                continue
            used = slot[4]
            slot[4] = used + want
            d = _draw(used, used + want, slot[3])
            cell = slot[5]
            while cell is not None and d != 0:
                before = cell[_USED]
                cell[_USED] = before + d
                d = _draw(before, before + d, cell[_KEPT])
                cell = cell[_UP]

    def borrows(self, tenant_id: str, runtime_class: str, need: Sequence[int]) -> bool:
        """Return whether a task of ``tenant_id`` needing ``need`` must borrow: it takes
        some managed resource of ``runtime_class`` above its tenant's nominal."""
        slots = self._slots_of(tenant_id, runtime_class)
        if slots is None:
            return False
        for i, nominal, _, _, used, _ in slots:
            want = need[i]
            if want > 0 and used + want > nominal:
                return True
        return False

    def may_borrow(self, needs: Iterable[tuple[str, str, Sequence[int]]]) -> bool:
        """Return whether some task of ``needs`` (tenant, runtime class, need) could have to
        borrow once the tasks before it are placed, whichever they are: whether some tenant's
        usage plus all its tasks' needs goes above its nominal in a managed class."""
        totals: dict[tuple[str, str], list[int]] = {}
        managed = self._managed
        for tenant_id, runtime_class, need in needs:
            if runtime_class not in managed:
                continue
            acc = totals.get((tenant_id, runtime_class))
            if acc is None:
                acc = totals[(tenant_id, runtime_class)] = [0, 0, 0]
            acc[0] += need[0]
            acc[1] += need[1]
            acc[2] += need[2]
        return any(self.borrows(t, rc, acc) for (t, rc), acc in totals.items())

    def tenant_weight(self, tenant_id: str) -> float:
        """Return the tenant's fair weight (1 when it has none set)."""
        return self._weight.get(("tenant", tenant_id), 1.0)

    def borrowing(
        self, tenant_id: str, runtime_class: str, used: Sequence[float] | None = None,
        need: Sequence[int] = (0, 0, 0),
    ) -> tuple[list[float], list[float]]:
        """Return what the tenant borrows in the class, using ``used`` (None: its usage
        now) with ``need`` more, and what its parent can lend, per resource (0 where not
        managed)."""
        borrowed = [0.0, 0.0, 0.0]
        lendable = [0.0, 0.0, 0.0]
        for i, nominal, _, _, now, cell in self._slots_of(tenant_id, runtime_class) or ():
            borrowed[i] = max(0.0, (now if used is None else used[i]) + need[i] - nominal)
            lendable[i] = _potential(cell)
        return borrowed, lendable

    def borrowable(self, tenant_id: str, runtime_class: str) -> tuple[int | None, ...]:
        """Return, per resource, the most the tenant could borrow above its nominal now
        (None where the class's quotas leave the resource out)."""
        slots = self._slots_of(tenant_id, runtime_class) or []
        out: list[int | None] = [None, None, None]
        for i, nominal, lim, _, used, cell in slots:
            base = max(0, nominal - used)
            need = [0, 0, 0]
            # Its own limit and its cohort's bound it (any borrowing reaches the cohort).
            hi = 2**53 if lim is None else max(0, lim - max(used, nominal))
            if cell[_LIM] is not None:
                hi = min(hi, max(0, cell[_LIM] - cell[_USED]))
            lo = 0
            while lo < hi:  # refusal grows with the amount: the largest that fits
                mid = (lo + hi + 1) // 2
                need[i] = base + mid
                if self.refuse(tenant_id, runtime_class, (need[0], need[1], need[2])) is None:
                    lo = mid
                else:
                    hi = mid - 1
            out[i] = lo
        return tuple(out)

    def tenant_node(self, tenant_id: str, runtime_class: str) -> QuotaNode | None:
        """Return the tenant as a node of the tree in ``runtime_class`` (None: unmanaged)."""
        slots = self._slots_of(tenant_id, runtime_class)
        if slots is None:
            return None
        borrowed = [0, 0, 0]
        lendable = [0, 0, 0]
        for i, nominal, _, _, used, cell in slots:
            borrowed[i] = max(0, used - nominal)
            lendable[i] = _potential(cell)
        return QuotaNode("tenant", tenant_id, runtime_class, self.path(tenant_id),
                         self._weight.get(("tenant", tenant_id), 1.0),
                         (borrowed[0], borrowed[1], borrowed[2]),
                         (lendable[0], lendable[1], lendable[2]))

    def cohort_node(self, cohort_id: str, runtime_class: str) -> QuotaNode | None:
        """Return the cohort as a node of the tree in ``runtime_class`` (None: unmanaged)."""
        resources = self._managed.get(runtime_class)
        if not resources:
            return None
        borrowed = [0, 0, 0]
        lendable = [0, 0, 0]
        for i, resource in enumerate(RESOURCES):
            if resource in resources:
                cell = self._cell(cohort_id, runtime_class, resource)
                borrowed[i] = max(0, cell[_USED] - cell[_CAP])
                up = cell[_UP]
                lendable[i] = _potential(up) if up is not None else 0
        return QuotaNode("cohort", cohort_id, runtime_class,
                         self._path_from(self._parent.get(cohort_id)),
                         self._weight.get(("cohort", cohort_id), 1.0),
                         (borrowed[0], borrowed[1], borrowed[2]),
                         (lendable[0], lendable[1], lendable[2]))


def _potential(cell: list) -> int:
    """Return what a cohort can make available to its members at most: what of its cap it
    keeps (does not lend up), plus what its parent can make available, within its own
    limit; a root, its cap (Kueue's potential available quota)."""
    up = cell[_UP]
    if up is None:
        return cell[_CAP]
    available = cell[_KEPT] + _potential(up)
    return available if cell[_LIM] is None else min(available, cell[_LIM])


def _refusal(
    tenant_id: str, resource: str, want: int, nominal: int, lim: int | None, kept: int,
    used: int, cell: list | None,
) -> NoPlacement | None:
    """Return why ``want`` more of ``resource`` does not fit: beyond the tenant's own limit,
    or more than some level of its path can lend now (None when it fits)."""
    after = used + want
    if lim is not None and after > lim:
        return NoPlacement(
            Reason.QUOTA_EXCEEDED,
            f"{_needs(tenant_id, resource, want, nominal, used)} and may borrow at most "
            f"{_amount(resource, lim - nominal)}",
            {}, None,
        )
    # ``more``: the borrowed part of the draw ``d`` on the next level up.
    more = max(0, after - nominal) - max(0, used - nominal)
    d = _draw(used, after, kept)
    first = True
    while more > 0 and cell is not None and d > 0:
        before = cell[_USED]
        if cell[_LIM] is not None and before + d > cell[_LIM]:
            left = max(0, cell[_LIM] - before - (d - more))
            where = "its cohort" if first else f"cohort {cell[_ID]} on its path"
            return NoPlacement(
                Reason.QUOTA_BORROW_UNAVAILABLE,
                f"{_needs(tenant_id, resource, want, nominal, used)}, {where} can lend "
                f"{_amount(resource, left)} now",
                {}, None,
            )
        first = False
        more = min(more, max(0, before + d - cell[_CAP]) - max(0, before - cell[_CAP]))
        d = _draw(before, before + d, cell[_KEPT])
        cell = cell[_UP]
    return None
