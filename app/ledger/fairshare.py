"""Fair sharing in the ledger: the tenants' fair weights, and their decayed usage.

* :func:`fair_weights_read`: the ``fairWeight`` of each tenant a pass orders or reclaims
  from (a tenant without a row weighs 1);
* :func:`fair_usage_decay`: with a usage half-life ``h`` set, brings the ``fair_usage``
  rows of the pass's tenants and classes up to date and returns them. A row is an
  exponentially decayed average of the tenant's usage (``quota_usage.used``): at each
  update ``decayed = decayed * w + used * (1 - w)`` with ``w = 0.5 ^ (elapsed / h)``; a
  new row starts at the usage of the moment. Rows another pass is updating are skipped
  (read as they were committed), so passes never wait for each other here, and a row moves
  at most once per pass clock.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from app.db import Connection
from app.ledger.quotas import RESOURCES

__all__ = ["fair_usage_decay", "fair_weights_read"]

_WEIGHTS = "SELECT id, fair_weight FROM tenants WHERE id = ANY($1::text[])"


async def fair_weights_read(
    conn: Connection, *, tenant_ids: Collection[str]
) -> dict[str, float]:
    """Return the fair weight of each of ``tenant_ids`` that has a tenant row."""
    if not tenant_ids:
        return {}
    return {r[0]: float(r[1]) for r in await conn.fetch(_WEIGHTS, sorted(set(tenant_ids)))}


# $1 tenants, $2 classes, $3 half-life (seconds), $4 now.
_INSERT = (
    "INSERT INTO fair_usage (tenant_id, runtime_class, resource, decayed, at) "
    "SELECT q.tenant_id, q.runtime_class, q.resource, q.used, $3 FROM quota_usage q "
    "WHERE q.tenant_id = ANY($1::text[]) AND q.runtime_class = ANY($2::text[]) "
    "ORDER BY 1, 2, 3 ON CONFLICT DO NOTHING"
)
_DECAY = (
    "WITH due AS (SELECT f.tenant_id, f.runtime_class, f.resource FROM fair_usage f "
    "WHERE f.tenant_id = ANY($1::text[]) AND f.runtime_class = ANY($2::text[]) "
    "AND f.at < $4 ORDER BY 1, 2, 3 FOR UPDATE SKIP LOCKED) "
    "UPDATE fair_usage f SET at = $4, decayed = greatest(0, "
    "f.decayed * power(0.5, extract(epoch FROM $4 - f.at) / $3) "
    "+ q.used * (1 - power(0.5, extract(epoch FROM $4 - f.at) / $3))) "
    "FROM due, quota_usage q WHERE (f.tenant_id, f.runtime_class, f.resource) "
    "= (due.tenant_id, due.runtime_class, due.resource) AND (q.tenant_id, q.runtime_class, "
    "q.resource) = (f.tenant_id, f.runtime_class, f.resource)"
)
_READ = (
    "SELECT tenant_id, runtime_class, resource, decayed FROM fair_usage "
    "WHERE tenant_id = ANY($1::text[]) AND runtime_class = ANY($2::text[])"
)


async def fair_usage_decay(
    conn: Connection, *, tenant_ids: Collection[str], runtime_classes: Collection[str],
    half_life_seconds: float, now: datetime,
) -> dict[tuple[str, str], tuple[float, float, float]]:
    """Bring the decayed usage of ``tenant_ids`` in ``runtime_classes`` up to ``now`` and
    return it per (tenant, class), per resource (see the module doc)."""
    if not tenant_ids or not runtime_classes:
        return {}
    tenants, classes = sorted(set(tenant_ids)), sorted(set(runtime_classes))
    await conn.execute(_INSERT, tenants, classes, now)
    await conn.execute(_DECAY, tenants, classes, half_life_seconds, now)
    out: dict[tuple[str, str], list[float]] = {}
    for r in await conn.fetch(_READ, tenants, classes):
        out.setdefault((r[0], r[1]), [0.0, 0.0, 0.0])[RESOURCES.index(r[2])] = float(r[3])
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}
