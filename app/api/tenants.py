"""HTTP API: tenants — cohort, fair weight and quotas (admin writes), with usage.

A tenant key reads only its own tenants (another tenant is 404, as if it did not exist);
operator and runtime keys are refused. A tenant nobody configured reads as the defaults
(cohort ``default``, fair weight 1, no quota). ``PUT`` replaces the tenant's settings whole.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from pydantic import ConfigDict, Field, model_validator

from app.api.bodies import StrictRoute
from app.api.common import (
    ID_PATTERN,
    ID_RULE,
    CamelModel,
    CursorQuery,
    LimitQuery,
    Page,
    RequestModel,
    cursor_after_id,
    cursor_encode,
    problems,
)
from app.api.tasks import TenantHeader
from app.auth import PrincipalDep
from app.ledger.tenants import DEFAULT_COHORT, Quota
from app.scheduling.spec import RuntimeClass
from app.services import tenants as service

router = APIRouter(prefix="/v1", tags=["tenants"], route_class=StrictRoute)

#: Largest quota amount (the largest integer a JSON client reads exactly).
MAX_AMOUNT = 2**53
#: The range of a fair weight.
MIN_WEIGHT = 0.001
MAX_WEIGHT = 1000.0
TenantIdPath = Annotated[
    str, Path(alias="tenantId", pattern=ID_PATTERN, description=f"The tenant id: {ID_RULE}.")
]
_EXAMPLE: dict[str, Any] = {
    "cohort": "research",
    "fairWeight": 2,
    "quotas": {"gpu-small": {
        "cpuMillis": {"nominal": 8000, "borrowingLimit": 4000, "lendingLimit": 2000},
        "llmSlots": {"nominal": 4},
    }},
}


class QuotaFields(RequestModel):
    """One resource's quota: guaranteed, and how far it may borrow and lend."""

    nominal: int = Field(ge=0, le=MAX_AMOUNT, description="Guaranteed to the tenant.")
    borrowing_limit: int | None = Field(
        default=None, ge=0, le=MAX_AMOUNT,
        description="Most it may use above nominal; null: no limit but its cohort's.",
    )
    lending_limit: int | None = Field(
        default=None, ge=0, le=MAX_AMOUNT,
        description="Most of its unused nominal others may borrow (at most nominal); "
        "null: all of it.",
    )

    def quota(self) -> Quota:
        """Return the ledger's value."""
        return Quota(self.nominal, self.borrowing_limit, self.lending_limit)


class QuotaAmounts(QuotaFields):
    """One resource's quota of a tenant: it lends only from its own nominal."""

    @model_validator(mode="after")
    def _lending_within_nominal(self) -> QuotaAmounts:
        if self.lending_limit is not None and self.lending_limit > self.nominal:
            raise ValueError(
                f"lendingLimit {self.lending_limit} is above nominal {self.nominal}: a "
                "tenant lends only from its own nominal"
            )
        return self


class ClassQuotas(RequestModel):
    """The quotas of one runtime class, per resource; a resource left out is not limited."""

    cpu_millis: QuotaAmounts | None = Field(default=None, alias="cpuMillis")
    memory_mib: QuotaAmounts | None = Field(default=None, alias="memoryMiB")
    llm_slots: QuotaAmounts | None = Field(default=None, alias="llmSlots")

    def quotas(self) -> dict[str, Quota]:
        """Return the named resources' quotas by API name."""
        return quotas_named(self)


def quotas_named(model: Any) -> dict[str, Quota]:
    """Return the quotas a class's quotas model names, by resource API name."""
    pairs = (("cpuMillis", model.cpu_millis), ("memoryMiB", model.memory_mib),
             ("llmSlots", model.llm_slots))
    return {name: q.quota() for name, q in pairs if q is not None}


class TenantSettings(RequestModel):
    """A tenant's settings, replaced whole by putTenant."""

    model_config = ConfigDict(json_schema_extra={"examples": [_EXAMPLE]})

    cohort: str = Field(
        default=DEFAULT_COHORT, pattern=ID_PATTERN,
        description=f"Tenants of one cohort lend each other their unused quota; {ID_RULE}.",
    )
    fair_weight: float = Field(
        default=1.0, ge=MIN_WEIGHT, le=MAX_WEIGHT,
        description=f"Weight of the tenant's share under the `fair` policy "
        f"({MIN_WEIGHT} to {MAX_WEIGHT}).",
    )
    quotas: dict[RuntimeClass, ClassQuotas] = Field(
        default_factory=dict, max_length=200, description="Quotas by runtime class."
    )


