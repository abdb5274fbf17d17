"""Benchmark data: a fresh database, P pools with ledgers and T admitted tasks, and checks.

Both the end-to-end benchmark and its naive baseline load the same generated dataset into
their own fresh database, so they place identical work. The dataset is deterministic for a
seed. Its shape:

* pools fall into cells of (tenant group, runtime class); every pool lists the tenants of its
  group, sits in one of six regions (with the region's data residency), has a ``tier`` and
  ``zone`` label, a cost weight and a small/medium/large ledger;
* tasks belong to many tenants (about one per hundred tasks); most specs are simple (a
  runtime class and requests), the rest add regions, data residency, a pool selector,
  preferred affinity, or a small gang;
* every constrained task is generated against an *anchor* pool of its cell that satisfies
  it, and each pool gets at least twice the demand of the tasks anchored on it, so a
  feasible placement of every task exists and the run ends with every task leased.

Bulk loading uses asyncpg's binary COPY into the migrated schema, as a restore would (the
API would make loading, not placing, the bulk of a run). Tasks are first copied into an
unlogged staging table and *admitted* later in one ``INSERT … SELECT`` with
``admitted_at = now()``, once the schedulers are up, so admission→lease latency measures
scheduling, not process start-up.
"""

from __future__ import annotations

import math
import random
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg
import orjson

from app.ledger.wakeups import CHANNEL, WakeSource
from app.scheduling.spec import TaskSpec
from app.shards import shard_of
from bench.database import bench_connect

__all__ = [
    "MIXES",
    "Admission",
    "Dataset",
    "dataset_admit",
    "dataset_generate",
    "dataset_load",
    "runtimes_heartbeat",
]

REGIONS = ("eu-west-1", "eu-central-1", "us-east-1", "us-west-2", "ap-south-1", "ap-northeast-1")
RESIDENCY = {"eu-west-1": "eu", "eu-central-1": "eu", "us-east-1": "us", "us-west-2": "us",
             "ap-south-1": "apac", "ap-northeast-1": "apac"}
#: Runtime classes and the share of tasks that ask for each.
CLASSES = (("python-3.11", 0.45), ("node-20", 0.25), ("java-21", 0.15), ("gpu-llm", 0.15))
#: Pool sizes (cpu millicores, memory MiB, llm slots for gpu pools) and how common each is.
SIZES = (((16_000, 65_536, 8), 0.5), ((32_000, 131_072, 16), 0.35), ((64_000, 262_144, 32), 0.15))
HEADROOM = 2.0
STAGING = "bench_admission"

_TASK_COLUMNS = ("ord", "id", "tenant_id", "shard", "priority", "runtime_class", "spec",
                 "labels", "max_attempts")


@dataclass(slots=True)
class Dataset:
    """Rows ready to COPY: pools, ledgers, runtime instances and tasks (in admission order),
    and each task's anchor pool (one that has room for it: the SQL floor places it there)."""

    pools: list[tuple[Any, ...]] = field(default_factory=list)
    ledgers: list[tuple[int, ...] | tuple[Any, ...]] = field(default_factory=list)
    runtimes: list[str] = field(default_factory=list)
    tasks: list[tuple[Any, ...]] = field(default_factory=list)
    tenants: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    anchors: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Pool:
    id: str
    group: int
    rc: str
    region: str
    tier: str
    zone: str
    size: tuple[int, int, int]
    demand: list[int] = field(default_factory=lambda: [0, 0, 0])


def _weighted(rng: random.Random, table: tuple[tuple[Any, float], ...]) -> Any:
    return rng.choices([v for v, _ in table], weights=[w for _, w in table])[0]


def _requests(rng: random.Random, rc: str) -> dict[str, int]:
    cpu = rng.choice((100, 250, 250, 500, 500, 1000, 2000))
    mem = rng.choice((128, 256, 512, 512, 1024, 2048, 4096))
    req = {"cpuMillis": cpu, "memoryMiB": mem}
    if rc == "gpu-llm":
        req["llmSlots"] = rng.choice((1, 1, 1, 2))
    return req


