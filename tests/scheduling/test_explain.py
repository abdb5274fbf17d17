"""The stored and served documents: one builder per shape, the exact fields served."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.scheduling.explain import (
    PLACEMENT_FORMAT,
    PlacementFormatUnknown,
    no_placement_document,
    placement_document,
    placement_stored,
    preview_document,
    ranked_stored,
)
from app.scheduling.framework import select
from app.scheduling.reasons import Reason
from app.scheduling.results import Candidate, NoPlacement, Ranked, ScoreComponent

from .factories import pool, snapshot, spec

HEAD = Candidate(
    "p1", 87.654321, (ScoreComponent("least_loaded", 50.123456, "projected utilization 10%"),)
)
NEXT = [Candidate("p2", 80.000049), Candidate("p3", 12.5)]


def test_placement_document_rounds_and_names_every_field():
    doc = placement_document(
        placement_stored(HEAD, members=[("p1", 2), ("p2", 1)], alternatives=NEXT)
    )
    assert doc == {
        "poolId": "p1",
        "score": 87.6543,
        "components": [
            {"name": "least_loaded", "value": 50.1235, "reason": "projected utilization 10%"}
        ],
        "members": [{"poolId": "p1", "count": 2}, {"poolId": "p2", "count": 1}],
        "alternatives": [{"poolId": "p2", "score": 80.0}, {"poolId": "p3", "score": 12.5}],
    }


@pytest.mark.parametrize(
    ("walked_from", "want"),
    [
        pytest.param((), [], id="not-walked"),
        pytest.param(["p0"], ["p0"], id="walked-one"),
        pytest.param(("p0", "p9"), ["p0", "p9"], id="walked-two"),
    ],
)
def test_walked_from_is_stored_and_not_served(walked_from, want):
    stored = placement_stored(HEAD, members=[("p1", 1)], alternatives=(), walked_from=walked_from)
    assert orjson.loads(stored)[5] == want
    assert "walkedFrom" not in placement_document(stored)


def test_a_stored_placement_carries_its_format_version():
    stored = orjson.loads(placement_stored(HEAD, members=[("p1", 1)], alternatives=NEXT))
    assert stored == [
        PLACEMENT_FORMAT,
        ["p1", "p2", "p3"],
        [87.654321, 80.000049, 12.5],
        [["least_loaded", 50.123456, "projected utilization 10%"]],
        [["p1", 1]],
        [],
    ]


@pytest.mark.parametrize(
    "text",
    [
        pytest.param('[1,["p1"],[1.0],[]]', id="lean-array-v1"),
        pytest.param('{"poolId":"p1","score":1.0}', id="document-v1"),
        pytest.param('[3,["p1"],[1.0],[],[["p1",1]],[],{}]', id="a-later-version"),
    ],
)
def test_a_placement_in_another_format_is_refused(text):
    with pytest.raises(PlacementFormatUnknown):
        placement_document(text)


def test_hidden_alternatives_are_left_out():
    stored = placement_stored(HEAD, members=[("p1", 1)], alternatives=NEXT)
    doc = placement_document(stored, hidden=frozenset({"p2"}))
    assert doc["alternatives"] == [{"poolId": "p3", "score": 12.5}]


def test_no_placement_document_renders_codes_as_strings():
    reason = NoPlacement(Reason.INSUFFICIENT_CPU, "no pool fits: 2 pools lack cpu", {"x": 2})
    assert no_placement_document(reason) == {
        "code": "insufficient_cpu",
        "message": "no pool fits: 2 pools lack cpu",
        "rejections": {"x": 2},
    }


def test_preview_document_holds_the_placement_document_of_the_result():
    pools = [pool("a"), pool("b", reserved=(1000, 0, 0)), pool("c", status="CORDONED")]
    result = select(spec(), snapshot(pools), explain=True)
    doc = preview_document(result)
    placement = result.placement
    assert doc["placement"] == placement_document(placement_stored(
        placement, members=placement.members, alternatives=placement.alternatives
    ))
    assert [c["poolId"] for c in doc["candidates"]] == ["a", "b"]
    assert doc["rejected"] == [{"poolId": "c", "reasons": ["pool_not_active"]}]
    assert doc["reason"] is None


#: Scores as the core makes them (0..a few hundred, four places apart) and the edges of
#: ``round``'s and orjson's number formats: halves, tiny, negative, huge, inf and nan.
NUMBERS = st.one_of(
    st.floats(min_value=-1000, max_value=1000),
    st.integers(-10**7, 10**7).map(lambda n: n / 10**4 + 0.00005),
    st.sampled_from([0.0, -0.0, 1e-4, 5e-5, 4.9999e-5, -4e-5, 0.00015, 2.675, 1e9 - 1e-5, 1e9,
                     -1e9, 1e16, 1.5e-7, float("inf"), float("-inf"), float("nan")]),
    st.floats(allow_nan=True, allow_infinity=True),
)
TEXTS = st.text(min_size=0, max_size=20)


@settings(max_examples=500)
@given(
    pools=st.lists(st.from_regex(r"[a-z0-9][a-z0-9-]{0,12}", fullmatch=True), min_size=1,
                   max_size=6, unique=True),
    scores=st.lists(NUMBERS, min_size=6, max_size=6),
    components=st.lists(st.tuples(TEXTS, st.one_of(NUMBERS, st.integers(-10**6, 10**6)),
                                  TEXTS), max_size=4),
    top_k=st.integers(0, 8),
)
def test_a_lean_placement_renders_as_the_same_placement_stored_from_candidates(
    pools, scores, components, top_k
):
    ranked = Ranked(pools, scores[: len(pools)], tuple(components), top_k, {})
    n = max(min(len(pools), top_k), 1)
    head = Candidate(pools[0], scores[0], tuple(ScoreComponent(*c) for c in components))
    full = placement_stored(
        head,
        members=[(pools[0], 1)],
        alternatives=[Candidate(p, x) for p, x in zip(pools[1:n], scores[1:n], strict=True)],
    )
    assert orjson.dumps(placement_document(ranked_stored(ranked))) == orjson.dumps(
        placement_document(full)
    )
