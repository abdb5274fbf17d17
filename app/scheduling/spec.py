"""The one validation of a task spec, and its compiled form used by the core.

The HTTP API uses :class:`TaskSpec` as its request body; the reconciler validates the stored
JSON with the same model. :func:`compile_spec` turns a valid spec into an immutable, hashable
:class:`CompiledSpec` that the core reads on its hot path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, NamedTuple

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel

if TYPE_CHECKING:
    from app.scheduling.records import ClaimedTask

__all__ = [
    "Affinity",
    "AffinityTerm",
    "CompiledSpec",
    "CompiledTerm",
    "Constraints",
    "Gang",
    "Resources",
    "StoredSpecs",
    "TaskSpec",
    "compile_spec",
]

#: Bounds that keep a spec small enough to store, index and evaluate cheaply.
MAX_LABELS = 32
MAX_SELECTOR = 16
MAX_TERMS = 8
MAX_REGIONS = 32
MAX_PRIORITY = 1000

LabelKey = Annotated[
    str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9]([A-Za-z0-9._/-]*)$")
]
LabelValue = Annotated[str, StringConstraints(max_length=256)]
Name = Annotated[str, StringConstraints(min_length=1, max_length=64)]
RuntimeClass = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?$")]
Topology = Literal["pool", "failureDomain", "region"]


class _Model(BaseModel):
    # Strict, by camelCase name only: a spec is a request body, and a stored one
    # was written by model_dump(by_alias=True), so it reads back the same way.
    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_alias=True,
        validate_by_name=False,
        extra="forbid",
        frozen=True,
        strict=True,
    )


class Resources(_Model):
    """Requested (or offered) capacity: CPU millicores, memory MiB and LLM slots."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"cpuMillis": 500, "memoryMiB": 1024, "llmSlots": 1}]}
    )

    cpu_millis: int = Field(default=0, ge=0, le=10**9)
    memory_mib: int = Field(default=0, ge=0, le=10**9, alias="memoryMiB")
    llm_slots: int = Field(default=0, ge=0, le=10**6)

    def as_tuple(self) -> tuple[int, int, int]:
        """Return the (cpuMillis, memoryMiB, llmSlots) tuple."""
        return (self.cpu_millis, self.memory_mib, self.llm_slots)


class Constraints(_Model):
    """Hard placement constraints plus the preferred artifact locality."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "regions": ["eu-west-1"],
                    "dataResidency": "eu",
                    "artifactRegion": "eu-west-1",
                    "poolSelector": {"gpu": "a100"},
                }
            ]
        }
    )

    regions: list[Name] | None = Field(default=None, min_length=1, max_length=MAX_REGIONS)
    data_residency: Name | None = None
    artifact_region: Name | None = None
    pool_selector: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=MAX_SELECTOR)


class AffinityTerm(_Model):
    """One affinity term: co-locate with (or, if ``anti``, away from) matching tasks.

    ``weight`` is required on preferred terms and forbidden on required terms.
    """

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"selector": {"app": "web"}, "topology": "failureDomain", "anti": True}]
        }
    )

    selector: dict[LabelKey, LabelValue] = Field(min_length=1, max_length=MAX_SELECTOR)
    topology: Topology = "pool"
    anti: bool = False
    weight: int | None = Field(default=None, ge=1, le=100)


class Affinity(_Model):
    """Required terms filter pools; preferred terms only score them."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "required": [{"selector": {"cohort": "c1"}, "topology": "pool"}],
                    "preferred": [{"selector": {"app": "db"}, "topology": "region", "weight": 50}],
                }
            ]
        }
    )

    required: list[AffinityTerm] = Field(default_factory=list, max_length=MAX_TERMS)
    preferred: list[AffinityTerm] = Field(default_factory=list, max_length=MAX_TERMS)

    @model_validator(mode="after")
    def _check_weights(self) -> Affinity:
        for i, term in enumerate(self.required):
            if term.weight is not None:
                raise ValueError(f"required[{i}].weight: weight applies only to preferred terms")
        for i, term in enumerate(self.preferred):
            if term.weight is None:
                raise ValueError(f"preferred[{i}].weight: a preferred term needs a weight 1..100")
        return self


