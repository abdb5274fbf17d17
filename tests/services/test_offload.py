"""The worker pool of request CPU work: results come back, the bound refuses with 429 at
once, a slow computation is 503, and a process worker leaves the event loop free."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from prometheus_client import REGISTRY

from app.db import Database
from app.ledger.reservations import ledger_reserve_many
from app.ledger.snapshot import snapshot_read
from app.services.offload import ComputeBusy, ComputeTimeout, Offload, worker_read
from tests.factories import NOW, heartbeat_add, pool_add


def _spin(seconds: float) -> int:
    """Hold a CPU (and the GIL, in a thread) for ``seconds``; return the worker's pid."""
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += 1
    return os.getpid()


def _wait(event: threading.Event) -> bool:
    return event.wait(10)


async def test_a_process_worker_computes_in_another_process() -> None:
    offload = Offload(workers=1, max_concurrent=2, timeout_seconds=60)
    offload.start()
    try:
        assert await offload.run(_spin, 0.01) != os.getpid()
        assert offload.in_use == 0
    finally:
        offload.close()


async def test_past_the_bound_a_request_is_refused_at_once_with_retry_after() -> None:
    offload = Offload(workers=0, max_concurrent=1, timeout_seconds=10)
    release = threading.Event()
    try:
        held = asyncio.ensure_future(offload.run(_wait, release))
        await asyncio.sleep(0.05)
        with pytest.raises(ComputeBusy) as refused:
            await offload.run(_spin, 0.0)
        assert refused.value.status == 429
        assert refused.value.extra["headers"]["Retry-After"] == "1"
        release.set()
        assert await held is True
        await asyncio.sleep(0.05)
        assert offload.in_use == 0
        assert await offload.run(_spin, 0.0) == os.getpid()
    finally:
        release.set()
        offload.close()


async def test_a_computation_past_the_timeout_is_503_and_keeps_its_slot_until_done() -> None:
    offload = Offload(workers=0, max_concurrent=1, timeout_seconds=0.1)
    release = threading.Event()
    try:
        with pytest.raises(ComputeTimeout) as late:
            await offload.run(_wait, release)
        assert late.value.status == 503 and "Retry-After" in late.value.extra["headers"]
        # The abandoned computation still runs: its slot is not free for another yet.
        with pytest.raises(ComputeBusy):
            await offload.run(_spin, 0.0)
        release.set()
        for _ in range(100):
            if offload.in_use == 0:
                break
            await asyncio.sleep(0.01)
        assert offload.in_use == 0
    finally:
        release.set()
        offload.close()


def test_a_process_stopped_by_a_signal_after_closing_leaves_no_semaphore_behind() -> None:
    """Under uvicorn the API process ends by the signal that stopped it, raised again after
    shutdown, which runs no exit handler: the pool's queues must be released by
    ``close()`` itself, or the resource tracker reports them leaked."""
    script = textwrap.dedent("""
        import asyncio, os, signal
        from app.services.offload import Offload

        async def main():
            offload = Offload(workers=1, max_concurrent=1, timeout_seconds=30)
            offload.start()
            assert await offload.run(os.getpid) != os.getpid()
            offload.close()

        if __name__ == "__main__":
            asyncio.run(main())
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.raise_signal(signal.SIGTERM)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=os.getcwd())
    assert done.returncode == -15, done.stderr
    assert "leaked" not in done.stderr, done.stderr


async def _no_placements() -> list:
    return []


def _refresh() -> int:
    """Refresh the worker's snapshot; return its pool count."""
    snapshot = worker_read(lambda conn, state: snapshot_read(
        conn, now=NOW, freshness_seconds=60.0, strategy="spread", placed=_no_placements,
        cache=state.snapshot_cache("spread")))
    return snapshot.n


def _rows_read() -> tuple[float, float]:
    return (REGISTRY.get_sample_value("berth_preview_rows_read_sum") or 0.0,
            REGISTRY.get_sample_value("berth_preview_rows_read_count") or 0.0)


async def test_the_rows_a_worker_refresh_reads_are_counted(db: Database) -> None:
    async with db.transaction() as conn:
        for pid in ("p1", "p2", "p3"):
            await pool_add(conn, pid, tenants=["acme"])
            await heartbeat_add(conn, f"rt-{pid}", at=NOW)
    offload = Offload(workers=0, max_concurrent=1, timeout_seconds=60, database_url=db.url)
    try:
        total, count = _rows_read()
        assert await offload.run(_refresh) == 3
        assert _rows_read() == (total + 3, count + 1)  # the first read is whole
        total, count = _rows_read()
        async with db.transaction() as conn:
            await ledger_reserve_many(conn, amounts={"p1": (10, 0, 0), "p3": (10, 0, 0)},
                                      now=NOW)
        assert await offload.run(_refresh) == 3
        after = _rows_read()
        assert after[1] == count + 1
        assert after[0] - total >= 2  # other sessions' transactions may widen a read
        assert await offload.run(_refresh) == 3
        assert _rows_read()[1] == count + 2
    finally:
        offload.close()
