"""Stored specs compile once per spec class, exactly as the whole validation compiles them,
and a text the whole validation refuses is refused with the same error."""

from __future__ import annotations

import orjson
import pytest
from pydantic import ValidationError

from app.scheduling.spec import CompiledSpec, StoredSpecs, TaskSpec, compile_spec

VALID = {
    "runtimeClass": "python-3.11",
    "requests": {"cpuMillis": 500, "memoryMiB": 256, "llmSlots": 0},
    "constraints": {"regions": ["eu-west-1"], "poolSelector": {"tier": "std"}},
    "affinity": {"required": [{"selector": {"app": "a"}, "topology": "pool"}]},
    "labels": {"app": "a"},
}


def stored(body: dict) -> str:
    """Return ``body`` as the service stores it: validated, dumped by alias, keys sorted."""
    spec = TaskSpec.model_validate(body).model_dump(mode="json", by_alias=True)
    return orjson.dumps(spec, option=orjson.OPT_SORT_KEYS).decode()


def whole(text: str, tenant: str):
    return compile_spec(TaskSpec.model_validate_json(text), tenant_id=tenant)


def same(a, b) -> bool:
    return a == b and (a.fingerprint, a.placement_class) == (b.fingerprint, b.placement_class)


#: One of each kind of spec a workload mixes: plain, constrained, affine, ganged, prioritised.
KINDS = (
    {},
    {"labels": {"app": "a"}},
    {"constraints": {"regions": ["eu-west-1", "us-east-1"]}},
    {"constraints": {"dataResidency": "eu"}},
    {"constraints": {"poolSelector": {"tier": "premium"}}},
    {"labels": {"app": "a"}, "affinity": {"preferred": [
        {"selector": {"app": "a"}, "topology": "failureDomain", "weight": 50}]}},
    {"affinity": {"required": [{"selector": {"app": "b"}, "topology": "pool", "anti": True}]}},
    {"gang": {"members": 3}},
    {"priority": 10, "constraints": {"artifactRegion": "eu-west-1"}},
)


def mixed_specs():
    """Yield (tenant, stored text) over kinds, runtime classes, requests and tenants."""
    for i, kind in enumerate(KINDS * 30):
        rc = ("python-3.11", "node-20", "gpu-llm")[i % 3]
        requests = {"cpuMillis": (250, 500, 1000)[i % 3 * 7 % 3], "memoryMiB": 256 << i % 4}
        if rc == "gpu-llm":
            requests["llmSlots"] = 1 + i % 2
        yield f"tenant-{i % 7}", stored({"runtimeClass": rc, "requests": requests, **kind})


def test_every_kind_of_spec_compiles_as_the_whole_validation_compiles_it():
    specs = StoredSpecs()
    for tenant, text in mixed_specs():
        assert same(specs.compile(tenant, text), whole(text, tenant)), text
    # The texts share far fewer classes than there are texts.
    assert len(specs._classes) < len(specs) / 2


def test_a_class_seen_from_another_tenant_is_compiled_for_this_one():
    specs = StoredSpecs()
    text = stored(VALID)
    specs.compile("t1", text)
    assert same(specs.compile("t2", text), whole(text, "t2"))
    assert same(specs.compile("t1", text), whole(text, "t1"))
    # A spec bound for another tenant is a CompiledSpec like any other: immutable, hashable.
    bound = specs.compile("t3", text)
    assert type(bound) is CompiledSpec and hash(bound) == hash(whole(text, "t3"))
    with pytest.raises(AttributeError):
        bound.tenant_id = "t4"  # type: ignore[misc]


def test_labels_accepted_before_do_not_let_equal_looking_invalid_ones_through():
    specs = StoredSpecs()
    specs.compile("t", stored(VALID))
    specs.compile("t", _variant(labels={"k": "1", "b": "true"}))
    for labels in ({"k": 1, "b": "true"}, {"k": "1", "b": True}, {"k": ["1"], "b": "true"}):
        with pytest.raises(ValidationError):
            specs.compile("t", _variant(labels=labels))


