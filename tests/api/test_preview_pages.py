"""Preview answers sized for people: a page of candidates and rejections with their counts,
rejections by reason, and opaque cursors that page the rest and refuse forgeries."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from typing import Any

import httpx
import pytest
from pydantic import TypeAdapter

from app.api.preview_schemas import PlacementPreview
from app.db import Database
from tests.api.conftest import Keys, assert_problem
from tests.api.test_preview import heartbeat

SPEC: dict[str, Any] = {
    "runtimeClass": "gpu-small",
    "requests": {"cpuMillis": 1000, "memoryMiB": 1024, "llmSlots": 1},
}
BIG = {"cpuMillis": 16000, "memoryMiB": 65536, "llmSlots": 8}
#: A spec whose compiled form holds sets (regions, labels), ordered by the hash seed.
SPEC_WITH_SETS: dict[str, Any] = {
    **SPEC, "labels": {"a": "1", "b": "2", "c": "3"},
    "constraints": {"regions": ["eu-west", "eu-central", "us-east"]},
}


@pytest.fixture
async def many(pool_make, db: Database) -> None:
    """Five candidates (c0 the largest), three stale pools, two of another runtime class."""
    for i in range(5):
        size = {k: v // (i + 1) for k, v in BIG.items()}
        await pool_make(f"c{i}", capacity=size)
    for i in range(3):
        await pool_make(f"s{i}", runtimeInstanceId="rt-2")
    for i in range(2):
        await pool_make(f"r{i}", runtimeClass="cpu-only")
    await heartbeat(db, "rt-1")
    await heartbeat(db, "rt-2", age_seconds=3600)


async def _preview(client: httpx.AsyncClient, keys: Keys, query: str = "",
                   spec: dict[str, Any] = SPEC) -> httpx.Response:
    return await client.post(f"/v1/placements/preview{query}", json=spec, headers=keys.tenant_a)


async def test_a_page_holds_limit_entries_and_counts_the_rest(client, keys, many):
    r = await _preview(client, keys, "?limit=2")

    assert r.status_code == 200, r.text
    page = r.json()
    TypeAdapter(PlacementPreview).validate_python(page)
    assert page["placement"]["poolId"] == "c0"
    assert [c["poolId"] for c in page["candidates"]] == ["c0", "c1"]
    assert all(c["components"] for c in page["candidates"])
    assert len(page["rejected"]) == 2
    assert (page["candidateCount"], page["rejectedCount"]) == (5, 5)
    assert page["rejectedByReason"] == [
        {"code": "runtime_unhealthy", "count": 3, "poolIds": ["s0", "s1", "s2"]},
        {"code": "runtime_class_mismatch", "count": 2, "poolIds": ["r0", "r1"]},
    ]
    assert page["nextCursor"]


async def test_cursors_page_through_every_candidate_and_rejection_once(client, keys, many):
    whole = (await _preview(client, keys, "?limit=1000")).json()
    assert whole["nextCursor"] is None
    candidates, rejected, query = [], [], "?limit=2"
    for _ in range(10):
        page = (await _preview(client, keys, query)).json()
        candidates += page["candidates"]
        rejected += page["rejected"]
        if page["nextCursor"] is None:
            break
        query = f"?limit=2&cursor={page['nextCursor']}"
    assert [c["poolId"] for c in candidates] == [c["poolId"] for c in whole["candidates"]]
    assert rejected == whole["rejected"]


async def test_the_default_page_is_twenty(client, keys, pool_make, db):
    for i in range(25):
        await pool_make(f"p{i:02d}")
    await heartbeat(db, "rt-1")

    page = (await _preview(client, keys)).json()

    assert len(page["candidates"]) == 20 and page["candidateCount"] == 25
    assert page["nextCursor"]


@pytest.mark.parametrize(
    "cursor",
    [
        pytest.param("not-a-cursor", id="malformed"),
        pytest.param("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", id="forged"),
    ],
)
async def test_a_cursor_berth_did_not_make_is_400(client, keys, many, cursor):
    assert_problem(await _preview(client, keys, f"?cursor={cursor}"), 400)


async def test_a_cursor_of_another_spec_is_400(client, keys, many):
    first = (await _preview(client, keys, "?limit=1")).json()
    other = {**SPEC, "requests": {"cpuMillis": 500, "memoryMiB": 512, "llmSlots": 1}}

    problem = assert_problem(
        await _preview(client, keys, f"?limit=1&cursor={first['nextCursor']}", spec=other), 400
    )
    assert "cursor" in problem["detail"]


@pytest.mark.parametrize("limit", ["0", "1001", "ten"])
async def test_limit_out_of_bounds_is_422(client, keys, many, limit):
    assert_problem(await _preview(client, keys, f"?limit={limit}"), 422)


def _wait(event: threading.Event) -> bool:
    return event.wait(10)


async def test_past_the_bound_on_previews_a_preview_is_429_with_retry_after(
    app, client, keys, many
):
    offload = app.state.offload
    release = threading.Event()
    held = [asyncio.ensure_future(offload.run(_wait, release))
            for _ in range(offload.max_concurrent)]
    await asyncio.sleep(0.05)
    try:
        r = await _preview(client, keys)
        problem = assert_problem(r, 429)
        assert r.headers["Retry-After"] == "1"
        assert "BERTH_PREVIEW_MAX_CONCURRENT" in problem["detail"]
        drained = await client.post("/v1/pools/c0/drain-preview", headers=keys.admin)
        assert_problem(drained, 429)
    finally:
        release.set()
        await asyncio.gather(*held)
    assert (await _preview(client, keys)).status_code == 200


def test_a_cursor_scope_is_the_same_in_every_process() -> None:
    # Another API process (or this one restarted) must open the cursors this one gave:
    # the scope may not depend on the process's hash seed.
    code = (
        "from app.scheduling.spec import TaskSpec\n"
        "from app.services.previews import placement_scope\n"
        f"print(placement_scope(TaskSpec.model_validate({SPEC_WITH_SETS!r}), "
        "tenant_id='tenant-a'))"
    )
    scopes = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONHASHSEED": seed}).stdout.strip()
        for seed in ("1", "2", "3")
    }
    assert len(scopes) == 1 and scopes.pop().startswith("placement-preview:")
