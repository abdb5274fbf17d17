"""``berth tenants list|get|set``: tenants' cohorts, fair weights and quotas on the
configured database (the rules of ``PUT /v1/tenants/{tenantId}``, as an admin).

A quota is written ``CLASS:RESOURCE=NOMINAL[:BORROWING_LIMIT[:LENDING_LIMIT]]``, e.g.
``gpu-small:cpuMillis=8000:4000`` (an empty limit is no limit); ``set`` replaces the
tenant's settings whole, as the API does.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from app.api.common import ID_PATTERN, ID_RULE
from app.api.tenants import TenantSettings
from app.auth import Principal
from app.config import get_settings
from app.db import Database
from app.errors import ConfigurationError
from app.keys_cli import database_run
from app.services import tenants as service
from app.startup import settings_for

#: Tenants listed per query by ``berth tenants list`` (it prints every page).
_PAGE = 500
_ADMIN = Principal(subject="berth-cli", role="admin", tenant_ids=frozenset(),
                   runtime_instance_ids=frozenset())


def _quota(text: str) -> tuple[str, str, dict[str, int | None]]:
    """Parse ``CLASS:RESOURCE=NOMINAL[:BORROWING[:LENDING]]``."""
    try:
        where, amounts = text.split("=", 1)
        rc, resource = where.split(":", 1)
        parts = amounts.split(":")
        if not 1 <= len(parts) <= 3:
            raise ValueError
        numbers = [int(p) if p != "" else None for p in parts] + [None] * (3 - len(parts))
    except ValueError:
        raise ConfigurationError(
            f"--quota {text!r}: write CLASS:RESOURCE=NOMINAL[:BORROWING_LIMIT[:LENDING_LIMIT]], "
            "e.g. gpu-small:cpuMillis=8000:4000"
        ) from None
    return rc, resource, {"nominal": numbers[0], "borrowingLimit": numbers[1],
                          "lendingLimit": numbers[2]}


def set_tenant(
    *, tenant_id: str, cohort: str, fair_weight: float, quotas: Sequence[str],
    data_dir: str | Path | None = None,
) -> int:
    """Replace a tenant's cohort, fair weight and quotas; print the tenant as JSON."""
    if not re.fullmatch(ID_PATTERN, tenant_id):
        raise ConfigurationError(f"tenant id {tenant_id!r}: must be {ID_RULE}")
    body: dict[str, Any] = {"cohort": cohort, "fairWeight": fair_weight, "quotas": {}}
    for text in quotas:
        rc, resource, amounts = _quota(text)
        body["quotas"].setdefault(rc, {})[resource] = amounts
    try:
        parsed = TenantSettings.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise ConfigurationError(f"{where}: {first['msg']}") from None
    settings = settings_for(get_settings(), data_dir)

    async def work(db: Database) -> dict[str, Any]:
        return await service.tenant_put(
            db, principal=_ADMIN, tenant_id=tenant_id, cohort=parsed.cohort,
            fair_weight=parsed.fair_weight,
            quotas={rc: q.quotas() for rc, q in parsed.quotas.items()},
            now=datetime.now(UTC),
        )

    doc, where = database_run(settings, work)
    print(f"berth: set tenant {tenant_id} on {where}:", flush=True)
    print(orjson.dumps(doc, default=str, option=orjson.OPT_INDENT_2).decode(), flush=True)
    return 0


def get_tenant(*, tenant_id: str, data_dir: str | Path | None = None) -> int:
    """Print a tenant's settings and usage as JSON."""
    settings = settings_for(get_settings(), data_dir)

    async def work(db: Database) -> dict[str, Any]:
        return await service.tenant_get(db, principal=_ADMIN, tenant_id=tenant_id)

    doc, _ = database_run(settings, work)
    print(orjson.dumps(doc, default=str, option=orjson.OPT_INDENT_2).decode(), flush=True)
    return 0


def list_tenants(*, data_dir: str | Path | None = None) -> int:
    """Print every configured tenant as a table: id, cohort, weight, quotas."""
    settings = settings_for(get_settings(), data_dir)

    async def work(db: Database) -> list[dict[str, Any]]:
        docs: list[dict[str, Any]] = []
        after = None
        while True:
            page, after = await service.tenants_page(
                db, principal=_ADMIN, after=after, limit=_PAGE)
            docs.extend(page)
            if after is None:
                return docs

    docs, _ = database_run(settings, work)
    table = [("TENANT", "COHORT", "WEIGHT", "QUOTAS")]
    for d in docs:
        quotas = " ".join(
            f"{rc}:{res}={q['nominal']}:{q['borrowingLimit'] or ''}:{q['lendingLimit'] or ''}"
            .rstrip(":")
            for rc, by in sorted(d["quotas"].items()) for res, q in sorted(by.items())
        )
        table.append((d["id"], d["cohort"], f"{d['fairWeight']:g}", quotas or "-"))
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    for line in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
    return 0
