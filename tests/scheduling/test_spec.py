"""The one validation of a task spec, and its compiled form."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.scheduling.spec import TaskSpec, compile_spec

BASE = {"runtimeClass": "python-3.11", "requests": {"cpuMillis": 500}}


def body(**kw):
    return {**BASE, **kw}


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(BASE, id="minimal"),
        pytest.param(body(requests={"cpuMillis": 0, "memoryMiB": 1, "llmSlots": 0}), id="memory"),
        pytest.param(body(gang={"members": 4, "minPools": 2, "maxPerPool": 2}), id="gang"),
        pytest.param(
            body(
                affinity={
                    "required": [{"selector": {"a": "b"}, "topology": "region"}],
                    "preferred": [{"selector": {"a": "b"}, "weight": 100}],
                }
            ),
            id="affinity",
        ),
        pytest.param(TaskSpec.model_json_schema()["examples"][0], id="schema-example"),
    ],
)
def test_valid_specs(data):
    TaskSpec.model_validate(data)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param({"requests": {"cpuMillis": 1}}, id="no-runtime-class"),
        pytest.param(body(runtimeClass="Python 3"), id="bad-runtime-class"),
        pytest.param(body(runtimeClass="-x"), id="runtime-class-leading-dash"),
        pytest.param(body(requests={"cpuMillis": -1}), id="negative-request"),
        pytest.param(body(requests={"cpuMillis": 0}), id="all-zero-requests"),
        pytest.param(body(requests={"cpu": 1}), id="unknown-request-field"),
        pytest.param(body(unknown=1), id="unknown-top-level-field"),
        pytest.param(body(gang={"members": 0}), id="gang-zero-members"),
        pytest.param(body(gang={"members": 2, "minPools": 3}), id="min-pools-over-members"),
        pytest.param(body(gang={"members": 2, "maxPerPool": 0}), id="max-per-pool-zero"),
        pytest.param(body(priority=5000), id="priority-out-of-range"),
        pytest.param(body(maxAttempts=0), id="max-attempts-zero"),
        pytest.param(
            body(affinity={"required": [{"selector": {}, "topology": "pool"}]}),
            id="empty-selector",
        ),
        pytest.param(
            body(affinity={"required": [{"selector": {"a": "b"}, "topology": "rack"}]}),
            id="unknown-topology",
        ),
        pytest.param(
            body(affinity={"required": [{"selector": {"a": "b"}, "weight": 3}]}),
            id="weight-on-required",
        ),
        pytest.param(
            body(affinity={"preferred": [{"selector": {"a": "b"}}]}), id="preferred-no-weight"
        ),
        pytest.param(
            body(affinity={"preferred": [{"selector": {"a": "b"}, "weight": 101}]}),
            id="weight-over-100",
        ),
        pytest.param(body(labels={f"k{i}": "v" for i in range(33)}), id="too-many-labels"),
        pytest.param(body(labels={"k": "v" * 300}), id="label-value-too-long"),
        pytest.param(body(constraints={"regions": []}), id="empty-regions"),
        pytest.param(body(constraints={"regions": ["r"] * 40}), id="too-many-regions"),
    ],
)
def test_invalid_specs(data):
    with pytest.raises(ValidationError):
        TaskSpec.model_validate(data)


def test_camel_case_round_trip_and_aliases():
    spec = TaskSpec.model_validate(
        body(
            requests={"cpuMillis": 1, "memoryMiB": 2, "llmSlots": 3},
            constraints={"dataResidency": "eu", "poolSelector": {"a": "b"}},
        )
    )
    dumped = spec.model_dump(by_alias=True, exclude_none=True)
    assert dumped["requests"] == {"cpuMillis": 1, "memoryMiB": 2, "llmSlots": 3}
    assert dumped["constraints"]["dataResidency"] == "eu"
    assert TaskSpec.model_validate(dumped) == spec


def test_compiled_spec_is_hashable_and_fingerprint_ignores_scoring_only_fields():
    a = compile_spec(TaskSpec.model_validate(BASE), tenant_id="t", task_id="1")
    b = compile_spec(
        TaskSpec.model_validate(
            body(
                constraints={"artifactRegion": "r1"},
                labels={"x": "y"},
                affinity={"preferred": [{"selector": {"a": "b"}, "weight": 5}]},
            )
        ),
        tenant_id="t",
        task_id="2",
    )
    hash(a), hash(b)
    assert a.fingerprint == b.fingerprint
    assert a.members == 1 and a.requests == (500, 0, 0)
    c = compile_spec(TaskSpec.model_validate(BASE), tenant_id="other")
    assert c.fingerprint != a.fingerprint


def test_fingerprint_includes_own_labels_only_with_required_terms():
    req = {"required": [{"selector": {"app": "x"}}]}
    one = compile_spec(
        TaskSpec.model_validate(body(affinity=req, labels={"app": "x"})), tenant_id="t"
    )
    two = compile_spec(TaskSpec.model_validate(body(affinity=req)), tenant_id="t")
    assert one.fingerprint != two.fingerprint
