"""The per-pass unsatisfiable cache."""

from __future__ import annotations

from app.scheduling.assumed import Assumed
from app.scheduling.framework import select
from app.scheduling.unsatisfiable import UnsatisfiableCache

from .factories import pool, snapshot, spec


def test_same_fingerprint_is_skipped_with_the_same_reason():
    snap = snapshot([pool("p", capacity=(100, 100, 0))])
    cache = UnsatisfiableCache(Assumed(snap))
    first = spec(task_id="a")
    reason = select(first, snap).reason
    cache.put(first, reason)
    assert cache.get(spec(task_id="b")) is reason
    assert cache.get(spec(task_id="c", requests={"cpuMillis": 50})) is None
    assert cache.hits == 1


def test_positive_affinity_entries_expire_when_a_placement_is_assumed():
    snap = snapshot([pool("p")])
    assumed = Assumed(snap)
    cache = UnsatisfiableCache(assumed)
    term = {"required": [{"selector": {"app": "db"}}]}
    waiting = spec(task_id="w1", affinity=term)
    reason = select(waiting, snap, assumed=assumed).reason
    cache.put(waiting, reason)
    assert cache.get(spec(task_id="w2", affinity=term)) is reason
    db = spec(task_id="db", labels={"app": "db"})
    assumed.add(db, [("p", 1)])
    later = spec(task_id="w3", affinity=term)
    assert cache.get(later) is None
    assert select(later, snap, assumed=assumed).placement is not None


def test_positive_affinity_not_cached_without_an_overlay():
    cache = UnsatisfiableCache()
    s = spec(affinity={"required": [{"selector": {"app": "db"}}]})
    cache.put(s, select(s, snapshot([pool("p")])).reason)
    assert cache.get(s) is None and len(cache) == 0
