"""The API keeps answering while previews compute: eight operators previewing the drain of a
pool with 2,000 leases, on a real `berth serve` process over the real database, while a tenant
reads its task and a runtime heartbeats. The previews' CPU work runs in worker processes, so
those two requests keep a p99 of 50 ms at most.

The machine running the tests may be busy with other work, which slows every request whether
previews run or not. So the same probes also run without previews, just before and just
after: what the busy machine adds to their p99 beyond a quiet machine's is added to the bound
(on a quiet machine, the bound is 50 ms exactly)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app.db import Database
from tests.api.conftest import Keys, pool_body
from tests.factories import berth_serving

LEASES = 2000
PREVIEWS = 8
PROBES = 200
P99_MS = 50.0
#: p99 of the probes alone on a machine with a core to spare for the API process.
QUIET_P99_MS = 10.0
SPEC = {"runtimeClass": "gpu-small", "requests": {"cpuMillis": 100, "memoryMiB": 64}}


ROOM = {"cpuMillis": LEASES * 100, "memoryMiB": LEASES * 64, "llmSlots": 0}


async def _pools(client: httpx.AsyncClient, keys: Keys,
                 bodies: list[tuple[dict[str, Any], dict[str, int]]]) -> None:
    for body, capacity in bodies:
        assert (await client.post("/v1/pools", json=body, headers=keys.admin)).status_code == 201
        put = await client.put(f"/v1/pools/{body['id']}/capacity", json=capacity,
                               headers=keys.admin)
        assert put.status_code == 200, put.text


async def _leased(client: httpx.AsyncClient, keys: Keys, reconcile) -> str:
    """Lease LEASES tasks on pool-x (the only pool with a fresh runtime then); return one."""
    assert (await client.post("/v1/runtimes/rt-1/heartbeat",
                              headers=keys.runtime_1)).status_code == 200
    ids: list[str] = []
    for _ in range(LEASES // 1000):
        r = await client.post("/v1/task-batches", json={"items": [{"spec": SPEC}] * 1000},
                              headers=keys.tenant_a)
        assert r.status_code == 200, r.text
        ids += [i["task"]["id"] for i in r.json()["items"]]
    leased = 0
    while leased < LEASES:
        done = (await reconcile()).leased
        assert done, f"only {leased} of {LEASES} tasks leased"
        leased += done
    return ids[0]


@pytest.fixture
async def server(db: Database, database_url: str) -> AsyncIterator[str]:
    """Yield the base URL of a `berth serve` process (no reconciler) on the test database."""
    async with berth_serving(database_url) as base:
        yield base


def _p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000


async def _previews(http: httpx.AsyncClient, keys: Keys, stop: asyncio.Event,
                    statuses: dict[int, int]) -> None:
    while not stop.is_set():
        r = await http.post("/v1/pools/pool-x/drain-preview", headers=keys.admin)
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        if r.status_code == 200:
            assert r.json()["summary"]["leases"] == LEASES


async def _probe(http: httpx.AsyncClient, method: str, path: str,
                 headers: dict[str, str]) -> float:
    start = time.perf_counter()
    r = await http.request(method, path, headers=headers)
    took = time.perf_counter() - start
    assert r.status_code == 200, r.text
    return took


async def _probes(http: httpx.AsyncClient, keys: Keys, task: str) -> tuple[float, float]:
    """Return the p99 (ms) of a tenant's task reads and of rt-2's heartbeats, in turns."""
    reads: list[float] = []
    beats: list[float] = []
    for _ in range(PROBES):
        reads.append(await _probe(http, "GET", f"/v1/tasks/{task}", keys.tenant_a))
        beats.append(await _probe(http, "POST", "/v1/runtimes/rt-2/heartbeat", keys.runtime_2))
        await asyncio.sleep(0.01)
    return _p99(reads), _p99(beats)


@pytest.mark.slow
async def test_reads_and_heartbeats_stay_fast_under_eight_drain_previews(
    client, keys: Keys, reconcile, server: str
) -> None:
    # pool-x takes every task (the only pool then); once it drains, 30 smaller pools on rt-1
    # take some of them; pool-rt2 belongs to runtime rt-2, which heartbeats meanwhile.
    await _pools(client, keys, [(pool_body("pool-x"), ROOM)])
    task = await _leased(client, keys, reconcile)
    await _pools(client, keys, [
        *((pool_body(f"pool-d{i:02d}", failureDomain=f"fd-{i}"),
           {"cpuMillis": 2000 + 100 * i, "memoryMiB": 4096, "llmSlots": 0}) for i in range(30)),
        (pool_body("pool-rt2", runtimeInstanceId="rt-2"), ROOM),
    ])
    limits = httpx.Limits(max_connections=PREVIEWS + 2)
    async with httpx.AsyncClient(base_url=server, timeout=120, limits=limits) as http:
        # Warm: each route once, and the workers' first decision.
        await _probe(http, "GET", f"/v1/tasks/{task}", keys.tenant_a)
        await _probe(http, "POST", "/v1/runtimes/rt-2/heartbeat", keys.runtime_2)
        assert (await http.post("/v1/pools/pool-x/drain-preview",
                                headers=keys.admin)).status_code == 200
        before = await _probes(http, keys, task)
        stop = asyncio.Event()
        statuses: dict[int, int] = {}
        load = [asyncio.ensure_future(_previews(http, keys, stop, statuses))
                for _ in range(PREVIEWS)]
        try:
            await asyncio.sleep(0.5)
            loaded = await _probes(http, keys, task)
        finally:
            stop.set()
            await asyncio.gather(*load)
        after = await _probes(http, keys, task)
    busy = max(0.0, max(*before, *after) - QUIET_P99_MS)
    measured: dict[str, Any] = {
        "p99 ms (getTask, heartbeat)": {"alone before": before, "under previews": loaded,
                                        "alone after": after},
        "bound ms": P99_MS + busy, "previews": statuses,
    }
    assert statuses.get(200, 0) >= PREVIEWS, measured
    assert max(loaded) <= P99_MS + busy, measured