class Amounts(CamelModel):
    """An amount per resource."""

    model_config = ConfigDict(populate_by_name=True)

    cpu_millis: int | None = Field(alias="cpuMillis")
    memory_mib: int | None = Field(alias="memoryMiB")
    llm_slots: int | None = Field(alias="llmSlots")


class QuotaView(CamelModel):
    """One resource's quota as stored."""

    nominal: int
    borrowing_limit: int | None
    lending_limit: int | None


class ClassUsage(CamelModel):
    """A tenant's usage of one runtime class now."""

    used: Amounts = Field(description="Sum of the requests of its live leases.")
    borrowed: Amounts = Field(description="What of it is above nominal.")
    borrowable: Amounts = Field(
        description="What it could borrow above nominal now: its cohort's unused lendable "
        "quota, within its borrowing limit; null where no quota names the resource."
    )


class Tenant(CamelModel):
    """A tenant: cohort, fair weight, quotas and usage by runtime class."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "id": "acme", **_EXAMPLE, "usage": {"gpu-small": {
            "used": {"cpuMillis": 9000, "memoryMiB": 0, "llmSlots": 2},
            "borrowed": {"cpuMillis": 1000, "memoryMiB": 0, "llmSlots": 0},
            "borrowable": {"cpuMillis": 3000, "memoryMiB": None, "llmSlots": 6},
        }}, "path": ["research", "org"], "share": 0.125, "updatedAt": "2026-12-01T12:00:00Z",
    }]})

    id: str
    cohort: str
    fair_weight: float
    quotas: dict[str, dict[str, QuotaView]]
    usage: dict[str, ClassUsage]
    path: list[str] = Field(description="The cohort ids from its cohort to the root.")
    share: float = Field(
        description="Its dominant borrowed resource (borrowed / what its cohort pools, "
        "largest over resources and runtime classes) divided by its fair weight.")
    updated_at: datetime | None = Field(description="Null for a tenant nobody configured.")


class TenantPage(Page[Tenant]):
    """One page of tenants, by id."""


#: The list scope of tenant cursors.
_SCOPE = "tenants"



def _tenant(doc: dict[str, Any]) -> Tenant:
    return Tenant.model_validate(doc)


@router.get(
    "/tenants",
    operation_id="listTenants",
    summary="List tenants with their quotas and usage",
    response_model=TenantPage,
    responses=problems(400, 401, 403, 422),
)
async def list_tenants(
    principal: PrincipalDep, request: Request, limit: LimitQuery = 100,
    cursor: CursorQuery = None, tenant: TenantHeader = None,
) -> TenantPage:
    """List tenants by id: every configured tenant for an admin, its own for a tenant key;
    only the one `X-Berth-Tenant` names with that header."""
    tokens = await request.app.state.tokens.get()
    docs, last = await service.tenants_page(
        request.app.state.db, principal=principal,
        after=cursor_after_id(tokens, cursor, scope=_SCOPE), limit=limit,
        tenant=tenant,
    )
    return TenantPage(
        items=[_tenant(d) for d in docs],
        next_cursor=cursor_encode(tokens, last, scope=_SCOPE) if last else None,
    )


@router.get(
    "/tenants/{tenantId}",
    operation_id="getTenant",
    summary="Read a tenant's quotas and usage",
    response_model=Tenant,
    responses=problems(400, 401, 403, 404, 422),
)
async def get_tenant(
    tenant_id: TenantIdPath, principal: PrincipalDep, request: Request,
    tenant: TenantHeader = None,
) -> Tenant:
    """Read a tenant: an admin any, a tenant key its own (another is 404, and so is one
    other than the `X-Berth-Tenant` header names)."""
    doc = await service.tenant_get(
        request.app.state.db, principal=principal, tenant_id=tenant_id, tenant=tenant
    )
    return _tenant(doc)


@router.put(
    "/tenants/{tenantId}",
    operation_id="putTenant",
    summary="Set a tenant's cohort, fair weight and quotas",
    response_model=Tenant,
    responses=problems(400, 401, 403, 409, 413, 422),
)
async def put_tenant(
    tenant_id: TenantIdPath, body: TenantSettings, principal: PrincipalDep, request: Request,
    tenant: TenantHeader = None,
) -> Tenant:
    """Replace the tenant's settings whole (a quota left out is removed); 409 when a new
    quota is below what the tenant uses now; 400 when `X-Berth-Tenant` names another
    tenant. Admin only."""
    doc = await service.tenant_put(
        request.app.state.db,
        principal=principal,
        tenant_id=tenant_id,
        tenant=tenant,
        cohort=body.cohort,
        fair_weight=body.fair_weight,
        quotas={rc: q.quotas() for rc, q in body.quotas.items()},
        now=datetime.now(UTC),
    )
    return _tenant(doc)
