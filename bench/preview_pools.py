"""Pools for the preview phase of ``berth bench api``: many pools a tenant sees, most of them
candidates for the benchmark's spec and the rest rejected for a mix of reasons.

Every pool lists the tenant. Of each ten pools, six take the spec's runtime class in one of
its regions (candidates, unless too small: one in seven has almost no CPU), two another
runtime class and two a region the spec does not allow. Loaded with COPY, as the other
benchmarks' datasets are, with a heartbeat for every runtime instance dated an hour ahead,
so that every runtime stays healthy for the whole phase however slow the machine is.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import orjson

from bench.dataset import RESIDENCY, Dataset, dataset_load

__all__ = ["preview_pools_load"]

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
