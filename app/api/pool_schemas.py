"""Request and response bodies of the pool API, in camelCase JSON."""

from __future__ import annotations

import math
import re
import uuid
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    AwareDatetime,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    StringConstraints,
    field_validator,
    model_validator,
)

from app.api.common import CamelModel, Page, RequestModel
from app.ledger.pools import PoolRecord, PoolViewer
from app.scheduling.spec import LabelKey, LabelValue, RuntimeClass
from app.services.pools import MAX_LABELS

POOL_ID_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
POOL_ID_RE = re.compile(POOL_ID_PATTERN)
MAX_LIST = 256
MAX_TOTAL = 10**12

PoolId = Annotated[str, StringConstraints(pattern=POOL_ID_PATTERN)]
Name = Annotated[str, StringConstraints(min_length=1, max_length=128)]
OptionalName = Annotated[str, StringConstraints(max_length=128)]
Reason = Annotated[str, StringConstraints(min_length=1, max_length=512)]

_RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$"
)


def _rfc3339_text(value: Any) -> Any:
    """Let only RFC 3339 text through to the datetime parser (no Unix times, no dates)."""
    if isinstance(value, str) and _RFC3339.match(value):
        return value
    raise ValueError("must be an RFC 3339 date-time with an offset, e.g. 2030-01-01T12:00:00Z")


#: A date-time in a request: RFC 3339 text with an offset, nothing else (strict models parse
#: no text at all into a datetime, so this one field is lax behind its own check).
Rfc3339 = Annotated[AwareDatetime, Strict(False), BeforeValidator(_rfc3339_text)]


class PoolStatus(StrEnum):
    """Operator intent: ACTIVE takes new placements; CORDONED and DRAINING keep leases only."""

    ACTIVE = "ACTIVE"
    CORDONED = "CORDONED"
    DRAINING = "DRAINING"


class Capacity(RequestModel):
    """Ledger amounts of one pool: CPU millicores, memory MiB and LLM slots."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"cpuMillis": 16000, "memoryMiB": 65536, "llmSlots": 8}]}
    )

    cpu_millis: int = Field(ge=0, le=MAX_TOTAL, description="CPU millicores.")
    memory_mib: int = Field(ge=0, le=MAX_TOTAL, alias="memoryMiB", description="Memory in MiB.")
    llm_slots: int = Field(ge=0, le=MAX_TOTAL, description="Concurrent LLM slots.")

    def as_tuple(self) -> tuple[int, int, int]:
        """Return (cpuMillis, memoryMiB, llmSlots)."""
        return (self.cpu_millis, self.memory_mib, self.llm_slots)

    @classmethod
    def of(cls, amounts: tuple[int, int, int] | None) -> Capacity | None:
        """Return the amounts as a Capacity, or None for a missing ledger."""
        if amounts is None:
            return None
        return cls.model_validate(
            {"cpuMillis": amounts[0], "memoryMiB": amounts[1], "llmSlots": amounts[2]}
        )


def _unique(values: list[str] | None) -> list[str] | None:
    """Return ``values`` without repeats, in their first order."""
    return None if values is None else list(dict.fromkeys(values))


_UNIQUE_LISTS = ("tenant_ids", "artifact_regions", "operators")


def _cost_weight_finite(value: float | None) -> float | None:
    if value is not None and not math.isfinite(value):
        raise ValueError("costWeight must be a finite number")
    return value


class PoolCreate(RequestModel):
    """A new pool: identity, who may use and operate it, and its placement keys."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": "eu-gpu-1",
                    "tenantIds": ["acme"],
                    "runtimeClass": "python-3.11",
                    "runtimeInstanceId": "rt-eu-1",
                    "region": "eu-west-1",
                    "dataResidency": "eu",
                    "failureDomain": "eu-west-1a",
                    "labels": {"tier": "std", "gpu": "a100"},
                    "artifactRegions": ["eu-west-1"],
                    "costWeight": 1.0,
                    "operators": ["ops-eu"],
                    "ready": True,
                }
            ]
        }
    )

    id: PoolId = Field(description="Caller-chosen slug: lowercase letters, digits and dashes.")
    tenant_ids: list[Name] = Field(
        default_factory=list, max_length=MAX_LIST, description="Tenants that may use the pool."
    )
    runtime_class: RuntimeClass = Field(description="What kind of runtime the pool offers.")
    runtime_instance_id: Name = Field(description="The runtime instance that runs the leases.")
    region: Name
    data_residency: OptionalName = ""
    failure_domain: OptionalName = ""
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=MAX_LABELS)
    artifact_regions: list[Name] = Field(default_factory=list, max_length=MAX_LIST)
    cost_weight: float = Field(default=1.0, ge=0, le=1e6, description="Lower is cheaper.")
    operators: list[Name] = Field(
        default_factory=list,
        max_length=MAX_LIST,
        description="Subjects allowed to cordon, drain and activate the pool.",
    )
    ready: bool = Field(default=True, description="The operator's static readiness flag.")

    @field_validator(*_UNIQUE_LISTS)
    @classmethod
    def _dedupe(cls, values: list[str]) -> list[str] | None:
        return _unique(values)

    @model_validator(mode="after")
    def _finite(self) -> PoolCreate:
        _cost_weight_finite(self.cost_weight)
        return self

    def fields(self) -> dict[str, Any]:
        """Return the stored columns of the new pool (without its id)."""
        return self.model_dump(exclude={"id"})


