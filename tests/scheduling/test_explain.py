"""The stored and served documents: one builder per shape, the exact SPEC §6 fields."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.scheduling.explain import (
    no_placement_document,
    placement_document,
    placement_read,
    preview_document,
    ranked_document,
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
    doc = placement_document(HEAD, members=[("p1", 2), ("p2", 1)], alternatives=NEXT)
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
        pytest.param((), None, id="not-walked"),
        pytest.param(["p0"], ["p0"], id="walked-one"),
        pytest.param(("p0", "p9"), ["p0", "p9"], id="walked-two"),
    ],
)
def test_walked_from_appears_only_when_the_reservation_walked(walked_from, want):
    doc = placement_document(
        HEAD, members=[("p1", 1)], alternatives=(), walked_from=walked_from
    )
    assert doc.get("walkedFrom") == want
    assert ("walkedFrom" in doc) == bool(want)


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
    assert doc["placement"] == placement_document(
        placement, members=placement.members, alternatives=placement.alternatives
    )
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
def test_a_stored_lean_placement_reads_back_as_its_document_byte_for_byte(
    pools, scores, components, top_k
):
    ranked = Ranked(pools, scores[: len(pools)], tuple(components), top_k, {})
    stored = ranked_stored(ranked)
    assert orjson.dumps(placement_read(stored)) == orjson.dumps(ranked_document(ranked))
    # Smaller than the document it stands for.
    assert len(stored) < len(orjson.dumps(ranked_document(ranked)))


def test_a_stored_document_reads_back_as_it_is():
    ranked = Ranked(["p-1", "p-2", "p-3"], [3.25, 2.5, 1.0], (("cost", 1.0, "why"),), 2, {})
    doc = placement_document(HEAD, members=[("p1", 2)], alternatives=NEXT, walked_from=["p0"])
    assert placement_read(orjson.dumps(doc).decode()) == doc
    assert placement_read(orjson.dumps(ranked_document(ranked)).decode()) == ranked_document(ranked)
    assert placement_read(ranked_stored(ranked)) == ranked_document(ranked)
    assert ranked_stored(ranked).startswith("[1,")


