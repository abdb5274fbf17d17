"""``berth bench core``: time ``select`` over 1,000 and 10,000 pools with mixed specs.

Prints one JSON line ``{"results": [{"pools", "p50Ms", "p99Ms", ...}, ...]}``. Each decision
is one ``select`` call on a shared snapshot with a pass overlay (``Assumed``) that grows as
tasks are placed and is reset every ``--batch`` tasks, as in a reconciler pass. The mix has
region constraints, pool selectors, residency, required and preferred affinity, and gangs.

``--dataset e2e`` replays instead the end-to-end benchmark's dataset (``--tasks`` tasks on
each ``--pools``) as one reconciler's passes would (:mod:`app.bench.replay`: compile, select,
assume, placement document; thread CPU time per task), optionally with ``--anti-affinity``
(the share of tasks given a required anti-affinity), and reports the mean, p50 and p99 CPU
per task.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import numpy as np

from app.bench.dataset import dataset_generate
from app.bench.replay import replay, with_anti_affinity
from app.scheduling.assumed import Assumed
from app.scheduling.framework import select
from app.scheduling.snapshot import PlacedTask, PoolState, Snapshot
from app.scheduling.spec import TaskSpec, compile_spec

TENANTS = [f"tenant-{i}" for i in range(8)]
CLASSES = ["python-3.11", "node-20", "llm-small"]
REGIONS = ["eu-west-1", "eu-central-1", "us-east-1", "us-west-2", "ap-south-1"]
RESIDENCY = {"eu-west-1": "eu", "eu-central-1": "eu", "us-east-1": "us", "us-west-2": "us"}


def make_pools(n: int, rng: random.Random) -> list[PoolState]:
    """Return ``n`` pools with varied tenants, classes, regions, labels, health and load."""
    pools = []
    for i in range(n):
        region = rng.choice(REGIONS)
        cap = (rng.choice([8000, 16000, 32000]), rng.choice([16384, 65536]), rng.choice([0, 4, 8]))
        reserved = tuple(int(c * rng.random() * 0.7) for c in cap)
        pools.append(
            PoolState(
                id=f"pool-{i:05d}",
                tenant_ids=frozenset(rng.sample(TENANTS, rng.randint(1, 4))),
                runtime_class=rng.choice(CLASSES),
                runtime_instance_id=f"rt-{i}",
                region=region,
                data_residency=RESIDENCY.get(region),
                failure_domain=f"{region}-fd{rng.randint(0, 9)}",
                labels={
                    "tier": rng.choice(["std", "std", "hi"]),
                    "disk": rng.choice(["ssd", "hdd"]),
                },
                artifact_regions=frozenset(rng.sample(REGIONS, 1)),
                cost_weight=rng.choice([0.5, 1.0, 1.0, 2.0]),
                status="ACTIVE" if rng.random() > 0.05 else "CORDONED",
                ready=rng.random() > 0.02,
                heartbeat_fresh=rng.random() > 0.02,
                capacity=cap if rng.random() > 0.01 else None,
                reserved=reserved,
            )
        )
    return pools


def make_placed(pools: list[PoolState], rng: random.Random, count: int) -> list[PlacedTask]:
    """Return ``count`` leased tasks with app labels, on pools their tenant can see."""
    out = []
    for i in range(count):
        p = rng.choice(pools)
        tenant = rng.choice(sorted(p.tenant_ids))
        out.append(PlacedTask(f"placed-{i}", tenant, {"app": f"app{i % 20}"}, (p.id,)))
    return out


def make_spec(i: int, rng: random.Random) -> dict:
    """Return a spec body from a mix of shapes."""
    body: dict = {
        "runtimeClass": rng.choice(CLASSES),
        "requests": {
            "cpuMillis": rng.choice([250, 500, 1000, 2000]),
            "memoryMiB": rng.choice([256, 1024, 4096]),
            "llmSlots": rng.choice([0, 0, 0, 1]),
        },
        "labels": {"app": f"app{i % 20}"},
    }
    kind = i % 10
    if kind in (1, 2):
        body["constraints"] = {"regions": rng.sample(REGIONS, 2)}
    elif kind == 3:
        body["constraints"] = {"poolSelector": {"tier": "hi"}, "artifactRegion": "us-east-1"}
    elif kind == 4:
        body["constraints"] = {"dataResidency": "eu"}
    elif kind == 5:
        body["affinity"] = {
            "preferred": [{"selector": {"app": f"app{i % 20}"}, "topology": "pool", "weight": 50}]
        }
    elif kind == 6:
        body["affinity"] = {
            "required": [{"selector": {"app": f"app{(i + 1) % 20}"}, "topology": "region"}]
        }
    elif kind == 7:
        body["gang"] = {"members": rng.choice([2, 4, 8]), "maxPerPool": 4}
    return body


def run(n_pools: int, decisions: int, batch: int, seed: int) -> dict:
    """Return p50/p99 of ``decisions`` select calls on ``n_pools`` pools."""
    rng = random.Random(seed)
    pools = make_pools(n_pools, rng)
    snap = Snapshot.build(pools, make_placed(pools, rng, n_pools // 2))
    specs = [
        compile_spec(
            TaskSpec.model_validate(make_spec(i, rng)),
            tenant_id=rng.choice(TENANTS),
            task_id=f"task-{i}",
        )
        for i in range(decisions)
    ]
    # Warm the per-snapshot memo tables (the static filters per tenant/class) as a pass would.
    warm = Assumed(snap)
    for spec in specs[:50]:
        select(spec, snap, assumed=warm)
    times = np.empty(len(specs), dtype=np.float64)
    placed = 0
    assumed = Assumed(snap)
    for k, spec in enumerate(specs):
        if k % batch == 0:
            assumed = Assumed(snap)
        t0 = time.perf_counter_ns()
        result = select(spec, snap, assumed=assumed)
        times[k] = time.perf_counter_ns() - t0
        if result.placement is not None:
            assumed.add(spec, result.placement.members)
            placed += 1
    ms = times / 1e6
    return {
        "pools": n_pools,
        "p50Ms": round(float(np.percentile(ms, 50)), 4),
        "p99Ms": round(float(np.percentile(ms, 99)), 4),
        "meanMs": round(float(ms.mean()), 4),
        "decisions": len(specs),
        "placed": placed,
    }


def run_dataset(n_pools: int, tasks: int, batch: int, seed: int, anti: float) -> dict:
    """Return CPU per task of the e2e dataset's tasks replayed through ``select`` in passes."""
    ds = with_anti_affinity(dataset_generate(pools=n_pools, tasks=tasks, seed=seed), anti)
    steps = list(replay(ds, select, batch=batch, top_k=4))
    us = np.array([s.elapsed_ns for s in steps], dtype=np.float64) / 1e3
    return {
        "pools": n_pools,
        "dataset": "e2e",
        "antiAffinity": anti,
        "meanUs": round(float(us.mean()), 1),
        "p50Us": round(float(np.percentile(us, 50)), 1),
        "p99Us": round(float(np.percentile(us, 99)), 1),
        "decisions": len(steps),
        "placed": sum(1 for s in steps if s.result is not None and s.result.placement),
    }


def main(argv: list[str]) -> int:
    """Run the core benchmark and print one JSON line."""
    parser = argparse.ArgumentParser(
        prog="berth bench core",
        description="Time the scheduling core's select() over 1,000 and 10,000 pools with "
        "mixed specs; prints one JSON line.",
    )
    parser.add_argument("--pools", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--decisions", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=None,
                        help="tasks per simulated pass (default 256; 1024 with --dataset e2e)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--dataset", choices=("mixed", "e2e"), default="mixed",
                        help="mixed: the core mix above; e2e: replay the e2e bench dataset")
    parser.add_argument("--tasks", type=int, default=20000, help="with --dataset e2e")
    parser.add_argument("--anti-affinity", type=float, default=0.0,
                        help="with --dataset e2e: share of tasks with required anti-affinity")
    args = parser.parse_args(argv)
    if args.dataset == "e2e":
        results = [run_dataset(n, args.tasks, args.batch or 1024, args.seed, args.anti_affinity)
                   for n in args.pools]
    else:
        results = [run(n, args.decisions, args.batch or 256, args.seed) for n in args.pools]
    print(json.dumps({"results": results}))
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
