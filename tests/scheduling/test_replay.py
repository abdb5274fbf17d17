"""Comparing decisions: what differs, and what counts under another profile."""

from __future__ import annotations

import pytest

from app.scheduling.recording import Decision
from app.scheduling.replay import decisions_compare

A = Decision("t1", "p1", 50.0, (("least_loaded", 30.0), ("cost", 20.0)), (("p1", 1),))


@pytest.mark.parametrize(("replayed", "why"), [
    (A, ()),
    (Decision("t1", "p2", 50.0, (("least_loaded", 30.0), ("cost", 20.0)), (("p2", 1),)),
     ("pool",)),
    (Decision("t1", "p1", 60.0, (("least_loaded", 30.0), ("cost", 30.0)), (("p1", 1),)),
     ("score", "cost")),
    (Decision("t1", None, None, code="insufficient_cpu"), ("outcome",)),
    (Decision("t1", "p1", 50.0, (("least_loaded", 30.0), ("cost", 20.0)), (("p1", 2),)),
     ("members",)),
], ids=["same", "pool", "score", "outcome", "members"])
def test_why_names_what_differs(replayed: Decision, why: tuple) -> None:
    changes = decisions_compare("x/1", [A], [replayed])
    assert tuple(c.why for c in changes) == ((why,) if why else ())


def test_under_another_profile_a_score_alone_is_no_change() -> None:
    moved = Decision("t1", "p1", 60.0, (("least_loaded", 30.0), ("cost", 30.0)), (("p1", 1),))
    assert decisions_compare("x/1", [A], [moved], scores=False) == []
    assert len(decisions_compare("x/1", [A], [moved])) == 1