class PoolPatch(RequestModel):
    """A JSON merge patch (RFC 7396) of a pool: absent fields stay; in ``labels`` a null value
    removes that label. Status and capacity have their own operations."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"labels": {"gpu": None, "tier": "gold"}, "ready": False}]}
    )

    tenant_ids: list[Name] | None = Field(default=None, max_length=MAX_LIST)
    runtime_class: RuntimeClass | None = None
    runtime_instance_id: Name | None = None
    region: Name | None = None
    data_residency: OptionalName | None = None
    failure_domain: OptionalName | None = None
    labels: dict[LabelKey, LabelValue | None] | None = Field(default=None, max_length=MAX_LABELS)
    artifact_regions: list[Name] | None = Field(default=None, max_length=MAX_LIST)
    cost_weight: float | None = Field(default=None, ge=0, le=1e6)
    operators: list[Name] | None = Field(default=None, max_length=MAX_LIST)
    ready: bool | None = None

    @field_validator(*_UNIQUE_LISTS)
    @classmethod
    def _dedupe(cls, values: list[str] | None) -> list[str] | None:
        return _unique(values)

    @model_validator(mode="after")
    def _no_nulls(self) -> PoolPatch:
        for name in self.model_fields_set:
            if getattr(self, name) is None:
                alias = type(self).model_fields[name].alias or name
                raise ValueError(f"{alias} cannot be null; omit it to leave it unchanged")
        _cost_weight_finite(self.cost_weight)
        return self

    def changes(self) -> dict[str, Any]:
        """Return the columns to replace (every set field except ``labels``)."""
        return {name: getattr(self, name) for name in self.model_fields_set - {"labels"}}

    def label_changes(self) -> dict[str, str | None]:
        """Return the labels to set (string) or remove (None)."""
        return dict(self.labels or {})


class StatusChange(RequestModel):
    """Optional body of cordon and activate: why the status changes."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"reason": "kernel upgrade"}]})

    reason: Reason | None = None


