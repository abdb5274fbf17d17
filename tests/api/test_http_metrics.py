"""HTTP metric labels come from fixed sets: unknown, redirected and odd requests add no series."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest

from app.api.http_metrics import OTHER_METHOD, UNMATCHED
from tests.api.conftest import Keys

SPEC = {"runtimeClass": "gpu-small", "requests": {"cpuMillis": 500, "memoryMiB": 256}}

#: Every probe path carries this, so /metrics can be searched for any trace of them.
MARK = "probe7f3a"


def series(exposition: str) -> set[str]:
    """Return the series of a Prometheus text exposition: name and labels, without values."""
    return {
        line.rsplit(" ", 1)[0]
        for line in exposition.splitlines()
        if line and not line.startswith("#")
    }


def probe(i: int, round_: str, foreign_task: str) -> tuple[str, str, str]:
    """Return (method, path, key name or "") of the ``i``-th probe: all distinct, all junk."""
    tag = f"{MARK}-{round_}-{i}"
    kinds = [
        ("GET", f"/v1/pools/{tag}/", ""),  # trailing slash: a 307 redirect, no key needed
        ("GET", f"/{tag}", ""),  # no route at all: 404
        ("GET", f"/v1/tasks/{foreign_task}/", "tenant_a"),  # another tenant's task, redirected
        ("GET", f"/v1/tasks/{foreign_task}/events/{tag}", "tenant_a"),  # deeper: 404
        ("GET", f"/v1/tasks/{uuid.uuid4()}/", ""),  # a task-id-looking path, redirected
        ("POST", f"/v1/pools/{tag}/cordon/", "admin"),  # an operation path, redirected
        (f"X{tag.upper().replace('-', '')}", f"/v1/{tag}", ""),  # a made-up method
        ("GET", f"/v1/tasks/{foreign_task}", "tenant_a"),  # templated: 404, labelled by route
    ]
    return kinds[i % len(kinds)]


async def send(client: httpx.AsyncClient, keys: Keys, round_: str, count: int, foreign: str):
    """Send ``count`` probes of ``round_``, 50 at a time; return their status codes."""
    statuses: list[int] = []
    for start in range(0, count, 50):
        requests = []
        for i in range(start, min(start + 50, count)):
            method, path, key = probe(i, round_, foreign)
            requests.append(client.request(method, path, headers=keys[key] if key else {}))
        statuses += [r.status_code for r in await asyncio.gather(*requests)]
    return statuses


@pytest.mark.slow
async def test_unknown_redirected_and_foreign_paths_add_no_series(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    created = await client.post("/v1/tasks", json=SPEC, headers=keys.tenant_b)
    assert created.status_code == 201, created.text
    foreign = created.json()["id"]
    # One of each kind first: the fixed series they fall into now exist.
    warm = await send(client, keys, "warm", 16, foreign)
    assert {307, 404}.issubset(warm), warm
    before = (await client.get("/metrics")).text

    statuses = await send(client, keys, "flood", 1000, foreign)

    after = (await client.get("/metrics")).text
    assert {307, 404}.issubset(statuses)
    assert series(after) == series(before), series(after) ^ series(before)
    # Counter values grow by a few digits at most; a series per request would add ~1 KB each.
    assert len(after) < len(before) + 2_000, (len(before), len(after))
    assert MARK not in after and foreign not in after
    assert f'handler="{UNMATCHED}"' in after
    assert f'method="{OTHER_METHOD}"' in after
    assert 'handler="/v1/tasks/{taskId}"' in after  # templated requests keep their route


async def test_redirected_path_is_counted_under_the_fixed_label(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    redirected = await client.get(f"/v1/pools/{MARK}-secret/", headers=keys.admin)
    assert redirected.status_code == 307  # what Starlette answers for a trailing slash

    metrics = (await client.get("/metrics")).text

    assert MARK not in metrics
    assert f'http_requests_total{{handler="{UNMATCHED}",method="GET",status="3xx"}}' in metrics