class Gang(_Model):
    """N identical members placed all-or-nothing, possibly across several pools."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"members": 4, "minPools": 1, "maxPerPool": 2}]}
    )

    members: int = Field(ge=1, le=1024)
    min_pools: int = Field(default=1, ge=1, le=1024)
    max_per_pool: int | None = Field(default=None, ge=1, le=1024)

    @model_validator(mode="after")
    def _check_spread(self) -> Gang:
        if self.min_pools > self.members:
            raise ValueError("minPools cannot exceed members (each pool hosts at least one member)")
        # With k pools the fullest pool holds ceil(members / k); the widest spread allowed by
        # minPools..members must fit under maxPerPool. k = members always gives 1, so any
        # maxPerPool >= 1 leaves a plan; keep the check explicit for readers.
        if self.max_per_pool is not None and -(-self.members // self.members) > self.max_per_pool:
            raise ValueError("no spread of the members satisfies maxPerPool")
        return self


_NO_CONSTRAINTS = Constraints()
_NO_AFFINITY = Affinity()


def _no_constraints() -> Constraints:
    return _NO_CONSTRAINTS


def _no_affinity() -> Affinity:
    return _NO_AFFINITY


class TaskSpec(_Model):
    """A task spec as submitted by a tenant."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "runtimeClass": "python-3.11",
                    "requests": {"cpuMillis": 500, "memoryMiB": 1024, "llmSlots": 0},
                    "constraints": {"regions": ["eu-west-1"], "poolSelector": {"tier": "std"}},
                    "affinity": {
                        "preferred": [
                            {"selector": {"app": "web"}, "topology": "pool", "weight": 10}
                        ]
                    },
                    "priority": 0,
                    "labels": {"app": "web"},
                    "maxAttempts": 3,
                }
            ]
        }
    )

    runtime_class: RuntimeClass
    requests: Resources
    # A spec without them shares one empty instance of each (they are frozen, and nothing
    # changes their dicts and lists): building a fresh one per spec, through its own
    # validation, was about a third of a small spec's validation.
    constraints: Constraints = Field(default_factory=_no_constraints)
    affinity: Affinity = Field(default_factory=_no_affinity)
    gang: Gang | None = None
    priority: int = Field(default=0, ge=-MAX_PRIORITY, le=MAX_PRIORITY)
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=MAX_LABELS)
    max_attempts: int = Field(default=3, ge=1, le=100)
    preemption: Literal["never", "lowerPriority"] = Field(
        default="never",
        description="`lowerPriority`: when the task fits nowhere, it may displace leased tasks "
        "of the same tenant with strictly lower priority (they get a grace period to stop); "
        "`never` (default): it waits.",
    )

    @model_validator(mode="after")
    def _check_requests(self) -> TaskSpec:
        if not any(self.requests.as_tuple()):
            raise ValueError("requests: at least one of cpuMillis, memoryMiB, llmSlots must be > 0")
        return self


# --- compiled form ---------------------------------------------------------------------------