def _spec(rng: random.Random, rc: str, tenant: int, anchor: _Pool) -> tuple[str, dict, int]:
    """Return (kind, spec JSON, members) for one task anchored on ``anchor``."""
    spec: dict[str, Any] = {"runtimeClass": rc, "requests": _requests(rng, rc)}
    app_label = f"app-{tenant}-{rng.randrange(4)}"
    roll = rng.random()
    members = 1
    if roll < 0.70:
        kind = "simple"
        if rng.random() < 0.5:
            spec["labels"] = {"app": app_label}
    elif roll < 0.80:
        kind = "regions"
        other = rng.choice(REGIONS)
        spec["constraints"] = {"regions": sorted({anchor.region, other})}
    elif roll < 0.85:
        kind = "residency"
        spec["constraints"] = {"dataResidency": RESIDENCY[anchor.region]}
    elif roll < 0.90:
        kind = "selector"
        spec["constraints"] = {"poolSelector": {"tier": anchor.tier}}
    elif roll < 0.95:
        kind = "affinity"
        spec["labels"] = {"app": app_label}
        spec["affinity"] = {"preferred": [
            {"selector": {"app": app_label}, "topology": "failureDomain", "weight": 50}]}
    elif roll < 0.97:
        kind = "gang"
        members = rng.choice((2, 3, 4))
        spec["gang"] = {"members": members}
    else:
        kind = "priority"
        spec["priority"] = rng.choice((-10, 5, 10, 100))
        spec["constraints"] = {"artifactRegion": anchor.region}
    return kind, spec, members


#: Spec mixes of ``--mix``: the default, or 10% of tasks replaced by one kind on top of it.
MIXES = ("default", "antiaffinity", "gangs")
#: Share of tasks a non-default mix adds.
MIX_SHARE = 0.10


def _spec_mixed(
    rng: random.Random, rc: str, tenant: int, anchor: _Pool, mix: str
) -> tuple[str, dict, int]:
    """Return (kind, spec JSON, members) for one task of ``mix``.

    ``antiaffinity``: 10% of tasks carry one *required* anti-affinity term, half with
    ``topology: pool``, half ``failureDomain``; the selector names an ``app`` label that
    other tasks of the same tenant carry (the default mix labels half of the simple tasks
    and every preferred-affinity task with one of the tenant's four ``app-<tenant>-<k>``),
    so the term excludes the pools (or failure domains) where those tasks were placed. The
    anti-affine task itself carries a label no selector names, so anti-affine tasks never
    exclude each other: each excludes at most the few pools of one label's tasks of its
    tenant in its cell (about 1 in 20 of the tenant's tasks), which leaves every task a
    feasible placement and the run completes.

    ``gangs``: 10% of tasks are gangs of 2–4 members (on top of the default mix's 2%).
    The extra draw happens only for a non-default mix: the default dataset is unchanged.
    """
    if mix == "default" or rng.random() >= MIX_SHARE:
        return _spec(rng, rc, tenant, anchor)
    spec: dict[str, Any] = {"runtimeClass": rc, "requests": _requests(rng, rc)}
    if mix == "gangs":
        members = rng.choice((2, 3, 4))
        spec["gang"] = {"members": members}
        return "gang", spec, members
    topology = rng.choice(("pool", "failureDomain"))
    spec["labels"] = {"app": f"anti-{tenant}"}
    spec["affinity"] = {"required": [
        {"selector": {"app": f"app-{tenant}-{rng.randrange(4)}"}, "topology": topology,
         "anti": True}]}
    return ("antiAffinityPool" if topology == "pool" else "antiAffinityFailureDomain"), spec, 1


