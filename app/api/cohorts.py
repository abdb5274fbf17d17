"""HTTP API: cohorts — the inner nodes of the quota tree: parent, fair weight and quotas of
their own (admin writes), with usage.

A tenant key reads only the cohorts on its tenants' paths to the root (another is 404, as
if it did not exist); operator and runtime keys are refused. A cohort a tenant names without
being configured reads as a root with no quota. ``PUT`` replaces the settings whole.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request, Response
from pydantic import ConfigDict, Field

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
from app.api.tenants import (
    MAX_WEIGHT,
    MIN_WEIGHT,
    Amounts,
    QuotaFields,
    QuotaView,
    quotas_named,
)
from app.auth import PrincipalDep
from app.ledger.cohorts import MAX_DEPTH
from app.ledger.tenants import Quota
from app.scheduling.spec import RuntimeClass
from app.services import cohorts as service

router = APIRouter(prefix="/v1", tags=["cohorts"], route_class=StrictRoute)

CohortIdPath = Annotated[
    str, Path(alias="cohortId", pattern=ID_PATTERN, description=f"The cohort id: {ID_RULE}.")
]
_EXAMPLE: dict[str, Any] = {
    "parent": "org",
    "fairWeight": 2,
    "quotas": {"gpu-small": {"cpuMillis": {"nominal": 16000, "lendingLimit": 8000}}},
}


class CohortQuotaAmounts(QuotaFields):
    """One resource's quota of a cohort: capacity of its own, lent to its subtree; what it
    lends up to its parent is at most its nominal plus what its members lend it."""


class CohortClassQuotas(RequestModel):
    """The quotas of one runtime class, per resource; a resource left out is not limited."""

    cpu_millis: CohortQuotaAmounts | None = Field(default=None, alias="cpuMillis")
    memory_mib: CohortQuotaAmounts | None = Field(default=None, alias="memoryMiB")
    llm_slots: CohortQuotaAmounts | None = Field(default=None, alias="llmSlots")

    def quotas(self) -> dict[str, Quota]:
        """Return the named resources' quotas by API name."""
        return quotas_named(self)


class CohortSettings(RequestModel):
    """A cohort's settings, replaced whole by putCohort."""

    model_config = ConfigDict(json_schema_extra={"examples": [_EXAMPLE]})

    parent: str | None = Field(
        default=None, pattern=ID_PATTERN,
        description=f"The parent cohort (null: a root); {ID_RULE}. At most {MAX_DEPTH} "
        "cohorts from a root down; a cycle is refused (409).",
    )
    fair_weight: float = Field(
        default=1.0, ge=MIN_WEIGHT, le=MAX_WEIGHT,
        description=f"Weight of the cohort's share among its siblings ({MIN_WEIGHT} to "
        f"{MAX_WEIGHT}).",
    )
    quotas: dict[RuntimeClass, CohortClassQuotas] = Field(
        default_factory=dict, max_length=200, description="Quotas by runtime class."
    )


class CohortClassUsage(CamelModel):
    """A cohort's usage of one runtime class now."""

    used: Amounts = Field(description="What its members draw on it.")
    borrowed: Amounts = Field(description="What of it is above its cap (drawn on its parent).")
    lendable: Amounts = Field(
        description="What of its cap (its nominal plus what its members lend it) is unused.")


class Cohort(CamelModel):
    """A cohort: parent, fair weight, quotas and usage by runtime class."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "id": "research", **_EXAMPLE, "usage": {"gpu-small": {
            "used": {"cpuMillis": 20000, "memoryMiB": 0, "llmSlots": 0},
            "borrowed": {"cpuMillis": 4000, "memoryMiB": 0, "llmSlots": 0},
            "lendable": {"cpuMillis": 0, "memoryMiB": 0, "llmSlots": 0},
        }}, "share": 0.0625, "updatedAt": "2026-12-01T12:00:00Z",
    }]})

    id: str
    parent: str | None
    fair_weight: float
    quotas: dict[str, dict[str, QuotaView]]
    usage: dict[str, CohortClassUsage]
    share: float = Field(
        description="Its dominant borrowed resource (borrowed / its parent's cap, largest "
        "over resources and runtime classes) divided by its fair weight.")
    updated_at: datetime | None = Field(description="Null for a cohort nobody configured.")


class CohortPage(Page[Cohort]):
    """One page of cohorts, by id."""


_SCOPE = "cohorts"



def _quotas(body: CohortSettings) -> dict[str, dict[str, Quota]]:
    return {rc: q.quotas() for rc, q in body.quotas.items()}


@router.get(
    "/cohorts",
    operation_id="listCohorts",
    summary="List cohorts with their quotas and usage",
    response_model=CohortPage,
    responses=problems(400, 401, 403, 422),
)
async def list_cohorts(
    principal: PrincipalDep, request: Request, limit: LimitQuery = 100,
    cursor: CursorQuery = None, tenant: TenantHeader = None,
) -> CohortPage:
    """List cohorts by id: every cohort for an admin; for a tenant key those on its
    tenants' paths to the root (of the one `X-Berth-Tenant` names with that header)."""
    tokens = await request.app.state.tokens.get()
    docs, last = await service.cohorts_page(
        request.app.state.db, principal=principal,
        after=cursor_after_id(tokens, cursor, scope=_SCOPE), limit=limit,
        tenant=tenant,
    )
    return CohortPage(
        items=[Cohort.model_validate(d) for d in docs],
        next_cursor=cursor_encode(tokens, last, scope=_SCOPE) if last else None,
    )


@router.get(
    "/cohorts/{cohortId}",
    operation_id="getCohort",
    summary="Read a cohort's quotas and usage",
    response_model=Cohort,
    responses=problems(400, 401, 403, 404, 422),
)
async def get_cohort(
    cohort_id: CohortIdPath, principal: PrincipalDep, request: Request,
    tenant: TenantHeader = None,
) -> Cohort:
    """Read a cohort: an admin any, a tenant key one on its tenants' paths (another is
    404)."""
    doc = await service.cohort_get(
        request.app.state.db, principal=principal, cohort_id=cohort_id, tenant=tenant
    )
    return Cohort.model_validate(doc)


@router.put(
    "/cohorts/{cohortId}",
    operation_id="putCohort",
    summary="Set a cohort's parent, fair weight and quotas",
    response_model=Cohort,
    responses=problems(400, 401, 403, 409, 413, 422),
)
async def put_cohort(
    cohort_id: CohortIdPath, body: CohortSettings, principal: PrincipalDep, request: Request,
) -> Cohort:
    """Replace the cohort's settings whole (a quota left out is removed); 409 when the
    parent makes a cycle or a tree more than 8 cohorts deep. Admin only."""
    doc = await service.cohort_put(
        request.app.state.db, principal=principal, cohort_id=cohort_id, parent=body.parent,
        fair_weight=body.fair_weight, quotas=_quotas(body), now=datetime.now(UTC),
    )
    return Cohort.model_validate(doc)


@router.delete(
    "/cohorts/{cohortId}",
    operation_id="deleteCohort",
    summary="Delete a cohort without members or children",
    status_code=204,
    response_class=Response,
    responses=problems(400, 401, 403, 404, 409, 422),
)
async def delete_cohort(
    cohort_id: CohortIdPath, principal: PrincipalDep, request: Request,
) -> Response:
    """Delete a configured cohort; 409 while tenants name it or cohorts have it as their
    parent. Admin only."""
    await service.cohort_delete(request.app.state.db, principal=principal,
                                cohort_id=cohort_id, now=datetime.now(UTC))
    return Response(status_code=204)
