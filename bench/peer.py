"""The peer queue: pgqueuer moving the same number of jobs through the same PostgreSQL.

A PostgreSQL job queue does the part of Berth's work that needs no decision: it hands each
job to one consumer exactly once and records that it finished. ``berth bench e2e`` runs it
in the same run, on the same server, in a fresh database: the jobs (one per task of the
dataset, each carrying its task's spec as payload) are enqueued in bulk before the clock
starts; then ``clients`` consumer processes (default 4), each a pgqueuer ``QueueManager``
on its own connection dequeuing ``batch`` jobs at a time (default 64) with a no-op handler,
drain the queue. Its rate is jobs finished per second from the common start to the last
consumer's end; its CPU is the consumers' and PostgreSQL's.

pgqueuer is an optional dependency (``pip install 'berth-scheduler[bench]'``); without it
the baseline is skipped and its fields are null.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from bench.database import bench_connect
from bench.dataset import Dataset
from bench.workers import worker_serve, workers_run

__all__ = ["PEER_BATCH", "PeerResult", "peer_available", "peer_prepare", "peer_run"]

PEER_BATCH = 64
ENTRYPOINT = "place"
#: Jobs per enqueue call while loading.
_ENQUEUE_CHUNK = 5000


@dataclass(frozen=True, slots=True)
class PeerResult:
    """What the consumers did: jobs finished, wall time and CPU (consumers + server)."""

    jobs: int
    seconds: float
    clients: int
    batch: int
    cpu_seconds: float
    version: str

    @property
    def rate(self) -> float:
        """Return jobs finished per second."""
        return self.jobs / self.seconds if self.seconds > 0 else 0.0


def peer_available() -> str | None:
    """Return pgqueuer's version, or None when it is not installed."""
    try:
        import pgqueuer
    except ImportError:
        return None
    return str(pgqueuer.__version__)


async def peer_prepare(url: str, ds: Dataset) -> None:
    """Install pgqueuer's schema in the empty database ``url`` and enqueue one job per task."""
    from pgqueuer import AsyncpgDriver, Queries

    conn = await bench_connect(url)
    try:
        queries = Queries(AsyncpgDriver(conn))
        await queries.install()
        payloads = [task[6].encode() for task in ds.tasks]
        for i in range(0, len(payloads), _ENQUEUE_CHUNK):
            chunk = payloads[i:i + _ENQUEUE_CHUNK]
            await queries.enqueue([ENTRYPOINT] * len(chunk), list(chunk), [0] * len(chunk))
        await conn.execute("ANALYZE")
    finally:
        await conn.close()


async def _consumer(url: str, batch: int) -> None:
    from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager
    from pgqueuer.types import QueueExecutionMode

    conn = await bench_connect(url)
    try:
        done = 0
        manager = QueueManager(Queries(AsyncpgDriver(conn)))

        @manager.entrypoint(ENTRYPOINT)
        async def place(job: Job) -> None:
            nonlocal done
            done += 1

        async def work() -> dict[str, Any]:
            await manager.run(dequeue_timeout=timedelta(seconds=1), batch_size=batch,
                              mode=QueueExecutionMode.drain)
            return {"jobs": done}

        await worker_serve(work)
    finally:
        await conn.close()


def peer_run(url: str, database: str, *, clients: int = 4, batch: int = PEER_BATCH) -> PeerResult:
    """Run ``clients`` consumer processes until the queue is drained."""
    argv = ["-m", "bench.peer", url, str(batch)]
    results, pg_cpu = workers_run(database, [argv] * clients)
    return PeerResult(
        jobs=sum(r["jobs"] for r in results),
        seconds=max(r["ended"] for r in results) - min(r["began"] for r in results),
        clients=clients, batch=batch,
        cpu_seconds=sum(r["cpu"] for r in results) + pg_cpu,
        version=peer_available() or "",
    )


if __name__ == "__main__":
    asyncio.run(_consumer(sys.argv[1], int(sys.argv[2])))