def _groups(tenants: int, pools: int) -> int:
    return max(1, min(16, tenants // 25, pools // (2 * len(CLASSES))))


#: The millisecond of the first generated task id (2026-01-01T00:00:00Z).
_ID_EPOCH_MS = 1_767_225_600_000


def _task_id(ord_: int, rand: int) -> uuid.UUID:
    """Return task ``ord_``'s id: a UUIDv7, as the API gives since 0009_batch. Its millisecond
    is one per task from a fixed epoch, so ids grow with admission order like submitted tasks';
    its 74 random bits are the top of the 128 the seeded generator gave the former UUIDv4 ids,
    so every other choice of the dataset is unchanged."""
    return uuid.UUID(int=((_ID_EPOCH_MS + ord_) << 80) | (0x7 << 76) | ((rand >> 62) << 64)
                     | (0b10 << 62) | (rand & ((1 << 62) - 1)))


def dataset_generate(*, pools: int, tasks: int, seed: int = 1, mix: str = "default") -> Dataset:
    """Generate ``pools`` pools sized so that all ``tasks`` (specs of ``mix``) fit;
    deterministic."""
    if mix not in MIXES:
        raise ValueError(f"mix must be one of {', '.join(MIXES)}, not {mix!r}")
    if pools < len(CLASSES):
        raise ValueError(f"need at least {len(CLASSES)} pools (one per runtime class)")
    rng = random.Random(seed)
    n_tenants = max(8, min(500, tasks // 100))
    n_groups = _groups(n_tenants, pools)
    cells: dict[tuple[int, str], list[_Pool]] = {}
    all_pools: list[_Pool] = []
    for i in range(pools):
        cell = i % (n_groups * len(CLASSES))
        group, rc = cell // len(CLASSES), CLASSES[cell % len(CLASSES)][0]
        p = _Pool(
            id=f"pool-{i:05d}",
            group=group,
            rc=rc,
            region=REGIONS[(i // (n_groups * len(CLASSES))) % len(REGIONS)],
            tier="premium" if rng.random() < 0.25 else "standard",
            zone=f"z{rng.randrange(3)}",
            size=_weighted(rng, SIZES),
        )
        cells.setdefault((group, rc), []).append(p)
        all_pools.append(p)
    ds = Dataset(tenants=n_tenants)
    class_table = tuple(CLASSES)
    for ord_ in range(tasks):
        tenant = rng.randrange(n_tenants)
        tenant_id = f"tenant-{tenant:03d}"
        rc = _weighted(rng, class_table)
        anchor = rng.choice(cells[(tenant % n_groups, rc)])
        kind, raw, members = _spec_mixed(rng, rc, tenant, anchor, mix)
        spec = TaskSpec.model_validate(raw).model_dump(mode="json", by_alias=True)
        req = spec["requests"]
        for d, key in enumerate(("cpuMillis", "memoryMiB", "llmSlots")):
            anchor.demand[d] += members * req[key]
        ds.kinds[kind] = ds.kinds.get(kind, 0) + 1
        ds.anchors.append(anchor.id)
        ds.tasks.append((
            ord_, _task_id(ord_, rng.getrandbits(128) >> 54), tenant_id, shard_of(tenant_id),
            spec["priority"], rc, orjson.dumps(spec, option=orjson.OPT_SORT_KEYS).decode(),
            orjson.dumps(spec["labels"]).decode(), spec["maxAttempts"],
        ))
    for p in all_pools:
        tenants_of_group = [f"tenant-{t:03d}" for t in range(n_tenants) if t % n_groups == p.group]
        cpu, mem, llm = p.size
        cap = (
            max(cpu, math.ceil(HEADROOM * p.demand[0] / 1000) * 1000),
            max(mem, math.ceil(HEADROOM * p.demand[1] / 1024) * 1024),
            max(llm, math.ceil(HEADROOM * p.demand[2])) if p.rc == "gpu-llm" else 0,
        )
        instance = f"rt-{p.id}"
        labels = {"tier": p.tier, "zone": p.zone}
        ds.pools.append((
            p.id, tenants_of_group, p.rc, instance, p.region, RESIDENCY[p.region],
            f"{p.region}-{p.zone}", orjson.dumps(labels).decode(), [p.region],
            round(rng.uniform(0.5, 2.0), 2), ["ops"],
        ))
        ds.ledgers.append((p.id, *cap))
        ds.runtimes.append(instance)
    return ds


async def dataset_load(url: str, ds: Dataset, *, now: datetime) -> None:
    """COPY pools, ledgers and fresh runtime heartbeats; stage the tasks for admission."""
    conn = await bench_connect(url)
    try:
        async with conn.transaction():
            await conn.copy_records_to_table(
                "pools",
                records=ds.pools,
                columns=("id", "tenant_ids", "runtime_class", "runtime_instance_id", "region",
                         "data_residency", "failure_domain", "labels", "artifact_regions",
                         "cost_weight", "operators"),
            )
            await conn.copy_records_to_table(
                "ledgers",
                records=ds.ledgers,
                columns=("pool_id", "cpu_total", "memory_total", "llm_total"),
            )
            await conn.copy_records_to_table(
                "runtime_instances",
                records=[(r, now) for r in ds.runtimes],
                columns=("id", "last_heartbeat_at"),
            )
            await conn.execute(
                f"""CREATE UNLOGGED TABLE {STAGING} (
                        ord int PRIMARY KEY, id uuid, tenant_id text, shard int, priority int,
                        runtime_class text, spec jsonb, labels jsonb, max_attempts int)"""
            )
            await conn.copy_records_to_table(STAGING, records=ds.tasks, columns=_TASK_COLUMNS)
        await conn.execute("ANALYZE")
    finally:
        await conn.close()


@dataclass(frozen=True, slots=True)
class Admission:
    """How long the admission transaction took (seconds, the server's clock) and when it
    committed (``time.monotonic()`` of the benchmark's process)."""

    seconds: float
    committed: float


async def dataset_admit(url: str) -> Admission:
    """Admit every staged task in one transaction (admitted_at = now()), with the staging
    table dropped and the tasks' statistics gathered before it commits, notify, and return
    how long it took and when it committed."""
    conn = await bench_connect(url)
    try:
        started = await conn.fetchval("SELECT extract(epoch FROM clock_timestamp())")
        async with conn.transaction():
            await conn.execute(
                f"""INSERT INTO tasks (id, tenant_id, shard, state, priority, runtime_class,
                                       spec, labels, max_attempts, created_at, admitted_at,
                                       updated_at)
                    SELECT id, tenant_id, shard, 'ADMITTED', priority, runtime_class, spec,
                           labels, max_attempts, now(), now(), now()
                    FROM {STAGING} ORDER BY ord"""
            )
            await conn.execute(
                f"""INSERT INTO task_events (task_id, at, from_state, to_state, reason)
                    SELECT id, now(), NULL, 'ADMITTED', 'submitted' FROM {STAGING}"""
            )
            await conn.execute(f"DROP TABLE {STAGING}")
            # ANALYZE in a transaction counts the transaction's own rows as live.
            await conn.execute("ANALYZE tasks")
            await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, WakeSource.SUBMITTED.value)
        committed = time.monotonic()
        ended = await conn.fetchval("SELECT extract(epoch FROM clock_timestamp())")
        return Admission(seconds=float(ended - started), committed=committed)
    finally:
        await conn.close()


# Every instance heard from now; how many had gone stale (their previous heartbeat older than
# the freshness window $1).
_HEARTBEAT = """
    WITH u AS (UPDATE runtime_instances r SET last_heartbeat_at = now()
               FROM runtime_instances o WHERE o.id = r.id
               RETURNING o.last_heartbeat_at <= now() - make_interval(secs => $1) AS stale)
    SELECT count(*) FILTER (WHERE stale) FROM u"""


async def runtimes_heartbeat(conn: asyncpg.Connection, *, freshness_seconds: float = 15.0) -> None:
    """Mark every runtime instance as heard from now, as live runtimes would; when some had
    gone stale (the bench fell behind on a loaded machine), wake the reconcilers with
    ``pool_healthy``, as ``POST /v1/runtimes/{id}/heartbeat`` does, so tasks parked as
    ``runtime_unhealthy`` meanwhile are retried instead of waiting for the safety sweep."""
    if await conn.fetchval(_HEARTBEAT, freshness_seconds):
        await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, WakeSource.POOL_HEALTHY.value)