Items = frozenset[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class CompiledTerm:
    """An affinity term as the core reads it: selector items, topology, anti, weight."""

    selector: Items
    topology: str
    anti: bool = False
    weight: int = 0

    def matches(self, labels: Items) -> bool:
        """Return whether a task with ``labels`` matches this term's selector."""
        return self.selector <= labels


class CompiledSpec(NamedTuple):
    """A validated spec compiled once per task: immutable, hashable, cheap to read and to make.

    A tuple: :func:`_bind` makes one per claimed task in a single call, and its fields read as
    fast as slots. ``fingerprint`` and ``placement_class`` are derived from the other fields.
    """

    tenant_id: str
    task_id: str | None
    runtime_class: str
    requests: tuple[int, int, int]
    regions: frozenset[str] | None = None
    data_residency: str | None = None
    artifact_region: str | None = None
    pool_selector: Items = frozenset()
    required: tuple[CompiledTerm, ...] = ()
    preferred: tuple[CompiledTerm, ...] = ()
    labels: Items = frozenset()
    members: int = 1
    min_pools: int = 1
    max_per_pool: int | None = None
    priority: int = 0
    #: Whether the task may displace leased lower-priority tasks of its tenant.
    may_preempt: bool = False
    fingerprint: tuple = ()
    #: What decides which pools pass the filters other than capacity and affinity, and the
    #: static scores (the lean select's class, with the tenant's audience).
    placement_class: tuple = ()

    @property
    def is_gang(self) -> bool:
        """Return whether the spec places more than one member."""
        return self.members > 1 or self.min_pools > 1

    @property
    def total_requests(self) -> tuple[int, int, int]:
        """Return what all members request together."""
        m, (cpu, memory, llm) = self.members, self.requests
        return (cpu * m, memory * m, llm * m)

    @property
    def depends_on_placements(self) -> bool:
        """Return whether feasibility can change when more tasks are placed (positive affinity)."""
        return any(not t.anti for t in self.required)


def _term(term: AffinityTerm) -> CompiledTerm:
    return CompiledTerm(
        selector=frozenset(term.selector.items()),
        topology=term.topology,
        anti=term.anti,
        weight=term.weight or 0,
    )


def compile_spec(spec: TaskSpec, *, tenant_id: str, task_id: str | None = None) -> CompiledSpec:
    """Compile a validated spec into the frozen form the core evaluates."""
    c = spec.constraints
    gang = spec.gang
    members = gang.members if gang else 1
    min_pools = gang.min_pools if gang else 1
    max_per_pool = gang.max_per_pool if gang else None
    requests = spec.requests.as_tuple()
    regions = frozenset(c.regions) if c.regions is not None else None
    selector = frozenset(c.pool_selector.items())
    required = tuple(_term(t) for t in spec.affinity.required)
    preferred = tuple(_term(t) for t in spec.affinity.preferred)
    labels = frozenset(spec.labels.items())
    # Own labels matter to feasibility only through the bootstrap rule of required terms.
    own = labels if required else frozenset()
    fingerprint = (
        tenant_id,
        spec.runtime_class,
        requests,
        regions,
        c.data_residency,
        selector,
        required,
        own,
        (members, min_pools, max_per_pool),
    )
    return CompiledSpec(
        tenant_id=tenant_id,
        task_id=task_id,
        runtime_class=spec.runtime_class,
        requests=requests,
        regions=regions,
        data_residency=c.data_residency,
        artifact_region=c.artifact_region,
        pool_selector=selector,
        required=required,
        preferred=preferred,
        labels=labels,
        members=members,
        min_pools=min_pools,
        max_per_pool=max_per_pool,
        priority=spec.priority,
        may_preempt=spec.preemption == "lowerPriority",
        fingerprint=fingerprint,
        placement_class=(
            spec.runtime_class, regions, c.data_residency, selector, c.artifact_region
        ),
    )


_LABELS: TypeAdapter[dict[str, str]] = TypeAdapter(
    Annotated[dict[LabelKey, LabelValue], Field(max_length=MAX_LABELS)],
    config=ConfigDict(strict=True),
)


class StoredSpecs:
    """Compile stored spec texts, validating each spec **class** once rather than each text.

    Specs differ mostly in their requests and labels. The rest of a spec (runtime class,
    constraints, affinity, gang, priority, attempts, preemption) is its class: the first text
    of a class is validated whole by :class:`TaskSpec` and compiled; a later text of the same
    class (from any tenant) only has its requests and labels validated (by the same field types and
    the same at-least-one-request rule) and takes the class's compiled form with them. Any
    doubt (a part missing, a value the parts' validators refuse) falls back to validating the
    text whole, so an invalid text raises exactly what :class:`TaskSpec` raises. Compiled
    specs have no ``task_id``: they are shared by the tasks of equal texts.

    Texts are kept by text alone: validation does not read the tenant, and equal texts of
    other tenants are common (in the bench mix about 40% of claimed tasks repeat a text seen
    shortly before, 2% a tenant and text), so another tenant's text is rebound, not parsed.
    """

    __slots__ = ("kept", "_texts", "_classes", "_parts")

    def __init__(self, kept: int = 4096) -> None:
        self.kept = kept
        self._texts: dict[str, CompiledSpec] = {}
        self._classes: dict[str, CompiledSpec] = {}
        #: Requests and labels validated, by their JSON text (exact: ``1``, ``1.0`` and
        #: ``true`` are different texts), with what the validators made of them.
        self._parts: dict[bytes, Any] = {}

    def __len__(self) -> int:
        return len(self._texts)

    def compile(self, tenant_id: str, text: str) -> CompiledSpec:
        """Return the compiled spec of a stored spec text; raise as :class:`TaskSpec` does."""
        hit = self._texts.get(text)
        if hit is None:
            if len(self._texts) >= self.kept:
                self._texts.clear()
            hit = self._texts[text] = self._compile(tenant_id, text)
        elif hit.tenant_id != tenant_id:
            return _bind(hit, tenant_id, hit.requests, hit.labels)
        return hit

    def compile_all(
        self, tasks: Sequence[ClaimedTask]
    ) -> tuple[list[tuple[ClaimedTask, CompiledSpec]], list[tuple[ClaimedTask, str]]]:
        """Return the tasks whose stored specs compile, with their specs, and the others with
        the first line of why, both in the tasks' order."""
        compiled: list[tuple[ClaimedTask, CompiledSpec]] = []
        invalid: list[tuple[ClaimedTask, str]] = []
        compile_, add = self.compile, compiled.append
        for task in tasks:
            try:
                add((task, compile_(task.tenant_id, task.spec_json)))
            except (ValidationError, ValueError, TypeError) as exc:
                invalid.append((task, str(exc).splitlines()[0][:200]))
        return compiled, invalid

    def _compile(self, tenant_id: str, text: str) -> CompiledSpec:
        try:
            body = orjson.loads(text)
            requests = body.pop("requests")
            labels = body.pop("labels", {})
            # As text: orjson's bytes keep the 4 KiB buffer they were written in.
            cls_key = orjson.dumps(body, option=orjson.OPT_SORT_KEYS).decode()
        except (orjson.JSONDecodeError, TypeError, AttributeError, KeyError):
            return compile_spec(TaskSpec.model_validate_json(text), tenant_id=tenant_id)
        shape = self._classes.get(cls_key)
        if shape is not None:
            req = self._part(b"r", requests, _requests)
            own = self._part(b"l", labels, _labels)
            if req is not None and own is not None and any(req):
                return _bind(shape, tenant_id, req, own)
        compiled = compile_spec(TaskSpec.model_validate_json(text), tenant_id=tenant_id)
        if len(self._classes) >= self.kept:
            self._classes.clear()
        self._classes[cls_key] = compiled
        return compiled


    def _part(self, kind: bytes, value: object, validate: Callable[[object], Any]) -> Any:
        """Return ``validate(value)``, computed once per JSON text of ``value``."""
        key = kind + orjson.dumps(value)
        parts = self._parts
        hit = parts.get(key, _UNSEEN)
        if hit is _UNSEEN:
            if len(parts) >= self.kept:
                parts.clear()
            hit = parts[key] = validate(value)
        return hit


_UNSEEN = object()
_NO_LABELS: Items = frozenset()


def _requests(requests: object) -> tuple[int, int, int] | None:
    """Return ``requests`` as :class:`Resources` validates them, as a tuple, or None when it
    refuses them."""
    try:
        return Resources.model_validate(requests).as_tuple()
    except ValidationError:
        return None


def _labels(labels: object) -> Items | None:
    """Return ``labels`` as :data:`LabelKey` and :data:`LabelValue` validate them, as items,
    or None when they refuse them."""
    try:
        return frozenset(_LABELS.validate_python(labels).items())
    except ValidationError:
        return None


def _bind(
    shape: CompiledSpec, tenant_id: str, requests: tuple[int, int, int], labels: Items
) -> CompiledSpec:
    """Return ``shape`` (a compiled spec of the same class) for this tenant, with these
    requests and labels: one tuple made in one call (a spec is bound per claimed task)."""
    (_, _, runtime_class, _, regions, data_residency, artifact_region, pool_selector, required,
     preferred, _, members, min_pools, max_per_pool, priority, may_preempt, fp,
     placement_class) = shape
    own = labels if required else _NO_LABELS
    return _NEW(CompiledSpec, (
        tenant_id, None, runtime_class, requests, regions, data_residency, artifact_region,
        pool_selector, required, preferred, labels, members, min_pools, max_per_pool, priority,
        may_preempt, (tenant_id, fp[1], requests, fp[3], fp[4], fp[5], fp[6], own, fp[8]),
        placement_class,
    ))


_NEW = tuple.__new__
#: The fields :func:`_bind` unpacks and makes, in order: every field of :class:`CompiledSpec`.
_BOUND = (
    "tenant_id", "task_id", "runtime_class", "requests", "regions", "data_residency",
    "artifact_region", "pool_selector", "required", "preferred", "labels", "members",
    "min_pools", "max_per_pool", "priority", "may_preempt", "fingerprint", "placement_class",
)
if CompiledSpec._fields != _BOUND:  # pragma: no cover
    raise ImportError("CompiledSpec's fields changed: _bind must make each of them")
