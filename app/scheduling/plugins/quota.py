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

from collections.abc import Iterable, Mapping
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
    """The quota rows of a pass and its decisions on top; says whether a task fits."""

    __slots__ = ("_borrowed", "_cohort", "_lendable", "_managed", "_rows")

    def __init__(self, rows: Iterable[QuotaRow], cohorts: Mapping[str, str]) -> None:
        #: (tenant, class, resource) -> [nominal, cap, lend, used]
        self._rows: dict[tuple[str, str, str], list[int | None]] = {}
        self._cohort: dict[str, str] = dict(cohorts)
        self._managed: dict[str, set[str]] = {}
        #: (cohort, class, resource) -> what its tenants lend / borrow in total now.
        self._lendable: dict[tuple[str, str, str], int] = {}
        self._borrowed: dict[tuple[str, str, str], int] = {}
        for r in rows:
            self._rows[(r.tenant_id, r.runtime_class, r.resource)] = [
                r.nominal, r.cap, r.lend, r.used]
            self._cohort.setdefault(r.tenant_id, r.cohort)
            self._managed.setdefault(r.runtime_class, set()).add(r.resource)
            key = (r.cohort, r.runtime_class, r.resource)
            self._lendable[key] = self._lendable.get(key, 0) + _lendable(r.nominal, r.lend, r.used)
            self._borrowed[key] = self._borrowed.get(key, 0) + max(0, r.used - r.nominal)

    def managed(self, runtime_class: str) -> bool:
        """Return whether some tenant's quota names a resource of ``runtime_class``."""
        return runtime_class in self._managed

    def _row(self, tenant_id: str, runtime_class: str, resource: str) -> list[int | None]:
        # A tenant without a quota in a managed class has nominal 0 and lends nothing.
        return self._rows.get((tenant_id, runtime_class, resource), [0, None, 0, 0])

    def refuse(
        self, tenant_id: str, runtime_class: str, need: tuple[int, int, int]
    ) -> NoPlacement | None:
        """Return why a task of ``tenant_id`` needing ``need`` (all members) in
        ``runtime_class`` does not fit its quota now, or None when it does."""
        resources = self._managed.get(runtime_class)
        if not resources:
            return None
        cohort = self._cohort.get(tenant_id, "default")
        for resource, want in zip(RESOURCES, need, strict=True):
            if want <= 0 or resource not in resources:
                continue
            nominal, cap, lend, used = self._row(tenant_id, runtime_class, resource)
            assert nominal is not None and used is not None
            after = used + want
            if after <= nominal:
                continue
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
            key = (cohort, runtime_class, resource)
            own = _lendable(nominal, lend, used)
            left = max(0, self._lendable.get(key, 0) - own - self._borrowed.get(key, 0))
            if more > left:
                return NoPlacement(
                    Reason.QUOTA_BORROW_UNAVAILABLE,
                    f"{head}, its cohort can lend {_amount(resource, left)} now",
                    {}, None,
                )
        return None

    def add(self, tenant_id: str, runtime_class: str, need: tuple[int, int, int]) -> None:
        """Count a placement of the pass (``need`` for all its members) in the book."""
        resources = self._managed.get(runtime_class)
        if not resources:
            return
        cohort = self._cohort.get(tenant_id, "default")
        for resource, want in zip(RESOURCES, need, strict=True):
            if want <= 0 or resource not in resources:
                continue
            row = self._rows.setdefault(
                (tenant_id, runtime_class, resource), list(self._row(tenant_id, runtime_class,
                                                                     resource)))
            nominal, _, lend, used = row
            assert nominal is not None and used is not None
            key = (cohort, runtime_class, resource)
            before_lend = _lendable(nominal, lend, used)
            before_borrow = max(0, used - nominal)
            row[3] = used + want
            self._lendable[key] = (self._lendable.get(key, 0) - before_lend
                                   + _lendable(nominal, lend, used + want))
            self._borrowed[key] = (self._borrowed.get(key, 0) - before_borrow
                                   + max(0, used + want - nominal))
