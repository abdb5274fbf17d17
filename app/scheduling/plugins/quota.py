"""Admission by quota: the filter stage before the pool filters.

A task fits its tenant's quota in its runtime class when, for every resource that some
tenant's quota names in that class (a *managed* resource), the tenant's usage plus the task's
whole request (every member) stays within its nominal, or the part above nominal stays
within its borrowing limit (``cap`` = nominal + borrowing limit) **and** within what its
cohort can still lend: the sum over the cohort's other tenants of ``min(lend, unused
nominal)``, minus what the cohort borrows already. A class with no managed resource is not
looked at. The verdict does not depend on the pool, so it is made once per task, before any
pool is: ``quota_exceeded`` (its own limit) or ``quota_borrow_unavailable`` (the cohort has
not enough to lend), with the numbers in the message.

:class:`QuotaBook` holds the quota rows a pass read (``app.ledger.quotas``) and, like
:class:`~app.scheduling.assumed.Assumed`, the pass's own decisions on top of them
(:meth:`QuotaBook.add`), so that later tasks of the pass see them. The database makes the
same check again when the pass commits. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from app.scheduling.plugins import names
from app.scheduling.reasons import Reason
from app.scheduling.results import NoPlacement

NAME = names.QUOTA
REASONS = (Reason.QUOTA_EXCEEDED, Reason.QUOTA_BORROW_UNAVAILABLE)
RESOURCES = ("cpuMillis", "memoryMiB", "llmSlots")
_UNITS = {"cpuMillis": ("m", " cpu"), "memoryMiB": (" MiB", " memory"),
          "llmSlots": ("", " llm slots")}

__all__ = ["NAME", "REASONS", "QuotaBook", "QuotaRow"]


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


def _amount(resource: str, n: int) -> str:
    unit, _ = _UNITS[resource]
    return f"{n}{unit}"


def _lendable(nominal: int, lend: int | None, used: int) -> int:
    unused = max(0, nominal - used)
    return unused if lend is None else min(lend, unused)


class QuotaBook:
    """The quota rows of a pass and its decisions on top; says whether a task fits.

    Each (tenant, managed class) has one slot per managed resource of the class,
    ``[resource index, nominal, cap, lend, used, cohort totals]``, made on first use (a
    tenant without a row there has nominal 0 and lends nothing); ``cohort totals`` is the
    ``[lendable, borrowed, can lend]`` of its (cohort, class, resource), shared by the
    cohort's slots, so that a check or a placement looks nothing else up (``can lend``: what
    its tenants would lend were they idle, the measure of a share,
    :mod:`app.scheduling.fairshare`).
    """

    __slots__ = ("_cohort", "_managed", "_rows", "_slots", "_totals")

    def __init__(self, rows: Iterable[QuotaRow], cohorts: Mapping[str, str]) -> None:
        self._rows: dict[tuple[str, str, str], QuotaRow] = {}
        self._cohort: dict[str, str] = dict(cohorts)
        self._managed: dict[str, set[str]] = {}
        #: (cohort, class, resource) -> [what its tenants lend, what they borrow] now.
        self._totals: dict[tuple[str, str, str], list[int]] = {}
        self._slots: dict[tuple[str, str], list[list]] = {}
        for r in rows:
            self._rows[(r.tenant_id, r.runtime_class, r.resource)] = r
            self._cohort.setdefault(r.tenant_id, r.cohort)
            self._managed.setdefault(r.runtime_class, set()).add(r.resource)
            totals = self._totals.setdefault((r.cohort, r.runtime_class, r.resource),
                                             [0, 0, 0])
            totals[0] += _lendable(r.nominal, r.lend, r.used)
            totals[1] += max(0, r.used - r.nominal)
            totals[2] += _lendable(r.nominal, r.lend, 0)

    def managed(self, runtime_class: str) -> bool:
        """Return whether some tenant's quota names a resource of ``runtime_class``."""
        return runtime_class in self._managed

    def _slots_of(self, tenant_id: str, runtime_class: str) -> list[list] | None:
        """Return the slots of ``tenant_id`` in ``runtime_class`` (None: not managed)."""
        slots = self._slots.get((tenant_id, runtime_class))
        if slots is not None:
            return slots
        resources = self._managed.get(runtime_class)
        if not resources:
            return None
        cohort = self._cohort.get(tenant_id, "default")
        slots = []
        for i, resource in enumerate(RESOURCES):
            if resource not in resources:
                continue
            r = self._rows.get((tenant_id, runtime_class, resource))
            totals = self._totals.setdefault((cohort, runtime_class, resource), [0, 0, 0])
            if r is None:
                slots.append([i, 0, None, 0, 0, totals])
            else:
                slots.append([i, r.nominal, r.cap, r.lend, r.used, totals])
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
        for i, nominal, cap, lend, used, totals in slots:
            want = need[i]
            if want <= 0 or used + want <= nominal:
                continue
            refused = _refusal(tenant_id, RESOURCES[i], want, nominal, cap, lend, used, totals)
            if refused is not None:
                return refused
        return None

    def borrows(self, tenant_id: str, runtime_class: str, need: Sequence[int]) -> bool:
        """Return whether a task of ``tenant_id`` needing ``need`` must borrow: it takes
        some managed resource of ``runtime_class`` above its tenant's nominal."""
        slots = self._slots_of(tenant_id, runtime_class)
        if slots is None:
            return False
        return any(s[4] + need[s[0]] > s[1] for s in slots if need[s[0]] > 0)

    def borrowing(
        self, tenant_id: str, runtime_class: str, need: Sequence[int] = (0, 0, 0)
    ) -> tuple[list[float], list[float]]:
        """Return what the tenant borrows in the class with ``need`` more, and what its
        cohort can lend, per resource (0 where not managed)."""
        slots = self._slots_of(tenant_id, runtime_class) or ()
        used = [0.0, 0.0, 0.0]
        for s in slots:
            used[s[0]] = s[4] + need[s[0]]
        return self.borrowing_of(tenant_id, runtime_class, used)

    def borrowing_of(
        self, tenant_id: str, runtime_class: str, used: Sequence[float]
    ) -> tuple[list[float], list[float]]:
        """Return what the tenant would borrow in the class using ``used``, and what its
        cohort can lend, per resource (0 where not managed)."""
        borrowed = [0.0, 0.0, 0.0]
        lendable = [0.0, 0.0, 0.0]
        for s in self._slots_of(tenant_id, runtime_class) or ():
            i = s[0]
            borrowed[i] = max(0.0, used[i] - s[1])
            lendable[i] = s[5][2]
        return borrowed, lendable

    def add(self, tenant_id: str, runtime_class: str, need: tuple[int, int, int]) -> None:
        """Count a placement of the pass (``need`` for all its members) in the book."""
        slots = self._slots_of(tenant_id, runtime_class)
        if slots is None:
            return
        for slot in slots:
            want = need[slot[0]]
            if want <= 0:
                continue
            nominal, lend, used = slot[1], slot[3], slot[4]
            after = used + want
            slot[4] = after
            totals = slot[5]
            if used < nominal:  # it lent some of its unused nominal: less now
                unused = nominal - used
                left = nominal - after if after < nominal else 0
                totals[0] -= (unused - left if lend is None
                              else (unused if unused < lend else lend)
                              - (left if left < lend else lend))
            if after > nominal:
                totals[1] += after - (used if used > nominal else nominal)


def _refusal(
    tenant_id: str, resource: str, want: int, nominal: int, cap: int | None, lend: int | None,
    used: int, totals: list[int],
) -> NoPlacement | None:
    """Return why ``want`` more of ``resource``, above ``nominal``, does not fit: beyond the
    tenant's own cap, or more than its cohort can lend now (None when it fits)."""
    after = used + want
    _, word = _UNITS[resource]
    head = (f"needs {_amount(resource, want)}{word}; {tenant_id} uses "
            f"{_amount(resource, used)} of {_amount(resource, nominal)} nominal")
    if cap is not None and after > cap:
        return NoPlacement(
            Reason.QUOTA_EXCEEDED,
            f"{head} and may borrow at most {_amount(resource, cap - nominal)}",
            {}, None,
        )
    more = max(0, after - nominal) - max(0, used - nominal)
    own = _lendable(nominal, lend, used)
    left = max(0, totals[0] - own - totals[1])
    if more > left:
        return NoPlacement(
            Reason.QUOTA_BORROW_UNAVAILABLE,
            f"{head}, its cohort can lend {_amount(resource, left)} now",
            {}, None,
        )
    return None