class DrainRequest(RequestModel):
    """Optional body of drain: why, and when remaining leases are revoked (RFC 3339, future)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"reason": "decommission", "deadline": "2030-01-01T12:00:00Z"}]
        }
    )

    reason: Reason | None = None
    deadline: Rfc3339 | None = Field(
        default=None,
        description="When it passes, remaining leases are revoked and their tasks requeued.",
    )


class DrainProgress(CamelModel):
    """How far a drain has got."""

    leases_left: int = Field(
        description="Live leases still on the pool (only the caller's own when usageScope is "
        "own)."
    )


class Pool(CamelModel):
    """A pool with its ledger view, health and operator status."""

    id: str
    tenant_ids: list[str] = Field(
        description="Tenants that may use the pool (a tenant caller sees only its own)."
    )
    runtime_class: str
    runtime_instance_id: str
    region: str
    data_residency: str
    failure_domain: str
    labels: dict[str, str]
    artifact_regions: list[str]
    cost_weight: float
    operators: list[str]
    status: PoolStatus
    status_reason: str | None
    drain_deadline: datetime | None
    drain_progress: DrainProgress | None = Field(description="Set while the pool is DRAINING.")
    ready: bool
    capacity: Capacity | None = Field(description="Ledger totals; null until registered.")
    reserved: Capacity | None = Field(
        description="Reserved capacity: the pool's total for an admin, the pool's operators "
        "and its runtime; only the caller's own tenants' share for anyone else (usageScope)."
    )
    available: Capacity | None = Field(
        description="The pool's free capacity (capacity minus everything reserved), for every "
        "caller."
    )
    usage_scope: Literal["pool", "own"] = Field(
        description="Whether reserved and activeLeases are the pool's totals (pool) or only "
        "the caller's own tenants' (own)."
    )
    healthy: bool = Field(
        description="ready, heartbeat fresh and ledger registered: the pool can take work."
    )
    last_heartbeat_at: datetime | None
    active_leases: int = Field(
        description="Live leases on the pool: all of them, or the caller's own (usageScope)."
    )
    version: int
    etag: str
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(
        cls, record: PoolRecord, *, viewer: PoolViewer, now: datetime, freshness_seconds: float
    ) -> Pool:
        """Return the API view of ``record`` for ``viewer``."""
        tenant_ids = list(record.tenant_ids)
        operates = viewer.role == "operator" and viewer.subject in record.operators
        if viewer.role != "admin" and not operates:
            # A shared pool must not tell one tenant which other tenants use it.
            tenant_ids = [t for t in tenant_ids if t in viewer.tenant_ids]
        return cls(
            id=record.id,
            tenant_ids=tenant_ids,
            runtime_class=record.runtime_class,
            runtime_instance_id=record.runtime_instance_id,
            region=record.region,
            data_residency=record.data_residency,
            failure_domain=record.failure_domain,
            labels=record.labels,
            artifact_regions=list(record.artifact_regions),
            cost_weight=record.cost_weight,
            operators=list(record.operators),
            status=PoolStatus(record.status),
            status_reason=record.status_reason,
            drain_deadline=record.drain_deadline,
            drain_progress=DrainProgress(leases_left=record.active_leases)
            if record.status == PoolStatus.DRAINING
            else None,
            ready=record.ready,
            capacity=Capacity.of(record.capacity),
            reserved=Capacity.of(record.reserved),
            available=Capacity.of(record.available),
            healthy=record.healthy(now=now, freshness_seconds=freshness_seconds),
            last_heartbeat_at=record.last_heartbeat_at,
            active_leases=record.active_leases,
            usage_scope=record.usage_scope,  # type: ignore[arg-type]
            version=record.version,
            etag=etag_of(record.version),
            created_at=record.created_at,
            updated_at=record.updated_at,
        )


def etag_of(version: int) -> str:
    """Return the ETag of a pool at ``version``."""
    return f'"{version}"'


def if_match_versions(header: str) -> set[int] | None:
    """Return the versions an If-Match header accepts, or None for ``*`` (any)."""
    versions: set[int] = set()
    for raw in header.split(","):
        tag = raw.strip()
        if tag == "*":
            return None
        if tag.startswith("W/"):
            tag = tag[2:]
        tag = tag.strip('"')
        if tag.isdigit():
            versions.add(int(tag))
    return versions


class PoolPage(Page[Pool]):
    """One page of pools, in pool id order."""

    watch_cursor: str | None = Field(
        default=None, description="Watch from here (`GET /v1/watch?after=`) to follow every "
        "change after this list.")


class DrainMember(CamelModel):
    """Members of a moved task on one pool."""

    pool_id: str
    count: int


class DrainReason(CamelModel):
    """Why a task would not be placed now: the pending reason a pass would record."""

    code: str = Field(description="The closest-miss reason code (docs/scheduling.md), or "
                      "`attempts_exhausted` when revoking the lease would fail the task.")
    message: str
    rejections: dict[str, int] = Field(
        default_factory=dict, description="How many pools each reason code rejected."
    )


class DrainPreviewItem(CamelModel):
    """One live lease of the pool and where its task would go if the lease were revoked now."""

    task_id: uuid.UUID
    lease_id: uuid.UUID
    tenant_id: str
    pool_id: str | None = Field(
        description="The pool the task (its first member, for a gang) would be placed on "
        "now, among the pools the caller can see; null when it would wait (see reason) or "
        "go only to pools the caller cannot see (see membersElsewhere)."
    )
    members: list[DrainMember] = Field(
        description="Every member's pool and count on the pools the caller can see (a gang "
        "moves as a unit); empty when it would wait."
    )
    members_elsewhere: int = Field(
        description="Members that would go to pools the caller cannot see (counted, never "
        "named)."
    )
    reason: DrainReason | None = Field(description="Why the task would wait; null when placed.")


class DrainDestination(CamelModel):
    """How many of the moving leases would go to one pool."""

    pool_id: str
    leases: int


class DrainWaiting(CamelModel):
    """How many of the moving leases would wait for one reason."""

    code: str
    leases: int


class DrainSummary(CamelModel):
    """Where every live lease of the pool would go, in numbers."""

    leases: int = Field(description="Live leases of the pool: all of them would be revoked.")
    placed: int = Field(description="Leases whose task would be placed again now.")
    waiting: int = Field(description="Leases whose task would wait (or fail).")
    destinations: list[DrainDestination] = Field(
        description="Per pool the caller can see, the leases whose task would go there "
        "(a gang counts once on each of its pools), most first."
    )
    to_pools_not_shown: int = Field(
        description="Leases whose task would go, in part or whole, to pools the caller "
        "cannot see."
    )
    waiting_by_reason: list[DrainWaiting] = Field(
        description="The waiting leases by reason code, most first."
    )


class DrainPreview(CamelModel):
    """What draining the pool would do now: the summary of every live lease, and one page
    of them. Nothing is reserved."""

    summary: DrainSummary
    items: list[DrainPreviewItem] = Field(
        description="One item per live lease, `limit` at most, in lease order."
    )
    next_cursor: str | None = Field(
        description="The cursor of the next page of items (null on the last)."
    )
