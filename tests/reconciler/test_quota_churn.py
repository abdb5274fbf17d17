"""Quota churn: two `berth reconcile` processes place work while API clients complete leases,
cancel tasks, submit more and change quotas, all at once, against a real Berth server.

The tenants sit in a tree of three levels (org -> two teams -> tenants, and a separate
root). Borrowers push their teams and the org over what they lend, a lender's own work
reclaims borrowed capacity (victims revoking for a second, then revoked by the leader),
runtimes complete leases (revoking ones too), tenants cancel leased and waiting tasks, and
two admins rewrite one tenant's quotas at once. After every step of every client, one read-
only snapshot of the ledger must show every quota usage row equal to the sum of the live
leases it covers, every cohort row at every level equal to what its members draw on it, no
tenant past its cap, no level past its limit where all that is drawn on it is borrowed, and
every quota row carrying the quota its tenant has now
(:func:`~app.ledger.invariants.ledger_check`). A complete or a cancel that Berth's own
bookkeeping refuses (a constraint's 409) fails the run: only the answers a runtime or a
tenant can act on are allowed (a lease already ended, a task already finished or being
placed right now).
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from app.db import Database
from app.ledger.cohorts import cohort_put
from app.ledger.invariants import ledger_check
from app.ledger.keys import api_key_create
from app.ledger.tenants import Quota, tenant_put
from tests.api.live import live_server
from tests.factories import (
    ledger_violations,
    pools_add,
    processes_stop,
    reconcile_process,
    spec_make,
)

pytestmark = pytest.mark.slow

SEED = 34
STEPS = 160  # per client
CLIENTS = 4
POOLS = 3
CPU = 250  # every task's request: the amounts the cohort rows move by
#: The tree, three levels: org (1000m of its own) -> team1, team2 (nothing of its own, at
#: most 500m borrowed); (parent, nominal, borrowing limit) of each cohort.
COHORTS: dict[str, tuple[str | None, int, int | None]] = {
    "org": (None, 1000, None),
    "team1": ("org", 0, None),
    "team2": ("org", 0, 500),
}
#: (cohort, nominal, borrowing limit, lending limit) of each tenant, as first set.
TENANTS: dict[str, tuple[str, int, int | None, int | None]] = {
    "lender": ("team1", 3000, 0, 2000),
    "borrower-a": ("team1", 500, 1500, None),
    "borrower-b": ("team2", 0, None, None),
    "borrower-c": ("team2", 0, None, None),
    "solo": ("d", 1000, 500, None),
}
#: The tenants whose quotas the admins rewrite during the run (team2's members keep none:
#: all they use is borrowed through team2, which must never let them past 500m).
REWRITTEN = ("borrower-a", "lender", "solo")
#: Answers a client may get for a legitimate request it raced with: (status, problem type).
ALLOWED = {
    "cancel": {(200, None), (409, "task-not-cancellable"), (409, "task-being-scheduled")},
    "complete": {(200, None), (409, "lease-stale"), (404, "lease-not-found")},
    "put": {(200, None), (409, "quota-below-usage")},
    "submit": {(201, None)},
}


@dataclass
class Churn:
    """What the clients share: their keys, the tasks submitted, what each action got."""

    admin: dict[str, str]
    runtime: dict[str, str]
    tenants: dict[str, dict[str, str]]
    instances: list[str]
    tasks: dict[str, list[str]] = field(default_factory=dict)
    seen: dict[str, int] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)

    def answer(self, action: str, response: httpx.Response) -> None:
        """Record ``response`` to ``action``; keep it as refused when it is not allowed."""
        kind = None
        if response.status_code >= 300:
            kind = str(response.json().get("type", "")).rsplit("/", 1)[-1]
        self.seen[f"{action} {response.status_code}"] = (
            self.seen.get(f"{action} {response.status_code}", 0) + 1)
        if (response.status_code, kind) not in ALLOWED[action]:
            self.refused.append(f"{action}: {response.status_code} {response.text[:300]}")


def _quota_body(rng: random.Random, tenant: str) -> dict[str, Any]:
    cohort, _, _, _ = TENANTS[tenant]
    nominal = rng.choice([0, 250, 500, 1000, 2000, 3000])
    amounts: dict[str, Any] = {"nominal": nominal,
                               "borrowingLimit": rng.choice([None, 0, 500, 2000])}
    if rng.random() < 0.5:
        amounts["lendingLimit"] = rng.choice([0, nominal // 2, nominal])
    quotas = {} if rng.random() < 0.3 else {"standard": {"cpuMillis": amounts}}
    return {"cohort": cohort, "fairWeight": 1, "quotas": quotas}


async def _step(http: httpx.AsyncClient, churn: Churn, rng: random.Random) -> None:
    """One action of one client, picked by ``rng``."""
    roll = rng.random()
    tenant = rng.choice(sorted(TENANTS))
    if roll < 0.35:
        r = await http.post("/v1/tasks", json=spec_make(cpu=CPU), headers=churn.tenants[tenant])
        churn.answer("submit", r)
        if r.status_code == 201:
            churn.tasks.setdefault(tenant, []).append(r.json()["id"])
    elif roll < 0.55:
        # The newest tasks are the ones still waiting or leased: cancelling among them
        # races the reconcilers instead of mostly finding tasks that already finished.
        if churn.tasks.get(tenant):
            task_id = rng.choice(churn.tasks[tenant][-6:])
            r = await http.post(f"/v1/tasks/{task_id}/cancel", headers=churn.tenants[tenant])
            churn.answer("cancel", r)
            if r.status_code == 200:
                churn.tasks[tenant].remove(task_id)
    elif roll < 0.9:
        instance = rng.choice(churn.instances)
        listed = await http.get(f"/v1/runtimes/{instance}/leases", headers=churn.runtime)
        assert listed.status_code == 200, listed.text
        live = [x for x in listed.json()["items"] if x["state"] in ("ACTIVE", "REVOKING")]
        if live:
            lease = rng.choice(live)
            r = await http.post(f"/v1/leases/{lease['id']}/complete", headers=churn.runtime,
                                json={"outcome": "succeeded", "epoch": lease["epoch"]})
            churn.answer("complete", r)
        await http.post(f"/v1/runtimes/{instance}/heartbeat", headers=churn.runtime)
    else:
        # Two admins change the same tenant at once: the last write wins whole.
        tenant = rng.choice(REWRITTEN)
        bodies = [_quota_body(rng, tenant), _quota_body(rng, tenant)]
        for r in await asyncio.gather(*(http.put(f"/v1/tenants/{tenant}", json=b,
                                                 headers=churn.admin) for b in bodies)):
            churn.answer("put", r)


async def _sound(db: Database) -> dict[str, int]:
    """Return the broken ledger invariants (quota rows included), read in one snapshot."""
    async with db.connection() as conn, conn.transaction(isolation="repeatable_read",
                                                        readonly=True):
        broken = {k: v for k, v in (await ledger_check(conn)).items() if v}
        # A cohort of the tree holding nothing of its own (no member lends it anything) is
        # drawn on only by borrowing: never past its limit. (Not so for a cohort whose
        # members' quotas an admin lowers under their usage.)
        over = await conn.fetchval(
            "SELECT count(*) FROM cohort_usage WHERE cap = 0 AND used > lim "
            "AND cohort = ANY($1::text[])", list(COHORTS))
        if over:
            broken["cohort_borrowed_past_its_limit"] = int(over)
        return broken


async def _client(base_url: str, db: Database, churn: Churn, index: int) -> None:
    rng = random.Random(SEED * 100 + index)
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        for step in range(STEPS):
            await _step(http, churn, rng)
            broken = await _sound(db)
            assert broken == {}, (index, step, broken, churn.seen)
            assert churn.refused == [], churn.refused


async def _setup(db: Database) -> Churn:
    fresh = datetime.now(UTC) + timedelta(hours=1)
    async with db.transaction() as conn:
        pools = await pools_add(conn, POOLS, tenants=list(TENANTS), capacity=(1750, 64_000, 0),
                                heartbeat_at=fresh)
        for name, (parent, nominal, borrowing) in COHORTS.items():
            await cohort_put(conn, cohort_id=name, parent=parent, fair_weight=1.0,
                             now=datetime.now(UTC), quotas={"standard": {
                                 "cpuMillis": Quota(nominal, borrowing)}})
        for name, (cohort, nominal, borrowing, lending) in TENANTS.items():
            await tenant_put(conn, tenant_id=name, cohort=cohort, fair_weight=1.0,
                             now=datetime.now(UTC), quotas={"standard": {
                                 "cpuMillis": Quota(nominal, borrowing, lending)}})
        instances = [f"rt-{p}" for p in pools]

        async def key(role: str, tenants: tuple[str, ...] = (),
                      runtimes: tuple[str, ...] = ()) -> dict[str, str]:
            raw = await api_key_create(conn, role=role, subject=f"churn-{uuid.uuid4().hex[:8]}",
                                       tenant_ids=tenants, runtime_instance_ids=runtimes)
            return {"Authorization": f"Bearer {raw}"}

        return Churn(
            admin=await key("admin"), runtime=await key("runtime", runtimes=tuple(instances)),
            tenants={t: await key("tenant", (t,)) for t in TENANTS}, instances=instances,
        )


@contextmanager
def _reconcilers(database_url: str, count: int) -> Iterator[list[subprocess.Popen]]:
    procs = [reconcile_process(database_url, stdout=subprocess.DEVNULL, batch_size=8,
                               preemption_grace_seconds=1, tick_seconds=0.5)
             for _ in range(count)]
    try:
        yield procs
    finally:
        processes_stop(procs)


async def test_usage_rows_equal_live_leases_through_churn(
    db: Database, database_url: str
) -> None:
    churn = await _setup(db)
    with _reconcilers(database_url, 2) as procs, live_server(database_url) as base_url:
        await asyncio.gather(*(_client(base_url, db, churn, i) for i in range(CLIENTS)))
        assert all(p.poll() is None for p in procs), [p.stderr.read() for p in procs  # type: ignore[union-attr]
                                                      if p.poll() is not None]
    assert await _sound(db) == {}
    assert await ledger_violations(db) == []
    # Every kind of step happened, and enough of them succeeded to have raced.
    for action, least in (("submit 201", 100), ("cancel 200", 20), ("complete 200", 40),
                          ("put 200", 15)):
        assert churn.seen.get(action, 0) >= least, churn.seen
    async with db.connection() as conn:
        leased = await conn.fetchval("SELECT count(*) FROM leases")
    assert leased >= 60, leased
