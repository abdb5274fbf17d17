"""Pools for the preview phase of ``berth bench api``: many pools a tenant sees, most of them
candidates for the benchmark's spec and the rest rejected for a mix of reasons; and, while
the previews run, writes to them as reconciler passes make (:class:`PoolsWriter`).

Every pool lists the tenant. Of each ten pools, six take the spec's runtime class in one of
its regions (candidates, unless too small: one in seven has almost no CPU), two another
runtime class and two a region the spec does not allow. Loaded with COPY, as the other
benchmarks' datasets are, with a heartbeat for every runtime instance dated an hour ahead,
so that every runtime stays healthy for the whole phase however slow the machine is.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import orjson

from bench.database import bench_connect
from bench.dataset import RESIDENCY, Dataset, dataset_load

__all__ = ["PoolsWriter", "WriterResult", "preview_pools_load"]

#: (runtime class, region) of each pool, by its index modulo ten.
_KINDS = (
    *(("python-3.11", "eu-west-1"),) * 3,
    *(("python-3.11", "eu-central-1"),) * 3,
    ("node-20", "eu-west-1"), ("node-20", "eu-central-1"),
    ("python-3.11", "us-east-1"), ("python-3.11", "ap-south-1"),
)


async def preview_pools_load(url: str, *, pools: int, tenant: str) -> None:
    """Load ``pools`` pools that list ``tenant`` into the database ``url``."""
    ds = Dataset()
    for i in range(pools):
        rc, region = _KINDS[i % len(_KINDS)]
        pool_id = f"pool-{i:05d}"
        instance = f"rt-{pool_id}"
        ds.pools.append((
            pool_id, [tenant], rc, instance, region, RESIDENCY[region], f"{region}-z{i % 3}",
            orjson.dumps({"tier": "standard", "zone": f"z{i % 3}"}).decode(), [region],
            1.0 + (i % 5) / 4, ["ops"],
        ))
        cpu = 100 if i % 7 == 0 else 16_000 + 1_000 * (i % 17)
        ds.ledgers.append((pool_id, cpu, 65_536, 0))
        ds.runtimes.append(instance)
    await dataset_load(url, ds, now=datetime.now(UTC) + timedelta(hours=1))


#: CPU (millicores) a pass of the writer reserves on each of its pools.
_RESERVED = 250
# One pass: reserve on this pass's pools and release the previous pass's, in one statement.
_PASS = (
    "UPDATE ledgers l SET cpu_reserved = l.cpu_reserved + d.cpu, updated_at = now() "
    "FROM unnest($1::text[], $2::bigint[]) AS d(pool_id, cpu) WHERE l.pool_id = d.pool_id"
)


@dataclass(frozen=True, slots=True)
class WriterResult:
    """What a :class:`PoolsWriter` committed: passes, ledger rows written, and over how long."""

    passes: int
    rows: int
    seconds: float


class PoolsWriter:
    """Commit ``rate`` passes a second, each a transaction that reserves CPU on ``per_pass``
    random pools of the ``pools`` loaded by :func:`preview_pools_load` and releases the
    previous pass's, as reconciler passes write the ledger; with ``hold``, another
    connection keeps a transaction that has an id open all the while (a long pass or batch).

    It runs in a thread of its own, with its own connections, from :meth:`start` to
    :meth:`stop`.
    """

    def __init__(self, url: str, *, pools: int, rate: float, per_pass: int, hold: bool) -> None:
        self.url = url
        # Pools with room for the reservations (one in seven has almost no CPU).
        self.candidates = [f"pool-{i:05d}" for i in range(pools) if i % 7]
        self.rate = rate
        self.per_pass = min(per_pass, len(self.candidates))
        self.hold = hold
        self._stop = threading.Event()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-pools-writer",
                                        daemon=True)
        self._result: WriterResult | None = None
        self._error: BaseException | None = None

    def start(self) -> None:
        """Start writing; return once the held transaction (if any) is open."""
        self._thread.start()
        self._started.wait(30)
        if self._error is not None:
            raise RuntimeError(f"the writer did not start: {self._error!r}")

    def stop(self) -> WriterResult:
        """Stop writing (ending the held transaction) and return what was written."""
        self._stop.set()
        self._thread.join(60)
        if self._error is not None or self._result is None:
            raise RuntimeError(f"the writer failed: {self._error!r}")
        return self._result

    def _run(self) -> None:
        try:
            asyncio.run(self._write())
        except BaseException as exc:  # reported by start() or stop()
            self._error = exc
            self._started.set()

    async def _write(self) -> None:
        rng = random.Random(7)
        conn = await bench_connect(self.url)
        held = await bench_connect(self.url) if self.hold else None
        try:
            if held is not None:
                await held.execute("BEGIN")
                await held.fetchval("SELECT pg_current_xact_id()")
            self._started.set()
            previous: list[str] = []
            passes = rows = 0
            t0 = time.monotonic()
            while not self._stop.is_set():
                if self.rate <= 0:  # only the held transaction
                    await asyncio.sleep(0.05)
                    continue
                chosen = rng.sample(self.candidates, self.per_pass)
                cpu = dict.fromkeys(previous, -_RESERVED)
                for pool_id in chosen:
                    cpu[pool_id] = cpu.get(pool_id, 0) + _RESERVED
                ids = sorted(cpu)
                await conn.execute(_PASS, ids, [cpu[i] for i in ids])
                previous = chosen
                passes += 1
                rows += len(ids)
                due = t0 + passes / self.rate
                await asyncio.sleep(max(0.0, due - time.monotonic()))
            self._result = WriterResult(passes, rows, time.monotonic() - t0)
        finally:
            if held is not None:
                await held.close()
            await conn.close()