@pytest.mark.parametrize(
    "changes",
    [
        {"requests": {"cpuMillis": 10**9, "memoryMiB": 10**9, "llmSlots": 10**6}},
        {"requests": {"llmSlots": 1}},
        {"labels": {"k" * 128: "v" * 256, "a.b/c-d_e": ""}},
        {"labels": {f"k{i}": "v" for i in range(32)}},
        {"labels": {}},
    ],
    ids=["requests-at-bounds", "one-request", "labels-at-bounds", "most-labels", "no-labels"],
)
def test_parts_at_their_bounds_compile_as_the_whole_validation_compiles_them(changes):
    specs = StoredSpecs()
    specs.compile("t", stored(VALID))  # the class is known: only the parts are checked
    text = _variant(**changes)
    assert same(specs.compile("t", text), whole(text, "t"))


def _variant(**changes) -> str:
    body = orjson.loads(stored(VALID))
    for key, value in changes.items():
        if value is KeyError:
            body.pop(key)
        else:
            body[key] = value
    return orjson.dumps(body).decode()


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(_variant(requests={"cpuMillis": -5, "memoryMiB": 0, "llmSlots": 0}),
                     id="negative-cpu"),
        pytest.param(_variant(requests={"cpuMillis": 0, "memoryMiB": 0, "llmSlots": 0}),
                     id="no-request"),
        pytest.param(_variant(requests={"cpuMillis": 1.5, "memoryMiB": 0, "llmSlots": 0}),
                     id="float-cpu"),
        pytest.param(_variant(requests={"cpuMillis": True, "memoryMiB": 0, "llmSlots": 0}),
                     id="bool-cpu"),
        pytest.param(_variant(requests={"cpuMillis": 1, "gpus": 1}), id="unknown-resource"),
        pytest.param(_variant(requests=KeyError), id="no-requests"),
        pytest.param(_variant(requests=[1, 2, 3]), id="requests-not-an-object"),
        pytest.param(_variant(requests={"cpuMillis": 10**9 + 1}), id="cpu-above-bound"),
        pytest.param(_variant(requests={"llmSlots": 10**6 + 1}), id="llm-above-bound"),
        pytest.param(_variant(labels={"-bad": "v"}), id="bad-label-key"),
        pytest.param(_variant(labels={"a\n": "v"}), id="label-key-newline"),
        pytest.param(_variant(labels={"k" * 129: "v"}), id="label-key-too-long"),
        pytest.param(_variant(labels={"": "v"}), id="label-key-empty"),
        pytest.param(_variant(labels={"k": "v" * 300}), id="label-value-too-long"),
        pytest.param(_variant(labels={f"k{i}": "v" for i in range(33)}), id="too-many-labels"),
        pytest.param(_variant(labels={"k": 1}), id="label-value-not-a-string"),
        pytest.param(_variant(labels=["a"]), id="labels-not-an-object"),
        pytest.param(_variant(priority=5000), id="priority-out-of-range"),
        pytest.param(_variant(extra=1), id="unknown-field"),
        pytest.param("[1, 2]", id="not-an-object"),
        pytest.param("{", id="not-json"),
    ],
)
def test_a_text_the_whole_validation_refuses_is_refused_with_its_error(text):
    specs = StoredSpecs()
    specs.compile("t", stored(VALID))  # the class is known: only the parts are checked
    with pytest.raises(ValidationError) as expected:
        whole(text, "t")
    with pytest.raises(ValidationError) as got:
        specs.compile("t", text)
    assert str(got.value) == str(expected.value)


def test_compiled_specs_are_shared_by_equal_texts_and_bounded():
    specs = StoredSpecs(kept=2)
    text = stored(VALID)
    assert specs.compile("t", text) is specs.compile("t", text)
    assert specs.compile("t", text).task_id is None
    for cpu in (1, 2, 3):
        specs.compile("t", stored({**VALID, "requests": {"cpuMillis": cpu}}))
    assert len(specs) <= 2
